use node_monitor_common::config::TpLayout;

use super::*;
use crate::ebpf::tracefs::{parse_format, tests as fmt};

/// `kmem/mm_page_alloc` and `mm_page_free` on 6.18 (the same on 6.1), print fmt left out.
const MM_PAGE_ALLOC: &str = "name: mm_page_alloc\nID: 653\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:unsigned long pfn;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:unsigned int order;\toffset:16;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long gfp_flags;\toffset:24;\tsize:8;\tsigned:0;\n\
\tfield:int migratetype;\toffset:32;\tsize:4;\tsigned:1;\n";
const MM_PAGE_FREE: &str = "name: mm_page_free\nID: 655\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:unsigned long pfn;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:unsigned int order;\toffset:16;\tsize:4;\tsigned:0;\n";

fn all_tracepoints() -> BTreeMap<String, Result<TracepointFormat, String>> {
    let mut m = BTreeMap::new();
    let generic = "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n";
    for spec in PROGRAMS {
        if let Attach::TracePoint { category, name } = spec.attach {
            let text = match name {
                "mark_victim" => fmt::MARK_VICTIM_6_18,
                "mm_vmscan_wakeup_kswapd" => fmt::WAKEUP_KSWAPD_6_18,
                "sys_enter_reboot" => fmt::SYS_ENTER_REBOOT,
                "mm_page_alloc" => MM_PAGE_ALLOC,
                "mm_page_free" => MM_PAGE_FREE,
                _ => generic,
            };
            m.insert(
                format!("{category}/{name}"),
                Ok(parse_format(text).unwrap()),
            );
        }
    }
    m
}

/// This machine: 6.18 with BTF and every tracepoint.
fn full() -> Capabilities {
    Capabilities {
        kernel: parse_kernel_release("6.18.44-fc-v669"),
        kernel_btf: Some(Ok(())),
        raw_tracepoints: [(
            "mark_victim".to_owned(),
            vec!["struct task_struct *".to_owned(), "uid_t".to_owned()],
        )]
        .into(),
        tracefs_error: None,
        tracepoints: all_tracepoints(),
    }
}

fn decisions(caps: &Capabilities, sel: &Selection) -> BTreeMap<&'static str, Decision> {
    plan(PROGRAMS, caps, sel)
        .into_iter()
        .map(|(s, d)| (s.name, d))
        .collect()
}

fn kind(d: &Decision) -> &'static str {
    match d {
        Decision::Attach { .. } => "attach",
        Decision::Fallback { .. } => "fallback",
        Decision::Skip(ProgramState::Failed { .. }) => "failed",
        Decision::Skip(ProgramState::Disabled { .. }) => "disabled",
        Decision::Skip(_) => "other",
    }
}

fn reason(d: &Decision) -> &str {
    match d {
        Decision::Skip(ProgramState::Failed { reason } | ProgramState::Disabled { reason }) => {
            reason
        }
        _ => "",
    }
}

#[test]
fn table_is_consistent() {
    let names: BTreeSet<&str> = PROGRAMS.iter().map(|p| p.name).collect();
    assert_eq!(names.len(), PROGRAMS.len(), "unique names");
    for (i, p) in PROGRAMS.iter().enumerate() {
        assert!(p.name.len() <= 15, "{} is cut by the kernel", p.name);
        if let Requirement::FallbackFor(primary) = p.requirement {
            let at = PROGRAMS.iter().position(|q| q.name == primary);
            assert!(
                at.is_some_and(|at| at < i),
                "{} must follow {primary}",
                p.name
            );
        }
        if let Some(g) = p.group {
            assert!(
                PROGRAMS.iter().filter(|q| q.group == Some(g)).count() >= 2,
                "{g}"
            );
        }
        assert!(!p.when_missing.is_empty());
    }
}

