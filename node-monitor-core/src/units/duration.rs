//! Go durations (`time.ParseDuration`), the syntax of every duration in a KubeletConfiguration and
//! in the kubelet's flags: `1m30s`, `300ms`, `1.5h`, `-2s`, `0`.
//! <https://github.com/golang/go/blob/master/src/time/format.go> (`ParseDuration`).

use std::time::Duration;

/// A malformed duration; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a Go duration: empty, a stray character, or a number without digits or too large.
    #[error("invalid duration {value:?}")]
    Invalid {
        /// The input as given.
        value: String,
    },
    /// A number without a unit (`30`); only `0` may go without one.
    #[error("missing unit in duration {value:?} (use ns, us, ms, s, m or h)")]
    MissingUnit {
        /// The input as given.
        value: String,
    },
    /// A unit Go does not know (`30d`).
    #[error("unknown unit {unit:?} in duration {value:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit {
        /// The input as given.
        value: String,
        /// The unknown unit.
        unit: String,
    },
    /// More than Go's `time.Duration` holds: about 292 years of signed nanoseconds.
    #[error("duration {value:?} overflows")]
    Overflow {
        /// The input as given.
        value: String,
    },
}

/// The largest magnitude a Go duration holds: `1<<63` nanoseconds (negative only).
const LIMIT: u64 = 1 << 63;

/// Parses a Go duration into signed nanoseconds.
pub fn parse_go_duration(s: &str) -> Result<i64, DurationError> {
    let overflow = || DurationError::Overflow { value: s.into() };
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(DurationError::Invalid { value: s.into() });
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let (v, r) = component(s, rest)?;
        rest = r;
        total = total
            .checked_add(v)
            .filter(|t| *t <= LIMIT)
            .ok_or_else(overflow)?;
    }
    if neg {
        // -(1<<63) is representable.
        return Ok(0_i64.wrapping_sub_unsigned(total));
    }
    i64::try_from(total).map_err(|_| overflow())
}

/// One `<number><unit>` component at the start of `rest` (a suffix of the input `s`, which
/// errors name): its nanoseconds, at most `1<<63`, and what follows it.
fn component<'a>(s: &str, rest: &'a str) -> Result<(u64, &'a str), DurationError> {
    let invalid = || DurationError::Invalid { value: s.into() };
    let overflow = || DurationError::Overflow { value: s.into() };
    let b = rest.as_bytes();
    if !(b[0] == b'.' || b[0].is_ascii_digit()) {
        return Err(invalid());
    }
    // Integer part.
    let int_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut v: u64 = 0;
    for &c in &b[..int_len] {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .filter(|v| *v <= LIMIT)
            .ok_or_else(invalid)?;
    }
    let mut rest = &rest[int_len..];
    // Fraction.
    let (frac, scale, frac_len) = match rest.strip_prefix('.') {
        Some(r) => {
            let (frac, scale, frac_len) = leading_fraction(r);
            rest = &r[frac_len..];
            (frac, scale, frac_len)
        }
        None => (0, 1.0, 0),
    };
    if int_len == 0 && frac_len == 0 {
        return Err(invalid());
    }
    // Unit.
    let unit_len = rest
        .bytes()
        .take_while(|c| !(*c == b'.' || c.is_ascii_digit()))
        .count();
    if unit_len == 0 {
        return Err(DurationError::MissingUnit { value: s.into() });
    }
    let unit = unit_nanos(s, &rest[..unit_len])?;
    rest = &rest[unit_len..];
    if v > LIMIT / unit {
        return Err(overflow());
    }
    v *= unit;
    if frac > 0 {
        // Go: v += uint64(float64(f) * (float64(unit) / scale)); the float conversion is
        // deliberate, to round exactly as Go does.
        let add = (frac as f64 * (unit as f64 / scale)) as u64;
        v = v
            .checked_add(add)
            .filter(|v| *v <= LIMIT)
            .ok_or_else(overflow)?;
    }
    Ok((v, rest))
}

/// The digits at the start of `rest` as a fraction: numerator, denominator and the number of
/// digits read. Digits beyond u64 precision are dropped, as Go's `leadingFraction` does.
fn leading_fraction(rest: &str) -> (u64, f64, usize) {
    let mut frac: u64 = 0;
    let mut scale: f64 = 1.0;
    let mut frac_len = 0;
    let mut overflowed = false;
    for &c in rest.as_bytes().iter().take_while(|c| c.is_ascii_digit()) {
        frac_len += 1;
        if overflowed {
            continue;
        }
        match frac
            .checked_mul(10)
            .and_then(|f| f.checked_add(u64::from(c - b'0')))
        {
            Some(f) if f <= LIMIT => {
                frac = f;
                scale *= 10.0;
            }
            _ => overflowed = true,
        }
    }
    (frac, scale, frac_len)
}

/// The nanoseconds in one `unit` of the input `s`.
fn unit_nanos(s: &str, unit: &str) -> Result<u64, DurationError> {
    Ok(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => {
            return Err(DurationError::UnknownUnit {
                value: s.into(),
                unit: unit.into(),
            });
        }
    })
}

