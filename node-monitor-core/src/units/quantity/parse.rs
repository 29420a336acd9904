//! `resource.ParseQuantity`: the grammar, the API machinery's int64 fast path (which decides
//! whether the input string is kept for printing) and the exact arbitrary-precision path.
use super::{CAP_EXPONENT, Format, MAX_LEN, MAX_NANOS, Quantity, QuantityError};

impl Quantity {
    /// `resource.ParseQuantity`.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Format { value: s.into() });
        }
        if s.len() > MAX_LEN {
            return Err(QuantityError::TooLong {
                value: s.chars().take(32).collect(),
                len: s.len(),
            });
        }
        if s == "0" {
            return Ok(Self {
                nanos: 0,
                format: Format::DecimalSI,
                cached: Some(s.into()),
            });
        }
        let parts = split(s)?;
        let Some((base, exponent, format)) = interpret_suffix(parts.suffix) else {
            return Err(QuantityError::Suffix {
                value: s.into(),
                suffix: parts.suffix.into(),
            });
        };
        let sign: i128 = if parts.positive { 1 } else { -1 };

        // The API machinery's int64 fast path: it decides whether the input string is kept.
        let (precision, scale, mantissa) = match format {
            Format::DecimalExponent | Format::DecimalSI => (
                18 - len_i32(parts.num) - len_i32(parts.denom),
                exponent,
                1_i64,
            ),
            Format::BinarySI if exponent >= 0 && parts.denom.is_empty() => {
                // `int32(float32(exponent)*3/10)` is exact for the binary exponents 10..=60.
                let decimal_digits = exponent * 3 / 10;
                (
                    15 - len_i32(parts.num) - decimal_digits - 1,
                    0,
                    1_i64 << exponent,
                )
            }
            Format::BinarySI => (-1, 0, 1),
        };
        if precision >= 0 {
            // In i64: an exponent near the i32 limit must neither overflow nor wrap here.
            let scale = i64::from(scale) - i64::from(len_i32(parts.denom));
            if scale >= -9 {
                let shifted = format!("{}{}", parts.num, parts.denom);
                if let Ok(value) = shifted.parse::<i64>()
                    && let Some(result) = value.checked_mul(mantissa)
                {
                    let keep = match format {
                        Format::BinarySI => exponent % 10 == 0 && value & 0x07 != 0,
                        _ => {
                            scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0')
                        }
                    };
                    let magnitude = scale_nanos(i128::from(result), scale);
                    return Ok(Self {
                        nanos: sign * magnitude,
                        format,
                        cached: keep.then(|| s.into()),
                    });
                }
            }
        }

        // The arbitrary-precision path: exact value, rounded up to a nano, capped at i64::MAX.
        if !parts.value.bytes().any(|b| b.is_ascii_digit()) {
            return Err(QuantityError::Numeric { value: s.into() });
        }
        let digits = format!("{}{}", parts.num, parts.denom);
        let denom_len = i64::from(len_i32(parts.denom));
        let magnitude = match base {
            Base::Ten => exact_nanos(&digits, i64::from(exponent) - denom_len + 9, 0),
            Base::Two => exact_nanos(&digits, 9 - denom_len, exponent.unsigned_abs()),
        };
        Ok(Self {
            nanos: sign * magnitude,
            format,
            cached: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Two,
    Ten,
}

/// The pieces `parseQuantityString` extracts.
struct Parts<'a> {
    positive: bool,
    /// Sign, digits and decimal point as written (the slow path's input).
    value: &'a str,
    /// Integer digits without leading zeros ("0" when there are none).
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn len_i32(s: &str) -> i32 {
    i32::try_from(s.len()).unwrap_or(i32::MAX)
}

/// `parseQuantityString`, transcribed: it accepts a few odd forms (`1.G`, `.5`) exactly as the
/// API machinery does.
fn split(s: &str) -> Result<Parts<'_>, QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    match b.first() {
        Some(b'-') => {
            positive = false;
            pos += 1;
        }
        Some(b'+') => pos += 1,
        _ => {}
    }
    // Leading zeros.
    loop {
        if pos >= end {
            return Ok(Parts {
                positive,
                value: "0",
                num: "0",
                denom: "",
                suffix: "",
            });
        }
        if b[pos] == b'0' {
            pos += 1;
        } else {
            break;
        }
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let mut num = &s[num_start..pos];
    if pos >= end {
        return Ok(Parts {
            positive,
            value: s,
            num,
            denom: "",
            suffix: "",
        });
    }
    if num.is_empty() {
        num = "0";
    }
    let mut denom = "";
    if b[pos] == b'.' {
        pos += 1;
        let denom_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[denom_start..pos];
        if pos >= end {
            return Ok(Parts {
                positive,
                value: s,
                num,
                denom,
                suffix: "",
            });
        }
    }
    let value = &s[..pos];
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::Format { value: s.into() });
    }
    Ok(Parts {
        positive,
        value,
        num,
        denom,
        suffix: &s[suffix_start..],
    })
}

