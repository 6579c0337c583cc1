//! Our logical types in Snowflake: the column type each one gets, which
//! type changes Snowflake can make in place, how a value is staged (text,
//! bound as an array of strings), how the staged text becomes the
//! column's type, and how a value is read back (for verification). See
//! `docs/type-mapping.md`.

use std::fmt;
use std::fmt::Write as _;

use tributary_schemas::{DataType, Value};

pub use crate::sink::schema::Fit;
use crate::sink::text::{parse_date, parse_interval, parse_time, parse_timestamp, render_text};

/// NUMBER holds at most 38 digits, the scale at most 37 of them.
const MAX_PRECISION: u32 = 38;
const MAX_SCALE: u32 = 37;
/// What information_schema reports as the length of an unbounded VARCHAR
/// (16 MB; 128 MB accounts report that, the 2025 bundle's default).
const UNBOUNDED_VARCHAR: u32 = 16_777_216;

/// A Snowflake column type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SfType {
    /// BOOLEAN.
    Boolean,
    /// NUMBER(P, S).
    Number(u32, u32),
    /// FLOAT (a double).
    Float,
    /// VARCHAR(N), or the longest VARCHAR when `None`.
    Varchar(Option<u32>),
    /// BINARY.
    Binary,
    /// DATE.
    Date,
    /// TIME.
    Time,
    /// TIMESTAMP_NTZ (wall clock, no zone).
    TimestampNtz,
    /// TIMESTAMP_TZ (an instant with its offset).
    TimestampTz,
    /// VARIANT (JSON).
    Variant,
    /// ARRAY (of VARIANT).
    Array,
}

impl fmt::Display for SfType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SfType::Boolean => f.write_str("BOOLEAN"),
            SfType::Number(p, s) => write!(f, "NUMBER({p}, {s})"),
            SfType::Float => f.write_str("FLOAT"),
            SfType::Varchar(None) => f.write_str("VARCHAR"),
            SfType::Varchar(Some(n)) => write!(f, "VARCHAR({n})"),
            SfType::Binary => f.write_str("BINARY"),
            SfType::Date => f.write_str("DATE"),
            SfType::Time => f.write_str("TIME"),
            SfType::TimestampNtz => f.write_str("TIMESTAMP_NTZ"),
            SfType::TimestampTz => f.write_str("TIMESTAMP_TZ"),
            SfType::Variant => f.write_str("VARIANT"),
            SfType::Array => f.write_str("ARRAY"),
        }
    }
}

/// The Snowflake type of a column.
pub fn snowflake_type(data_type: &DataType) -> SfType {
    match data_type {
        DataType::Boolean => SfType::Boolean,
        DataType::Int16 => SfType::Number(5, 0),
        DataType::Int32 => SfType::Number(10, 0),
        DataType::Int64 => SfType::Number(19, 0),
        DataType::Float32 | DataType::Float64 => SfType::Float,
        DataType::Decimal { precision, scale } if *precision <= MAX_PRECISION && *scale <= MAX_SCALE => {
            SfType::Number((*precision).max(1).max(*scale), *scale)
        }
        // Wider than NUMBER, or a scale that varies row by row: the exact
        // text (NUMBER's scale is fixed per column).
        DataType::Decimal { .. } | DataType::VariableDecimal => SfType::Varchar(None),
        DataType::Text | DataType::Uuid | DataType::Enum { .. } | DataType::Interval => SfType::Varchar(None),
        DataType::Json => SfType::Variant,
        // Geometry as its WKB bytes: GEOGRAPHY/GEOMETRY would need the SRID
        // and a parse per row.
        DataType::Bytes | DataType::Bits { .. } | DataType::Geometry => SfType::Binary,
        DataType::Date => SfType::Date,
        DataType::Time => SfType::Time,
        // MySQL's TIME, -838:59:59 to 838:59:59: Snowflake's TIME holds one
        // day (and it has no interval column), so the exact text.
        DataType::TimeSpan => SfType::Varchar(None),
        DataType::Timestamp => SfType::TimestampNtz,
        DataType::TimestampTz => SfType::TimestampTz,
        DataType::Array(_) => SfType::Array,
    }
}

