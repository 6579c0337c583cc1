//! PostgreSQL types: the mapping of a column's type onto [`DataType`], and the
//! decoding of PostgreSQL's text output (pgoutput tuples and `COPY ... TO
//! STDOUT` text alike) into [`Value`].
//!
//! Every connection pins `DateStyle=ISO`, `IntervalStyle=iso_8601`,
//! `TimeZone=UTC`, `bytea_output=hex` and `extra_float_digits=3`
//! (the source's `SESSION_OPTIONS`; the sink sets the same before it reads
//! rows back to verify them), so the text forms parsed here
//! are the only ones that can arrive.
//!
//! Errors name the table, the column and the type, never the value.

use tributary_schemas::mapping::{self, SourceType};
use tributary_schemas::{Column, DataType, TableId, Value};

use crate::error::{Error, Result};
pub use crate::pgwire::{BinaryType, BINARY_COPY_SIGNATURE, PG_EPOCH_DAYS, PG_EPOCH_MICROS};

/// What the catalog says about a column's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgType {
    /// `pg_type.oid`.
    pub oid: u32,
    /// `pg_type.typname` of the type (of the base type for a domain),
    /// e.g. `int4`, `numeric`, `_text` for `text[]`.
    pub typname: String,
    /// `pg_type.typtype` of the (base) type: `b` base, `e` enum, `c`
    /// composite, `r` range, `m` multirange, `p` pseudo.
    pub typtype: char,
    /// `atttypmod` (-1 when none).
    pub typmod: i32,
    /// `format_type(oid, typmod)`, e.g. `numeric(12,2)` (the source
    /// spelling, `Column::source_type`); for a domain its base type's, with
    /// the domain's modifier, and for an array of one that array's
    /// (`integer[]`): a destination can recreate the base type.
    pub formatted: String,
    /// What the type mapping reads: `format_type` of the base type with
    /// the column's modifier for a domain (of the array type itself for an
    /// array), `formatted` otherwise.
    pub mapping_text: String,
    /// Element type of an array type.
    pub element: Option<Box<PgType>>,
    /// Labels of an enum type, in declaration order.
    pub enum_labels: Vec<String>,
}

/// Maps a PostgreSQL type onto the model with the project's mapping
/// (`tributary_schemas::mapping::postgres`, Debezium's choices). A type that
/// mapping does not know (`point`, composites, ...) is carried as its
/// canonical text, so a column never stops the source; `source_type` keeps
/// the exact spelling.
pub fn map_type(t: &PgType, table: &TableId, column: &str) -> DataType {
    let labels: &[String] = match &t.element {
        Some(e) if e.typtype == 'e' => &e.enum_labels,
        _ => &t.enum_labels,
    };
    let mut st = SourceType::new(table, column, &t.mapping_text);
    if t.typtype == 'e' || t.element.as_ref().is_some_and(|e| e.typtype == 'e') {
        st = st.with_enum_labels(labels);
    }
    match mapping::postgres::data_type(&st) {
        Ok(dt) => dt,
        Err(_) => {
            tracing::warn!(table = %table, column, source_type = %t.formatted, "unknown type carried as text");
            if t.element.is_some() {
                DataType::Array(Box::new(DataType::Text))
            } else {
                DataType::Text
            }
        }
    }
}

/// Where a value comes from, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct ColumnRef<'a> {
    /// The table.
    pub table: &'a TableId,
    /// The column.
    pub column: &'a str,
    /// The column's source type spelling.
    pub source_type: &'a str,
    /// Whether the column accepts NULL (array elements always do): a
    /// numeric `NaN` / `Infinity` is NULL there, zero otherwise.
    pub nullable: bool,
}

impl ColumnRef<'_> {
    fn error(&self, why: &str) -> Error {
        Error::permanent(format!("cannot decode a value of type {}: {why}", self.source_type))
            .with_table(self.table.clone())
            .with_column(self.column.to_string())
            .with_class("tributary.postgres.decode")
    }

    /// A numeric `NaN`, `Infinity` or `-Infinity` (`text`, as PostgreSQL
    /// prints it): a decimal has no form for them, so the column carries
    /// what Debezium carries with `decimal.handling.mode=precise` (NULL
    /// where the column is optional, zero, the type's fallback, where it
    /// is NOT NULL), and the value travels exactly as its text beside the
    /// row ([`Value::SourceText`]).
    fn special_numeric(&self, text: &str) -> Value {
        let nearest = if self.nullable {
            Value::Null
        } else {
            Value::Decimal("0".to_string())
        };
        Value::SourceText { text: text.to_string(), nearest: Box::new(nearest) }
    }

    /// The same column, for one element of its arrays (elements are nullable).
    fn element(&self) -> Self {
        Self { nullable: true, ..*self }
    }
}

/// Decodes one non-NULL value in PostgreSQL text output form.
pub fn decode_text(data_type: &DataType, text: &str, col: ColumnRef<'_>) -> Result<Value> {
    Ok(match data_type {
        DataType::Boolean => match text {
            // `bit(1)` prints 1 / 0.
            "t" | "true" | "1" => Value::Boolean(true),
            "f" | "false" | "0" => Value::Boolean(false),
            _ => return Err(col.error("not a boolean")),
        },
        DataType::Int16 => Value::Int16(text.parse().map_err(|_| col.error("not an int16"))?),
        DataType::Int32 => Value::Int32(text.parse().map_err(|_| col.error("not an int32"))?),
        DataType::Int64 => Value::Int64(text.parse().map_err(|_| col.error("not an int64"))?),
        DataType::Float32 => Value::Float32(parse_float(text).ok_or_else(|| col.error("not a float"))? as f32),
        DataType::Float64 => Value::Float64(parse_float(text).ok_or_else(|| col.error("not a float"))?),
        DataType::Decimal { .. } | DataType::VariableDecimal => {
            if text == "NaN" || text.ends_with("Infinity") {
                return Ok(col.special_numeric(text));
            }
            if text.contains('$') {
                // money (also under a domain's name): lc_monetary is
                // pinned to C, `-$1,234.56`.
                let plain: String = text.chars().filter(|c| c.is_ascii_digit() || *c == '-' || *c == '.').collect();
                return Ok(Value::Decimal(plain));
            }
            if !text.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b'.' || b == b'+') {
                return Err(col.error("not a decimal"));
            }
            Value::Decimal(text.to_string())
        }
        DataType::Text => Value::Text(text.to_string()),
        DataType::Json if col.source_type.starts_with("hstore") => {
            Value::Json(hstore_to_json(text).ok_or_else(|| col.error("not an hstore"))?)
        }
        DataType::Json => Value::Json(text.to_string()),
        DataType::Enum { .. } => Value::Enum(text.to_string()),
        DataType::Uuid => Value::Uuid(uuid::Uuid::parse_str(text).map_err(|_| col.error("not a uuid"))?),
        DataType::Bits { length } => {
            Value::Bytes(parse_bits(text, *length).ok_or_else(|| col.error("not a bit string of the column's length"))?)
        }
        DataType::Bytes => Value::Bytes(parse_bytea(text).ok_or_else(|| col.error("not hex bytea"))?),
        DataType::Geometry => Value::Geometry(parse_bytea_or_hex(text).ok_or_else(|| col.error("not hex WKB"))?),
        DataType::Date => Value::Date(parse_date(text).ok_or_else(|| col.error("not an ISO date"))?),
        DataType::Time | DataType::TimeSpan => {
            Value::Time(parse_time(text).ok_or_else(|| col.error("not an ISO time"))?)
        }
        DataType::Timestamp => {
            let (micros, exact) = timestamp_micros(text, false).ok_or_else(|| col.error("not an ISO timestamp"))?;
            beyond_range(Value::Timestamp(micros), exact, text)
        }
        DataType::TimestampTz => {
            let (micros, exact) = timestamp_micros(text, true).ok_or_else(|| col.error("not an ISO timestamptz"))?;
            beyond_range(Value::TimestampTz(micros), exact, text)
        }
        DataType::Interval => {
            let (months, days, micros) = parse_interval(text).ok_or_else(|| col.error("not an ISO 8601 interval"))?;
            Value::Interval { months, days, micros }
        }
        DataType::Array(elem) => {
            let delimiter = array_delimiter(col.source_type);
            let (items, lower_bounds) =
                parse_array_with(text, delimiter).ok_or_else(|| col.error("not an array literal"))?;
            let mut exact = !lower_bounds;
            let mut out = Vec::with_capacity(items.len());
            push_array_values(elem, items, col.element(), &mut out, &mut exact)?;
            if exact {
                Value::Array(out)
            } else {
                // The topic's `array<T>` holds one dimension from 1, and
                // elements of T: the elements in PostgreSQL's (row-major)
                // order, each the nearest of its type, and the value
                // exactly as its text beside the row.
                Value::SourceText {
                    text: text.to_string(),
                    nearest: Box::new(Value::Array(out)),
                }
            }
        }
    })
}

