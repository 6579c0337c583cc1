//! The BigQuery sink: keeps a copy of each source table in BigQuery, with
//! exactly-once effect. A [`Warehouse`] of the core
//! (`crate::sink::warehouse`), which decides the order of everything; this
//! module says how BigQuery does each step.
//!
//! # How a batch is applied
//!
//! 1. The destination table is created or evolved for every schema version in
//!    the batch (`CREATE TABLE` with the key declared `NOT ENFORCED` and
//!    clustered on it; `ADD COLUMN`, `DROP NOT NULL`, `SET DATA TYPE` to
//!    widen). DDL cannot run inside a BigQuery transaction, so it runs first;
//!    every statement is idempotent (`IF NOT EXISTS`, relaxing twice is a
//!    no-op), so a crash after it and a replay are harmless.
//! 2. The batch is reduced to the last event per key.
//! 3. The survivors are streamed (`tabledata.insertAll`) into the staging
//!    table of the destination table's column set (in the bookkeeping
//!    dataset, reused across batches), tagged with the write's own id
//!    (a batch writes a table once per run of changes between its reset,
//!    truncate and table-copied records; each MERGE reads its run only).
//! 4. One script: `BEGIN TRANSACTION`; a truncate's guarded `DELETE`; **one
//!    `MERGE`** per destination table that inserts, updates and deletes,
//!    guarded by the row's stored source position so that a replay never
//!    moves a row backwards; a `MERGE` of the batch's Kafka offsets into the
//!    offsets table; `COMMIT TRANSACTION`. Rows and offsets become visible
//!    together or not at all.
//! 5. The attempt's staged rows are deleted where BigQuery allows it (not
//!    while they are in the streaming buffer: partition expiry takes them).
//!
//! Talks to BigQuery's REST API through `gcp-bigquery-client` ([`client`]).
//! The same code runs against a real project (service-account key file or
//! application default credentials) and against an emulator
//! (`emulator_url`, no credentials). The Storage Write API's CDC mode
//! (`_CHANGE_TYPE`) is not provided: see `docs/destinations/bigquery.md`.
//!
//! # Errors
//!
//! [`client::classify`] and [`client::classify_proto`] map BigQuery's HTTP
//! status and error reasons to an error kind; nothing else decides. A row
//! that `insertAll` refuses is a permanent error of that record, with
//! BigQuery's reason.

pub mod check;
pub mod client;
pub mod config;
pub mod dialect;
pub mod types;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use async_trait::async_trait;
use gcp_bigquery_client::error::BQError;
use gcp_bigquery_client::model::query_response::{QueryResponse, ResultSet};
use gcp_bigquery_client::model::table_data_insert_all_request::TableDataInsertAllRequest;
use serde_json::{Map, Value as Json};
use tracing::{debug, info, info_span, Span};
use tributary_operations::config::{ConfigError, Validate};
use tributary_schemas::{Position, Row, TableId, TableSchema};

use self::client::{redact, BqClient, Ctx};
pub use self::config::{BigQuerySinkConfig, DestinationTable};
use self::dialect::{
    change_sql, deleted_merge_sql, deleted_table_ddl, fence_sql, forget_deleted_sql, forget_positions_sql, keyless_sql,
    merge_sql, offsets_merge_sql, prune_deleted_sql, quote_string, read_range_sql, removed_before_sql,
    staging_table_sql, truncate_older_sql, BigQueryDialect, BATCH_COLUMN, QUOTING,
};
use self::types::{bigquery_type, from_cell, from_metadata, to_json, BqType};
use crate::error::{Error, ErrorKind, Result};
use crate::problem::Problem;
use crate::sink::bookkeeping::{
    key_text, staging_name, OffsetMove, COMMIT_COLUMN, DELETED_TABLE, DELETE_COLUMN, INDEX_COLUMN, KEY_COLUMN,
    OFFSETS_TABLE, RESETS_TABLE, ROW_COLUMN,
};
use crate::sink::keyless;
use crate::sink::reduce::{key_bytes, Reduction};
use crate::sink::schema::{plan, Evolution, ShapeColumn, TableChange, TableShape, KEY_CHANGED_CLASS};
use crate::sink::script::{self, Script, Scripted};
use crate::sink::verify::KeyRange;
use crate::sink::warehouse::{Mode, Warehouse, WarehouseSink};
use crate::sink::{ApplyError, SinkBatch};

