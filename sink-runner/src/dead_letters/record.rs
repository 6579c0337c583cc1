//! A dead-letter record: the original key, value and headers of a record
//! the sink cannot apply, plus error headers compatible with Kafka
//! Connect's (`errors.deadletterqueue.context.headers.enable`), so the
//! tools operators already use to inspect Connect's dead-letter topics work
//! here too. Written by the runner ([`headers`]), read back by `replay` and
//! by the next owner of a partition ([`origin`]).

use rdkafka::message::{Header, OwnedHeaders};
use tributary_connectors::{Error, KafkaPosition};

use crate::buffer::RawRecord;

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

/// Where a dead letter came from (its `__connect.errors.*` headers).
pub fn origin(dead_letter: &RawRecord) -> Option<KafkaPosition> {
    Some(KafkaPosition {
        topic: dead_letter.header(HEADER_TOPIC)?,
        partition: dead_letter.header(HEADER_PARTITION)?.parse().ok()?,
        offset: dead_letter.header(HEADER_OFFSET)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;
    use tributary_schemas::TableId;

    use super::*;

    #[test]
    fn headers_keep_the_original_and_add_connect_error_headers_that_name_the_origin() {
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
        let all: Vec<(String, Option<Vec<u8>>)> =
            h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect();
        let text: Vec<(String, String)> = all
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned()))
            .collect();
        let get = |k: &str| text.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("trace"), Some("x"));
        assert_eq!(get(HEADER_TOPIC), Some("shop.public.orders"));
        assert_eq!(get(HEADER_PARTITION), Some("2"));
        assert_eq!(get(HEADER_OFFSET), Some("41"));
        assert_eq!(text.iter().filter(|(k, _)| k == HEADER_OFFSET).count(), 1);
        assert_eq!(get(HEADER_STAGE), Some("TASK_PUT"));
        assert_eq!(get(HEADER_CLASS), Some("postgres.sqlstate.22001"));
        assert_eq!(get(HEADER_TABLE), Some("public.orders"));
        assert_eq!(get(HEADER_COLUMN), Some("name"));
        assert_eq!(get(HEADER_REASON), Some("permanent: value too long"));
        // Read back as the next owner and `replay` read it.
        let dead_letter = RawRecord {
            topic: "shop.public.orders.dlq".into(),
            partition: 0,
            offset: 3,
            key: None,
            value: Some(vec![1]),
            headers: all,
        };
        assert_eq!(
            origin(&dead_letter),
            Some(KafkaPosition {
                topic: "shop.public.orders".into(),
                partition: 2,
                offset: 41
            })
        );
    }
}
