//! The change stream: `V$LOGMNR_CONTENTS` rows of one mining window into
//! committed transactions, in commit order.
//!
//! Rows come in SCN order, interleaved across transactions and (on RAC)
//! redo threads. A statement longer than one row's 4000 bytes continues in
//! the next rows (`CSF = 1` on all but the last: Oracle Database
//! Reference, `V$LOGMNR_CONTENTS.CSF`); they are joined first. Then each
//! row goes to the [`TxBuffer`] by `XID`: `START` (6) opens, DML, DDL and
//! LOB rows are buffered, `COMMIT` (7) closes into a [`Committed`],
//! `ROLLBACK` (36) drops.
//!
//! Commits are emitted ordered by [`CommitPos`] (commit SCN, then redo
//! thread, then XID): two RAC instances can commit at the same SCN, and
//! the checkpoint's "commit reached" must order every commit the same way
//! after a restart, when the window is mined again and every commit at or
//! below it is skipped.

use serde::{Deserialize, Serialize};

use super::client::LogMinerRow;
use super::txbuffer::{Committed, TxBuffer, TxEvent};
use crate::error::Result;

/// Where a commit sorts: SCN, then thread, then XID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CommitPos {
    /// Commit SCN.
    pub scn: u64,
    /// Redo thread.
    pub thread: u16,
    /// Transaction id.
    pub xid: String,
}

impl CommitPos {
    /// Every commit at or below `scn` (a snapshot's SCN: its rows hold them).
    pub fn through(scn: u64) -> Self {
        Self {
            scn,
            thread: u16::MAX,
            xid: String::from("\u{10FFFF}"),
        }
    }

    /// A committed transaction's position.
    pub fn of(c: &Committed) -> Self {
        Self {
            scn: c.commit_scn,
            thread: c.thread,
            xid: c.xid.clone(),
        }
    }
}

/// Joins `CSF` continuation rows: each returned row holds a whole
/// statement. A continuation never spans windows: LogMiner returns all
/// rows of one redo record at its SCN.
pub fn join_continuations(rows: Vec<LogMinerRow>) -> Vec<LogMinerRow> {
    let mut out: Vec<LogMinerRow> = Vec::with_capacity(rows.len());
    let mut open = false;
    for row in rows {
        if open {
            if let Some(last) = out.last_mut() {
                if let Some(more) = &row.sql_redo {
                    last.sql_redo.get_or_insert_with(String::new).push_str(more);
                }
                last.csf = row.csf;
                open = row.csf;
                continue;
            }
        }
        open = row.csf;
        out.push(row);
    }
    out
}

/// Feeds one window's rows to the buffer, keeping the changes of tables
/// `captured(owner, table)` says yes to (the mining query filters by owner
/// only); returns the transactions that committed in it, in [`CommitPos`]
/// order.
pub fn feed(
    buffer: &mut TxBuffer,
    rows: Vec<LogMinerRow>,
    captured: impl Fn(&str, &str) -> bool,
) -> Result<Vec<Committed>> {
    let mut committed = Vec::new();
    for row in join_continuations(rows) {
        let data = !matches!(row.operation_code, 6 | 7 | 36);
        if data && !captured(row.seg_owner.as_deref().unwrap_or(""), row.table_name.as_deref().unwrap_or("")) {
            continue;
        }
        match row.operation_code {
            6 => buffer.begin(&row.xid, row.scn, row.thread),
            7 => {
                if let Some(c) = buffer.commit(&row.xid, row.scn, row.ts_ms)? {
                    committed.push(c);
                }
            }
            36 => buffer.rollback(&row.xid),
            1 | 2 | 3 | 5 | 9 | 10 | 11 | 28 | 68 | 70 | 71 => {
                let event = TxEvent {
                    scn: row.scn,
                    op: row.operation_code,
                    row_id: row.row_id.unwrap_or_default(),
                    owner: row.seg_owner.unwrap_or_default(),
                    table: row.table_name.unwrap_or_default(),
                    sql: row.sql_redo.unwrap_or_default(),
                    ts_ms: row.ts_ms,
                };
                buffer.append(&row.xid, row.thread, event, row.rollback)?;
            }
            255 => {
                // UNSUPPORTED: LogMiner cannot render the change (a type it
                // does not mine). Skipping it would lose a change.
                return Err(crate::error::Error::needs_operator(format!(
                    "the source cannot decode a change of {}.{} at SCN {} (OPERATION_CODE 255: UNSUPPORTED)",
                    row.seg_owner.unwrap_or_default(),
                    row.table_name.unwrap_or_default(),
                    row.scn,
                ))
                .with_class("tributary.oracle_unsupported")
                .with_hint(
                    "the table has a column type LogMiner does not support (Oracle Database Utilities, \
                     \"Unsupported Data Types and Table Storage Attributes\"): exclude the table (oracle.exclude) \
                     and start again",
                ));
            }
            _ => {}
        }
    }
    committed.sort_by_key(CommitPos::of);
    Ok(committed)
}

