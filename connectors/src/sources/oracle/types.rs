//! Oracle column types to the model's [`DataType`] (the mapping itself is
//! `tributary_schemas::mapping::oracle`), and values to [`Value`]s.
//!
//! Both paths decode the same [`Literal`]s: the stream gets them from
//! `SQL_REDO` ([`super::redo_sql`]), the snapshot from a `SELECT` that
//! renders each column as canonical text ([`snapshot_expr`]): numbers with
//! `TO_CHAR(x, 'TM9')`, dates and timestamps in the formats of
//! [`DATE_MASK`] / [`TIMESTAMP_MASK`] / [`TIMESTAMP_TZ_MASK`], which are
//! also the mining session's NLS formats, RAW as hex. So a row read by the
//! snapshot and the same row in the redo give the same values.

use tributary_schemas::mapping::{oracle, SourceType};
use tributary_schemas::temporal::days_from_civil;
use tributary_schemas::{Column, DataType, TableId, Value};

use super::redo_sql::{from_hex, quote_ident, Literal};
use crate::error::{Error, Result};

/// `NLS_DATE_FORMAT` of every session, and the snapshot's DATE text.
pub const DATE_MASK: &str = "YYYY-MM-DD HH24:MI:SS";
/// `NLS_TIMESTAMP_FORMAT` of every session, and the snapshot's TIMESTAMP text.
pub const TIMESTAMP_MASK: &str = "YYYY-MM-DD HH24:MI:SS.FF9";
/// `NLS_TIMESTAMP_TZ_FORMAT` of every session, and the snapshot's text of
/// zoned timestamps.
pub const TIMESTAMP_TZ_MASK: &str = "YYYY-MM-DD HH24:MI:SS.FF9 TZH:TZM";

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The logical type of an Oracle column (`ALL_TAB_COLUMNS` spelling).
pub fn map_type(
    table: &TableId,
    column: &str,
    type_text: &str,
    precision: Option<u32>,
    scale: Option<u32>,
) -> Result<DataType> {
    Ok(oracle::data_type(
        &SourceType::new(table, column, type_text).with_precision_scale(precision, scale),
    )?)
}

/// The snapshot's select expression of a column: canonical text that
/// [`decode`] reads as it reads the redo's literals.
pub fn snapshot_expr(col: &Column) -> String {
    let q = quote_ident(&col.name);
    let st = col.source_type.to_ascii_uppercase();
    match &col.data_type {
        DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::Decimal { .. } | DataType::VariableDecimal
            if st.starts_with("NUMBER") || st.starts_with("FLOAT") || st.starts_with("INTEGER") =>
        {
            format!("TO_CHAR({q}, 'TM9')")
        }
        DataType::Timestamp if st == "DATE" => format!("TO_CHAR({q}, '{DATE_MASK}')"),
        DataType::Timestamp => format!("TO_CHAR({q}, '{TIMESTAMP_MASK}')"),
        // Local time zone: the session's zone is UTC.
        DataType::TimestampTz => {
            format!("TO_CHAR(SYS_EXTRACT_UTC(CAST({q} AS TIMESTAMP WITH TIME ZONE)), '{TIMESTAMP_MASK}')")
        }
        // Fetched as bytes and written as hex by the client: RAWTOHEX in
        // SQL stops at 4000 characters (2000 bytes) and a BLOB is longer.
        DataType::Bytes => q,
        DataType::Text if st == "XMLTYPE" => format!("XMLSERIALIZE(DOCUMENT {q} AS CLOB)"),
        DataType::Interval | DataType::Float32 | DataType::Float64 => format!("TO_CHAR({q})"),
        _ => q,
    }
}

fn bad(col: &Column, what: &str) -> Error {
    // Never the value: only the column and what was wrong.
    Error::permanent(format!("{what} for a {} column", col.source_type)).with_column(col.name.clone())
}

