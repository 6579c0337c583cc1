//! Our logical types in BigQuery: the column type each one gets, which type
//! changes BigQuery can follow, how a value is written into an
//! `insertAll` row (JSON), and how it is read back from a query's result
//! (for verification). See `docs/destinations/bigquery.md`.

use std::fmt;

use base64::Engine as _;
use serde_json::Value as Json;
use tributary_schemas::{Column, DataType, Value};

pub use crate::sink::schema::Fit;

/// NUMERIC holds 38 digits, at most 9 after the point (29 before it).
const NUMERIC_MAX_SCALE: u32 = 9;
const NUMERIC_MAX_INTEGER_DIGITS: u32 = 29;
/// BIGNUMERIC holds 76 digits (and a bit), at most 38 after the point.
const BIGNUMERIC_MAX_SCALE: u32 = 38;
const BIGNUMERIC_MAX_INTEGER_DIGITS: u32 = 38;
/// Days from 0001-01-01 to 1970-01-01 and from 1970-01-01 to 9999-12-31:
/// BigQuery's DATE, DATETIME and TIMESTAMP range.
const MIN_DAYS: i64 = -719_162;
const MAX_DAYS: i64 = 2_932_896;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// A BigQuery column type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BqType {
    /// BOOL.
    Bool,
    /// INT64.
    Int64,
    /// FLOAT64.
    Float64,
    /// NUMERIC(P, S), or plain NUMERIC when `None`.
    Numeric(Option<(u32, u32)>),
    /// BIGNUMERIC(P, S), or plain BIGNUMERIC when `None`.
    BigNumeric(Option<(u32, u32)>),
    /// STRING.
    String,
    /// JSON.
    Json,
    /// BYTES.
    Bytes,
    /// DATE.
    Date,
    /// TIME.
    Time,
    /// DATETIME (wall clock, no zone).
    Datetime,
    /// TIMESTAMP (an instant).
    Timestamp,
    /// GEOGRAPHY.
    Geography,
    /// ARRAY<T> (a REPEATED field).
    Array(Box<BqType>),
}

impl fmt::Display for BqType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BqType::Bool => f.write_str("BOOL"),
            BqType::Int64 => f.write_str("INT64"),
            BqType::Float64 => f.write_str("FLOAT64"),
            BqType::Numeric(None) => f.write_str("NUMERIC"),
            BqType::Numeric(Some((p, s))) => write!(f, "NUMERIC({p}, {s})"),
            BqType::BigNumeric(None) => f.write_str("BIGNUMERIC"),
            BqType::BigNumeric(Some((p, s))) => write!(f, "BIGNUMERIC({p}, {s})"),
            BqType::String => f.write_str("STRING"),
            BqType::Json => f.write_str("JSON"),
            BqType::Bytes => f.write_str("BYTES"),
            BqType::Date => f.write_str("DATE"),
            BqType::Time => f.write_str("TIME"),
            BqType::Datetime => f.write_str("DATETIME"),
            BqType::Timestamp => f.write_str("TIMESTAMP"),
            BqType::Geography => f.write_str("GEOGRAPHY"),
            BqType::Array(inner) => write!(f, "ARRAY<{inner}>"),
        }
    }
}

/// The BigQuery type of a column.
pub fn bigquery_type(data_type: &DataType) -> BqType {
    match data_type {
        DataType::Boolean => BqType::Bool,
        DataType::Int16 | DataType::Int32 | DataType::Int64 => BqType::Int64,
        DataType::Float32 | DataType::Float64 => BqType::Float64,
        DataType::Decimal { precision, scale } => {
            let (p, s) = (*precision, *scale);
            let integer = p.saturating_sub(s);
            if s <= NUMERIC_MAX_SCALE && integer <= NUMERIC_MAX_INTEGER_DIGITS {
                BqType::Numeric(Some((p.max(1), s)))
            } else if s <= BIGNUMERIC_MAX_SCALE && integer <= BIGNUMERIC_MAX_INTEGER_DIGITS {
                BqType::BigNumeric(Some((p.max(1), s)))
            } else {
                // Wider than BIGNUMERIC(P, S) can declare: the exact text.
                BqType::String
            }
        }
        // Any scale up to 38: the widest exact type.
        DataType::VariableDecimal => BqType::BigNumeric(None),
        DataType::Text | DataType::Uuid | DataType::Enum { .. } | DataType::Interval => BqType::String,
        DataType::Json => BqType::Json,
        // A bit string as Debezium's Bits bytes (docs/type-mapping.md).
        DataType::Bytes | DataType::Bits { .. } => BqType::Bytes,
        DataType::Date => BqType::Date,
        DataType::Time => BqType::Time,
        // MySQL's TIME (-838:59:59 to 838:59:59): TIME holds one day, so
        // the exact text, `-838:59:59.000000` (as STRING holds intervals).
        DataType::TimeSpan => BqType::String,
        DataType::Timestamp => BqType::Datetime,
        DataType::TimestampTz => BqType::Timestamp,
        DataType::Geometry => BqType::Geography,
        DataType::Array(inner) => match bigquery_type(inner) {
            // BigQuery has no arrays of arrays: the inner array as JSON.
            BqType::Array(_) => BqType::Array(Box::new(BqType::Json)),
            t => BqType::Array(Box::new(t)),
        },
    }
}

