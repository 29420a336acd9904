use super::*;

fn cm(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn properties_parse_and_report_the_bad_line() {
    let p = parse_properties(
        "cm",
        METHOD_KEY,
        "# comment\n\n a = b \nc=d=e\n!x\nempty=\n",
    )
    .expect("valid");
    assert_eq!(p, cm(&[("a", "b"), ("c", "d=e"), ("empty", "")]));
    let cases = [("novalue\n", 1), ("a=b\n=c\n", 2), ("a b=c", 1)];
    for (text, line) in cases {
        let err = parse_properties("cm", METHOD_KEY, text).expect_err(text);
        assert!(
            matches!(&err, FenceConfigError::BadLine { line: l, .. } if *l == line),
            "{text:?}: {err}"
        );
        assert!(err.to_string().contains("ConfigMap cm"), "{err}");
    }
}

#[test]
fn plan_lists_methods_per_step_as_in_the_proposal() {
    let data = cm(&[(
        CONFIG_KEY,
        "node_name=host1\nisolation=fc-off\npower_management=eaton-off eaton-on\nrecovery=fc-on\n",
    )]);
    let plan = parse_plan("fence-config-host1", &data, "host1").expect("valid");
    assert_eq!(plan.isolation, ["fc-off"]);
    assert_eq!(plan.power_management, ["eaton-off", "eaton-on"]);
    assert_eq!(plan.methods(Step::Recovery), ["fc-on"]);
    assert!(plan.configured().power_management);
}

#[test]
fn plan_errors_name_configmap_and_field() {
    let cases = [
        (
            "fence-config-host1",
            cm(&[(CONFIG_KEY, "node_name=host2\n")]),
            "node_name",
        ),
        ("fence-config-host1", cm(&[]), CONFIG_KEY),
        (
            "fence-config-host1",
            cm(&[(CONFIG_KEY, "isolaton=fc-off\n")]),
            "isolaton",
        ),
        (
            "fence-config-host1",
            cm(&[(CONFIG_KEY, "isolation=FC_OFF\n")]),
            "FC_OFF",
        ),
    ];
    for (name, data, needle) in cases {
        let err = parse_plan(name, &data, "host1").expect_err(needle);
        let msg = err.to_string();
        assert!(msg.contains(name) && msg.contains(needle), "{msg}");
    }
    // The shared default does not have to name the node.
    let shared = cm(&[(CONFIG_KEY, "node_name=any\nisolation=a\n")]);
    assert!(parse_plan(DEFAULT_CONFIG, &shared, "host1").is_ok());
}

fn store() -> BTreeMap<String, BTreeMap<String, String>> {
    BTreeMap::from([
        (
            "fence-method-template-eaton-pdu".to_owned(),
            cm(&[(
                TEMPLATE_KEY,
                "name=eaton_pdu\nagent_name=fence_eaton_snmp\nipaddr=192.168.1.4\nsecret=eaton-credentials\ntimeout=20s\n",
            )]),
        ),
        (
            "fence-method-eaton-off-host0".to_owned(),
            cm(&[(
                METHOD_KEY,
                "node_name=host0\ntemplate=fence-method-template-eaton-pdu\nplug=1\naction=off\n",
            )]),
        ),
        (
            "fence-method-eaton-off".to_owned(),
            cm(&[(
                METHOD_KEY,
                "template=fence-method-template-eaton-pdu\nplug=$(NODE_NAME)\naction=off\ntimeout=5s\n",
            )]),
        ),
        (
            "fence-method-script".to_owned(),
            cm(&[(
                METHOD_KEY,
                "agent_name=/usr/local/bin/fence-script\nnodename=override\n",
            )]),
        ),
        (
            "fence-method-orphan".to_owned(),
            cm(&[(METHOD_KEY, "template=fence-method-template-missing\n")]),
        ),
        (
            "fence-method-noagent".to_owned(),
            cm(&[(METHOD_KEY, "plug=1\n")]),
        ),
    ])
}

#[test]
fn methods_resolve_per_node_then_shared_with_template_defaults() {
    let s = store();
    let get = |n: &str| s.get(n);
    // host0 has its own method ConfigMap.
    let m = resolve_method("eaton-off", "host0", Duration::from_secs(60), get).expect("host0");
    assert_eq!(m.agent, "fence_eaton_snmp");
    assert_eq!(m.secret.as_deref(), Some("eaton-credentials"));
    assert_eq!(m.timeout, Duration::from_secs(20));
    assert_eq!(
        m.params,
        cm(&[
            ("action", "off"),
            ("ipaddr", "192.168.1.4"),
            ("nodename", "host0"),
            ("plug", "1")
        ])
    );
    assert_eq!(
        m.origin,
        "fence-method-eaton-off-host0 + fence-method-template-eaton-pdu"
    );
    // host1 falls back to the shared method, with the node name substituted.
    let m = resolve_method("eaton-off", "host1", Duration::from_secs(60), get).expect("host1");
    assert_eq!(m.params.get("plug").map(String::as_str), Some("host1"));
    assert_eq!(m.timeout, Duration::from_secs(5));
    // No template; an explicit nodename wins.
    let m = resolve_method("script", "host1", Duration::from_secs(60), get).expect("script");
    assert_eq!(m.timeout, Duration::from_secs(60));
    assert_eq!(m.params, cm(&[("nodename", "override")]));
    assert_eq!(stdin_text(&m.params), "nodename=override\n");
}

#[test]
fn method_errors_say_what_is_missing() {
    let s = store();
    let get = |n: &str| s.get(n);
    let cases = [
        ("absent", "fence-method-absent-host1"),
        ("orphan", "fence-method-template-missing"),
        ("noagent", "agent_name"),
    ];
    for (method, needle) in cases {
        let err = resolve_method(method, "host1", Duration::from_secs(1), get).expect_err(method);
        assert!(err.to_string().contains(needle), "{method}: {err}");
    }
}

#[test]
fn secrets_add_parameters_but_never_line_breaks() {
    let s = store();
    let mut m =
        resolve_method("eaton-off", "host0", Duration::from_secs(60), |n| s.get(n)).expect("host0");
    let ok = BTreeMap::from([("password".to_owned(), b"s3cret".to_vec())]);
    add_secret(&mut m, "eaton-credentials", &ok).expect("one line");
    assert_eq!(m.params.get("password").map(String::as_str), Some("s3cret"));
    let bad = BTreeMap::from([("password".to_owned(), b"a\nb".to_vec())]);
    let err = add_secret(&mut m, "eaton-credentials", &bad).expect_err("two lines");
    assert!(
        !err.to_string().contains("a\nb"),
        "secrets are never echoed: {err}"
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: the colliding names and every lookup among them, read together"
)]
fn colliding_method_and_node_names_never_pick_another_nodes_method() {
    // Nodes host0 and off-host0, methods eaton and eaton-off: `fence-method-eaton-off-host0`
    // could be method eaton-off of host0, method eaton of off-host0, or a shared method.
    let shared = [
        (
            "fence-method-eaton",
            "agent_name=fence_eaton_snmp\nplug=$(NODE_NAME)\naction=off\n",
        ),
        (
            "fence-method-eaton-off",
            "agent_name=fence_eaton_snmp\nplug=$(NODE_NAME)\naction=off\n",
        ),
    ];
    let with = |colliding: &str| -> BTreeMap<String, BTreeMap<String, String>> {
        let mut m: BTreeMap<String, BTreeMap<String, String>> = shared
            .iter()
            .map(|(n, t)| ((*n).to_owned(), cm(&[(METHOD_KEY, t)])))
            .collect();
        m.insert(
            "fence-method-eaton-off-host0".to_owned(),
            cm(&[(
                METHOD_KEY,
                &format!("agent_name=fence_eaton_snmp\n{colliding}"),
            )]),
        );
        m
    };
    let plug = |s: &BTreeMap<String, BTreeMap<String, String>>, method: &str, node: &str| {
        resolve_method(method, node, Duration::from_secs(60), |n| s.get(n))
            .map(|m| (m.params.get("plug").cloned().unwrap_or_default(), m.origin))
            .map_err(|e| e.to_string())
    };
    let ok = |p: &str, origin: &str| Ok((p.to_owned(), origin.to_owned()));
    let per_node = "fence-method-eaton-off-host0";
    // (the colliding ConfigMap, method, node, the plug and origin it must resolve to)
    type Row<'a> = (&'a str, &'a str, &'a str, Result<(String, String), String>);
    let cases: [Row<'_>; 8] = [
        // It is host0's eaton-off: off-host0's eaton is the shared one (with its own plug).
        (
            "node_name=host0\nplug=1\n",
            "eaton-off",
            "host0",
            ok("1", per_node),
        ),
        (
            "node_name=host0\nplug=1\n",
            "eaton",
            "off-host0",
            ok("off-host0", "fence-method-eaton"),
        ),
        // It is off-host0's eaton: host0's eaton-off is the shared one.
        (
            "node_name=off-host0\nplug=7\n",
            "eaton",
            "off-host0",
            ok("7", per_node),
        ),
        (
            "node_name=off-host0\nplug=7\n",
            "eaton-off",
            "host0",
            ok("host0", "fence-method-eaton-off"),
        ),
        // It is the shared method eaton-off-host0: neither node's per-node method.
        (
            "method_name=eaton-off-host0\nplug=9\n",
            "eaton-off",
            "host0",
            ok("host0", "fence-method-eaton-off"),
        ),
        // It names the node but another method: refused.
        (
            "node_name=host0\nmethod_name=eaton\nplug=1\n",
            "eaton-off",
            "host0",
            Err("method_name".to_owned()),
        ),
        // It says nothing: which node's it is cannot be told, so it is refused for both.
        (
            "plug=1\n",
            "eaton-off",
            "host0",
            Err("node_name=host0".to_owned()),
        ),
        (
            "plug=1\n",
            "eaton",
            "off-host0",
            Err("node_name=off-host0".to_owned()),
        ),
    ];
    for (colliding, method, node, want) in cases {
        let got = plug(&with(colliding), method, node);
        match (&got, &want) {
            (Err(e), Err(needle)) => {
                assert!(
                    e.contains(needle) && e.contains(per_node),
                    "{colliding:?}: {e}"
                );
            }
            _ => assert_eq!(got, want, "{colliding:?} {method} {node}"),
        }
    }
    // The identity keys never reach the agent.
    let s = with("node_name=host0\nmethod_name=eaton-off\nplug=1\n");
    let m =
        resolve_method("eaton-off", "host0", Duration::from_secs(60), |n| s.get(n)).expect("host0");
    assert!(!m.params.contains_key("node_name") && !m.params.contains_key("method_name"));
    // A shared-looking name that is another split's per-node method is not shared.
    let mut s = with("node_name=host0\nplug=1\n");
    s.insert(
        "fence-method-eaton-off".to_owned(),
        cm(&[(METHOD_KEY, "node_name=off\nagent_name=x\nplug=3\n")]),
    );
    let err = plug(&s, "eaton-off", "node-9").expect_err("no method for node-9");
    assert!(err.contains("none of the ConfigMaps"), "{err}");
    assert_eq!(plug(&s, "eaton", "off"), ok("3", "fence-method-eaton-off"));
}