/// Decodes one literal of the column `col`; `snapshot` says the text is
/// the snapshot's canonical rendering (hex for bytes).
pub fn decode(col: &Column, lit: &Literal, snapshot: bool) -> Result<Value> {
    let text = match lit {
        Literal::Null => return Ok(Value::Null),
        // A LOB's content follows in LOB_WRITE rows; until then it is empty.
        Literal::EmptyLob => {
            return Ok(match col.data_type {
                DataType::Bytes => Value::Bytes(Vec::new()),
                _ => Value::Text(String::new()),
            })
        }
        Literal::Raw(bytes) => {
            return match col.data_type {
                DataType::Bytes => Ok(Value::Bytes(bytes.clone())),
                _ => Err(bad(col, "HEXTORAW")),
            }
        }
        Literal::Unsupported => {
            return Err(Error::needs_operator(format!(
                "LogMiner cannot render values of this {} column (`Unsupported Type` in SQL_REDO)",
                col.source_type
            ))
            .with_column(col.name.clone())
            .with_hint("leave the column out (oracle.exclude_columns) and start the runner again"))
        }
        Literal::Date { text, mask } | Literal::Timestamp { text, mask } | Literal::TimestampTz { text, mask } => {
            let parsed = if mask.is_empty() {
                parse_session_timestamp(text)
            } else {
                parse_masked(text, mask)
            };
            let (micros, offset) = parsed.ok_or_else(|| bad(col, "a date not in its mask"))?;
            return match col.data_type {
                DataType::Timestamp => Ok(Value::Timestamp(micros)),
                DataType::TimestampTz => Ok(Value::TimestampTz(micros - offset.unwrap_or(0) * 60_000_000)),
                DataType::Date => Ok(Value::Date(micros.div_euclid(MICROS_PER_DAY) as i32)),
                _ => Err(bad(col, "a date")),
            };
        }
        Literal::YmInterval(t) | Literal::DsInterval(t) => t,
        Literal::Str(t) | Literal::Number(t) => t,
    };
    Ok(match &col.data_type {
        DataType::Int16 => Value::Int16(text.trim().parse().map_err(|_| bad(col, "not a small integer"))?),
        DataType::Int32 => Value::Int32(text.trim().parse().map_err(|_| bad(col, "not an integer"))?),
        DataType::Int64 => Value::Int64(text.trim().parse().map_err(|_| bad(col, "not an integer"))?),
        DataType::Decimal { .. } | DataType::VariableDecimal => {
            Value::Decimal(normalize_number(text).ok_or_else(|| bad(col, "not a number"))?)
        }
        DataType::Float32 => Value::Float32(parse_float(text).ok_or_else(|| bad(col, "not a float"))? as f32),
        DataType::Float64 => Value::Float64(parse_float(text).ok_or_else(|| bad(col, "not a float"))?),
        DataType::Boolean => Value::Boolean(matches!(text.trim(), "1" | "TRUE" | "true")),
        DataType::Text => Value::Text(text.clone()),
        DataType::Json => Value::Json(text.clone()),
        DataType::Bytes if snapshot => Value::Bytes(from_hex(text)?),
        DataType::Bytes => Value::Bytes(text.as_bytes().to_vec()),
        DataType::Timestamp => {
            let parsed = parse_masked(text, TIMESTAMP_MASK).or_else(|| parse_masked(text, DATE_MASK));
            Value::Timestamp(parsed.ok_or_else(|| bad(col, "not a timestamp"))?.0)
        }
        DataType::TimestampTz => {
            let (micros, offset) = parse_masked(text, TIMESTAMP_TZ_MASK)
                .or_else(|| parse_masked(text, TIMESTAMP_MASK))
                .or_else(|| parse_masked(text, DATE_MASK))
                .ok_or_else(|| bad(col, "not a timestamp"))?;
            Value::TimestampTz(micros - offset.unwrap_or(0) * 60_000_000)
        }
        DataType::Interval => {
            let (months, days, micros) = parse_interval(text).ok_or_else(|| bad(col, "not an interval"))?;
            Value::Interval { months, days, micros }
        }
        _ => return Err(bad(col, "a type the Oracle source does not decode")),
    })
}

