"""The destination of bench/run: a second PostgreSQL instance of its own.

A migration copies one instance into another, and so does every real CDC
deployment. With source and destination databases in one instance, the
source's walsender has to read (and check the CRC of) every WAL record the
destination writes, just to skip it: about 1 s of CPU per 1M rows copied, on
the 2 cores that everything else shares, and only for the CDC pipelines
(pg_dump | psql has no slot). A second instance on the same machine removes
that artefact and keeps everything else shared.
`bench/run --destination same` keeps the destination databases in the stack's
instance, as the runs before 2026-12-01 15:00 did.

The instance is the stack's own PostgreSQL service (scripts/stack: initdb,
settings, the tributary role), started in a stack directory of its own on
another port, so that the two instances differ only in being two.
"""

import os
import subprocess
import tempfile
from pathlib import Path

STACK = Path(__file__).resolve().parent.parent / "scripts/stack"


class Cluster:
    """A PostgreSQL instance on `port` in a throw-away stack directory;
    stop() stops it and removes its data."""

    def __init__(self, port, log):
        self.port, self.log = str(port), log
        self.stack_dir = Path(tempfile.mkdtemp(prefix="tributary-bench-dst-"))
        self.env = dict(os.environ, TRIBUTARY_STACK_DIR=str(self.stack_dir), TRIBUTARY_PG_PORT=self.port)

    def _stack(self, *args):
        return subprocess.run([str(STACK), *args], env=self.env, capture_output=True, text=True)

    def start(self):
        self.log(f"destination: a second PostgreSQL instance (stack dir {self.stack_dir}), port {self.port}")
        r = self._stack("start", "postgres")
        if r.returncode != 0:
            raise RuntimeError(f"the destination instance did not start: {(r.stdout + r.stderr)[-1500:]}")
        return self

    def stop(self):
        r = self._stack("down", "--purge")
        if r.returncode != 0:
            self.log(f"WARNING: stopping the destination instance: {(r.stdout + r.stderr)[-800:]}")