/// `suffixHandler.interpret`: base, exponent and format of a suffix.
fn interpret_suffix(suffix: &str) -> Option<(Base, i32, Format)> {
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(e) = decimal {
        return Some((Base::Ten, e, Format::DecimalSI));
    }
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(e) = binary {
        return Some((Base::Two, e, Format::BinarySI));
    }
    let rest = suffix.strip_prefix(['e', 'E'])?;
    if rest.is_empty() {
        return None;
    }
    // Go's strconv.ParseInt(…, 10, 64) then int32(): the conversion wraps.
    let parsed: i64 = rest.parse().ok()?;
    // Truncating like Go's int32() conversion, on purpose.
    Some((Base::Ten, parsed as i32, Format::DecimalExponent))
}

/// `value × 10^scale` in nanos, for the fast path (`scale >= -9`), capped.
fn scale_nanos(value: i128, scale: i64) -> i128 {
    if value == 0 {
        return 0;
    }
    let mut v = value;
    for _ in 0..(scale + 9) {
        v = v.saturating_mul(10);
        if v > MAX_NANOS {
            return MAX_NANOS;
        }
    }
    v.min(MAX_NANOS)
}

/// `ceil(digits × 2^pow2 × 10^pow10)`, capped at `MAX_NANOS`; `digits` is a decimal integer.
fn exact_nanos(digits: &str, pow10: i64, pow2: u32) -> i128 {
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return 0;
    }
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    // Above the cap however the digits go.
    if len + pow10 > CAP_EXPONENT {
        return MAX_NANOS;
    }
    // Below one nano (2^60 < 10^19): rounds up to the smallest non-zero value.
    if len + pow10 + 19 < 0 {
        return 1;
    }
    let mut n = BigUint::from_decimal(digits);
    n.shl(pow2);
    let mut inexact = false;
    if pow10 >= 0 {
        for _ in 0..pow10 {
            n.mul_small(10);
        }
    } else {
        for _ in 0..pow10.unsigned_abs() {
            inexact |= n.div_small(10) != 0;
        }
    }
    let mut v = n.to_i128_capped();
    if inexact {
        v = v.saturating_add(1);
    }
    v.min(MAX_NANOS)
}

/// Just enough unsigned big-integer arithmetic for exact quantity parsing (little-endian limbs).
struct BigUint(Vec<u32>);

impl BigUint {
    fn from_decimal(digits: &str) -> Self {
        let mut n = BigUint(Vec::new());
        for d in digits.bytes() {
            n.mul_small(10);
            n.add_small(u32::from(d - b'0'));
        }
        n
    }

    fn mul_small(&mut self, m: u32) {
        let mut carry = 0_u64;
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = (v & 0xffff_ffff) as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push((carry & 0xffff_ffff) as u32);
        }
    }

    fn add_small(&mut self, a: u32) {
        let mut carry = u64::from(a);
        for limb in &mut self.0 {
            if carry == 0 {
                return;
            }
            let v = u64::from(*limb) + carry;
            *limb = (v & 0xffff_ffff) as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push((carry & 0xffff_ffff) as u32);
        }
    }

    fn shl(&mut self, bits: u32) {
        for _ in 0..bits {
            self.mul_small(2);
        }
    }

    /// Divides in place; returns the remainder.
    fn div_small(&mut self, d: u32) -> u32 {
        let mut rem = 0_u64;
        for limb in self.0.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(d)) as u32;
            rem = v % u64::from(d);
        }
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
        rem as u32
    }

    fn to_i128_capped(&self) -> i128 {
        if self.0.len() > 4 {
            return MAX_NANOS;
        }
        let mut v: u128 = 0;
        for limb in self.0.iter().rev() {
            v = (v << 32) | u128::from(*limb);
        }
        i128::try_from(v).unwrap_or(i128::MAX).min(MAX_NANOS)
    }
}
