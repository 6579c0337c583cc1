//! Oracle: a source reading a flashback snapshot `AS OF SCN`, then the redo
//! through LogMiner (`DBMS_LOGMNR` with `DICT_FROM_ONLINE_CATALOG`).
//!
//! [`OracleSource`] talks to the database only through
//! [`client::LogMinerClient`]: [`client::OracleClient`] over the `oracle`
//! crate in production, `fake::FakeOracle` (which follows the documented
//! semantics of `V$LOGMNR_CONTENTS`) in the tests. Each poll mines one
//! window of SCNs ([`logs`]) whose rows go through the transaction buffer
//! ([`txbuffer`], [`stream`]); committed transactions are parsed
//! ([`redo_sql`], [`lob`]) into change events. See
//! `docs/sources/oracle.md` for the operator's view and what was verified.
//!
//! # Checkpoint
//!
//! An [`OracleState`] as JSON: `restart_scn`, where mining starts after a
//! restart (the start SCN of the oldest transaction open at the
//! checkpoint, so none of its rows is missed), and `committed`, the
//! [`stream::CommitPos`] of the last transaction emitted (every commit at
//! or below it is skipped when mined again); the captured tables'
//! definitions; the snapshot's progress while unfinished. Nothing is held
//! on the server: acknowledging releases nothing (redo retention is the
//! operator's, `docs/sources/oracle.md`).

pub mod check;
pub mod client;
pub mod config;
pub mod ddl;
// The tests' LogMiner: never in the runners' builds (`test-utils`).
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
pub mod lob;
pub mod logs;
pub mod redo_sql;
pub mod snapshot;
pub mod stream;
pub mod txbuffer;
pub mod types;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tributary_schemas::{
    ChangeEvent, Column, Op, Position, Row, SnapshotMarker, SourceInfo, TableId, TableSchema, TransactionInfo, Value,
};

use self::client::{LogMinerClient, OracleClient, TableDef};
pub use self::config::OracleSourceConfig;
use self::config::{SnapshotMode, TableFilter};
use self::ddl::Ddl;
use self::lob::{LobOp, LobValue};
use self::redo_sql::{Literal, Redo};
use self::snapshot::{SnapshotState, TablePlan};
use self::stream::CommitPos;
use self::txbuffer::{Committed, TxBuffer, TxEvent};
use crate::error::{Error, Result};
use crate::source::SnapshotTableProgress;
use crate::{Checkpoint, Source, SourceBatch, SourceMessage};

/// The connector's name in every event (Debezium's `source.connector`).
pub const CONNECTOR: &str = "oracle";
/// Version of the checkpoint JSON.
pub const CHECKPOINT_VERSION: u32 = 1;

/// A captured table's definition, as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredTable {
    /// Owner.
    pub schema: String,
    /// Table.
    pub table: String,
    /// Definition.
    pub def: TableDef,
}

/// The source's resumable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleState {
    /// Format version.
    pub version: u32,
    /// `V$DATABASE.DBID`: SCNs of another database do not compare.
    pub dbid: u64,
    /// Mining starts here after a restart (inclusive).
    pub restart_scn: u64,
    /// The last transaction emitted.
    pub committed: CommitPos,
    /// Captured tables.
    pub tables: Vec<StoredTable>,
    /// Snapshot work not done yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotState>,
    /// Tables copied again while streaming ([`Source::resync`], a table
    /// renamed into the capture): the stream leaves out their changes
    /// committed at or below the copy's SCN (its rows hold them) until it
    /// has passed that SCN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recopied: Vec<Recopied>,
}

/// A table copied again at `scn` while streaming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recopied {
    /// Owner.
    pub schema: String,
    /// Table.
    pub table: String,
    /// The copy's flashback SCN.
    pub scn: u64,
}

impl OracleState {
    /// Parses a checkpoint written by this source.
    pub fn from_checkpoint(c: &Checkpoint) -> Result<Self> {
        c.decode("Oracle", |s: &OracleState| s.version, CHECKPOINT_VERSION)
    }

    fn def(&self, id: &TableId) -> Option<&TableDef> {
        self.tables
            .iter()
            .find(|t| t.schema == id.schema && t.table == id.table)
            .map(|t| &t.def)
    }

    /// Whether the copy of `id` made at a later SCN holds a change of it
    /// committed at `commit_scn`.
    fn covered(&self, id: &TableId, commit_scn: u64) -> bool {
        self.recopied
            .iter()
            .any(|r| r.schema == id.schema && r.table == id.table && commit_scn <= r.scn)
    }

    fn set_def(&mut self, id: &TableId, def: Option<TableDef>) {
        self.tables.retain(|t| !(t.schema == id.schema && t.table == id.table));
        if let Some(def) = def {
            self.tables.push(StoredTable {
                schema: id.schema.clone(),
                table: id.table.clone(),
                def,
            });
        }
    }
}

/// The model columns of a definition (excluded columns already left out).
pub fn columns_of(table: &TableId, def: &TableDef) -> Result<Vec<Column>> {
    def.columns
        .iter()
        .map(|c| {
            let data_type = types::map_type(table, &c.name, &c.type_text, c.precision, c.scale)?;
            let mut col = Column::new(c.name.clone(), data_type, c.nullable);
            col.source_type = c.type_text.clone();
            col.aliases = c.aliases.clone();
            Ok(col)
        })
        .collect()
}

/// The captured shape of a table: excluded columns left out, the key the
/// primary key (all columns without one).
fn build_schema(filter: &TableFilter, table: &TableId, def: &TableDef) -> Result<(Arc<TableSchema>, TableDef, bool)> {
    let kept = TableDef {
        columns: def
            .columns
            .iter()
            .filter(|c| !filter.excludes_column(table, &c.name))
            .cloned()
            .collect(),
        primary_key: def.primary_key.clone(),
    };
    let columns = columns_of(table, &kept)?;
    for k in &kept.primary_key {
        if !columns.iter().any(|c| &c.name == k) {
            return Err(Error::needs_operator(format!("key column {k} is excluded by oracle.exclude_columns"))
                .with_table(table.clone())
                .with_column(k.clone()));
        }
    }
    let keyed = !kept.primary_key.is_empty();
    let key = if keyed {
        kept.primary_key.clone()
    } else {
        columns.iter().map(|c| c.name.clone()).collect()
    };
    Ok((
        Arc::new(TableSchema {
            id: table.clone(),
            columns,
            key,
            dropped: Vec::new(),
        }),
        kept,
        keyed,
    ))
}

/// A LOB being written by the rows after its `SEL_LOB_LOCATOR`.
struct OpenLob {
    at: PieceTarget,
    value: LobValue,
}

/// The column of a row that LOB or XML rows write.
struct PieceTarget {
    /// The row's ROWID.
    row_id: String,
    table: TableId,
    column: String,
    /// The row's columns in the locator's (or XML DOC BEGIN's) where clause.
    key: Vec<(String, Literal)>,
}

/// An XMLTYPE document being written by the rows after its `XML DOC BEGIN`.
struct OpenXml {
    at: PieceTarget,
    /// Binary storage (see [`lob::XmlBegin`]).
    binary: bool,
    /// The bytes so far; `None` after `XML_REDO := NULL`.
    document: Option<Vec<u8>>,
}

/// The Oracle source.
pub struct OracleSource {
    config: OracleSourceConfig,
    filter: TableFilter,
    owners: Vec<String>,
    name: Arc<str>,
    /// A client given at construction (the fake); else one is connected at start.
    given: Option<Arc<dyn LogMinerClient>>,
    client: Option<Arc<dyn LogMinerClient>>,
    db: Arc<str>,
    state: Option<OracleState>,
    buffer: TxBuffer,
    /// The last SCN mined (exclusive start of the next window).
    mined_to: u64,
    announced: BTreeMap<TableId, Arc<TableSchema>>,
    progress: BTreeMap<TableId, SnapshotTableProgress>,
    /// Committed transactions of the last window not emitted yet, with
    /// their rank among the commits of their SCN.
    pending: std::collections::VecDeque<(u64, Committed)>,
    /// A window failed half-way: the buffer and window start are rebuilt
    /// from the last checkpoint returned.
    dirty: bool,
}

