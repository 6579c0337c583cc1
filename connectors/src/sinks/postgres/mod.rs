//! The PostgreSQL sink: keeps a copy of each source table in a PostgreSQL
//! database, with exactly-once effect. A [`Warehouse`] of the core
//! (`crate::sink::warehouse`), which decides the order of everything; this
//! module says how PostgreSQL does each step.
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
//!    while PostgreSQL parses the chunk before) into a session-local staging
//!    table, then merged with one `INSERT ... SELECT ... ON CONFLICT DO
//!    UPDATE` and one `DELETE ... USING`, both guarded by the row's stored
//!    position: an event older than what a row already holds never moves it
//!    backwards.
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
//! [`client::classify`] maps every failure to an error kind (the SQLSTATE
//! table is [`crate::pgwire::sqlstate`]); nothing else here decides. Row
//! values are never logged nor put into error messages: PostgreSQL's own
//! messages for data errors quote the value, so they are redacted.

pub mod check;
pub mod client;
pub mod config;
pub mod dialect;
pub mod objects;
pub mod types;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};

use async_trait::async_trait;
use bytes::Bytes;
use futures::SinkExt;
use tokio_postgres::error::SqlState;
use tracing::{debug, info, info_span, Span};
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::{DataType, Position, Row, SequenceState, TableId, TableSchema, Value};

use self::client::{classify, CopyFailure, Ctx, HintIfNone, Session};
pub use self::config::{
    DestinationTable, PostgresSinkConfig, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_TABLE_TEMPLATE,
};
use self::dialect::{
    advance_sequence_sql, change_sql, copy_sql, create_resets_sql, deleted_table, deleted_table_ddl,
    forget_deleted_sql, forget_positions_sql, has_deleted_sql, has_newer_sql, keyless_sql, merge_sql, offsets_sql,
    offsets_table, prune_deleted_sql, removed_before_sql, resets_table, staging_table_sql, truncate_older_sql, QUOTING,
};
pub use self::dialect::{destination_type, fit, logical_type, PgType, PostgresDialect};
use self::types::{binary_fields, binary_type, render_binary_line, render_line};
pub use self::types::{render_copy, render_copy_as, render_pg_text, TextForm};
use crate::error::{Error, ErrorKind, Result};
use crate::pgwire::{quote_ident, quote_literal, BinaryType, BINARY_COPY_SIGNATURE};
use crate::problem::Problem;
use crate::sink::bookkeeping::{
    position_i64, reset_i64, staging_name, OffsetMove, PositionSyntax, DELETED_ROWS_PRUNE_INTERVAL, DELETED_TABLE,
    POSITION_COLUMNS,
};
pub use crate::sink::bookkeeping::{BOOKKEEPING_SCHEMA, COMMIT_COLUMN, INDEX_COLUMN, OFFSETS_TABLE};
use crate::sink::keyless;
use crate::sink::reduce::{Group, Reduction};
use crate::sink::schema::{plan, Evolution, ShapeColumn, TableShape, KEY_CHANGED_CLASS};
use crate::sink::verify::KeyRange;
use crate::sink::warehouse::{Mode, Warehouse, WarehouseSink};
use crate::sink::{ApplyError, SinkBatch};

/// Bytes per `COPY` data message: rows are rendered one chunk ahead of
/// PostgreSQL parsing them, so smaller chunks overlap the two better; 256
/// KiB still amortises the per-message cost.
const COPY_CHUNK_BYTES: usize = 256 * 1024;
/// Batches of a table that skip the direct-`COPY` fast path after it met an
/// existing key: a re-snapshot or a replay of many batches would otherwise
/// pay a failed `COPY` each time.
const FAST_PATH_BACKOFF_BATCHES: u32 = 64;
/// Opens each batch's transaction; deferred to go with its first statement.
const BEGIN: &str = "BEGIN";
/// Prefix of the session-local staging tables.
const STAGING_PREFIX: &str = "__tributary_stage_";
/// The source connector whose types PostgreSQL can recreate verbatim.
const POSTGRES_ORIGIN: &str = "postgresql";

/// What the sink knows about one destination table (from the catalog).
#[derive(Debug, Clone, Default)]
struct TableState {
    shape: TableShape<PgType>,
    /// Each column's `format_type` spelling (in `shape.columns` order), used
    /// verbatim for staging columns: a user type's name is not what
    /// [`PgType`] makes of it.
    raw: Vec<String>,
    /// Fingerprints of the source schemas already reconciled with it.
    reconciled: HashSet<u64>,
}

impl TableState {
    fn raw_type(&self, name: &str) -> Option<&str> {
        self.shape
            .columns
            .iter()
            .position(|c| c.name == name)
            .map(|i| self.raw[i].as_str())
    }
}

