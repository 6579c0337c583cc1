//! Partitions whose stored offset the topic no longer holds (its retention
//! ran out, or it was deleted and re-created): stopped, neither skipping
//! nor re-reading anything, with the operator's two fixes in the status,
//! and probed until the stored offset is in range again. Fenced partitions
//! go on from their stored offsets the same way.

use rdkafka::consumer::{Consumer, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, info, warn};
use tributary_connectors::{Error, Sink};
use tributary_operations::telemetry::TableState;
use tributary_schemas::TableId;

use crate::partitions::Partition;
use crate::pipeline::Pipeline;
use crate::rebalance::WATERMARKS_TIMEOUT;

/// A partition whose stored offset is outside the topic's current range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRange {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the destination stored for it.
    pub stored: i64,
    /// The topic's earliest offset still held (low watermark).
    pub low: i64,
    /// The offset after its last record (high watermark).
    pub high: i64,
}

impl OutOfRange {
    /// `Some` when `stored` is outside `[low, high]`.
    pub fn check(topic: &str, partition: i32, stored: i64, (low, high): (i64, i64)) -> Option<Self> {
        (stored < low || stored > high).then(|| Self {
            topic: topic.to_string(),
            partition,
            stored,
            low,
            high,
        })
    }

    /// The needs-operator error that stops the partition, with the
    /// operator's two choices.
    pub fn error(&self, consumer_group: &str, table: &TableId) -> Error {
        let Self { topic, partition, stored, low, high } = self;
        let why = if stored < low {
            format!(
                "records {stored}..{} were removed from the topic before this sink applied them (its retention ran \
                 out, or records were deleted)",
                low - 1
            )
        } else {
            "the topic holds fewer records than the stored offset says were applied (it was deleted and re-created?)"
                .to_string()
        };
        let key = format!(
            "consumer_group = '{}' AND topic = '{}' AND partition = {partition}",
            consumer_group.replace('\'', "''"),
            topic.replace('\'', "''")
        );
        Error::needs_operator(format!(
            "topic {topic} partition {partition}: the stored offset {stored} is out of the topic's current range \
             {low}..{high} (earliest held, next to be written): {why}; the partition is stopped, neither skipping \
             nor re-reading anything"
        ))
        .with_table(table.clone())
        .with_class("tributary.kafka.offset_out_of_range")
        .with_hint(format!(
            "either (1) accept that the changes in between are lost to this copy and go on from the earliest record \
             the topic holds: in the destination run UPDATE tributary.offsets SET next_offset = {low} WHERE {key}; \
             or (2) copy the table again: stop the sink runner, drop the destination table, run DELETE FROM \
             tributary.offsets WHERE {key}; have the source copy the table again into the topic if the topic does \
             not start with a full copy of it (a source snapshot), and start the sink runner; the partition is \
             then read from its beginning. The runner checks the stored offset every few seconds and resumes by \
             itself once it is in range (see docs/operations.md)"
        ))
    }
}

/// Whether a consumer error is librdkafka's report of a fetch out of range
/// (with `auto.offset.reset=error`).
pub fn is_out_of_range(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode;
    matches!(
        e,
        KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
    )
}

