//! Proof of exactly once by breaking things on purpose: the fault-injection
//! suite (issue #10), over four pipelines (one test each):
//!
//! | test | source | sink |
//! |---|---|---|
//! | `postgres_to_postgres` | PostgreSQL | PostgreSQL |
//! | `mariadb_to_postgres` | MariaDB (the MySQL source) | PostgreSQL |
//! | `postgres_to_bigquery` | PostgreSQL | the BigQuery emulator |
//! | `postgres_to_redshift` | PostgreSQL | PostgreSQL as Redshift (the sink's test mode), staging in moto |
//! | `postgres_to_snowflake` | PostgreSQL | the Snowflake emulator (fakesnow) |
//!
//! A mixed workload (inserts, updates, deletes; transactions across three
//! tables) runs against the source while the harness, one fault at a time:
//! kills the source runner or one of the sink's two members (one consumer
//! group) with SIGKILL at random moments (the first of each during the
//! snapshot), freezes a sink member (SIGSTOP) past its session, restarts the
//! Kafka broker or the schema registry, takes the destination away
//! (connections refused and cut, or the emulator stopped), stops the
//! PostgreSQL server (whatever of the pipeline lives there) or the MariaDB
//! server, revokes the sink's privileges, writes rows the destination
//! refuses, adds a partition to a change topic, deletes the source's offsets
//! topic (then `source-runner reset`), replays dead letters whose rows
//! changed since, and changes a table's schema (`ddl`: columns added with a
//! constant or a volatile default, retyped `USING` an expression, made
//! stored generated columns, dropped; a rewrite the log does not carry must
//! be copied again). The workload also changes primary keys. Each pipeline
//! leaves out the faults that do not exist for it, with the reason
//! ([`Pipeline::left_out`]): there is no privilege to revoke on the
//! emulator, and no MariaDB behind a PostgreSQL source.
//!
//! At the end it checks, automatically, for every pipeline:
//! * the destination equals the source: every column of every row of each
//!   table, read as text on both sides and compared row by row (decimals to
//!   their two places, BigQuery writes `1.5` for `1.50`), apart from the
//!   deliberately bad rows;
//! * the change topics, read with `read_committed`, hold every committed
//!   source change exactly once and in order per key (each change bumps a
//!   per-row `version`; a snapshot read stands for the versions before it),
//!   where a restart of the source during its snapshot may leave only the
//!   shape both sources document ([`check_topics`]: changes the stream
//!   caught up with before a read, never a change older than a read after
//!   it);
//! * the dead-letter topics hold exactly the bad rows (notes whose payload a
//!   CHECK of the PostgreSQL destination refuses; for BigQuery, notes due
//!   after 9999-12-31; for Snowflake, notes due `infinity`), and the
//!   failed-records counter moved by their
//!   number (checked at each such fault);
//! * during each outage and revoke the sink's status said `paused` with a
//!   reason, and it came back by itself;
//! * neither runner exited on its own.
//!
//! Parameters (environment; `scripts/faults` sets them from flags):
//! `FAULT_PIPELINES` (comma-separated pipeline names, e.g.
//! `mariadb-postgres`; default all), `FAULTS` (default 10 for
//! postgres-postgres, 4 for postgres-redshift and postgres-snowflake, 6
//! for the others), `FAULT_SEED` (printed; replays a run's schedule),
//! `FAULT_RATE` (workload transactions per second, default 40, 10 for
//! postgres-redshift and postgres-snowflake),
//! `FAULT_DURATION` (seconds; spreads the faults over at least this
//! long), `FAULT_KINDS` (comma-separated; each pipeline runs those of them
//! that apply to it, and is skipped if none does), `FAULT_SNAPSHOT_KILL` (1
//! by default: kill the source mid-snapshot; 0: let the snapshot finish
//! first, see [`check_topics`]).
//!
//! The harness drives the `source-runner` and `sink-runner` binaries and the
//! stack (`scripts/stack restart kafka`, ...), so it must run alone against
//! its stack: it is a test binary of its own, cargo runs test binaries one
//! after another, and its tests take [`ONE_AT_A_TIME`] in turn.
//!
//! Adding a source or a sink: the source side is [`SourceKind`] with
//! [`Source`] (its fixture and runner config) and [`SourceDb`] (DDL,
//! sessions for the workload, in-doubt lookups, rows); the sink side is
//! [`SinkKind`] with [`Destination`] (its config, rows, the outage and the
//! refused value). The workload's statements, the fault schedule, the topic
//! and dead-letter checks and the status checks are shared.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::Message;
use secrecy::ExposeSecret;
use tokio_postgres::{Client, NoTls};
use tributary_schemas::decoder::{Decoded, EventDecoder};
use tributary_schemas::registry::Registry;
use tributary_schemas::{Op, Value};
use tributary_tests::bigquery::{query as bigquery, Datasets};
use tributary_tests::mysql::Database as MariaDbDatabase;
use tributary_tests::postgres::{source_admin, Destination as PgDestination, SourceSchema};
use tributary_tests::redshift::{redshift_url, Warehouse as RedshiftWarehouse};
use tributary_tests::snowflake::Schemas as SfSchemas;
use tributary_tests::{
    committed_reader, header, kafka_bootstrap, pg_destination_url, pg_source_url, runner_binary, schema_registry_url,
    wait_for, Rng, Runner,
};

/// Rows per snapshot chunk (one Kafka transaction each).
const CHUNK_ROWS: u64 = 500;
/// Marks a row the destination refuses.
const BAD_PREFIX: &str = "BAD";
/// How long anything may take to come back after a fault.
const RECOVERY: Duration = Duration::from_secs(180);

/// The faults restart services every pipeline shares: one pipeline at a
/// time, also under `--test-threads=2`.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------- pipelines

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fault {
    KillSource,
    KillSink,
    RestartKafka,
    RestartRegistry,
    DestinationDown,
    StopPostgres,
    RestartMariaDb,
    RevokeSink,
    BadRows,
    FreezeSink,
    PartitionIncrease,
    OffsetsTopicLoss,
    ReplayDeadLetter,
    Ddl,
}

impl Fault {
    const ALL: [Fault; 14] = [
        Fault::KillSource,
        Fault::KillSink,
        Fault::RestartKafka,
        Fault::RestartRegistry,
        Fault::DestinationDown,
        Fault::StopPostgres,
        Fault::RestartMariaDb,
        Fault::RevokeSink,
        Fault::BadRows,
        Fault::FreezeSink,
        Fault::PartitionIncrease,
        Fault::OffsetsTopicLoss,
        Fault::ReplayDeadLetter,
        Fault::Ddl,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillSource => "kill-source",
            Fault::KillSink => "kill-sink",
            Fault::RestartKafka => "restart-kafka",
            Fault::RestartRegistry => "restart-registry",
            Fault::DestinationDown => "destination-down",
            Fault::StopPostgres => "stop-postgres",
            Fault::RestartMariaDb => "restart-mariadb",
            Fault::RevokeSink => "revoke-sink",
            Fault::BadRows => "bad-rows",
            Fault::FreezeSink => "freeze-sink",
            Fault::PartitionIncrease => "partition-increase",
            Fault::OffsetsTopicLoss => "offsets-topic-loss",
            Fault::ReplayDeadLetter => "replay-dead-letter",
            Fault::Ddl => "ddl",
        }
    }

    fn parse(name: &str) -> Fault {
        *Fault::ALL
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("unknown fault kind {name} (one of {})", Fault::ALL.map(Fault::name).join(", ")))
    }
}

/// A source, a sink and the faults that exist between them: every fault
/// but those it leaves out, each with the reason.
struct Pipeline {
    name: &'static str,
    source: SourceKind,
    sink: SinkKind,
    left_out: &'static [(Fault, &'static str)],
    /// Faults per run unless `FAULTS` says otherwise.
    default_faults: u64,
    /// Workload transactions per second unless `FAULT_RATE` says otherwise.
    default_rate: u64,
}

impl Pipeline {
    fn faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| !self.left_out.iter().any(|(l, _)| l == f))
            .collect()
    }
}

const NO_MARIADB: (Fault, &str) = (Fault::RestartMariaDb, "no MariaDB in this pipeline");

/// stop-postgres stops source and destination at once (one server).
const POSTGRES_POSTGRES: Pipeline = Pipeline {
    name: "postgres-postgres",
    source: SourceKind::Postgres,
    sink: SinkKind::Postgres,
    left_out: &[NO_MARIADB],
    default_faults: 10,
    default_rate: 40,
};

/// stop-postgres stops the destination's server, restart-mariadb the
/// source's.
const MARIADB_POSTGRES: Pipeline = Pipeline {
    name: "mariadb-postgres",
    source: SourceKind::MariaDb,
    sink: SinkKind::Postgres,
    left_out: &[(
        Fault::OffsetsTopicLoss,
        "the MySQL source keeps no position on the server (no slot): without its offsets topic a start is a \
         first start, a new snapshot, with nothing that could tell it the checkpoint was lost",
    )],
    default_faults: 6,
    default_rate: 40,
};

/// stop-postgres stops the source's server; destination-down stops the
/// emulator and starts it again.
const POSTGRES_BIGQUERY: Pipeline = Pipeline {
    name: "postgres-bigquery",
    source: SourceKind::Postgres,
    sink: SinkKind::BigQuery,
    left_out: &[
        (Fault::RevokeSink, "the emulator has no privileges to take away"),
        NO_MARIADB,
        (
            Fault::ReplayDeadLetter,
            "BigQuery refuses the bad rows by type (a DATE after 9999-12-31): nothing at the destination can be \
             fixed so that a replay applies them",
        ),
    ],
    default_faults: 6,
    default_rate: 40,
};

/// stop-postgres stops source and destination at once (one server: the
/// test mode's stand-in cluster is a database of it); destination-down
/// stops the S3 emulator (moto) and starts it again. Few faults at a low
/// rate: the CI's budget (the other pipelines cover the shared runner
/// paths at length).
const POSTGRES_REDSHIFT: Pipeline = Pipeline {
    name: "postgres-redshift",
    source: SourceKind::Postgres,
    sink: SinkKind::Redshift,
    left_out: &[
        (
            Fault::RevokeSink,
            "the test mode's stand-in cluster is PostgreSQL, and the sink makes its stand-ins there as the stack's \
             superuser: revoking PostgreSQL's grants would test PostgreSQL's privileges, not Redshift's (a \
             privilege error pauses through the PostgreSQL sink's classification, which postgres-postgres revokes)",
        ),
        NO_MARIADB,
        (
            Fault::ReplayDeadLetter,
            "the bad rows are refused by type (PostgreSQL's infinity date, which Redshift's DATE cannot hold): \
             nothing at the destination can be fixed so that a replay applies them",
        ),
    ],
    default_faults: 4,
    default_rate: 10,
};

/// stop-postgres stops the source's server. Four faults at 10 transactions
/// a second keep it within a minute in CI: fakesnow runs each statement
/// on DuckDB behind HTTP, about 20 ms, and a batch is a dozen of them.
const POSTGRES_SNOWFLAKE: Pipeline = Pipeline {
    name: "postgres-snowflake",
    source: SourceKind::Postgres,
    sink: SinkKind::Snowflake,
    left_out: &[
        (Fault::RevokeSink, "the emulator has no privileges to take away"),
        NO_MARIADB,
        (
            Fault::DestinationDown,
            "fakesnow keeps its databases in memory: stopping it loses the copy (a real outage does not), and the \
             harness has no proxy to cut the network instead",
        ),
        (
            Fault::ReplayDeadLetter,
            "Snowflake refuses the bad rows by type (a DATE of infinity): nothing at the destination can be fixed \
             so that a replay applies them",
        ),
    ],
    default_faults: 4,
    default_rate: 10,
};

