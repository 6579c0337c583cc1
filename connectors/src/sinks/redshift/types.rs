//! Values as the staged CSV files carry them: the SQL text form of
//! [`crate::sink::text`] (what Redshift's `COPY` reads with `TIMEFORMAT
//! 'auto'`), quoted; VARBYTE as bare hex and SUPER as JSON, the forms
//! Redshift's `COPY` reads for them from CSV. And the way back, for
//! verification ([`ReadBack`]): each column's value read as the model's.

use tributary_schemas::{Column, DataType, TableId, TableSchema, Value};

use super::dialect::{CSV_NULL, TOO_LONG};
use crate::error::{Error, Result};
use crate::sink::bookkeeping::key_text;
use crate::sink::reduce::{key_bytes, Group, Line};
use crate::sink::text::{parse_hex, parse_text, render_text};
use crate::sink::ApplyError;

/// How a staging column's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsvKind {
    /// The SQL text form.
    Text,
    /// `varbyte`: bare lowercase hex.
    Hex,
    /// `super`: JSON (an array as a JSON array, a JSON value as it is).
    Json,
    /// `numeric(p, s)`: the SQL text, of a decimal the column holds exactly
    /// (Redshift rounds extra fraction digits; a value with more is
    /// refused, never rounded).
    Numeric {
        /// Digits before the point the column holds (`p - s`).
        integer: u32,
        /// Digits after it.
        scale: u32,
    },
}

impl CsvKind {
    /// The kind of a destination column type (`format_type` spelling).
    pub fn of(raw: &str) -> Self {
        let base = raw.split('(').next().unwrap_or(raw).trim();
        match base {
            "varbyte" | "varbinary" | "binary varying" => Self::Hex,
            "super" => Self::Json,
            "numeric" | "decimal" => {
                let t = super::dialect::PgType::parse(raw);
                match t.mods.as_slice() {
                    [p, s] if t.dims == 0 => Self::Numeric {
                        integer: u32::try_from(p - s).unwrap_or(0),
                        scale: u32::try_from(*s).unwrap_or(0),
                    },
                    [p] if t.dims == 0 => Self::Numeric { integer: u32::try_from(*p).unwrap_or(0), scale: 0 },
                    _ => Self::Text,
                }
            }
            _ => Self::Text,
        }
    }
}

/// Appends `value` as one CSV field (`\N` unquoted for NULL, anything else
/// quoted). The error names the value's kind, never the value.
pub fn render_field(out: &mut Vec<u8>, scratch: &mut String, value: &Value, kind: CsvKind) -> Result<(), String> {
    if matches!(value, Value::Null) {
        out.extend_from_slice(CSV_NULL.as_bytes());
        return Ok(());
    }
    scratch.clear();
    match (kind, value) {
        (CsvKind::Hex, Value::Bytes(b) | Value::Geometry(b)) => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.reserve(b.len() * 2);
            for byte in b {
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 15)]);
            }
            return Ok(());
        }
        (CsvKind::Json, Value::Array(_)) => scratch.push_str(&to_json(value)?.to_string()),
        (CsvKind::Numeric { integer, scale }, Value::Decimal(text)) => {
            fits_numeric(text, integer, scale)?;
            scratch.push_str(text);
        }
        _ => render_text(scratch, value)?,
    }
    out.push(b'"');
    for &b in scratch.as_bytes() {
        if b == b'"' {
            out.push(b'"');
        }
        out.push(b);
    }
    out.push(b'"');
    Ok(())
}

/// Refuses a decimal `numeric(integer + scale, scale)` cannot hold as it
/// is: more digits before the point (Redshift refuses), or significant
/// digits after the scale (Redshift would round them).
fn fits_numeric(text: &str, integer: u32, scale: u32) -> Result<(), String> {
    let digits = text.trim_start_matches(['-', '+']);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int_digits = int.trim_start_matches('0').len();
    let frac_digits = frac.trim_end_matches('0').len();
    if int_digits > integer as usize || frac_digits > scale as usize {
        return Err(format!(
            "a decimal of {int_digits} integer and {frac_digits} fraction digits, which NUMERIC({}, {scale}) \
             cannot hold without rounding",
            integer + scale
        ));
    }
    Ok(())
}

