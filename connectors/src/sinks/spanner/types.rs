//! Our logical types in Spanner (GoogleSQL dialect): the column type each
//! one gets, and how a value is encoded for a mutation (Spanner's protobuf
//! `Value`: INT64 and NUMERIC as decimal text, BYTES as base64, TIMESTAMP as
//! RFC 3339 in UTC). A value Spanner would refuse (a string over its cell
//! limit, a NUMERIC out of range, a date outside 0001..9999) is refused
//! here, naming its record, before anything is sent. See
//! `docs/type-mapping.md`. And the way back, for verification
//! ([`read_row`]): each cell read as the model's value.

use std::fmt;

use base64::Engine as _;
use prost_types::value::Kind;
use prost_types::ListValue;
use tributary_schemas::{DataType, TableSchema, Value};

use super::client::Raw;
use crate::error::{Error, Result as SinkResult};
use crate::sink::text::{parse_text, render_text};

/// NUMERIC holds 38 digits, at most 9 after the point (29 before it).
const NUMERIC_MAX_SCALE: u32 = 9;
const NUMERIC_MAX_INTEGER_DIGITS: u32 = 29;
/// A STRING(MAX) cell holds at most 2,621,440 Unicode characters.
pub const MAX_STRING_CHARS: usize = 2_621_440;
/// A BYTES(MAX) cell holds at most 10 MiB.
pub const MAX_BYTES: usize = 10 * 1024 * 1024;
/// Days from 1970-01-01 to 0001-01-01 and to 9999-12-31: Spanner's DATE and
/// TIMESTAMP range.
const MIN_DAYS: i64 = -719_162;
const MAX_DAYS: i64 = 2_932_896;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// A Spanner column type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SpType {
    /// BOOL.
    Bool,
    /// INT64.
    Int64,
    /// FLOAT64.
    Float64,
    /// NUMERIC (precision 38, scale 9).
    Numeric,
    /// STRING(MAX), or STRING(n) on a table made by hand.
    String(Option<u32>),
    /// JSON.
    Json,
    /// BYTES(MAX), or BYTES(n).
    Bytes(Option<u32>),
    /// DATE.
    Date,
    /// TIMESTAMP.
    Timestamp,
    /// ARRAY<T>.
    Array(Box<SpType>),
}

impl fmt::Display for SpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpType::Bool => f.write_str("BOOL"),
            SpType::Int64 => f.write_str("INT64"),
            SpType::Float64 => f.write_str("FLOAT64"),
            SpType::Numeric => f.write_str("NUMERIC"),
            SpType::String(None) => f.write_str("STRING(MAX)"),
            SpType::String(Some(n)) => write!(f, "STRING({n})"),
            SpType::Json => f.write_str("JSON"),
            SpType::Bytes(None) => f.write_str("BYTES(MAX)"),
            SpType::Bytes(Some(n)) => write!(f, "BYTES({n})"),
            SpType::Date => f.write_str("DATE"),
            SpType::Timestamp => f.write_str("TIMESTAMP"),
            SpType::Array(inner) => write!(f, "ARRAY<{inner}>"),
        }
    }
}

