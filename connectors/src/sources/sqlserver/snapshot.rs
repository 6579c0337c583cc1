//! The consistent snapshot: every captured table read in key order, in
//! chunks, inside one SNAPSHOT-isolation transaction whose
//! `sys.fn_cdc_get_max_lsn()` is the LSN the stream starts after (Debezium's
//! `snapshot.isolation.mode = snapshot`). The checkpoint keeps per table the
//! last key emitted; a restarted snapshot opens a new transaction at a later
//! LSN, the stream first catches up to it (so no row goes out before a
//! change it already reflects), then the remaining keys are read.

use serde::{Deserialize, Serialize};
use tributary_schemas::{DataType, Value};

/// A key value in the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyValue {
    /// NULL (a key column of a unique index may be NULL once).
    Null,
    /// bit.
    Bool(bool),
    /// Any integer.
    Int(i64),
    /// Floating point.
    Float(f64),
    /// Decimal text.
    Decimal(String),
    /// Text.
    Text(String),
    /// uniqueidentifier.
    Uuid(uuid::Uuid),
    /// Binary.
    Bytes(Vec<u8>),
    /// Days since 1970.
    Date(i32),
    /// Microseconds (time, datetime, datetime2, datetimeoffset).
    Micros(i64),
}

impl KeyValue {
    /// From a key column's value.
    pub fn from_value(v: &Value) -> Self {
        match v {
            Value::Boolean(b) => KeyValue::Bool(*b),
            Value::Int16(i) => KeyValue::Int(i64::from(*i)),
            Value::Int32(i) => KeyValue::Int(i64::from(*i)),
            Value::Int64(i) => KeyValue::Int(*i),
            Value::Float32(f) => KeyValue::Float(f64::from(*f)),
            Value::Float64(f) => KeyValue::Float(*f),
            Value::Decimal(d) => KeyValue::Decimal(d.clone()),
            Value::Text(s) | Value::Json(s) | Value::Enum(s) => KeyValue::Text(s.clone()),
            Value::Uuid(u) => KeyValue::Uuid(*u),
            Value::Bytes(b) | Value::Geometry(b) => KeyValue::Bytes(b.clone()),
            Value::Date(d) => KeyValue::Date(*d),
            Value::Time(m) | Value::Timestamp(m) | Value::TimestampTz(m) => KeyValue::Micros(*m),
            _ => KeyValue::Null,
        }
    }

    /// Back to the value of a column of type `dt`.
    pub fn to_value(&self, dt: &DataType) -> Value {
        match (self, dt) {
            (KeyValue::Bool(b), _) => Value::Boolean(*b),
            (KeyValue::Int(i), DataType::Int16) => i16::try_from(*i).map_or(Value::Int64(*i), Value::Int16),
            (KeyValue::Int(i), DataType::Int32) => i32::try_from(*i).map_or(Value::Int64(*i), Value::Int32),
            (KeyValue::Int(i), _) => Value::Int64(*i),
            (KeyValue::Float(f), DataType::Float32) => Value::Float32(*f as f32),
            (KeyValue::Float(f), _) => Value::Float64(*f),
            (KeyValue::Decimal(d), _) => Value::Decimal(d.clone()),
            (KeyValue::Text(s), _) => Value::Text(s.clone()),
            (KeyValue::Uuid(u), _) => Value::Uuid(*u),
            (KeyValue::Bytes(b), _) => Value::Bytes(b.clone()),
            (KeyValue::Date(d), _) => Value::Date(*d),
            (KeyValue::Micros(m), DataType::Time) => Value::Time(*m),
            (KeyValue::Micros(m), DataType::TimestampTz) => Value::TimestampTz(*m),
            (KeyValue::Micros(m), _) => Value::Timestamp(*m),
            (KeyValue::Null, _) => Value::Null,
        }
    }
}

/// One table's snapshot progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TablePlan {
    /// `schema.table`.
    pub table: String,
    /// The key of the last row emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_key: Option<Vec<KeyValue>>,
    /// Every row emitted.
    #[serde(default)]
    pub done: bool,
}

/// The unfinished snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// No transaction opened yet: the first one fixes the tables, their
    /// capture instances and the stream's starting LSN.
    pub initial: bool,
    /// A copy asked for while streaming (`Source::resync`, or a table whose
    /// capture was enabled since), not the initial snapshot: its last row
    /// is not marked `last` (Debezium's marker ends the initial snapshot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mid_stream: bool,
    /// Tables in copy order.
    pub tables: Vec<TablePlan>,
}

impl SnapshotState {
    /// Plans `table` (`schema.table`) to be copied from its first key,
    /// whatever of it was copied before.
    pub fn copy_again(&mut self, table: &str) {
        match self.tables.iter_mut().find(|p| p.table == table) {
            Some(p) => {
                p.last_key = None;
                p.done = false;
            }
            None => self.tables.push(TablePlan {
                table: table.to_string(),
                last_key: None,
                done: false,
            }),
        }
    }

    /// The tables whose copy has not begun: no row of theirs emitted yet.
    /// The transaction that will copy them reads at an LSN at or above
    /// anything the stream reads before it, so the stream leaves their
    /// changes to the copy.
    pub fn not_begun(&self) -> impl Iterator<Item = &str> {
        self.tables
            .iter()
            .filter(|p| p.last_key.is_none() && !p.done)
            .map(|p| p.table.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_round_trip_through_the_checkpoint() {
        let cases = [
            (Value::Int32(7), DataType::Int32),
            (Value::Int16(-2), DataType::Int16),
            (Value::Text("k".into()), DataType::Text),
            (Value::Decimal("1.50".into()), DataType::Decimal { precision: 9, scale: 2 }),
            (Value::Timestamp(5), DataType::Timestamp),
            (Value::TimestampTz(5), DataType::TimestampTz),
            (Value::Bytes(vec![1, 2]), DataType::Bytes),
        ];
        for (v, dt) in cases {
            let json = serde_json::to_string(&KeyValue::from_value(&v)).expect("json");
            let back: KeyValue = serde_json::from_str(&json).expect("parses");
            assert_eq!(back.to_value(&dt), v, "{json}");
        }
    }
}
