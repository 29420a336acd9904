use super::*;

fn program(name: &str, state: &str, reason: Option<&str>) -> Program {
    Program {
        name: name.to_owned(),
        state: state.to_owned(),
        reason: reason.map(str::to_owned),
    }
}

/// A cgroup v2 node where everything works: the tracepoint attached, its fallback standing by.
fn v2_node() -> Facts {
    Facts {
        ebpf: Ebpf::Loaded {
            reboot: vec![
                program("reboot_enter", "attached", None),
                program(
                    "reboot_raw",
                    "disabled",
                    Some("standby: reboot_enter is attached"),
                ),
            ],
            memory_push: vec![
                program("mem_push_alloc", "loaded", None),
                program("mem_push_free", "loaded", None),
            ],
            kernel_btf: Ok(()),
        },
        memcg_thresholds: Source::NotApplicable("cgroup v2".to_owned()),
        psi: Source::Active,
        kubelet_config: KubeletConfig::Read("process 812: /var/lib/kubelet/config.yaml".to_owned()),
    }
}

fn label(a: &Assessment, g: Guarantee) -> &'static str {
    a[&g].label()
}

fn why(a: &Assessment, g: Guarantee) -> String {
    match &a[&g] {
        Holds::No(w) | Holds::NotApplicable(w) => w.clone(),
        Holds::Yes => String::new(),
    }
}

/// A scenario: its name, the change to the v2 node's facts, and the verdicts that differ from
/// the v2 node's (guarantee, label, a word the reason holds).
type Case = (
    &'static str,
    fn(&mut Facts),
    Vec<(Guarantee, &'static str, &'static str)>,
);

#[test]
#[expect(clippy::too_many_lines, reason = "a table test: one row per scenario")]
fn every_guarantee_is_judged_by_scenario() {
    use Guarantee::*;
    let cases: Vec<Case> = vec![
        ("a cgroup v2 node with everything", |_| {}, vec![]),
        (
            "Debian's perf_event_paranoid 3: the tracepoint failed, its fallback attached",
            |f| {
                if let Ebpf::Loaded { reboot, .. } = &mut f.ebpf {
                    *reboot = vec![
                        program("reboot_enter", "failed", Some("attach: Permission denied")),
                        program("reboot_raw", "attached", None),
                    ];
                }
            },
            vec![],
        ),
        (
            "no reboot program could attach",
            |f| {
                if let Ebpf::Loaded { reboot, .. } = &mut f.ebpf {
                    *reboot = vec![
                        program("reboot_enter", "failed", Some("attach: Permission denied")),
                        program(
                            "reboot_raw",
                            "failed",
                            Some("raw tracepoint sys_enter not in kernel BTF"),
                        ),
                    ];
                }
            },
            vec![(RebootProbe, "no", "sys_enter")],
        ),
        (
            "no kernel BTF: the reboot probe degraded, no CO-RE reads",
            |f| {
                if let Ebpf::Loaded {
                    reboot, kernel_btf, ..
                } = &mut f.ebpf
                {
                    *reboot = vec![
                        program(
                            "reboot_enter",
                            "degraded",
                            Some("reboot(2) callers cannot be checked"),
                        ),
                        program("reboot_raw", "failed", Some("no kernel BTF")),
                    ];
                    *kernel_btf = Err("read /sys/kernel/btf/vmlinux: No such file".to_owned());
                }
            },
            vec![
                (RebootProbe, "no", "callers cannot be checked"),
                (CoreReads, "no", "/sys/kernel/btf/vmlinux"),
            ],
        ),
        (
            "a cgroup v1 node: thresholds push, the memory push is not needed",
            |f| {
                f.memcg_thresholds = Source::Active;
                f.psi = Source::NotApplicable("no /proc/pressure/memory".to_owned());
            },
            vec![
                (MemcgThresholds, "yes", ""),
                (PsiTrigger, "not_applicable", "pressure"),
                (MemoryPush, "not_applicable", "cgroup v1"),
            ],
        ),
        (
            "the PSI trigger could not be written",
            |f| f.psi = Source::Unavailable("writing memory.pressure: EACCES".to_owned()),
            vec![(PsiTrigger, "no", "EACCES")],
        ),
        (
            "the memory push turned off by configuration",
            |f| {
                if let Ebpf::Loaded { memory_push, .. } = &mut f.ebpf {
                    *memory_push = vec![
                        program(
                            "mem_push_alloc",
                            "disabled",
                            Some("disabled by configuration"),
                        ),
                        program(
                            "mem_push_free",
                            "disabled",
                            Some("disabled by configuration"),
                        ),
                    ];
                }
            },
            vec![(MemoryPush, "no", "disabled by configuration")],
        ),
        (
            "eBPF off (--no-ebpf)",
            |f| f.ebpf = Ebpf::Off("--no-ebpf".to_owned()),
            vec![
                (RebootProbe, "no", "--no-ebpf"),
                (CoreReads, "no", "--no-ebpf"),
                (MemoryPush, "no", "--no-ebpf"),
            ],
        ),
        (
            "polling only",
            |f| f.psi = Source::Disabled,
            vec![(PsiTrigger, "no", "--polling-only")],
        ),
        (
            "the kubelet's configuration not found",
            |f| {
                f.kubelet_config = crate::guarantees::KubeletConfig::Missing(
                    "not found: /etc/kubernetes/kubelet/config.json".to_owned(),
                );
            },
            vec![(KubeletConfig, "no", "/etc/kubernetes/kubelet")],
        ),
        (
            "the kubelet's configuration not read by configuration",
            |f| f.kubelet_config = crate::guarantees::KubeletConfig::Off,
            vec![(KubeletConfig, "no", "kubeletConfigPath")],
        ),
        (
            "starting: nothing known yet",
            |f| *f = Facts::default(),
            vec![
                (RebootProbe, "no", "not known yet"),
                (CoreReads, "no", "not known yet"),
                (MemcgThresholds, "no", "not known yet"),
                (PsiTrigger, "no", "not known yet"),
                (MemoryPush, "no", "not known yet"),
                (KubeletConfig, "no", "not known yet"),
            ],
        ),
    ];
    let usual = [
        (RebootProbe, "yes"),
        (CoreReads, "yes"),
        (MemcgThresholds, "not_applicable"),
        (PsiTrigger, "yes"),
        (MemoryPush, "yes"),
        (KubeletConfig, "yes"),
    ];
    for (scenario, tweak, changes) in cases {
        let mut facts = v2_node();
        tweak(&mut facts);
        let a = assess(&facts);
        assert_eq!(a.len(), Guarantee::ALL.len(), "{scenario}");
        for (g, want) in usual {
            let (want, word) = changes
                .iter()
                .find(|(c, _, _)| *c == g)
                .map_or((want, ""), |(_, l, w)| (*l, *w));
            assert_eq!(label(&a, g), want, "{scenario}: {g:?} {:?}", a[&g]);
            assert!(why(&a, g).contains(word), "{scenario}: {g:?} {:?}", a[&g]);
        }
    }
}

