//! An in-memory SQL Server with change data capture, for the tests that
//! need no server: it answers [`CdcClient`] from tables and change tables
//! kept the way SQL Server documents them.
//!
//! * A capture instance captures the columns its table had when it was
//!   enabled (`sys.sp_cdc_enable_table`:
//!   <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sys-sp-cdc-enable-table-transact-sql>);
//!   a column added later is not in it, a column dropped later reads NULL;
//!   a table has at most two capture instances.
//! * Each committed transaction has one commit LSN (`__$start_lsn`); each
//!   change in it a `__$seqval`, increasing, below the commit LSN. An update
//!   is an `__$operation` 3 (before) and 4 (after) row pair sharing the
//!   seqval; an update of the unique index the instance identifies rows by
//!   is a delete (1) and an insert (2) sharing one seqval (Debezium's
//!   documentation of `event_serial_no`:
//!   <https://debezium.io/documentation/reference/stable/connectors/sqlserver.html>).
//! * The capture job harvests every commit at once, so
//!   `sys.fn_cdc_get_max_lsn()` is the last commit's LSN (a real server lags
//!   by its polling interval: see `docs/sources/sqlserver.md`).
//! * The cleanup job deletes the change rows below a low-water mark and
//!   moves the instance's `start_lsn`, which `sys.fn_cdc_get_min_lsn`
//!   returns; asking for changes below it fails as the server does (error
//!   313) (<https://learn.microsoft.com/sql/relational-databases/track-changes/administer-and-monitor-change-data-capture-sql-server>).
//! * Dropping a table drops its capture instances.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tributary_schemas::{Row, TableId, Value};

use super::client::{operation, CaptureInstance, CdcClient, ChangeRow, Connector, DatabaseFacts, TableFacts};
use super::lsn::Lsn;
use super::types::ColumnDef;
use crate::error::{Error, Result};

/// A value of a key, ordered the way the server orders the key's column.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum SortKey {
    Null,
    Int(i64),
    Text(String),
    Other(String),
}

fn sort_key(v: &Value) -> SortKey {
    match v {
        Value::Null => SortKey::Null,
        Value::Int16(i) => SortKey::Int(i64::from(*i)),
        Value::Int32(i) => SortKey::Int(i64::from(*i)),
        Value::Int64(i) => SortKey::Int(*i),
        Value::Text(s) => SortKey::Text(s.clone()),
        other => SortKey::Other(format!("{other:?}")),
    }
}

#[derive(Debug, Clone)]
struct Table {
    columns: Vec<ColumnDef>,
    key: Vec<String>,
    rows: BTreeMap<Vec<SortKey>, Row>,
}

impl Table {
    fn key_of(&self, row: &Row) -> Vec<SortKey> {
        self.key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .map(|i| sort_key(row.get(i).unwrap_or(&Value::Null)))
            .collect()
    }
}

#[derive(Debug, Clone)]
struct Instance {
    ci: CaptureInstance,
    min_lsn: Lsn,
    changes: Vec<ChangeRow>,
}

/// What `check` reads besides tables and instances (the `tables` of the
/// facts are the fake's own); tests change it.
#[derive(Debug, Clone)]
pub struct FakeSettings {
    /// The database's facts as `check` reads them.
    pub facts: DatabaseFacts,
    /// Tables the login may not SELECT.
    pub no_select: Vec<TableId>,
    /// How many of the next change and snapshot reads fail (a dropped
    /// connection: retryable).
    pub failing_reads: u32,
}

impl Default for FakeSettings {
    fn default() -> Self {
        Self {
            facts: DatabaseFacts {
                database: "fake".into(),
                user: "tributary".into(),
                cdc_enabled: true,
                snapshot_isolation: true,
                agent_running: Some(true),
                capture_job: Some(true),
                cleanup_job: Some(true),
                select_on_cdc: true,
                view_database_state: true,
                tables: Vec::new(),
            },
            no_select: Vec::new(),
            failing_reads: 0,
        }
    }
}

/// Fails the read when `failing_reads` says so.
fn injected_failure(settings: &mut FakeSettings) -> Result<()> {
    if settings.failing_reads > 0 {
        settings.failing_reads -= 1;
        return Err(Error::retryable("connection reset by peer (injected)").with_class("sqlserver.io"));
    }
    Ok(())
}