/// (scenario, capabilities change, selection, expected decision per program)
#[test]
#[expect(clippy::too_many_lines, reason = "a table test: one row per scenario")]
fn plans_by_scenario() {
    type Tweak = fn(&mut Capabilities, &mut Selection);
    /// The decisions that differ from [`EVERYTHING`].
    type Changes = Vec<(&'static str, &'static str)>;
    /// The plan on a kernel with everything, and the default selection.
    const EVERYTHING: [(&str, &str); 11] = [
        (prog::OOM_RAW, "attach"),
        (prog::OOM_TP, "fallback"),
        (prog::DIRECT_BEGIN, "attach"),
        (prog::DIRECT_END, "attach"),
        (prog::MEMCG_BEGIN, "attach"),
        (prog::MEMCG_END, "attach"),
        (prog::KSWAPD_WAKE, "attach"),
        (prog::REBOOT, "attach"),
        (prog::MEM_PUSH_ALLOC, "attach"),
        (prog::MEM_PUSH_FREE, "attach"),
        (prog::SYNTHETIC, "disabled"),
    ];
    /// Every tracefs program fails.
    const NO_TRACEPOINTS: [(&str, &str); 9] = [
        (prog::OOM_TP, "failed"),
        (prog::DIRECT_BEGIN, "failed"),
        (prog::DIRECT_END, "failed"),
        (prog::MEMCG_BEGIN, "failed"),
        (prog::MEMCG_END, "failed"),
        (prog::KSWAPD_WAKE, "failed"),
        (prog::REBOOT, "failed"),
        (prog::MEM_PUSH_ALLOC, "failed"),
        (prog::MEM_PUSH_FREE, "failed"),
    ];
    let cases: Vec<(&str, Tweak, Changes)> = vec![
        ("everything available", |_, _| {}, vec![]),
        (
            "no kernel BTF",
            |c, _| c.kernel_btf = Some(Err("no /sys/kernel/btf/vmlinux".into())),
            vec![(prog::OOM_RAW, "failed")],
        ),
        (
            "no tracefs: only the raw tracepoint",
            |c, _| c.tracefs_error = Some("not mounted and mount failed: EPERM".into()),
            NO_TRACEPOINTS.to_vec(),
        ),
        (
            "no memcg reclaim tracepoint end (CONFIG_MEMCG off): the whole group stays out",
            |c, _| {
                c.tracepoints.insert(
                    "vmscan/mm_vmscan_memcg_reclaim_end".into(),
                    Err("no such event".into()),
                );
            },
            vec![(prog::MEMCG_BEGIN, "disabled"), (prog::MEMCG_END, "failed")],
        ),
        (
            "no kmem/mm_page_free: the memory push stays out whole",
            |c, _| {
                c.tracepoints
                    .insert("kmem/mm_page_free".into(), Err("no such event".into()));
            },
            vec![
                (prog::MEM_PUSH_ALLOC, "disabled"),
                (prog::MEM_PUSH_FREE, "failed"),
            ],
        ),
        (
            "mm_page_alloc without its order field: the memory push stays out whole",
            |c, _| {
                c.tracepoints.insert(
                    "kmem/mm_page_alloc".into(),
                    Ok(parse_format(&MM_PAGE_ALLOC.replace("order", "ordre")).unwrap()),
                );
            },
            vec![
                (prog::MEM_PUSH_ALLOC, "failed"),
                (prog::MEM_PUSH_FREE, "disabled"),
            ],
        ),
        (
            "the memory push disabled by configuration (nodeMonitor.memoryPush off)",
            |_, s| s.disabled = ["mem_push".to_owned()].into(),
            vec![
                (prog::MEM_PUSH_ALLOC, "disabled"),
                (prog::MEM_PUSH_FREE, "disabled"),
            ],
        ),
        (
            "no syscall tracepoints (CONFIG_FTRACE_SYSCALLS off)",
            |c, _| {
                c.tracepoints.retain(|k, _| !k.starts_with("syscalls/"));
            },
            vec![(prog::REBOOT, "failed")],
        ),
        (
            "kernel too old for the ring buffer",
            |c, _| c.kernel = parse_kernel_release("5.4.0-150-generic"),
            [[(prog::OOM_RAW, "failed")].as_slice(), &NO_TRACEPOINTS].concat(),
        ),
        (
            "families disabled by configuration, benchmark generator requested",
            |_, s| {
                s.disabled = ["kswapd".to_owned(), prog::DIRECT_END.to_owned()].into();
                s.opt_in = true;
            },
            vec![
                (prog::DIRECT_BEGIN, "disabled"),
                (prog::DIRECT_END, "disabled"),
                (prog::KSWAPD_WAKE, "disabled"),
                (prog::SYNTHETIC, "attach"),
            ],
        ),
        (
            "old oom format without the raw tracepoint: fallback with pid only",
            |c, _| {
                c.raw_tracepoints.clear();
                c.tracepoints.insert(
                    "oom/mark_victim".into(),
                    Ok(parse_format(fmt::MARK_VICTIM_5_15).unwrap()),
                );
            },
            vec![(prog::OOM_RAW, "failed")],
        ),
        (
            "the raw tracepoint passes only the pid (before it passed the task): fallback",
            |c, _| {
                c.raw_tracepoints
                    .insert("mark_victim".into(), vec!["int".into()]);
                c.tracepoints.insert(
                    "oom/mark_victim".into(),
                    Ok(parse_format(fmt::MARK_VICTIM_5_15).unwrap()),
                );
            },
            vec![(prog::OOM_RAW, "failed")],
        ),
    ];
    for (scenario, tweak, changes) in cases {
        let mut caps = full();
        let mut sel = Selection::default();
        tweak(&mut caps, &mut sel);
        let got = decisions(&caps, &sel);
        for (name, usual) in EVERYTHING {
            let expected = changes
                .iter()
                .find(|(changed, _)| *changed == name)
                .map_or(usual, |(_, kind)| *kind);
            assert_eq!(
                kind(&got[name]),
                expected,
                "{scenario}: {name} ({:?})",
                got[name]
            );
        }
    }
}