/// The Spanner type of a column.
pub fn spanner_type(data_type: &DataType) -> SpType {
    match data_type {
        DataType::Boolean => SpType::Bool,
        DataType::Int16 | DataType::Int32 | DataType::Int64 => SpType::Int64,
        DataType::Float32 | DataType::Float64 => SpType::Float64,
        DataType::Decimal { precision, scale } => {
            let integer = precision.saturating_sub(*scale);
            if *scale <= NUMERIC_MAX_SCALE && integer <= NUMERIC_MAX_INTEGER_DIGITS {
                SpType::Numeric
            } else {
                // Wider than NUMERIC: the exact text.
                SpType::String(None)
            }
        }
        // Any scale: NUMERIC keeps 9 digits after the point; a value with
        // more is refused (dead-lettered), never rounded.
        DataType::VariableDecimal => SpType::Numeric,
        // Spanner has no time type: a time of day, and MySQL's TIME
        // (-838:59:59 to 838:59:59), as their exact text.
        DataType::Text
        | DataType::Uuid
        | DataType::Enum { .. }
        | DataType::Interval
        | DataType::Time
        | DataType::TimeSpan => SpType::String(None),
        DataType::Json => SpType::Json,
        DataType::Bytes | DataType::Bits { .. } | DataType::Geometry => SpType::Bytes(None),
        DataType::Date => SpType::Date,
        // Spanner has no zoneless date-time: the wall clock is stored as if
        // it were UTC.
        DataType::Timestamp | DataType::TimestampTz => SpType::Timestamp,
        DataType::Array(inner) => match spanner_type(inner) {
            // No arrays of arrays (nor of JSON in every dialect): the array
            // as its text.
            SpType::Array(_) => SpType::String(None),
            t => SpType::Array(Box::new(t)),
        },
    }
}

/// Parses `INFORMATION_SCHEMA.COLUMNS.SPANNER_TYPE` (`STRING(MAX)`,
/// `ARRAY<INT64>`, ...).
pub fn from_spanner_type(text: &str) -> Option<SpType> {
    let t = text.trim();
    if let Some(inner) = t.strip_prefix("ARRAY<").and_then(|r| r.strip_suffix('>')) {
        return from_spanner_type(inner).map(|i| SpType::Array(Box::new(i)));
    }
    let length = |rest: &str| -> Option<Option<u32>> {
        let n = rest.strip_prefix('(')?.strip_suffix(')')?;
        if n.eq_ignore_ascii_case("MAX") {
            Some(None)
        } else {
            n.parse().ok().map(Some)
        }
    };
    Some(match t {
        "BOOL" => SpType::Bool,
        "INT64" => SpType::Int64,
        "FLOAT64" | "FLOAT32" => SpType::Float64,
        "NUMERIC" => SpType::Numeric,
        "JSON" => SpType::Json,
        "DATE" => SpType::Date,
        "TIMESTAMP" => SpType::Timestamp,
        _ if t.starts_with("STRING") => SpType::String(length(&t[6..])?),
        _ if t.starts_with("BYTES") => SpType::Bytes(length(&t[5..])?),
        _ => return None,
    })
}

