//! MySQL values to the model's [`Value`]s: text-protocol values of the
//! snapshot and binlog row values of the stream, decoded by one
//! [`ColumnCodec`] per column so that both give the same value for the same
//! row.

use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value as MyValue;
use tributary_schemas::mapping::{mysql, SourceType};
use tributary_schemas::temporal::days_from_civil;
use tributary_schemas::{Column, DataType, TableId, Value};

use crate::error::{Error, Result};

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// `name` -> `` `name` `` for SQL text.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `` `db`.`table` ``.
pub fn quote_table(table: &TableId) -> String {
    format!("{}.{}", quote_ident(&table.schema), quote_ident(&table.table))
}

/// `'text'` for SQL text (only used for identifiers in catalog queries and
/// fix statements, never for row values).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The logical type of a MySQL column type text (`COLUMN_TYPE` spelling).
pub fn map_type(table: &TableId, column: &str, type_text: &str) -> Result<DataType> {
    Ok(mysql::data_type(&SourceType::new(table, column, type_text))?)
}

/// How one column's values are decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnCodec {
    /// The column's logical type.
    pub data_type: DataType,
    /// For integers, the stored width in bits and whether they are
    /// unsigned: the binlog decoder takes signedness from the table map's
    /// optional metadata, which is missing (MySQL 5.7, MariaDB without
    /// `binlog_row_metadata = FULL`) or misread for MEDIUMINT, so values are
    /// reinterpreted at the column's own width and sign.
    int_bits: Option<(u32, bool)>,
    /// `binary(n)`: the binlog drops trailing zero bytes, a SELECT keeps them.
    binary_len: Option<usize>,
    /// `set(...)` members: the binlog carries a bit mask.
    set_members: Option<Vec<String>>,
    /// `year`: the binlog and the text protocol both carry text; kept apart
    /// from other Int32 columns.
    year: bool,
    /// `bit(n)`: raw bytes in both protocols, not digits.
    bit: bool,
    /// Whether the column accepts NULL: a zero date is NULL there, the
    /// epoch otherwise (see [`ColumnCodec::zero_date`]).
    nullable: bool,
}

impl ColumnCodec {
    /// The codec of `column` (its `source_type` is MySQL's `COLUMN_TYPE`).
    pub fn new(column: &Column) -> Self {
        let text = column.source_type.to_ascii_lowercase();
        let base = text.split(['(', ' ']).next().unwrap_or("").to_string();
        let unsigned = text.contains("unsigned");
        let int_bits = match base.as_str() {
            "tinyint" => Some(8),
            "smallint" => Some(16),
            "mediumint" => Some(24),
            "int" | "integer" => Some(32),
            "bigint" => Some(64),
            _ => None,
        }
        .map(|bits| (bits, unsigned));
        let args = || {
            let open = column.source_type.find('(')?;
            let close = column.source_type.rfind(')')?;
            column.source_type.get(open + 1..close).map(str::to_string)
        };
        let binary_len = (base == "binary")
            .then(|| args().and_then(|a| a.trim().parse().ok()))
            .flatten()
            .or((base == "binary").then_some(1));
        let set_members = (base == "set").then(|| args().map(|a| split_labels(&a)).unwrap_or_default());
        Self {
            data_type: column.data_type.clone(),
            int_bits,
            binary_len,
            set_members,
            year: base == "year",
            bit: base == "bit",
            nullable: column.nullable,
        }
    }

    /// A zero date (`0000-00-00`, or a date with a zero month or day) has
    /// no calendar day: as Debezium carries it, NULL where the column is
    /// optional and the epoch (1970-01-01 [00:00:00]) where it is NOT NULL.
    fn zero_date(&self) -> Value {
        match (&self.data_type, self.nullable) {
            (_, true) => Value::Null,
            (DataType::Date, false) => Value::Date(0),
            (DataType::Timestamp, false) => Value::Timestamp(0),
            (DataType::TimestampTz, false) => Value::TimestampTz(0),
            (_, false) => Value::Null,
        }
    }

