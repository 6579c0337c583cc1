//! MySQL and MariaDB: a source reading a consistent snapshot, then the
//! binlog.
//!
//! The source ([`MySqlSource`]) copies the selected tables in key-ordered
//! chunks inside one `START TRANSACTION WITH CONSISTENT SNAPSHOT` whose
//! binlog position it knows ([`snapshot`]), then streams the binlog from
//! that position ([`stream`]), decoding every row event with the columns
//! its table had when it was written ([`history`]). See
//! `docs/sources/mysql.md` for the operator's view.
//!
//! # Checkpoint
//!
//! A [`SourceState`] as JSON: the binlog file and position after the last
//! transaction emitted (plus its GTID position), the schema history as of
//! that position, and, while a snapshot is unfinished, per table the last
//! key emitted. The runner stores it in the same Kafka transaction as the
//! events, so a restart resumes exactly after them; there is nothing to
//! release on the server (no slot), and binlog retention is the operator's
//! (`binlog_expire_logs_seconds`).

pub mod check;
pub mod client;
pub mod config;
pub mod gtid;
pub mod history;
pub mod objects;
pub mod rewrites;
pub mod snapshot;
pub mod stream;
pub mod types;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};
use tributary_schemas::{Column, DataType, TableId, TableSchema, Value};

pub use self::config::MySqlSourceConfig;
use self::config::{ConnectionParams, NewTables, SnapshotMode, TableFilter};
use self::history::{AddedDefault, SchemaHistory, TableDef};
use self::snapshot::{SnapshotRun, SnapshotState, TablePlan};
use self::stream::Streamer;
use self::types::{map_type, ColumnCodec};
use crate::error::{Error, Result};
use crate::source::SnapshotTableProgress;
use crate::{Checkpoint, Source, SourceBatch, SourceMessage};

pub use self::client::{classify_my, connect, list_tables, table_def};
pub use self::config::MySqlSourceConfig as Config;

/// The connector's name in every event (Debezium's `source.connector`).
pub const CONNECTOR: &str = "mysql";

/// Version of the checkpoint JSON.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Which server the source talks to: their GTIDs, snapshot positions and
/// privileges differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// MariaDB (`10.11.6-MariaDB`).
    MariaDb,
    /// MySQL (and Percona).
    MySql,
}

impl ServerKind {
    /// From `@@version`.
    pub fn from_version(version: &str) -> Self {
        if version.to_ascii_lowercase().contains("mariadb") {
            ServerKind::MariaDb
        } else {
            ServerKind::MySql
        }
    }
}

/// A binlog coordinate: the start of the next event to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinlogPosition {
    /// File name (`mysql-bin.000003`).
    pub file: String,
    /// Offset in the file.
    pub pos: u64,
}

impl BinlogPosition {
    /// The model's ordered position: file number in the high 32 bits, the
    /// offset in the low 32. Offsets fit: a file grows past
    /// `max_binlog_size` (1 GiB at most) only by one large transaction, and
    /// the servers cannot go past 4 GiB (an event header's next position is
    /// 32 bits; MySQL's manual on `max_binlog_cache_size`: it "cannot work
    /// with binary log positions greater than 4GB"). Streamed positions come
    /// from those headers; a snapshot's, read as text, is checked by
    /// [`BinlogPosition::checked`].
    pub fn ordered(&self) -> u64 {
        let seq: u64 = self.file.rsplit('.').next().and_then(|n| n.parse().ok()).unwrap_or(0);
        seq << 32 | (self.pos & 0xffff_ffff)
    }
}

impl BinlogPosition {
    /// The position, refused when its offset does not fit the 32 bits
    /// [`BinlogPosition::ordered`] keeps (it would wrap, and every change
    /// after it would look older than the rows written before).
    pub fn checked(self) -> Result<Self> {
        if self.pos > u64::from(u32::MAX) {
            return Err(Error::needs_operator(format!(
                "binlog position {self} is beyond 4 GiB in its file: positions there do not fit Tributary's ordering"
            ))
            .with_class("tributary.binlog_offset")
            .with_hint(
                "FLUSH BINARY LOGS on the server (a new file starts at offset 4), then start the runner again; \
                 keep transactions well under 4 GiB",
            ));
        }
        Ok(self)
    }
}

impl std::fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// The source's resumable state, serialized as the [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Format version.
    pub version: u32,
    /// Which server wrote the positions.
    pub server: ServerKind,
    /// Where streaming resumes: after the last transaction emitted.
    pub binlog: BinlogPosition,
    /// The GTID position of the same point (MariaDB `d-s-n,...`, MySQL
    /// GTID set), when the server has GTIDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// Captured tables' definitions as of `binlog`. Not in the checkpoint:
    /// kept beside it, a side record per table (see
    /// [`Source::take_side_records`]); read from checkpoints written
    /// before that.
    #[serde(default, skip_serializing)]
    pub history: SchemaHistory,
    /// Snapshot work not done yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotState>,
    /// The epoch of the positions: the server's identity
    /// (`server_uuid:...` on MySQL, `server_id:...` on MariaDB, which has
    /// no UUID). Another one at start means another server (a failover,
    /// with `resume_by = "gtid"`), whose binlog numbering does not compare
    /// with the checkpoint's. Absent in checkpoints written before epochs:
    /// the first start adopts the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// The part of the transaction starting at `binlog` already emitted,
    /// while one goes out in parts (see [`stream::PartialTxn`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<stream::PartialTxn>,
    /// How many tables the history beside the checkpoint holds, as read
    /// (written from `history` by [`SourceState::to_checkpoint`]): a start
    /// that finds another count of side records stops, instead of reading
    /// rows of tables it would not know.
    #[serde(default, skip_serializing)]
    pub history_tables: Option<usize>,
}

impl SourceState {
    /// The snapshot plan a table to copy, verify or repair joins: the one
    /// not done yet, or a new one from the stream's position (not the
    /// first snapshot).
    fn later_snapshot(&mut self) -> &mut SnapshotState {
        let position = self.binlog.clone();
        self.snapshot.get_or_insert_with(|| SnapshotState {
            initial: false,
            position: Some(position),
            tables: Vec::new(),
        })
    }
}

