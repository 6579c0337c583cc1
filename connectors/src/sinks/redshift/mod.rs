//! The Redshift sink: keeps a copy of each source table in Amazon Redshift,
//! with exactly-once effect, staging each batch's rows as CSV files in S3.
//! A [`Warehouse`] of the core (`crate::sink::warehouse`), which decides
//! the order of everything; this module says how Redshift does each step.
//!
//! # How a batch is applied
//!
//! One transaction per [`SinkBatch`] on the main session:
//!
//! 1. Schema changes run first, on a second session outside the batch's
//!    transaction (Redshift runs `ALTER TABLE ... ADD COLUMN` and a VARCHAR
//!    lengthening only outside a transaction block). They are additive, so
//!    a batch that then fails leaves nothing wrong behind. A change needed
//!    for a table this transaction already wrote (a later schema version in
//!    the same batch) would wait for this transaction's own lock: the batch
//!    fails retryably and the change is made before the retry's first
//!    statement.
//! 2. A truncate removes the older rows (`DELETE`: Redshift's `TRUNCATE`
//!    commits the transaction).
//! 3. The batch is reduced to the last change per key; the survivors of each
//!    schema version are written as CSV files and a manifest to S3 and
//!    loaded with `COPY ... IAM_ROLE ... MANIFEST` into a temporary staging
//!    table; the files are removed after the load.
//! 4. The position guard runs on the staging rows first, then DELETE and
//!    INSERT replace the rows (see [`dialect::apply_sql`]): Redshift's
//!    `MERGE` takes no extra condition on its one `WHEN MATCHED`.
//! 5. The offsets table is locked, the stored offsets are read and checked
//!    against the batch's fence, then replaced; `COMMIT`.
//!
//! Each destination table is locked (`LOCK`) before the transaction first
//! writes it, so two runners writing one table take turns; Redshift runs
//! every transaction serializable and still aborts one of two conflicting
//! ones with error 1023 (retried). The test mode's PostgreSQL runs the
//! same statements at READ COMMITTED, where the locks alone serialize.
//!
//! Redshift has no savepoints: the core's bisection probes each run in a
//! transaction of their own (`savepoint` rolls back and begins again).
//!
//! A `COPY` that refuses a row says only "Load into table ... failed.
//! Check 'stl_load_errors'": the sink rolls back and reads the row's reason
//! and column from `stl_load_errors` on the same session
//! ([`RedshiftSink::refusal`]), and that error is the one bisection
//! dead-letters the record with.
//!
//! # Test mode
//!
//! `loader = "test_stdin_from_s3"` replaces only the `COPY` from S3 with a
//! `COPY FROM STDIN` of the same staged files, read back from S3, so that
//! everything else runs unchanged against PostgreSQL 15; a row PostgreSQL
//! refuses is logged in a stand-in `stl_load_errors` (with a stand-in
//! `pg_last_copy_id()`) and fails the load with Redshift's message (see
//! `docs/destinations/redshift.md` for what that does and does not show).

pub mod check;
pub mod client;
pub mod config;
pub mod dialect;
pub mod types;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::SinkExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use tracing::{debug, info, info_span, warn, Span};
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::{Position, TableId, TableSchema};

use self::client::{
    classify, copy_query_id, load_refused, CopyFailure, Ctx, HintIfNone, LoadError, Session, Stager, LOAD_ERROR_CLASS,
};
pub use self::config::{DestinationTable, Loader, RedshiftSinkConfig, S3Config};
use self::dialect::{
    apply_sql, bookkeeping_ddl, change_sql, clear_stage_sql, copy_s3_sql, copy_stdin_test_sql, create_schema_sql,
    delete_offsets_sql, drop_table_sql, forget_deleted_sql, forget_positions_sql, keyless_sql, load_error_sql,
    lock_sql, offsets_sql, offsets_table, prune_deleted_sql, read_range_sql, removed_before_sql, reset_of_sql,
    resets_table, staging_table_sql, stored_offsets_sql, table_entry_sql, timestamp_literal, truncate_older_sql,
    CopyQuery, COLUMNS_SQL, PRIMARY_KEY_SQL, QUOTING, SCHEMA_EXISTS_SQL,
};
pub use self::dialect::{PgType, RedshiftDialect, BEGIN};
use self::types::{read_row, render_record, CsvKind, ReadBack};
use crate::error::{Error, ErrorKind, Result};
use crate::pgwire::quote_ident;
use crate::problem::Problem;
use crate::sink::bookkeeping::{
    fenced, keeps_removal, position_i64, reset_i64, staging_name, Fence, OffsetMove, BOOKKEEPING_SCHEMA,
    DELETED_ROWS_PRUNE_INTERVAL, OFFSETS_TABLE,
};
use crate::sink::keyless;
use crate::sink::reduce::{Group, Reduction};
use crate::sink::schema::{plan, Evolution, ShapeColumn, TableShape, KEY_CHANGED_CLASS};
use crate::sink::verify::KeyRange;
use crate::sink::warehouse::{Mode, Warehouse, WarehouseSink};
use crate::sink::{ApplyError, SinkBatch};

