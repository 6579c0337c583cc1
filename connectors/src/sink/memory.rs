//! The reference sink: tables in memory, driven by the warehouse-sink core
//! exactly as a real destination is. Read it first when writing a sink: each
//! [`Warehouse`] method here is the smallest thing that keeps the contract.
//!
//! Runner tests use it as a destination that needs no server; the
//! conformance suite (`tests/tests/sink_conformance.rs`) runs against it as
//! against every real sink, so the suite itself is known to pass on a
//! correct sink. A [`MemoryStore`] outlives the sinks built on it (a
//! restarted runner finds its offsets), and can be made unreachable or made
//! to refuse a value, for the error paths.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tracing::Span;
use tributary_schemas::{Column, DataType, Position, TableId, TableSchema, Value};

use super::bookkeeping::{fenced, is_bookkeeping, keeps_removal, Fence, OffsetMove, FORGOTTEN_POSITION};
use super::keyless::{delete_done, pair, row_gone, PairItem};
use super::reduce::{key_bytes, Group, Instance, Line, Reduction};
use super::schema::{plan, Dialect, Evolution, Fit, TableChange, TableShape, KEY_CHANGED_CLASS};
use super::warehouse::{Mode, Warehouse, WarehouseSink};
use super::{ApplyError, SinkBatch};
use crate::error::{Error, Result};
use crate::problem::Problem;

/// A stored row: its values by column, and the position of the change that
/// wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRow {
    /// Values by column name.
    pub values: BTreeMap<String, Value>,
    /// The position guard's column pair; `None` once forgotten (older
    /// than any change: see [`Warehouse::forget_positions`]; a real
    /// destination stores `(-1, -1)`).
    pub position: Option<Position>,
}

/// A table in memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryTable {
    /// Its columns and key.
    pub shape: TableShape<DataType>,
    /// Rows by key (the core's key bytes).
    pub rows: BTreeMap<Vec<u8>, StoredRow>,
    /// The deleted-rows entries: the position of each key's newest delete
    /// (kept until a newer change writes the key again).
    pub deleted: BTreeMap<Vec<u8>, Position>,
    /// The table-wide entry: the newest truncate or copy.
    pub removed_before: Option<Position>,
    /// A table without a key: its pending deletes, by content key and
    /// record (see [`super::keyless`]); its other entries are in
    /// `deleted`, under `+<record>` and `-<record>`.
    pub pending: BTreeMap<(String, String), Position>,
    /// The columns added with the source's default: the default a row
    /// written without the column gets, as a destination's `DEFAULT`
    /// gives it.
    pub defaults: BTreeMap<String, Value>,
}

/// Everything the sinks of one destination share.
#[derive(Debug, Clone, Default)]
pub struct MemoryState {
    /// Tables by `schema.table`.
    pub tables: BTreeMap<String, MemoryTable>,
    /// `(consumer group, topic, partition) -> next offset`.
    pub offsets: BTreeMap<(String, String, i32), i64>,
    /// The last reset applied to each table (see
    /// [`Warehouse::forget_positions`]).
    pub resets: BTreeMap<String, u64>,
    /// While set, every call fails as a destination that is down would
    /// (retryable).
    pub unreachable: bool,
    /// A value the destination refuses in any column (like a CHECK
    /// constraint): the batch fails without naming the record, so the core
    /// must find it by bisection.
    pub refused: Option<Value>,
    /// Committed units, for tests that count round trips.
    pub commits: u64,
}

/// A destination in memory, shared by every sink built on it.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore(Arc<Mutex<MemoryState>>);

impl MemoryStore {
    /// An empty destination.
    pub fn new() -> Self {
        Self::default()
    }

    /// Its state, to read or change.
    pub fn state(&self) -> MutexGuard<'_, MemoryState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A sink writing here under `consumer_group`.
    pub fn sink(&self, consumer_group: &str) -> MemorySink {
        MemorySink {
            store: self.clone(),
            consumer_group: consumer_group.to_string(),
            drop_tables: false,
            drop_columns: false,
            open: None,
            mode: Mode::Commit,
            saved: Vec::new(),
        }
    }