/// Parses the type spelling of BigQuery's table metadata (`tables.get`:
/// `INTEGER`, `NUMERIC` with precision/scale, ...) back into a [`BqType`].
pub fn from_metadata(type_name: &str, precision: Option<u32>, scale: Option<u32>, repeated: bool) -> Option<BqType> {
    let params = precision.map(|p| (p, scale.unwrap_or(0)));
    let t = match type_name.to_ascii_uppercase().as_str() {
        "BOOL" | "BOOLEAN" => BqType::Bool,
        "INT64" | "INTEGER" => BqType::Int64,
        "FLOAT64" | "FLOAT" => BqType::Float64,
        "NUMERIC" => BqType::Numeric(params),
        "BIGNUMERIC" => BqType::BigNumeric(params),
        "STRING" => BqType::String,
        "JSON" => BqType::Json,
        "BYTES" => BqType::Bytes,
        "DATE" => BqType::Date,
        "TIME" => BqType::Time,
        "DATETIME" => BqType::Datetime,
        "TIMESTAMP" => BqType::Timestamp,
        "GEOGRAPHY" => BqType::Geography,
        _ => return None,
    };
    Some(if repeated { BqType::Array(Box::new(t)) } else { t })
}

/// Whether a column of type `have` takes values of type `want`, and if not,
/// whether BigQuery can widen it (it allows INT64 -> NUMERIC / BIGNUMERIC /
/// FLOAT64, NUMERIC -> BIGNUMERIC / FLOAT64, and larger precision or scale
/// of a parameterised NUMERIC / BIGNUMERIC).
pub fn fit(have: &BqType, want: &BqType) -> Fit<BqType> {
    use BqType::*;
    if have == want {
        return Fit::Keep;
    }
    match (have, want) {
        (Numeric(None), Numeric(Some((p, s))))
            if *s <= NUMERIC_MAX_SCALE && p.saturating_sub(*s) <= NUMERIC_MAX_INTEGER_DIGITS =>
        {
            Fit::Keep
        }
        (BigNumeric(None), BigNumeric(_) | Numeric(_) | Int64) => Fit::Keep,
        (Numeric(None), Int64) => Fit::Keep,
        (Numeric(Some((hp, hs))), Int64) if hp.saturating_sub(*hs) >= 19 => Fit::Keep,
        (Numeric(Some(h)), Numeric(Some(w))) => match widened(*h, *w) {
            None => Fit::Keep,
            Some(params) => Fit::Widen(Numeric(Some(params))),
        },
        (BigNumeric(Some(h)), BigNumeric(Some(w)) | Numeric(Some(w))) => match widened(*h, *w) {
            None => Fit::Keep,
            Some(params) => Fit::Widen(BigNumeric(Some(params))),
        },
        (Int64, Numeric(_) | BigNumeric(_) | Float64) => Fit::Widen(want.clone()),
        (Numeric(_), BigNumeric(_)) => Fit::Widen(want.clone()),
        (Numeric(Some(_)), Numeric(None)) => Fit::Widen(Numeric(None)),
        // A MySQL TIME column made TIME before spans had their own type
        // (BigQuery cannot make it STRING in place): it keeps its type, and
        // a value outside a day is refused (dead-lettered), never wrapped.
        (Time, String) => Fit::Keep,
        (BigNumeric(Some(_)), BigNumeric(None)) => Fit::Widen(BigNumeric(None)),
        _ => Fit::Incompatible,
    }
}

