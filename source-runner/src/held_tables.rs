//! The tables whose changes the runner holds back, and how far each one's
//! new copy is: a plain state machine, kept in the offsets topic with the
//! checkpoint (its held-tables record), and unit-tested here without Kafka.
//!
//! A table is held when it is paused alone (a schema change its topic
//! cannot carry, `incompatible_schema_changes = "pause_table"`, or a change
//! the source could not read: `SourceMessage::TableFailed`) or copied again
//! (`source-runner reset`, `POST /resync`, a change of the source's
//! position domain). Its life:
//!
//! 1. [`CopyProgress::Paused`]: every change is held back; the next start
//!    asks the source to copy the table again.
//! 2. [`CopyProgress::Asked`]: the source was asked; a reset due is sent
//!    (a table-reset record, before any row of the copy), and changes are
//!    held back until the copy's first row comes.
//! 3. [`CopyProgress::From`]: the copy read the table at that position;
//!    older streamed changes are held back (the copy's rows hold them),
//!    newer ones flow. Once the copy is complete, a table-copied record
//!    sweeps the rows it did not rewrite; the first change after that ends
//!    the hold. An empty copy (no row to take a position from) sweeps
//!    every row and ends the hold at once.

use std::collections::BTreeMap;

use tracing::{info, warn};
use tributary_connectors::{CopyHold, ErrorKind, SnapshotTableProgress, SourceBatch, SourceMessage};
use tributary_operations::telemetry::{TableState, Telemetry};
use tributary_schemas::records::{CopyProgress, Held, HeldTable, OffsetsRecord};
use tributary_schemas::{Position, TableId};

/// The position of an empty copy's sweep: the greatest position
/// destinations can store (as signed 64-bit integers), so every row is
/// older.
const NEWEST: u64 = i64::MAX.unsigned_abs();

/// A new reset's id: the clock in milliseconds, so that a later reset of a
/// table has a greater id than an earlier one (see
/// [`tributary_schemas::records::ControlRecord::TableReset`]).
pub fn new_reset_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The held tables of one runner, and a reset of every table asked and
/// not carried out yet.
#[derive(Debug, Default)]
pub struct HeldTables {
    held: BTreeMap<TableId, Held>,
    /// Whether `held` changed since it was last committed.
    changed: bool,
    /// A reset of every table asked by `source-runner reset` (its id), not
    /// carried out yet: kept in the offsets topic until the commit that
    /// holds the tables' resets.
    reset_all: Option<u64>,
    /// The reset-all record the next commit writes: the request itself
    /// (`source-runner reset`), or its end (`None`) once the tables' resets
    /// are held.
    reset_all_write: Option<Option<u64>>,
    /// Tables held for a copy the source asked for (a rewrite), to be
    /// asked of the source once the batch that asked is committed. Held
    /// `Paused` meanwhile, so a crash before that copies them at the start.
    copies_asked: Vec<TableId>,
}

impl HeldTables {
    /// The state the offsets topic held.
    pub fn restore(held: Vec<HeldTable>, reset_all: Option<u64>) -> Self {
        Self {
            held: held.into_iter().map(|h| (h.id(), h.held)).collect(),
            changed: false,
            reset_all,
            reset_all_write: None,
            copies_asked: Vec::new(),
        }
    }

    /// Whether no table is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The held table `table`, if it is.
    pub fn get(&self, table: &TableId) -> Option<&Held> {
        self.held.get(table)
    }

    /// Whether a reset of every table was asked and is not carried out.
    pub fn reset_all_asked(&self) -> bool {
        self.reset_all.is_some()
    }

    /// Takes on the resets the source starts with: after a change of its
    /// position domain (or a reset of every table, which the source
    /// reports as one) every table it captures is copied again, with a
    /// reset first. Tables it no longer captures are no longer held.
    pub fn reset_all_tables(&mut self, why: &str, tables: Vec<TableId>) {
        let reset = self.reset_all.unwrap_or_else(new_reset_id);
        warn!(
            reason = why,
            tables = tables.len(),
            reset,
            "copying every table again; destination rows the new copy does not see are removed"
        );
        self.held.retain(|t, _| tables.contains(t));
        for table in tables {
            self.held.insert(
                table,
                Held {
                    reason: why.to_string(),
                    copy: CopyProgress::Asked,
                    reset: Some(reset),
                },
            );
        }
        self.changed = true;
        if self.reset_all.is_some() {
            self.reset_all_write = Some(None);
        }
    }

