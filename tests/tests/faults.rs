//! Proof of exactly once by breaking things on purpose: the fault-injection
//! suite (issue #10).
//!
//! A mixed workload (inserts, updates, deletes; transactions across three
//! tables) runs against the source while the harness, one fault at a time:
//! kills the source runner or the sink runner with SIGKILL at random moments
//! (the first of each during the snapshot), restarts the Kafka broker or the
//! schema registry, takes the destination database away (connections
//! refused and cut), stops the whole PostgreSQL server (source and
//! destination), revokes the sink's privileges, and writes rows the
//! destination refuses.
//!
//! At the end it checks, automatically:
//! * the destination equals the source (row count and a checksum of every
//!   column per table), apart from the deliberately bad rows;
//! * the change topics, read with `read_committed`, hold every committed
//!   source change exactly once and in order per key (each change bumps a
//!   per-row `version`; a snapshot read stands for the versions before it);
//! * the dead-letter topics hold exactly the bad rows, and the failed-records
//!   counter moved by their number (checked at each such fault);
//! * during each outage and revoke the sink's status said `paused` with a
//!   reason, and it came back by itself;
//! * neither runner exited on its own.
//!
//! Parameters (environment; `scripts/faults` sets them from flags):
//! `FAULTS` (default 10), `FAULT_SEED` (printed; replays a run's schedule),
//! `FAULT_RATE` (workload transactions per second, default 40),
//! `FAULT_DURATION` (seconds; spreads the faults over at least this long),
//! `FAULT_KINDS` (comma-separated subset of the kinds below),
//! `FAULT_SNAPSHOT_KILL` (1 by default: kill the source mid-snapshot; 0:
//! let the snapshot finish first, see [`check_topics`]).
//!
//! The harness drives the `source-runner` and `sink-runner` binaries and the
//! stack (`scripts/stack restart kafka`, ...), so it must run alone against
//! its stack: it is a test binary of its own with one test, and cargo runs
//! test binaries one after another.
//!
//! Adding a source or a sink: the source side is [`Workload`] (DDL, changes,
//! in-doubt resolution) plus [`checksums`]; the sink side is the config in
//! [`Pipeline::sink_config`] plus [`checksums`] on the destination. Each
//! new connector implements those against its own database.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::{ClientConfig, Message};
use tokio_postgres::{Client, NoTls};
use tributary_schemas::decoder::{Decoded, EventDecoder};
use tributary_schemas::registry::Registry;
use tributary_schemas::{Op, Value};
use tributary_tests::{
    committed_reader, kafka_bootstrap, pg_destination_url, pg_source_url, runner_binary, schema_registry_url, unique,
    wait_for, Rng,
};

/// Rows per table before the runners start: enough snapshot chunks that the
/// first kills land mid-snapshot.
const INITIAL_ROWS: [(&str, i64); 3] = [("accounts", 6_000), ("orders", 4_000), ("notes", 1_000)];
/// Rows per snapshot chunk (one Kafka transaction each).
const CHUNK_ROWS: u64 = 500;
/// Marks a row the destination refuses (a CHECK constraint there).
const BAD_PREFIX: &str = "BAD";
/// How long anything may take to come back after a fault.
const RECOVERY: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fault {
    KillSource,
    KillSink,
    RestartKafka,
    RestartRegistry,
    DestinationDown,
    StopPostgres,
    RevokeSink,
    BadRows,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::KillSource,
        Fault::KillSink,
        Fault::RestartKafka,
        Fault::RestartRegistry,
        Fault::DestinationDown,
        Fault::StopPostgres,
        Fault::RevokeSink,
        Fault::BadRows,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillSource => "kill-source",
            Fault::KillSink => "kill-sink",
            Fault::RestartKafka => "restart-kafka",
            Fault::RestartRegistry => "restart-registry",
            Fault::DestinationDown => "destination-down",
            Fault::StopPostgres => "stop-postgres",
            Fault::RevokeSink => "revoke-sink",
            Fault::BadRows => "bad-rows",
        }
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn workspace() -> PathBuf {
    tributary_tests::workspace_dir()
}

