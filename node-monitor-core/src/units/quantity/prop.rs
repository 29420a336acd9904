use proptest::{prelude::*, sample::select};

use super::*;

const DECIMAL_SUFFIXES: [(&str, u32); 10] = [
    ("n", 0),
    ("u", 3),
    ("m", 6),
    ("", 9),
    ("k", 12),
    ("M", 15),
    ("G", 18),
    ("T", 21),
    ("P", 24),
    ("E", 27),
];
const BINARY_SUFFIXES: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

fn any_format() -> impl Strategy<Value = Format> {
    prop_oneof![
        Just(Format::DecimalExponent),
        Just(Format::BinarySI),
        Just(Format::DecimalSI),
    ]
}

/// Every representable value, with the shapes real quantities have (whole units, powers of
/// 1024, the cap) drawn often.
fn any_nanos() -> impl Strategy<Value = i128> {
    prop_oneof![
        -MAX_NANOS..=MAX_NANOS,
        (-1_000_000_i128..1_000_000).prop_map(|v| v * NANO),
        (any::<i32>(), 0_u32..7).prop_map(
            |(v, e)| (i128::from(v) * 1024_i128.pow(e) * NANO).clamp(-MAX_NANOS, MAX_NANOS)
        ),
        (any::<i16>(), 0_u32..28)
            .prop_map(|(v, e)| (i128::from(v) * 10_i128.pow(e)).clamp(-MAX_NANOS, MAX_NANOS)),
        Just(MAX_NANOS),
        Just(-MAX_NANOS),
        Just(1),
        Just(-1),
    ]
}

fn any_quantity() -> impl Strategy<Value = Quantity> {
    (any_nanos(), any_format()).prop_map(|(nanos, format)| Quantity {
        nanos,
        format,
        cached: None,
    })
}

/// Strings shaped like quantities, valid or not.
fn quantity_like() -> impl Strategy<Value = String> {
    "[+-]?[0-9]{0,30}(\\.[0-9]{0,12})?([eEinumkKMGTP]{0,2}[-+]?[0-9]{0,12})?"
}

proptest! {
    #![proptest_config(crate::proptest_config())]

    #[test]
    fn prop_parse_never_panics(s in "\\PC{0,300}") {
        let _ = Quantity::parse(&s);
    }

    #[test]
    fn prop_parse_never_panics_on_long_numbers(s in "[+-]?[0-9.]{200,260}[eEinumkKMGTP]{0,2}[-+]?[0-9]{0,20}") {
        if let Ok(q) = Quantity::parse(&s) {
            prop_assert!(q.nanos().abs() <= MAX_NANOS);
        }
    }

    /// Whatever parses prints (canonically and as shown) to a string that parses back to the
    /// same value, within the cap.
    #[test]
    fn prop_parsed_quantities_reparse(s in quantity_like()) {
        if let Ok(q) = Quantity::parse(&s) {
            prop_assert!(q.nanos().abs() <= MAX_NANOS, "{s:?}: {}", q.nanos());
            let canonical = q.canonical();
            let again = Quantity::parse(&canonical);
            prop_assert_eq!(again.map(|p| p.nanos()), Ok(q.nanos()), "{:?} -> {:?}", s, canonical);
            let shown = q.to_string();
            let again = Quantity::parse(&shown);
            prop_assert_eq!(again.map(|p| p.nanos()), Ok(q.nanos()), "{:?} -> {:?}", s, shown);
        }
    }

    /// parse(canonical(q)) == q, and the canonical form of a parsed quantity is a fixed point.
    #[test]
    fn prop_canonical_round_trips(q in any_quantity()) {
        let canonical = q.canonical();
        let p = Quantity::parse(&canonical);
        prop_assert!(p.is_ok(), "{:?}: {:?}", canonical, p);
        let p = p.unwrap_or_default();
        prop_assert_eq!(p.nanos(), q.nanos(), "{}", canonical);
        // A binary quantity that is no multiple of 1024 prints without a suffix, as the API
        // machinery prints it, and parses back as decimal: stable from then on.
        let twice = Quantity::parse(&p.canonical()).unwrap_or_default().canonical();
        prop_assert_eq!(twice, p.canonical());
    }

    /// An integer with any suffix is exactly its value, capped.
    #[test]
    fn prop_integers_with_suffixes_are_exact(
        v in any::<i32>(),
        decimal in select(&DECIMAL_SUFFIXES[..]),
        binary in select(&BINARY_SUFFIXES[..]),
        exponent in -9_i32..=18,
    ) {
        let cap = |n: i128| n.clamp(-MAX_NANOS, MAX_NANOS);
        let v128 = i128::from(v);
        let (suffix, pow10) = decimal;
        prop_assert_eq!(Quantity::parse(&format!("{v}{suffix}")).map(|q| q.nanos()),
                        Ok(cap(v128 * 10_i128.pow(pow10))));
        let (suffix, pow2) = binary;
        prop_assert_eq!(Quantity::parse(&format!("{v}{suffix}")).map(|q| q.nanos()),
                        Ok(cap(v128 * (1_i128 << pow2) * NANO)));
        let pow = u32::try_from(exponent + 9).unwrap_or(0);
        prop_assert_eq!(Quantity::parse(&format!("{v}e{exponent}")).map(|q| q.nanos()),
                        Ok(cap(v128 * 10_i128.pow(pow))));
    }

    /// Ordering, `value()` and `add` follow the exact values.
    #[test]
    fn prop_order_and_sums_follow_the_values(a in any_quantity(), b in any_quantity()) {
        let pa = Quantity::parse(&a.canonical()).unwrap_or_default();
        let pb = Quantity::parse(&b.canonical()).unwrap_or_default();
        prop_assert_eq!(pa.cmp(&pb), a.nanos().cmp(&b.nanos()));
        if a.nanos() <= b.nanos() {
            prop_assert!(a.value() <= b.value());
        }
        // value() rounds away from zero to whole units.
        let units = i128::from(a.value()) * NANO;
        prop_assert!(units.abs() >= a.nanos().abs() && (units - a.nanos()).abs() < NANO);
        prop_assert_eq!(a.signum(), a.nanos().signum() as i32);
        let mut sum = a.clone();
        sum.add(&b);
        prop_assert_eq!(sum.nanos(), (a.nanos() + b.nanos()).clamp(-MAX_NANOS, MAX_NANOS));
    }
}
