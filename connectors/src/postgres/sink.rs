//! The PostgreSQL sink: keeps a copy of each source table in a PostgreSQL
//! database, with exactly-once effect.
//!
//! # How a batch is applied
//!
//! One database transaction per [`SinkBatch`]:
//!
//! 1. The destination table is created or evolved for every schema version in
//!    the batch (`ADD COLUMN`, widening `ALTER COLUMN ... TYPE`), under an
//!    advisory lock so that two sink runners never race on DDL.
//! 2. A truncate removes the rows older than itself.
//! 3. The batch is reduced to the last event per key (a delete then an insert
//!    of the same key is the insert).
//! 4. The survivors are streamed with `COPY ... FROM STDIN` (binary when every
//!    column's destination type and value has a binary writer here, else
//!    text, the format `pg_dump` uses; rendered one 256 KiB chunk at a time
//!    while PostgreSQL parses the chunk before) into a session-local staging table, then merged
//!    with one `INSERT ... SELECT ... ON CONFLICT DO UPDATE` and one
//!    `DELETE ... USING`, both guarded by the row's stored [`Position`]: an
//!    event older than what a row already holds never moves it backwards.
//! 5. The batch's Kafka offsets are written to `tributary.offsets`.
//! 6. `COMMIT`.
//!
//! A batch of reads and inserts only (a snapshot) first tries `COPY`
//! straight into the table under a savepoint, and falls back to the staging
//! path when a key exists already: the upsert's speculative insertion is
//! most of the cost of a snapshot.
//!
//! The same path serves snapshot-sized and single-row batches: the staging
//! table is created once per session and schema version (`ON COMMIT DELETE
//! ROWS`), so a small batch costs a handful of round trips and no catalog
//! churn.
//!
//! # Errors
//!
//! [`classify`] maps every SQLSTATE to an [`ErrorKind`]; nothing else in this
//! file decides. When a batch fails with a permanent error, the sink finds the
//! offending record by bisecting the batch with savepoints inside one
//! transaction that is rolled back, and names it in [`ApplyError::record`].
//!
//! Row values are never logged nor put into error messages: PostgreSQL's own
//! messages for data errors quote the value, so they are redacted.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::SinkExt;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Statement};
use tracing::{debug, info, info_span, warn, Instrument};
use tributary_operations::config::{resolve_secret, ConfigError, Validate};
use tributary_schemas::hashing::FxHashMap;
use tributary_schemas::{ChangeEvent, Column, DataType, Op, Position, TableId, TableSchema, Value};

use super::config::{validate_tls, TlsMode};
use super::types::{BinaryType, BINARY_COPY_SIGNATURE, PG_EPOCH_DAYS, PG_EPOCH_MICROS};
use crate::error::{Error, ErrorKind, Result};
use crate::sink::{
    check_table_template, expand_table_template, group_by_destination, locate_failed_record, segments, ApplyError,
    KafkaPosition, PrefixProbe, Segment, Sink, SinkBatch, SinkRecord,
};

/// Default destination table name: the source table's own name, so that a
/// migration from one PostgreSQL to another keeps every name.
pub const DEFAULT_TABLE_TEMPLATE: &str = "{table}";
/// Connect timeout. Long enough for a TLS handshake across regions, short
/// enough that a down server is reported (as retryable) within seconds.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How long a statement waits for a lock before failing (retryably). Without
/// it a long `ALTER TABLE` or an operator's open transaction would hang the
/// sink silently; with it the wait shows up as `paused` in the status.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 60_000;
/// Schema of the sink's own bookkeeping tables.
pub const BOOKKEEPING_SCHEMA: &str = "tributary";
/// The offsets table (see `docs/CONTRACTS.md`).
pub const OFFSETS_TABLE: &str = "offsets";
/// Column holding `Position::commit` of the event that last wrote a row.
pub const COMMIT_COLUMN: &str = "__tributary_commit";
/// Column holding `Position::index` of the event that last wrote a row.
pub const INDEX_COLUMN: &str = "__tributary_index";
/// Staging column telling a delete (`t`) from an upsert (`f`).
const DELETE_COLUMN: &str = "__tributary_delete";
/// Bytes per `COPY` data message: rows are rendered one chunk ahead of
/// PostgreSQL parsing them, so smaller chunks overlap the two better; 256
/// KiB still amortises the per-message cost.
const COPY_CHUNK_BYTES: usize = 256 * 1024;
/// Batches of a table that skip the direct-`COPY` fast path after it met an
/// existing key: a re-snapshot or a replay of many batches would otherwise
/// pay a failed `COPY` each time.
const FAST_PATH_BACKOFF_BATCHES: u32 = 64;
/// Prepared `COPY` statements kept per session (one per table, schema
/// version and target: the table itself or its staging table).
const MAX_COPY_STATEMENTS: usize = 1024;
/// Opens each batch's transaction; deferred to go with its first statement.
const BEGIN: &str = "BEGIN";
/// `application_name` of the sink's sessions, so a DBA sees who holds a lock.
const APPLICATION_NAME: &str = "tributary-sink";

/// Configuration of the PostgreSQL sink (`[postgres]` in a sink runner's
/// config file).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// Connection URL, e.g. `postgres://user@host:5432/db`: inline,
    /// `env:NAME` or `file:/path`. It holds the password, so it is never
    /// logged.
    pub url: String,
    /// Destination schema of every table. Default: the source table's schema
    /// (MySQL: its database name).
    #[serde(default)]
    pub schema: Option<String>,
    /// Destination table name; `{schema}` and `{table}` stand for the source
    /// table's schema and name. Must contain `{table}`.
    #[serde(default = "default_table_template")]
    pub table: String,
    /// Whether a table dropped in the source is dropped in the destination.
    /// Off by default: dropping data is not something to do by surprise.
    #[serde(default)]
    pub drop_tables: bool,
    /// The key of this copy's rows in `tributary.offsets`. Filled from the
    /// sink runner's `consumer_group`; set it here only to the same value.
    #[serde(default)]
    pub consumer_group: Option<String>,
    /// Connect timeout in milliseconds.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Lock wait limit per statement in milliseconds (0: wait forever).
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: u64,
    /// `disable`, `require`, `verify-ca` or `verify-full`, as for the source.
    #[serde(default)]
    pub tls: TlsMode,
    /// CA bundle (PEM) for `verify-ca` / `verify-full`.
    #[serde(default)]
    pub tls_ca_file: Option<String>,
}

fn default_table_template() -> String {
    DEFAULT_TABLE_TEMPLATE.to_string()
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_lock_timeout_ms() -> u64 {
    DEFAULT_LOCK_TIMEOUT_MS
}

impl fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: never print it.
        f.debug_struct("PostgresSinkConfig")
            .field("url", &"<redacted>")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("drop_tables", &self.drop_tables)
            .field("consumer_group", &self.consumer_group)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("lock_timeout_ms", &self.lock_timeout_ms)
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

impl PostgresSinkConfig {
    /// A config with defaults for everything but the URL and consumer group.
    pub fn new(url: impl Into<String>, consumer_group: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            table: default_table_template(),
            drop_tables: false,
            consumer_group: Some(consumer_group.into()),
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            lock_timeout_ms: DEFAULT_LOCK_TIMEOUT_MS,
            tls: TlsMode::default(),
            tls_ca_file: None,
        }
    }

    /// Checks every rule; errors name the field under `prefix` (`postgres`
    /// in a sink runner's file).
    pub fn validate_at(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid(format!("{prefix}.url"), "must not be empty"));
        }
        if !self.url.starts_with("env:") && !self.url.starts_with("file:") {
            // Parsing errors of tokio-postgres do not echo the URL.
            tokio_postgres::Config::from_str(&self.url).map_err(|e| {
                ConfigError::invalid(
                    format!("{prefix}.url"),
                    format!("is not a PostgreSQL URL or key=value string ({e})"),
                )
            })?;
        }
        if let Some(schema) = &self.schema {
            if schema.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{prefix}.schema"),
                    "must not be empty when set (leave it out to keep the source schema)",
                ));
            }
        }
        check_table_template(&self.table).map_err(|rule| ConfigError::invalid(format!("{prefix}.table"), rule))?;
        if let Some(group) = &self.consumer_group {
            if group.trim().is_empty() {
                return Err(ConfigError::invalid(format!("{prefix}.consumer_group"), "must not be empty"));
            }
        }
        if self.connect_timeout_ms == 0 {
            return Err(ConfigError::invalid(format!("{prefix}.connect_timeout_ms"), "must be greater than 0"));
        }
        validate_tls(self.tls, self.tls_ca_file.as_deref(), |name| format!("{prefix}.{name}"))
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        let schema = self.schema.clone().unwrap_or_else(|| source.schema.clone());
        let table = expand_table_template(&self.table, source);
        DestinationTable { schema, table }
    }
}

impl Validate for PostgresSinkConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_at("postgres")
    }
}

/// A table in the destination database.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationTable {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
}

impl DestinationTable {
    /// The quoted, schema-qualified name for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl fmt::Display for DestinationTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

pub use crate::sink::CheckProblem;

/// What the sink knows about one destination table (from the catalog).
#[derive(Debug, Clone, Default)]
struct TableState {
    exists: bool,
    columns: Vec<DestColumn>,
    primary_key: Vec<String>,
    /// Hashes of the source schemas already reconciled with this table.
    reconciled: HashSet<u64>,
}

impl TableState {
    fn column(&self, name: &str) -> Option<&DestColumn> {
        self.columns.iter().find(|c| c.name == name)
    }
}

#[derive(Debug, Clone)]
struct DestColumn {
    name: String,
    /// `format_type` spelling, used verbatim for staging columns.
    raw_type: String,
    not_null: bool,
}

/// The PostgreSQL [`Sink`].
pub struct PostgresSink {
    config: PostgresSinkConfig,
    consumer_group: String,
    pg: tokio_postgres::Config,
    client: Option<Client>,
    tables: HashMap<DestinationTable, TableState>,
    /// Staging tables known to exist in the current session.
    staging: HashSet<String>,
    /// Staging tables created or filled in the current transaction.
    staging_in_txn: HashSet<String>,
    staging_filled: HashSet<String>,
    /// Per table, batches left before the fast path is tried again.
    fast_skip: HashMap<DestinationTable, u32>,
    /// Statements that need no answer of their own (`BEGIN`, `RELEASE
    /// SAVEPOINT`), sent in one message with the next statement. Each round
    /// trip left the destination idle until the sink's tasks were woken and
    /// scheduled on the shared cores: 3-10 ms, several times per batch.
    deferred: Mutex<String>,
    /// `COPY` statements prepared in this session, by text: `copy_in` with
    /// a text prepares it first, a round trip of its own before each `COPY`.
    copy_statements: Mutex<HashMap<String, Statement>>,
}

impl fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSink")
            .field("config", &self.config)
            .field("connected", &self.client.is_some())
            .finish()
    }
}