/// The smallest (precision, scale) holding both `have` and `want`, or
/// `None` when `have` already holds every value of `want`.
fn widened((hp, hs): (u32, u32), (wp, ws): (u32, u32)) -> Option<(u32, u32)> {
    let (have_int, want_int) = (hp.saturating_sub(hs), wp.saturating_sub(ws));
    if hs >= ws && have_int >= want_int {
        return None;
    }
    let scale = hs.max(ws);
    Some((have_int.max(want_int) + scale, scale))
}

/// Why a value cannot be written; never contains the value itself.
pub type Reason = String;

/// The `insertAll` JSON of one value for a column of type `ty`.
pub fn to_json(value: &Value, ty: &BqType) -> Result<Json, Reason> {
    Ok(match (value, ty) {
        (Value::Null, BqType::Array(_)) => Json::Array(Vec::new()),
        (Value::Null, _) => Json::Null,
        (Value::Boolean(b), _) => Json::Bool(*b),
        (Value::Int16(v), _) => Json::from(*v),
        (Value::Int32(v), _) => Json::from(*v),
        // A JSON number: BigQuery reads it exactly (bqemulator refuses
        // INT64 given as text).
        (Value::Int64(v), _) => Json::from(*v),
        (Value::Float32(v), _) => float(f64::from(*v)),
        (Value::Float64(v), _) => float(*v),
        (Value::Decimal(text), t) => {
            check_decimal(text, t)?;
            Json::String(text.clone())
        }
        (Value::Text(s) | Value::Enum(s), _) => Json::String(s.clone()),
        (Value::Json(s), _) => {
            serde_json::from_str::<Json>(s).map_err(|_| "a json value that is not valid JSON".to_string())?;
            Json::String(s.clone())
        }
        (Value::Uuid(u), _) => Json::String(u.to_string()),
        (Value::Bytes(b), _) => Json::String(base64::engine::general_purpose::STANDARD.encode(b)),
        (Value::Date(days), _) => Json::String(date_text(i64::from(*days))?),
        (Value::Time(micros), BqType::Time) => Json::String(time_text(*micros)?),
        // A span (MySQL's TIME) in its exact text.
        (Value::Time(_), _) => Json::String(span_text(value)?),
        (Value::Timestamp(micros), _) => Json::String(datetime_text(*micros, "")?),
        (Value::TimestampTz(micros), _) => Json::String(datetime_text(*micros, "Z")?),
        (Value::Interval { months, days, micros }, _) => {
            Json::String(tributary_schemas::temporal::interval_to_iso(*months, *days, *micros))
        }
        (Value::Geometry(wkb), BqType::Geography) => Json::String(wkb_to_wkt(wkb)?),
        (Value::Geometry(wkb), _) => Json::String(base64::engine::general_purpose::STANDARD.encode(wkb)),
        (Value::Array(items), BqType::Array(inner)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if matches!(item, Value::Null) {
                    return Err("an array with a NULL element (BigQuery arrays cannot hold NULL)".into());
                }
                out.push(match (item, inner.as_ref()) {
                    (Value::Array(_), BqType::Json) => Json::String(array_as_json(item)?.to_string()),
                    _ => to_json(item, inner)?,
                });
            }
            Json::Array(out)
        }
        (Value::Array(_), t) => return Err(format!("an array value for a column of type {t}")),
        (Value::SourceText { .. }, _) => return Err(crate::sink::text::NO_EXACT_FORM.into()),
        (Value::Unchanged, _) => {
            return Err("an unchanged-value placeholder (the source did not send the value)".into())
        }
    })
}

fn array_as_json(value: &Value) -> Result<Json, Reason> {
    match value {
        Value::Array(items) => items.iter().map(array_as_json).collect::<Result<Vec<_>, _>>().map(Json::Array),
        other => to_json(other, &BqType::String),
    }
}

fn float(v: f64) -> Json {
    if v.is_nan() {
        Json::String("NaN".into())
    } else if v.is_infinite() {
        Json::String(if v > 0.0 { "Infinity" } else { "-Infinity" }.into())
    } else {
        serde_json::Number::from_f64(v).map(Json::Number).unwrap_or(Json::Null)
    }
}