/// `value` encoded for a column of type `ty`; the reason when Spanner would
/// refuse it (never the value itself).
pub fn encode(value: &Value, ty: &SpType) -> Result<Kind, String> {
    if matches!(value, Value::Null) {
        return Ok(Kind::NullValue(0));
    }
    if matches!(value, Value::SourceText { .. }) {
        return Err(crate::sink::text::NO_EXACT_FORM.into());
    }
    Ok(match ty {
        SpType::Bool => match value {
            Value::Boolean(b) => Kind::BoolValue(*b),
            other => return Err(mismatch(other, ty)),
        },
        SpType::Int64 => match value {
            Value::Int16(v) => Kind::StringValue(v.to_string()),
            Value::Int32(v) => Kind::StringValue(v.to_string()),
            Value::Int64(v) => Kind::StringValue(v.to_string()),
            other => return Err(mismatch(other, ty)),
        },
        SpType::Float64 => {
            let v = match value {
                Value::Float32(v) => f64::from(*v),
                Value::Float64(v) => *v,
                Value::Int16(v) => f64::from(*v),
                Value::Int32(v) => f64::from(*v),
                other => return Err(mismatch(other, ty)),
            };
            if v.is_nan() {
                Kind::StringValue("NaN".into())
            } else if v.is_infinite() {
                Kind::StringValue(if v > 0.0 { "Infinity" } else { "-Infinity" }.into())
            } else {
                Kind::NumberValue(v)
            }
        }
        SpType::Numeric => match value {
            Value::Decimal(s) => Kind::StringValue(numeric(s)?),
            Value::Int16(_) | Value::Int32(_) | Value::Int64(_) => Kind::StringValue(text(value)?),
            other => return Err(mismatch(other, ty)),
        },
        SpType::String(limit) => {
            let s = text(value)?;
            let chars = s.chars().count();
            let max = limit.map_or(MAX_STRING_CHARS, |n| n as usize);
            if chars > max {
                return Err(format!("{chars} characters, more than the column's {max}"));
            }
            Kind::StringValue(s)
        }
        SpType::Json => match value {
            Value::Json(s) | Value::Text(s) => {
                if serde_json::from_str::<serde_json::Value>(s).is_err() {
                    return Err("not a JSON document".into());
                }
                Kind::StringValue(s.clone())
            }
            other => return Err(mismatch(other, ty)),
        },
        SpType::Bytes(limit) => match value {
            Value::Bytes(b) | Value::Geometry(b) => {
                let max = limit.map_or(MAX_BYTES, |n| n as usize);
                if b.len() > max {
                    return Err(format!("{} bytes, more than the column's {max}", b.len()));
                }
                Kind::StringValue(base64::engine::general_purpose::STANDARD.encode(b))
            }
            other => return Err(mismatch(other, ty)),
        },
        SpType::Date => match value {
            Value::Date(days) => {
                let days = i64::from(*days);
                if !(MIN_DAYS..=MAX_DAYS).contains(&days) {
                    return Err("a date outside 0001-01-01..9999-12-31".into());
                }
                Kind::StringValue(text(value)?)
            }
            other => return Err(mismatch(other, ty)),
        },
        SpType::Timestamp => match value {
            Value::Timestamp(micros) | Value::TimestampTz(micros) => Kind::StringValue(timestamp(*micros)?),
            other => return Err(mismatch(other, ty)),
        },
        SpType::Array(inner) => match value {
            Value::Array(items) => Kind::ListValue(ListValue {
                values: items
                    .iter()
                    .map(|i| encode(i, inner).map(|k| prost_types::Value { kind: Some(k) }))
                    .collect::<Result<_, _>>()?,
            }),
            other => return Err(mismatch(other, ty)),
        },
    })
}

fn mismatch(value: &Value, ty: &SpType) -> String {
    format!("a {} value does not fit a {ty} column", value.kind())
}

fn text(value: &Value) -> Result<String, String> {
    let mut out = String::new();
    render_text(&mut out, value)?;
    Ok(out)
}

/// A decimal's text for NUMERIC, or why NUMERIC cannot hold it: more than
/// 29 digits before the point or 9 after it (not rounded: a value that
/// would change is dead-lettered).
fn numeric(s: &str) -> Result<String, String> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() || !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err("a decimal NUMERIC cannot hold (NaN, infinity or not a number)".into());
    }
    let frac_used = frac.trim_end_matches('0');
    if int.trim_start_matches('0').len() > NUMERIC_MAX_INTEGER_DIGITS as usize
        || frac_used.len() > NUMERIC_MAX_SCALE as usize
    {
        return Err("a decimal outside NUMERIC's range (29 digits before the point, 9 after)".into());
    }
    Ok(s.to_string())
}

/// Microseconds since the epoch as Spanner's canonical TIMESTAMP text:
/// RFC 3339 in UTC, the fraction without trailing zeros (the form Spanner
/// returns, so that keys read back compare equal).
pub fn timestamp(micros: i64) -> Result<String, String> {
    let days = micros.div_euclid(MICROS_PER_DAY);
    if !(MIN_DAYS..=MAX_DAYS).contains(&days) {
        return Err("a timestamp outside 0001-01-01..9999-12-31".into());
    }
    let at = chrono::DateTime::from_timestamp_micros(micros).ok_or("a timestamp outside chrono's range")?;
    let mut out = at.format("%Y-%m-%dT%H:%M:%S").to_string();
    let frac = micros.rem_euclid(1_000_000);
    if frac != 0 {
        let f = format!("{frac:06}");
        out.push('.');
        out.push_str(f.trim_end_matches('0'));
    }
    out.push('Z');
    Ok(out)
}