/// `scripts/stack ARGS` with this process's environment (ports).
fn stack(args: &[&str]) {
    let status = Command::new("bash")
        .arg(workspace().join("scripts/stack"))
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("run scripts/stack");
    assert!(status.success(), "scripts/stack {} failed", args.join(" "));
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Connects, waiting through an outage.
async fn connect_retrying(url: &str, stop: &AtomicBool) -> Option<Client> {
    loop {
        if let Ok(c) = connect(url).await {
            return Some(c);
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------- runners

/// A runner binary, restartable, with its log appended across restarts.
struct Runner {
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    admin: String,
}

impl Runner {
    fn new(package: &str, config: PathBuf, log: PathBuf, admin_port: u16) -> Self {
        Self {
            bin: runner_binary(package),
            config,
            log,
            child: None,
            admin: format!("http://127.0.0.1:{admin_port}"),
        }
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.bin.display());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("runner log");
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn runner");
        self.child = Some(child);
    }

    /// SIGKILL: no shutdown code runs.
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("kill -9");
            let _ = c.wait();
        }
    }

    /// A runner must never exit by itself: it pauses and retries instead.
    fn assert_alive(&mut self, when: &str) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "{} exited by itself ({status}) {when}; log tail:\n{}",
                    self.bin.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
    }

    async fn get(&self, path: &str) -> Option<String> {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
        let resp = client.get(format!("{}{path}", self.admin)).send().await.ok()?;
        resp.text().await.ok()
    }

    /// What is paused, with the reasons: the runner as a whole (`runner`)
    /// and tables in state `paused`.
    async fn paused_tables(&self) -> Option<Vec<(String, String)>> {
        let status: serde_json::Value = serde_json::from_str(&self.get("/status").await?).ok()?;
        let tables = status.get("tables")?.as_object()?;
        let mut out: Vec<(String, String)> = tables
            .iter()
            .filter(|(_, t)| t.get("state").and_then(|s| s.as_str()) == Some("paused"))
            .map(|(name, t)| (name.clone(), t.get("reason").and_then(|r| r.as_str()).unwrap_or_default().to_string()))
            .collect();
        if let Some(reason) = status.get("paused").and_then(|p| p.as_str()) {
            out.push(("runner".to_string(), reason.to_string()));
        }
        Some(out)
    }

    /// Sum of `tributary_failed_records_total` over tables whose label
    /// contains `table`.
    async fn failed_records(&self, table: &str) -> Option<u64> {
        let text = self.get("/metrics").await?;
        Some(
            text.lines()
                .filter(|l| l.starts_with("tributary_failed_records_total{") && l.contains(table))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64,
        )
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ---------------------------------------------------------------- the model

/// Every committed source change, per (table, id), in commit order.
#[derive(Default)]
struct Model {
    changes: HashMap<(String, i64), Vec<(Op, i64)>>,
    /// Live rows: table -> id -> version.
    live: HashMap<String, BTreeMap<i64, i64>>,
    next_id: HashMap<String, i64>,
    /// Ids of the notes the destination refuses.
    bad: HashSet<i64>,
    committed: u64,
    /// Changes per key committed before the first snapshot chunk was in
    /// Kafka: at least every change before the slot's consistent point.
    at_start: HashMap<(String, i64), usize>,
    in_doubt_committed: u64,
    in_doubt_rolled_back: u64,
}

impl Model {
    fn change_count(&self) -> usize {
        self.changes.values().map(Vec::len).sum()
    }
}

/// One planned statement; `apply` records it in the model once committed.
enum Stmt {
    Insert { table: &'static str, id: i64, sql: String },
    Update { table: &'static str, id: i64, sql: String },
    Delete { table: &'static str, id: i64, sql: String },
}

impl Stmt {
    fn sql(&self) -> &str {
        match self {
            Stmt::Insert { sql, .. } | Stmt::Update { sql, .. } | Stmt::Delete { sql, .. } => sql,
        }
    }

    fn apply(&self, m: &mut Model) {
        match self {
            Stmt::Insert { table, id, .. } => {
                m.live.entry(table.to_string()).or_default().insert(*id, 1);
                m.changes.entry((table.to_string(), *id)).or_default().push((Op::Create, 1));
            }
            Stmt::Update { table, id, .. } => {
                let v = m.live.get_mut(*table).and_then(|t| t.get_mut(id)).expect("updated row is live");
                *v += 1;
                let v = *v;
                m.changes.entry((table.to_string(), *id)).or_default().push((Op::Update, v));
            }
            Stmt::Delete { table, id, .. } => {
                let v = m.live.get_mut(*table).and_then(|t| t.remove(id)).expect("deleted row is live");
                m.changes.entry((table.to_string(), *id)).or_default().push((Op::Delete, v));
            }
        }
    }
}

/// The source side: schema, initial rows, the workload and in-doubt
/// resolution, for PostgreSQL.
struct Workload {
    url: String,
    schema: String,
    /// Not captured: one row per workload transaction, to tell after a
    /// lost connection whether its COMMIT happened.
    log_schema: String,
    model: Arc<Mutex<Model>>,
}

impl Workload {
    async fn create(&self, admin: &Client) {
        let (s, l) = (&self.schema, &self.log_schema);
        admin
            .batch_execute(&format!(
                "CREATE SCHEMA {s}; CREATE SCHEMA {l};
                 CREATE TABLE {l}.txlog (id uuid PRIMARY KEY);
                 CREATE TABLE {s}.accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), version bigint NOT NULL);
                 CREATE TABLE {s}.orders (id bigint PRIMARY KEY, account_id bigint NOT NULL, amount numeric(12,2) NOT NULL, note text, version bigint NOT NULL);
                 CREATE TABLE {s}.notes (id bigint PRIMARY KEY, payload text NOT NULL, version bigint NOT NULL);"
            ))
            .await
            .expect("create the source tables");
        let mut sql = String::new();
        {
            let mut m = self.model.lock().unwrap();
            for (table, rows) in INITIAL_ROWS {
                let values = match table {
                    "accounts" => "i, 'owner ' || i, (i % 1000) * 1.25, 1",
                    "orders" => "i, i % 500, (i % 700) * 0.5, CASE WHEN i % 3 = 0 THEN NULL ELSE 'n' || i END, 1",
                    _ => "i, 'payload ' || i, 1",
                };
                sql.push_str(&format!("INSERT INTO {s}.{table} SELECT {values} FROM generate_series(1, {rows}) i;"));
                for id in 1..=rows {
                    m.live.entry(table.to_string()).or_default().insert(id, 1);
                    m.changes.entry((table.to_string(), id)).or_default().push((Op::Create, 1));
                }
                m.next_id.insert(table.to_string(), rows + 1);
            }
        }
        admin.batch_execute(&sql).await.expect("initial rows");
    }

    /// Plans one transaction of 1-4 statements over the three tables.
    fn plan(&self, rng: &mut Rng) -> Vec<Stmt> {
        let s = &self.schema;
        let mut m = self.model.lock().unwrap();
        let mut out = Vec::new();
        let mut touched = HashSet::new();
        for _ in 0..1 + rng.below(4) {
            let table: &'static str = match rng.below(10) {
                0..=4 => "accounts",
                5..=8 => "orders",
                _ => "notes",
            };
            let kind = rng.below(10);
            if kind < 3 {
                let next = m.next_id.get_mut(table).expect("next id");
                let id = *next;
                *next += 1;
                let sql = match table {
                    "accounts" => format!(
                        "INSERT INTO {s}.accounts VALUES ({id}, 'owner {id}', {}.{:02}, 1)",
                        rng.below(100_000),
                        rng.below(100)
                    ),
                    "orders" => format!(
                        "INSERT INTO {s}.orders VALUES ({id}, {}, {}.50, 'new', 1)",
                        rng.below(500),
                        rng.below(10_000)
                    ),
                    _ => format!("INSERT INTO {s}.notes VALUES ({id}, 'note {id}', 1)"),
                };
                touched.insert((table, id));
                out.push(Stmt::Insert { table, id, sql });
                continue;
            }
            let live = m.live.get(table).expect("table");
            // Mostly recent rows: updates pile up on a hot set, so a lost or
            // repeated change would show.
            let hot = live.len() as u64;
            let Some((&id, _)) = live.iter().nth((hot - 1 - rng.below(hot.min(300))) as usize) else {
                continue;
            };
            if m.bad.contains(&id) && table == "notes" || !touched.insert((table, id)) {
                continue;
            }
            if kind < 4 {
                out.push(Stmt::Delete {
                    table,
                    id,
                    sql: format!("DELETE FROM {s}.{table} WHERE id = {id}"),
                });
            } else {
                let set = match table {
                    "accounts" => format!("balance = {}.{:02}", rng.below(100_000), rng.below(100)),
                    "orders" => format!("amount = amount + 1, note = 'u{}'", rng.below(1000)),
                    _ => format!("payload = 'edited {}'", rng.below(1000)),
                };
                out.push(Stmt::Update {
                    table,
                    id,
                    sql: format!("UPDATE {s}.{table} SET {set}, version = version + 1 WHERE id = {id}"),
                });
            }
        }
        // Plans are applied in the order they commit; a planned insert's id
        // is reserved, and a planned update or delete is on a row only this
        // task writes, so the model stays exact.
        drop(m);
        out
    }

    /// Runs `stmts` as one transaction; through an outage it retries, and a
    /// transaction whose COMMIT outcome is unknown is resolved from the
    /// transaction log. Returns whether it committed (false only on stop).
    async fn run(&self, client: &mut Option<Client>, stmts: &[Stmt], stop: &AtomicBool) -> bool {
        let txid = uuid::Uuid::new_v4();
        let mut sql = String::from("BEGIN;");
        for st in stmts {
            sql.push_str(st.sql());
            sql.push(';');
        }
        sql.push_str(&format!("INSERT INTO {}.txlog VALUES ('{txid}'); COMMIT;", self.log_schema));
        loop {
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                *client = connect_retrying(&self.url, stop).await;
                let Some(c) = client.as_ref() else { return false };
                // Reconnected: did an earlier attempt commit?
                let done: bool = match c
                    .query_one(
                        &format!("SELECT EXISTS (SELECT 1 FROM {}.txlog WHERE id = $1)", self.log_schema),
                        &[&txid],
                    )
                    .await
                {
                    Ok(r) => r.get(0),
                    Err(_) => continue,
                };
                if done {
                    self.model.lock().unwrap().in_doubt_committed += 1;
                    break;
                }
            }
            let c = client.as_ref().expect("connected");
            match c.batch_execute(&sql).await {
                Ok(()) => break,
                Err(e) => {
                    assert!(e.as_db_error().is_none_or(|d| !d.code().code().starts_with("23")), "workload bug: {e}");
                    // Unknown outcome: drop the session, resolve on reconnect.
                    *client = None;
                    self.model.lock().unwrap().in_doubt_rolled_back += 1;
                }
            }
        }
        let mut m = self.model.lock().unwrap();
        for st in stmts {
            st.apply(&mut m);
        }
        m.committed += 1;
        true
    }

    /// Writes `n` notes the destination refuses; returns their ids.
    async fn bad_rows(&self, client: &mut Option<Client>, n: u64, stop: &AtomicBool) -> Vec<i64> {
        let mut stmts = Vec::new();
        {
            let mut m = self.model.lock().unwrap();
            for _ in 0..n {
                let next = m.next_id.get_mut("notes").expect("notes");
                let id = *next;
                *next += 1;
                m.bad.insert(id);
                stmts.push(Stmt::Insert {
                    table: "notes",
                    id,
                    sql: format!("INSERT INTO {}.notes VALUES ({id}, '{BAD_PREFIX} {id}', 1)", self.schema),
                });
            }
        }
        assert!(self.run(client, &stmts, stop).await, "bad rows written");
        stmts
            .iter()
            .map(|s| if let Stmt::Insert { id, .. } = s { *id } else { 0 })
            .collect()
    }
}

/// Row count and an md5 over every column of each table, in id order;
/// `where_` filters rows (the bad rows are left out on both sides).
async fn checksums(client: &Client, schema: &str) -> Result<BTreeMap<String, (i64, String)>, tokio_postgres::Error> {
    let mut out = BTreeMap::new();
    for (table, cols, filter) in [
        ("accounts", "id::text, owner, balance::numeric(12,2)::text, version::text", "true"),
        (
            "orders",
            "id::text, account_id::text, amount::numeric(12,2)::text, coalesce(note, '<null>'), version::text",
            "true",
        ),
        ("notes", "id::text, payload, version::text", "payload NOT LIKE 'BAD%'"),
    ] {
        let q = format!(
            "SELECT count(*), coalesce(md5(string_agg(concat_ws('|', {cols}), ',' ORDER BY id)), '') \
             FROM {schema}.{table} WHERE {filter}"
        );
        let row = client.query_one(q.as_str(), &[]).await?;
        out.insert(table.to_string(), (row.get(0), row.get(1)));
    }
    Ok(out)
}

// ---------------------------------------------------------------- topics

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int16(x) => Some(i64::from(*x)),
        Value::Int32(x) => Some(i64::from(*x)),
        Value::Int64(x) => Some(*x),
        _ => None,
    }
}