/// Refuses a decimal that the column type cannot hold (BigQuery would
/// round or reject it).
fn check_decimal(text: &str, ty: &BqType) -> Result<(), Reason> {
    let digits = text.trim_start_matches(['-', '+']);
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part.chars().chain(frac_part.chars()).all(|c| c.is_ascii_digit())
    {
        return Err("a decimal that is not a plain decimal number (NaN or infinity?)".into());
    }
    let integer = int_part.trim_start_matches('0').len() as u32;
    let scale = frac_part.trim_end_matches('0').len() as u32;
    let (max_int, max_scale) = match ty {
        BqType::Numeric(Some((p, s))) | BqType::BigNumeric(Some((p, s))) => (p.saturating_sub(*s), *s),
        BqType::Numeric(None) => (NUMERIC_MAX_INTEGER_DIGITS, NUMERIC_MAX_SCALE),
        BqType::BigNumeric(None) => (BIGNUMERIC_MAX_INTEGER_DIGITS, BIGNUMERIC_MAX_SCALE),
        _ => return Ok(()),
    };
    if integer > max_int || scale > max_scale {
        return Err(format!(
            "a decimal with {integer} integer and {scale} fractional digits for a column of type {ty}"
        ));
    }
    Ok(())
}

fn date_of(days: i64) -> Result<chrono::NaiveDate, Reason> {
    if !(MIN_DAYS..=MAX_DAYS).contains(&days) {
        return Err("a date outside BigQuery's range 0001-01-01 to 9999-12-31".into());
    }
    chrono::NaiveDate::from_num_days_from_ce_opt((days + 719_163) as i32)
        .ok_or_else(|| "a date outside BigQuery's range 0001-01-01 to 9999-12-31".to_string())
}

fn date_text(days: i64) -> Result<String, Reason> {
    Ok(date_of(days)?.format("%Y-%m-%d").to_string())
}

/// A span's SQL text, `[-]HH:MM:SS.ffffff` with as many hours as it takes.
fn span_text(value: &Value) -> Result<String, Reason> {
    let mut out = String::new();
    crate::sink::text::render_text(&mut out, value)?;
    Ok(out)
}

fn time_text(micros: i64) -> Result<String, Reason> {
    if !(0..MICROS_PER_DAY).contains(&micros) {
        // PostgreSQL's 24:00:00 and negative times have no BigQuery TIME.
        return Err("a time of day outside 00:00:00 to 23:59:59.999999".into());
    }
    let secs = micros / 1_000_000;
    Ok(format!("{:02}:{:02}:{:02}.{:06}", secs / 3600, secs / 60 % 60, secs % 60, micros % 1_000_000))
}

fn datetime_text(micros: i64, zone: &str) -> Result<String, Reason> {
    let days = micros.div_euclid(MICROS_PER_DAY);
    let date = date_text(days)?;
    let time = time_text(micros.rem_euclid(MICROS_PER_DAY))?;
    Ok(format!("{date}T{time}{zone}"))
}

/// WKB (ISO or EWKB, 2D) to WKT, which BigQuery's GEOGRAPHY accepts in
/// `insertAll`. Z and M coordinates are dropped (GEOGRAPHY is 2D).
pub fn wkb_to_wkt(wkb: &[u8]) -> Result<String, Reason> {
    let mut r = Wkb { data: wkb, at: 0 };
    let mut out = String::new();
    r.geometry(&mut out, 0)?;
    Ok(out)
}

struct Wkb<'a> {
    data: &'a [u8],
    at: usize,
}

const BAD_WKB: &str = "a geometry whose WKB cannot be read";