const PIPELINES: [&Pipeline; 5] = [
    &POSTGRES_POSTGRES,
    &MARIADB_POSTGRES,
    &POSTGRES_BIGQUERY,
    &POSTGRES_REDSHIFT,
    &POSTGRES_SNOWFLAKE,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_to_postgres() {
    run(&POSTGRES_POSTGRES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_to_postgres() {
    run(&MARIADB_POSTGRES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_to_bigquery() {
    run(&POSTGRES_BIGQUERY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_to_redshift() {
    run(&POSTGRES_REDSHIFT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_to_snowflake() {
    run(&POSTGRES_SNOWFLAKE).await;
}

/// A run's parameters, from the environment.
struct Params {
    seed: u64,
    faults: u64,
    rate: u64,
    duration: Duration,
    snapshot_kill: bool,
    kinds: Vec<Fault>,
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A comma-separated list, unless unset or empty.
fn env_list(name: &str) -> Option<Vec<String>> {
    let list = std::env::var(name).ok().filter(|v| !v.trim().is_empty())?;
    Some(list.split(',').map(|s| s.trim().to_string()).collect())
}

impl Params {
    /// `None` when `FAULT_PIPELINES` or `FAULT_KINDS` leave the pipeline out
    /// (said on stderr: a pipeline never passes as if it had run).
    fn from_env(pipeline: &Pipeline) -> Option<Self> {
        if let Some(names) = env_list("FAULT_PIPELINES") {
            for n in &names {
                assert!(
                    PIPELINES.iter().any(|p| p.name == n),
                    "unknown pipeline {n} in FAULT_PIPELINES (one of {})",
                    PIPELINES.map(|p| p.name).join(", ")
                );
            }
            if !names.iter().any(|n| n == pipeline.name) {
                eprintln!("{}: not in FAULT_PIPELINES, not run", pipeline.name);
                return None;
            }
        }
        let kinds = match env_list("FAULT_KINDS") {
            Some(list) => {
                let wanted: Vec<Fault> = list.iter().map(|k| Fault::parse(k)).collect();
                for (k, why) in pipeline.left_out.iter().filter(|(k, _)| wanted.contains(k)) {
                    eprintln!("{}: {} does not apply to this pipeline ({why}), left out", pipeline.name, k.name());
                }
                let kinds: Vec<Fault> = pipeline.faults().into_iter().filter(|f| wanted.contains(f)).collect();
                if kinds.is_empty() {
                    eprintln!("{}: none of FAULT_KINDS applies to this pipeline, not run", pipeline.name);
                    return None;
                }
                kinds
            }
            None => pipeline.faults(),
        };
        Some(Self {
            seed: std::env::var("FAULT_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128() as u64 | 1),
            faults: env_num("FAULTS", pipeline.default_faults),
            rate: env_num("FAULT_RATE", pipeline.default_rate).max(1),
            duration: Duration::from_secs(env_num("FAULT_DURATION", 0)),
            snapshot_kill: env_num("FAULT_SNAPSHOT_KILL", 1) == 1,
            kinds,
        })
    }
}

// ---------------------------------------------------------------- tables

struct Table {
    name: &'static str,
    /// Rows before the runners start: enough snapshot chunks that the first
    /// kills land mid-snapshot.
    initial_rows: i64,
    columns: &'static [&'static str],
    /// The `numeric(12,2)` columns, compared to two places (BigQuery's
    /// NUMERIC text drops trailing zeros); every other column as its text.
    decimals: &'static [&'static str],
}

const TABLES: [Table; 3] = [
    Table {
        name: "accounts",
        initial_rows: 6_000,
        columns: &["id", "owner", "balance", "version"],
        decimals: &["balance"],
    },
    Table {
        name: "orders",
        initial_rows: 4_000,
        columns: &["id", "account_id", "amount", "note", "version"],
        decimals: &["amount"],
    },
    Table {
        name: "notes",
        initial_rows: 1_000,
        columns: &["id", "payload", "due", "version"],
        decimals: &[],
    },
];

/// Where rows are read as text.
#[derive(Clone, Copy)]
enum Dialect {
    Postgres,
    MariaDb,
    BigQuery,
    Snowflake,
}

impl Dialect {
    /// Every column of `table` (at `at`) as text, without the bad rows.
    /// (Not `ORDER BY id`: in PostgreSQL that is the output column
    /// `id::text`; [`by_id`] sorts.)
    fn select(self, at: &str, table: &Table, columns: &[String]) -> String {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match self {
                Dialect::Postgres => format!("{c}::text"),
                Dialect::MariaDb => format!("CAST({c} AS CHAR)"),
                Dialect::BigQuery => format!("CAST({c} AS STRING)"),
                // The sink keeps the source's names, lower case: quoted.
                Dialect::Snowflake => format!("CAST(\"{c}\" AS VARCHAR)"),
            })
            .collect();
        let filter = if table.name == "notes" {
            let payload = if matches!(self, Dialect::Snowflake) {
                "\"payload\""
            } else {
                "payload"
            };
            format!("{payload} NOT LIKE '{BAD_PREFIX}%'")
        } else {
            "TRUE".into()
        };
        format!("SELECT {} FROM {at} WHERE {filter}", cells.join(", "))
    }
}

/// Per table, each row as `cell|cell|...` in id order.
type Rows = BTreeMap<&'static str, Vec<String>>;

/// One row as compared: NULL as `<null>`, decimals to two places.
fn canonical(table: &Table, columns: &[String], cells: Vec<Option<String>>) -> String {
    assert_eq!(cells.len(), columns.len(), "{}: one cell per column", table.name);
    let cells: Vec<String> = columns
        .iter()
        .zip(cells)
        .map(|(col, cell)| match cell {
            None => "<null>".to_string(),
            Some(v) if table.decimals.contains(&col.as_str()) => two_places(&v),
            Some(v) => v,
        })
        .collect();
    cells.join("|")
}

/// Columns the ddl fault added to each table and the source still has:
/// compared like the table's own. One pipeline runs at a time
/// ([`ONE_AT_A_TIME`]); each run starts without any.
static ADDED_COLUMNS: Mutex<BTreeMap<&'static str, Vec<String>>> = Mutex::new(BTreeMap::new());

/// The columns of `table` compared: its own and those the ddl fault added.
fn compared_columns(table: &Table) -> Vec<String> {
    let added = ADDED_COLUMNS.lock().unwrap().get(table.name).cloned().unwrap_or_default();
    table.columns.iter().map(|c| c.to_string()).chain(added).collect()
}

/// Rows from [`canonical`] in id order.
fn by_id(mut rows: Vec<String>) -> Vec<String> {
    rows.sort_by_key(|r| r.split('|').next().and_then(|id| id.parse::<i64>().ok()));
    rows
}

/// `1.5`, `1.50` and `1.500` as `1.50`; anything with more places that
/// matter stays as it is, so that a real difference still shows.
fn two_places(v: &str) -> String {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > 2 {
        return v.to_string();
    }
    format!("{int}.{frac:0<2}")
}

/// What differs between the source's rows and a copy's, per table: the
/// counts and the first rows each side has alone.
fn differences(want: &Rows, got: &Rows) -> Vec<String> {
    let mut out = Vec::new();
    for (table, w) in want {
        let g = got.get(table).map(Vec::as_slice).unwrap_or(&[]);
        if w.as_slice() == g {
            continue;
        }
        let (in_w, in_g): (HashSet<&String>, HashSet<&String>) = (w.iter().collect(), g.iter().collect());
        let missing: Vec<&String> = w.iter().filter(|r| !in_g.contains(r)).take(5).collect();
        let extra: Vec<&String> = g.iter().filter(|r| !in_w.contains(r)).take(5).collect();
        out.push(format!(
            "{table}: {} rows, the source has {}; first missing or different: {missing:?}; first not in the source: {extra:?}",
            g.len(),
            w.len()
        ));
    }
    out
}

async fn postgres_rows(client: &Client, schema: &str) -> Result<Rows, String> {
    let mut out = Rows::new();
    for t in &TABLES {
        let columns = compared_columns(t);
        let sql = Dialect::Postgres.select(&format!("{schema}.{}", t.name), t, &columns);
        let rows = client.query(sql.as_str(), &[]).await.map_err(|e| e.to_string())?;
        let rows = rows
            .iter()
            .map(|r| canonical(t, &columns, (0..r.len()).map(|i| r.get::<_, Option<String>>(i)).collect()));
        out.insert(t.name, by_id(rows.collect()));
    }
    Ok(out)
}

async fn mariadb_rows(conn: &mut mysql_async::Conn, db: &str) -> Result<Rows, String> {
    let mut out = Rows::new();
    for t in &TABLES {
        let columns = compared_columns(t);
        let sql = Dialect::MariaDb.select(&format!("{db}.{}", t.name), t, &columns);
        let rows: Vec<mysql_async::Row> = conn.query(sql).await.map_err(|e| e.to_string())?;
        let rows = rows.into_iter().map(|r| {
            let cells = (0..r.len()).map(|i| r.get::<Option<String>, _>(i).flatten()).collect();
            canonical(t, &columns, cells)
        });
        out.insert(t.name, by_id(rows.collect()));
    }
    Ok(out)
}

async fn bigquery_rows(datasets: &Datasets) -> Result<Rows, String> {
    let mut out = Rows::new();
    for t in &TABLES {
        let columns = compared_columns(t);
        let rows = bigquery(&Dialect::BigQuery.select(&datasets.table(t.name), t, &columns)).await?;
        out.insert(t.name, by_id(rows.into_iter().map(|r| canonical(t, &columns, r)).collect()));
    }
    Ok(out)
}

async fn snowflake_rows(schemas: &SfSchemas) -> Result<Rows, String> {
    let mut out = Rows::new();
    for t in &TABLES {
        let columns = compared_columns(t);
        let rows = schemas
            .query(&Dialect::Snowflake.select(&schemas.table(t.name), t, &columns))
            .await?;
        out.insert(t.name, by_id(rows.into_iter().map(|r| canonical(t, &columns, r)).collect()));
    }
    Ok(out)
}

// ---------------------------------------------------------------- source side

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    Postgres,
    MariaDb,
}

/// The source database as the workload (a task of its own) and the checks
/// reach it.
#[derive(Clone)]
struct SourceDb {
    kind: SourceKind,
    url: String,
    /// The captured schema (PostgreSQL) or database (MariaDB); also the
    /// runner's name, so the topics are `<schema>.<schema>.<table>`.
    schema: String,
    /// Not captured: one row per workload transaction, to tell after a
    /// lost connection whether its COMMIT happened.
    log: String,
}

/// A session of the source database.
enum Session {
    Postgres(Client),
    MariaDb(mysql_async::Conn),
}

impl Session {
    /// Known to be unusable (PostgreSQL notices; MariaDB's shows on use).
    fn is_closed(&self) -> bool {
        match self {
            Session::Postgres(c) => c.is_closed(),
            Session::MariaDb(_) => false,
        }
    }

    /// Runs `sql` (statements separated by `;`). Panics on an integrity
    /// violation: the workload never causes one, so it is a harness bug.
    async fn execute(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Session::Postgres(c) => c.batch_execute(sql).await.map_err(|e| {
                assert!(e.as_db_error().is_none_or(|d| !d.code().code().starts_with("23")), "workload bug: {e}");
                e.to_string()
            }),
            Session::MariaDb(c) => c.query_drop(sql).await.map_err(|e| {
                let integrity = matches!(&e, mysql_async::Error::Server(s) if s.state.starts_with("23"));
                assert!(!integrity, "workload bug: {e}");
                e.to_string()
            }),
        }
    }

    /// The first column of the first row of `sql`, a count.
    async fn count(&mut self, sql: &str) -> Result<i64, String> {
        match self {
            Session::Postgres(c) => c.query_one(sql, &[]).await.map(|r| r.get(0)).map_err(|e| e.to_string()),
            Session::MariaDb(c) => c
                .query_first::<i64, _>(sql)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no row".to_string()),
        }
    }
}

impl SourceDb {
    async fn connect(&self) -> Option<Session> {
        match self.kind {
            SourceKind::Postgres => connect(&self.url).await.ok().map(Session::Postgres),
            SourceKind::MariaDb => mysql_async::Conn::from_url(self.url.as_str()).await.ok().map(Session::MariaDb),
        }
    }

    /// Connects, waiting through an outage (`None` only on stop).
    async fn connect_retrying(&self, stop: &AtomicBool) -> Option<Session> {
        loop {
            if let Some(s) = self.connect().await {
                return Some(s);
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The tables (the log too) and their initial rows.
    async fn create(&self) {
        let (s, l) = (&self.schema, &self.log);
        let [a, o, n] = TABLES.map(|t| t.initial_rows);
        let sql = match self.kind {
            SourceKind::Postgres => format!(
                "CREATE SCHEMA {l}; CREATE TABLE {l}.txlog (id uuid PRIMARY KEY);
                 CREATE TABLE {s}.accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), version bigint NOT NULL);
                 CREATE TABLE {s}.orders (id bigint PRIMARY KEY, account_id bigint NOT NULL, amount numeric(12,2) NOT NULL, note text, version bigint NOT NULL);
                 CREATE TABLE {s}.notes (id bigint PRIMARY KEY, payload text NOT NULL, due date, version bigint NOT NULL);
                 INSERT INTO {s}.accounts SELECT i, 'owner ' || i, (i % 1000) * 1.25, 1 FROM generate_series(1, {a}) i;
                 INSERT INTO {s}.orders SELECT i, i % 500, (i % 700) * 0.5, CASE WHEN i % 3 = 0 THEN NULL ELSE 'n' || i END, 1
                   FROM generate_series(1, {o}) i;
                 INSERT INTO {s}.notes SELECT i, 'payload ' || i, CASE WHEN i % 4 = 0 THEN NULL ELSE DATE '2024-01-01' + i % 365 END, 1
                   FROM generate_series(1, {n}) i;"
            ),
            SourceKind::MariaDb => format!(
                "CREATE TABLE {l}.txlog (id char(36) PRIMARY KEY);
                 CREATE TABLE {s}.accounts (id bigint PRIMARY KEY, owner varchar(64) NOT NULL, balance decimal(12,2), version bigint NOT NULL);
                 CREATE TABLE {s}.orders (id bigint PRIMARY KEY, account_id bigint NOT NULL, amount decimal(12,2) NOT NULL, note varchar(64), version bigint NOT NULL);
                 CREATE TABLE {s}.notes (id bigint PRIMARY KEY, payload varchar(200) NOT NULL, due date, version bigint NOT NULL);
                 INSERT INTO {s}.accounts SELECT seq, CONCAT('owner ', seq), (seq % 1000) * 1.25, 1 FROM seq_1_to_{a};
                 INSERT INTO {s}.orders SELECT seq, seq % 500, (seq % 700) * 0.5, IF(seq % 3 = 0, NULL, CONCAT('n', seq)), 1
                   FROM seq_1_to_{o};
                 INSERT INTO {s}.notes SELECT seq, CONCAT('payload ', seq), IF(seq % 4 = 0, NULL, DATE '2024-01-01' + INTERVAL (seq % 365) DAY), 1
                   FROM seq_1_to_{n};"
            ),
        };
        let mut session = self.connect().await.expect("a session of the source");
        session.execute(&sql).await.expect("create the source tables");
    }

    /// Whether the transaction `txid` committed (`Err`: the session broke).
    async fn committed(&self, session: &mut Session, txid: &uuid::Uuid) -> Result<bool, String> {
        let n = session
            .count(&format!("SELECT COUNT(*) FROM {}.txlog WHERE id = '{txid}'", self.log))
            .await?;
        Ok(n > 0)
    }

    async fn rows(&self) -> Result<Rows, String> {
        match self.connect().await.ok_or("cannot connect to the source")? {
            Session::Postgres(c) => postgres_rows(&c, &self.schema).await,
            Session::MariaDb(mut c) => mariadb_rows(&mut c, &self.schema).await,
        }
    }
}

/// The source's fixture: what it made, dropped at the end.
enum SourceFixture {
    Postgres(SourceSchema),
    MariaDb {
        data: MariaDbDatabase,
        log: MariaDbDatabase,
        server_id: u32,
    },
}

struct Source {
    db: SourceDb,
    fixture: SourceFixture,
}

impl Source {
    async fn new(kind: SourceKind) -> Self {
        match kind {
            SourceKind::Postgres => {
                let fx = SourceSchema::new("faults").await;
                let db = SourceDb {
                    kind,
                    url: pg_source_url(),
                    schema: fx.schema.clone(),
                    log: format!("{}_log", fx.schema),
                };
                Self { db, fixture: SourceFixture::Postgres(fx) }
            }
            SourceKind::MariaDb => {
                let data = MariaDbDatabase::new("faults").await;
                let log = MariaDbDatabase::new("faults_log").await;
                let config = data.config();
                let db = SourceDb {
                    kind,
                    url: config.url.expose_secret().to_string(),
                    schema: data.db.clone(),
                    log: log.db.clone(),
                };
                Self {
                    db,
                    fixture: SourceFixture::MariaDb { data, log, server_id: config.server_id },
                }
            }
        }
    }

    /// The source runner's `[postgres]` or `[mysql]` section.
    fn runner_section(&self) -> String {
        let (schema, url) = (&self.db.schema, &self.db.url);
        // The MySQL source copies 11,000 rows in 500-row chunks in about
        // 0.3 s, less than the harness takes to see the first chunk: in
        // 100-row chunks the kill lands mid-snapshot.
        let chunk_rows = match self.db.kind {
            SourceKind::Postgres => CHUNK_ROWS,
            SourceKind::MariaDb => CHUNK_ROWS / 5,
        };
        let common =
            format!("include = [\"{schema}.*\"]\nsnapshot_chunk_rows = {chunk_rows}\nheartbeat_interval_ms = 1000\n");
        match &self.fixture {
            SourceFixture::Postgres(fx) => format!(
                "[postgres]\nurl = \"{url}\"\nslot_name = \"{}\"\npublication_name = \"{}\"\n{common}",
                fx.slot, fx.publication
            ),
            // Transactions of 3 changes or more (most of the workload's)
            // go out in parts, so kills land inside them.
            SourceFixture::MariaDb { server_id, .. } => {
                format!("[mysql]\nurl = \"{url}\"\nserver_id = {server_id}\nmax_batch_events = 3\n{common}")
            }
        }
    }

    async fn cleanup(self) {
        match self.fixture {
            SourceFixture::Postgres(mut fx) => {
                // (The fixture's session may have died with a server stop.)
                fx.admin = source_admin().await;
                let _ = fx
                    .admin
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.db.log))
                    .await;
                fx.cleanup().await;
            }
            SourceFixture::MariaDb { mut data, mut log, .. } => {
                for fx in [&mut data, &mut log] {
                    fx.conn = tributary_tests::mysql::admin().await;
                }
                data.drop().await;
                log.drop().await;
            }
        }
    }
}

// ---------------------------------------------------------------- sink side

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    Postgres,
    BigQuery,
    Redshift,
    Snowflake,
}

impl SinkKind {
    /// The `due` of a bad note (its payload starts with [`BAD_PREFIX`]).
    fn bad_due(self) -> &'static str {
        match self {
            // A CHECK constraint of the destination refuses the payload.
            SinkKind::Postgres => "NULL",
            // BigQuery's DATE ends with 9999-12-31, PostgreSQL's does not.
            SinkKind::BigQuery => "'10000-01-01'",
            // Redshift's DATE has no infinity: the sink stages a date out
            // of range, which COPY refuses (stl_load_errors' reason).
            SinkKind::Redshift => "'infinity'",
            // Snowflake's DATE has no infinity.
            SinkKind::Snowflake => "'infinity'",
        }
    }
}

enum Destination {
    Postgres {
        fx: Box<PgDestination>,
        /// The sink's role: not a superuser, so that its rights can be
        /// taken away.
        role: String,
        role_url: String,
        /// The destination database.
        db: String,
    },
    BigQuery(Datasets),
    Redshift {
        wh: Box<RedshiftWarehouse>,
        group: String,
    },
    Snowflake(Box<SfSchemas>),
}

impl Destination {
    async fn new(kind: SinkKind) -> Self {
        match kind {
            SinkKind::Postgres => {
                let fx = PgDestination::new("faults").await;
                fx.sink().connect().await.expect("the bookkeeping tables");
                let role = format!("{}_role", fx.schema);
                // The bookkeeping the docs have an operator make for a sink
                // without CREATE on the database (docs/destinations/postgresql.md):
                // offsets, deleted rows (every delete), resets (a reset).
                fx.exec(&format!(
                    "CREATE ROLE {role} LOGIN PASSWORD 'pw'; CREATE SCHEMA {} AUTHORIZATION {role};
                     SELECT pg_advisory_lock(hashtext('tributary bookkeeping'));
                     CREATE TABLE IF NOT EXISTS tributary.resets (destination text PRIMARY KEY, reset bigint NOT NULL);
                     SELECT pg_advisory_unlock(hashtext('tributary bookkeeping'));
                     GRANT USAGE ON SCHEMA tributary TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.offsets TO {role};
                     GRANT SELECT, INSERT, UPDATE, DELETE ON tributary.deleted_rows TO {role};
                     GRANT SELECT, INSERT, UPDATE ON tributary.resets TO {role};",
                    fx.schema
                ))
                .await;
                let dst: tokio_postgres::Config = pg_destination_url().parse().expect("destination url");
                let port = dst.get_ports().first().copied().unwrap_or(5432);
                let db = dst.get_dbname().unwrap_or("destination").to_string();
                let role_url = format!("postgres://{role}:pw@127.0.0.1:{port}/{db}");
                Destination::Postgres { fx: Box::new(fx), role, role_url, db }
            }
            SinkKind::BigQuery => Destination::BigQuery(Datasets::new("faults")),
            SinkKind::Redshift => Destination::Redshift {
                wh: Box::new(RedshiftWarehouse::new("faults").await),
                group: tributary_tests::unique("rsfaults"),
            },
            SinkKind::Snowflake => Destination::Snowflake(Box::new(SfSchemas::new("faults"))),
        }
    }

    fn group(&self) -> &str {
        match self {
            Destination::Postgres { fx, .. } => &fx.group,
            Destination::BigQuery(d) => &d.group,
            Destination::Redshift { group, .. } => group,
            Destination::Snowflake(d) => &d.group,
        }
    }

    /// The sink runner's batching beyond `batch_max_records`.
    fn batching(&self) -> &'static str {
        match self {
            Destination::Postgres { .. } | Destination::Redshift { .. } => "",
            // Each batch is one MERGE job per table (examples/sink-bigquery.toml).
            Destination::BigQuery(_) => "batch_linger_ms = 1000\n",
            // Fewer, larger transactions: each statement is an HTTP round
            // trip (examples/sink-snowflake.toml).
            Destination::Snowflake(_) => "batch_linger_ms = 1000\n",
        }
    }

    /// The sink runner's `[postgres]` or `[bigquery]` section.
    fn runner_section(&self) -> String {
        match self {
            Destination::Postgres { fx, role_url, .. } => format!(
                "[postgres]\nurl = \"{role_url}\"\nschema = \"{}\"\nlock_timeout_ms = 5000\nconnect_timeout_ms = 3000\n",
                fx.schema
            ),
            Destination::BigQuery(d) => d.runner_section(),
            Destination::Redshift { wh, .. } => format!("{}connect_timeout_ms = 3000\n", wh.runner_section()),
            // Snapshot batches through the internal stage (PUT + COPY
            // INTO), the workload's small ones by INSERTs: kills land in
            // both.
            Destination::Snowflake(d) => format!("{}stage_threshold_rows = 100\n", d.runner_section()),
        }
    }

    async fn rows(&self) -> Result<Rows, String> {
        match self {
            Destination::Postgres { fx, .. } => {
                let c = connect(&pg_destination_url()).await.map_err(|e| e.to_string())?;
                postgres_rows(&c, &fx.schema).await
            }
            Destination::BigQuery(d) => bigquery_rows(d).await,
            Destination::Redshift { wh, .. } => {
                let c = connect(&redshift_url()).await.map_err(|e| e.to_string())?;
                postgres_rows(&c, &wh.schema).await
            }
            Destination::Snowflake(d) => snowflake_rows(d).await,
        }
    }

    /// Whether the sink has applied rows of `accounts`.
    async fn has_rows(&self) -> bool {
        let n = match self {
            Destination::Postgres { fx, .. } => match connect(&pg_destination_url()).await {
                Ok(c) => {
                    let q = format!("SELECT count(*)::text FROM {}.accounts", fx.schema);
                    c.query_one(q.as_str(), &[]).await.ok().map(|r| r.get::<_, String>(0))
                }
                Err(_) => None,
            },
            Destination::Redshift { wh, .. } => match connect(&redshift_url()).await {
                Ok(c) => {
                    let q = format!("SELECT count(*)::text FROM {}.accounts", wh.schema);
                    c.query_one(q.as_str(), &[]).await.ok().map(|r| r.get::<_, String>(0))
                }
                Err(_) => None,
            },
            Destination::BigQuery(d) => {
                bigquery(&format!("SELECT CAST(COUNT(*) AS STRING) FROM {}", d.table("accounts")))
                    .await
                    .ok()
                    .and_then(|r| r.first()?.first()?.clone())
            }
            Destination::Snowflake(d) => d
                .query(&format!("SELECT CAST(COUNT(*) AS VARCHAR) FROM {}", d.table("accounts")))
                .await
                .ok()
                .and_then(|r| r.first()?.first()?.clone()),
        };
        n.and_then(|n| n.parse::<i64>().ok()).is_some_and(|n| n > 0)
    }

    /// Makes the destination refuse the bad notes, once their table is
    /// there (BigQuery and Snowflake refuse their `due` by themselves).
    async fn refuse_bad_rows(&self) {
        if let Destination::Postgres { fx, .. } = self {
            let sql = format!(
                "ALTER TABLE {}.notes ADD CONSTRAINT faults_no_bad CHECK (payload NOT LIKE '{BAD_PREFIX}%') NOT VALID",
                fx.schema
            );
            wait_for("the notes table in the destination", RECOVERY, || async {
                fx.admin.batch_execute(&sql).await.ok()
            })
            .await;
        }
    }

    /// The destination goes away while the source keeps writing: the sink
    /// must say it is paused, with the reason, and come back by itself.
    async fn down_then_back(&self, sinks: &[Proc]) {
        match self {
            Destination::Postgres { role, db, .. } => {
                // New sessions refused, the sink's cut. (From another
                // database of the server: the one taken away is not to be
                // used.)
                let c = connect(&pg_source_url()).await.expect("admin session");
                let mut guard = AllowConnections(Some(db.clone()));
                c.batch_execute(&format!(
                    "ALTER DATABASE {db} WITH ALLOW_CONNECTIONS false; \
                     SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
                ))
                .await
                .unwrap_or_else(|e| panic!("take the destination away: {e:?}"));
                paused_then_resumed(sinks, self, "destination-down", async {
                    c.batch_execute(&format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS true"))
                        .await
                        .expect("bring the destination back");
                })
                .await;
                guard.0 = None;
            }
            Destination::BigQuery(_) => {
                let stopped = Stopped::stop("bigquery");
                paused_then_resumed(sinks, self, "destination-down", async { stopped.start() }).await;
            }
            Destination::Redshift { .. } => {
                // The staging area goes: moto in server mode keeps all in
                // memory, so the staged files of a batch in flight are lost
                // with it (the sink stages them again). So is the bucket,
                // which S3 never loses: made again as part of the return.
                let stopped = Stopped::stop("s3");
                paused_for_then_resumed(sinks, self, "destination-down", "S3", async {
                    stopped.start();
                    tributary_tests::redshift::create_bucket().await;
                })
                .await;
            }
            Destination::Snowflake(_) => unreachable!("destination-down is not a fault of this pipeline"),
        }
    }

    /// The sink may no longer write its offsets: it must say it is paused,
    /// with the reason, and come back by itself after the GRANT.
    async fn revoke_then_grant(&self, sinks: &[Proc]) {
        let Destination::Postgres { role, .. } = self else {
            unreachable!("revoke-sink is not a fault of this pipeline")
        };
        let c = connect(&pg_destination_url()).await.expect("admin session");
        c.batch_execute(&format!("REVOKE INSERT, UPDATE ON tributary.offsets FROM {role}"))
            .await
            .expect("revoke");
        paused_then_resumed(sinks, self, "revoke-sink", async {
            c.batch_execute(&format!("GRANT INSERT, UPDATE ON tributary.offsets TO {role}"))
                .await
                .expect("grant");
        })
        .await;
    }

    /// Waits until the sink applied the later changes of `ids`: the fixed
    /// rows are there, and the stored offsets of `topic` reached its end as
    /// it is once they are, past the deletes (same source transaction).
    async fn wait_applied(&self, kafka: &KafkaAdmin, topic: &str, ids: &Replayed) {
        let Destination::Postgres { fx, .. } = self else {
            unreachable!("replay-dead-letter is not a fault of this pipeline")
        };
        let q = format!("SELECT count(*) FROM {}.notes WHERE id = ANY($1) AND version = 2", fx.schema);
        wait_for("the fixed rows in the destination", RECOVERY, || async {
            let c = connect(&pg_destination_url()).await.ok()?;
            let n: i64 = c.query_one(q.as_str(), &[&ids.fixed]).await.ok()?.get(0);
            (n == ids.fixed.len() as i64).then_some(())
        })
        .await;
        let ends = kafka.high_watermarks(topic);
        let q = "SELECT partition, next_offset FROM tributary.offsets WHERE consumer_group = $1 AND topic = $2";
        wait_for("the sink's stored offsets past the deletes", RECOVERY, || async {
            let c = connect(&pg_destination_url()).await.ok()?;
            let rows = c.query(q, &[&fx.group, &topic]).await.ok()?;
            let stored: HashMap<i32, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            // The last offset below the watermark is a commit marker or a
            // record of a later, open transaction: the deletes are before.
            ends.iter()
                .all(|(p, high)| *high == 0 || stored.get(p).is_some_and(|s| *s >= high - 1))
                .then_some(())
        })
        .await;
    }

    /// Makes the destination refuse the notes of replay `n` (a CHECK of
    /// their own, [`replay_prefix`]).
    async fn refuse_replayed(&self, n: u64) {
        let Destination::Postgres { fx, .. } = self else {
            unreachable!("replay-dead-letter is not a fault of this pipeline")
        };
        let admin = connect(&pg_destination_url()).await.expect("destination");
        admin
            .batch_execute(&format!(
                "ALTER TABLE {}.notes ADD CONSTRAINT faults_replay_{n} CHECK (payload NOT LIKE '{} %') NOT VALID",
                fx.schema,
                replay_prefix(n)
            ))
            .await
            .expect("the replay's CHECK");
    }

    /// The operator's fix (replay `n`'s CHECK dropped), then `sink-runner
    /// replay` of `dlq`: its notes apply or are older than their rows (the
    /// fixed and deleted ones), and no fixed or deleted row comes back
    /// older. The bad rows (still refused by `faults_no_bad`) still fail,
    /// and only they.
    async fn replay_and_check(&self, sink: &Proc, dlq: &str, ids: &Replayed, n: u64) {
        let Destination::Postgres { fx, .. } = self else {
            unreachable!("replay-dead-letter is not a fault of this pipeline")
        };
        let admin = connect(&pg_destination_url()).await.expect("destination");
        admin
            .batch_execute(&format!("ALTER TABLE {}.notes DROP CONSTRAINT faults_replay_{n}", fx.schema))
            .await
            .expect("drop the replay's CHECK");
        let out = command(&sink.bin, &sink.config, &["replay", "--dlq", dlq]).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let failing: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  ")).collect();
        // Exit 3: some records still fail (the bad rows).
        assert!(
            out.status.success() || out.status.code() == Some(3) && failing.iter().all(|l| l.contains("faults_no_bad")),
            "sink-runner replay ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("  {}", stdout.lines().next().unwrap_or_default());
        let all: Vec<i64> = ids.fixed.iter().chain(&ids.deleted).copied().collect();
        let q = format!("SELECT id, payload, version FROM {}.notes WHERE id = ANY($1)", fx.schema);
        let rows = admin.query(q.as_str(), &[&all]).await.expect("the replayed rows");
        let got: BTreeMap<i64, (String, i64)> = rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
        let want: BTreeMap<i64, (String, i64)> = ids.fixed.iter().map(|id| (*id, (format!("fixed {id}"), 2))).collect();
        assert_eq!(got, want, "after the replay: the fixed rows as fixed, the deleted ones gone");
    }

    /// What the sink's sessions were doing, for a failure message.
    async fn sessions(&self) -> String {
        let Destination::Postgres { role, .. } = self else {
            return String::new();
        };
        let mut out = String::new();
        if let Ok(c) = connect(&pg_source_url()).await {
            let q = "SELECT datname, usename, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''), \
                     (now() - query_start)::text, left(query, 200) FROM pg_stat_activity WHERE usename = $1";
            if let Ok(rows) = c.query(q, &[role]).await {
                for r in rows {
                    let cols: Vec<String> = (0..7).map(|i| r.get::<_, Option<String>>(i).unwrap_or_default()).collect();
                    out.push_str(&format!("  {}\n", cols.join(" | ")));
                }
            }
        }
        format!("sink sessions:\n{out}")
    }

    async fn cleanup(self) {
        match self {
            Destination::Postgres { mut fx, role, .. } => {
                // (The fixture's session may have died with a server stop.)
                fx.admin = tributary_tests::postgres::connect(&pg_destination_url()).await;
                let admin = connect(&pg_destination_url()).await.expect("destination");
                (*fx).cleanup().await;
                let _ = admin.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
            }
            Destination::BigQuery(d) => d.cleanup().await,
            Destination::Redshift { wh, group } => wh.cleanup(&[group]).await,
            Destination::Snowflake(d) => d.cleanup().await,
        }
    }
}

// ---------------------------------------------------------------- the stack

/// `scripts/stack ARGS` with this process's environment (ports).
fn stack_status(args: &[&str]) -> bool {
    Command::new("bash")
        .arg(tributary_tests::workspace_dir().join("scripts/stack"))
        .args(args)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn stack(args: &[&str]) {
    assert!(stack_status(args), "scripts/stack {} failed", args.join(" "));
}

/// A service of the stack, stopped; started again when dropped, also if
/// the harness fails meanwhile, so that later tests find it running.
struct Stopped(Option<&'static str>);

impl Stopped {
    fn stop(service: &'static str) -> Self {
        stack(&["stop", service]);
        Self(Some(service))
    }

    fn start(mut self) {
        if let Some(s) = self.0.take() {
            stack(&["start", s]);
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            stack_status(&["start", s]);
        }
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
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

// ---------------------------------------------------------------- runners

/// A runner binary that the harness kills and starts again, its log
/// appended across restarts.
struct Proc {
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    admin: String,
    running: Option<Runner>,
}

impl Proc {
    fn new(package: &str, config: PathBuf, log: PathBuf, admin_port: u16) -> Self {
        Self {
            bin: runner_binary(package),
            config,
            log,
            admin: format!("http://127.0.0.1:{admin_port}"),
            running: None,
        }
    }

    fn start(&mut self) {
        assert!(self.running.is_none(), "{} already running", self.bin.display());
        self.running = Some(Runner::spawn(&self.bin, &self.config, &self.log));
    }

    /// SIGKILL: no shutdown code runs.
    fn kill9(&mut self) {
        if let Some(r) = self.running.take() {
            r.kill9();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the running process.
    fn signal(&self, signal: &str) {
        let pid = self.running.as_ref().expect("running").pid();
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid}");
    }

    /// A runner must never exit by itself: it pauses and retries instead.
    fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.running.as_mut().and_then(Runner::exited) {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "{} exited by itself ({status}) {when}; log tail:\n{}",
                self.bin.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
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

    /// Whether every table's state is `streaming`.
    async fn all_streaming(&self) -> Option<()> {
        let status: serde_json::Value = serde_json::from_str(&self.get("/status").await?).ok()?;
        let tables = status.get("tables")?.as_object()?;
        (tables.len() == TABLES.len()
            && tables
                .values()
                .all(|t| t.get("state").and_then(|s| s.as_str()) == Some("streaming")))
        .then_some(())
    }

    /// Whether the source said it copies `table` again (a rewrite the log
    /// does not carry) at `since_ms` or later.
    async fn copied_again_since(&self, table: &str, since_ms: i64) -> Option<()> {
        let status: serde_json::Value = serde_json::from_str(&self.get("/status").await?).ok()?;
        let tables = status.get("tables")?.as_object()?;
        let (_, t) = tables.iter().find(|(k, _)| k.rsplit('.').next() == Some(table))?;
        let at = t.get("last_copy_again")?.get("at_ms")?.as_i64()?;
        (at >= since_ms).then_some(())
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

/// The sink's members: runners in one consumer group, so that a kill, a
/// freeze or a restart of one is a rebalance with a member that may still
/// write (a zombie), the case fenced offsets are for.
const SINK_MEMBERS: usize = 2;
/// Partitions of each change topic (created before the source starts): the
/// stack's brokers create 1, and with one partition per topic one member
/// would have nothing to do.
const TOPIC_PARTITIONS: i32 = 3;
/// A partition increase stops here (about 3 per topic in a 100-fault run).
const MAX_PARTITIONS: i32 = 8;
/// The sink's consumer session: a killed or frozen member leaves its group
/// after this long.
const SESSION_TIMEOUT_MS: u64 = 6000;
/// A member waiting on its group this long leaves and joins again:
/// shorter than the checks' waits (60 s), longer than a broker restart and
/// the rebalance after it (34 s seen).
const GROUP_REJOIN_AFTER_SECS: u64 = 45;

/// The source runner and the sink's members, their configs and logs in
/// `dir`.
struct Runners {
    dir: PathBuf,
    source: Proc,
    sinks: Vec<Proc>,
}

impl Runners {
    fn new(source: &Source, destination: &Destination) -> Self {
        let name = &source.db.schema;
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let sp = tributary_tests::free_port();
        let (registry, kafka) = (schema_registry_url(), kafka_bootstrap());
        // The producer sees a partition increase within 2 s (librdkafka's
        // default is 5 minutes), so that keys move partition mid-run.
        let source_config = format!(
            "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\n\
             [kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"2000\"\n\n\
             [admin]\nlisten = \"127.0.0.1:{sp}\"\n\n{}",
            source.runner_section()
        );
        std::fs::write(dir.join("source.toml"), source_config).expect("source config");
        let sinks = (1..=SINK_MEMBERS)
            .map(|member| {
                let kp = tributary_tests::free_port();
                let sink_config = format!(
                    "prefix = \"{name}\"\nconsumer_group = \"{}\"\nschema_registry_url = \"{registry}\"\nbatch_max_records = 2000\n\
                     group_rejoin_after_secs = {GROUP_REJOIN_AFTER_SECS}\n{}\n\
                     [kafka]\nbootstrap_servers = \"{kafka}\"\n\n\
                     [kafka.properties]\n\"session.timeout.ms\" = \"{SESSION_TIMEOUT_MS}\"\n\"heartbeat.interval.ms\" = \"1000\"\n\n\
                     [admin]\nlisten = \"127.0.0.1:{kp}\"\n\n{}",
                    destination.group(),
                    destination.batching(),
                    destination.runner_section()
                );
                let config = dir.join(format!("sink-{member}.toml"));
                std::fs::write(&config, sink_config).expect("sink config");
                Proc::new("sink-runner", config, dir.join(format!("sink-{member}.log")), kp)
            })
            .collect();
        eprintln!("logs: {}/{{source,sink-1,sink-2}}.log", dir.display());
        Self {
            source: Proc::new("source-runner", dir.join("source.toml"), dir.join("source.log"), sp),
            sinks,
            dir,
        }
    }

    fn assert_alive(&mut self, when: &str) {
        self.source.assert_alive(when);
        for sink in &mut self.sinks {
            sink.assert_alive(when);
        }
    }

    /// Kills all and deletes the source's topics and schema subjects, as
    /// an operator would; the fixtures drop the rest. (Not `sink-runner
    /// delete`: it refuses while a killed member is still in its group, for
    /// a session timeout.)
    fn delete(&mut self) {
        self.source.kill9();
        for sink in &mut self.sinks {
            sink.kill9();
        }
        let _ = Command::new(&self.source.bin)
            .arg("--config")
            .arg(&self.source.config)
            .args(["delete", "--yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// How often the sink's members logged a fenced batch (a member that
    /// lost its partitions, writing on: the zombie refused).
    fn fenced_batches(&self) -> usize {
        self.sinks
            .iter()
            .map(|s| {
                std::fs::read_to_string(&s.log)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("batch fenced"))
                    .count()
            })
            .sum()
    }
}

/// Waits until a sink member reports a paused table with a reason, then
/// (after `restore`) until no member reports anything paused: the outage
/// was seen and it came back by itself.
async fn paused_then_resumed<F: std::future::Future<Output = ()>>(
    sinks: &[Proc],
    destination: &Destination,
    what: &str,
    restore: F,
) {
    paused_for_then_resumed(sinks, destination, what, "", restore).await
}

/// [`paused_then_resumed`], for a pause whose reason contains `about` (a
/// pause left from an earlier fault, still waiting for its retry, does not
/// count).
async fn paused_for_then_resumed<F: std::future::Future<Output = ()>>(
    sinks: &[Proc],
    destination: &Destination,
    what: &str,
    about: &str,
    restore: F,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let reason = 'seen: loop {
        for sink in sinks {
            if let Some(r) = sink
                .paused_tables()
                .await
                .and_then(|p| p.into_iter().find(|(_, r)| !r.is_empty() && r.contains(about)))
            {
                break 'seen r;
            }
        }
        if Instant::now() > deadline {
            let mut status = String::new();
            for sink in sinks {
                status.push_str(&sink.get("/status").await.unwrap_or_else(|| "<no status>".into()));
                status.push('\n');
            }
            panic!(
                "{what}: no sink member reported paused within 60s\nsink status:\n{status}{}",
                destination.sessions().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("  {what}: paused ({}: {})", reason.0, reason.1.chars().take(160).collect::<String>());
    restore.await;
    wait_for(&format!("{what}: the sink resumes by itself"), RECOVERY, || async {
        for sink in sinks {
            sink.paused_tables().await.filter(|p| p.is_empty())?;
        }
        Some(())
    })
    .await;
}

/// `tributary_failed_records_total` of `table`, summed over the sink's
/// members (each counts what it dead-lettered since it started).
async fn failed_records(sinks: &[Proc], table: &str) -> Option<u64> {
    let mut sum = 0;
    for sink in sinks {
        sum += sink.failed_records(table).await?;
    }
    Some(sum)
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
    /// Kafka: at least every change before the snapshot's point.
    at_start: HashMap<(String, i64), usize>,
    in_doubt_committed: u64,
    in_doubt_rolled_back: u64,
    /// `source-runner reset`s carried out (offsets-topic-loss): each copied
    /// every table again, after a table-reset record on every partition.
    resets: u64,
    /// Primary key changes committed.
    rekeys: u64,
    /// Per table, the copies the source made again after a ddl fault's
    /// rewrite (each behind a table-reset record on each of its
    /// partitions, as a reset's).
    copies: HashMap<String, u64>,
}

impl Model {
    /// The table-reset records each partition of `table`'s topic carries:
    /// a reset's and a copy again's.
    fn generations(&self, table: &str) -> u64 {
        self.resets + self.copies.get(table).copied().unwrap_or(0)
    }

    fn change_count(&self) -> usize {
        self.changes.values().map(Vec::len).sum()
    }
}

/// One planned statement; `apply` records it in the model once committed.
/// The SQL is the same for every source.
enum Stmt {
    Insert {
        table: &'static str,
        id: i64,
        sql: String,
    },
    Update {
        table: &'static str,
        id: i64,
        sql: String,
    },
    Delete {
        table: &'static str,
        id: i64,
        sql: String,
    },
    /// `UPDATE ... SET id = new`: one update event under the new key (its
    /// `before` names the old one), which sinks apply as a delete of the old
    /// key; the two keys mostly hash to different partitions.
    Rekey {
        table: &'static str,
        old: i64,
        new: i64,
        sql: String,
    },
}

impl Stmt {
    fn sql(&self) -> &str {
        match self {
            Stmt::Insert { sql, .. }
            | Stmt::Update { sql, .. }
            | Stmt::Delete { sql, .. }
            | Stmt::Rekey { sql, .. } => sql,
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
            Stmt::Rekey { table, old, new, .. } => {
                let live = m.live.get_mut(*table).expect("table");
                let v = live.remove(old).expect("rekeyed row is live");
                live.insert(*new, v + 1);
                // The old key ends as if deleted (at its last version), the
                // new one starts with the update.
                m.changes.entry((table.to_string(), *old)).or_default().push((Op::Delete, v));
                m.changes
                    .entry((table.to_string(), *new))
                    .or_default()
                    .push((Op::Update, v + 1));
                m.rekeys += 1;
            }
        }
    }
}

/// The workload: plans transactions, runs them against the source through
/// outages, and keeps the model of what committed.
struct Workload {
    db: SourceDb,
    /// The `due` of a bad note ([`SinkKind::bad_due`]).
    bad_due: &'static str,
    model: Arc<Mutex<Model>>,
}

impl Workload {
    async fn create(&self) {
        self.db.create().await;
        let mut m = self.model.lock().unwrap();
        for t in &TABLES {
            for id in 1..=t.initial_rows {
                m.live.entry(t.name.to_string()).or_default().insert(id, 1);
                m.changes.entry((t.name.to_string(), id)).or_default().push((Op::Create, 1));
            }
            m.next_id.insert(t.name.to_string(), t.initial_rows + 1);
        }
    }

    /// Plans one transaction of 1-4 statements over the three tables.
    fn plan(&self, rng: &mut Rng) -> Vec<Stmt> {
        let s = &self.db.schema;
        let mut m = self.model.lock().unwrap();
        let mut out = Vec::new();
        let mut touched = HashSet::new();
        let due = |rng: &mut Rng| match rng.below(4) {
            0 => "NULL".to_string(),
            _ => format!("'20{:02}-{:02}-{:02}'", rng.below(30), 1 + rng.below(12), 1 + rng.below(28)),
        };
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
                        "INSERT INTO {s}.accounts (id, owner, balance, version) VALUES ({id}, 'owner {id}', {}.{:02}, 1)",
                        rng.below(100_000),
                        rng.below(100)
                    ),
                    "orders" => format!(
                        "INSERT INTO {s}.orders (id, account_id, amount, note, version) VALUES ({id}, {}, {}.50, 'new', 1)",
                        rng.below(500),
                        rng.below(10_000)
                    ),
                    _ => format!("INSERT INTO {s}.notes (id, payload, due, version) VALUES ({id}, 'note {id}', {}, 1)", due(rng)),
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
            } else if kind == 9 {
                // A primary key change: the new id is fresh (reserved like
                // an insert's), so a key never comes back.
                let next = m.next_id.get_mut(table).expect("next id");
                let new = *next;
                *next += 1;
                touched.insert((table, new));
                out.push(Stmt::Rekey {
                    table,
                    old: id,
                    new,
                    sql: format!("UPDATE {s}.{table} SET id = {new}, version = version + 1 WHERE id = {id}"),
                });
            } else {
                let set = match table {
                    "accounts" => format!("balance = {}.{:02}", rng.below(100_000), rng.below(100)),
                    "orders" => format!("amount = amount + 1, note = 'u{}'", rng.below(1000)),
                    _ => format!("payload = 'edited {}', due = {}", rng.below(1000), due(rng)),
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
    async fn run(&self, session: &mut Option<Session>, stmts: &[Stmt], stop: &AtomicBool) -> bool {
        let txid = uuid::Uuid::new_v4();
        let mut sql = String::from("START TRANSACTION;");
        for st in stmts {
            sql.push_str(st.sql());
            sql.push(';');
        }
        sql.push_str(&format!("INSERT INTO {}.txlog VALUES ('{txid}'); COMMIT", self.db.log));
        loop {
            if session.as_ref().is_none_or(Session::is_closed) {
                *session = self.db.connect_retrying(stop).await;
                let Some(s) = session.as_mut() else { return false };
                // Reconnected: did an earlier attempt commit?
                match self.db.committed(s, &txid).await {
                    Ok(true) => {
                        self.model.lock().unwrap().in_doubt_committed += 1;
                        break;
                    }
                    Ok(false) => {}
                    Err(_) => {
                        *session = None;
                        continue;
                    }
                }
            }
            let s = session.as_mut().expect("connected");
            match s.execute(&sql).await {
                Ok(()) => break,
                Err(_) => {
                    // Unknown outcome: drop the session, resolve on reconnect.
                    *session = None;
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
    /// Their payload starts with `prefix` ([`BAD_PREFIX`], or a
    /// replay-dead-letter's own, see [`replay_prefix`]).
    async fn bad_rows(&self, session: &mut Option<Session>, n: u64, prefix: &str, stop: &AtomicBool) -> Vec<i64> {
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
                    sql: format!(
                        "INSERT INTO {}.notes (id, payload, due, version) VALUES ({id}, '{prefix} {id}', {}, 1)",
                        self.db.schema, self.bad_due
                    ),
                });
            }
        }
        assert!(self.run(session, &stmts, stop).await, "bad rows written");
        stmts
            .iter()
            .map(|s| if let Stmt::Insert { id, .. } = s { *id } else { 0 })
            .collect()
    }

    /// Later changes of dead-lettered notes, in one transaction: `fixed`
    /// get a payload the destination takes, `deleted` are deleted.
    async fn later_changes(&self, session: &mut Option<Session>, fixed: &[i64], deleted: &[i64], stop: &AtomicBool) {
        let s = &self.db.schema;
        let mut stmts: Vec<Stmt> = deleted
            .iter()
            .map(|&id| Stmt::Delete {
                table: "notes",
                id,
                sql: format!("DELETE FROM {s}.notes WHERE id = {id}"),
            })
            .collect();
        stmts.extend(fixed.iter().map(|&id| Stmt::Update {
            table: "notes",
            id,
            sql: format!("UPDATE {s}.notes SET payload = 'fixed {id}', version = version + 1 WHERE id = {id}"),
        }));
        assert!(self.run(session, &stmts, stop).await, "later changes of the dead-lettered rows written");
    }
}

/// One schema change of the ddl fault: the kinds of the fidelity matrix
/// (`tests/tests/fidelity.rs`), on a column of its own so the workload's
/// statements (which name their columns) go on unchanged.
struct Ddl {
    sql: String,
    /// Shown in the log.
    what: &'static str,
    /// The column added, or the one dropped.
    added: Option<String>,
    dropped: Option<String>,
    /// Whether it changes values the log carries no row change for, so the
    /// source must copy the table again (docs/schema-changes.md).
    copies: bool,
}

impl Ddl {
    /// A random change of `table` (at `at`, qualified); `added` are the
    /// columns earlier ones added (`g`-prefixed: generated, MariaDB),
    /// `n` numbers a new one.
    fn plan(kind: SourceKind, at: &str, added: &[String], n: u64, rng: &mut Rng) -> Ddl {
        let new = |generated: bool| format!("{}{n}", if generated { "g" } else { "x" });
        let plain: Vec<&String> = added.iter().filter(|c| c.starts_with('x')).collect();
        let choice = rng.below(if added.is_empty() { 2 } else { 4 });
        let add = |sql: String, what, col: String, copies| Ddl { sql, what, added: Some(col), dropped: None, copies };
        match (kind, choice) {
            (SourceKind::Postgres, 0) | (SourceKind::MariaDb, 0) => {
                let c = new(false);
                add(
                    format!("ALTER TABLE {at} ADD COLUMN {c} int DEFAULT 7"),
                    "add a column with a constant default",
                    c,
                    false,
                )
            }
            // A volatile default rewrites the table: the rows there get
            // values no row event carries.
            (SourceKind::Postgres, 1) => {
                let c = new(false);
                add(
                    format!("ALTER TABLE {at} ADD COLUMN {c} int DEFAULT (random() * 1000)::int"),
                    "add a column with a volatile default (a rewrite)",
                    c,
                    true,
                )
            }
            // A copying ALTER: the binlog has the statement, no rows.
            (SourceKind::MariaDb, 1) => {
                let c = new(true);
                add(
                    format!("ALTER TABLE {at} ADD COLUMN {c} INT AS (id * 3) STORED"),
                    "add a stored generated column (a copying ALTER)",
                    c,
                    true,
                )
            }
            (SourceKind::Postgres, 2) if !plain.is_empty() => {
                let c = plain[rng.below(plain.len() as u64) as usize];
                Ddl {
                    sql: format!("ALTER TABLE {at} ALTER COLUMN {c} TYPE bigint USING {c} + 1"),
                    what: "retype a column USING an expression (a rewrite)",
                    added: None,
                    dropped: None,
                    copies: true,
                }
            }
            (SourceKind::MariaDb, 2) if !plain.is_empty() => {
                let c = plain[rng.below(plain.len() as u64) as usize];
                Ddl {
                    sql: format!("ALTER TABLE {at} MODIFY {c} BIGINT DEFAULT 7"),
                    what: "widen a column (values kept)",
                    added: None,
                    dropped: None,
                    copies: false,
                }
            }
            _ => {
                let c = added[rng.below(added.len() as u64) as usize].clone();
                Ddl {
                    sql: format!("ALTER TABLE {at} DROP COLUMN {c}"),
                    what: "drop a column",
                    added: None,
                    dropped: Some(c),
                    copies: false,
                }
            }
        }
    }
}

/// Writes `n` notes the destination refuses and waits until the sink's
/// failed-records counter moved by exactly `n`; returns their ids.
async fn write_bad_rows(
    workload: &Workload,
    sinks: &[Proc],
    session: &mut Option<Session>,
    stop: &AtomicBool,
    n: u64,
    prefix: &str,
) -> Vec<i64> {
    let before = wait_for("the sink's metrics", RECOVERY, || failed_records(sinks, "notes")).await;
    let ids = workload.bad_rows(session, n, prefix, stop).await;
    wait_for(&format!("{n} more failed records"), RECOVERY, || async {
        failed_records(sinks, "notes").await.filter(|now| *now >= before + n)
    })
    .await;
    let now = failed_records(sinks, "notes").await.unwrap_or(0);
    assert_eq!(now, before + n, "the failed counter moves by the number of bad rows");
    ids
}

/// Dead-lettered notes whose keys changed later at the source.
struct Replayed {
    /// Updated to a payload the destination takes (version 2).
    fixed: Vec<i64>,
    deleted: Vec<i64>,
}

/// The payload prefix of replay-dead-letter number `n`'s notes, which
/// the destination refuses until that fault's replay (its own CHECK, so
/// that the replay lets in nothing else: a row refused by a CHECK the
/// destination still has must not get in).
fn replay_prefix(n: u64) -> String {
    format!("REPLAY{n}")
}

/// replay-dead-letter's first half: 2-3 notes dead-lettered (refused by
/// the CHECK of replay `replay`), then (once they are) one of them fixed
/// and the others deleted at the source.
async fn dead_letter_then_change(
    workload: &Workload,
    sinks: &[Proc],
    session: &mut Option<Session>,
    stop: &AtomicBool,
    rng: &mut Rng,
    replay: u64,
) -> Replayed {
    let n = 2 + rng.below(2);
    let ids = write_bad_rows(workload, sinks, session, stop, n, &replay_prefix(replay)).await;
    let (fixed, deleted) = ids.split_at(1);
    workload.later_changes(session, fixed, deleted, stop).await;
    Replayed { fixed: fixed.to_vec(), deleted: deleted.to_vec() }
}

/// `<bin> --config <config> ARGS` to its end, off the async runtime.
async fn command(bin: &std::path::Path, config: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (bin, config) = (bin.to_path_buf(), config.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let what = format!("{} {}", bin.display(), args.join(" "));
    tokio::task::spawn_blocking(move || Command::new(&bin).arg("--config").arg(&config).args(&args).output())
        .await
        .expect("command task")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `source-runner reset` (every table), as an operator would.
async fn source_reset(source: &Proc) {
    let out = command(&source.bin, &source.config, &["reset"]).await;
    assert!(
        out.status.success(),
        "source-runner reset failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------- kafka

/// The harness's side of Kafka: change topics made with more partitions,
/// grown, deleted. Metadata is always asked for every topic: a request
/// naming one topic would create it (the stack's brokers have
/// `auto.create.topics.enable`).
struct KafkaAdmin {
    admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    meta: BaseConsumer,
}

impl KafkaAdmin {
    fn new() -> Self {
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", kafka_bootstrap());
        let admin = config.create().expect("admin client");
        let meta = committed_reader("faults-meta")
            .set("allow.auto.create.topics", "false")
            .create()
            .expect("metadata client");
        Self { admin, meta }
    }

    /// The partition count of `topic`, `None` if it does not exist.
    fn partitions(&self, topic: &str) -> Option<i32> {
        let meta = self.meta.fetch_metadata(None, Duration::from_secs(10)).ok()?;
        let t = meta.topics().iter().find(|t| t.name() == topic)?;
        (t.error().is_none()).then(|| t.partitions().len() as i32)
    }

    /// Creates `topics` with `partitions` partitions each.
    async fn create(&self, topics: &[String], partitions: i32) {
        use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
        let new: Vec<NewTopic> = topics
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
            .collect();
        for r in self
            .admin
            .create_topics(&new, &AdminOptions::new())
            .await
            .expect("create topics")
        {
            r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
        for t in topics {
            wait_for(&format!("{t} with {partitions} partitions"), RECOVERY, || async {
                (self.partitions(t) == Some(partitions)).then_some(())
            })
            .await;
        }
    }

    /// Raises `topic`'s partition count to `total`.
    async fn grow(&self, topic: &str, total: i32) {
        use rdkafka::admin::{AdminOptions, NewPartitions};
        let new = NewPartitions::new(topic, total as usize);
        for r in self
            .admin
            .create_partitions(&[new], &AdminOptions::new())
            .await
            .expect("create partitions")
        {
            r.unwrap_or_else(|(t, e)| panic!("add partitions to {t}: {e}"));
        }
        wait_for(&format!("{topic} with {total} partitions"), RECOVERY, || async {
            (self.partitions(topic) == Some(total)).then_some(())
        })
        .await;
    }

    /// Deletes `topic` and waits until it is gone.
    async fn delete(&self, topic: &str) {
        use rdkafka::admin::AdminOptions;
        for r in self
            .admin
            .delete_topics(&[topic], &AdminOptions::new())
            .await
            .expect("delete topic")
        {
            r.unwrap_or_else(|(t, e)| panic!("delete topic {t}: {e}"));
        }
        wait_for(&format!("{topic} gone"), RECOVERY, || async { self.partitions(topic).is_none().then_some(()) }).await;
    }

    /// Each partition's high watermark (the offset after its last record,
    /// commit markers included).
    fn high_watermarks(&self, topic: &str) -> Vec<(i32, i64)> {
        let n = self.partitions(topic).expect("the topic exists");
        (0..n)
            .map(|p| {
                let (_, high) = self
                    .meta
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
                (p, high)
            })
            .collect()
    }
}

// ---------------------------------------------------------------- the run

async fn run(pipeline: &Pipeline) {
    let Some(Params { seed, faults, rate, duration, snapshot_kill, kinds }) = Params::from_env(pipeline) else {
        return;
    };
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    ADDED_COLUMNS.lock().unwrap().clear();
    eprintln!(
        "{}: FAULT_SEED={seed} FAULTS={faults} FAULT_RATE={rate} FAULT_DURATION={} FAULT_SNAPSHOT_KILL={} FAULT_KINDS={}",
        pipeline.name,
        duration.as_secs(),
        u8::from(snapshot_kill),
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
    );
    // Every seed its own schedule (xorshift needs a state other than 0).
    // Until 2026-12-02 this was `seed | 1`: an even seed ran the schedule
    // of the odd one after it; odd seeds replay as they did.
    let mut rng = Rng(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed });
    let started = Instant::now();
    let at = || format!("[{:>5.1}s]", started.elapsed().as_secs_f64());

    let source = Source::new(pipeline.source).await;
    let destination = Destination::new(pipeline.sink).await;
    let name = source.db.schema.clone();
    let model = Arc::new(Mutex::new(Model::default()));
    let workload = Arc::new(Workload {
        db: source.db.clone(),
        bad_due: pipeline.sink.bad_due(),
        model: model.clone(),
    });
    workload.create().await;

    // A reader for the start only (the first snapshot chunk); the topics
    // are read again from the beginning, by a fresh consumer, at the end: a
    // consumer living through all the broker restarts would test the
    // harness's librdkafka as much as the runners.
    let pattern = format!("^{name}\\.{name}\\.(accounts|orders|notes)$");
    let stop_reader = Arc::new(AtomicBool::new(false));
    let reader_errors: ReaderErrors = Arc::default();
    let born: Generations = Arc::default();
    let seen = collect(pattern.clone(), stop_reader.clone(), reader_errors.clone(), born.clone());

    // The change topics with more than one partition, before the source
    // makes them with the broker's one.
    let kafka = KafkaAdmin::new();
    let topic = |table: &str| format!("{name}.{name}.{table}");
    kafka.create(&TABLES.map(|t| topic(t.name)), TOPIC_PARTITIONS).await;

    // The workload: `rate` transactions a second until told to stop.
    let stop_workload = Arc::new(AtomicBool::new(false));
    let work = {
        let (w, stop) = (workload.clone(), stop_workload.clone());
        let mut wrng = Rng(rng.next() | 1);
        tokio::spawn(async move {
            let mut session = None;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let plan = w.plan(&mut wrng);
                if !plan.is_empty() && !w.run(&mut session, &plan, &stop).await {
                    break;
                }
            }
        })
    };

    let mut p = Runners::new(&source, &destination);
    let reads = |seen: &Seen| {
        seen.lock()
            .unwrap()
            .values()
            .filter(|v| v.first().is_some_and(|e| e.op == Op::Read))
            .count()
    };

    p.source.start();
    // The snapshot's point exists once the first snapshot chunk is in
    // Kafka: every change before it is at most what the snapshot stands for.
    wait_for("the first snapshot chunk", RECOVERY, || async { (reads(&seen) > 0).then_some(()) }).await;
    {
        let mut m = model.lock().unwrap();
        m.at_start = m.changes.iter().map(|(k, v)| (k.clone(), v.len())).collect();
    }
    stop_reader.store(true, Ordering::Relaxed);
    if snapshot_kill {
        // Kill the source during its snapshot, right after that chunk.
        p.source.kill9();
        eprintln!("{} fault: kill-source during the snapshot", at());
        p.source.start();
    } else {
        // Strict mode: no source crash until the snapshot is done.
        wait_for("the snapshot of every table", RECOVERY, || p.source.all_streaming()).await;
    }

    // Kill a sink member while it applies the snapshot.
    for sink in &mut p.sinks {
        sink.start();
    }
    wait_for("the first applied rows", RECOVERY, || async { destination.has_rows().await.then_some(()) }).await;
    p.sinks[0].kill9();
    eprintln!("{} fault: kill-sink (member 1) during the snapshot", at());
    p.sinks[0].start();
    destination.refuse_bad_rows().await;

    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    // Notes the destination refuses (bad-rows), and those written by
    // replay-dead-letter (refused, then fixed or deleted at the source).
    let mut bad_rows: Vec<i64> = Vec::new();
    let mut replayed_rows: Vec<i64> = Vec::new();
    // Dead letters of bad rows copied again by a reset or a ddl fault's
    // rewrite of `notes` (each once more).
    let mut copied_again: usize = 0;
    // replay-dead-letter faults so far.
    let mut replays: u64 = 0;
    let mut bad_session = None;
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
        eprintln!("{} fault {}/{faults}: {}", at(), i + 1, fault.name());
        match fault {
            Fault::KillSource => {
                p.source.kill9();
                tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
                p.source.start();
            }
            Fault::KillSink => {
                // One member: the other takes over its partitions (a
                // rebalance), and again when it comes back.
                let m = rng.below(p.sinks.len() as u64) as usize;
                eprintln!("  member {}", m + 1);
                p.sinks[m].kill9();
                tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
                p.sinks[m].start();
            }
            Fault::FreezeSink => {
                // SIGSTOP for longer than the session: the group gives its
                // partitions to the other member while it may be in the
                // middle of a batch; after SIGCONT it writes on as a zombie
                // (its batch is fenced, it reads the stored offsets again).
                let m = rng.below(p.sinks.len() as u64) as usize;
                let frozen = Duration::from_millis(SESSION_TIMEOUT_MS + 2000 + rng.below(4000));
                eprintln!("  member {} for {:.1}s", m + 1, frozen.as_secs_f64());
                p.sinks[m].signal("STOP");
                tokio::time::sleep(frozen).await;
                p.sinks[m].signal("CONT");
            }
            Fault::PartitionIncrease => {
                let table = TABLES[rng.below(TABLES.len() as u64) as usize].name;
                let t = topic(table);
                let now = kafka.partitions(&t).expect("the change topic exists");
                if now >= MAX_PARTITIONS {
                    eprintln!("  {t} has {now} partitions already");
                } else {
                    // Resets before it never put a record on it.
                    born.lock()
                        .unwrap()
                        .insert((t.clone(), now), model.lock().unwrap().generations(table));
                    kafka.grow(&t, now + 1).await;
                    eprintln!("  {t}: {now} -> {} partitions", now + 1);
                }
            }
            Fault::OffsetsTopicLoss => {
                // The checkpoint is gone while the slot remains: the source
                // must stop for an operator, who runs `source-runner reset`.
                let failed_before =
                    wait_for("the sink's metrics", RECOVERY, || failed_records(&p.sinks, "notes")).await;
                p.source.kill9();
                kafka.delete(&format!("{name}.tributary.offsets")).await;
                p.source.start();
                let reason = wait_for("the source stops for an operator (lost checkpoint)", RECOVERY, || async {
                    p.source
                        .paused_tables()
                        .await?
                        .into_iter()
                        .find(|(what, r)| what == "runner" && r.contains("no checkpoint"))
                        .map(|(_, r)| r)
                })
                .await;
                assert!(
                    reason.contains("source-runner --config <source.toml> reset"),
                    "the hint names source-runner reset: {reason}"
                );
                // Stopped or running (then fenced, it starts again by itself).
                let stopped = rng.below(2) == 0;
                if stopped {
                    p.source.kill9();
                }
                eprintln!("  needs operator; source-runner reset ({})", if stopped { "stopped" } else { "running" });
                source_reset(&p.source).await;
                if stopped {
                    p.source.start();
                }
                let resets = {
                    let mut m = model.lock().unwrap();
                    m.resets += 1;
                    m.resets
                };
                // Each bad row is copied again and refused again.
                copied_again += bad_rows.len();
                wait_for(&format!("reset {resets}: every table copied again"), RECOVERY, || async {
                    let status: serde_json::Value = serde_json::from_str(&p.source.get("/status").await?).ok()?;
                    status.get("paused")?.is_null().then_some(())?;
                    p.source.all_streaming().await
                })
                .await;
                // (Before the next fault counts failed records.)
                let want = failed_before + bad_rows.len() as u64;
                wait_for(&format!("the {} bad rows refused again", bad_rows.len()), RECOVERY, || async {
                    failed_records(&p.sinks, "notes").await.filter(|now| *now >= want)
                })
                .await;
            }
            Fault::ReplayDeadLetter => {
                refused_rows_wait_for_the_snapshot(&p).await;
                replays += 1;
                destination.refuse_replayed(replays).await;
                let ids =
                    dead_letter_then_change(&workload, &p.sinks, &mut bad_session, &stop_workload, &mut rng, replays)
                        .await;
                replayed_rows.extend(&ids.fixed);
                replayed_rows.extend(&ids.deleted);
                destination.wait_applied(&kafka, &topic("notes"), &ids).await;
                destination
                    .replay_and_check(&p.sinks[0], &format!("{}.dlq", topic("notes")), &ids, replays)
                    .await;
            }
            Fault::Ddl => {
                let table = TABLES[rng.below(TABLES.len() as u64) as usize].name;
                let added = ADDED_COLUMNS.lock().unwrap().get(table).cloned().unwrap_or_default();
                let at = format!("{}.{table}", source.db.schema);
                let ddl = Ddl::plan(pipeline.source, &at, &added, i, &mut rng);
                eprintln!("  {table}: {} ({})", ddl.what, ddl.sql);
                // A copy of `notes` writes its bad rows again: each is
                // refused again (as after a reset).
                let failed_before = if ddl.copies && table == "notes" {
                    Some(wait_for("the sink's metrics", RECOVERY, || failed_records(&p.sinks, "notes")).await)
                } else {
                    None
                };
                let since = now_ms();
                let mut session = source.db.connect_retrying(&AtomicBool::new(false)).await.expect("a session");
                session.execute(&ddl.sql).await.unwrap_or_else(|e| panic!("{}: {e}", ddl.sql));
                {
                    let mut columns = ADDED_COLUMNS.lock().unwrap();
                    let columns = columns.entry(table).or_default();
                    columns.extend(ddl.added.clone());
                    columns.retain(|c| Some(c) != ddl.dropped.as_ref());
                }
                if ddl.copies {
                    // The source says it copies the table again, and does
                    // (behind a table-reset record on each partition).
                    wait_for(&format!("{table} copied again after the rewrite"), RECOVERY, || {
                        p.source.copied_again_since(table, since)
                    })
                    .await;
                    *model.lock().unwrap().copies.entry(table.to_string()).or_default() += 1;
                    let deadline = Instant::now() + RECOVERY;
                    while p.source.all_streaming().await.is_none() {
                        assert!(
                            Instant::now() < deadline,
                            "{table}: its copy not done within {RECOVERY:?}; the source's status: {}",
                            p.source.get("/status").await.unwrap_or_default()
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    if let Some(before) = failed_before {
                        copied_again += bad_rows.len();
                        let want = before + bad_rows.len() as u64;
                        wait_for(&format!("the {} bad rows refused again", bad_rows.len()), RECOVERY, || async {
                            failed_records(&p.sinks, "notes").await.filter(|now| *now >= want)
                        })
                        .await;
                    }
                }
            }
            Fault::RestartKafka => stack(&["restart", "kafka"]),
            Fault::RestartRegistry => stack(&["restart", "registry"]),
            Fault::StopPostgres | Fault::RestartMariaDb => {
                let stopped = Stopped::stop(if fault == Fault::StopPostgres {
                    "postgres"
                } else {
                    "mariadb"
                });
                tokio::time::sleep(Duration::from_millis(2000 + rng.below(6000))).await;
                stopped.start();
            }
            Fault::DestinationDown => destination.down_then_back(&p.sinks).await,
            Fault::RevokeSink => destination.revoke_then_grant(&p.sinks).await,
            Fault::BadRows => {
                refused_rows_wait_for_the_snapshot(&p).await;
                let n = 1 + rng.below(3);
                bad_rows
                    .extend(write_bad_rows(&workload, &p.sinks, &mut bad_session, &stop_workload, n, BAD_PREFIX).await);
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
    eprintln!("{} workload stopped: {committed} transactions, {changes} changes; catching up", at());
    let want = source.db.rows().await.expect("the source's rows");
    let deadline = Instant::now() + RECOVERY;
    loop {
        p.assert_alive("while catching up");
        let got = destination.rows().await;
        let diff = match &got {
            Ok(got) => differences(&want, got),
            Err(e) => vec![format!("cannot read the destination: {e}")],
        };
        if diff.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the destination differs from the source: {diff:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let sizes: BTreeMap<&str, usize> = want.iter().map(|(t, r)| (*t, r.len())).collect();
    eprintln!("{} destination equals the source, every column of every row: {sizes:?}", at());
    // The product's own check says so too (docs/verification.md): a
    // verification of every table, equal on the members that compare its
    // partitions, every source row compared.
    verify_every_table(&mut p, &sizes, bad_rows.len() as u64).await;
    eprintln!("{} the verification of every table is equal", at());
    let stop_reader = Arc::new(AtomicBool::new(false));
    let seen = collect(pattern, stop_reader.clone(), reader_errors.clone(), born.clone());
    let deadline = Instant::now() + RECOVERY;
    loop {
        let behind: Vec<String> = {
            let seen = seen.lock().unwrap();
            let m = model.lock().unwrap();
            let last = |k: &(String, i64)| {
                ordered(seen.get(k).map(Vec::as_slice).unwrap_or(&[]), m.generations(&k.0))
                    .pop()
                    .unwrap_or_default()
            };
            m.changes
                .iter()
                .filter(|(k, want)| !caught_up(want, &last(k)))
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
    let (by_generation, moved) = {
        let (seen, m) = (seen.lock().unwrap(), model.lock().unwrap());
        let by_generation: ByGeneration = seen
            .iter()
            .map(|(k, evs)| (k.clone(), ordered(evs, m.generations(&k.0))))
            .collect();
        // Keys whose events are on more than one partition (moved by a
        // partition increase; an old key's end is on the new key's).
        let moved = seen
            .values()
            .filter(|evs| evs.iter().map(|e| e.partition).collect::<HashSet<_>>().len() > 1)
            .count();
        (by_generation, moved)
    };
    check_topics(&model.lock().unwrap(), &by_generation, snapshot_kill).unwrap_or_else(|problems| {
        panic!(
            "{} keys differ from the committed changes (lost, repeated or out of order), first: {:#?}",
            problems.len(),
            &problems[..problems.len().min(10)]
        )
    });

    // Dead letters: exactly the bad rows, each once (a member frozen past
    // its session is fenced from repeating one), and once more each bad row
    // a reset copied again (a new source record).
    let mut dead: BTreeMap<(String, String), usize> = BTreeMap::new();
    for t in &TABLES {
        for m in read_all(&format!("{name}.{name}.{}.dlq", t.name)) {
            assert_eq!(t.name, "notes", "only bad notes are dead-lettered, found one of {}", t.name);
            let reason = header(&m, sink_runner::dead_letters::HEADER_REASON).unwrap_or_default();
            assert!(reason.starts_with("permanent"), "reason header: {reason}");
            let at = (
                header(&m, sink_runner::dead_letters::HEADER_PARTITION).unwrap_or_default(),
                header(&m, sink_runner::dead_letters::HEADER_OFFSET).unwrap_or_default(),
            );
            *dead.entry(at).or_default() += 1;
        }
    }
    let repeated = dead.values().filter(|n| **n > 1).count();
    assert_eq!(
        repeated,
        0,
        "source records dead-lettered twice: {:?}",
        dead.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    assert_eq!(
        dead.len(),
        bad_rows.len() + replayed_rows.len() + copied_again,
        "one dead letter per bad row ({} bad rows, {} replayed, {copied_again} copied again by resets)",
        bad_rows.len(),
        replayed_rows.len()
    );
    let (in_doubt, rekeys, resets) = {
        let m = model.lock().unwrap();
        ((m.in_doubt_committed, m.in_doubt_rolled_back), m.rekeys, m.resets)
    };
    p.assert_alive("at the end");
    eprintln!(
        "PASSED {} seed={seed}: {faults} faults {counts:?}, {committed} transactions, {changes} changes, \
         {rekeys} key changes, {moved} keys on more than one partition, {resets} resets, {} fenced batches, \
         {} bad rows dead-lettered ({repeated} written twice, {copied_again} again by resets), {} replayed, \
         in-doubt commits resolved {}/{}, {:.0}s",
        pipeline.name,
        p.fenced_batches(),
        bad_rows.len(),
        replayed_rows.len(),
        in_doubt.0,
        in_doubt.1,
        started.elapsed().as_secs_f64()
    );

    // Tidy up.
    p.delete();
    source.cleanup().await;
    destination.cleanup().await;
    let _ = std::fs::remove_dir_all(&p.dir);
}

/// Asks the source runner to verify every table (`POST /verify`) and waits
/// until, for each table of `sizes`, the sink members that compare its
/// partitions ended that verification, `equal`, with every source row
/// compared once. The bad notes the destination refused (up to `refused`,
/// left out of `sizes`) are the one difference allowed: missing there.
async fn verify_every_table(p: &mut Runners, sizes: &BTreeMap<&str, usize>, refused: u64) {
    let url = format!("{}/verify", p.source.admin);
    let deadline = Instant::now() + RECOVERY;
    let id: u64 = loop {
        let answer = match reqwest::Client::new().post(&url).send().await {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => e.to_string(),
        };
        if let Some(id) = answer
            .split_whitespace()
            .nth(1)
            .and_then(|w| w.trim_end_matches(':').parse().ok())
        {
            break id;
        }
        assert!(Instant::now() < deadline, "POST /verify failed: {answer}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    loop {
        p.assert_alive("while verifying");
        let mut entries: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
        for sink in &p.sinks {
            let Some(status) = sink.get("/status").await else {
                continue;
            };
            let Ok(status) = serde_json::from_str::<serde_json::Value>(&status) else {
                continue;
            };
            let Some(tables) = status.get("tables").and_then(|t| t.as_object()) else {
                continue;
            };
            for (label, t) in tables {
                let Some(v) = t.get("verification").filter(|v| v["id"].as_u64() == Some(id)) else {
                    continue;
                };
                if let Some(name) = sizes.keys().find(|n| label.ends_with(&format!(".{n}"))) {
                    entries.entry(name).or_default().push(v.clone());
                }
            }
        }
        let pending: Vec<String> = sizes
            .iter()
            .filter_map(|(name, rows)| {
                let found = entries.get(name).map(Vec::as_slice).unwrap_or_default();
                let mut missing = 0;
                for v in found.iter().filter(|v| v["finished_ms"].is_i64()) {
                    let refused_only = *name == "notes"
                        && v["differences"].as_array().is_some_and(|d| {
                            d.iter()
                                .all(|d| d.as_str().unwrap_or_default().ends_with("missing in the destination"))
                        });
                    // A column the ddl fault added is in the table's topic
                    // from the table's next change on (docs/verification.md):
                    // until then the verification says it cannot compare it.
                    let added_only = v["state"] == "not_verified"
                        && v["rows_differing"] == 0
                        && v["reason"].as_str().is_some_and(|r| r.contains("is not in the range's schema"));
                    if added_only {
                        eprintln!("{name}: columns added at the source are not in the destination yet: {v}");
                    } else if v["state"] != "equal" && refused_only {
                        missing += v["rows_differing"].as_u64().unwrap_or(0);
                    } else {
                        assert_eq!(v["state"], "equal", "the verification of {name}: {v}");
                    }
                }
                assert!(missing <= refused, "{missing} notes missing, {refused} refused: {found:?}");
                let compared: u64 = found.iter().map(|v| v["rows_verified"].as_u64().unwrap_or(0)).sum();
                let ended = !found.is_empty() && found.iter().all(|v| v["finished_ms"].is_i64());
                (!ended || compared < *rows as u64 || compared > *rows as u64 + refused)
                    .then(|| format!("{name}: {compared} of {rows} rows compared, ended: {ended}"))
            })
            .collect();
        if pending.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the verification did not end: {pending:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Rows the destination refuses are written once the source's snapshot is
/// done: during a resumed snapshot a row inserted after the first
/// snapshot's point is both streamed and read by the snapshot (the shape
/// both sources document, see [`check_topics`]), and each of the two
/// records is refused, so the count of dead letters per bad row would
/// depend on the moment.
async fn refused_rows_wait_for_the_snapshot(p: &Runners) {
    wait_for("the source's snapshot done", RECOVERY, || p.source.all_streaming()).await;
}

/// Now, in ms since the epoch (the runners' clock: the same machine).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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

/// One event of a key as read: (op, version), the partition it was on and
/// how many resets (table-reset records) that partition had seen before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ev {
    op: Op,
    version: i64,
    partition: i32,
    generation: u64,
}

type Seen = Arc<Mutex<HashMap<(String, i64), Vec<Ev>>>>;

/// Each key's (op, version) in source order, per generation ([`ordered`]).
type ByGeneration = HashMap<(String, i64), Vec<Vec<(Op, i64)>>>;

/// Per (topic, partition) added by partition-increase: the resets carried
/// out before it existed (they never put a record on it).
type Generations = Arc<Mutex<HashMap<(String, i32), u64>>>;

/// The reader's own failures (a record that does not decode), reported by
/// the waits instead of dying unseen in a spawned task.
type ReaderErrors = Arc<Mutex<Vec<String>>>;

/// Collects the events per key from the change topics, `read_committed`.
/// An update that changes the key counts for the old key too, as the delete
/// of its last version (the update bumped it by one), on the new key's
/// partition. Table-reset records (`source-runner reset`) start a new
/// generation on their partition.
fn collect(pattern: String, stop: Arc<AtomicBool>, errors: ReaderErrors, born: Generations) -> Seen {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let consumer: StreamConsumer = committed_reader("faults-reader").create().expect("consumer");
        consumer.subscribe(&[&pattern]).expect("subscribe");
        let mut decoder = EventDecoder::new(Registry::new(schema_registry_url()).expect("registry"));
        // Per (topic, partition): the reset ids seen.
        let mut resets: HashMap<(String, i32), HashSet<String>> = HashMap::new();
        while !stop.load(Ordering::Relaxed) {
            let m = match tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await {
                Ok(Ok(m)) => m,
                // Broker restarts and topics that do not exist yet.
                _ => continue,
            };
            let at = (m.topic().to_string(), m.partition());
            if m.payload().is_none() {
                let m = m.detach();
                if header(&m, "tributary.control").as_deref() == Some("table-reset") {
                    let id = header(&m, "tributary.reset").unwrap_or_default();
                    resets.entry(at).or_default().insert(id);
                }
                continue;
            }
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
                let generation =
                    born.lock().unwrap().get(&at).copied().unwrap_or(0) + resets.get(&at).map_or(0, |r| r.len() as u64);
                let ev = |op, version| Ev { op, version, partition: m.partition(), generation };
                let mut out = out.lock().unwrap();
                let table = e.schema.id.table.clone();
                if let (Op::Update, Some(before)) = (e.op, e.before.as_ref()) {
                    if let Some(old) = int(&before[idx("id")]).filter(|old| *old != id) {
                        out.entry((table.clone(), old)).or_default().push(ev(Op::Delete, version - 1));
                    }
                }
                out.entry((table, id)).or_default().push(ev(e.op, version));
            }
        }
    });
    seen
}

/// A key's events in source order, per generation (one more than the
/// resets; the last is what the topics hold now): each partition's events in
/// the order read, merged across partitions by version. A key's events are
/// in order on one partition only: after a partition increase its newer
/// events go to another partition, and an update that changed a key is on
/// the new key's. (Within a version a change comes before the read of it,
/// and a delete last.)
fn ordered(events: &[Ev], resets: u64) -> Vec<Vec<(Op, i64)>> {
    let rank = |op: Op| match op {
        Op::Create | Op::Update => 0,
        Op::Read => 1,
        Op::Delete => 2,
        Op::Truncate => 3,
    };
    let generations = events.iter().map(|e| e.generation).max().unwrap_or(0).max(resets);
    (0..=generations)
        .map(|g| {
            let mut parts: BTreeMap<i32, std::collections::VecDeque<(Op, i64)>> = BTreeMap::new();
            for e in events.iter().filter(|e| e.generation == g) {
                parts.entry(e.partition).or_default().push_back((e.op, e.version));
            }
            let mut out = Vec::new();
            while let Some(next) = parts
                .values_mut()
                .filter(|q| !q.is_empty())
                .min_by_key(|q| q.front().map(|(op, v)| (*v, rank(*op))))
            {
                out.extend(next.pop_front());
            }
            out
        })
        .collect()
}

/// Reads a whole topic (to its end at the time of the call).
fn read_all(topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    let mut config = committed_reader("faults-dlq");
    let consumer: BaseConsumer = config.set("enable.partition.eof", "true").create().expect("consumer");
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

/// Whether a key's last event is in: the last change, or a snapshot read of
/// the last version, or nothing for a row gone before the snapshot. `got`
/// is the key's last generation ([`ordered`]). (The strict check is
/// [`check_topics`].)
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
/// up to the version it read. No replay, gap or reordering is allowed,
/// also after a source crash during the snapshot.
///
/// After such a crash (`resumed`) the keys whose ranges were read after the
/// restart, at a second point `P2` later than the first snapshot's `P1`,
/// differ as both sources document (docs/sources/postgresql.md, "Restart
/// during the snapshot"; docs/sources/mysql.md, "Resumed snapshot"), and
/// only in these ways:
/// - the stream first caught up from `P1` to `P2`: the committed changes
///   from the first snapshot's point up to exactly the version read come
///   before the read; nothing older than the read follows it;
/// - a row that existed at the first snapshot's point but was deleted
///   before its range was read has no read, only its changes from the first
///   point on, ending with the delete.
///
/// After a `source-runner reset` (offsets-topic-loss: the checkpoint was
/// lost, so what the topics got before the reset may stop anywhere) every
/// table is copied again behind a table-reset record on each partition
/// (docs/operations.md, Reset). The events before it must be a beginning of
/// the shapes above; those after it a copy of its own: the read of the
/// version the row had at the copy, then every change after it; nothing for
/// a row gone before the copy; every change for a row made after it.
///
/// `seen` holds each key's events per generation ([`ordered`]). Returns the
/// keys that differ.
fn check_topics(model: &Model, seen: &ByGeneration, resumed: bool) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let none: Vec<Vec<(Op, i64)>> = Vec::new();
    for (key, want) in &model.changes {
        let generations = seen.get(key).unwrap_or(&none);
        let last = model.generations(&key.0) as usize;
        let segment = |g: usize| generations.get(g).map(Vec::as_slice).unwrap_or(&[]);
        let at_start = model.at_start.get(key).copied().unwrap_or(0);
        if let Err(p) = check_first(want, segment(0), resumed, at_start, last == 0) {
            problems.push(format!("{key:?}: {p}"));
            continue;
        }
        for g in 1..=last {
            let earlier_empty = (0..g).all(|e| segment(e).is_empty());
            if let Err(p) = check_copy(want, segment(g), g == last, earlier_empty) {
                problems.push(format!("{key:?}, after reset {g}: {p}"));
                break;
            }
        }
        if generations.len() > last + 1 {
            problems.push(format!("{key:?}: events after {} resets, only {last} were made", generations.len() - 1));
        }
    }
    for key in seen.keys() {
        if !model.changes.contains_key(key) {
            problems.push(format!("{key:?}: events for a row never written"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Where the events after a read of version `v` start in `want`.
fn after_read(want: &[(Op, i64)], v: i64) -> Option<usize> {
    want.iter().rposition(|(op, w)| *op != Op::Delete && *w == v).map(|pos| pos + 1)
}

/// The events of a key up to the first reset (all of them without one):
/// see [`check_topics`]. `complete`: no reset followed, so they must be all
/// of the key's changes, not only a beginning.
fn check_first(
    want: &[(Op, i64)],
    got: &[(Op, i64)],
    resumed: bool,
    at_start: usize,
    complete: bool,
) -> Result<(), String> {
    // At most one read per key; after a resumed snapshot it may follow
    // changes the stream emitted while catching up to that snapshot.
    let reads: Vec<usize> = got
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| *op == Op::Read)
        .map(|(i, _)| i)
        .collect();
    if reads.len() > 1 {
        return Err(format!("read more than once: {got:?}"));
    }
    let (pre, read, rest) = match reads.first() {
        Some(&i) => (&got[..i], Some(got[i].1), &got[i + 1..]),
        None => (&got[..0], None, got),
    };
    // Where the events after the read must start in `want`.
    let from = match read {
        Some(v) => {
            after_read(want, v).ok_or_else(|| format!("snapshot read at version {v}, never committed: {got:?}"))?
        }
        None => 0,
    };
    let fits = |rest: &[(Op, i64)], from: usize| {
        let tail = &want[from.min(want.len())..];
        rest == tail || !complete && tail.starts_with(rest)
    };
    // The changes before the read: none, or (after a resumed snapshot
    // that catches up first) the committed changes from the first
    // snapshot's point up to exactly the version read.
    let pre_ok = pre.is_empty()
        || (resumed && pre.len() <= from && want[from - pre.len()..from] == *pre && from - pre.len() <= at_start);
    if pre_ok && fits(rest, from) {
        return Ok(());
    }
    // A row inserted and deleted before the snapshot: no events.
    if got.is_empty() && (!complete || want.last().is_some_and(|(op, _)| *op == Op::Delete)) {
        return Ok(());
    }
    // `rest` is every change from the first snapshot's point on, of a row
    // that existed before that point and whose range was read after the row
    // was gone.
    if resumed
        && read.is_none()
        && !rest.is_empty()
        && (0..=at_start.min(want.len())).any(|j| {
            let tail = &want[j..];
            if complete {
                tail == rest
            } else {
                tail.starts_with(rest)
            }
        })
    {
        return Ok(());
    }
    Err(format!("got {got:?}, expected {:?} after the read {read:?}", &want[from.min(want.len())..]))
}

/// The events of a key after a reset (up to the next one if not `last`):
/// the copy's read and every later change, or nothing for a row gone
/// before the copy, or every change of a row made after it (`earlier_empty`:
/// the key had no events before). Not `last`: a beginning of that.
fn check_copy(want: &[(Op, i64)], got: &[(Op, i64)], last: bool, earlier_empty: bool) -> Result<(), String> {
    let fits = |rest: &[(Op, i64)], tail: &[(Op, i64)]| if last { rest == tail } else { tail.starts_with(rest) };
    match got.first() {
        None if !last || want.last().is_some_and(|(op, _)| *op == Op::Delete) => Ok(()),
        None => Err(format!("nothing after the reset, the row is live: want {want:?}")),
        Some((Op::Read, v)) => {
            let from =
                after_read(want, *v).ok_or_else(|| format!("copy read at version {v}, never committed: {got:?}"))?;
            if fits(&got[1..], &want[from..]) {
                Ok(())
            } else {
                Err(format!("got {got:?}, expected the read then {:?}", &want[from..]))
            }
        }
        Some(_) if earlier_empty && fits(got, want) => Ok(()),
        Some(_) => Err(format!(
            "got {got:?} without a read of the copy (earlier events: {}), want {want:?}",
            !earlier_empty
        )),
    }
}

/// The topic check itself: the shapes it lets through, and that it lets
/// nothing else through. One key; `Create 1`, `Update 2` were committed
/// before the first snapshot chunk was in Kafka (`at_start`), `Update 3`,
/// `Update 4` after it.
#[test]
fn the_topic_check_lets_through_exactly_the_documented_shapes() {
    use Op::{Create, Read, Update};
    let key = ("accounts".to_string(), 1);
    let model = Model {
        changes: HashMap::from([(key.clone(), vec![(Create, 1), (Update, 2), (Update, 3), (Update, 4)])]),
        at_start: HashMap::from([(key.clone(), 2)]),
        ..Model::default()
    };
    let check =
        |got: &[(Op, i64)], resumed| check_topics(&model, &HashMap::from([(key.clone(), vec![got.to_vec()])]), resumed);
    // A read at the first point, then the changes after it: always right.
    for r in [false, true] {
        assert_eq!(check(&[(Read, 2), (Update, 3), (Update, 4)], r), Ok(()));
    }
    // Caught up to the second point, then read there: after a restart
    // during the snapshot only.
    let caught_up = [(Update, 3), (Read, 3), (Update, 4)];
    assert_eq!(check(&caught_up, true), Ok(()));
    assert!(check(&caught_up, false).is_err());
    // Lost, repeated, reordered, a replay with or without a gap (the MySQL
    // source's shape before issue #23 case 7: read at the second point,
    // then the stream from the first), a second read, a version never
    // committed: never.
    for got in [
        &[(Read, 2), (Update, 4)][..],
        &[(Read, 2), (Update, 3), (Update, 3), (Update, 4)],
        &[(Read, 2), (Update, 4), (Update, 3)],
        &[(Read, 3), (Update, 3), (Update, 4)],
        &[(Read, 3), (Update, 3), (Update, 3), (Update, 4)],
        &[(Read, 4), (Update, 4)],
        &[(Read, 2), (Read, 3), (Update, 4)],
        &[(Read, 5)],
        &[(Read, 2), (Update, 3)],
    ] {
        for r in [false, true] {
            assert!(check(got, r).is_err(), "{got:?} under resumed = {r}");
        }
    }
}

/// After a reset (offsets-topic-loss) the events before it may stop
/// anywhere; after it comes a copy of its own, strictly. One key: `Create
/// 1` ... `Update 4`, then deleted at 4; a second key made after the copy.
#[test]
fn the_topic_check_after_a_reset_wants_a_whole_copy() {
    use Op::{Create, Delete, Read, Update};
    let (key, later) = (("accounts".to_string(), 1), ("accounts".to_string(), 2));
    let mut model = Model {
        changes: HashMap::from([
            (key.clone(), vec![(Create, 1), (Update, 2), (Update, 3), (Update, 4)]),
            (later.clone(), vec![(Create, 1), (Update, 2)]),
        ]),
        resets: 1,
        ..Model::default()
    };
    let check = |model: &Model, first: &[(Op, i64)], copy: &[(Op, i64)]| {
        let later = vec![vec![], vec![(Create, 1), (Update, 2)]];
        let seen = HashMap::from([
            (key.clone(), vec![first.to_vec(), copy.to_vec()]),
            (("accounts".to_string(), 2), later),
        ]);
        check_topics(model, &seen, false)
    };
    // Before the reset a beginning (the checkpoint was lost there), after
    // it the copy's read and what follows.
    assert_eq!(check(&model, &[(Create, 1)], &[(Read, 3), (Update, 4)]), Ok(()));
    assert_eq!(check(&model, &[(Create, 1), (Update, 2), (Update, 3)], &[(Read, 4)]), Ok(()));
    for (first, copy) in [
        // No copy, a copy without the change after it, a gap before the
        // reset, a change older than the copy after it, a second read.
        (&[(Create, 1)][..], &[][..]),
        (&[(Create, 1)], &[(Read, 3)]),
        (&[(Update, 2)], &[(Read, 3), (Update, 4)]),
        (&[(Create, 1)], &[(Read, 3), (Update, 3), (Update, 4)]),
        (&[(Create, 1)], &[(Read, 3), (Read, 4)]),
        // Changes without the copy's read, for a row that existed before.
        (&[(Create, 1)], &[(Update, 4)]),
    ] {
        assert!(check(&model, first, copy).is_err(), "{first:?} then {copy:?}");
    }
    // Deleted before the copy: nothing after the reset.
    model.changes.get_mut(&key).unwrap().push((Delete, 4));
    assert_eq!(check(&model, &[(Create, 1), (Update, 2)], &[]), Ok(()));
}

/// A key's events merge across partitions by version (a partition increase
/// moved it, or the update that changed it to this key is on another
/// partition); on one partition they stay in the order read, so a
/// reordering there still shows.
#[test]
fn events_merge_across_partitions_and_split_at_resets() {
    use Op::{Create, Delete, Read, Update};
    let ev = |op, version, partition, generation| Ev { op, version, partition, generation };
    let events = [
        ev(Read, 1, 0, 0),
        ev(Update, 3, 1, 0),
        ev(Update, 2, 0, 0),
        ev(Delete, 3, 1, 0),
        ev(Read, 3, 0, 1),
    ];
    assert_eq!(ordered(&events, 1), vec![vec![(Read, 1), (Update, 2), (Update, 3), (Delete, 3)], vec![(Read, 3)]]);
    // Out of order on one partition: kept so.
    let events = [ev(Create, 1, 0, 0), ev(Update, 3, 0, 0), ev(Update, 2, 0, 0)];
    assert_eq!(ordered(&events, 0), vec![vec![(Create, 1), (Update, 3), (Update, 2)]]);
    // A change before the read of the same version, a delete after both.
    let events = [ev(Read, 2, 0, 0), ev(Update, 2, 1, 0), ev(Delete, 2, 2, 0)];
    assert_eq!(ordered(&events, 0), vec![vec![(Update, 2), (Read, 2), (Delete, 2)]]);
}

#[test]
fn decimals_compare_to_two_places_and_nothing_else_is_changed() {
    assert_eq!(two_places("1.5"), "1.50");
    assert_eq!(two_places("1.50"), "1.50");
    assert_eq!(two_places("7"), "7.00");
    assert_eq!(two_places("0.500"), "0.50");
    assert_eq!(two_places("1.505"), "1.505");
}
