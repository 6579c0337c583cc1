//! The Snowflake sink: keeps a copy of each source table in Snowflake, with
//! updates and deletes and exactly-once effect. A [`Warehouse`] of the core
//! (`crate::sink::warehouse`), which decides the order of everything; this
//! module says how Snowflake does each step.
//!
//! # How a batch is applied
//!
//! 1. The destination table is created or evolved for every schema version
//!    in the batch (`CREATE TABLE`, `ADD COLUMN` with the source's default,
//!    `DROP NOT NULL`, `SET DATA TYPE` to lengthen a VARCHAR or add NUMBER
//!    precision). Snowflake commits any open transaction at a DDL
//!    statement, so DDL runs first, on its own; every statement is
//!    idempotent (`IF NOT EXISTS`, relaxing twice), so a crash after it and
//!    a replay are harmless.
//! 2. The batch is reduced to the last change per key.
//! 3. The survivors are staged into a temporary table of the session,
//!    tagged with the write's id, every value as text: by array-bound
//!    `INSERT`s, or, above `stage_threshold_rows`, as one gzipped CSV file
//!    `PUT` to the session's temporary internal stage, uploaded, and loaded
//!    by `COPY INTO ... PURGE = TRUE` (which removes the file).
//! 4. One transaction: `BEGIN`; the group's writer lock (one transaction
//!    of the group at a time, [`dialect::lock_sql`]); the fence (the
//!    offsets read: a member that lost its partitions writes nothing); a
//!    truncate's guarded `DELETE`; per table, the deletes kept in the
//!    deleted-rows table, a `DELETE` of every stored row a change replaces
//!    and an `INSERT` of every upsert, both guarded by the row's stored
//!    source position so that a replay never moves a row backwards; the
//!    offsets rows replaced; `COMMIT`. Rows and offsets become visible
//!    together or not at all. No `MERGE`: see [`dialect`].
//! 5. The staged rows are deleted.
//!
//! Talks to Snowflake's HTTP protocol through a client of our own
//! ([`client`]): password or key-pair (JWT) login, and the upload of a
//! PUT's file to the presigned URL of a stage on Google Cloud Storage (what
//! Snowflake answers on GCP accounts, and fakesnow). On a stage elsewhere
//! (S3, Azure) large writes are staged by INSERTs too. Snowpipe Streaming
//! is not used: see `docs/destinations/snowflake.md`.
//!
//! # Errors
//!
//! [`client::classify`] maps Snowflake's error codes and SQLSTATEs (and
//! [`client::classify_http`] the HTTP statuses) to an error kind; nothing
//! else decides. A value Snowflake refuses fails the transaction without
//! naming its row: the core finds the record by bisection.

pub mod check;
pub mod client;
pub mod config;
pub mod dialect;
pub mod types;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use async_trait::async_trait;
use serde_json::{json, Value as Json};
use tracing::{debug, info, info_span, warn, Span};
use tributary_operations::config::{resolve_secret, ConfigError, Validate};
use tributary_schemas::{Position, Row, TableId, TableSchema};

pub use self::client::Rows;
use secrecy::ExposeSecret;

use self::client::{upload_url, Credentials, KeyError, KeyPair, SfClient, SESSION_CLASS};
pub use self::config::{DestinationTable, SnowflakeSinkConfig};
use self::dialect::{
    change_sql, copy_sql, deleted_keep_sql, deleted_table_ddl, forget_deleted_sql, forget_positions_sql,
    insert_rows_sql, internal_stage_sql, keyless_sql, lock_row_sql, lock_sql, locks_table_ddl, offsets_table_ddl,
    prune_deleted_sql, put_sql, quote_ident, quote_string, read_offsets_sql, read_range_sql, removed_before_sql,
    replaced_rows_sql, resets_table_ddl, staged_csv, staged_source, staging_insert_sql, staging_table_sql,
    truncate_older_sql, write_offsets_sql, SnowflakeDialect, QUOTING,
};
use self::types::{from_cell, from_metadata, staged_text, SfType};
use crate::error::{Error, ErrorKind, Result};
use crate::problem::Problem;
use crate::sink::bookkeeping::{
    fenced, keeps_removal, key_text, position_i64, reset_i64, staging_name, Fence, OffsetMove, DELETED_TABLE,
    OFFSETS_TABLE, RESETS_TABLE,
};
use crate::sink::keyless;
use crate::sink::reduce::{key_bytes, Reduction};
use crate::sink::schema::{plan, Evolution, ShapeColumn, TableShape, KEY_CHANGED_CLASS};
use crate::sink::script::{self, Script, Scripted};
use crate::sink::verify::KeyRange;
use crate::sink::warehouse::{Mode, Warehouse, WarehouseSink};
use crate::sink::{ApplyError, SinkBatch};

