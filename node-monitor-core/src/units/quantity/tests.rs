use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

/// Values in base units, rounded up, as `Quantity.Value()` reports them. Vectors from
/// apimachinery's quantity_test.go (TestQuantityParse) where they apply.
#[test]
fn parse_values() {
    let cases: &[(&str, i64)] = &[
        ("0", 0),
        ("0n", 0),
        ("0Mi", 0),
        ("1", 1),
        ("100Mi", 100 * 1024 * 1024),
        ("1Ki", 1024),
        ("8Mi", 8 * 1024 * 1024),
        ("7Gi", 7 * (1 << 30)),
        ("6Ti", 6 * (1 << 40)),
        ("5Pi", 5 * (1 << 50)),
        ("4Ei", 4 * (1 << 60)),
        ("1.5Gi", 1_610_612_736),
        ("0.5Ki", 512),
        ("1k", 1000),
        ("5M", 5_000_000),
        ("3G", 3_000_000_000),
        ("2T", 2_000_000_000_000),
        ("1P", 1_000_000_000_000_000),
        ("1E", 1_000_000_000_000_000_000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e-3", 1),
        ("12e6", 12_000_000),
        ("1.5", 2),
        ("100m", 1),
        ("1500m", 2),
        ("1n", 1),
        ("1u", 1),
        ("+5", 5),
        ("-5", -5),
        ("-1.5", -2),
        ("-100m", -1),
        ("01Gi", 1 << 30),
        ("1.G", 1_000_000_000),
        (".5", 1),
        ("0.1Ki", 103),
        ("10Ei", i64::MAX),
        ("1e30", i64::MAX),
        ("1e-30", 1),
    ];
    for (input, want) in cases {
        assert_eq!(q(input).value(), *want, "value of {input:?}");
    }
}

/// Exponents at the edge of 32 bits neither panic nor wrap into a small value: large ones cap,
/// tiny ones round up to a nano, zero stays zero (and returns at once).
#[test]
fn extreme_exponents_saturate() {
    let cases: &[(&str, i128)] = &[
        ("1e2147483647", MAX_NANOS),
        ("-1e2147483647", -MAX_NANOS),
        ("9e2147483646", MAX_NANOS),
        ("1.5e2147483647", MAX_NANOS),
        ("1e-2147483648", 1),
        ("1.5e-2147483648", 1),
        ("0e2147483647", 0),
        ("0.0e2147483647", 0),
        ("1e-2147483647", 1),
    ];
    for (input, want) in cases {
        assert_eq!(q(input).nanos(), *want, "nanos of {input:?}");
    }
}

/// A quantity longer than `MAX_LEN` is refused with its length named; one at the limit
/// parses exactly.
#[test]
fn long_mantissas_are_bounded() {
    let at_limit = format!("0.{}1", "0".repeat(MAX_LEN - 3));
    assert_eq!(at_limit.len(), MAX_LEN);
    assert_eq!(q(&at_limit).nanos(), 1);
    let long = format!("1.{}", "5".repeat(100_000));
    match Quantity::parse(&long) {
        Err(QuantityError::TooLong { len, .. }) => assert_eq!(len, 100_002),
        other => panic!("a 100 kB quantity must be refused, got {other:?}"),
    }
    let message = Quantity::parse(&long).unwrap_err().to_string();
    assert!(message.contains("100002 bytes long"), "{message}");
}

#[test]
fn nano_rounding_and_exactness() {
    assert_eq!(q("100m").nanos(), 100_000_000);
    assert_eq!(q("1n").nanos(), 1);
    // Below one nano rounds up to one nano, as ParseQuantity does.
    assert_eq!(q("1e-12").nanos(), 1);
    assert_eq!(q("1.0000000001").nanos(), 1_000_000_001);
    assert_eq!(q("-1.0000000001").nanos(), -1_000_000_001);
    assert_eq!(q("0.1Ki").nanos(), 102_400_000_000);
    assert!(q("1Gi") > q("1G"));
    assert_eq!(q("1024Mi"), q("1Gi"));
    assert_eq!(q("1000m"), q("1"));
}

#[test]
fn rejects_garbage_naming_the_value() {
    let cases: &[(&str, &str)] = &[
        ("", "must match"),
        ("abc", "must match"),
        ("1Gb", "must match"),
        ("1Mii", "unknown suffix \"Mii\""),
        ("1kK", "unknown suffix \"kK\""),
        ("1Zi", "must match"),
        ("1 Gi", "must match"),
        ("1.2.3", "must match"),
        ("1e", "unknown suffix \"e\""),
        ("1Ki2", "unknown suffix \"Ki2\""),
        ("1e1.5", "must match"),
        ("10%", "must match"),
        ("-.e-10", "no parsable numeric part"),
    ];
    for (input, want) in cases {
        let err = Quantity::parse(input).expect_err(input).to_string();
        assert!(err.contains(want), "{input:?}: {err}");
        assert!(
            err.contains(&format!("{input:?}")),
            "{input:?} not named in: {err}"
        );
    }
}

/// Printed forms: `String()` keeps canonical inputs, canonicalises the rest.
#[test]
fn prints_like_the_api_machinery() {
    let cases: &[(&str, &str)] = &[
        ("0", "0"),
        ("0Mi", "0"),
        ("100Mi", "100Mi"),
        ("1024Mi", "1Gi"),
        ("2048Ki", "2Mi"),
        ("1025Ki", "1025Ki"),
        ("1.5Gi", "1536Mi"),
        ("0.5Ki", "512"),
        ("1.5", "1500m"),
        ("1000m", "1"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("10000", "10k"),
        ("1e3", "1e3"),
        ("1e4", "10e3"),
        ("100M", "100M"),
        ("+1Ki", "+1Ki"),
        ("-1Gi", "-1Gi"),
        ("1.G", "1.G"),
        ("0.1", "100m"),
    ];
    for (input, want) in cases {
        assert_eq!(q(input).to_string(), *want, "printed form of {input:?}");
    }
}

#[test]
fn new_quantities_print_canonically() {
    assert_eq!(
        Quantity::new(12345 * 1024, Format::BinarySI).to_string(),
        "12345Ki"
    );
    assert_eq!(
        Quantity::new(1_073_741_840, Format::BinarySI).to_string(),
        "1073741840"
    );
    assert_eq!(Quantity::new(1023, Format::BinarySI).to_string(), "1023");
    assert_eq!(Quantity::new(2 << 30, Format::BinarySI).to_string(), "2Gi");
    assert_eq!(Quantity::new(12_000, Format::DecimalSI).to_string(), "12k");
    assert_eq!(Quantity::new(0, Format::BinarySI).to_string(), "0");
    assert_eq!(Quantity::new(-2048, Format::BinarySI).to_string(), "-2Ki");
}

#[test]
fn add_takes_the_format_of_the_first_non_zero_term() {
    let mut sum = Quantity::default();
    sum.add(&q("512Mi"));
    sum.add(&q("512Mi"));
    assert_eq!(sum.to_string(), "1Gi");
    assert_eq!(sum.value(), 1 << 30);
}

#[test]
fn deserializes_strings_and_integers() {
    let v: Vec<Quantity> = serde_json::from_str(r#"["500Mi", 1024, "1e3"]"#).expect("json");
    assert_eq!(v[0].value(), 500 << 20);
    assert_eq!(v[1].value(), 1024);
    assert_eq!(v[2].value(), 1000);
    let err = serde_json::from_str::<Quantity>(r#""12 apples""#).expect_err("garbage");
    assert!(err.to_string().contains("12 apples"), "{err}");
}
