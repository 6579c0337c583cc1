//! User story 18: a reader of the destination sees a state the source was
//! in (docs/consistency.md). A workload of transfers between two tables
//! (each in one source transaction: the total of both never changes) and
//! orders inserted and deleted with their lines (the lines the orders
//! count always exist), through a source runner with
//! `transaction_metadata` and a sink runner with `consistency =
//! "transactional"`, with a `kill -9` of each runner and a broker restart
//! meanwhile; a reader samples the destination every 100 ms, in one query,
//! and must never see the total change or an order without its lines. The
//! copy ends equal to the source, and says which source transaction it
//! reflects (`consistent_as_of`, in the destination and in `/status`).
//!
//! The same reader over the same workload into a per-table sink sees the
//! difference ([`per_table_mode_lets_a_reader_see_half_a_transaction`]):
//! the invariant is not one the workload keeps by luck.
//!
//! Restarts the broker: runs alone (`scripts/test`'s `ALONE_TESTS`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_tests::{
    bigquery, e2e, free_port, log_tail, pg_destination_url, pg_source_runner_config, pg_source_url, postgres, redshift,
    runner_status, sink_runner_config, snowflake, spanner, unique, wait_for, Runner,
};

/// Rows of each account table, and each one's opening balance.
const ACCOUNTS: i64 = 50;
const OPENING: i64 = 1000;
const TOTAL: i64 = 2 * ACCOUNTS * OPENING;
/// How long one step may take to reach the destination.
const STEP: Duration = Duration::from_secs(180);

enum Dest {
    Postgres(postgres::Destination),
    BigQuery(bigquery::Datasets),
    Snowflake(Box<snowflake::Schemas>),
    /// A Redshift schema (PostgreSQL in the sink's test mode) and the
    /// consumer group.
    Redshift(redshift::Warehouse, String),
    Spanner(spanner::Database),
}

impl Dest {
    fn section(&self) -> String {
        match self {
            Dest::Postgres(d) => format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", pg_destination_url(), d.schema),
            Dest::BigQuery(d) => d.runner_section(),
            Dest::Snowflake(d) => d.runner_section(),
            Dest::Redshift(w, _) => w.runner_section(),
            // Tables named as the source names them (one database per test).
            Dest::Spanner(d) => format!("{}table = \"{{table}}\"\n", d.runner_section()),
        }
    }

    fn group(&self) -> String {
        match self {
            Dest::Postgres(d) => d.group.clone(),
            Dest::BigQuery(d) => d.group.clone(),
            Dest::Snowflake(d) => d.group.clone(),
            Dest::Redshift(_, group) => group.clone(),
            Dest::Spanner(d) => d.group.clone(),
        }
    }

    fn table(&self, name: &str) -> String {
        match self {
            Dest::Postgres(d) => format!("\"{}\".\"{name}\"", d.schema),
            Dest::BigQuery(d) => d.table(name),
            Dest::Snowflake(d) => d.table(name),
            Dest::Redshift(w, _) => format!("\"{}\".\"{name}\"", w.schema),
            Dest::Spanner(_) => name.to_string(),
        }
    }

    /// A column, as the destination's SQL names it.
    fn col(&self, name: &str) -> String {
        match self {
            Dest::Snowflake(_) => format!("\"{name}\""),
            _ => name.to_string(),
        }
    }

    fn text(&self, expr: &str) -> String {
        match self {
            Dest::Postgres(_) | Dest::Redshift(..) => format!("({expr})::text"),
            Dest::BigQuery(_) | Dest::Spanner(_) => format!("CAST(({expr}) AS STRING)"),
            Dest::Snowflake(_) => format!("CAST(({expr}) AS VARCHAR)"),
        }
    }

    async fn query(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        match self {
            Dest::Postgres(d) => text_rows(&d.admin, sql).await,
            Dest::BigQuery(_) => bigquery::query(sql).await,
            Dest::Snowflake(d) => d.query(sql).await,
            Dest::Redshift(w, _) => text_rows(&w.admin, sql).await,
            Dest::Spanner(d) => d.query(sql).await,
        }
    }