/// Prefix of the session-local staging tables.
const STAGING_PREFIX: &str = "__tributary_stage_";
/// Settings of both sessions: the text forms the staged files use.
/// Redshift has no `IntervalStyle`, `lock_timeout` or
/// `standard_conforming_strings` (its literals always read backslash
/// escapes).
const SETUP: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 3";
/// TEST MODE ONLY, added to [`SETUP`] on PostgreSQL: literals read
/// backslashes as Redshift's do.
const TEST_SETUP: &str = "SET standard_conforming_strings = off; SET escape_string_warning = off";
/// Added for the schema session: a schema change that waits for another
/// runner's table lock while that runner waits for one this runner's
/// batch holds is a cycle the database cannot see (this runner's two
/// sessions wait through the client); it ends here, as a retryable error.
/// Redshift's schema changes are metadata changes: this is far above them.
const SCHEMA_SETUP: &str = "SET statement_timeout = 300000";
/// TEST MODE ONLY: Redshift's SUPER and VARBYTE as PostgreSQL domains
/// (over text: the staged JSON and hex as they are), so the same DDL runs.
const TEST_TYPES: [(&str, &str); 2] = [("super", "text"), ("varbyte", "text")];
/// TEST MODE ONLY: stand-ins of Redshift's load-error log and of
/// `pg_last_copy_id()`, which PostgreSQL lacks, so that the sink's lookup
/// of a refused row's reason ([`RedshiftSink::refusal`]) runs unchanged.
/// The table has Redshift's columns and types, and the start of the
/// session that ran the `COPY` (PostgreSQL reuses process ids). The test
/// loader writes a row for each `COPY FROM STDIN` PostgreSQL refuses
/// ([`RedshiftSink::log_refusal_test`]); the function returns the
/// session's last such `COPY` (the stand-in logs no other: the sink asks
/// only after a refusal), -1 without one, as Redshift's does.
const TEST_LOAD_ERRORS: [(&str, &str); 2] = [
    (
        "SELECT 1 FROM pg_class WHERE oid = to_regclass('public.stl_load_errors')",
        "CREATE TABLE public.stl_load_errors (userid integer, slice integer, tbl integer, starttime timestamp, \
         session integer, query serial, filename character(256), line_number bigint, colname character(127), \
         type character(10), col_length character(10), position integer, raw_line character(1024), \
         raw_field_value character(1024), err_code integer, err_reason character(100), is_partial integer, \
         start_offset bigint, stand_in_backend_start timestamptz)",
    ),
    (
        "SELECT 1 FROM pg_proc WHERE proname = 'pg_last_copy_id'",
        "CREATE FUNCTION public.pg_last_copy_id() RETURNS integer LANGUAGE sql STABLE AS $$ \
         SELECT coalesce(max(e.query), -1) FROM public.stl_load_errors e JOIN pg_stat_activity a \
         ON a.pid = e.session AND a.backend_start = e.stand_in_backend_start WHERE a.pid = pg_backend_pid() $$",
    ),
];
/// TEST MODE ONLY: stand-ins of the Redshift functions that read SUPER and
/// VARBYTE back for verification ([`dialect::read_range_sql`]), over the
/// test types' text (the staged JSON and hex as they are). `OCTET_LENGTH`
/// of a test VARBYTE counts its hex, twice its bytes: the stand-in calls a
/// value too long from half the length Redshift does.
const TEST_FUNCTIONS: [(&str, &str); 4] = [
    (
        "SELECT 1 FROM pg_proc WHERE proname = 'json_size'",
        "CREATE FUNCTION public.json_size(text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT octet_length($1) $$",
    ),
    (
        "SELECT 1 FROM pg_proc WHERE proname = 'json_serialize'",
        "CREATE FUNCTION public.json_serialize(text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT $1 $$",
    ),
    (
        "SELECT 1 FROM pg_proc WHERE proname = 'from_varbyte'",
        "CREATE FUNCTION public.from_varbyte(text, text) RETURNS text LANGUAGE sql IMMUTABLE AS \
         $$ SELECT CASE WHEN lower($2) = 'hex' THEN lower($1) END $$",
    ),
    (
        "SELECT 1 FROM pg_proc WHERE proname = 'to_varbyte'",
        "CREATE FUNCTION public.to_varbyte(text, text) RETURNS public.varbyte LANGUAGE sql IMMUTABLE AS \
         $$ SELECT CAST(CASE WHEN lower($2) = 'hex' THEN lower($1) END AS public.varbyte) $$",
    ),
];
/// TEST MODE ONLY: the stand-in's row for a refused `COPY FROM STDIN`
/// (what Redshift's loader writes): `$1` the session, `$2` the file, `$3`
/// the line in it, `$4` the column, `$5` its type, `$6` the value, `$7`
/// PostgreSQL's message. No table id, slice, raw line or Redshift error
/// code (0): PostgreSQL has none of them to give.
const TEST_LOG_LOAD_ERROR: &str =
    "INSERT INTO public.stl_load_errors (userid, slice, tbl, starttime, session, filename, \
     line_number, colname, type, col_length, position, raw_line, raw_field_value, err_code, err_reason, is_partial, \
     start_offset, stand_in_backend_start) VALUES (0, 0, 0, now()::timestamp, $1::integer, left($2::text, 256), \
     $3::bigint, left($4::text, 127), left($5::text, 10), '0', 0, '', left($6::text, 1024), 0, left($7::text, 100), \
     0, 0, (SELECT backend_start FROM pg_stat_activity WHERE pid = $1::integer))";