impl Wkb<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Reason> {
        let bytes = self.data.get(self.at..self.at + N).ok_or_else(|| BAD_WKB.to_string())?;
        self.at += N;
        let mut a = [0u8; N];
        a.copy_from_slice(bytes);
        Ok(a)
    }
    fn u32(&mut self, le: bool) -> Result<u32, Reason> {
        let b = self.take::<4>()?;
        Ok(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }
    fn f64(&mut self, le: bool) -> Result<f64, Reason> {
        let b = self.take::<8>()?;
        Ok(if le {
            f64::from_le_bytes(b)
        } else {
            f64::from_be_bytes(b)
        })
    }
    fn point(&mut self, out: &mut String, le: bool, dims: usize) -> Result<(), Reason> {
        let x = self.f64(le)?;
        let y = self.f64(le)?;
        for _ in 2..dims {
            self.f64(le)?;
        }
        out.push_str(&format!("{x} {y}"));
        Ok(())
    }
    fn points(&mut self, out: &mut String, le: bool, dims: usize) -> Result<(), Reason> {
        let n = self.u32(le)?;
        out.push('(');
        for i in 0..n {
            if i > 0 {
                out.push_str(", ");
            }
            self.point(out, le, dims)?;
        }
        out.push(')');
        Ok(())
    }
    fn geometry(&mut self, out: &mut String, depth: u32) -> Result<(), Reason> {
        if depth > 8 {
            return Err(BAD_WKB.into());
        }
        let le = self.take::<1>()?[0] == 1;
        let raw = self.u32(le)?;
        // EWKB flags: Z, M, SRID.
        let (ez, em, srid) = (raw & 0x8000_0000 != 0, raw & 0x4000_0000 != 0, raw & 0x2000_0000 != 0);
        if srid {
            self.u32(le)?;
        }
        let code = raw & 0x0FFF_FFFF;
        let (kind, iso_dims) = (code % 1000, code / 1000);
        let dims =
            2 + usize::from(ez || iso_dims == 1 || iso_dims == 3) + usize::from(em || iso_dims == 2 || iso_dims == 3);
        match kind {
            1 => {
                out.push_str("POINT(");
                self.point(out, le, dims)?;
                out.push(')');
            }
            2 => {
                out.push_str("LINESTRING");
                self.points(out, le, dims)?;
            }
            3 => {
                out.push_str("POLYGON(");
                let rings = self.u32(le)?;
                for i in 0..rings {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.points(out, le, dims)?;
                }
                out.push(')');
            }
            4..=7 => {
                out.push_str(match kind {
                    4 => "MULTIPOINT(",
                    5 => "MULTILINESTRING(",
                    6 => "MULTIPOLYGON(",
                    _ => "GEOMETRYCOLLECTION(",
                });
                let n = self.u32(le)?;
                for i in 0..n {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let mut part = String::new();
                    self.geometry(&mut part, depth + 1)?;
                    // Inside MULTI* the members are written without their keyword.
                    let body = match kind {
                        4 => part.strip_prefix("POINT").map(str::to_string),
                        5 => part.strip_prefix("LINESTRING").map(str::to_string),
                        6 => part.strip_prefix("POLYGON").map(str::to_string),
                        _ => Some(part.clone()),
                    };
                    out.push_str(&body.unwrap_or(part));
                }
                out.push(')');
            }
            _ => return Err(format!("a geometry of WKB type {code}, which GEOGRAPHY cannot hold")),
        }
        Ok(())
    }
}

/// A value read back from a query's result cell (`cell`: text, or for a
/// repeated column an array of `{"v": ...}`) of `column`, kept as `ty`:
/// the inverse of [`to_json`], for verification. A TIMESTAMP is read as
/// its microseconds (`UNIX_MICROS`): the REST API's own form of it is a
/// float of seconds, which rounds. What cannot be turned back exactly is an
/// error naming the types, never a guess.
pub fn from_cell(cell: &Json, ty: &BqType, column: &Column) -> Result<Value, Reason> {
    match (ty, cell.as_array()) {
        // NULL is written as an empty array too (a REPEATED column holds no
        // NULL): exact where the source column holds no NULL.
        (BqType::Array(_), Some(items)) if items.is_empty() && !column.nullable => Ok(Value::Array(Vec::new())),
        _ => value_of(cell, ty, &column.data_type),
    }
}