    /// A snapshot value (text protocol: every value is text or bytes).
    pub fn from_text(&self, raw: MyValue, table: &TableId, column: &str) -> Result<Value> {
        let bytes = match raw {
            MyValue::NULL => return Ok(Value::Null),
            MyValue::Bytes(b) => b,
            other => return self.value_of(other, None, table, column),
        };
        let bad = |what: &str| {
            Error::permanent(format!("the snapshot value of a {} column is not {what}", self.data_type))
                .with_table(table.clone())
                .with_column(column)
        };
        let text = || std::str::from_utf8(&bytes).map_err(|_| bad("UTF-8 text"));
        Ok(match &self.data_type {
            DataType::Boolean => {
                if self.bit {
                    Value::Boolean(bytes.iter().any(|b| *b != 0))
                } else {
                    Value::Boolean(text()?.trim() != "0")
                }
            }
            DataType::Int16 => Value::Int16(text()?.parse().map_err(|_| bad("a 16-bit integer"))?),
            DataType::Int32 => Value::Int32(text()?.parse().map_err(|_| bad("a 32-bit integer"))?),
            DataType::Int64 => Value::Int64(text()?.parse().map_err(|_| bad("a 64-bit integer"))?),
            DataType::Float32 => Value::Float32(text()?.parse().map_err(|_| bad("a float"))?),
            DataType::Float64 => Value::Float64(text()?.parse().map_err(|_| bad("a double"))?),
            DataType::Decimal { .. } | DataType::VariableDecimal => Value::Decimal(text()?.to_string()),
            DataType::Text => Value::Text(text()?.to_string()),
            DataType::Json => Value::Json(text()?.to_string()),
            DataType::Enum { .. } => Value::Enum(text()?.to_string()),
            DataType::Bytes | DataType::Geometry => self.bytes_value(bytes),
            DataType::Date => match parse_date(text()?) {
                Some(days) => Value::Date(days),
                None => zero_date(text()?).then(|| self.zero_date()).ok_or_else(|| bad("a date"))?,
            },
            DataType::TimeSpan => Value::Time(parse_time(text()?).ok_or_else(|| bad("a time"))?),
            DataType::Timestamp => match parse_datetime(text()?) {
                Some(us) => Value::Timestamp(us),
                None => zero_date(text()?).then(|| self.zero_date()).ok_or_else(|| bad("a datetime"))?,
            },
            // The session time zone is UTC (see `config::connection`).
            DataType::TimestampTz => match parse_datetime(text()?) {
                Some(us) => Value::TimestampTz(us),
                None => zero_date(text()?).then(|| self.zero_date()).ok_or_else(|| bad("a timestamp"))?,
            },
            other => {
                return Err(Error::permanent(format!("type {other} does not come from MySQL"))
                    .with_table(table.clone())
                    .with_column(column))
            }
        })
    }

    /// A binlog row value (`None`: SQL NULL). `collation` is the column's
    /// collation id from the table map's optional metadata (0 when the
    /// server sent none): text is decoded from its character set.
    pub fn from_binlog(
        &self,
        raw: Option<BinlogValue<'_>>,
        collation: u16,
        table: &TableId,
        column: &str,
    ) -> Result<Value> {
        match raw {
            None => Ok(Value::Null),
            Some(BinlogValue::Value(v)) => self.value_of(v, Some(collation), table, column),
            Some(BinlogValue::Jsonb(j)) => {
                // MySQL 8's binary JSON; MariaDB logs JSON as text.
                let json = serde_json::Value::try_from(j).map_err(|e| {
                    Error::permanent(format!("binary JSON value cannot be decoded: {e}"))
                        .with_table(table.clone())
                        .with_column(column)
                })?;
                Ok(Value::Json(json.to_string()))
            }
            Some(BinlogValue::JsonDiff(_)) => {
                Err(Error::needs_operator("a partial JSON update reached the binlog, which has no full after-image")
                    .with_table(table.clone())
                    .with_column(column)
                    .with_hint("SET GLOBAL binlog_row_value_options = '' (MySQL 8)"))
            }
        }
    }

