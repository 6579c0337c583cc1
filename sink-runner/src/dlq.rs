//! Dead-letter records: the original key, value and headers of a record the
//! sink cannot apply, plus error headers compatible with Kafka Connect's
//! (`errors.deadletterqueue.context.headers.enable`), so the tools operators
//! already use to inspect Connect's dead-letter topics work here too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::warn;
use tributary_connectors::{Error, ErrorKind, KafkaPosition};

/// Header: the record's original topic.
pub const HEADER_TOPIC: &str = "__connect.errors.topic";
/// Header: the record's original partition (decimal text).
pub const HEADER_PARTITION: &str = "__connect.errors.partition";
/// Header: the record's original offset (decimal text).
pub const HEADER_OFFSET: &str = "__connect.errors.offset";
/// Header: the class of the failure (a SQLSTATE class, `tributary.schema`, ...).
pub const HEADER_CLASS: &str = "__connect.errors.exception.class.name";
/// Header: the error message (never row values).
pub const HEADER_MESSAGE: &str = "__connect.errors.exception.message";
/// Header: where it failed (`VALUE_CONVERTER` for decoding, `TASK_PUT` for
/// the destination), Kafka Connect's stage names.
pub const HEADER_STAGE: &str = "__connect.errors.stage";
/// Header: the consumer group that dead-lettered it.
pub const HEADER_CONNECTOR: &str = "__connect.errors.connector.name";
/// Header: the source table, when known.
pub const HEADER_TABLE: &str = "tributary.errors.table";
/// Header: the column, when known.
pub const HEADER_COLUMN: &str = "tributary.errors.column";
/// Header: the error kind and short reason.
pub const HEADER_REASON: &str = "tributary.errors.reason";

/// How long a dead-letter produce (and its transaction's start and commit)
/// may take before the batch is retried.
pub const DLQ_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker aborts a dead-letter transaction a crashed sender left open
/// after this long (unless the partition's next owner claims it first).
pub const DLQ_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Kafka metadata and watermark timeout when reading a dead-letter topic.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the next record of a partition known to have more.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Records read per step when a dead-letter partition is read backwards.
const SCAN_WINDOW: i64 = 10_000;

/// Where a record failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The record could not be decoded.
    Decode,
    /// The destination refused it.
    Apply,
}

impl Stage {
    /// Kafka Connect's name of the stage.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Decode => "VALUE_CONVERTER",
            Stage::Apply => "TASK_PUT",
        }
    }
}

/// A record as it came from Kafka, kept until it is applied or
/// dead-lettered.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RawRecord {
    /// Copies a consumed message.
    pub fn from_message<M: Message>(m: &M) -> Self {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The value of a header, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Where it came from, for a dead letter (its `__connect.errors.*`
    /// headers).
    pub fn origin(&self) -> Option<KafkaPosition> {
        Some(KafkaPosition {
            topic: self.header(HEADER_TOPIC)?,
            partition: self.header(HEADER_PARTITION)?.parse().ok()?,
            offset: self.header(HEADER_OFFSET)?.parse().ok()?,
        })
    }

    /// Bytes it holds (for batch limits).
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
            + 64
    }
}

/// Why a record is dead-lettered.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Stage.
    pub stage: Stage,
    /// Class of the failure.
    pub class: String,
    /// Full message.
    pub message: String,
    /// Kind and short reason.
    pub reason: String,
    /// Source table, when known.
    pub table: Option<String>,
    /// Column, when known.
    pub column: Option<String>,
}

impl Failure {
    /// From a connector error.
    pub fn from_error(stage: Stage, error: &Error, table: Option<String>) -> Self {
        Self {
            stage,
            class: error.class(),
            message: error.to_string(),
            reason: format!("{}: {}", error.kind(), error.message()),
            table: error.table().map(|t| t.to_string()).or(table),
            column: error.column().map(str::to_string),
        }
    }
}

