//! Which redo log files a mining session needs, and how far it may mine.
//!
//! LogMiner reads only the files it is given (`DBMS_LOGMNR.ADD_LOGFILE`).
//! The files come from `V$ARCHIVED_LOG` (archived copies: `THREAD#`,
//! `SEQUENCE#`, `FIRST_CHANGE#`, `NEXT_CHANGE#`, `NAME`, `STATUS = 'A'`)
//! and `V$LOG` / `V$LOGFILE` (the online groups, one `CURRENT` per open
//! thread whose `NEXT_CHANGE#` is the largest SCN, `ARCHIVED = NO` until
//! archived), Oracle Database Reference, "V$ARCHIVED_LOG" and "V$LOG".
//!
//! What goes wrong in practice (Debezium's LogMiner adapter and its
//! tracker): at a log switch the archived copy of a sequence may not be
//! listed in `V$ARCHIVED_LOG` yet while mining moves on, and LogMiner's own
//! sequence check is skipped with the online catalog (DBZ-6942, pull
//! request 4996); on RAC each thread numbers its sequences on its own
//! (DBZ-7158), and each instance flushes its redo on its own, so a window
//! must end below the lowest `V$THREAD.LAST_REDO_CHANGE#` of the open
//! threads (DBZ-8055, DBZ-8503); a window must never jump ahead when the
//! source is behind. So here: every thread's sequences must be contiguous
//! from the one holding the start SCN, a gap stops the source with
//! [`ErrorKind::NeedsOperator`] (never skipped), the window ends at the
//! open threads' ceiling ([`thread_ceiling`]), and a window starts exactly
//! where the last one ended ([`window`]).
//!
//! [`ErrorKind::NeedsOperator`]: crate::error::ErrorKind::NeedsOperator

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// One redo log file, archived or online.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// File name, for `ADD_LOGFILE`.
    pub name: String,
    /// `THREAD#`.
    pub thread: u16,
    /// `SEQUENCE#`.
    pub sequence: u64,
    /// `FIRST_CHANGE#`: the lowest SCN in it.
    pub first_scn: u64,
    /// `NEXT_CHANGE#`: the first SCN after it; `u64::MAX` for a thread's
    /// current online log (its `NEXT_CHANGE#` is the highest SCN).
    pub next_scn: u64,
    /// An online group (`V$LOG`), not an archived copy.
    pub online: bool,
    /// The thread's current online log (`V$LOG.STATUS = 'CURRENT'`).
    pub current: bool,
}

/// A redo thread (`V$THREAD`: one per RAC instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedoThread {
    /// `THREAD#`.
    pub thread: u16,
    /// `STATUS = 'OPEN'`.
    pub open: bool,
    /// `LAST_REDO_CHANGE#`: the last SCN the instance flushed to redo.
    pub last_redo_scn: u64,
}

/// The highest SCN a window may end at: one below the lowest
/// `LAST_REDO_CHANGE#` of the open threads (redo at that SCN may still be
/// being flushed by the slowest instance), and the current SCN at most.
/// Closed threads do not hold the window back.
pub fn thread_ceiling(threads: &[RedoThread], current_scn: u64) -> u64 {
    threads
        .iter()
        .filter(|t| t.open)
        .map(|t| t.last_redo_scn.saturating_sub(1))
        .min()
        .map_or(current_scn, |c| c.min(current_scn))
}

/// The files of one mining session and the SCN it may mine up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiningPlan {
    /// Files to add, by thread and sequence.
    pub files: Vec<LogFile>,
    /// The highest SCN the files of every thread reach: a window must end
    /// at or below it.
    pub ceiling: u64,
}