/// [`from_cell`] of a value of our type `data_type`.
fn value_of(cell: &Json, ty: &BqType, data_type: &DataType) -> Result<Value, Reason> {
    if cell.is_null() {
        return Ok(Value::Null);
    }
    let BqType::Array(inner) = ty else {
        let text = cell.as_str().ok_or_else(|| format!("a {ty} cell that is not text"))?;
        return from_text(text, ty, data_type);
    };
    let DataType::Array(element) = data_type else {
        return Err(format!("an {ty} column for a value of type {data_type}"));
    };
    if matches!(element.as_ref(), DataType::Array(_)) {
        return Err("an array of arrays (kept as JSON text, whose elements lose their types)".into());
    }
    let items = cell.as_array().ok_or_else(|| format!("an {ty} cell that is not an array"))?;
    if items.is_empty() {
        return Err("an empty array of a column that may be NULL, which BigQuery keeps as an empty array too".into());
    }
    items
        .iter()
        .map(|item| value_of(item.get("v").unwrap_or(&Json::Null), inner, element))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// One value of a result cell's text.
fn from_text(text: &str, ty: &BqType, data_type: &DataType) -> Result<Value, Reason> {
    use DataType as D;
    let unreadable = || format!("a {ty} value that does not read as one");
    Ok(match (ty, data_type) {
        (BqType::Bool, D::Boolean) => match text {
            "true" => Value::Boolean(true),
            "false" => Value::Boolean(false),
            _ => return Err(unreadable()),
        },
        (BqType::Int64, D::Int16 | D::Int32 | D::Int64) => Value::Int64(text.parse().map_err(|_| unreadable())?),
        // UNIX_MICROS of the TIMESTAMP.
        (BqType::Int64, D::TimestampTz) => Value::TimestampTz(text.parse().map_err(|_| unreadable())?),
        // Shortest round-trip digits; `NaN`, `Infinity` (any case: the
        // emulator writes `nan`).
        (BqType::Float64, D::Float32 | D::Float64) => Value::Float64(text.parse().map_err(|_| unreadable())?),
        (BqType::Numeric(_) | BqType::BigNumeric(_), D::Decimal { .. } | D::VariableDecimal)
        | (BqType::String, D::Decimal { .. } | D::VariableDecimal) => Value::Decimal(text.to_string()),
        (BqType::String, D::Text | D::Uuid | D::Enum { .. }) => Value::Text(text.to_string()),
        (BqType::String, D::Interval) => {
            let (months, days, micros) = tributary_schemas::temporal::interval_from_iso(text).ok_or_else(unreadable)?;
            Value::Interval { months, days, micros }
        }
        (BqType::String | BqType::Time, D::TimeSpan) | (BqType::Time, D::Time) => {
            Value::Time(crate::sink::text::parse_time(text).ok_or_else(unreadable)?)
        }
        (BqType::Json, D::Json) => Value::Json(text.to_string()),
        (BqType::Bytes, D::Bytes | D::Bits { .. }) => Value::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| unreadable())?,
        ),
        (BqType::Date, D::Date) => Value::Date(crate::sink::text::parse_date(text).ok_or_else(unreadable)?),
        (BqType::Datetime, D::Timestamp) => {
            Value::Timestamp(crate::sink::text::parse_timestamp(text).ok_or_else(unreadable)?)
        }
        // WKT of 2D WKB: the Z and M coordinates and the SRID are gone.
        (BqType::Geography, _) => return Err("a GEOGRAPHY, which keeps no WKB to compare".into()),
        (ty, data_type) => {
            return Err(format!("a {ty} value of a column of type {data_type}, which has no exact form"))
        }
    })
}

/// The SQL expression reading column `column` (quoted) of our type
/// `data_type` back, in the form [`from_cell`] takes.
pub fn read_expression(column: &str, data_type: &DataType) -> String {
    match bigquery_type(data_type) {
        BqType::Timestamp => format!("UNIX_MICROS({column})"),
        BqType::Array(inner) if *inner == BqType::Timestamp => {
            format!("ARRAY(SELECT UNIX_MICROS(e) FROM UNNEST({column}) AS e WITH OFFSET o ORDER BY o)")
        }
        _ => column.to_string(),
    }
}

