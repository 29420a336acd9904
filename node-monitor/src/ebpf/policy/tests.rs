use node_monitor_common::config::TpLayout;

use super::*;
use crate::ebpf::tracefs::{parse_format, tests as fmt};

fn all_tracepoints() -> BTreeMap<String, Result<TracepointFormat, String>> {
    let mut m = BTreeMap::new();
    let generic = "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n";
    for spec in PROGRAMS {
        if let Attach::TracePoint { category, name } = spec.attach {
            let text = match name {
                "mark_victim" => fmt::MARK_VICTIM_6_18,
                "sys_enter_reboot" => fmt::SYS_ENTER_REBOOT,
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

/// The raw tracepoints the table names, with their arguments on 6.18 (the same on 6.1).
fn all_raw_tracepoints() -> BTreeMap<String, Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    [
        ("mark_victim", v(&["struct task_struct *", "uid_t"])),
        ("mm_vmscan_direct_reclaim_begin", v(&["int", "gfp_t"])),
        ("mm_vmscan_direct_reclaim_end", v(&["long unsigned int"])),
        ("mm_vmscan_memcg_reclaim_begin", v(&["int", "gfp_t"])),
        ("mm_vmscan_memcg_reclaim_end", v(&["long unsigned int"])),
        (
            "mm_vmscan_wakeup_kswapd",
            v(&["int", "int", "int", "gfp_t"]),
        ),
        (
            "mm_page_alloc",
            v(&["struct page *", "unsigned int", "gfp_t", "int"]),
        ),
        ("mm_page_free", v(&["struct page *", "unsigned int"])),
        ("sys_enter", v(&["struct pt_regs *", "long int"])),
    ]
    .into_iter()
    .map(|(n, a)| (n.to_owned(), a))
    .collect()
}

/// This machine: 6.18 with BTF and every tracepoint.
fn full() -> Capabilities {
    Capabilities {
        kernel: parse_kernel_release("6.18.44-fc-v669"),
        kernel_btf: Some(Ok(())),
        raw_tracepoints: all_raw_tracepoints(),
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
    const EVERYTHING: [(&str, &str); 13] = [
        (prog::OOM_RAW, "attach"),
        // 6.18's `mark_victim` passes the task: the pid-only program cannot run (and stands by
        // behind `oom_victim_raw` at load, `standby`).
        (prog::OOM_PID, "failed"),
        (prog::OOM_TP, "fallback"),
        (prog::DIRECT_BEGIN, "attach"),
        (prog::DIRECT_END, "attach"),
        (prog::MEMCG_BEGIN, "attach"),
        (prog::MEMCG_END, "attach"),
        (prog::KSWAPD_WAKE, "attach"),
        (prog::REBOOT, "attach"),
        (prog::REBOOT_RAW, "fallback"),
        (prog::MEM_PUSH_ALLOC, "attach"),
        (prog::MEM_PUSH_FREE, "attach"),
        (prog::SYNTHETIC, "disabled"),
    ];
    /// Every tracefs program fails; the raw tracepoints need no tracefs.
    const NO_TRACEPOINTS: [(&str, &str); 2] = [(prog::OOM_TP, "failed"), (prog::REBOOT, "failed")];
    /// Every raw tracepoint program but the OOM one (which has its fallback) fails.
    const NO_RAW: [(&str, &str); 8] = [
        (prog::DIRECT_BEGIN, "failed"),
        (prog::DIRECT_END, "failed"),
        (prog::MEMCG_BEGIN, "failed"),
        (prog::MEMCG_END, "failed"),
        (prog::KSWAPD_WAKE, "failed"),
        (prog::REBOOT_RAW, "failed"),
        (prog::MEM_PUSH_ALLOC, "failed"),
        (prog::MEM_PUSH_FREE, "failed"),
    ];
    /// Every program that needs the ring buffer fails.
    const EVERY_RING_PROGRAM: [(&str, &str); 10] = [
        (prog::OOM_TP, "failed"),
        (prog::DIRECT_BEGIN, "failed"),
        (prog::DIRECT_END, "failed"),
        (prog::MEMCG_BEGIN, "failed"),
        (prog::MEMCG_END, "failed"),
        (prog::KSWAPD_WAKE, "failed"),
        (prog::REBOOT, "failed"),
        (prog::REBOOT_RAW, "failed"),
        (prog::MEM_PUSH_ALLOC, "failed"),
        (prog::MEM_PUSH_FREE, "failed"),
    ];
    let cases: Vec<(&str, Tweak, Changes)> = vec![
        ("everything available", |_, _| {}, vec![]),
        (
            "no kernel BTF: the raw tracepoints' arguments cannot be checked",
            |c, _| {
                c.kernel_btf = Some(Err("no /sys/kernel/btf/vmlinux".into()));
                c.raw_tracepoints.clear();
            },
            [[(prog::OOM_RAW, "failed")].as_slice(), &NO_RAW].concat(),
        ),
        (
            "no tracefs: only the raw tracepoints",
            |c, _| c.tracefs_error = Some("not mounted and mount failed: EPERM".into()),
            NO_TRACEPOINTS.to_vec(),
        ),
        (
            "no memcg reclaim tracepoint end (CONFIG_MEMCG off): the whole group stays out",
            |c, _| {
                c.raw_tracepoints.remove("mm_vmscan_memcg_reclaim_end");
            },
            vec![(prog::MEMCG_BEGIN, "disabled"), (prog::MEMCG_END, "failed")],
        ),
        (
            "no mm_page_free: the memory push stays out whole",
            |c, _| {
                c.raw_tracepoints.remove("mm_page_free");
            },
            vec![
                (prog::MEM_PUSH_ALLOC, "disabled"),
                (prog::MEM_PUSH_FREE, "failed"),
            ],
        ),
        (
            "mm_page_alloc passing other arguments: the memory push stays out whole",
            |c, _| {
                c.raw_tracepoints
                    .insert("mm_page_alloc".into(), vec!["long unsigned int".into()]);
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
            "no syscall tracepoints (CONFIG_FTRACE_SYSCALLS off): the raw sys_enter stands by",
            |c, _| {
                c.tracepoints.retain(|k, _| !k.starts_with("syscalls/"));
            },
            vec![(prog::REBOOT, "failed")],
        ),
        (
            "neither syscall tracepoints nor the raw sys_enter: no reboot probe",
            |c, _| {
                c.tracepoints.retain(|k, _| !k.starts_with("syscalls/"));
                c.raw_tracepoints.remove("sys_enter");
            },
            vec![(prog::REBOOT, "failed"), (prog::REBOOT_RAW, "failed")],
        ),
        (
            "sys_enter passing other arguments: the fallback is refused",
            |c, _| {
                c.raw_tracepoints
                    .insert("sys_enter".into(), vec!["long int".into()]);
            },
            vec![(prog::REBOOT_RAW, "failed")],
        ),
        (
            "kernel too old for the ring buffer",
            |c, _| c.kernel = parse_kernel_release("5.4.0-150-generic"),
            [[(prog::OOM_RAW, "failed")].as_slice(), &EVERY_RING_PROGRAM].concat(),
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
                c.raw_tracepoints.remove("mark_victim");
                c.tracepoints.insert(
                    "oom/mark_victim".into(),
                    Ok(parse_format(fmt::MARK_VICTIM_5_15).unwrap()),
                );
            },
            vec![(prog::OOM_RAW, "failed")],
        ),
        (
            "the raw tracepoint passes only the pid (before it passed the task, as on 5.10): the \
             pid-only raw program, then the tracepoint",
            |c, _| {
                c.raw_tracepoints
                    .insert("mark_victim".into(), vec!["int".into()]);
                c.tracepoints.insert(
                    "oom/mark_victim".into(),
                    Ok(parse_format(fmt::MARK_VICTIM_5_15).unwrap()),
                );
            },
            vec![(prog::OOM_RAW, "failed"), (prog::OOM_PID, "fallback")],
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
    caps.raw_tracepoints.clear();
    let d = decisions(&caps, &Selection::default());
    assert!(
        reason(&d[prog::OOM_RAW]).contains("no kernel BTF for CO-RE: read /sys/kernel/btf/vmlinux"),
        "{:?}",
        d[prog::OOM_RAW]
    );
    assert_eq!(
        reason(&d[prog::KSWAPD_WAKE]),
        "raw tracepoint mm_vmscan_wakeup_kswapd: its arguments cannot be checked without kernel \
         BTF: read /sys/kernel/btf/vmlinux: No such file"
    );
    let mut no_memcg = full();
    no_memcg
        .raw_tracepoints
        .remove("mm_vmscan_memcg_reclaim_end");
    let d = decisions(&no_memcg, &Selection::default());
    assert_eq!(
        reason(&d[prog::MEMCG_END]),
        "raw tracepoint mm_vmscan_memcg_reclaim_end not in kernel BTF"
    );
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
    // The raw tracepoint programs read their arguments: no layout.
    for name in [prog::KSWAPD_WAKE, prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE] {
        assert_eq!(d[name], Decision::Attach { layout: None }, "{name}");
    }
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
    let cases: [Case; 8] = [
        (prog::REBOOT, attached(), Some(Ok(())), "attached"),
        (prog::REBOOT_RAW, attached(), Some(Ok(())), "attached"),
        (prog::REBOOT_RAW, attached(), None, "degraded"),
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

/// (primary attached, earlier fallback attached, this fallback) → what it stands by for.
#[test]
fn a_fallback_stands_by_for_its_primary_and_earlier_fallbacks() {
    let spec = |name| PROGRAMS.iter().find(|p| p.name == name).unwrap();
    let cases: [(&[&str], &str, Option<&str>); 7] = [
        (&[prog::OOM_RAW], prog::OOM_PID, Some(prog::OOM_RAW)),
        (&[prog::OOM_RAW], prog::OOM_TP, Some(prog::OOM_RAW)),
        (&[prog::OOM_PID], prog::OOM_TP, Some(prog::OOM_PID)),
        // A later fallback does not make an earlier one stand by.
        (&[prog::OOM_TP], prog::OOM_PID, None),
        (&[], prog::OOM_TP, None),
        (&[prog::REBOOT], prog::REBOOT_RAW, Some(prog::REBOOT)),
        // A primary never stands by.
        (&[prog::OOM_PID, prog::OOM_TP], prog::OOM_RAW, None),
    ];
    for (attached, program, want) in cases {
        assert_eq!(
            standby(PROGRAMS, spec(program), |n| attached.contains(&n)),
            want,
            "{program} with {attached:?} attached"
        );
    }
}