/// A value as JSON (for SUPER): numbers and booleans as themselves, the
/// rest as their text.
fn to_json(value: &Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        Value::Null => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Int16(v) => J::from(*v),
        Value::Int32(v) => J::from(*v),
        Value::Int64(v) => J::from(*v),
        Value::Float32(v) => serde_json::Number::from_f64(f64::from(*v)).map_or(J::Null, J::Number),
        Value::Float64(v) => serde_json::Number::from_f64(*v).map_or(J::Null, J::Number),
        Value::Json(s) => serde_json::from_str(s).map_err(|_| "a json value that is not valid JSON".to_string())?,
        Value::Array(items) => J::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        other => {
            let mut text = String::new();
            render_text(&mut text, other)?;
            J::String(text)
        }
    })
}

/// Appends `line` of `group` as one CSV record: delete flag, key text, the
/// columns (a delete carries only its key), the position, the row's name
/// (a table without a key; else NULL). `kinds` has one
/// entry per schema column.
pub fn render_record(
    group: &Group<'_>,
    kinds: &[CsvKind],
    out: &mut Vec<u8>,
    scratch: &mut String,
    line: &Line<'_>,
) -> Result<(), ApplyError> {
    // A keyless table's row: its content key (and its name, last).
    let key = match &line.instance {
        Some(instance) => instance.content.clone(),
        None => key_text(&key_bytes(&group.schema, line.row, &group.key).map_err(|error| ApplyError {
            error: error.with_table(group.schema.id.clone()),
            record: Some(line.record),
        })?),
    };
    out.extend_from_slice(if line.delete { b"t," } else { b"f," });
    out.extend_from_slice(key.as_bytes());
    for (i, ((col, value), kind)) in group.schema.columns.iter().zip(line.row).zip(kinds).enumerate() {
        out.push(b',');
        if group.writes(line, i) {
            render_field(out, scratch, value, *kind).map_err(|reason| ApplyError {
                error: Error::permanent(format!("column {}: {reason}", col.name))
                    .with_column(col.name.clone())
                    .with_table(group.schema.id.clone()),
                record: Some(line.record),
            })?;
        } else {
            out.extend_from_slice(CSV_NULL.as_bytes());
        }
    }
    let mut digits = itoa::Buffer::new();
    out.push(b',');
    out.extend_from_slice(digits.format(line.commit).as_bytes());
    out.push(b',');
    out.extend_from_slice(digits.format(line.index).as_bytes());
    out.push(b',');
    // A record's name (a legal topic name, a partition and an offset)
    // needs no CSV quotes.
    match &line.instance {
        Some(instance) => out.extend_from_slice(instance.row.as_bytes()),
        None => out.extend_from_slice(CSV_NULL.as_bytes()),
    }
    out.push(b'\n');
    Ok(())
}

/// The records of a staged CSV file: its line ends outside quoted fields
/// (a quoted field may hold a line end; `""` inside one toggles twice).
pub fn csv_records(file: &[u8]) -> i64 {
    let mut quoted = false;
    let mut records = 0;
    for b in file {
        match b {
            b'"' => quoted = !quoted,
            b'\n' if !quoted => records += 1,
            _ => {}
        }
    }
    records
}

/// How a column's values are read back (by the destination column's
/// type, `format_type` spelled): the inverse of what [`render_field`]
/// wrote and `COPY` made of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// `boolean`, read as itself.
    Bool,
    /// `double precision`, read as itself: its text depends on
    /// `extra_float_digits`, the binary value does not.
    Float,
    /// `super`: its JSON (`JSON_SERIALIZE`).
    Json,
    /// `varbyte`: hex (`FROM_VARBYTE(..., 'hex')`).
    Hex,
    /// A VARCHAR: the SQL text the sink wrote ([`parse_text`]).
    Written,
    /// Any other type (numbers, dates, times, timestamps) cast to text:
    /// Redshift prints them as PostgreSQL does (ISO dates, UTC), read with
    /// PostgreSQL's decoders.
    Printed,
}

impl ReadBack {
    /// The reading of a destination column of type `raw`.
    pub fn of(raw: &str) -> Self {
        match raw.split('(').next().unwrap_or(raw).trim() {
            "boolean" => Self::Bool,
            "double precision" => Self::Float,
            "character varying" | "character" | "text" => Self::Written,
            _ => match CsvKind::of(raw) {
                CsvKind::Json => Self::Json,
                CsvKind::Hex => Self::Hex,
                CsvKind::Text | CsvKind::Numeric { .. } => Self::Printed,
            },
        }
    }
}