/// A key value of a column of type `ty` as text for matching the keys
/// Spanner returns with the keys a batch holds: the same for the same
/// value in either form (Spanner returns NUMERIC `1.50` as `1.5`).
pub fn key_form(kind: &Kind, ty: &SpType) -> String {
    match kind {
        Kind::NullValue(_) => "\u{0}null".into(),
        Kind::BoolValue(b) => b.to_string(),
        Kind::NumberValue(n) => n.to_string(),
        Kind::StringValue(s) if *ty == SpType::Numeric => canonical_numeric(s),
        Kind::StringValue(s) => s.clone(),
        Kind::ListValue(_) | Kind::StructValue(_) => String::new(),
    }
}

/// A NUMERIC's text without insignificant zeros.
fn canonical_numeric(s: &str) -> String {
    if !s.contains('.') {
        return s.to_string();
    }
    let trimmed = s.trim_end_matches('0').trim_end_matches('.');
    if trimmed == "-0" {
        "0".into()
    } else {
        trimmed.to_string()
    }
}

/// The cells of one row read back (`schema`'s columns, in order, kept as
/// `types`) as the model's values. An error names the table, the column
/// and its type; never the value.
pub fn read_row(cells: &[Raw], schema: &TableSchema, types: &[SpType]) -> SinkResult<Vec<Value>> {
    if cells.len() != schema.columns.len() {
        return Err(Error::permanent(format!(
            "a row read back has {} cells for {} columns",
            cells.len(),
            schema.columns.len()
        ))
        .with_table(schema.id.clone()));
    }
    schema
        .columns
        .iter()
        .zip(types)
        .zip(cells)
        .map(|((column, ty), cell)| {
            decode(&cell.0, ty, &column.data_type).map_err(|why| {
                Error::permanent(format!(
                    "cannot read column {} ({}, kept as {ty}) back exactly: {why}",
                    column.name, column.data_type
                ))
                .with_table(schema.id.clone())
                .with_column(column.name.clone())
                .with_class("tributary.verify.read_back")
            })
        })
        .collect()
}

/// The value of a column of `data_type` that [`encode`] wrote as `kind`
/// into a column of type `ty`, as Spanner returns it.
pub fn decode(kind: &Kind, ty: &SpType, data_type: &DataType) -> Result<Value, String> {
    Ok(match (ty, kind) {
        (_, Kind::NullValue(_)) => Value::Null,
        (SpType::Bool, Kind::BoolValue(b)) => Value::Boolean(*b),
        (SpType::Int64, Kind::StringValue(s)) => Value::Int64(s.parse().map_err(|_| "not an INT64")?),
        (SpType::Float64, Kind::NumberValue(n)) => Value::Float64(*n),
        (SpType::Float64, Kind::StringValue(s)) => Value::Float64(match s.as_str() {
            "NaN" => f64::NAN,
            "Infinity" => f64::INFINITY,
            "-Infinity" => f64::NEG_INFINITY,
            _ => return Err("not a FLOAT64".into()),
        }),
        (SpType::Numeric, Kind::StringValue(s)) => parse_text(&DataType::VariableDecimal, s)?,
        (SpType::String(_), Kind::StringValue(s)) => parse_text(data_type, s)?,
        (SpType::Json, Kind::StringValue(s)) => Value::Json(s.clone()),
        (SpType::Bytes(_), Kind::StringValue(s)) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| "not base64")?;
            match data_type {
                DataType::Geometry => Value::Geometry(bytes),
                _ => Value::Bytes(bytes),
            }
        }
        (SpType::Date, Kind::StringValue(s)) => parse_text(&DataType::Date, s)?,
        (SpType::Timestamp, Kind::StringValue(s)) => {
            let micros = timestamp_micros(s)?;
            match data_type {
                // The wall clock, kept as if it were UTC.
                DataType::Timestamp => Value::Timestamp(micros),
                _ => Value::TimestampTz(micros),
            }
        }
        (SpType::Array(inner), Kind::ListValue(list)) => {
            let DataType::Array(element) = data_type else {
                return Err(format!("an array for a {data_type} column"));
            };
            Value::Array(
                list.values
                    .iter()
                    .map(|v| decode(v.kind.as_ref().unwrap_or(&Kind::NullValue(0)), inner, element))
                    .collect::<Result<_, _>>()?,
            )
        }
        _ => return Err(format!("a value of another kind than {ty}")),
    })
}

