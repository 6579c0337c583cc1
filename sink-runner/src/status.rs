//! What a sink runner is doing, per destination table, for the admin server
//! (`/status`, metrics such as `tributary_failed_records_total{table}`).
//!
//! The runner updates it as it goes; readers take a [`SinkStatus::snapshot`].
//! Counters are atomics so that the hot path never takes a lock for them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The state of one destination table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum TableState {
    /// Applying as records arrive.
    Running,
    /// Waiting to retry after an error that may clear (by itself or after
    /// an operator acts); nothing moves past the unapplied batch.
    Paused {
        /// Why.
        reason: String,
        /// What an operator can do, when known.
        hint: Option<String>,
    },
    /// Stopped for good until restarted.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The last error seen for a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastError {
    /// The message (never row values).
    pub message: String,
    /// `retryable`, `needs-operator` or `permanent`.
    pub kind: String,
    /// When, milliseconds since the epoch.
    pub at_ms: i64,
}

/// Live status of one destination table.
#[derive(Debug)]
pub struct TableStatus {
    state: Mutex<TableState>,
    /// Change events applied (after per-key reduction they may have touched
    /// fewer rows).
    pub applied_events: AtomicU64,
    /// Records sent to the dead-letter topic.
    pub failed_records: AtomicU64,
    /// Source commit time of the newest applied event, ms since the epoch
    /// (0: none yet). `now - this` is how far behind the table is.
    pub last_source_ts_ms: AtomicI64,
    /// When the last batch was applied, ms since the epoch (0: never).
    pub last_applied_at_ms: AtomicI64,
    last_error: Mutex<Option<LastError>>,
}

impl Default for TableStatus {
    fn default() -> Self {
        Self {
            state: Mutex::new(TableState::Running),
            applied_events: AtomicU64::new(0),
            failed_records: AtomicU64::new(0),
            last_source_ts_ms: AtomicI64::new(0),
            last_applied_at_ms: AtomicI64::new(0),
            last_error: Mutex::new(None),
        }
    }
}

impl TableStatus {
    /// The current state.
    pub fn state(&self) -> TableState {
        self.state.lock().map(|s| s.clone()).unwrap_or(TableState::Running)
    }

    /// Sets the state.
    pub fn set_state(&self, state: TableState) {
        if let Ok(mut s) = self.state.lock() {
            *s = state;
        }
    }

    /// Records an error.
    pub fn set_error(&self, message: String, kind: &str) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = Some(LastError {
                message,
                kind: kind.to_string(),
                at_ms: now_ms(),
            });
        }
    }

    /// The last error.
    pub fn last_error(&self) -> Option<LastError> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    /// Records an applied batch.
    pub fn applied(&self, events: u64, newest_source_ts_ms: Option<i64>) {
        self.applied_events.fetch_add(events, Ordering::Relaxed);
        if let Some(ts) = newest_source_ts_ms {
            self.last_source_ts_ms.fetch_max(ts, Ordering::Relaxed);
        }
        self.last_applied_at_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// A point-in-time copy of one table's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableSnapshot {
    /// Destination table.
    pub table: String,
    /// State.
    #[serde(flatten)]
    pub state: TableState,
    /// Change events applied.
    pub applied_events: u64,
    /// Records sent to the dead-letter topic.
    pub failed_records: u64,
    /// Source time of the newest applied event (ms since the epoch).
    pub last_source_ts_ms: Option<i64>,
    /// When the last batch was applied (ms since the epoch).
    pub last_applied_at_ms: Option<i64>,
    /// The last error.
    pub last_error: Option<LastError>,
}

/// The status of a sink runner: one entry per destination table.
#[derive(Debug, Default)]
pub struct SinkStatus {
    tables: RwLock<BTreeMap<String, Arc<TableStatus>>>,
}

impl SinkStatus {
    /// An empty status.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The status of `table`, created on first use.
    pub fn table(&self, table: &str) -> Arc<TableStatus> {
        if let Ok(tables) = self.tables.read() {
            if let Some(t) = tables.get(table) {
                return t.clone();
            }
        }
        match self.tables.write() {
            Ok(mut tables) => tables.entry(table.to_string()).or_default().clone(),
            // A poisoned lock only means a reader panicked; a detached
            // entry keeps the runner going.
            Err(_) => Arc::new(TableStatus::default()),
        }
    }

    /// Failed records of `table` so far.
    pub fn failed_records(&self, table: &str) -> u64 {
        self.tables
            .read()
            .ok()
            .and_then(|t| t.get(table).map(|s| s.failed_records.load(Ordering::Relaxed)))
            .unwrap_or(0)
    }

    /// A copy of everything, sorted by table.
    pub fn snapshot(&self) -> Vec<TableSnapshot> {
        let Ok(tables) = self.tables.read() else {
            return Vec::new();
        };
        tables
            .iter()
            .map(|(name, t)| {
                let nonzero = |v: i64| (v != 0).then_some(v);
                TableSnapshot {
                    table: name.clone(),
                    state: t.state(),
                    applied_events: t.applied_events.load(Ordering::Relaxed),
                    failed_records: t.failed_records.load(Ordering::Relaxed),
                    last_source_ts_ms: nonzero(t.last_source_ts_ms.load(Ordering::Relaxed)),
                    last_applied_at_ms: nonzero(t.last_applied_at_ms.load(Ordering::Relaxed)),
                    last_error: t.last_error(),
                }
            })
            .collect()
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_table_and_snapshots() {
        let s = SinkStatus::new();
        s.table("public.a").failed_records.fetch_add(2, Ordering::Relaxed);
        s.table("public.a").applied(5, Some(1000));
        s.table("public.b").set_state(TableState::Paused {
            reason: "permission denied".into(),
            hint: Some("GRANT ...".into()),
        });
        assert_eq!(s.failed_records("public.a"), 2);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[0].applied_events, 5);
        assert_eq!(snap[0].last_source_ts_ms, Some(1000));
        let json = serde_json::to_value(&snap[1]).unwrap();
        assert_eq!(json["state"], "paused");
        assert_eq!(json["reason"], "permission denied");
    }
}