/// What the sink knows about one destination table (from the catalog).
#[derive(Debug, Clone, Default)]
struct TableState {
    shape: TableShape<PgType>,
    /// Each column's `format_type` spelling, in `shape.columns` order.
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

/// A schema change postponed to the next transaction's start (see the
/// module docs, step 1).
type PendingChange = (DestinationTable, Arc<TableSchema>, String);

/// The Redshift [`Sink`](crate::Sink).
pub struct RedshiftSink {
    config: RedshiftSinkConfig,
    consumer_group: String,
    /// The batches' transactions.
    session: Session,
    /// Catalog reads and DDL, outside the batches' transactions.
    schema_session: Session,
    stager: Stager,
    tables: HashMap<DestinationTable, TableState>,
    /// Staging tables known to exist in the main session.
    staging: HashSet<String>,
    /// Staging tables created in the open transaction.
    staging_in_txn: HashSet<String>,
    /// Tables the open transaction wrote (and so holds locks on).
    touched: HashSet<DestinationTable>,
    /// Tables the open transaction dropped: made again in it, if needed.
    dropped: HashSet<DestinationTable>,
    /// Whether the open transaction changed a table's shape (cached shapes
    /// are then forgotten if it rolls back).
    ddl_in_txn: bool,
    pending: Vec<PendingChange>,
    mode: Mode,
    prune_at: std::time::Instant,
    /// The batch's time as a literal (`deleted_at`).
    now: String,
    /// Every statement sent (the dialect check's input), when asked for.
    recorder: Option<Arc<Mutex<Vec<String>>>>,
    /// TEST MODE ONLY: the main session's process id (the stand-in load
    /// error log's `session`).
    test_pid: Option<i32>,
}

impl fmt::Debug for RedshiftSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedshiftSink")
            .field("config", &self.config)
            .field("connected", &self.session.is_open())
            .finish()
    }
}

