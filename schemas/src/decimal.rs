//! Decimal text (the model's exact representation) to and from Avro's
//! `decimal`: the unscaled value as a big-endian two's-complement integer.
//!
//! Values up to 38 digits take an `i128` path that allocates nothing; larger
//! ones (PostgreSQL numerics go to 1000 digits) use `num-bigint`.

use num_bigint::BigInt;

/// Why a decimal text does not fit. Static, so it can never echo the value.
pub type Reason = &'static str;

/// A parsed decimal text: sign, digits without leading zeros, and where the
/// point was.
struct Parsed<'a> {
    negative: bool,
    /// Integer-part digits, leading zeros removed.
    int: &'a [u8],
    /// Fraction digits as written.
    frac: &'a [u8],
}

fn parse(text: &str) -> Result<Parsed<'_>, Reason> {
    let b = text.as_bytes();
    let (negative, rest) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let (int, frac) = match rest.iter().position(|&c| c == b'.') {
        Some(p) => (&rest[..p], &rest[p + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    if int.is_empty() && frac.is_empty() {
        return Err("not a decimal number");
    }
    if !int.iter().chain(frac.iter()).all(u8::is_ascii_digit) {
        // NaN, Infinity, exponents and stray characters all end here.
        return Err("not a finite decimal number in plain notation");
    }
    let first_nonzero = int.iter().position(|&c| c != b'0').unwrap_or(int.len());
    Ok(Parsed { negative, int: &int[first_nonzero..], frac })
}

/// Appends the minimal two's-complement big-endian bytes of `v`.
fn push_i128(out: &mut Vec<u8>, v: i128) {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    // Drop sign-extension bytes while the next byte still carries the sign.
    while start < 15 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0x00 && next & 0x80 == 0) || (b == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Writes the unscaled digits (`int` then `frac`, then `pad` zeros) into
/// `out` as two's complement bytes.
fn push_unscaled(out: &mut Vec<u8>, negative: bool, int: &[u8], frac: &[u8], pad: usize) {
    let digits = int.len() + frac.len() + pad;
    if digits <= 38 {
        let mut v: i128 = 0;
        for &d in int.iter().chain(frac.iter()) {
            v = v * 10 + i128::from(d - b'0');
        }
        for _ in 0..pad {
            v *= 10;
        }
        push_i128(out, if negative { -v } else { v });
        return;
    }
    let mut text = Vec::with_capacity(digits + 1);
    if negative {
        text.push(b'-');
    }
    text.extend_from_slice(int);
    text.extend_from_slice(frac);
    text.resize(text.len() + pad, b'0');
    // Digits were checked by `parse`, so this cannot fail; fall back to zero
    // rather than panic should that ever change.
    let v = BigInt::parse_bytes(&text, 10).unwrap_or_default();
    out.extend_from_slice(&v.to_signed_bytes_be());
}

/// Encodes decimal text at a fixed `scale`, checking it has at most
/// `precision` digits. Appends the unscaled bytes (without length) to `out`.
/// Extra fraction digits are accepted only when they are zeros, so the
/// value is never rounded.
pub fn encode_fixed(out: &mut Vec<u8>, text: &str, precision: u32, scale: u32) -> Result<(), Reason> {
    let p = parse(text)?;
    let scale = scale as usize;
    let mut frac = p.frac;
    if frac.len() > scale {
        if frac[scale..].iter().any(|&c| c != b'0') {
            return Err("more fraction digits than the column's scale");
        }
        frac = &frac[..scale];
    }
    if p.int.len() + scale > precision as usize {
        return Err("more digits than the column's precision");
    }
    push_unscaled(out, p.negative, p.int, frac, scale - frac.len());
    Ok(())
}

/// Encodes decimal text keeping its own scale (Debezium's
/// `VariableScaleDecimal`). Appends the unscaled bytes and returns the scale.
pub fn encode_variable(out: &mut Vec<u8>, text: &str) -> Result<i32, Reason> {
    let p = parse(text)?;
    let scale = i32::try_from(p.frac.len()).map_err(|_| "scale too large")?;
    push_unscaled(out, p.negative, p.int, p.frac, 0);
    Ok(scale)
}

/// The largest scale (or negative scale) a decoded decimal may have: far
/// beyond any database's, and small enough that forged input cannot make
/// us build a huge string.
pub const MAX_SCALE: i32 = 16_384;

/// Renders unscaled two's-complement bytes at `scale` as canonical decimal
/// text: optional `-`, integer digits without leading zeros (at least one),
/// and exactly `scale` fraction digits.
pub fn decode(bytes: &[u8], scale: i32) -> Result<String, Reason> {
    if bytes.is_empty() {
        return Err("empty decimal bytes");
    }
    if scale.unsigned_abs() > MAX_SCALE as u32 {
        return Err("decimal scale out of range");
    }
    let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0x00 };
    if bytes.len() <= 8 {
        // The common case: formatting a u64 is several times faster than
        // a u128, and needs no intermediate string.
        let mut a = [fill; 8];
        a[8 - bytes.len()..].copy_from_slice(bytes);
        let v = i64::from_be_bytes(a);
        let mut buf = [0u8; 20];
        let digits = format_u64(v.unsigned_abs(), &mut buf);
        return Ok(place_point(v < 0, digits, scale));
    }
    let (negative, digits) = if bytes.len() <= 16 {
        let mut a = [fill; 16];
        a[16 - bytes.len()..].copy_from_slice(bytes);
        let v = i128::from_be_bytes(a);
        (v < 0, v.unsigned_abs().to_string())
    } else {
        let v = BigInt::from_signed_bytes_be(bytes);
        (v.sign() == num_bigint::Sign::Minus, v.magnitude().to_string())
    };
    Ok(place_point(negative, &digits, scale))
}

/// Decimal digits of `v`, written at the end of `buf`.
fn format_u64(mut v: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

fn place_point(negative: bool, digits: &str, scale: i32) -> String {
    let mut s = String::with_capacity(digits.len() + scale.unsigned_abs() as usize + 3);
    if negative && digits != "0" {
        s.push('-');
    }
    if scale <= 0 {
        s.push_str(digits);
        if digits != "0" {
            s.extend(std::iter::repeat_n('0', scale.unsigned_abs() as usize));
        }
        return s;
    }
    let scale = scale as usize;
    if digits.len() <= scale {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', scale - digits.len()));
        s.push_str(digits);
    } else {
        let (i, f) = digits.split_at(digits.len() - scale);
        s.push_str(i);
        s.push('.');
        s.push_str(f);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(text: &str, p: u32, s: u32) -> Result<String, Reason> {
        let mut out = Vec::new();
        encode_fixed(&mut out, text, p, s)?;
        decode(&out, s as i32)
    }

    #[test]
    fn fixed_round_trips_and_pads() {
        assert_eq!(fixed("-12.34", 12, 2).as_deref(), Ok("-12.34"));
        assert_eq!(fixed("12.3", 12, 2).as_deref(), Ok("12.30"));
        assert_eq!(fixed("0", 5, 2).as_deref(), Ok("0.00"));
        assert_eq!(fixed("-0.05", 5, 2).as_deref(), Ok("-0.05"));
        assert_eq!(fixed("+007", 3, 0).as_deref(), Ok("7"));
        assert_eq!(fixed("1.500", 3, 2).as_deref(), Ok("1.50"));
        assert_eq!(fixed("127", 3, 0).as_deref(), Ok("127"));
        assert_eq!(fixed("128", 3, 0).as_deref(), Ok("128"));
        assert_eq!(fixed("-128", 3, 0).as_deref(), Ok("-128"));
    }

    #[test]
    fn fixed_rejects_what_does_not_fit() {
        assert!(fixed("NaN", 12, 2).is_err());
        assert!(fixed("1e5", 12, 2).is_err());
        assert!(fixed("1.234", 12, 2).is_err());
        assert!(fixed("1234", 5, 2).is_err());
        assert!(fixed("", 5, 2).is_err());
        assert!(fixed("-", 5, 2).is_err());
        assert!(fixed(".", 5, 2).is_err());
    }

    #[test]
    fn minimal_twos_complement_matches_bigint() {
        for v in [0i128, 1, -1, 127, 128, -128, -129, 255, 256, i128::MAX, i128::MIN + 1] {
            let mut out = Vec::new();
            push_i128(&mut out, v);
            assert_eq!(out, BigInt::from(v).to_signed_bytes_be(), "{v}");
        }
    }

    #[test]
    fn big_values_use_bigint() {
        let text = format!("-{}.{}", "9".repeat(60), "1".repeat(20));
        let mut out = Vec::new();
        let scale = encode_variable(&mut out, &text).expect("valid");
        assert_eq!(scale, 20);
        assert_eq!(decode(&out, scale).as_deref(), Ok(text.as_str()));
    }

    #[test]
    fn negative_scale_appends_zeros() {
        assert_eq!(decode(&[12], -3).as_deref(), Ok("12000"));
        assert_eq!(decode(&[0], -3).as_deref(), Ok("0"));
        assert!(decode(&[], 0).is_err());
        assert!(decode(&[1], i32::MAX).is_err());
    }
}