/// How long a transaction asks again for the group's writer lock when the
/// store answers a conflict instead of waiting (fakesnow; Snowflake waits
/// by itself): longer than a large batch's transaction on the emulator
/// (seconds), shorter than the runner's patience with a stuck table.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// First and longest pause between two asks (a small batch's transaction
/// on fakesnow takes 100-500 ms).
const LOCK_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(20);
const LOCK_RETRY_LONGEST: std::time::Duration = std::time::Duration::from_millis(500);
/// The bookkeeping table of the consumer groups' writer locks.
pub const LOCKS_TABLE: &str = "writer_locks";
/// Prefix of the temporary staging tables' names.
const STAGING_PREFIX: &str = "tributary_stage_";
/// The session's temporary internal stage (in the bookkeeping schema)
/// that large writes are uploaded to.
pub const INTERNAL_STAGE: &str = "tributary_upload";

/// Staged rows: text cells (NULL as `None`), the columns of
/// [`dialect::staging_table_sql`].
type StagedRows = Vec<Vec<Option<String>>>;

/// What the sink knows about one destination table.
#[derive(Debug, Clone, Default)]
struct TableState {
    shape: TableShape<SfType>,
    /// Fingerprints of the source schemas already reconciled with it.
    reconciled: HashSet<u64>,
}

/// The Snowflake [`Sink`](crate::Sink).
pub struct SnowflakeSink {
    config: SnowflakeSinkConfig,
    consumer_group: String,
    client: SfClient,
    /// Whether the session's bookkeeping schema and tables are known to exist.
    bookkeeping_ready: bool,
    /// Whether the resets table is known to exist.
    resets_ready: bool,
    tables: HashMap<DestinationTable, TableState>,
    /// Destination schemas known to exist.
    schemas: HashSet<String>,
    /// Temporary staging tables of the session.
    stages: HashSet<String>,
    /// Whether the session's internal stage is known to exist.
    internal_stage_ready: bool,
    /// Why large writes are staged by INSERTs (Snowflake's answer to a PUT
    /// named a place the sink does not upload to), once known.
    upload_refused: Option<String>,
    /// Files loaded through the internal stage.
    staged_files: u64,
    /// Statements committed (a cost proxy for the benchmark).
    statements: u64,
    /// The open attempt's statements, run as one transaction at its end.
    script: Script,
    /// Staging tables the open attempt wrote to.
    staged: Vec<String>,
}

impl std::fmt::Debug for SnowflakeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnowflakeSink")
            .field("config", &self.config)
            .field("connected", &self.client.is_open())
            .finish()
    }
}

