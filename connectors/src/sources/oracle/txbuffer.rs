//! The transaction buffer: LogMiner returns the changes of every
//! transaction as they were written, interleaved and uncommitted
//! (`V$LOGMNR_CONTENTS` without `COMMITTED_DATA_ONLY`, which would hold a
//! whole transaction in the server's memory). Each transaction's rows are
//! kept here, by `XID`, until its `COMMIT` row (then emitted in order) or
//! its `ROLLBACK` row (then dropped).
//!
//! A partial rollback (`ROLLBACK TO SAVEPOINT`) leaves no marker of its
//! own: Oracle writes the undo of each change rolled back as a redo record,
//! which LogMiner shows with `ROLLBACK = 1` ("1 = if the redo record was
//! generated because of a partial or a full rollback of the associated
//! transaction", Oracle Database Reference, `V$LOGMNR_CONTENTS`). Such a
//! row cancels the latest change still buffered of the same transaction
//! with the same `ROW_ID`, as Debezium's LogMiner adapter does, and the
//! LOB and XML rows that wrote that row's columns after it (they have no
//! undo rows of their own).
//!
//! Memory is bounded: when the buffered statement text exceeds the budget,
//! the largest transaction's buffered rows go to an unnamed temporary file
//! (removed by the OS when closed) and are read back at its commit. The
//! commit of a transaction reads it whole once.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One buffered change of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxEvent {
    /// The row's SCN.
    pub scn: u64,
    /// `OPERATION_CODE` (1 insert, 2 delete, 3 update, 5 DDL, 9 LOB locator,
    /// 10 LOB write, 11 LOB trim, 28 LOB erase, 68 XML DOC BEGIN, 70 XML DOC
    /// WRITE, 71 XML DOC END).
    pub op: u8,
    /// `ROW_ID`.
    pub row_id: String,
    /// `SEG_OWNER`.
    pub owner: String,
    /// `TABLE_NAME`.
    pub table: String,
    /// `SQL_REDO`, continuation rows joined.
    pub sql: String,
    /// `TIMESTAMP`, milliseconds since the epoch.
    pub ts_ms: i64,
}

impl TxEvent {
    fn bytes(&self) -> usize {
        self.sql.len() + self.row_id.len() + self.owner.len() + self.table.len() + 48
    }
}

/// A transaction that committed, with its changes in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// `XID`.
    pub xid: String,
    /// The SCN of its first row.
    pub start_scn: u64,
    /// Its redo thread (RAC instance).
    pub thread: u16,
    /// The commit row's SCN.
    pub commit_scn: u64,
    /// The commit row's time, milliseconds since the epoch.
    pub commit_ts_ms: i64,
    /// Its changes, rolled-back ones removed.
    pub events: Vec<TxEvent>,
}

#[derive(Debug)]
struct Open {
    start_scn: u64,
    thread: u16,
    /// Rows spilled to disk, oldest first, before `events`.
    spill: Option<(File, usize)>,
    events: Vec<TxEvent>,
    bytes: usize,
}

/// Open transactions by `XID`.
#[derive(Debug)]
pub struct TxBuffer {
    open: BTreeMap<String, Open>,
    bytes: usize,
    max_bytes: usize,
    spill_dir: Option<PathBuf>,
    spilled_total: u64,
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::needs_operator(format!("the transaction buffer's spill file: {what}: {e}"))
        .with_hint("give the runner a writable oracle.spill_dir with free space")
}

impl TxBuffer {
    /// A buffer holding at most `max_bytes` of statement text in memory,
    /// spilling to `spill_dir` (the system's temporary directory when
    /// `None`).
    pub fn new(max_bytes: usize, spill_dir: Option<PathBuf>) -> Self {
        Self {
            open: BTreeMap::new(),
            bytes: 0,
            max_bytes,
            spill_dir,
            spilled_total: 0,
        }
    }

    /// A transaction's first row (`START`, or any row of a transaction
    /// not seen yet).
    pub fn begin(&mut self, xid: &str, scn: u64, thread: u16) {
        self.open.entry(xid.to_string()).or_insert(Open {
            start_scn: scn,
            thread,
            spill: None,
            events: Vec::new(),
            bytes: 0,
        });
    }