/// A checkpoint as stored: the state and its history's table count.
#[derive(Serialize)]
struct Stored<'a> {
    #[serde(flatten)]
    state: &'a SourceState,
    history_tables: usize,
}

impl SourceState {
    /// Serializes the state.
    pub fn to_checkpoint(&self) -> Checkpoint {
        Checkpoint::encode(&Stored { state: self, history_tables: self.history.len() })
    }

    /// Parses a checkpoint written by this source.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Result<Self> {
        checkpoint.decode("MySQL", |s: &SourceState| s.version, CHECKPOINT_VERSION)
    }
}

/// What every event of the source carries besides its row.
#[derive(Debug, Clone)]
pub struct EventContext {
    /// The connector kind (`source.connector`).
    pub connector: Arc<str>,
    /// The runner's logical name (`source.name`).
    pub name: Arc<str>,
    /// Database of the URL (`source.db` falls back to it).
    pub db: Arc<str>,
}

/// A table's schema as captured, with how binlog columns map onto it.
#[derive(Debug, Clone)]
pub struct BuiltSchema {
    /// The schema (captured columns only).
    pub schema: Arc<TableSchema>,
    /// For each source column (binlog order), its index in `schema.columns`,
    /// or `None` when excluded.
    pub source_columns: Vec<Option<usize>>,
    /// The codec of each captured column, in `schema.columns` order.
    pub codecs: Vec<ColumnCodec>,
    /// Whether the key is unique (primary key or configured key).
    pub keyed: bool,
}

/// The value rows older than an added column got, decoded like a value of
/// the column in MySQL's text protocol; `None` when it does not decode.
fn added_default(col: &Column, codec: &ColumnCodec, default: &AddedDefault, table: &TableId) -> Option<Value> {
    let text = match default {
        AddedDefault::Literal(text) => text.clone(),
        AddedDefault::Implicit => match &col.data_type {
            DataType::Boolean
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal { .. } => "0".to_string(),
            DataType::Text | DataType::Bytes => String::new(),
            DataType::Enum { symbols } => symbols.first()?.clone(),
            DataType::Time | DataType::TimeSpan => "00:00:00".to_string(),
            // The zero date: the epoch in a NOT NULL column, as its rows read.
            DataType::Date | DataType::Timestamp | DataType::TimestampTz => "0000-00-00 00:00:00".to_string(),
            _ => return None,
        },
    };
    match codec.from_text(mysql_async::Value::Bytes(text.into_bytes()), table, &col.name) {
        Ok(Value::Null) | Err(_) => None,
        Ok(v) => Some(v),
    }
}

impl BuiltSchema {
    /// The schema of `table` from its definition, with excluded columns
    /// left out and the configured key where there is no primary key.
    pub fn build(config: &MySqlSourceConfig, filter: &TableFilter, table: &TableId, def: &TableDef) -> Result<Self> {
        let mut columns = Vec::new();
        let mut codecs = Vec::new();
        let mut source_columns = Vec::with_capacity(def.columns.len());
        for c in &def.columns {
            if filter.excludes_column(table, &c.name) {
                source_columns.push(None);
                continue;
            }
            let data_type = map_type(table, &c.name, &c.type_text)?;
            let mut col = Column::new(c.name.clone(), data_type, c.nullable);
            col.source_type = c.type_text.clone();
            col.aliases = c.aliases.clone();
            let codec = ColumnCodec::new(&col);
            if let Some(v) = c.added_default.as_ref().and_then(|d| added_default(&col, &codec, d, table)) {
                col = col.with_default(&v);
            }
            source_columns.push(Some(columns.len()));
            codecs.push(codec);
            columns.push(col);
        }
        let (key, keyed) = if !def.primary_key.is_empty() {
            (def.primary_key.clone(), true)
        } else if let Some(k) = config.configured_key(table) {
            for name in k {
                if !columns.iter().any(|c| &c.name == name) {
                    return Err(Error::needs_operator(format!("configured key column {name} does not exist"))
                        .with_table(table.clone())
                        .with_column(name.clone())
                        .with_hint(format!("fix mysql.keys.\"{table}\"")));
                }
            }
            (k.clone(), true)
        } else {
            // A table without a key: no key columns, its rows a multiset
            // (see `sink::keyless`), its events with a null Kafka key.
            (Vec::new(), false)
        };
        for k in &key {
            if !columns.iter().any(|c| &c.name == k) {
                return Err(Error::needs_operator(format!("key column {k} is excluded by mysql.exclude_columns"))
                    .with_table(table.clone())
                    .with_column(k.clone()));
            }
        }
        Ok(Self {
            schema: Arc::new(TableSchema {
                id: table.clone(),
                columns,
                key,
                dropped: Vec::new(),
            }),
            source_columns,
            codecs,
            keyed,
        })
    }
}

/// The MySQL / MariaDB source.
pub struct MySqlSource {
    config: MySqlSourceConfig,
    params: ConnectionParams,
    filter: TableFilter,
    ctx: EventContext,
    state: Option<SourceState>,
    /// Schemas as last announced to the runner, per table.
    announced: BTreeMap<TableId, Arc<TableSchema>>,
    prelude: Vec<SourceMessage>,
    snapshot: Option<SnapshotRun>,
    /// The position of a snapshot run opened after the stream's position (a
    /// resumed or a mid-stream copy): the stream is read up to it before
    /// the run's first row goes out, so that no change the rows already
    /// reflect follows them.
    catch_up: Option<BinlogPosition>,
    streamer: Option<Streamer>,
    progress: BTreeMap<TableId, SnapshotTableProgress>,
    /// Tables asked to be copied again ([`Source::resync`]) while a copy
    /// was under way that read them already, or could not take them on:
    /// copied by a run of their own once it is over.
    copy_after_run: Vec<TableId>,
    /// State and announced schemas as of the last batch returned: what
    /// `next_batch` rolls back to after an error.
    emitted: Option<(SourceState, BTreeMap<TableId, Arc<TableSchema>>)>,
    /// Why the last start found the checkpoint in another position domain
    /// (see [`Source::domain_change`]).
    domain_change: Option<String>,
    /// The next start starts over (see [`Source::start_over`]).
    start_over: bool,
    /// The side records durable at the last start, by key.
    restored: BTreeMap<String, String>,
    /// The history as the side records last handed to the runner hold it.
    written: SchemaHistory,
    /// The runner's wake-up between batches (see [`Source::set_wake`]).
    wake: Option<Arc<tokio::sync::Notify>>,
    /// The copied tables' objects as last sent, and when they are read
    /// next (see [`MySqlSource::objects_moved`]).
    objects: crate::source::objects::ObjectsSent,
    /// The session they are read on.
    objects_conn: Option<mysql_async::Conn>,
}

