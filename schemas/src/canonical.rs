//! The canonical form of a row: what a verification compares between a
//! source table and its copy (docs/verification.md).
//!
//! A value's canonical text depends only on the value as the model holds
//! it and its column's [`DataType`], never on how a database prints it: the
//! source computes it from the values it decoded, a sink from the values it
//! reads back from the destination (each sink turning its destination's
//! types back into the model's, as its type mapping says). Two forms of
//! one value are one text: an `int16` read back as an `int64`, a `float32`
//! kept in a `FLOAT64`, a decimal without its trailing zeros, a JSON
//! document with its keys in another order, a UUID in upper case, an enum
//! label kept as text. What a destination cannot hold exactly, the sinks
//! refuse (docs/type-mapping.md); so equal canonical texts mean equal rows.
//!
//! A row's digest is a 64-bit hash of its columns' canonical texts (XXH3,
//! NULL told apart from every text) and one byte per column (a fingerprint
//! of that column's text), so that a row that differs says which column
//! does, without the row's values ever leaving the databases.

use crate::model::{DataType, TableSchema, Value};

/// A value's canonical text; `None` for NULL. `data_type` is the column's.
pub fn canonical_text(data_type: &DataType, value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => return None,
        Value::Boolean(b) => if *b { "t" } else { "f" }.to_string(),
        Value::Int16(v) => v.to_string(),
        Value::Int32(v) => v.to_string(),
        Value::Int64(v) => v.to_string(),
        Value::Float32(v) => float_text(f64::from(*v), data_type),
        Value::Float64(v) => float_text(*v, data_type),
        Value::Decimal(text) => decimal_text(text),
        Value::Text(text) | Value::Enum(text) => match data_type {
            // A destination without the type keeps its text.
            DataType::Uuid => text.to_ascii_lowercase(),
            DataType::Json => json_text(text),
            DataType::Decimal { .. } | DataType::VariableDecimal => decimal_text(text),
            _ => text.clone(),
        },
        Value::Json(text) => json_text(text),
        Value::Uuid(u) => u.hyphenated().to_string(),
        Value::Bytes(b) | Value::Geometry(b) => hex(b),
        Value::Date(d) => d.to_string(),
        Value::Time(t) => t.to_string(),
        Value::Timestamp(t) | Value::TimestampTz(t) => t.to_string(),
        Value::Interval { months, days, micros } => format!("{months}:{days}:{micros}"),
        Value::Array(items) => {
            let element = match data_type {
                DataType::Array(inner) => inner.as_ref(),
                other => other,
            };
            let items: Vec<serde_json::Value> = items
                .iter()
                .map(|v| canonical_text(element, v).map_or(serde_json::Value::Null, serde_json::Value::String))
                .collect();
            serde_json::Value::Array(items).to_string()
        }
        // The source's own text is the value (a destination of the
        // source's kind keeps it; any other refuses it).
        Value::SourceText { text, .. } => format!("source:{text}"),
        // Never read from a table: a marker between a source and itself.
        Value::Unchanged => "unchanged".to_string(),
    })
}

/// Shortest text that reads back as the same float of the column's width:
/// a `float32` column's value is compared as a 32-bit float wherever it is
/// kept.
fn float_text(v: f64, data_type: &DataType) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    match data_type {
        DataType::Float32 => format!("{}", v as f32),
        _ => format!("{v}"),
    }
}

/// A decimal's text without leading zeros, trailing fractional zeros or a
/// sign on zero: `-012.3400` is `-12.34`, `0.00` is `0`. Not a number
/// (`NaN`, `Infinity`) stays as it is.
fn decimal_text(text: &str) -> String {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return t.to_string();
    }
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let mut out = String::with_capacity(t.len());
    if negative && !(int.is_empty() && frac.is_empty()) {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// A JSON document with the keys of every object in order and no
/// insignificant space; text that is not JSON stays as it is.
fn json_text(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => sorted(v).to_string(),
        Err(_) => text.to_string(),
    }
}

fn sorted(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// A row as verification compares it: its key's text, a hash of every
/// column, and a fingerprint byte per column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDigest {
    /// The key's canonical texts as a JSON array (`["42"]`, `["a",null]`).
    pub key: String,
    /// A hash of the canonical texts of every column, in the schema's order.
    pub hash: u64,
    /// One byte per column, in the schema's order, from its canonical text.
    pub columns: Vec<u8>,
}

