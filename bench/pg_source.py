#!/usr/bin/env python3
"""The PostgreSQL source runner alone beside PostgreSQL's own rates, in one run.

    bench/pg_source.py [--rows N] [--reps K] [--bin-dir DIR]

Creates a table of N rows (default 1M) with the 10 columns of bench/run's
`items`, then, K times (default 3), measures one after the other:

- raw `COPY (SELECT * FROM items) TO STDOUT` through psql into /dev/null:
  the rate at which PostgreSQL hands the rows out at all;
- the source runner's snapshot into Kafka (Avro through the registry, Kafka
  transactions; no sink): process start until its committed
  `tributary_events_total` reaches N, and its peak RSS (VmHWM) over it;
- streaming: min(N, 100,000) row changes in 1000-row UPDATE transactions,
  written while the runner streams: changes / (workload start until the
  committed `tributary_events_total` has them all), beside the rate at
  which PostgreSQL executed the UPDATEs.

It prints the medians side by side, then every rep's numbers. The reps
alternate raw and runner measurements because this shared 2-core machine's
speed drifts from minute to minute (raw COPY was seen anywhere from 240k to
500k rows/s within one run): a ratio of medians over interleaved reps moves
much less than a ratio of two single runs.

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
import mysql  # noqa: E402  (its metric reader and waiter, and the VmHWM reader)

REPO = Path(__file__).resolve().parent.parent
PG = dict(host="127.0.0.1", port=os.environ.get("TRIBUTARY_PG_PORT", "5432"), user="tributary", db="source")
KAFKA = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7")
ADMIN_PORT = 18_095
# Metric and RSS polling interval (the measured time is over-stated by up to this).
POLL_S = 0.1
# Rows per UPDATE transaction of the streaming workload (as bench/mysql.py).
ROWS_PER_TXN = 1000
ENV = dict(os.environ, PGPASSWORD="tributary")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def psql(sql, out=subprocess.PIPE):
    args = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", PG["host"], "-p", PG["port"],
            "-U", PG["user"], "-d", PG["db"], "-c", sql]
    return subprocess.run(args, env=ENV, stdout=out, stderr=subprocess.PIPE, text=True, check=True).stdout


def runner_config(run_id, rep, table):
    name = f"{run_id}_r{rep}"
    return f"""name = "{name}"
