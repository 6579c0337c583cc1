//! Values as the sink sends them in `COPY`: text (escaped as `COPY` reads
//! it; the value's SQL text from [`crate::sink::text`]) or, where every
//! column's type has a writer here, PostgreSQL's binary format.

use tributary_schemas::Value;

use super::dialect::PgType;
use crate::error::Error;
use crate::pgwire::{BinaryType, PG_EPOCH_DAYS, PG_EPOCH_MICROS};
use crate::sink::bookkeeping::key_text;
use crate::sink::reduce::{key_bytes, Group, Line};
use crate::sink::text::render_text;
use crate::sink::ApplyError;

/// Appends `value` in `COPY` text format (`\N` for NULL; the caller adds
/// the tabs). The error names the value's kind, never the value. `scratch`
/// is reused between calls for values rendered before they are escaped.
pub fn render_copy(out: &mut Vec<u8>, scratch: &mut String, value: &Value) -> Result<(), String> {
    // The common types are written straight into `out` (none of their
    // text needs escaping); the rest go through `render_text`.
    match value {
        Value::Null => out.extend_from_slice(b"\\N"),
        Value::Boolean(b) => out.push(if *b { b't' } else { b'f' }),
        Value::Int16(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Int32(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Int64(v) => out.extend_from_slice(itoa::Buffer::new().format(*v).as_bytes()),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) | Value::Enum(s) => escape_copy(out, s),
        other => {
            scratch.clear();
            render_text(scratch, other)?;
            escape_copy(out, scratch);
        }
    }
    Ok(())
}

fn escape_copy(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|b| matches!(b, b'\\' | b'\n' | b'\r' | b'\t')) {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.push(b),
        }
    }
}

/// The binary `COPY` type of a destination column type (`format_type`
/// spelling); `None` for the types sent as text (arrays, intervals, user
/// types...). Binary input spares PostgreSQL the text parsing of every
/// value: a 1M-row `COPY` into the benchmark table (with its primary key)
/// took 4.1-5.3 s as text and 2.9-3.0 s as binary here.
pub fn binary_type(raw: &str) -> Option<BinaryType> {
    let t = PgType::parse(raw);
    if t.dims > 0 {
        return None;
    }
    BinaryType::from_base(&t.base)
}