#[test]
fn the_annotation_round_trips_and_bounds_its_reasons() {
    let mut facts = v2_node();
    facts.psi = Source::Unavailable("é".repeat(300));
    let a = assess(&facts);
    let text = encode(&a);
    let back = decode(&text).expect("decodes");
    assert_eq!(back.len(), a.len());
    for (g, h) in &a {
        match (h, &back[g]) {
            (Holds::No(w), Holds::No(b)) => {
                assert!(
                    b.len() <= MAX_REASON_BYTES && w.starts_with(b.as_str()),
                    "{g:?}"
                )
            }
            (h, b) => assert_eq!(h, b, "{g:?}"),
        }
    }
    assert!(text.contains("\"reboot-probe\":\"yes\""), "{text}");
}

#[test]
fn a_malformed_annotation_is_an_error_or_ignored_keys_never_a_panic() {
    for (text, ok) in [
        ("", false),
        ("[]", false),
        ("{", false),
        ("\"yes\"", false),
        ("{}", true),
        (
            "{\"reboot-probe\": 3, \"unknown\": \"yes\", \"psi-trigger\": \"maybe\"}",
            true,
        ),
    ] {
        let got = decode(text);
        assert_eq!(got.is_ok(), ok, "{text:?}: {got:?}");
        if let Ok(a) = got {
            assert!(a.is_empty(), "{text:?}: {a:?}");
        }
    }
    let huge = format!("{{\"x\": \"{}\"}}", "a".repeat(MAX_ANNOTATION_BYTES));
    assert!(decode(&huge).unwrap_err().contains("more than"));
}

#[test]
fn the_fleet_summary_counts_the_nodes_where_each_guarantee_does_not_hold() {
    let good = encode(&assess(&v2_node()));
    let mut blind = v2_node();
    if let Ebpf::Loaded { reboot, .. } = &mut blind.ebpf {
        *reboot = vec![program("reboot_enter", "failed", Some("EACCES"))];
    }
    let blind = encode(&assess(&blind));
    let mut nodes: Vec<(String, Option<String>)> = (0..40)
        .map(|i| (format!("n{i:02}"), Some(good.clone())))
        .collect();
    for n in nodes.iter_mut().take(12) {
        n.1 = Some(blind.clone());
    }
    nodes[39].1 = None;
    nodes[38].1 = Some("not json".to_owned());
    let lines = fleet_summary(&nodes);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with("12 of 40 nodes cannot see a reboot that bypasses the inhibitor"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("n00 (reboot_enter failed: EACCES)"),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with(", and 7 more"), "{}", lines[0]);
    assert!(
        lines[1].starts_with("2 of 40 nodes publish no guarantees"),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("n38 (unreadable:"), "{}", lines[1]);

    let all_good = fleet_summary(&[("a".to_owned(), Some(good))]);
    assert_eq!(
        all_good,
        vec!["every guarantee holds, or cannot apply, on all 1 nodes".to_owned()]
    );
}