impl std::fmt::Debug for OracleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OracleSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OracleSource {
    /// A source for `config`; with `client`, that client instead of a
    /// connection of its own (the fake). Nothing connects before start.
    pub fn new(config: OracleSourceConfig, runner_name: &str, client: Option<Arc<dyn LogMinerClient>>) -> Result<Self> {
        config.validate_as("oracle").map_err(|e| Error::needs_operator(e.to_string()))?;
        let buffer = TxBuffer::new(config.buffer_memory_bytes as usize, config.spill_dir.clone());
        Ok(Self {
            filter: config.filter(),
            owners: config.owners(),
            name: Arc::from(runner_name),
            given: client,
            client: None,
            db: Arc::from(""),
            state: None,
            buffer,
            mined_to: 0,
            announced: BTreeMap::new(),
            progress: BTreeMap::new(),
            pending: std::collections::VecDeque::new(),
            dirty: false,
            config,
        })
    }

    fn client(&self) -> Result<Arc<dyn LogMinerClient>> {
        self.client.clone().ok_or_else(|| Error::retryable("the source is not started"))
    }

    fn state(&mut self) -> Result<&mut OracleState> {
        self.state.as_mut().ok_or_else(|| Error::retryable("the source is not started"))
    }

    fn announce(&mut self, schema: &Arc<TableSchema>, out: &mut Vec<SourceMessage>) {
        if self.announced.get(&schema.id).is_none_or(|a| **a != **schema) {
            self.announced.insert(schema.id.clone(), schema.clone());
            out.push(SourceMessage::SchemaChanged(schema.clone()));
        }
    }

    fn info(&self, position: Position, ts_ms: i64, snapshot: SnapshotMarker, xid: Option<&str>) -> SourceInfo {
        SourceInfo {
            connector: Arc::from(CONNECTOR),
            name: self.name.clone(),
            db: self.db.clone(),
            ts_ms,
            snapshot,
            tx_id: xid.map(str::to_string),
            position,
            native_position: Arc::from(format!("scn:{}", position.commit)),
        }
    }