/// Prefix of staging table names.
const STAGING_PREFIX: &str = "stage_";

/// What the sink knows about one destination table.
#[derive(Debug, Clone, Default)]
struct TableState {
    shape: TableShape<BqType>,
    /// Fingerprints of the source schemas already reconciled with it.
    reconciled: HashSet<u64>,
}

/// One reduced row, staged for the `MERGE`.
struct StagedRow {
    record: usize,
    table: TableId,
    json: Map<String, Json>,
}

/// The BigQuery [`Sink`](crate::Sink).
pub struct BigQuerySink {
    config: BigQuerySinkConfig,
    consumer_group: String,
    client: BqClient,
    bookkeeping_ready: bool,
    /// Whether the resets table is known to exist.
    resets_ready: bool,
    tables: HashMap<DestinationTable, TableState>,
    /// Staging tables known to exist.
    stages: HashSet<String>,
    merges: u64,
    /// The open attempt's statements, run as one transaction at its end.
    script: Script,
    /// What the open attempt staged: each write's staging table and id.
    /// Every write has its own id, and its `MERGE` reads only its rows: a
    /// unit writes a table once per run of changes between its reset,
    /// truncate and table-copied records.
    staged: Vec<(String, String)>,
}

impl std::fmt::Debug for BigQuerySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigQuerySink")
            .field("config", &self.config)
            .field("connected", &self.client.is_built())
            .finish()
    }
}