schema_registry_url = "{REGISTRY}"
[kafka]
bootstrap_servers = "{KAFKA}"
[admin]
listen = "127.0.0.1:{ADMIN_PORT}"
[postgres]
url = "postgres://{PG['user']}@{PG['host']}:{PG['port']}/{PG['db']}"
password = "env:TRIBUTARY_SOURCE_PASSWORD"
slot_name = "{name}"
publication_name = "{name}"
include = ["{table}"]
install_ddl_trigger = false
"""


def rep_once(binary, work, run_id, rep, table, rows, changes):
    """One rep: raw COPY, then the runner's snapshot and streaming."""
    t0 = time.time()
    with open(os.devnull, "w") as null:
        psql(f"COPY (SELECT * FROM {table}) TO STDOUT", out=null)
    res = {"copy_rows_s": rows / (time.time() - t0)}
    cfg = work / f"source-r{rep}.toml"
    cfg.write_text(runner_config(run_id, rep, table))
    env = dict(ENV, TRIBUTARY_SOURCE_PASSWORD="tributary")
    proc = None
    hwm = [0]
    try:
        t0 = time.time()
        with open(work / f"source-runner-r{rep}.log", "w") as out:
            proc = subprocess.Popen([str(binary), "--config", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(env, RUST_LOG=os.environ.get("RUST_LOG", "info")))
        poll_rss = lambda: hwm.__setitem__(0, max(hwm[0], mysql.vm_hwm_kib(proc.pid)))  # noqa: E731
        t1 = mysql.wait_metric(ADMIN_PORT, "tributary_events_total", table, rows, proc, max(300, rows / 1000), poll_rss)
        poll_rss()
        res["snapshot_rows_s"] = rows / (t1 - t0)
        res["rss_mib"] = hwm[0] / 1024
        stmts = "".join(
            f"BEGIN; UPDATE {table} SET qty = qty + 1 WHERE id BETWEEN {a} AND {a + ROWS_PER_TXN - 1}; COMMIT; "
            for a in range(1, changes + 1, ROWS_PER_TXN))
        t0 = time.time()
        psql(stmts)
        res["pg_update_events_s"] = changes / (time.time() - t0)
        t1 = mysql.wait_metric(ADMIN_PORT, "tributary_events_total", table, rows + changes, proc, 300)
        res["streaming_events_s"] = changes / (t1 - t0)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait()
        # `delete` drops the slot, the publication, the topics and subjects.
        subprocess.run([str(binary), "--config", str(cfg), "delete", "--yes"], capture_output=True, env=env)
    return res


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin-dir", default=str(REPO / "target/release"))
    args = ap.parse_args()
    binary = Path(args.bin_dir) / "source-runner"
    if not binary.exists():
        sys.exit(f"{binary} missing: cargo build --release -p source-runner")
    run_id = "benchpg_" + time.strftime("%m%d%H%M%S") + f"_{os.getpid() % 1000}"
    schema, table = run_id, f"{run_id}.items"
    work = Path(tempfile.mkdtemp(prefix=run_id + "-"))
    changes = min(args.rows, 100_000)
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
        reps = []
        for rep in range(args.reps):
            r = rep_once(binary, work, run_id, rep, table, args.rows, changes)
            log(f"rep {rep + 1}/{args.reps}: raw COPY {r['copy_rows_s']:,.0f} rows/s, snapshot "
                f"{r['snapshot_rows_s']:,.0f} rows/s ({r['rss_mib']:.1f} MiB), streaming "
                f"{r['streaming_events_s']:,.0f} events/s (PostgreSQL wrote {r['pg_update_events_s']:,.0f}/s)")
            reps.append(r)
        m = {k: median([r[k] for r in reps]) for k in reps[0]}
        peak = max(r["rss_mib"] for r in reps)
        snap_share = m["snapshot_rows_s"] / m["copy_rows_s"]
        stream_share = m["streaming_events_s"] / m["pg_update_events_s"]
        print(f"\nPostgreSQL source runner, {args.rows:,} rows x 10 columns, medians of {args.reps} rep(s) "
              f"(into Kafka: Avro + registry, Kafka transactions; no sink)\n")
        print("| measure | PostgreSQL alone | source runner | ratio | target | met |")
        print("|---|---:|---:|---:|---|---|")
        print(f"| snapshot rows/s (process start to all committed) vs raw COPY TO STDOUT | "
              f"{m['copy_rows_s']:,.0f} | {m['snapshot_rows_s']:,.0f} | {snap_share:.0%} | >= 50% of COPY | "
              f"{'yes' if snap_share >= 0.5 else '**no**'} |")
        print(f"| peak RSS (VmHWM; highest rep) |  | {peak:.1f} MiB |  | < 64 MiB | {'yes' if peak < 64 else '**no**'} |")
        print(f"| streaming events/s ({changes:,} changes in {ROWS_PER_TXN}-row UPDATEs) vs PostgreSQL "
              f"executing them | {m['pg_update_events_s']:,.0f} | {m['streaming_events_s']:,.0f} | "
              f"{stream_share:.0%} |  |  |")
        print("\nPer rep:\n")
        print("| rep | raw COPY rows/s | snapshot rows/s | share | peak RSS | UPDATEs events/s | streaming events/s |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for i, r in enumerate(reps, 1):
            print(f"| {i} | {r['copy_rows_s']:,.0f} | {r['snapshot_rows_s']:,.0f} | "
                  f"{r['snapshot_rows_s'] / r['copy_rows_s']:.0%} | {r['rss_mib']:.1f} MiB | "
                  f"{r['pg_update_events_s']:,.0f} | {r['streaming_events_s']:,.0f} |")
    finally:
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        log(f"cleaned up; runner logs in {work}")


if __name__ == "__main__":
    main()
