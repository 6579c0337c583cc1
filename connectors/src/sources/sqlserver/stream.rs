//! The change stream: the rows of every capture instance in one LSN
//! window, merged into transactions in commit order, update halves paired.
//!
//! Debezium's `SqlServerStreamingChangeEventSource` reads each capture
//! instance with `cdc.fn_cdc_get_all_changes_<instance>(from, to, N'all
//! update old')` up to `sys.fn_cdc_get_max_lsn()` and merges the tables by
//! (commit LSN, change LSN, operation); so do we. Within one transaction
//! `__$seqval` orders the changes across tables; an update is a 3 (before)
//! row directly followed by its 4 (after) row with the same seqval; an
//! update of the row identifier is a 1 and a 2 with the same seqval, and
//! the operation code puts the delete first.
//!
//! # Capture-instance switch
//!
//! A capture instance keeps the columns its table had when it was enabled.
//! After `ALTER TABLE` the operator enables a second instance (Debezium's
//! documented procedure); both then capture every change from the second
//! one's `start_lsn` on. The stream reads the old instance below that LSN
//! and the new one from it, announces the new schema at that point, and
//! records the switch in the checkpoint: no change is lost or read twice.

use tributary_schemas::{Op, Row, TableId};

use super::client::{operation, ChangeRow};
use super::lsn::Lsn;
use crate::error::{Error, Result};

/// One change of a transaction, update halves paired.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Which table (an index into the caller's list of reads).
    pub read: usize,
    /// `__$seqval`.
    pub seqval: Lsn,
    /// Create, update or delete.
    pub op: Op,
    /// The row before (updates, deletes).
    pub before: Option<Row>,
    /// The row after (inserts, updates).
    pub after: Option<Row>,
}

/// A committed transaction of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Txn {
    /// Its commit LSN (`__$start_lsn`).
    pub lsn: Lsn,
    /// Commit time, ms since the epoch.
    pub ts_ms: i64,
    /// Its changes in order.
    pub changes: Vec<Change>,
}

/// Merges the change rows of several reads (each already ordered) into
/// transactions ordered by commit LSN, each change ordered by (seqval,
/// operation), 3/4 pairs made one update. A 3 without its 4 (or the
/// reverse) is a permanent error: the change table is not what SQL Server
/// writes.
pub fn merge(reads: Vec<(usize, Vec<ChangeRow>)>, tables: &[TableId]) -> Result<Vec<Txn>> {
    let mut all: Vec<(usize, ChangeRow)> = reads
        .into_iter()
        .flat_map(|(i, rows)| rows.into_iter().map(move |r| (i, r)))
        .collect();
    // Stable: equal keys keep their read order (they cannot be equal across
    // tables: one seqval is one log record of one table).
    all.sort_by_key(|(_, r)| r.order_key());
    let mut out: Vec<Txn> = Vec::new();
    let mut it = all.into_iter().peekable();
    while let Some((read, row)) = it.next() {
        let table = || tables.get(read).cloned().unwrap_or_else(|| TableId::new("", ""));
        let change = match row.operation {
            operation::INSERT => Change {
                read,
                seqval: row.seqval,
                op: Op::Create,
                before: None,
                after: Some(row.row),
            },
            operation::DELETE => Change {
                read,
                seqval: row.seqval,
                op: Op::Delete,
                before: Some(row.row),
                after: None,
            },
            operation::UPDATE_BEFORE => {
                let pair =
                    it.next_if(|(r, n)| *r == read && n.operation == operation::UPDATE_AFTER && n.seqval == row.seqval);
                let Some((_, after)) = pair else {
                    return Err(Error::permanent(format!(
                        "an update's before image at {} has no after image (__$operation 4)",
                        row.seqval
                    ))
                    .with_table(table()));
                };
                Change {
                    read,
                    seqval: row.seqval,
                    op: Op::Update,
                    before: Some(row.row),
                    after: Some(after.row),
                }
            }
            operation::UPDATE_AFTER => {
                return Err(Error::permanent(format!(
                    "an update's after image at {} has no before image: the capture instance must be read with \
                     N'all update old'",
                    row.seqval
                ))
                .with_table(table()))
            }
            other => {
                return Err(
                    Error::permanent(format!("unknown __$operation {other} at {}", row.seqval)).with_table(table())
                )
            }
        };
        match out.last_mut() {
            Some(t) if t.lsn == row.start_lsn => t.changes.push(change),
            _ => out.push(Txn {
                lsn: row.start_lsn,
                ts_ms: row.ts_ms,
                changes: vec![change],
            }),
        }
    }
    Ok(out)
}

