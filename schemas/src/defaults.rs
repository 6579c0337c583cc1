//! Column defaults as Avro JSON default values.
//!
//! A column added to a table that already has rows gives those rows a value
//! (PostgreSQL's `ADD COLUMN ... DEFAULT 7`, MySQL's implicit `0` of a new
//! `NOT NULL` column). The source puts that value into the column's Avro
//! field, so that the new schema stays BACKWARD compatible (a reader of old
//! events fills the field with it) and a sink can give the rows it already
//! holds the same value. It travels as the Avro JSON encoding of the field's
//! type (`docs/schema-changes.md`), the form the Avro specification gives
//! field defaults.
//!
//! Types without a faithful JSON form here (intervals, arrays, geometry,
//! non-finite floats) carry no default: the column then behaves as one
//! without a default (see `docs/schema-changes.md`).

use serde_json::{json, Value as Json};

use crate::decimal;
use crate::model::{DataType, Value};

/// The Avro JSON default of `value` for a column of type `data_type`, or
/// `None` when it has none (NULL, or a type without a JSON form here).
pub fn to_avro_json(data_type: &DataType, value: &Value) -> Option<Json> {
    Some(match (data_type, value) {
        (DataType::Boolean, Value::Boolean(b)) => json!(b),
        (DataType::Int16, Value::Int16(v)) => json!(v),
        (DataType::Int32, Value::Int32(v)) => json!(v),
        (DataType::Int64, Value::Int64(v)) => json!(v),
        (DataType::Float32, Value::Float32(v)) if v.is_finite() => json!(f64::from(*v)),
        (DataType::Float64, Value::Float64(v)) if v.is_finite() => json!(v),
        (DataType::Decimal { precision, scale }, Value::Decimal(text)) => {
            let mut out = Vec::new();
            decimal::encode_fixed(&mut out, text, *precision, *scale).ok()?;
            Json::String(bytes_to_json(&out))
        }
        (DataType::VariableDecimal, Value::Decimal(text)) => {
            let mut out = Vec::new();
            let scale = decimal::encode_variable(&mut out, text).ok()?;
            json!({"scale": scale, "value": bytes_to_json(&out)})
        }
        (DataType::Text, Value::Text(s)) | (DataType::Json, Value::Json(s)) => json!(s),
        (DataType::Enum { symbols }, Value::Enum(s)) if symbols.contains(s) => json!(s),
        (DataType::Uuid, Value::Uuid(u)) => json!(u.hyphenated().to_string()),
        (DataType::Bytes | DataType::Bits { .. }, Value::Bytes(b)) => Json::String(bytes_to_json(b)),
        (DataType::Date, Value::Date(d)) => json!(d),
        (DataType::Time | DataType::TimeSpan, Value::Time(t)) | (DataType::Timestamp, Value::Timestamp(t)) => {
            json!(t)
        }
        (DataType::TimestampTz, Value::TimestampTz(t)) => json!(t),
        _ => return None,
    })
}

/// The value of an Avro JSON default for a column of type `data_type`
/// (the inverse of [`to_avro_json`]); `None` when it does not read as one.
pub fn from_avro_json(data_type: &DataType, json: &Json) -> Option<Value> {
    Some(match data_type {
        DataType::Boolean => Value::Boolean(json.as_bool()?),
        DataType::Int16 => Value::Int16(i16::try_from(json.as_i64()?).ok()?),
        DataType::Int32 => Value::Int32(i32::try_from(json.as_i64()?).ok()?),
        DataType::Int64 => Value::Int64(json.as_i64()?),
        // f64 -> f32 is exact for a value that came from an f32.
        #[allow(clippy::cast_possible_truncation)]
        DataType::Float32 => Value::Float32(json.as_f64()? as f32),
        DataType::Float64 => Value::Float64(json.as_f64()?),
        DataType::Decimal { scale, .. } => {
            let bytes = bytes_from_json(json.as_str()?)?;
            Value::Decimal(decimal::decode(&bytes, i32::try_from(*scale).ok()?).ok()?)
        }
        DataType::VariableDecimal => {
            let scale = i32::try_from(json.get("scale")?.as_i64()?).ok()?;
            let bytes = bytes_from_json(json.get("value")?.as_str()?)?;
            Value::Decimal(decimal::decode(&bytes, scale).ok()?)
        }
        DataType::Text => Value::Text(json.as_str()?.to_string()),
        DataType::Json => Value::Json(json.as_str()?.to_string()),
        DataType::Enum { symbols } => {
            let s = json.as_str()?;
            if !symbols.iter().any(|x| x == s) {
                return None;
            }
            Value::Enum(s.to_string())
        }
        DataType::Uuid => Value::Uuid(uuid::Uuid::parse_str(json.as_str()?).ok()?),
        DataType::Bytes | DataType::Bits { .. } => Value::Bytes(bytes_from_json(json.as_str()?)?),
        DataType::Date => Value::Date(i32::try_from(json.as_i64()?).ok()?),
        DataType::Time | DataType::TimeSpan => Value::Time(json.as_i64()?),
        DataType::Timestamp => Value::Timestamp(json.as_i64()?),
        DataType::TimestampTz => Value::TimestampTz(json.as_i64()?),
        DataType::Interval | DataType::Array(_) | DataType::Geometry => return None,
    })
}