/// Where mining starts again after this point: the start of the oldest
/// transaction still open, else just after the window mined.
pub fn restart_scn(buffer: &TxBuffer, mined_to: u64) -> u64 {
    buffer.oldest_start().map_or(mined_to + 1, |s| s.min(mined_to + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn row(scn: u64, op: u8, xid: &str, thread: u16, sql: &str) -> LogMinerRow {
        LogMinerRow {
            scn,
            operation_code: op,
            xid: xid.into(),
            thread,
            rs_id: format!("rs{scn}"),
            ssn: 0,
            csf: false,
            rollback: false,
            seg_owner: Some("APP".into()),
            table_name: Some("T".into()),
            row_id: Some(format!("row{scn}")),
            sql_redo: Some(sql.into()),
            ts_ms: 0,
        }
    }

    #[test]
    fn continuation_rows_join() {
        let mut a = row(5, 1, "x", 1, "insert into \"APP\".\"T\"(\"A\") val");
        a.csf = true;
        let mut b = row(5, 1, "x", 1, "ues ('very lo");
        b.csf = true;
        let c = row(5, 1, "x", 1, "ng');");
        let joined = join_continuations(vec![a, b, c, row(6, 7, "x", 1, "commit;")]);
        assert_eq!(joined.len(), 2);
        assert_eq!(joined[0].sql_redo.as_deref(), Some("insert into \"APP\".\"T\"(\"A\") values ('very long');"));
        assert!(!joined[0].csf);
    }

    #[test]
    fn commits_order_by_scn_thread_and_xid_and_restart_is_the_oldest_open_start() {
        // Two RAC threads commit at SCN 20; thread 2's rows come first.
        let rows = vec![
            row(10, 6, "b", 2, ""),
            row(11, 1, "b", 2, "b1"),
            row(12, 6, "a", 1, ""),
            row(13, 1, "a", 1, "a1"),
            row(14, 6, "c", 1, ""),
            row(15, 1, "c", 1, "c1"),
            row(20, 7, "b", 2, ""),
            row(20, 7, "a", 1, ""),
            row(21, 6, "d", 1, ""),
            row(22, 1, "d", 1, "d1"),
            row(23, 36, "d", 1, ""),
        ];
        let mut buf = TxBuffer::new(1 << 20, None);
        let out = feed(&mut buf, rows, |_, _| true).unwrap();
        let order: Vec<(u64, u16, &str)> = out.iter().map(|c| (c.commit_scn, c.thread, c.xid.as_str())).collect();
        assert_eq!(order, vec![(20, 1, "a"), (20, 2, "b")]);
        // c is still open from SCN 14.
        assert_eq!(restart_scn(&buf, 23), 14);
        buf.rollback("c");
        assert_eq!(restart_scn(&buf, 23), 24);
        assert!(CommitPos::of(&out[1]) <= CommitPos::through(20));
        assert!(CommitPos::of(&out[1]) > CommitPos::of(&out[0]));
    }

    #[test]
    fn unsupported_rows_stop_the_source_and_xml_rows_are_buffered() {
        let mut buf = TxBuffer::new(1 << 20, None);
        let e = feed(&mut buf, vec![row(1, 255, "x", 1, "Unsupported")], |_, _| true).expect_err("unsupported");
        // Another table's unsupported change is not this source's concern.
        assert!(feed(&mut buf, vec![row(1, 255, "x", 1, "Unsupported")], |_, t| t != "T").is_ok());
        assert_eq!(e.kind(), crate::error::ErrorKind::NeedsOperator);
        // XMLTYPE documents are buffered with their transaction.
        assert!(
            feed(&mut buf, vec![row(2, 68, "y", 1, "XML DOC BEGIN:"), row(3, 70, "y", 1, "<a/>")], |_, _| true).is_ok()
        );
        assert_eq!(buf.oldest_start(), Some(2));
    }
}