    fn bytes_value(&self, mut bytes: Vec<u8>) -> Value {
        if let Some(n) = self.binary_len {
            if bytes.len() < n {
                bytes.resize(n, 0);
            }
        }
        if self.data_type == DataType::Geometry {
            Value::Geometry(bytes)
        } else {
            Value::Bytes(bytes)
        }
    }

    /// A typed driver value (binlog values, with the column's collation id,
    /// and binary-protocol values, whose text is the connection's UTF-8).
    fn value_of(&self, raw: MyValue, collation: Option<u16>, table: &TableId, column: &str) -> Result<Value> {
        let mismatch = |raw: &MyValue| {
            Error::permanent(format!(
                "a {} value in the binlog does not fit column type {}",
                driver_kind(raw),
                self.data_type
            ))
            .with_table(table.clone())
            .with_column(column)
        };
        // Reinterpret at the column's width and sign (see `int_bits`).
        let int = |v: i128| -> i128 {
            match self.int_bits {
                Some((bits, true)) if v < 0 => v + (1i128 << bits),
                Some((bits, false)) if v >= 1i128 << (bits - 1) => v - (1i128 << bits),
                _ => v,
            }
        };
        let as_int = |raw: &MyValue| -> Option<i128> {
            match raw {
                MyValue::Int(v) => Some(int(i128::from(*v))),
                MyValue::UInt(v) => Some(int(i128::from(*v))),
                MyValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
                _ => None,
            }
        };
        if matches!(raw, MyValue::NULL) {
            return Ok(Value::Null);
        }
        Ok(match (&self.data_type, &raw) {
            (DataType::Boolean, MyValue::Bytes(b)) => Value::Boolean(b.iter().any(|x| *x != 0)),
            (DataType::Boolean, _) => Value::Boolean(as_int(&raw).ok_or_else(|| mismatch(&raw))? != 0),
            (DataType::Int16, _) => {
                Value::Int16(as_int(&raw).and_then(|v| i16::try_from(v).ok()).ok_or_else(|| mismatch(&raw))?)
            }
            (DataType::Int32, _) => {
                Value::Int32(as_int(&raw).and_then(|v| i32::try_from(v).ok()).ok_or_else(|| mismatch(&raw))?)
            }
            (DataType::Int64, _) => {
                Value::Int64(as_int(&raw).and_then(|v| i64::try_from(v).ok()).ok_or_else(|| mismatch(&raw))?)
            }
            (DataType::Float32, MyValue::Float(f)) => Value::Float32(*f),
            (DataType::Float32, MyValue::Double(f)) => Value::Float32(*f as f32),
            (DataType::Float64, MyValue::Double(f)) => Value::Float64(*f),
            (DataType::Float64, MyValue::Float(f)) => Value::Float64(f64::from(*f)),
            (DataType::Decimal { .. } | DataType::VariableDecimal, MyValue::Bytes(b)) => {
                Value::Decimal(String::from_utf8(b.clone()).map_err(|_| mismatch(&raw))?)
            }
            // `bigint unsigned` is Decimal(20,0).
            (DataType::Decimal { .. }, _) => Value::Decimal(as_int(&raw).ok_or_else(|| mismatch(&raw))?.to_string()),
            (DataType::Text, MyValue::Bytes(b)) => match &self.set_members {
                Some(members) => Value::Text(set_text(b, members)),
                None => Value::Text(self.text(b, collation, table, column)?),
            },
            (DataType::Json, MyValue::Bytes(b)) => Value::Json(self.text(b, collation, table, column)?),
            // ENUM in the binlog: the 1-based index of the label (0 is the
            // empty string MySQL stores for an invalid label).
            (DataType::Enum { symbols }, _) => {
                let idx = as_int(&raw).ok_or_else(|| mismatch(&raw))?;
                let label = usize::try_from(idx)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| symbols.get(i).cloned())
                    .unwrap_or_default();
                Value::Enum(label)
            }
            (DataType::Bytes | DataType::Geometry, MyValue::Bytes(b)) => self.bytes_value(b.clone()),
            (DataType::Date, MyValue::Date(y, m, d, ..)) => match civil_days(*y, *m, *d) {
                Some(days) => Value::Date(days as i32),
                None => self.zero_date(),
            },
            (DataType::Timestamp, MyValue::Date(y, m, d, h, mi, s, us)) => match civil_days(*y, *m, *d) {
                Some(days) => Value::Timestamp(days * MICROS_PER_DAY + clock_micros(*h, *mi, *s, *us)),
                None => self.zero_date(),
            },
            (DataType::TimeSpan, MyValue::Time(neg, days, h, mi, s, us)) => {
                let v = i64::from(*days) * MICROS_PER_DAY + clock_micros(*h, *mi, *s, *us);
                Value::Time(if *neg { -v } else { v })
            }
            // TIMESTAMP2 in the binlog: `seconds[.micros]` since the epoch.
            (DataType::TimestampTz, MyValue::Bytes(b)) => {
                let text = std::str::from_utf8(b).map_err(|_| mismatch(&raw))?;
                let (secs, frac) = text.split_once('.').unwrap_or((text, "0"));
                let secs: i64 = secs.parse().map_err(|_| mismatch(&raw))?;
                let frac = format!("{frac:0<6}");
                let micros: i64 = frac.get(..6).and_then(|f| f.parse().ok()).ok_or_else(|| mismatch(&raw))?;
                if secs == 0 && micros == 0 {
                    // 0000-00-00 00:00:00, MySQL's zero timestamp.
                    self.zero_date()
                } else {
                    // A corrupt or hostile binlog can hold any number.
                    Value::TimestampTz(
                        secs.checked_mul(1_000_000)
                            .and_then(|s| s.checked_add(micros))
                            .ok_or_else(|| mismatch(&raw))?,
                    )
                }
            }
            (DataType::TimestampTz, MyValue::Int(secs)) => {
                if *secs == 0 {
                    self.zero_date()
                } else {
                    Value::TimestampTz(secs.checked_mul(1_000_000).ok_or_else(|| mismatch(&raw))?)
                }
            }
            _ if self.year => {
                Value::Int32(as_int(&raw).and_then(|v| i32::try_from(v).ok()).ok_or_else(|| mismatch(&raw))?)
            }
            _ => return Err(mismatch(&raw)),
        })
    }
}

