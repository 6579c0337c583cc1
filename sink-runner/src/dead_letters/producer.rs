//! Writing dead letters: each in a Kafka transaction of its own, by a
//! producer per origin partition whose transactional id fences every
//! earlier sender of that partition's dead letters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;
use tributary_connectors::{Error, ErrorKind};

use super::record::{headers, Failure};
use crate::buffer::RawRecord;

/// How long a dead-letter produce (and its transaction's start and commit)
/// may take before the batch is retried.
pub const DLQ_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker aborts a dead-letter transaction a crashed sender left open
/// after this long (unless the partition's next owner claims it first).
pub const DLQ_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Produces dead-letter records, each in a Kafka transaction of its own,
/// with one transactional producer per origin partition.
///
/// The fence: the transactional id is the consumer group's, the origin
/// topic's and partition's (see [`transactional_id`]), so the member that
/// owns a partition now fences every earlier owner when it claims the
/// partition ([`DeadLetters::claim`], `init_transactions`), and only then
/// reads what they sent (`read_committed`). A member frozen past its
/// session that wakes up and dead-letters a record the new owner has
/// already sent fails its commit (`PRODUCER_FENCED`): the record is in the
/// dead-letter topic once. A zombie that claims again fences the owner in
/// turn, reads the topic first and sends nothing twice; the owner's next
/// send fails, and it claims and reads again (see the pipeline's
/// `dead_letter`). The claim aborts a transaction a crashed owner left open.
pub struct DeadLetters {
    base: ClientConfig,
    group: String,
    /// Claimed partitions (origin topic, partition) and their producers.
    producers: BTreeMap<(String, i32), Arc<FutureProducer>>,
}

/// The transactional id of the dead-letter producer of one origin
/// partition: stable across members and restarts of one consumer group,
/// which is what makes it a fence.
pub fn transactional_id(group: &str, topic: &str, partition: i32) -> String {
    format!("{group}.dlq.{topic}.{partition}")
}

impl DeadLetters {
    /// Kafka settings from `base`; producers are made per partition, when it
    /// is claimed.
    pub fn new(base: &ClientConfig, group: &str) -> Self {
        Self {
            base: base.clone(),
            group: group.to_string(),
            producers: BTreeMap::new(),
        }
    }

    /// Fences every earlier sender of dead letters of `topic` / `partition`
    /// (other members, this runner before a restart) and aborts what they
    /// left open. Call before reading what they sent: a send committed
    /// before the claim is in the topic, any later one fails.
    pub async fn claim(&mut self, topic: &str, partition: i32) -> Result<(), Error> {
        self.producers.remove(&(topic.to_string(), partition));
        let mut c = self.base.clone();
        c.set("transactional.id", transactional_id(&self.group, topic, partition));
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        c.set("linger.ms", "0");
        c.set("message.timeout.ms", DLQ_DELIVERY_TIMEOUT.as_millis().to_string());
        // A crashed sender's open transaction holds back `read_committed`
        // readers of the dead-letter partition until the broker aborts it.
        c.set("transaction.timeout.ms", DLQ_TRANSACTION_TIMEOUT.as_millis().to_string());
        let producer: FutureProducer = c
            .create()
            .map_err(|e| Error::needs_operator(format!("cannot create a dead-letter producer: {e}")))?;
        let producer = Arc::new(producer);
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.init_transactions(DLQ_DELIVERY_TIMEOUT))
            .await
            .map_err(|e| Error::retryable(format!("dead-letter producer: {e}")))?
            .map_err(|e| kafka_error(&format!("cannot claim the dead letters of {topic}/{partition}"), e))?;
        self.producers.insert((topic.to_string(), partition), producer);
        Ok(())
    }

    /// Drops the producer of a partition this member no longer owns.
    pub fn release(&mut self, topic: &str, partition: i32) {
        self.producers.remove(&(topic.to_string(), partition));
    }

    /// Sends `record` (of a partition claimed before) to `topic` and
    /// commits it. After an error the partition is no longer claimed: the
    /// caller claims it and reads the topic again before the next send (the
    /// error may be a fence, and the fencer may have sent the record).
    pub async fn send(&mut self, topic: &str, record: &RawRecord, failure: &Failure) -> Result<(), Error> {
        let part = (record.topic.clone(), record.partition);
        let Some(producer) = self.producers.remove(&part) else {
            return Err(Error::retryable(format!(
                "the dead letters of {}/{} are not claimed",
                record.topic, record.partition
            )));
        };
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.begin_transaction())
            .await
            .map_err(|e| Error::retryable(format!("dead-letter producer: {e}")))?
            .map_err(|e| kafka_error(&format!("cannot write to dead-letter topic {topic}"), e))?;
        let mut r: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).headers(headers(record, failure, &self.group));
        if let Some(k) = &record.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &record.value {
            r = r.payload(v.as_slice());
        }
        if let Err((e, _)) = producer.send(r, DLQ_DELIVERY_TIMEOUT).await {
            return Err(kafka_error(&format!("cannot write to dead-letter topic {topic}"), e)
                .with_hint(format!("allow the sink to write {topic} (and create it, or enable auto-creation)")));
        }
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.commit_transaction(DLQ_DELIVERY_TIMEOUT))
            .await
            .map_err(|e| Error::retryable(format!("dead-letter producer: {e}")))?
            .map_err(|e| kafka_error(&format!("cannot commit the dead letter to {topic}"), e))?;
        self.producers.insert(part, producer);
        Ok(())
    }
}

/// An error of a dead-letter producer, classified as every Kafka error is
/// ([`tributary_connectors::kafka::kafka_error`]), except that a fence is
/// retried: it is the partition's hand-over to its next owner, and the
/// runner claims the partition and reads the topic again before it sends
/// again.
fn kafka_error(context: &str, e: rdkafka::error::KafkaError) -> Error {
    use tributary_connectors::kafka::{kafka_error, FENCED_PRODUCER_CLASS};
    let e = kafka_error(context, e);
    if e.class() == FENCED_PRODUCER_CLASS {
        e.with_kind(ErrorKind::Retryable)
    } else {
        e
    }
}