type Seen = Arc<Mutex<HashMap<(String, i64), Vec<(Op, i64)>>>>;

/// The reader's own failures (a record that does not decode), reported by
/// the waits instead of dying unseen in a spawned task.
type ReaderErrors = Arc<Mutex<Vec<String>>>;

/// Collects (op, version) per key from the change topics, `read_committed`.
fn collect(pattern: String, stop: Arc<AtomicBool>, errors: ReaderErrors) -> Seen {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let consumer: StreamConsumer = committed_reader("faults-reader").create().expect("consumer");
        consumer.subscribe(&[&pattern]).expect("subscribe");
        let mut decoder = EventDecoder::new(Registry::new(schema_registry_url()).expect("registry"));
        while !stop.load(Ordering::Relaxed) {
            let m = match tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
                Ok(Ok(m)) => m,
                // Broker restarts and topics that do not exist yet.
                _ => continue,
            };
            let decoded = loop {
                match decoder.decode(m.topic(), m.key(), m.payload()).await {
                    Ok(d) => break d,
                    // The registry may be restarting; the record is valid.
                    Err(e) if e.to_string().contains("registry") => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => {
                        errors.lock().unwrap().push(format!(
                            "a record on {} at offset {} does not decode: {e}",
                            m.topic(),
                            m.offset()
                        ));
                        break Decoded::Tombstone;
                    }
                }
            };
            if let Decoded::Change(e) = decoded {
                let cols = &e.schema.columns;
                let idx = |name: &str| cols.iter().position(|c| c.name == name).expect("column");
                let row = e.after.as_ref().or(e.before.as_ref()).expect("row image");
                let id = int(&row[idx("id")]).expect("id");
                let version = int(&row[idx("version")]).expect("version");
                out.lock()
                    .unwrap()
                    .entry((e.schema.id.table.clone(), id))
                    .or_default()
                    .push((e.op, version));
            }
        }
    });
    seen
}