impl ColumnCodec {
    /// A text value's bytes in the column's character set as a string.
    fn text(&self, bytes: &[u8], collation: Option<u16>, table: &TableId, column: &str) -> Result<String> {
        let error = |what: String| {
            Error::permanent(format!("a text value of column type {} {what}", self.data_type))
                .with_table(table.clone())
                .with_column(column)
                .with_class("tributary.mysql.decode")
        };
        let Some(id) = collation.filter(|id| *id != 0) else {
            // The text protocol (the connection's utf8mb4), or a binlog
            // without the table map's charsets.
            return String::from_utf8(bytes.to_vec()).map_err(|_| match collation {
                None => error("is not UTF-8".to_string()),
                Some(_) => Error::needs_operator(format!(
                    "a text value of column type {} is not UTF-8 and the binlog does not say its character set",
                    self.data_type
                ))
                .with_table(table.clone())
                .with_column(column)
                .with_hint("SET GLOBAL binlog_row_metadata = 'FULL'"),
            });
        };
        let Some(charset) = charset_of(id) else {
            return String::from_utf8(bytes.to_vec())
                .map_err(|_| error(format!("is not UTF-8 and its collation id {id} is not one the source knows")));
        };
        match encoding_of(charset) {
            Some(Charset::Utf8) => {
                String::from_utf8(bytes.to_vec()).map_err(|_| error(format!("is not valid {charset}")))
            }
            Some(Charset::Utf32) => utf32_text(bytes).ok_or_else(|| error("is not valid utf32".to_string())),
            Some(Charset::Other(encoding)) => encoding
                .decode_without_bom_handling_and_without_replacement(bytes)
                .map(std::borrow::Cow::into_owned)
                .ok_or_else(|| error(format!("is not valid {charset}"))),
            None => String::from_utf8(bytes.to_vec()).map_err(|_| {
                error(format!("is in character set {charset} (collation id {id}), which the source cannot decode"))
            }),
        }
    }
}