    /// The invariants' numbers in one query (one snapshot of the
    /// destination): the accounts' total, the lines the orders count less
    /// the lines there are, and the rows of each table. `None` while a
    /// table does not exist yet.
    async fn sample(&self) -> Option<[i64; 5]> {
        let (a, b, o, l) =
            (self.table("accounts_a"), self.table("accounts_b"), self.table("orders"), self.table("order_lines"));
        let (balance, lines) = (self.col("balance"), self.col("lines"));
        let sql = format!(
            "SELECT {}, {}, {}, {}, {}",
            self.text(&format!(
                "(SELECT COALESCE(SUM({balance}), 0) FROM {a}) + (SELECT COALESCE(SUM({balance}), 0) FROM {b})"
            )),
            self.text(&format!("(SELECT COALESCE(SUM({lines}), 0) FROM {o}) - (SELECT COUNT(*) FROM {l})")),
            self.text(&format!("(SELECT COUNT(*) FROM {a}) + (SELECT COUNT(*) FROM {b})")),
            self.text(&format!("SELECT COUNT(*) FROM {o}")),
            self.text(&format!("SELECT COUNT(*) FROM {l}")),
        );
        let rows = self.query(&sql).await.ok()?;
        let row = rows.first()?;
        let mut out = [0i64; 5];
        for (o, cell) in out.iter_mut().zip(row) {
            *o = cell.as_deref()?.parse::<f64>().ok()? as i64;
        }
        Some(out)
    }

    /// `transaction_id` and `committed_at` of the copy's `consistent_as_of`.
    async fn consistent_as_of(&self) -> Option<(String, String)> {
        let sql = format!(
            "SELECT {}, {} FROM {} WHERE {} = '{}'",
            self.col("transaction_id"),
            self.text(&self.col("committed_at")),
            self.table("consistent_as_of"),
            self.col("copy"),
            self.group()
        );
        let rows = self.query(&sql).await.ok()?;
        let row = rows.first()?;
        Some((row.first()?.clone()?, row.get(1)?.clone()?))
    }

    async fn cleanup(self) {
        match self {
            Dest::Postgres(d) => d.cleanup().await,
            Dest::BigQuery(d) => d.cleanup().await,
            Dest::Snowflake(d) => d.cleanup().await,
            Dest::Redshift(w, group) => w.cleanup(&[group]).await,
            Dest::Spanner(d) => d.cleanup().await,
        }
    }
}