/// One row read back by the query of `kinds` (one per column of `schema`,
/// in order): each value as the model's. An error names the table, the
/// column and its type; never the value.
pub fn read_row(row: &tokio_postgres::Row, schema: &TableSchema, kinds: &[ReadBack]) -> Result<Vec<Value>> {
    schema
        .columns
        .iter()
        .zip(kinds)
        .enumerate()
        .map(|(i, (column, kind))| {
            if *kind == ReadBack::Printed {
                return crate::pgwire::values::text_cell(row, i, &schema.id, column);
            }
            let read = match kind {
                ReadBack::Bool => row.try_get::<_, Option<bool>>(i).map(|v| v.map(|b| Ok(Value::Boolean(b)))),
                ReadBack::Float => row.try_get::<_, Option<f64>>(i).map(|v| v.map(|f| Ok(Value::Float64(f)))),
                _ => row
                    .try_get::<_, Option<&str>>(i)
                    .map(|text| text.map(|t| read_text(*kind, &column.data_type, t))),
            };
            let read: std::result::Result<Value, String> = match read {
                Ok(Some(Ok(v))) => Ok(v),
                Ok(Some(Err(why))) => Err(why),
                Ok(None) => Ok(Value::Null),
                Err(e) => Err(e.to_string()),
            };
            read.map_err(|why| unreadable(&schema.id, column, *kind, &why))
        })
        .collect()
}

fn unreadable(table: &TableId, column: &Column, kind: ReadBack, why: &str) -> Error {
    Error::permanent(format!(
        "cannot read column {} ({}, kept as {kind:?}) back exactly: {why}",
        column.name, column.data_type
    ))
    .with_table(table.clone())
    .with_column(column.name.clone())
    .with_class("tributary.verify.read_back")
}

/// A value of `data_type` from the text `kind` reads.
fn read_text(kind: ReadBack, data_type: &DataType, text: &str) -> Result<Value, String> {
    if matches!(kind, ReadBack::Json | ReadBack::Hex) && text == TOO_LONG {
        return Err(
            "a value whose JSON or hex is longer than a VARCHAR (64 KB), which Redshift cannot give back".into()
        );
    }
    match (kind, data_type) {
        (ReadBack::Hex, DataType::Geometry) => parse_hex(text).map(Value::Geometry).ok_or_else(|| "not hex".into()),
        (ReadBack::Hex, DataType::Bytes | DataType::Bits { .. }) => {
            parse_hex(text).map(Value::Bytes).ok_or_else(|| "not hex".into())
        }
        (ReadBack::Json, DataType::Json) => Ok(Value::Json(text.to_string())),
        (ReadBack::Json, DataType::Array(_)) => match serde_json::from_str(text) {
            Ok(json @ serde_json::Value::Array(_)) => from_json(&json, data_type),
            _ => Err("not a JSON array".into()),
        },
        (ReadBack::Written, _) => parse_text(data_type, text),
        _ => Err("a type the sink does not write it to".into()),
    }
}