/// The character set of a collation id: MySQL's table (MySQL's and
/// MariaDB's ids agree below 256); MariaDB's `*_nopad_*` collations are
/// 1024 above their PAD SPACE twin of the same character set.
pub fn charset_of(collation: u16) -> Option<&'static str> {
    use mysql_common::collations::{Collation, CollationId};
    let known = |id: u16| match Collation::resolve(CollationId::from(id)).charset {
        "unknown" => None,
        charset => Some(charset),
    };
    known(collation).or_else(|| collation.checked_sub(1024).filter(|id| *id < 256).and_then(known))
}

/// How a MySQL character set's bytes become text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charset {
    /// UTF-8 (`utf8mb3`, `utf8mb4`), also ASCII.
    Utf8,
    /// `utf32`: 4-byte big-endian code points (no `encoding_rs` decoder).
    Utf32,
    /// Any other character set `encoding_rs` decodes.
    Other(&'static encoding_rs::Encoding),
}

/// The decoder of a MySQL character set name; `None` for the few legacy
/// ones (`dec8`, `hp8`, `swe7`, `keybcs2`, `cp850`, `cp852`, `macroman`,
/// `armscii8`, `geostd8`, ...) that have none: their text must be UTF-8 or
/// is refused naming the character set.
pub fn encoding_of(charset: &str) -> Option<Charset> {
    use encoding_rs as e;
    Some(match charset {
        "utf8" | "utf8mb3" | "utf8mb4" | "ascii" => Charset::Utf8,
        "utf32" => Charset::Utf32,
        // MySQL's latin1 is Windows-1252 (with the five unassigned bytes
        // kept as C1 controls, as WHATWG's decoder does).
        "latin1" => Charset::Other(e::WINDOWS_1252),
        "latin2" => Charset::Other(e::ISO_8859_2),
        // latin5 is ISO 8859-9; WHATWG decodes it as its superset Windows-1254.
        "latin5" => Charset::Other(e::WINDOWS_1254),
        "latin7" => Charset::Other(e::ISO_8859_13),
        "greek" => Charset::Other(e::ISO_8859_7),
        "hebrew" => Charset::Other(e::ISO_8859_8),
        "cp1250" => Charset::Other(e::WINDOWS_1250),
        "cp1251" => Charset::Other(e::WINDOWS_1251),
        "cp1256" => Charset::Other(e::WINDOWS_1256),
        "cp1257" => Charset::Other(e::WINDOWS_1257),
        "cp866" => Charset::Other(e::IBM866),
        "koi8r" => Charset::Other(e::KOI8_R),
        "koi8u" => Charset::Other(e::KOI8_U),
        "tis620" => Charset::Other(e::WINDOWS_874),
        "sjis" | "cp932" => Charset::Other(e::SHIFT_JIS),
        "ujis" | "eucjpms" => Charset::Other(e::EUC_JP),
        "euckr" => Charset::Other(e::EUC_KR),
        "gb2312" | "gbk" => Charset::Other(e::GBK),
        "gb18030" => Charset::Other(e::GB18030),
        "big5" => Charset::Other(e::BIG5),
        "ucs2" | "utf16" => Charset::Other(e::UTF_16BE),
        "utf16le" => Charset::Other(e::UTF_16LE),
        _ => return None,
    })
}

fn utf32_text(bytes: &[u8]) -> Option<String> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    bytes
        .chunks_exact(4)
        .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

fn driver_kind(v: &MyValue) -> &'static str {
    match v {
        MyValue::NULL => "null",
        MyValue::Bytes(_) => "bytes",
        MyValue::Int(_) => "integer",
        MyValue::UInt(_) => "unsigned integer",
        MyValue::Float(_) => "float",
        MyValue::Double(_) => "double",
        MyValue::Date(..) => "date",
        MyValue::Time(..) => "time",
    }
}

