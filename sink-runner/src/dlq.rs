//! Dead-letter records: the original key, value and headers of a record the
//! sink cannot apply, plus error headers compatible with Kafka Connect's
//! (`errors.deadletterqueue.context.headers.enable`), so the tools operators
//! already use to inspect Connect's dead-letter topics work here too.

use std::time::Duration;

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tributary_connectors::{Error, ErrorKind};

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

/// How long a dead-letter produce may take before the batch is retried.
pub const DLQ_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Produces dead-letter records and waits for each to be acknowledged.
pub struct DeadLetters {
    producer: FutureProducer,
    group: String,
}

impl DeadLetters {
    /// A producer with Kafka settings from `base` (idempotent, acks=all: a
    /// dead-lettered record must not be lost, it is the only copy that
    /// survives once the offsets move past it).
    pub fn new(base: &ClientConfig, group: &str) -> Result<Self, Error> {
        let mut c = base.clone();
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        c.set("linger.ms", "5");
        c.set("message.timeout.ms", DLQ_DELIVERY_TIMEOUT.as_millis().to_string());
        let producer: FutureProducer = c
            .create()
            .map_err(|e| Error::needs_operator(format!("cannot create the dead-letter producer: {e}")))?;
        Ok(Self { producer, group: group.to_string() })
    }

    /// Sends `record` to `topic` and waits for the acknowledgement.
    pub async fn send(&self, topic: &str, record: &RawRecord, failure: &Failure) -> Result<(), Error> {
        let mut r: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).headers(headers(record, failure, &self.group));
        if let Some(k) = &record.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &record.value {
            r = r.payload(v.as_slice());
        }
        match self.producer.send(r, DLQ_DELIVERY_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err((e, _)) => {
                let kind = match e.rdkafka_error_code() {
                    Some(rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed)
                    | Some(rdkafka::types::RDKafkaErrorCode::ClusterAuthorizationFailed) => ErrorKind::NeedsOperator,
                    _ => ErrorKind::Retryable,
                };
                Err(Error::new(kind, format!("cannot write to dead-letter topic {topic}: {e}"))
                    .with_class("kafka.produce")
                    .with_hint(format!("allow the sink to write {topic} (and create it, or enable auto-creation)")))
            }
        }
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