impl PostgresSink {
    /// A sink for `config`; it connects on first use, so that a destination
    /// that is down pauses the runner instead of failing its start.
    pub fn new(config: PostgresSinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("postgres.consumer_group", "is required"))?;
        let secret: SecretString = resolve_secret("postgres.url", &config.url)?;
        let mut pg = tokio_postgres::Config::from_str(secret.expose_secret())
            .map_err(|e| ConfigError::invalid("postgres.url", format!("is not a PostgreSQL URL ({e})")))?;
        pg.connect_timeout(Duration::from_millis(config.connect_timeout_ms));
        pg.application_name(APPLICATION_NAME);
        Ok(Self {
            config,
            consumer_group,
            pg,
            client: None,
            tables: HashMap::new(),
            staging: HashSet::new(),
            staging_in_txn: HashSet::new(),
            staging_filled: HashSet::new(),
            fast_skip: HashMap::new(),
            deferred: Mutex::new(String::new()),
            copy_statements: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresSinkConfig {
        &self.config
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    fn user(&self) -> String {
        self.pg.get_user().unwrap_or("<sink user>").to_string()
    }

    fn database(&self) -> String {
        self.pg.get_dbname().map(str::to_string).unwrap_or_else(|| self.user())
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            user: self.user(),
            database: self.database(),
            table: None,
        }
    }

    /// Opens a session with the configured TLS mode; its connection task
    /// runs in the background and only records why it ended.
    async fn open(&self) -> Result<Client> {
        fn spawn<S, T>(connection: tokio_postgres::Connection<S, T>)
        where
            S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
            T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        {
            tokio::spawn(
                async move {
                    if let Err(e) = connection.await {
                        // A broken connection is reported by the next
                        // statement; this only records why, without any
                        // statement text.
                        warn!(error = %redacted(&e), "destination connection closed");
                    }
                }
                .instrument(info_span!("postgres_connection")),
            );
        }
        let ctx = self.ctx();
        let connected = if self.config.tls == TlsMode::Disable {
            self.pg.connect(NoTls).await.map(|(client, connection)| {
                spawn(connection);
                client
            })
        } else {
            let mut pg = self.pg.clone();
            pg.ssl_mode(tokio_postgres::config::SslMode::Require);
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(super::tls::client_config(
                self.config.tls,
                self.config.tls_ca_file.as_deref(),
            )?);
            pg.connect(tls).await.map(|(client, connection)| {
                spawn(connection);
                client
            })
        };
        connected.map_err(|e| classify(&e, &ctx))
    }

    /// Connects (if not connected) and makes sure the bookkeeping tables exist.
    pub async fn connect(&mut self) -> Result<()> {
        if let Some(c) = &self.client {
            if !c.is_closed() {
                return Ok(());
            }
        }
        self.reset();
        let ctx = self.ctx();
        let client = self.open().await.map_err(|e| e.with_hint_if_none(connect_hint()))?;
        let lock_timeout = format!("{}ms", self.config.lock_timeout_ms);
        let setup = format!(
            "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; \
             SET standard_conforming_strings = on; SET extra_float_digits = 3; \
             SET lock_timeout = {}",
            quote_literal(&lock_timeout)
        );
        client.batch_execute(&setup).await.map_err(|e| classify(&e, &ctx))?;
        self.client = Some(client);
        if let Err(e) = self.ensure_bookkeeping().await {
            self.reset();
            return Err(e);
        }
        info!(database = %self.database(), user = %self.user(), "connected to the destination");
        Ok(())
    }

    /// Forgets the connection and everything cached about the session.
    fn reset(&mut self) {
        self.client = None;
        self.take_deferred();
        lock(&self.copy_statements).clear();
        self.tables.clear();
        self.staging.clear();
        self.staging_in_txn.clear();
        self.staging_filled.clear();
    }

    /// Removes this copy from the destination: its stored offsets and, when
    /// `drop` lists them, the destination tables of those source tables.
    /// Returns what it removed, for the operator.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let ctx = self.ctx();
        let group = self.consumer_group.clone();
        let client = self.client().await?;
        let offsets = format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(OFFSETS_TABLE));
        let n = client
            .execute(&format!("DELETE FROM {offsets} WHERE consumer_group = $1"), &[&group])
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let mut done = vec![format!("{n} stored offset(s) of consumer group {group}")];
        for source in drop {
            let dest = self.config.destination(source);
            client
                .batch_execute(&format!("DROP TABLE IF EXISTS {}", dest.quoted()))
                .await
                .map_err(|e| classify(&e, &ctx))?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    fn connected(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::retryable("not connected to the destination"))
    }

    /// The session, once what was deferred has been sent: every statement
    /// goes through here or [`PostgresSink::execute`], so none can run ahead
    /// of a deferred `BEGIN`.
    async fn client(&self) -> Result<&Client> {
        let client = self.connected()?;
        let deferred = self.take_deferred();
        if !deferred.is_empty() {
            client.batch_execute(&deferred).await.map_err(|e| classify(&e, &self.ctx()))?;
        }
        Ok(client)
    }

    /// Runs `sql` (simple protocol) with what was deferred ahead of it, in
    /// one round trip. A deferred statement that fails reports through this
    /// one: they are `BEGIN` and `RELEASE SAVEPOINT`, which fail only with
    /// the session.
    async fn execute(&self, sql: &str, ctx: &Ctx) -> Result<()> {
        let client = self.connected()?;
        let mut text = self.take_deferred();
        text.push_str(sql);
        client.batch_execute(&text).await.map_err(|e| classify(&e, ctx))
    }

    /// Sends `sql` with the next statement; see [`PostgresSink::execute`].
    fn defer(&self, sql: &str) {
        let mut deferred = lock(&self.deferred);
        deferred.push_str(sql);
        deferred.push_str("; ");
    }

    fn take_deferred(&self) -> String {
        std::mem::take(&mut *lock(&self.deferred))
    }

    /// The session and the `COPY ... FROM STDIN` statement `sql`, prepared
    /// on first use in this session (a utility statement is analysed again
    /// at each execution, so a table changed since is no problem).
    async fn copy_statement(&self, sql: &str) -> std::result::Result<(&Client, Statement), CopyFailure> {
        let client = self.client().await.map_err(CopyFailure::Session)?;
        if let Some(statement) = lock(&self.copy_statements).get(sql) {
            return Ok((client, statement.clone()));
        }
        let statement = client.prepare(sql).await.map_err(CopyFailure::Db)?;
        let mut cache = lock(&self.copy_statements);
        if cache.len() >= MAX_COPY_STATEMENTS {
            // Tables come and go over a long run: start over rather than
            // grow without end.
            cache.clear();
        }
        cache.insert(sql.to_string(), statement.clone());
        Ok((client, statement))
    }

    async fn ensure_bookkeeping(&mut self) -> Result<()> {
        let ctx = self.ctx();
        let client = self.client().await?;
        let offsets = format!("{}.{}", quote_ident(BOOKKEEPING_SCHEMA), quote_ident(OFFSETS_TABLE));
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $2)",
                &[&offsets, &BOOKKEEPING_SCHEMA],
            )
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let (has_table, has_schema): (bool, bool) = (row.get(0), row.get(1));
        if has_table {
            return Ok(());
        }
        let mut sql = String::from("BEGIN; ");
        let _ = write!(sql, "SELECT pg_advisory_xact_lock(hashtext({})); ", quote_literal("tributary bookkeeping"));
        if !has_schema {
            let _ = write!(sql, "CREATE SCHEMA IF NOT EXISTS {}; ", quote_ident(BOOKKEEPING_SCHEMA));
        }
        let _ = write!(
            sql,
            "CREATE TABLE IF NOT EXISTS {offsets} (consumer_group text NOT NULL, topic text NOT NULL, \
             partition integer NOT NULL, next_offset bigint NOT NULL, \
             PRIMARY KEY (consumer_group, topic, partition)); COMMIT"
        );
        if let Err(e) = client.batch_execute(&sql).await {
            let _ = client.batch_execute("ROLLBACK").await;
            let err = classify(&e, &ctx);
            return Err(if err.kind() == ErrorKind::NeedsOperator {
                err.with_hint_if_none(format!(
                    "GRANT CREATE ON DATABASE {} TO {}; or create the bookkeeping table yourself: \
                     CREATE SCHEMA {BOOKKEEPING_SCHEMA}; CREATE TABLE {BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE} \
                     (consumer_group text, topic text, partition int, next_offset bigint, \
                     PRIMARY KEY (consumer_group, topic, partition)); GRANT USAGE ON SCHEMA {BOOKKEEPING_SCHEMA} TO {}; \
                     GRANT SELECT, INSERT, UPDATE ON {BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE} TO {}",
                    quote_ident(&ctx.database),
                    quote_ident(&ctx.user),
                    quote_ident(&ctx.user),
                    quote_ident(&ctx.user)
                ))
            } else {
                err
            });
        }
        Ok(())
    }

    /// Checks that the destination is reachable and usable, without changing
    /// it. Returns the problems found, each with a fix; empty means ready.
    pub async fn check(&mut self) -> Vec<CheckProblem> {
        let mut problems = Vec::new();
        let ctx = self.ctx();
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.reset();
            match self.open().await {
                Ok(client) => self.client = Some(client),
                Err(err) => {
                    problems.push(CheckProblem {
                        problem: format!("cannot connect to the destination: {}", err.message()),
                        fix: err.hint().map(str::to_string).unwrap_or_else(connect_hint),
                    });
                    return problems;
                }
            }
        }
        let Ok(client) = self.client().await else {
            return problems;
        };
        let user = quote_ident(&ctx.user);
        let db = quote_ident(&ctx.database);
        let q = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, \
                 has_database_privilege(current_database(), 'CREATE'), \
                 to_regclass('tributary.offsets') IS NOT NULL, \
                 pg_is_in_recovery()",
                &[],
            )
            .await;
        let row = match q {
            Ok(row) => row,
            Err(e) => {
                let err = classify(&e, &ctx);
                problems.push(CheckProblem {
                    problem: format!("cannot query the destination: {}", err.message()),
                    fix: err.hint().unwrap_or("check the server log").to_string(),
                });
                return problems;
            }
        };
        let version: i32 = row.get(0);
        let can_create: bool = row.get(1);
        let has_offsets: bool = row.get(2);
        let in_recovery: bool = row.get(3);
        if version < 110_000 {
            problems.push(CheckProblem {
                problem: format!("PostgreSQL {} is too old", version / 10_000),
                fix: "use PostgreSQL 11 or newer".into(),
            });
        }
        if in_recovery {
            problems.push(CheckProblem {
                problem: "the destination is a read-only standby".into(),
                fix: "point postgres.url at the primary".into(),
            });
        }
        if has_offsets {
            let ok = client
                .query_one("SELECT has_table_privilege('tributary.offsets', 'SELECT, INSERT, UPDATE')", &[])
                .await
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(false);
            if !ok {
                problems.push(CheckProblem {
                    problem: "the sink user cannot write tributary.offsets".into(),
                    fix: format!(
                        "GRANT USAGE ON SCHEMA tributary TO {user}; GRANT SELECT, INSERT, UPDATE ON tributary.offsets TO {user}"
                    ),
                });
            }
        } else if !can_create {
            problems.push(CheckProblem {
                problem: "the bookkeeping table tributary.offsets does not exist and the sink user cannot create it"
                    .into(),
                fix: format!("GRANT CREATE ON DATABASE {db} TO {user}"),
            });
        }
        if let Some(schema) = &self.config.schema {
            let r = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1), \
                     CASE WHEN EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) \
                     THEN has_schema_privilege($1, 'USAGE, CREATE') ELSE false END",
                    &[schema],
                )
                .await;
            if let Ok(r) = r {
                let (exists, usable): (bool, bool) = (r.get(0), r.get(1));
                if exists && !usable {
                    problems.push(CheckProblem {
                        problem: format!("the sink user cannot create tables in schema {schema}"),
                        fix: format!("GRANT USAGE, CREATE ON SCHEMA {} TO {user}", quote_ident(schema)),
                    });
                } else if !exists && !can_create {
                    problems.push(CheckProblem {
                        problem: format!("schema {schema} does not exist and the sink user cannot create it"),
                        fix: format!("CREATE SCHEMA {} AUTHORIZATION {user}", quote_ident(schema)),
                    });
                }
            }
        }
        problems
    }

    /// Applies `batch` inside a transaction and rolls it back: tells whether
    /// (and at which record) it would fail, changing nothing. Used by
    /// `sink-runner replay --dry-run`.
    pub async fn trial_apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        self.apply_inner(batch, false).await
    }

    async fn apply_inner(&mut self, batch: &SinkBatch, commit: bool) -> Result<(), ApplyError> {
        self.connect().await?;
        let outcome = self.transaction(&batch.records, &batch.next_offsets, commit).await;
        match outcome {
            Ok(()) => Ok(()),
            Err(failure) => {
                if failure.error.kind() == ErrorKind::Permanent && failure.record.is_none() && !batch.records.is_empty()
                {
                    self.locate(&batch.records, failure.error).await
                } else {
                    Err(failure)
                }
            }
        }
    }

    /// One transaction over `records` and `offsets`; rolled back on error or
    /// when `commit` is false.
    async fn transaction(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        offsets: &[(String, i32, i64)],
        commit: bool,
    ) -> Result<(), ApplyError> {
        let ctx = self.ctx();
        self.connected()?;
        self.take_deferred();
        self.defer(BEGIN);
        self.staging_in_txn.clear();
        self.staging_filled.clear();
        let result = async {
            self.apply_records(records, 0, false).await?;
            if !offsets.is_empty() {
                let sql = offsets_sql(&self.consumer_group, offsets);
                if commit {
                    // Sent with the COMMIT, in one round trip.
                    self.defer(&sql);
                } else {
                    self.execute(&sql, &ctx.clone().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}")))
                        .await?;
                }
            }
            Ok::<(), ApplyError>(())
        }
        .await;
        match result {
            Ok(()) if commit => {
                match self.execute("COMMIT", &ctx).await {
                    Ok(()) => {
                        self.staging.extend(self.staging_in_txn.drain());
                        Ok(())
                    }
                    Err(err) => {
                        // The offsets or the COMMIT failed. A failed statement
                        // before the COMMIT leaves the transaction aborted,
                        // which the ROLLBACK ends (after a failed COMMIT it
                        // only warns). A COMMIT whose answer was lost may or
                        // may not have happened; the stored offsets tell the
                        // runner which.
                        self.rollback().await;
                        Err(self.failed(err).into())
                    }
                }
            }
            Ok(()) => {
                self.rollback().await;
                Ok(())
            }
            Err(mut failure) => {
                self.rollback().await;
                if failure.error.kind() != ErrorKind::Permanent {
                    failure.error = self.failed(failure.error);
                }
                Err(failure)
            }
        }
    }

    async fn rollback(&mut self) {
        // A transaction whose `BEGIN` is still deferred was never opened.
        let opened = !self.take_deferred().starts_with(BEGIN);
        let ok = match &self.client {
            Some(c) if opened => c.batch_execute("ROLLBACK").await.is_ok(),
            _ => true,
        };
        self.rolled_back();
        if !ok {
            // The session is unusable; the next apply reconnects.
            self.reset();
        }
    }

    /// Forgets what a rolled-back transaction may have created or changed.
    fn rolled_back(&mut self) {
        self.tables.clear();
        for name in self.staging_in_txn.drain() {
            self.staging.remove(&name);
        }
        self.staging_filled.clear();
    }

    /// Drops the session after an error that is not about the data: the
    /// retry starts on a fresh connection (cheap next to the backoff) and
    /// never on one that a failover or a restart left half-broken.
    fn failed(&mut self, err: Error) -> Error {
        if err.kind() != ErrorKind::Permanent {
            self.reset();
        }
        err
    }

    /// Finds the first record of `records` that fails with a permanent
    /// error: bisects on prefixes, each applied under a savepoint, all in
    /// one transaction that is rolled back.
    async fn locate(&mut self, records: &[(KafkaPosition, SinkRecord)], original: Error) -> Result<(), ApplyError> {
        let span = info_span!("locate_failed_record", records = records.len());
        async {
            let ctx = self.ctx();
            self.connect().await?;
            self.execute(BEGIN, &ctx).await?;
            self.staging_in_txn.clear();
            self.staging_filled.clear();
            let result = self.bisect(records, original).await;
            self.rollback().await;
            result
        }
        .instrument(span)
        .await
    }

    async fn bisect(&mut self, records: &[(KafkaPosition, SinkRecord)], original: Error) -> Result<(), ApplyError> {
        let ctx = self.ctx();
        // Schema changes first: their failure names the record directly, and
        // the probes below then only differ in data.
        self.execute("SAVEPOINT tributary_probe", &ctx).await?;
        self.reconcile_all(records).await?;
        self.execute("RELEASE SAVEPOINT tributary_probe", &ctx).await?;
        locate_failed_record(&mut Prefixes { sink: self, records }, records.len(), original).await
    }

    async fn probe(&mut self, records: &[(KafkaPosition, SinkRecord)]) -> Result<(), ApplyError> {
        let ctx = self.ctx();
        self.execute("SAVEPOINT tributary_probe", &ctx).await?;
        let result = self.apply_records(records, 0, true).await;
        self.execute("ROLLBACK TO SAVEPOINT tributary_probe; RELEASE SAVEPOINT tributary_probe", &ctx)
            .await?;
        // Whatever the probe created or changed inside the savepoint is
        // gone again: forget it.
        for name in self.staging_in_txn.drain() {
            self.staging.remove(&name);
        }
        self.staging_filled.clear();
        self.tables.clear();
        result
    }

    async fn reconcile_all(&mut self, records: &[(KafkaPosition, SinkRecord)]) -> Result<(), ApplyError> {
        for (i, (_, record)) in records.iter().enumerate() {
            match record {
                SinkRecord::Change(ev) => {
                    let dest = self.destination(&ev.schema.id);
                    self.reconcile(&dest, &ev.schema, from_postgres(ev))
                        .await
                        .map_err(|error| ApplyError { error, record: Some(i) })?;
                }
                SinkRecord::TableDropped(id) => {
                    if self.config.drop_tables {
                        let dest = self.destination(id);
                        self.drop_table(&dest).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies `records` inside the open transaction. `base` is the index of
    /// `records[0]` in the batch; `probe` re-creates staging tables even when
    /// cached (a savepoint rollback may have removed them).
    async fn apply_records(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        base: usize,
        probe: bool,
    ) -> Result<(), ApplyError> {
        for segment in segments(records) {
            match segment {
                Segment::Dropped(id) => {
                    let dest = self.destination(id);
                    if self.config.drop_tables {
                        self.drop_table(&dest).await?;
                    } else {
                        debug!(table = %dest, "source table dropped; kept (drop_tables = false)");
                    }
                }
                Segment::Changes { start, records: run } => self.apply_segment(run, base + start, probe).await?,
            }
        }
        Ok(())
    }

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext({})); DROP TABLE IF EXISTS {}",
            quote_literal(&format!("tributary table {dest}")),
            dest.quoted()
        );
        self.execute(&sql, &ctx).await?;
        self.tables.remove(dest);
        info!(table = %dest, "dropped destination table (the source table was dropped)");
        Ok(())
    }

    /// A run of change records with no table drop in between.
    async fn apply_segment(
        &mut self,
        records: &[(KafkaPosition, SinkRecord)],
        base: usize,
        probe: bool,
    ) -> Result<(), ApplyError> {
        let groups = group_by_destination(records, base, |t| self.config.destination(t));
        for (dest, events) in groups {
            self.apply_table(&dest, &events, probe).await?;
        }
        Ok(())
    }

    /// Applies the change events of one destination table; `events` carry
    /// their index in the batch.
    async fn apply_table(
        &mut self,
        dest: &DestinationTable,
        events: &[(usize, &ChangeEvent)],
        probe: bool,
    ) -> Result<(), ApplyError> {
        // 1. Create or evolve the table for every schema version.
        // Addresses of the schemas seen (the decoder shares one Arc per version).
        let mut seen: Vec<usize> = Vec::new();
        for &(i, ev) in events {
            let ptr = Arc::as_ptr(&ev.schema) as usize;
            if seen.contains(&ptr) {
                continue;
            }
            seen.push(ptr);
            self.reconcile(dest, &ev.schema, from_postgres(ev))
                .await
                .map_err(|error| ApplyError { error, record: Some(i) })?;
        }
        // 2. The newest truncate removes every older row.
        let truncate = events
            .iter()
            .map(|(_, ev)| ev)
            .filter(|ev| ev.op == Op::Truncate)
            .map(|ev| ev.source.position)
            .max();
        if let Some(at) = truncate {
            self.truncate(dest, at)
                .await
                .map_err(|error| ApplyError { error, record: None })?;
        }
        // 3. A run of reads and inserts of one schema version (a snapshot
        // chunk) is first copied as it is: `COPY` straight into the table
        // refuses a key that is there already or twice in the run, and then
        // the reduction below runs as for any batch. Hashing every key
        // first took an eighth of a snapshot batch's time, with the
        // destination idle in its transaction meanwhile.
        let mut direct_tried = false;
        if truncate.is_none() && !probe {
            if let Some(group) = Group::inserts_only(events) {
                // Refused, or skipped after an earlier refusal: either way
                // the reduced rows go to staging (and the skip is counted
                // once per batch).
                match self.copy_fast(dest, &group).await? {
                    Some(true) => return Ok(()),
                    Some(false) | None => direct_tried = true,
                }
            }
        }
        // 4. Last event per key.
        let mut reduced = Reduced::with_capacity(events.len());
        for &(i, ev) in events {
            if ev.op == Op::Truncate || truncate.is_some_and(|t| ev.source.position <= t) {
                continue;
            }
            reduced.add(i, ev).map_err(|error| ApplyError {
                error: error.with_table(ev.schema.id.clone()),
                record: Some(i),
            })?;
        }
        // 5. Stage and merge, per schema version.
        for group in &reduced.groups {
            if group.upserts == 0 && group.deletes == 0 {
                continue;
            }
            self.merge(dest, group, probe || direct_tried).await?;
        }
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let (commit, index) = position_sql(at)?;
        let q = format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE ({c}, {i}) >= ({commit}, {index}))",
            t = dest.quoted(),
            c = quote_ident(COMMIT_COLUMN),
            i = quote_ident(INDEX_COLUMN),
        );
        let newer: bool = self
            .client()
            .await?
            .query_one(q.as_str(), &[])
            .await
            .map_err(|e| classify(&e, &ctx))?
            .get(0);
        let sql = if newer {
            // Rows written after the truncate (a replay): keep them.
            format!(
                "DELETE FROM {t} WHERE ({c}, {i}) < ({commit}, {index})",
                t = dest.quoted(),
                c = quote_ident(COMMIT_COLUMN),
                i = quote_ident(INDEX_COLUMN),
            )
        } else {
            format!("TRUNCATE {}", dest.quoted())
        };
        self.execute(&sql, &ctx).await
    }

    /// Reads a table's columns and primary key from the catalog.
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let client = self.client().await?;
        let name = dest.quoted();
        let rows = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                 COALESCE((SELECT array_position(i.indkey::int2[], a.attnum) FROM pg_index i \
                   WHERE i.indrelid = a.attrelid AND i.indisprimary), -1) \
                 FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
                 AND NOT a.attisdropped ORDER BY a.attnum",
                &[&name],
            )
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let mut state = TableState { exists: !rows.is_empty(), ..Default::default() };
        let mut pk: Vec<(i32, String)> = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            let pos: i32 = row.get(3);
            // int2vector subscripts start at 0; -1: not in the key.
            if pos >= 0 {
                pk.push((pos, name.clone()));
            }
            state
                .columns
                .push(DestColumn { name, raw_type: row.get(1), not_null: row.get(2) });
        }
        pk.sort();
        state.primary_key = pk.into_iter().map(|(_, n)| n).collect();
        if let Some(old) = self.tables.get(dest) {
            if old.exists && state.exists {
                state.reconciled = old.reconciled.clone();
            }
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    /// Makes the destination table fit `schema`: creates it, adds columns,
    /// widens types, relaxes NOT NULL of columns the source no longer sends.
    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema, from_pg: bool) -> Result<()> {
        let fingerprint = schema_fingerprint(schema, from_pg);
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let plan = plan_ddl(dest, schema, from_pg, self.tables.get(dest))?;
        if !plan.is_empty() {
            let ctx = self.ctx().in_table(dest.to_string());
            // Serialise DDL on this table across sink runners, then look
            // again: another runner may have done it meanwhile.
            let lock = format!(
                "SELECT pg_advisory_xact_lock(hashtext({}))",
                quote_literal(&format!("tributary table {dest}"))
            );
            self.execute(&lock, &ctx).await?;
            self.load_table(dest).await?;
            let plan = plan_ddl(dest, schema, from_pg, self.tables.get(dest))?;
            if !plan.is_empty() {
                if !self.tables.get(dest).is_some_and(|s| s.exists) {
                    let exists: bool = self
                        .client()
                        .await?
                        .query_one("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", &[&dest.schema])
                        .await
                        .map_err(|e| classify(&e, &ctx))?
                        .get(0);
                    if !exists {
                        let sql = format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&dest.schema));
                        self.execute(&sql, &ctx).await?;
                    }
                }
                for statement in &plan {
                    info!(table = %dest, ddl = %statement, "changing destination table");
                }
                let sql = plan.join("; ");
                self.execute(&sql, &ctx).await?;
                self.load_table(dest).await?;
            }
        }
        let state = self
            .tables
            .get_mut(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        if state.primary_key.is_empty() {
            let keys = schema.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
            return Err(Error::needs_operator(format!(
                "destination table {dest} has no primary key, so rows cannot be matched"
            ))
            .with_table(schema.id.clone())
            .with_class("tributary.no_primary_key")
            .with_hint(format!("ALTER TABLE {} ADD PRIMARY KEY ({keys})", dest.quoted())));
        }
        state.reconciled.insert(fingerprint);
        Ok(())
    }

    /// The fast path for rows that are all new: `COPY` straight into the
    /// table, under a savepoint. `Ok(false)` (rolled back) when a key
    /// already exists; then the staging path decides by position.
    async fn copy_direct(
        &self,
        dest: &DestinationTable,
        names: &[String],
        group: &Group<'_>,
        binary: Option<&[BinaryType]>,
    ) -> Result<bool, ApplyError> {
        let ctx = self.ctx().in_table(dest.to_string());
        self.execute("SAVEPOINT tributary_fast", &ctx).await?;
        let copy = format!(
            "COPY {} ({}{}{}, {}) FROM STDIN",
            dest.quoted(),
            names.join(", "),
            if names.is_empty() { "" } else { ", " },
            quote_ident(COMMIT_COLUMN),
            quote_ident(INDEX_COLUMN),
        );
        match copy_lines(self, &copy, group, false, binary).await {
            Ok(()) => {
                self.defer("RELEASE SAVEPOINT tributary_fast");
                debug!(table = %dest, rows = group.upserts, "copied directly");
                Ok(true)
            }
            Err(CopyFailure::Db(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                self.execute("ROLLBACK TO SAVEPOINT tributary_fast; RELEASE SAVEPOINT tributary_fast", &ctx)
                    .await?;
                debug!(table = %dest, "keys exist already: merging instead");
                Ok(false)
            }
            Err(CopyFailure::Db(e)) => Err(classify(&e, &ctx).into()),
            Err(CopyFailure::Session(e)) => Err(e.into()),
            Err(CopyFailure::Render(e)) => Err(e),
        }
    }

    /// The direct `COPY` of a group of reads and inserts, unless an earlier
    /// batch found keys there already: `Some(true)` copied, `Some(false)`
    /// tried and rolled back (keys exist), `None` not tried.
    async fn copy_fast(&mut self, dest: &DestinationTable, group: &Group<'_>) -> Result<Option<bool>, ApplyError> {
        if group.deletes > 0 || !group.only_inserts || group.upserts == 0 {
            return Ok(None);
        }
        let skip = self.fast_skip.get(dest).copied().unwrap_or(0);
        if skip > 0 {
            self.fast_skip.insert(dest.clone(), skip - 1);
            return Ok(None);
        }
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        let (columns, binary) = copy_columns(dest, state, group)?;
        let names: Vec<String> = columns.iter().map(|(n, _)| quote_ident(n)).collect();
        if self.copy_direct(dest, &names, group, binary.as_deref()).await? {
            return Ok(Some(true));
        }
        // Some keys exist already (a snapshot taken again, a replay): use
        // the upsert for a while before trying again.
        self.fast_skip.insert(dest.clone(), FAST_PATH_BACKOFF_BATCHES);
        Ok(Some(false))
    }

    /// Stages one schema version's surviving rows and merges them (or
    /// copies them straight in, see [`PostgresSink::copy_direct`]). With
    /// `probe` (bisecting, or this batch's direct copy was already refused
    /// or skipped) the direct copy is not tried.
    async fn merge(&mut self, dest: &DestinationTable, group: &Group<'_>, probe: bool) -> Result<(), ApplyError> {
        if !probe && self.copy_fast(dest, group).await? == Some(true) {
            return Ok(());
        }
        let ctx = self.ctx().in_table(dest.to_string());
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        let (columns, binary) = copy_columns(dest, state, group)?;
        let key = state.primary_key.clone();
        let stage = staging_name(dest, &columns);
        let mut sql = String::new();
        if probe || !self.staging.contains(&stage) {
            let defs = columns
                .iter()
                .map(|(n, t)| format!("{} {t}", quote_ident(n)))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(
                sql,
                "CREATE TEMP TABLE IF NOT EXISTS {s} ({defs}{comma} {d} boolean, {c} bigint, {i} bigint) ON COMMIT DELETE ROWS; ",
                s = quote_ident(&stage),
                comma = if defs.is_empty() { "" } else { "," },
                d = quote_ident(DELETE_COLUMN),
                c = quote_ident(COMMIT_COLUMN),
                i = quote_ident(INDEX_COLUMN),
            );
            self.staging_in_txn.insert(stage.clone());
        }
        if self.staging_filled.contains(&stage) {
            let _ = write!(sql, "TRUNCATE {}; ", quote_ident(&stage));
        }
        if !sql.is_empty() {
            self.execute(&sql, &ctx).await?;
        }
        self.staging_filled.insert(stage.clone());
        let names: Vec<String> = columns.iter().map(|(n, _)| quote_ident(n)).collect();
        let copy = format!(
            "COPY {} ({}, {}{}{}, {}) FROM STDIN",
            quote_ident(&stage),
            quote_ident(DELETE_COLUMN),
            names.join(", "),
            if names.is_empty() { "" } else { ", " },
            quote_ident(COMMIT_COLUMN),
            quote_ident(INDEX_COLUMN),
        );
        match copy_lines(self, &copy, group, true, binary.as_deref()).await {
            Ok(()) => {}
            Err(CopyFailure::Db(e)) => return Err(classify(&e, &ctx).into()),
            Err(CopyFailure::Session(e)) => return Err(e.into()),
            Err(CopyFailure::Render(e)) => return Err(e),
        }

        let c = quote_ident(COMMIT_COLUMN);
        let i = quote_ident(INDEX_COLUMN);
        let d = quote_ident(DELETE_COLUMN);
        let keys: Vec<String> = key.iter().map(|k| quote_ident(k)).collect();
        let mut merge = String::new();
        if group.deletes > 0 {
            let on = keys.iter().map(|k| format!("t.{k} = s.{k}")).collect::<Vec<_>>().join(" AND ");
            let _ = write!(
                merge,
                "DELETE FROM {t} AS t USING {s} AS s WHERE s.{d} AND {on} AND (t.{c}, t.{i}) <= (s.{c}, s.{i}); ",
                t = dest.quoted(),
                s = quote_ident(&stage),
            );
        }
        if group.upserts > 0 {
            let all: Vec<String> = names.iter().cloned().chain([c.clone(), i.clone()]).collect();
            let set = names
                .iter()
                .filter(|n| !keys.contains(n))
                .chain([&c, &i])
                .map(|n| format!("{n} = EXCLUDED.{n}"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(
                merge,
                "INSERT INTO {t} AS t ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {s} WHERE NOT {d} \
                 ORDER BY {keys}, {c} DESC, {i} DESC \
                 ON CONFLICT ({keys}) DO UPDATE SET {set} WHERE (t.{c}, t.{i}) < (EXCLUDED.{c}, EXCLUDED.{i})",
                t = dest.quoted(),
                cols = all.join(", "),
                keys = keys.join(", "),
                s = quote_ident(&stage),
            );
        }
        self.execute(&merge, &ctx).await?;
        debug!(table = %dest, upserts = group.upserts, deletes = group.deletes, "merged");
        Ok(())
    }
}

#[async_trait]
impl Sink for PostgresSink {
    async fn committed_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.connect().await?;
        let ctx = self.ctx().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
        let rows = match self
            .client()
            .await?
            .query(
                "SELECT topic, partition, next_offset FROM tributary.offsets WHERE consumer_group = $1",
                &[&self.consumer_group],
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                let err = classify(&e, &ctx);
                return Err(self.failed(err));
            }
        };
        let stored: HashMap<(String, i32), i64> = rows
            .into_iter()
            .map(|r| ((r.get::<_, String>(0), r.get::<_, i32>(1)), r.get::<_, i64>(2)))
            .collect();
        Ok(partitions.iter().map(|(t, p)| stored.get(&(t.clone(), *p)).copied()).collect())
    }

    async fn apply(&mut self, batch: &SinkBatch) -> Result<(), ApplyError> {
        let span = info_span!("postgres_apply", table = %batch.table, records = batch.records.len());
        self.apply_inner(batch, true).instrument(span).await
    }
}

