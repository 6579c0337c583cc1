//! SQL Server: a source reading a consistent snapshot, then the change
//! tables of change data capture (CDC).
//!
//! The source ([`SqlServerSource`]) copies the captured tables in key
//! order inside a SNAPSHOT-isolation transaction whose max CDC LSN it notes
//! ([`snapshot`]), then polls every capture instance from that LSN up to
//! `sys.fn_cdc_get_max_lsn()` and merges their rows into transactions in
//! commit order ([`stream`]). Everything it asks of the server goes through
//! [`client::CdcClient`]: tiberius against a real server, `fake` in the
//! tests. See `docs/sources/sqlserver.md`; this source has not run against
//! a real SQL Server yet.
//!
//! # Checkpoint
//!
//! A [`SourceState`] as JSON: the LSN up to which every change is emitted,
//! the capture instance read for each table, and while a snapshot is
//! unfinished the last key emitted per table. Positions pack the LSN as
//! [`lsn`] documents. Nothing is held on the server: the cleanup job
//! deletes change rows by age, and a checkpoint older than its retention
//! stops the table with a needs-operator error naming it.

pub mod check;
pub mod client;
pub mod config;
// The tests' SQL Server: never in the runners' builds (`test-utils`).
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
pub mod lsn;
pub mod snapshot;
pub mod stream;
pub mod types;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tributary_schemas::{
    ChangeEvent, Column, Op, SnapshotMarker, SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

use self::client::{CaptureInstance, CdcClient, Connector};
pub use self::config::SqlServerSourceConfig;
use self::config::{SnapshotMode, TableFilter};
use self::lsn::Lsn;
use self::snapshot::{KeyValue, SnapshotState, TablePlan};
use self::stream::{current_bounds, merge, Txn};
use self::types::map_type;
use crate::error::{Error, Result};
use crate::source::SnapshotTableProgress;
use crate::{Checkpoint, Source, SourceBatch, SourceMessage};

/// The connector's name in every event (Debezium's `source.connector`).
pub const CONNECTOR: &str = "sqlserver";
/// Version of the checkpoint JSON.
pub const CHECKPOINT_VERSION: u32 = 1;

/// The capture instance read for a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceState {
    /// Its name.
    pub name: String,
    /// Its `start_lsn` when the source began reading it: the cleanup job
    /// moving it above both this and the stream's LSN is a gap.
    pub since: Lsn,
}

/// The source's resumable state, serialized as the [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceState {
    /// Format version.
    pub version: u32,
    /// Every change committed at or below this LSN is emitted.
    pub lsn: Lsn,
    /// The capture instance read per table (`schema.table`).
    pub instances: BTreeMap<String, InstanceState>,
    /// Snapshot work not done yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotState>,
}

impl SourceState {
    /// Parses a checkpoint written by this source.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Result<Self> {
        checkpoint.decode("SQL Server", |s: &SourceState| s.version, CHECKPOINT_VERSION)
    }
}

/// What the stream emits, in order.
#[derive(Debug)]
enum Item {
    /// A transaction; each change with the schema of its table.
    Txn(Txn, Vec<Arc<TableSchema>>),
    /// From here the table is read from this instance (a switch after DDL,
    /// or a new table).
    Switch(TableId, CaptureInstance, Arc<TableSchema>),
    /// The table and its capture instances are gone.
    Dropped(TableId),
    /// A table not captured before got a capture instance: its rows are
    /// copied (the rows it held before CDC was enabled are in no change
    /// table), then it streams from the copy's LSN.
    Copy(TableId, CaptureInstance),
}

/// The SQL Server source.
pub struct SqlServerSource {
    config: SqlServerSourceConfig,
    connector: Arc<dyn Connector>,
    filter: TableFilter,
    name: Arc<str>,
    db: Arc<str>,
    state: Option<SourceState>,
    emitted: Option<(SourceState, BTreeMap<TableId, Arc<TableSchema>>)>,
    client: Option<Box<dyn CdcClient>>,
    /// The open snapshot transaction and its LSN.
    snap: Option<(Box<dyn CdcClient>, Lsn)>,
    /// Stream up to this LSN before the snapshot goes on (a resumed snapshot).
    catch_up: Option<Lsn>,
    announced: BTreeMap<TableId, Arc<TableSchema>>,
    prelude: Vec<SourceMessage>,
    pending: VecDeque<Item>,
    pending_to: Option<Lsn>,
    progress: BTreeMap<TableId, SnapshotTableProgress>,
    start_over: bool,
    domain_change: Option<String>,
    /// When an idle poll next looks for new capture instances (the
    /// catalog's queries are more than the max LSN's one).
    idle_catalog_at: Instant,
}