/// Writing values in binary `COPY`.
impl BinaryType {
    /// Whether `value` can be written as this field with the meaning its
    /// text form has (anything else sends its group as text, where
    /// PostgreSQL decides as before).
    pub fn accepts(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (Self::Bool, Value::Boolean(_)) => true,
            (Self::Int2, Value::Int16(_)) => true,
            (Self::Int4, Value::Int16(_) | Value::Int32(_)) => true,
            (Self::Int8, Value::Int16(_) | Value::Int32(_) | Value::Int64(_)) => true,
            (Self::Float4, Value::Float32(_)) => true,
            (Self::Float8, Value::Float32(_) | Value::Float64(_)) => true,
            (Self::Numeric, Value::Decimal(s)) => decimal_parts(s).is_some(),
            (Self::Text, Value::Text(_) | Value::Enum(_)) => true,
            (Self::Bytea, Value::Bytes(_)) => true,
            (Self::Date, Value::Date(d)) => d.checked_sub(PG_EPOCH_DAYS).is_some(),
            // Text input reads 24:00:00 and takes the rest modulo a day.
            (Self::Time, Value::Time(t)) => (0..=86_400_000_000).contains(t),
            // i64::MIN and MAX are -infinity and infinity in binary only.
            (Self::Timestamp, Value::Timestamp(t)) | (Self::TimestampTz, Value::TimestampTz(t)) => {
                t.checked_sub(PG_EPOCH_MICROS).is_some_and(|v| v != i64::MIN && v != i64::MAX)
            }
            (Self::Uuid, Value::Uuid(_)) => true,
            (Self::Json | Self::Jsonb, Value::Json(_) | Value::Text(_)) => true,
            _ => false,
        }
    }

    /// Appends `value` (accepted by [`BinaryType::accepts`]) as a binary
    /// `COPY` field: its length, then its bytes.
    pub fn write(self, out: &mut Vec<u8>, value: &Value) {
        fn field(out: &mut Vec<u8>, bytes: &[u8]) {
            out.extend_from_slice(&i32::try_from(bytes.len()).unwrap_or(i32::MAX).to_be_bytes());
            out.extend_from_slice(bytes);
        }
        let int = |v: &Value| match v {
            Value::Int16(v) => i64::from(*v),
            Value::Int32(v) => i64::from(*v),
            Value::Int64(v) => *v,
            _ => 0,
        };
        match (self, value) {
            (_, Value::Null) => out.extend_from_slice(&(-1i32).to_be_bytes()),
            (Self::Bool, Value::Boolean(b)) => field(out, &[u8::from(*b)]),
            // Accepted values fit: only narrower integers reach a column.
            (Self::Int2, v) => field(out, &(int(v) as i16).to_be_bytes()),
            (Self::Int4, v) => field(out, &(int(v) as i32).to_be_bytes()),
            (Self::Int8, v) => field(out, &int(v).to_be_bytes()),
            (Self::Float4, Value::Float32(f)) => field(out, &f.to_bits().to_be_bytes()),
            (Self::Float8, Value::Float32(f)) => field(out, &f64::from(*f).to_bits().to_be_bytes()),
            (Self::Float8, Value::Float64(f)) => field(out, &f.to_bits().to_be_bytes()),
            (Self::Numeric, Value::Decimal(s)) => write_numeric(out, s),
            (Self::Text | Self::Json, Value::Text(s) | Value::Enum(s) | Value::Json(s)) => field(out, s.as_bytes()),
            (Self::Jsonb, Value::Json(s) | Value::Text(s)) => {
                // jsonb's binary form: version 1, then the JSON text.
                out.extend_from_slice(&i32::try_from(s.len() + 1).unwrap_or(i32::MAX).to_be_bytes());
                out.push(1);
                out.extend_from_slice(s.as_bytes());
            }
            (Self::Bytea, Value::Bytes(b)) => field(out, b),
            (Self::Date, Value::Date(d)) => field(out, &(d - PG_EPOCH_DAYS).to_be_bytes()),
            (Self::Time, Value::Time(t)) => field(out, &t.to_be_bytes()),
            (Self::Timestamp, Value::Timestamp(t)) | (Self::TimestampTz, Value::TimestampTz(t)) => {
                field(out, &(t - PG_EPOCH_MICROS).to_be_bytes())
            }
            (Self::Uuid, Value::Uuid(u)) => field(out, u.as_bytes()),
            // Not accepted: never called so (see `binary_fields`); NULL
            // keeps the stream well-formed.
            _ => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
}

/// The sign, integer digits and fraction digits of a plain decimal text
/// (`-12.340`, `.5`, `7`); `None` for anything else (`NaN`, exponents).
fn decimal_parts(s: &str) -> Option<(bool, &str, &str)> {
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    // numeric's limits: 131072 digits before the point, 16383 after.
    if (int.is_empty() && frac.is_empty())
        || !digits(int)
        || !digits(frac)
        || int.len() > 131_072
        || frac.len() > 16_383
    {
        return None;
    }
    Some((neg, int, frac))
}

/// Appends a decimal text (accepted by [`decimal_parts`]) as PostgreSQL's
/// binary `numeric`: base-10000 digit groups aligned on the decimal point,
/// the weight of the first, the sign and the display scale.
fn write_numeric(out: &mut Vec<u8>, s: &str) {
    let Some((neg, int, frac)) = decimal_parts(s) else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return;
    };
    let int = int.trim_start_matches('0');
    let mut groups: Vec<i16> = Vec::with_capacity(int.len() / 4 + frac.len() / 4 + 2);
    let (mut acc, mut n) = (0i16, (4 - int.len() % 4) % 4);
    for b in int.bytes().chain(frac.bytes()) {
        acc = acc * 10 + i16::from(b - b'0');
        n += 1;
        if n == 4 {
            groups.push(acc);
            (acc, n) = (0, 0);
        }
    }
    if n > 0 {
        for _ in n..4 {
            acc *= 10;
        }
        groups.push(acc);
    }
    let mut weight = (int.len() as i32 + 3) / 4 - 1;
    let lead = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..lead);
    weight -= lead as i32;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let sign: u16 = if neg && !groups.is_empty() { 0x4000 } else { 0 };
    if groups.is_empty() {
        weight = 0;
    }
    out.extend_from_slice(&i32::try_from(8 + 2 * groups.len()).unwrap_or(i32::MAX).to_be_bytes());
    out.extend_from_slice(&i16::try_from(groups.len()).unwrap_or(i16::MAX).to_be_bytes());
    out.extend_from_slice(&i16::try_from(weight).unwrap_or(i16::MAX).to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&i16::try_from(frac.len()).unwrap_or(i16::MAX).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
}

// ---------------------------------------------------------------- rows

/// Appends `line` of `group` as a `COPY` text line: the delete flag first
/// when `flag` (the staging table's column order), then the columns (a
/// delete carries only its key), then the position.
pub fn render_line(
    group: &Group<'_>,
    out: &mut Vec<u8>,
    scratch: &mut String,
    line: &Line<'_>,
    flag: bool,
) -> Result<(), ApplyError> {
    if flag {
        out.extend_from_slice(if line.delete { b"t\t" } else { b"f\t" });
        out.extend_from_slice(staged_key(group, line)?.as_bytes());
        out.push(b'\t');
    }
    for (i, (col, value)) in group.schema.columns.iter().zip(line.row).enumerate() {
        if group.writes(line, i) {
            render_copy(out, scratch, value).map_err(|reason| ApplyError {
                error: Error::permanent(format!("column {}: {reason}", col.name))
                    .with_column(col.name.clone())
                    .with_table(group.schema.id.clone()),
                record: Some(line.record),
            })?;
        } else {
            out.extend_from_slice(b"\\N");
        }
        out.push(b'\t');
    }
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(digits.format(line.commit).as_bytes());
    out.push(b'\t');
    out.extend_from_slice(digits.format(line.index).as_bytes());
    if let Some(instance) = line.instance.as_deref().filter(|_| flag) {
        // A record's name (a legal topic name, a partition and an offset)
        // needs no COPY escape.
        out.push(b'\t');
        out.extend_from_slice(instance.row.as_bytes());
    }
    out.push(b'\n');
    Ok(())
}