    /// The rows of `table` (`schema.table`), each as its values by column
    /// name, in key order.
    pub fn rows(&self, table: &str) -> Vec<BTreeMap<String, Value>> {
        self.state()
            .tables
            .get(table)
            .map(|t| t.rows.values().map(|r| r.values.clone()).collect())
            .unwrap_or_default()
    }
}

/// The memory [`Sink`](super::Sink).
#[derive(Debug)]
pub struct MemorySink {
    store: MemoryStore,
    consumer_group: String,
    drop_tables: bool,
    drop_columns: bool,
    /// The open unit: a copy of the state, written back on commit.
    open: Option<MemoryState>,
    mode: Mode,
    /// Copies taken at each savepoint.
    saved: Vec<MemoryState>,
}

/// The memory destination's types: the logical types themselves.
#[derive(Debug, Clone, Copy)]
pub struct MemoryDialect;

impl Dialect for MemoryDialect {
    type Type = DataType;

    fn column_type(&self, column: &Column, _origin: &str) -> DataType {
        column.data_type.clone()
    }

    fn position_type(&self) -> DataType {
        DataType::Int64
    }

    fn fit(&self, have: &DataType, want: &DataType) -> Fit<DataType> {
        let width = |t: &DataType| match t {
            DataType::Int16 => Some(1),
            DataType::Int32 => Some(2),
            DataType::Int64 => Some(3),
            _ => None,
        };
        match (have, want) {
            _ if have == want => Fit::Keep,
            (h, w) if width(h).is_some() && width(w).is_some() => {
                if width(h) >= width(w) {
                    Fit::Keep
                } else {
                    Fit::Widen(w.clone())
                }
            }
            (DataType::Float64, DataType::Float32) => Fit::Keep,
            (DataType::Float32, DataType::Float64) => Fit::Widen(want.clone()),
            (DataType::Decimal { precision: hp, scale: hs }, DataType::Decimal { precision: wp, scale: ws }) => {
                let (i, s) = ((hp - hs).max(wp - ws), (*hs).max(*ws));
                if (i + s, s) == (*hp, *hs) {
                    Fit::Keep
                } else {
                    Fit::Widen(DataType::Decimal { precision: i + s, scale: s })
                }
            }
            (DataType::VariableDecimal, DataType::Decimal { .. }) => Fit::Keep,
            (DataType::Decimal { .. }, DataType::VariableDecimal) => Fit::Widen(DataType::VariableDecimal),
            (DataType::Text, DataType::Enum { .. }) | (DataType::Enum { .. }, DataType::Enum { .. }) => Fit::Keep,
            _ => Fit::Incompatible,
        }
    }

    fn key_refuses_null(&self) -> bool {
        true
    }

    fn adds_position_columns(&self) -> bool {
        true
    }

    fn incompatible(&self, table: &str, column: &Column, have: &DataType, want: &DataType) -> Error {
        Error::permanent(format!("cannot change column {} of {table} from {have} to {want}", column.name))
            .with_hint("recreate the table with the new type, then replay the dead-letter topic")
    }
}

impl MemorySink {
    /// Whether a table dropped in the source is dropped here (off by
    /// default, as for every sink).
    pub fn set_drop_tables(&mut self, drop: bool) {
        self.drop_tables = drop;
    }

    /// Whether a column dropped in the source is dropped here (off by
    /// default, as for every sink).
    pub fn set_drop_columns(&mut self, drop: bool) {
        self.drop_columns = drop;
    }

    fn down(&self) -> Result<()> {
        if self.store.state().unreachable {
            return Err(Error::retryable("the memory destination is unreachable").with_class("memory.unreachable"));
        }
        Ok(())
    }

    fn unit(&mut self) -> Result<&mut MemoryState> {
        self.down()?;
        self.open.as_mut().ok_or_else(|| Error::retryable("no unit is open"))
    }
}