/// What to read of one table in a window `(after, to]`: its current
/// instance below `until` (the next instance's start), and the next
/// instance from its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// First LSN to read (inclusive).
    pub from: Lsn,
    /// Last LSN to read (inclusive).
    pub to: Lsn,
}

/// The LSN range of the current instance of a table whose next instance
/// starts at `next_start` (if any), in the window `(after, to]`; `None`
/// when nothing of it is left to read.
pub fn current_bounds(after: Lsn, to: Lsn, next_start: Option<Lsn>) -> Option<Bounds> {
    let from = after.next();
    let end = match next_start {
        Some(s) if s <= from => return None,
        Some(s) => to.min(predecessor(s)),
        None => to,
    };
    (from <= end).then_some(Bounds { from, to: end })
}

/// The LSN just below `l` (`l` is above zero).
fn predecessor(l: Lsn) -> Lsn {
    let v = u128::from_be_bytes({
        let mut b = [0u8; 16];
        b[6..].copy_from_slice(&l.0);
        b
    });
    let mut out = [0u8; 10];
    out.copy_from_slice(&v.saturating_sub(1).to_be_bytes()[6..]);
    Lsn(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::Value;

    fn row(lsn: u16, seq: u16, op: u8, id: i32) -> ChangeRow {
        ChangeRow {
            start_lsn: Lsn::new(1, 10, lsn),
            seqval: Lsn::new(1, 9, seq),
            operation: op,
            ts_ms: 0,
            row: vec![Value::Int32(id)],
        }
    }

    #[test]
    fn transactions_merge_across_tables_and_updates_pair() {
        let t = [TableId::new("dbo", "a"), TableId::new("dbo", "b")];
        let a = vec![row(5, 1, 2, 1), row(5, 3, 3, 1), row(5, 3, 4, 1), row(7, 1, 1, 1)];
        // A key update in b: delete and insert share the seqval; read out of order.
        let b = vec![row(5, 2, 2, 9), row(6, 1, 2, 20), row(6, 1, 1, 10)];
        let txns = merge(vec![(0, a), (1, b)], &t).expect("merges");
        let shape: Vec<(u16, Vec<(usize, Op)>)> = txns
            .iter()
            .map(|t| (t.lsn.slot(), t.changes.iter().map(|c| (c.read, c.op)).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (5, vec![(0, Op::Create), (1, Op::Create), (0, Op::Update)]),
                (6, vec![(1, Op::Delete), (1, Op::Create)]),
                (7, vec![(0, Op::Delete)]),
            ]
        );
        assert_eq!(txns[0].changes[2].before, Some(vec![Value::Int32(1)]));
    }

    #[test]
    fn a_lone_update_half_is_refused() {
        let t = [TableId::new("dbo", "a")];
        let e = merge(vec![(0, vec![row(5, 1, 3, 1)])], &t).expect_err("no after");
        assert_eq!(e.table(), Some(&t[0]));
        assert!(merge(vec![(0, vec![row(5, 1, 4, 1)])], &t).is_err());
    }

    #[test]
    fn bounds_split_at_the_next_instance() {
        let l = |s: u16| Lsn::new(1, 1, s);
        assert_eq!(current_bounds(l(2), l(9), None), Some(Bounds { from: l(3), to: l(9) }));
        assert_eq!(current_bounds(l(2), l(9), Some(l(6))), Some(Bounds { from: l(3), to: l(5) }));
        assert_eq!(current_bounds(l(5), l(9), Some(l(6))), None);
        assert_eq!(current_bounds(l(9), l(9), None), None);
    }
}
