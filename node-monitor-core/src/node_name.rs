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
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !value.split('.').all(label_ok) {
        return Err(format!(
            "node name {value:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', \
             each part starting and ending with a letter or digit)"
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

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
