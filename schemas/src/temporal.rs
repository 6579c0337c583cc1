//! Text forms of time values that Debezium carries as strings: intervals
//! (`io.debezium.time.Interval`, ISO-8601 durations) and zoned timestamps
//! (`io.debezium.time.ZonedTimestamp`, ISO-8601 instants with an offset).

use std::fmt::Write as _;

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_MINUTE: i64 = 60 * MICROS_PER_SECOND;
const MICROS_PER_HOUR: i64 = 60 * MICROS_PER_MINUTE;
const MICROS_PER_DAY: i64 = 24 * MICROS_PER_HOUR;

/// Renders an interval the way Debezium's `io.debezium.time.Interval` does:
/// every component present, `P1Y2M3DT4H5M6.78S`. Each component carries its
/// own sign, so parsing the text gives back exactly the same three parts.
pub fn interval_to_iso(months: i32, days: i32, micros: i64) -> String {
    let mut s = String::with_capacity(32);
    let hours = micros / MICROS_PER_HOUR;
    let rem = micros % MICROS_PER_HOUR;
    let minutes = rem / MICROS_PER_MINUTE;
    let rem = rem % MICROS_PER_MINUTE;
    let secs = rem / MICROS_PER_SECOND;
    let frac = (rem % MICROS_PER_SECOND).unsigned_abs();
    let _ = write!(s, "P{}Y{}M{}DT{}H{}M", months / 12, months % 12, days, hours, minutes);
    if rem < 0 {
        s.push('-');
    }
    let _ = write!(s, "{}", secs.unsigned_abs());
    if frac != 0 {
        let f = format!("{frac:06}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s.push('S');
    s
}

/// Parses an ISO-8601 duration (`P1Y2M3DT4H5M6.78S`, any subset of the
/// components, each optionally negative, weeks allowed) into months, days
/// and microseconds.
pub fn interval_from_iso(text: &str) -> Option<(i32, i32, i64)> {
    let (negate_all, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let rest = rest.strip_prefix('P')?;
    let (date_part, time_part) = match rest.find('T') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut months: i64 = 0;
    let mut days: i64 = 0;
    let mut micros: i64 = 0;
    let mut any = false;
    for (number, unit) in components(date_part)? {
        any = true;
        let n: i64 = number.parse().ok()?;
        match unit {
            'Y' => months = months.checked_add(n.checked_mul(12)?)?,
            'M' => months = months.checked_add(n)?,
            'W' => days = days.checked_add(n.checked_mul(7)?)?,
            'D' => days = days.checked_add(n)?,
            _ => return None,
        }
    }
    if let Some(time_part) = time_part {
        for (number, unit) in components(time_part)? {
            any = true;
            let add = match unit {
                'H' => number.parse::<i64>().ok()?.checked_mul(MICROS_PER_HOUR)?,
                'M' => number.parse::<i64>().ok()?.checked_mul(MICROS_PER_MINUTE)?,
                'S' => seconds_to_micros(number)?,
                _ => return None,
            };
            micros = micros.checked_add(add)?;
        }
    }
    if !any {
        return None;
    }
    if negate_all {
        months = months.checked_neg()?;
        days = days.checked_neg()?;
        micros = micros.checked_neg()?;
    }
    Some((i32::try_from(months).ok()?, i32::try_from(days).ok()?, micros))
}

/// Splits `1Y-2M3D` into `("1",'Y'), ("-2",'M'), ("3",'D')`.
fn components(s: &str) -> Option<Vec<(&str, char)>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c.is_ascii_alphabetic() {
            let number = &s[start..i];
            if number.is_empty() {
                return None;
            }
            out.push((number, c));
            start = i + c.len_utf8();
        }
    }
    if start != s.len() {
        return None;
    }
    Some(out)
}

/// `-6.78` seconds to microseconds; more than six fraction digits are cut,
/// as Debezium never sends them.
fn seconds_to_micros(text: &str) -> Option<i64> {
    let (negative, t) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (int, frac) = match t.find('.') {
        Some(i) => (&t[..i], &t[i + 1..]),
        None => (t, ""),
    };
    if int.is_empty() || !int.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut v = int.parse::<i64>().ok()?.checked_mul(MICROS_PER_SECOND)?;
    let mut scale = 100_000;
    for d in frac.bytes().take(6) {
        v = v.checked_add(i64::from(d - b'0') * scale)?;
        scale /= 10;
    }
    Some(if negative { -v } else { v })
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `days` after 1970-01-01, as `(year, month,
/// day)` with year 0 for 1 BC (Howard Hinnant's `civil_from_days`, the
/// inverse of [`days_from_civil`]).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    // Both fit: 1..=31 and 1..=12.
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses an ISO-8601 instant with offset (`2024-01-02T03:04:05.123456Z`,
/// `...+02:00`) into microseconds since the Unix epoch, UTC.
pub fn instant_from_iso(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    // Years beyond 9999 and negative years are written with a sign.
    let (year_sign, body) = match b.first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => (1, text),
    };
    let dash = body.find('-')?;
    let year: i64 = year_sign * body[..dash].parse::<i64>().ok()?;
    // Far beyond any database's range; keeps the day arithmetic in i64.
    if year.abs() > 1_000_000 {
        return None;
    }
    let rest = &body[dash + 1..];
    let num = |s: &str, from: usize, len: usize| -> Option<u32> {
        let part = s.get(from..from + len)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let month = num(rest, 0, 2)?;
    let day = num(rest, 3, 2)?;
    if rest.as_bytes().get(2) != Some(&b'-') {
        return None;
    }
    let sep = rest.as_bytes().get(5)?;
    if *sep != b'T' && *sep != b' ' {
        return None;
    }
    let hour = num(rest, 6, 2)?;
    let minute = num(rest, 9, 2)?;
    let second = num(rest, 12, 2)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 24 || minute > 59 || second > 60 {
        return None;
    }
    let mut tail = rest.get(14..)?;
    let mut micros: i64 = 0;
    if let Some(f) = tail.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut scale = 100_000;
        for d in f.bytes().take(digits.min(6)) {
            micros += i64::from(d - b'0') * scale;
            scale /= 10;
        }
        tail = &f[digits..];
    }
    let offset_secs: i64 = match tail {
        "Z" | "z" => 0,
        _ => {
            let sign = match tail.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh = num(tail, 1, 2)?;
            let om = match tail.len() {
                3 => 0,
                6 if tail.as_bytes()[3] == b':' => num(tail, 4, 2)?,
                5 => num(tail, 3, 2)?,
                _ => return None,
            };
            sign * (i64::from(oh) * 3600 + i64::from(om) * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second) - offset_secs;
    days.checked_mul(MICROS_PER_DAY)?
        .checked_add(secs.checked_mul(MICROS_PER_SECOND)?)?
        .checked_add(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_round_trips() {
        for (m, d, us) in [
            (0, 0, 0),
            (14, 3, 4 * MICROS_PER_HOUR + 5 * MICROS_PER_MINUTE + 6_780_000),
            (-14, -3, -3_723_000_001),
            (i32::MAX, i32::MIN, i64::MAX),
            (i32::MIN, 0, i64::MIN),
            (0, 0, -500_000),
        ] {
            let text = interval_to_iso(m, d, us);
            assert_eq!(interval_from_iso(&text), Some((m, d, us)), "{text}");
        }
        assert_eq!(interval_to_iso(14, 3, 6_780_000), "P1Y2M3DT0H0M6.78S");
    }

    #[test]
    fn interval_parses_iso_subsets() {
        assert_eq!(interval_from_iso("P1W"), Some((0, 7, 0)));
        assert_eq!(interval_from_iso("PT1.5S"), Some((0, 0, 1_500_000)));
        assert_eq!(interval_from_iso("-P1M"), Some((-1, 0, 0)));
        assert_eq!(interval_from_iso("P"), None);
        assert_eq!(interval_from_iso("P1X"), None);
        assert_eq!(interval_from_iso("garbage"), None);
    }

    #[test]
    fn instants_parse_with_offsets() {
        assert_eq!(instant_from_iso("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(instant_from_iso("1970-01-01T01:00:00.5+01:00"), Some(500_000));
        assert_eq!(instant_from_iso("2024-02-29T12:34:56.123456Z"), Some(1_709_210_096_123_456));
        assert_eq!(instant_from_iso("1969-12-31T23:59:59Z"), Some(-1_000_000));
        assert_eq!(instant_from_iso("2024-13-01T00:00:00Z"), None);
        assert_eq!(instant_from_iso("2024-01-01"), None);
    }
}