/// Parses information_schema's `data_type` (with precision, scale and
/// character length) back into an [`SfType`]; `None` for a type the sink
/// does not write.
pub fn from_metadata(
    data_type: &str,
    precision: Option<u32>,
    scale: Option<u32>,
    length: Option<u32>,
) -> Option<SfType> {
    Some(match data_type.to_ascii_uppercase().as_str() {
        "BOOLEAN" => SfType::Boolean,
        "NUMBER" | "DECIMAL" | "NUMERIC" | "INT" | "INTEGER" | "BIGINT" | "SMALLINT" => {
            SfType::Number(precision.unwrap_or(MAX_PRECISION), scale.unwrap_or(0))
        }
        "FLOAT" | "DOUBLE" | "REAL" | "FLOAT8" | "DOUBLE PRECISION" => SfType::Float,
        "TEXT" | "VARCHAR" | "STRING" => SfType::Varchar(length.filter(|n| *n < UNBOUNDED_VARCHAR)),
        "BINARY" | "VARBINARY" => SfType::Binary,
        "DATE" => SfType::Date,
        "TIME" => SfType::Time,
        "TIMESTAMP_NTZ" | "TIMESTAMP" | "DATETIME" => SfType::TimestampNtz,
        "TIMESTAMP_TZ" => SfType::TimestampTz,
        "VARIANT" | "OBJECT" => SfType::Variant,
        "ARRAY" => SfType::Array,
        _ => return None,
    })
}

/// Whether a column of type `have` takes every value of `want`, or what it
/// must be widened to. Snowflake changes a column in place only by making
/// a VARCHAR longer or a NUMBER's precision larger at the same scale.
pub fn fit(have: &SfType, want: &SfType) -> Fit<SfType> {
    if have == want {
        return Fit::Keep;
    }
    match (have, want) {
        (SfType::Number(hp, hs), SfType::Number(wp, ws)) => {
            if ws > hs {
                return Fit::Incompatible;
            }
            // Integer digits each side; the scale stays (Snowflake cannot
            // change it).
            let (hi, wi) = (hp - hs, wp - ws);
            if wi <= hi {
                Fit::Keep
            } else if wi + hs <= MAX_PRECISION {
                Fit::Widen(SfType::Number(wi + hs, *hs))
            } else {
                Fit::Incompatible
            }
        }
        (SfType::Varchar(None), SfType::Varchar(_)) => Fit::Keep,
        (SfType::Varchar(Some(h)), SfType::Varchar(Some(w))) if w <= h => Fit::Keep,
        (SfType::Varchar(Some(_)), SfType::Varchar(w)) => Fit::Widen(SfType::Varchar(*w)),
        (SfType::Variant, SfType::Array) => Fit::Keep,
        // A MySQL TIME column made TIME before spans had their own type
        // (Snowflake changes no type in place): it keeps its type, and
        // Snowflake refuses a value outside a day, never wrapped.
        (SfType::Time, SfType::Varchar(_)) => Fit::Keep,
        _ => Fit::Incompatible,
    }
}

/// How a staged text cell becomes a value of `ty` (`cell` is an SQL
/// expression of type VARCHAR).
pub fn from_staged(cell: &str, ty: &SfType) -> String {
    match ty {
        SfType::Varchar(_) => cell.to_string(),
        SfType::Variant => format!("PARSE_JSON({cell})"),
        SfType::Array => format!("CAST(PARSE_JSON({cell}) AS ARRAY)"),
        SfType::Binary => format!("TO_BINARY({cell}, 'HEX')"),
        t => format!("CAST({cell} AS {t})"),
    }
}

/// The staged text of a value (`None` for NULL): SQL text as every SQL sink
/// renders it ([`render_text`]), in the forms Snowflake reads: hex bytes,
/// JSON arrays, `+00:00` offsets, `inf`/`-inf`/`NaN`. Errors name the
/// value's kind, never the value.
pub fn staged_text(value: &Value) -> Result<Option<String>, String> {
    let mut out = String::new();
    match value {
        Value::Null => return Ok(None),
        Value::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Bytes(b) | Value::Geometry(b) => {
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
        }
        Value::Float32(_) | Value::Float64(_) => {
            render_text(&mut out, value)?;
            match out.as_str() {
                "Infinity" => out = "inf".into(),
                "-Infinity" => out = "-inf".into(),
                _ => {}
            }
        }
        Value::Array(_) => json(&mut out, value)?,
        Value::TimestampTz(_) => {
            render_text(&mut out, value)?;
            if out.ends_with("+00") {
                out.push_str(":00");
            }
        }
        _ => render_text(&mut out, value)?,
    }
    Ok(Some(out))
}