/// Parses a Go duration that must not be negative.
pub fn parse_non_negative(s: &str) -> Result<Option<Duration>, DurationError> {
    let nanos = parse_go_duration(s)?;
    Ok(u64::try_from(nanos).ok().map(Duration::from_nanos))
}

/// Prints a duration the way Go's `Duration.String()` does (`1m30s`, `500ms`, `0s`).
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        let (unit, div) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("\u{b5}s", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", trim_fraction(nanos, div));
    }
    let total_secs = nanos / 1_000_000_000;
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let sub = nanos % 60_000_000_000;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{}s", trim_fraction(sub, 1_000_000_000)));
    out
}

fn trim_fraction(value: u128, div: u128) -> String {
    let whole = value / div;
    let frac = value % div;
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("-0", 0),
            ("0s", 0),
            ("5s", 5_000_000_000),
            ("1m30s", 90_000_000_000),
            ("1h", 3_600_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("300ms", 300_000_000),
            ("1us", 1_000),
            ("1\u{b5}s", 1_000),
            ("1\u{3bc}s", 1_000),
            ("10ns", 10),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("-2s", -2_000_000_000),
            ("+2s", 2_000_000_000),
            ("1h2m3s4ms5us6ns", 3_723_004_005_006),
            ("2562047h47m16.854775807s", i64::MAX),
        ];
        for (input, want) in cases {
            assert_eq!(parse_go_duration(input), Ok(*want), "{input:?}");
        }
    }

    #[test]
    fn rejects_malformed_durations_naming_the_value() {
        let cases: &[(&str, &str)] = &[
            ("", "invalid duration"),
            ("-", "invalid duration"),
            ("90", "missing unit"),
            ("1m30", "missing unit"),
            ("5 s", "unknown unit \" s\""),
            ("5d", "unknown unit \"d\""),
            ("s", "invalid duration"),
            (".s", "invalid duration"),
            ("1m-30s", "unknown unit \"m-\""),
            ("3000000h", "overflows"),
            ("2562047h47m16.854775808s", "overflows"),
        ];
        for (input, want) in cases {
            let err = parse_go_duration(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input:?}: {err}");
            assert!(
                err.contains(&format!("{input:?}")),
                "{input:?} not named: {err}"
            );
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(u64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5\u{b5}s"),
            (300_000_000, "300ms"),
            (5_000_000_000, "5s"),
            (90_000_000_000, "1m30s"),
            (300_000_000_000, "5m0s"),
            (3_600_000_000_000, "1h0m0s"),
            (1_500_000_000, "1.5s"),
        ];
        for (nanos, want) in cases {
            assert_eq!(format_go_duration(Duration::from_nanos(*nanos)), *want);
        }
    }
}

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop {
    use proptest::prelude::*;

    use super::*;

    /// Strings shaped like Go durations, valid or not.
    fn duration_like() -> impl Strategy<Value = String> {
        "[+-]?([0-9]{0,22}(\\.[0-9]{0,24})?(ns|us|\u{b5}s|\u{3bc}s|ms|s|m|h|x|\u{e9}|)){0,4}"
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        #[test]
        fn prop_parse_never_panics(s in "\\PC{0,64}") {
            let _ = parse_go_duration(&s);
            let _ = parse_non_negative(&s);
        }

        /// Whatever parses has the sign written (or is zero), and `parse_non_negative` agrees.
        #[test]
        fn prop_duration_like_strings_parse_or_fail_cleanly(s in duration_like()) {
            match parse_go_duration(&s) {
                Ok(n) => {
                    if s.starts_with('-') {
                        prop_assert!(n <= 0, "{s:?}: {n}");
                    } else {
                        prop_assert!(n >= 0, "{s:?}: {n}");
                    }
                    let non_negative = parse_non_negative(&s);
                    prop_assert_eq!(
                        non_negative,
                        Ok(u64::try_from(n).ok().map(Duration::from_nanos))
                    );
                }
                Err(e) => prop_assert!(e.to_string().contains(&format!("{s:?}")), "{e}"),
            }
        }

        /// Go's `Duration.String()` output parses back to the same value, either sign.
        #[test]
        fn prop_printed_durations_round_trip(n in prop_oneof![
            0..=i64::MAX,
            0_i64..1_000_000_000,
            (0_i64..1_000_000).prop_map(|s| s * 1_000_000_000),
            Just(i64::MAX),
        ]) {
            let d = Duration::from_nanos(n.unsigned_abs());
            let text = format_go_duration(d);
            prop_assert_eq!(parse_go_duration(&text), Ok(n), "{}", text);
            prop_assert_eq!(parse_go_duration(&format!("-{text}")), Ok(-n), "-{}", text);
        }

        /// Durations written one after the other add up (`1h` + `30m` = `1h30m`).
        #[test]
        fn prop_concatenated_durations_add(a in 0_i64..=i64::MAX / 2, b in 0_i64..=i64::MAX / 2) {
            let text = format!(
                "{}{}",
                format_go_duration(Duration::from_nanos(a.unsigned_abs())),
                format_go_duration(Duration::from_nanos(b.unsigned_abs()))
            );
            prop_assert_eq!(parse_go_duration(&text), Ok(a + b), "{}", text);
        }
    }
}