/// Prefixes of a batch, each applied under a savepoint and rolled back.
struct Prefixes<'a> {
    sink: &'a mut PostgresSink,
    records: &'a [(KafkaPosition, SinkRecord)],
}

#[async_trait]
impl PrefixProbe for Prefixes<'_> {
    async fn probe(&mut self, n: usize) -> Result<(), ApplyError> {
        self.sink.probe(&self.records[..n]).await
    }
}

// ---------------------------------------------------------------- reduction

/// The surviving events of one table, grouped by schema version. Rows are
/// rendered for `COPY` only while they are sent ([`copy_lines`]), so
/// PostgreSQL parses one chunk while the next is rendered, and a batch is
/// never held rendered whole.
#[derive(Default)]
struct Reduced<'a> {
    groups: Vec<Group<'a>>,
    /// Key text -> the line of the newest event of that key so far.
    winners: FxHashMap<Vec<u8>, Winner>,
}

struct Winner {
    position: Position,
    group: usize,
    line: usize,
}

struct Group<'a> {
    schema: Arc<TableSchema>,
    key: Vec<usize>,
    /// In batch order; lines superseded by a later event of the same key
    /// are not `live`.
    lines: Vec<Line<'a>>,
    upserts: usize,
    deletes: usize,
    /// Whether every upsert is a read or an insert (no update): such a
    /// group may be copied straight into the table (see `merge`).
    only_inserts: bool,
}