/// The binary `COPY` fields of `group`, when every live value can be
/// written in binary exactly as its text form would be read; `None` sends
/// the group as text. `fields` holds one entry per schema column, from the
/// destination column's type (`None` for a type without a binary writer
/// here).
pub fn binary_fields(group: &Group<'_>, fields: &[Option<BinaryType>]) -> Option<Vec<BinaryType>> {
    let fields: Vec<BinaryType> = fields.iter().copied().collect::<Option<_>>()?;
    for line in group.live() {
        for (i, (field, value)) in fields.iter().zip(line.row).enumerate() {
            if group.writes(line, i) && !field.accepts(value) {
                return None;
            }
        }
    }
    Some(fields)
}

/// Appends `line` of `group` as a binary `COPY` tuple, in the order of
/// [`render_line`]. Every value was checked by [`binary_fields`].
pub fn render_binary_line(
    group: &Group<'_>,
    out: &mut Vec<u8>,
    fields: &[BinaryType],
    line: &Line<'_>,
    flag: bool,
) -> Result<(), ApplyError> {
    let row = line.instance.as_deref().filter(|_| flag);
    let n = group.schema.columns.len() + 2 + 2 * usize::from(flag) + usize::from(row.is_some());
    out.extend_from_slice(&i16::try_from(n).unwrap_or(i16::MAX).to_be_bytes());
    if flag {
        BinaryType::Bool.write(out, &Value::Boolean(line.delete));
        let key = staged_key(group, line)?;
        // A text field's binary form is its UTF-8 bytes.
        out.extend_from_slice(&i32::try_from(key.len()).unwrap_or(i32::MAX).to_be_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    for (i, (field, value)) in fields.iter().zip(line.row).enumerate() {
        if group.writes(line, i) {
            field.write(out, value);
        } else {
            out.extend_from_slice(&(-1i32).to_be_bytes());
        }
    }
    BinaryType::Int8.write(out, &Value::Int64(line.commit));
    BinaryType::Int8.write(out, &Value::Int64(line.index));
    if let Some(instance) = row {
        out.extend_from_slice(&i32::try_from(instance.row.len()).unwrap_or(i32::MAX).to_be_bytes());
        out.extend_from_slice(instance.row.as_bytes());
    }
    Ok(())
}

/// A staged line's key column (`bookkeeping::KEY_COLUMN`): what the
/// deleted-rows table is matched on; a keyless table's content key.
fn staged_key(group: &Group<'_>, line: &Line<'_>) -> Result<String, ApplyError> {
    if let Some(instance) = &line.instance {
        return Ok(instance.content.clone());
    }
    let bytes = key_bytes(&group.schema, line.row, &group.key).map_err(|error| ApplyError {
        error: error.with_table(group.schema.id.clone()),
        record: Some(line.record),
    })?;
    Ok(key_text(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(v: &Value) -> String {
        let mut out = Vec::new();
        render_copy(&mut out, &mut String::new(), v).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_values_as_copy_text() {
        assert_eq!(copy(&Value::Null), "\\N");
        assert_eq!(copy(&Value::Text("a\tb\nc\\d".into())), "a\\tb\\nc\\\\d");
        assert_eq!(copy(&Value::Bytes(vec![0, 255])), "\\\\x00ff");
        assert_eq!(copy(&Value::Date(0)), "1970-01-01");
        assert_eq!(copy(&Value::Date(-719_163)), "0001-12-31 BC");
        assert_eq!(copy(&Value::Date(19_723)), "2024-01-01");
        assert_eq!(copy(&Value::Timestamp(-1)), "1969-12-31 23:59:59.999999");
        assert_eq!(copy(&Value::TimestampTz(1_000_000)), "1970-01-01 00:00:01.000000+00");
        assert_eq!(copy(&Value::Time(3_723_000_001)), "01:02:03.000001");
        assert_eq!(copy(&Value::Float64(f64::NAN)), "NaN");
        assert_eq!(copy(&Value::Float64(-f64::INFINITY)), "-Infinity");
        assert_eq!(copy(&Value::Float64(0.1)), "0.1");
        assert_eq!(
            copy(&Value::Interval { months: 14, days: -3, micros: -3_600_500_000 }),
            "14 mons -3 days -1 hours -0.500000 secs"
        );
        assert_eq!(
            copy(&Value::Array(vec![Value::Text("a\"b".into()), Value::Null, Value::Int32(3)])),
            "{\"a\\\\\"b\",NULL,\"3\"}"
        );
        assert!(render_copy(&mut Vec::new(), &mut String::new(), &Value::Unchanged).is_err());
    }
}