/// The headers of a dead-letter record: the original ones, then the error
/// headers (replacing earlier error headers of a record dead-lettered twice).
pub fn headers(record: &RawRecord, failure: &Failure, group: &str) -> OwnedHeaders {
    let ours = [
        HEADER_TOPIC,
        HEADER_PARTITION,
        HEADER_OFFSET,
        HEADER_CLASS,
        HEADER_MESSAGE,
        HEADER_STAGE,
        HEADER_CONNECTOR,
        HEADER_TABLE,
        HEADER_COLUMN,
        HEADER_REASON,
    ];
    let mut h = OwnedHeaders::new_with_capacity(record.headers.len() + ours.len());
    for (k, v) in &record.headers {
        if ours.contains(&k.as_str()) {
            continue;
        }
        h = h.insert(Header { key: k, value: v.as_deref() });
    }
    let partition = record.partition.to_string();
    let offset = record.offset.to_string();
    let put = |h: OwnedHeaders, k: &str, v: &str| h.insert(Header { key: k, value: Some(v) });
    h = put(h, HEADER_TOPIC, &record.topic);
    h = put(h, HEADER_PARTITION, &partition);
    h = put(h, HEADER_OFFSET, &offset);
    h = put(h, HEADER_CLASS, &failure.class);
    h = put(h, HEADER_MESSAGE, &failure.message);
    h = put(h, HEADER_STAGE, failure.stage.as_str());
    h = put(h, HEADER_CONNECTOR, group);
    if let Some(t) = &failure.table {
        h = put(h, HEADER_TABLE, t);
    }
    if let Some(c) = &failure.column {
        h = put(h, HEADER_COLUMN, c);
    }
    h = put(h, HEADER_REASON, &failure.reason);
    h
}

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
/// send fails, and it claims and reads again (see the runner's
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
            .map_err(|e| kafka_error(&format!("cannot claim the dead letters of {topic}/{partition}"), &e))?;
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
        producer
            .begin_transaction()
            .map_err(|e| kafka_error(&format!("cannot write to dead-letter topic {topic}"), &e))?;
        let mut r: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).headers(headers(record, failure, &self.group));
        if let Some(k) = &record.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &record.value {
            r = r.payload(v.as_slice());
        }
        if let Err((e, _)) = producer.send(r, DLQ_DELIVERY_TIMEOUT).await {
            return Err(kafka_error(&format!("cannot write to dead-letter topic {topic}"), &e)
                .with_hint(format!("allow the sink to write {topic} (and create it, or enable auto-creation)")));
        }
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.commit_transaction(DLQ_DELIVERY_TIMEOUT))
            .await
            .map_err(|e| Error::retryable(format!("dead-letter producer: {e}")))?
            .map_err(|e| kafka_error(&format!("cannot commit the dead letter to {topic}"), &e))?;
        self.producers.insert(part, producer);
        Ok(())
    }
}

/// An error of a dead-letter producer: permissions need an operator, the
/// rest (a fence, a timeout, a broker away) is retried after a new claim.
fn kafka_error(context: &str, e: &rdkafka::error::KafkaError) -> Error {
    use rdkafka::types::RDKafkaErrorCode as Code;
    let kind = match e.rdkafka_error_code() {
        Some(
            Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::TransactionalIdAuthorizationFailed,
        ) => ErrorKind::NeedsOperator,
        _ => ErrorKind::Retryable,
    };
    Error::new(kind, format!("{context}: {e}")).with_class("kafka.produce")
}

/// A partition of a topic, its first offset and the offset after its last.
pub type PartitionRange = (i32, i64, i64);

/// Reads dead-letter topics: the whole of one (`sink-runner replay`), or,
/// backwards, what one origin partition already sent there (see
/// [`DlqReader::dead_lettered_since`]).
pub struct DlqReader {
    consumer: StreamConsumer,
}

impl DlqReader {
    /// A consumer that only ever assigns partitions (`group_id` is never
    /// joined, and nothing is committed under it).
    pub fn new(base: &ClientConfig, group_id: &str) -> Result<Self, Error> {
        let mut c = base.clone();
        c.set("group.id", group_id);
        c.set("enable.auto.commit", "false");
        c.set("isolation.level", "read_committed");
        let consumer: StreamConsumer = c
            .create()
            .map_err(|e| Error::needs_operator(format!("cannot create a dead-letter topic reader: {e}")))?;
        Ok(Self { consumer })
    }