/// Reads a whole topic (to its end at the time of the call).
fn read_all(topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("faults-dlq"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let Ok(meta) = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
        return vec![];
    };
    let partitions = meta.topics().first().map(|t| t.partitions().len()).unwrap_or(0);
    if partitions == 0 {
        return vec![];
    }
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut eof = HashSet::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while eof.len() < partitions && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => out.push(m.detach()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            _ => {}
        }
    }
    assert_eq!(eof.len(), partitions, "read {topic} to its end");
    out
}

fn header(m: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Whether a key's last event is in: the last change, or a snapshot read of
/// the last version, or nothing for a row gone before the snapshot. (The
/// strict check is [`check_topics`].)
fn caught_up(want: &[(Op, i64)], got: &[(Op, i64)]) -> bool {
    match (want.last(), got.last()) {
        (Some(w), Some(g)) if w == g => true,
        (Some((wop, wv)), Some((Op::Read, gv))) => *wop != Op::Delete && wv == gv,
        (Some((Op::Delete, _)), None) => true,
        _ => false,
    }
}

/// The topic must show each committed change once, in order, per key:
/// exactly the model's changes, where a snapshot read stands for the changes
/// up to the version it read. No replay, gap or reordering is allowed, also
/// after a source crash during the snapshot.
///
/// One case differs after such a crash (`resumed_snapshot`), and is right:
/// the unfinished key ranges are read in a new snapshot after the stream has
/// caught up to it (docs/sources/postgresql.md, "Restart during the
/// snapshot"), so a row that existed at the first snapshot's point but was
/// deleted before its range was read has no read, only its changes from the
/// first point on: the committed changes from there, ending with the last.
fn check_topics(model: &Model, seen: &HashMap<(String, i64), Vec<(Op, i64)>>, resumed_snapshot: bool) {
    let mut problems = Vec::new();
    for (key, want) in &model.changes {
        let got = seen.get(key).cloned().unwrap_or_default();
        // At most one read per key; after a resumed snapshot it may follow
        // changes the stream emitted while catching up to that snapshot.
        let reads: Vec<usize> = got
            .iter()
            .enumerate()
            .filter(|(_, (op, _))| *op == Op::Read)
            .map(|(i, _)| i)
            .collect();
        if reads.len() > 1 {
            problems.push(format!("{key:?}: read more than once: {got:?}"));
            continue;
        }
        let (pre, read, rest) = match reads.first() {
            Some(&i) => (&got[..i], Some(got[i].1), &got[i + 1..]),
            None => (&got[..0], None, &got[..]),
        };
        // Where the events after the read must start in `want`.
        let from = match read {
            Some(v) => match want.iter().rposition(|(op, w)| *op != Op::Delete && *w == v) {
                Some(pos) => pos + 1,
                None => {
                    problems.push(format!("{key:?}: snapshot read at version {v}, never committed: {got:?}"));
                    continue;
                }
            },
            None => 0,
        };
        let at_start = model.at_start.get(key).copied().unwrap_or(0);
        // The changes before the read: none, or (after a resumed snapshot)
        // the committed changes from the first snapshot's point up to
        // exactly the version read.
        let pre_ok = pre.is_empty()
            || (resumed_snapshot
                && pre.len() <= from
                && want[from - pre.len()..from] == *pre
                && from - pre.len() <= at_start);
        if pre_ok && rest == &want[from.min(want.len())..] {
            continue;
        }
        // A row inserted and deleted before the snapshot: no events.
        if got.is_empty() && want.last().is_some_and(|(op, _)| *op == Op::Delete) {
            continue;
        }
        if resumed_snapshot && read.is_none() && !rest.is_empty() && want.ends_with(rest) {
            let start = want.len() - rest.len();
            if start <= at_start {
                // Changes from the first snapshot's point on, of a row that
                // existed before it and whose range was read after the row
                // was gone.
                continue;
            }
        }
        problems.push(format!(
            "{key:?}: got {got:?}, expected {:?} after the read {read:?}",
            &want[from.min(want.len())..]
        ));
    }
    for key in seen.keys() {
        if !model.changes.contains_key(key) {
            problems.push(format!("{key:?}: events for a row never written"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} keys differ from the committed changes (lost, repeated or out of order), first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
}

/// Lets connections into the destination database again if the harness
/// fails while it is taken away, so that later tests find it usable.
struct AllowConnections(Option<String>);

impl Drop for AllowConnections {
    fn drop(&mut self) {
        let Some(db) = self.0.take() else { return };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(c) = connect(&pg_source_url()).await {
                    let _ = c
                        .batch_execute(&format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS true"))
                        .await;
                }
            });
        })
        .join();
    }
}

// ---------------------------------------------------------------- pipeline

struct Pipeline {
    dir: PathBuf,
    sink_role: String,
    source: Runner,
    sink: Runner,
}

impl Pipeline {
    fn source_config(name: &str, admin_port: u16) -> String {
        format!(
            r#"name = "{name}"
schema_registry_url = "{registry}"

[kafka]
bootstrap_servers = "{kafka}"

[admin]
listen = "127.0.0.1:{admin_port}"

[postgres]
url = "{url}"
slot_name = "{name}"
publication_name = "{name}"
include = ["{name}.*"]
snapshot_chunk_rows = {CHUNK_ROWS}
heartbeat_interval_ms = 1000
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
            url = pg_source_url(),
        )
    }

    fn sink_config(name: &str, role_url: &str, admin_port: u16) -> String {
        format!(
            r#"prefix = "{name}"
consumer_group = "{name}-sink"
schema_registry_url = "{registry}"
batch_max_records = 2000

[kafka]
bootstrap_servers = "{kafka}"

[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "1000"

[admin]
listen = "127.0.0.1:{admin_port}"

[postgres]
url = "{role_url}"
lock_timeout_ms = 5000
connect_timeout_ms = 3000
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
        )
    }

    fn new(name: &str, role_url: &str, sink_role: &str) -> Self {
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (sp, kp) = (free_port(), free_port());
        std::fs::write(dir.join("source.toml"), Self::source_config(name, sp)).expect("source config");
        std::fs::write(dir.join("sink.toml"), Self::sink_config(name, role_url, kp)).expect("sink config");
        eprintln!("logs: {}/{{source,sink}}.log", dir.display());
        Self {
            source: Runner::new("source-runner", dir.join("source.toml"), dir.join("source.log"), sp),
            sink: Runner::new("sink-runner", dir.join("sink.toml"), dir.join("sink.log"), kp),
            dir,
            sink_role: sink_role.to_string(),
        }
    }

    fn assert_alive(&mut self, when: &str) {
        self.source.assert_alive(when);
        self.sink.assert_alive(when);
    }
}

/// Waits until the sink reports a paused table with a reason, then (after
/// `restore`) until nothing is paused: the outage was seen and it came back
/// by itself.
async fn paused_then_resumed<F: std::future::Future<Output = ()>>(sink: &Runner, what: &str, restore: F) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let reason = loop {
        if let Some(r) = sink
            .paused_tables()
            .await
            .and_then(|p| p.into_iter().find(|(_, r)| !r.is_empty()))
        {
            break r;
        }
        if Instant::now() > deadline {
            panic!("{what}: the sink never reported paused within 60s\n{}", diagnostics(sink).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("  {what}: paused ({}: {})", reason.0, reason.1.chars().take(160).collect::<String>());
    restore.await;
    wait_for(&format!("{what}: the sink resumes by itself"), RECOVERY, || async {
        sink.paused_tables().await.filter(|p| p.is_empty()).map(|_| ())
    })
    .await;
}

/// What the sink and its database sessions were doing, for a failure
/// message.
async fn diagnostics(sink: &Runner) -> String {
    let status = sink.get("/status").await.unwrap_or_else(|| "<no status>".into());
    let mut sessions = String::new();
    if let Ok(c) = connect(&pg_source_url()).await {
        let q = "SELECT datname, usename, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''), \
                 (now() - query_start)::text, left(query, 200) FROM pg_stat_activity WHERE usename LIKE 'faults%'";
        if let Ok(rows) = c.query(q, &[]).await {
            for r in rows {
                let cols: Vec<String> = (0..7).map(|i| r.get::<_, Option<String>>(i).unwrap_or_default()).collect();
                sessions.push_str(&format!("  {}\n", cols.join(" | ")));
            }
        }
    }
    format!("sink status: {status}\nsink sessions:\n{sessions}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_lose_and_duplicate_nothing() {
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128() as u64 | 1);
    let faults = env_num("FAULTS", 10);
    let rate = env_num("FAULT_RATE", 40).max(1);
    let duration = Duration::from_secs(env_num("FAULT_DURATION", 0));
    let snapshot_kill = env_num("FAULT_SNAPSHOT_KILL", 1) == 1;
    let kinds: Vec<Fault> = match std::env::var("FAULT_KINDS") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|k| {
                *Fault::ALL
                    .iter()
                    .find(|f| f.name() == k.trim())
                    .unwrap_or_else(|| panic!("unknown fault kind {k}"))
            })
            .collect(),
        _ => Fault::ALL.to_vec(),
    };
    eprintln!(
        "FAULT_SEED={seed} FAULTS={faults} FAULT_RATE={rate} FAULT_DURATION={} FAULT_SNAPSHOT_KILL={} FAULT_KINDS={}",
        duration.as_secs(),
        u8::from(snapshot_kill),
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
    );
    let mut rng = Rng(seed | 1);
    let started = Instant::now();

    let name = unique("faults");
    let admin_src = connect(&pg_source_url()).await.expect("source");
    let admin_dst = connect(&pg_destination_url()).await.expect("destination");

    // The sink writes as a role of its own (not a superuser), so that its
    // rights can be taken away.
    let role = format!("{name}_sink");
    {
        let boot = tributary_connectors::sinks::postgres::PostgresSink::new(
            tributary_connectors::sinks::postgres::PostgresSinkConfig::new(
                pg_destination_url(),
                format!("{name}-boot"),
            ),
        );
        boot.expect("sink config").connect().await.expect("bookkeeping tables");
    }
    admin_dst
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'pw'; CREATE SCHEMA {name} AUTHORIZATION {role};
             GRANT USAGE ON SCHEMA tributary TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.offsets TO {role};"
        ))
        .await
        .expect("sink role");
    let dst: tokio_postgres::Config = pg_destination_url().parse().expect("destination url");
    let port = dst.get_ports().first().copied().unwrap_or(5432);
    let db = dst.get_dbname().unwrap_or("destination").to_string();
    let role_url = format!("postgres://{role}:pw@127.0.0.1:{port}/{db}");

    let model = Arc::new(Mutex::new(Model::default()));
    let workload = Arc::new(Workload {
        url: pg_source_url(),
        schema: name.clone(),
        log_schema: format!("{name}_log"),
        model: model.clone(),
    });
    workload.create(&admin_src).await;

    // A reader for the start only (the first snapshot chunk); the topics
    // are read again from the beginning, by a fresh consumer, at the end: a
    // consumer living through all the broker restarts would test the
    // harness's librdkafka as much as the runners.
    let pattern = format!("^{name}\\.{name}\\.(accounts|orders|notes)$");
    let stop_reader = Arc::new(AtomicBool::new(false));
    let reader_errors: ReaderErrors = Arc::default();
    let seen = collect(pattern.clone(), stop_reader.clone(), reader_errors.clone());

    // The workload: `rate` transactions a second until told to stop.
    let stop_workload = Arc::new(AtomicBool::new(false));
    let work = {
        let (w, stop) = (workload.clone(), stop_workload.clone());
        let mut wrng = Rng(rng.next() | 1);
        tokio::spawn(async move {
            let mut client = None;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let plan = w.plan(&mut wrng);
                if !plan.is_empty() && !w.run(&mut client, &plan, &stop).await {
                    break;
                }
            }
        })
    };

    let mut p = Pipeline::new(&name, &role_url, &role);
    let reads = |seen: &Seen| {
        seen.lock()
            .unwrap()
            .values()
            .filter(|v| v.first().is_some_and(|(op, _)| *op == Op::Read))
            .count()
    };

    p.source.start();
    // The slot (and its consistent point) exists once the first snapshot
    // chunk is in Kafka: every change before it is at most what the
    // snapshot stands for.
    wait_for("the first snapshot chunk", RECOVERY, || async { (reads(&seen) > 0).then_some(()) }).await;
    {
        let mut m = model.lock().unwrap();
        m.at_start = m.changes.iter().map(|(k, v)| (k.clone(), v.len())).collect();
    }
    stop_reader.store(true, Ordering::Relaxed);
    if snapshot_kill {
        // Kill the source during its snapshot, right after that chunk.
        p.source.kill9();
        eprintln!("[{:>5.1}s] fault: kill-source during the snapshot", started.elapsed().as_secs_f64());
        p.source.start();
    } else {
        // Strict mode: no source crash until the snapshot is done.
        wait_for("the snapshot of every table", RECOVERY, || async {
            let status: serde_json::Value = serde_json::from_str(&p.source.get("/status").await?).ok()?;
            let tables = status.get("tables")?.as_object()?;
            (tables.len() == INITIAL_ROWS.len()
                && tables
                    .values()
                    .all(|t| t.get("state").and_then(|s| s.as_str()) == Some("streaming")))
            .then_some(())
        })
        .await;
    }

    // Kill the sink while it applies the snapshot.
    p.sink.start();
    let q = format!("SELECT count(*) FROM {name}.accounts");
    wait_for("the first applied rows", RECOVERY, || async {
        admin_dst
            .query_one(q.as_str(), &[])
            .await
            .ok()
            .map(|r| r.get::<_, i64>(0))
            .filter(|n| *n > 0)
    })
    .await;
    p.sink.kill9();
    eprintln!("[{:>5.1}s] fault: kill-sink during the snapshot", started.elapsed().as_secs_f64());
    p.sink.start();

    // The destination refuses what the bad-rows fault writes.
    wait_for("the notes table in the destination", RECOVERY, || async {
        admin_dst
            .batch_execute(&format!("ALTER TABLE {name}.notes ADD CONSTRAINT faults_no_bad CHECK (payload NOT LIKE '{BAD_PREFIX}%') NOT VALID"))
            .await
            .ok()
    })
    .await;

    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut bad_rows: Vec<i64> = Vec::new();
    let mut bad_client = None;
    let gap = if faults > 0 {
        duration / faults as u32
    } else {
        Duration::ZERO
    };
    for i in 0..faults {
        let fault_started = Instant::now();
        let fault = kinds[rng.below(kinds.len() as u64) as usize];
        *counts.entry(fault.name()).or_default() += 1;
        // A random moment: mid-batch, mid-transaction, during a commit.
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        p.assert_alive(&format!("before fault {i}"));
        eprintln!("[{:>5.1}s] fault {}/{faults}: {}", started.elapsed().as_secs_f64(), i + 1, fault.name());
        match fault {
            Fault::KillSource => {
                p.source.kill9();
                tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
                p.source.start();
            }
            Fault::KillSink => {
                p.sink.kill9();
                tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
                p.sink.start();
            }
            Fault::RestartKafka => stack(&["restart", "kafka"]),
            Fault::RestartRegistry => stack(&["restart", "registry"]),
            Fault::StopPostgres => {
                stack(&["stop", "postgres"]);
                tokio::time::sleep(Duration::from_millis(2000 + rng.below(6000))).await;
                stack(&["start", "postgres"]);
            }
            Fault::DestinationDown => {
                // New sessions refused, the sink's cut: the destination is
                // gone for the sink while the source keeps writing.
                // (From another database of the server: the one taken away
                // is not to be used.)
                let c = connect(&pg_source_url()).await.expect("admin session");
                let mut guard = AllowConnections(Some(db.clone()));
                c.batch_execute(&format!(
                    "ALTER DATABASE {db} WITH ALLOW_CONNECTIONS false; \
                     SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
                ))
                .await
                .unwrap_or_else(|e| panic!("take the destination away: {e:?}"));
                paused_then_resumed(&p.sink, "destination-down", async {
                    c.batch_execute(&format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS true"))
                        .await
                        .expect("bring the destination back");
                })
                .await;
                guard.0 = None;
            }
            Fault::RevokeSink => {
                let c = connect(&pg_destination_url()).await.expect("admin session");
                c.batch_execute(&format!("REVOKE INSERT, UPDATE ON tributary.offsets FROM {}", p.sink_role))
                    .await
                    .expect("revoke");
                paused_then_resumed(&p.sink, "revoke-sink", async {
                    c.batch_execute(&format!("GRANT INSERT, UPDATE ON tributary.offsets TO {}", p.sink_role))
                        .await
                        .expect("grant");
                })
                .await;
            }
            Fault::BadRows => {
                let before = wait_for("the sink's metrics", RECOVERY, || p.sink.failed_records("notes")).await;
                let n = 1 + rng.below(3);
                let ids = workload.bad_rows(&mut bad_client, n, &stop_workload).await;
                bad_rows.extend(&ids);
                wait_for(&format!("{n} more failed records"), RECOVERY, || async {
                    p.sink.failed_records("notes").await.filter(|now| *now >= before + n)
                })
                .await;
                let now = p.sink.failed_records("notes").await.unwrap_or(0);
                assert_eq!(now, before + n, "the failed counter moves by the number of bad rows");
            }
        }
        p.assert_alive(&format!("after fault {i} ({})", fault.name()));
        if let Some(rest) = gap.checked_sub(fault_started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }

    // Quiesce and compare.
    stop_workload.store(true, Ordering::Relaxed);
    work.await.expect("workload task");
    let (committed, changes) = {
        let m = model.lock().unwrap();
        (m.committed, m.change_count())
    };
    eprintln!(
        "[{:>5.1}s] workload stopped: {committed} transactions, {changes} changes; catching up",
        started.elapsed().as_secs_f64()
    );
    // (The admin sessions may have died with a PostgreSQL stop.)
    let admin_src = connect(&pg_source_url()).await.expect("source");
    let admin_dst = connect(&pg_destination_url()).await.expect("destination");
    let want = checksums(&admin_src, &name).await.expect("source checksums");
    let deadline = Instant::now() + RECOVERY;
    let last = loop {
        p.assert_alive("while catching up");
        if let Ok(got) = checksums(&admin_dst, &name).await {
            if got == want {
                break got;
            }
            assert!(Instant::now() < deadline, "the destination differs from the source: {got:?}, want {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("destination equals the source: {last:?}");
    let stop_reader = Arc::new(AtomicBool::new(false));
    let seen = collect(pattern, stop_reader.clone(), reader_errors.clone());
    let deadline = Instant::now() + RECOVERY;
    loop {
        let behind: Vec<String> = {
            let seen = seen.lock().unwrap();
            let m = model.lock().unwrap();
            m.changes
                .iter()
                .filter(|(k, want)| !caught_up(want, seen.get(*k).map(Vec::as_slice).unwrap_or(&[])))
                .take(10)
                .map(|(k, want)| format!("{k:?}: want {want:?}, got {:?}", seen.get(k)))
                .collect()
        };
        let errors = reader_errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "the change topics hold records that do not decode: {errors:#?}");
        if behind.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the topics lack the last change of some keys: {behind:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_reader.store(true, Ordering::Relaxed);
    check_topics(&model.lock().unwrap(), &seen.lock().unwrap(), snapshot_kill);

    // Dead letters: exactly the bad rows (a crash between the DLQ write and
    // the offset commit may repeat one; its source offset tells).
    let mut dead: BTreeMap<(String, String), usize> = BTreeMap::new();
    for table in ["accounts", "orders", "notes"] {
        for m in read_all(&format!("{name}.{name}.{table}.dlq")) {
            assert_eq!(table, "notes", "only bad notes are dead-lettered, found one of {table}");
            let reason = header(&m, sink_runner::dlq::HEADER_REASON).unwrap_or_default();
            assert!(reason.starts_with("permanent"), "reason header: {reason}");
            let at = (
                header(&m, sink_runner::dlq::HEADER_PARTITION).unwrap_or_default(),
                header(&m, sink_runner::dlq::HEADER_OFFSET).unwrap_or_default(),
            );
            *dead.entry(at).or_default() += 1;
        }
    }
    let repeated = dead.values().filter(|n| **n > 1).count();
    assert_eq!(dead.len(), bad_rows.len(), "one dead letter per bad row");
    let in_doubt = {
        let m = model.lock().unwrap();
        (m.in_doubt_committed, m.in_doubt_rolled_back)
    };
    p.assert_alive("at the end");
    eprintln!(
        "PASSED seed={seed}: {faults} faults {counts:?}, {committed} transactions, {changes} changes, \
         {} bad rows dead-lettered ({repeated} written twice), in-doubt commits resolved {}/{}, \
         {:.0}s",
        bad_rows.len(),
        in_doubt.0,
        in_doubt.1,
        started.elapsed().as_secs_f64()
    );

    // Tidy up.
    p.source.kill9();
    p.sink.kill9();
    for (runner, args) in [
        ("source-runner", vec!["delete", "--yes"]),
        ("sink-runner", vec!["delete", "--yes", "--drop-destination"]),
    ] {
        let config = p.dir.join(if runner == "source-runner" {
            "source.toml"
        } else {
            "sink.toml"
        });
        let _ = Command::new(runner_binary(runner))
            .arg("--config")
            .arg(&config)
            .args(&args)
            .stdout(Stdio::null())
            .status();
    }
    let _ = admin_src
        .batch_execute(&format!("DROP SCHEMA {name} CASCADE; DROP SCHEMA {name}_log CASCADE"))
        .await;
    let _ = admin_dst
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
    let _ = std::fs::remove_dir_all(Path::new(&p.dir));
}