/// One row to write: an upsert's new values or a delete's key.
struct Line<'a> {
    row: &'a [Value],
    /// Index of its record in the batch, named when it cannot be rendered.
    record: usize,
    commit: i64,
    index: i64,
    delete: bool,
    live: bool,
}

impl<'a> Reduced<'a> {
    fn with_capacity(events: usize) -> Self {
        Self {
            groups: Vec::new(),
            winners: FxHashMap::with_capacity_and_hasher(events, Default::default()),
        }
    }

    fn group_of(&mut self, schema: &Arc<TableSchema>) -> usize {
        if let Some(g) = self
            .groups
            .iter()
            .position(|g| Arc::ptr_eq(&g.schema, schema) || *g.schema == **schema)
        {
            return g;
        }
        self.groups.push(Group {
            schema: schema.clone(),
            key: schema.key_indexes(),
            lines: Vec::new(),
            upserts: 0,
            deletes: 0,
            only_inserts: true,
        });
        self.groups.len() - 1
    }

    /// Adds the event of record `record`.
    fn add(&mut self, record: usize, ev: &'a ChangeEvent) -> Result<()> {
        let schema = &ev.schema;
        let key_idx = schema.key_indexes();
        if key_idx.is_empty() {
            return Err(Error::permanent("the table has no key columns").with_class("tributary.no_key"));
        }
        match ev.op {
            Op::Read | Op::Create | Op::Update => {
                let after = ev
                    .after
                    .as_ref()
                    .ok_or_else(|| Error::permanent(format!("a {:?} event without an after row", ev.op)))?;
                if let (Op::Update, Some(before)) = (ev.op, &ev.before) {
                    // A key change: the old key is deleted at the same position.
                    if before.len() == schema.columns.len() && !before_key_is_null(before, &key_idx) {
                        let old = render_key(schema, before, &key_idx)?;
                        let new = render_key(schema, after, &key_idx)?;
                        if old != new {
                            self.put(record, ev, before, true, &key_idx)?;
                        }
                    }
                }
                self.put(record, ev, after, false, &key_idx)
            }
            Op::Delete => {
                let before = ev
                    .before
                    .as_ref()
                    .ok_or_else(|| Error::permanent("a delete event without a before row"))?;
                self.put(record, ev, before, true, &key_idx)
            }
            Op::Truncate => Ok(()),
        }
    }

