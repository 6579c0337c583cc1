//! Dead letters: what the destination can never apply goes to the table's
//! `<topic>.dlq`, once, with Kafka Connect's error headers; `replay`
//! applies them again after an operator fixed the cause.
//!
//! * [`record`]: a dead letter's headers, written and read back;
//! * [`producer`]: the fenced, transactional writes;
//! * [`reader`]: reading a dead-letter topic (replay, and the next owner of
//!   a partition looking for what its predecessor sent).

pub mod producer;
pub mod reader;
pub mod record;

use std::collections::BTreeSet;

use tracing::{debug, info, warn};
use tributary_connectors::{Error, Sink};
use tributary_schemas::TableId;

pub use producer::{transactional_id, DeadLetters, DLQ_DELIVERY_TIMEOUT, DLQ_TRANSACTION_TIMEOUT};
pub use reader::{DlqReader, PartitionRange};
pub use record::{
    headers, origin, Failure, Stage, HEADER_CLASS, HEADER_COLUMN, HEADER_CONNECTOR, HEADER_MESSAGE, HEADER_OFFSET,
    HEADER_PARTITION, HEADER_REASON, HEADER_STAGE, HEADER_TABLE, HEADER_TOPIC,
};

use crate::buffer::RawRecord;
use crate::pipeline::Pipeline;

/// The pipeline's dead letters: the producers, what was sent and not yet
/// covered by stored offsets, and the reader for predecessors' ones.
pub(crate) struct DeadLetterState {
    producers: DeadLetters,
    /// Records dead-lettered whose offsets are not stored yet (topic,
    /// partition, offset): consumed again, such a record is not sent or
    /// counted again. This process's own, and those a predecessor sent
    /// before it crashed or lost the partition (read from the dead-letter
    /// topic before the partition's first dead letter, see
    /// `PartitionState::dlq_unscanned`).
    sent: BTreeSet<(String, i32, i64)>,
    /// Reads dead-letter topics for unscanned partitions, once needed.
    reader: Option<DlqReader>,
}

impl DeadLetterState {
    /// No dead letter sent yet.
    pub(crate) fn new(producers: DeadLetters) -> Self {
        Self { producers, sent: BTreeSet::new(), reader: None }
    }

    /// Drops the producer of a partition this member no longer owns.
    pub(crate) fn release(&mut self, topic: &str, partition: i32) {
        self.producers.release(topic, partition);
    }

    /// `next_offsets` are stored: what was dead-lettered below them is
    /// never consumed again.
    pub(crate) fn stored(&mut self, next_offsets: &[(String, i32, i64)]) {
        if self.sent.is_empty() {
            return;
        }
        for (t, p, o) in next_offsets {
            self.sent.retain(|(dt, dp, doff)| !(dt == t && dp == p && doff < o));
        }
    }
}

impl<S: Sink + 'static> Pipeline<S> {
    /// Sends `raw` to its dead-letter topic, once (see
    /// [`DeadLetterState::sent`]), and counts it for its table.
    pub(crate) async fn dead_letter(
        &mut self,
        raw: &RawRecord,
        stage: Stage,
        error: &Error,
        table: &TableId,
    ) -> Result<(), Error> {
        let label = (self.labeler)(table);
        let dlq = self.config.dlq_topic(&raw.topic);
        let origin = (raw.topic.clone(), raw.partition, raw.offset);
        self.read_predecessors_dead_letters(&dlq, &raw.topic, raw.partition).await?;
        if self.dead_letters.sent.contains(&origin) {
            debug!(table = %label, topic = %raw.topic, partition = raw.partition, offset = raw.offset,
                "already dead-lettered by this runner: not sent or counted again");
            return Ok(());
        }
        let failure = Failure::from_error(stage, error, Some(table.to_string()));
        if let Err(e) = self.dead_letters.producers.send(&dlq, raw, &failure).await {
            // Perhaps fenced by a member that claimed the partition since
            // and sent this record: claim and read again before a retry.
            if let Some(state) = self.partitions.get_mut(&raw.topic, raw.partition) {
                state.dlq_unscanned = true;
            }
            return Err(e);
        }
        self.dead_letters.sent.insert(origin);
        self.telemetry
            .record_failed(&label, &error.to_string(), &error.kind().to_string());
        self.telemetry.set_dead_letter_topic(&label, &dlq);
        warn!(
            table = %label,
            topic = %raw.topic,
            partition = raw.partition,
            offset = raw.offset,
            dlq = %dlq,
            stage = stage.as_str(),
            error = %error,
            "record dead-lettered"
        );
        Ok(())
    }

    /// Once per assignment of `topic` / `partition`, before its first dead
    /// letter (and again after a failed send): fences earlier senders of
    /// its dead letters ([`DeadLetters::claim`]), then reads what a
    /// predecessor (this runner before a crash, another member before a
    /// rebalance, a frozen member since) dead-lettered from the stored
    /// offset on and could not store offsets past, so that it is not sent
    /// twice.
    async fn read_predecessors_dead_letters(&mut self, dlq: &str, topic: &str, partition: i32) -> Result<(), Error> {
        let Some(state) = self.partitions.get(topic, partition).filter(|s| s.dlq_unscanned) else {
            return Ok(());
        };
        let from = state.stored.unwrap_or(0);
        if self.dead_letters.reader.is_none() {
            let base = self
                .config
                .kafka
                .client_config()
                .map_err(|e| Error::needs_operator(e.to_string()))?;
            self.dead_letters.reader =
                Some(DlqReader::new(&base, &format!("{}.dlq-check", self.config.consumer_group))?);
        }
        self.dead_letters.producers.claim(topic, partition).await?;
        let Some(reader) = &self.dead_letters.reader else {
            return Ok(());
        };
        let found = reader.dead_lettered_since(dlq, topic, partition, from).await?;
        if !found.is_empty() {
            info!(
                topic,
                partition,
                from,
                records = found.len(),
                dlq,
                "dead letters a predecessor sent and could not store offsets past: not sent again"
            );
        }
        for offset in found {
            self.dead_letters.sent.insert((topic.to_string(), partition, offset));
        }
        if let Some(state) = self.partitions.get_mut(topic, partition) {
            state.dlq_unscanned = false;
        }
        Ok(())
    }
}
