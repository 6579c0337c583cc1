"""The destination of bench/run: a second PostgreSQL instance of its own.

A migration copies one instance into another, and so does every real CDC
deployment. With source and destination databases in one instance, the
source's walsender has to read (and check the CRC of) every WAL record the
destination writes, just to skip it: about 1 s of CPU per 1M rows copied, on
the 2 cores that everything else shares, and only for the CDC pipelines
(pg_dump | psql has no slot). A second instance on the same machine, set up
like the stack's, removes that artefact and keeps everything else shared.
`bench/run --destination same` keeps the destination databases in the stack's
instance, as the runs before 2026-12-01 15:00 did.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The stack's instance settings (scripts/stack pg_prepare), so that the two
# instances differ only in being two.
SETTINGS = """
listen_addresses = '127.0.0.1'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 200
fsync = off
full_page_writes = off
shared_buffers = 128MB
log_min_messages = warning
"""
HBA = """local   all   all                 trust
host    all   postgres 127.0.0.1/32 trust
host    all   all      127.0.0.1/32 scram-sha-256
"""
READY_S = 60


class Cluster:
    """An initdb'd instance on `port`, run as the postgres OS user when we are
    root (postgres refuses to run as root); removed by stop()."""

    def __init__(self, port, user, password, log):
        self.port, self.user, self.password, self.log = str(port), user, password, log
        self.as_owner = []
        if os.geteuid() == 0:
            self.as_owner = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
        # /var/tmp: the postgres user may not reach a root-owned temp dir.
        self.home = Path(tempfile.mkdtemp(prefix="tributary-bench-dst-", dir="/var/tmp"))
        self.proc = None

    def _own(self, path):
        if self.as_owner:
            shutil.chown(path, "postgres", "postgres")

    def start(self):
        data, sock = self.home / "data", self.home / "sock"
        for d in (self.home, sock):
            d.mkdir(exist_ok=True)
            self._own(d)
        self.log(f"destination: a second PostgreSQL instance in {self.home}, port {self.port}")
        r = subprocess.run(self.as_owner + [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8",
                                            "--locale=C.UTF-8", "--auth-local=trust", "--auth-host=scram-sha-256",
                                            "--no-instructions"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"initdb of the destination instance failed: {r.stderr[-800:]}")
        (data / "pg_hba.conf").write_text(HBA)
        with open(data / "postgresql.conf", "a") as f:
            f.write(SETTINGS)
        self._own(data / "pg_hba.conf")
        self.logfile = open(self.home / "postgres.log", "w")
        self.proc = subprocess.Popen(self.as_owner + [str(PG_BIN / "postgres"), "-D", str(data), "-p", self.port,
                                                      "-k", str(sock)],
                                     stdout=self.logfile, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + READY_S
        while True:
            ok = subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", str(sock), "-p", self.port, "-U", "postgres"])
            if ok.returncode == 0:
                break
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the destination instance did not start; see {self.home / 'postgres.log'}")
            time.sleep(0.2)
        sql = f"CREATE ROLE {self.user} LOGIN SUPERUSER PASSWORD '{self.password}'"
        r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(sock), "-p", self.port,
                            "-U", "postgres", "-d", "postgres", "-c", sql], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"destination instance: {r.stderr.strip()}")
        return self

    def server_version(self):
        r = subprocess.run([str(PG_BIN / "postgres"), "--version"], capture_output=True, text=True)
        return r.stdout.strip()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # postgres' fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)