impl std::fmt::Debug for MySqlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlSource")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl MySqlSource {
    /// A source for `config`; nothing connects before [`Source::start`].
    pub fn new(config: MySqlSourceConfig, runner_name: impl Into<String>) -> Result<Self> {
        config.validate_as("mysql").map_err(|e| Error::needs_operator(e.to_string()))?;
        let params = config.connection()?;
        let filter = config.filter(&params.database);
        let ctx = EventContext {
            connector: Arc::from(CONNECTOR),
            name: Arc::from(runner_name.into()),
            db: params.database.as_str().into(),
        };
        Ok(Self {
            config,
            params,
            filter,
            ctx,
            state: None,
            announced: BTreeMap::new(),
            prelude: Vec::new(),
            snapshot: None,
            catch_up: None,
            streamer: None,
            progress: BTreeMap::new(),
            copy_after_run: Vec::new(),
            emitted: None,
            domain_change: None,
            start_over: false,
            restored: BTreeMap::new(),
            written: SchemaHistory::default(),
            wake: None,
            objects: crate::source::objects::ObjectsSent::default(),
            objects_conn: None,
        })
    }

    fn state_mut(&mut self) -> Result<&mut SourceState> {
        self.state.as_mut().ok_or_else(|| Error::retryable("the source is not started"))
    }

    /// Queues a `SchemaChanged` for `schema` unless it is the one announced last.
    fn announce(&mut self, schema: &Arc<TableSchema>) {
        if self.announced.get(&schema.id).is_none_or(|a| **a != **schema) {
            self.announced.insert(schema.id.clone(), schema.clone());
            self.prelude.push(SourceMessage::SchemaChanged(schema.clone()));
        }
    }

    async fn start_snapshot(&mut self) -> Result<()> {
        let state = self
            .state
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut plan = state.snapshot.clone().ok_or_else(|| Error::retryable("no snapshot to run"))?;
        // A table without a key whose copy stopped part-way: read again from
        // its start, its rows would be there twice (they have no key to be
        // overwritten by). It is copied again as a rewritten table is: a
        // reset first, a sweep of what the first part wrote after.
        let interrupted: Vec<TableId> = plan
            .tables
            .iter()
            .filter(|t| !t.done && t.last_key.is_none() && t.rows_done > 0)
            .map(TablePlan::id)
            .filter(|id| {
                self.config.configured_key(id).is_none()
                    && state.history.get(id).is_some_and(|d| d.primary_key.is_empty())
            })
            .collect();
        if !interrupted.is_empty() {
            plan.tables.retain(|t| !interrupted.contains(&t.id()));
            for id in &interrupted {
                tracing::info!(table = %id, "the copy of a table without a key stopped part-way: copying it again");
                self.prelude.push(SourceMessage::TableRewritten(
                    id.clone(),
                    "its copy stopped part-way, and a table without a key cannot resume one".to_string(),
                ));
            }
            let empty = plan.tables.is_empty();
            let state = self.state_mut()?;
            state.snapshot = (!empty).then(|| plan.clone());
            if empty {
                return Ok(());
            }
        }
        let state = self
            .state
            .as_ref()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let first = plan.position.is_none();
        let run = SnapshotRun::open(&self.params, plan, self.config.snapshot_chunk_rows).await?;
        // A resumed (or mid-stream) snapshot reads the remaining rows at its
        // own, later point. The stream first catches up to that point (the
        // changes before it go out as changes), then the rows go out, then
        // the stream goes on from there: per key nothing older than a row
        // follows it.
        let behind = !first && state.binlog.ordered() < run.position.ordered();
        for t in run.plan.tables.iter().filter(|t| t.verify.is_none()) {
            let id = t.id();
            // A table copied again (renamed back to a name copied before)
            // starts its progress over; a resumed copy keeps it.
            if self.progress.get(&id).is_none_or(|p| p.done && !t.done) {
                self.progress.insert(
                    id.clone(),
                    SnapshotTableProgress {
                        table: id.clone(),
                        rows: 0,
                        estimated_rows: run.estimates.get(&id).copied(),
                        done: t.done,
                    },
                );
            }
        }
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        if state.snapshot.as_ref().is_some_and(|s| s.position.is_none()) {
            // The first snapshot transaction fixes where streaming starts
            // and the definitions the history starts from.
            state.binlog = run.position.clone();
            state.gtid = run.gtid.clone();
            for (id, def) in &run.defs {
                state.history.insert(id.clone(), def.clone());
            }
            state.snapshot = Some(run.plan.clone());
        }
        tracing::info!(tables = run.plan.tables.len(), position = %run.position, "snapshot started");
        self.catch_up = behind.then(|| run.position.clone());
        self.snapshot = Some(run);
        if !behind {
            self.announce_run()?;
        }
        Ok(())
    }

    /// Announces the shapes the running snapshot reads its tables in,
    /// before its first row.
    fn announce_run(&mut self) -> Result<()> {
        let Some(run) = self.snapshot.as_ref() else {
            return Ok(());
        };
        let mut shapes = Vec::new();
        for t in &run.plan.tables {
            let id = t.id();
            if let Some(def) = run.defs.get(&id) {
                // The catalog knows no earlier column names; the history does.
                let def = match self.state.as_ref().and_then(|s| s.history.get(&id)) {
                    Some(known) => def.with_aliases_from(known),
                    None => def.clone(),
                };
                shapes.push(BuiltSchema::build(&self.config, &self.filter, &id, &def)?.schema);
            }
        }
        for schema in &shapes {
            self.announce(schema);
        }
        Ok(())
    }

    /// Every `objects_interval_ms` (when `schema_objects` is on): reads the
    /// indexes, constraints and defaults of the announced tables whose copy
    /// is done, and adds to `batch` those of tables where they changed
    /// since they were last sent, saying once what of them is not carried.
    /// A failed read is said and tried again at the next interval.
    async fn objects_moved(&mut self, batch: &mut SourceBatch) {
        if !self.config.schema_objects || !self.objects.due(self.config.objects_interval_ms) {
            return;
        }
        let Some(kind) = self.state.as_ref().map(|s| s.server) else {
            return;
        };
        // A table being copied gets its objects once its rows are in, by
        // the batch's own checkpoint (pgcopydb's order: an index built
        // before a copy slows it).
        let Ok(emitted) = SourceState::from_checkpoint(&batch.checkpoint) else {
            return;
        };
        let copying: Vec<TableId> = emitted
            .snapshot
            .map(|s| {
                s.tables
                    .iter()
                    .filter(|t| t.verify.is_none() && !t.done)
                    .map(TablePlan::id)
                    .collect()
            })
            .unwrap_or_default();
        let tables: BTreeMap<TableId, Arc<TableSchema>> = self
            .announced
            .iter()
            .filter(|(t, _)| !copying.contains(t))
            .map(|(t, s)| (t.clone(), s.clone()))
            .collect();
        if tables.is_empty() {
            return;
        }
        let conn = match self.objects_conn.take() {
            Some(conn) => Ok(conn),
            None => connect(&self.params).await,
        };
        let found = match conn {
            Ok(mut conn) => {
                let found = objects::read(&mut conn, kind, &tables).await;
                if found.is_ok() {
                    self.objects_conn = Some(conn);
                }
                found
            }
            Err(e) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the captured tables' indexes, constraints and defaults; trying again later");
                return;
            }
        };
        for (table, objects) in self.objects.changed(found.objects) {
            for what in found.not_carried.get(&table).into_iter().flatten() {
                tracing::warn!(table = %table, "not carried into destinations that recreate objects: {what}");
            }
            batch.messages.push(SourceMessage::Objects(table, objects));
        }
    }

    async fn next_snapshot_batch(&mut self) -> Result<Option<SourceBatch>> {
        let Some(run) = self.snapshot.as_mut() else {
            return Ok(None);
        };
        let chunk = run.next_chunk(&self.config, &self.filter, &self.ctx).await?;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        match chunk {
            Some(chunk) => {
                if let Some(p) = self.progress.get_mut(&chunk.table) {
                    p.rows += chunk.messages.len() as u64;
                    p.done = chunk.table_done;
                }
                state.snapshot = Some(run.plan.clone());
                let mut messages = std::mem::take(&mut self.prelude);
                messages.extend(chunk.messages);
                Ok(Some(SourceBatch { messages, checkpoint: state.to_checkpoint() }))
            }
            None => {
                let copied: Vec<TableId> = run.plan.tables.iter().map(TablePlan::id).collect();
                self.snapshot = None;
                state.snapshot = None;
                tracing::info!("snapshot finished");
                if !self.copy_after_run.is_empty() {
                    // Copies asked while it ran: the next run, at a later
                    // point the stream catches up to first.
                    state.snapshot = Some(SnapshotState {
                        initial: false,
                        position: Some(state.binlog.clone()),
                        tables: self.copy_after_run.drain(..).map(|t| TablePlan::new(&t)).collect(),
                    });
                }
                // A copy taken after the stream's position (a resumed or a
                // mid-stream one) read the tables' later shape; the stream
                // goes on with the history's, announced again before its rows.
                let mut shapes = Vec::new();
                for id in &copied {
                    if let Some(def) = state.history.get(id) {
                        shapes.push(BuiltSchema::build(&self.config, &self.filter, id, def)?.schema);
                    }
                }
                for schema in &shapes {
                    self.announce(schema);
                }
                let state = self
                    .state
                    .as_mut()
                    .ok_or_else(|| Error::retryable("the source is not started"))?;
                Ok(Some(SourceBatch {
                    messages: std::mem::take(&mut self.prelude),
                    checkpoint: state.to_checkpoint(),
                }))
            }
        }
    }

    async fn next_batch_inner(&mut self) -> Result<SourceBatch> {
        if self.state.is_none() {
            return Err(Error::retryable("the source is not started"));
        }
        if self.snapshot.is_none() && self.state.as_ref().is_some_and(|s| s.snapshot.is_some()) {
            self.start_snapshot().await?;
        }
        if self.snapshot.is_some() && self.catch_up.is_none() {
            if let Some(batch) = self.next_snapshot_batch().await? {
                return Ok(batch);
            }
        }
        if self.streamer.is_none() {
            let state = self
                .state
                .as_ref()
                .ok_or_else(|| Error::retryable("the source is not started"))?;
            self.streamer = Some(Streamer::open(&self.params, &self.config, state).await?);
        }
        let (Some(streamer), Some(state)) = (self.streamer.as_mut(), self.state.as_mut()) else {
            return Err(Error::retryable("the source is not started"));
        };
        let planned = |s: &SourceState| {
            s.snapshot
                .as_ref()
                .map(|p| p.tables.iter().map(TablePlan::id).collect::<Vec<_>>())
        };
        let planned_before = planned(state);
        let mut sc = stream::StreamContext {
            config: &self.config,
            filter: &self.filter,
            ctx: &self.ctx,
            announced: &mut self.announced,
            state,
            wake: self.wake.as_deref(),
        };
        let out = streamer.next_batch(&mut sc, self.catch_up.as_ref()).await?;
        let mut messages = std::mem::take(&mut self.prelude);
        messages.extend(out.messages);
        if planned(state) != planned_before {
            // A renamed table to copy: the copy runs next, then the stream
            // opens again at this batch's checkpoint. A run catching up
            // lacks the table: it starts again (nothing of it went out).
            self.streamer = None;
            self.snapshot = None;
            self.catch_up = None;
        } else if out.reached_stop && self.catch_up.take().is_some() {
            // Every transaction the snapshot holds is out, none after it:
            // its rows come next (in the shapes it read them), and the
            // stream opens again at its position after them.
            self.streamer = None;
            tracing::info!(position = %state.binlog, "stream caught up with the snapshot");
            self.announce_run()?;
        }
        Ok(SourceBatch {
            messages,
            checkpoint: self.state_mut()?.to_checkpoint(),
        })
    }
}