#[async_trait]
impl Warehouse for MemorySink {
    type Table = String;

    fn destination(&self, source: &TableId) -> String {
        source.to_string()
    }

    fn drops_tables(&self) -> bool {
        self.drop_tables
    }

    async fn connect(&mut self) -> Result<()> {
        self.down()
    }

    async fn begin(&mut self, mode: Mode) -> Result<()> {
        self.down()?;
        self.open = Some(self.store.state().clone());
        self.mode = mode;
        self.saved.clear();
        Ok(())
    }

    async fn finish(&mut self, offsets: &[OffsetMove<'_>]) -> Result<()> {
        let group = self.consumer_group.clone();
        let unit = self.unit()?;
        for m in offsets {
            let key = (group.clone(), m.topic.to_string(), m.partition);
            let stored = unit.offsets.get(&key).copied();
            let holds = match m.fence {
                Fence::Unchecked => true,
                Fence::Absent => stored.is_none(),
                Fence::At(at) => stored == Some(at),
            };
            if !holds {
                self.open = None;
                return Err(fenced(&format!(
                    "{} partition {}: expected {:?}, stored {stored:?}",
                    m.topic, m.partition, m.fence
                )));
            }
            unit.offsets.insert(key, m.next);
        }
        let unit = self.open.take().ok_or_else(|| Error::retryable("no unit is open"))?;
        if self.mode == Mode::Commit {
            let mut state = self.store.state();
            let (unreachable, refused, commits) = (state.unreachable, state.refused.clone(), state.commits);
            *state = unit;
            // What the test set meanwhile is not part of the unit.
            state.unreachable = unreachable;
            state.refused = refused;
            state.commits = commits + 1;
        }
        Ok(())
    }

    async fn abort(&mut self) {
        self.open = None;
        self.saved.clear();
    }

    fn failed(&mut self, error: Error) -> Error {
        self.open = None;
        error
    }

    async fn reconcile(&mut self, table: &String, schema: &TableSchema, origin: &str) -> Result<()> {
        let drop_columns = self.drop_columns;
        let unit = self.unit()?;
        let stored = unit.tables.entry(table.clone()).or_default();
        let evolution = Evolution { drop_columns };
        let changes = match plan(&MemoryDialect, table, schema, origin, &stored.shape, evolution) {
            // Its source table gained or lost its key: made anew once a
            // reset forgot every row (the source copies it again).
            Err(e) if e.class() == KEY_CHANGED_CLASS => {
                if stored.rows.values().any(|r| r.position.is_some()) {
                    return Err(e);
                }
                *stored = MemoryTable::default();
                plan(&MemoryDialect, table, schema, origin, &stored.shape, evolution)?
            }
            other => other?,
        };
        stored.shape.apply(&changes);
        for change in &changes {
            match change {
                TableChange::AddBookkeeping(c) => {
                    for row in stored.rows.values_mut() {
                        row.values.insert(c.name.clone(), Value::Int64(-1));
                    }
                }
                TableChange::AddColumn { column, backfill: Some(v) } => {
                    for row in stored.rows.values_mut() {
                        row.values.insert(column.name.clone(), v.clone());
                    }
                    stored.defaults.insert(column.name.clone(), v.clone());
                }
                TableChange::RenameColumn { from, to } => {
                    if let Some(v) = stored.defaults.remove(from) {
                        stored.defaults.insert(to.clone(), v);
                    }
                    for row in stored.rows.values_mut() {
                        if let Some(v) = row.values.remove(from) {
                            row.values.insert(to.clone(), v);
                        }
                    }
                }
                TableChange::DropColumn { column } => {
                    stored.defaults.remove(column);
                    for row in stored.rows.values_mut() {
                        row.values.remove(column);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn drop_table(&mut self, table: &String) -> Result<()> {
        self.unit()?.tables.remove(table);
        Ok(())
    }

    async fn truncate(&mut self, table: &String, at: Position) -> Result<()> {
        let t = self.unit()?.tables.entry(table.clone()).or_default();
        t.rows.retain(|_, row| row.position >= Some(at));
        t.deleted.retain(|_, p| *p >= at);
        t.pending.retain(|_, p| *p >= at);
        if keeps_removal(at) {
            t.removed_before = t.removed_before.max(Some(at));
        }
        Ok(())
    }

    async fn forget_positions(&mut self, table: &String, reset: u64) -> Result<()> {
        let unit = self.unit()?;
        if unit.resets.get(table).is_some_and(|done| *done >= reset) {
            return Ok(());
        }
        unit.resets.insert(table.clone(), reset);
        if let Some(t) = unit.tables.get_mut(table) {
            for row in t.rows.values_mut() {
                row.position = None;
            }
            // Positions of another domain: a delete's or truncate's entry
            // would keep the copy's rows out.
            t.deleted.clear();
            t.pending.clear();
            t.removed_before = None;
        }
        Ok(())
    }

    async fn write(&mut self, table: &String, changes: &Reduction<'_>, _after_load: bool) -> Result<(), ApplyError> {
        let refused = self.store.state().refused.clone();
        let unit = self.unit()?;
        let stored = unit
            .tables
            .get_mut(table)
            .ok_or_else(|| Error::retryable(format!("table {table} is missing")))?;
        if changes.is_keyless() {
            return write_keyless(stored, table, changes, refused.as_ref());
        }
        for (group, line) in changes.live() {
            let key = key_bytes(&group.schema, line.row, &group.key)?;
            let older = stored.rows.get(&key).is_none_or(|row| row.position < Some(line.position));
            let or_same = stored.rows.get(&key).is_none_or(|row| row.position <= Some(line.position));
            if line.delete {
                if or_same {
                    stored.rows.remove(&key);
                }
                let entry = stored.deleted.entry(key).or_insert(line.position);
                *entry = (*entry).max(line.position);
                continue;
            }
            // Deleted at or after this change, or truncated (copied) away
            // after it: it must not bring the row back. A change at the
            // table-wide entry's own position is a row of that copy (every
            // row of a snapshot has its position), read on a partition
            // applied after another partition's table-copied record.
            let deleted = stored.deleted.get(&key).is_some_and(|p| *p >= line.position);
            if deleted || stored.removed_before.is_some_and(|p| p > line.position) {
                continue;
            }
            let kept = stored.rows.get(&key).map(|r| r.values.clone()).unwrap_or_default();
            let values = row_values(stored, table, group, line, refused.as_ref(), &kept)?;
            stored.deleted.remove(&key);
            if older {
                stored.rows.insert(key, StoredRow { values, position: Some(line.position) });
            }
        }
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<()> {
        let copy = self.unit()?.clone();
        self.saved.push(copy);
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        let saved = self.saved.pop().ok_or_else(|| Error::retryable("no savepoint"))?;
        self.open = Some(saved);
        Ok(())
    }

    async fn read_range(
        &mut self,
        table: &String,
        schema: &TableSchema,
        range: &super::verify::KeyRange,
    ) -> Result<Option<Vec<tributary_schemas::Row>>> {
        self.down()?;
        let state = self.store.state();
        let Some(stored) = state.tables.get(table) else {
            return Ok(Some(Vec::new()));
        };
        let keys = schema.key_indexes();
        let mut out = Vec::new();
        for row in stored.rows.values() {
            let values: Vec<Value> = schema
                .columns
                .iter()
                .map(|c| row.values.get(&c.name).cloned().unwrap_or(Value::Null))
                .collect();
            let key: Vec<Value> = keys.iter().map(|&k| values[k].clone()).collect();
            if range.contains(&key) {
                out.push(values);
            }
        }
        Ok(Some(out))
    }
}

/// The values `line` writes into `stored`, checked as a destination
/// would (a refused value, NULL in a NOT NULL column: named by
/// bisection). Columns the schema no longer has are NULL in a new row,
/// `kept` in an updated one (as an UPDATE ... SET of the sent columns).
fn row_values(
    stored: &MemoryTable,
    table: &str,
    group: &Group<'_>,
    line: &Line<'_>,
    refused: Option<&Value>,
    kept: &BTreeMap<String, Value>,
) -> Result<BTreeMap<String, Value>, ApplyError> {
    let mut values = BTreeMap::new();
    for (column, value) in group.schema.columns.iter().zip(line.row) {
        let Some(dest) = stored.shape.column(&column.name) else {
            return Err(Error::retryable(format!("column {} is missing in {table}", column.name)).into());
        };
        if refused == Some(value) {
            // Named by bisection, like a constraint the server checks.
            return Err(Error::permanent(format!("column {}: the value is refused", column.name))
                .with_column(column.name.clone())
                .with_table(group.schema.id.clone())
                .into());
        }
        if dest.not_null && *value == Value::Null {
            // Like a server's NOT NULL check: the record is found by
            // bisection.
            return Err(Error::permanent(format!("column {} refuses NULL", column.name))
                .with_column(column.name.clone())
                .with_table(group.schema.id.clone())
                .into());
        }
        values.insert(column.name.clone(), value.clone());
    }
    for c in stored.shape.columns.iter().filter(|c| !is_bookkeeping(&c.name)) {
        if !values.contains_key(&c.name) {
            let default = stored.defaults.get(&c.name);
            values.insert(c.name.clone(), kept.get(&c.name).or(default).cloned().unwrap_or(Value::Null));
        }
    }
    Ok(values)
}

/// A stored position as the pairing compares it (forgotten: older than
/// any change).
fn pair_position(p: Option<Position>) -> (i64, i64) {
    p.map_or(FORGOTTEN_POSITION, |p| (p.commit as i64, p.index as i64))
}

/// The rows key of a keyless table's row: its content key and name.
fn keyless_row_key(content: &str, row: &str) -> Vec<u8> {
    format!("{content}/{row}").into_bytes()
}

/// [`Warehouse::write`] of a table without a key, as
/// [`super::keyless::statements`] does it in SQL, step by step.
fn write_keyless(
    stored: &mut MemoryTable,
    table: &str,
    changes: &Reduction<'_>,
    refused: Option<&Value>,
) -> Result<(), ApplyError> {
    let instance = |line: &Line<'_>| -> Result<Instance> {
        line.instance
            .as_deref()
            .cloned()
            .ok_or_else(|| Error::retryable("a keyless line without its row's name"))
    };
    let older_than_table = |t: &MemoryTable, at: Position| t.removed_before.is_some_and(|r| r > at);
    // 1-3: inserts, some taken by pending deletes of their content.
    let mut inserts = Vec::new();
    for (group, line) in changes.live().filter(|(_, l)| !l.delete) {
        let i = instance(line)?;
        if stored.rows.contains_key(&keyless_row_key(&i.content, &i.row))
            || stored.deleted.contains_key(row_gone(&i.row).as_bytes())
            || older_than_table(stored, line.position)
        {
            continue;
        }
        inserts.push((group, line, i));
    }
    let mut items: Vec<PairItem> = Vec::new();
    for (_, line, i) in &inserts {
        items.push(PairItem {
            content: i.content.clone(),
            position: pair_position(Some(line.position)),
            newer: false,
            id: i.row.clone(),
        });
    }
    let pending: Vec<((String, String), Position)> = stored
        .pending
        .iter()
        .filter(|((content, _), _)| inserts.iter().any(|(_, _, i)| &i.content == content))
        .map(|(k, p)| (k.clone(), *p))
        .collect();
    for ((content, id), at) in &pending {
        items.push(PairItem {
            content: content.clone(),
            position: pair_position(Some(*at)),
            newer: true,
            id: id.clone(),
        });
    }
    let matched = pair(&items);
    let mut taken: Vec<bool> = matched[..inserts.len()].to_vec();
    for (n, ((content, id), at)) in pending.iter().enumerate() {
        if matched[inserts.len() + n] {
            stored.pending.remove(&(content.clone(), id.clone()));
            stored.deleted.insert(delete_done(id).into_bytes(), *at);
        }
    }
    for (n, (group, line, i)) in inserts.iter().enumerate() {
        if std::mem::take(&mut taken[n]) {
            stored.deleted.insert(row_gone(&i.row).into_bytes(), line.position);
            continue;
        }
        let values = row_values(stored, table, group, line, refused, &BTreeMap::new())?;
        stored
            .rows
            .insert(keyless_row_key(&i.content, &i.row), StoredRow { values, position: Some(line.position) });
    }
    // 4-5: deletes, each taking a row of its content older than it, or
    // left pending.
    let mut deletes = Vec::new();
    for (_, line) in changes.live().filter(|(_, l)| l.delete) {
        let i = instance(line)?;
        if stored.deleted.contains_key(delete_done(&i.row).as_bytes())
            || stored.pending.contains_key(&(i.content.clone(), i.row.clone()))
            || older_than_table(stored, line.position)
        {
            continue;
        }
        deletes.push((line.position, i));
    }
    let mut items: Vec<PairItem> = deletes
        .iter()
        .map(|(at, i)| PairItem {
            content: i.content.clone(),
            position: pair_position(Some(*at)),
            newer: true,
            id: i.row.clone(),
        })
        .collect();
    let mut rows: Vec<(Vec<u8>, String, Option<Position>)> = Vec::new();
    for (key, row) in &stored.rows {
        let Some((content, name)) = std::str::from_utf8(key).ok().and_then(|k| k.split_once('/')) else {
            continue;
        };
        if deletes.iter().any(|(_, i)| i.content == content) {
            items.push(PairItem {
                content: content.to_string(),
                position: pair_position(row.position),
                newer: false,
                id: name.to_string(),
            });
            rows.push((key.clone(), name.to_string(), row.position));
        }
    }
    let matched = pair(&items);
    for (n, (at, i)) in deletes.iter().enumerate() {
        if matched[n] {
            stored.deleted.insert(delete_done(&i.row).into_bytes(), *at);
        } else {
            stored.pending.insert((i.content.clone(), i.row.clone()), *at);
        }
    }
    for (n, (key, name, at)) in rows.iter().enumerate() {
        if matched[deletes.len() + n] {
            stored.rows.remove(key);
            stored.deleted.insert(row_gone(name).into_bytes(), at.unwrap_or_default());
        }
    }
    Ok(())
}

#[async_trait]
impl WarehouseSink for MemorySink {
    /// None: nothing of the memory sink takes time worth a span.
    fn apply_span(&self, _batch: &SinkBatch) -> Span {
        Span::none()
    }

    async fn read_offsets(&mut self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>> {
        self.down()?;
        let state = self.store.state();
        Ok(partitions
            .iter()
            .map(|(t, p)| state.offsets.get(&(self.consumer_group.clone(), t.clone(), *p)).copied())
            .collect())
    }

    async fn problems(&mut self) -> Vec<Problem> {
        match self.down() {
            Ok(()) => Vec::new(),
            Err(e) => vec![Problem::error(
                e.to_string(),
                Some("bring the memory destination back".into()),
            )],
        }
    }

    async fn remove_copy(&mut self, drop: &[TableId]) -> Result<Vec<String>> {
        self.down()?;
        let mut state = self.store.state();
        let before = state.offsets.len();
        state.offsets.retain(|(g, _, _), _| *g != self.consumer_group);
        let mut done = vec![format!(
            "{} stored offset(s) of consumer group {}",
            before - state.offsets.len(),
            self.consumer_group
        )];
        for t in drop {
            if state.tables.remove(&t.to_string()).is_some() {
                done.push(format!("destination table {t}"));
            }
        }
        Ok(done)
    }

    fn destinations(&self) -> impl Fn(&TableId) -> String + Send + Sync + 'static {
        |t: &TableId| t.to_string()
    }
}