    /// Records a reset asked by `source-runner reset`, to be carried out at
    /// the runner's next start: of `tables`, or of every table when there
    /// is none.
    pub fn record_reset(&mut self, tables: &[TableId], reset: u64) {
        if tables.is_empty() {
            self.reset_all = Some(reset);
            self.reset_all_write = Some(Some(reset));
        }
        for table in tables {
            self.held.insert(
                table.clone(),
                Held {
                    reason: "copied again, as asked (source-runner reset)".to_string(),
                    copy: CopyProgress::Paused,
                    reset: Some(reset),
                },
            );
            self.changed = true;
        }
    }

    /// The tables to ask the source to copy again at a start: the paused
    /// ones, and those asked before a crash (the source's checkpoint of
    /// the same transaction may not have the request).
    pub fn to_copy_again(&self) -> Vec<TableId> {
        self.held
            .iter()
            .filter(|(_, h)| matches!(h.copy, CopyProgress::Paused | CopyProgress::Asked))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// The source copies `copying` again (asked by
    /// [`HeldTables::to_copy_again`]). A reset it cannot carry out (a
    /// table it does not capture, or no snapshots) is said once, and
    /// dropped.
    pub fn copying_again(&mut self, copying: &[TableId]) {
        for table in copying {
            if let Some(h) = self.held.get_mut(table) {
                info!(table = %table, "copying a paused table again");
                h.copy = CopyProgress::Asked;
                self.changed = true;
            }
        }
        let refused: Vec<TableId> = self
            .held
            .iter()
            .filter(|(t, h)| h.reset.is_some() && h.copy == CopyProgress::Paused && !copying.contains(t))
            .map(|(t, _)| t.clone())
            .collect();
        for table in refused {
            warn!(table = %table, "reset not carried out: the source does not capture this table, or cannot copy \
                tables again (snapshot_mode = \"never\")");
            self.held.remove(&table);
            self.changed = true;
        }
    }

    /// The tables whose copy the source asked for since the last call
    /// (see [`SourceMessage::TableRewritten`]), still waiting for it: to be
    /// asked of the source now that the batch that asked is committed.
    pub fn take_copies_asked(&mut self) -> Vec<TableId> {
        let asked = std::mem::take(&mut self.copies_asked);
        asked
            .into_iter()
            .filter(|t| self.held.get(t).is_some_and(|h| h.copy == CopyProgress::Paused))
            .collect()
    }

    /// Whether the source asked for a copy not asked of it yet.
    pub fn copies_asked(&self) -> bool {
        !self.copies_asked.is_empty()
    }

    /// Holds `table` for a copy asked while the stream goes on (`POST
    /// /resync`), with reset `reset` due before its rows, until the source
    /// takes it on ([`HeldTables::copy_taken_on`]) or refuses
    /// ([`HeldTables::restore_table`] with what this returns). Refused when
    /// its copy is under way already.
    pub fn copy_again_live(&mut self, table: &TableId, reset: u64) -> Result<Option<Held>, String> {
        if self.held.get(table).is_some_and(|h| h.copy != CopyProgress::Paused) {
            return Err(format!("{table} is being copied again already"));
        }
        Ok(self.held.insert(
            table.clone(),
            Held {
                reason: "copied again, as asked (POST /resync)".to_string(),
                copy: CopyProgress::Paused,
                reset: Some(reset),
            },
        ))
    }

    /// The source took on the copy of `table` asked by
    /// [`HeldTables::copy_again_live`].
    pub fn copy_taken_on(&mut self, table: &TableId) {
        if let Some(h) = self.held.get_mut(table) {
            h.copy = CopyProgress::Asked;
        }
        self.changed = true;
    }

    /// Puts `table` back as it was before [`HeldTables::copy_again_live`].
    pub fn restore_table(&mut self, table: &TableId, before: Option<Held>) {
        match before {
            Some(h) => self.held.insert(table.clone(), h),
            None => self.held.remove(table),
        };
    }

    /// Pauses `table` alone for `reason`: every change of it is held back
    /// until the next start copies it again.
    pub fn pause(&mut self, table: TableId, reason: String) {
        self.held
            .insert(table, Held { reason, copy: CopyProgress::Paused, reset: None });
        self.changed = true;
    }

    /// Which of `batch`'s messages are held back, moving each held table's
    /// copy along: the state machine of the module's doc.
    pub fn hold(&mut self, batch: &SourceBatch) -> Vec<bool> {
        let holds = |m: &SourceMessage| matches!(m, SourceMessage::TableFailed(..) | SourceMessage::TableRewritten(..));
        if self.held.is_empty() && !batch.messages.iter().any(holds) {
            return Vec::new();
        }
        let mut out = vec![false; batch.messages.len()];
        for (i, msg) in batch.messages.iter().enumerate() {
            match msg {
                SourceMessage::TableFailed(t, reason) => {
                    warn!(table = %t, error = %reason, "the table is paused; the others go on");
                    self.pause(t.clone(), reason.clone());
                }
                SourceMessage::TableDropped(t) => {
                    if self.held.remove(t).is_some() {
                        self.changed = true;
                    }
                    self.copies_asked.retain(|c| c != t);
                }
                SourceMessage::TableRewritten(t, why) => {
                    warn!(table = %t, reason = %why, "the table's rows changed without row changes in the log: it is \
                        copied again while the others stream");
                    // Held from here (a copy under way read it before the
                    // rewrite: it is asked again), with a reset, as `POST
                    // /resync` does.
                    self.held.insert(
                        t.clone(),
                        Held {
                            reason: format!("copied again: {why}"),
                            copy: CopyProgress::Paused,
                            reset: Some(new_reset_id()),
                        },
                    );
                    self.changed = true;
                    if !self.copies_asked.contains(t) {
                        self.copies_asked.push(t.clone());
                    }
                }
                SourceMessage::SchemaChanged(s) => out[i] = self.held.contains_key(&s.id),
                // A sequence only ever moves a destination's forward, and
                // objects are sent once per change: never held back (an
                // object the held rows refuse is said by the sink, and
                // made again at a cutover).
                SourceMessage::Sequence(..) | SourceMessage::Objects(..) | SourceMessage::TransactionEnd(_) => {}
                // A held table's changes wait: its rows at the destination
                // are not the source's until its copy ends, so a range
                // read meanwhile would differ.
                SourceMessage::Verify(t, _) => out[i] = self.held.contains_key(t),
                SourceMessage::Change(e) => {
                    let Some(h) = self.held.get_mut(&e.schema.id) else {
                        continue;
                    };
                    let mut hold = match h.copy {
                        CopyProgress::Paused => {
                            out[i] = true;
                            continue;
                        }
                        CopyProgress::Asked => CopyHold::default(),
                        CopyProgress::From { commit, index, swept } => {
                            CopyHold { from: Some(Position { commit, index }), swept }
                        }
                    };
                    let (held, ends) = hold.admit(e);
                    if let (CopyProgress::Asked, Some(at)) = (h.copy, hold.from) {
                        h.copy = CopyProgress::From { commit: at.commit, index: at.index, swept: false };
                        self.changed = true;
                    }
                    if ends {
                        self.held.remove(&e.schema.id);
                        self.changed = true;
                    }
                    out[i] = held;
                }
            }
        }
        out
    }

    /// Whether the message at `i` of a batch is held back: by
    /// [`HeldTables::hold`] (its answer `held`), or because its table was
    /// paused since.
    pub fn is_held(&self, held: &[bool], i: usize, table: &TableId) -> bool {
        held.get(i).copied().unwrap_or(false) || self.held.get(table).is_some_and(|h| h.copy == CopyProgress::Paused)
    }

    /// The resets due (see [`Held::reset`]): of tables whose copy the
    /// source has taken on.
    pub fn due_resets(&self) -> Vec<(TableId, u64)> {
        self.held
            .iter()
            .filter(|(_, h)| h.copy != CopyProgress::Paused)
            .filter_map(|(t, h)| h.reset.map(|r| (t.clone(), r)))
            .collect()
    }

    /// `table`'s reset was sent.
    pub fn reset_sent(&mut self, table: &TableId) {
        if let Some(h) = self.held.get_mut(table) {
            h.reset = None;
        }
        self.changed = true;
    }

    /// The sweeps due: each held table whose new copy `progress` says is
    /// complete, with the position older rows are gone at (an empty copy:
    /// every row).
    pub fn due_sweeps(&self, progress: &[SnapshotTableProgress]) -> Vec<(TableId, Position)> {
        let mut due = Vec::new();
        for (table, held) in &self.held {
            if !progress.iter().any(|p| &p.table == table && p.done) {
                continue;
            }
            match held.copy {
                CopyProgress::From { commit, index, swept: false } => {
                    due.push((table.clone(), Position { commit, index }))
                }
                CopyProgress::Asked => due.push((table.clone(), Position { commit: NEWEST, index: NEWEST })),
                _ => {}
            }
        }
        due
    }

    /// `table`'s sweep was sent: its hold ends with the next change (an
    /// empty copy's at once: nothing streamed of it is older).
    pub fn swept(&mut self, table: &TableId) {
        match self.held.get_mut(table) {
            Some(Held { copy: CopyProgress::From { swept, .. }, .. }) => *swept = true,
            _ => {
                self.held.remove(table);
            }
        }
        self.changed = true;
    }

    /// Shows the paused tables in status and metrics (not those held for
    /// a copy the source asked for, about to be asked of it).
    pub fn show_paused(&self, telemetry: &Telemetry) {
        for (table, held) in &self.held {
            if held.copy == CopyProgress::Paused && !self.copies_asked.contains(table) {
                let table = table.to_string();
                telemetry.record_error(&table, &held.reason, &ErrorKind::NeedsOperator.to_string());
                telemetry.set_state(&table, TableState::Paused(held.reason.clone()));
            }
        }
    }

    /// The offsets-topic records the next commit writes: the held tables
    /// when they changed, and a reset of every table asked, or its end once
    /// carried out. [`HeldTables::committed`] once they are durable.
    pub fn records(&self) -> Vec<OffsetsRecord> {
        let mut out = Vec::new();
        if self.changed {
            let held = self
                .held
                .iter()
                .map(|(id, held)| HeldTable {
                    schema: id.schema.clone(),
                    table: id.table.clone(),
                    held: held.clone(),
                })
                .collect();
            out.push(OffsetsRecord::HeldTables(held));
        }
        if let Some(reset) = self.reset_all_write {
            out.push(OffsetsRecord::ResetAll(reset));
        }
        out
    }

    /// What [`HeldTables::records`] gave is durable.
    pub fn committed(&mut self) {
        self.changed = false;
        if self.reset_all_write.take() == Some(None) {
            self.reset_all = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tributary_connectors::Checkpoint;
    use tributary_schemas::{ChangeEvent, Column, DataType, Op, SnapshotMarker, SourceInfo, TableSchema, Value};

    use super::*;

    fn schema(table: &str) -> Arc<TableSchema> {
        Arc::new(TableSchema {
            id: TableId::new("public", table),
            columns: vec![Column::new("id", DataType::Int64, false)],
            key: vec!["id".to_string()],
            dropped: Vec::new(),
        })
    }

    fn change(table: &Arc<TableSchema>, commit: u64, snapshot: SnapshotMarker) -> SourceMessage {
        let source = SourceInfo {
            connector: "memory".into(),
            name: "test".into(),
            db: "db".into(),
            ts_ms: 0,
            snapshot,
            tx_id: None,
            position: Position { commit, index: 0 },
            native_position: "".into(),
        };
        let op = if snapshot == SnapshotMarker::False {
            Op::Update
        } else {
            Op::Read
        };
        SourceMessage::Change(ChangeEvent {
            schema: table.clone(),
            op,
            before: None,
            after: Some(vec![Value::Int64(1)]),
            source,
            ts_ms: 0,
            transaction: None,
        })
    }

    fn batch(messages: Vec<SourceMessage>) -> SourceBatch {
        SourceBatch { messages, checkpoint: Checkpoint(String::new()) }
    }

    fn done(table: &str) -> Vec<SnapshotTableProgress> {
        vec![SnapshotTableProgress {
            table: TableId::new("public", table),
            rows: 1,
            estimated_rows: None,
            done: true,
        }]
    }

    #[test]
    fn a_paused_table_holds_everything_back_and_the_others_flow() {
        let (a, b) = (schema("a"), schema("b"));
        let mut held = HeldTables::default();
        let failed = SourceMessage::TableFailed(a.id.clone(), "bad value".into());
        let out = held.hold(&batch(vec![
            change(&a, 1, SnapshotMarker::False),
            failed,
            change(&a, 2, SnapshotMarker::False),
            change(&b, 3, SnapshotMarker::False),
        ]));
        assert_eq!(out, vec![false, false, true, false], "only what follows the failure is held");
        assert_eq!(held.get(&a.id).map(|h| h.copy), Some(CopyProgress::Paused));
        let out = held.hold(&batch(vec![
            SourceMessage::SchemaChanged(a.clone()),
            change(&b, 4, SnapshotMarker::False),
        ]));
        assert_eq!(out, vec![true, false]);
        assert_eq!(held.to_copy_again(), vec![a.id.clone()]);
        assert!(held.due_resets().is_empty(), "no reset for a paused table");
        // Committed once as changed.
        assert_eq!(held.records().len(), 1);
        held.committed();
        assert!(held.records().is_empty());
    }

    #[test]
    fn a_copy_holds_older_changes_until_its_sweep_then_the_next_change_ends_it() {
        let a = schema("a");
        let mut held = HeldTables::default();
        held.record_reset(std::slice::from_ref(&a.id), 77);
        assert!(held.due_resets().is_empty(), "not before the source takes the copy on");
        held.copying_again(std::slice::from_ref(&a.id));
        assert_eq!(held.due_resets(), vec![(a.id.clone(), 77)]);
        held.reset_sent(&a.id);
        assert!(held.due_resets().is_empty());
        // Streamed before the copy's first row: held.
        assert_eq!(held.hold(&batch(vec![change(&a, 5, SnapshotMarker::False)])), vec![true]);
        // The copy's rows read at 10: they pass, and the copy is From 10.
        assert_eq!(held.hold(&batch(vec![change(&a, 10, SnapshotMarker::True)])), vec![false]);
        assert_eq!(held.get(&a.id).map(|h| h.copy), Some(CopyProgress::From { commit: 10, index: 0, swept: false }));
        // Older streamed changes (the copy holds them) are held, newer flow.
        assert_eq!(
            held.hold(&batch(vec![
                change(&a, 9, SnapshotMarker::False),
                change(&a, 11, SnapshotMarker::False)
            ])),
            vec![true, false]
        );
        assert!(held.due_sweeps(&[]).is_empty(), "the copy is not complete");
        assert_eq!(held.due_sweeps(&done("a")), vec![(a.id.clone(), Position { commit: 10, index: 0 })]);
        held.swept(&a.id);
        assert!(held.due_sweeps(&done("a")).is_empty(), "swept once");
        assert!(!held.is_empty(), "held until the next change");
        assert_eq!(held.hold(&batch(vec![change(&a, 12, SnapshotMarker::False)])), vec![false]);
        assert!(held.is_empty());
    }

    #[test]
    fn an_empty_copy_sweeps_every_row_and_ends_at_once() {
        let a = schema("a");
        let mut held = HeldTables::default();
        held.pause(a.id.clone(), "incompatible".into());
        held.copying_again(std::slice::from_ref(&a.id));
        assert_eq!(held.due_sweeps(&done("a")), vec![(a.id.clone(), Position { commit: NEWEST, index: NEWEST })]);
        held.swept(&a.id);
        assert!(held.is_empty());
    }

    #[test]
    fn a_reset_of_every_table_is_cleared_by_the_commit_that_holds_the_tables() {
        let (a, b, gone) = (schema("a"), schema("b"), schema("gone"));
        let mut held = HeldTables::restore(
            vec![HeldTable {
                schema: "public".into(),
                table: "gone".into(),
                held: Held {
                    reason: "r".into(),
                    copy: CopyProgress::Paused,
                    reset: None,
                },
            }],
            Some(42),
        );
        assert!(held.reset_all_asked());
        held.reset_all_tables("reset asked", vec![a.id.clone(), b.id.clone()]);
        assert!(held.get(&gone.id).is_none(), "a table no longer captured is no longer held");
        assert_eq!(held.due_resets(), vec![(a.id.clone(), 42), (b.id.clone(), 42)], "the asked reset's id");
        let records = held.records();
        assert!(
            matches!(records.as_slice(), [OffsetsRecord::HeldTables(t), OffsetsRecord::ResetAll(None)] if t.len() == 2)
        );
        held.committed();
        assert!(!held.reset_all_asked());
        assert!(held.records().is_empty());
    }

    #[test]
    fn a_reset_the_source_cannot_carry_out_is_dropped_and_a_live_copy_is_not_asked_twice() {
        let (a, b) = (schema("a"), schema("b"));
        let mut held = HeldTables::default();
        held.record_reset(&[a.id.clone(), b.id.clone()], 5);
        held.copying_again(std::slice::from_ref(&a.id));
        assert!(held.get(&b.id).is_none(), "b is not captured: its reset is dropped");
        assert_eq!(held.copy_again_live(&a.id, 6), Err(format!("{} is being copied again already", a.id)));
        let before = held.copy_again_live(&b.id, 6).expect("b may be copied");
        assert_eq!(before, None);
        held.restore_table(&b.id, before);
        assert!(held.get(&b.id).is_none(), "restored as it was");
        let before = held.copy_again_live(&b.id, 7).expect("b may be copied");
        held.copy_taken_on(&b.id);
        assert_eq!(before, None);
        assert_eq!(held.get(&b.id).map(|h| (h.copy, h.reset)), Some((CopyProgress::Asked, Some(7))));
    }

    #[test]
    fn a_rewritten_table_is_held_from_its_message_and_its_copy_asked_once_committed() {
        let (a, b) = (schema("a"), schema("b"));
        let mut held = HeldTables::default();
        let rewritten = SourceMessage::TableRewritten(a.id.clone(), "ALTER TABLE rewrote it".into());
        let out = held.hold(&batch(vec![
            change(&a, 1, SnapshotMarker::False),
            rewritten,
            change(&a, 2, SnapshotMarker::False),
            change(&b, 3, SnapshotMarker::False),
        ]));
        assert_eq!(out, vec![false, false, true, false], "its changes after the rewrite wait for the copy");
        assert!(held.copies_asked());
        let h = held.get(&a.id).expect("held").clone();
        assert_eq!(h.copy, CopyProgress::Paused, "a crash now copies it at the start");
        assert!(h.reason.contains("ALTER TABLE rewrote it"), "{}", h.reason);
        let reset = h.reset.expect("a reset before the copy, as POST /resync");
        assert!(held.due_resets().is_empty(), "not before the source takes the copy on");
        assert_eq!(held.records().len(), 1, "committed with the batch");
        assert_eq!(held.take_copies_asked(), vec![a.id.clone()]);
        assert!(!held.copies_asked() && held.take_copies_asked().is_empty(), "asked once");
        held.copy_taken_on(&a.id);
        assert_eq!(held.due_resets(), vec![(a.id.clone(), reset)]);
    }

    #[test]
    fn a_dropped_table_is_no_longer_held() {
        let a = schema("a");
        let mut held = HeldTables::default();
        held.pause(a.id.clone(), "r".into());
        held.committed();
        assert_eq!(held.hold(&batch(vec![SourceMessage::TableDropped(a.id.clone())])), vec![false]);
        assert!(held.is_empty());
        assert_eq!(held.records().len(), 1, "the change is committed");
    }
}