#[async_trait]
impl Source for MySqlSource {
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        self.snapshot = None;
        self.catch_up = None;
        self.streamer = None;
        self.announced.clear();
        self.prelude.clear();
        self.progress.clear();
        self.copy_after_run.clear();
        self.objects.forget();
        let mut resumed = checkpoint.as_ref().map(SourceState::from_checkpoint).transpose()?;
        // The history as the side records hold it: the durable one (a
        // checkpoint written before side records holds its own).
        let history = self.restored.iter().filter(|(k, _)| k.starts_with(HISTORY_RECORD_PREFIX));
        self.written = SchemaHistory::from_records(history.map(|(_, v)| v)).map_err(|e| {
            Error::needs_operator(format!("a schema history record in the offsets topic is unreadable: {e}"))
                .with_hint("copy everything again: source-runner --config <source.toml> reset")
        })?;
        if let Some(state) = resumed.as_mut().filter(|s| s.history.is_empty()) {
            let expected = state.history_tables.unwrap_or(0);
            if expected != self.written.len() {
                return Err(Error::needs_operator(format!(
                    "the checkpoint's schema history has {expected} tables, the offsets topic holds records of {}",
                    self.written.len()
                ))
                .with_class("tributary.schema_history")
                .with_hint(
                    "the offsets topic lost records (or the source was started without them): copy everything \
                     again: source-runner --config <source.toml> reset",
                ));
            }
            state.history = self.written.clone();
        }
        let mut conn = connect(&self.params).await?;
        let version: Option<String> = conn
            .query_first("SELECT @@version")
            .await
            .map_err(|e| classify_my(e, "reading the server version"))?;
        let kind = ServerKind::from_version(version.as_deref().unwrap_or(""));
        let epoch = server_epoch(&mut conn, kind).await?;
        self.domain_change = None;
        if std::mem::take(&mut self.start_over) {
            self.domain_change = Some("every table is copied again, as asked (source-runner reset)".to_string());
        } else if let Some(state) = &resumed {
            self.domain_change = match &state.epoch {
                Some(theirs) if *theirs != epoch => Some(format!(
                    "the server is {epoch}, the checkpoint's {theirs}: another server (a failover), whose binlog \
                     positions do not compare with those the copy holds"
                )),
                _ => {
                    let logs = binary_logs(&mut conn).await?;
                    binlog_restarted(&state.binlog, &logs).then(|| {
                        format!(
                            "the server's binlog numbering restarted below the checkpoint's {} (RESET MASTER, or \
                             another server's binlogs): its positions do not compare with those the copy holds",
                            state.binlog
                        )
                    })
                }
            };
        }
        let resumed = if self.domain_change.is_some() {
            if self.config.snapshot_mode == SnapshotMode::Never {
                return Err(Error::needs_operator(format!(
                    "{}; with mysql.snapshot_mode = \"never\" the tables cannot be copied again",
                    self.domain_change.as_deref().unwrap_or("the source changed domain")
                ))
                .with_class("tributary.epoch_changed")
                .with_hint(
                    "set mysql.snapshot_mode = \"initial\" and start again: every table is copied again and the \
                     rows the copy does not see are removed downstream (see docs/operations.md, Reset)",
                ));
            }
            tracing::warn!(
                reason = self.domain_change.as_deref().unwrap_or(""),
                "the source changed position domain: every table is copied again"
            );
            None
        } else {
            resumed
        };
        let mut state = match resumed {
            Some(state) => {
                if state.server != kind {
                    return Err(Error::needs_operator(format!(
                        "the checkpoint was written against {:?}, the server is {kind:?}",
                        state.server
                    ))
                    .with_hint(
                        "copy everything again: source-runner --config <source.toml> reset, then start the runner \
                         (see docs/operations.md, Reset)",
                    ));
                }
                // Announce every captured table as the history has it at
                // the checkpoint: the runner registers before producing.
                for table in state.history.tables().collect::<Vec<_>>() {
                    if let Some(def) = state.history.get(&table) {
                        let built = BuiltSchema::build(&self.config, &self.filter, &table, def)?;
                        self.announce(&built.schema);
                    }
                }
                state
            }
            None => {
                let tables = list_tables(&mut conn, &self.filter).await?;
                match self.config.snapshot_mode {
                    SnapshotMode::Initial => {
                        // Position, GTID and definitions come from the
                        // snapshot transaction when it opens.
                        SourceState {
                            version: CHECKPOINT_VERSION,
                            server: kind,
                            binlog: BinlogPosition { file: String::new(), pos: 0 },
                            gtid: None,
                            history: SchemaHistory::default(),
                            snapshot: Some(SnapshotState {
                                initial: true,
                                position: None,
                                tables: tables.iter().map(TablePlan::new).collect(),
                            }),
                            epoch: None,
                            partial: None,
                            history_tables: None,
                        }
                    }
                    SnapshotMode::Never => {
                        let (binlog, gtid) = snapshot::current_position(&mut conn, kind).await?;
                        let mut history = SchemaHistory::default();
                        for t in &tables {
                            if let Some(def) = table_def(&mut conn, t).await? {
                                let built = BuiltSchema::build(&self.config, &self.filter, t, &def)?;
                                self.announce(&built.schema);
                                history.insert(t.clone(), def);
                            }
                        }
                        SourceState {
                            version: CHECKPOINT_VERSION,
                            server: kind,
                            binlog,
                            gtid,
                            history,
                            snapshot: None,
                            epoch: None,
                            partial: None,
                            history_tables: None,
                        }
                    }
                }
            }
        };
        state.epoch = Some(epoch);
        if let Err(e) = conn.disconnect().await {
            tracing::debug!(error = %e, "closing the start-up connection");
        }
        if self.config.new_tables == NewTables::Ignore {
            tracing::debug!("tables created later are ignored (mysql.new_tables = \"ignore\")");
        }
        self.state = Some(state);
        self.emitted = self.state.clone().map(|s| (s, self.announced.clone()));
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<SourceBatch> {
        match self.next_batch_inner().await {
            Ok(mut batch) => {
                if let Some(state) = &self.state {
                    self.emitted = Some((state.clone(), self.announced.clone()));
                }
                self.objects_moved(&mut batch).await;
                Ok(batch)
            }
            Err(e) => {
                // Drop half-done work; the next call resumes after the last
                // batch returned.
                self.snapshot = None;
                self.catch_up = None;
                self.streamer = None;
                if let Some((state, announced)) = self.emitted.clone() {
                    self.state = Some(state);
                    self.announced = announced;
                }
                self.prelude.clear();
                Err(e)
            }
        }
    }