    /// Adds `row` of the event of record `record`; `key_idx` is its schema's
    /// key columns.
    fn put(
        &mut self,
        record: usize,
        ev: &ChangeEvent,
        row: &'a [Value],
        delete: bool,
        key_idx: &[usize],
    ) -> Result<()> {
        let schema = &ev.schema;
        if row.len() != schema.columns.len() {
            return Err(Error::permanent(format!(
                "a row of {} values for {} columns",
                row.len(),
                schema.columns.len()
            )));
        }
        let key = render_key(schema, row, key_idx)?;
        let position = ev.source.position;
        if let Some(w) = self.winners.get(&key) {
            if w.position > position {
                return Ok(()); // an older event: the newer one stays
            }
        }
        let (commit, index) = position_sql(position)?;
        let g = self.group_of(schema);
        let group = &mut self.groups[g];
        if ev.op == Op::Update {
            group.only_inserts = false;
        }
        group.lines.push(Line { row, record, commit, index, delete, live: true });
        if delete {
            group.deletes += 1;
        } else {
            group.upserts += 1;
        }
        let line = group.lines.len() - 1;
        if let Some(old) = self.winners.insert(key, Winner { position, group: g, line }) {
            let og = &mut self.groups[old.group];
            let superseded = &mut og.lines[old.line];
            superseded.live = false;
            if superseded.delete {
                og.deletes -= 1;
            } else {
                og.upserts -= 1;
            }
        }
        Ok(())
    }
}

impl<'a> Group<'a> {
    /// All of `events` as one group, unreduced, when they are reads and
    /// inserts of one schema version with a whole row and a key each (a
    /// snapshot chunk); `None` otherwise, and then the reduction decides
    /// (and names what is wrong with a row).
    fn inserts_only(events: &[(usize, &'a ChangeEvent)]) -> Option<Group<'a>> {
        let (_, first) = events.first()?;
        let schema = &first.schema;
        let key = schema.key_indexes();
        if key.is_empty() {
            return None;
        }
        let mut lines = Vec::with_capacity(events.len());
        for &(record, ev) in events {
            if !matches!(ev.op, Op::Read | Op::Create) || !Arc::ptr_eq(&ev.schema, schema) {
                return None;
            }
            let row = ev.after.as_deref()?;
            if row.len() != schema.columns.len() || before_key_is_null(row, &key) {
                return None;
            }
            let (commit, index) = position_sql(ev.source.position).ok()?;
            lines.push(Line {
                row,
                record,
                commit,
                index,
                delete: false,
                live: true,
            });
        }
        Some(Group {
            schema: schema.clone(),
            key,
            upserts: lines.len(),
            deletes: 0,
            only_inserts: true,
            lines,
        })
    }
}

impl Group<'_> {
    /// Appends `line` as a `COPY` text line: the delete flag first when
    /// `flag` (the staging table's column order), then the columns (a
    /// delete carries only its key), then the position.
    fn render(&self, out: &mut Vec<u8>, scratch: &mut String, line: &Line<'_>, flag: bool) -> Result<(), ApplyError> {
        if flag {
            out.extend_from_slice(if line.delete { b"t\t" } else { b"f\t" });
        }
        for (i, (col, value)) in self.schema.columns.iter().zip(line.row).enumerate() {
            if line.delete && !self.key.contains(&i) {
                out.extend_from_slice(b"\\N");
            } else {
                render_copy(out, scratch, value).map_err(|reason| ApplyError {
                    error: Error::permanent(format!("column {}: {reason}", col.name))
                        .with_column(col.name.clone())
                        .with_table(self.schema.id.clone()),
                    record: Some(line.record),
                })?;
            }
            out.push(b'\t');
        }
        let mut digits = itoa::Buffer::new();
        out.extend_from_slice(digits.format(line.commit).as_bytes());
        out.push(b'\t');
        out.extend_from_slice(digits.format(line.index).as_bytes());
        out.push(b'\n');
        Ok(())
    }

    /// The binary `COPY` fields of this group, when every live value can be
    /// written in binary exactly as its text form would be read; `None`
    /// sends the group as text. `fields` holds one entry per schema column,
    /// from the destination column's type (`None` for a type without a
    /// binary writer here).
    fn binary_fields(&self, fields: &[Option<BinaryType>]) -> Option<Vec<BinaryType>> {
        let fields: Vec<BinaryType> = fields.iter().copied().collect::<Option<_>>()?;
        for line in self.lines.iter().filter(|l| l.live) {
            for (i, (field, value)) in fields.iter().zip(line.row).enumerate() {
                if !(line.delete && !self.key.contains(&i)) && !field.accepts(value) {
                    return None;
                }
            }
        }
        Some(fields)
    }

    /// Appends `line` as a binary `COPY` tuple, in the order of [`Group::render`].
    /// Every value was checked by [`Group::binary_fields`].
    fn render_binary(&self, out: &mut Vec<u8>, fields: &[BinaryType], line: &Line<'_>, flag: bool) {
        let n = self.schema.columns.len() + 2 + usize::from(flag);
        out.extend_from_slice(&i16::try_from(n).unwrap_or(i16::MAX).to_be_bytes());
        if flag {
            BinaryType::Bool.write(out, &Value::Boolean(line.delete));
        }
        for (i, (field, value)) in fields.iter().zip(line.row).enumerate() {
            if line.delete && !self.key.contains(&i) {
                out.extend_from_slice(&(-1i32).to_be_bytes());
            } else {
                field.write(out, value);
            }
        }
        BinaryType::Int8.write(out, &Value::Int64(line.commit));
        BinaryType::Int8.write(out, &Value::Int64(line.index));
    }
}

/// The binary `COPY` type of a destination column type (`format_type`
/// spelling); `None` for the types sent as text (arrays, intervals, user
/// types...). Binary input spares PostgreSQL the text parsing of every
/// value: a 1M-row `COPY` into the benchmark table (with its primary key)
/// took 4.1-5.3 s as text and 2.9-3.0 s as binary here.
fn binary_type(raw: &str) -> Option<BinaryType> {
    let t = PgType::parse(raw);
    if t.dims > 0 {
        return None;
    }
    BinaryType::from_base(&t.base)
}

/// Writing values in binary `COPY`.
impl BinaryType {
    /// Whether `value` can be written as this field with the meaning its
    /// text form has (anything else sends its group as text, where
    /// PostgreSQL decides as before).
    fn accepts(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (Self::Bool, Value::Boolean(_)) => true,
            (Self::Int2, Value::Int16(_)) => true,
            (Self::Int4, Value::Int16(_) | Value::Int32(_)) => true,
            (Self::Int8, Value::Int16(_) | Value::Int32(_) | Value::Int64(_)) => true,
            (Self::Float4, Value::Float32(_)) => true,
            (Self::Float8, Value::Float32(_) | Value::Float64(_)) => true,
            (Self::Numeric, Value::Decimal(s)) => decimal_parts(s).is_some(),
            (Self::Text, Value::Text(_) | Value::Enum(_)) => true,
            (Self::Bytea, Value::Bytes(_)) => true,
            (Self::Date, Value::Date(d)) => d.checked_sub(PG_EPOCH_DAYS).is_some(),
            // Text input reads 24:00:00 and takes the rest modulo a day.
            (Self::Time, Value::Time(t)) => (0..=86_400_000_000).contains(t),
            // i64::MIN and MAX are -infinity and infinity in binary only.
            (Self::Timestamp, Value::Timestamp(t)) | (Self::TimestampTz, Value::TimestampTz(t)) => {
                t.checked_sub(PG_EPOCH_MICROS).is_some_and(|v| v != i64::MIN && v != i64::MAX)
            }
            (Self::Uuid, Value::Uuid(_)) => true,
            (Self::Json | Self::Jsonb, Value::Json(_) | Value::Text(_)) => true,
            _ => false,
        }
    }

    /// Appends `value` (accepted by [`BinaryType::accepts`]) as a binary
    /// `COPY` field: its length, then its bytes.
    fn write(self, out: &mut Vec<u8>, value: &Value) {
        fn field(out: &mut Vec<u8>, bytes: &[u8]) {
            out.extend_from_slice(&i32::try_from(bytes.len()).unwrap_or(i32::MAX).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        let int = |v: &Value| match v {
            Value::Int16(v) => i64::from(*v),
            Value::Int32(v) => i64::from(*v),
            Value::Int64(v) => *v,
            _ => 0,
        };
        match (self, value) {
            (_, Value::Null) => out.extend_from_slice(&(-1i32).to_be_bytes()),
            (Self::Bool, Value::Boolean(b)) => field(out, &[u8::from(*b)]),
            // Accepted values fit: only narrower integers reach a column.
            (Self::Int2, v) => field(out, &(int(v) as i16).to_be_bytes()),
            (Self::Int4, v) => field(out, &(int(v) as i32).to_be_bytes()),
            (Self::Int8, v) => field(out, &int(v).to_be_bytes()),
            (Self::Float4, Value::Float32(f)) => field(out, &f.to_bits().to_be_bytes()),
            (Self::Float8, Value::Float32(f)) => field(out, &f64::from(*f).to_bits().to_be_bytes()),
            (Self::Float8, Value::Float64(f)) => field(out, &f.to_bits().to_be_bytes()),
            (Self::Numeric, Value::Decimal(s)) => write_numeric(out, s),
            (Self::Text | Self::Json, Value::Text(s) | Value::Enum(s) | Value::Json(s)) => field(out, s.as_bytes()),
            (Self::Jsonb, Value::Json(s) | Value::Text(s)) => {
                // jsonb's binary form: version 1, then the JSON text.
                out.extend_from_slice(&i32::try_from(s.len() + 1).unwrap_or(i32::MAX).to_be_bytes());
                out.push(1);
                out.extend_from_slice(s.as_bytes());
            }
            (Self::Bytea, Value::Bytes(b)) => field(out, b),
            (Self::Date, Value::Date(d)) => field(out, &(d - PG_EPOCH_DAYS).to_be_bytes()),
            (Self::Time, Value::Time(t)) => field(out, &t.to_be_bytes()),
            (Self::Timestamp, Value::Timestamp(t)) | (Self::TimestampTz, Value::TimestampTz(t)) => {
                field(out, &(t - PG_EPOCH_MICROS).to_be_bytes())
            }
            (Self::Uuid, Value::Uuid(u)) => field(out, u.as_bytes()),
            // Not accepted: never called so (see `binary_fields`); NULL
            // keeps the stream well-formed.
            _ => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
}

/// The sign, integer digits and fraction digits of a plain decimal text
/// (`-12.340`, `.5`, `7`); `None` for anything else (`NaN`, exponents).
fn decimal_parts(s: &str) -> Option<(bool, &str, &str)> {
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    // numeric's limits: 131072 digits before the point, 16383 after.
    if (int.is_empty() && frac.is_empty())
        || !digits(int)
        || !digits(frac)
        || int.len() > 131_072
        || frac.len() > 16_383
    {
        return None;
    }
    Some((neg, int, frac))
}

/// Appends a decimal text (accepted by [`decimal_parts`]) as PostgreSQL's
/// binary `numeric`: base-10000 digit groups aligned on the decimal point,
/// the weight of the first, the sign and the display scale.
fn write_numeric(out: &mut Vec<u8>, s: &str) {
    let Some((neg, int, frac)) = decimal_parts(s) else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return;
    };
    let int = int.trim_start_matches('0');
    let mut groups: Vec<i16> = Vec::with_capacity(int.len() / 4 + frac.len() / 4 + 2);
    let (mut acc, mut n) = (0i16, (4 - int.len() % 4) % 4);
    for b in int.bytes().chain(frac.bytes()) {
        acc = acc * 10 + i16::from(b - b'0');
        n += 1;
        if n == 4 {
            groups.push(acc);
            (acc, n) = (0, 0);
        }
    }
    if n > 0 {
        for _ in n..4 {
            acc *= 10;
        }
        groups.push(acc);
    }
    let mut weight = (int.len() as i32 + 3) / 4 - 1;
    let lead = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..lead);
    weight -= lead as i32;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let sign: u16 = if neg && !groups.is_empty() { 0x4000 } else { 0 };
    if groups.is_empty() {
        weight = 0;
    }
    out.extend_from_slice(&i32::try_from(8 + 2 * groups.len()).unwrap_or(i32::MAX).to_be_bytes());
    out.extend_from_slice(&i16::try_from(groups.len()).unwrap_or(i16::MAX).to_be_bytes());
    out.extend_from_slice(&i16::try_from(weight).unwrap_or(i16::MAX).to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&i16::try_from(frac.len()).unwrap_or(i16::MAX).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
}

/// Why [`copy_lines`] failed.
enum CopyFailure {
    /// A row could not be rendered (the `COPY` was aborted).
    Render(ApplyError),
    /// PostgreSQL refused the `COPY` or the connection broke.
    Db(tokio_postgres::Error),
    /// There was no session, or what was deferred failed before the `COPY`.
    Session(Error),
}

/// Each column's name and destination type, and the binary writers (when
/// every column and value has one).
type CopyColumns<'s> = (Vec<(&'s str, &'s str)>, Option<Vec<BinaryType>>);

/// The destination type of each of `group`'s columns, and the binary
/// writers when every column and value has one (else the copy is text).
fn copy_columns<'s>(dest: &DestinationTable, state: &'s TableState, group: &'s Group<'_>) -> Result<CopyColumns<'s>> {
    let schema = &group.schema;
    let mut columns: Vec<(&str, &str)> = Vec::with_capacity(schema.columns.len());
    for c in &schema.columns {
        let d = state.column(&c.name).ok_or_else(|| {
            Error::retryable(format!("column {} is missing in {dest}", c.name)).with_column(c.name.clone())
        })?;
        columns.push((c.name.as_str(), d.raw_type.as_str()));
    }
    let binary = group.binary_fields(&columns.iter().map(|(_, t)| binary_type(t)).collect::<Vec<_>>());
    Ok((columns, binary))
}

/// Runs `copy` (a `COPY ... FROM STDIN`, sent with `(FORMAT binary)` when
/// `binary` gives the fields) in `pg`'s session with the live lines of
/// `group`, rendering each chunk while PostgreSQL parses the one before.
/// On a render error the sink is dropped unfinished, which makes
/// tokio-postgres send `CopyFail`: nothing of the `COPY` stays.
async fn copy_lines(
    pg: &PostgresSink,
    copy: &str,
    group: &Group<'_>,
    flag: bool,
    binary: Option<&[BinaryType]>,
) -> Result<(), CopyFailure> {
    let copy = if binary.is_some() {
        format!("{copy} (FORMAT binary)")
    } else {
        copy.to_string()
    };
    let (client, statement) = pg.copy_statement(&copy).await?;
    let sink = client.copy_in::<_, Bytes>(&statement).await.map_err(CopyFailure::Db)?;
    futures::pin_mut!(sink);
    let mut scratch = String::new();
    let mut chunk = Vec::with_capacity(COPY_CHUNK_BYTES + COPY_CHUNK_BYTES / 4);
    if binary.is_some() {
        // The signature, no flags, no header extension.
        chunk.extend_from_slice(BINARY_COPY_SIGNATURE);
        chunk.extend_from_slice(&[0; 8]);
    }
    for line in group.lines.iter().filter(|l| l.live) {
        match binary {
            Some(fields) => group.render_binary(&mut chunk, fields, line, flag),
            None => group
                .render(&mut chunk, &mut scratch, line, flag)
                .map_err(CopyFailure::Render)?,
        }
        if chunk.len() >= COPY_CHUNK_BYTES {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(COPY_CHUNK_BYTES + COPY_CHUNK_BYTES / 4));
            sink.send(Bytes::from(full)).await.map_err(CopyFailure::Db)?;
        }
    }
    if binary.is_some() {
        chunk.extend_from_slice(&(-1i16).to_be_bytes());
    }
    if !chunk.is_empty() {
        sink.send(Bytes::from(chunk)).await.map_err(CopyFailure::Db)?;
    }
    sink.as_mut().finish().await.map_err(CopyFailure::Db)?;
    Ok(())
}

fn before_key_is_null(row: &[Value], key: &[usize]) -> bool {
    key.iter()
        .any(|&i| matches!(row.get(i), Some(Value::Null) | Some(Value::Unchanged) | None))
}

fn render_key(schema: &TableSchema, row: &[Value], key: &[usize]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for &i in key {
        let value = row.get(i).ok_or_else(|| Error::permanent("a row shorter than its schema"))?;
        if matches!(value, Value::Null) {
            return Err(Error::permanent(format!("key column {} is null", schema.columns[i].name))
                .with_column(schema.columns[i].name.clone()));
        }
        render_copy(&mut out, &mut String::new(), value).map_err(|reason| {
            Error::permanent(format!("key column {}: {reason}", schema.columns[i].name))
                .with_column(schema.columns[i].name.clone())
        })?;
        out.push(b'\t');
    }
    Ok(out)
}

fn position_sql(p: Position) -> Result<(i64, i64)> {
    let commit = i64::try_from(p.commit)
        .map_err(|_| Error::permanent("the event's position does not fit a bigint").with_class("tributary.position"))?;
    let index = i64::try_from(p.index)
        .map_err(|_| Error::permanent("the event's position does not fit a bigint").with_class("tributary.position"))?;
    Ok((commit, index))
}

fn from_postgres(ev: &ChangeEvent) -> bool {
    &*ev.source.connector == "postgresql"
}

fn schema_fingerprint(schema: &TableSchema, from_pg: bool) -> u64 {
    let mut h = DefaultHasher::new();
    schema.hash(&mut h);
    from_pg.hash(&mut h);
    h.finish()
}

fn staging_name(dest: &DestinationTable, columns: &[(&str, &str)]) -> String {
    let mut h = DefaultHasher::new();
    dest.hash(&mut h);
    columns.hash(&mut h);
    format!("__tributary_stage_{:016x}", h.finish())
}

fn offsets_sql(group: &str, offsets: &[(String, i32, i64)]) -> String {
    let mut sql = format!(
        "INSERT INTO {}.{} (consumer_group, topic, partition, next_offset) VALUES ",
        quote_ident(BOOKKEEPING_SCHEMA),
        quote_ident(OFFSETS_TABLE)
    );
    for (n, (topic, partition, next)) in offsets.iter().enumerate() {
        if n > 0 {
            sql.push_str(", ");
        }
        let _ = write!(sql, "({}, {}, {partition}, {next})", quote_literal(group), quote_literal(topic));
    }
    sql.push_str(" ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset");
    sql
}

// ---------------------------------------------------------------- DDL

/// The statements that make `state` fit `schema` (empty when it already does).
fn plan_ddl(
    dest: &DestinationTable,
    schema: &TableSchema,
    from_pg: bool,
    state: Option<&TableState>,
) -> Result<Vec<String>> {
    let mut plan = Vec::new();
    let table = dest.quoted();
    let Some(state) = state.filter(|s| s.exists) else {
        if schema.key.is_empty() {
            return Err(Error::permanent("the source table has no key columns")
                .with_table(schema.id.clone())
                .with_class("tributary.no_key"));
        }
        let mut defs = Vec::new();
        for c in &schema.columns {
            let ty = destination_type(c, from_pg).render();
            let not_null = if !c.nullable || schema.key.contains(&c.name) {
                " NOT NULL"
            } else {
                ""
            };
            defs.push(format!("{} {ty}{not_null}", quote_ident(&c.name)));
        }
        defs.push(format!("{} bigint NOT NULL", quote_ident(COMMIT_COLUMN)));
        defs.push(format!("{} bigint NOT NULL", quote_ident(INDEX_COLUMN)));
        let keys = schema.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
        defs.push(format!("PRIMARY KEY ({keys})"));
        plan.push(format!("CREATE TABLE IF NOT EXISTS {table} ({})", defs.join(", ")));
        return Ok(plan);
    };
    for c in &schema.columns {
        let wanted = destination_type(c, from_pg);
        match state.column(&c.name) {
            None => plan.push(format!("ALTER TABLE {table} ADD COLUMN {} {}", quote_ident(&c.name), wanted.render())),
            Some(d) => {
                let have = PgType::parse(&d.raw_type);
                match fit(&have, &wanted) {
                    Fit::Keep => {}
                    Fit::Widen(to) => plan.push(format!(
                        "ALTER TABLE {table} ALTER COLUMN {} TYPE {}",
                        quote_ident(&c.name),
                        to.render()
                    )),
                    Fit::Incompatible => {
                        return Err(Error::permanent(format!(
                            "cannot change column {} of destination table {dest} from {} to {}: \
                             PostgreSQL cannot widen one into the other",
                            c.name,
                            d.raw_type,
                            wanted.render()
                        ))
                        .with_table(schema.id.clone())
                        .with_column(c.name.clone())
                        .with_class("tributary.incompatible_type")
                        .with_hint(format!(
                            "change the column by hand (ALTER TABLE {table} ALTER COLUMN {} TYPE {} USING ...), \
                             then replay the dead-letter topic",
                            quote_ident(&c.name),
                            wanted.render()
                        )));
                    }
                }
                if d.not_null && c.nullable && !state.primary_key.contains(&c.name) {
                    plan.push(format!("ALTER TABLE {table} ALTER COLUMN {} DROP NOT NULL", quote_ident(&c.name)));
                }
            }
        }
    }
    // Columns the source no longer sends must accept NULL in new rows.
    for d in &state.columns {
        let ours = d.name == COMMIT_COLUMN || d.name == INDEX_COLUMN;
        if !ours && d.not_null && !state.primary_key.contains(&d.name) && schema.column_index(&d.name).is_none() {
            plan.push(format!("ALTER TABLE {table} ALTER COLUMN {} DROP NOT NULL", quote_ident(&d.name)));
        }
    }
    // A table made by hand gets the bookkeeping columns; -1 sorts before
    // every real position.
    for col in [COMMIT_COLUMN, INDEX_COLUMN] {
        if state.column(col).is_none() {
            plan.push(format!("ALTER TABLE {table} ADD COLUMN {} bigint NOT NULL DEFAULT -1", quote_ident(col)));
        }
    }
    Ok(plan)
}

/// A PostgreSQL type, parsed enough to compare and widen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgType {
    /// Canonical base name (`format_type` spelling without modifiers).
    pub base: String,
    /// Type modifiers: `(40)`, `(12,2)`.
    pub mods: Vec<i64>,
    /// Array dimensions.
    pub dims: usize,
}