/// Cell `i` of `row`, PostgreSQL's text of a value of `column` of `table`
/// (NULL as [`Value::Null`]), decoded: how a destination speaking
/// PostgreSQL's protocol reads a value back that it selected as text.
pub fn text_cell(row: &tokio_postgres::Row, i: usize, table: &TableId, column: &Column) -> Result<Value> {
    let text: Option<&str> = row.try_get(i).map_err(|e| {
        Error::permanent(format!("reading column {} ({}) back as text: {e}", column.name, column.data_type))
            .with_table(table.clone())
            .with_column(column.name.clone())
    })?;
    match text {
        None => Ok(Value::Null),
        Some(t) => decode_text(
            &column.data_type,
            t,
            ColumnRef {
                table,
                column: &column.name,
                source_type: &column.source_type,
                nullable: column.nullable,
            },
        ),
    }
}

/// A timestamp's value, or, past the 64-bit microseconds (after
/// 294247-01-10, which PostgreSQL has up to 294276), the largest (smallest)
/// one with PostgreSQL's text beside it.
fn beyond_range(value: Value, exact: bool, text: &str) -> Value {
    if exact {
        value
    } else {
        Value::SourceText { text: text.to_string(), nearest: Box::new(value) }
    }
}

/// The delimiter of an array's elements: `;` for `box` (whose values hold
/// commas), `,` for every other built-in type.
fn array_delimiter(source_type: &str) -> char {
    if source_type.trim_end_matches("[]").trim() == "box" {
        ';'
    } else {
        ','
    }
}

/// The elements of an array, a multi-dimensional one flattened in
/// PostgreSQL's (row-major) order; `exact` becomes false where the value
/// has a shape the topic's `array<T>` cannot hold (several dimensions) or
/// an element without an exact form (a numeric NaN).
fn push_array_values(
    elem: &DataType,
    items: Vec<ArrayItem>,
    col: ColumnRef<'_>,
    out: &mut Vec<Value>,
    exact: &mut bool,
) -> Result<()> {
    for item in items {
        match item {
            ArrayItem::Null => out.push(Value::Null),
            ArrayItem::Text(t) => match decode_text(elem, &t, col)? {
                Value::SourceText { nearest, .. } => {
                    *exact = false;
                    out.push(*nearest);
                }
                v => out.push(v),
            },
            ArrayItem::Nested(inner) => {
                *exact = false;
                push_array_values(elem, inner, col, out, exact)?;
            }
        }
    }
    Ok(())
}

fn parse_float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// A `bit(length)` value (`0101...`, exactly `length` digits) as Debezium's
/// `Bits` carries it: the bit string read as a binary number, little-endian
/// in `ceil(length / 8)` bytes (the last digit is bit 0 of byte 0).
fn parse_bits(text: &str, length: u32) -> Option<Vec<u8>> {
    if text.len() != usize::try_from(length).ok()? {
        return None;
    }
    let mut out = vec![0u8; text.len().div_ceil(8)];
    for (i, c) in text.bytes().rev().enumerate() {
        match c {
            b'1' => out[i / 8] |= 1 << (i % 8),
            b'0' => {}
            _ => return None,
        }
    }
    Some(out)
}

/// hstore's text (`"a"=>"1", "b"=>NULL`) as a JSON object of strings.
fn hstore_to_json(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut pos = 0;
    let mut map = serde_json::Map::new();
    let skip_ws = |pos: &mut usize| {
        while chars.get(*pos).is_some_and(|c| c.is_whitespace() || *c == ',') {
            *pos += 1;
        }
    };
    let quoted = |pos: &mut usize| -> Option<String> {
        if chars.get(*pos) != Some(&'"') {
            return None;
        }
        *pos += 1;
        let mut s = String::new();
        loop {
            match chars.get(*pos)? {
                '\\' => {
                    s.push(*chars.get(*pos + 1)?);
                    *pos += 2;
                }
                '"' => {
                    *pos += 1;
                    return Some(s);
                }
                c => {
                    s.push(*c);
                    *pos += 1;
                }
            }
        }
    };
    loop {
        skip_ws(&mut pos);
        if pos >= chars.len() {
            break;
        }
        let key = quoted(&mut pos)?;
        while chars.get(pos).is_some_and(|c| c.is_whitespace()) {
            pos += 1;
        }
        if chars.get(pos) != Some(&'=') || chars.get(pos + 1) != Some(&'>') {
            return None;
        }
        pos += 2;
        while chars.get(pos).is_some_and(|c| c.is_whitespace()) {
            pos += 1;
        }
        let value = if chars.get(pos) == Some(&'"') {
            serde_json::Value::String(quoted(&mut pos)?)
        } else if chars[pos..].starts_with(&['N', 'U', 'L', 'L']) {
            pos += 4;
            serde_json::Value::Null
        } else {
            return None;
        };
        map.insert(key, value);
    }
    serde_json::to_string(&serde_json::Value::Object(map)).ok()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_hex(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks_exact(2)
        .map(|p| Some(hex_val(p[0])? << 4 | hex_val(p[1])?))
        .collect()
}

/// `\x0a0b` (bytea_output = hex).
fn parse_bytea(text: &str) -> Option<Vec<u8>> {
    parse_hex(text.strip_prefix("\\x")?.as_bytes())
}

fn parse_bytea_or_hex(text: &str) -> Option<Vec<u8>> {
    parse_bytea(text).or_else(|| parse_hex(text.as_bytes()))
}

/// Days since 1970-01-01 of a valid civil date (proleptic Gregorian, year
/// 0 = 1 BC), for every year PostgreSQL has (4713 BC to 5874897 AD, beyond
/// chrono's ±262143).
fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    let leap = year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day == 0 || day > days_in_month {
        return None;
    }
    Some(tributary_schemas::temporal::days_from_civil(year, month, day))
}