    async fn snapshot_batch(&mut self) -> Result<SourceBatch> {
        let client = self.client()?;
        let chunk_rows = self.config.snapshot_chunk_rows as usize;
        let state = self.state()?.clone();
        let Some(mut snap) = state.snapshot.clone() else {
            return Err(Error::retryable("no snapshot to run"));
        };
        let mut messages = Vec::new();
        let Some(i) = snap.tables.iter().position(|t| !t.done) else {
            let state = self.state()?;
            state.snapshot = None;
            return Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(state) });
        };
        let id = snap.tables[i].id();
        let def = state
            .def(&id)
            .cloned()
            .ok_or_else(|| Error::permanent(format!("no definition of {id}")))?;
        let (schema, kept, keyed) = build_schema(&self.filter, &id, &def)?;
        self.announce(&schema, &mut messages);
        let scn = snap.tables[i].scn.unwrap_or(snap.scn);
        let rows = client
            .snapshot_chunk(&id, &kept, scn, snap.tables[i].after.as_ref(), chunk_rows)
            .await?;
        let position = Position { commit: scn, index: 0 };
        let ts_ms = crate::now_ms();
        for r in &rows {
            let after = snapshot::decode_row(&schema, r)?;
            messages.push(SourceMessage::Change(ChangeEvent {
                schema: schema.clone(),
                op: Op::Read,
                before: None,
                after: Some(after),
                source: self.info(position, ts_ms, SnapshotMarker::True, None),
                ts_ms,
                transaction: None,
            }));
        }
        let progress = self.progress.entry(id.clone()).or_insert_with(|| SnapshotTableProgress {
            table: id.clone(),
            rows: 0,
            estimated_rows: None,
            done: false,
        });
        progress.rows += rows.len() as u64;
        if rows.len() < chunk_rows {
            snap.tables[i].done = true;
            progress.done = true;
        }
        if let Some(after) = snapshot::next_after(&schema, keyed, &rows) {
            snap.tables[i].after = Some(after);
        }
        let finished = snap.tables.iter().all(|t| t.done);
        if finished {
            if let Some(SourceMessage::Change(ev)) =
                messages.iter_mut().rev().find(|m| matches!(m, SourceMessage::Change(_)))
            {
                ev.source.snapshot = SnapshotMarker::Last;
            }
            tracing::info!(scn = snap.scn, "snapshot finished");
        }
        let state = self.state()?;
        state.snapshot = (!finished).then_some(snap);
        Ok(SourceBatch { messages, checkpoint: Checkpoint::encode(state) })
    }

    /// Emits the next committed transactions, mining the next window when
    /// none is pending.
    async fn stream_batch(&mut self) -> Result<SourceBatch> {
        let client = self.client()?;
        if self.dirty {
            // A batch failed half-way: start again from the last checkpoint
            // returned (its restart SCN covers every transaction not emitted).
            let restart = self.state()?.restart_scn;
            self.buffer = TxBuffer::new(self.config.buffer_memory_bytes as usize, self.config.spill_dir.clone());
            self.pending.clear();
            self.mined_to = restart.saturating_sub(1);
        }
        self.dirty = true;
        if self.pending.is_empty() {
            let current = client.current_scn().await?;
            let logs = client.logs().await?;
            let plan = logs::plan(&logs, self.mined_to + 1, current)?;
            let threads = client.threads().await?;
            let ceiling = plan.ceiling.min(logs::thread_ceiling(&threads, current));
            let Some((lo, hi)) = logs::window(self.mined_to, current, ceiling, self.config.max_window_scns) else {
                // Caught up: wait one poll interval (LogMiner has no push)
                // and return a heartbeat.
                self.dirty = false;
                tokio::time::sleep(Duration::from_millis(self.config.poll_interval_ms)).await;
                let state = self.state()?;
                return Ok(SourceBatch {
                    messages: Vec::new(),
                    checkpoint: Checkpoint::encode(state),
                });
            };
            let rows = client.mine(&plan.files, lo, hi, &self.owners).await?;
            // Off the async path: a buffer over its memory budget writes
            // (and a commit reads back) its spill files. Should the task
            // not finish, `dirty` rebuilds the buffer at the next batch.
            let filter = self.filter.clone();
            let mut buffer = std::mem::replace(&mut self.buffer, TxBuffer::new(0, None));
            let (buffer, committed) = tokio::task::spawn_blocking(move || {
                let committed =
                    stream::feed(&mut buffer, rows, |owner, table| filter.captures(&TableId::new(owner, table)));
                (buffer, committed)
            })
            .await
            .map_err(|e| Error::retryable(format!("the transaction buffer's work did not finish: {e}")))?;
            self.buffer = buffer;
            let committed = committed?;
            // Ranks among the commits of one SCN, over all of them (also
            // those emitted before a restart): mined again, they get the
            // same positions.
            let mut rank = 0u64;
            let mut last_scn = None;
            let done = self.state()?.committed.clone();
            for txn in committed {
                rank = if last_scn == Some(txn.commit_scn) { rank + 1 } else { 0 };
                last_scn = Some(txn.commit_scn);
                if CommitPos::of(&txn) > done {
                    self.pending.push_back((rank, txn));
                }
            }
            self.mined_to = hi;
        }
        let mut messages = Vec::new();
        let mut state = self.state()?.clone();
        // Whole transactions, until the batch holds max_batch_events.
        while messages.len() < self.config.max_batch_events {
            let Some((rank, txn)) = self.pending.pop_front() else {
                break;
            };
            let pos = CommitPos::of(&txn);
            self.emit(&client, &mut state, txn, rank, &mut messages).await?;
            state.committed = pos;
            if state.snapshot.is_some() {
                // A table renamed into the capture is copied now: its copy
                // comes before any later change.
                break;
            }
        }
        // Past a copy's SCN, the commits it holds are behind `committed`.
        let reached = state.committed.scn;
        state.recopied.retain(|r| r.scn >= reached);
        let pending_start = self.pending.iter().map(|(_, t)| t.start_scn).min();
        let restart = stream::restart_scn(&self.buffer, self.mined_to);
        state.restart_scn = pending_start.map_or(restart, |p| p.min(restart));
        self.dirty = false;
        let checkpoint = Checkpoint::encode(&state);
        self.state = Some(state);
        Ok(SourceBatch { messages, checkpoint })
    }

    /// Plans a new copy of `id` at the current SCN, its definition read
    /// from the catalog just before: chunked and resumable like the
    /// initial snapshot (in the checkpoint), and the table's changes
    /// committed at or below that SCN left out of the stream (the copy's
    /// rows hold them). Whether the table exists.
    async fn plan_copy(
        &mut self,
        client: &Arc<dyn LogMinerClient>,
        state: &mut OracleState,
        id: &TableId,
        old: Option<&TableDef>,
    ) -> Result<bool> {
        let Some(def) = client.table_def(id).await? else {
            return Ok(false);
        };
        let scn = client.current_scn().await?;
        // A DDL between the two reads would have the flashback read at
        // `scn` name columns the table did not have then (ORA-01466).
        if client.table_def(id).await?.as_ref() != Some(&def) {
            return Err(Error::retryable(format!("the definition of {id} changed while its copy was planned"))
                .with_table(id.clone()));
        }
        state.set_def(id, Some(carry_aliases(old, def, &[])));
        let snap = state.snapshot.get_or_insert_with(|| SnapshotState { scn, tables: Vec::new() });
        snap.tables.retain(|t| t.id() != *id);
        snap.tables.push(TablePlan { scn: Some(scn), ..TablePlan::new(id) });
        state.recopied.retain(|r| !(r.schema == id.schema && r.table == id.table));
        state.recopied.push(Recopied {
            schema: id.schema.clone(),
            table: id.table.clone(),
            scn,
        });
        self.progress.remove(id);
        self.announced.remove(id);
        tracing::info!(table = %id, scn, "copying the table again");
        Ok(true)
    }

    /// The schema of a table changed by a DDL (or first seen): re-read from
    /// the catalog; a table gone is dropped.
    async fn refresh(
        &mut self,
        client: &Arc<dyn LogMinerClient>,
        state: &mut OracleState,
        id: &TableId,
        renames: &[(String, String)],
        out: &mut Vec<SourceMessage>,
    ) -> Result<()> {
        let def = client.table_def(id).await?;
        match def {
            None => {
                if state.def(id).is_some() {
                    state.set_def(id, None);
                    self.announced.remove(id);
                    out.push(SourceMessage::TableDropped(id.clone()));
                }
            }
            Some(def) => {
                let def = carry_aliases(state.def(id), def, renames);
                let (schema, _, _) = build_schema(&self.filter, id, &def)?;
                state.set_def(id, Some(def));
                self.announce(&schema, out);
            }
        }
        Ok(())
    }

    /// The DDL statements of `rest` (the rest of the transaction being
    /// emitted, from the current row on) and of the transactions mined and
    /// not emitted yet, in order: the online catalog renders every row
    /// with today's names, so a row written before a rename and mined
    /// after it already names the new ones.
    fn ddl_ahead<'a>(&'a self, rest: &'a [TxEvent]) -> impl Iterator<Item = Ddl> + 'a {
        rest.iter()
            .chain(self.pending.iter().flat_map(|(_, t)| t.events.iter()))
            .filter(|e| e.op == 5)
            .map(|e| ddl::parse(&e.sql, &e.owner))
    }

    /// The column renames of `table` ahead (see [`OracleSource::ddl_ahead`]).
    fn renames_ahead(&self, table: &TableId, rest: &[TxEvent]) -> Vec<(String, String)> {
        self.ddl_ahead(rest)
            .filter_map(|d| match d {
                Ddl::RenameColumn { table: t, from, to } if t == *table => Some((from, to)),
                _ => None,
            })
            .collect()
    }

    /// `from` renamed to `to` (see `docs/schema-changes.md`, as the MySQL
    /// source does): the old name is dropped downstream; the new one,
    /// when captured, is copied (its rows were written under the old
    /// name, no event carries them under the new one) at an SCN after the
    /// rename, then streamed.
    async fn rename_table(
        &mut self,
        client: &Arc<dyn LogMinerClient>,
        state: &mut OracleState,
        (from, to): (&TableId, &TableId),
        out: &mut Vec<SourceMessage>,
    ) -> Result<()> {
        let old = state.def(from).cloned();
        if old.is_some() {
            state.set_def(from, None);
            self.announced.remove(from);
            out.push(SourceMessage::TableDropped(from.clone()));
        }
        if !self.filter.captures(to) {
            return Ok(());
        }
        if self.config.snapshot_mode == SnapshotMode::Never {
            return self.refresh(client, state, to, &[], out).await;
        }
        if self.plan_copy(client, state, to, old.as_ref()).await? {
            tracing::info!(from = %from, to = %to, "renamed table to be copied under its new name");
        }
        Ok(())
    }

    async fn emit(
        &mut self,
        client: &Arc<dyn LogMinerClient>,
        state: &mut OracleState,
        txn: Committed,
        rank: u64,
        out: &mut Vec<SourceMessage>,
    ) -> Result<()> {
        let mut events: Vec<(String, ChangeEvent)> = Vec::new();
        // The LOB being written: (row id, table, column, value, key).
        let mut lob: Option<OpenLob> = None;
        let mut xml: Option<OpenXml> = None;
        // Tables read from the catalog again for a name their definition lacks.
        let mut refreshed: Vec<TableId> = Vec::new();
        for (k, e) in txn.events.iter().enumerate() {
            if !matches!(e.op, 10 | 11 | 28) {
                if let Some(done) = lob.take() {
                    self.finish_lob(state, &txn, rank, done, &mut events)?;
                }
            }
            if e.op != 70 {
                // XML DOC END (71), or a row after a document whose end
                // was not mined.
                if let Some(done) = xml.take() {
                    self.finish_xml(state, &txn, rank, done, &mut events)?;
                }
            }
            let id = TableId::new(&e.owner, &e.table);
            let ddl = if e.op == 5 {
                ddl::parse(&e.sql, &e.owner)
            } else {
                Ddl::Other
            };
            if e.op == 5 {
                // Events before the DDL keep their shape: flush them first.
                out.extend(events.drain(..).map(|(_, ev)| SourceMessage::Change(ev)));
            }
            if let Ddl::RenameTable { from, to } = &ddl {
                // The row's own table name is whichever the catalog has now.
                self.rename_table(client, state, (from, to), out).await?;
                continue;
            }
            let id = match ddl {
                Ddl::RenameColumn { table, .. } => table,
                _ => id,
            };
            if !self.filter.captures(&id) || state.covered(&id, txn.commit_scn) {
                continue;
            }
            match e.op {
                5 => {
                    let renames = self.renames_ahead(&id, &txn.events[k..]);
                    self.refresh(client, state, &id, &renames, out).await?;
                }
                1..=3 => {
                    if state.def(&id).is_none() {
                        let renamed_here = self
                            .ddl_ahead(&txn.events[k..])
                            .any(|d| matches!(&d, Ddl::RenameTable { to, .. } if *to == id));
                        if renamed_here {
                            // Written before a rename to this name, mined after
                            // it: in the copy the rename starts.
                            continue;
                        }
                        self.refresh(client, state, &id, &[], out).await?;
                    }
                    let redo = redo_sql::parse(&e.sql).map_err(|err| err.with_table(id.clone()))?;
                    if !refreshed.contains(&id) && state.def(&id).is_some_and(|d| names_unknown(d, &redo)) {
                        // Renamed columns ahead (the online catalog names them
                        // already), or a definition the catalog is ahead of.
                        // Once per table and transaction: a name the catalog
                        // does not list either would cost a read per row.
                        let renames = self.renames_ahead(&id, &txn.events[k..]);
                        self.refresh(client, state, &id, &renames, out).await?;
                        refreshed.push(id.clone());
                    }
                    let Some(def) = state.def(&id).cloned() else {
                        // The online catalog no longer knows the table (dropped
                        // later in the window): it is gone downstream too.
                        tracing::warn!(table = %id, scn = e.scn, "a change of a table the catalog no longer has");
                        continue;
                    };
                    let (schema, _, _) = build_schema(&self.filter, &id, &def)?;
                    self.announce(&schema, out);
                    let missing = missing_after(&schema, &redo);
                    let mut ev = self.change(&schema, redo, &txn, rank, events.len())?;
                    if !missing.is_empty() {
                        fill_from_flashback(client, &schema, &def, txn.commit_scn, &missing, &mut ev).await?;
                    }
                    events.push((e.row_id.clone(), ev));
                }
                9 => {
                    if let LobOp::Select { table, column, key } = lob::parse(9, &e.sql)? {
                        let current = events
                            .iter()
                            .rev()
                            .find(|(r, ev)| *r == e.row_id && ev.schema.id == table)
                            .and_then(|(_, ev)| {
                                let i = ev.schema.columns.iter().position(|c| c.name == column)?;
                                ev.after.as_ref()?.get(i).cloned()
                            });
                        let value = match current {
                            Some(Value::Bytes(b)) => LobValue::Bytes(b),
                            Some(Value::Text(t)) => LobValue::Text(t.chars().collect()),
                            _ => {
                                let bytes = state
                                    .def(&table)
                                    .and_then(|d| d.columns.iter().find(|c| c.name == column))
                                    .is_some_and(|c| c.type_text == "BLOB");
                                if bytes {
                                    LobValue::Bytes(Vec::new())
                                } else {
                                    LobValue::Text(Vec::new())
                                }
                            }
                        };
                        lob = Some(OpenLob {
                            at: PieceTarget { row_id: e.row_id.clone(), table, column, key },
                            value,
                        });
                    }
                }
                68 => {
                    let begin = lob::parse_xml_begin(&e.sql).map_err(|err| err.with_table(id.clone()))?;
                    let at = PieceTarget {
                        row_id: e.row_id.clone(),
                        table: begin.table,
                        column: begin.column,
                        key: begin.key,
                    };
                    xml = Some(OpenXml {
                        at,
                        binary: begin.binary,
                        document: Some(Vec::new()),
                    });
                }
                70 => {
                    if let Some(x) = xml.as_mut() {
                        match lob::parse_xml_write(&e.sql, x.binary).map_err(|err| err.with_table(id.clone()))? {
                            Some(piece) => x.document.get_or_insert_with(Vec::new).extend(piece),
                            None => x.document = None,
                        }
                    }
                }
                71 => {}
                _ => {
                    if let Some(OpenLob { value, .. }) = lob.as_mut() {
                        value.apply(&lob::parse(e.op, &e.sql)?)?;
                    }
                }
            }
        }
        if let Some(done) = lob.take() {
            self.finish_lob(state, &txn, rank, done, &mut events)?;
        }
        if let Some(done) = xml.take() {
            self.finish_xml(state, &txn, rank, done, &mut events)?;
        }
        // Debezium's block: the change's place in the transaction and
        // among the transaction's changes of its table, each from 1.
        let mut per_table: std::collections::BTreeMap<TableId, i64> = std::collections::BTreeMap::new();
        for (i, (_, mut ev)) in events.into_iter().enumerate() {
            let n = per_table.entry(ev.schema.id.clone()).or_insert(0);
            *n += 1;
            ev.transaction = Some(TransactionInfo {
                id: txn.xid.clone(),
                total_order: i as i64 + 1,
                data_collection_order: *n,
            });
            out.push(SourceMessage::Change(ev));
        }
        if let Some(end) = crate::TransactionEnd::of(txn.xid.clone(), txn.commit_ts_ms, &per_table) {
            out.push(SourceMessage::TransactionEnd(end));
        }
        Ok(())
    }

    /// Puts a reassembled LOB into the row's latest change of the
    /// transaction, or, when the transaction changed only the LOB, into an
    /// update of the row built from the locator's where clause.
    fn finish_lob(
        &mut self,
        state: &OracleState,
        txn: &Committed,
        rank: u64,
        OpenLob { at, value }: OpenLob,
        events: &mut Vec<(String, ChangeEvent)>,
    ) -> Result<()> {
        let v = match value {
            LobValue::Bytes(b) => Value::Bytes(b),
            LobValue::Text(t) => Value::Text(t.into_iter().collect()),
        };
        self.set_column(state, txn, rank, at, v, events)
    }

    /// Puts a reassembled XMLTYPE document into its row's change, as
    /// [`OracleSource::finish_lob`] does a LOB.
    fn finish_xml(
        &mut self,
        state: &OracleState,
        txn: &Committed,
        rank: u64,
        xml: OpenXml,
        events: &mut Vec<(String, ChangeEvent)>,
    ) -> Result<()> {
        let v = match xml.document {
            None => Value::Null,
            Some(bytes) => Value::Text(String::from_utf8(bytes).map_err(|_| {
                Error::permanent(format!(
                    "an XMLTYPE document of {}.{} is not UTF-8: the source reads binary XML in the AL32UTF8 \
                     database character set only",
                    xml.at.table, xml.at.column
                ))
                .with_table(xml.at.table.clone())
                .with_column(xml.at.column.clone())
                .with_class("tributary.oracle_xml")
            })?),
        };
        self.set_column(state, txn, rank, xml.at, v, events)
    }

    /// Sets `column` of the row `at` names to `v` in the row's latest
    /// change of the transaction, or, when the transaction changed only
    /// that column, in an update of the row built from the where clause.
    fn set_column(
        &mut self,
        state: &OracleState,
        txn: &Committed,
        rank: u64,
        PieceTarget { row_id, table, column, key }: PieceTarget,
        v: Value,
        events: &mut Vec<(String, ChangeEvent)>,
    ) -> Result<()> {
        if let Some((_, ev)) = events.iter_mut().rev().find(|(r, ev)| *r == row_id && ev.schema.id == table) {
            if let (Some(i), Some(after)) = (ev.schema.columns.iter().position(|c| c.name == column), ev.after.as_mut())
            {
                after[i] = v;
            }
            return Ok(());
        }
        let Some(def) = state.def(&table).cloned() else {
            return Ok(());
        };
        let (schema, _, _) = build_schema(&self.filter, &table, &def)?;
        let before = row_of(&schema, &key)?;
        let mut after = before.clone();
        if let Some(i) = schema.columns.iter().position(|c| c.name == column) {
            after[i] = v;
        }
        let ev = self.event(&schema, Op::Update, Some(before), Some(after), txn, rank, events.len());
        events.push((row_id, ev));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        schema: &Arc<TableSchema>,
        op: Op,
        before: Option<Row>,
        after: Option<Row>,
        txn: &Committed,
        rank: u64,
        index: usize,
    ) -> ChangeEvent {
        let position = Position {
            commit: txn.commit_scn,
            index: rank << 32 | index as u64,
        };
        ChangeEvent {
            schema: schema.clone(),
            op,
            before,
            after,
            source: self.info(position, txn.commit_ts_ms, SnapshotMarker::False, Some(&txn.xid)),
            ts_ms: crate::now_ms(),
            transaction: None,
        }
    }

    fn change(
        &self,
        schema: &Arc<TableSchema>,
        redo: Redo,
        txn: &Committed,
        rank: u64,
        index: usize,
    ) -> Result<ChangeEvent> {
        let (op, before, after) = match redo {
            Redo::Insert { values, .. } => (Op::Create, None, Some(row_of(schema, &values)?)),
            Redo::Update { set, before, .. } => {
                let b = row_of(schema, &before)?;
                let mut a = b.clone();
                for (name, lit) in &set {
                    if let Some(i) = schema.columns.iter().position(|c| &c.name == name) {
                        a[i] = types::decode(&schema.columns[i], lit, false).map_err(|e| e.or_table(&schema.id))?;
                    }
                }
                (Op::Update, Some(b), Some(a))
            }
            Redo::Delete { before, .. } => (Op::Delete, Some(row_of(schema, &before)?), None),
        };
        Ok(self.event(schema, op, before, after, txn, rank, index))
    }
}

