//! Values as SQL text: the input syntax PostgreSQL reads for each type
//! (ISO dates, `t`/`f`, `\x` hex bytes, `{...}` arrays). Redshift and
//! Snowflake read the same forms from their staged files, so every SQL sink
//! renders values here and only escapes them its own way.
//!
//! Values these forms cannot hold exactly are refused, never written as a
//! nearby value: PostgreSQL's infinite timestamps (`i64::MIN` / `MAX`
//! microseconds, as Debezium carries them: written as dates they were
//! 294247-01-10 04:00:54.775807, a real timestamp in Redshift and
//! Snowflake) and values the topic carries as the source's text beside the
//! row ([`Value::SourceText`]). Infinite dates (`i32::MIN` / `MAX` days)
//! are written as those days (5881580-07-11), which no destination has: the
//! destination refuses them with its own reason. The PostgreSQL sink writes
//! all of them as PostgreSQL has them (`crate::sinks::postgres::types`).
//!
//! Errors name the value's kind, never the value: they reach logs and
//! dead-letter headers.

use std::fmt::Write as _;

use tributary_schemas::temporal::{civil_from_days, days_from_civil, instant_from_iso};
use tributary_schemas::{DataType, Value};

/// Why a value without an exact form here is refused ([`Value::SourceText`]).
pub const NO_EXACT_FORM: &str = "a value the change topic carries only as the source's text (a numeric NaN or \
     infinity, a timestamp after 294247-01-10, an array of several dimensions or lower bounds other than 1, see \
     docs/type-mapping.md): only a PostgreSQL destination holds it exactly";
/// Why an infinite timestamp is refused.
pub const INFINITE: &str = "PostgreSQL's infinity or -infinity (carried as the largest or smallest value), which \
     this destination has no value for";

/// Whether a date of `days` is PostgreSQL's `infinity` / `-infinity`.
pub fn infinite_date(days: i32) -> bool {
    days == i32::MAX || days == i32::MIN
}

/// Whether a timestamp of `micros` is PostgreSQL's `infinity` / `-infinity`.
pub fn infinite_timestamp(micros: i64) -> bool {
    micros == i64::MAX || micros == i64::MIN
}

/// The SQL text form of a (non-null) value.
pub fn render_text(out: &mut String, value: &Value) -> Result<(), String> {
    match value {
        Value::SourceText { .. } => return Err(NO_EXACT_FORM.into()),
        Value::Timestamp(t) | Value::TimestampTz(t) if infinite_timestamp(*t) => return Err(INFINITE.into()),
        Value::Null => return Err("null is not a text value".into()),
        Value::Boolean(b) => out.push_str(if *b { "t" } else { "f" }),
        Value::Int16(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Int32(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Int64(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Float32(v) => render_float(out, f64::from(*v), v.to_string()),
        Value::Float64(v) => render_float(out, *v, v.to_string()),
        Value::Decimal(s) | Value::Text(s) | Value::Json(s) | Value::Enum(s) => out.push_str(s),
        Value::Uuid(u) => {
            let _ = write!(out, "{}", u.hyphenated());
        }
        Value::Bytes(b) | Value::Geometry(b) => {
            out.push_str("\\x");
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
        }
        Value::Date(days) => render_date(out, i64::from(*days)),
        Value::Time(micros) => render_time(out, *micros),
        Value::Timestamp(micros) => render_timestamp(out, *micros, false),
        Value::TimestampTz(micros) => render_timestamp(out, *micros, true),
        Value::Interval { months, days, micros } => {
            let hours = micros / 3_600_000_000;
            let rest = micros % 3_600_000_000;
            let sign = if rest < 0 { "-" } else { "" };
            let rest = rest.unsigned_abs();
            let _ = write!(
                out,
                "{months} mons {days} days {hours} hours {sign}{}.{:06} secs",
                rest / 1_000_000,
                rest % 1_000_000
            );
        }
        Value::Array(items) => render_array(out, items, ',', &render_text)?,
        Value::Unchanged => {
            return Err("an unchanged (TOAST) value reached the sink; the source must resolve it".into())
        }
    }
    Ok(())
}

/// An array literal `{...}` of `items`, separated by `delimiter`: NULL,
/// nested arrays as they are, every other element's text (from `item`)
/// quoted and escaped.
pub fn render_array(
    out: &mut String,
    items: &[Value],
    delimiter: char,
    item: &dyn Fn(&mut String, &Value) -> Result<(), String>,
) -> Result<(), String> {
    out.push('{');
    for (n, value) in items.iter().enumerate() {
        if n > 0 {
            out.push(delimiter);
        }
        match value {
            Value::Null => out.push_str("NULL"),
            Value::Array(_) => item(out, value)?,
            other => {
                let mut inner = String::new();
                item(&mut inner, other)?;
                out.push('"');
                for ch in inner.chars() {
                    if ch == '"' || ch == '\\' {
                        out.push('\\');
                    }
                    out.push(ch);
                }
                out.push('"');
            }
        }
    }
    out.push('}');
    Ok(())
}

fn render_float(out: &mut String, v: f64, shortest: String) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&shortest);
    }
}