/// `YYYY-MM-DD[ BC]`; `infinity` / `-infinity` map to `i32::MAX` / `i32::MIN`.
pub fn parse_date(text: &str) -> Option<i32> {
    match text {
        "infinity" => return Some(i32::MAX),
        "-infinity" => return Some(i32::MIN),
        _ => {}
    }
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    let mut parts = body.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    let year = if bc { 1 - y } else { y };
    // PostgreSQL's dates all fit (its limit is the 32-bit Julian day).
    i32::try_from(days_from_civil(year, m, d)?).ok()
}

/// `HH:MM:SS[.ffffff]` as microseconds since midnight (`24:00:00` allowed).
pub fn parse_time(text: &str) -> Option<i64> {
    let mut parts = text.splitn(3, ':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let s = parts.next()?;
    let (secs, frac) = match s.split_once('.') {
        Some((a, b)) => (a, b),
        None => (s, ""),
    };
    let secs: i64 = secs.parse().ok()?;
    let micros = parse_fraction_micros(frac)?;
    if h > 24 || m > 59 || secs > 60 {
        return None;
    }
    Some(((h * 60 + m) * 60 + secs) * 1_000_000 + micros)
}

/// Up to six fraction digits as microseconds.
fn parse_fraction_micros(frac: &str) -> Option<i64> {
    if frac.is_empty() {
        return Some(0);
    }
    if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = frac.parse().ok()?;
    Some(v * 10i64.pow(6 - frac.len() as u32))
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]` as microseconds since
/// the epoch (UTC when `with_zone`); infinities map to `i64::MAX` / `i64::MIN`,
/// as do the instants after 294247-01-10 that PostgreSQL has (up to 294276
/// AD) and 64-bit microseconds do not.
pub fn parse_timestamp(text: &str, with_zone: bool) -> Option<i64> {
    timestamp_micros(text, with_zone).map(|(micros, _)| micros)
}

/// [`parse_timestamp`], and whether the microseconds are the value (false
/// for a value past the 64-bit microseconds, given as the largest or
/// smallest).
pub fn timestamp_micros(text: &str, with_zone: bool) -> Option<(i64, bool)> {
    match text {
        "infinity" => return Some((i64::MAX, true)),
        "-infinity" => return Some((i64::MIN, true)),
        _ => {}
    }
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    let (date, rest) = body.split_once(' ')?;
    let (time, offset_secs) = if with_zone {
        // The offset starts at the last '+' or '-' of the time part.
        let pos = rest.rfind(['+', '-'])?;
        let (t, z) = rest.split_at(pos);
        let sign = if z.starts_with('-') { -1 } else { 1 };
        let mut zp = z[1..].split(':');
        let zh: i64 = zp.next()?.parse().ok()?;
        let zm: i64 = zp.next().map(|v| v.parse().ok()).unwrap_or(Some(0))?;
        let zs: i64 = zp.next().map(|v| v.parse().ok()).unwrap_or(Some(0))?;
        (t, sign * (zh * 3600 + zm * 60 + zs))
    } else {
        (rest, 0)
    };
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let year = if bc { 1 - y } else { y };
    let days = i128::from(days_from_civil(year, mo, d)?);
    let tod = i128::from(parse_time(time)?);
    let micros = days * 86_400_000_000 + tod - i128::from(offset_secs) * 1_000_000;
    // i64::MAX and MIN are the infinities: a value that lands on them is
    // not exact either.
    let exact = micros > i128::from(i64::MIN) && micros < i128::from(i64::MAX);
    Some((micros.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64, exact))
}

/// ISO 8601 interval as PostgreSQL prints it with `IntervalStyle=iso_8601`,
/// e.g. `P1Y2M3DT4H5M6.5S`, `P-1Y-2M3DT-4H`, `PT0S`.
pub fn parse_interval(text: &str) -> Option<(i32, i32, i64)> {
    let body = text.strip_prefix('P')?;
    let (date_part, time_part) = match body.split_once('T') {
        Some((d, t)) => (d, t),
        None => (body, ""),
    };
    let mut months: i64 = 0;
    let mut days: i64 = 0;
    let mut micros: i64 = 0;
    let mut num = String::new();
    for c in date_part.chars() {
        match c {
            'Y' => {
                months += num.parse::<i64>().ok()? * 12;
                num.clear();
            }
            'M' => {
                months += num.parse::<i64>().ok()?;
                num.clear();
            }
            'W' => {
                days += num.parse::<i64>().ok()? * 7;
                num.clear();
            }
            'D' => {
                days += num.parse::<i64>().ok()?;
                num.clear();
            }
            c => num.push(c),
        }
    }
    if !num.is_empty() {
        return None;
    }
    for c in time_part.chars() {
        match c {
            'H' => {
                micros += num.parse::<i64>().ok()? * 3_600_000_000;
                num.clear();
            }
            'M' => {
                micros += num.parse::<i64>().ok()? * 60_000_000;
                num.clear();
            }
            'S' => {
                let negative = num.starts_with('-');
                let digits = num.trim_start_matches(['-', '+']);
                let (whole, frac) = match digits.split_once('.') {
                    Some((w, f)) => (w, f),
                    None => (digits, ""),
                };
                let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
                let v = whole * 1_000_000 + parse_fraction_micros(frac)?;
                micros += if negative { -v } else { v };
                num.clear();
            }
            c => num.push(c),
        }
    }
    if !num.is_empty() {
        return None;
    }
    Some((i32::try_from(months).ok()?, i32::try_from(days).ok()?, micros))
}

/// One element of a parsed array literal.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayItem {
    /// `NULL`.
    Null,
    /// An element's text, unquoted and unescaped.
    Text(String),
    /// A sub-array (multi-dimensional arrays).
    Nested(Vec<ArrayItem>),
}

/// Parses PostgreSQL's array output: `{1,2,NULL}`, `{"a b","x\"y"}`,
/// `{{1,2},{3,4}}`, with an optional `[lo:hi]=` dimension prefix.
pub fn parse_array(text: &str) -> Option<Vec<ArrayItem>> {
    parse_array_with(text, ',').map(|(items, _)| items)
}

/// [`parse_array`] with the element type's delimiter (`;` for `box`), and
/// whether the text had the `[lo:hi]=` prefix (PostgreSQL prints it only
/// when a lower bound is not 1).
pub fn parse_array_with(text: &str, delimiter: char) -> Option<(Vec<ArrayItem>, bool)> {
    let mut s = text;
    let bounds = s.starts_with('[');
    if bounds {
        s = &s[s.find('=')? + 1..];
    }
    let bytes: Vec<char> = s.chars().collect();
    let mut pos = 0;
    let items = parse_array_level(&bytes, &mut pos, delimiter, 0)?;
    if pos != bytes.len() {
        return None;
    }
    Some((items, bounds))
}

/// PostgreSQL's limit on an array's dimensions (`MAXDIM`): deeper text is
/// no array it printed, and the recursion stays bounded.
const MAX_ARRAY_DIMENSIONS: usize = 6;

fn parse_array_level(s: &[char], pos: &mut usize, delimiter: char, depth: usize) -> Option<Vec<ArrayItem>> {
    if s.get(*pos) != Some(&'{') || depth >= MAX_ARRAY_DIMENSIONS {
        return None;
    }
    *pos += 1;
    let mut items = Vec::new();
    if s.get(*pos) == Some(&'}') {
        *pos += 1;
        return Some(items);
    }
    loop {
        match s.get(*pos)? {
            '{' => items.push(ArrayItem::Nested(parse_array_level(s, pos, delimiter, depth + 1)?)),
            '"' => {
                *pos += 1;
                let mut out = String::new();
                loop {
                    match s.get(*pos)? {
                        '\\' => {
                            out.push(*s.get(*pos + 1)?);
                            *pos += 2;
                        }
                        '"' => {
                            *pos += 1;
                            break;
                        }
                        c => {
                            out.push(*c);
                            *pos += 1;
                        }
                    }
                }
                items.push(ArrayItem::Text(out));
            }
            _ => {
                let mut out = String::new();
                while let Some(c) = s.get(*pos) {
                    if *c == delimiter || *c == '}' {
                        break;
                    }
                    if *c == '\\' {
                        out.push(*s.get(*pos + 1)?);
                        *pos += 2;
                    } else {
                        out.push(*c);
                        *pos += 1;
                    }
                }
                let trimmed = out.trim();
                if trimmed.eq_ignore_ascii_case("NULL") {
                    items.push(ArrayItem::Null);
                } else {
                    items.push(ArrayItem::Text(trimmed.to_string()));
                }
            }
        }
        match s.get(*pos)? {
            c if *c == delimiter => *pos += 1,
            '}' => {
                *pos += 1;
                return Some(items);
            }
            _ => return None,
        }
    }
}

/// Splits one line of `COPY ... TO STDOUT` text format into fields, undoing
/// COPY's escapes; `None` fields are `\N` (NULL).
pub fn split_copy_line(line: &[u8], out: &mut Vec<Option<String>>) -> std::result::Result<(), NotUtf8> {
    out.clear();
    for field in copy_fields(line) {
        out.push(match field {
            None => None,
            Some(raw) => Some(unescape_copy_field(raw)?.into_owned()),
        });
    }
    Ok(())
}

/// The raw fields of one COPY text line (`None` for `\N`), still escaped.
pub fn copy_fields(line: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.split(|b| *b == b'\t').map(|f| if f == b"\\N" { None } else { Some(f) })
}

/// Undoes COPY's escapes in one field; borrows when there are none (the
/// common case), so the snapshot does not allocate per field.
pub fn unescape_copy_field(field: &[u8]) -> std::result::Result<std::borrow::Cow<'_, str>, NotUtf8> {
    if !field.contains(&b'\\') {
        return std::str::from_utf8(field).map(std::borrow::Cow::Borrowed).map_err(|_| NotUtf8);
    }
    let mut buf = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' || i + 1 >= field.len() {
            buf.push(b);
            i += 1;
            continue;
        }
        let e = field[i + 1];
        i += 2;
        match e {
            b'b' => buf.push(8),
            b'f' => buf.push(12),
            b'n' => buf.push(b'\n'),
            b'r' => buf.push(b'\r'),
            b't' => buf.push(b'\t'),
            b'v' => buf.push(11),
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + (field[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                buf.push(v as u8);
            }
            b'x' => {
                let mut v = 0u8;
                let mut n = 0;
                while n < 2 && i < field.len() {
                    match hex_val(field[i]) {
                        Some(h) => {
                            v = v * 16 + h;
                            i += 1;
                            n += 1;
                        }
                        None => break,
                    }
                }
                buf.push(v);
            }
            other => buf.push(other),
        }
    }
    String::from_utf8(buf).map(std::borrow::Cow::Owned).map_err(|_| NotUtf8)
}

/// A COPY field that is not valid UTF-8 once unescaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUtf8;

impl std::fmt::Display for NotUtf8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("COPY text is not valid UTF-8")
    }
}

impl std::error::Error for NotUtf8 {}

/// Rough size of a value in bytes, for batch limits.
pub fn value_size(v: &Value) -> usize {
    match v {
        Value::Text(s) | Value::Json(s) | Value::Decimal(s) | Value::Enum(s) => s.len() + 8,
        Value::Bytes(b) | Value::Geometry(b) => b.len() + 8,
        Value::Array(items) => items.iter().map(value_size).sum::<usize>() + 8,
        Value::SourceText { text, nearest } => text.len() + value_size(nearest),
        _ => 8,
    }
}

// ---------------------------------------------------------------- binary COPY

/// `source_type` without its modifiers (`numeric(12,2)` -> `numeric`,
/// `timestamp(3) with time zone` -> `timestamp with time zone`); `None`
/// for arrays.
fn base_type(source_type: &str) -> Option<String> {
    if source_type.contains('[') {
        return None;
    }
    let mut s = source_type.to_string();
    if let (Some(open), Some(close)) = (s.find('('), s.find(')')) {
        if open < close {
            s = format!("{}{}", &s[..open], &s[close + 1..]);
        }
    }
    Some(s.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The binary reader of a column with this mapped type and source type, if
/// there is one (domains, enums, arrays, `money`, `bit`, `hstore`,
/// `interval`, network types... are read as text).
pub fn binary_column(data_type: &DataType, source_type: &str) -> Option<BinaryType> {
    let t = BinaryType::from_base(&base_type(source_type)?)?;
    let fits = match t {
        BinaryType::Bool => *data_type == DataType::Boolean,
        BinaryType::Int2 => *data_type == DataType::Int16,
        BinaryType::Int4 => *data_type == DataType::Int32,
        BinaryType::Int8 => *data_type == DataType::Int64,
        BinaryType::Float4 => *data_type == DataType::Float32,
        BinaryType::Float8 => *data_type == DataType::Float64,
        BinaryType::Numeric => matches!(data_type, DataType::Decimal { .. } | DataType::VariableDecimal),
        BinaryType::Text => *data_type == DataType::Text,
        BinaryType::Json | BinaryType::Jsonb => *data_type == DataType::Json,
        BinaryType::Bytea => *data_type == DataType::Bytes,
        BinaryType::Uuid => *data_type == DataType::Uuid,
        BinaryType::Date => *data_type == DataType::Date,
        BinaryType::Time => *data_type == DataType::Time,
        BinaryType::Timestamp => *data_type == DataType::Timestamp,
        BinaryType::TimestampTz => *data_type == DataType::TimestampTz,
    };
    fits.then_some(t)
}

/// The readers of every column of `columns` (`(data type, source type)`),
/// or `None` when one has none: the table is then read as text.
pub fn binary_columns<'a>(columns: impl IntoIterator<Item = (&'a DataType, &'a str)>) -> Option<Vec<BinaryType>> {
    columns.into_iter().map(|(t, s)| binary_column(t, s)).collect()
}

/// Decodes one non-NULL value of a binary `COPY` tuple.
pub fn decode_binary(kind: BinaryType, data: &[u8], col: ColumnRef<'_>) -> Result<Value> {
    fn fixed<const N: usize>(data: &[u8], col: &ColumnRef<'_>) -> Result<[u8; N]> {
        data.try_into().map_err(|_| col.error("a binary value of the wrong length"))
    }
    let text = |data: &[u8]| -> Result<String> {
        std::str::from_utf8(data)
            .map(str::to_string)
            .map_err(|_| col.error("not valid UTF-8 text"))
    };
    Ok(match kind {
        BinaryType::Bool => Value::Boolean(fixed::<1>(data, &col)?[0] != 0),
        BinaryType::Int2 => Value::Int16(i16::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Int4 => Value::Int32(i32::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Int8 => Value::Int64(i64::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Float4 => Value::Float32(f32::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Float8 => Value::Float64(f64::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Numeric => match numeric_text(data, &col)? {
            Ok(text) => Value::Decimal(text),
            Err(special) => col.special_numeric(special),
        },
        BinaryType::Text => Value::Text(text(data)?),
        BinaryType::Json => Value::Json(text(data)?),
        BinaryType::Jsonb => match data.split_first() {
            Some((1, rest)) => Value::Json(text(rest)?),
            _ => return Err(col.error("an unknown jsonb binary version")),
        },
        BinaryType::Bytea => Value::Bytes(data.to_vec()),
        BinaryType::Uuid => Value::Uuid(uuid::Uuid::from_bytes(fixed(data, &col)?)),
        BinaryType::Date => Value::Date(match i32::from_be_bytes(fixed(data, &col)?) {
            // -infinity and infinity, as `parse_date` maps them.
            i32::MIN => i32::MIN,
            i32::MAX => i32::MAX,
            d => d.checked_add(PG_EPOCH_DAYS).ok_or_else(|| col.error("a date out of range"))?,
        }),
        BinaryType::Time => Value::Time(i64::from_be_bytes(fixed(data, &col)?)),
        BinaryType::Timestamp | BinaryType::TimestampTz => {
            let zone = kind == BinaryType::TimestampTz;
            let typed = |micros| {
                if zone {
                    Value::TimestampTz(micros)
                } else {
                    Value::Timestamp(micros)
                }
            };
            match i64::from_be_bytes(fixed(data, &col)?) {
                i64::MIN => typed(i64::MIN),
                i64::MAX => typed(i64::MAX),
                t => match t.checked_add(PG_EPOCH_MICROS).filter(|m| *m != i64::MAX && *m != i64::MIN) {
                    Some(micros) => typed(micros),
                    // Past 294247-01-10 (PostgreSQL goes to 294276 AD): the
                    // largest value, PostgreSQL's text beside it, as the
                    // text reader gives it.
                    None => Value::SourceText {
                        text: timestamp_text(i128::from(t) + i128::from(PG_EPOCH_MICROS), zone),
                        nearest: Box::new(typed(if t > 0 { i64::MAX } else { i64::MIN })),
                    },
                },
            }
        }
    })
}

/// PostgreSQL's text of a timestamp (`DateStyle = ISO`, `TimeZone = UTC`)
/// `micros` after 1970-01-01, for the few past the 64-bit microseconds.
fn timestamp_text(micros: i128, zone: bool) -> String {
    const DAY: i128 = 86_400_000_000;
    let days = micros.div_euclid(DAY);
    let tod = micros.rem_euclid(DAY);
    let (y, m, d) = tributary_schemas::temporal::civil_from_days(i64::try_from(days).unwrap_or_default());
    let (secs, frac) = (tod / 1_000_000, tod % 1_000_000);
    let mut out = format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac > 0 {
        let digits = format!(".{frac:06}");
        out.push_str(digits.trim_end_matches('0'));
    }
    if zone {
        out.push_str("+00");
    }
    out
}

/// A binary `numeric` as the text `numeric_out` prints: base-10000 digit
/// groups, the weight of the first, the sign and the display scale; `Err`
/// with the text of `NaN`, `Infinity` and `-Infinity`.
fn numeric_text(data: &[u8], col: &ColumnRef<'_>) -> Result<std::result::Result<String, &'static str>> {
    let short = || col.error("a binary numeric too short");
    let word = |i: usize| -> Option<u16> { Some(u16::from_be_bytes([*data.get(i)?, *data.get(i + 1)?])) };
    let ndigits = usize::from(word(0).ok_or_else(short)?);
    let weight = i32::from(word(2).ok_or_else(short)? as i16);
    let sign = word(4).ok_or_else(short)?;
    let dscale = usize::from(word(6).ok_or_else(short)?);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Ok(Err("NaN")),
        0xD000 => return Ok(Err("Infinity")),
        0xF000 => return Ok(Err("-Infinity")),
        _ => return Err(col.error("a binary numeric of an unknown sign")),
    }
    // Read in place, no copy of the digits: this runs for every numeric
    // of a binary snapshot.
    if data.len() < 8 + 2 * ndigits {
        return Err(short());
    }
    if (0..ndigits).any(|k| word(8 + 2 * k).is_some_and(|d| d > 9999)) {
        return Err(col.error("a binary numeric digit out of range"));
    }
    let group = |i: i32| -> u16 {
        usize::try_from(i)
            .ok()
            .filter(|&i| i < ndigits)
            .and_then(|i| word(8 + 2 * i))
            .unwrap_or(0)
    };
    // A group's four decimal digits, leading zeros included.
    let four =
        |g: u16| -> [char; 4] { [g / 1000, g / 100 % 10, g / 10 % 10, g % 10].map(|d| char::from(b'0' + d as u8)) };
    let mut out = String::with_capacity(ndigits * 4 + dscale + 2);
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for i in 0..=weight {
            let digits = four(group(i));
            // The first group without its leading zeros (but one digit).
            let from = if i == 0 {
                digits.iter().take(3).take_while(|c| **c == '0').count()
            } else {
                0
            };
            out.extend(&digits[from..]);
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut left = dscale;
        let mut i = weight + 1;
        while left > 0 {
            let take = left.min(4);
            out.extend(&four(group(i))[..take]);
            left -= take;
            i += 1;
        }
    }
    Ok(Ok(out))
}

/// The text of a key value as a SQL literal reads it back (`'...'::type`),
/// for the resume point of a table read in binary; `None` for key types
/// whose text this does not write (such tables are read as text).
pub fn key_literal_text(value: &Value) -> Option<String> {
    match value {
        Value::Int16(v) => Some(v.to_string()),
        Value::Int32(v) => Some(v.to_string()),
        Value::Int64(v) => Some(v.to_string()),
        Value::Text(s) | Value::Decimal(s) => Some(s.clone()),
        Value::Uuid(u) => Some(u.hyphenated().to_string()),
        // A numeric key's NaN or infinity.
        Value::SourceText { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// Whether a key column of this reader has a [`key_literal_text`].
pub fn binary_key_ok(kind: BinaryType) -> bool {
    matches!(
        kind,
        BinaryType::Int2
            | BinaryType::Int4
            | BinaryType::Int8
            | BinaryType::Text
            | BinaryType::Numeric
            | BinaryType::Uuid
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_numerics_read_as_numeric_out_prints_them() {
        let t = TableId::new("s", "t");
        let num = |ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]| {
            let mut b = Vec::new();
            for w in [ndigits, weight as u16, sign, dscale].into_iter().chain(digits.iter().copied()) {
                b.extend_from_slice(&w.to_be_bytes());
            }
            decode_binary(BinaryType::Numeric, &b, col(&t))
        };
        assert_eq!(num(4, 2, 0, 3, &[1, 2345, 6789, 1250]).unwrap(), Value::Decimal("123456789.125".into()));
        assert_eq!(num(1, -2, 0x4000, 6, &[100]).unwrap(), Value::Decimal("-0.000001".into()));
        assert_eq!(num(0, 0, 0, 2, &[]).unwrap(), Value::Decimal("0.00".into()));
        assert_eq!(num(1, 2, 0, 0, &[1]).unwrap(), Value::Decimal("100000000".into()));
        assert_eq!(num(2, 0, 0x4000, 2, &[1234, 5000]).unwrap(), Value::Decimal("-1234.50".into()));
        // NaN, Infinity, -Infinity: their text, NULL in a nullable column.
        let special = |text: &str| Value::SourceText { text: text.into(), nearest: Box::new(Value::Null) };
        assert_eq!(num(0, 0, 0xC000, 0, &[]).unwrap(), special("NaN"));
        assert_eq!(num(0, 0, 0xD000, 0, &[]).unwrap(), special("Infinity"));
        assert_eq!(num(0, 0, 0xF000, 0, &[]).unwrap(), special("-Infinity"));
        assert!(num(0, 0, 0x8000, 0, &[]).is_err(), "unknown sign");
        assert!(num(2, 0, 0, 0, &[1]).is_err(), "short");
        assert!(num(1, 0, 0, 0, &[10_000]).is_err(), "digit out of range");
    }

    /// `numeric_out`'s text of base-10000 groups, written the plain way
    /// (each group formatted on its own), to check the in-place reader.
    fn numeric_reference(digits: &[u16], weight: i16, negative: bool, dscale: u16) -> String {
        let group = |i: i32| usize::try_from(i).ok().and_then(|i| digits.get(i).copied()).unwrap_or(0);
        let mut out = String::from(if negative { "-" } else { "" });
        if weight < 0 {
            out.push('0');
        } else {
            for i in 0..=i32::from(weight) {
                out.push_str(&if i == 0 {
                    group(i).to_string()
                } else {
                    format!("{:04}", group(i))
                });
            }
        }
        if dscale > 0 {
            out.push('.');
            let fraction: String = (i32::from(weight) + 1..)
                .map(|i| format!("{:04}", group(i)))
                .take(usize::from(dscale).div_ceil(4))
                .collect();
            out.push_str(&fraction[..usize::from(dscale)]);
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn binary_numerics_match_the_plain_rendering(
            digits in proptest::collection::vec(0u16..10_000, 0..8),
            weight in -4i16..8,
            negative: bool,
            dscale in 0u16..24,
        ) {
            let t = TableId::new("s", "t");
            let mut b = Vec::new();
            let sign = if negative { 0x4000 } else { 0 };
            for w in [digits.len() as u16, weight as u16, sign, dscale].into_iter().chain(digits.iter().copied()) {
                b.extend_from_slice(&w.to_be_bytes());
            }
            let read = decode_binary(BinaryType::Numeric, &b, col(&t)).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            proptest::prop_assert_eq!(read, Value::Decimal(numeric_reference(&digits, weight, negative, dscale)));
        }
    }

    #[test]
    fn binary_readers_only_for_plain_types() {
        assert_eq!(binary_column(&DataType::Int32, "integer"), Some(BinaryType::Int4));
        assert_eq!(
            binary_column(&DataType::Decimal { precision: 12, scale: 2 }, "numeric(12,2)"),
            Some(BinaryType::Numeric)
        );
        assert_eq!(binary_column(&DataType::TimestampTz, "timestamp(3) with time zone"), Some(BinaryType::TimestampTz));
        assert_eq!(binary_column(&DataType::Text, "character varying(10)"), Some(BinaryType::Text));
        assert_eq!(binary_column(&DataType::Decimal { precision: 12, scale: 2 }, "money"), None);
        assert_eq!(binary_column(&DataType::Int32, "s.posint"), None);
        assert_eq!(binary_column(&DataType::Text, "inet"), None);
        assert_eq!(binary_column(&DataType::Bytes, "bit(9)"), None);
        assert_eq!(binary_column(&DataType::Array(Box::new(DataType::Int32)), "integer[]"), None);
        let t = TableId::new("s", "t");
        assert_eq!(decode_binary(BinaryType::Date, &i32::MAX.to_be_bytes(), col(&t)).unwrap(), Value::Date(i32::MAX));
        assert_eq!(decode_binary(BinaryType::Date, &0i32.to_be_bytes(), col(&t)).unwrap(), Value::Date(10_957));
        assert_eq!(
            decode_binary(BinaryType::Timestamp, &i64::MIN.to_be_bytes(), col(&t)).unwrap(),
            Value::Timestamp(i64::MIN)
        );
        assert!(decode_binary(BinaryType::Int4, &[0, 1], col(&t)).is_err());
        assert!(decode_binary(BinaryType::Jsonb, b"\x02{}", col(&t)).is_err());
    }

    fn col<'a>(t: &'a TableId) -> ColumnRef<'a> {
        ColumnRef {
            table: t,
            column: "c",
            source_type: "x",
            nullable: true,
        }
    }

    fn pg(name: &str, typmod: i32) -> PgType {
        PgType {
            oid: 0,
            typname: name.into(),
            typtype: 'b',
            typmod,
            formatted: name.into(),
            mapping_text: name.into(),
            element: None,
            enum_labels: vec![],
        }
    }

    #[test]
    fn maps_with_the_shared_mapping_and_falls_back_to_text() {
        let t = TableId::new("s", "t");
        assert_eq!(map_type(&pg("numeric(12,2)", -1), &t, "c"), DataType::Decimal { precision: 12, scale: 2 });
        assert_eq!(map_type(&pg("numeric", -1), &t, "c"), DataType::VariableDecimal);
        assert_eq!(map_type(&pg("inet", -1), &t, "c"), DataType::Text);
        assert_eq!(map_type(&pg("point", -1), &t, "c"), DataType::Text);
        let mut e = pg("mood", -1);
        e.typtype = 'e';
        e.enum_labels = vec!["a".into(), "b".into()];
        assert_eq!(map_type(&e, &t, "c"), DataType::Enum { symbols: vec!["a".into(), "b".into()] });
    }

    #[test]
    fn decodes_money_bits_and_hstore() {
        let t = TableId::new("s", "t");
        let c = |st: &'static str| ColumnRef {
            table: &t,
            column: "c",
            source_type: st,
            nullable: true,
        };
        let money = DataType::Decimal { precision: 19, scale: 2 };
        assert_eq!(decode_text(&money, "-$1,234.50", c("money")).unwrap(), Value::Decimal("-1234.50".into()));
        assert_eq!(decode_text(&DataType::Boolean, "1", c("bit(1)")).unwrap(), Value::Boolean(true));
        // Debezium's Bits: the number 0b1_0100_0001, little-endian.
        assert_eq!(
            decode_text(&DataType::Bits { length: 9 }, "101000001", c("bit(9)")).unwrap(),
            Value::Bytes(vec![0b0100_0001, 0b1])
        );
        assert_eq!(
            decode_text(&DataType::Bits { length: 16 }, "0000000000000001", c("bit(16)")).unwrap(),
            Value::Bytes(vec![1, 0])
        );
        // The column's length exactly; a domain's spelling does not matter.
        assert!(decode_text(&DataType::Bits { length: 9 }, "10100000", c("bit(9)")).is_err());
        assert!(decode_text(&DataType::Bits { length: 2 }, "12", c("s.flags")).is_err());
        assert_eq!(
            decode_text(&DataType::Bits { length: 4 }, "1010", c("s.flags")).unwrap(),
            Value::Bytes(vec![0b1010])
        );
        // money under a domain's name.
        assert_eq!(decode_text(&money, "$0.01", c("s.price")).unwrap(), Value::Decimal("0.01".into()));
        assert_eq!(
            decode_text(&DataType::Json, "\"a\"=>\"1\", \"b\"=>NULL", c("hstore")).unwrap(),
            Value::Json("{\"a\":\"1\",\"b\":null}".into())
        );
    }

    #[test]
    fn decodes_scalars() {
        let t = TableId::new("s", "t");
        let c = col(&t);
        assert_eq!(decode_text(&DataType::Boolean, "t", c).unwrap(), Value::Boolean(true));
        assert_eq!(decode_text(&DataType::Int64, "-42", c).unwrap(), Value::Int64(-42));
        assert!(matches!(decode_text(&DataType::Float64, "NaN", c).unwrap(), Value::Float64(f) if f.is_nan()));
        assert_eq!(decode_text(&DataType::Float64, "-Infinity", c).unwrap(), Value::Float64(f64::NEG_INFINITY));
        assert_eq!(decode_text(&DataType::Bytes, "\\x00ff", c).unwrap(), Value::Bytes(vec![0, 255]));
        assert_eq!(decode_text(&DataType::Date, "1970-01-02", c).unwrap(), Value::Date(1));
        assert_eq!(decode_text(&DataType::Time, "00:00:01.5", c).unwrap(), Value::Time(1_500_000));
        assert_eq!(decode_text(&DataType::Timestamp, "1970-01-01 00:00:01", c).unwrap(), Value::Timestamp(1_000_000));
        assert_eq!(decode_text(&DataType::TimestampTz, "1970-01-01 02:00:00+02", c).unwrap(), Value::TimestampTz(0));
        assert_eq!(
            decode_text(&DataType::TimestampTz, "1970-01-01 00:00:00-05:30", c).unwrap(),
            Value::TimestampTz(5 * 3_600_000_000 + 30 * 60_000_000)
        );
        assert_eq!(decode_text(&DataType::Date, "0001-01-01 BC", c).unwrap(), Value::Date(-719528));
    }

    #[test]
    fn special_numerics_carry_their_text_beside_null_or_zero() {
        let t = TableId::new("s", "t");
        let optional = col(&t);
        let required = ColumnRef { nullable: false, ..optional };
        let special = |text: &str, nearest: Value| Value::SourceText { text: text.into(), nearest: Box::new(nearest) };
        for dt in [DataType::VariableDecimal, DataType::Decimal { precision: 12, scale: 3 }] {
            for text in ["NaN", "Infinity", "-Infinity"] {
                assert_eq!(decode_text(&dt, text, optional).unwrap(), special(text, Value::Null), "{dt} {text}");
                assert_eq!(
                    decode_text(&dt, text, required).unwrap(),
                    special(text, Value::Decimal("0".into())),
                    "{dt} {text}"
                );
            }
        }
        // Binary COPY: the NaN sign word.
        let nan = [0u8, 0, 0, 0, 0xC0, 0, 0, 0];
        assert_eq!(
            decode_binary(BinaryType::Numeric, &nan, required).unwrap(),
            special("NaN", Value::Decimal("0".into()))
        );
        // An array with a NaN: the array's text, its elements with NULL
        // for the NaN (elements are nullable).
        assert_eq!(
            decode_text(&DataType::Array(Box::new(DataType::VariableDecimal)), "{1.5,NaN}", required).unwrap(),
            special("{1.5,NaN}", Value::Array(vec![Value::Decimal("1.5".into()), Value::Null]))
        );
        // Other garbage is still refused, naming the column and not the value.
        let e = decode_text(&DataType::VariableDecimal, "12abc", required).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Permanent);
        assert_eq!(e.column(), Some("c"));
        assert!(!e.to_string().contains("12abc"), "{e}");
    }

    #[test]
    fn arrays_of_other_shapes_carry_their_text_beside_the_elements() {
        let t = TableId::new("s", "t");
        let ints = DataType::Array(Box::new(DataType::Int32));
        let shaped = |text: &str, items: Vec<Value>| Value::SourceText {
            text: text.into(),
            nearest: Box::new(Value::Array(items)),
        };
        assert_eq!(
            decode_text(&ints, "{{1,2},{3,NULL}}", col(&t)).unwrap(),
            shaped("{{1,2},{3,NULL}}", vec![Value::Int32(1), Value::Int32(2), Value::Int32(3), Value::Null])
        );
        assert_eq!(
            decode_text(&ints, "[0:1][1:2]={{{5}},{{6}}}", col(&t)).unwrap(),
            shaped("[0:1][1:2]={{{5}},{{6}}}", vec![Value::Int32(5), Value::Int32(6)])
        );
        assert_eq!(
            decode_text(&ints, "[0:1]={7,8}", col(&t)).unwrap(),
            shaped("[0:1]={7,8}", vec![Value::Int32(7), Value::Int32(8)])
        );
        // One dimension from 1: the array itself.
        assert_eq!(decode_text(&ints, "{7,NULL}", col(&t)).unwrap(), Value::Array(vec![Value::Int32(7), Value::Null]));
        let texts = DataType::Array(Box::new(DataType::Text));
        assert_eq!(
            decode_text(&texts, "{{\"a,b\",c},{\"{d}\",NULL}}", col(&t)).unwrap(),
            shaped(
                "{{\"a,b\",c},{\"{d}\",NULL}}",
                vec![
                    Value::Text("a,b".into()),
                    Value::Text("c".into()),
                    Value::Text("{d}".into()),
                    Value::Null
                ]
            )
        );
        // box: elements separated by `;`.
        let boxes = ColumnRef { source_type: "box[]", ..col(&t) };
        assert_eq!(
            decode_text(&texts, "{(1,1),(0,0);(2,2),(1,1)}", boxes).unwrap(),
            Value::Array(vec![Value::Text("(1,1),(0,0)".into()), Value::Text("(2,2),(1,1)".into())])
        );
        // More dimensions than PostgreSQL has: not an array it printed.
        assert!(decode_text(&ints, "{{{{{{{1}}}}}}}", col(&t)).is_err());
        assert!(decode_text(&ints, &"{".repeat(100_000), col(&t)).is_err());
    }

    #[test]
    fn dates_and_timestamps_over_postgresql_whole_range() {
        // Infinities: the largest and smallest value (Debezium's choice).
        assert_eq!(parse_date("infinity"), Some(i32::MAX));
        assert_eq!(parse_date("-infinity"), Some(i32::MIN));
        assert_eq!(parse_timestamp("infinity", true), Some(i64::MAX));
        assert_eq!(parse_timestamp("-infinity", false), Some(i64::MIN));
        // PostgreSQL's last and first dates, beyond chrono's years.
        assert_eq!(parse_date("5874897-12-31"), Some(2_145_042_905));
        assert_eq!(parse_date("4713-01-01 BC"), Some(-2_440_550));
        assert_eq!(parse_date("262143-01-01"), Some(95_026_237));
        assert_eq!(parse_date("2023-02-29"), None);
        assert_eq!(parse_date("2024-13-01"), None);
        // Timestamps past i64 microseconds (294247-01-10) saturate, and
        // are not exact (nor is one landing on i64::MAX, infinity's).
        assert_eq!(timestamp_micros("294276-12-31 23:59:59.999999", false), Some((i64::MAX, false)));
        assert_eq!(timestamp_micros("294276-12-31 23:59:59.999999+00", true), Some((i64::MAX, false)));
        assert_eq!(timestamp_micros("294247-01-10 04:00:54.775807", false), Some((i64::MAX, false)));
        assert_eq!(timestamp_micros("294247-01-10 04:00:54.775806", false), Some((i64::MAX - 1, true)));
        assert_eq!(timestamp_micros("infinity", false), Some((i64::MAX, true)));
        assert_eq!(parse_timestamp("4713-01-01 00:00:00+00 BC", true), Some(-2_440_550 * 86_400_000_000));
        let t = TableId::new("s", "t");
        let far = "294276-12-31 23:59:59.999999+00";
        assert_eq!(
            decode_text(&DataType::TimestampTz, far, col(&t)).unwrap(),
            Value::SourceText {
                text: far.into(),
                nearest: Box::new(Value::TimestampTz(i64::MAX))
            }
        );
        // Binary COPY gives the same value, its text written as
        // PostgreSQL prints it.
        let pg_max = 9_223_371_331_200_000_000i64 - 1; // END_TIMESTAMP - 1, since 2000
        assert_eq!(
            decode_binary(BinaryType::TimestampTz, &pg_max.to_be_bytes(), col(&t)).unwrap(),
            Value::SourceText {
                text: far.into(),
                nearest: Box::new(Value::TimestampTz(i64::MAX))
            }
        );
        let at_max = i64::MAX - PG_EPOCH_MICROS; // 294247-01-10 04:00:54.775807
        assert_eq!(
            decode_binary(BinaryType::Timestamp, &at_max.to_be_bytes(), col(&t)).unwrap(),
            Value::SourceText {
                text: "294247-01-10 04:00:54.775807".into(),
                nearest: Box::new(Value::Timestamp(i64::MAX))
            }
        );
        let whole = 9_223_371_331_200_000_000i64 - 86_400_000_000; // 294276-12-31 00:00:00
        assert_eq!(
            decode_binary(BinaryType::Timestamp, &whole.to_be_bytes(), col(&t)).unwrap(),
            Value::SourceText {
                text: "294276-12-31 00:00:00".into(),
                nearest: Box::new(Value::Timestamp(i64::MAX))
            }
        );
    }

    proptest::proptest! {
        #[test]
        fn civil_days_agree_with_chrono_where_chrono_reaches(days in -95_000_000i64..95_000_000) {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
            let d = epoch + chrono::Duration::days(days);
            use chrono::Datelike;
            let (y, bc) = if d.year() <= 0 { (1 - d.year(), " BC") } else { (d.year(), "") };
            let text = format!("{y:04}-{:02}-{:02}{bc}", d.month(), d.day());
            proptest::prop_assert_eq!(parse_date(&text), Some(days as i32), "{}", text);
            let ts = format!("{y:04}-{:02}-{:02} 12:00:00+01{bc}", d.month(), d.day());
            proptest::prop_assert_eq!(
                parse_timestamp(&ts, true),
                Some(days * 86_400_000_000 + 11 * 3_600_000_000)
            );
        }
    }

    proptest::proptest! {
        /// The text decoder is total: any text, for any type (arrays of
        /// any depth and delimiter among them), decodes or is an error.
        #[test]
        fn any_text_decodes_or_fails_without_a_panic(
            text in "[{}\\[\\]:=,;\"\\\\01a-z NULinfty+-.]{0,40}",
            which in 0usize..10,
        ) {
            let t = TableId::new("s", "t");
            let types = [
                DataType::Bits { length: 3 },
                DataType::Array(Box::new(DataType::Bits { length: 2 })),
                DataType::Array(Box::new(DataType::Int32)),
                DataType::Array(Box::new(DataType::Array(Box::new(DataType::Text)))),
                DataType::Array(Box::new(DataType::VariableDecimal)),
                DataType::Timestamp,
                DataType::TimestampTz,
                DataType::Date,
                DataType::Decimal { precision: 5, scale: 2 },
                DataType::Array(Box::new(DataType::TimestampTz)),
            ];
            let boxes = ColumnRef { source_type: "box[]", ..col(&t) };
            for c in [col(&t), boxes] {
                let _ = decode_text(&types[which], &text, c);
            }
        }

        /// So is the binary reader of timestamps and numerics.
        #[test]
        fn any_binary_timestamp_or_numeric_decodes_or_fails(bytes in proptest::collection::vec(0u8..=255, 0..24)) {
            let t = TableId::new("s", "t");
            for kind in [BinaryType::Timestamp, BinaryType::TimestampTz, BinaryType::Numeric, BinaryType::Date] {
                let _ = decode_binary(kind, &bytes, col(&t));
            }
        }
    }

    #[test]
    fn decodes_intervals() {
        assert_eq!(parse_interval("P1Y2M3DT4H5M6.5S"), Some((14, 3, 14_706_500_000)));
        assert_eq!(parse_interval("PT0S"), Some((0, 0, 0)));
        assert_eq!(parse_interval("P-1Y-2M3DT-4H-0.25S"), Some((-14, 3, -14_400_250_000)));
    }

    #[test]
    fn parses_arrays() {
        assert_eq!(
            parse_array("{1,NULL,\"a b\",\"x\\\"y\"}").unwrap(),
            vec![
                ArrayItem::Text("1".into()),
                ArrayItem::Null,
                ArrayItem::Text("a b".into()),
                ArrayItem::Text("x\"y".into())
            ]
        );
        assert_eq!(parse_array("{{1,2},{3,4}}").unwrap().len(), 2);
        assert_eq!(parse_array("{}").unwrap(), vec![]);
        assert_eq!(parse_array("[0:1]={5,6}").unwrap().len(), 2);
        assert_eq!(parse_array("{\"NULL\"}").unwrap(), vec![ArrayItem::Text("NULL".into())]);
    }

    #[test]
    fn splits_copy_lines() {
        let mut out = Vec::new();
        split_copy_line(b"1\t\\N\ta\\tb\\\\c\\n\n", &mut out).unwrap();
        assert_eq!(out, vec![Some("1".into()), None, Some("a\tb\\c\n".into())]);
    }
}