/// The digest of `row`, whose values are `schema`'s columns in order.
///
/// XXH3 (64 bits, seed 0: a fixed algorithm, so that runners of other
/// builds agree) over each column's tag (NULL or not), length and text;
/// the common types are written into one buffer, without a text per value.
pub fn digest_row(schema: &TableSchema, row: &[Value]) -> RowDigest {
    use std::hash::Hasher;
    use twox_hash::XxHash3_64;

    let mut hash = XxHash3_64::with_seed(0);
    let mut columns = Vec::with_capacity(schema.columns.len());
    let mut key: Vec<(usize, Option<String>)> = Vec::with_capacity(schema.key.len());
    let mut text = String::new();
    for (column, value) in schema.columns.iter().zip(row) {
        text.clear();
        let key_at = schema.key.iter().position(|k| *k == column.name);
        if write_canonical(&mut text, &column.data_type, value) {
            hash.write_u8(1);
            hash.write_u64(text.len() as u64);
            hash.write(text.as_bytes());
            columns.push(fingerprint(&text));
            if let Some(at) = key_at {
                key.push((at, Some(text.clone())));
            }
        } else {
            hash.write_u8(0);
            columns.push(0);
            if let Some(at) = key_at {
                key.push((at, None));
            }
        }
    }
    // In key order, which may differ from the columns' order.
    key.sort_by_key(|(at, _)| *at);
    RowDigest {
        key: key_text(key.into_iter().map(|(_, t)| t)),
        hash: hash.finish(),
        columns,
    }
}

/// [`canonical_text`] written into `out`; false for NULL (nothing
/// written).
pub fn write_canonical(out: &mut String, data_type: &DataType, value: &Value) -> bool {
    use std::fmt::Write;
    let plain_text =
        !matches!(data_type, DataType::Uuid | DataType::Json | DataType::Decimal { .. } | DataType::VariableDecimal);
    // Writing into a String cannot fail.
    let _ = match value {
        Value::Null => return false,
        Value::Int16(v) => write!(out, "{v}"),
        Value::Int32(v) => write!(out, "{v}"),
        Value::Int64(v) => write!(out, "{v}"),
        Value::Date(v) => write!(out, "{v}"),
        Value::Time(v) | Value::Timestamp(v) | Value::TimestampTz(v) => write!(out, "{v}"),
        Value::Text(t) | Value::Enum(t) if plain_text => {
            out.push_str(t);
            Ok(())
        }
        Value::Uuid(u) => write!(out, "{}", u.hyphenated()),
        other => match canonical_text(data_type, other) {
            Some(t) => {
                out.push_str(&t);
                Ok(())
            }
            None => return false,
        },
    };
    true
}

/// A column's fingerprint byte: never 0, which stands for NULL.
fn fingerprint(text: &str) -> u8 {
    let b = twox_hash::XxHash3_64::oneshot(text.as_bytes()) as u8;
    if b == 0 {
        1
    } else {
        b
    }
}

/// The JSON array of a key's canonical texts (as serde_json writes it).
pub fn key_text(texts: impl Iterator<Item = Option<String>>) -> String {
    let mut out = String::from("[");
    for (i, t) in texts.enumerate() {
        if i > 0 {
            out.push(',');
        }
        match t {
            None => out.push_str("null"),
            Some(t) => json_string(&mut out, &t),
        }
    }
    out.push(']');
    out
}

/// `text` as a JSON string, escaped as serde_json escapes it.
fn json_string(out: &mut String, text: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The canonical texts of a key's JSON array ([`key_text`]).
pub fn parse_key_text(text: &str) -> Option<Vec<Option<String>>> {
    let serde_json::Value::Array(items) = serde_json::from_str(text).ok()? else {
        return None;
    };
    items
        .into_iter()
        .map(|v| match v {
            serde_json::Value::Null => Some(None),
            serde_json::Value::String(s) => Some(Some(s)),
            _ => None,
        })
        .collect()
}

/// Whether a key column of this type can bound a verified range: its
/// values order the same way in every database we write to (numbers,
/// dates and times by value; text, UUIDs and bytes by their bytes, which
/// the source reads in with a binary collation).
pub fn orders_everywhere(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Boolean
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Decimal { .. }
            | DataType::VariableDecimal
            | DataType::Text
            | DataType::Uuid
            | DataType::Bytes
            | DataType::Date
            | DataType::Time
            | DataType::Timestamp
            | DataType::TimestampTz
    )
}