impl std::fmt::Debug for SqlServerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlServerSource")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

fn table_key(t: &TableId) -> String {
    t.to_string()
}

fn parse_table(s: &str) -> TableId {
    let (schema, table) = s.split_once('.').unwrap_or(("", s));
    TableId::new(schema, table)
}

impl SqlServerSource {
    /// A source over `connector`; nothing connects before [`Source::start`].
    pub fn new(config: SqlServerSourceConfig, connector: Arc<dyn Connector>, runner_name: &str) -> Result<Self> {
        let db = config::parse_url(secrecy::ExposeSecret::expose_secret(&config.url)).map_or(String::new(), |p| p.4);
        Ok(Self {
            filter: config.filter(),
            config,
            connector,
            name: Arc::from(runner_name),
            db: Arc::from(db),
            state: None,
            emitted: None,
            client: None,
            snap: None,
            catch_up: None,
            announced: BTreeMap::new(),
            prelude: Vec::new(),
            pending: VecDeque::new(),
            pending_to: None,
            progress: BTreeMap::new(),
            start_over: false,
            domain_change: None,
            idle_catalog_at: Instant::now(),
        })
    }

    /// `instance` with the excluded columns left out.
    fn captured(&self, instance: &CaptureInstance) -> CaptureInstance {
        let mut ci = instance.clone();
        ci.columns.retain(|c| !self.filter.excludes_column(&ci.table, &c.name));
        ci
    }

    /// The schema events of `instance` carry.
    fn schema_of(&self, instance: &CaptureInstance) -> Result<Arc<TableSchema>> {
        let ci = self.captured(instance);
        let mut columns = Vec::with_capacity(ci.columns.len());
        for c in &ci.columns {
            let mut col = Column::new(c.name.clone(), map_type(&ci.table, c)?, c.nullable);
            col.source_type = c.type_text.clone();
            columns.push(col);
        }
        let key = if ci.key.is_empty() {
            columns.iter().map(|c| c.name.clone()).collect()
        } else {
            ci.key.clone()
        };
        for k in &key {
            if !columns.iter().any(|c| &c.name == k) {
                return Err(Error::needs_operator(format!("key column {k} is excluded by sqlserver.exclude_columns"))
                    .with_table(ci.table.clone())
                    .with_column(k.clone()));
            }
        }
        Ok(Arc::new(TableSchema {
            id: ci.table.clone(),
            columns,
            key,
            dropped: Vec::new(),
        }))
    }

    fn announce(&mut self, schema: &Arc<TableSchema>, out: &mut Vec<SourceMessage>) {
        if self.announced.get(&schema.id).is_none_or(|a| **a != **schema) {
            self.announced.insert(schema.id.clone(), schema.clone());
            out.push(SourceMessage::SchemaChanged(schema.clone()));
        }
    }

    fn info(
        &self,
        lsn: Lsn,
        position: tributary_schemas::Position,
        ts_ms: i64,
        native: String,
        snapshot: SnapshotMarker,
    ) -> SourceInfo {
        SourceInfo {
            connector: Arc::from(CONNECTOR),
            name: self.name.clone(),
            db: self.db.clone(),
            ts_ms,
            snapshot,
            tx_id: (snapshot == SnapshotMarker::False).then(|| lsn.to_string()),
            position,
            native_position: Arc::from(native),
        }
    }

    async fn client(&mut self) -> Result<&mut Box<dyn CdcClient>> {
        if self.client.is_none() {
            self.client = Some(self.connector.connect().await?);
        }
        self.client.as_mut().ok_or_else(|| Error::retryable("no connection"))
    }

