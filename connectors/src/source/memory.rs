//! The reference source: a database in memory, read as a real source reads
//! its database. Read it first when writing a source: it keeps the
//! [`Source`] contract in the fewest lines (a consistent snapshot at one
//! position, chunked and resumable; then the change log from exactly that
//! position; a checkpoint after every batch; heartbeats while idle).
//!
//! Tests change a [`MemoryDatabase`] through its methods, each one a
//! committed transaction of the log, and read what the source emits; the
//! source conformance suite runs against it as against every real source.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tributary_schemas::{
    ChangeEvent, Column, Op, Position, Row, SnapshotMarker, SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

use super::{Checkpoint, SnapshotTableProgress, Source, SourceBatch, SourceMessage};
use crate::error::{Error, Result};
use crate::sink::reduce::key_bytes;

/// The connector name of its events (`source.connector`).
pub const CONNECTOR: &str = "memory";
/// Version of the checkpoint JSON.
pub const CHECKPOINT_VERSION: u32 = 1;
/// Rows per snapshot batch unless configured.
pub const DEFAULT_CHUNK_ROWS: usize = 1000;
/// How long `next_batch` waits for a change before it returns a heartbeat.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(200);

/// One change of a transaction.
#[derive(Debug, Clone)]
enum Change {
    /// A table appeared, or its schema changed; the rows it had get the
    /// given value in each column added at the end.
    Schema(Arc<TableSchema>, Vec<Value>),
    Dropped(TableId),
    Insert(TableId, Row),
    Update(TableId, Row, Row),
    Delete(TableId, Row),
    Truncate(TableId),
}

#[derive(Debug, Clone)]
struct Txn {
    ts_ms: i64,
    changes: Vec<Change>,
}

#[derive(Debug, Default)]
struct Log {
    txns: Vec<Txn>,
}

/// A table as of some point of the log.
#[derive(Debug, Clone)]
struct TableAt {
    schema: Arc<TableSchema>,
    rows: BTreeMap<Vec<u8>, Row>,
}

impl Log {
    /// The tables after the first `n` transactions.
    fn tables_at(&self, n: usize) -> Result<BTreeMap<TableId, TableAt>> {
        let mut tables: BTreeMap<TableId, TableAt> = BTreeMap::new();
        for txn in &self.txns[..n.min(self.txns.len())] {
            for change in &txn.changes {
                match change {
                    Change::Schema(s, defaults) => {
                        let t = tables
                            .entry(s.id.clone())
                            .or_insert_with(|| TableAt { schema: s.clone(), rows: BTreeMap::new() });
                        for row in t.rows.values_mut() {
                            row.extend(defaults.iter().cloned());
                        }
                        t.schema = s.clone();
                    }
                    Change::Dropped(id) => {
                        tables.remove(id);
                    }
                    Change::Insert(id, row) | Change::Update(id, _, row) => {
                        let t = tables.get_mut(id).ok_or_else(|| Error::permanent(format!("no table {id}")))?;
                        let key = key_bytes(&t.schema, row, &t.schema.key_indexes())?;
                        t.rows.insert(key, row.clone());
                    }
                    Change::Delete(id, row) => {
                        let t = tables.get_mut(id).ok_or_else(|| Error::permanent(format!("no table {id}")))?;
                        let key = key_bytes(&t.schema, row, &t.schema.key_indexes())?;
                        t.rows.remove(&key);
                    }
                    Change::Truncate(id) => {
                        if let Some(t) = tables.get_mut(id) {
                            t.rows.clear();
                        }
                    }
                }
            }
        }
        Ok(tables)
    }
}

/// A database in memory: its history is a log of committed transactions.
#[derive(Debug, Clone, Default)]
pub struct MemoryDatabase {
    log: Arc<Mutex<Log>>,
    changed: Arc<Notify>,
}