impl<S: Sink + 'static> Pipeline<S> {
    /// Stops a partition whose stored offset is out of the topic's range:
    /// paused (nothing fetched, no offset moves), the error in the status
    /// and the log, probed until an operator fixes the stored offset. The
    /// table's other partitions and the other tables go on.
    pub(crate) fn stop_partition(&mut self, o: OutOfRange) {
        let table = self.table_of(&o.topic);
        let label = (self.labeler)(&table);
        let error = o.error(&self.config.consumer_group, &table);
        let Some(state) = self.partitions.get(&o.topic, o.partition) else {
            return;
        };
        let again = state.stopped.as_ref() == Some(&o);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&o.topic, o.partition);
        if let Err(e) = self.consumer.pause(&tpl) {
            warn!(topic = %o.topic, partition = o.partition, error = %e, "cannot pause the partition");
        }
        if !again {
            error!(
                table = %label,
                topic = %o.topic,
                partition = o.partition,
                stored_offset = o.stored,
                low = o.low,
                high = o.high,
                kind = %error.kind(),
                error = %error,
                hint = error.hint().unwrap_or(""),
                "partition stopped: its stored offset is out of range"
            );
            self.telemetry
                .record_error(&label, &error.to_string(), &error.kind().to_string());
        }
        self.telemetry.set_state(&label, TableState::Paused(error.to_string()));
        if let Some(state) = self.partitions.get_mut(&o.topic, o.partition) {
            state.stopped = Some(o);
        }
        self.stopped_probe
            .get_or_insert_with(|| std::time::Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
    }

    /// After librdkafka reported a fetch out of range (it names no
    /// partition to us): compares each assigned partition's next offset
    /// with its topic's range and stops those outside it.
    pub(crate) async fn find_out_of_range(&mut self) {
        let candidates: Vec<(String, i32, i64)> = self
            .partitions
            .iter()
            .filter(|(_, _, s)| s.stopped.is_none())
            .filter_map(|(t, p, s)| s.expected.map(|o| (t.to_string(), p, o)))
            .collect();
        let mut found = Vec::new();
        for (topic, partition, next) in candidates {
            match self.watermarks(&topic, partition).await {
                Ok(range) => found.extend(OutOfRange::check(&topic, partition, next, range)),
                Err(e) => warn!(topic = %topic, partition, error = %e, "cannot read the topic's range"),
            }
        }
        if found.is_empty() {
            warn!("Kafka reported an offset out of range, but every assigned partition's offset is in range now");
        }
        for o in found {
            self.stop_partition(o);
        }
    }

    /// Looks at the stopped partitions again: once the stored offset (read
    /// from the destination) is in the topic's range, or gone (then the
    /// partition is read from its beginning), the partition goes on from
    /// there.
    pub(crate) async fn probe_stopped(&mut self) {
        self.stopped_probe = None;
        let parts = self.partitions.waiting();
        self.restart_from_stored(parts).await;
    }

    /// Makes `parts` go on from the offsets stored in the destination now:
    /// stopped partitions once their offset is in range again, fenced ones
    /// at once. When the destination cannot tell, they wait paused and are
    /// looked at again with the stopped ones.
    pub(crate) async fn restart_from_stored(&mut self, parts: Vec<Partition>) {
        if parts.is_empty() {
            return;
        }
        let pairs: Vec<(String, i32)> = parts.iter().map(Partition::pair).collect();
        let stored = match self.sink.lock().await.committed_offsets(&pairs).await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot read the stored offsets of stopped or fenced partitions");
                for p in parts {
                    let Some(state) = self.partitions.get_mut(&p.topic, p.partition) else {
                        continue;
                    };
                    if state.stopped.is_none() && !state.rereading {
                        state.rereading = true;
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition(&p.topic, p.partition);
                        if let Err(e) = self.consumer.pause(&tpl) {
                            warn!(topic = %p.topic, partition = p.partition, error = %e, "cannot pause the partition");
                        }
                    }
                }
                self.stopped_probe =
                    Some(std::time::Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
                return;
            }
        };
        for (Partition { topic, partition }, stored) in parts.into_iter().zip(stored) {
            let at = match stored {
                None => Offset::Beginning,
                Some(o) => {
                    match self.watermarks(&topic, partition).await {
                        Ok(range) => {
                            if let Some(still) = OutOfRange::check(&topic, partition, o, range) {
                                self.stop_partition(still);
                                continue;
                            }
                        }
                        Err(e) => {
                            warn!(topic = %topic, partition, error = %e, "cannot read the topic's range");
                            continue;
                        }
                    }
                    Offset::Offset(o)
                }
            };
            if let Err(e) = self.restart_partition(&topic, partition, at).await {
                warn!(topic = %topic, partition, error = %e, "cannot restart the stopped partition");
                continue;
            }
            let Some(state) = self.partitions.get_mut(&topic, partition) else {
                continue;
            };
            state.stopped = None;
            state.rereading = false;
            state.stored = stored;
            state.expected = stored;
            // Records of the partition still buffered came before the
            // stop and are older than the fixed offset: dropped.
            let lane = self.buffers.lane_of(&topic).to_string();
            if !self.buffers.retrying(&topic) && self.in_flight.as_ref().is_none_or(|f| f.raw.topic != lane) {
                self.buffers.drop_partition(&topic, partition);
                self.transactions.drop_partition(&topic, partition);
            }
            let held = self.operator.paused_topics.contains(&topic) || self.buffers.retrying(&topic);
            if !held {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&topic, partition);
                if let Err(e) = self.consumer.resume(&tpl) {
                    warn!(topic = %topic, partition, error = %e, "cannot resume the partition");
                }
            }
            let label = (self.labeler)(&self.table_of(&topic));
            info!(table = %label, topic = %topic, partition, offset = ?at, "partition goes on from its stored offset");
            if !held {
                self.set_streaming(&topic, &label);
            }
        }
        if self.partitions.any_waiting() {
            self.stopped_probe = Some(std::time::Instant::now() + tributary_connectors::error::OPERATOR_PROBE_DELAY);
        }
    }

    /// Makes a stopped partition fetch from `at` (it stays paused). A seek
    /// does it while librdkafka still fetches the partition; after a fetch
    /// out of range librdkafka stopped fetching it and refuses a seek, so
    /// it is assigned again: alone with the cooperative protocol, else the
    /// whole assignment, every other partition at the next offset this
    /// pipeline expects (what was fetched beyond it is fetched again and
    /// taken once).
    async fn restart_partition(&self, topic: &str, partition: i32, at: Offset) -> Result<(), KafkaError> {
        let consumer = self.consumer.clone();
        let (t, seek_at) = (topic.to_string(), at);
        let sought = tokio::task::spawn_blocking(move || consumer.seek(&t, partition, seek_at, WATERMARKS_TIMEOUT))
            .await
            .unwrap_or(Err(KafkaError::Seek("the seek did not finish".into())));
        if sought.is_ok() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        if matches!(self.consumer.rebalance_protocol(), RebalanceProtocol::Cooperative) {
            tpl.add_partition_offset(topic, partition, at)?;
            self.consumer.incremental_unassign(&tpl)?;
            self.consumer.incremental_assign(&tpl)?;
        } else {
            let current = self.consumer.assignment()?;
            for e in current.elements() {
                let offset = if e.topic() == topic && e.partition() == partition {
                    at
                } else {
                    match self.partitions.get(e.topic(), e.partition()) {
                        Some(state) => state.expected.map_or(
                            // Copied, but nothing stored or received yet.
                            Offset::Beginning,
                            Offset::Offset,
                        ),
                        // Not copied (paused for ever): anywhere in range.
                        None => Offset::End,
                    }
                };
                tpl.add_partition_offset(e.topic(), e.partition(), offset)?;
            }
            self.consumer.assign(&tpl)?;
        }
        // The pause flags survive the new assignment; this one stays paused
        // until the caller resumes it.
        let mut one = TopicPartitionList::new();
        one.add_partition(topic, partition);
        self.consumer.pause(&one)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_out_of_range_names_partition_offset_range_and_both_fixes() {
        assert_eq!(OutOfRange::check("t", 0, 5, (0, 10)), None);
        assert_eq!(OutOfRange::check("t", 0, 10, (0, 10)), None, "the next offset to be written is in range");
        assert!(OutOfRange::check("t", 0, 11, (0, 10)).is_some(), "beyond the end: re-created topic");
        let o = OutOfRange::check("shop.public.orders", 2, 1200, (5000, 5600)).expect("out of range");
        let e = o.error("g'1", &TableId::new("public", "orders"));
        assert_eq!(e.kind(), tributary_connectors::ErrorKind::NeedsOperator);
        let text = e.to_string();
        for part in [
            "topic shop.public.orders partition 2",
            "stored offset 1200 ",
            "range 5000..5600",
            "records 1200..4999 were removed",
            "UPDATE tributary.offsets SET next_offset = 5000 WHERE consumer_group = 'g''1' AND topic = 'shop.public.orders' AND partition = 2",
            "DELETE FROM tributary.offsets WHERE consumer_group = 'g''1'",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
    }
}