    /// The instance a table is read from at `lsn`: the newest that started
    /// at or before it, else the oldest.
    fn choose<'a>(instances: &'a [CaptureInstance], table: &TableId, lsn: Lsn) -> Option<&'a CaptureInstance> {
        let mut of: Vec<&CaptureInstance> = instances.iter().filter(|i| i.table == *table).collect();
        of.sort_by_key(|i| i.start_lsn);
        of.iter().rev().find(|i| i.start_lsn <= lsn.next()).or(of.first()).copied()
    }

    /// Plans `table` to be copied (again) in a snapshot the stream first
    /// catches up to; its stream goes on from the copy's LSN.
    fn plan_copy(&mut self, table: &TableId) -> Result<()> {
        let plan = self.state_mut()?.snapshot.get_or_insert_with(|| SnapshotState {
            initial: false,
            mid_stream: true,
            tables: Vec::new(),
        });
        plan.copy_again(&table_key(table));
        self.progress.insert(
            table.clone(),
            SnapshotTableProgress {
                table: table.clone(),
                rows: 0,
                estimated_rows: None,
                done: false,
            },
        );
        Ok(())
    }

    fn state_mut(&mut self) -> Result<&mut SourceState> {
        self.state.as_mut().ok_or_else(|| Error::retryable("the source is not started"))
    }

    /// The next snapshot batch (after opening the transaction if needed);
    /// `None` when the stream must catch up first.
    async fn snapshot_batch(&mut self) -> Result<Option<SourceBatch>> {
        if self.snap.is_none() {
            let mut snap = self.connector.connect().await?;
            let at = snap.begin_snapshot().await?;
            let instances = self.client().await?.capture_instances().await?;
            let state = self
                .state
                .clone()
                .ok_or_else(|| Error::retryable("the source is not started"))?;
            let mut plan = state.snapshot.clone().ok_or_else(|| Error::retryable("no snapshot to run"))?;
            let mut messages = Vec::new();
            let mut new_state = state.clone();
            if plan.initial {
                // The first transaction fixes the tables, their instances
                // and the LSN the stream starts after.
                let mut tables: Vec<TableId> = instances.iter().map(|i| i.table.clone()).collect();
                tables.sort();
                tables.dedup();
                tables.retain(|t| self.filter.captures(t));
                for t in &tables {
                    if let Some(ci) = Self::choose(&instances, t, at) {
                        new_state
                            .instances
                            .insert(table_key(t), InstanceState { name: ci.name.clone(), since: ci.start_lsn });
                    }
                }
                plan = SnapshotState {
                    initial: false,
                    mid_stream: false,
                    tables: tables
                        .iter()
                        .map(|t| TablePlan { table: table_key(t), last_key: None, done: false })
                        .collect(),
                };
                new_state.lsn = at;
            } else if at > state.lsn {
                self.catch_up = Some(at);
            }
            // A table not copied yet is copied with the instance that
            // captures at this LSN (the stream left its changes to the copy,
            // a capture-instance switch included), and streams from it.
            for key in plan.not_begun() {
                if let Some(ci) = Self::choose(&instances, &parse_table(key), at) {
                    new_state
                        .instances
                        .insert(key.to_string(), InstanceState { name: ci.name.clone(), since: ci.start_lsn });
                }
            }
            for (t, inst) in &new_state.instances {
                if let Some(ci) = instances.iter().find(|i| i.name == inst.name) {
                    let schema = self.schema_of(ci)?;
                    self.announce(&schema, &mut messages);
                } else {
                    tracing::debug!(table = %t, "capture instance gone at the snapshot; the stream decides");
                }
            }
            for p in &plan.tables {
                let id = parse_table(&p.table);
                self.progress.entry(id.clone()).or_insert(SnapshotTableProgress {
                    table: id,
                    rows: 0,
                    estimated_rows: None,
                    done: p.done,
                });
            }
            new_state.snapshot = Some(plan);
            self.state = Some(new_state);
            self.snap = Some((snap, at));
            self.prelude.extend(messages);
            if self.catch_up.is_some() {
                return Ok(None);
            }
        }
        if self.catch_up.is_some() {
            return Ok(None);
        }
        let chunk = usize::try_from(self.config.snapshot_chunk_rows).unwrap_or(usize::MAX);
        let instances = self.client().await?.capture_instances().await?;
        let mut messages = std::mem::take(&mut self.prelude);
        let mut state = self
            .state
            .clone()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let mut plan = state.snapshot.clone().ok_or_else(|| Error::retryable("no snapshot to run"))?;
        let (mut snap, at) = self.snap.take().ok_or_else(|| Error::retryable("no snapshot transaction"))?;
        // The rows are the state after every change of the transaction at
        // `at`: they sort after all of them (a resumed snapshot's stream
        // catches up to `at`, that transaction included) and before every
        // later one.
        let position = at.position(lsn::MAX_ORDINAL)?;
        let ts_ms = crate::now_ms();
        let mut emitted = 0usize;
        for p in plan.tables.iter_mut().filter(|p| !p.done) {
            if emitted > 0 {
                break;
            }
            let id = parse_table(&p.table);
            let Some(inst) = state
                .instances
                .get(&p.table)
                .and_then(|s| instances.iter().find(|i| i.name == s.name))
            else {
                // Gone since: the stream reports it (dropped or disabled).
                p.done = true;
                continue;
            };
            let schema = self.schema_of(inst)?;
            // A table added to an open snapshot was not announced at its start.
            self.announce(&schema, &mut messages);
            let ci = self.captured(inst);
            let key_idx = schema.key_indexes();
            let after: Option<Vec<Value>> = p.last_key.as_ref().map(|k| {
                k.iter()
                    .zip(&key_idx)
                    .map(|(kv, i)| kv.to_value(&schema.columns[*i].data_type))
                    .collect()
            });
            let mut rows = snap.snapshot_rows(&ci, after.as_deref(), chunk.saturating_add(1)).await?;
            p.done = rows.len() <= chunk;
            rows.truncate(chunk);
            if let Some(last) = rows.last() {
                p.last_key = Some(key_idx.iter().map(|i| KeyValue::from_value(&last[*i])).collect());
            }
            emitted += rows.len();
            if let Some(pr) = self.progress.get_mut(&id) {
                pr.rows += rows.len() as u64;
                pr.done = p.done;
            }
            let native = format!("{at}");
            for row in rows {
                let source = self.info(at, position, ts_ms, native.clone(), SnapshotMarker::True);
                messages.push(SourceMessage::Change(ChangeEvent {
                    schema: schema.clone(),
                    op: Op::Read,
                    before: None,
                    after: Some(row),
                    source,
                    ts_ms: crate::now_ms(),
                    transaction: None,
                }));
            }
        }
        if plan.tables.iter().all(|p| p.done) {
            if let Some(SourceMessage::Change(ev)) = messages
                .iter_mut()
                .rev()
                .find(|m| !plan.mid_stream && matches!(m, SourceMessage::Change(_)))
            {
                ev.source.snapshot = SnapshotMarker::Last;
            }
            state.snapshot = None;
            snap.end_snapshot().await?;
        } else {
            state.snapshot = Some(plan);
            self.snap = Some((snap, at));
        }
        let checkpoint = Checkpoint::encode(&state);
        self.state = Some(state);
        Ok(Some(SourceBatch { messages, checkpoint }))
    }

    /// Reads the next window `(state.lsn, to]` into `pending`; returns
    /// whether there was one (else the caller waits).
    async fn read_window(&mut self) -> Result<bool> {
        let state = self
            .state
            .clone()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        let max = self.client().await?.max_lsn().await?;
        let to = self.catch_up.map_or(max, |c| c.min(max));
        // A table whose capture was enabled is copied in a transaction that
        // begins after it was seen, so the copy holds every row it had
        // before (and nothing of it is lost below its instance's start); an
        // open transaction is only good for one captured at or below its LSN.
        let copying = self.config.snapshot_mode == SnapshotMode::Initial;
        let any_start = copying && self.snap.is_none();
        if to <= state.lsn {
            if any_start && Instant::now() >= self.idle_catalog_at {
                // No commit since: not a reason to wait for one, but looked
                // for once a heartbeat interval only.
                self.idle_catalog_at = Instant::now() + Duration::from_millis(self.config.heartbeat_interval_ms);
                let instances = self.client().await?.capture_instances().await?;
                let copies: VecDeque<Item> = self
                    .new_tables(&state, &instances, None)
                    .into_iter()
                    .map(|ci| Item::Copy(ci.table.clone(), ci.clone()))
                    .collect();
                if !copies.is_empty() {
                    self.pending = copies;
                    self.pending_to = None;
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        let after = state.lsn;
        let instances = self.client().await?.capture_instances().await?;
        let mut reads: Vec<(CaptureInstance, Arc<TableSchema>, stream::Bounds)> = Vec::new();
        let mut switches: Vec<(Lsn, TableId, CaptureInstance)> = Vec::new();
        let mut dropped: Vec<TableId> = Vec::new();
        let mut existing: Option<Vec<TableId>> = None;
        let not_begun: Vec<&str> = state.snapshot.iter().flat_map(|s| s.not_begun()).collect();
        for (key, inst) in &state.instances {
            if not_begun.contains(&key.as_str()) {
                // Its copy holds every change of it up to this window's end.
                continue;
            }
            let table = parse_table(key);
            let cur = instances.iter().find(|i| i.name == inst.name);
            let next = instances
                .iter()
                .filter(|i| i.table == table && i.name != inst.name && cur.is_none_or(|c| i.start_lsn > c.start_lsn))
                .filter(|i| i.start_lsn <= to)
                .min_by_key(|i| i.start_lsn);
            match cur {
                Some(cur) => {
                    let min = self.client().await?.min_lsn(&cur.name).await?;
                    if min > after.next() && min > inst.since {
                        return Err(cleanup_gap(&table, &cur.name, after, min));
                    }
                    if let Some(b) = current_bounds(after, to, next.map(|n| n.start_lsn)) {
                        let b = stream::Bounds { from: b.from.max(min), to: b.to };
                        if b.from <= b.to {
                            reads.push((self.captured(cur), self.schema_of(cur)?, b));
                        }
                    }
                }
                None => {
                    let Some(n) = next else {
                        if existing.is_none() {
                            existing = Some(self.client().await?.tables().await?);
                        }
                        if existing.as_ref().is_some_and(|e| e.contains(&table)) {
                            return Err(Error::needs_operator(format!(
                                "capture instance {} was disabled and the table has no other: its changes are not captured",
                                inst.name
                            ))
                            .with_table(table.clone())
                            .with_class("tributary.sqlserver_cdc_disabled")
                            .with_hint(format!(
                                "EXEC sys.sp_cdc_enable_table @source_schema = {}, @source_name = {}, @role_name = NULL; \
                                 then copy the table again: source-runner --config <source.toml> reset --table {table}",
                                types::quote_literal(&table.schema),
                                types::quote_literal(&table.table)
                            )));
                        }
                        dropped.push(table);
                        continue;
                    };
                    if n.start_lsn > after.next() {
                        return Err(Error::needs_operator(format!(
                            "capture instance {} was disabled before the source reached {}'s start {}: the changes \
                             between {after} and it are in neither",
                            inst.name, n.name, n.start_lsn
                        ))
                        .with_table(table.clone())
                        .with_class("tributary.sqlserver_cleanup_gap")
                        .with_hint(format!(
                            "copy the table again: source-runner --config <source.toml> reset --table {table} (keep \
                             the old capture instance until the source has switched: docs/sources/sqlserver.md)"
                        )));
                    }
                }
            }
            if let Some(n) = next {
                let from = n.start_lsn.max(after.next());
                reads.push((self.captured(n), self.schema_of(n)?, stream::Bounds { from, to }));
                switches.push((n.start_lsn, table.clone(), n.clone()));
            }
        }
        // New tables. Copied when snapshots are on: CDC captures from its
        // enabling on, and the rows the table held then are in no change
        // table. Else streamed from the instance's start.
        let mut copies: Vec<Item> = Vec::new();
        for ci in self.new_tables(&state, &instances, (!any_start).then_some(to)) {
            if copying {
                copies.push(Item::Copy(ci.table.clone(), ci.clone()));
                continue;
            }
            let from = ci.start_lsn.max(after.next());
            reads.push((self.captured(ci), self.schema_of(ci)?, stream::Bounds { from, to }));
            switches.push((ci.start_lsn, ci.table.clone(), ci.clone()));
        }
        let mut rows = Vec::with_capacity(reads.len());
        let tables: Vec<TableId> = reads.iter().map(|r| r.0.table.clone()).collect();
        for (i, (ci, _, b)) in reads.iter().enumerate() {
            rows.push((i, self.client().await?.changes(ci, b.from, b.to).await?));
        }
        let txns = merge(rows, &tables)?;
        let mut items: VecDeque<Item> = dropped.into_iter().map(Item::Dropped).chain(copies).collect();
        switches.sort_by_key(|s| s.0);
        let mut switches = switches.into_iter().peekable();
        for txn in txns {
            while let Some((_, t, ci)) = switches.next_if(|s| s.0 <= txn.lsn) {
                let schema = self.schema_of(&ci)?;
                items.push_back(Item::Switch(t, ci, schema));
            }
            let schemas = txn.changes.iter().map(|c| reads[c.read].1.clone()).collect();
            items.push_back(Item::Txn(txn, schemas));
        }
        for (_, t, ci) in switches {
            let schema = self.schema_of(&ci)?;
            items.push_back(Item::Switch(t, ci, schema));
        }
        self.pending = items;
        self.pending_to = Some(to);
        Ok(true)
    }

    /// The capture instances of selected tables neither read nor planned
    /// to be copied, one per table, that started at or below `to` (`None`:
    /// any).
    fn new_tables<'a>(
        &self,
        state: &SourceState,
        instances: &'a [CaptureInstance],
        to: Option<Lsn>,
    ) -> Vec<&'a CaptureInstance> {
        let mut out: Vec<&CaptureInstance> = Vec::new();
        for ci in instances.iter().filter(|i| to.is_none_or(|to| i.start_lsn <= to)) {
            let key = table_key(&ci.table);
            let planned = state.snapshot.as_ref().is_some_and(|s| s.tables.iter().any(|p| p.table == key));
            if state.instances.contains_key(&key)
                || planned
                || out.iter().any(|o| o.table == ci.table)
                || !self.filter.captures(&ci.table)
            {
                continue;
            }
            out.push(ci);
        }
        out
    }

    /// A batch from `pending`: whole transactions up to the batch size.
    fn pending_batch(&mut self) -> Result<SourceBatch> {
        let mut messages = std::mem::take(&mut self.prelude);
        let max = self.config.max_batch_events;
        let mut events = 0usize;
        while let Some(item) = self.pending.pop_front() {
            match item {
                Item::Dropped(t) => {
                    self.state_mut()?.instances.remove(&table_key(&t));
                    self.announced.remove(&t);
                    messages.push(SourceMessage::TableDropped(t));
                }
                Item::Copy(t, ci) => {
                    self.state_mut()?
                        .instances
                        .insert(table_key(&t), InstanceState { name: ci.name.clone(), since: ci.start_lsn });
                    tracing::info!(table = %t, instance = %ci.name, "a new capture instance: copying the table's rows");
                    self.plan_copy(&t)?;
                }
                Item::Switch(t, ci, schema) => {
                    self.state_mut()?
                        .instances
                        .insert(table_key(&t), InstanceState { name: ci.name.clone(), since: ci.start_lsn });
                    self.announce(&schema, &mut messages);
                }
                Item::Txn(txn, schemas) => {
                    if events > 0 && events + txn.changes.len() > max {
                        self.pending.push_front(Item::Txn(txn, schemas));
                        break;
                    }
                    events += txn.changes.len();
                    let mut per_table: BTreeMap<TableId, i64> = BTreeMap::new();
                    for (ordinal, (change, schema)) in txn.changes.iter().zip(&schemas).enumerate() {
                        self.announce(schema, &mut messages);
                        let n = per_table.entry(schema.id.clone()).or_insert(0);
                        *n += 1;
                        // Debezium's event_serial_no: 2 for the insert half of a key update.
                        let serial = if ordinal > 0
                            && change.op == Op::Create
                            && txn.changes[ordinal - 1].seqval == change.seqval
                        {
                            2
                        } else {
                            1
                        };
                        let native = format!("{}:{}:{serial}", txn.lsn, change.seqval);
                        let source = self.info(
                            txn.lsn,
                            txn.lsn.position(ordinal as u64)?,
                            txn.ts_ms,
                            native,
                            SnapshotMarker::False,
                        );
                        messages.push(SourceMessage::Change(ChangeEvent {
                            schema: schema.clone(),
                            op: change.op,
                            before: change.before.clone(),
                            after: change.after.clone(),
                            source,
                            ts_ms: crate::now_ms(),
                            transaction: Some(TransactionInfo {
                                id: txn.lsn.to_string(),
                                total_order: ordinal as i64 + 1,
                                data_collection_order: *n,
                            }),
                        }));
                    }
                    if let Some(end) = crate::TransactionEnd::of(txn.lsn.to_string(), txn.ts_ms, &per_table) {
                        messages.push(SourceMessage::TransactionEnd(end));
                    }
                    self.state_mut()?.lsn = txn.lsn;
                }
            }
        }
        if self.pending.is_empty() {
            if let Some(to) = self.pending_to.take() {
                self.state_mut()?.lsn = to;
            }
        }
        let state = self
            .state
            .clone()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(&state) })
    }

    async fn next_batch_inner(&mut self) -> Result<SourceBatch> {
        let started = Instant::now();
        let heartbeat = Duration::from_millis(self.config.heartbeat_interval_ms);
        let poll = Duration::from_millis(self.config.poll_interval_ms);
        loop {
            if !self.pending.is_empty() {
                return self.pending_batch();
            }
            let snapshotting = self.state.as_ref().is_some_and(|s| s.snapshot.is_some());
            if let (Some(c), Some(s)) = (self.catch_up, &self.state) {
                if s.lsn >= c {
                    self.catch_up = None;
                }
            }
            if snapshotting && self.catch_up.is_none() {
                if let Some(batch) = self.snapshot_batch().await? {
                    return Ok(batch);
                }
                continue;
            }
            if self.read_window().await? {
                // Its first batch; a window without captured changes (commits
                // to other tables only) still moves the checkpoint to its end.
                return self.pending_batch();
            }
            if let Some(c) = self.catch_up {
                // The server's max LSN cannot be below a snapshot's.
                tracing::debug!(catch_up = %c, "catching up to the snapshot's LSN");
                self.catch_up = None;
                continue;
            }
            if started.elapsed() >= heartbeat || !self.prelude.is_empty() {
                let messages = std::mem::take(&mut self.prelude);
                let state = self
                    .state
                    .clone()
                    .ok_or_else(|| Error::retryable("the source is not started"))?;
                return Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(&state) });
            }
            // CDC is polled: nothing to wait on but the clock (Debezium's
            // poll.interval.ms).
            tokio::time::sleep(poll).await;
        }
    }
}