/// The files holding redo from `from_scn` on, per thread, checked for
/// gaps; the archived copy of a sequence wins over its online group (which
/// may be overwritten while mined). `current_scn` is the database's.
pub fn plan(logs: &[LogFile], from_scn: u64, current_scn: u64) -> Result<MiningPlan> {
    let mut by_thread: BTreeMap<u16, BTreeMap<u64, LogFile>> = BTreeMap::new();
    for log in logs {
        let seqs = by_thread.entry(log.thread).or_default();
        match seqs.get(&log.sequence) {
            Some(have) if !have.online && log.online => {}
            _ => {
                seqs.insert(log.sequence, log.clone());
            }
        }
    }
    if by_thread.is_empty() {
        return Err(Error::needs_operator("no redo log is listed in V$LOG or V$ARCHIVED_LOG")
            .with_class("tributary.oracle_no_logs")
            .with_hint("grant SELECT on V_$LOG, V_$LOGFILE and V_$ARCHIVED_LOG (see docs/sources/oracle.md)"));
    }
    let mut files = Vec::new();
    let mut ceiling = current_scn;
    for (thread, seqs) in by_thread {
        // Only what ends after from_scn is needed.
        let needed: Vec<&LogFile> = seqs.values().filter(|l| l.next_scn > from_scn).collect();
        let Some(first) = needed.first() else {
            // Every file of this thread ends at or before from_scn: a
            // thread closed since (its redo is all mined).
            continue;
        };
        if first.first_scn > from_scn {
            // The file holding from_scn is neither archived nor online:
            // deleted (RMAN, retention) before it was mined.
            let before = seqs.values().rev().find(|l| l.next_scn <= from_scn).map(|l| l.sequence);
            let missing = before.map_or_else(|| "an earlier sequence".to_string(), |s| format!("sequence {}", s + 1));
            return Err(gap(thread, &missing, from_scn));
        }
        for pair in needed.windows(2) {
            if pair[1].sequence != pair[0].sequence + 1 {
                return Err(gap(thread, &format!("sequence {}", pair[0].sequence + 1), pair[0].next_scn));
            }
        }
        let last = needed[needed.len() - 1];
        // A thread whose newest listed log is not its current one (a log
        // switch being recorded, DBZ-6942) has nothing listed beyond that
        // log's end yet: the window stops there and takes the rest later.
        if !last.current && last.online {
            ceiling = ceiling.min(last.next_scn.saturating_sub(1));
        }
        files.extend(needed.into_iter().cloned());
    }
    Ok(MiningPlan { files, ceiling })
}

fn gap(thread: u16, missing: &str, scn: u64) -> Error {
    Error::needs_operator(format!(
        "redo thread {thread}: {missing} (from SCN {scn}) is in neither V$ARCHIVED_LOG nor V$LOG: its changes cannot \
         be mined, and the source does not skip them"
    ))
    .with_class("tributary.oracle_log_gap")
    .with_hint(
        "restore the archived log (RMAN: RESTORE ARCHIVELOG SEQUENCE <n> THREAD <t>) and start the runner again; if \
         it is gone for good, copy everything again (source-runner reset); keep archived logs longer than the \
         longest runner outage (docs/sources/oracle.md, Redo retention)",
    )
}