impl PgType {
    fn new(base: &str) -> Self {
        Self { base: base.to_string(), mods: Vec::new(), dims: 0 }
    }

    fn with_mods(mut self, mods: Vec<i64>) -> Self {
        self.mods = mods;
        self
    }

    /// Parses a type name as `format_type` or a user writes it.
    pub fn parse(text: &str) -> Self {
        let mut s = text.trim().to_ascii_lowercase();
        let mut dims = 0;
        loop {
            let t = s.trim_end();
            if t.ends_with(']') {
                if let Some(open) = t.rfind('[') {
                    s = t[..open].to_string();
                    dims += 1;
                    continue;
                }
            }
            break;
        }
        if let Some(rest) = s.strip_suffix(" array") {
            s = rest.to_string();
            dims += 1;
        }
        let mut mods = Vec::new();
        if let (Some(open), Some(close)) = (s.find('('), s.find(')')) {
            if open < close {
                mods = s[open + 1..close]
                    .split(',')
                    .filter_map(|m| m.trim().parse::<i64>().ok())
                    .collect();
                s = format!("{}{}", &s[..open], &s[close + 1..]);
            }
        }
        let base = s.split_whitespace().collect::<Vec<_>>().join(" ");
        let base = match base.as_str() {
            "int2" | "smallint" | "smallserial" | "serial2" => "smallint",
            "int" | "int4" | "integer" | "serial" | "serial4" => "integer",
            "int8" | "bigint" | "bigserial" | "serial8" => "bigint",
            "float4" | "real" => "real",
            "float8" | "double precision" | "float" => "double precision",
            "decimal" | "numeric" => "numeric",
            "varchar" | "character varying" => "character varying",
            "char" | "character" | "bpchar" => "character",
            "bool" | "boolean" => "boolean",
            "timestamp" | "timestamp without time zone" => "timestamp without time zone",
            "timestamptz" | "timestamp with time zone" => "timestamp with time zone",
            "time" | "time without time zone" => "time without time zone",
            "timetz" | "time with time zone" => "time with time zone",
            "varbit" | "bit varying" => "bit varying",
            other => other,
        }
        .to_string();
        Self { base, mods, dims }
    }

