//! Change events to Confluent-framed Avro records.
//!
//! [`EventEncoder::prepare`] does everything that may wait or fail for
//! reasons other than a value: building the schemas, checking compatibility
//! locally and with the registry, registering. [`EventEncoder::encode`] is
//! then synchronous and writes the Avro datum directly from the model's
//! values, following the schema `crate::avro` generated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::avro::{envelope, EnvelopeOptions, EnvelopeSchemas};
use crate::binary::{write_bool, write_bytes, write_double, write_float, write_header, write_int, write_long};
use crate::compat;
use crate::decimal;
use crate::decoder::CompiledEnvelope;
use crate::error::SchemaError;
use crate::hashing::FxHashMap;
use crate::model::{ChangeEvent, Column, DataType, Op, Row, TableSchema, Value};
use crate::registry::Registry;
use crate::temporal;

type Result<T> = std::result::Result<T, SchemaError>;

/// Compatibility level set on the subjects we create.
pub const COMPATIBILITY_LEVEL: &str = "BACKWARD";

/// One Kafka record: key and value in the Confluent wire format. `None` is
/// a null key or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    /// The key (null for truncates and key-less tables).
    pub key: Option<Vec<u8>>,
    /// The value (null for a tombstone).
    pub value: Option<Vec<u8>>,
}

/// What [`EventEncoder::prepare`] settled for one topic.
#[derive(Debug)]
struct Prepared {
    table: Arc<TableSchema>,
    key_indexes: Vec<usize>,
    key_id: Option<u32>,
    value_id: u32,
    schemas: EnvelopeSchemas,
    /// Size of the last value, to allocate once per record.
    size_hint: AtomicUsize,
}

/// Encodes change events of any number of tables, each on its own topic.
#[derive(Debug)]
pub struct EventEncoder {
    registry: Registry,
    options: EnvelopeOptions,
    topics: FxHashMap<String, Prepared>,
}

/// The source's version string in `source.version`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

impl EventEncoder {
    /// An encoder registering schemas in `registry`.
    pub fn new(registry: Registry, options: EnvelopeOptions) -> Self {
        Self { registry, options, topics: FxHashMap::default() }
    }

    /// The envelope options.
    pub fn options(&self) -> &EnvelopeOptions {
        &self.options
    }

    /// The schemas prepared for a topic, with their registry ids (key id,
    /// value id).
    pub fn prepared(&self, topic: &str) -> Option<(&EnvelopeSchemas, Option<u32>, u32)> {
        self.topics.get(topic).map(|p| (&p.schemas, p.key_id, p.value_id))
    }

