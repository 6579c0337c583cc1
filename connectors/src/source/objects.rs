//! What a source that sends its tables' objects (`SourceMessage::Objects`,
//! docs/migration.md) keeps between reads: when it reads them next, and the
//! sets it sent, so that a table's goes out again only when it changed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tributary_schemas::{TableId, TableObjects};

/// The objects a source sent, and when it reads them again.
#[derive(Debug, Default)]
pub struct ObjectsSent {
    /// When they are read next (`None`: at the next batch).
    next_read: Option<Instant>,
    /// Each table's objects as last sent.
    sent: HashMap<TableId, TableObjects>,
}

impl ObjectsSent {
    /// Whether a read is due now, every `every_ms` (0: never); when it is,
    /// the next one is set.
    pub fn due(&mut self, every_ms: u64) -> bool {
        let now = Instant::now();
        if every_ms == 0 || self.next_read.is_some_and(|at| now < at) {
            return false;
        }
        self.next_read = Some(now + Duration::from_millis(every_ms));
        true
    }

    /// Of the sets `found`, those that differ from the ones last sent,
    /// recorded as sent.
    pub fn changed(
        &mut self,
        found: impl IntoIterator<Item = (TableId, TableObjects)>,
    ) -> Vec<(TableId, TableObjects)> {
        let mut out = Vec::new();
        for (table, objects) in found {
            if self.sent.get(&table) != Some(&objects) {
                tracing::debug!(table = %table, "the table's indexes, constraints or defaults changed: sending them");
                self.sent.insert(table.clone(), objects.clone());
                out.push((table, objects));
            }
        }
        out
    }

    /// Forgets what was sent and reads at the next batch.
    pub fn forget(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_goes_out_when_it_changed_and_again_once_forgotten() {
        let mut s = ObjectsSent::default();
        assert!(!s.due(0));
        assert!(s.due(60_000));
        assert!(!s.due(60_000));
        let t = TableId::new("s", "t");
        let empty = TableObjects::default();
        assert_eq!(s.changed([(t.clone(), empty.clone())]).len(), 1);
        assert!(s.changed([(t.clone(), empty.clone())]).is_empty());
        s.forget();
        assert!(s.due(60_000));
        assert_eq!(s.changed([(t, empty)]).len(), 1);
    }
}