/// A timestamp LogMiner wrote without a mask, in the session's format
/// (`YYYY-MM-DD HH24:MI:SS.FF`, perhaps `TZH:TZM`): the fraction may be
/// empty (`'2020-02-01 00:00:00.'`) or absent.
fn parse_session_timestamp(text: &str) -> Option<(i64, Option<i64>)> {
    let t = text.trim();
    let (main, zone) = match t.rfind([' ']) {
        Some(i) if t[i + 1..].starts_with(['+', '-']) => (&t[..i], Some(&t[i + 1..])),
        _ => (t, None),
    };
    let (secs, frac) = main.split_once('.').unwrap_or((main, ""));
    let (wall, _) = parse_masked(secs, DATE_MASK)?;
    let micros = wall.checked_add(fraction_micros(frac)?)?;
    let offset = match zone {
        None => None,
        Some(z) => Some(parse_masked(&format!("1970-01-01 00:00:00 {z}"), "YYYY-MM-DD HH24:MI:SS TZH:TZM")?.1?),
    };
    Some((micros, offset))
}

/// `BINARY_FLOAT` / `BINARY_DOUBLE` text, with Oracle's `Inf`, `-Inf`, `Nan`.
fn parse_float(text: &str) -> Option<f64> {
    match text.trim() {
        "Inf" | "INF" | "BINARY_DOUBLE_INFINITY" | "BINARY_FLOAT_INFINITY" => Some(f64::INFINITY),
        "-Inf" | "-INF" | "-BINARY_DOUBLE_INFINITY" | "-BINARY_FLOAT_INFINITY" => Some(f64::NEG_INFINITY),
        "Nan" | "NaN" | "BINARY_DOUBLE_NAN" | "BINARY_FLOAT_NAN" => Some(f64::NAN),
        t => t.parse().ok(),
    }
}

/// Oracle's number text as canonical decimal text: `.5` -> `0.5`, `-.5` ->
/// `-0.5`, `1.5E+3` -> `1500`; `None` when it is not a number.
pub fn normalize_number(text: &str) -> Option<String> {
    let t = text.trim();
    let (mantissa, exp) = match t.find(['E', 'e']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (negative, digits) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if (int.is_empty() && frac.is_empty()) || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    if exp.unsigned_abs() > 200 {
        return None;
    }
    // Move the point by the exponent over all the digits.
    let all: String = format!("{int}{frac}");
    let point = int.len() as i64 + i64::from(exp);
    let (int, frac) = if point <= 0 {
        (String::new(), format!("{}{}", "0".repeat((-point) as usize), all))
    } else if point as usize >= all.len() {
        (format!("{all}{}", "0".repeat(point as usize - all.len())), String::new())
    } else {
        (all[..point as usize].to_string(), all[point as usize..].to_string())
    };
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let zero = int == "0" && frac.bytes().all(|b| b == b'0');
    let sign = if negative && !zero { "-" } else { "" };
    Some(if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    })
}

/// `+02-03` (years-months) or `+01 02:03:04.5` (days to seconds).
fn parse_interval(text: &str) -> Option<(i32, i32, i64)> {
    let t = text.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let sign = if negative { -1 } else { 1 };
    if let Some((days, time)) = t.split_once(' ') {
        let days: i32 = days.parse().ok()?;
        let mut parts = time.split(':');
        let h: i64 = parts.next()?.parse().ok()?;
        let m: i64 = parts.next()?.parse().ok()?;
        let (s, f) = parts.next()?.split_once('.').unwrap_or((time.rsplit(':').next()?, ""));
        let s: i64 = s.parse().ok()?;
        let micros = (h * 3600 + m * 60 + s) * 1_000_000 + fraction_micros(f)?;
        Some((0, sign * days, i64::from(sign) * micros))
    } else {
        let (y, m) = t.split_once('-')?;
        let months = y.parse::<i32>().ok()?.checked_mul(12)?.checked_add(m.parse().ok()?)?;
        Some((sign * months, 0, 0))
    }
}