#[derive(Debug)]
struct State {
    settings: FakeSettings,
    tables: BTreeMap<TableId, Table>,
    instances: Vec<Instance>,
    /// The last LSN handed out.
    last: Lsn,
    /// The last commit's LSN (`sys.fn_cdc_get_max_lsn()`).
    max: Lsn,
}

/// One change of a transaction.
#[derive(Debug, Clone)]
pub enum FakeOp {
    /// Insert the row.
    Insert(TableId, Row),
    /// Replace the row with the key of the first row by the second.
    Update(TableId, Row, Row),
    /// Delete the row with the key of the row.
    Delete(TableId, Row),
}

/// The in-memory server: clones share it.
#[derive(Debug, Clone)]
pub struct FakeServer(Arc<Mutex<State>>);

impl FakeServer {
    /// An empty database with CDC enabled; LSNs start after `first`.
    pub fn new(first: Lsn) -> Self {
        FakeServer(Arc::new(Mutex::new(State {
            settings: FakeSettings::default(),
            tables: BTreeMap::new(),
            instances: Vec::new(),
            last: first,
            max: Lsn::ZERO,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes what `check` reads.
    pub fn settings(&self, f: impl FnOnce(&mut FakeSettings)) {
        f(&mut self.lock().settings)
    }

    /// The next LSN: the slot moves on, then the block, then the VLF, so
    /// that tests cross every boundary of the packing.
    fn next_lsn(state: &mut State) -> Lsn {
        let l = state.last;
        let next = if l.slot() < 3 {
            Lsn::new(l.vlf(), l.block(), l.slot() + 1)
        } else if l.block() < u32::MAX - 1 {
            Lsn::new(l.vlf(), l.block() + 1, 0)
        } else {
            Lsn::new(l.vlf() + 1, 0, 0)
        };
        state.last = next;
        next
    }

    /// `CREATE TABLE`.
    pub fn create_table(&self, id: &TableId, columns: Vec<ColumnDef>, key: &[&str]) {
        let t = Table {
            columns,
            key: key.iter().map(|k| k.to_string()).collect(),
            rows: BTreeMap::new(),
        };
        self.lock().tables.insert(id.clone(), t);
    }

    /// `sys.sp_cdc_enable_table` with `@capture_instance = name`: captures
    /// the table's columns as they are now, from the next LSN.
    pub fn enable_table(&self, id: &TableId, name: &str) -> Result<()> {
        let mut s = self.lock();
        let t = s
            .tables
            .get(id)
            .ok_or_else(|| Error::permanent(format!("no table {id}")))?
            .clone();
        if s.instances.iter().filter(|i| i.ci.table == *id).count() >= 2 {
            // Error 22962: a table has at most two capture instances.
            return Err(Error::permanent(format!("{id} already has two capture instances")));
        }
        let start = Self::next_lsn(&mut s);
        s.instances.push(Instance {
            ci: CaptureInstance {
                name: name.into(),
                table: id.clone(),
                start_lsn: start,
                columns: t.columns.clone(),
                key: t.key.clone(),
            },
            min_lsn: start,
            changes: Vec::new(),
        });
        Ok(())
    }

    /// `sys.sp_cdc_disable_table` for one capture instance.
    pub fn disable_instance(&self, name: &str) {
        self.lock().instances.retain(|i| i.ci.name != name);
    }

    /// `ALTER TABLE ... ADD column`; existing rows get `default`.
    pub fn add_column(&self, id: &TableId, column: ColumnDef, default: Value) {
        if let Some(t) = self.lock().tables.get_mut(id) {
            t.columns.push(column);
            for row in t.rows.values_mut() {
                row.push(default.clone());
            }
        }
    }

    /// `DROP TABLE`: its capture instances go with it. The DDL is a
    /// transaction of its own, which the capture job harvests (it records
    /// DDL of captured tables in `cdc.ddl_history`): the max LSN moves.
    pub fn drop_table(&self, id: &TableId) {
        let mut s = self.lock();
        s.tables.remove(id);
        s.instances.retain(|i| i.ci.table != *id);
        s.max = Self::next_lsn(&mut s);
    }

    /// The cleanup job with low-water mark `low`: change rows committed
    /// below it are deleted and every instance's minimum LSN moves to it.
    pub fn cleanup(&self, low: Lsn) {
        for i in &mut self.lock().instances {
            i.changes.retain(|c| c.start_lsn >= low);
            i.min_lsn = i.min_lsn.max(low);
        }
    }

    /// The current rows of a table, in key order.
    pub fn rows(&self, id: &TableId) -> Vec<Row> {
        self.lock()
            .tables
            .get(id)
            .map(|t| t.rows.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The tables that have a capture instance.
    pub fn captured_tables(&self) -> Vec<TableId> {
        let mut out: Vec<TableId> = self.lock().instances.iter().map(|i| i.ci.table.clone()).collect();
        out.dedup();
        out
    }

    /// The last commit's LSN (what `sys.fn_cdc_get_max_lsn()` returns).
    pub fn max_lsn(&self) -> Lsn {
        self.lock().max
    }

    /// Commits `ops` as one transaction; returns its commit LSN.
    pub fn commit(&self, ops: Vec<FakeOp>) -> Result<Lsn> {
        let mut s = self.lock();
        // Changes as (table, seqval, operation, full row).
        let mut logged: Vec<(TableId, Lsn, u8, Row)> = Vec::new();
        for op in ops {
            let seq = Self::next_lsn(&mut s);
            let (id, entries) = {
                let (id, before, after) = match op {
                    FakeOp::Insert(id, row) => (id, None, Some(row)),
                    FakeOp::Update(id, old, new) => (id, Some(old), Some(new)),
                    FakeOp::Delete(id, old) => (id, Some(old), None),
                };
                let t = s
                    .tables
                    .get_mut(&id)
                    .ok_or_else(|| Error::permanent(format!("no table {id}")))?;
                let old = match &before {
                    Some(b) => Some(
                        t.rows
                            .remove(&t.key_of(b))
                            .ok_or_else(|| Error::permanent(format!("no such row in {id}")))?,
                    ),
                    None => None,
                };
                if let Some(a) = &after {
                    if t.rows.insert(t.key_of(a), a.clone()).is_some() && old.is_none() {
                        return Err(Error::permanent(format!("duplicate key in {id}")));
                    }
                }
                let entries = match (old, after) {
                    (None, Some(a)) => vec![(operation::INSERT, a)],
                    (Some(b), None) => vec![(operation::DELETE, b)],
                    (Some(b), Some(a)) if t.key_of(&b) != t.key_of(&a) => {
                        vec![(operation::DELETE, b), (operation::INSERT, a)]
                    }
                    (Some(b), Some(a)) => vec![(operation::UPDATE_BEFORE, b), (operation::UPDATE_AFTER, a)],
                    (None, None) => Vec::new(),
                };
                (id, entries)
            };
            logged.extend(entries.into_iter().map(|(op, row)| (id.clone(), seq, op, row)));
        }
        let commit = Self::next_lsn(&mut s);
        s.max = commit;
        let ts_ms = crate::now_ms();
        let State { tables, instances, .. } = &mut *s;
        for (id, seq, op, row) in logged {
            let Some(t) = tables.get(&id) else { continue };
            for inst in instances.iter_mut().filter(|i| i.ci.table == id && i.ci.start_lsn <= commit) {
                // The instance's columns, by name: NULL for one dropped since.
                let projected = inst
                    .ci
                    .columns
                    .iter()
                    .map(|c| {
                        t.columns
                            .iter()
                            .position(|tc| tc.name == c.name)
                            .map_or(Value::Null, |i| row[i].clone())
                    })
                    .collect();
                inst.changes.push(ChangeRow {
                    start_lsn: commit,
                    seqval: seq,
                    operation: op,
                    ts_ms,
                    row: projected,
                });
            }
        }
        Ok(commit)
    }
}

#[async_trait]
impl Connector for FakeServer {
    async fn connect(&self) -> Result<Box<dyn CdcClient>> {
        Ok(Box::new(FakeClient { server: self.clone(), snapshot: None }))
    }
}

/// A session with the fake server.
#[derive(Debug)]
pub struct FakeClient {
    server: FakeServer,
    /// The snapshot transaction's view: the tables as of its start.
    snapshot: Option<BTreeMap<TableId, Table>>,
}

#[async_trait]
impl CdcClient for FakeClient {
    async fn facts(&mut self) -> Result<DatabaseFacts> {
        let s = self.server.lock();
        let st = &s.settings;
        Ok(DatabaseFacts {
            tables: s
                .tables
                .iter()
                .map(|(id, t)| TableFacts {
                    table: id.clone(),
                    columns: t.columns.iter().map(|c| c.name.clone()).collect(),
                    has_primary_key: !t.key.is_empty(),
                    select: !st.no_select.contains(id),
                })
                .collect(),
            ..st.facts.clone()
        })
    }

    async fn tables(&mut self) -> Result<Vec<TableId>> {
        Ok(self.server.lock().tables.keys().cloned().collect())
    }

    async fn capture_instances(&mut self) -> Result<Vec<CaptureInstance>> {
        let s = self.server.lock();
        if !s.settings.facts.cdc_enabled {
            // cdc.change_tables does not exist before sp_cdc_enable_db.
            return Err(Error::needs_operator("Invalid object name 'cdc.change_tables'").with_class("sqlserver.208"));
        }
        Ok(s.instances
            .iter()
            .map(|i| CaptureInstance { start_lsn: i.min_lsn, ..i.ci.clone() })
            .collect())
    }

    async fn max_lsn(&mut self) -> Result<Lsn> {
        Ok(self.server.lock().max)
    }

    async fn min_lsn(&mut self, instance: &str) -> Result<Lsn> {
        Ok(self
            .server
            .lock()
            .instances
            .iter()
            .find(|i| i.ci.name == instance)
            .map_or(Lsn::ZERO, |i| i.min_lsn))
    }

    async fn changes(&mut self, instance: &CaptureInstance, from: Lsn, to: Lsn) -> Result<Vec<ChangeRow>> {
        let mut s = self.server.lock();
        injected_failure(&mut s.settings)?;
        let inst = s.instances.iter().find(|i| i.ci.name == instance.name).ok_or_else(|| {
            Error::needs_operator(format!("Invalid object name 'cdc.fn_cdc_get_all_changes_{}'", instance.name))
                .with_class("sqlserver.208")
        })?;
        if from < inst.min_lsn || to < from {
            return Err(Error::needs_operator(format!(
                "An insufficient number of arguments were supplied for the procedure or function \
                 cdc.fn_cdc_get_all_changes_{}",
                instance.name
            ))
            .with_class("sqlserver.313"));
        }
        let mut rows: Vec<ChangeRow> = inst
            .changes
            .iter()
            .filter(|c| c.start_lsn >= from && c.start_lsn <= to)
            .map(|c| {
                let row = instance
                    .columns
                    .iter()
                    .map(|want| {
                        inst.ci
                            .columns
                            .iter()
                            .position(|c| c.name == want.name)
                            .map_or(Value::Null, |i| c.row[i].clone())
                    })
                    .collect();
                ChangeRow { row, ..c.clone() }
            })
            .collect();
        rows.sort_by_key(ChangeRow::order_key);
        Ok(rows)
    }

    async fn begin_snapshot(&mut self) -> Result<Lsn> {
        let s = self.server.lock();
        if !s.settings.facts.snapshot_isolation {
            return Err(Error::needs_operator(
                "Snapshot isolation transaction failed accessing database 'fake' because snapshot isolation is not allowed",
            )
            .with_class("sqlserver.3952"));
        }
        self.snapshot = Some(s.tables.clone());
        Ok(s.max)
    }

    async fn snapshot_rows(
        &mut self,
        instance: &CaptureInstance,
        after: Option<&[Value]>,
        limit: usize,
    ) -> Result<Vec<Row>> {
        injected_failure(&mut self.server.lock().settings)?;
        let tables = self
            .snapshot
            .as_ref()
            .ok_or_else(|| Error::retryable("no snapshot transaction"))?;
        let Some(t) = tables.get(&instance.table) else {
            return Ok(Vec::new());
        };
        let after: Option<Vec<SortKey>> = after.map(|a| a.iter().map(sort_key).collect());
        Ok(t.rows
            .iter()
            .filter(|(k, _)| {
                after
                    .as_ref()
                    .is_none_or(|a| k.as_slice().cmp(a.as_slice()) == Ordering::Greater)
            })
            .take(limit)
            .map(|(_, row)| {
                instance
                    .columns
                    .iter()
                    .map(|c| {
                        t.columns
                            .iter()
                            .position(|tc| tc.name == c.name)
                            .map_or(Value::Null, |i| row[i].clone())
                    })
                    .collect()
            })
            .collect())
    }

    async fn end_snapshot(&mut self) -> Result<()> {
        self.snapshot = None;
        Ok(())
    }
}