impl BigQuerySink {
    /// A sink for `config`; it connects on first use, so that a destination
    /// that cannot be reached pauses the runner instead of failing its start.
    pub fn new(config: BigQuerySinkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let consumer_group = config
            .consumer_group
            .clone()
            .ok_or_else(|| ConfigError::invalid("bigquery.consumer_group", "is required"))?;
        Ok(Self {
            client: BqClient::new(&config),
            config,
            consumer_group,
            bookkeeping_ready: false,
            resets_ready: false,
            tables: HashMap::new(),
            stages: HashSet::new(),
            merges: 0,
            script: Script::default(),
            staged: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BigQuerySinkConfig {
        &self.config
    }

    /// The destination table of a source table.
    pub fn destination(&self, source: &TableId) -> DestinationTable {
        self.config.destination(source)
    }

    /// `MERGE` statements run so far (a cost proxy: each one scans the
    /// destination table's clustered blocks that the keys touch).
    pub fn merges(&self) -> u64 {
        self.merges
    }

    fn offsets_table(&self) -> String {
        format!("`{}.{}.{OFFSETS_TABLE}`", self.config.project, self.config.bookkeeping_dataset)
    }

    fn deleted_table(&self) -> String {
        format!("`{}.{}.{DELETED_TABLE}`", self.config.project, self.config.bookkeeping_dataset)
    }

    fn resets_table(&self) -> String {
        format!("`{}.{}.{RESETS_TABLE}`", self.config.project, self.config.bookkeeping_dataset)
    }

    fn staging_table(&self, stage: &str) -> String {
        format!("`{}.{}.{stage}`", self.config.project, self.config.bookkeeping_dataset)
    }

    /// Builds the client (if not built) and makes sure the bookkeeping
    /// dataset and offsets table exist.
    pub async fn connect(&mut self) -> Result<()> {
        if !self.client.is_built() {
            self.client.build().await?;
            info!(project = %self.config.project, emulator = self.config.emulator_url.is_some(), "BigQuery client ready");
        }
        if !self.bookkeeping_ready {
            let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
            self.ensure_dataset(&self.config.bookkeeping_dataset.clone()).await?;
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {} (consumer_group STRING NOT NULL, topic STRING NOT NULL, \
                 `partition` INT64 NOT NULL, next_offset INT64 NOT NULL)",
                self.offsets_table()
            );
            let hint = |e: Error| {
                if e.kind() == ErrorKind::NeedsOperator {
                    e.with_hint("grant the sink's principal roles/bigquery.dataEditor on the bookkeeping dataset and roles/bigquery.jobUser on the project")
                } else {
                    e
                }
            };
            self.client.query(&sql, &ctx).await.map_err(hint)?;
            self.client
                .query(&deleted_table_ddl(&self.deleted_table()), &ctx)
                .await
                .map_err(hint)?;
            self.bookkeeping_ready = true;
        }
        Ok(())
    }

    async fn ensure_dataset(&self, dataset: &str) -> Result<()> {
        let location = self
            .config
            .location
            .as_deref()
            .map(|l| format!(" OPTIONS (location = {})", quote_string(l)))
            .unwrap_or_default();
        let sql = format!("CREATE SCHEMA IF NOT EXISTS `{}.{dataset}`{location}", self.config.project);
        self.client.query(&sql, &Ctx::table(dataset)).await.map(|_| ())
    }

    /// Forgets the client and everything cached.
    fn reset(&mut self) {
        self.client.reset();
        self.bookkeeping_ready = false;
        self.resets_ready = false;
        self.tables.clear();
        self.stages.clear();
    }

    /// Removes this copy from BigQuery: its stored offsets and, when `drop`
    /// lists them, the destination tables of those source tables.
    pub async fn delete_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.connect().await?;
        let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
        let sql = format!(
            "DELETE FROM {} WHERE consumer_group = {}",
            self.offsets_table(),
            quote_string(&self.consumer_group)
        );
        self.client.query(&sql, &ctx).await?;
        let mut done = vec![format!("stored offsets of consumer group {}", self.consumer_group)];
        for source in drop {
            let dest = self.destination(source);
            self.client
                .query(&format!("DROP TABLE IF EXISTS {}", dest.quoted()), &Ctx::table(&dest))
                .await?;
            self.client
                .query(&forget_deleted_sql(&self.deleted_table(), &dest), &Ctx::table(&dest))
                .await?;
            done.push(format!("destination table {dest}"));
        }
        self.tables.clear();
        Ok(done)
    }

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
        let ctx = Ctx::table(dest);
        let response = self
            .client
            .query(&keyless::current_rows_sql(QUOTING, &dest.quoted()), &ctx)
            .await?;
        let mut rs = ResultSet::new_from_query_response(response);
        let current = rs.next_row() && rs.get_i64(0).ok().flatten().unwrap_or(1) > 0;
        if current {
            return Err(changed);
        }
        info!(table = %dest, reason = %changed, "making the destination table anew: its source table gained or lost its key");
        self.client
            .query(&format!("DROP TABLE IF EXISTS {}", dest.quoted()), &ctx)
            .await?;
        self.client
            .query(&forget_deleted_sql(&self.deleted_table(), dest), &ctx)
            .await?;
        self.tables.remove(dest);
        Ok(())
    }

    /// Runs a read-only query for the setup check.
    pub(super) async fn probe_query(&mut self, sql: &str) -> Result<QueryResponse> {
        self.client.build().await?;
        self.client.query(sql, &Ctx::default()).await
    }