/// Spanner's TIMESTAMP text (RFC 3339 in UTC, up to nine fraction digits)
/// as microseconds; one with nanoseconds has none (never truncated).
pub fn timestamp_micros(text: &str) -> Result<i64, String> {
    let body = text.strip_suffix('Z').ok_or("not a UTC timestamp")?;
    let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not an RFC 3339 timestamp".into());
    }
    let (micros, nanos) = fraction.split_at(fraction.len().min(6));
    if nanos.bytes().any(|b| b != b'0') {
        return Err("a timestamp with nanoseconds, which microseconds cannot hold".into());
    }
    let micros = if micros.is_empty() {
        String::new()
    } else {
        format!(".{micros}")
    };
    tributary_schemas::temporal::instant_from_iso(&format!("{whole}{micros}Z"))
        .ok_or_else(|| "not an RFC 3339 timestamp".into())
}

/// Whether Spanner orders the values of a key column of `data_type` kept as
/// `ty` as the source does ([`tributary_schemas::canonical::orders_everywhere`]):
/// a key range is then a range of Spanner's keys. A decimal or a number
/// kept as text is not (`10` sorts before `9`).
pub fn orders_as_source(data_type: &DataType, ty: &SpType) -> bool {
    matches!(
        (data_type, ty),
        (DataType::Boolean, SpType::Bool)
            | (DataType::Int16 | DataType::Int32 | DataType::Int64, SpType::Int64 | SpType::Numeric)
            | (DataType::Decimal { .. } | DataType::VariableDecimal, SpType::Numeric)
            // Text and UUIDs by their UTF-8 bytes; a time of day's text has
            // a fixed width (`HH:MM:SS.ffffff`).
            | (DataType::Text | DataType::Uuid | DataType::Time, SpType::String(_))
            | (DataType::Bytes, SpType::Bytes(_))
            | (DataType::Date, SpType::Date)
            | (DataType::Timestamp | DataType::TimestampTz, SpType::Timestamp)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_source() {
        assert_eq!(spanner_type(&DataType::Int32), SpType::Int64);
        assert_eq!(spanner_type(&DataType::Decimal { precision: 10, scale: 2 }), SpType::Numeric);
        assert_eq!(spanner_type(&DataType::Decimal { precision: 40, scale: 2 }), SpType::String(None));
        assert_eq!(spanner_type(&DataType::Array(Box::new(DataType::Text))).to_string(), "ARRAY<STRING(MAX)>");
        for t in [
            "STRING(MAX)",
            "STRING(10)",
            "ARRAY<INT64>",
            "BYTES(MAX)",
            "NUMERIC",
            "TIMESTAMP",
        ] {
            assert_eq!(from_spanner_type(t).unwrap().to_string(), t);
        }
    }

    #[test]
    fn refused_values_name_no_value() {
        let e = encode(&Value::Decimal("1e40".into()), &SpType::Numeric).unwrap_err();
        assert!(!e.contains("1e40"), "{e}");
        assert!(encode(&Value::Decimal("123.1234567891".into()), &SpType::Numeric).is_err());
        assert!(encode(&Value::Decimal("123.123456789000".into()), &SpType::Numeric).is_ok());
        assert!(encode(&Value::Text("x".repeat(11)), &SpType::String(Some(10))).is_err());
        assert!(encode(&Value::Date(3_000_000), &SpType::Date).is_err());
    }

    #[test]
    fn mysql_times_are_their_exact_text() {
        assert_eq!(spanner_type(&DataType::TimeSpan), SpType::String(None));
        let text = |micros: i64| match encode(&Value::Time(micros), &SpType::String(None)) {
            Ok(Kind::StringValue(s)) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(text(-3_020_399_000_000), "-838:59:59.000000");
        assert_eq!(text(3_020_398_999_999), "838:59:58.999999");
        assert_eq!(text(45_296_000_001), "12:34:56.000001");
    }

    #[test]
    fn values_read_back_as_they_were_written() {
        use tributary_schemas::canonical::canonical_text;
        let cases = [
            (DataType::Int32, Value::Int32(-5)),
            (DataType::Float64, Value::Float64(0.1)),
            (DataType::Float64, Value::Float64(f64::NAN)),
            (DataType::Decimal { precision: 8, scale: 2 }, Value::Decimal("12.50".into())),
            (DataType::Decimal { precision: 50, scale: 2 }, Value::Decimal("-12.50".into())),
            (DataType::Text, Value::Text("a\u{1F600}".into())),
            (DataType::Uuid, Value::Uuid(uuid::Uuid::from_u128(42))),
            (DataType::Json, Value::Json("{\"b\":1,\"a\":[true]}".into())),
            (DataType::Bytes, Value::Bytes(vec![0, 1, 254])),
            (DataType::Date, Value::Date(-719_162)),
            (DataType::Time, Value::Time(86_399_999_999)),
            (DataType::TimeSpan, Value::Time(-3_020_399_000_000)),
            (DataType::Timestamp, Value::Timestamp(1_500_000)),
            (DataType::TimestampTz, Value::TimestampTz(-1)),
            (DataType::Interval, Value::Interval { months: 1, days: -2, micros: 3 }),
            (DataType::Array(Box::new(DataType::Text)), Value::Array(vec![Value::Text("a".into()), Value::Null])),
            (DataType::Boolean, Value::Boolean(false)),
        ];
        for (data_type, value) in cases {
            let ty = spanner_type(&data_type);
            let kind = encode(&value, &ty).unwrap();
            // What Spanner returns: INT64, NUMERIC, BYTES, DATE and
            // TIMESTAMP as text, FLOAT64 as a number.
            let back = decode(&kind, &ty, &data_type).unwrap();
            assert_eq!(canonical_text(&data_type, &back), canonical_text(&data_type, &value), "{data_type}");
        }
        assert_eq!(timestamp_micros("2026-01-01T00:00:00.123456000Z"), Ok(1_767_225_600_123_456));
        assert!(timestamp_micros("2026-01-01T00:00:00.123456789Z").is_err(), "nanoseconds are not truncated");
        let wrong = decode(&Kind::BoolValue(true), &SpType::Int64, &DataType::Int64).unwrap_err();
        assert!(wrong.contains("INT64"), "{wrong}");
        assert!(orders_as_source(&DataType::Int32, &SpType::Int64));
        assert!(!orders_as_source(&DataType::Decimal { precision: 50, scale: 2 }, &SpType::String(None)));
    }

    #[test]
    fn timestamps_and_keys_are_canonical() {
        assert_eq!(timestamp(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_500_000).unwrap(), "1970-01-01T00:00:01.5Z");
        let n = SpType::Numeric;
        assert_eq!(key_form(&Kind::StringValue("1.50".into()), &n), key_form(&Kind::StringValue("1.5".into()), &n));
        assert_eq!(key_form(&Kind::StringValue("1.50".into()), &SpType::String(None)), "1.50");
    }
}