/// The BigQuery column of a source column.
pub fn column_type(column: &Column) -> BqType {
    bigquery_type(&column.data_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_map_by_precision_and_scale() {
        assert_eq!(bigquery_type(&DataType::Decimal { precision: 10, scale: 2 }), BqType::Numeric(Some((10, 2))));
        assert_eq!(bigquery_type(&DataType::Decimal { precision: 38, scale: 9 }), BqType::Numeric(Some((38, 9))));
        assert_eq!(bigquery_type(&DataType::Decimal { precision: 40, scale: 2 }), BqType::BigNumeric(Some((40, 2))));
        assert_eq!(bigquery_type(&DataType::Decimal { precision: 30, scale: 12 }), BqType::BigNumeric(Some((30, 12))));
        assert_eq!(bigquery_type(&DataType::Decimal { precision: 100, scale: 2 }), BqType::String);
        assert_eq!(bigquery_type(&DataType::VariableDecimal), BqType::BigNumeric(None));
    }

    #[test]
    fn widening_follows_what_bigquery_allows() {
        assert_eq!(fit(&BqType::Int64, &BqType::Int64), Fit::Keep);
        assert_eq!(fit(&BqType::Int64, &BqType::Numeric(Some((20, 2)))), Fit::Widen(BqType::Numeric(Some((20, 2)))));
        assert_eq!(
            fit(&BqType::Numeric(Some((10, 2))), &BqType::Numeric(Some((12, 4)))),
            Fit::Widen(BqType::Numeric(Some((12, 4))))
        );
        assert_eq!(fit(&BqType::Numeric(Some((12, 4))), &BqType::Numeric(Some((10, 2)))), Fit::Keep);
        assert_eq!(fit(&BqType::String, &BqType::Int64), Fit::Incompatible);
        assert_eq!(fit(&BqType::Int64, &BqType::String), Fit::Incompatible);
    }

    #[test]
    fn values_render_as_bigquery_json() {
        assert_eq!(to_json(&Value::Int64(i64::MAX), &BqType::Int64).unwrap(), Json::from(i64::MAX));
        assert_eq!(to_json(&Value::Date(0), &BqType::Date).unwrap(), Json::String("1970-01-01".into()));
        assert_eq!(to_json(&Value::Date(-1), &BqType::Date).unwrap(), Json::String("1969-12-31".into()));
        assert_eq!(
            to_json(&Value::TimestampTz(1_500_000), &BqType::Timestamp).unwrap(),
            Json::String("1970-01-01T00:00:01.500000Z".into())
        );
        assert_eq!(
            to_json(&Value::Timestamp(-1), &BqType::Datetime).unwrap(),
            Json::String("1969-12-31T23:59:59.999999".into())
        );
        assert_eq!(
            to_json(&Value::Time(3_723_000_001), &BqType::Time).unwrap(),
            Json::String("01:02:03.000001".into())
        );
        assert!(to_json(&Value::Time(MICROS_PER_DAY), &BqType::Time).is_err());
        assert!(to_json(&Value::Time(-1), &BqType::Time).is_err());
    }

    #[test]
    fn mysql_times_are_held_exactly_as_text_or_refused_by_a_time_column() {
        assert_eq!(bigquery_type(&DataType::TimeSpan), BqType::String);
        assert_eq!(bigquery_type(&DataType::Time), BqType::Time);
        let span = |micros: i64| to_json(&Value::Time(micros), &BqType::String).unwrap();
        assert_eq!(span(-3_020_399_000_000), Json::String("-838:59:59.000000".into()));
        assert_eq!(span(3_020_398_999_999), Json::String("838:59:58.999999".into()));
        assert_eq!(span(360_000_500_000), Json::String("100:00:00.500000".into()));
        assert_eq!(span(-1), Json::String("-00:00:00.000001".into()));
        // A table made before: TIME stays, a value outside a day is refused.
        assert_eq!(fit(&BqType::Time, &BqType::String), Fit::Keep);
        assert!(to_json(&Value::Time(-3_020_399_000_000), &BqType::Time).is_err());
        assert!(to_json(&Value::Date(3_000_000), &BqType::Date).is_err());
        assert_eq!(to_json(&Value::Bytes(vec![1, 2]), &BqType::Bytes).unwrap(), Json::String("AQI=".into()));
        assert_eq!(to_json(&Value::Float64(f64::NAN), &BqType::Float64).unwrap(), Json::String("NaN".into()));
    }

    #[test]
    fn decimals_that_do_not_fit_are_refused_without_the_value() {
        let t = BqType::Numeric(Some((10, 2)));
        assert!(to_json(&Value::Decimal("12345678.12".into()), &t).is_ok());
        let e = to_json(&Value::Decimal("123456789.12".into()), &t).unwrap_err();
        assert!(!e.contains("123456789"), "{e}");
        assert!(to_json(&Value::Decimal("1.123".into()), &t).is_err());
        assert!(to_json(&Value::Decimal("NaN".into()), &BqType::BigNumeric(None)).is_err());
    }

    #[test]
    fn values_read_back_as_they_were_written() {
        let cell = |s: &str| Json::String(s.into());
        let back = |v: &str, ty: BqType, dt: DataType| value_of(&cell(v), &ty, &dt);
        assert_eq!(back("7", BqType::Int64, DataType::Int32), Ok(Value::Int64(7)));
        assert_eq!(back("true", BqType::Bool, DataType::Boolean), Ok(Value::Boolean(true)));
        assert_eq!(
            back("nan", BqType::Float64, DataType::Float64).map(|v| matches!(v, Value::Float64(f) if f.is_nan())),
            Ok(true)
        );
        assert_eq!(back("-Infinity", BqType::Float64, DataType::Float64), Ok(Value::Float64(f64::NEG_INFINITY)));
        assert_eq!(
            back("12.300000000", BqType::Numeric(None), DataType::Decimal { precision: 8, scale: 2 }),
            Ok(Value::Decimal("12.300000000".into()))
        );
        assert_eq!(
            back("1767225601123456", BqType::Int64, DataType::TimestampTz),
            Ok(Value::TimestampTz(1_767_225_601_123_456))
        );
        assert_eq!(back("1969-12-31T23:59:59.999999", BqType::Datetime, DataType::Timestamp), Ok(Value::Timestamp(-1)));
        assert_eq!(back("1969-12-31", BqType::Date, DataType::Date), Ok(Value::Date(-1)));
        assert_eq!(back("01:02:03.000001", BqType::Time, DataType::Time), Ok(Value::Time(3_723_000_001)));
        assert_eq!(back("-838:59:59.000000", BqType::String, DataType::TimeSpan), Ok(Value::Time(-3_020_399_000_000)));
        assert_eq!(back("AQI=", BqType::Bytes, DataType::Bytes), Ok(Value::Bytes(vec![1, 2])));
        assert_eq!(
            back("P1Y2M3DT0H0M6.78S", BqType::String, DataType::Interval),
            Ok(Value::Interval { months: 14, days: 3, micros: 6_780_000 })
        );
        // Every written value reads back as itself.
        for (v, dt) in [
            (Value::Date(20_455), DataType::Date),
            (Value::Timestamp(1_767_225_601_500_000), DataType::Timestamp),
            (Value::Time(3_723_000_001), DataType::Time),
            (Value::Bytes(vec![0, 255]), DataType::Bytes),
        ] {
            let ty = bigquery_type(&dt);
            assert_eq!(value_of(&to_json(&v, &ty).unwrap(), &ty, &dt), Ok(v));
        }
        let mut tags = Column {
            name: "tags".into(),
            data_type: DataType::Array(Box::new(DataType::Text)),
            nullable: true,
            source_type: "text[]".into(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        };
        let ty = column_type(&tags);
        let array = serde_json::json!([{"v": "a"}, {"v": "1"}]);
        assert_eq!(
            from_cell(&array, &ty, &tags),
            Ok(Value::Array(vec![Value::Text("a".into()), Value::Text("1".into())]))
        );
        // What would be a guess is an error: an empty array is NULL too,
        // unless the column holds no NULL.
        let empty = serde_json::json!([]);
        assert!(from_cell(&empty, &ty, &tags).unwrap_err().contains("NULL"));
        tags.nullable = false;
        assert_eq!(from_cell(&empty, &ty, &tags), Ok(Value::Array(Vec::new())));
        assert!(back("1.767225601123456E9", BqType::Timestamp, DataType::TimestampTz).is_err());
        assert!(back("POINT(1 2)", BqType::Geography, DataType::Geometry).is_err());
        assert!(back("x", BqType::Int64, DataType::Int64).is_err());
        assert_eq!(read_expression("`ts`", &DataType::TimestampTz), "UNIX_MICROS(`ts`)");
        assert_eq!(read_expression("`ts`", &DataType::Timestamp), "`ts`");
    }

    #[test]
    fn wkb_becomes_wkt() {
        // POINT(1 2), little endian.
        let mut p = vec![1u8, 1, 0, 0, 0];
        p.extend_from_slice(&1f64.to_le_bytes());
        p.extend_from_slice(&2f64.to_le_bytes());
        assert_eq!(wkb_to_wkt(&p).unwrap(), "POINT(1 2)");
        // MULTIPOINT of that point, big endian header.
        let mut m = vec![0u8, 0, 0, 0, 4, 0, 0, 0, 1];
        m.extend_from_slice(&p);
        assert_eq!(wkb_to_wkt(&m).unwrap(), "MULTIPOINT((1 2))");
        assert!(wkb_to_wkt(&p[..7]).is_err());
    }
}
