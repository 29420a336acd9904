//! The kubelet's map-valued settings (`signal<quantity`, `signal=duration`), from a document or a
//! flag, parsed into thresholds, grace periods and minimum reclaims.
use super::*;

/// A kubelet map flag (`LangleSeparatedMapStringString` for `<`, `MapStringString` for `=`):
/// comma-separated `key<value` / `key=value` pairs, spaces trimmed, later keys win.
pub(super) fn flag_map(
    values: &[String],
    flag: &'static str,
    sep: char,
) -> Result<StatementMap, ConfigError> {
    let expected = if sep == '<' {
        "signal<quantity (the only operator is \"<\")"
    } else {
        "signal=value"
    };
    let mut entries = BTreeMap::new();
    for value in values {
        for item in value.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once(sep) else {
                if sep == '<'
                    && let Some(op) = [">=", "<=", ">", "=", "!="]
                        .into_iter()
                        .find(|op| item.contains(op))
                {
                    return Err(ConfigError::UnsupportedOperator {
                        field: flag.into(),
                        statement: item.into(),
                        operator: op.into(),
                    });
                }
                return Err(ConfigError::MalformedFlag {
                    flag,
                    entry: item.into(),
                    expected,
                });
            };
            let (k, v) = (k.trim(), v.trim());
            if sep == '<' && v.starts_with('=') {
                return Err(ConfigError::UnsupportedOperator {
                    field: flag.into(),
                    statement: item.into(),
                    operator: "<=".into(),
                });
            }
            entries.insert(
                k.to_owned(),
                Entry {
                    value: v.to_owned(),
                    field: format!("{flag} {k}"),
                    explicit: true,
                },
            );
        }
    }
    Ok(StatementMap { entries })
}

pub(super) fn pick(
    flag_values: &[String],
    flag: &'static str,
    sep: char,
    file: &Option<StatementMap>,
) -> Result<StatementMap, ConfigError> {
    if flag_values.is_empty() {
        Ok(file.clone().unwrap_or_default())
    } else {
        flag_map(flag_values, flag, sep)
    }
}

pub(super) fn parse_signal(entry: &Entry, key: &str) -> Result<Signal, ConfigError> {
    key.parse::<Signal>()
        .map_err(|_| ConfigError::UnknownSignal {
            field: entry.field.clone(),
            signal: key.into(),
        })
}

/// `parsePercentage`: trailing `%` removed, parsed as a float32, divided by 100 in float32.
pub(super) fn parse_percentage(entry: &Entry) -> Result<(f32, f64), ConfigError> {
    let bad = || ConfigError::Percentage {
        field: entry.field.clone(),
        value: entry.value.clone(),
    };
    let number = entry.value.trim_end_matches('%');
    let single: f32 = number.parse().map_err(|_| bad())?;
    let double: f64 = number.parse().map_err(|_| bad())?;
    if !single.is_finite() {
        return Err(bad());
    }
    Ok((single / 100.0, double))
}

/// `parseThresholdStatement` for each entry.
pub(super) fn parse_statements(
    map: &StatementMap,
    source: ThresholdSource,
    warnings: &mut Vec<String>,
) -> Result<Vec<Threshold>, ConfigError> {
    let mut out = Vec::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        let value = entry.value.as_str();
        let threshold_value = if value.ends_with('%') {
            // The kubelet ignores exactly these two spellings.
            if value == "0%" || value == "100%" {
                if entry.explicit {
                    warnings.push(format!(
                        "{} {value:?} disables the threshold (the kubelet ignores 0% and 100%)",
                        entry.field
                    ));
                }
                continue;
            }
            let (fraction, percent) = parse_percentage(entry)?;
            if !(0.0..=1.0).contains(&fraction) {
                return Err(ConfigError::PercentageRange {
                    field: entry.field.clone(),
                    value: value.into(),
                });
            }
            ThresholdValue::Percentage { fraction, percent }
        } else {
            let q = Quantity::parse(value).map_err(|e| ConfigError::Quantity {
                field: entry.field.clone(),
                value: value.into(),
                source: e,
            })?;
            if q.signum() <= 0 {
                return Err(ConfigError::NotPositive {
                    field: entry.field.clone(),
                    value: value.into(),
                });
            }
            ThresholdValue::Quantity(q)
        };
        out.push(Threshold {
            signal,
            operator: Operator::LessThan,
            value: threshold_value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
            source,
            derived_from: None,
        });
    }
    out.sort_by_key(|t| t.signal);
    Ok(out)
}

pub(super) fn parse_grace_periods(
    map: &StatementMap,
) -> Result<BTreeMap<Signal, Duration>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        out.insert(signal, non_negative_duration(&entry.field, &entry.value)?);
    }
    Ok(out)
}

pub(super) fn parse_min_reclaims(
    map: &StatementMap,
) -> Result<BTreeMap<Signal, ThresholdValue>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        let value = if entry.value.ends_with('%') {
            let (fraction, percent) = parse_percentage(entry)?;
            if fraction <= 0.0 {
                return Err(ConfigError::NonPositiveMinReclaimPercentage {
                    field: entry.field.clone(),
                    value: entry.value.clone(),
                });
            }
            ThresholdValue::Percentage { fraction, percent }
        } else {
            let q = Quantity::parse(&entry.value).map_err(|e| ConfigError::Quantity {
                field: entry.field.clone(),
                value: entry.value.clone(),
                source: e,
            })?;
            if q.signum() < 0 {
                return Err(ConfigError::NegativeMinReclaim {
                    field: entry.field.clone(),
                    value: entry.value.clone(),
                });
            }
            ThresholdValue::Quantity(q)
        };
        out.insert(signal, value);
    }
    Ok(out)
}

pub(super) fn non_negative_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    let nanos = parse_go_duration(value).map_err(|e| ConfigError::Duration {
        field: field.into(),
        value: value.into(),
        source: e,
    })?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| ConfigError::NegativeDuration {
            field: field.into(),
            value: value.into(),
        })
}