impl RedshiftSink {
    /// A sink for `config`; it connects on first use.
    pub fn new(config: RedshiftSinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("redshift.consumer_group", "is required"))?;
        let connection = config.connection();
        Ok(Self {
            session: Session::new_in(&connection, "redshift")?,
            schema_session: Session::new_in(&connection, "redshift")?,
            stager: Stager::new(&config.s3, "redshift")?,
            config,
            consumer_group,
            tables: HashMap::new(),
            staging: HashSet::new(),
            staging_in_txn: HashSet::new(),
            touched: HashSet::new(),
            dropped: HashSet::new(),
            ddl_in_txn: false,
            pending: Vec::new(),
            mode: Mode::Commit,
            prune_at: std::time::Instant::now(),
            now: timestamp_literal(chrono::Utc::now()),
            recorder: None,
            test_pid: None,
        })
    }

    /// Records every statement sent to the destination into `to` (the
    /// dialect check; the test mode's own `COPY FROM STDIN` and type
    /// stand-ins are not recorded, the `COPY` from S3 it replaces is).
    pub fn record_statements(&mut self, to: Arc<Mutex<Vec<String>>>) {
        self.recorder = Some(to);
    }

    /// The configuration.
    pub fn config(&self) -> &RedshiftSinkConfig {
        &self.config
    }

    fn record(&self, sql: &str) {
        if let Some(r) = &self.recorder {
            r.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(sql.to_string());
        }
    }

    /// Sends `sql` with the next statement (recorded like every statement).
    fn defer(&self, sql: &str) {
        self.record(sql);
        self.session.defer(sql);
    }

    fn ctx(&self) -> Ctx {
        self.session.ctx()
    }

    fn test_mode(&self) -> bool {
        self.config.loader == Loader::TestStdinFromS3
    }

    fn setup(&self) -> String {
        if self.test_mode() {
            format!("{SETUP}; {TEST_SETUP}")
        } else {
            SETUP.to_string()
        }
    }

    /// Runs `statements` on the main session, after what is deferred, in
    /// one round trip.
    async fn exec(&self, statements: &[String], ctx: &Ctx) -> Result<()> {
        self.exec_naming_copy(statements, ctx).await.map_err(|(e, _)| e)
    }

    /// [`RedshiftSink::exec`], with the `COPY` a load error names (see
    /// [`CopyQuery`]).
    async fn exec_naming_copy(&self, statements: &[String], ctx: &Ctx) -> Result<(), (Error, CopyQuery)> {
        for s in statements {
            self.record(s);
        }
        let client = self.session.connected().map_err(|e| (e, CopyQuery::LastInSession))?;
        let mut text = self.session.take_deferred();
        text.push_str(&statements.join("; "));
        client
            .batch_execute(&text)
            .await
            .map_err(|e| (classify(&e, ctx), copy_query_id(&e).map_or(CopyQuery::LastInSession, CopyQuery::Id)))
    }

    /// A query on the main session (after what is deferred).
    async fn query(&self, sql: &str, ctx: &Ctx) -> Result<Vec<Row>> {
        self.record(sql);
        let client = self.session.connected()?;
        let deferred = self.session.take_deferred();
        if !deferred.is_empty() {
            client.batch_execute(&deferred).await.map_err(|e| classify(&e, ctx))?;
        }
        client.query(sql, &[]).await.map_err(|e| classify(&e, ctx))
    }

    /// One statement on the schema session (autocommit).
    async fn ddl(&self, sql: &str, ctx: &Ctx) -> Result<()> {
        self.record(sql);
        let client = self.schema_session.connected()?;
        client.batch_execute(sql).await.map_err(|e| classify(&e, ctx))
    }

    /// A catalog query on the schema session (sees every committed change).
    async fn catalog(&self, sql: &str, params: &[&(dyn ToSql + Sync)], ctx: &Ctx) -> Result<Vec<Row>> {
        self.record(sql);
        let client = self.schema_session.connected()?;
        client.query(sql, params).await.map_err(|e| classify(&e, ctx))
    }

    /// Connects both sessions (if not connected) and makes sure the
    /// bookkeeping tables exist.
    pub async fn connect(&mut self) -> Result<()> {
        if self.session.is_open() && self.schema_session.is_open() {
            return Ok(());
        }
        self.reset();
        let setup = self.setup();
        let connected = async {
            self.session.connect_with(&setup).await?;
            self.schema_session.connect_with(&format!("{setup}; {SCHEMA_SETUP}")).await?;
            if self.test_mode() {
                self.test_stand_ins().await?;
            }
            self.ensure_bookkeeping().await
        }
        .await;
        if let Err(e) = connected {
            self.reset();
            return Err(e);
        }
        info!(database = %self.session.database(), user = %self.session.user(), "connected to Redshift");
        Ok(())
    }

    /// Forgets the connections and everything cached about them.
    fn reset(&mut self) {
        self.session.reset();
        self.schema_session.reset();
        self.tables.clear();
        self.staging.clear();
        self.staging_in_txn.clear();
        self.touched.clear();
    }

    /// TEST MODE ONLY: creates the stand-ins of Redshift's types, load
    /// error log, `pg_last_copy_id()` and the functions verification reads
    /// with, and notes the main session's process id.
    async fn test_stand_ins(&mut self) -> Result<()> {
        let ctx = self.ctx();
        let client = self.schema_session.connected()?;
        let domains: Vec<(String, String)> = TEST_TYPES
            .iter()
            .map(|(name, over)| {
                let exists = format!("SELECT 1 FROM pg_type WHERE typname = '{name}'");
                (exists, format!("CREATE DOMAIN public.{name} AS {over}"))
            })
            .collect();
        let all = domains
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .chain(TEST_LOAD_ERRORS)
            .chain(TEST_FUNCTIONS);
        for (exists, create) in all {
            if client.query(exists, &[]).await.map_err(|e| classify(&e, &ctx))?.is_empty() {
                // Two sinks starting at once: the loser's error is harmless.
                let _ = client.batch_execute(create).await;
            }
        }
        let pid = self.session.connected()?.query_one("SELECT pg_backend_pid()", &[]).await;
        self.test_pid = Some(pid.map_err(|e| classify(&e, &ctx))?.get(0));
        Ok(())
    }

    async fn ensure_bookkeeping(&self) -> Result<()> {
        let ctx = self.ctx().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
        for sql in bookkeeping_ddl() {
            // `IF NOT EXISTS` races with another runner's create: once more.
            if self.ddl(&sql, &ctx).await.is_err() {
                self.ddl(&sql, &ctx).await.map_err(|e| {
                    if e.kind() == ErrorKind::NeedsOperator {
                        e.with_hint_if_none(format!(
                            "GRANT CREATE ON DATABASE {} TO {u}; or create the bookkeeping tables yourself ({}) and \
                             GRANT USAGE ON SCHEMA {BOOKKEEPING_SCHEMA} TO {u}; GRANT SELECT, INSERT, UPDATE, DELETE \
                             ON ALL TABLES IN SCHEMA {BOOKKEEPING_SCHEMA} TO {u}",
                            quote_ident(&ctx.database),
                            bookkeeping_ddl().join("; "),
                            u = quote_ident(&ctx.user),
                        ))
                    } else {
                        e
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Removes this copy: its stored offsets and the tables of `drop`.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let ctx = self.ctx();
        let group = self.consumer_group.clone();
        self.ddl(&delete_offsets_sql(&group), &ctx).await?;
        let mut done = vec![format!("the stored offsets of consumer group {group}")];
        for source in drop {
            let dest = self.config.destination(source);
            self.ddl(&drop_table_sql(&dest), &ctx).await?;
            self.ddl(&forget_deleted_sql(&dest), &ctx).await?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

    async fn rollback(&mut self) {
        // A transaction whose `BEGIN` is still deferred was never opened.
        let opened = !self.session.take_deferred().starts_with(BEGIN);
        let ok = match self.session.connected() {
            Ok(c) if opened => {
                self.record("ROLLBACK");
                c.batch_execute("ROLLBACK").await.is_ok()
            }
            _ => true,
        };
        self.forget_transaction();
        if !ok {
            self.reset();
        }
    }

    /// Forgets what a rolled-back transaction created or touched. The
    /// table shapes stay: DDL ran outside it and is committed.
    fn forget_transaction(&mut self) {
        for name in self.staging_in_txn.drain() {
            self.staging.remove(&name);
        }
        if std::mem::take(&mut self.ddl_in_txn) {
            self.tables.clear();
        }
        self.touched.clear();
        self.dropped.clear();
    }

    /// Rolls the open transaction back and opens another (what a savepoint
    /// does elsewhere).
    async fn restart_transaction(&mut self) -> Result<()> {
        self.rollback().await;
        self.session.connected()?;
        self.defer(BEGIN);
        Ok(())
    }

    /// Locks `dest` for the rest of the transaction, the first time the
    /// transaction is about to write it (sent with the next statement):
    /// two runners writing one table (after a key change, the old key's
    /// partition and the new key's may belong to different members) take
    /// turns, so neither misses the other's deleted-row entries or rows.
    /// In Redshift it also spares most serializable-isolation aborts.
    fn lock_for_write(&mut self, dest: &DestinationTable) {
        if self.touched.insert(dest.clone()) {
            let sql = lock_sql(&dest.quoted());
            self.defer(&sql);
        }
    }

    /// Creates `dest` again inside the open transaction, which dropped it
    /// (a source table dropped and made again within one batch): Redshift
    /// runs `CREATE TABLE` in a transaction block, and outside it the old
    /// table would still be there.
    async fn recreate_in_transaction(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        origin: &str,
    ) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let empty = TableShape::default();
        let changes = plan(&RedshiftDialect, &dest.quoted(), schema, origin, &empty, self.evolution())?;
        let statements = changes
            .iter()
            .map(|c| change_sql(dest, c).map_err(|e| e.with_table(schema.id.clone())))
            .collect::<Result<Vec<_>>>()?;
        self.ddl_in_txn = true;
        self.exec(&statements, &ctx).await?;
        let mut state = TableState::default();
        state.shape.apply(&changes);
        state.raw = state.shape.columns.iter().map(|c| c.ty.render()).collect();
        state.reconciled.insert(schema_fingerprint(schema));
        self.tables.insert(dest.clone(), state);
        self.dropped.remove(dest);
        Ok(())
    }

    /// A destination table made for a keyed source table whose source has
    /// no key now, or the reverse (`changed`, see
    /// [`crate::sink::schema::key_changed`]): dropped and made anew for
    /// `schema` in the open transaction when none of its rows is current (a
    /// reset forgot every position: the source copies the table again after
    /// such a change); else `changed` stands.
    async fn make_anew(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        origin: &str,
        changed: Error,
    ) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        self.lock_for_write(dest);
        let current = self.query(&keyless::current_rows_sql(QUOTING, &dest.quoted()), &ctx).await?;
        if current.first().is_none_or(|r| r.get::<_, i64>(0) > 0) {
            return Err(changed);
        }
        info!(table = %dest, reason = %changed, "making the destination table anew: its source table gained or lost its key");
        self.drop_table(dest).await?;
        self.recreate_in_transaction(dest, schema, origin).await
    }

    /// Reads a table's columns and primary key from the catalog.
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let rows = self.catalog(COLUMNS_SQL, &[&dest.schema, &dest.table], &ctx).await?;
        let mut state = TableState::default();
        state.shape.exists = !rows.is_empty();
        for row in rows {
            let raw: String = row.get(1);
            state.shape.columns.push(ShapeColumn {
                name: row.get(0),
                ty: PgType::parse(&raw),
                not_null: row.get(2),
            });
            state.raw.push(raw);
        }
        if state.shape.exists {
            let keys = self.catalog(PRIMARY_KEY_SQL, &[&dest.schema, &dest.table], &ctx).await?;
            state.shape.primary_key = keys.iter().map(|r| r.get(0)).collect();
        }
        if let Some(old) = self.tables.get(dest) {
            if old.shape.exists && state.shape.exists {
                state.reconciled = old.reconciled.clone();
            }
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    fn state(&self, dest: &DestinationTable) -> Result<&TableState> {
        self.tables
            .get(dest)
            .ok_or_else(|| Error::retryable(format!("table {dest} vanished from the cache")))
    }

    fn plan_for(&self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<Vec<String>> {
        let changes =
            plan(&RedshiftDialect, &dest.quoted(), schema, origin, &self.state(dest)?.shape, self.evolution())?;
        changes
            .iter()
            .map(|c| change_sql(dest, c).map_err(|e| e.with_table(schema.id.clone())))
            .collect()
    }

    /// Makes `dest` fit `schema` on the schema session, one statement at a
    /// time, outside any transaction block.
    async fn change_table(&mut self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let statements = self.plan_for(dest, schema, origin)?;
        if statements.is_empty() {
            return Ok(());
        }
        if !self.state(dest)?.shape.exists {
            let n: i64 = self
                .catalog(SCHEMA_EXISTS_SQL, &[&dest.schema], &ctx)
                .await?
                .first()
                .map_or(0, |r| r.get(0));
            if n == 0 {
                self.ddl(&create_schema_sql(&dest.schema), &ctx).await?;
            }
        }
        for statement in &statements {
            info!(table = %dest, ddl = %statement, "changing destination table");
            if let Err(e) = self.ddl(statement, &ctx).await {
                // Another runner may have made the same change meanwhile.
                self.load_table(dest).await?;
                if self.plan_for(dest, schema, origin)?.is_empty() {
                    return Ok(());
                }
                return Err(e);
            }
        }
        self.load_table(dest).await
    }

    /// How each column of `schema` is read back from `dest` (with its
    /// type there), the catalog read again if a column is not in the cached
    /// shape; `None` when the table does not exist.
    async fn read_kinds(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
    ) -> Result<Option<Vec<(ReadBack, String)>>> {
        let cached = self
            .tables
            .get(dest)
            .is_some_and(|s| schema.columns.iter().all(|c| s.raw_type(&c.name).is_some()));
        if !cached {
            self.load_table(dest).await?;
        }
        let state = self.state(dest)?;
        if !state.shape.exists {
            return Ok(None);
        }
        schema
            .columns
            .iter()
            .map(|c| {
                let raw = state.raw_type(&c.name).ok_or_else(|| {
                    Error::permanent(format!("column {} ({}) is not in destination table {dest}", c.name, c.data_type))
                        .with_table(schema.id.clone())
                        .with_column(c.name.clone())
                })?;
                Ok((ReadBack::of(raw), raw.to_string()))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Stages the surviving rows of one schema version and applies them.
    async fn stage_and_apply(&mut self, dest: &DestinationTable, group: &Group<'_>) -> Result<(), ApplyError> {
        let ctx = self.ctx().in_table(dest.to_string());
        let state = self.state(dest)?;
        let mut columns: Vec<(&str, String)> = Vec::with_capacity(group.schema.columns.len());
        for c in &group.schema.columns {
            let raw = state.raw_type(&c.name).ok_or_else(|| {
                Error::retryable(format!("column {} is missing in {dest}", c.name)).with_column(c.name.clone())
            })?;
            columns.push((c.name.as_str(), raw.to_string()));
        }
        let keys: Vec<String> = state.shape.primary_key.iter().map(|k| quote_ident(k)).collect();
        if keys.is_empty() {
            return Err(Error::needs_operator(format!(
                "destination table {dest} has no primary key, so rows cannot be matched"
            ))
            .with_table(group.schema.id.clone())
            .with_class("tributary.no_primary_key")
            .with_hint(format!(
                "ALTER TABLE {} ADD PRIMARY KEY ({})",
                dest.quoted(),
                group.schema.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ")
            ))
            .into());
        }
        let kinds: Vec<CsvKind> = columns.iter().map(|(_, raw)| CsvKind::of(raw)).collect();
        let names: Vec<String> = columns.iter().map(|(n, _)| quote_ident(n)).collect();
        let typed: Vec<(&str, &str)> = columns.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let stage = staging_name(STAGING_PREFIX, dest, &typed);
        let prepare = if self.staging.contains(&stage) {
            clear_stage_sql(&stage)
        } else {
            self.staging.insert(stage.clone());
            self.staging_in_txn.insert(stage.clone());
            staging_table_sql(&stage, &typed)
        };
        self.exec(&[prepare], &ctx).await?;

        // The files: `rows_per_file` records each.
        let mut files = Vec::new();
        let mut file = Vec::new();
        let mut rows = 0;
        let mut scratch = String::new();
        for line in group.live() {
            render_record(group, &kinds, &mut file, &mut scratch, line)?;
            rows += 1;
            if rows == self.config.rows_per_file {
                files.push(std::mem::take(&mut file));
                rows = 0;
            }
        }
        if !file.is_empty() {
            files.push(file);
        }
        let staged = self.stager.put(&self.consumer_group, files).await?;
        let copy = copy_s3_sql(&stage, &names, &staged.manifest_url, &self.config.iam_role);
        let loaded = match self.config.loader {
            Loader::S3Copy => self.exec_naming_copy(&[copy], &ctx).await,
            Loader::TestStdinFromS3 => {
                self.record(&copy);
                self.copy_from_s3_test(&stage, &names, &typed, &staged.manifest_url, &ctx)
                    .await
                    .map_err(|e| (e, CopyQuery::LastInSession))
            }
        };
        self.stager.remove(&staged).await;
        if let Err((error, copy)) = loaded {
            if error.class() != LOAD_ERROR_CLASS {
                return Err(error.into());
            }
            return Err(self.refusal(error, copy, staged.dir_url(), &ctx).await.into());
        }
        let statements = if group.key.is_empty() {
            keyless_sql(dest, &stage, &names, (group.upserts > 0, group.deletes > 0), &self.now)
        } else {
            apply_sql(dest, &stage, &names, &keys, group.deletes > 0, group.upserts > 0, &self.now)
        };
        self.exec(&statements, &ctx).await?;
        debug!(table = %dest, upserts = group.upserts, deletes = group.deletes, "applied");
        Ok(())
    }

    /// Redshift's reason for a refused row, from `stl_load_errors`, in
    /// place of `error` (whose message only points there). Asked on the
    /// same session after a rollback: `pg_last_copy_id()` is the session's,
    /// the aborted transaction refuses every statement until it ends, and
    /// the log row is written outside the transaction, so the rollback
    /// leaves it. Without a row (the id an older load's, the row not
    /// visible) `error` stays, its hint the query to run by hand.
    async fn refusal(&mut self, error: Error, copy: CopyQuery, staged_dir: &str, ctx: &Ctx) -> Error {
        self.rollback().await;
        match self.query(&load_error_sql(copy, staged_dir), ctx).await {
            Ok(rows) => match rows.first().map(LoadError::from_row) {
                Some(Ok(row)) => row.into_error(),
                Some(Err(e)) => {
                    warn!(error = %crate::pgwire::redact::redacted(&e), "could not read the stl_load_errors row");
                    error
                }
                None => {
                    warn!(?copy, "no stl_load_errors row for the refused COPY");
                    error
                }
            },
            Err(e) => {
                warn!(error = %e, "could not look the refused row up in stl_load_errors");
                error
            }
        }
    }

    /// TEST MODE ONLY: what `COPY ... FROM 's3://...' MANIFEST` does,
    /// against PostgreSQL: the manifest's files read back from S3 and sent
    /// with `COPY FROM STDIN`. A row PostgreSQL refuses is logged in the
    /// stand-in `stl_load_errors` and fails the load with Redshift's
    /// message, as the cluster's loader does.
    async fn copy_from_s3_test(
        &self,
        stage: &str,
        names: &[String],
        typed: &[(&str, &str)],
        manifest: &str,
        ctx: &Ctx,
    ) -> Result<()> {
        let files = self.stager.read(manifest).await?;
        let sql = copy_stdin_test_sql(stage, names);
        let copy = async {
            let (client, statement) = self.session.copy_statement(&sql).await?;
            let sink = client.copy_in::<_, bytes::Bytes>(&statement).await.map_err(CopyFailure::Db)?;
            futures::pin_mut!(sink);
            for (_, f) in &files {
                sink.send(f.clone()).await.map_err(CopyFailure::Db)?;
            }
            sink.as_mut().finish().await.map_err(CopyFailure::Db)?;
            Ok::<(), CopyFailure>(())
        };
        match copy.await {
            Ok(()) => Ok(()),
            Err(CopyFailure::Db(e)) => match e.as_db_error() {
                Some(db) if crate::pgwire::redact::is_data_error(db.code().code()) => {
                    // Still a refused row without its log entry (the
                    // lookup then finds none): never retried for ever.
                    if let Err(e) = self.log_refusal_test(db, typed, &files).await {
                        warn!(error = %e, "TEST MODE: could not log the refused row in the stand-in stl_load_errors");
                    }
                    Err(load_refused(stage, ctx))
                }
                _ => Err(classify(&e, ctx)),
            },
            Err(CopyFailure::Session(e)) => Err(e),
            Err(CopyFailure::Render(e)) => Err(e.error),
        }
    }

    /// TEST MODE ONLY: the stand-in `stl_load_errors` row of a refused
    /// `COPY FROM STDIN`, written on the schema session (the main one's
    /// transaction is aborted) from PostgreSQL's error: its message as the
    /// reason, the column and value from its context (`COPY stage, line 3,
    /// column due: "infinity"`), the line mapped to the staged file it is in.
    async fn log_refusal_test(
        &self,
        db: &tokio_postgres::error::DbError,
        typed: &[(&str, &str)],
        files: &[(String, bytes::Bytes)],
    ) -> Result<()> {
        let context = db.where_().unwrap_or_default();
        let column = crate::sinks::postgres::client::copy_column(context).unwrap_or_default();
        // Redshift's `type` is the bare name (`numeric`, not `numeric(38,2)`).
        let column_type = typed
            .iter()
            .find(|(n, _)| *n == column)
            .map_or("", |(_, t)| t.split('(').next().unwrap_or(t));
        let value = context
            .split_once(&format!(", column {column}: "))
            .map(|(_, v)| v.trim_matches('"').to_string())
            .unwrap_or_default();
        let line: i64 = context
            .split_once(", line ")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1);
        // PostgreSQL counts the lines of the whole stream; Redshift, of a file.
        let (mut file, mut in_file) = (files.first().map(|(u, _)| u.clone()).unwrap_or_default(), line);
        for (url, bytes) in files {
            let records = types::csv_records(bytes);
            file.clone_from(url);
            if in_file <= records {
                break;
            }
            in_file -= records;
        }
        let pid = self
            .test_pid
            .ok_or_else(|| Error::retryable("the test mode's session id is unknown"))?;
        let client = self.schema_session.connected()?;
        client
            .execute(TEST_LOG_LOAD_ERROR, &[&pid, &file, &in_file, &column, &column_type, &value, &db.message()])
            .await
            .map_err(|e| classify(&e, &self.ctx()))?;
        Ok(())
    }
}

#[async_trait]
impl Warehouse for RedshiftSink {
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
        RedshiftSink::connect(self).await
    }

    async fn begin(&mut self, mode: Mode) -> Result<()> {
        self.session.connected()?;
        self.session.take_deferred();
        // Schema changes a failed attempt found it could not make inside
        // its transaction: made now, before this one opens.
        for (dest, schema, origin) in std::mem::take(&mut self.pending) {
            self.load_table(&dest).await?;
            self.change_table(&dest, &schema, &origin).await?;
        }
        self.defer(BEGIN);
        self.staging_in_txn.clear();
        self.touched.clear();
        self.dropped.clear();
        self.ddl_in_txn = false;
        self.mode = mode;
        self.now = timestamp_literal(chrono::Utc::now());
        Ok(())
    }

    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()> {
        let ctx = self.ctx().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
        let mut statements = Vec::new();
        if self.mode == Mode::Commit && std::time::Instant::now() >= self.prune_at {
            self.prune_at = std::time::Instant::now() + DELETED_ROWS_PRUNE_INTERVAL;
            let hours = i64::try_from(self.config.deleted_rows_retention_hours).unwrap_or(i64::MAX / 3_600_000);
            let before = chrono::Utc::now() - chrono::Duration::hours(hours.min(24 * 365 * 100));
            statements.push(prune_deleted_sql(&timestamp_literal(before)));
        }
        if !offsets.is_empty() {
            // Runners commit their offsets one at a time: the fence check
            // and the replacement see no other runner's move in between.
            let sql = lock_sql(&offsets_table());
            self.defer(&sql);
        }
        if offsets.iter().any(|m| m.fence != Fence::Unchecked) {
            let rows = self.query(&stored_offsets_sql(&self.consumer_group), &ctx).await?;
            let stored: HashMap<(String, i32), i64> = rows
                .iter()
                .map(|r| ((r.get::<_, String>(0), r.get::<_, i32>(1)), r.get::<_, i64>(2)))
                .collect();
            let fenced_moves = offsets
                .iter()
                .filter(|m| {
                    let now = stored.get(&(m.topic.to_string(), m.partition)).copied();
                    match m.fence {
                        Fence::Unchecked => false,
                        Fence::Absent => now.is_some(),
                        Fence::At(at) => now != Some(at),
                    }
                })
                .count();
            if fenced_moves > 0 {
                return Err(fenced(&format!(
                    "{fenced_moves} of {} partitions not at their expected offset",
                    offsets.iter().filter(|m| m.fence != Fence::Unchecked).count()
                )));
            }
        }
        statements.extend(offsets_sql(&self.consumer_group, offsets));
        if !statements.is_empty() {
            self.exec(&statements, &ctx).await?;
        }
        if self.mode == Mode::Trial {
            self.rollback().await;
            return Ok(());
        }
        self.exec(&["COMMIT".to_string()], &ctx).await?;
        self.staging_in_txn.clear();
        self.touched.clear();
        self.dropped.clear();
        self.ddl_in_txn = false;
        Ok(())
    }

    async fn abort(&mut self) {
        self.rollback().await;
    }

    fn failed(&mut self, error: Error) -> Error {
        if error.kind() != ErrorKind::Permanent {
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
        let name = dest.quoted();
        crate::sink::schema::differences(&RedshiftDialect, &name, schema, origin, &shape, self.evolution(), |c| {
            vec![change_sql(dest, c).unwrap_or_else(|e| e.to_string())]
        })
        .map(Some)
    }

    async fn reconcile(&mut self, dest: &DestinationTable, schema: &TableSchema, origin: &str) -> Result<()> {
        let fingerprint = schema_fingerprint(schema);
        if self.dropped.contains(dest) {
            return self.recreate_in_transaction(dest, schema, origin).await;
        }
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        if self.tables.get(dest).is_some_and(|s| s.reconciled.contains(&fingerprint)) {
            return Ok(());
        }
        let planned = match self.plan_for(dest, schema, origin) {
            Err(e) if e.class() == KEY_CHANGED_CLASS => return self.make_anew(dest, schema, origin, e).await,
            other => other?,
        };
        if !planned.is_empty() {
            if self.touched.contains(dest) {
                self.pending.push((dest.clone(), Arc::new(schema.clone()), origin.to_string()));
                return Err(Error::retryable(format!(
                    "destination table {dest} needs a schema change after this batch already wrote to it; \
                     the change is made before the batch is applied again"
                ))
                .with_class("redshift.schema_change_mid_batch"));
            }
            self.change_table(dest, schema, origin).await?;
        }
        if let Some(state) = self.tables.get_mut(dest) {
            state.reconciled.insert(fingerprint);
        }
        Ok(())
    }

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        self.touched.insert(dest.clone());
        self.exec(&[drop_table_sql(dest), forget_deleted_sql(dest)], &ctx).await?;
        self.tables.remove(dest);
        self.dropped.insert(dest.clone());
        self.ddl_in_txn = true;
        info!(table = %dest, "dropped destination table (the source table was dropped)");
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let (commit, index) = position_i64(at)?;
        self.lock_for_write(dest);
        let mut statements = vec![truncate_older_sql(dest, commit, index)];
        if keeps_removal(at) {
            let entry = self.query(&table_entry_sql(dest), &ctx).await?;
            let stored = entry.first().map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)));
            match stored {
                Some(p) if p >= (commit, index) => {
                    // A newer removal is kept; older key entries still go.
                    let all = removed_before_sql(dest, commit, index, false, &self.now);
                    statements.extend(all.into_iter().skip(1));
                }
                _ => statements.extend(removed_before_sql(dest, commit, index, stored.is_some(), &self.now)),
            }
        }
        self.exec(&statements, &ctx).await
    }

    async fn forget_positions(&mut self, dest: &DestinationTable, reset: u64) -> Result<()> {
        let ctx = self.ctx().in_table(dest.to_string());
        let reset = reset_i64(reset)?;
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        let exists = self.state(dest)?.shape.exists && !self.dropped.contains(dest);
        // The locks come before the look at the resets table: each member
        // sees a reset on its own partitions, and a member that read it
        // while another's forgetting was not committed forgot again, after
        // the other had written copy rows, which the copy's end then
        // removed as older than the copy (the fault suite's
        // postgres-redshift, seed 9948827786508112435). The table first,
        // then the resets table: a batch writes one table, so no two
        // batches take them in the other order.
        if exists {
            self.lock_for_write(dest);
        }
        self.defer(&lock_sql(&resets_table()));
        let done = self.query(&reset_of_sql(dest), &ctx).await?;
        if done.first().is_some_and(|r| r.get::<_, i64>(0) >= reset) {
            return Ok(());
        }
        self.exec(&forget_positions_sql(dest, exists, reset), &ctx).await
    }

    async fn write(
        &mut self,
        dest: &DestinationTable,
        changes: &Reduction<'_>,
        _after_load: bool,
    ) -> Result<(), ApplyError> {
        self.lock_for_write(dest);
        for group in &changes.groups {
            if group.upserts == 0 && group.deletes == 0 {
                continue;
            }
            self.stage_and_apply(dest, group).await?;
        }
        Ok(())
    }

    /// Redshift has no savepoints: a probe runs in a transaction of its own.
    async fn savepoint(&mut self) -> Result<()> {
        self.restart_transaction().await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        self.restart_transaction().await
    }

    /// One query on the schema session (autocommit: the rows as committed,
    /// outside the batches' transaction), each column read as its
    /// destination type says ([`ReadBack`]).
    async fn read_range(
        &mut self,
        table: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
    ) -> Result<Option<Vec<tributary_schemas::Row>>> {
        let ctx = self.ctx().in_table(table.to_string());
        let kinds = match self.read_kinds(table, schema).await? {
            Some(kinds) => kinds,
            None => return Ok(Some(Vec::new())),
        };
        let sql = read_range_sql(table, schema, &kinds, range)
            .map_err(|e| Error::permanent(e).with_table(schema.id.clone()))?;
        let kinds: Vec<ReadBack> = kinds.into_iter().map(|(k, _)| k).collect();
        let rows = self.catalog(&sql, &[], &ctx).await?;
        rows.iter()
            .map(|r| read_row(r, schema, &kinds))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

#[async_trait]
impl WarehouseSink for RedshiftSink {
    fn apply_span(&self, batch: &SinkBatch) -> Span {
        info_span!("redshift_apply", table = %batch.table, records = batch.records.len())
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.connect().await?;
        let ctx = self.ctx().in_table(format!("{BOOKKEEPING_SCHEMA}.{OFFSETS_TABLE}"));
        let sql = stored_offsets_sql(&self.consumer_group);
        let rows = match self.catalog(&sql, &[], &ctx).await {
            Ok(rows) => rows,
            Err(e) => return Err(self.failed(e)),
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
        RedshiftSink::delete_copy(self, drop).await
    }

    fn destinations(&self) -> impl Fn(&TableId) -> DestinationTable + Send + Sync + 'static {
        let config = self.config.clone();
        move |t: &TableId| config.destination(t)
    }
}

fn schema_fingerprint(schema: &TableSchema) -> u64 {
    let mut h = DefaultHasher::new();
    schema.hash(&mut h);
    h.finish()
}
