#!/usr/bin/env python3
"""The PostgreSQL source runner alone beside the raw COPY rate, in one run.

    bench/pg_source.py [--rows N] [--bin-dir DIR]

Creates a table of N rows (default 1M) with the 10 columns of bench/run's
`items`, then prints side by side:

- raw `COPY (SELECT * FROM items) TO STDOUT` through psql into /dev/null:
  the rate at which PostgreSQL hands the rows out at all;
- the source runner's snapshot into Kafka (Avro through the registry, Kafka
  transactions; no sink): process start until its committed
  `tributary_events_total` reaches N, and its peak RSS (VmHWM) over it.

Needs the local stack (scripts/stack up) and a release source-runner
(cargo build --release -p source-runner). Drops its schema, slot,
publication, topics and subjects at the end, also on failure.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mysql  # noqa: E402  (its metric reader)

REPO = Path(__file__).resolve().parent.parent
PG = dict(host="127.0.0.1", port=os.environ.get("TRIBUTARY_PG_PORT", "5432"), user="tributary", db="source")
KAFKA = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7")
ADMIN_PORT = 18_095
# Metric and RSS polling interval (the measured time is over-stated by up to this).
POLL_S = 0.1
ENV = dict(os.environ, PGPASSWORD="tributary")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def psql(sql, out=subprocess.PIPE):
    args = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", PG["host"], "-p", PG["port"],
            "-U", PG["user"], "-d", PG["db"], "-c", sql]
    return subprocess.run(args, env=ENV, stdout=out, stderr=subprocess.PIPE, text=True, check=True).stdout


def committed_events(table):
    return mysql.metric(ADMIN_PORT, "tributary_events_total", table)


def vm_hwm_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--bin-dir", default=str(REPO / "target/release"))
    args = ap.parse_args()
    binary = Path(args.bin_dir) / "source-runner"
    if not binary.exists():
        sys.exit(f"{binary} missing: cargo build --release -p source-runner")
    run_id = "benchpg_" + time.strftime("%m%d%H%M%S") + f"_{os.getpid() % 1000}"
    schema, table = run_id, f"{run_id}.items"
    work = Path(tempfile.mkdtemp(prefix=run_id + "-"))
    cfg = work / "source.toml"
    cfg.write_text(f"""name = "{run_id}"
schema_registry_url = "{REGISTRY}"
[kafka]
bootstrap_servers = "{KAFKA}"
[admin]
listen = "127.0.0.1:{ADMIN_PORT}"
[postgres]
url = "postgres://{PG['user']}@{PG['host']}:{PG['port']}/{PG['db']}"
password = "env:TRIBUTARY_SOURCE_PASSWORD"
slot_name = "{run_id}"
publication_name = "{run_id}"
include = ["{table}"]
install_ddl_trigger = false
""")
    proc = None
    try:
        log(f"creating {table} with {args.rows} rows")
        psql(f"""
            CREATE SCHEMA {schema};
            CREATE TABLE {table} (id bigint PRIMARY KEY, name text, qty integer, price double precision,
                amount numeric(12,2), created_at timestamptz, active boolean, day date, uid uuid, doc jsonb);
            INSERT INTO {table}
            SELECT g, 'item-' || g || '-' || md5(g::text), (g * 7) % 1000, g * 1.5,
                   ((g * 13) % 10000000) / 100.0,
                   timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',
                   g % 2 = 0, date '2024-01-01' + (g % 365), md5(g::text)::uuid,
                   jsonb_build_object('k', g, 'tags', jsonb_build_array('a', 'b'), 'note', 'n' || (g % 97))
            FROM generate_series(1, {args.rows}) g;
            ANALYZE {table};""")
        t0 = time.time()
        with open(os.devnull, "w") as null:
            psql(f"COPY (SELECT * FROM {table}) TO STDOUT", out=null)
        copy_s = time.time() - t0
        log(f"raw COPY: {args.rows / copy_s:,.0f} rows/s")

        t0 = time.time()
        with open(work / "source-runner.log", "w") as out:
            proc = subprocess.Popen([str(binary), "--config", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(ENV, TRIBUTARY_SOURCE_PASSWORD="tributary", RUST_LOG="info"))
        hwm = 0
        deadline = t0 + max(300, args.rows / 1000)
        while committed_events(table) < args.rows:
            hwm = max(hwm, vm_hwm_kib(proc.pid))
            if proc.poll() is not None:
                raise RuntimeError(f"source-runner exited with {proc.returncode}; log {work}/source-runner.log")
            if time.time() > deadline:
                raise RuntimeError("the snapshot did not finish in time")
            time.sleep(POLL_S)
        snap_s = time.time() - t0
        hwm = max(hwm, vm_hwm_kib(proc.pid))
        rate = args.rows / snap_s
        copy_rate = args.rows / copy_s
        print(f"\nPostgreSQL source runner, {args.rows:,} rows x 10 columns "
              f"(snapshot into Kafka, Avro + registry, Kafka transactions; no sink)\n")
        print("| measure | raw COPY TO STDOUT | source runner | ratio | target | met |")
        print("|---|---:|---:|---:|---|---|")
        print(f"| snapshot rows/s (process start to all committed) | {copy_rate:,.0f} | {rate:,.0f} | "
              f"{rate / copy_rate:.0%} | >= 50% of COPY | {'yes' if rate >= copy_rate / 2 else '**no**'} |")
        print(f"| peak RSS (VmHWM) |  | {hwm / 1024:.1f} MiB |  | < 64 MiB | "
              f"{'yes' if hwm < 64 * 1024 else '**no**'} |")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait()
        # `delete` drops the slot, the publication, the topics and subjects.
        subprocess.run([str(binary), "--config", str(cfg), "delete", "--yes"], capture_output=True,
                       env=dict(ENV, TRIBUTARY_SOURCE_PASSWORD="tributary"))
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        log(f"cleaned up; runner log in {work}")


if __name__ == "__main__":
    main()