/// The PostgreSQL [`Sink`](crate::Sink).
pub struct PostgresSink {
    config: PostgresSinkConfig,
    consumer_group: String,
    session: Session,
    tables: HashMap<DestinationTable, TableState>,
    /// Staging tables known to exist in the current session.
    staging: HashSet<String>,
    /// Staging tables created or filled in the current transaction.
    staging_in_txn: HashSet<String>,
    staging_filled: HashSet<String>,
    /// Per table, batches left before the fast path is tried again.
    fast_skip: HashMap<DestinationTable, u32>,
    /// How the open transaction ends.
    mode: Mode,
    /// When expired deleted-rows entries are removed next.
    prune_at: std::time::Instant,
    /// Whether the open transaction was left open for the next batch
    /// (a large source transaction applied whole, `keep_open`).
    unit_open: bool,
}

impl fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSink")
            .field("config", &self.config)
            .field("connected", &self.session.is_open())
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
        let session = Session::new(&config)?;
        Ok(Self {
            config,
            consumer_group,
            session,
            tables: HashMap::new(),
            staging: HashSet::new(),
            staging_in_txn: HashSet::new(),
            staging_filled: HashSet::new(),
            fast_skip: HashMap::new(),
            mode: Mode::Commit,
            prune_at: std::time::Instant::now(),
            unit_open: false,
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

    /// Creates `schema` in the open transaction unless it exists (asked
    /// first: `CREATE SCHEMA IF NOT EXISTS` needs the database's `CREATE`
    /// privilege even when the schema is there).
    async fn ensure_schema(&mut self, schema: &str, ctx: &Ctx) -> Result<()> {
        let exists: bool = self
            .session
            .client()
            .await?
            .query_one("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", &[&schema])
            .await
            .map_err(|e| classify(&e, ctx))?
            .get(0);
        if !exists {
            let sql = format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(schema));
            self.session.execute(&sql, ctx).await?;
        }
        Ok(())
    }

    /// Connects (if not connected) and makes sure the bookkeeping tables exist.
    pub async fn connect(&mut self) -> Result<()> {
        if self.session.is_open() {
            return Ok(());
        }
        self.reset();
        self.session.connect().await?;
        if let Err(e) = self.ensure_bookkeeping().await {
            self.reset();
            return Err(e);
        }
        info!(database = %self.session.database(), user = %self.session.user(), "connected to the destination");
        Ok(())
    }

    /// Forgets the connection and everything cached about the session.
    fn reset(&mut self) {
        self.unit_open = false;
        self.session.reset();
        self.tables.clear();
        self.staging.clear();
        self.staging_in_txn.clear();
        self.staging_filled.clear();
    }

    fn ctx(&self) -> Ctx {
        self.session.ctx()
    }

    async fn ensure_bookkeeping(&mut self) -> Result<()> {
        let ctx = self.ctx();
        let client = self.session.client().await?;
        let offsets = offsets_table();
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($3) IS NOT NULL, \
                 EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $2)",
                &[&offsets, &BOOKKEEPING_SCHEMA, &deleted_table()],
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
             PRIMARY KEY (consumer_group, topic, partition)); {}; COMMIT",
            deleted_table_ddl()
        );
        if let Err(e) = client.batch_execute(&sql).await {
            let _ = client.batch_execute("ROLLBACK").await;
            let err = classify(&e, &ctx);
            return Err(if err.kind() == ErrorKind::NeedsOperator {
                err.with_hint_if_none(format!(
                    "GRANT CREATE ON DATABASE {} TO {}; or create the bookkeeping table yourself: \
                     CREATE SCHEMA {BOOKKEEPING_SCHEMA}; CREATE TABLE {BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE} \
                     (consumer_group text, topic text, partition int, next_offset bigint, \
                     PRIMARY KEY (consumer_group, topic, partition)); {}; GRANT USAGE ON SCHEMA {BOOKKEEPING_SCHEMA} TO {}; \
                     GRANT SELECT, INSERT, UPDATE ON {BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE} TO {}; \
                     GRANT SELECT, INSERT, UPDATE, DELETE ON {BOOKKEEPING_SCHEMA}.{DELETED_TABLE} TO {}",
                    quote_ident(&ctx.database),
                    quote_ident(&ctx.user),
                    deleted_table_ddl(),
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

    /// The source's objects recorded for the destination tables, each
    /// with its state (docs/migration.md).
    pub async fn objects(&mut self) -> Result<Vec<objects::Outcome>> {
        self.connect().await?;
        objects::list(&self.session, &self.consumer_group, &self.ctx()).await
    }

    /// Makes every object that waits for a cutover (or was refused), and
    /// returns every object's outcome: run once the source is read-only
    /// and every change is applied (see [`objects::make_waiting`]).
    pub async fn make_waiting_objects(&mut self) -> Result<Vec<objects::Outcome>> {
        self.connect().await?;
        let out = objects::make_waiting(&self.session, &self.consumer_group, &self.ctx()).await;
        // Tables may have changed under the cached shapes.
        self.tables.clear();
        out
    }

    /// Moves the destination's copy of each of `states`' sequences to at
    /// least the source's next value (made if missing), each on its own:
    /// a cutover's last word on them (see [`Warehouse::advance_sequence`]).
    pub async fn advance_sequences(&mut self, states: &[SequenceState]) -> Result<Vec<DestinationTable>> {
        self.connect().await?;
        let mut out = Vec::new();
        for state in states {
            let sequence = self.config.destination(&state.id());
            let ctx = self.ctx().in_table(sequence.to_string());
            self.ensure_schema(&sequence.schema, &ctx).await?;
            self.session.execute(&advance_sequence_sql(&sequence, state), &ctx).await?;
            out.push(sequence);
        }
        Ok(out)
    }

    /// The destination table of source table `source`.
    pub fn destination_of(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    /// Each of `tables`' row count (`None`: no such table).
    pub async fn row_counts(&mut self, tables: &[DestinationTable]) -> Result<Vec<Option<i64>>> {
        self.connect().await?;
        let ctx = self.ctx();
        let client = self.session.client().await?;
        let mut out = Vec::new();
        for t in tables {
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&t.quoted()])
                .await
                .map_err(|e| classify(&e, &ctx))?
                .get(0);
            out.push(if exists {
                let row = client
                    .query_one(&format!("SELECT count(*) FROM {}", t.quoted()), &[])
                    .await
                    .map_err(|e| classify(&e, &ctx))?;
                Some(row.get(0))
            } else {
                None
            });
        }
        Ok(out)
    }

    /// Drops the sink's position columns from `tables` (a copy that ended
    /// at a cutover: the application writes rows without them). The copy
    /// cannot go on into these tables after.
    pub async fn drop_position_columns(&mut self, tables: &[DestinationTable]) -> Result<()> {
        self.connect().await?;
        for t in tables {
            let ctx = self.ctx().in_table(t.to_string());
            let drops: Vec<String> = POSITION_COLUMNS
                .iter()
                .map(|c| format!("DROP COLUMN IF EXISTS {}", quote_ident(c)))
                .collect();
            self.session
                .execute(&format!("ALTER TABLE IF EXISTS {} {}", t.quoted(), drops.join(", ")), &ctx)
                .await?;
        }
        self.tables.clear();
        Ok(())
    }

    /// Removes this copy from the destination: its stored offsets and, when
    /// `drop` lists them, the destination tables of those source tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let ctx = self.ctx();
        let group = self.consumer_group.clone();
        let client = self.session.client().await?;
        let n = client
            .execute(&format!("DELETE FROM {} WHERE consumer_group = $1", offsets_table()), &[&group])
            .await
            .map_err(|e| classify(&e, &ctx))?;
        client
            .batch_execute(&objects::forget_group_sql(&group))
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let mut done = vec![format!("{n} stored offset(s) of consumer group {group}")];
        for source in drop {
            let dest = self.config.destination(source);
            client
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {}; {}; {}",
                    dest.quoted(),
                    forget_deleted_sql(&dest),
                    objects::forget_sql(&group, &dest)
                ))
                .await
                .map_err(|e| classify(&e, &ctx))?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    async fn rollback(&mut self) {
        self.unit_open = false;
        // A transaction whose `BEGIN` is still deferred was never opened.
        let opened = !self.session.take_deferred().starts_with(BEGIN);
        let ok = match self.session.connected() {
            Ok(c) if opened => c.batch_execute("ROLLBACK").await.is_ok(),
            _ => true,
        };
        self.forget_transaction();
        if !ok {
            // The session is unusable; the next apply reconnects.
            self.reset();
        }
    }

    /// Forgets what a rolled-back transaction (or savepoint) may have created
    /// or changed.
    fn forget_transaction(&mut self) {
        self.tables.clear();
        for name in self.staging_in_txn.drain() {
            self.staging.remove(&name);
        }
        self.staging_filled.clear();
    }

    /// Reads a table's columns and primary key from the catalog.
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let client = self.session.client().await?;
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
        let mut state = TableState::default();
        state.shape.exists = !rows.is_empty();
        let mut pk: Vec<(i32, String)> = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            let raw: String = row.get(1);
            let pos: i32 = row.get(3);
            // int2vector subscripts start at 0; -1: not in the key.
            if pos >= 0 {
                pk.push((pos, name.clone()));
            }
            state.shape.columns.push(ShapeColumn {
                name,
                ty: PgType::parse(&raw),
                not_null: row.get(2),
            });
            state.raw.push(raw);
        }
        pk.sort();
        state.shape.primary_key = pk.into_iter().map(|(_, n)| n).collect();
        if let Some(old) = self.tables.get(dest) {
            if old.shape.exists && state.shape.exists {
                state.reconciled = old.reconciled.clone();
            }
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    /// A destination table made for a keyed source table whose source has
    /// no key now, or the reverse (`changed`, see
    /// [`crate::sink::schema::key_changed`]): dropped, to be made anew in
    /// the open transaction, when none of its rows is current (a reset
    /// forgot every position: the source copies the table again after
    /// such a change); else `changed` stands.
    async fn make_anew(&mut self, dest: &DestinationTable, changed: Error) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let lock =
            format!("SELECT pg_advisory_xact_lock(hashtext({}))", quote_literal(&format!("tributary table {dest}")));
        self.session.execute(&lock, &ctx).await?;
        let current: i64 = self
            .session
            .client()
            .await?
            .query_one(keyless::current_rows_sql(QUOTING, &dest.quoted()).as_str(), &[])
            .await
            .map_err(|e| classify(&e, &ctx))?
            .get(0);
        if current > 0 {
            return Err(changed);
        }
        info!(table = %dest, reason = %changed, "making the destination table anew: its source table gained or lost its key");
        let sql = format!("DROP TABLE {}; {}", dest.quoted(), forget_deleted_sql(dest));
        self.session.execute(&sql, &ctx).await?;
        self.load_table(dest).await
    }

    fn state(&self, dest: &DestinationTable) -> Result<&TableState> {
        self.tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))
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
        forms: &[TextForm],
    ) -> Result<bool, ApplyError> {
        let ctx = self.ctx().in_table(dest.to_string());
        self.session.execute("SAVEPOINT tributary_fast", &ctx).await?;
        let copy = copy_sql(&dest.quoted(), names, false, false);
        match self.copy_lines(&copy, group, false, binary, forms).await {
            Ok(()) => {
                self.session.defer("RELEASE SAVEPOINT tributary_fast");
                debug!(table = %dest, rows = group.upserts, "copied directly");
                Ok(true)
            }
            Err(CopyFailure::Db(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                self.session
                    .execute("ROLLBACK TO SAVEPOINT tributary_fast; RELEASE SAVEPOINT tributary_fast", &ctx)
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
        // A deleted row's entry may be newer than a row loaded straight in.
        let ctx = self.ctx().in_table(dest.to_string());
        let has_deleted: bool = self
            .session
            .client()
            .await?
            .query_one(has_deleted_sql(dest).as_str(), &[])
            .await
            .map_err(|e| classify(&e, &ctx))?
            .get(0);
        if has_deleted {
            self.fast_skip.insert(dest.clone(), FAST_PATH_BACKOFF_BATCHES);
            return Ok(None);
        }
        let (columns, binary, forms) = copy_columns(dest, self.state(dest)?, group)?;
        let names: Vec<String> = columns.iter().map(|(n, _)| quote_ident(n)).collect();
        if self.copy_direct(dest, &names, group, binary.as_deref(), &forms).await? {
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
        // A keyless table's rows carry their content key and name, which
        // the direct copy does not write.
        let keyless = group.key.is_empty();
        if !probe && !keyless && self.copy_fast(dest, group).await? == Some(true) {
            return Ok(());
        }
        let ctx = self.ctx().in_table(dest.to_string());
        let state = self
            .tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        let (columns, binary, forms) = copy_columns(dest, state, group)?;
        let keys: Vec<String> = state.shape.primary_key.iter().map(|k| quote_ident(k)).collect();
        let stage = staging_name(STAGING_PREFIX, dest, &columns);
        let mut sql = String::new();
        if probe || !self.staging.contains(&stage) {
            let _ = write!(sql, "{}; ", staging_table_sql(&stage, &columns));
            self.staging_in_txn.insert(stage.clone());
        }
        if self.staging_filled.contains(&stage) {
            let _ = write!(sql, "TRUNCATE {}; ", quote_ident(&stage));
        }
        if !sql.is_empty() {
            self.session.execute(&sql, &ctx).await?;
        }
        self.staging_filled.insert(stage.clone());
        let names: Vec<String> = columns.iter().map(|(n, _)| quote_ident(n)).collect();
        let copy = copy_sql(&quote_ident(&stage), &names, true, keyless);
        match self.copy_lines(&copy, group, true, binary.as_deref(), &forms).await {
            Ok(()) => {}
            Err(CopyFailure::Db(e)) => return Err(classify(&e, &ctx).into()),
            Err(CopyFailure::Session(e)) => return Err(e.into()),
            Err(CopyFailure::Render(e)) => return Err(e),
        }
        let merge = if keyless {
            keyless_sql(dest, &stage, &names, (group.upserts > 0, group.deletes > 0))
        } else {
            merge_sql(dest, &stage, &names, &keys, group.deletes > 0, group.upserts > 0)
        };
        self.session.execute(&merge, &ctx).await?;
        debug!(table = %dest, upserts = group.upserts, deletes = group.deletes, "merged");
        Ok(())
    }

    /// Runs `copy` (a `COPY ... FROM STDIN`, sent with `(FORMAT binary)`
    /// when `binary` gives the fields) with the live lines of `group`,
    /// rendering each chunk while PostgreSQL parses the one before. On a
    /// render error the sink is dropped unfinished, which makes
    /// tokio-postgres send `CopyFail`: nothing of the `COPY` stays.
    async fn copy_lines(
        &self,
        copy: &str,
        group: &Group<'_>,
        flag: bool,
        binary: Option<&[BinaryType]>,
        forms: &[TextForm],
    ) -> Result<(), CopyFailure> {
        let copy = if binary.is_some() {
            format!("{copy} (FORMAT binary)")
        } else {
            copy.to_string()
        };
        let (client, statement) = self.session.copy_statement(&copy).await?;
        let sink = client.copy_in::<_, Bytes>(&statement).await.map_err(CopyFailure::Db)?;
        futures::pin_mut!(sink);
        let mut scratch = String::new();
        let mut chunk = Vec::with_capacity(COPY_CHUNK_BYTES + COPY_CHUNK_BYTES / 4);
        if binary.is_some() {
            // The signature, no flags, no header extension.
            chunk.extend_from_slice(BINARY_COPY_SIGNATURE);
            chunk.extend_from_slice(&[0; 8]);
        }
        for line in group.live() {
            match binary {
                Some(fields) => {
                    render_binary_line(group, &mut chunk, fields, line, flag).map_err(CopyFailure::Render)?
                }
                None => render_line(group, forms, &mut chunk, &mut scratch, line, flag).map_err(CopyFailure::Render)?,
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
}

#[async_trait]
impl Warehouse for PostgresSink {
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
        PostgresSink::connect(self).await
    }

    async fn begin(&mut self, mode: Mode) -> Result<()> {
        self.session.connected()?;
        self.session.take_deferred();
        self.session.defer(BEGIN);
        self.staging_in_txn.clear();
        self.staging_filled.clear();
        self.mode = mode;
        self.unit_open = false;
        Ok(())
    }

    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()> {
        self.unit_open = false;
        let ctx = self.ctx();
        if self.mode == Mode::Commit && std::time::Instant::now() >= self.prune_at {
            self.prune_at = std::time::Instant::now() + DELETED_ROWS_PRUNE_INTERVAL;
            self.session.defer(&prune_deleted_sql(self.config.deleted_rows_retention_hours));
        }
        if !offsets.is_empty() {
            let sql = offsets_sql(&self.consumer_group, offsets);
            if self.mode == Mode::Commit {
                // Sent with the COMMIT, in one round trip.
                self.session.defer(&sql);
            } else {
                let ctx = ctx.clone().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
                self.session.execute(&sql, &ctx).await?;
            }
        }
        if self.mode == Mode::Trial {
            self.rollback().await;
            return Ok(());
        }
        // A failed statement before the COMMIT leaves the transaction
        // aborted, which the core's abort ends (after a failed COMMIT it
        // only warns). A COMMIT whose answer was lost may or may not have
        // happened; the stored offsets tell the runner which.
        self.session.execute("COMMIT", &ctx).await?;
        self.staging.extend(self.staging_in_txn.drain());
        Ok(())
    }

    async fn abort(&mut self) {
        self.rollback().await;
    }

    /// One transaction of the session takes as many batches as a large
    /// source transaction needs.
    fn spans_batches(&self) -> bool {
        true
    }

    fn keep_open(&mut self) {
        self.unit_open = true;
    }

    fn unit_open(&self) -> bool {
        self.unit_open && self.session.is_open()
    }

    /// Drops the session after an error that is not about the data: the
    /// retry starts on a fresh connection (cheap next to the backoff) and
    /// never on one that a failover or a restart left half-broken.
    fn failed(&mut self, error: Error) -> Error {
        if error.kind() != ErrorKind::Permanent {
            self.reset();
        }
        error
    }

    /// Makes the destination table fit `schema`: creates it, adds columns,
    /// widens types, relaxes NOT NULL of columns the source no longer sends.
    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<()> {
        let fingerprint = schema_fingerprint(schema, origin == POSTGRES_ORIGIN);
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let name = dest.quoted();
        let changes = match plan(&PostgresDialect, &name, schema, origin, &self.state(dest)?.shape, self.evolution()) {
            Err(e) if e.class() == KEY_CHANGED_CLASS => {
                self.make_anew(dest, e).await?;
                plan(&PostgresDialect, &name, schema, origin, &self.state(dest)?.shape, self.evolution())?
            }
            other => other?,
        };
        if !changes.is_empty() {
            let ctx = self.ctx().in_table(dest.to_string());
            // Serialise DDL on this table across sink runners, then look
            // again: another runner may have done it meanwhile.
            let lock = format!(
                "SELECT pg_advisory_xact_lock(hashtext({}))",
                quote_literal(&format!("tributary table {dest}"))
            );
            self.session.execute(&lock, &ctx).await?;
            self.load_table(dest).await?;
            let changes =
                match plan(&PostgresDialect, &name, schema, origin, &self.state(dest)?.shape, self.evolution()) {
                    Err(e) if e.class() == KEY_CHANGED_CLASS => {
                        self.make_anew(dest, e).await?;
                        plan(&PostgresDialect, &name, schema, origin, &self.state(dest)?.shape, self.evolution())?
                    }
                    other => other?,
                };
            if !changes.is_empty() {
                let created = !self.state(dest)?.shape.exists;
                if created {
                    self.ensure_schema(&dest.schema, &ctx).await?;
                }
                let statements: Vec<String> = changes.iter().map(|c| change_sql(dest, c)).collect();
                for statement in &statements {
                    info!(table = %dest, ddl = %statement, "changing destination table");
                }
                self.session.execute(&statements.join("; "), &ctx).await?;
                if created {
                    // Objects that came before the table (its rows on
                    // another partition): made with it.
                    objects::make_refused_now(&self.session, &self.consumer_group, dest, &ctx).await?;
                }
                self.load_table(dest).await?;
            }
        }
        let state = self
            .tables
            .get_mut(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))?;
        if state.shape.primary_key.is_empty() {
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

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let sql = format!(
            "SELECT pg_advisory_xact_lock(hashtext({})); DROP TABLE IF EXISTS {}; {}; {}",
            quote_literal(&format!("tributary table {dest}")),
            dest.quoted(),
            forget_deleted_sql(dest),
            objects::forget_sql(&self.consumer_group, dest)
        );
        self.session.execute(&sql, &ctx).await?;
        self.tables.remove(dest);
        info!(table = %dest, "dropped destination table (the source table was dropped)");
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let (commit, index) = position_i64(at)?;
        let newer: bool = self
            .session
            .client()
            .await?
            .query_one(has_newer_sql(dest, commit, index).as_str(), &[])
            .await
            .map_err(|e| classify(&e, &ctx))?
            .get(0);
        let sql = if newer {
            // Rows written after the truncate (a replay): keep them.
            truncate_older_sql(dest, commit, index)
        } else {
            format!("TRUNCATE {}", dest.quoted())
        };
        let sql = if crate::sink::bookkeeping::keeps_removal(at) {
            format!("{sql}; {}", removed_before_sql(dest, commit, index))
        } else {
            sql
        };
        self.session.execute(&sql, &ctx).await
    }

    async fn advance_sequence(&mut self, sequence: &DestinationTable, state: &SequenceState) -> Result<()> {
        let ctx = self.ctx().in_table(sequence.to_string());
        self.ensure_schema(&sequence.schema, &ctx).await?;
        debug!(sequence = %sequence, next = %state.next_value(), "keeping the sequence at or above the source's");
        self.session.execute(&advance_sequence_sql(sequence, state), &ctx).await
    }

    async fn match_objects(
        &mut self,
        dest: &DestinationTable,
        source: &tributary_schemas::TableObjects,
        named: &HashMap<TableId, DestinationTable>,
    ) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        self.ensure_schema(&dest.schema, &ctx).await?;
        let planned = objects::plan(dest, source, named);
        objects::apply(&self.session, &self.consumer_group, dest, &planned, &ctx).await
    }

    async fn forget_positions(&mut self, dest: &DestinationTable, reset: u64) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let reset = reset_i64(reset)?;
        let resets = resets_table();
        let row = self
            .session
            .client()
            .await?
            .query_one("SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL", &[&resets, &dest.quoted()])
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let (has_resets, exists): (bool, bool) = (row.get(0), row.get(1));
        let mut sql = if has_resets { String::new() } else { create_resets_sql() };
        sql.push_str(&forget_positions_sql(dest, exists, reset));
        self.session.execute(&sql, &ctx).await.map_err(|e| {
            if e.kind() == ErrorKind::NeedsOperator {
                e.with_hint_if_none(format!(
                    "create the resets table for the sink's user: CREATE TABLE {resets} (destination text PRIMARY KEY, \
                     reset bigint NOT NULL); GRANT SELECT, INSERT, UPDATE ON {resets} TO {}",
                    quote_ident(&ctx.user)
                ))
            } else {
                e
            }
        })
    }

    fn loads_new_rows(&self) -> bool {
        true
    }

    async fn load_new(&mut self, dest: &DestinationTable, rows: &Group<'_>) -> Result<Option<bool>, ApplyError> {
        self.copy_fast(dest, rows).await
    }

    async fn write(
        &mut self,
        dest: &DestinationTable,
        changes: &Reduction<'_>,
        after_load: bool,
    ) -> Result<(), ApplyError> {
        // Two runners of one group can write one table at once (after a key
        // change the old key's partition and the new key's may belong to
        // different members). An upsert's check of the deleted-rows entry
        // and a delete's check of the row must not run side by side: each
        // would miss what the other has not committed yet (write skew under
        // READ COMMITTED), and a row older than its key's delete stayed. One
        // writer per destination table until commit.
        self.session.defer(&format!(
            "SELECT pg_advisory_xact_lock(hashtext({}))",
            quote_literal(&format!("tributary rows {dest}"))
        ));
        for group in &changes.groups {
            if group.upserts == 0 && group.deletes == 0 {
                continue;
            }
            self.merge(dest, group, after_load).await?;
        }
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<()> {
        self.session.execute("SAVEPOINT tributary_probe", &self.ctx()).await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        let ctx = self.ctx();
        self.session
            .execute("ROLLBACK TO SAVEPOINT tributary_probe; RELEASE SAVEPOINT tributary_probe", &ctx)
            .await?;
        // Whatever the probe created or changed inside the savepoint is
        // gone again: forget it.
        self.forget_transaction();
        Ok(())
    }

    async fn schema_differences(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        origin: &str,
    ) -> Result<Option<Vec<String>>> {
        self.load_table(dest).await?;
        let name = dest.quoted();
        let shape = &self.state(dest)?.shape;
        crate::sink::schema::differences(&PostgresDialect, &name, schema, origin, shape, self.evolution(), |c| {
            vec![change_sql(dest, c)]
        })
        .map(Some)
    }

    async fn read_range(
        &mut self,
        table: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
    ) -> Result<Option<Vec<Row>>> {
        let ctx = self.ctx();
        let sql =
            read_range_sql(table, schema, range).map_err(|e| Error::permanent(e).with_table(schema.id.clone()))?;
        let client = self.session.client().await?;
        // The text forms the source's decoders read (the sink's own
        // session prints intervals another way), for this read only.
        client
            .batch_execute(
                "BEGIN READ ONLY; SET LOCAL IntervalStyle = 'iso_8601'; SET LOCAL bytea_output = 'hex'; \
                 SET LOCAL extra_float_digits = 3",
            )
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let exists = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()])
            .await
            .map_err(|e| classify(&e, &ctx));
        let rows = match exists {
            Ok(row) if row.get::<_, bool>(0) => client.query(sql.as_str(), &[]).await.map_err(|e| classify(&e, &ctx)),
            Ok(_) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        let _ = client.batch_execute("COMMIT").await;
        let mut out = Vec::with_capacity(rows.as_ref().map_or(0, Vec::len));
        for row in rows? {
            let values = schema
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| match c.data_type {
                    // Microseconds ([`read_back_text`]).
                    DataType::TimeSpan => {
                        let text: Option<&str> = row.try_get(i).map_err(|e| {
                            Error::permanent(format!("reading column {} back: {e}", c.name))
                                .with_table(schema.id.clone())
                                .with_column(c.name.clone())
                        })?;
                        text.map_or(Ok(Value::Null), |t| {
                            t.parse().map(Value::Time).map_err(|_| {
                                Error::permanent(format!("column {}: {t:?} is not a count of microseconds", c.name))
                                    .with_table(schema.id.clone())
                                    .with_column(c.name.clone())
                            })
                        })
                    }
                    _ => crate::pgwire::values::text_cell(&row, i, &schema.id, c),
                })
                .collect::<Result<Vec<_>>>()?;
            out.push(values);
        }
        Ok(Some(out))
    }

    async fn summarize(
        &mut self,
        table: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
        summary: &tributary_schemas::records::RangeSummary,
    ) -> Result<std::result::Result<(u64, String), String>> {
        self.summarize_known(table, schema, range, summary).await
    }
}

/// The query reading back the rows of `range`: every column as text, the
/// key compared as every destination orders it (text by its bytes).
fn read_range_sql(
    table: &DestinationTable,
    schema: &TableSchema,
    range: &KeyRange,
) -> std::result::Result<String, String> {
    let cols = schema.columns.iter().map(read_back_text).collect::<Vec<_>>().join(", ");
    let mut sql = format!("SELECT {cols} FROM {}", table.quoted());
    if let Some(condition) = range_condition(schema, range)? {
        sql.push_str(" WHERE ");
        sql.push_str(&condition);
    }
    Ok(sql)
}

/// A column read back as the text the source's decoders read: its type's
/// output function, as pgoutput sends it (`::text` is a cast of its own
/// for `character(n)`, which drops the padding, and `inet`/`cidr`, which
/// add the netmask of a host); a MySQL TIME kept as `interval` as its
/// microseconds.
fn read_back_text(c: &tributary_schemas::Column) -> String {
    let name = quote_ident(&c.name);
    let source_type = c.source_type.to_ascii_lowercase();
    let base = source_type.split('(').next().unwrap_or_default().trim();
    if c.data_type == DataType::TimeSpan {
        format!("(extract(epoch FROM {name}) * 1000000)::bigint::text")
    } else if matches!(base, "character" | "bpchar" | "inet" | "cidr") {
        format!("CASE WHEN {name} IS NULL THEN NULL ELSE format('%s', {name}) END")
    } else {
        format!("{name}::text")
    }
}

/// The condition keeping the rows of `range`, the key compared as every
/// destination orders it (text by its bytes); `None` without bounds.
fn range_condition(schema: &TableSchema, range: &KeyRange) -> std::result::Result<Option<String>, String> {
    let keys = schema.key_indexes();
    // Text compares by its bytes, as the source read it.
    let collated = |c: &tributary_schemas::Column, expr: String| match c.data_type {
        DataType::Text => format!("{expr} COLLATE \"C\""),
        _ => expr,
    };
    let key_list: Vec<String> = keys
        .iter()
        .map(|&k| collated(&schema.columns[k], quote_ident(&schema.columns[k].name)))
        .collect();
    let literal = |i: usize, v: &Value| -> std::result::Result<String, String> {
        let c = keys.get(i).map(|&k| &schema.columns[k]).ok_or("a bound longer than the key")?;
        let mut text = String::new();
        render_pg_text(&mut text, v, &TextForm::of(&c.data_type, &c.source_type, &c.source_type))?;
        Ok(collated(c, quote_literal(&text)))
    };
    range.condition(PositionSyntax::RowValue, &key_list, literal)
}

impl PostgresSink {
    /// [`Warehouse::summarize`] with the table's columns known: their
    /// types must be the source's, on a server whose row texts the method
    /// covers.
    async fn summarize_known(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
        summary: &tributary_schemas::records::RangeSummary,
    ) -> Result<std::result::Result<(u64, String), String>> {
        use crate::pgwire::summary as method;
        let Some(oldest) = method::min_server_version(&summary.method) else {
            return Ok(Err(format!("this destination does not compute summaries of method {}", summary.method)));
        };
        let mut types = Vec::with_capacity(schema.columns.len());
        for fresh in [false, true] {
            if fresh || !self.tables.contains_key(dest) {
                self.load_table(dest).await?;
            }
            types = schema
                .columns
                .iter()
                .filter_map(|c| self.tables.get(dest).and_then(|t| t.raw_type(&c.name)).map(str::to_string))
                .collect();
            if types.len() == schema.columns.len() {
                break;
            }
        }
        if !method::same_types(&summary.types, &types) {
            let why = schema
                .columns
                .iter()
                .zip(&summary.types)
                .zip(types.iter().map(Some).chain(std::iter::repeat(None)))
                .find(|((_, s), d)| d.is_none_or(|d| d != *s))
                .map_or_else(
                    || "its columns differ from the source's".to_string(),
                    |((c, s), d)| match d {
                        Some(d) => format!("column {} is {d} here and {s} at the source", c.name),
                        None => format!("column {} is not here", c.name),
                    },
                );
            return Ok(Err(why));
        }
        let condition =
            range_condition(schema, range).map_err(|e| Error::permanent(e).with_table(schema.id.clone()))?;
        let columns: Vec<String> = schema
            .columns
            .iter()
            .zip(&summary.types)
            .map(|(c, t)| method::column_expr(&summary.method, &quote_ident(&c.name), t))
            .collect();
        let sql = method::range_sql(&summary.method, &dest.quoted(), &columns, condition.as_deref());
        let ctx = self.ctx().in_table(dest.to_string());
        let client = self.session.client().await?;
        client
            .batch_execute(&format!("BEGIN READ ONLY; {}", method::SETTINGS))
            .await
            .map_err(|e| classify(&e, &ctx))?;
        let answer = async {
            let version: i32 = client
                .query_one("SELECT current_setting('server_version_num')::int", &[])
                .await?
                .try_get(0)?;
            if version < oldest {
                return Ok(None);
            }
            let row = client.query_one(sql.as_str(), &[]).await?;
            let rows: i64 = row.try_get(0)?;
            let sum: String = row.try_get(1)?;
            Ok::<_, tokio_postgres::Error>(Some((u64::try_from(rows).unwrap_or(0), sum)))
        }
        .await;
        let _ = client.batch_execute("COMMIT").await;
        Ok(match answer {
            Ok(Some(computed)) => Ok(computed),
            Ok(None) => {
                Err(format!("this server is older than PostgreSQL {}, which {} needs", oldest / 10_000, summary.method))
            }
            // The destination cannot compute it (a type without the hash):
            // its rows are compared instead.
            Err(e) if e.as_db_error().is_some() => Err(format!("the destination cannot sum the range: {e}")),
            Err(e) => return Err(classify(&e, &ctx)),
        })
    }
}

#[async_trait]
impl WarehouseSink for PostgresSink {
    fn apply_span(&self, batch: &SinkBatch) -> Span {
        info_span!("postgres_apply", table = %batch.table, records = batch.records.len())
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.connect().await?;
        let ctx = self.ctx().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
        let sql = format!("SELECT topic, partition, next_offset FROM {} WHERE consumer_group = $1", offsets_table());
        let rows = match self.session.client().await?.query(&sql, &[&self.consumer_group]).await {
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

    async fn problems(&mut self) -> Vec<Problem> {
        check::check(self).await
    }

    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        PostgresSink::delete_copy(self, drop).await
    }

    fn destinations(&self) -> impl Fn(&TableId) -> DestinationTable + Send + Sync + 'static {
        let config = self.config.clone();
        move |t: &TableId| config.destination(t)
    }
}

/// Each column's name and destination type, the binary writers (when
/// every column and value has one), and each column's text form.
type CopyColumns<'s> = (Vec<(&'s str, &'s str)>, Option<Vec<BinaryType>>, Vec<TextForm>);

/// The destination type of each of `group`'s columns, the binary writers
/// when every column and value has one (else the copy is text), and the
/// text form of each column's values in its destination type.
fn copy_columns<'s>(dest: &DestinationTable, state: &'s TableState, group: &'s Group<'_>) -> Result<CopyColumns<'s>> {
    let schema = &group.schema;
    let mut columns: Vec<(&str, &str)> = Vec::with_capacity(schema.columns.len());
    for c in &schema.columns {
        let raw = state.raw_type(&c.name).ok_or_else(|| {
            Error::retryable(format!("column {} is missing in {dest}", c.name)).with_column(c.name.clone())
        })?;
        columns.push((c.name.as_str(), raw));
    }
    let binary = binary_fields(group, &columns.iter().map(|(_, t)| binary_type(t)).collect::<Vec<_>>());
    let forms = schema
        .columns
        .iter()
        .zip(&columns)
        .map(|(c, (_, dest))| TextForm::of(&c.data_type, &c.source_type, dest))
        .collect();
    Ok((columns, binary, forms))
}

fn schema_fingerprint(schema: &TableSchema, from_pg: bool) -> u64 {
    let mut h = DefaultHasher::new();
    schema.hash(&mut h);
    from_pg.hash(&mut h);
    h.finish()
}
