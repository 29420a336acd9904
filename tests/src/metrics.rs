//! The Prometheus text exposition (the classic 0.0.4 format and the OpenMetrics text the agent
//! serves), read back from the agent's and remediate's `/metrics`: one parser for every tier.
use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail};

/// One sample line: `name{label="value",…} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// Does the sample carry every `labels` pair?
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.get(*k).is_some_and(|have| have == v))
    }
}

/// Every sample of an exposition, in order (comments and blank lines skipped). A line that is not
/// a sample is an error naming the line. `text` may be a whole HTTP response (the guests' dumps
/// over bash's /dev/tcp keep the header): its header is skipped.
pub fn parse(text: &str) -> Result<Vec<Sample>> {
    let body = if text.starts_with("HTTP/") {
        let (head, body) = text
            .split_once("\r\n\r\n")
            .or_else(|| text.split_once("\n\n"))
            .context("an HTTP response without the blank line that ends its header")?;
        let status = head.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) != Some("200") {
            bail!("the scrape answered {status:?}");
        }
        body
    } else {
        text
    };
    body.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| parse_line(l).with_context(|| format!("metrics line {}: {l:?}", i + 1)))
        .collect()
}

fn parse_line(line: &str) -> Result<Sample> {
    let line = line.trim();
    let name_end = line.find(['{', ' ', '\t']).context("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        bail!("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().context("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .with_context(|| format!("value {v:?} is not a number"))?,
    };
    // An optional timestamp (milliseconds), and nothing after it.
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .with_context(|| format!("timestamp {ts:?} is not an integer"))?;
    }
    if let Some(extra) = fields.next() {
        bail!("unexpected {extra:?} after the value");
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Reads `label="value",…}` into `labels`; returns what follows the closing brace.
fn parse_labels<'a>(mut s: &'a str, labels: &mut BTreeMap<String, String>) -> Result<&'a str> {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok(rest);
        }
        let (key, rest) = s.split_once('=').context("a label without '='")?;
        let key = key.trim();
        let mut chars = rest
            .strip_prefix('"')
            .context("a label value without '\"'")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next().context("an unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().context("an unterminated escape")?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.to_owned(), value);
        s = rest[1 + end + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// The sum of the samples of `family` (the exact sample name) that carry every `labels` pair; 0
/// when there are none. Malformed text is an error.
pub fn try_sum(text: &str, family: &str, labels: &[(&str, &str)]) -> Result<f64> {
    let sum: f64 = parse(text)?
        .iter()
        .filter(|s| s.name == family && s.has_labels(labels))
        .map(|s| s.value)
        .sum();
    // An empty sum is -0.0; a printed figure reads better as 0.
    Ok(sum + 0.0)
}

/// [`try_sum`] for a test: malformed text fails the test, naming the line.
pub fn sum(text: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    try_sum(text, family, labels).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Is there a labelled series of `family` that carries every `labels` pair?
pub fn has_series(text: &str, family: &str, labels: &[(&str, &str)]) -> bool {
    parse(text)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .any(|s| s.name == family && !s.labels.is_empty() && s.has_labels(labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP node_monitor_evictions_total Evictions.
# TYPE node_monitor_evictions_total counter
node_monitor_evictions_total{outcome="evicted",signal="memory.available"} 2
node_monitor_evictions_total{outcome="refused",signal="memory.available"} 1
node_monitor_evictions_total{outcome="evicted",signal="nodefs.available"} 3 1700000000000
node_monitor_wakeups_total 7
node_monitor_reason{message="a \"quoted\", \\ back\nslash"} 1
node_monitor_latency_seconds_bucket{le="+Inf"} +Inf
"#;

    #[test]
    fn parses_names_labels_escapes_values_and_timestamps() {
        let samples = parse(TEXT).expect("parse");
        assert_eq!(samples.len(), 6);
        assert_eq!(samples[0].name, "node_monitor_evictions_total");
        assert_eq!(
            samples[0].labels,
            BTreeMap::from([
                ("outcome".to_owned(), "evicted".to_owned()),
                ("signal".to_owned(), "memory.available".to_owned()),
            ])
        );
        assert_eq!(samples[2].value, 3.0);
        assert_eq!(samples[3].labels, BTreeMap::new());
        assert_eq!(samples[3].value, 7.0);
        assert_eq!(samples[4].labels["message"], "a \"quoted\", \\ back\nslash");
        assert_eq!(samples[5].labels["le"], "+Inf");
        assert_eq!(samples[5].value, f64::INFINITY);
    }

    #[test]
    fn sums_the_samples_that_carry_every_label() {
        let family = "node_monitor_evictions_total";
        assert_eq!(sum(TEXT, family, &[("outcome", "evicted")]), 5.0);
        assert_eq!(sum(TEXT, family, &[]), 6.0);
        assert_eq!(
            sum(
                TEXT,
                family,
                &[("outcome", "evicted"), ("signal", "memory.available")]
            ),
            2.0
        );
        // A label value is matched whole, not as a substring of another label.
        assert_eq!(sum(TEXT, family, &[("come", "evicted")]), 0.0);
        let none = sum(TEXT, "node_monitor_absent", &[]);
        assert!(none == 0.0 && none.is_sign_positive(), "{none}");
        assert_eq!(sum(TEXT, "node_monitor_wakeups_total", &[]), 7.0);
        assert!(has_series(TEXT, family, &[("signal", "nodefs.available")]));
        assert!(!has_series(TEXT, "node_monitor_wakeups_total", &[]));
    }

    #[test]
    fn a_whole_http_response_is_read_past_its_header() {
        let response = format!(
            "HTTP/1.0 200 OK\r\ncontent-type: application/openmetrics-text\r\n\r\n{TEXT}# EOF\n"
        );
        assert_eq!(
            parse(&response).expect("parse"),
            parse(TEXT).expect("parse")
        );
        assert!(parse("HTTP/1.0 503 Service Unavailable\r\n\r\n").is_err());
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for bad in [
            "node_monitor_x{a=\"1\" 2",
            "node_monitor_x 2 3 4",
            "node_monitor_x abc",
            "node_monitor_x",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(format!("{e:#}").contains("metrics line 1"), "{e:#}");
        }
    }
}
