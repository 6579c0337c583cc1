//! The transaction topic of a copy, `<prefix>.transaction`, as Debezium's
//! (`provide.transaction.metadata`): a BEGIN record before a source
//! transaction's first change and an END record after its last, with how
//! many changes it made in all and per table, each keyed by the
//! transaction's id, in the same Kafka transaction as the changes. Avro in
//! the Confluent wire format, under Debezium's schemas
//! (`io.debezium.connector.common.TransactionMetadataKey` / `...Value`), so
//! that a Debezium user's consumer reads it unchanged.

use apache_avro::types::Value as Avro;
use apache_avro::Schema;

use super::RecordError;
use crate::binary::{split_header, write_header};

/// The copy's transaction topic.
pub fn topic(prefix: &str) -> String {
    format!("{prefix}.transaction")
}

/// The key's Avro schema.
pub const KEY_SCHEMA: &str = r#"{"type":"record","name":"TransactionMetadataKey","namespace":"io.debezium.connector.common","fields":[{"name":"id","type":"string"}]}"#;

/// The value's Avro schema.
pub const VALUE_SCHEMA: &str = r#"{"type":"record","name":"TransactionMetadataValue","namespace":"io.debezium.connector.common","fields":[{"name":"status","type":"string"},{"name":"id","type":"string"},{"name":"event_count","type":["null","long"],"default":null},{"name":"data_collections","type":["null",{"type":"array","items":{"type":"record","name":"ConnectDefault","namespace":"io.confluent.connect.avro","fields":[{"name":"data_collection","type":"string"},{"name":"event_count","type":"long"}]}}],"default":null},{"name":"ts_ms","type":"long"}]}"#;

/// One record of the transaction topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionRecord {
    /// Before the transaction's first change.
    Begin {
        /// The source's transaction id (the changes' `transaction.id`).
        id: String,
        /// The transaction's commit time at the source, in milliseconds.
        ts_ms: i64,
    },
    /// After its last change.
    End {
        /// The source's transaction id.
        id: String,
        /// The transaction's commit time at the source, in milliseconds.
        ts_ms: i64,
        /// Per table (`schema.table`, as Debezium's `data_collection`), the
        /// changes it made, in the order the tables were first changed.
        data_collections: Vec<(String, i64)>,
    },
}

fn schema(text: &str) -> Schema {
    // Constant texts, parsed in the tests.
    Schema::parse_str(text).unwrap_or(Schema::Null)
}

/// The key's and the value's schemas, parsed once: parsing took most of
/// a transactional sink's CPU per transaction (a record is decoded twice,
/// `bench/run --consistency`).
fn key_schema() -> &'static Schema {
    static KEY: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    KEY.get_or_init(|| schema(KEY_SCHEMA))
}

fn value_schema() -> &'static Schema {
    static VALUE: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    VALUE.get_or_init(|| schema(VALUE_SCHEMA))
}

fn unreadable(reason: impl Into<String>) -> RecordError {
    RecordError::Unreadable {
        what: "a transaction record".into(),
        reason: reason.into(),
    }
}

