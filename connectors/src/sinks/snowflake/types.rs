//! Our logical types in Snowflake: the column type each one gets, which
//! type changes Snowflake can make in place, how a value is staged (text,
//! bound as an array of strings) and how the staged text becomes the
//! column's type. See `docs/type-mapping.md`.

use std::fmt;
use std::fmt::Write as _;

use tributary_schemas::{DataType, Value};

pub use crate::sink::schema::Fit;
use crate::sink::text::render_text;

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
