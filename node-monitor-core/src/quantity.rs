//! Kubernetes resource quantities, parsed and printed the way
//! `k8s.io/apimachinery/pkg/api/resource` does it
//! (<https://github.com/kubernetes/apimachinery/blob/master/pkg/api/resource/quantity.go>).
//!
//! A quantity is `<sign><digits>[.<digits>]<suffix>` where the suffix is binary (`Ki` … `Ei`),
//! decimal SI (`n u m "" k M G T P E`) or a decimal exponent (`e3`, `E-2`). Values are kept exactly,
//! in nano-units, because the API machinery rounds any non-zero value up to the nearest nano
//! (`ParseQuantity`: "if you want some resources, you should get some resources").
//!
//! One documented difference: the API machinery can carry values above `i64::MAX` base units in
//! its `int64Amount` fast path (and then reports `Value() == 0`); here every value is capped at
//! `i64::MAX` base units, as its slow path does. Nothing on a node comes near 9.2 exabytes.

use std::{cmp::Ordering, fmt};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Nano-units per base unit.
const NANO: i128 = 1_000_000_000;
/// `maxAllowed` in the API machinery: `math.MaxInt64` base units.
const MAX_NANOS: i128 = i64::MAX as i128 * NANO;
/// A power of ten beyond which any non-zero value is above the cap (10^29 nanos > `MAX_NANOS`).
const CAP_EXPONENT: i64 = 29;

/// How a quantity prints (`resource.Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Format {
    /// `1e3`, `12e6`.
    DecimalExponent,
    /// `5Gi`, `12Ki`.
    BinarySI,
    /// `5G`, `100m`.
    DecimalSI,
}

/// Why a string is not a quantity. Each message names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Empty, or not of the quantity syntax (`1 Gi`, `1Gb`, `1.2.3`).
    #[error(
        "quantity {value:?} must match the regular expression \
         '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format {
        /// The input as given.
        value: String,
    },
    /// Suffix characters that make no known suffix (`1Mii`, `1e`).
    #[error("quantity {value:?} has an unknown suffix {suffix:?}")]
    Suffix {
        /// The input as given.
        value: String,
        /// The unknown suffix.
        suffix: String,
    },
    /// The number has no digit (`-.e-10`).
    #[error("quantity {value:?} has no parsable numeric part")]
    Numeric {
        /// The input as given.
        value: String,
    },
    /// Longer than [`MAX_LEN`] bytes.
    #[error("quantity {value:?}… is {len} bytes long; at most {MAX_LEN} are accepted")]
    TooLong {
        /// The first 32 characters of the input.
        value: String,
        /// The input's length in bytes.
        len: usize,
    },
}

/// The longest quantity string accepted. The API machinery has no limit, but it stores every
/// quantity it cannot keep verbatim in canonical form, which is short; only a configuration could
/// carry a longer one, and exact parsing costs the square of the length.
pub const MAX_LEN: usize = 256;

/// An exact quantity. Equality and ordering compare values only, never the printed form.
#[derive(Debug, Clone)]
pub struct Quantity {
    nanos: i128,
    format: Format,
    /// The input string, kept when the API machinery keeps it (it then prints verbatim).
    cached: Option<Box<str>>,
}

impl Default for Quantity {
    /// The zero quantity (`resource.Quantity{}`), which prints as `0`.
    fn default() -> Self {
        Self {
            nanos: 0,
            format: Format::DecimalSI,
            cached: None,
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Quantity {
    /// `resource.NewQuantity(value, format)`.
    pub fn new(value: i64, format: Format) -> Self {
        Self {
            nanos: i128::from(value) * NANO,
            format,
            cached: None,
        }
    }

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

    /// `Quantity.Value()`: the value in base units, rounded away from zero.
    pub fn value(&self) -> i64 {
        let units = if self.nanos >= 0 {
            (self.nanos + NANO - 1) / NANO
        } else {
            -((-self.nanos + NANO - 1) / NANO)
        };
        // The cap keeps every value within i64.
        i64::try_from(units).unwrap_or(if units > 0 { i64::MAX } else { i64::MIN })
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// How the quantity prints: the format of its suffix.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The value is exactly zero (`Quantity.IsZero()`).
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// -1, 0 or 1 (`Quantity.Sign()`).
    pub fn signum(&self) -> i32 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// `Quantity.Add`: exact sum; the result prints canonically. A zero receiver takes the
    /// other's format, as the API machinery does.
    pub fn add(&mut self, other: &Quantity) {
        if self.nanos == 0 {
            self.format = other.format;
        }
        self.nanos = (self.nanos + other.nanos).clamp(-MAX_NANOS, MAX_NANOS);
        self.cached = None;
    }

    /// The canonical form (`CanonicalizeBytes`), ignoring any kept input string.
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".into();
        }
        match self.format {
            Format::BinarySI if self.nanos.abs() >= 1024 * NANO && self.nanos % NANO == 0 => {
                let mut v = self.nanos / NANO;
                let mut exp = 0;
                while v.abs() >= 1024 && v % 1024 == 0 {
                    v /= 1024;
                    exp += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                    .get(exp)
                    .copied()
                    .unwrap_or("Ei");
                format!("{v}{suffix}")
            }
            // Binary quantities below 1024 or with a fraction print as decimal SI.
            Format::BinarySI | Format::DecimalSI => decimal_canonical(self.nanos, false),
            Format::DecimalExponent => decimal_canonical(self.nanos, true),
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cached {
            Some(s) => f.write_str(s),
            None => f.write_str(&self.canonical()),
        }
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    /// A quantity string (`"500Mi"`) or an integer in base units (`524288000`).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes quantity string or an integer")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Quantity::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::new(v, Format::DecimalSI))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                i64::try_from(v)
                    .map(|v| Quantity::new(v, Format::DecimalSI))
                    .map_err(|_| E::custom(format!("integer {v} is above {}", i64::MAX)))
            }
        }
        deserializer.deserialize_any(Visitor)
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

/// Canonical decimal form: mantissa without trailing zeros, exponent a multiple of three.
fn decimal_canonical(nanos: i128, exponent_form: bool) -> String {
    let mut m = nanos;
    let mut e: i32 = -9;
    while m % 10 == 0 {
        m /= 10;
        e += 1;
    }
    let r = e.rem_euclid(3);
    m *= 10_i128.pow(r.unsigned_abs());
    e -= r;
    let suffix = if exponent_form {
        if e == 0 {
            String::new()
        } else {
            format!("e{e}")
        }
    } else {
        match e {
            -9 => "n".into(),
            -6 => "u".into(),
            -3 => "m".into(),
            0 => String::new(),
            3 => "k".into(),
            6 => "M".into(),
            9 => "G".into(),
            12 => "T".into(),
            15 => "P".into(),
            18 => "E".into(),
            other => format!("e{other}"),
        }
    };
    format!("{m}{suffix}")
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

#[cfg(test)]
mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