impl MemoryDatabase {
    /// An empty database.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn commit(&self, changes: Vec<Change>) {
        let ts_ms = crate::now_ms();
        self.lock().txns.push(Txn { ts_ms, changes });
        self.changed.notify_waiters();
    }

    /// The current schema of `table`.
    pub fn schema(&self, table: &TableId) -> Option<Arc<TableSchema>> {
        let log = self.lock();
        log.tables_at(log.txns.len()).ok()?.get(table).map(|t| t.schema.clone())
    }

    /// Creates a table.
    pub fn create_table(&self, schema: TableSchema) {
        self.commit(vec![Change::Schema(Arc::new(schema), Vec::new())]);
    }

    /// Adds a column at the end; the rows there are get `default` (like
    /// `ALTER TABLE ... ADD COLUMN ... DEFAULT`, which rewrites no row in
    /// the change log: only the new schema is emitted).
    pub fn add_column(&self, table: &TableId, column: Column, default: Value) -> Result<()> {
        let schema = self
            .schema(table)
            .ok_or_else(|| Error::permanent(format!("no table {table}")))?;
        let mut new = (*schema).clone();
        new.columns.push(column);
        self.commit(vec![Change::Schema(Arc::new(new), vec![default])]);
        Ok(())
    }

    /// Drops a table.
    pub fn drop_table(&self, table: &TableId) {
        self.commit(vec![Change::Dropped(table.clone())]);
    }

    /// Inserts rows, in one transaction.
    pub fn insert(&self, table: &TableId, rows: Vec<Row>) {
        self.commit(rows.into_iter().map(|r| Change::Insert(table.clone(), r)).collect());
    }

    /// Replaces a row (found by the key of `after`) with `after`.
    pub fn update(&self, table: &TableId, after: Row) -> Result<()> {
        let before = self.current(table, &after)?;
        self.commit(vec![Change::Update(table.clone(), before, after)]);
        Ok(())
    }

    /// Deletes the row with the key of `key_row`.
    pub fn delete(&self, table: &TableId, key_row: &Row) -> Result<()> {
        let before = self.current(table, key_row)?;
        self.commit(vec![Change::Delete(table.clone(), before)]);
        Ok(())
    }

    /// Removes every row.
    pub fn truncate(&self, table: &TableId) {
        self.commit(vec![Change::Truncate(table.clone())]);
    }

    /// The current rows of `table`, in key order.
    pub fn rows(&self, table: &TableId) -> Vec<Row> {
        let log = self.lock();
        log.tables_at(log.txns.len())
            .ok()
            .and_then(|t| t.get(table).map(|t| t.rows.values().cloned().collect()))
            .unwrap_or_default()
    }

    fn current(&self, table: &TableId, row: &Row) -> Result<Row> {
        let log = self.lock();
        let tables = log.tables_at(log.txns.len())?;
        let t = tables.get(table).ok_or_else(|| Error::permanent(format!("no table {table}")))?;
        let key = key_bytes(&t.schema, row, &t.schema.key_indexes())?;
        t.rows
            .get(&key)
            .cloned()
            .ok_or_else(|| Error::permanent(format!("no such row in {table}")))
    }
}

/// The source's resumable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryState {
    /// Format version.
    pub version: u32,
    /// Transactions of the log already emitted.
    pub position: usize,
    /// While the snapshot is unfinished: rows emitted per table (`schema.table`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<BTreeMap<String, usize>>,
}

/// The memory [`Source`].
#[derive(Debug)]
pub struct MemorySource {
    db: MemoryDatabase,
    name: Arc<str>,
    chunk_rows: usize,
    heartbeat: Duration,
    state: Option<MemoryState>,
    announced: HashMap<TableId, Arc<TableSchema>>,
    snapshot_total: BTreeMap<String, usize>,
}

impl MemorySource {
    /// A source reading `db`, for the runner named `name`.
    pub fn new(db: MemoryDatabase, name: &str) -> Self {
        Self {
            db,
            name: Arc::from(name),
            chunk_rows: DEFAULT_CHUNK_ROWS,
            heartbeat: DEFAULT_HEARTBEAT,
            state: None,
            announced: HashMap::new(),
            snapshot_total: BTreeMap::new(),
        }
    }