/// The value of a canonical text of a key column (one that
/// [`orders_everywhere`]), to bound a range in a destination's query.
pub fn key_value(data_type: &DataType, text: Option<&str>) -> Option<Value> {
    let Some(t) = text else { return Some(Value::Null) };
    Some(match data_type {
        DataType::Boolean => Value::Boolean(t == "t"),
        DataType::Int16 => Value::Int16(t.parse().ok()?),
        DataType::Int32 => Value::Int32(t.parse().ok()?),
        DataType::Int64 => Value::Int64(t.parse().ok()?),
        DataType::Decimal { .. } | DataType::VariableDecimal => Value::Decimal(t.to_string()),
        DataType::Text => Value::Text(t.to_string()),
        DataType::Uuid => Value::Uuid(uuid::Uuid::parse_str(t).ok()?),
        DataType::Bytes => Value::Bytes(unhex(t)?),
        DataType::Date => Value::Date(t.parse().ok()?),
        DataType::Time => Value::Time(t.parse().ok()?),
        DataType::Timestamp => Value::Timestamp(t.parse().ok()?),
        DataType::TimestampTz => Value::TimestampTz(t.parse().ok()?),
        _ => return None,
    })
}

fn unhex(t: &str) -> Option<Vec<u8>> {
    if !t.len().is_multiple_of(2) {
        return None;
    }
    (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(t.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Column, TableId};

    fn col(name: &str, data_type: DataType) -> Column {
        Column {
            name: name.into(),
            data_type,
            nullable: true,
            source_type: String::new(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        }
    }

    #[test]
    fn one_value_in_two_forms_is_one_text() {
        let d = DataType::Decimal { precision: 10, scale: 2 };
        assert_eq!(canonical_text(&d, &Value::Decimal("-012.3400".into())), Some("-12.34".into()));
        assert_eq!(canonical_text(&d, &Value::Decimal("-0.00".into())), Some("0".into()));
        assert_eq!(canonical_text(&d, &Value::Decimal("1.5".into())), canonical_text(&d, &Value::Text("1.50".into())));
        assert_eq!(
            canonical_text(&DataType::Int16, &Value::Int16(7)),
            canonical_text(&DataType::Int16, &Value::Int64(7))
        );
        assert_eq!(
            canonical_text(&DataType::Float32, &Value::Float32(0.1)),
            canonical_text(&DataType::Float32, &Value::Float64(f64::from(0.1f32)))
        );
        assert_eq!(
            canonical_text(&DataType::Json, &Value::Json(r#"{"b": 1, "a": [1, {"d":2,"c":3}]}"#.into())),
            Some(r#"{"a":[1,{"c":3,"d":2}],"b":1}"#.into())
        );
        let u = uuid::Uuid::from_u128(0xABCDEF);
        assert_eq!(
            canonical_text(&DataType::Uuid, &Value::Uuid(u)),
            canonical_text(&DataType::Uuid, &Value::Text(u.hyphenated().to_string().to_uppercase()))
        );
        let e = DataType::Enum { symbols: vec!["a".into()] };
        assert_eq!(canonical_text(&e, &Value::Enum("a".into())), canonical_text(&e, &Value::Text("a".into())));
        assert_eq!(canonical_text(&DataType::Text, &Value::Null), None);
        assert_eq!(canonical_text(&DataType::Float64, &Value::Float64(f64::NAN)), Some("NaN".into()));
    }

    #[test]
    fn a_row_digest_names_the_column_that_differs() {
        let schema = TableSchema {
            id: TableId::new("public", "t"),
            columns: vec![
                col("id", DataType::Int64),
                col("a", DataType::Text),
                col("b", DataType::Text),
            ],
            key: vec!["id".into()],
            dropped: Vec::new(),
        };
        let one = digest_row(&schema, &[Value::Int64(1), Value::Text("x".into()), Value::Null]);
        let two = digest_row(&schema, &[Value::Int64(1), Value::Text("x".into()), Value::Text(String::new())]);
        assert_eq!(one.key, r#"["1"]"#);
        assert_ne!(one.hash, two.hash, "NULL and the empty text differ");
        let differing: Vec<usize> = (0..3).filter(|&i| one.columns[i] != two.columns[i]).collect();
        assert_eq!(differing, vec![2]);
        assert_eq!(parse_key_text(&one.key), Some(vec![Some("1".to_string())]));
        // The key's JSON is serde_json's, escapes and all.
        let odd = vec![Some("a\"b\\c\n\u{1}\u{8}é".to_string()), None];
        let by_serde = serde_json::Value::Array(vec![
            serde_json::Value::String(odd[0].clone().unwrap_or_default()),
            serde_json::Value::Null,
        ])
        .to_string();
        assert_eq!(key_text(odd.clone().into_iter()), by_serde);
        assert_eq!(parse_key_text(&by_serde), Some(odd));
        assert_eq!(key_value(&DataType::Int64, Some("1")), Some(Value::Int64(1)));
    }
}