#[test]
fn reasons_name_what_is_missing() {
    let mut caps = full();
    caps.kernel_btf = Some(Err("read /sys/kernel/btf/vmlinux: No such file".into()));
    caps.tracepoints.insert(
        "vmscan/mm_vmscan_memcg_reclaim_end".into(),
        Err("no such event".into()),
    );
    let d = decisions(&caps, &Selection::default());
    assert!(
        reason(&d[prog::OOM_RAW]).contains("no kernel BTF for CO-RE: read /sys/kernel/btf/vmlinux"),
        "{:?}",
        d[prog::OOM_RAW]
    );
    assert!(reason(&d[prog::MEMCG_END]).contains("vmscan/mm_vmscan_memcg_reclaim_end"));
    assert!(reason(&d[prog::MEMCG_BEGIN]).contains("memcg_rcl_end"));
    let mut pid_only = full();
    pid_only
        .raw_tracepoints
        .insert("mark_victim".into(), vec!["int".into()]);
    assert_eq!(
        reason(&decisions(&pid_only, &Selection::default())[prog::OOM_RAW]),
        "raw tracepoint mark_victim passes (int), the program reads (struct task_struct *, \
             uid_t)"
    );
    let mut old = full();
    old.kernel = parse_kernel_release("4.19.0");
    assert_eq!(
        reason(&decisions(&old, &Selection::default())[prog::REBOOT]),
        "kernel 4.19 is older than 5.8"
    );
}