/// Appends `v` with at least `width` digits, zero-padded (`format!`'s
/// `{:0width$}` costs several times more, on every timestamp of a snapshot).
fn push_digits(out: &mut String, v: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(v);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

/// `YYYY-MM-DD` (year at least 4 digits); `true` when the date is BC.
fn render_ymd(out: &mut String, days: i64) -> bool {
    let (y, m, d) = civil_from_days(days);
    let bc = y <= 0;
    push_digits(out, (if bc { 1 - y } else { y }).unsigned_abs(), 4);
    out.push('-');
    push_digits(out, u64::from(m), 2);
    out.push('-');
    push_digits(out, u64::from(d), 2);
    bc
}

fn render_date(out: &mut String, days: i64) {
    if render_ymd(out, days) {
        out.push_str(" BC");
    }
}

fn render_time_of_day(out: &mut String, micros: i64) {
    let micros = micros.unsigned_abs();
    let secs = micros / 1_000_000;
    push_digits(out, secs / 3600, 2);
    out.push(':');
    push_digits(out, (secs / 60) % 60, 2);
    out.push(':');
    push_digits(out, secs % 60, 2);
    out.push('.');
    push_digits(out, micros % 1_000_000, 6);
}

/// `[-]HH:MM:SS.ffffff`, hours as many as it takes: every value exactly
/// (a MySQL TIME spans -838:59:59 to 838:59:59). PostgreSQL's `interval`
/// reads it as it is; a time-of-day column (`time`, `TIME`) refuses what
/// is outside a day, loudly, where it was once taken modulo a day (the
/// destination held `01:00:01` for `-838:59:59`).
fn render_time(out: &mut String, micros: i64) {
    if micros < 0 {
        out.push('-');
    }
    render_time_of_day(out, micros);
}

fn render_timestamp(out: &mut String, micros: i64, utc: bool) {
    let days = micros.div_euclid(86_400_000_000);
    let tod = micros.rem_euclid(86_400_000_000);
    let bc = render_ymd(out, days);
    out.push(' ');
    render_time_of_day(out, tod);
    if utc {
        out.push_str("+00");
    }
    if bc {
        out.push_str(" BC");
    }
}

/// Appends `v` as SQL text: `NaN`, `Infinity` and `-Infinity` for the values
/// without digits.
pub fn render_float64(out: &mut String, v: f64) {
    render_float(out, v, v.to_string());
}

/// The value of `text` as [`render_text`] wrote it for a column of type
/// `data_type` (its inverse): what a destination that keeps a type as its
/// text holds is read back with it. The error names the type, never the
/// value; an array kept as text (of several dimensions) has no reading
/// here.
pub fn parse_text(data_type: &DataType, text: &str) -> Result<Value, String> {
    let not = |what: &str| format!("not {what} as the sink writes it");
    Ok(match data_type {
        DataType::Boolean => match text {
            "t" | "true" => Value::Boolean(true),
            "f" | "false" => Value::Boolean(false),
            _ => return Err(not("a boolean")),
        },
        DataType::Int16 => Value::Int16(text.parse().map_err(|_| not("an int16"))?),
        DataType::Int32 => Value::Int32(text.parse().map_err(|_| not("an int32"))?),
        DataType::Int64 => Value::Int64(text.parse().map_err(|_| not("an int64"))?),
        DataType::Float32 => Value::Float32(parse_float(text).ok_or_else(|| not("a float"))?),
        DataType::Float64 => Value::Float64(parse_float(text).ok_or_else(|| not("a float"))?),
        DataType::Decimal { .. } | DataType::VariableDecimal => {
            let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
            let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
            let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
            if int.is_empty() || !all_digits(int) || !all_digits(frac) {
                return Err(not("a decimal"));
            }
            Value::Decimal(text.to_string())
        }
        // A UUID kept as its text compares as its text, in any case.
        DataType::Text | DataType::Uuid => Value::Text(text.to_string()),
        DataType::Enum { .. } => Value::Enum(text.to_string()),
        DataType::Json => Value::Json(text.to_string()),
        DataType::Bytes | DataType::Bits { .. } => Value::Bytes(parse_bytes(text).ok_or_else(|| not("bytes"))?),
        DataType::Geometry => Value::Geometry(parse_bytes(text).ok_or_else(|| not("bytes"))?),
        DataType::Date => Value::Date(parse_date(text).ok_or_else(|| not("a date"))?),
        DataType::Time | DataType::TimeSpan => Value::Time(parse_time(text).ok_or_else(|| not("a time"))?),
        DataType::Timestamp => Value::Timestamp(parse_written_timestamp(text).ok_or_else(|| not("a timestamp"))?),
        DataType::TimestampTz => {
            Value::TimestampTz(parse_written_timestamp(text).ok_or_else(|| not("a timestamp with time zone"))?)
        }
        DataType::Interval => {
            let (months, days, micros) = parse_interval(text).ok_or_else(|| not("an interval"))?;
            Value::Interval { months, days, micros }
        }
        DataType::Array(_) => return Err("an array kept as its text, which is not read back".into()),
    })
}

/// A float, or `NaN`, `Infinity`, `-Infinity` (as [`render_float`] writes them).
fn parse_float<F: std::str::FromStr + From<f32>>(text: &str) -> Option<F> {
    match text {
        "NaN" => Some(F::from(f32::NAN)),
        "Infinity" => Some(F::from(f32::INFINITY)),
        "-Infinity" => Some(F::from(f32::NEG_INFINITY)),
        _ => text.parse().ok(),
    }
}

/// `\x` and hex digits.
fn parse_bytes(text: &str) -> Option<Vec<u8>> {
    parse_hex(text.strip_prefix("\\x")?)
}

/// Bytes as hex digits (either case), two a byte.
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let hex = text.as_bytes();
    // `from_str_radix` takes a sign too.
    if !hex.len().is_multiple_of(2) || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// A timestamp as [`render_text`] writes it, a date BC among it
/// (`0002-12-31 23:59:59.999999+00 BC`), as microseconds since the epoch.
fn parse_written_timestamp(text: &str) -> Option<i64> {
    let Some(body) = text.strip_suffix(" BC") else {
        return parse_timestamp(text);
    };
    let body = body.strip_suffix("+00").unwrap_or(body);
    let (date, clock) = body.split_once(' ')?;
    let days = i64::from(parse_date(&format!("{date} BC"))?);
    let tod = parse_time(clock)?;
    if !(0..86_400_000_000).contains(&tod) {
        return None;
    }
    days.checked_mul(86_400_000_000)?.checked_add(tod)
}

// ------------------------------------------------ reading the forms back

/// The days since 1970-01-01 of a date in [`render_text`]'s form
/// (`2026-01-02`, `0001-12-31 BC`); `None` for any other text.
pub fn parse_date(text: &str) -> Option<i32> {
    let (ymd, bc) = match text.strip_suffix(" BC") {
        Some(d) => (d, true),
        None => (text, false),
    };
    let mut parts = ymd.splitn(3, '-');
    let year: i64 = digits(parts.next()?)?;
    let month: u32 = digits(parts.next()?)?;
    let day: u32 = digits(parts.next()?)?;
    if year > 10_000_000 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let year = if bc { 1 - year } else { year };
    let days = days_from_civil(year, month, day);
    // A day that does not exist (February 30th) is not this date's text.
    if civil_from_days(days) != (year, month, day) {
        return None;
    }
    i32::try_from(days).ok()
}

/// The microseconds of a time of day or a span in [`render_text`]'s form
/// (`01:02:03.000004`, `-838:59:59.000000`; the fraction may be shorter,
/// absent, or longer with zeros beyond the microsecond); `None` for any
/// other text, and for a finer fraction, which no microsecond holds.
pub fn parse_time(text: &str) -> Option<i64> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text),
    };
    let (hms, fraction) = body.split_once('.').unwrap_or((body, ""));
    let mut parts = hms.splitn(3, ':');
    let hours: i64 = digits(parts.next()?)?;
    let minutes: i64 = digits(parts.next()?)?;
    let seconds: i64 = digits(parts.next()?)?;
    if minutes > 59 || seconds > 59 {
        return None;
    }
    let micros = hours
        .checked_mul(3_600_000_000)?
        .checked_add(minutes * 60_000_000 + seconds * 1_000_000)?
        .checked_add(fraction_micros(fraction)?)?;
    Some(if negative { -micros } else { micros })
}