/// Up to 9 fraction digits to microseconds (truncated, as the model keeps
/// microseconds).
fn fraction_micros(f: &str) -> Option<i64> {
    if f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut padded = f.to_string();
    padded.truncate(6);
    while padded.len() < 6 {
        padded.push('0');
    }
    padded.parse().ok()
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];

/// Parses `text` by an Oracle datetime format mask (the elements of the
/// SQL Language Reference, "Datetime Format Elements", that the mining
/// session's NLS formats and LogMiner's documented examples use: `YYYY`,
/// `MM`, `MON`, `DD`, `HH24`, `HH`, `MI`, `SS`, `FF[1-9]`, `AM`/`PM`,
/// `TZH`, `TZM`, separators). Returns wall-clock microseconds since the
/// epoch and the zone offset in minutes when the mask has one.
pub fn parse_masked(text: &str, mask: &str) -> Option<(i64, Option<i64>)> {
    let (mut year, mut month, mut day, mut hour, mut minute, mut second, mut micros) =
        (1970i64, 1u32, 1u32, 0i64, 0i64, 0i64, 0i64);
    let mut pm: Option<bool> = None;
    let (mut tzh, mut tzm): (Option<i64>, i64) = (None, 0);
    let t = text.trim().as_bytes();
    let m = mask.as_bytes();
    let (mut i, mut j) = (0usize, 0usize);
    let digits = |i: &mut usize, max: usize| -> Option<i64> {
        let start = *i;
        while *i < t.len() && *i - start < max && t[*i].is_ascii_digit() {
            *i += 1;
        }
        std::str::from_utf8(&t[start..*i]).ok()?.parse().ok()
    };
    while j < m.len() {
        // Bytes, not `str` slices: a mask from the redo may hold any
        // character, and a separator is skipped one byte at a time.
        let rest = String::from_utf8_lossy(&m[j..(j + 4).min(m.len())]).to_ascii_uppercase();
        let take = |n: usize, j: &mut usize| *j += n;
        if rest.starts_with("YYYY") {
            let neg = t.get(i) == Some(&b'-');
            if neg {
                i += 1;
            }
            year = digits(&mut i, 4)? * if neg { -1 } else { 1 };
            take(4, &mut j);
        } else if rest.starts_with("MON") {
            let word = std::str::from_utf8(t.get(i..i + 3)?).ok()?.to_ascii_uppercase();
            month = MONTHS.iter().position(|x| *x == word)? as u32 + 1;
            i += 3;
            take(3, &mut j);
        } else if rest.starts_with("MM") {
            month = u32::try_from(digits(&mut i, 2)?).ok()?;
            take(2, &mut j);
        } else if rest.starts_with("MI") {
            minute = digits(&mut i, 2)?;
            take(2, &mut j);
        } else if rest.starts_with("DD") {
            day = u32::try_from(digits(&mut i, 2)?).ok()?;
            take(2, &mut j);
        } else if rest.starts_with("HH24") {
            hour = digits(&mut i, 2)?;
            take(4, &mut j);
        } else if rest.starts_with("HH12") || rest.starts_with("HH") {
            hour = digits(&mut i, 2)?;
            take(if rest.starts_with("HH12") { 4 } else { 2 }, &mut j);
        } else if rest.starts_with("SS") {
            second = digits(&mut i, 2)?;
            take(2, &mut j);
        } else if rest.starts_with("FF") {
            let n = rest
                .as_bytes()
                .get(2)
                .filter(|b| b.is_ascii_digit())
                .map(|b| usize::from(b - b'0'));
            let start = i;
            while i < t.len() && t[i].is_ascii_digit() && i - start < 9 {
                i += 1;
            }
            micros = fraction_micros(std::str::from_utf8(&t[start..i]).ok()?)?;
            take(if n.is_some() { 3 } else { 2 }, &mut j);
        } else if rest.starts_with("AM") || rest.starts_with("PM") {
            let word = std::str::from_utf8(t.get(i..i + 2)?).ok()?.to_ascii_uppercase();
            pm = Some(word == "PM");
            i += 2;
            take(2, &mut j);
        } else if rest.starts_with("TZH") {
            let neg = match t.get(i) {
                Some(b'-') => true,
                Some(b'+') => false,
                _ => return None,
            };
            i += 1;
            tzh = Some(digits(&mut i, 2)? * if neg { -1 } else { 1 });
            take(3, &mut j);
        } else if rest.starts_with("TZM") {
            tzm = digits(&mut i, 2)?;
            take(3, &mut j);
        } else {
            // A separator: the text has one too (any punctuation or space).
            let c = *t.get(i)?;
            if c.is_ascii_alphanumeric() {
                return None;
            }
            i += 1;
            j += 1;
        }
    }
    if i != t.len() || !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 59
    {
        return None;
    }
    if let Some(pm) = pm {
        hour = hour % 12 + if pm { 12 } else { 0 };
    }
    let days = days_from_civil(year, month, day);
    let wall = ((days * 24 + hour) * 60 + minute) * 60 + second;
    let offset = tzh.map(|h| h * 60 + if h < 0 { -tzm } else { tzm });
    Some((wall.checked_mul(1_000_000)?.checked_add(micros)?, offset))
}