impl TransactionRecord {
    /// The transaction's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Begin { id, .. } | Self::End { id, .. } => id,
        }
    }

    /// The key in the wire format, under the registry's id `key_id` of
    /// [`KEY_SCHEMA`].
    pub fn encode_key(&self, key_id: u32) -> Result<Vec<u8>, RecordError> {
        let datum = Avro::Record(vec![("id".into(), Avro::String(self.id().to_string()))]);
        framed(key_id, key_schema(), datum)
    }

    /// The value in the wire format, under the registry's id `value_id`
    /// of [`VALUE_SCHEMA`].
    pub fn encode_value(&self, value_id: u32) -> Result<Vec<u8>, RecordError> {
        let (status, id, ts_ms, end) = match self {
            Self::Begin { id, ts_ms } => ("BEGIN", id, *ts_ms, None),
            Self::End { id, ts_ms, data_collections } => ("END", id, *ts_ms, Some(data_collections)),
        };
        let union = |v: Option<Avro>| match v {
            None => Avro::Union(0, Box::new(Avro::Null)),
            Some(v) => Avro::Union(1, Box::new(v)),
        };
        let count = end.map(|d| Avro::Long(d.iter().map(|(_, n)| n).sum()));
        let collections = end.map(|d| {
            Avro::Array(
                d.iter()
                    .map(|(table, n)| {
                        Avro::Record(vec![
                            ("data_collection".into(), Avro::String(table.clone())),
                            ("event_count".into(), Avro::Long(*n)),
                        ])
                    })
                    .collect(),
            )
        });
        let datum = Avro::Record(vec![
            ("status".into(), Avro::String(status.into())),
            ("id".into(), Avro::String(id.clone())),
            ("event_count".into(), union(count)),
            ("data_collections".into(), union(collections)),
            ("ts_ms".into(), Avro::Long(ts_ms)),
        ]);
        framed(value_id, value_schema(), datum)
    }

    /// A record's value in the wire format (its schema [`VALUE_SCHEMA`]).
    pub fn decode_value(bytes: &[u8]) -> Result<Self, RecordError> {
        let (_, mut datum) = split_header(bytes).ok_or_else(|| unreadable("no wire-format header"))?;
        let value = apache_avro::reader::datum::GenericDatumReader::builder(value_schema())
            .build()
            .and_then(|r| r.read_value(&mut datum))
            .map_err(|e| unreadable(e.to_string()))?;
        let Avro::Record(fields) = value else {
            return Err(unreadable("not a record"));
        };
        let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let text = |name: &str| match field(name) {
            Some(Avro::String(s)) => Ok(s.clone()),
            _ => Err(unreadable(format!("no {name}"))),
        };
        let (status, id) = (text("status")?, text("id")?);
        let ts_ms = match field("ts_ms") {
            Some(Avro::Long(t)) => *t,
            _ => return Err(unreadable("no ts_ms")),
        };
        match status.as_str() {
            "BEGIN" => Ok(Self::Begin { id, ts_ms }),
            "END" => {
                let Some(Avro::Union(1, items)) = field("data_collections") else {
                    return Err(unreadable("an END without data_collections"));
                };
                let Avro::Array(items) = items.as_ref() else {
                    return Err(unreadable("data_collections is not an array"));
                };
                let data_collections = items
                    .iter()
                    .map(|item| match item {
                        Avro::Record(f) => match (f.first().map(|x| &x.1), f.get(1).map(|x| &x.1)) {
                            (Some(Avro::String(t)), Some(Avro::Long(n))) => Ok((t.clone(), *n)),
                            _ => Err(unreadable("a data collection without its name and count")),
                        },
                        _ => Err(unreadable("a data collection is not a record")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Self::End { id, ts_ms, data_collections })
            }
            other => Err(unreadable(format!("status {other:?}"))),
        }
    }
}

fn framed(schema_id: u32, schema: &Schema, datum: Avro) -> Result<Vec<u8>, RecordError> {
    let body = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(datum))
        .map_err(|e| unreadable(e.to_string()))?;
    let mut out = Vec::with_capacity(body.len() + 5);
    write_header(&mut out, schema_id);
    out.extend(body);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schemas_parse() {
        assert!(Schema::parse_str(KEY_SCHEMA).is_ok());
        assert!(Schema::parse_str(VALUE_SCHEMA).is_ok());
    }

    /// Golden bytes: Debezium's record layout, in the wire format.
    #[test]
    fn begin_and_end_round_trip_in_the_wire_format() {
        let begin = TransactionRecord::Begin { id: "571".into(), ts_ms: 1_700_000_000_000 };
        let end = TransactionRecord::End {
            id: "571".into(),
            ts_ms: 1_700_000_000_000,
            data_collections: vec![("public.orders".into(), 1), ("public.lines".into(), 3)],
        };
        let key = begin.encode_key(7).expect("key");
        assert_eq!(key, [0, 0, 0, 0, 7, 6, b'5', b'7', b'1']);
        let value = begin.encode_value(8).expect("value");
        // status "BEGIN", id "571", event_count null, data_collections
        // null, ts_ms.
        assert_eq!(&value[..5], &[0, 0, 0, 0, 8]);
        assert_eq!(&value[5..17], &[10, b'B', b'E', b'G', b'I', b'N', 6, b'5', b'7', b'1', 0, 0]);
        for record in [begin, end] {
            let bytes = record.encode_value(8).expect("value");
            assert_eq!(TransactionRecord::decode_value(&bytes).expect("decoded"), record);
        }
        let end = TransactionRecord::decode_value(
            &TransactionRecord::End {
                id: "x".into(),
                ts_ms: 1,
                data_collections: vec![("a.b".into(), 2), ("c.d".into(), 5)],
            }
            .encode_value(1)
            .expect("value"),
        )
        .expect("decoded");
        assert!(matches!(end, TransactionRecord::End { ref data_collections, .. } if data_collections.len() == 2));
        assert!(TransactionRecord::decode_value(&[0, 0, 0, 0, 1, 99]).is_err());
    }
}