/// A value as JSON (array elements): numbers as numbers where JSON can
/// hold them exactly, everything else as its SQL text in a string.
fn json(out: &mut String, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int16(_) | Value::Int32(_) | Value::Int64(_) => render_text(out, value)?,
        Value::Float32(_) | Value::Float64(_) | Value::Decimal(_) => {
            let mut text = String::new();
            render_text(&mut text, value)?;
            if text.parse::<f64>().is_ok_and(f64::is_finite) {
                out.push_str(&text);
            } else {
                out.push_str(&serde_json::Value::String(text).to_string());
            }
        }
        Value::Json(s) => out.push_str(s),
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                json(out, item)?;
            }
            out.push(']');
        }
        other => {
            let text = staged_text(other)?.unwrap_or_default();
            out.push_str(&serde_json::Value::String(text).to_string());
        }
    }
    Ok(())
}

/// The SQL expression reading a column of type `ty` back, in the form
/// [`from_cell`] takes: dates as days and times and timestamps as
/// microseconds (numbers: the JSON result's own forms differ, epoch
/// seconds with nanoseconds from Snowflake, ISO text from fakesnow, and
/// `CAST AS VARCHAR` follows the session's output formats, three
/// fractional digits by default); semi-structured values as compact JSON.
pub fn read_expression(column: &str, ty: &SfType) -> String {
    match ty {
        SfType::Date => format!("DATEDIFF(day, '1970-01-01'::DATE, {column})"),
        SfType::Time => format!("DATEDIFF(microsecond, '00:00:00'::TIME, {column})"),
        SfType::TimestampNtz | SfType::TimestampTz => format!("DATE_PART(EPOCH_MICROSECOND, {column})"),
        SfType::Variant | SfType::Array => format!("TO_JSON({column})"),
        _ => column.to_string(),
    }
}

/// A value read back from a result cell's text (as [`read_expression`]
/// reads it) of a column of our type `data_type` kept as `ty`: the inverse
/// of [`staged_text`] and [`from_staged`], for verification. What cannot
/// be turned back exactly is an error naming the types, never a guess.
pub fn from_cell(text: &str, ty: &SfType, data_type: &DataType) -> Result<Value, String> {
    use DataType as D;
    let unreadable = || format!("a {ty} value that does not read as one");
    let integer = || text.parse::<i64>().map_err(|_| unreadable());
    Ok(match (ty, data_type) {
        (SfType::Boolean, D::Boolean) => match text {
            "1" | "true" | "TRUE" => Value::Boolean(true),
            "0" | "false" | "FALSE" => Value::Boolean(false),
            _ => return Err(unreadable()),
        },
        (SfType::Number(_, 0), D::Int16 | D::Int32 | D::Int64) => Value::Int64(integer()?),
        (SfType::Number(..) | SfType::Varchar(_), D::Decimal { .. } | D::VariableDecimal) => {
            Value::Decimal(text.to_string())
        }
        // `NaN`, `inf` (any case).
        (SfType::Float, D::Float32 | D::Float64) => Value::Float64(text.parse().map_err(|_| unreadable())?),
        (SfType::Varchar(_), D::Text | D::Uuid | D::Enum { .. }) => Value::Text(text.to_string()),
        (SfType::Varchar(_), D::Interval) => {
            let (months, days, micros) = parse_interval(text).ok_or_else(unreadable)?;
            Value::Interval { months, days, micros }
        }
        (SfType::Varchar(_), D::TimeSpan) => Value::Time(parse_time(text).ok_or_else(unreadable)?),
        (SfType::Time, D::Time | D::TimeSpan) => Value::Time(integer()?),
        (SfType::Date, D::Date) => Value::Date(text.parse().map_err(|_| unreadable())?),
        (SfType::TimestampNtz, D::Timestamp) => Value::Timestamp(integer()?),
        (SfType::TimestampTz, D::TimestampTz) => Value::TimestampTz(integer()?),
        (SfType::Binary, D::Bytes | D::Bits { .. }) => Value::Bytes(unhex(text).ok_or_else(unreadable)?),
        (SfType::Binary, D::Geometry) => Value::Geometry(unhex(text).ok_or_else(unreadable)?),
        (SfType::Variant, D::Json) => Value::Json(text.to_string()),
        (SfType::Variant | SfType::Array, D::Array(element)) => array_from_json(text, element)?,
        (ty, data_type) => {
            return Err(format!("a {ty} value of a column of type {data_type}, which has no exact form"))
        }
    })
}

