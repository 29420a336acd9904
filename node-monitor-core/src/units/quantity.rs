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

mod parse;

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

#[cfg(test)]
mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