    /// Rows per snapshot batch.
    pub fn with_chunk_rows(mut self, rows: usize) -> Self {
        self.chunk_rows = rows.max(1);
        self
    }

    fn info(&self, position: Position, ts_ms: i64, snapshot: SnapshotMarker) -> SourceInfo {
        SourceInfo {
            connector: Arc::from(CONNECTOR),
            name: self.name.clone(),
            db: Arc::from("memory"),
            ts_ms,
            snapshot,
            tx_id: (snapshot == SnapshotMarker::False).then(|| position.commit.to_string()),
            position,
            native_position: Arc::from(position.commit.to_string()),
        }
    }

    fn announce(&mut self, schema: &Arc<TableSchema>, out: &mut Vec<SourceMessage>) {
        if self.announced.get(&schema.id).is_none_or(|s| s != schema) {
            self.announced.insert(schema.id.clone(), schema.clone());
            out.push(SourceMessage::SchemaChanged(schema.clone()));
        }
    }

    fn event(
        &self,
        schema: &Arc<TableSchema>,
        op: Op,
        before: Option<Row>,
        after: Option<Row>,
        source: SourceInfo,
    ) -> ChangeEvent {
        ChangeEvent {
            schema: schema.clone(),
            op,
            before,
            after,
            source,
            ts_ms: crate::now_ms(),
            transaction: None,
        }
    }

    /// The next snapshot chunk, or `None` when the snapshot is done.
    fn snapshot_batch(&mut self, mut state: MemoryState) -> Result<SourceBatch> {
        let at = state.position;
        let tables = { self.db.lock().tables_at(at)? };
        let mut done = state.snapshot.take().unwrap_or_default();
        let mut messages = Vec::new();
        let position = Position { commit: at as u64, index: 0 };
        let ts_ms = crate::now_ms();
        for (id, t) in &tables {
            self.snapshot_total.insert(id.to_string(), t.rows.len());
            let emitted = done.get(&id.to_string()).copied().unwrap_or(0);
            if emitted >= t.rows.len() && done.contains_key(&id.to_string()) {
                continue;
            }
            self.announce(&t.schema, &mut messages);
            let rows: Vec<&Row> = t.rows.values().skip(emitted).take(self.chunk_rows).collect();
            for row in &rows {
                let source = self.info(position, ts_ms, SnapshotMarker::True);
                messages.push(SourceMessage::Change(self.event(
                    &t.schema,
                    Op::Read,
                    None,
                    Some((*row).clone()),
                    source,
                )));
            }
            done.insert(id.to_string(), emitted + rows.len());
            break;
        }
        let finished = tables
            .iter()
            .all(|(id, t)| done.get(&id.to_string()).is_some_and(|n| *n >= t.rows.len()));
        if finished {
            // The last row of the snapshot says so (Debezium's `last`).
            if let Some(SourceMessage::Change(ev)) =
                messages.iter_mut().rev().find(|m| matches!(m, SourceMessage::Change(_)))
            {
                ev.source.snapshot = SnapshotMarker::Last;
            }
            for (id, t) in &tables {
                self.announced.entry(id.clone()).or_insert_with(|| t.schema.clone());
            }
        } else {
            state.snapshot = Some(done);
        }
        self.state = Some(state.clone());
        Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(&state) })
    }
}