/// `'a','b''c'` -> `["a", "b'c"]` (labels of `set(...)`).
fn split_labels(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = args.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if quoted && chars.peek() == Some(&'\'') => {
                chars.next();
                cur.push('\'');
            }
            '\'' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c if quoted => cur.push(c),
            _ => {}
        }
    }
    out.push(cur);
    out
}

/// A SET bit mask (little-endian) as MySQL's text: members in declaration order.
fn set_text(mask: &[u8], members: &[String]) -> String {
    members
        .iter()
        .enumerate()
        .filter(|(i, _)| mask.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0))
        .map(|(_, m)| m.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn civil_days(y: u16, m: u8, d: u8) -> Option<i64> {
    // MySQL's zero date (and dates with a zero part) have no calendar day.
    (m != 0 && d != 0).then(|| days_from_civil(i64::from(y), u32::from(m), u32::from(d)))
}

fn clock_micros(h: u8, mi: u8, s: u8, us: u32) -> i64 {
    ((i64::from(h) * 60 + i64::from(mi)) * 60 + i64::from(s)) * 1_000_000 + i64::from(us)
}

fn zero_date(text: &str) -> bool {
    text.starts_with("0000-00-00") || text.get(5..7) == Some("00") || text.get(8..10) == Some("00")
}

/// `2024-02-29` -> days since 1970-01-01.
pub fn parse_date(text: &str) -> Option<i32> {
    let mut parts = text.get(..10)?.split('-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    if m == 0 || d == 0 || m > 12 || d > 31 {
        return None;
    }
    i32::try_from(days_from_civil(y, m, d)).ok()
}

/// `[-]HHH:MM:SS[.ffffff]` -> microseconds (MySQL TIME spans ±838 hours).
pub fn parse_time(text: &str) -> Option<i64> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (hms, frac) = body.split_once('.').unwrap_or((body, ""));
    let mut parts = hms.split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let s: i64 = parts.next()?.parse().ok()?;
    let micros = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").get(..6)?.parse::<i64>().ok()?
    };
    let v = ((h * 60 + m) * 60 + s) * 1_000_000 + micros;
    Some(if neg { -v } else { v })
}