    /// Buffers a change; a `rollback` row cancels the latest buffered
    /// change of the transaction on the same row instead.
    pub fn append(&mut self, xid: &str, thread: u16, event: TxEvent, rollback: bool) -> Result<()> {
        self.begin(xid, event.scn, thread);
        let Some(tx) = self.open.get_mut(xid) else {
            return Ok(());
        };
        if rollback {
            let (found, freed) = cancel(&mut tx.events, &event.row_id);
            tx.bytes -= freed;
            self.bytes -= freed;
            if !found && tx.spill.is_some() {
                // The change is on disk: read the spilled part back, drop
                // it there, spill the rest again (rare: a savepoint rolled
                // back after its transaction outgrew memory).
                let mut spilled = read_spill(tx)?;
                cancel(&mut spilled, &event.row_id);
                tx.spill = None;
                write_spill(tx, &spilled, self.spill_dir.as_ref())?;
            } else if !found {
                tracing::debug!(xid, "a rollback row with no buffered change on its row (mined from after it)");
            }
            return Ok(());
        }
        let b = event.bytes();
        tx.bytes += b;
        self.bytes += b;
        tx.events.push(event);
        while self.bytes > self.max_bytes {
            let Some((xid, _)) = self.open.iter().filter(|(_, t)| t.bytes > 0).max_by_key(|(_, t)| t.bytes) else {
                break;
            };
            let xid = xid.clone();
            self.spill(&xid)?;
        }
        Ok(())
    }

    fn spill(&mut self, xid: &str) -> Result<()> {
        let Some(tx) = self.open.get_mut(xid) else {
            return Ok(());
        };
        let events = std::mem::take(&mut tx.events);
        write_spill(tx, &events, self.spill_dir.as_ref())?;
        self.bytes -= tx.bytes;
        tx.bytes = 0;
        self.spilled_total += events.len() as u64;
        tracing::debug!(xid, rows = events.len(), "transaction buffer over its memory budget: spilled to disk");
        Ok(())
    }

    /// The transaction's `COMMIT` row: its changes, in order (`None` when
    /// nothing of it was buffered: a transaction that changed no captured
    /// table, or one mined from after its last change).
    pub fn commit(&mut self, xid: &str, commit_scn: u64, commit_ts_ms: i64) -> Result<Option<Committed>> {
        let Some(mut tx) = self.open.remove(xid) else {
            return Ok(None);
        };
        self.bytes -= tx.bytes;
        let mut events = if tx.spill.is_some() {
            read_spill(&mut tx)?
        } else {
            Vec::new()
        };
        events.append(&mut tx.events);
        Ok(Some(Committed {
            xid: xid.to_string(),
            start_scn: tx.start_scn,
            thread: tx.thread,
            commit_scn,
            commit_ts_ms,
            events,
        }))
    }

    /// The transaction's `ROLLBACK` row: drops it.
    pub fn rollback(&mut self, xid: &str) {
        if let Some(tx) = self.open.remove(xid) {
            self.bytes -= tx.bytes;
        }
    }

    /// The start SCN of the oldest open transaction: where mining must
    /// start again after a restart so that none of its rows is missed.
    pub fn oldest_start(&self) -> Option<u64> {
        self.open.values().map(|t| t.start_scn).min()
    }

    /// Open transactions.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no transaction is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Statement bytes held in memory now.
    pub fn memory_bytes(&self) -> usize {
        self.bytes
    }

    /// Rows spilled to disk since the buffer was made.
    pub fn spilled_rows(&self) -> u64 {
        self.spilled_total
    }
}

/// Cancels the latest row change (insert, update, delete) of `events` on
/// `row_id`, and the LOB and XML rows of that row after it: they wrote the
/// LOB and XMLTYPE columns of the change undone (LOB and XML data keep no
/// undo of their own in the redo, so no rollback row of theirs follows).
/// Without such a change here (it is on disk, before these), every LOB
/// and XML row of `row_id` goes. Returns whether the change was here and
/// the bytes freed.
fn cancel(events: &mut Vec<TxEvent>, row_id: &str) -> (bool, usize) {
    let piece = |e: &TxEvent| e.row_id == row_id && matches!(e.op, 9 | 10 | 11 | 28 | 68 | 70 | 71);
    let at = events.iter().rposition(|e| e.row_id == row_id && matches!(e.op, 1..=3));
    let from = at.unwrap_or(0);
    let mut freed = 0;
    let mut i = 0;
    events.retain(|e| {
        let gone = i >= from && (Some(i) == at || piece(e));
        i += 1;
        if gone {
            freed += e.bytes();
        }
        !gone
    });
    (at.is_some(), freed)
}