/// The next mining window `(start, end]`: it starts exactly where the last
/// one ended (`start`, never moved ahead while behind) and ends `max_scns`
/// later at most, at the plan's ceiling and the current SCN at most.
/// `None` when there is nothing new to mine (an empty or inverted range
/// would fail with ORA-01281).
pub fn window(start: u64, current_scn: u64, ceiling: u64, max_scns: u64) -> Option<(u64, u64)> {
    let end = start.saturating_add(max_scns.max(1)).min(current_scn).min(ceiling);
    (end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    fn archived(thread: u16, sequence: u64, first: u64, next: u64) -> LogFile {
        LogFile {
            name: format!("/arch/{thread}_{sequence}.arc"),
            thread,
            sequence,
            first_scn: first,
            next_scn: next,
            online: false,
            current: false,
        }
    }
    fn online(thread: u16, sequence: u64, first: u64, next: Option<u64>) -> LogFile {
        LogFile {
            name: format!("/redo/{thread}_{sequence}.log"),
            thread,
            sequence,
            first_scn: first,
            next_scn: next.unwrap_or(u64::MAX),
            online: true,
            current: next.is_none(),
        }
    }

    #[test]
    fn contiguous_logs_plan_and_archived_copies_win() {
        let logs = vec![
            archived(1, 10, 100, 200),
            archived(1, 11, 200, 300),
            online(1, 11, 200, Some(300)),
            online(1, 12, 300, None),
        ];
        let p = plan(&logs, 250, 350).expect("plans");
        assert_eq!(p.files.iter().map(|f| (f.sequence, f.online)).collect::<Vec<_>>(), vec![(11, false), (12, true)]);
        assert_eq!(p.ceiling, 350);
    }

    #[test]
    fn a_missing_sequence_stops_the_source() {
        // DBZ-6942: sequence 11 archived copy not listed and its group reused.
        let logs = vec![archived(1, 10, 100, 200), online(1, 12, 300, None)];
        let e = plan(&logs, 150, 400).expect_err("gap");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.to_string().contains("thread 1: sequence 11"), "{e}");
        // The file with the start SCN deleted.
        let logs = vec![archived(1, 12, 300, 400), online(1, 13, 400, None)];
        let e = plan(&logs, 250, 500).expect_err("purged");
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(e.to_string().contains("SCN 250"), "{e}");
        assert!(plan(&[], 1, 2).is_err());
    }

    #[test]
    fn rac_threads_bound_the_window_by_the_slowest_thread() {
        // Thread 2's newest listed log ended at 280 and its next one is
        // not listed yet: mining past 279 would miss its redo there.
        let logs = vec![
            online(1, 5, 100, None),
            archived(2, 7, 100, 200),
            online(2, 8, 200, Some(280)),
        ];
        let p = plan(&logs, 150, 500).expect("plans");
        assert_eq!(p.ceiling, 279);
        assert_eq!(window(150, 500, p.ceiling, 10_000), Some((150, 279)));
        // DBZ-8055 / DBZ-8503: instance 2 flushed its redo up to 390, so
        // the window ends at 389; a closed thread does not count.
        let threads = [
            RedoThread { thread: 1, open: true, last_redo_scn: 480 },
            RedoThread { thread: 2, open: true, last_redo_scn: 390 },
            RedoThread { thread: 3, open: false, last_redo_scn: 100 },
        ];
        assert_eq!(thread_ceiling(&threads, 500), 389);
        assert_eq!(thread_ceiling(&threads[2..], 500), 500);
        assert_eq!(thread_ceiling(&threads[..1], 300), 300);
        // A closed thread whose redo is all below the start adds nothing.
        let logs = vec![online(1, 5, 100, None), archived(2, 3, 10, 90)];
        let p = plan(&logs, 150, 500).expect("plans");
        assert_eq!(p.files.len(), 1);
    }

    #[test]
    fn windows_never_jump_ahead() {
        assert_eq!(window(100, 1_000_000, u64::MAX, 5000), Some((100, 5100)));
        assert_eq!(window(100, 100, u64::MAX, 5000), None);
        assert_eq!(window(100, 90, u64::MAX, 5000), None);
    }

    proptest! {
        /// Windows mined one after the other cover every SCN once, in
        /// order, whatever the current SCN and ceilings do.
        #[test]
        fn windows_cover_every_scn_once(
            start in 0u64..1000,
            steps in proptest::collection::vec((0u64..500, 0u64..500, 1u64..300), 1..40),
        ) {
            let mut at = start;
            let mut current = start;
            for (grow, ceil_extra, max) in steps {
                current += grow;
                if let Some((s, e)) = window(at, current, at + ceil_extra, max) {
                    prop_assert_eq!(s, at);
                    prop_assert!(e > s && e <= current && e - s <= max);
                    at = e;
                }
            }
            prop_assert!(at <= current);
        }

        /// A plan either lists each needed sequence of each thread once,
        /// contiguous, or stops with NeedsOperator: it never skips one.
        #[test]
        fn plans_never_skip_a_sequence(
            present in proptest::collection::vec(any::<bool>(), 2..20),
            from in 0u64..2000,
        ) {
            let mut logs = Vec::new();
            for (i, keep) in present.iter().enumerate() {
                let seq = i as u64 + 1;
                let last = i + 1 == present.len();
                if *keep || last {
                    logs.push(if last { online(1, seq, seq * 100, None) } else { archived(1, seq, seq * 100, seq * 100 + 100) });
                }
            }
            match plan(&logs, from, u64::MAX - 1) {
                Ok(p) => {
                    let seqs: Vec<u64> = p.files.iter().map(|f| f.sequence).collect();
                    prop_assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
                    prop_assert!(p.files[0].first_scn <= from);
                    let needed_from = (from / 100).max(1);
                    for s in needed_from..=present.len() as u64 {
                        prop_assert!(seqs.contains(&s));
                    }
                }
                Err(e) => prop_assert_eq!(e.kind(), ErrorKind::NeedsOperator),
            }
        }
    }
}
