//! The node name the agent acts for. It selects the pods the agent may evict (the field selector
//! `spec.nodeName=<name>`), so an empty one would select every pod not yet scheduled anywhere in
//! the cluster; a Node's name is a DNS subdomain (RFC 1123), as the API server requires.

/// Checks `value` as a Node name, for the `--node-name` flag and `NODE_NAME`; the error names the
/// value and what is wrong with it.
pub fn parse_node_name(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err(
            "the node name is empty: the DaemonSet passes it from spec.nodeName (NODE_NAME); \
             an empty one would select every unscheduled pod of the cluster"
                .into(),
        );
    }
    if value.len() > 253 {
        return Err(format!(
            "node name {value:?} is {} characters long; a Node's name has at most 253",
            value.len()
        ));
    }
    if !value.split('.').all(dns_label) {
        return Err(format!(
            "node name {value:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', \
             each part starting and ending with a letter or digit)"
        ));
    }
    Ok(value.to_owned())
}

/// Checks `value` as a namespace name (an RFC 1123 DNS label, as the API server requires), for
/// the flags that name the agents' namespace; the error names the value.
pub fn parse_namespace(value: &str) -> Result<String, String> {
    if dns_label(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "namespace {value:?} is not a DNS label (1 to 63 lowercase letters, digits and '-', \
             starting and ending with a letter or digit)"
        ))
    }
}

/// An RFC 1123 label: 1 to 63 lowercase letters, digits and '-', starting and ending with a
/// letter or digit.
fn dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_dns_labels() {
        for good in ["node-monitor", "a", "kube-system", &"a".repeat(63)] {
            assert_eq!(parse_namespace(good).as_deref(), Ok(good));
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            let e = parse_namespace(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn node_names() {
        let long = "a".repeat(254);
        let cases: &[(&str, Result<(), &str>)] = &[
            ("node-a", Ok(())),
            ("ip-10-0-1-17.eu-west-1.compute.internal", Ok(())),
            ("a", Ok(())),
            ("", Err("is empty")),
            ("Node-A", Err("not a DNS subdomain")),
            ("-a", Err("not a DNS subdomain")),
            ("a..b", Err("not a DNS subdomain")),
            ("a b", Err("not a DNS subdomain")),
            ("a,spec.nodeName!=x", Err("not a DNS subdomain")),
            (&long, Err("at most 253")),
        ];
        for (input, want) in cases {
            match (parse_node_name(input), want) {
                (Ok(v), Ok(())) => assert_eq!(v, *input),
                (Err(e), Err(w)) => assert!(e.contains(w), "{input:?}: {e}"),
                (got, _) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
