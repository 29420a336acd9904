//! `kubectl node-monitor version`: the plugin's version against the agents'. Pure.

/// One agent's answer to `version`: its node, and its version (`None`: it could not be asked, or
/// it is older than the field).
pub type AgentVersion = (String, Option<String>);

/// `kubectl node-monitor version`: the plugin's version, each agent's, and whether they skew (an
/// agent whose release differs from the plugin's, or agents of more than one release). The
/// release is an answer's first word (`0.1.0` of `0.1.0 (commit …)`). Pure.
pub fn version_report(plugin: &str, agents: &[AgentVersion]) -> (String, bool) {
    let release = |v: &str| v.split_whitespace().next().unwrap_or("").to_owned();
    let mut lines = vec![format!("plugin {plugin}")];
    let mut releases = std::collections::BTreeSet::new();
    for (node, version) in agents {
        match version {
            Some(v) => {
                releases.insert(release(v));
                lines.push(format!("node {node}: agent {v}"));
            }
            None => lines.push(format!("node {node}: agent version unknown")),
        }
    }
    let mismatched: Vec<&String> = releases.iter().filter(|r| **r != release(plugin)).collect();
    let skew = releases.len() > 1 || !mismatched.is_empty();
    if skew {
        lines.push(format!(
            "skew: agents run {} against the plugin's {}",
            releases.iter().cloned().collect::<Vec<_>>().join(", "),
            release(plugin)
        ));
    }
    (lines.join("\n"), skew)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `version`: the plugin's and each agent's, and a skew when an agent's release differs from the
    /// plugin's or the agents run more than one.
    #[test]
    fn version_report_flags_a_skew() {
        let a = |node: &str, v: Option<&str>| (node.to_owned(), v.map(str::to_owned));
        let cases = [
            (
                vec![
                    a("n1", Some("0.1.0 (commit abc)")),
                    a("n2", Some("0.1.0 (commit def)")),
                ],
                false,
            ),
            (
                vec![
                    a("n1", Some("0.1.0 (commit abc)")),
                    a("n2", Some("0.2.0 (commit def)")),
                ],
                true,
            ),
            (vec![a("n1", Some("0.2.0 (commit abc)"))], true),
            // An agent that cannot tell is reported, not a skew.
            (
                vec![a("n1", Some("0.1.0 (commit abc)")), a("n2", None)],
                false,
            ),
            (vec![], false),
        ];
        for (agents, skew) in cases {
            let (text, got) = version_report("0.1.0", &agents);
            assert_eq!(got, skew, "{agents:?}: {text}");
            assert!(text.starts_with("plugin 0.1.0"), "{text}");
            for (node, _) in &agents {
                assert!(text.contains(&format!("node {node}: agent ")), "{text}");
            }
            assert_eq!(text.contains("skew: "), skew, "{text}");
        }
    }
}