    async fn acknowledge(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        // Nothing to release on the server: the checkpoint stored with the
        // events is the only replication state (no slot, unlike PostgreSQL).
        Ok(())
    }

    fn set_wake(&mut self, wake: Arc<tokio::sync::Notify>) {
        self.wake = Some(wake);
    }

    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        self.progress.values().cloned().collect()
    }

    /// Copies `tables` again the way a renamed table is copied: a snapshot
    /// of them at a later binlog point, in the checkpoint, then the stream
    /// from here.
    async fn resync(&mut self, tables: &[TableId]) -> Result<Vec<TableId>> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Ok(Vec::new());
        }
        // The tables a copy under way has not started reading: it reads them
        // at its point, which the stream reaches first, so after every
        // change said before. (A table it read already, or is reading, was
        // read before: it is copied again once the run is over.)
        let untouched: Option<Vec<TableId>> = self.snapshot.as_ref().map(|run| {
            run.plan
                .tables
                .iter()
                .filter(|t| !t.done && t.last_key.is_none() && t.rows_done == 0)
                .map(TablePlan::id)
                .collect()
        });
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut out = Vec::new();
        for id in tables {
            if !filter.captures(id) || state.history.get(id).is_none() {
                continue;
            }
            out.push(id.clone());
            match &untouched {
                // Its progress stays: the runner removes the destination's
                // older rows when it says the copy is complete (a removed
                // one never said so, and rows deleted meanwhile stayed).
                Some(u) if u.contains(id) => continue,
                // The run's plan would overwrite a table added to it with
                // its next chunk: it waits for the run's end.
                Some(_) => {
                    if !self.copy_after_run.contains(id) {
                        self.copy_after_run.push(id.clone());
                    }
                }
                None => {
                    let plan = state.later_snapshot();
                    match plan.tables.iter_mut().find(|t| t.id() == *id) {
                        // A verification of it gives way to the copy.
                        Some(t) if t.verify.is_some() => *t = TablePlan::new(id),
                        Some(_) => {}
                        None => plan.tables.push(TablePlan::new(id)),
                    }
                }
            }
            // A copy made before must not count as this one's.
            self.progress.remove(id);
        }
        Ok(out)
    }

    async fn verify(&mut self, tables: &[TableId], id: u64, rows_per_second: u64) -> Result<Vec<TableId>> {
        // While a copy runs, its plan is the run's: verified after it.
        if self.config.snapshot_mode == SnapshotMode::Never || self.snapshot.is_some() {
            return Ok(Vec::new());
        }
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut out = Vec::new();
        for table in tables {
            let Some(def) = state.history.get(table).filter(|_| filter.captures(table)) else {
                continue;
            };
            let Ok(built) = BuiltSchema::build(&self.config, filter, table, def) else {
                continue;
            };
            let keys: Vec<&tributary_schemas::Column> = def
                .primary_key
                .iter()
                .filter_map(|k| built.schema.column_index(k).map(|i| &built.schema.columns[i]))
                .collect();
            // A table without a key is verified by its rows' content keys.
            if keys.len() != def.primary_key.len()
                || keys
                    .iter()
                    .any(|c| !tributary_schemas::canonical::orders_everywhere(&c.data_type))
            {
                tracing::warn!(table = %table, "the table is not verified: it has a key of a type whose order \
                    differs between databases");
                continue;
            }
            let plan = state.later_snapshot();
            if plan.tables.iter().any(|t| t.id() == *table) {
                continue;
            }
            plan.tables.push(TablePlan::verify(table, id, rows_per_second));
            out.push(table.clone());
        }
        Ok(out)
    }

    async fn repair(
        &mut self,
        table: &TableId,
        keys: &[String],
        verify_after: u64,
        rows_per_second: u64,
    ) -> Result<bool> {
        // While a run reads, its plan is the run's: the next verification
        // asks again.
        if self.config.snapshot_mode == SnapshotMode::Never || self.snapshot.is_some() {
            return Ok(false);
        }
        let filter = &self.filter;
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        if !filter.captures(table) || state.history.get(table).is_none_or(|d| d.primary_key.is_empty()) {
            return Ok(false);
        }
        let plan = state.later_snapshot();
        match plan.tables.iter_mut().find(|t| t.id() == *table) {
            // Asked already: the keys join it.
            Some(t) if t.repair.is_some() => {
                if let Some(k) = t.repair.as_mut() {
                    k.extend(keys.iter().cloned());
                }
            }
            // To be copied whole: the copy rewrites every row.
            Some(t) if t.verify.is_none() => return Ok(false),
            // To be verified: the repair goes first, and verifies after.
            Some(t) => *t = TablePlan::repair(table, keys.to_vec(), verify_after, rows_per_second),
            None => plan
                .tables
                .push(TablePlan::repair(table, keys.to_vec(), verify_after, rows_per_second)),
        }
        tracing::info!(table = %table, keys = keys.len(), "a repair asked: the rows are sent again, then verified");
        Ok(true)
    }

    /// The binlog after this copy's read position: MySQL keeps binlogs by
    /// its own retention (`binlog_expire_logs_seconds`), not for readers,
    /// so this is how far behind the copy reads, and what a purge would
    /// take from it.
    async fn retained_bytes(&mut self) -> Option<u64> {
        let at = self.state.as_ref()?.binlog.clone();
        let logs: Vec<mysql_async::Row> = match client::connect(&self.params).await {
            Ok(mut conn) => {
                let rows = conn.query("SHOW BINARY LOGS").await;
                let _ = conn.disconnect().await;
                rows.map_err(|e| tracing::debug!(error = %e, "cannot list the binary logs"))
                    .ok()?
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the binary logs");
                return None;
            }
        };
        let files = logs
            .into_iter()
            .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
            .collect::<Vec<_>>();
        Some(binlog_after(&files, &at))
    }

    fn tables(&self) -> Vec<TableId> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        let mut out: Vec<TableId> = state.history.tables().collect();
        for t in state.snapshot.iter().flat_map(|s| s.tables.iter()) {
            if !out.contains(&t.id()) {
                out.push(t.id());
            }
        }
        out
    }

    fn domain_change(&self) -> Option<String> {
        self.domain_change.clone()
    }

    fn start_over(&mut self) -> bool {
        self.start_over = true;
        true
    }

    fn restore_side_records(&mut self, records: BTreeMap<String, String>) {
        self.restored = records;
    }

    fn take_side_records(&mut self) -> Vec<(String, Option<String>)> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        if state.history == self.written {
            return Vec::new();
        }
        let (before, now) = (self.written.records(), state.history.records());
        let mut out: Vec<(String, Option<String>)> = before
            .keys()
            .filter(|k| !now.contains_key(*k))
            .map(|k| (format!("{HISTORY_RECORD_PREFIX}{k}"), None))
            .collect();
        for (k, v) in now {
            if before.get(&k) != Some(&v) {
                out.push((format!("{HISTORY_RECORD_PREFIX}{k}"), Some(v)));
            }
        }
        self.written = state.history.clone();
        out
    }
}