/// A key value as the canonical text [`super::client::snapshot_sql`]'s
/// binds convert back (`TO_NUMBER`, `TO_DATE(.., DATE_MASK)`, ...); `None`
/// for NULL or a type a key is not made of.
pub fn canonical_text(col: &Column, value: &Value) -> Option<String> {
    Some(match value {
        Value::Int16(v) => v.to_string(),
        Value::Int32(v) => v.to_string(),
        Value::Int64(v) => v.to_string(),
        Value::Decimal(t) | Value::Text(t) => t.clone(),
        Value::Bytes(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
        Value::Timestamp(m) if col.source_type.eq_ignore_ascii_case("DATE") => {
            render_timestamp(*m).get(..19)?.to_string()
        }
        Value::Timestamp(m) | Value::TimestampTz(m) => render_timestamp(*m),
        _ => return None,
    })
}

/// Renders wall-clock microseconds in [`TIMESTAMP_MASK`] (the fake and the
/// tests write timestamps as Oracle would).
pub fn render_timestamp(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let dt = chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default().naive_utc();
    format!("{}.{:06}000", dt.format("%Y-%m-%d %H:%M:%S"), frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(t: DataType, st: &str) -> Column {
        let mut c = Column::new("C", t, true);
        c.source_type = st.into();
        c
    }

    #[test]
    fn numbers_decode_exactly() {
        assert_eq!(normalize_number(".5").as_deref(), Some("0.5"));
        assert_eq!(normalize_number("-.5").as_deref(), Some("-0.5"));
        assert_eq!(normalize_number("1.5E+3").as_deref(), Some("1500"));
        assert_eq!(normalize_number("12E-4").as_deref(), Some("0.0012"));
        assert_eq!(normalize_number("-0").as_deref(), Some("0"));
        assert_eq!(normalize_number("007").as_deref(), Some("7"));
        assert_eq!(normalize_number("1e999"), None);
        assert_eq!(normalize_number("x"), None);
        let c = col(DataType::VariableDecimal, "NUMBER");
        assert_eq!(decode(&c, &Literal::Str("-.25".into()), false).unwrap(), Value::Decimal("-0.25".into()));
        let c = col(DataType::Int32, "NUMBER(9)");
        assert_eq!(decode(&c, &Literal::Str("4000".into()), false).unwrap(), Value::Int32(4000));
        let e = decode(&c, &Literal::Str("4000x".into()), false).expect_err("not a number");
        assert_eq!(e.column(), Some("C"));
        assert!(!e.to_string().contains("4000x"), "{e}");
        let c = col(DataType::Float64, "BINARY_DOUBLE");
        assert_eq!(decode(&c, &Literal::Str("1.5E+000".into()), false).unwrap(), Value::Float64(1.5));
        assert_eq!(decode(&c, &Literal::Str("-Inf".into()), false).unwrap(), Value::Float64(f64::NEG_INFINITY));
    }

    #[test]
    fn dates_timestamps_and_intervals_decode_by_their_masks() {
        // Oracle Database Utilities, LogMiner example: TO_DATE('13-jan-2012 15:10:22', 'dd-mon-yyyy hh24:mi:ss').
        let (m, off) = parse_masked("13-jan-2012 15:10:22", "dd-mon-yyyy hh24:mi:ss").expect("parses");
        assert_eq!(off, None);
        assert_eq!(m, (days_from_civil(2012, 1, 13) * 86_400 + 15 * 3600 + 10 * 60 + 22) * 1_000_000);
        let d = col(DataType::Timestamp, "DATE");
        let lit = Literal::Date {
            text: "2012-01-13 15:10:22".into(),
            mask: DATE_MASK.into(),
        };
        assert_eq!(decode(&d, &lit, false).unwrap(), Value::Timestamp(m));
        let tz = col(DataType::TimestampTz, "TIMESTAMP(6) WITH TIME ZONE");
        let lit = Literal::TimestampTz {
            text: "2012-01-13 17:10:22.5 +02:00".into(),
            mask: "YYYY-MM-DD HH24:MI:SS.FF TZH:TZM".into(),
        };
        assert_eq!(decode(&tz, &lit, false).unwrap(), Value::TimestampTz(m + 500_000));
        let lit = Literal::TimestampTz {
            text: "2012-01-13 12:40:22 -02:30".into(),
            mask: "YYYY-MM-DD HH24:MI:SS TZH:TZM".into(),
        };
        assert_eq!(decode(&tz, &lit, false).unwrap(), Value::TimestampTz(m));
        assert_eq!(parse_masked("2012-13-01 00:00:00", DATE_MASK), None);
        assert_eq!(parse_masked("2012-01-01 00:00:00 junk", DATE_MASK), None);
        assert_eq!(
            parse_masked("03-04-2012 01:02:03 PM", "DD-MM-YYYY HH:MI:SS AM")
                .map(|x| x.0 % (86_400 * 1_000_000) / 3_600_000_000),
            Some(13)
        );
        let ts = col(DataType::Timestamp, "TIMESTAMP(9)");
        assert_eq!(decode(&ts, &Literal::Str(render_timestamp(m + 7)), true).unwrap(), Value::Timestamp(m + 7));
        let iv = col(DataType::Interval, "INTERVAL YEAR(2) TO MONTH");
        assert_eq!(
            decode(&iv, &Literal::YmInterval("-01-02".into()), false).unwrap(),
            Value::Interval { months: -14, days: 0, micros: 0 }
        );
        let iv = col(DataType::Interval, "INTERVAL DAY(2) TO SECOND(6)");
        assert_eq!(
            decode(&iv, &Literal::DsInterval("+01 02:03:04.500000".into()), false).unwrap(),
            Value::Interval { months: 0, days: 1, micros: 7_384_500_000 }
        );
    }

    #[test]
    fn timestamps_without_a_mask_read_in_the_session_format() {
        let ts = col(DataType::Timestamp, "TIMESTAMP(6)");
        let at = |t: &str| decode(&ts, &Literal::Timestamp { text: t.into(), mask: String::new() }, false);
        let base = days_from_civil(2020, 2, 1) * 86_400_000_000;
        assert_eq!(at("2020-02-01 00:00:00.").unwrap(), Value::Timestamp(base));
        assert_eq!(at("2020-02-01 00:00:00").unwrap(), Value::Timestamp(base));
        assert_eq!(at("2020-02-01 00:00:00.202590").unwrap(), Value::Timestamp(base + 202_590));
        let tz = col(DataType::TimestampTz, "TIMESTAMP(6) WITH TIME ZONE");
        let lit = Literal::TimestampTz {
            text: "2020-02-01 01:00:00.5 +01:00".into(),
            mask: String::new(),
        };
        assert_eq!(decode(&tz, &lit, false).unwrap(), Value::TimestampTz(base + 500_000));
        assert!(at("2020-02-01").is_err());
        let e = decode(&ts, &Literal::Unsupported, false).expect_err("unsupported");
        assert_eq!(e.kind(), crate::error::ErrorKind::NeedsOperator);
    }

    #[test]
    fn raw_lobs_and_types_map() {
        let t = TableId::new("APP", "T");
        assert_eq!(map_type(&t, "C", "NUMBER", None, None).unwrap(), DataType::VariableDecimal);
        assert_eq!(map_type(&t, "C", "NUMBER", Some(10), Some(0)).unwrap(), DataType::Int64);
        assert_eq!(map_type(&t, "C", "BLOB", None, None).unwrap(), DataType::Bytes);
        assert_eq!(map_type(&t, "C", "XMLTYPE", None, None).unwrap(), DataType::Text);
        assert_eq!(map_type(&t, "C", "INTERVAL YEAR(2) TO MONTH", None, None).unwrap(), DataType::Interval);
        let raw = col(DataType::Bytes, "RAW(16)");
        assert_eq!(decode(&raw, &Literal::Raw(vec![1, 2]), false).unwrap(), Value::Bytes(vec![1, 2]));
        assert_eq!(decode(&raw, &Literal::Str("0A0b".into()), true).unwrap(), Value::Bytes(vec![10, 11]));
        assert_eq!(decode(&raw, &Literal::EmptyLob, false).unwrap(), Value::Bytes(vec![]));
        assert_eq!(decode(&raw, &Literal::Null, false).unwrap(), Value::Null);
        assert!(snapshot_expr(&col(DataType::Timestamp, "DATE")).contains(DATE_MASK));
        assert!(snapshot_expr(&col(DataType::Int64, "NUMBER(12)")).contains("TM9"));
    }

    proptest::proptest! {
        /// Every microsecond timestamp in Oracle's range renders and parses back.
        #[test]
        fn timestamps_round_trip(micros in -62_000_000_000_000_000i64..250_000_000_000_000_000i64) {
            let text = render_timestamp(micros);
            proptest::prop_assert_eq!(parse_masked(&text, TIMESTAMP_MASK).map(|x| x.0), Some(micros), "{}", text);
        }

        /// Arbitrary text and masks never panic.
        #[test]
        fn masks_never_panic(text in "\\PC{0,30}", mask in "([A-Z0-9: .-]|\\PC){0,24}") {
            let _ = parse_masked(&text, &mask);
            let _ = normalize_number(&text);
            let _ = parse_interval(&text);
            let _ = parse_session_timestamp(&text);
        }

        /// Decimal text survives normalization digit for digit.
        #[test]
        fn decimals_keep_their_digits(int in "[1-9][0-9]{0,20}", frac in "[0-9]{0,10}", neg: bool) {
            let text = if frac.is_empty() { int.clone() } else { format!("{int}.{frac}") };
            let signed = if neg { format!("-{text}") } else { text.clone() };
            proptest::prop_assert_eq!(normalize_number(&signed), Some(signed.clone()));
        }
    }
}