    /// The type as SQL.
    pub fn render(&self) -> String {
        let mods = if self.mods.is_empty() {
            String::new()
        } else {
            format!("({})", self.mods.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(","))
        };
        let mut out = match self.base.split_once(' ') {
            // `timestamp(3) with time zone`: the modifier goes after the
            // first word.
            Some((first, rest)) if matches!(first, "timestamp" | "time") && !mods.is_empty() => {
                format!("{first}{mods} {rest}")
            }
            _ => format!("{}{mods}", self.base),
        };
        for _ in 0..self.dims {
            out.push_str("[]");
        }
        out
    }

    fn is_verbatim_safe(&self) -> bool {
        // Built-in types whose text input accepts what the sink renders for
        // the value model; user types (enums, domains, PostGIS) may not
        // exist in the destination and fall back to the logical mapping.
        matches!(
            self.base.as_str(),
            "smallint"
                | "integer"
                | "bigint"
                | "real"
                | "double precision"
                | "numeric"
                | "money"
                | "character varying"
                | "character"
                | "text"
                | "name"
                | "boolean"
                | "bytea"
                | "date"
                | "time without time zone"
                | "time with time zone"
                | "timestamp without time zone"
                | "timestamp with time zone"
                | "interval"
                | "json"
                | "jsonb"
                | "uuid"
                | "xml"
                | "inet"
                | "cidr"
                | "macaddr"
                | "macaddr8"
                | "oid"
        )
    }
}

/// The destination type of a source column: the source's own spelling when
/// it came from PostgreSQL (a migration recreates the exact type), else the
/// logical mapping.
pub fn destination_type(column: &Column, from_pg: bool) -> PgType {
    if from_pg && !column.source_type.trim().is_empty() {
        let t = PgType::parse(&column.source_type);
        let logical = logical_type(&column.data_type);
        if t.is_verbatim_safe() && t.dims == logical.dims {
            return t;
        }
    }
    logical_type(&column.data_type)
}

/// The PostgreSQL type of a logical type.
pub fn logical_type(data_type: &DataType) -> PgType {
    match data_type {
        DataType::Boolean => PgType::new("boolean"),
        DataType::Int16 => PgType::new("smallint"),
        DataType::Int32 => PgType::new("integer"),
        DataType::Int64 => PgType::new("bigint"),
        DataType::Float32 => PgType::new("real"),
        DataType::Float64 => PgType::new("double precision"),
        DataType::Decimal { precision, scale } if *precision >= 1 && *precision <= 1000 && scale <= precision => {
            PgType::new("numeric").with_mods(vec![i64::from(*precision), i64::from(*scale)])
        }
        DataType::Decimal { .. } | DataType::VariableDecimal => PgType::new("numeric"),
        DataType::Text | DataType::Enum { .. } => PgType::new("text"),
        DataType::Json => PgType::new("jsonb"),
        DataType::Uuid => PgType::new("uuid"),
        DataType::Bytes | DataType::Geometry => PgType::new("bytea"),
        DataType::Date => PgType::new("date"),
        DataType::Time => PgType::new("time without time zone"),
        DataType::Timestamp => PgType::new("timestamp without time zone"),
        DataType::TimestampTz => PgType::new("timestamp with time zone"),
        DataType::Interval => PgType::new("interval"),
        DataType::Array(inner) => {
            let mut t = logical_type(inner);
            t.dims += 1;
            t
        }
    }
}

/// Whether a destination column of type `have` can take values of type
/// `want`, and how to change it if not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// `have` already holds every value of `want`.
    Keep,
    /// `ALTER COLUMN ... TYPE` to this (wider) type.
    Widen(PgType),
    /// PostgreSQL cannot widen `have` into `want`.
    Incompatible,
}

/// Decides how a destination column of type `have` follows a source column
/// now of type `want`.
pub fn fit(have: &PgType, want: &PgType) -> Fit {
    if have == want {
        return Fit::Keep;
    }
    if have.dims != want.dims {
        return Fit::Incompatible;
    }
    let int_digits = |b: &str| match b {
        "smallint" => Some(5i64),
        "integer" => Some(10),
        "bigint" => Some(19),
        _ => None,
    };
    let widen = |base: &str, mods: Vec<i64>| Fit::Widen(PgType { base: base.to_string(), mods, dims: have.dims });
    let (h, w) = (have.base.as_str(), want.base.as_str());
    match (h, w) {
        _ if int_digits(h).is_some() && int_digits(w).is_some() => {
            if int_digits(h) >= int_digits(w) {
                Fit::Keep
            } else {
                widen(w, vec![])
            }
        }
        ("numeric", _) if int_digits(w).is_some() => {
            let digits = int_digits(w).unwrap_or(19);
            match have.mods.as_slice() {
                [] => Fit::Keep,
                [p] if *p >= digits => Fit::Keep,
                [p, s] if p - s >= digits => Fit::Keep,
                [p] => widen("numeric", vec![digits.max(*p)]),
                [p, s] => widen("numeric", vec![digits.max(p - s) + s, *s]),
                _ => Fit::Incompatible,
            }
        }
        (_, "numeric") if int_digits(h).is_some() => {
            let digits = int_digits(h).unwrap_or(19);
            match want.mods.as_slice() {
                [] => widen("numeric", vec![]),
                [p] if *p >= digits => widen("numeric", vec![*p]),
                [p, s] if p - s >= digits => widen("numeric", vec![*p, *s]),
                _ => Fit::Incompatible,
            }
        }
        ("numeric", "numeric") => {
            let parts = |m: &[i64]| match m {
                [p] => Some((*p, 0)),
                [p, s] => Some((*p - *s, *s)),
                _ => None,
            };
            match (parts(&have.mods), parts(&want.mods)) {
                (None, _) => Fit::Keep,
                (_, None) => widen("numeric", vec![]),
                (Some((hi, hs)), Some((wi, ws))) => {
                    if hi >= wi && hs >= ws {
                        Fit::Keep
                    } else {
                        let (i, s) = (hi.max(wi), hs.max(ws));
                        if i + s > 1000 {
                            widen("numeric", vec![])
                        } else {
                            widen("numeric", vec![i + s, s])
                        }
                    }
                }
            }
        }
        ("double precision", "real") => Fit::Keep,
        ("real", "double precision") => widen(w, vec![]),
        ("text", "character varying" | "character" | "text" | "name") => Fit::Keep,
        ("character varying", "character varying" | "character" | "text") => {
            match (have.mods.first(), want.mods.first()) {
                (None, _) => Fit::Keep,
                (Some(n), Some(m)) if w != "text" && m <= n => Fit::Keep,
                (Some(_), Some(m)) if w == "character" => widen("character varying", vec![*m]),
                (Some(_), Some(m)) if w == "character varying" => widen(w, vec![*m]),
                _ => widen(w, want.mods.clone()),
            }
        }
        ("character", "character") => match (have.mods.first(), want.mods.first()) {
            (Some(n), Some(m)) if m > n => widen(w, vec![*m]),
            _ => Fit::Keep,
        },
        ("character", "character varying" | "text") => widen(w, want.mods.clone()),
        ("json", "jsonb") | ("jsonb", "json") => Fit::Keep,
        (
            "timestamp without time zone"
            | "timestamp with time zone"
            | "time without time zone"
            | "time with time zone"
            | "interval",
            _,
        ) if h == w => match (have.mods.first(), want.mods.first()) {
            (None, _) => Fit::Keep,
            (Some(_), None) => widen(w, vec![]),
            (Some(a), Some(b)) if a >= b => Fit::Keep,
            (Some(_), Some(b)) => widen(w, vec![*b]),
        },
        _ if h == w && have.mods.len() == want.mods.len() && have.mods.iter().zip(&want.mods).all(|(a, b)| a >= b) => {
            Fit::Keep
        }
        _ => Fit::Incompatible,
    }
}

// ---------------------------------------------------------------- values

/// Appends `value` in `COPY` text format (`\N` for NULL; the caller adds
/// the tabs). The error names the value's kind, never the value. `scratch`
/// is reused between calls for values rendered before they are escaped.
pub fn render_copy(out: &mut Vec<u8>, scratch: &mut String, value: &Value) -> Result<(), String> {
    // The common types are written straight into `out` (none of their
    // text needs escaping); the rest go through `render_text`.
    match value {
        Value::Null => out.extend_from_slice(b"\\N"),
        Value::Boolean(b) => out.push(if *b { b't' } else { b'f' }),
        Value::Int16(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Int32(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Int64(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) | Value::Enum(s) => escape_copy(out, s),
        other => {
            scratch.clear();
            render_text(scratch, other)?;
            escape_copy(out, scratch);
        }
    }
    Ok(())
}

fn escape_copy(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|b| matches!(b, b'\\' | b'\n' | b'\r' | b'\t')) {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.push(b),
        }
    }
}

/// PostgreSQL's text input form of a (non-null) value.
fn render_text(out: &mut String, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => return Err("null is not a text value".into()),
        Value::Boolean(b) => out.push_str(if *b { "t" } else { "f" }),
        Value::Int16(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Int32(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Int64(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Float32(v) => render_float(out, f64::from(*v), v.to_string()),
        Value::Float64(v) => render_float(out, *v, v.to_string()),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) | Value::Enum(s) => out.push_str(s),
        Value::Uuid(u) => {
            let _ = write!(out, "{}", u.hyphenated());
        }
        Value::Bytes(b) | Value::Geometry(b) => {
            out.push_str("\\x");
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
        }
        Value::Date(days) => render_date(out, i64::from(*days)),
        Value::Time(micros) => render_time(out, *micros),
        Value::Timestamp(micros) => render_timestamp(out, *micros, false),
        Value::TimestampTz(micros) => render_timestamp(out, *micros, true),
        Value::Interval { months, days, micros } => {
            let hours = micros / 3_600_000_000;
            let rest = micros % 3_600_000_000;
            let sign = if rest < 0 { "-" } else { "" };
            let rest = rest.unsigned_abs();
            let _ = write!(
                out,
                "{months} mons {days} days {hours} hours {sign}{}.{:06} secs",
                rest / 1_000_000,
                rest % 1_000_000
            );
        }
        Value::Array(items) => {
            out.push('{');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                match item {
                    Value::Null => out.push_str("NULL"),
                    Value::Array(_) => render_text(out, item)?,
                    other => {
                        let mut inner = String::new();
                        render_text(&mut inner, other)?;
                        out.push('"');
                        for ch in inner.chars() {
                            if ch == '"' || ch == '\\' {
                                out.push('\\');
                            }
                            out.push(ch);
                        }
                        out.push('"');
                    }
                }
            }
            out.push('}');
        }
        Value::Unchanged => {
            return Err("an unchanged (TOAST) value reached the sink; the source must resolve it".into())
        }
    }
    Ok(())
}

fn render_float(out: &mut String, v: f64, shortest: String) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&shortest);
    }
}