/// The key prefix of the schema history's side records (one per table).
const HISTORY_RECORD_PREFIX: &str = "history/";

/// The server's identity, the epoch of its binlog positions: MySQL's
/// `server_uuid`; MariaDB has none, and its `server_id` (unique among the
/// servers that replicate from each other) stands in. A MariaDB restored
/// onto a new server under the same `server_id` starts its binlog
/// numbering over, which [`binlog_restarted`] sees.
async fn server_epoch(conn: &mut mysql_async::Conn, kind: ServerKind) -> Result<String> {
    let (sql, name) = match kind {
        ServerKind::MySql => ("SELECT CAST(@@server_uuid AS CHAR)", "server_uuid"),
        ServerKind::MariaDb => ("SELECT CAST(@@server_id AS CHAR)", "server_id"),
    };
    let value: Option<Option<String>> = conn
        .query_first(sql)
        .await
        .map_err(|e| classify_my(e, &format!("reading the server's {name}")))?;
    let value = value
        .flatten()
        .ok_or_else(|| Error::retryable(format!("the server has no {name}")))?;
    Ok(format!("{name}:{value}"))
}

/// The server's binlog files with their sizes (`SHOW BINARY LOGS`).
async fn binary_logs(conn: &mut mysql_async::Conn) -> Result<Vec<(String, u64)>> {
    let rows: Vec<mysql_async::Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(|e| classify_my(e, "listing the binlogs (SHOW BINARY LOGS)"))?;
    Ok(rows
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect())
}

