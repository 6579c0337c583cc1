//! One Kafka transaction of the pipeline: the batches in it, when it is
//! committed, and what is reported once it is.
//!
//! A streamed batch is committed at once (latency). Snapshot batches share
//! a transaction, up to [`TXN_MAX_EVENTS`] events or [`TXN_MAX_AGE`]: a
//! commit waits until Kafka has every record of the transaction, and the
//! runner produces nothing meanwhile, so one commit per snapshot chunk made
//! commits most of a snapshot's time (a bigger chunk would instead hold
//! more decoded rows in memory). Measured on a 1M-row snapshot: 59k rows/s
//! with a commit per 8192-row chunk, 150k with up to 65,536 events per
//! transaction, 206-216k with up to 262,144, 237k with one transaction.
//! The first snapshot transaction holds one batch and each next one up to
//! four times as many events as the one before, so sinks get the first rows at
//! once. Events are encoded and handed to librdkafka batch by batch, so an
//! open transaction holds only encoded bytes (bounded by
//! `producer_queue_kbytes`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tracing::debug;
use tributary_connectors::{Checkpoint, Error, SnapshotTableProgress, Source, SourceBatch, SourceMessage};
use tributary_operations::telemetry::{TableState, Telemetry};
use tributary_schemas::{SnapshotMarker, TableId};

use crate::writer::TopicWriter;

/// Snapshot batches share a Kafka transaction up to this many events...
pub const TXN_MAX_EVENTS: usize = 262_144;
/// ...or for this long (checked when a batch arrives); well inside the
/// transaction timeout (at least 1 s, 60 s by default).
pub const TXN_MAX_AGE: Duration = Duration::from_secs(2);

/// What a transaction's events of one table add up to, for its metrics and
/// status once it is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCounts {
    /// Change events.
    pub events: u64,
    /// The latest source time among them (ms since the epoch).
    pub latest_ts: i64,
    /// The earliest source time among them (ms since the epoch): the lag
    /// counts from it until they are committed.
    pub oldest_ts: i64,
    /// Whether any was a snapshot row.
    pub snapshot: bool,
    /// Encoded key and value bytes.
    pub bytes: u64,
}

impl Default for TableCounts {
    fn default() -> Self {
        Self {
            events: 0,
            latest_ts: i64::MIN,
            oldest_ts: i64::MAX,
            snapshot: false,
            bytes: 0,
        }
    }
}

impl TableCounts {
    /// Adds `other`'s events to these.
    pub fn add(&mut self, other: TableCounts) {
        self.events += other.events;
        self.latest_ts = self.latest_ts.max(other.latest_ts);
        self.oldest_ts = self.oldest_ts.min(other.oldest_ts);
        self.snapshot |= other.snapshot;
        self.bytes += other.bytes;
    }
}

/// The batches in the open Kafka transaction: what to report once it is
/// committed.
pub struct OpenTxn {
    /// When its first batch was produced: the broker times a transaction
    /// from its first produce.
    pub started: Instant,
    /// The last batch's checkpoint: it covers them all.
    pub checkpoint: Checkpoint,
    /// Messages in it.
    pub events: usize,
    per_table: HashMap<TableId, TableCounts>,
    /// Time spent waiting for the source's batches, and encoding and
    /// handing them to librdkafka (logged at debug with the commit's).
    pub waited_for_source: Duration,
    /// See `waited_for_source`.
    pub producing: Duration,
    /// Committed to Kafka already (kept alive while the source was slow);
    /// the source's acknowledgement and the status follow.
    pub kafka_committed: bool,
}

impl OpenTxn {
    /// A transaction whose first batch was produced from `started` on.
    pub fn new(started: Instant) -> Self {
        Self {
            kafka_committed: false,
            waited_for_source: Duration::ZERO,
            producing: Duration::ZERO,
            started,
            checkpoint: Checkpoint(String::new()),
            events: 0,
            per_table: HashMap::new(),
        }
    }

    /// Adds a batch's counts (its checkpoint is set once the batch is no
    /// longer needed).
    pub fn add(&mut self, batch: &SourceBatch, counts: HashMap<TableId, TableCounts>) {
        // A verify range weighs as the rows it stands for.
        self.events += batch
            .messages
            .iter()
            .map(|m| match m {
                SourceMessage::Verify(_, range) => range
                    .summary
                    .as_ref()
                    .map_or(range.rows.len(), |s| usize::try_from(s.rows).unwrap_or(usize::MAX))
                    .max(1),
                _ => 1,
            })
            .sum::<usize>();
        for (id, c) in counts {
            self.per_table.entry(id).or_default().add(c);
        }
    }

    /// Whether the transaction stays open for the batches that follow: its
    /// last batch held snapshot rows, the snapshot goes on, and it is under
    /// `limit` events and [`TXN_MAX_AGE`].
    pub fn stays_open(&self, snapshot_rows: bool, snapshot_ends: bool, limit: usize) -> bool {
        snapshot_rows && !snapshot_ends && self.events < limit && self.started.elapsed() < TXN_MAX_AGE
    }

    /// Commits the Kafka side with the last checkpoint (once).
    pub async fn commit_kafka(&mut self, writer: &mut TopicWriter) -> Result<(), Error> {
        if !self.kafka_committed {
            writer.commit(&self.checkpoint).await?;
            self.kafka_committed = true;
        }
        Ok(())
    }