/// Whether an Avro JSON default written for a column of type `from` reads
/// as the same value for a column of type `to` (the widenings a schema may
/// keep, see `crate::compat::widens`).
pub fn carries_over(from: &DataType, to: &DataType, json: &Json) -> bool {
    // A decimal's bytes are its unscaled value: only the same scale reads the same.
    let same_meaning =
        !matches!((from, to), (DataType::Decimal { scale: a, .. }, DataType::Decimal { scale: b, .. }) if a != b);
    same_meaning && from_avro_json(to, json).is_some()
}

/// Avro's JSON form of bytes: one character per byte, U+0000 to U+00FF.
fn bytes_to_json(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn bytes_from_json(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_carried_type_round_trips() {
        let cases = [
            (DataType::Boolean, Value::Boolean(true)),
            (DataType::Int16, Value::Int16(-3)),
            (DataType::Int32, Value::Int32(7)),
            (DataType::Int64, Value::Int64(i64::MAX)),
            (DataType::Float32, Value::Float32(1.5)),
            (DataType::Float64, Value::Float64(-0.25)),
            (DataType::Decimal { precision: 12, scale: 2 }, Value::Decimal("-1234.50".into())),
            (DataType::VariableDecimal, Value::Decimal("3.14159".into())),
            (DataType::Text, Value::Text("x 'y' ü".into())),
            (DataType::Json, Value::Json("{\"a\":1}".into())),
            (DataType::Enum { symbols: vec!["a".into(), "b".into()] }, Value::Enum("b".into())),
            (DataType::Uuid, Value::Uuid(uuid::Uuid::from_u128(42))),
            (DataType::Bytes, Value::Bytes(vec![0, 1, 200, 255])),
            (DataType::Date, Value::Date(-1)),
            (DataType::Time, Value::Time(3_600_000_000)),
            (DataType::Timestamp, Value::Timestamp(1)),
            (DataType::TimestampTz, Value::TimestampTz(-1)),
        ];
        for (dt, v) in cases {
            let j = to_avro_json(&dt, &v).unwrap_or_else(|| panic!("{dt} has a default"));
            assert_eq!(from_avro_json(&dt, &j), Some(v), "{dt}: {j}");
        }
    }

    #[test]
    fn values_without_a_json_form_carry_none() {
        assert_eq!(to_avro_json(&DataType::Float64, &Value::Float64(f64::NAN)), None);
        assert_eq!(to_avro_json(&DataType::Int32, &Value::Null), None);
        assert_eq!(to_avro_json(&DataType::Interval, &Value::Interval { months: 1, days: 0, micros: 0 }), None);
        assert_eq!(to_avro_json(&DataType::Int32, &Value::Text("7".into())), None);
        assert_eq!(from_avro_json(&DataType::Int16, &json!(70000)), None);
    }

    #[test]
    fn widened_columns_keep_their_default() {
        let j = json!(7);
        assert!(carries_over(&DataType::Int32, &DataType::Int64, &j));
        let d = to_avro_json(&DataType::Decimal { precision: 8, scale: 2 }, &Value::Decimal("1.50".into())).unwrap();
        assert!(carries_over(
            &DataType::Decimal { precision: 8, scale: 2 },
            &DataType::Decimal { precision: 12, scale: 2 },
            &d
        ));
        assert!(!carries_over(
            &DataType::Decimal { precision: 8, scale: 2 },
            &DataType::Decimal { precision: 12, scale: 3 },
            &d
        ));
    }
}