#[async_trait]
impl Source for MemorySource {
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        self.announced.clear();
        let state = match checkpoint {
            Some(c) => c.decode::<MemoryState>("memory", |s| s.version, CHECKPOINT_VERSION)?,
            None => {
                let at = self.db.lock().txns.len();
                MemoryState {
                    version: CHECKPOINT_VERSION,
                    position: at,
                    snapshot: Some(BTreeMap::new()),
                }
            }
        };
        // What the topics already hold is announced again (the runner
        // registers by content: an unchanged schema costs nothing).
        self.state = Some(state);
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<SourceBatch> {
        let state = self
            .state
            .clone()
            .ok_or_else(|| Error::retryable("the source is not started"))?;
        if state.snapshot.is_some() {
            return self.snapshot_batch(state);
        }
        let changed = self.db.changed.clone();
        let notified = changed.notified();
        let next = { self.db.lock().txns.get(state.position).cloned() };
        let txn = match next {
            Some(txn) => txn,
            None => {
                let _ = tokio::time::timeout(self.heartbeat, notified).await;
                match self.db.lock().txns.get(state.position).cloned() {
                    Some(txn) => txn,
                    None => {
                        return Ok(SourceBatch {
                            messages: Vec::new(),
                            checkpoint: Checkpoint::encode(&state),
                        })
                    }
                }
            }
        };
        let commit = state.position as u64 + 1;
        let schemas = { self.db.lock().tables_at(state.position)? };
        let mut schemas: HashMap<TableId, Arc<TableSchema>> =
            schemas.into_iter().map(|(id, t)| (id, t.schema)).collect();
        let mut messages = Vec::new();
        let total = txn.changes.len() as i64;
        for (index, change) in txn.changes.into_iter().enumerate() {
            let source = self.info(Position { commit, index: index as u64 }, txn.ts_ms, SnapshotMarker::False);
            let schema_of = |id: &TableId, schemas: &HashMap<TableId, Arc<TableSchema>>| {
                schemas
                    .get(id)
                    .cloned()
                    .ok_or_else(|| Error::permanent(format!("no schema for {id}")))
            };
            let (schema, op, before, after) = match change {
                Change::Schema(s, _) => {
                    schemas.insert(s.id.clone(), s.clone());
                    self.announce(&s, &mut messages);
                    continue;
                }
                Change::Dropped(id) => {
                    self.announced.remove(&id);
                    messages.push(SourceMessage::TableDropped(id));
                    continue;
                }
                Change::Insert(id, row) => (schema_of(&id, &schemas)?, Op::Create, None, Some(row)),
                Change::Update(id, b, a) => (schema_of(&id, &schemas)?, Op::Update, Some(b), Some(a)),
                Change::Delete(id, b) => (schema_of(&id, &schemas)?, Op::Delete, Some(b), None),
                Change::Truncate(id) => (schema_of(&id, &schemas)?, Op::Truncate, None, None),
            };
            self.announce(&schema, &mut messages);
            let mut ev = self.event(&schema, op, before, after, source);
            ev.transaction = Some(TransactionInfo {
                id: commit.to_string(),
                total_order: index as i64 + 1,
                data_collection_order: total,
            });
            messages.push(SourceMessage::Change(ev));
        }
        let state = MemoryState { position: state.position + 1, ..state };
        self.state = Some(state.clone());
        Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(&state) })
    }

    async fn acknowledge(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        // Nothing to release: the log is kept whole (a real source moves
        // its slot or binlog retention here).
        Ok(())
    }

    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        let done = self.state.as_ref().and_then(|s| s.snapshot.as_ref());
        self.snapshot_total
            .iter()
            .map(|(name, total)| {
                let (schema, table) = name.split_once('.').unwrap_or(("", name));
                // No snapshot state left: every table is done.
                let rows = done.map_or(*total, |d| d.get(name).copied().unwrap_or(0));
                SnapshotTableProgress {
                    table: TableId::new(schema, table),
                    rows: rows as u64,
                    estimated_rows: Some(*total as u64),
                    done: done.is_none() || d_done(done, name, *total),
                }
            })
            .collect()
    }
}

/// Whether the snapshot state `done` has emitted all `total` rows of `table`.
fn d_done(done: Option<&BTreeMap<String, usize>>, table: &str, total: usize) -> bool {
    done.and_then(|d| d.get(table)).is_some_and(|n| *n >= total)
}