    /// Commits the transaction with the last checkpoint, acknowledges it to
    /// the source, and feeds status and metrics.
    pub async fn commit(
        mut self,
        writer: &mut TopicWriter,
        source: &mut dyn Source,
        telemetry: &Telemetry,
    ) -> Result<(), Error> {
        let committing = Instant::now();
        self.commit_kafka(writer).await?;
        debug!(
            events = self.events,
            waited_for_source_ms = self.waited_for_source.as_millis() as u64,
            producing_ms = self.producing.as_millis() as u64,
            commit_ms = committing.elapsed().as_millis() as u64,
            "transaction committed"
        );
        source.acknowledge(&self.checkpoint).await?;
        telemetry.record_batch_seconds(self.started.elapsed().as_secs_f64());
        for (id, TableCounts { events, latest_ts: ts, snapshot, bytes: b, .. }) in self.per_table {
            let table = id.to_string();
            telemetry.record_events(&table, events, b, Some(ts));
            telemetry.record_applied(&table, Some(ts));
            telemetry.set_state(
                &table,
                if snapshot {
                    TableState::Snapshotting
                } else {
                    TableState::Streaming
                },
            );
        }
        writer.held.show_paused(telemetry);
        Ok(())
    }
}

/// The events limit of the next snapshot transaction, after one of
/// `events` was committed: one batch first, then four times the last one.
pub fn next_limit(events: usize, snapshot_rows: bool) -> usize {
    if snapshot_rows {
        (events * 4).min(TXN_MAX_EVENTS)
    } else {
        0
    }
}

/// Whether `batch` holds snapshot rows (or a verification's ranges, read
/// as they are: many batches to one transaction).
pub fn snapshot_rows(batch: &SourceBatch) -> bool {
    batch.messages.iter().any(|m| match m {
        SourceMessage::Change(e) => e.source.snapshot == SnapshotMarker::True,
        SourceMessage::Verify(..) => true,
        _ => false,
    })
}

/// Whether `batch` ends what keeps a transaction open: it holds the
/// snapshot's last row, or a verification's last range; or, for a batch
/// of snapshot rows, `progress` says every table is copied. (A
/// verification is not a copy: its tables have no progress, and an empty
/// progress ended each of its ranges' transactions, one commit per range.)
pub fn snapshot_ends(batch: &SourceBatch, progress: &[SnapshotTableProgress]) -> bool {
    let mut verifies = false;
    for m in &batch.messages {
        match m {
            SourceMessage::Change(e) if e.source.snapshot == SnapshotMarker::Last => return true,
            SourceMessage::Verify(_, range) if range.last => return true,
            SourceMessage::Verify(..) => verifies = true,
            _ => {}
        }
    }
    !verifies && progress.iter().all(|p| p.done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_transactions_grow_fourfold_up_to_the_limit() {
        assert_eq!(next_limit(1000, true), 4000);
        assert_eq!(next_limit(TXN_MAX_EVENTS, true), TXN_MAX_EVENTS);
        assert_eq!(next_limit(1000, false), 0, "a streamed transaction: the next snapshot one starts small");
    }

    fn verify_batch(last: bool) -> SourceBatch {
        use tributary_schemas::records::VerifyRange;
        let range = VerifyRange {
            id: 1,
            at: tributary_schemas::Position { commit: 5, index: 0 },
            connector: "postgresql".into(),
            schema_id: 0,
            key_schema_id: None,
            partition: None,
            columns: None,
            summary: None,
            after: None,
            until: (!last).then(|| vec![Some("7".into())]),
            last,
            rows: vec![("7".into(), "00".into(), "00".into())],
        };
        SourceBatch {
            messages: vec![SourceMessage::Verify(TableId::new("public", "t"), range)],
            checkpoint: Checkpoint(String::new()),
        }
    }

    #[test]
    fn a_verification_keeps_its_transaction_open_until_its_last_range() {
        // A verification's tables have no snapshot progress: that alone
        // ended each range's transaction (one Kafka commit per range).
        assert!(!snapshot_ends(&verify_batch(false), &[]));
        assert!(snapshot_ends(&verify_batch(true), &[]));
        let empty = SourceBatch {
            messages: vec![],
            checkpoint: Checkpoint(String::new()),
        };
        assert!(snapshot_ends(&empty, &[]), "nothing being copied: nothing keeps it open");
        let copying = SnapshotTableProgress {
            table: TableId::new("public", "u"),
            rows: 1,
            estimated_rows: None,
            done: false,
        };
        assert!(!snapshot_ends(&empty, &[copying]));
    }

    #[test]
    fn counts_add_up() {
        let mut a = TableCounts {
            events: 1,
            latest_ts: 5,
            oldest_ts: 5,
            snapshot: false,
            bytes: 10,
        };
        a.add(TableCounts {
            events: 2,
            latest_ts: 9,
            oldest_ts: 3,
            snapshot: true,
            bytes: 1,
        });
        assert_eq!(
            a,
            TableCounts {
                events: 3,
                latest_ts: 9,
                oldest_ts: 3,
                snapshot: true,
                bytes: 11
            }
        );
        let mut empty = TableCounts::default();
        empty.add(a);
        assert_eq!(empty, a);
    }
}