/// The cleanup job deleted change rows the source had not read.
fn cleanup_gap(table: &TableId, instance: &str, at: Lsn, min: Lsn) -> Error {
    Error::needs_operator(format!(
        "the cleanup job removed changes of capture instance {instance} the source had not read: it keeps changes from \
         {min} on, the source is at {at}"
    ))
    .with_table(table.clone())
    .with_class("tributary.sqlserver_cleanup_gap")
    .with_hint(format!(
        "the changes in between are gone; copy the table again: source-runner --config <source.toml> reset --table \
         {table}, and keep changes longer (EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = \
         <minutes>; see docs/sources/sqlserver.md, Cleanup)"
    ))
}

#[async_trait]
impl Source for SqlServerSource {
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        self.announced.clear();
        self.prelude.clear();
        self.pending.clear();
        self.pending_to = None;
        self.catch_up = None;
        self.snap = None;
        self.client = None;
        let checkpoint = if self.start_over {
            self.start_over = false;
            self.domain_change = Some("a start over was asked for (source-runner reset)".into());
            None
        } else {
            checkpoint
        };
        let state = match checkpoint {
            Some(c) => {
                let state = SourceState::from_checkpoint(&c)?;
                let instances = self.client().await?.capture_instances().await?;
                let mut messages = Vec::new();
                for inst in state.instances.values() {
                    if let Some(ci) = instances.iter().find(|i| i.name == inst.name) {
                        let schema = self.schema_of(ci)?;
                        self.announce(&schema, &mut messages);
                    }
                }
                self.prelude = messages;
                state
            }
            None => match self.config.snapshot_mode {
                SnapshotMode::Initial => SourceState {
                    version: CHECKPOINT_VERSION,
                    lsn: Lsn::ZERO,
                    instances: BTreeMap::new(),
                    snapshot: Some(SnapshotState {
                        initial: true,
                        mid_stream: false,
                        tables: Vec::new(),
                    }),
                },
                SnapshotMode::Never => {
                    let client = self.client().await?;
                    let lsn = client.max_lsn().await?;
                    let instances = client.capture_instances().await?;
                    let mut state = SourceState {
                        version: CHECKPOINT_VERSION,
                        lsn,
                        instances: BTreeMap::new(),
                        snapshot: None,
                    };
                    let mut messages = Vec::new();
                    for ci in &instances {
                        if !self.filter.captures(&ci.table) || state.instances.contains_key(&table_key(&ci.table)) {
                            continue;
                        }
                        if let Some(chosen) = Self::choose(&instances, &ci.table, lsn) {
                            state.instances.insert(
                                table_key(&ci.table),
                                InstanceState { name: chosen.name.clone(), since: chosen.start_lsn },
                            );
                            let schema = self.schema_of(chosen)?;
                            self.announce(&schema, &mut messages);
                        }
                    }
                    self.prelude = messages;
                    state
                }
            },
        };
        self.state = Some(state);
        self.emitted = self.state.clone().map(|s| (s, self.announced.clone()));
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<SourceBatch> {
        match self.next_batch_inner().await {
            Ok(batch) => {
                if let Some(state) = &self.state {
                    self.emitted = Some((state.clone(), self.announced.clone()));
                }
                Ok(batch)
            }
            Err(e) => {
                // Drop half-done work; the next call resumes after the last
                // batch returned.
                self.snap = None;
                self.client = None;
                self.catch_up = None;
                self.pending.clear();
                self.pending_to = None;
                self.prelude.clear();
                if let Some((state, announced)) = self.emitted.clone() {
                    self.state = Some(state);
                    self.announced = announced;
                }
                Err(e)
            }
        }
    }