/// Days since 1970-01-01 to `(year, month, day)` in the proleptic Gregorian
/// calendar (Howard Hinnant's algorithm; year 0 is 1 BC).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Appends `v` with at least `width` digits, zero-padded (`format!`'s
/// `{:0width$}` costs several times more, on every timestamp of a snapshot).
fn push_digits(out: &mut String, v: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(v);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

/// `YYYY-MM-DD` (year at least 4 digits); `true` when the date is BC.
fn render_ymd(out: &mut String, days: i64) -> bool {
    let (y, m, d) = civil_from_days(days);
    let bc = y <= 0;
    push_digits(out, (if bc { 1 - y } else { y }).unsigned_abs(), 4);
    out.push('-');
    push_digits(out, u64::from(m), 2);
    out.push('-');
    push_digits(out, u64::from(d), 2);
    bc
}

fn render_date(out: &mut String, days: i64) {
    if render_ymd(out, days) {
        out.push_str(" BC");
    }
}

fn render_time_of_day(out: &mut String, micros: i64) {
    let micros = micros.unsigned_abs();
    let secs = micros / 1_000_000;
    push_digits(out, secs / 3600, 2);
    out.push(':');
    push_digits(out, (secs / 60) % 60, 2);
    out.push(':');
    push_digits(out, secs % 60, 2);
    out.push('.');
    push_digits(out, micros % 1_000_000, 6);
}

fn render_time(out: &mut String, micros: i64) {
    // time allows 24:00:00 exactly; anything else is taken modulo a day.
    let micros = if micros == 86_400_000_000 {
        micros
    } else {
        micros.rem_euclid(86_400_000_000)
    };
    render_time_of_day(out, micros);
}

fn render_timestamp(out: &mut String, micros: i64, utc: bool) {
    let days = micros.div_euclid(86_400_000_000);
    let tod = micros.rem_euclid(86_400_000_000);
    let bc = render_ymd(out, days);
    out.push(' ');
    render_time_of_day(out, tod);
    if utc {
        out.push_str("+00");
    }
    if bc {
        out.push_str(" BC");
    }
}

// ---------------------------------------------------------------- errors

/// Context for classifying an error: who we are and what we touched.
#[derive(Debug, Clone)]
struct Ctx {
    user: String,
    database: String,
    table: Option<String>,
}

impl Ctx {
    fn in_table(mut self, table: String) -> Self {
        self.table = Some(table);
        self
    }
}

trait HintIfNone {
    fn with_hint_if_none(self, hint: String) -> Self;
}

impl HintIfNone for Error {
    fn with_hint_if_none(self, hint: String) -> Self {
        if self.hint().is_some() {
            self
        } else {
            self.with_hint(hint)
        }
    }
}

fn connect_hint() -> String {
    "check that the destination is running and that postgres.url points at it".to_string()
}

/// The one place that maps a PostgreSQL failure to an [`ErrorKind`].
///
/// * connection failures (class 08, no SQLSTATE at all), serialization
///   failures and deadlocks (40001, 40P01), lock timeouts (55P03), admin
///   shutdown / cannot connect now (57P01-57P03), a read-only transaction
///   during a failover (25006), too many connections, out of memory,
///   a cancelled statement, a table or column dropped by hand (the sink
///   recreates it on the retry): **retryable**;
/// * missing privileges (42501), authentication (class 28), a full disk
///   (53100), a missing database: **needs an operator**, with a hint;
/// * data exceptions (class 22), constraint violations (class 23), datatype
///   mismatch (42804): **permanent** for the record;
/// * anything else needs an operator: pausing is safer than dead-lettering
///   data over an error nobody has seen before.
fn classify(err: &tokio_postgres::Error, ctx: &Ctx) -> Error {
    let Some(db) = err.as_db_error() else {
        return Error::new(
            super::client_error_kind(err),
            format!("connection to the destination failed: {}", redacted(err)),
        )
        .with_class("postgres.connection");
    };
    let code = db.code().code();
    let class = format!("postgres.sqlstate.{code}");
    let data_error = code.starts_with("22") || code.starts_with("23") || *db.code() == SqlState::DATATYPE_MISMATCH;
    let mut message = format!("{} (SQLSTATE {code})", redact_message(db.message(), data_error));
    if let Some(c) = db.constraint() {
        let _ = write!(message, ", constraint {c}");
    }
    let column = db.column().map(str::to_string).or_else(|| db.where_().and_then(copy_column));
    let kind = if code.starts_with("08")
        || matches!(
            code,
            "40001"
                | "40P01"
                | "55P03"
                | "57P01"
                | "57P02"
                | "57P03"
                | "25006"
                | "53300"
                | "53200"
                | "57014"
                | "42P01"
                | "42703"
        ) {
        ErrorKind::Retryable
    } else if code == "42501" || code.starts_with("28") || code == "53100" || code == "3D000" || code == "3F000" {
        ErrorKind::NeedsOperator
    } else if data_error {
        ErrorKind::Permanent
    } else {
        ErrorKind::NeedsOperator
    };
    let mut e = Error::new(kind, message).with_class(class);
    if let Some(c) = column {
        e = e.with_column(c);
    }
    let table = ctx.table.clone().unwrap_or_else(|| "<schema>.<table>".to_string());
    let user = quote_ident(&ctx.user);
    match code {
        "42501" => {
            let schema = table.split('.').next().unwrap_or("public").to_string();
            e = e.with_hint(format!(
                "GRANT USAGE, CREATE ON SCHEMA {} TO {user}; GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON {table} TO {user}",
                quote_ident(&schema)
            ));
        }
        c if c.starts_with("28") => {
            e = e.with_hint("check the user and password in postgres.url (and pg_hba.conf on the server)".to_string());
        }
        "53100" => e = e.with_hint("free disk space on the destination server".to_string()),
        "3D000" => {
            e = e.with_hint(format!("CREATE DATABASE {} OWNER {user}", quote_ident(&ctx.database)));
        }
        _ => {}
    }
    e
}

/// `COPY stage, line 3, column qty: "abc"` -> `qty`.
fn copy_column(where_: &str) -> Option<String> {
    let start = where_.find(", column ")? + ", column ".len();
    let rest = &where_[start..];
    let end = rest.find(':').unwrap_or(rest.len());
    let c = rest[..end].trim();
    (!c.is_empty()).then(|| c.to_string())
}

/// PostgreSQL's message, with quoted text (which may be a row value)
/// replaced for data errors.
fn redact_message(message: &str, data_error: bool) -> String {
    if !data_error {
        return message.to_string();
    }
    let mut out = String::with_capacity(message.len());
    let mut in_quote = false;
    for ch in message.chars() {
        if ch == '"' {
            if in_quote {
                out.push_str("…\"");
            } else {
                out.push('"');
            }
            in_quote = !in_quote;
        } else if !in_quote {
            out.push(ch);
        }
    }
    // `value too long for type character varying(3)` keeps its type; an
    // unquoted trailing `: <value>` is cut.
    if let Some(i) = out.find(": ") {
        out.truncate(i);
    }
    out
}

/// The value behind `mutex`; a panic elsewhere while it was held leaves
/// it usable (it holds only text and prepared statements).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A tokio-postgres error without anything a server might echo of our data.
fn redacted(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", redact_message(db.message(), true), db.code().code()),
        None => {
            let mut s = err.to_string();
            let mut source = std::error::Error::source(err);
            while let Some(inner) = source {
                let _ = write!(s, ": {inner}");
                source = inner.source();
            }
            s
        }
    }
}

/// Quotes an identifier for SQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal for SQL (with `standard_conforming_strings` on,
/// which the sink sets for its sessions).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(v: &Value) -> String {
        let mut out = Vec::new();
        render_copy(&mut out, &mut String::new(), v).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_values_as_copy_text() {
        assert_eq!(copy(&Value::Null), "\\N");
        assert_eq!(copy(&Value::Text("a\tb\nc\\d".into())), "a\\tb\\nc\\\\d");
        assert_eq!(copy(&Value::Bytes(vec![0, 255])), "\\\\x00ff");
        assert_eq!(copy(&Value::Date(0)), "1970-01-01");
        assert_eq!(copy(&Value::Date(-719_163)), "0001-12-31 BC");
        assert_eq!(copy(&Value::Date(19_723)), "2024-01-01");
        assert_eq!(copy(&Value::Timestamp(-1)), "1969-12-31 23:59:59.999999");
        assert_eq!(copy(&Value::TimestampTz(1_000_000)), "1970-01-01 00:00:01.000000+00");
        assert_eq!(copy(&Value::Time(3_723_000_001)), "01:02:03.000001");
        assert_eq!(copy(&Value::Float64(f64::NAN)), "NaN");
        assert_eq!(copy(&Value::Float64(-f64::INFINITY)), "-Infinity");
        assert_eq!(copy(&Value::Float64(0.1)), "0.1");
        assert_eq!(
            copy(&Value::Interval { months: 14, days: -3, micros: -3_600_500_000 }),
            "14 mons -3 days -1 hours -0.500000 secs"
        );
        assert_eq!(
            copy(&Value::Array(vec![Value::Text("a\"b".into()), Value::Null, Value::Int32(3)])),
            "{\"a\\\\\"b\",NULL,\"3\"}"
        );
        assert!(render_copy(&mut Vec::new(), &mut String::new(), &Value::Unchanged).is_err());
    }

    #[test]
    fn parses_and_renders_types() {
        let t = PgType::parse("character varying(40)");
        assert_eq!(t.base, "character varying");
        assert_eq!(t.mods, vec![40]);
        assert_eq!(PgType::parse("varchar(40)"), t);
        assert_eq!(PgType::parse("timestamp(3) with time zone").render(), "timestamp(3) with time zone");
        assert_eq!(PgType::parse("int4[]").render(), "integer[]");
        assert_eq!(PgType::parse("numeric(12, 2)").render(), "numeric(12,2)");
    }

    #[test]
    fn widens_only_where_postgres_can() {
        let p = PgType::parse;
        assert_eq!(fit(&p("integer"), &p("bigint")), Fit::Widen(p("bigint")));
        assert_eq!(fit(&p("bigint"), &p("integer")), Fit::Keep);
        assert_eq!(fit(&p("varchar(10)"), &p("varchar(20)")), Fit::Widen(p("varchar(20)")));
        assert_eq!(fit(&p("varchar(20)"), &p("varchar(10)")), Fit::Keep);
        assert_eq!(fit(&p("varchar(20)"), &p("text")), Fit::Widen(p("text")));
        assert_eq!(fit(&p("numeric(10,2)"), &p("numeric(12,2)")), Fit::Widen(p("numeric(12,2)")));
        assert_eq!(fit(&p("numeric(10,2)"), &p("numeric(10,3)")), Fit::Widen(p("numeric(11,3)")));
        assert_eq!(fit(&p("numeric"), &p("numeric(10,3)")), Fit::Keep);
        assert_eq!(fit(&p("integer"), &p("numeric(12,2)")), Fit::Widen(p("numeric(12,2)")));
        assert_eq!(fit(&p("integer"), &p("text")), Fit::Incompatible);
        assert_eq!(fit(&p("text"), &p("integer")), Fit::Incompatible);
        assert_eq!(fit(&p("integer[]"), &p("integer")), Fit::Incompatible);
        assert_eq!(fit(&p("real"), &p("double precision")), Fit::Widen(p("double precision")));
        assert_eq!(fit(&p("timestamp(3)"), &p("timestamp")), Fit::Widen(p("timestamp")));
    }

    #[test]
    fn verbatim_types_only_for_builtin_postgres_types() {
        let col = |ty: &str, dt: DataType| Column {
            name: "c".into(),
            data_type: dt,
            nullable: true,
            source_type: ty.into(),
        };
        assert_eq!(destination_type(&col("varchar(40)", DataType::Text), true).render(), "character varying(40)");
        assert_eq!(destination_type(&col("varchar(40)", DataType::Text), false).render(), "text");
        assert_eq!(destination_type(&col("mood", DataType::Enum { symbols: vec![] }), true).render(), "text");
        assert_eq!(
            destination_type(&col("integer[]", DataType::Array(Box::new(DataType::Int32))), true).render(),
            "integer[]"
        );
    }

    #[test]
    fn redacts_values_from_data_errors() {
        assert_eq!(
            redact_message("invalid input syntax for type integer: \"abc\"", true),
            "invalid input syntax for type integer"
        );
        assert_eq!(
            redact_message("new row for relation \"t\" violates check constraint \"c\"", true),
            "new row for relation \"…\" violates check constraint \"…\""
        );
        assert_eq!(copy_column("COPY s, line 1, column qty: \"x\""), Some("qty".into()));
    }

    #[test]
    fn config_rules_name_the_field() {
        let mut c = PostgresSinkConfig::new("postgres://u:secret@h/db", "g");
        assert!(c.validate().is_ok());
        c.table = "fixed".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("postgres.table"), "{e}");
        c.table = "{schema}_{table}".into();
        assert_eq!(
            c.destination(&TableId::new("public", "orders")),
            DestinationTable {
                schema: "public".into(),
                table: "public_orders".into()
            }
        );
        assert!(!format!("{c:?}").contains("secret"));
    }
}