/// The microseconds since the epoch (UTC) of a timestamp: a date, `T` or a
/// space, a time of day with an optional fraction, and an optional offset
/// (`+00`, `+02:00`, `Z`; none: the wall clock as UTC, as a timestamp
/// without zone is kept). `None` for any other text (a date BC among it).
pub fn parse_timestamp(text: &str) -> Option<i64> {
    // The offset's sign comes after the time (a date's dashes come before).
    let time_at = text.find(['T', ' '])?;
    let zoned = text[time_at..].contains(['+', 'Z']) || text[time_at + 1..].contains('-');
    let fraction = text[time_at..].split_once('.').map(|(_, f)| f);
    // The fraction as exact microseconds (instant_from_iso would drop
    // digits beyond them).
    if let Some(f) = fraction {
        let digits_end = f.bytes().take_while(u8::is_ascii_digit).count();
        fraction_micros(&f[..digits_end])?;
    }
    if zoned {
        instant_from_iso(text)
    } else {
        instant_from_iso(&format!("{text}Z"))
    }
}

/// An interval in [`render_text`]'s form (`14 mons 3 days 4 hours
/// -306.780000 secs`) as months, days and microseconds.
pub fn parse_interval(text: &str) -> Option<(i32, i32, i64)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let [months, "mons", days, "days", hours, "hours", secs, "secs"] = words.as_slice() else {
        return None;
    };
    let hours: i64 = hours.parse().ok()?;
    let (negative, secs) = match secs.strip_prefix('-') {
        Some(s) => (true, s),
        None => (false, *secs),
    };
    let (whole, fraction) = secs.split_once('.').unwrap_or((secs, ""));
    let rest = digits::<i64>(whole)?
        .checked_mul(1_000_000)?
        .checked_add(fraction_micros(fraction)?)?;
    let micros = hours
        .checked_mul(3_600_000_000)?
        .checked_add(if negative { -rest } else { rest })?;
    Some((months.parse().ok()?, days.parse().ok()?, micros))
}