    async fn acknowledge(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        // Nothing to release: the cleanup job deletes change rows by age,
        // not by what readers acknowledged.
        Ok(())
    }

    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        self.progress.values().cloned().collect()
    }

    /// Copies `tables` again in a snapshot of their own: a SNAPSHOT
    /// transaction whose max CDC LSN is the handoff (the stream first
    /// catches up to it, leaving these tables' changes to the copy; their
    /// changes above it stream after the copy's rows), read in key order
    /// in chunks recorded in the checkpoint, as the initial snapshot.
    async fn resync(&mut self, tables: &[TableId]) -> Result<Vec<TableId>> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Ok(Vec::new());
        }
        let initial = self.state_mut()?.snapshot.as_ref().is_some_and(|s| s.initial);
        // Only a table with a capture instance can be copied consistently
        // (and streamed after).
        let instances = self.client().await?.capture_instances().await?;
        let mut out = Vec::new();
        for id in tables {
            if !self.filter.captures(id) || !instances.iter().any(|i| i.table == *id) || out.contains(id) {
                continue;
            }
            let key = table_key(id);
            let state = self.state_mut()?;
            let known = state.instances.contains_key(&key)
                || state.snapshot.as_ref().is_some_and(|s| s.tables.iter().any(|p| p.table == key));
            if initial {
                // The snapshot not begun yet copies every captured table.
            } else if known {
                self.plan_copy(id)?;
            } else {
                // Not read yet: the stream finds its instance and copies it.
                continue;
            }
            out.push(id.clone());
        }
        // A failed batch goes back to the state after the last one
        // returned: the copies asked for are part of it.
        if let (Some(state), Some((emitted, _))) = (&self.state, &mut self.emitted) {
            *emitted = state.clone();
        }
        Ok(out)
    }

    fn tables(&self) -> Vec<TableId> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        let mut out: Vec<TableId> = state.instances.keys().map(|k| parse_table(k)).collect();
        for p in state.snapshot.iter().flat_map(|s| s.tables.iter()) {
            let id = parse_table(&p.table);
            if !out.contains(&id) {
                out.push(id);
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
}

#[cfg(test)]
mod tds_fixtures;
#[cfg(test)]
mod tests;