/// The definition `new` (read from the catalog) with the earlier names of
/// its columns: those `old` knew by the same name, after `renames` (each
/// `(from, to)`, in order) are applied to `old`'s names. Aliases are oldest
/// first, without duplicates and never the column's own name (a rename
/// back drops it), as the MySQL source keeps them.
fn carry_aliases(old: Option<&TableDef>, mut new: TableDef, renames: &[(String, String)]) -> TableDef {
    let Some(old) = old else { return new };
    let mut tracked: Vec<(String, Vec<String>)> =
        old.columns.iter().map(|c| (c.name.clone(), c.aliases.clone())).collect();
    for (from, to) in renames {
        if tracked.iter().any(|(n, _)| n == to) {
            // Already under its new name (the rename was applied before).
            continue;
        }
        if let Some((name, aliases)) = tracked.iter_mut().find(|(n, _)| n == from) {
            aliases.retain(|a| a != to);
            aliases.push(from.clone());
            *name = to.clone();
        }
    }
    for c in &mut new.columns {
        if let Some((_, aliases)) = tracked.iter().find(|(n, _)| *n == c.name) {
            c.aliases.clone_from(aliases);
        }
    }
    new
}

/// Whether `redo` names a column `def` does not have.
fn names_unknown(def: &TableDef, redo: &Redo) -> bool {
    let named: Vec<&(String, Literal)> = match redo {
        Redo::Insert { values, .. } => values.iter().collect(),
        Redo::Update { set, before, .. } => set.iter().chain(before.iter()).collect(),
        Redo::Delete { before, .. } => before.iter().collect(),
    };
    named.iter().any(|(n, _)| !def.columns.iter().any(|c| c.name == *n))
}