/// A number of ASCII digits only (no sign, no space).
fn digits<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The microseconds of a second's fraction (`5` is 500000); `None` when it
/// is not digits or has a nonzero digit beyond the microsecond.
fn fraction_micros(fraction: &str) -> Option<i64> {
    if fraction.is_empty() {
        return Some(0);
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || fraction.bytes().skip(6).any(|b| b != b'0') {
        return None;
    }
    let mut micros = 0;
    for (i, b) in fraction.bytes().take(6).enumerate() {
        micros += i64::from(b - b'0') * 10_i64.pow(5 - i as u32);
    }
    Some(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &Value) -> String {
        let mut out = String::new();
        render_text(&mut out, v).unwrap();
        out
    }

    #[test]
    fn renders_each_kind() {
        assert_eq!(text(&Value::Date(0)), "1970-01-01");
        assert_eq!(text(&Value::Date(-719_163)), "0001-12-31 BC");
        assert_eq!(text(&Value::Timestamp(-1)), "1969-12-31 23:59:59.999999");
        assert_eq!(text(&Value::TimestampTz(1_000_000)), "1970-01-01 00:00:01.000000+00");
        assert_eq!(text(&Value::Time(3_723_000_001)), "01:02:03.000001");
        // MySQL TIME's range, never taken modulo a day.
        assert_eq!(text(&Value::Time(-3_020_399_000_000)), "-838:59:59.000000");
        assert_eq!(text(&Value::Time(3_020_399_000_000)), "838:59:59.000000");
        assert_eq!(text(&Value::Time(-1)), "-00:00:00.000001");
        assert_eq!(text(&Value::Time(86_400_000_000)), "24:00:00.000000");
        assert_eq!(text(&Value::Time(i64::MIN)), "-2562047788:00:54.775808");
        assert_eq!(text(&Value::Float64(f64::NAN)), "NaN");
        assert_eq!(text(&Value::Bytes(vec![0, 255])), "\\x00ff");
        assert_eq!(
            text(&Value::Array(vec![Value::Text("a\"b".into()), Value::Null, Value::Int32(3)])),
            "{\"a\\\"b\",NULL,\"3\"}"
        );
        assert!(render_text(&mut String::new(), &Value::Null).is_err());
        assert!(render_text(&mut String::new(), &Value::Unchanged).is_err());
    }

    #[test]
    fn every_form_reads_back_as_its_value() {
        for v in [
            Value::Date(0),
            Value::Date(-719_163),
            Value::Date(20_455),
            Value::Time(3_723_000_001),
            Value::Time(-3_020_399_000_000),
            Value::Time(-1),
            Value::Timestamp(-1),
            Value::TimestampTz(1_767_225_601_123_456),
            Value::Interval {
                months: 14,
                days: 3,
                micros: 4 * 3_600_000_000 + 306_780_000,
            },
            Value::Interval { months: -14, days: -3, micros: -3_723_000_001 },
        ] {
            let t = text(&v);
            let back = match v {
                Value::Date(_) => parse_date(&t).map(Value::Date),
                Value::Time(_) => parse_time(&t).map(Value::Time),
                Value::Timestamp(_) => parse_timestamp(&t).map(Value::Timestamp),
                Value::TimestampTz(_) => parse_timestamp(&t).map(Value::TimestampTz),
                _ => parse_interval(&t).map(|(months, days, micros)| Value::Interval { months, days, micros }),
            };
            assert_eq!(back, Some(v), "{t}");
        }
        // Other engines' spellings of the same values.
        assert_eq!(parse_timestamp("2026-01-01T00:00:01.5"), Some(1_767_225_601_500_000));
        assert_eq!(parse_timestamp("2026-01-01T00:00:01"), Some(1_767_225_601_000_000));
        assert_eq!(parse_timestamp("2026-01-01 02:00:01+02:00"), Some(1_767_225_601_000_000));
        assert_eq!(parse_timestamp("1969-12-31 23:00:00-01:00"), Some(0));
        assert_eq!(parse_time("01:02:03"), Some(3_723_000_000));
        assert_eq!(parse_time("01:02:03.000004000"), Some(3_723_000_004));
        // What no microsecond holds, and what is not a value's text.
        assert_eq!(parse_time("01:02:03.0000041"), None);
        assert_eq!(parse_timestamp("2026-01-01 00:00:01.0000001"), None);
        assert_eq!(parse_date("2026-02-30"), None);
        assert_eq!(parse_date("2026-1-x"), None);
        assert_eq!(parse_interval("P1Y"), None);
    }

    #[test]
    fn each_kind_reads_back_as_it_was_written() {
        let decimal = DataType::Decimal { precision: 10, scale: 2 };
        let cases = [
            (DataType::Boolean, Value::Boolean(true)),
            (DataType::Int16, Value::Int16(-7)),
            (DataType::Int64, Value::Int64(i64::MIN)),
            (DataType::Float32, Value::Float32(0.1)),
            (DataType::Float64, Value::Float64(-1.0e-300)),
            (DataType::Float64, Value::Float64(f64::NEG_INFINITY)),
            (decimal.clone(), Value::Decimal("-12.50".into())),
            (DataType::Text, Value::Text("a b\n".into())),
            (DataType::Json, Value::Json("{\"a\": 1}".into())),
            (DataType::Bytes, Value::Bytes(vec![0, 0xab, 0xff])),
            (DataType::Date, Value::Date(0)),
            (DataType::Date, Value::Date(-719_163)),
            (DataType::Date, Value::Date(2_932_896)),
            (DataType::Time, Value::Time(3_723_000_001)),
            (DataType::TimeSpan, Value::Time(-3_020_399_000_000)),
            (DataType::TimeSpan, Value::Time(-1)),
            (DataType::Timestamp, Value::Timestamp(-1)),
            (DataType::Timestamp, Value::Timestamp(-62_167_219_200_000_001)),
            (DataType::TimestampTz, Value::TimestampTz(1_767_225_600_123_456)),
            (DataType::Interval, Value::Interval { months: 14, days: -3, micros: -7_384_000_001 }),
            (DataType::Interval, Value::Interval { months: 0, days: 0, micros: -1 }),
            (DataType::Interval, Value::Interval { months: -1, days: 2, micros: 3_600_000_000 }),
        ];
        for (data_type, value) in cases {
            let written = text(&value);
            assert_eq!(parse_text(&data_type, &written), Ok(value.clone()), "{data_type}: {written}");
        }
        // Another offset is the same instant (a destination may print one).
        assert_eq!(
            parse_text(&DataType::TimestampTz, "2026-01-01 02:00:00+02"),
            parse_text(&DataType::TimestampTz, "2026-01-01 00:00:00+00")
        );
        let u = uuid::Uuid::from_u128(7);
        assert_eq!(parse_text(&DataType::Uuid, &text(&Value::Uuid(u))), Ok(Value::Text(u.hyphenated().to_string())));
        for (data_type, bad) in [
            (DataType::Date, "2023-02-30"),
            (DataType::Time, "12:60:00"),
            (DataType::Bytes, "\\xabc"),
            (decimal, "1e5"),
            (DataType::Interval, "P1D"),
            (DataType::Array(Box::new(DataType::Int32)), "{{1},{2}}"),
        ] {
            assert!(parse_text(&data_type, bad).is_err(), "{data_type}: {bad}");
        }
    }

    #[test]
    fn values_without_an_exact_form_are_refused() {
        for v in [
            Value::Timestamp(i64::MAX),
            Value::TimestampTz(i64::MIN),
            Value::SourceText { text: "NaN".into(), nearest: Box::new(Value::Null) },
            Value::Array(vec![Value::TimestampTz(i64::MAX)]),
        ] {
            assert!(render_text(&mut String::new(), &v).is_err(), "{v:?}");
        }
        // The microseconds next to them are ordinary values; an infinite
        // date is a day no destination has, which it refuses itself.
        assert_eq!(text(&Value::Date(i32::MAX)), "5881580-07-11");
        assert_eq!(text(&Value::Timestamp(i64::MAX - 1)), "294247-01-10 04:00:54.775806");
    }
}