/// The number of a binlog file (`mysql-bin.000042` -> 42).
fn binlog_number(file: &str) -> Option<u64> {
    file.rsplit('.').next()?.parse().ok()
}

/// Whether the server's binlog numbering restarted below `stored` (`RESET
/// MASTER`, or another server's binlogs under the same name), given the
/// server's binlogs and their sizes: the stored file is gone and every
/// file there has a lower number, or the stored file is there but shorter
/// than the stored offset. A stored file gone while higher numbers exist
/// was purged (the stream's error says so); an empty list (binlog off)
/// decides nothing.
pub fn binlog_restarted(stored: &BinlogPosition, logs: &[(String, u64)]) -> bool {
    let Some(number) = binlog_number(&stored.file) else {
        return false;
    };
    if logs.is_empty() {
        return false;
    }
    match logs.iter().find(|(f, _)| *f == stored.file) {
        Some((_, size)) => *size < stored.pos,
        None => logs.iter().filter_map(|(f, _)| binlog_number(f)).all(|n| n < number),
    }
}

/// The bytes of `files` (`SHOW BINARY LOGS`: name, size) after `at`.
/// Binlog names sort in order within a server's sequence.
fn binlog_after(files: &[(String, u64)], at: &BinlogPosition) -> u64 {
    files
        .iter()
        .map(|(name, size)| match name.cmp(&at.file) {
            std::cmp::Ordering::Less => 0,
            std::cmp::Ordering::Equal => size.saturating_sub(at.pos),
            std::cmp::Ordering::Greater => *size,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::sources::mysql::history::ColumnDef;

    #[test]
    fn binlog_offsets_beyond_4_gib_are_refused_not_wrapped() {
        let at = |pos: u64| BinlogPosition { file: "mysql-bin.000002".into(), pos };
        assert!(at(u64::from(u32::MAX)).checked().is_ok());
        let e = at(u64::from(u32::MAX) + 5).checked().expect_err("beyond 4 GiB");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    }

    #[test]
    fn binlog_positions_order_by_file_then_offset() {
        let a = BinlogPosition { file: "mysql-bin.000002".into(), pos: 900_000 };
        let b = BinlogPosition { file: "mysql-bin.000003".into(), pos: 4 };
        assert!(a.ordered() < b.ordered());
        assert_eq!(b.to_string(), "mysql-bin.000003:4");
    }

    #[test]
    fn an_added_not_null_date_column_defaults_to_the_epoch_as_its_rows_read() {
        let t = TableId::new("db", "t");
        let default = |type_text: &str, nullable: bool, d: AddedDefault| {
            let mut col = Column::new("d", map_type(&t, "d", type_text).expect("maps"), nullable);
            col.source_type = type_text.to_string();
            let codec = ColumnCodec::new(&col);
            added_default(&col, &codec, &d, &t)
        };
        assert_eq!(default("date", false, AddedDefault::Implicit), Some(Value::Date(0)));
        assert_eq!(default("datetime", false, AddedDefault::Implicit), Some(Value::Timestamp(0)));
        assert_eq!(
            default("timestamp", false, AddedDefault::Literal("0000-00-00 00:00:00".into())),
            Some(Value::TimestampTz(0))
        );
        assert_eq!(default("date", true, AddedDefault::Literal("0000-00-00".into())), None);
        assert_eq!(default("date", false, AddedDefault::Literal("1970-01-02".into())), Some(Value::Date(1)));
    }

    #[test]
    fn binlog_numbering_restarted_is_told_from_purged_binlogs() {
        let at = |file: &str, pos: u64| BinlogPosition { file: file.into(), pos };
        let logs = |list: &[(&str, u64)]| list.iter().map(|(f, s)| (f.to_string(), *s)).collect::<Vec<_>>();
        // RESET MASTER: numbering starts over at 1, below the stored file.
        assert!(binlog_restarted(&at("mysql-bin.000042", 900), &logs(&[("mysql-bin.000001", 4000)])));
        // ... while the stored file was the first: it is there again, shorter.
        assert!(binlog_restarted(&at("mysql-bin.000001", 90_000), &logs(&[("mysql-bin.000001", 400)])));
        // Still there and long enough: the same numbering.
        assert!(!binlog_restarted(
            &at("mysql-bin.000007", 900),
            &logs(&[("mysql-bin.000006", 4000), ("mysql-bin.000007", 900)])
        ));
        // Purged: higher numbers exist (the stream's error says so).
        assert!(!binlog_restarted(&at("mysql-bin.000003", 900), &logs(&[("mysql-bin.000009", 4000)])));
        // Nothing to tell by: no binlogs listed, or no stored file yet.
        assert!(!binlog_restarted(&at("mysql-bin.000003", 900), &[]));
        assert!(!binlog_restarted(&at("", 0), &logs(&[("mysql-bin.000001", 4000)])));
    }

    #[test]
    fn server_kind_from_version() {
        assert_eq!(ServerKind::from_version("10.11.6-MariaDB-0+deb12u1-log"), ServerKind::MariaDb);
        assert_eq!(ServerKind::from_version("8.0.36"), ServerKind::MySql);
    }

    #[test]
    fn checkpoint_round_trips_and_rejects_other_versions() {
        let mut history = SchemaHistory::default();
        history.insert(
            TableId::new("db", "t"),
            TableDef {
                columns: vec![ColumnDef {
                    name: "id".into(),
                    type_text: "int(11)".into(),
                    nullable: false,
                    added_default: None,
                    aliases: vec![],
                    auto_increment: false,
                }],
                primary_key: vec!["id".into()],
            },
        );
        let s = SourceState {
            version: CHECKPOINT_VERSION,
            server: ServerKind::MariaDb,
            binlog: BinlogPosition { file: "mysql-bin.000001".into(), pos: 1234 },
            gtid: Some("0-1-5".into()),
            history,
            snapshot: None,
            epoch: Some("server_id:1".into()),
            partial: None,
            history_tables: None,
        };
        // The history is kept beside the checkpoint, a record per table.
        let read = SourceState::from_checkpoint(&s.to_checkpoint()).expect("parses");
        assert!(read.history.is_empty() && !s.to_checkpoint().0.contains("\"history\""));
        assert_eq!(read.history_tables, Some(1), "the count of the history's tables");
        let records = s.history.records();
        assert_eq!(records.len(), 1);
        let history = SchemaHistory::from_records(records.values()).expect("records parse");
        assert_eq!(SourceState { history, history_tables: None, ..read }, s);
        // A checkpoint written before side records holds the history.
        let mut old: serde_json::Value = serde_json::from_str(&s.to_checkpoint().0).expect("json");
        old["history"] = serde_json::to_value(&s.history).expect("history");
        old.as_object_mut().expect("object").remove("history_tables");
        let old = Checkpoint(old.to_string());
        assert_eq!(SourceState::from_checkpoint(&old).expect("parses"), s);
        let other = Checkpoint(s.to_checkpoint().0.replace("\"version\":1", "\"version\":9"));
        assert_eq!(SourceState::from_checkpoint(&other).expect_err("version").kind(), ErrorKind::NeedsOperator);
    }

    #[test]
    fn built_schema_leaves_out_excluded_columns_and_uses_configured_keys() {
        let mut config = MySqlSourceConfig::with_url("mysql://u@h/db");
        config.exclude_columns = vec!["db.t.secret".into()];
        config.keys.insert("db.t".into(), vec!["code".into()]);
        let filter = config.filter("db");
        let def = TableDef {
            columns: vec![
                ColumnDef {
                    name: "code".into(),
                    type_text: "varchar(8)".into(),
                    nullable: false,
                    added_default: None,
                    aliases: vec![],
                    auto_increment: false,
                },
                ColumnDef {
                    name: "secret".into(),
                    type_text: "text".into(),
                    nullable: true,
                    added_default: None,
                    aliases: vec![],
                    auto_increment: false,
                },
                ColumnDef {
                    name: "n".into(),
                    type_text: "int(10) unsigned".into(),
                    nullable: true,
                    added_default: None,
                    aliases: vec![],
                    auto_increment: false,
                },
            ],
            primary_key: vec![],
        };
        let t = TableId::new("db", "t");
        let built = BuiltSchema::build(&config, &filter, &t, &def).expect("builds");
        assert_eq!(built.schema.key, vec!["code"]);
        assert_eq!(built.schema.columns.len(), 2);
        assert!(built.source_columns[1].is_none());
        assert!(built.keyed);
        config.keys.clear();
        config.keys.insert("db.t".into(), vec!["nope".into()]);
        let e = BuiltSchema::build(&config, &filter, &t, &def).expect_err("unknown key column");
        assert_eq!(e.column(), Some("nope"));
    }

    #[test]
    fn the_binlog_after_a_position_counts_the_rest_of_its_file_and_the_later_ones() {
        let files = [
            ("mysql-bin.000001".to_string(), 1000),
            ("mysql-bin.000002".to_string(), 500),
            ("mysql-bin.000003".to_string(), 300),
        ];
        let at = |file: &str, pos| BinlogPosition { file: file.into(), pos };
        assert_eq!(binlog_after(&files, &at("mysql-bin.000002", 200)), 300 + 300);
        assert_eq!(binlog_after(&files, &at("mysql-bin.000003", 300)), 0);
        assert_eq!(binlog_after(&files, &at("mysql-bin.000001", 0)), 1800);
    }
}