/// The columns an update's after-image lacks: named neither in its `set`
/// list nor in its where clause. LogMiner leaves LOB columns out of both
/// (and every column without supplemental logging of all columns).
fn missing_after(schema: &TableSchema, redo: &Redo) -> Vec<usize> {
    let Redo::Update { set, before, .. } = redo else {
        return Vec::new();
    };
    schema
        .columns
        .iter()
        .enumerate()
        .filter(|(_, c)| !set.iter().chain(before.iter()).any(|(n, _)| *n == c.name))
        .map(|(i, _)| i)
        .collect()
}

/// Reads the `missing` columns of an update's row as of its commit SCN
/// (a flashback query by key, as PostgreSQL's source reads unchanged
/// TOAST values): the value the row has once the transaction committed.
/// A row gone by then keeps NULL there.
async fn fill_from_flashback(
    client: &Arc<dyn LogMinerClient>,
    schema: &TableSchema,
    def: &TableDef,
    scn: u64,
    missing: &[usize],
    ev: &mut ChangeEvent,
) -> Result<()> {
    let Some(after) = ev.after.as_mut() else { return Ok(()) };
    let key: Vec<Option<String>> = def
        .primary_key
        .iter()
        .map(|k| {
            let i = schema.columns.iter().position(|c| &c.name == k)?;
            types::canonical_text(&schema.columns[i], &after[i])
        })
        .collect();
    if key.is_empty() || key.iter().any(Option::is_none) {
        // No primary key to find the row by: the columns stay NULL.
        return Ok(());
    }
    let kept = TableDef {
        columns: def
            .columns
            .iter()
            .filter(|c| schema.columns.iter().any(|s| s.name == c.name))
            .cloned()
            .collect(),
        primary_key: def.primary_key.clone(),
    };
    let at = client::RowAt { table: &schema.id, def: &kept, scn, key: &key };
    if let Some(texts) = client.row_at(at).await? {
        let row = snapshot::decode_row(schema, &(String::new(), texts))?;
        for &i in missing {
            after[i] = row[i].clone();
        }
    }
    Ok(())
}

/// A row of `schema` from named literals; columns not named are NULL
/// (with supplemental logging of all columns, which `check` demands, every
/// column is named).
fn row_of(schema: &TableSchema, values: &[(String, Literal)]) -> Result<Row> {
    schema
        .columns
        .iter()
        .map(|c| match values.iter().find(|(n, _)| *n == c.name) {
            Some((_, lit)) => types::decode(c, lit, false).map_err(|e| e.or_table(&schema.id)),
            None => Ok(Value::Null),
        })
        .collect()
}