/// `2024-01-02 03:04:05[.ffffff]` -> wall-clock microseconds since the epoch.
pub fn parse_datetime(text: &str) -> Option<i64> {
    let days = i64::from(parse_date(text)?);
    let time = match text.get(11..) {
        Some(t) if !t.is_empty() => parse_time(t)?,
        _ => 0,
    };
    Some(days * MICROS_PER_DAY + time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(type_text: &str) -> ColumnCodec {
        let t = TableId::new("db", "t");
        let mut c = Column::new("c", map_type(&t, "c", type_text).expect("maps"), true);
        c.source_type = type_text.to_string();
        ColumnCodec::new(&c)
    }

    fn bin(codec: &ColumnCodec, v: MyValue) -> Value {
        bin_in(codec, v, 45)
    }

    /// A binlog value of a column of collation `collation`.
    fn bin_in(codec: &ColumnCodec, v: MyValue, collation: u16) -> Value {
        codec
            .from_binlog(Some(BinlogValue::Value(v)), collation, &TableId::new("db", "t"), "c")
            .expect("decodes")
    }

    fn not_null(type_text: &str) -> ColumnCodec {
        let t = TableId::new("db", "t");
        let mut c = Column::new("c", map_type(&t, "c", type_text).expect("maps"), false);
        c.source_type = type_text.to_string();
        ColumnCodec::new(&c)
    }

    #[test]
    fn zero_dates_are_null_where_optional_and_the_epoch_where_not_null() {
        for (type_text, epoch) in [
            ("date", Value::Date(0)),
            ("datetime(3)", Value::Timestamp(0)),
            ("timestamp", Value::TimestampTz(0)),
        ] {
            for zero in ["0000-00-00", "0000-00-00 00:00:00", "2024-00-15", "2024-05-00 10:00:00"] {
                assert_eq!(text(&codec(type_text), zero), Value::Null, "{type_text} {zero}");
                if type_text != "timestamp" {
                    assert_eq!(text(&not_null(type_text), zero), epoch, "{type_text} {zero}");
                }
            }
            assert_eq!(text(&not_null(type_text), "0000-00-00 00:00:00"), epoch, "{type_text}");
        }
        for (y, m, d) in [(0, 0, 0), (2024, 0, 15), (2024, 5, 0)] {
            assert_eq!(bin(&codec("date"), MyValue::Date(y, m, d, 0, 0, 0, 0)), Value::Null);
            assert_eq!(bin(&not_null("date"), MyValue::Date(y, m, d, 0, 0, 0, 0)), Value::Date(0));
            assert_eq!(bin(&not_null("datetime"), MyValue::Date(y, m, d, 1, 2, 3, 0)), Value::Timestamp(0));
        }
        assert_eq!(bin(&not_null("timestamp"), MyValue::Bytes(b"0".to_vec())), Value::TimestampTz(0));
        assert_eq!(bin(&codec("timestamp(6)"), MyValue::Bytes(b"0.000000".to_vec())), Value::Null);
        // A real date is untouched.
        assert_eq!(text(&not_null("date"), "1970-01-02"), Value::Date(1));
    }

    #[test]
    fn binlog_text_is_decoded_by_the_column_character_set() {
        let c = codec("varchar(40)");
        // latin1_swedish_ci (8), latin1_bin (47), MariaDB's latin1_nopad_bin (1071).
        for id in [8, 47, 1071] {
            assert_eq!(bin_in(&c, MyValue::Bytes(b"caf\xe9 \x80".to_vec()), id), Value::Text("café €".into()));
        }
        // cp1251_general_ci (51), greek_general_ci (25), sjis_japanese_ci (13), utf8mb4_bin (46).
        assert_eq!(bin_in(&c, MyValue::Bytes(b"\xef\xf0\xe8".to_vec()), 51), Value::Text("при".into()));
        assert_eq!(bin_in(&c, MyValue::Bytes(b"\xe1\xe2".to_vec()), 25), Value::Text("αβ".into()));
        assert_eq!(bin_in(&c, MyValue::Bytes(b"\x93\xfa\x96\x7b".to_vec()), 13), Value::Text("日本".into()));
        assert_eq!(bin_in(&c, MyValue::Bytes("ü ✓".as_bytes().to_vec()), 46), Value::Text("ü ✓".into()));
        // utf32_general_ci (60), ucs2_general_ci (35).
        assert_eq!(bin_in(&c, MyValue::Bytes(vec![0, 0, 0, 0xfc, 0, 1, 0xf6, 0]), 60), Value::Text("ü😀".into()));
        assert_eq!(bin_in(&c, MyValue::Bytes(vec![0, 0xfc]), 35), Value::Text("ü".into()));
        // No charset in the table map: UTF-8, else the operator is asked for the metadata.
        assert_eq!(bin_in(&c, MyValue::Bytes("é".as_bytes().to_vec()), 0), Value::Text("é".into()));
        let t = TableId::new("db", "t");
        let e = c
            .from_binlog(Some(BinlogValue::Value(MyValue::Bytes(b"caf\xe9".to_vec()))), 0, &t, "name")
            .expect_err("unknown charset");
        assert_eq!(e.kind(), crate::ErrorKind::NeedsOperator);
        assert_eq!(e.column(), Some("name"));
        // Invalid bytes for the charset: an error naming the charset, not the value.
        let e = c
            .from_binlog(Some(BinlogValue::Value(MyValue::Bytes(b"\xff\xfe caf".to_vec()))), 45, &t, "name")
            .expect_err("not utf8mb4");
        assert!(e.message().contains("utf8mb4") && !e.message().contains("caf"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn latin1_and_cp1251_text_round_trips(text in "[ -~\u{a0}-\u{ff}]{0,40}", cyr in "[ -~а-яА-ЯёЁ]{0,40}") {
            let c = codec("text");
            let (latin1, _, bad) = encoding_rs::WINDOWS_1252.encode(&text);
            proptest::prop_assert!(!bad);
            proptest::prop_assert_eq!(bin_in(&c, MyValue::Bytes(latin1.into_owned()), 8), Value::Text(text.clone()));
            let (cp1251, _, bad) = encoding_rs::WINDOWS_1251.encode(&cyr);
            proptest::prop_assert!(!bad);
            proptest::prop_assert_eq!(bin_in(&c, MyValue::Bytes(cp1251.into_owned()), 51), Value::Text(cyr.clone()));
        }
    }

    fn text(codec: &ColumnCodec, v: &str) -> Value {
        codec
            .from_text(MyValue::Bytes(v.as_bytes().to_vec()), &TableId::new("db", "t"), "c")
            .expect("decodes")
    }

    #[test]
    fn unsigned_integers_are_reinterpreted_at_their_width() {
        assert_eq!(bin(&codec("int(10) unsigned"), MyValue::Int(-1)), Value::Int64(4_294_967_295));
        assert_eq!(bin(&codec("tinyint(3) unsigned"), MyValue::Int(-1)), Value::Int16(255));
        assert_eq!(bin(&codec("bigint(20) unsigned"), MyValue::Int(-1)), Value::Decimal("18446744073709551615".into()));
        assert_eq!(
            text(&codec("bigint(20) unsigned"), "18446744073709551615"),
            Value::Decimal("18446744073709551615".into())
        );
        assert_eq!(bin(&codec("int(11)"), MyValue::Int(-5)), Value::Int32(-5));
        // A signed MEDIUMINT decoded as unsigned by the binlog reader.
        assert_eq!(bin(&codec("mediumint(9)"), MyValue::Int(8_777_216)), Value::Int32(-8_000_000));
        assert_eq!(bin(&codec("bigint(20)"), MyValue::UInt(u64::MAX)), Value::Int64(-1));
    }

    #[test]
    fn snapshot_text_and_binlog_values_agree() {
        let c = codec("datetime(6)");
        assert_eq!(text(&c, "2024-01-02 03:04:05.000006"), bin(&c, MyValue::Date(2024, 1, 2, 3, 4, 5, 6)));
        let c = codec("time(3)");
        assert_eq!(text(&c, "-838:59:59.500"), bin(&c, MyValue::Time(true, 34, 22, 59, 59, 500_000)));
        let c = codec("timestamp");
        assert_eq!(text(&c, "1970-01-02 00:00:01"), bin(&c, MyValue::Bytes(b"86401".to_vec())));
        let c = codec("set('a','b','c')");
        assert_eq!(text(&c, "a,c"), bin(&c, MyValue::Bytes(vec![0b101])));
        let c = codec("enum('x','y')");
        assert_eq!(text(&c, "y"), bin(&c, MyValue::Int(2)));
        let c = codec("binary(4)");
        assert_eq!(text(&c, "ab\0\0"), bin(&c, MyValue::Bytes(b"ab".to_vec())));
        let c = codec("year(4)");
        assert_eq!(text(&c, "2024"), bin(&c, MyValue::Bytes(b"2024".to_vec())));
        let c = codec("bit(1)");
        assert_eq!(
            c.from_text(MyValue::Bytes(vec![1]), &TableId::new("db", "t"), "c")
                .expect("bit"),
            bin(&c, MyValue::Bytes(vec![1]))
        );
        let c = codec("date");
        assert_eq!(text(&c, "0000-00-00"), Value::Null);
    }

    #[test]
    fn a_value_of_the_wrong_kind_names_table_and_column() {
        let e = codec("int(11)")
            .from_binlog(Some(BinlogValue::Value(MyValue::Double(1.5))), 0, &TableId::new("db", "t"), "qty")
            .expect_err("mismatch");
        assert_eq!(e.table(), Some(&TableId::new("db", "t")));
        assert_eq!(e.column(), Some("qty"));
        assert!(e.message().contains("double"), "{e}");
    }
}