/// A query's rows as text, over PostgreSQL's protocol.
async fn text_rows(client: &tokio_postgres::Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let messages = client.simple_query(sql).await.map_err(|e| e.to_string())?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

/// The source's numbers, as [`Dest::sample`] reads the destination's.
async fn source_sample(pg: &tokio_postgres::Client, name: &str) -> [i64; 5] {
    let row = pg
        .query_one(
            &format!(
                "SELECT ((SELECT SUM(balance) FROM {name}.accounts_a) + (SELECT SUM(balance) FROM {name}.accounts_b))::bigint,
                        ((SELECT COALESCE(SUM(lines), 0) FROM {name}.orders) - (SELECT COUNT(*) FROM {name}.order_lines))::bigint,
                        (SELECT COUNT(*) FROM {name}.accounts_a) + (SELECT COUNT(*) FROM {name}.accounts_b),
                        (SELECT COUNT(*) FROM {name}.orders), (SELECT COUNT(*) FROM {name}.order_lines)"
            ),
            &[],
        )
        .await
        .expect("source numbers");
    let n = |i: usize| -> i64 { row.get(i) };
    [n(0), n(1), n(2), n(3), n(4)]
}

/// What the reader saw.
#[derive(Default)]
struct Seen {
    samples: u64,
    violations: Vec<String>,
}

/// Lines of the large orders of [`Faults::large`]: about 100 KB of
/// records in one source transaction, over [`LARGE_SINK_CONFIG`]'s bound.
const LARGE_ORDER_LINES: i64 = 1500;
/// A sink runner that may hold 64 KiB of records (and batches of 16 KiB).
const LARGE_SINK_CONFIG: &str = "batch_max_bytes = 16384\nmax_buffered_bytes = 65536\n";

/// Transfers and orders, one source transaction each, until `stop`; with
/// `large`, every 40th is an order of [`LARGE_ORDER_LINES`] lines (and its
/// delete later is as large).
async fn workload(name: String, stop: Arc<AtomicBool>, large: bool) -> u64 {
    let pg = postgres::connect(&pg_source_url()).await;
    let mut n: i64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (from, to, amount) = (n % ACCOUNTS + 1, (n * 7) % ACCOUNTS + 1, n % 13 + 1);
        let (a, b) = if n % 2 == 0 {
            ("accounts_a", "accounts_b")
        } else {
            ("accounts_b", "accounts_a")
        };
        let lines = if large && n % 40 == 0 {
            LARGE_ORDER_LINES
        } else {
            n % 4 + 1
        };
        let sql = match n % 5 {
            // An order and its lines.
            0 | 1 => format!(
                "BEGIN; INSERT INTO {name}.orders VALUES ({n}, {lines});
                 INSERT INTO {name}.order_lines SELECT {n}, g FROM generate_series(1, {lines}) g; COMMIT;"
            ),
            // An older order goes, with its lines.
            2 => format!(
                "BEGIN; DELETE FROM {name}.order_lines WHERE order_id = {old};
                 DELETE FROM {name}.orders WHERE id = {old}; COMMIT;",
                old = n - 20
            ),
            _ => format!(
                "BEGIN; UPDATE {name}.{a} SET balance = balance - {amount} WHERE id = {from};
                 UPDATE {name}.{b} SET balance = balance + {amount} WHERE id = {to}; COMMIT;"
            ),
        };
        if let Err(e) = pg.batch_execute(&sql).await {
            panic!("workload: {e}");
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    n as u64
}

/// Samples the destination every 100 ms until `stop`.
async fn reader(dest: Arc<Dest>, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    while !stop.load(Ordering::Relaxed) {
        if let Some(s) = dest.sample().await {
            seen.samples += 1;
            if s[0] != TOTAL || s[1] != 0 {
                seen.violations.push(format!(
                    "total {} (always {TOTAL} at the source), lines counted less lines there {} (always 0): {s:?}",
                    s[0], s[1]
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

fn stack(args: &[&str]) {
    let ok = Command::new("bash")
        .arg(tributary_tests::workspace_dir().join("scripts/stack"))
        .args(args)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "scripts/stack {} failed", args.join(" "));
}

/// How a run goes.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Transactional consistency, with the faults (a kill -9 of the
    /// applying sink member and of the source runner, a broker restart).
    transactional: bool,
    /// A second sink member stands by and takes over from the one killed.
    standby: bool,
    /// Source transactions larger than the sink runner's memory bound.
    large: bool,
}

/// Runs the workload into `dest` as `faults` says. Returns what the reader
/// saw.
async fn run(name: &str, dest: Dest, faults: Faults) -> Seen {
    let Faults { transactional, standby, large } = faults;
    let pg = postgres::connect(&pg_source_url()).await;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.accounts_a (id bigint PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE {name}.accounts_b (id bigint PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE {name}.orders (id bigint PRIMARY KEY, lines bigint NOT NULL);
         CREATE TABLE {name}.order_lines (order_id bigint, line bigint, PRIMARY KEY (order_id, line));
         INSERT INTO {name}.accounts_a SELECT i, {OPENING} FROM generate_series(1, {ACCOUNTS}) i;
         INSERT INTO {name}.accounts_b SELECT i, {OPENING} FROM generate_series(1, {ACCOUNTS}) i;
         INSERT INTO {name}.orders VALUES (-1, 2);
         INSERT INTO {name}.order_lines VALUES (-1, 1), (-1, 2);"
    ))
    .await
    .expect("source tables");
    let dir: PathBuf = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_config = dir.join("source.toml");
    std::fs::write(&source_config, format!("transaction_metadata = true\n{}", pg_source_runner_config(name)))
        .expect("source config");
    let mode = if transactional { "transactional" } else { "per_table" };
    // Two members of one group where `standby`: one applies the copy, the
    // other stands by (Kafka's range assignor gives every single-partition
    // topic to the same member).
    let members = if standby { 2 } else { 1 };
    let ports: Vec<u16> = (0..members).map(|_| free_port()).collect();
    let sink_configs: Vec<PathBuf> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let path = dir.join(format!("sink{i}.toml"));
            let config = sink_runner_config(name, &dest.group(), &dest.section())
                .replace("[admin]\nlisten = \"off\"", &format!("[admin]\nlisten = \"127.0.0.1:{port}\""));
            let bound = if large { LARGE_SINK_CONFIG } else { "" };
            std::fs::write(&path, format!("consistency = \"{mode}\"\n{bound}{config}")).expect("sink config");
            path
        })
        .collect();
    let source_log = dir.join("source.log");
    let sink_logs: Vec<PathBuf> = (0..members).map(|i| dir.join(format!("sink{i}.log"))).collect();
    let start_sink = |i: usize| Some(Runner::start("sink-runner", &sink_configs[i], &sink_logs[i]));
    eprintln!("logs: {}", dir.display());

    let source = Runner::start("source-runner", &source_config, &source_log);
    let mut sinks: Vec<Option<Runner>> = (0..members).map(start_sink).collect();
    let dest = Arc::new(dest);
    // The snapshot is not a transaction: the reader starts once it is in.
    let opening = source_sample(&pg, name).await;
    wait_for("the snapshot", STEP, || async { (dest.sample().await == Some(opening)).then_some(()) }).await;

    let stop = Arc::new(AtomicBool::new(false));
    let work = tokio::spawn(workload(name.to_string(), stop.clone(), large));
    let read = tokio::spawn(reader(dest.clone(), stop.clone()));
    let mut source = Some(source);
    if transactional {
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The member applying the copy, killed: the one standing by takes
        // it over (its session ends 6 s later), and it comes back as the
        // new standby.
        let active = if standby {
            wait_for("the member applying the copy", Duration::from_secs(60), || async {
                for (i, port) in ports.iter().enumerate() {
                    if runner_status(*port)
                        .await
                        .is_some_and(|s| s["consistency"]["transactions_applied"].as_u64() > Some(0))
                    {
                        return Some(i);
                    }
                }
                None
            })
            .await
        } else {
            0
        };
        if let Some(s) = sinks[active].take() {
            s.kill9();
        }
        tokio::time::sleep(Duration::from_secs(if standby { 10 } else { 2 })).await;
        sinks[active] = start_sink(active);
        tokio::time::sleep(Duration::from_secs(5)).await;
        if let Some(s) = source.take() {
            s.kill9();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        source = Some(Runner::start("source-runner", &source_config, &source_log));
        tokio::time::sleep(Duration::from_secs(5)).await;
        stack(&["restart", "kafka"]);
        tokio::time::sleep(Duration::from_secs(10)).await;
    } else {
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let transactions = work.await.expect("workload");
    let seen = read.await.expect("reader");
    eprintln!("{transactions} source transactions; {} samples, {} violations", seen.samples, seen.violations.len());

    if transactional {
        let want = source_sample(&pg, name).await;
        let deadline = Instant::now() + STEP;
        loop {
            let got = dest.sample().await;
            if got.as_ref() == Some(&want) {
                break;
            }
            if Instant::now() > deadline {
                // What CI shows of a copy that never caught up: where each
                // runner stands, and what it said last.
                let mut said = String::new();
                for (i, port) in ports.iter().enumerate() {
                    let status = runner_status(*port).await;
                    said += &format!(
                        "\n--- sink {i} /status: {status:?}\n--- sink {i} log:\n{}",
                        log_tail(&sink_logs[i], 60)
                    );
                }
                panic!(
                    "timed out after {STEP:?} waiting for the copy to equal the source: the source {want:?}, the copy \
                     {got:?}{said}\n--- source log:\n{}",
                    log_tail(&source_log, 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // The moment it reflects, in the destination and in the applying
        // member's /status and metrics.
        let (txid, committed) = wait_for("consistent_as_of", Duration::from_secs(30), || dest.consistent_as_of()).await;
        eprintln!("consistent as of transaction {txid}, committed {committed}");
        assert!(!txid.is_empty());
        let (status, port) = wait_for("consistency in /status", Duration::from_secs(30), || async {
            for port in &ports {
                let s = runner_status(*port).await?;
                if s["consistency"]["consistent_as_of"]["transaction_id"].as_str() == Some(txid.as_str()) {
                    return Some((s, *port));
                }
            }
            None
        })
        .await;
        assert_eq!(status["consistency"]["transactions_split"], 0, "{status}");
        if large {
            assert!(status["consistency"]["transactions_spanned"].as_u64() > Some(0), "{status}");
        }
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("tributary_consistent_as_of_timestamp_seconds") && !l.ends_with(" 0")),
            "{metrics}"
        );
    }
    drop(sinks);
    drop(source);
    e2e::delete_source_copy(&pg, &source_config, name).await;
    if let Ok(dest) = Arc::try_unwrap(dest) {
        dest.cleanup().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

async fn transactional(name: &str, dest: Dest, standby: bool) {
    whole(run(name, dest, Faults { transactional: true, standby, large: false }).await);
}

/// Asserts that the reader saw only states the source was in.
fn whole(seen: Seen) {
    // Every 100 ms for ~30 s; the emulators answer a query in 100-400 ms.
    assert!(seen.samples >= 30, "the reader read {} samples", seen.samples);
    assert!(
        seen.violations.is_empty(),
        "a reader saw a state the source never was in ({} of {} samples), first: {}",
        seen.violations.len(),
        seen.samples,
        seen.violations[0]
    );
}

#[tokio::test]
async fn a_reader_of_postgres_sees_only_whole_transactions_through_kill_9_a_standby_and_a_broker_restart() {
    let name = unique("cons_pg");
    transactional(&name, Dest::Postgres(postgres::Destination::new(&name).await), true).await;
}

#[tokio::test]
async fn a_reader_of_bigquery_sees_only_whole_transactions_through_kill_9_and_a_broker_restart() {
    let name = unique("cons_bq");
    transactional(&name, Dest::BigQuery(bigquery::Datasets::new(&name)), false).await;
}

#[tokio::test]
async fn a_reader_of_snowflake_sees_only_whole_transactions_through_kill_9_and_a_broker_restart() {
    let name = unique("cons_sf");
    transactional(&name, Dest::Snowflake(Box::new(snowflake::Schemas::new(&name))), false).await;
}

#[tokio::test]
async fn a_reader_of_redshift_sees_only_whole_transactions_through_kill_9_and_a_broker_restart() {
    let name = unique("cons_rs");
    let warehouse = redshift::Warehouse::new(&name).await;
    transactional(&name, Dest::Redshift(warehouse, unique(&name)), false).await;
}

#[tokio::test]
async fn a_reader_of_spanner_sees_only_whole_transactions_through_kill_9_and_a_broker_restart() {
    let name = unique("cons_sp");
    transactional(&name, Dest::Spanner(spanner::Database::new(&name).await), false).await;
}

/// Orders of 1,500 lines (and their deletes), each one source transaction
/// over the sink runner's memory bound (64 KiB), are applied whole in
/// PostgreSQL, in one destination transaction held open across batches,
/// through the same faults: the reader never sees part of one, and
/// nothing went in parts.
#[tokio::test]
async fn a_transaction_larger_than_the_sinks_memory_is_applied_whole_in_postgres() {
    let name = unique("cons_large");
    let dest = Dest::Postgres(postgres::Destination::new(&name).await);
    whole(run(&name, dest, Faults { transactional: true, standby: false, large: true }).await);
}

/// The same reader and workload into a per-table sink: it sees states the
/// source never was in.
#[tokio::test]
async fn per_table_mode_lets_a_reader_see_half_a_transaction() {
    let name = unique("cons_per_table");
    let seen = run(&name, Dest::Postgres(postgres::Destination::new(&name).await), Faults::default()).await;
    eprintln!("per table: {} of {} samples saw half a transaction", seen.violations.len(), seen.samples);
    assert!(
        !seen.violations.is_empty(),
        "per table, the reader never saw half a transaction in {} samples: the invariant test could not fail",
        seen.samples
    );
}

/// A table the source holds back (here: an incompatible type change, which
/// pauses it and copies it again) leaves the other tables of a transaction
/// whole and flowing: the END counts only the changes written, so the
/// transaction does not wait for the held table's change (it waited 60 s,
/// then went as "split", when the END counted it).
#[tokio::test]
async fn a_table_held_back_at_the_source_leaves_the_rest_of_its_transactions_flowing() {
    let name = unique("cons_held");
    let dest = postgres::Destination::new(&name).await;
    let pg = postgres::connect(&pg_source_url()).await;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.accounts_a (id bigint PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE {name}.accounts_b (id bigint PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO {name}.accounts_a SELECT i, {OPENING} FROM generate_series(1, 10) i;
         INSERT INTO {name}.accounts_b SELECT i, {OPENING} FROM generate_series(1, 10) i;"
    ))
    .await
    .expect("source tables");
    let dir: PathBuf = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_config = dir.join("source.toml");
    std::fs::write(&source_config, format!("transaction_metadata = true\n{}", pg_source_runner_config(&name)))
        .expect("source config");
    let port = free_port();
    let sink_config = dir.join("sink.toml");
    let section = format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", pg_destination_url(), dest.schema);
    let config = sink_runner_config(&name, &dest.group, &section)
        .replace("[admin]\nlisten = \"off\"", &format!("[admin]\nlisten = \"127.0.0.1:{port}\""));
    std::fs::write(&sink_config, format!("consistency = \"transactional\"\n{config}")).expect("sink config");
    eprintln!("logs: {}", dir.display());
    let source = Runner::start("source-runner", &source_config, &dir.join("source.log"));
    let sink = Runner::start("sink-runner", &sink_config, &dir.join("sink.log"));
    let b1 = |want: i64| {
        let dest = &dest;
        async move {
            let sql = format!("SELECT balance::text FROM \"{}\".accounts_b WHERE id = 1", dest.schema);
            let got = dest.admin.query_opt(&sql, &[]).await.ok().flatten()?;
            (got.get::<_, String>(0) == want.to_string()).then_some(())
        }
    };
    wait_for("the snapshot", STEP, || b1(OPENING)).await;
    // One transaction through both tables first, so that the copy is
    // streaming whole transactions.
    pg.batch_execute(&format!(
        "BEGIN; UPDATE {name}.accounts_a SET balance = balance - 1 WHERE id = 1;
         UPDATE {name}.accounts_b SET balance = balance + 1 WHERE id = 1; COMMIT;"
    ))
    .await
    .expect("a transfer");
    wait_for("the first transfer", STEP, || b1(OPENING + 1)).await;
    // accounts_a becomes text: held back at the source (and copied again).
    pg.batch_execute(&format!(
        "ALTER TABLE {name}.accounts_a ALTER COLUMN balance TYPE text;
         BEGIN; UPDATE {name}.accounts_a SET balance = 'held' WHERE id = 2;
         UPDATE {name}.accounts_b SET balance = balance + 5 WHERE id = 1; COMMIT;"
    ))
    .await
    .expect("a transaction through the held table");
    // Well before the 60 s an END waits for changes that do not come.
    wait_for("the rest of the transaction", Duration::from_secs(30), || b1(OPENING + 6)).await;
    let status = wait_for("the sink's status", Duration::from_secs(10), || runner_status(port)).await;
    assert_eq!(status["consistency"]["transactions_split"], 0, "{status}");
    drop(sink);
    drop(source);
    e2e::delete_source_copy(&pg, &source_config, &name).await;
    dest.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}