    /// Makes `topic` ready for events of `table`: builds the key and value
    /// schemas, checks that they can follow the subject's previous version
    /// (locally and with the registry, BACKWARD), registers them as
    /// `<topic>-key` / `<topic>-value`, and sets a new subject's
    /// compatibility to BACKWARD.
    ///
    /// An incompatible change is [`SchemaError::Incompatible`] naming the
    /// table and the columns; nothing is registered then.
    pub async fn prepare(&mut self, table: &Arc<TableSchema>, topic: &str) -> Result<()> {
        if let Some(p) = self.topics.get_mut(topic) {
            if Arc::ptr_eq(&p.table, table) || *p.table == **table {
                p.table = table.clone();
                return Ok(());
            }
        }
        let schemas = envelope(table, topic, &self.options)?;
        let key_subject = format!("{topic}-key");
        let value_subject = format!("{topic}-value");
        let new_key_columns: Vec<Column> = table.key_indexes().into_iter().map(|i| table.columns[i].clone()).collect();

        // The previous shape: ours if this process prepared the topic,
        // else the registry's latest version (after a restart).
        // `fresh`: the registry was just asked for the subjects' latest
        // versions, so `*_is_new` says that they have none.
        let (previous, value_is_new, key_is_new, fresh) = match self.topics.get(topic) {
            Some(p) => {
                let key_cols = p.key_indexes.iter().map(|&i| p.table.columns[i].clone()).collect::<Vec<_>>();
                (Some((p.table.columns.clone(), key_cols)), false, p.key_id.is_none(), false)
            }
            None => {
                // The registry's round trips for one new topic are two
                // independent chains, key and value, each run at once: a
                // source of many tables registers them one after the other
                // at its start, at 10-35 ms a request (Apicurio, here).
                let (latest_value, latest_key) =
                    tokio::try_join!(self.registry.latest(&value_subject), self.registry.latest(&key_subject))?;
                let previous = match &latest_value {
                    Some((_, text)) => {
                        let plan = CompiledEnvelope::new(topic, text, latest_key.as_ref().map(|(_, t)| &**t))?;
                        let key_cols = plan
                            .key()
                            .iter()
                            .filter_map(|k| plan.columns().iter().find(|c| &c.name == k).cloned())
                            .collect::<Vec<_>>();
                        Some((plan.columns().to_vec(), key_cols))
                    }
                    None => None,
                };
                (previous, latest_value.is_none(), latest_key.is_none(), true)
            }
        };

        if let Some((old_columns, old_key)) = &previous {
            let mut violations = compat::check(old_columns, &table.columns);
            if schemas.key.is_some() && !old_key.is_empty() {
                for v in compat::check(old_key, &new_key_columns) {
                    if !violations.iter().any(|x| x.column == v.column) {
                        violations.push(compat::Violation {
                            column: v.column,
                            reason: format!("in the key: {}", v.reason),
                        });
                    }
                }
            }
            if !violations.is_empty() {
                return Err(SchemaError::Incompatible {
                    table: table.id.clone(),
                    columns: violations.iter().map(|v| v.column.as_str()).collect::<Vec<_>>().join(", "),
                    reason: violations
                        .iter()
                        .map(|v| format!("{}: {}", v.column, v.reason))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
        }

        // The registry has the last word (another writer may have
        // registered a version we do not know). A subject that had no
        // version a moment ago has nothing to be compatible with (the
        // registry answers 404, taken as compatible); if another writer
        // registers one meanwhile, the registry checks ours against it when
        // we register.
        let value_check = async {
            if fresh && value_is_new {
                return None;
            }
            Some(self.registry.compatibility(&value_subject, &schemas.value).await)
        };
        let key_check = async {
            match &schemas.key {
                Some(key) if !(fresh && key_is_new) => Some(self.registry.compatibility(&key_subject, key).await),
                _ => None,
            }
        };
        let (value_answer, key_answer) = tokio::join!(value_check, key_check);
        let checks = [
            (value_answer, &value_subject, &table.columns, "value"),
            (key_answer, &key_subject, &new_key_columns, "key"),
        ];
        for (answer, subject, columns, which) in checks {
            let Some(answer) = answer else { continue };
            let (ok, messages) = answer?;
            if !ok {
                let changed = match &previous {
                    Some((old, old_key)) => {
                        let old = if which == "key" { old_key } else { old };
                        compat::changed_columns(old, columns)
                    }
                    None => Vec::new(),
                };
                let columns = if changed.is_empty() {
                    "(unknown)".to_string()
                } else {
                    changed.join(", ")
                };
                return Err(SchemaError::Incompatible {
                    table: table.id.clone(),
                    columns,
                    reason: format!(
                        "the schema registry refuses the new {which} schema of subject {subject}: {}",
                        messages.join("; ")
                    ),
                });
            }
        }

        // The level is set before the first version so that no version is
        // ever registered under the registry's global default.
        let value = async {
            if value_is_new {
                self.registry.set_compatibility(&value_subject, COMPATIBILITY_LEVEL).await?;
            }
            self.registry.register(&value_subject, &schemas.value).await
        };
        let key = async {
            match &schemas.key {
                Some(key) => {
                    if key_is_new {
                        self.registry.set_compatibility(&key_subject, COMPATIBILITY_LEVEL).await?;
                    }
                    Ok(Some(self.registry.register(&key_subject, key).await?))
                }
                None => Ok(None),
            }
        };
        let (value_id, key_id) = tokio::try_join!(value, key)?;
        self.topics.insert(
            topic.to_string(),
            Prepared {
                table: table.clone(),
                key_indexes: table.key_indexes(),
                key_id,
                value_id,
                schemas,
                size_hint: AtomicUsize::new(256),
            },
        );
        Ok(())
    }

    fn prepared_for(&self, event: &ChangeEvent, topic: &str) -> Result<&Prepared> {
        let p = self.topics.get(topic).ok_or_else(|| not_prepared(event, topic))?;
        if !Arc::ptr_eq(&p.table, &event.schema) && *p.table != *event.schema {
            return Err(not_prepared(event, topic));
        }
        Ok(p)
    }

    /// Encodes an event for `topic`, which must have been prepared with the
    /// event's table schema. For a delete, follow with
    /// [`EventEncoder::tombstone`].
    pub fn encode(&self, event: &ChangeEvent, topic: &str) -> Result<EncodedRecord> {
        let p = self.prepared_for(event, topic)?;
        let key = self.encode_key(p, event)?;
        let mut out = Vec::with_capacity(p.size_hint.load(Ordering::Relaxed) + 16);
        write_header(&mut out, p.value_id);
        self.write_envelope(&mut out, event)?;
        p.size_hint.store(out.len(), Ordering::Relaxed);
        Ok(EncodedRecord { key, value: Some(out) })
    }

    /// The tombstone that follows a delete (its key, a null value), or
    /// `None` for other operations or when tombstones are off.
    pub fn tombstone(&self, event: &ChangeEvent, topic: &str) -> Result<Option<EncodedRecord>> {
        if event.op != Op::Delete || !self.options.tombstones {
            return Ok(None);
        }
        let p = self.prepared_for(event, topic)?;
        Ok(self
            .encode_key(p, event)?
            .map(|key| EncodedRecord { key: Some(key), value: None }))
    }

    /// The encoded key of an event (`None` for truncates and key-less
    /// tables), as a tombstone or a compaction key needs it.
    pub fn tombstone_key(&self, event: &ChangeEvent, topic: &str) -> Result<Option<Vec<u8>>> {
        let p = self.prepared_for(event, topic)?;
        self.encode_key(p, event)
    }

    fn encode_key(&self, p: &Prepared, event: &ChangeEvent) -> Result<Option<Vec<u8>>> {
        let (Some(key_id), Some(row)) = (p.key_id, event.key_row()) else {
            return Ok(None);
        };
        let table = &event.schema;
        check_row_len(table, row)?;
        let mut out = Vec::with_capacity(32);
        write_header(&mut out, key_id);
        for &i in &p.key_indexes {
            write_column(&mut out, table, &table.columns[i], &row[i])?;
        }
        Ok(Some(out))
    }

    fn write_envelope(&self, out: &mut Vec<u8>, event: &ChangeEvent) -> Result<()> {
        let table = &event.schema;
        for row in [&event.before, &event.after] {
            match row {
                None => write_long(out, 0),
                Some(row) => {
                    write_long(out, 1);
                    write_row(out, table, row)?;
                }
            }
        }
        let s = &event.source;
        write_bytes(out, VERSION.as_bytes());
        write_bytes(out, s.connector.as_bytes());
        write_bytes(out, s.name.as_bytes());
        write_long(out, s.ts_ms);
        write_bytes(out, s.snapshot.as_str().as_bytes());
        write_bytes(out, s.db.as_bytes());
        write_bytes(out, table.id.schema.as_bytes());
        write_bytes(out, table.id.table.as_bytes());
        match &s.tx_id {
            None => write_long(out, 0),
            Some(tx) => {
                write_long(out, 1);
                write_bytes(out, tx.as_bytes());
            }
        }
        if self.options.has_lsn() {
            match parse_pg_lsn(&s.native_position) {
                None => write_long(out, 0),
                Some(lsn) => {
                    write_long(out, 1);
                    write_long(out, lsn as i64);
                }
            }
        }
        // Avro has no unsigned long: positions travel bit-cast.
        write_long(out, s.position.commit as i64);
        write_long(out, s.position.index as i64);
        write_bytes(out, s.native_position.as_bytes());
        write_bytes(out, event.op.code().as_bytes());
        write_long(out, 1);
        write_long(out, event.ts_ms);
        match &event.transaction {
            None => write_long(out, 0),
            Some(tx) => {
                write_long(out, 1);
                write_bytes(out, tx.id.as_bytes());
                write_long(out, tx.total_order);
                write_long(out, tx.data_collection_order);
            }
        }
        Ok(())
    }
}

fn not_prepared(event: &ChangeEvent, topic: &str) -> SchemaError {
    SchemaError::Incompatible {
        table: event.schema.id.clone(),
        columns: String::new(),
        reason: format!("topic {topic} was not prepared for this table schema (call prepare first)"),
    }
}

/// A PostgreSQL LSN in its text form `16/B374D848`.
fn parse_pg_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

fn check_row_len(table: &TableSchema, row: &Row) -> Result<()> {
    if row.len() != table.columns.len() {
        return Err(SchemaError::Value {
            table: table.id.clone(),
            column: String::new(),
            value_kind: "row",
            data_type: format!("row of {} columns", table.columns.len()),
            reason: format!("the row has {} values", row.len()),
        });
    }
    Ok(())
}

fn write_row(out: &mut Vec<u8>, table: &TableSchema, row: &Row) -> Result<()> {
    check_row_len(table, row)?;
    for (col, v) in table.columns.iter().zip(row) {
        write_column(out, table, col, v)?;
    }
    Ok(())
}

#[inline]
fn write_column(out: &mut Vec<u8>, table: &TableSchema, col: &Column, v: &Value) -> Result<()> {
    let r = match v {
        Value::Null if col.nullable => {
            write_long(out, 0);
            Ok(())
        }
        Value::Null => Err("NULL in a NOT NULL column"),
        _ => {
            if col.nullable {
                write_long(out, 1);
            }
            write_typed(out, &col.data_type, v)
        }
    };
    r.map_err(|reason| SchemaError::Value {
        table: table.id.clone(),
        column: col.name.clone(),
        value_kind: v.kind(),
        data_type: col.data_type.to_string(),
        reason: reason.to_string(),
    })
}

/// Writes `bytes` produced by `fill` with their length prefix in front,
/// without a scratch buffer: one byte is reserved for the length, enough
/// for up to 63 bytes (every decimal of up to 151 digits); longer ones move
/// into place once.
#[inline]
fn write_len_prefixed(
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut Vec<u8>) -> std::result::Result<(), decimal::Reason>,
) -> std::result::Result<(), decimal::Reason> {
    let at = out.len();
    out.push(0);
    fill(out)?;
    let len = out.len() - at - 1;
    if len < 64 {
        out[at] = (len as u8) << 1;
    } else {
        let mut prefix = Vec::with_capacity(10);
        write_long(&mut prefix, len as i64);
        out.splice(at..at + 1, prefix);
    }
    Ok(())
}

fn write_typed(out: &mut Vec<u8>, dt: &DataType, v: &Value) -> std::result::Result<(), &'static str> {
    match (dt, v) {
        (DataType::Boolean, Value::Boolean(b)) => write_bool(out, *b),
        (DataType::Int16, Value::Int16(x)) => write_int(out, i32::from(*x)),
        (DataType::Int32, Value::Int32(x)) => write_int(out, *x),
        (DataType::Int64, Value::Int64(x)) => write_long(out, *x),
        (DataType::Float32, Value::Float32(x)) => write_float(out, *x),
        (DataType::Float64, Value::Float64(x)) => write_double(out, *x),
        (DataType::Decimal { precision, scale }, Value::Decimal(text)) => {
            write_len_prefixed(out, |o| decimal::encode_fixed(o, text, *precision, *scale))?
        }
        (DataType::VariableDecimal, Value::Decimal(text)) => {
            // The scale comes first in the record: count the fraction digits
            // before encoding.
            let scale = text.split_once('.').map_or(0, |(_, f)| f.len());
            let scale = i32::try_from(scale).map_err(|_| "scale too large")?;
            write_int(out, scale);
            write_len_prefixed(out, |o| decimal::encode_variable(o, text).map(|_| ()))?
        }
        (DataType::Text, Value::Text(s)) => write_bytes(out, s.as_bytes()),
        (DataType::Json, Value::Json(s)) => write_bytes(out, s.as_bytes()),
        (DataType::Uuid, Value::Uuid(u)) => {
            let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
            write_bytes(out, u.hyphenated().encode_lower(&mut buf).as_bytes());
        }
        (DataType::Bytes, Value::Bytes(b)) => write_bytes(out, b),
        (DataType::Date, Value::Date(d)) => write_int(out, *d),
        (DataType::Time, Value::Time(t)) => write_long(out, *t),
        (DataType::Timestamp, Value::Timestamp(t)) => write_long(out, *t),
        (DataType::TimestampTz, Value::TimestampTz(t)) => write_long(out, *t),
        (DataType::Interval, Value::Interval { months, days, micros }) => {
            write_bytes(out, temporal::interval_to_iso(*months, *days, *micros).as_bytes())
        }
        (DataType::Enum { symbols }, Value::Enum(label)) => {
            if !symbols.iter().any(|s| s == label) {
                return Err("label is not one of the column's enum labels");
            }
            write_bytes(out, label.as_bytes());
        }
        (DataType::Array(inner), Value::Array(items)) => {
            if !items.is_empty() {
                write_long(out, items.len() as i64);
                for item in items {
                    match item {
                        Value::Null => write_long(out, 0),
                        _ => {
                            write_long(out, 1);
                            write_typed(out, inner, item)?;
                        }
                    }
                }
            }
            write_long(out, 0);
        }
        (DataType::Geometry, Value::Geometry(wkb)) => {
            write_bytes(out, wkb);
            write_long(out, 0);
        }
        (_, Value::Unchanged) => return Err("an unchanged (TOAST) value was not resolved by the source"),
        _ => return Err("the value's kind does not match the column's type"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_lsn_parses() {
        assert_eq!(parse_pg_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_pg_lsn("0/0"), Some(0));
        assert_eq!(parse_pg_lsn("mysql-bin.000003:154"), None);
    }

    #[test]
    fn long_prefixed_bytes_move_into_place() {
        let mut out = vec![7u8];
        write_len_prefixed(&mut out, |o| {
            o.extend(std::iter::repeat_n(1u8, 200));
            Ok(())
        })
        .expect("fill");
        let mut r = crate::binary::Reader::new(&out[1..]);
        assert_eq!(r.bytes().map(<[u8]>::len), Ok(200));
        assert!(r.at_end());
    }
}
