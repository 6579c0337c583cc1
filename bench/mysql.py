"""`bench/run --source mysql`: the MySQL source beside the raw rates of the
same MariaDB table, in one run.

Snapshot: rows/s of the source runner (its `tributary_snapshot_rows`
metric reaching the table's row count, from process start) beside a plain
`SELECT *` of the same table through the `mariadb` client (the rate at which
the server can hand the rows out at all). Streaming: events/s of the runner
(`tributary_events_total` reaching snapshot + changes) for a workload of
multi-row UPDATE transactions, beside the rate at which MariaDB executed them.
"""

import os
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

MY_HOST, MY_PORT, MY_USER, MY_PASSWORD = "127.0.0.1", "3306", "tributary", "tributary"
# Rows per UPDATE transaction of the streaming workload: enough that the
# client round trips do not bound the rate being measured.
ROWS_PER_TXN = 1000
# Metric polling interval (the measured time is over-stated by up to this).
POLL_S = 0.1


def mariadb(sql, db=None):
    args = ["mariadb", "--no-defaults", "-h", MY_HOST, "-P", MY_PORT, "-u", MY_USER, f"-p{MY_PASSWORD}",
            "--batch", "--skip-column-names"]
    if db:
        args.append(db)
    return subprocess.run(args + ["-e", sql], check=True, capture_output=True, text=True).stdout


def metric(port, name, table):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    m = re.search(rf'^{name}{{[^}}]*table="{re.escape(table)}"}} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def wait_metric(port, name, table, target, proc, timeout, on_poll=None):
    """Waits until the runner's metric `name` of `table` reaches `target`;
    `on_poll` runs at each poll (bench/pg_source.py reads the RSS there)."""
    deadline = time.time() + timeout
    while metric(port, name, table) < target:
        if on_poll:
            on_poll()
        if proc.poll() is not None:
            raise RuntimeError(f"source-runner exited with {proc.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {name} {table} >= {target}")
        time.sleep(POLL_S)
    return time.time()


def vm_hwm_kib(pid):
    """The process's peak RSS so far (VmHWM), KiB; 0 once it is gone. The
    one reader of it for bench/run, bench/pg_source.py and this file."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def create_table(db, rows):
    """`db.items` with `rows` rows (the database exists)."""
    mariadb("CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL, qty INT, "
            "price DECIMAL(10,2), updated DATETIME(6))", db)
    mariadb(f"INSERT INTO items SELECT seq, CONCAT('item ', seq), seq % 100, seq / 7, "
            f"'2024-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_{rows}", db)


def streaming_changes(rows):
    """Row changes of the streaming workload for a table of `rows` rows."""
    return min(rows, 100_000)


def update_sql(changes):
    """The streaming workload: `changes` row updates in ROWS_PER_TXN-row transactions."""
    return ";".join(
        f"START TRANSACTION; UPDATE items SET qty = qty + 1 WHERE id BETWEEN {a} AND {a + ROWS_PER_TXN - 1}; COMMIT"
        for a in range(1, changes + 1, ROWS_PER_TXN))


def run(rows, bin_dir, kafka, registry, log):
    run_id = "benchmy_" + time.strftime("%m%d%H%M%S") + f"_{os.getpid() % 1000}"
    db = run_id
    table = f"{db}.items"
    work = Path(tempfile.mkdtemp(prefix=f"{run_id}-"))
    log(f"mysql: creating {table} with {rows} rows; logs in {work}")
    mariadb(f"CREATE DATABASE {db}")
    proc = None
    try:
        create_table(db, rows)
        t0 = time.time()
        subprocess.run(["mariadb", "--no-defaults", "-h", MY_HOST, "-P", MY_PORT, "-u", MY_USER,
                        f"-p{MY_PASSWORD}", "--quick", "--batch", db, "-e", "SELECT * FROM items"],
                       check=True, stdout=subprocess.DEVNULL)
        raw_select = rows / (time.time() - t0)

        port = 18000 + os.getpid() % 1000
        cfg = work / "source.toml"
        cfg.write_text(f"""name = "{run_id}"
schema_registry_url = "{registry}"
[kafka]
bootstrap_servers = "{kafka}"
[admin]
listen = "127.0.0.1:{port}"
[mysql]
url = "mysql://{MY_USER}@{MY_HOST}:{MY_PORT}/{db}"
password = "env:TRIBUTARY_SOURCE_PASSWORD"
server_id = {7000 + os.getpid() % 1000}
""")
        env = dict(os.environ, TRIBUTARY_SOURCE_PASSWORD=MY_PASSWORD, RUST_LOG="info")
        t0 = time.time()
        proc = subprocess.Popen([str(bin_dir / "source-runner"), "--config", str(cfg)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(work / "source-runner.log", "w"))
        t1 = wait_metric(port, "tributary_snapshot_rows", table, rows, proc, max(300, rows / 1000))
        snapshot = rows / (t1 - t0)
        # Streaming starts once the snapshot's events are all counted.
        wait_metric(port, "tributary_events_total", table, rows, proc, 60)

        changes = streaming_changes(rows)
        t0 = time.time()
        mariadb(update_sql(changes), db)
        t_written = time.time()
        t1 = wait_metric(port, "tributary_events_total", table, rows + changes, proc, 300)
        res = {
            "rows": rows,
            "raw_select_rows_s": raw_select,
            "snapshot_rows_s": snapshot,
            "changes": changes,
            "source_write_events_s": changes / (t_written - t0),
            "streaming_events_s": changes / (t1 - t0),
            "rss_kib": vm_hwm_kib(proc.pid),
        }
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            # The run's topics, offsets and schema subjects.
            subprocess.run([str(bin_dir / "source-runner"), "--config", str(work / "source.toml"), "delete", "--yes"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        mariadb(f"DROP DATABASE IF EXISTS {db}")
    return res, run_id


def render(res):
    return "\n".join([
        f"MySQL source (MariaDB, {res['rows']} rows, {res['changes']} changes in "
        f"{ROWS_PER_TXN}-row transactions)",
        "| | Tributary | raw |",
        "|---|---|---|",
        f"| snapshot rows/s | {res['snapshot_rows_s']:.0f} | {res['raw_select_rows_s']:.0f} (mariadb client SELECT *) |",
        f"| streaming events/s | {res['streaming_events_s']:.0f} | {res['source_write_events_s']:.0f} "
        f"(MariaDB executing the UPDATEs) |",
    ])