    /// Reads a table's columns from `tables.get` (free, unlike
    /// INFORMATION_SCHEMA).
    async fn load_table(&mut self, dest: &DestinationTable) -> Result<()> {
        let mut state = TableState::default();
        if let Some(table) = self.client.get_table(dest).await? {
            state.shape.exists = true;
            for f in table.schema.fields.unwrap_or_default() {
                let type_name = serde_json::to_value(&f.r#type)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let mode = f.mode.as_deref().unwrap_or("NULLABLE");
                let ty = from_metadata(&type_name, None, None, mode == "REPEATED").ok_or_else(|| {
                    Error::needs_operator(format!(
                        "column {} has type {type_name}, which the sink does not write",
                        f.name
                    ))
                    .with_column(f.name.clone())
                })?;
                state
                    .shape
                    .columns
                    .push(ShapeColumn { name: f.name, ty, not_null: mode == "REQUIRED" });
            }
        }
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    /// Streams `rows` into the staging table `stage`. A refused row is a
    /// permanent error of its record, with BigQuery's reason.
    async fn insert_staging(
        &self,
        dest: &DestinationTable,
        stage: &str,
        write: &str,
        rows: &[StagedRow],
    ) -> Result<(), ApplyError> {
        let ctx = Ctx::table(dest);
        for (chunk_no, chunk) in rows.chunks(self.config.insert_chunk_rows).enumerate() {
            let mut request = TableDataInsertAllRequest::new();
            // Insert the valid rows and report the others one by one
            // (without it bqemulator fails the whole request with a 500).
            request.skip_invalid_rows();
            for row in chunk {
                let mut json = row.json.clone();
                json.insert(BATCH_COLUMN.into(), Json::String(write.to_string()));
                request
                    .add_row(None, &json)
                    .map_err(|e| Error::permanent(format!("cannot serialise a staging row: {e}")))?;
            }
            let response = self
                .client
                .insert_all(&self.config.bookkeeping_dataset, stage, request, &ctx)
                .await?;
            let refused = response.insert_errors.unwrap_or_default();
            // BigQuery marks the rows it did not insert only because another
            // row failed as `stopped`; the culprit has another reason.
            let culprit = refused.iter().find_map(|e| {
                let errors = e.errors.as_deref().unwrap_or_default();
                let real = errors.iter().find(|p| p.reason.as_deref() != Some("stopped"))?;
                Some((e.index.unwrap_or(0), real.clone()))
            });
            if let Some((index, proto)) = culprit {
                let at = chunk_no * self.config.insert_chunk_rows + usize::try_from(index).unwrap_or(0);
                let row = rows.get(at).ok_or_else(|| {
                    Error::retryable(format!("BigQuery refused row {at} of a staging request of {} rows", chunk.len()))
                })?;
                let reason = proto.reason.clone().unwrap_or_else(|| "invalid".into());
                let mut error = Error::permanent(format!(
                    "BigQuery refused the row: {reason}: {}",
                    redact(proto.message.as_deref().unwrap_or(""))
                ))
                .with_class(format!("bigquery.{reason}"))
                .with_table(row.table.clone());
                if let Some(column) = proto.location.as_deref().filter(|l| !l.is_empty()) {
                    error = error.with_column(column.to_string());
                }
                return Err(ApplyError { error, record: Some(row.record) });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Scripted for BigQuerySink {
    fn script(&mut self) -> &mut Script {
        &mut self.script
    }

    /// One multi-statement request: the fence, the statements and, when
    /// there are some, the offsets `MERGE`, committed or rolled back.
    async fn run_transaction(&mut self, offsets: &[OffsetMove<'_>], commit: bool) -> Result<()> {
        let mut sql = String::from("BEGIN TRANSACTION;\n");
        // First: a member that lost its partitions writes nothing.
        if let Some(fence) = fence_sql(&self.offsets_table(), &self.consumer_group, offsets) {
            sql.push_str(&fence);
            sql.push_str(";\n");
        }
        if self.script.prune_due(commit) {
            sql.push_str(&prune_deleted_sql(&self.deleted_table(), self.config.deleted_rows_retention_hours));
            sql.push_str(";\n");
        }
        for s in self.script.statements() {
            sql.push_str(s);
            sql.push_str(";\n");
        }
        if !offsets.is_empty() {
            sql.push_str(&offsets_merge_sql(&self.offsets_table(), &self.consumer_group, offsets));
            sql.push_str(";\n");
        }
        sql.push_str(if commit {
            "COMMIT TRANSACTION;"
        } else {
            "ROLLBACK TRANSACTION;"
        });
        // Row writes: the MERGEs into destination tables, not those that
        // keep deleted rows' positions.
        let bookkeeping = format!("MERGE {}", self.deleted_table());
        let merges = self
            .script
            .statements()
            .iter()
            .filter(|s| s.starts_with("MERGE") && !s.starts_with(&bookkeeping))
            .count() as u64;
        self.client.query(&sql, &Ctx::default()).await?;
        if commit {
            self.merges += merges;
        }
        Ok(())
    }

    /// Deletes the attempt's staged rows, whatever happened to it.
    async fn clean_staging(&mut self) {
        let mut by_stage: Vec<(String, Vec<String>)> = Vec::new();
        for (stage, write) in std::mem::take(&mut self.staged) {
            match by_stage.iter_mut().find(|(s, _)| *s == stage) {
                Some((_, writes)) => writes.push(quote_string(&write)),
                None => by_stage.push((stage, vec![quote_string(&write)])),
            }
        }
        for (stage, writes) in by_stage {
            let sql = format!(
                "DELETE FROM {} WHERE {} IN ({})",
                self.staging_table(&stage),
                dialect::quote_ident(BATCH_COLUMN),
                writes.join(", ")
            );
            if let Err(e) = self.client.query(&sql, &Ctx::table(&stage)).await {
                // BigQuery refuses DML on rows still in the streaming
                // buffer; they are never read again (each MERGE filters on
                // its own write id) and go with the partition expiry.
                debug!(staging = %stage, error = %e, "staged rows left in place");
            }
        }
    }
}

/// The staging rows of `changes`: per live line its columns (a delete only
/// its key) as BigQuery JSON in the destination's types, the delete flag and
/// the position.
fn staging_rows(changes: &Reduction<'_>, state: &TableState) -> Result<Vec<StagedRow>, ApplyError> {
    let mut rows = Vec::new();
    let names = changes.column_names();
    for (group, line) in changes.live() {
        let mut json = Map::new();
        // The columns this row's version lacks (the MERGE sets every
        // version's columns): what the source gave them.
        let absent: Vec<(&str, tributary_schemas::Value)> = if line.delete {
            Vec::new()
        } else {
            names
                .iter()
                .filter(|n| group.schema.column_index(n).is_none())
                .filter_map(|n| Some((*n, changes.absent_value(group, n)?)))
                .collect()
        };
        let written = group
            .schema
            .columns
            .iter()
            .zip(line.row)
            .enumerate()
            .filter(|(i, _)| group.writes(line, *i))
            .map(|(_, (col, value))| (col.name.as_str(), &col.data_type, value));
        let filled = absent.iter().filter_map(|(n, v)| {
            let ty = &changes
                .groups
                .iter()
                .find_map(|g| g.schema.columns.iter().find(|c| c.name == *n))?
                .data_type;
            Some((*n, ty, v))
        });
        for (name, data_type, value) in written.chain(filled) {
            let ty = state
                .shape
                .column(name)
                .map_or_else(|| bigquery_type(data_type), |c| c.ty.clone());
            let v = to_json(value, &ty).map_err(|reason| ApplyError {
                error: Error::permanent(format!("column {name}: {reason} (value type {})", value.kind()))
                    .with_column(name.to_string())
                    .with_class("tributary.value")
                    .with_table(group.schema.id.clone()),
                record: Some(line.record),
            })?;
            json.insert(name.to_string(), v);
        }
        json.insert(DELETE_COLUMN.into(), Json::Bool(line.delete));
        let key = match &line.instance {
            // A keyless table's row: its content key and name.
            Some(instance) => {
                json.insert(ROW_COLUMN.into(), Json::String(instance.row.clone()));
                instance.content.clone()
            }
            None => key_text(&key_bytes(&group.schema, line.row, &group.key).map_err(|error| ApplyError {
                error: error.with_table(group.schema.id.clone()),
                record: Some(line.record),
            })?),
        };
        json.insert(KEY_COLUMN.into(), Json::String(key));
        json.insert(COMMIT_COLUMN.into(), Json::from(line.commit));
        json.insert(INDEX_COLUMN.into(), Json::from(line.index));
        rows.push(StagedRow {
            record: line.record,
            table: group.schema.id.clone(),
            json,
        });
    }
    Ok(rows)
}

#[async_trait]
impl Warehouse for BigQuerySink {
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
        BigQuerySink::connect(self).await
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

    /// Forgets cached state after an error that is not about the data: the
    /// retry starts from BigQuery's own view (a table may have been dropped
    /// or changed by someone else).
    fn failed(&mut self, error: Error) -> Error {
        if error.kind() != ErrorKind::Permanent {
            self.tables.clear();
            self.stages.clear();
            if error.kind() == ErrorKind::NeedsOperator {
                self.reset();
            }
        }
        error
    }

    /// Makes the destination table fit `schema`: creates it, adds columns,
    /// widens types, relaxes REQUIRED columns.
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
        let ctx = Ctx::table(dest);
        let mut state = self.tables.get(dest).cloned().unwrap_or_default();
        let changes = match plan(&BigQueryDialect, &dest.to_string(), schema, origin, &state.shape, self.evolution()) {
            Err(e) if e.class() == KEY_CHANGED_CLASS => {
                self.make_anew(dest, e).await?;
                state = TableState::default();
                plan(&BigQueryDialect, &dest.to_string(), schema, origin, &state.shape, self.evolution())?
            }
            other => other?,
        };
        if !state.shape.exists {
            self.ensure_dataset(&dest.dataset).await?;
        }
        for change in &changes {
            if let TableChange::RenameColumn { from, .. } = change {
                // Renamed already (by another runner of the group, or before
                // a restart where `tables.get` lags behind, as the
                // emulator's does): a query naming the old column is refused.
                let probe = format!("SELECT {} FROM {} LIMIT 0", dialect::quote_ident(from), dest.quoted());
                match self.client.query(&probe, &ctx).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Permanent => continue,
                    Err(e) => return Err(e),
                }
            }
            for statement in change_sql(dest, change, self.config.declare_primary_key) {
                info!(table = %dest, ddl = %statement, "changing destination table");
                self.client.query(&statement, &ctx).await?;
            }
        }
        // The cache is updated from what was done, not read back: bqemulator's
        // tables.get does not see ALTER TABLE (and re-running the idempotent
        // DDL after a restart is harmless).
        state.shape.apply(&changes);
        state.reconciled.insert(fingerprint);
        self.tables.insert(dest.clone(), state);
        Ok(())
    }

    async fn drop_table(&mut self, dest: &DestinationTable) -> Result<()> {
        // DDL cannot run inside a transaction (`script::commit_before_ddl`).
        if script::commit_before_ddl(self).await? {
            self.client
                .query(&format!("DROP TABLE IF EXISTS {}", dest.quoted()), &Ctx::table(dest))
                .await?;
            self.client
                .query(&forget_deleted_sql(&self.deleted_table(), dest), &Ctx::table(dest))
                .await?;
            self.tables.remove(dest);
            info!(table = %dest, "dropped destination table (the source table was dropped)");
        }
        Ok(())
    }

    async fn truncate(&mut self, dest: &DestinationTable, at: Position) -> Result<()> {
        let (commit, index) = crate::sink::bookkeeping::position_i64(at)?;
        self.script.push(truncate_older_sql(dest, commit, index));
        if crate::sink::bookkeeping::keeps_removal(at) {
            self.script
                .extend(removed_before_sql(&self.deleted_table(), dest, commit, index));
        }
        Ok(())
    }

    async fn forget_positions(&mut self, dest: &DestinationTable, reset: u64) -> Result<()> {
        let reset = crate::sink::bookkeeping::reset_i64(reset)?;
        if !self.resets_ready {
            // DDL cannot run inside the batch's transaction; made once,
            // idempotent, and harmless if the batch then fails.
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {} (destination STRING NOT NULL, reset INT64 NOT NULL)",
                self.resets_table()
            );
            self.client
                .query(&sql, &Ctx::table(format!("{}.{RESETS_TABLE}", self.config.bookkeeping_dataset)))
                .await?;
            self.resets_ready = true;
        }
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        let exists = self.tables.get(dest).is_some_and(|s| s.shape.exists);
        let resets = self.resets_table();
        self.script
            .extend(forget_positions_sql(dest, exists, &resets, &self.deleted_table(), reset));
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
        let rows = staging_rows(changes, state)?;
        if rows.is_empty() {
            return Ok(());
        }
        // The destination's columns that some schema of the batch has.
        let columns: Vec<ShapeColumn<BqType>> = changes
            .column_names()
            .into_iter()
            .filter_map(|n| state.shape.column(n).cloned())
            .collect();
        let key = changes.groups.first().map(|g| g.schema.key.clone()).unwrap_or_default();
        let stage = staging_name(
            &format!("{STAGING_PREFIX}{}_", staging_base(dest)),
            // Staging tables made before the row column are not reused.
            &ROW_COLUMN,
            &columns.iter().map(|c| (c.name.as_str(), c.ty.to_string())).collect::<Vec<_>>(),
        );
        if !self.stages.contains(&stage) {
            // Long-lived: BigQuery may refuse or delay streaming into a table
            // created moments before. bqemulator has no ingestion-time
            // partitions; it can delete staged rows right away instead.
            let sql = staging_table_sql(&self.staging_table(&stage), &columns, self.config.emulator_url.is_none());
            self.client.query(&sql, &Ctx::table(&stage)).await?;
            self.stages.insert(stage.clone());
        }
        let write = uuid::Uuid::new_v4().simple().to_string();
        self.staged.push((stage.clone(), write.clone()));
        self.insert_staging(dest, &stage, &write, &rows).await?;
        let source = format!(
            "(SELECT * FROM {} WHERE {} = {})",
            self.staging_table(&stage),
            dialect::quote_ident(BATCH_COLUMN),
            quote_string(&write)
        );
        let deleted = self.deleted_table();
        if changes.is_keyless() {
            self.script
                .extend(keyless_sql(&deleted, dest, &source, &columns, changes.parts()));
            debug!(table = %dest, rows = rows.len(), "staged");
            return Ok(());
        }
        if changes.groups.iter().any(|g| g.deletes > 0) {
            self.script.push(deleted_merge_sql(&deleted, dest, &source));
        }
        self.script
            .push(merge_sql(dest, &QUOTING.not_deleted_sql(&deleted, dest, &source), &columns, &key));
        if changes.groups.iter().any(|g| g.upserts > 0) {
            self.script.push(QUOTING.undeleted_sql(&deleted, dest, &source));
        }
        debug!(table = %dest, rows = rows.len(), "staged");
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<()> {
        script::savepoint(self)
    }

    /// A probe's statements run now, in a transaction rolled back, so that
    /// the `MERGE` itself is tried.
    async fn verify(&mut self) -> Result<(), ApplyError> {
        script::verify(self).await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        script::abort(self).await;
        Ok(())
    }

    /// One query per range, outside any transaction (a unit's statements
    /// run as one script at its end, so none is open here).
    async fn read_range(
        &mut self,
        dest: &DestinationTable,
        schema: &TableSchema,
        range: &KeyRange,
    ) -> Result<Option<Vec<Row>>> {
        if !self.tables.contains_key(dest) {
            self.load_table(dest).await?;
        }
        // A query of a missing table fails (on the emulator as access
        // denied): it has no rows.
        if !self.tables.get(dest).is_some_and(|s| s.shape.exists) {
            return Ok(Some(Vec::new()));
        }
        let sql = read_range_sql(dest, schema, range).map_err(|e| Error::permanent(e).with_table(schema.id.clone()))?;
        let result = self.client.query_rows(&sql, &Ctx::table(dest)).await?;
        debug!(table = %dest, rows = result.rows.len(), bytes_processed = ?result.bytes_processed, "read a range back");
        rows_read_back(schema, &result.columns, result.rows)
    }
}

/// The rows of a range's query as the values of `schema`'s columns:
/// `columns` are the result's (type, repeated), in the schema's order.
fn rows_read_back(schema: &TableSchema, columns: &[(String, bool)], rows: Vec<Vec<Json>>) -> Result<Option<Vec<Row>>> {
    let fail = |column: &str, why: String| {
        Error::permanent(why)
            .with_column(column.to_string())
            .with_class("tributary.verify")
            .with_table(schema.id.clone())
    };
    if columns.len() != schema.columns.len() {
        return Err(Error::permanent(format!(
            "reading a range back gave {} columns for {}",
            columns.len(),
            schema.columns.len()
        ))
        .with_table(schema.id.clone()));
    }
    let mut types = Vec::with_capacity(columns.len());
    for (c, (type_name, repeated)) in schema.columns.iter().zip(columns) {
        let ty = from_metadata(type_name, None, None, *repeated)
            .ok_or_else(|| fail(&c.name, format!("BigQuery answered its values as {type_name}")))?;
        types.push(ty);
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if row.len() != types.len() {
            return Err(Error::retryable(format!(
                "BigQuery answered a row of {} cells for {} columns",
                row.len(),
                types.len()
            ))
            .with_table(schema.id.clone()));
        }
        let mut values = Vec::with_capacity(schema.columns.len());
        for ((c, ty), cell) in schema.columns.iter().zip(&types).zip(&row) {
            let value = from_cell(cell, ty, c).map_err(|why| {
                fail(&c.name, format!("{why} (BigQuery type {ty}, source type {}): not read back exactly", c.data_type))
            })?;
            values.push(value);
        }
        out.push(values);
    }
    Ok(Some(out))
}

/// The readable part of a staging table's name: dataset and table, with
/// anything BigQuery does not allow in a name replaced.
fn staging_base(dest: &DestinationTable) -> String {
    format!("{}_{}", dest.dataset, dest.table)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(200)
        .collect()
}

#[async_trait]
impl WarehouseSink for BigQuerySink {
    fn apply_span(&self, batch: &SinkBatch) -> Span {
        info_span!("bigquery_apply", table = %batch.table, records = batch.records.len())
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        if let Err(e) = self.connect().await {
            return Err(self.failed(e));
        }
        let ctx = Ctx::table(format!("{}.{OFFSETS_TABLE}", self.config.bookkeeping_dataset));
        let sql = format!(
            "SELECT topic, `partition`, next_offset FROM {} WHERE consumer_group = {}",
            self.offsets_table(),
            quote_string(&self.consumer_group)
        );
        let response = match self.client.query(&sql, &ctx).await {
            Ok(r) => r,
            Err(e) => return Err(self.failed(e)),
        };
        let mut rs = ResultSet::new_from_query_response(response);
        let mut stored: HashMap<(String, i32), i64> = HashMap::new();
        while rs.next_row() {
            let bad = |e: BQError| Error::retryable(format!("unreadable offsets row: {e}"));
            let topic = rs.get_string(0).map_err(bad)?;
            let partition = rs.get_i64(1).map_err(bad)?;
            let next = rs.get_i64(2).map_err(bad)?;
            if let (Some(t), Some(p), Some(n)) = (topic, partition, next) {
                stored.insert((t, i32::try_from(p).unwrap_or(-1)), n);
            }
        }
        Ok(partitions.iter().map(|(t, p)| stored.get(&(t.clone(), *p)).copied()).collect())
    }

    async fn problems(&mut self) -> Vec<Problem> {
        check::run(self).await
    }

    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        BigQuerySink::delete_copy(self, drop).await
    }

    fn destinations(&self) -> impl Fn(&TableId) -> DestinationTable + Send + Sync + 'static {
        let config = self.config.clone();
        move |t: &TableId| config.destination(t)
    }
}