    /// Each partition of `topic` with its first and next offset; `None` if
    /// the topic does not exist.
    pub fn ranges(&self, topic: &str) -> Result<Option<Vec<PartitionRange>>, Error> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(|e| Error::retryable(format!("cannot read metadata of {topic}: {e}")))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(partitions.len());
        for p in partitions {
            let (low, high) = self
                .consumer
                .fetch_watermarks(topic, p, METADATA_TIMEOUT)
                .map_err(|e| Error::retryable(format!("cannot read the offsets of {topic}/{p}: {e}")))?;
            out.push((p, low, high));
        }
        Ok(Some(out))
    }

    /// The records of `topic` from `start` to before `end`, per partition
    /// `(partition, start, end)`, in order within each partition.
    pub async fn read(&self, topic: &str, ranges: &[PartitionRange]) -> Result<Vec<RawRecord>, Error> {
        let mut remaining: BTreeMap<i32, i64> = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        for &(p, start, end) in ranges.iter().filter(|(_, start, end)| end > start) {
            remaining.insert(p, end);
            tpl.add_partition_offset(topic, p, Offset::Offset(start))
                .map_err(|e| Error::retryable(e.to_string()))?;
        }
        let mut out = Vec::new();
        if remaining.is_empty() {
            return Ok(out);
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| Error::retryable(format!("cannot assign {topic}: {e}")))?;
        let mut last_progress = Instant::now();
        while !remaining.is_empty() {
            // With read_committed, transaction markers take offsets too: a
            // partition is done once its position reaches the end.
            if let Ok(position) = self.consumer.position() {
                for e in position.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        if remaining.get(&e.partition()).is_some_and(|end| o >= *end) {
                            remaining.remove(&e.partition());
                        }
                    }
                }
            }
            if remaining.is_empty() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(500), self.consumer.recv()).await {
                Ok(Ok(m)) => {
                    let raw = RawRecord::from_message(&m);
                    last_progress = Instant::now();
                    let Some(end) = remaining.get(&raw.partition).copied() else {
                        continue;
                    };
                    if raw.offset + 1 >= end {
                        remaining.remove(&raw.partition);
                    }
                    if raw.offset < end {
                        out.push(raw);
                    }
                }
                Ok(Err(e)) => warn!(error = %e, topic, "consumer error while reading a dead-letter topic"),
                Err(_) => {}
            }
            if last_progress.elapsed() > RECEIVE_TIMEOUT {
                return Err(Error::retryable(format!(
                    "no progress reading {topic} for {} s; partitions left: {:?}",
                    RECEIVE_TIMEOUT.as_secs(),
                    remaining.keys().collect::<Vec<_>>()
                )));
            }
        }
        let _ = self.consumer.unassign();
        Ok(out)
    }

    /// The offsets, at `from` or later, of the records of `topic` /
    /// `partition` that `dlq` already holds: what a sink that crashed (or
    /// lost the partition) between sending a dead letter and storing the
    /// offsets past it sent before. The sink that now owns the partition
    /// consumes them again from `from` (its stored offset) and sends none of
    /// them twice.
    ///
    /// Reads each partition of `dlq` backwards, [`SCAN_WINDOW`] records at
    /// a time, and stops at the first window holding a dead letter of the
    /// partition older than `from`: dead letters at or after `from` were
    /// sent after the offsets reached `from` were stored, and one sender
    /// appends to a partition in order.
    pub async fn dead_lettered_since(
        &self,
        dlq: &str,
        topic: &str,
        partition: i32,
        from: i64,
    ) -> Result<BTreeSet<i64>, Error> {
        let mut found = BTreeSet::new();
        let Some(ranges) = self.ranges(dlq)? else {
            return Ok(found);
        };
        for (p, low, high) in ranges {
            let mut end = high;
            while end > low {
                let start = (end - SCAN_WINDOW).max(low);
                let mut older = false;
                for raw in self.read(dlq, &[(p, start, end)]).await? {
                    match raw.origin() {
                        Some(o) if o.topic == topic && o.partition == partition => {
                            if o.offset >= from {
                                found.insert(o.offset);
                            } else {
                                older = true;
                            }
                        }
                        _ => {}
                    }
                }
                if older {
                    break;
                }
                end = start;
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_schemas::TableId;

    #[test]
    fn headers_keep_the_original_and_add_connect_error_headers() {
        let record = RawRecord {
            topic: "shop.public.orders".into(),
            partition: 2,
            offset: 41,
            key: None,
            value: Some(vec![1]),
            headers: vec![
                ("trace".into(), Some(b"x".to_vec())),
                (HEADER_OFFSET.into(), Some(b"1".to_vec())),
            ],
        };
        let e = Error::permanent("value too long")
            .with_table(TableId::new("public", "orders"))
            .with_column("name")
            .with_class("postgres.sqlstate.22001");
        let h = headers(&record, &Failure::from_error(Stage::Apply, &e, None), "g");
        let all: Vec<(String, String)> = h
            .iter()
            .map(|h| (h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
            .collect();
        let get = |k: &str| all.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("trace"), Some("x"));
        assert_eq!(get(HEADER_TOPIC), Some("shop.public.orders"));
        assert_eq!(get(HEADER_PARTITION), Some("2"));
        assert_eq!(get(HEADER_OFFSET), Some("41"));
        assert_eq!(all.iter().filter(|(k, _)| k == HEADER_OFFSET).count(), 1);
        assert_eq!(get(HEADER_STAGE), Some("TASK_PUT"));
        assert_eq!(get(HEADER_CLASS), Some("postgres.sqlstate.22001"));
        assert_eq!(get(HEADER_TABLE), Some("public.orders"));
        assert_eq!(get(HEADER_COLUMN), Some("name"));
        assert_eq!(get(HEADER_REASON), Some("permanent: value too long"));
    }
}