/// The value of `data_type` that [`to_json`] wrote as `json`: numbers and
/// booleans as themselves, the rest as their SQL text.
fn from_json(json: &serde_json::Value, data_type: &DataType) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match (json, data_type) {
        (J::Null, _) => Value::Null,
        (json, DataType::Json) => Value::Json(json.to_string()),
        (J::Array(items), DataType::Array(element)) => {
            Value::Array(items.iter().map(|i| from_json(i, element)).collect::<Result<_, _>>()?)
        }
        (J::Bool(b), DataType::Boolean) => Value::Boolean(*b),
        (J::Number(n), DataType::Int16 | DataType::Int32 | DataType::Int64) => {
            Value::Int64(n.as_i64().ok_or_else(|| format!("a number that is not a {data_type}"))?)
        }
        (J::Number(n), DataType::Float32 | DataType::Float64) => {
            Value::Float64(n.as_f64().ok_or_else(|| format!("a number that is not a {data_type}"))?)
        }
        (J::String(s), _) => parse_text(data_type, s)?,
        _ => return Err(format!("JSON that is not a {data_type} as the sink writes it")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(v: &Value, kind: CsvKind) -> String {
        let mut out = Vec::new();
        render_field(&mut out, &mut String::new(), v, kind).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fields_are_quoted_csv() {
        assert_eq!(field(&Value::Null, CsvKind::Text), "\\N");
        assert_eq!(field(&Value::Text("\\N".into()), CsvKind::Text), "\"\\N\"");
        assert_eq!(field(&Value::Text("a \"b\",\nc".into()), CsvKind::Text), "\"a \"\"b\"\",\nc\"");
        assert_eq!(field(&Value::Int32(-7), CsvKind::Text), "\"-7\"");
        assert_eq!(field(&Value::Bytes(vec![0, 0xab]), CsvKind::Hex), "00ab");
        assert_eq!(
            field(&Value::Array(vec![Value::Int32(1), Value::Null, Value::Text("x".into())]), CsvKind::Json),
            "\"[1,null,\"\"x\"\"]\""
        );
        assert_eq!(CsvKind::of("varbyte(64000)"), CsvKind::Hex);
        assert_eq!(CsvKind::of("super"), CsvKind::Json);
        assert_eq!(CsvKind::of("numeric(38,10)"), CsvKind::Numeric { integer: 28, scale: 10 });
        let n = CsvKind::of("numeric(38,10)");
        assert_eq!(field(&Value::Decimal("-12.5000000000000".into()), n), "\"-12.5000000000000\"");
        let refused = |v: &str| render_field(&mut Vec::new(), &mut String::new(), &Value::Decimal(v.into()), n);
        // Redshift would round these: refused, never rounded.
        assert!(refused("0.00000000001").is_err());
        assert!(refused("12345678901234567890123456789").is_err());
        assert!(refused("1234567890123456789012345678.1").is_ok());
    }

    #[test]
    fn values_read_back_as_they_were_written() {
        use tributary_schemas::canonical::canonical_text;
        assert_eq!(ReadBack::of("super"), ReadBack::Json);
        assert_eq!(ReadBack::of("varbyte(64000)"), ReadBack::Hex);
        assert_eq!(ReadBack::of("character varying(36)"), ReadBack::Written);
        assert_eq!(ReadBack::of("numeric(38,2)"), ReadBack::Printed);
        assert_eq!(ReadBack::of("timestamp with time zone"), ReadBack::Printed);
        assert_eq!(ReadBack::of("boolean"), ReadBack::Bool);
        assert_eq!(ReadBack::of("double precision"), ReadBack::Float);
        let tags = DataType::Array(Box::new(DataType::Text));
        let cases = [
            (tags.clone(), Value::Array(vec![Value::Text("a\"b".into()), Value::Null])),
            (DataType::Array(Box::new(DataType::Int32)), Value::Array(vec![Value::Int32(-1), Value::Int32(7)])),
            (DataType::Array(Box::new(DataType::Float32)), Value::Array(vec![Value::Float32(0.1)])),
            (DataType::Array(Box::new(DataType::Date)), Value::Array(vec![Value::Date(-1)])),
            (
                DataType::Array(Box::new(DataType::Json)),
                Value::Array(vec![Value::Json("{\"b\":1,\"a\":2}".into())]),
            ),
            (DataType::Bytes, Value::Bytes(vec![0, 0xfe])),
            (DataType::Interval, Value::Interval { months: 3, days: 1, micros: -4 }),
            (DataType::TimeSpan, Value::Time(-3_020_399_000_000)),
            (DataType::Uuid, Value::Uuid(uuid::Uuid::from_u128(9))),
        ];
        for (data_type, value) in cases {
            let raw =
                crate::sinks::redshift::dialect::destination_type(&Column::new("c", data_type.clone(), true)).render();
            let kind = ReadBack::of(&raw);
            let mut field = Vec::new();
            render_field(&mut field, &mut String::new(), &value, CsvKind::of(&raw)).unwrap();
            // What the column holds: the CSV field's text (test mode),
            // which JSON_SERIALIZE and FROM_VARBYTE give back as it is.
            let text = String::from_utf8(field).unwrap();
            let text = text
                .strip_prefix('"')
                .and_then(|t| t.strip_suffix('"'))
                .unwrap_or(&text)
                .replace("\"\"", "\"");
            let back = read_text(kind, &data_type, &text).unwrap();
            assert_eq!(canonical_text(&data_type, &back), canonical_text(&data_type, &value), "{data_type}");
        }
        assert!(read_text(ReadBack::Json, &tags, "{\"a\":1}").is_err(), "an object is no array");
        assert!(read_text(ReadBack::Hex, &DataType::Bytes, "abc").is_err());
        assert!(read_text(ReadBack::Json, &DataType::Json, TOO_LONG).is_err(), "named, never a JSON text");
    }

    #[test]
    fn records_count_line_ends_outside_quotes() {
        assert_eq!(csv_records(b"1,a\n2,\"b\nc\"\n3,\"d\"\"\n\"\n"), 3);
        assert_eq!(csv_records(b""), 0);
    }
}