impl SnowflakeSink {
    /// A sink for `config`; it logs in on first use, so that a destination
    /// that cannot be reached pauses the runner instead of failing its start.
    pub fn new(config: SnowflakeSinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("snowflake.consumer_group", "is required"))?;
        let credentials = match (&config.password, &config.private_key) {
            (_, Some(key)) => {
                let pem = resolve_secret("snowflake.private_key", key)?;
                let passphrase = match &config.private_key_passphrase {
                    Some(p) => Some(resolve_secret("snowflake.private_key_passphrase", p)?),
                    None => None,
                };
                let pair = KeyPair::from_pem(pem.expose_secret(), passphrase.as_ref().map(|p| p.expose_secret()));
                Credentials::KeyPair(pair.map_err(|e| match e {
                    KeyError::Key(rule) => ConfigError::invalid("snowflake.private_key", rule),
                    KeyError::Passphrase(rule) => ConfigError::invalid("snowflake.private_key_passphrase", rule),
                })?)
            }
            (Some(password), None) => Credentials::Password(resolve_secret("snowflake.password", password)?),
            (None, None) => return Err(ConfigError::invalid("snowflake.password", "is required")),
        };
        let client = SfClient::new(&config, credentials)
            .map_err(|e| ConfigError::invalid("snowflake.url", e.message().to_string()))?;
        Ok(Self {
            client,
            config,
            consumer_group,
            bookkeeping_ready: false,
            resets_ready: false,
            tables: HashMap::new(),
            schemas: HashSet::new(),
            stages: HashSet::new(),
            internal_stage_ready: false,
            upload_refused: None,
            staged_files: 0,
            statements: 0,
            script: Script::default(),
            staged: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SnowflakeSinkConfig {
        &self.config
    }

    /// Statements committed so far in batch transactions (the benchmark's
    /// statements per change).
    pub fn statements(&self) -> u64 {
        self.statements
    }

    /// Files loaded through the internal stage so far (writes above
    /// `stage_threshold_rows`).
    pub fn staged_files(&self) -> u64 {
        self.staged_files
    }

    /// The quoted name of the session's internal stage.
    pub fn internal_stage(&self) -> String {
        self.bookkeeping(INTERNAL_STAGE)
    }

    fn bookkeeping(&self, table: &str) -> String {
        format!(
            "{}.{}.{}",
            quote_ident(&self.config.database),
            quote_ident(&self.config.bookkeeping_schema),
            quote_ident(table)
        )
    }

    fn locks_table(&self) -> String {
        self.bookkeeping(LOCKS_TABLE)
    }

    fn offsets_table(&self) -> String {
        self.bookkeeping(OFFSETS_TABLE)
    }

    fn deleted_table(&self) -> String {
        self.bookkeeping(DELETED_TABLE)
    }

    fn resets_table(&self) -> String {
        self.bookkeeping(RESETS_TABLE)
    }

    /// Logs in (if no session is open) and makes sure the bookkeeping
    /// schema, the session's schema (where its temporary tables live) and
    /// the bookkeeping tables exist.
    pub async fn connect(&mut self) -> Result<()> {
        if !self.client.is_open() {
            self.client.login().await?;
            self.bookkeeping_ready = false;
            self.stages.clear();
            self.internal_stage_ready = false;
            info!(database = %self.config.database, "Snowflake session open");
        }
        if !self.bookkeeping_ready {
            let hint = |e: Error| {
                if e.kind() == ErrorKind::NeedsOperator {
                    e.with_hint(
                        "GRANT USAGE ON DATABASE ... and CREATE SCHEMA ON DATABASE ... (or OWNERSHIP of the bookkeeping \
                         schema) TO ROLE ... (see docs/destinations/snowflake.md)",
                    )
                } else {
                    e
                }
            };
            let schema =
                format!("{}.{}", quote_ident(&self.config.database), quote_ident(&self.config.bookkeeping_schema));
            self.client
                .query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await
                .map_err(hint)?;
            self.client.query(&format!("USE SCHEMA {schema}")).await.map_err(hint)?;
            self.client
                .query(&offsets_table_ddl(&self.offsets_table()))
                .await
                .map_err(hint)?;
            self.client
                .query(&deleted_table_ddl(&self.deleted_table()))
                .await
                .map_err(hint)?;
            self.client.query(&locks_table_ddl(&self.locks_table())).await.map_err(hint)?;
            self.client
                .query(&lock_row_sql(&self.locks_table(), &self.consumer_group))
                .await
                .map_err(hint)?;
            self.bookkeeping_ready = true;
        }
        Ok(())
    }

    /// Forgets the session and everything cached.
    fn reset(&mut self) {
        self.client.reset();
        self.bookkeeping_ready = false;
        self.resets_ready = false;
        self.tables.clear();
        self.schemas.clear();
        self.stages.clear();
        self.internal_stage_ready = false;
    }

    /// Removes this copy from Snowflake: its stored offsets and, when
    /// `drop` lists them, the destination tables of those source tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let sql = format!(
            "DELETE FROM {} WHERE consumer_group = {}",
            self.offsets_table(),
            quote_string(&self.consumer_group)
        );
        self.client.query(&sql).await?;
        let sql =
            format!("DELETE FROM {} WHERE consumer_group = {}", self.locks_table(), quote_string(&self.consumer_group));
        self.client.query(&sql).await?;
        let mut done = vec![format!("stored offsets of consumer group {}", self.consumer_group)];
        for source in drop {
            let dest = self.config.destination(source);
            self.client.query(&format!("DROP TABLE IF EXISTS {}", dest.quoted())).await?;
            self.client.query(&forget_deleted_sql(&self.deleted_table(), &dest)).await?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    /// Runs one statement in the sink's session (logging in first) and
    /// returns its rows as text: for the setup check, tools and tests.
    pub async fn query(&mut self, sql: &str) -> Result<Rows> {
        let result = self.probe_query(sql).await;
        result.map_err(|e| self.failed(e))
    }

    /// Runs a statement for the setup check (logging in first).
    pub(super) async fn probe_query(&mut self, sql: &str) -> Result<Rows> {
        self.connect().await?;
        self.client.query(sql).await
    }

    /// The stored offsets of the consumer group.
    /// A destination table made for a keyed source table whose source has
    /// no key now, or the reverse (`changed`, see
    /// [`crate::sink::schema::key_changed`]): dropped, to be made anew,
    /// when none of its rows is current (a reset forgot every position: the
    /// source copies the table again after such a change); else `changed`
    /// stands. DDL commits the unit's statements so far (see
    /// [`script::commit_before_ddl`]); a trial makes nothing anew.
    async fn make_anew(&mut self, dest: &DestinationTable, changed: Error) -> Result<()> {
        // The unit's statements so far first: its reset forgets the rows'
        // positions.
        if !script::commit_before_ddl(self).await? {
            return Err(changed);
        }
        let rows = self.client.query(&keyless::current_rows_sql(QUOTING, &dest.quoted())).await?;
        let current = rows
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .and_then(|n| n.parse::<i64>().ok())
            .is_none_or(|n| n > 0);
        if current {
            return Err(changed);
        }
        info!(table = %dest, reason = %changed, "making the destination table anew: its source table gained or lost its key");
        self.client.query(&format!("DROP TABLE IF EXISTS {}", dest.quoted())).await?;
        self.client.query(&forget_deleted_sql(&self.deleted_table(), dest)).await?;
        self.tables.remove(dest);
        Ok(())
    }

    async fn stored_offsets(&mut self) -> Result<HashMap<(String, i32), i64>> {
        let rows = self
            .client
            .query(&read_offsets_sql(&self.offsets_table(), &self.consumer_group))
            .await?;
        let mut stored = HashMap::new();
        for row in rows {
            let cell = |i: usize| row.get(i).cloned().flatten();
            let bad = || Error::retryable("unreadable offsets row");
            let topic = cell(0).ok_or_else(bad)?;
            let partition = cell(1).and_then(|p| p.parse::<i32>().ok()).ok_or_else(bad)?;
            let next = cell(2).and_then(|n| n.parse::<i64>().ok()).ok_or_else(bad)?;
            stored.insert((topic, partition), next);
        }
        Ok(stored)
    }

    /// `BEGIN` and the group's writer lock ([`lock_sql`]), its first
    /// statement. Snowflake's UPDATE waits for the lock; a store that
    /// answers a lock conflict at once with an error instead (fakesnow:
    /// DuckDB's "Conflict on update", HTTP 500) gets the lock asked for
    /// again, in a new transaction, for up to [`LOCK_WAIT`]: the wait
    /// Snowflake would do. Without it a long batch lost to the other
    /// member's short ones again and again (a bisection, each probe a
    /// transaction of its own, backed off to 30 s between attempts).
    async fn begin_locked(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let mut wait = LOCK_RETRY_FIRST;
        loop {
            self.client.query("BEGIN").await?;
            let error = match self.client.query(&lock_sql(&self.locks_table(), &self.consumer_group)).await {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let conflict = error.kind() == ErrorKind::Retryable
                && ![SESSION_CLASS, "snowflake.network", "snowflake.timeout"].contains(&error.class().as_str());
            if !conflict || started.elapsed() >= LOCK_WAIT || self.client.query("ROLLBACK").await.is_err() {
                return Err(error);
            }
            // Jittered, so that two members do not ask in step.
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            let jitter = std::time::Duration::from_millis(u64::from(now.map_or(0, |d| d.subsec_nanos()) % 50));
            tokio::time::sleep(wait + jitter).await;
            wait = (wait * 2).min(LOCK_RETRY_LONGEST);
        }
    }

    async fn in_transaction(&mut self, offsets: &[OffsetMove<'_>], commit: bool) -> Result<()> {
        // The group's writer lock is taken (`begin_locked`); first a member
        // that lost its partitions writes nothing.
        if offsets.iter().any(|m| m.fence != Fence::Unchecked) {
            let stored = self.stored_offsets().await?;
            for m in offsets {
                let have = stored.get(&(m.topic.to_string(), m.partition)).copied();
                let holds = match m.fence {
                    Fence::Unchecked => true,
                    Fence::Absent => have.is_none(),
                    Fence::At(at) => have == Some(at),
                };
                if !holds {
                    return Err(fenced(&format!(
                        "{}[{}] is at {}, expected {:?}",
                        m.topic,
                        m.partition,
                        have.map_or_else(|| "nothing".to_string(), |h| h.to_string()),
                        m.fence
                    )));
                }
            }
        }
        if self.script.prune_due(commit) {
            let sql = prune_deleted_sql(&self.deleted_table(), self.config.deleted_rows_retention_hours);
            self.client.query(&sql).await?;
        }
        let script = self.script.statements().to_vec();
        for sql in &script {
            self.client.query(sql).await?;
        }
        if !offsets.is_empty() {
            for sql in write_offsets_sql(&self.offsets_table(), &self.consumer_group, offsets) {
                self.client.query(&sql).await?;
            }
        }
        self.client.query(if commit { "COMMIT" } else { "ROLLBACK" }).await?;
        if commit {
            self.statements += script.len() as u64;
        }
        Ok(())
    }

    /// Reads a table's columns from information_schema.
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let sql = format!(
            "SELECT column_name, data_type, numeric_precision, numeric_scale, character_maximum_length, is_nullable \
             FROM {}.information_schema.columns WHERE table_schema = {} AND table_name = {} ORDER BY ordinal_position",
            quote_ident(&dest.database),
            quote_string(&dest.schema),
            quote_string(&dest.table)
        );
        let mut state = TableState::default();
        for row in self.client.query(&sql).await? {
            let cell = |i: usize| row.get(i).cloned().flatten();
            let number = |i: usize| cell(i).and_then(|v| v.parse::<u32>().ok());
            let name = cell(0).unwrap_or_default();
            let type_name = cell(1).unwrap_or_default();
            let ty = from_metadata(&type_name, number(2), number(3), number(4)).ok_or_else(|| {
                Error::needs_operator(format!(
                    "column {name} of {dest} has type {type_name}, which the sink does not write"
                ))
                .with_column(name.clone())
            })?;
            state.shape.exists = true;
            state.shape.columns.push(ShapeColumn {
                name,
                ty,
                not_null: cell(5).as_deref() == Some("NO"),
            });
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    /// Stages the rows of `changes` for `dest` into the session's temporary
    /// table of the column set, under the write id `batch` (array-bound
    /// INSERTs, or above `stage_threshold_rows` the internal stage);
    /// returns the staging table.
    async fn stage(
        &mut self,
        dest: &DestinationTable,
        changes: &Reduction<'_>,
        names: &[&str],
        batch: &str,
    ) -> Result<String, ApplyError> {
        let stage = staging_name(STAGING_PREFIX, dest, &names);
        if !self.stages.contains(&stage) {
            self.client.query(&staging_table_sql(&stage, names)).await?;
            self.stages.insert(stage.clone());
        }
        self.staged.push(stage.clone());
        let rows = staged_rows(changes, names, batch)?;
        let threshold = self.config.stage_threshold_rows;
        if threshold > 0
            && rows.len() > threshold
            && self.upload_refused.is_none()
            && self.load_through_stage(&stage, &rows, batch).await?
        {
            debug!(table = %dest, rows = rows.len(), "staged through the internal stage");
            return Ok(stage);
        }
        // Column-wise: one bound array per staging column.
        let insert = staging_insert_sql(&stage, names);
        for chunk in rows.chunks(self.config.insert_chunk_rows) {
            let mut bindings = serde_json::Map::new();
            for n in 0..names.len() + 6 {
                let ty = match n.checked_sub(names.len()) {
                    Some(0) => "BOOLEAN",
                    Some(2 | 3) => "FIXED",
                    _ => "TEXT",
                };
                let values: Vec<Json> = chunk.iter().map(|r| r[n].clone().map_or(Json::Null, Json::String)).collect();
                bindings.insert((n + 1).to_string(), json!({"type": ty, "value": values}));
            }
            self.client.query_bound(&insert, Json::Object(bindings)).await?;
        }
        debug!(table = %dest, rows = rows.len(), "staged");
        Ok(stage)
    }

    /// Loads `rows` into the staging table `table` through the session's
    /// internal stage: `PUT` (Snowflake answers where the file goes), the
    /// upload, `COPY INTO` (which removes the file). `false`, having done
    /// nothing, when the PUT's answer is a place the sink does not upload
    /// to: this and every later write is staged by INSERTs.
    async fn load_through_stage(&mut self, table: &str, rows: &[Vec<Option<String>>], batch: &str) -> Result<bool> {
        let stage = self.internal_stage();
        if !self.internal_stage_ready {
            self.client.query(&internal_stage_sql(&stage)).await?;
            self.internal_stage_ready = true;
        }
        // Named by the write: a file is never loaded twice (Snowflake skips
        // a file it loaded before, by name, for 64 days).
        let file = format!("{batch}.csv.gz");
        let answer = self.client.put(&put_sql(&stage, &file)).await?;
        let url = match upload_url(&answer) {
            Ok(url) => url,
            Err(reason) => {
                warn!(%reason, "writes above snowflake.stage_threshold_rows are staged by INSERTs");
                self.upload_refused = Some(reason);
                return Ok(false);
            }
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let body = std::io::Write::write_all(&mut gz, &staged_csv(rows))
            .and_then(|()| gz.finish())
            .map_err(|e| Error::retryable(format!("cannot compress a staged file: {e}")))?;
        self.client.upload(&url, body).await?;
        let loaded = self.client.query(&copy_sql(table, &stage, &file)).await?;
        // COPY's result: file, status, rows_parsed, rows_loaded, ...
        let cell = |i: usize| loaded.first().and_then(|r| r.get(i)).cloned().flatten();
        let (status, count) = (cell(1), cell(3).and_then(|n| n.parse::<usize>().ok()));
        if status.as_deref() != Some("LOADED") || count != Some(rows.len()) {
            return Err(Error::retryable(format!(
                "COPY INTO loaded {count:?} of {} staged rows (status {status:?})",
                rows.len()
            ))
            .with_class("snowflake.copy"));
        }
        self.staged_files += 1;
        Ok(true)
    }
}

#[async_trait]
impl Scripted for SnowflakeSink {
    fn script(&mut self) -> &mut Script {
        &mut self.script
    }

    /// `BEGIN` with the writer lock, the fence, the statements and, when
    /// there are some, the offsets, then `COMMIT` or `ROLLBACK`.
    async fn run_transaction(&mut self, offsets: &[OffsetMove<'_>], commit: bool) -> Result<()> {
        let result = match self.begin_locked().await {
            Ok(()) => self.in_transaction(offsets, commit).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            // Nothing of the batch stays; a session that cannot even roll
            // back is dropped (Snowflake aborts its transaction with it).
            if self.client.query("ROLLBACK").await.is_err() {
                self.client.reset();
            }
        }
        result
    }

    /// Deletes the staged rows of the attempt, whatever happened to it
    /// (each write reads only its own rows: what a failure leaves is never
    /// read again, and goes with the session).
    async fn clean_staging(&mut self) {
        for stage in std::mem::take(&mut self.staged) {
            if let Err(e) = self.client.query(&format!("DELETE FROM {}", quote_ident(&stage))).await {
                debug!(staging = %stage, error = %e, "staged rows left in place");
            }
        }
    }
}

/// The staged rows of `changes` for the column set `names`: the values as
/// text, then the delete flag, key, position and write id `batch`.
fn staged_rows(changes: &Reduction<'_>, names: &[&str], batch: &str) -> Result<StagedRows, ApplyError> {
    let mut rows = Vec::new();
    for (group, line) in changes.live() {
        let mut cells = Vec::with_capacity(names.len() + 6);
        for name in names {
            let at = group.schema.columns.iter().position(|c| c.name == *name);
            // A column this row's version lacks: what the source gave it.
            let absent = match at {
                None if !line.delete => changes.absent_value(group, name),
                _ => None,
            };
            let value = match at {
                Some(i) if group.writes(line, i) => Some(&line.row[i]),
                Some(_) => None,
                None => absent.as_ref(),
            };
            let cell = match value {
                Some(value) => staged_text(value).map_err(|reason| ApplyError {
                    error: Error::permanent(format!("column {name}: {reason} (value type {})", value.kind()))
                        .with_column((*name).to_string())
                        .with_class("tributary.value")
                        .with_table(group.schema.id.clone()),
                    record: Some(line.record),
                })?,
                None => None,
            };
            cells.push(cell);
        }
        // A keyless table's row: its content key and name.
        let (key, row) = match &line.instance {
            Some(instance) => (instance.content.clone(), Some(instance.row.clone())),
            None => {
                let key = key_bytes(&group.schema, line.row, &group.key).map_err(|error| ApplyError {
                    error: error.with_table(group.schema.id.clone()),
                    record: Some(line.record),
                })?;
                (key_text(&key), None)
            }
        };
        cells.extend([
            Some(line.delete.to_string()),
            Some(key),
            Some(line.commit.to_string()),
            Some(line.index.to_string()),
            row,
            Some(batch.to_string()),
        ]);
        rows.push(cells);
    }
    Ok(rows)
}

#[async_trait]
impl Warehouse for SnowflakeSink {
    type Table = DestinationTable;

    fn destination(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    fn drops_tables(&self) -> bool {
        self.config.drop_tables
    }

    fn evolution(&self) -> Evolution {
        Evolution { drop_columns: self.config.drop_columns }
    }

    async fn connect(&mut self) -> Result<()> {
        SnowflakeSink::connect(self).await
    }

    async fn begin(&mut self, mode: Mode) -> Result<()> {
        script::begin(self, mode)
    }

    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()> {
        script::finish(self, offsets).await
    }

    async fn abort(&mut self) {
        script::abort(self).await;
    }

    /// Forgets cached state after an error that is not about the data, and
    /// the session with it: the retry starts from a new session (no
    /// transaction of the failed attempt can be left open in it) and from
    /// Snowflake's own view of the tables.
    fn failed(&mut self, error: Error) -> Error {
        if error.kind() != ErrorKind::Permanent || error.class() == SESSION_CLASS {
            self.reset();
        }
        error
    }

    async fn schema_differences(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        origin: &str,
    ) -> Result<Option<Vec<String>>> {
        self.load_table(dest).await?;
        let shape = self.tables.get(dest).map(|s| s.shape.clone()).unwrap_or_default();
        let declare = self.config.declare_primary_key;
        let name = dest.to_string();
        crate::sink::schema::differences(&SnowflakeDialect, &name, schema, origin, &shape, self.evolution(), |c| {
            change_sql(dest, c, declare)
        })
        .map(Some)
    }

    /// Makes the destination table fit `schema`: creates it, adds columns,
    /// widens types, relaxes NOT NULL.
    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<()> {
        let fingerprint = {
            let mut h = DefaultHasher::new();
            schema.hash(&mut h);
            h.finish()
        };
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let mut state = self.tables.get(dest).cloned().unwrap_or_default();
        let changes = match plan(&SnowflakeDialect, &dest.to_string(), schema, origin, &state.shape, self.evolution()) {
            Err(e) if e.class() == KEY_CHANGED_CLASS => {
                self.make_anew(dest, e).await?;
                state = TableState::default();
                plan(&SnowflakeDialect, &dest.to_string(), schema, origin, &state.shape, self.evolution())?
            }
            other => other?,
        };
        if !state.shape.exists && !self.schemas.contains(&dest.schema) {
            let sql =
                format!("CREATE SCHEMA IF NOT EXISTS {}.{}", quote_ident(&dest.database), quote_ident(&dest.schema));
            self.client.query(&sql).await?;
            self.schemas.insert(dest.schema.clone());
        }
        for change in &changes {
            for statement in change_sql(dest, change, self.config.declare_primary_key) {
                info!(table = %dest, ddl = %statement, "changing destination table");
                self.client.query(&statement).await?;
            }
        }
        state.shape.apply(&changes);
        state.reconciled.insert(fingerprint);
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        // DDL commits any open transaction (`script::commit_before_ddl`).
        if script::commit_before_ddl(self).await? {
            self.client.query(&format!("DROP TABLE IF EXISTS {}", dest.quoted())).await?;
            self.client.query(&forget_deleted_sql(&self.deleted_table(), dest)).await?;
            self.tables.remove(dest);
            info!(table = %dest, "dropped destination table (the source table was dropped)");
        }
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let (commit, index) = position_i64(at)?;
        self.script.push(truncate_older_sql(dest, commit, index));
        if keeps_removal(at) {
            self.script
                .extend(removed_before_sql(&self.deleted_table(), dest, commit, index));
        }
        Ok(())
    }

    async fn forget_positions(&mut self, dest: &DestinationTable, reset: u64) -> Result<()> {
        let reset = reset_i64(reset)?;
        if !self.resets_ready {
            // DDL cannot run inside the batch's transaction; made once,
            // idempotent, and harmless if the batch then fails.
            self.client.query(&resets_table_ddl(&self.resets_table())).await?;
            self.resets_ready = true;
        }
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        let exists = self.tables.get(dest).is_some_and(|s| s.shape.exists);
        let statements = forget_positions_sql(dest, exists, &self.resets_table(), &self.deleted_table(), reset);
        self.script.extend(statements);
        Ok(())
    }

    async fn write(
        &mut self,
        dest: &DestinationTable,
        changes: &Reduction<'_>,
        _after_load: bool,
    ) -> Result<(), ApplyError> {
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        // The destination's columns that some schema of the batch has.
        let columns: Vec<ShapeColumn<SfType>> = changes
            .column_names()
            .into_iter()
            .filter_map(|n| state.shape.column(n).cloned())
            .collect();
        if changes.is_keyless() {
            let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let batch = uuid::Uuid::new_v4().simple().to_string();
            let stage = self.stage(dest, changes, &names, &batch).await?;
            let source = staged_source(&stage, &batch);
            let statements = keyless_sql(&self.deleted_table(), dest, &source, &columns, changes.parts());
            self.script.extend(statements);
            return Ok(());
        }
        let key_names: Vec<String> = changes.groups.first().map(|g| g.schema.key.clone()).unwrap_or_default();
        let key: Vec<ShapeColumn<SfType>> = key_names.iter().filter_map(|k| state.shape.column(k).cloned()).collect();
        if key.len() != key_names.len() || key.is_empty() {
            return Err(Error::needs_operator(format!("{dest} lacks a key column of the source table")).into());
        }
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let batch = uuid::Uuid::new_v4().simple().to_string();
        let stage = self.stage(dest, changes, &names, &batch).await?;
        let source = staged_source(&stage, &batch);
        let deleted = self.deleted_table();
        if changes.groups.iter().any(|g| g.deletes > 0) {
            self.script.extend(deleted_keep_sql(&deleted, dest, &source));
        }
        let live = QUOTING.not_deleted_sql(&deleted, dest, &source);
        self.script.push(replaced_rows_sql(dest, &live, &key));
        if changes.groups.iter().any(|g| g.upserts > 0) {
            self.script.push(insert_rows_sql(dest, &live, &columns, &key));
            self.script.push(QUOTING.undeleted_sql(&deleted, dest, &source));
        }
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<()> {
        script::savepoint(self)
    }

    /// A probe's statements run now, in a transaction rolled back, so that
    /// Snowflake itself tries every value.
    async fn verify(&mut self) -> Result<(), ApplyError> {
        script::verify(self).await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        script::abort(self).await;
        Ok(())
    }

    /// One query per range, in the session outside any transaction (a
    /// unit's statements run at its end, so none is open here).
    async fn read_range(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
    ) -> Result<Option<Vec<Row>>> {
        let Some(types) = self.column_types(dest, schema).await? else {
            return Ok(Some(Vec::new()));
        };
        let sql = read_range_sql(dest, schema, &types, range)
            .map_err(|e| Error::permanent(e).with_table(schema.id.clone()))?;
        let rows = self.client.query_all(&sql).await?;
        debug!(table = %dest, rows = rows.len(), "read a range back");
        rows_read_back(schema, &types, rows).map(Some)
    }
}

impl SnowflakeSink {
    /// The destination types of `schema`'s columns in `dest` (read again
    /// once when one is not cached: the table may have changed since),
    /// `None` when the table does not exist.
    async fn column_types(&mut self, dest: &DestinationTable, schema: &TableSchema) -> Result<Option<Vec<SfType>>> {
        for fresh in [false, true] {
            if fresh || !self.tables.contains_key(dest) {
                self.load_table(dest).await?;
            }
            let Some(state) = self.tables.get(dest).filter(|s| s.shape.exists) else {
                return Ok(None);
            };
            let types: Option<Vec<SfType>> = schema
                .columns
                .iter()
                .map(|c| state.shape.column(&c.name).map(|s| s.ty.clone()))
                .collect();
            if let Some(types) = types {
                return Ok(Some(types));
            }
        }
        let missing = schema
            .columns
            .iter()
            .find(|c| self.tables.get(dest).is_some_and(|s| s.shape.column(&c.name).is_none()))
            .map_or_else(String::new, |c| c.name.clone());
        Err(Error::permanent(format!("the column is not in {dest}"))
            .with_column(missing)
            .with_table(schema.id.clone()))
    }
}

/// The rows of a range's query as the values of `schema`'s columns, each
/// kept as `types` says.
fn rows_read_back(schema: &TableSchema, types: &[SfType], rows: Rows) -> Result<Vec<Row>> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if row.len() != types.len() {
            return Err(Error::retryable(format!(
                "Snowflake answered a row of {} cells for {} columns",
                row.len(),
                types.len()
            ))
            .with_table(schema.id.clone()));
        }
        let mut values = Vec::with_capacity(types.len());
        for ((c, ty), cell) in schema.columns.iter().zip(types).zip(row) {
            let value = match cell {
                None => tributary_schemas::Value::Null,
                Some(text) => from_cell(&text, ty, &c.data_type).map_err(|why| {
                    Error::permanent(format!(
                        "{why} (Snowflake type {ty}, source type {}): not read back exactly",
                        c.data_type
                    ))
                    .with_column(c.name.clone())
                    .with_class("tributary.verify")
                    .with_table(schema.id.clone())
                })?,
            };
            values.push(value);
        }
        out.push(values);
    }
    Ok(out)
}

#[async_trait]
impl WarehouseSink for SnowflakeSink {
    fn apply_span(&self, batch: &SinkBatch) -> Span {
        info_span!("snowflake_apply", table = %batch.table, records = batch.records.len())
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        let stored = match self.connect().await {
            Ok(()) => self.stored_offsets().await,
            Err(e) => Err(e),
        };
        let stored = stored.map_err(|e| self.failed(e))?;
        Ok(partitions.iter().map(|(t, p)| stored.get(&(t.clone(), *p)).copied()).collect())
    }

    async fn problems(&mut self) -> Vec<Problem> {
        check::run(self).await
    }

    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        SnowflakeSink::delete_copy(self, drop).await
    }

    fn destinations(&self) -> impl Fn(&TableId) -> DestinationTable + Send + Sync + 'static {
        let config = self.config.clone();
        move |t: &TableId| config.destination(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_tables_follow_the_column_set() {
        let d = DestinationTable {
            database: "DB".into(),
            schema: "s".into(),
            table: "t".into(),
        };
        let a = staging_name(STAGING_PREFIX, &d, &["id", "name"]);
        let b = staging_name(STAGING_PREFIX, &d, &["id", "name", "note"]);
        assert_ne!(a, b);
        assert!(a.starts_with(STAGING_PREFIX));
    }
}