#[async_trait]
impl Source for OracleSource {
    async fn start(&mut self, checkpoint: Option<Checkpoint>) -> Result<()> {
        self.announced.clear();
        self.progress.clear();
        let client: Arc<dyn LogMinerClient> = match &self.given {
            Some(c) => c.clone(),
            None => {
                let p = self.config.connection()?;
                Arc::new(OracleClient::open(&p).await?)
            }
        };
        self.client = Some(client.clone());
        let info = client.database_info().await?;
        // Mining from the root, the data is the PDB's.
        self.db = Arc::from(
            self.config
                .pdb_name
                .as_deref()
                .map_or(info.con_name.clone(), str::to_ascii_uppercase),
        );
        let resumed = checkpoint.as_ref().map(OracleState::from_checkpoint).transpose()?;
        let state = match resumed {
            Some(s) => {
                if s.dbid != info.dbid {
                    return Err(Error::needs_operator(format!(
                        "the checkpoint's database (DBID {}) is not this one (DBID {}): its SCNs do not compare",
                        s.dbid, info.dbid
                    ))
                    .with_hint("copy everything again: source-runner --config <source.toml> reset"));
                }
                s
            }
            None => {
                let scn = client.current_scn().await?;
                // Changes of transactions open now, made before `scn`, are
                // not in the flashback rows and are in the redo before
                // `scn`: mining starts at the oldest one's start.
                let oldest = client.oldest_open_transaction().await?;
                let mut tables = Vec::new();
                for id in client.list_tables(&self.owners).await? {
                    if !self.filter.captures(&id) {
                        continue;
                    }
                    if let Some(def) = client.table_def(&id).await? {
                        tables.push(StoredTable {
                            schema: id.schema.clone(),
                            table: id.table.clone(),
                            def,
                        });
                    }
                }
                let snapshot = (self.config.snapshot_mode == SnapshotMode::Initial).then(|| SnapshotState {
                    scn,
                    tables: tables
                        .iter()
                        .map(|t| TablePlan::new(&TableId::new(&t.schema, &t.table)))
                        .collect(),
                });
                tracing::info!(scn, tables = tables.len(), "starting at SCN");
                OracleState {
                    version: CHECKPOINT_VERSION,
                    dbid: info.dbid,
                    restart_scn: oldest.map_or(scn + 1, |o| o.min(scn + 1)),
                    committed: CommitPos::through(scn),
                    tables,
                    snapshot,
                    recopied: Vec::new(),
                }
            }
        };
        // Schemas are announced before the first event that uses them.
        self.mined_to = state.restart_scn.saturating_sub(1);
        self.buffer = TxBuffer::new(self.config.buffer_memory_bytes as usize, self.config.spill_dir.clone());
        self.pending.clear();
        self.dirty = false;
        self.state = Some(state);
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<SourceBatch> {
        let snapshot = self.state()?.snapshot.is_some();
        // Schemas announced by a batch that then fails never reached the
        // runner: the next batch announces them again.
        let announced = self.announced.clone();
        let result = if snapshot {
            self.snapshot_batch().await
        } else {
            self.stream_batch().await
        };
        if result.is_err() {
            self.announced = announced;
        }
        result
    }

    async fn acknowledge(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        // Nothing held on the server: no slot; redo retention is the
        // operator's (the checkpoint's restart_scn says what is needed).
        Ok(())
    }

    fn snapshot_progress(&self) -> Vec<SnapshotTableProgress> {
        self.progress.values().cloned().collect()
    }

    /// Copies `tables` again with flashback reads at an SCN read now (see
    /// [`OracleSource::plan_copy`]); the stream waits until the copy is
    /// done, then goes on from where it was, without the copied tables'
    /// changes the copy holds.
    async fn resync(&mut self, tables: &[TableId]) -> Result<Vec<TableId>> {
        if self.config.snapshot_mode == SnapshotMode::Never {
            return Ok(Vec::new());
        }
        let client = self.client()?;
        let mut state = self.state()?.clone();
        let mut out = Vec::new();
        for id in tables {
            let Some(old) = state.def(id).cloned().filter(|_| self.filter.captures(id)) else {
                continue;
            };
            if self.plan_copy(&client, &mut state, id, Some(&old)).await? {
                out.push(id.clone());
            }
        }
        self.state = Some(state);
        Ok(out)
    }

    fn tables(&self) -> Vec<TableId> {
        self.state
            .as_ref()
            .map(|s| s.tables.iter().map(|t| TableId::new(&t.schema, &t.table)).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::fake::FakeOracle;
    use super::*;
    use crate::error::ErrorKind;

    fn orders() -> TableId {
        TableId::new("APP", "ORDERS")
    }

    fn source(db: &FakeOracle, chunk: u64) -> OracleSource {
        let mut c = OracleSourceConfig::with_url("oracle://c##tributary@fake/FREEPDB1", &["APP.*"]);
        c.snapshot_chunk_rows = chunk;
        c.poll_interval_ms = 100;
        c.max_window_scns = 1000;
        c.max_batch_events = 3;
        OracleSource::new(c, "test", Some(Arc::new(db.clone()))).expect("valid")
    }

    /// The rows a consumer holds after applying every event (by key text),
    /// and every change seen with its position.
    #[derive(Default, Debug)]
    struct Mirror {
        rows: BTreeMap<(TableId, String), Row>,
        seen: Vec<(TableId, Op, Position)>,
        /// The transaction block of each streamed change.
        blocks: Vec<TransactionInfo>,
        /// The transactions' ends.
        ends: Vec<crate::TransactionEnd>,
        dropped: Vec<TableId>,
        schemas: BTreeMap<TableId, Arc<TableSchema>>,
    }

    impl Mirror {
        fn apply(&mut self, batch: &SourceBatch) {
            for m in &batch.messages {
                match m {
                    SourceMessage::SchemaChanged(s) => {
                        self.schemas.insert(s.id.clone(), s.clone());
                    }
                    SourceMessage::TableDropped(t) => self.dropped.push(t.clone()),
                    SourceMessage::TableFailed(t, reason) => panic!("{t} failed: {reason}"),
                    SourceMessage::TableRewritten(t, reason) => panic!("{t} rewritten: {reason}"),
                    SourceMessage::Sequence(..) | SourceMessage::Objects(..) | SourceMessage::Verify(..) => {}
                    SourceMessage::TransactionEnd(end) => self.ends.push(end.clone()),
                    SourceMessage::Change(ev) => {
                        assert_eq!(self.schemas.get(&ev.schema.id), Some(&ev.schema), "announced before use");
                        self.seen.push((ev.schema.id.clone(), ev.op, ev.source.position));
                        self.blocks.extend(ev.transaction.clone());
                        let row = ev.after.as_ref().or(ev.before.as_ref()).expect("a row");
                        let key = format!("{:?}", row[0]);
                        match ev.op {
                            Op::Delete => {
                                self.rows.remove(&(ev.schema.id.clone(), key));
                            }
                            _ => {
                                if let Some(b) = &ev.before {
                                    self.rows.remove(&(ev.schema.id.clone(), format!("{:?}", b[0])));
                                }
                                self.rows.insert((ev.schema.id.clone(), key), row.clone());
                            }
                        }
                    }
                }
            }
        }

        fn table(&self, t: &TableId) -> Vec<Row> {
            self.rows
                .iter()
                .filter(|((id, _), _)| id == t)
                .map(|(_, r)| r.clone())
                .collect()
        }

        /// What the runner's table-reset and table-copied records do
        /// downstream when `t` is copied again: its rows are the copy's
        /// and the changes after it.
        fn reset(&mut self, t: &TableId) {
            self.rows.retain(|(id, _), _| id != t);
        }

        /// `t`'s rows as (key, second column) texts.
        fn pairs(&self, t: &TableId) -> BTreeSet<(String, Option<String>)> {
            let text = |v: &Value| match v {
                Value::Decimal(d) => Some(d.to_string()),
                Value::Text(t) => Some(t.clone()),
                _ => None,
            };
            self.table(t)
                .iter()
                .map(|r| (text(&r[0]).unwrap_or_default(), text(&r[1])))
                .collect()
        }
    }

    /// The fake's committed rows of `t` as [`Mirror::pairs`] gives them.
    fn db_pairs(db: &FakeOracle, t: &TableId) -> BTreeSet<(String, Option<String>)> {
        db.rows(t)
            .into_iter()
            .map(|r| (r[0].clone().unwrap_or_default(), r[1].clone()))
            .collect()
    }

    /// Batches until the source has mined everything the fake wrote and
    /// returned a heartbeat; each batch's checkpoint is returned with it.
    async fn drain(src: &mut OracleSource, db: &FakeOracle, mirror: &mut Mirror) -> Vec<(Checkpoint, usize)> {
        let mut checkpoints = Vec::new();
        for _ in 0..1000 {
            let b = src.next_batch().await.expect("batch");
            mirror.apply(&b);
            checkpoints.push((b.checkpoint.clone(), mirror.seen.len()));
            let streaming = src.state.as_ref().is_some_and(|s| s.snapshot.is_none());
            if streaming && b.messages.is_empty() && src.pending.is_empty() && src.mined_to >= db.scn() {
                return checkpoints;
            }
        }
        panic!("the source never caught up");
    }

    /// From every checkpoint returned, a new source emits exactly what
    /// the first run (`mirror`) emitted after it, in the same order: none
    /// lost, none twice.
    async fn replays_match(db: &FakeOracle, mirror: &Mirror, checkpoints: &[(Checkpoint, usize)]) {
        for (n, (cp, emitted)) in checkpoints.iter().enumerate() {
            let mut replay = Mirror {
                schemas: mirror.schemas.clone(),
                ..Mirror::default()
            };
            let mut resumed = source(db, 2);
            resumed.start(Some(cp.clone())).await.expect("resume");
            drain(&mut resumed, db, &mut replay).await;
            assert_eq!(replay.seen, mirror.seen[*emitted..], "checkpoint {n}");
        }
    }

    /// A seeded fake, a source over it (snapshot chunks of `chunk` rows)
    /// that has copied it and caught up, and what it emitted.
    async fn seeded_and_streaming(chunk: u64) -> (FakeOracle, OracleSource, Mirror) {
        let db = FakeOracle::new();
        seed(&db);
        let mut src = source(&db, chunk);
        src.start(None).await.expect("start");
        let mut mirror = Mirror::default();
        drain(&mut src, &db, &mut mirror).await;
        (db, src, mirror)
    }

    fn seed(db: &FakeOracle) {
        db.create_table(&orders(), &[("ID", "NUMBER"), ("NAME", "VARCHAR2"), ("AT", "DATE"), ("DOC", "CLOB")], &["ID"]);
        let mut tx = db.begin();
        for i in 1..=5 {
            let id = i.to_string();
            tx.insert(&orders(), &[Some(&id), Some("it's"), Some("2024-02-29 12:00:00"), Some("short")]);
        }
        tx.commit();
    }

    fn text(v: &str) -> Value {
        Value::Text(v.into())
    }

    #[tokio::test]
    async fn snapshot_then_streaming_with_savepoints_lobs_and_long_statements() {
        let db = FakeOracle::new();
        seed(&db);
        // Open at snapshot time: its first change is before the snapshot SCN.
        let mut open = db.begin();
        open.insert(&orders(), &[Some("100"), Some("early"), None, None]);
        let mut src = source(&db, 2);
        src.start(None).await.expect("start");
        db.set_csf_limit(40);
        open.insert(&orders(), &[Some("101"), Some("late"), None, None]);
        open.commit();
        let mut tx = db.begin();
        tx.insert(&orders(), &[Some("6"), Some("six"), None, Some("a CLOB written in many pieces, é")]);
        tx.savepoint();
        tx.update(&orders(), "1", &[("NAME", Some("undone"))]);
        tx.insert(&orders(), &[Some("7"), Some("undone"), None, Some("a CLOB rolled back")]);
        tx.rollback_to_savepoint();
        tx.delete(&orders(), "2");
        // LogMiner leaves the CLOB out of this update: read back by key.
        tx.update(&orders(), "3", &[("NAME", Some("three"))]);
        tx.commit();
        let rolled = {
            let mut tx = db.begin();
            tx.insert(&orders(), &[Some("8"), Some("never"), None, None]);
            tx
        };
        rolled.rollback();
        let mut mirror = Mirror::default();
        drain(&mut src, &db, &mut mirror).await;
        let rows = mirror.table(&orders());
        let ids: Vec<Value> = rows.iter().map(|r| r[0].clone()).collect();
        let d = |s: &str| Value::Decimal(s.into());
        // 100 was inserted before the snapshot's SCN by a transaction that
        // committed after it: mined from that transaction's start.
        assert_eq!(ids, vec![d("1"), d("100"), d("101"), d("3"), d("4"), d("5"), d("6")]);
        let by = |id: &str| rows.iter().find(|r| r[0] == d(id)).expect("row").clone();
        assert_eq!(by("1")[1], text("it's"));
        assert_eq!(by("100")[1], text("early"));
        assert_eq!(by("6")[3], text("a CLOB written in many pieces, é"));
        let at = types::parse_masked("2024-02-29 12:00:00", types::DATE_MASK).expect("date").0;
        assert_eq!(by("3")[2], Value::Timestamp(at));
        assert_eq!((by("3")[1].clone(), by("3")[3].clone()), (text("three"), text("short")));
        // Snapshot rows (3 chunks of 2 for 5 rows), then streamed changes
        // in position order.
        let snapshot: Vec<&(TableId, Op, Position)> = mirror.seen.iter().filter(|(_, op, _)| *op == Op::Read).collect();
        assert_eq!(snapshot.len(), 5);
        let streamed: Vec<Position> = mirror
            .seen
            .iter()
            .filter(|(_, op, _)| *op != Op::Read)
            .map(|(_, _, p)| *p)
            .collect();
        assert!(streamed.windows(2).all(|w| w[0] < w[1]), "{streamed:?}");
        assert!(streamed[0] > snapshot[0].2);
        // Debezium's transaction block: the insert of 6, the delete of 2
        // and the update of 3 are one transaction's first to third change,
        // and of its table's.
        assert_eq!(mirror.blocks.len(), streamed.len(), "every streamed change has its block");
        let tx: Vec<&TransactionInfo> = mirror.blocks.iter().filter(|b| b.id == mirror.blocks[2].id).collect();
        let order: Vec<(i64, i64)> = tx.iter().map(|b| (b.total_order, b.data_collection_order)).collect();
        assert_eq!(order, vec![(1, 1), (2, 2), (3, 3)], "{:?}", mirror.blocks);
        // Its end, after its changes, with their count.
        let end = mirror.ends.iter().find(|e| e.id == tx[0].id).expect("the transaction's end");
        assert_eq!(end.tables, vec![(orders(), 3)]);
    }

    #[tokio::test]
    async fn a_restart_from_any_checkpoint_loses_and_repeats_nothing() {
        let db = FakeOracle::new();
        seed(&db);
        let mut src = source(&db, 2);
        src.start(None).await.expect("start");
        let long = db.begin();
        let mut long = long;
        long.insert(&orders(), &[Some("50"), Some("long"), None, None]);
        for i in 10..20 {
            let mut tx = db.begin();
            tx.insert(&orders(), &[Some(&i.to_string()), Some("x"), None, None]);
            tx.commit();
        }
        let mut mirror = Mirror::default();
        let mut checkpoints = drain(&mut src, &db, &mut mirror).await;
        long.update(&orders(), "50", &[("NAME", Some("done"))]);
        long.commit();
        let mut tx = db.begin();
        tx.delete(&orders(), "10");
        tx.commit();
        // Nothing open now: batches of three events leave committed
        // transactions of the window pending, which the checkpoint's
        // restart SCN must still cover.
        for i in 60..70 {
            let mut tx = db.begin();
            tx.insert(&orders(), &[Some(&i.to_string()), Some("y"), None, None]);
            tx.commit();
        }
        checkpoints.extend(drain(&mut src, &db, &mut mirror).await);
        let want = mirror.table(&orders());
        let want_seen = mirror.seen.len();
        assert_eq!(want.len(), 5 + 10 - 1 + 1 + 10);
        // Snapshot rows and changes alike.
        replays_match(&db, &mirror, &checkpoints).await;
        assert_eq!(mirror.seen.len(), want_seen);
    }

    #[tokio::test]
    async fn resync_copies_a_table_again_while_its_changes_and_the_others_go_on() {
        let db = FakeOracle::new();
        seed(&db);
        let other = TableId::new("APP", "OTHER");
        db.create_table(&other, &[("ID", "NUMBER"), ("NAME", "VARCHAR2")], &["ID"]);
        let mut src = source(&db, 2);
        src.start(None).await.expect("start");
        let mut mirror = Mirror::default();
        drain(&mut src, &db, &mut mirror).await;
        // Written before the resync, mined after it: committed changes of
        // both tables, and a transaction open across it.
        let mut open = db.begin();
        open.insert(&orders(), &[Some("40"), Some("open"), None, None]);
        open.insert(&other, &[Some("40"), Some("open")]);
        for i in 10..14 {
            let id = i.to_string();
            let mut tx = db.begin();
            tx.insert(&orders(), &[Some(&id), Some("before"), None, None]);
            tx.insert(&other, &[Some(&id), Some("before")]);
            tx.commit();
        }
        let mut tx = db.begin();
        tx.update(&orders(), "1", &[("NAME", Some("before"))]);
        tx.delete(&orders(), "2");
        tx.delete(&other, "10");
        tx.commit();

        assert_eq!(src.resync(&[TableId::new("APP", "NOPE")]).await.expect("resync"), Vec::<TableId>::new());
        assert_eq!(src.resync(&[orders()]).await.expect("resync"), vec![orders()]);
        let s = db.scn();
        assert_eq!(
            src.state.as_ref().map(|st| st.recopied.clone()),
            Some(vec![Recopied {
                schema: "APP".into(),
                table: "ORDERS".into(),
                scn: s
            }])
        );
        mirror.reset(&orders());
        let from = mirror.seen.len();

        open.update(&orders(), "40", &[("NAME", Some("late"))]);
        open.commit();
        let mut tx = db.begin();
        tx.update(&orders(), "3", &[("NAME", Some("after"))]);
        tx.delete(&orders(), "4");
        tx.insert(&orders(), &[Some("20"), Some("after"), None, None]);
        tx.insert(&other, &[Some("20"), Some("after")]);
        tx.commit();
        let checkpoints = drain(&mut src, &db, &mut mirror).await;

        // The copy's rows first, read at s; then only changes committed after it.
        let after = &mirror.seen[from..];
        let reads = after.iter().take_while(|(_, op, _)| *op == Op::Read).count();
        assert_eq!(reads, 5 - 1 + 4);
        assert!(after[..reads]
            .iter()
            .all(|(t, _, p)| *t == orders() && *p == Position { commit: s, index: 0 }));
        assert!(after[reads..].iter().all(|(_, op, _)| *op != Op::Read));
        let orders_after: Vec<Position> = after[reads..]
            .iter()
            .filter(|(t, _, _)| *t == orders())
            .map(|(_, _, p)| *p)
            .collect();
        assert_eq!(orders_after.len(), 2 + 3, "{orders_after:?}");
        assert!(orders_after.iter().all(|p| p.commit > s), "{orders_after:?}");
        // The other table lost and repeated nothing.
        let others: Vec<Position> = mirror
            .seen
            .iter()
            .filter(|(t, op, _)| *t == other && *op != Op::Read)
            .map(|(_, _, p)| *p)
            .collect();
        assert_eq!(others.len(), 1 + 4 + 1 + 1);
        assert!(others.windows(2).all(|w| w[0] < w[1]), "{others:?}");
        assert_eq!(mirror.pairs(&orders()), db_pairs(&db, &orders()));
        assert_eq!(mirror.pairs(&other), db_pairs(&db, &other));
        assert!(mirror.pairs(&orders()).contains(&("40".into(), Some("late".into()))));
        assert_eq!(src.state.as_ref().map(|st| st.recopied.len()), Some(0), "dropped once the stream passed s");

        // A restart from any checkpoint of the copy (half-way through it
        // too) or after it emits exactly what the first run did after it.
        let halfway = checkpoints.iter().filter(|(cp, _)| {
            OracleState::from_checkpoint(cp)
                .expect("state")
                .snapshot
                .is_some_and(|sn| sn.tables.iter().any(|t| t.after.is_some() && !t.done))
        });
        assert!(halfway.count() >= 2);
        replays_match(&db, &mirror, &checkpoints).await;

        // Without snapshots, nothing can be copied again.
        let mut c = OracleSourceConfig::with_url("oracle://c##tributary@fake/FREEPDB1", &["APP.*"]);
        c.snapshot_mode = SnapshotMode::Never;
        let mut never = OracleSource::new(c, "test", Some(Arc::new(db.clone()))).expect("valid");
        never.start(None).await.expect("start");
        assert_eq!(never.resync(&[orders()]).await.expect("resync"), Vec::<TableId>::new());
    }

    #[tokio::test]
    async fn a_renamed_column_keeps_its_values_and_its_earlier_names() {
        let (db, mut src, mut mirror) = seeded_and_streaming(100).await;
        // Written before the rename, mined after it: LogMiner's online
        // catalog names the column TITLE already.
        let mut tx = db.begin();
        tx.update(&orders(), "1", &[("NAME", Some("before"))]);
        tx.commit();
        db.rename_column(&orders(), "NAME", "TITLE");
        let mut tx = db.begin();
        tx.insert(&orders(), &[Some("9"), Some("after"), None, None]);
        tx.update(&orders(), "3", &[("TITLE", Some("three"))]);
        tx.commit();
        let checkpoints = drain(&mut src, &db, &mut mirror).await;
        let schema = mirror.schemas.get(&orders()).expect("schema").clone();
        let names: Vec<(&str, &[String])> =
            schema.columns.iter().map(|c| (c.name.as_str(), c.aliases.as_slice())).collect();
        assert_eq!(names[1], ("TITLE", &["NAME".to_string()][..]));
        assert!(!names.iter().any(|(n, _)| *n == "NAME"));
        assert_eq!(mirror.pairs(&orders()), db_pairs(&db, &orders()));
        assert!(mirror.pairs(&orders()).contains(&("1".into(), Some("before".into()))));

        // Renamed again, and back: the aliases stay oldest first, never the
        // column's own name; a restart keeps them (the checkpoint's
        // definitions).
        db.rename_column(&orders(), "TITLE", "LABEL");
        let cp = checkpoints.last().expect("a checkpoint").0.clone();
        let mut again = source(&db, 100);
        again.start(Some(cp)).await.expect("resume");
        let mut tx = db.begin();
        tx.update(&orders(), "4", &[("LABEL", Some("four"))]);
        tx.commit();
        drain(&mut again, &db, &mut mirror).await;
        let aliases = |m: &Mirror| m.schemas.get(&orders()).expect("schema").columns[1].aliases.clone();
        assert_eq!(mirror.schemas.get(&orders()).expect("schema").columns[1].name, "LABEL");
        assert_eq!(aliases(&mirror), vec!["NAME".to_string(), "TITLE".to_string()]);
        db.rename_column(&orders(), "LABEL", "NAME");
        drain(&mut again, &db, &mut mirror).await;
        assert_eq!(aliases(&mirror), vec!["TITLE".to_string(), "LABEL".to_string()]);
        assert_eq!(mirror.pairs(&orders()), db_pairs(&db, &orders()));
    }

    #[tokio::test]
    async fn a_renamed_table_is_dropped_and_copied_under_its_new_name() {
        let (db, mut src, mut mirror) = seeded_and_streaming(2).await;
        // Mined after the rename, under the new name: in the copy.
        let mut tx = db.begin();
        tx.insert(&orders(), &[Some("30"), Some("before"), None, None]);
        tx.delete(&orders(), "5");
        tx.commit();
        db.rename_table(&orders(), "ORDERS2");
        let renamed = TableId::new("APP", "ORDERS2");
        let mut tx = db.begin();
        tx.insert(&renamed, &[Some("31"), Some("between"), None, None]);
        tx.commit();
        let from = mirror.seen.len();
        drain(&mut src, &db, &mut mirror).await;
        let mut tx = db.begin();
        tx.update(&renamed, "1", &[("NAME", Some("after"))]);
        tx.delete(&renamed, "2");
        tx.commit();
        drain(&mut src, &db, &mut mirror).await;

        assert_eq!(mirror.dropped, vec![orders()]);
        let after = &mirror.seen[from..];
        assert!(after.iter().all(|(t, _, _)| *t == renamed), "{after:?}");
        let reads = after.iter().take_while(|(_, op, _)| *op == Op::Read).count();
        assert_eq!(reads, 6);
        assert_eq!(after.len(), reads + 2);
        assert_eq!(mirror.pairs(&renamed), db_pairs(&db, &renamed));
        assert!(mirror.schemas.get(&renamed).is_some_and(|s| s.columns.len() == 4));
    }

    #[tokio::test]
    async fn ddl_adds_columns_and_drops_tables_and_gaps_stop_the_source() {
        let (db, mut src, mut mirror) = seeded_and_streaming(100).await;
        db.add_column(&orders(), "NOTE", "VARCHAR2");
        let mut tx = db.begin();
        tx.insert(&orders(), &[Some("9"), Some("n"), None, None, Some("a note")]);
        tx.commit();
        let t2 = TableId::new("APP", "LATER");
        db.create_table(&t2, &[("K", "NUMBER(9)"), ("R", "RAW(4)")], &["K"]);
        let mut tx = db.begin();
        tx.insert(&t2, &[Some("1"), Some("0A0B")]);
        tx.commit();
        drain(&mut src, &db, &mut mirror).await;
        db.drop_table(&t2);
        drain(&mut src, &db, &mut mirror).await;
        let schema = mirror.schemas.get(&orders()).expect("schema");
        assert_eq!(schema.columns.last().map(|c| c.name.as_str()), Some("NOTE"));
        assert!(mirror.table(&orders()).iter().any(|r| r.get(4) == Some(&text("a note"))));
        assert_eq!(mirror.table(&t2), vec![vec![Value::Int32(1), Value::Bytes(vec![10, 11])]]);
        assert_eq!(mirror.dropped, vec![t2]);

        // A sequence lost before it was mined: NeedsOperator, and nothing
        // after it is emitted.
        let at = db.scn();
        for i in 0..(2 * fake::LOG_SCNS) {
            let mut tx = db.begin();
            tx.insert(&orders(), &[Some(&(1000 + i).to_string()), None, None, None]);
            tx.commit();
        }
        db.lose_sequence(at / fake::LOG_SCNS + 1);
        let e = src.next_batch().await.expect_err("gap");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.to_string().contains("sequence"), "{e}");
        let e = src.next_batch().await.expect_err("still a gap");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    }

    #[tokio::test]
    async fn xmltype_documents_are_reassembled_into_their_rows() {
        let db = FakeOracle::new();
        let t = TableId::new("APP", "DOCS");
        db.create_table(&t, &[("ID", "NUMBER"), ("NAME", "VARCHAR2"), ("DATA", "XMLTYPE")], &["ID"]);
        let mut tx = db.begin();
        tx.insert(&t, &[Some("1"), Some("snap"), Some("<a>in the snapshot</a>")]);
        tx.commit();
        let mut src = source(&db, 100);
        src.start(None).await.expect("start");
        let mut mirror = Mirror::default();
        drain(&mut src, &db, &mut mirror).await;
        let long = format!("<doc>{}</doc>", "Ä ünïcødé, ".repeat(40));
        let mut tx = db.begin();
        tx.insert(&t, &[Some("2"), Some("new"), Some(&long)]);
        tx.insert(&t, &[Some("3"), Some("none"), None]);
        // The document alone: only XML DOC rows, no DML row.
        tx.update(&t, "1", &[("DATA", Some("<a>changed</a>"))]);
        tx.commit();
        let mut tx = db.begin();
        tx.update(&t, "2", &[("NAME", Some("renamed")), ("DATA", None)]);
        tx.commit();
        drain(&mut src, &db, &mut mirror).await;
        let rows = mirror.table(&t);
        let by = |id: &str| rows.iter().find(|r| r[0] == Value::Decimal(id.into())).expect("row").clone();
        assert_eq!(by("1"), vec![Value::Decimal("1".into()), text("snap"), text("<a>changed</a>")]);
        assert_eq!(by("2"), vec![Value::Decimal("2".into()), text("renamed"), Value::Null]);
        assert_eq!(by("3")[2], Value::Null);
        // The long document, between the insert and the update of row 2.
        let docs: Vec<&(TableId, Op, Position)> = mirror.seen.iter().filter(|(id, _, _)| *id == t).collect();
        assert_eq!(docs.len(), 1 + 3 + 1);
        assert_eq!(mirror.schemas.get(&t).expect("schema").columns[2].data_type, tributary_schemas::DataType::Text);
        let mut replay = Mirror::default();
        let mut again = source(&db, 100);
        again.start(None).await.expect("start");
        let mut tx = db.begin();
        tx.insert(&t, &[Some("4"), Some("x"), Some(&long)]);
        tx.commit();
        drain(&mut again, &db, &mut replay).await;
        assert_eq!(
            replay
                .table(&t)
                .iter()
                .find(|r| r[0] == Value::Decimal("4".into()))
                .map(|r| r[2].clone()),
            Some(text(&long))
        );
    }

    #[tokio::test]
    async fn mining_from_the_root_names_the_pdb_in_every_event() {
        let db = FakeOracle::new();
        seed(&db);
        db.set_info(|i| i.con_name = "CDB$ROOT".into());
        let mut c = OracleSourceConfig::with_url("oracle://c##tributary@fake/ORCLCDB", &["APP.*"]);
        c.pdb_name = Some("freepdb1".into());
        let mut src = OracleSource::new(c, "test", Some(Arc::new(db.clone()))).expect("valid");
        src.start(None).await.expect("start");
        let b = src.next_batch().await.expect("batch");
        let dbs: Vec<&str> = b
            .messages
            .iter()
            .filter_map(|m| match m {
                SourceMessage::Change(ev) => Some(&*ev.source.db),
                _ => None,
            })
            .collect();
        assert_eq!(dbs, vec!["FREEPDB1"; 5]);
    }

    #[tokio::test]
    async fn a_checkpoint_of_another_database_is_refused() {
        let db = FakeOracle::new();
        seed(&db);
        let mut src = source(&db, 100);
        src.start(None).await.expect("start");
        let b = src.next_batch().await.expect("batch");
        db.set_info(|i| i.dbid = 7);
        let mut again = source(&db, 100);
        let e = again.start(Some(b.checkpoint)).await.expect_err("other dbid");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
    }
}