#[test]
fn field_programs_carry_their_layout() {
    let d = decisions(&full(), &Selection::default());
    let Decision::Attach {
        layout: Some((index, layout)),
    } = &d[prog::REBOOT]
    else {
        panic!("{:?}", d[prog::REBOOT]);
    };
    assert_eq!(*index, reboot_tp::SLOT.index);
    assert_eq!(layout.fields[reboot_tp::CMD].offset, 32);
    let Decision::Fallback {
        primary,
        layout: Some((index, _)),
    } = &d[prog::OOM_TP]
    else {
        panic!("{:?}", d[prog::OOM_TP]);
    };
    assert_eq!((*primary, *index), (prog::OOM_RAW, oom_tp::SLOT.index));
    assert_eq!(d[prog::DIRECT_BEGIN], Decision::Attach { layout: None });
    let _: TpLayout = *layout;
    for (name, slot, order) in [
        (
            prog::MEM_PUSH_ALLOC,
            page_alloc_tp::SLOT,
            page_alloc_tp::ORDER,
        ),
        (prog::MEM_PUSH_FREE, page_free_tp::SLOT, page_free_tp::ORDER),
    ] {
        let Decision::Attach {
            layout: Some((index, layout)),
        } = &d[name]
        else {
            panic!("{name}: {:?}", d[name]);
        };
        assert_eq!(*index, slot.index, "{name}");
        assert_eq!(
            (layout.fields[order].offset, layout.fields[order].size),
            (16, 4),
            "{name}"
        );
    }
    let Decision::Attach {
        layout: Some((_, alloc)),
    } = &d[prog::MEM_PUSH_ALLOC]
    else {
        unreachable!()
    };
    assert_eq!(alloc.fields[page_alloc_tp::PFN].offset, 8);
}

#[test]
fn unknown_kernel_version_does_not_gate() {
    let mut caps = full();
    caps.kernel = parse_kernel_release("not-a-version");
    assert_eq!(caps.kernel, None);
    assert_eq!(
        kind(&decisions(&caps, &Selection::default())[prog::REBOOT]),
        "attach"
    );
}

#[test]
fn kernel_releases_parse() {
    let cases = [
        ("6.18.44-fc-v669", Some((6, 18, 44))),
        ("5.15.0-91-generic", Some((5, 15, 0))),
        ("6.1", Some((6, 1, 0))),
        ("6.8.0+", Some((6, 8, 0))),
        ("garbage", None),
        ("", None),
    ];
    for (release, want) in cases {
        let got = parse_kernel_release(release).map(|k| (k.major, k.minor, k.patch));
        assert_eq!(got, want, "{release}");
    }
}

#[test]
fn a_group_member_failing_at_attach_detaches_its_partner() {
    let mut states: BTreeMap<&'static str, ProgramState> = PROGRAMS
        .iter()
        .map(|p| (p.name, ProgramState::Attached))
        .collect();
    assert!(broken_groups(PROGRAMS, &states).is_empty());
    states.insert(
        prog::MEMCG_END,
        ProgramState::Failed {
            reason: "EPERM".into(),
        },
    );
    assert_eq!(
        broken_groups(PROGRAMS, &states),
        vec![(
            prog::MEMCG_BEGIN,
            "group memcg_reclaim partner memcg_rcl_end did not attach".to_owned()
        )]
    );
}

#[test]
fn the_reboot_program_degrades_without_kernel_btf() {
    let attached = || ProgramState::Attached;
    type Case = (
        &'static str,
        ProgramState,
        Option<Result<(), String>>,
        &'static str,
    );
    let cases: [Case; 6] = [
        (prog::REBOOT, attached(), Some(Ok(())), "attached"),
        (
            prog::REBOOT,
            attached(),
            Some(Err("read /sys/kernel/btf/vmlinux: No such file".into())),
            "degraded",
        ),
        (prog::REBOOT, attached(), None, "degraded"),
        // Not attached: nothing to degrade.
        (
            prog::REBOOT,
            ProgramState::Failed { reason: "x".into() },
            None,
            "failed",
        ),
        (prog::OOM_RAW, attached(), None, "attached"),
        (
            prog::KSWAPD_WAKE,
            attached(),
            Some(Err("e".into())),
            "attached",
        ),
    ];
    for (name, state, caller, want) in cases {
        let got = with_caller_checks(name, state, &caller);
        assert_eq!(got.label(), want, "{name} {caller:?}");
        assert!(got.is_attached() == (want != "failed"), "{got:?}");
        if let ProgramState::Degraded { reason } = &got {
            assert!(reason.contains("unverified"), "{reason}");
            if let Some(Err(e)) = &caller {
                assert!(reason.contains(e.as_str()), "{reason}");
            }
        }
    }
}