/// An array staged as JSON ([`staged_text`]) back: each element by its
/// type, from its JSON text as it is (a number's digits are its value).
fn array_from_json(text: &str, element: &DataType) -> Result<Value, String> {
    let items: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_str(text).map_err(|_| "an ARRAY that is not a JSON array".to_string())?;
    items
        .iter()
        .map(|item| element_from_json(item.get(), element))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// One array element from its JSON text: what `json` wrote (numbers as
/// numbers where JSON holds them exactly, other values as their SQL text in
/// a string, JSON as it is, arrays nested).
fn element_from_json(json: &str, data_type: &DataType) -> Result<Value, String> {
    use DataType as D;
    let unreadable = || format!("an array element that does not read as a {data_type}");
    if json == "null" {
        return Ok(Value::Null);
    }
    let string = || serde_json::from_str::<String>(json).map_err(|_| unreadable());
    // A number's digits, or a string's text (a NaN, an infinity).
    let number = || {
        if json.starts_with('"') {
            string()
        } else {
            Ok(json.to_string())
        }
    };
    Ok(match data_type {
        D::Array(inner) => array_from_json(json, inner)?,
        D::Json => Value::Json(json.to_string()),
        D::Boolean => match json {
            "true" => Value::Boolean(true),
            "false" => Value::Boolean(false),
            _ => return Err(unreadable()),
        },
        D::Int16 | D::Int32 | D::Int64 => Value::Int64(json.parse().map_err(|_| unreadable())?),
        D::Float32 | D::Float64 => Value::Float64(number()?.parse().map_err(|_| unreadable())?),
        D::Decimal { .. } | D::VariableDecimal => Value::Decimal(number()?),
        D::Text | D::Uuid | D::Enum { .. } => Value::Text(string()?),
        D::Bytes | D::Bits { .. } => Value::Bytes(unhex(&string()?).ok_or_else(unreadable)?),
        D::Geometry => Value::Geometry(unhex(&string()?).ok_or_else(unreadable)?),
        D::Date => Value::Date(parse_date(&string()?).ok_or_else(unreadable)?),
        D::Time | D::TimeSpan => Value::Time(parse_time(&string()?).ok_or_else(unreadable)?),
        D::Timestamp => Value::Timestamp(parse_timestamp(&string()?).ok_or_else(unreadable)?),
        D::TimestampTz => Value::TimestampTz(parse_timestamp(&string()?).ok_or_else(unreadable)?),
        D::Interval => {
            let (months, days, micros) = parse_interval(&string()?).ok_or_else(unreadable)?;
            Value::Interval { months, days, micros }
        }
    })
}

/// Bytes of hex digits (either case: Snowflake's BINARY output is upper
/// case).
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(v: Value) -> String {
        staged_text(&v).unwrap().unwrap()
    }

    #[test]
    fn stages_values_in_snowflake_forms() {
        assert_eq!(staged_text(&Value::Null).unwrap(), None);
        assert_eq!(staged(Value::Boolean(true)), "true");
        assert_eq!(staged(Value::Bytes(vec![0, 0xab])), "00ab");
        assert_eq!(staged(Value::Float64(f64::INFINITY)), "inf");
        assert_eq!(staged(Value::TimestampTz(0)), "1970-01-01 00:00:00.000000+00:00");
        // A MySQL TIME: exact, into VARCHAR.
        assert_eq!(snowflake_type(&DataType::TimeSpan), SfType::Varchar(None));
        assert_eq!(staged(Value::Time(-3_020_399_000_000)), "-838:59:59.000000");
        assert_eq!(staged(Value::Time(360_000_500_000)), "100:00:00.500000");
        assert_eq!(
            staged(Value::Array(vec![Value::Int32(1), Value::Null, Value::Text("a\"b".into())])),
            "[1,null,\"a\\\"b\"]"
        );
    }

    #[test]
    fn values_read_back_as_they_were_staged() {
        let back = |text: &str, dt: DataType| from_cell(text, &snowflake_type(&dt), &dt);
        assert_eq!(back("7", DataType::Int32), Ok(Value::Int64(7)));
        assert_eq!(back("1", DataType::Boolean), Ok(Value::Boolean(true)));
        assert_eq!(back("12.30", DataType::Decimal { precision: 8, scale: 2 }), Ok(Value::Decimal("12.30".into())));
        assert_eq!(back("20455", DataType::Date), Ok(Value::Date(20_455)));
        assert_eq!(back("3723000004", DataType::Time), Ok(Value::Time(3_723_000_004)));
        assert_eq!(back("-1", DataType::Timestamp), Ok(Value::Timestamp(-1)));
        assert_eq!(back("1767225601123456", DataType::TimestampTz), Ok(Value::TimestampTz(1_767_225_601_123_456)));
        assert_eq!(back("00AB", DataType::Bytes), Ok(Value::Bytes(vec![0, 0xab])));
        assert_eq!(back("inf", DataType::Float64), Ok(Value::Float64(f64::INFINITY)));
        assert_eq!(back("-838:59:59.000000", DataType::TimeSpan), Ok(Value::Time(-3_020_399_000_000)));
        // Arrays as they were staged, element by element.
        for (v, dt) in [
            (Value::Array(vec![Value::Text("a\"b".into()), Value::Null, Value::Text("1".into())]), DataType::Text),
            (Value::Array(vec![Value::Int32(1), Value::Int32(-2)]), DataType::Int32),
            (
                Value::Array(vec![Value::Decimal("2.50".into()), Value::Decimal("NaN".into())]),
                DataType::VariableDecimal,
            ),
            (Value::Array(vec![Value::TimestampTz(1_500_000), Value::TimestampTz(-1)]), DataType::TimestampTz),
            (Value::Array(vec![Value::Date(-1), Value::Date(20_455)]), DataType::Date),
            (Value::Array(vec![Value::Bytes(vec![1, 255])]), DataType::Bytes),
            (
                Value::Array(vec![Value::Array(vec![Value::Boolean(true)])]),
                DataType::Array(Box::new(DataType::Boolean)),
            ),
        ] {
            let dt = DataType::Array(Box::new(dt));
            let staged = staged(v.clone());
            let read = back(&staged, dt.clone()).unwrap_or_else(|e| panic!("{staged}: {e}"));
            let canonical = |v: &Value| tributary_schemas::canonical::canonical_text(&dt, v);
            assert_eq!(canonical(&read), canonical(&v), "{staged}");
        }
        // What would be a guess is an error.
        assert!(back("x", DataType::Int64).is_err());
        assert!(back("0a1", DataType::Bytes).is_err());
        assert!(from_cell("1", &SfType::Number(10, 2), &DataType::Int32).is_err());
        assert_eq!(read_expression("\"ts\"", &SfType::TimestampTz), "DATE_PART(EPOCH_MICROSECOND, \"ts\")");
    }

    #[test]
    fn widens_only_where_snowflake_can() {
        let n = SfType::Number;
        assert_eq!(fit(&n(10, 0), &n(19, 0)), Fit::Widen(n(19, 0)));
        assert_eq!(fit(&n(19, 0), &n(10, 0)), Fit::Keep);
        assert_eq!(fit(&n(10, 2), &n(12, 2)), Fit::Widen(n(12, 2)));
        assert_eq!(fit(&n(10, 2), &n(10, 4)), Fit::Incompatible, "a scale never changes");
        assert_eq!(fit(&n(10, 0), &SfType::Varchar(None)), Fit::Incompatible);
        assert_eq!(fit(&SfType::Varchar(Some(10)), &SfType::Varchar(None)), Fit::Widen(SfType::Varchar(None)));
        assert_eq!(fit(&SfType::Varchar(None), &SfType::Varchar(Some(10))), Fit::Keep);
    }

    #[test]
    fn metadata_round_trips() {
        for ty in [
            snowflake_type(&DataType::Int32),
            snowflake_type(&DataType::Decimal { precision: 12, scale: 2 }),
            SfType::Varchar(None),
            SfType::TimestampTz,
            SfType::Variant,
        ] {
            let (p, s) = match ty {
                SfType::Number(p, s) => (Some(p), Some(s)),
                _ => (None, None),
            };
            let name = ty.to_string();
            let base = name.split('(').next().unwrap();
            assert_eq!(from_metadata(base, p, s, Some(UNBOUNDED_VARCHAR)), Some(ty));
        }
    }
}