fn write_spill(tx: &mut Open, events: &[TxEvent], dir: Option<&PathBuf>) -> Result<()> {
    if tx.spill.is_none() {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        }
        .map_err(|e| io("creating", e))?;
        tx.spill = Some((file, 0));
    }
    let Some((file, count)) = tx.spill.as_mut() else {
        return Ok(());
    };
    file.seek(SeekFrom::End(0)).map_err(|e| io("seeking", e))?;
    let mut w = std::io::BufWriter::new(&*file);
    for e in events {
        serde_json::to_writer(&mut w, e).map_err(|e| io("writing", e.into()))?;
        w.write_all(b"\n").map_err(|e| io("writing", e))?;
    }
    w.flush().map_err(|e| io("writing", e))?;
    *count += events.len();
    Ok(())
}

fn read_spill(tx: &mut Open) -> Result<Vec<TxEvent>> {
    let Some((file, count)) = tx.spill.as_mut() else {
        return Ok(Vec::new());
    };
    file.seek(SeekFrom::Start(0)).map_err(|e| io("seeking", e))?;
    let mut out = Vec::with_capacity(*count);
    for line in BufReader::new(&*file).lines() {
        let line = line.map_err(|e| io("reading", e))?;
        out.push(serde_json::from_str(&line).map_err(|e| io("reading", e.into()))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(scn: u64, row: &str, sql: &str) -> TxEvent {
        TxEvent {
            scn,
            op: 1,
            row_id: row.into(),
            owner: "APP".into(),
            table: "T".into(),
            sql: sql.into(),
            ts_ms: 0,
        }
    }

    #[test]
    fn commit_emits_in_order_and_rollback_drops() {
        let mut b = TxBuffer::new(1 << 20, None);
        b.begin("01", 10, 1);
        b.append("01", 1, ev(11, "r1", "a"), false).unwrap();
        b.append("02", 1, ev(12, "r2", "b"), false).unwrap();
        b.append("01", 1, ev(13, "r3", "c"), false).unwrap();
        assert_eq!(b.oldest_start(), Some(10));
        b.rollback("01");
        assert_eq!(b.oldest_start(), Some(12));
        let c = b.commit("02", 20, 5).unwrap().expect("buffered");
        assert_eq!(c.events, vec![ev(12, "r2", "b")]);
        assert_eq!((c.start_scn, c.commit_scn), (12, 20));
        assert!(b.is_empty());
        assert_eq!(b.memory_bytes(), 0);
        assert_eq!(b.commit("99", 30, 0).unwrap(), None);
    }

    #[test]
    fn rollback_to_savepoint_cancels_the_latest_change_of_each_row() {
        // INSERT r1; SAVEPOINT s; UPDATE r1; INSERT r2; ROLLBACK TO s; COMMIT
        // LogMiner: the undo of INSERT r2 and of UPDATE r1, ROLLBACK = 1.
        let mut b = TxBuffer::new(1 << 20, None);
        b.append("x", 1, ev(1, "r1", "insert r1"), false).unwrap();
        b.append("x", 1, ev(2, "r1", "update r1"), false).unwrap();
        b.append("x", 1, ev(3, "r2", "insert r2"), false).unwrap();
        b.append("x", 1, ev(4, "r2", "delete r2"), true).unwrap();
        b.append("x", 1, ev(5, "r1", "undo update r1"), true).unwrap();
        let c = b.commit("x", 6, 0).unwrap().expect("buffered");
        assert_eq!(c.events, vec![ev(1, "r1", "insert r1")]);
    }

    #[test]
    fn a_rolled_back_change_takes_its_lob_and_xml_rows_along() {
        // INSERT r1 with a CLOB and an XMLTYPE document; SAVEPOINT s;
        // INSERT r2 with a CLOB; UPDATE r1; ROLLBACK TO s: the undo of the
        // update and of r2's insert, ROLLBACK = 1; LOB and XML writes have
        // no undo rows. In memory, and with r1's rows spilled.
        let piece = |scn, row: &str, op| TxEvent { op, ..ev(scn, row, "piece") };
        for budget in [1 << 20, 200] {
            let dir = tempfile::tempdir().unwrap();
            let mut b = TxBuffer::new(budget, Some(dir.path().to_path_buf()));
            let rows = [
                ev(1, "r1", "insert r1"),
                piece(2, "r1", 9),
                piece(3, "r1", 10),
                piece(4, "r1", 68),
                piece(5, "r1", 70),
                piece(6, "r1", 71),
                ev(7, "r2", "insert r2"),
                piece(8, "r2", 9),
                piece(9, "r2", 10),
                TxEvent { op: 3, ..ev(10, "r1", "update r1") },
            ];
            for r in &rows {
                b.append("x", 1, r.clone(), false).unwrap();
            }
            b.append("x", 1, TxEvent { op: 3, ..ev(11, "r1", "undo update r1") }, true)
                .unwrap();
            b.append("x", 1, TxEvent { op: 2, ..ev(12, "r2", "delete r2") }, true).unwrap();
            let c = b.commit("x", 13, 0).unwrap().expect("buffered");
            assert_eq!(c.events, rows[..6].to_vec(), "budget {budget}");
        }
        // Rolled back whole: r1's LOB and XML rows go with it, also from
        // memory when r1's insert is on disk.
        let dir = tempfile::tempdir().unwrap();
        let mut b = TxBuffer::new(150, Some(dir.path().to_path_buf()));
        b.append("y", 1, ev(1, "r1", &"x".repeat(200)), false).unwrap();
        assert!(b.spilled_rows() > 0);
        b.append("y", 1, piece(2, "r1", 9), false).unwrap();
        b.append("y", 1, piece(3, "r1", 10), false).unwrap();
        b.append("y", 1, TxEvent { op: 2, ..ev(4, "r1", "delete r1") }, true).unwrap();
        assert_eq!(b.commit("y", 5, 0).unwrap().expect("buffered").events, vec![]);
    }

    #[test]
    fn over_budget_transactions_spill_and_come_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = TxBuffer::new(400, Some(dir.path().to_path_buf()));
        for i in 0..50u64 {
            b.append("big", 1, ev(i, &format!("r{i}"), &"x".repeat(40)), false).unwrap();
            assert!(b.memory_bytes() <= 400, "{}", b.memory_bytes());
        }
        b.append("small", 1, ev(60, "s", "y"), false).unwrap();
        assert!(b.spilled_rows() > 0);
        // A savepoint rollback of a spilled change.
        b.append("big", 1, ev(70, "r3", "undo"), true).unwrap();
        let c = b.commit("big", 80, 0).unwrap().expect("buffered");
        assert_eq!(c.events.len(), 49);
        assert!(c.events.iter().all(|e| e.row_id != "r3"));
        assert!(c.events.windows(2).all(|w| w[0].scn < w[1].scn));
        assert_eq!(b.commit("small", 81, 0).unwrap().expect("buffered").events.len(), 1);
    }

    proptest! {
        /// Any interleaving of changes, savepoint rollbacks, commits and
        /// rollbacks of several transactions, under any memory budget,
        /// commits exactly what a model without spilling commits.
        #[test]
        fn spilling_never_changes_what_commits(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0usize..4, 0usize..60), 1..120),
            budget in 64usize..2000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut b = TxBuffer::new(budget, Some(dir.path().to_path_buf()));
            let mut model: BTreeMap<String, Vec<TxEvent>> = BTreeMap::new();
            for (n, (kind, tx, row, len)) in ops.into_iter().enumerate() {
                let xid = format!("t{tx}");
                let e = ev(n as u64, &format!("r{row}"), &"z".repeat(len));
                match kind {
                    0 | 1 => {
                        b.append(&xid, 1, e.clone(), false).unwrap();
                        model.entry(xid).or_default().push(e);
                    }
                    2 => {
                        b.append(&xid, 1, e.clone(), true).unwrap();
                        let m = model.entry(xid).or_default();
                        if let Some(i) = m.iter().rposition(|x| x.row_id == e.row_id) {
                            m.remove(i);
                        }
                    }
                    _ => {
                        let got = b.commit(&xid, n as u64, 0).unwrap().map(|c| c.events);
                        let want = model.remove(&xid);
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert!(b.memory_bytes() <= budget.max(100));
            }
        }
    }
}
