//! The load policy: which programs exist, what each needs from the kernel, whether the agent
//! depends on it and what it loses without it ([`PROGRAMS`]), and a pure function from the
//! kernel's probed capabilities to a plan ([`plan`]). No I/O here: the loader probes, plans, then
//! acts, so every degradation path is unit-tested.
use std::collections::{BTreeMap, BTreeSet};

use node_monitor_common::{
    config::{TaskOffsets, TpLayout, TpSlot, kswapd_tp, oom_tp, reboot_tp},
    names::prog,
};

use super::tracefs::{self, TracepointFormat};

/// How a program attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// A classic tracepoint (`perf_event_open` on `<tracefs>/events/<category>/<name>/id`).
    TracePoint {
        category: &'static str,
        name: &'static str,
    },
    /// A raw tracepoint (`BPF_RAW_TRACEPOINT_OPEN`), by the tracepoint's name; no tracefs needed.
    RawTracePoint { name: &'static str },
}

impl std::fmt::Display for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TracePoint { category, name } => write!(f, "tracepoint {category}/{name}"),
            Self::RawTracePoint { name } => write!(f, "raw_tracepoint {name}"),
        }
    }
}

/// Something a program needs from the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Kernel BTF with every `task_struct` offset the program reads.
    TaskOffsets,
    /// The tracepoint exists (tracefs mounted and the event present).
    Tracepoint {
        category: &'static str,
        name: &'static str,
    },
    /// The tracepoint exists and has the slot's required fields (their offsets go to the map).
    TracepointFields(TpSlot),
    /// A raw tracepoint of that name exists (its `btf_trace_<name>` typedef is in the BTF) and
    /// its arguments start with `args` (C spelling), the ones the program reads.
    RawTracepoint {
        name: &'static str,
        args: &'static [&'static str],
    },
}

/// How much the agent depends on a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// The feature it serves is degraded without it (a warning and `degraded()`), but the agent
    /// runs on.
    Required,
    /// Nice to have.
    Optional,
    /// Attached only when the named program is not attached.
    FallbackFor(&'static str),
    /// Off unless the configuration asks for it (the benchmark generator).
    OptIn,
}

/// A probe family: the unit of `--kind` filtering and of `ProbeConfig::disable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Oom,
    Reclaim,
    Kswapd,
    Reboot,
    Synthetic,
}

impl Family {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Oom => "oom",
            Self::Reclaim => "reclaim",
            Self::Kswapd => "kswapd",
            Self::Reboot => "reboot",
            Self::Synthetic => "synthetic",
        }
    }
}

/// A row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramSpec {
    pub name: &'static str,
    pub family: Family,
    pub attach: Attach,
    pub needs: &'static [Need],
    /// Oldest kernel (major, minor) the program works on: the ring buffer needs 5.8.
    pub min_kernel: (u32, u32),
    pub requirement: Requirement,
    /// Programs of one group attach together or not at all (a reclaim `begin` without its
    /// `end` would only fill the in-flight map).
    pub group: Option<&'static str>,
    /// What the agent loses, or does instead, when the program is not attached.
    pub when_missing: &'static str,
}

const RINGBUF_KERNEL: (u32, u32) = (5, 8);

const fn tp(category: &'static str, name: &'static str) -> Attach {
    Attach::TracePoint { category, name }
}

const fn need_tp(category: &'static str, name: &'static str) -> Need {
    Need::Tracepoint { category, name }
}

/// Every program in the eBPF object, in load order (a primary before its fallback).
pub const PROGRAMS: &[ProgramSpec] = &[
    ProgramSpec {
        name: prog::OOM_RAW,
        family: Family::Oom,
        attach: Attach::RawTracePoint {
            name: "mark_victim",
        },
        needs: &[
            Need::TaskOffsets,
            // `TP_PROTO(struct task_struct *task, uid_t uid)`; before it, `(int pid)`.
            Need::RawTracepoint {
                name: "mark_victim",
                args: &["struct task_struct *", "uid_t"],
            },
        ],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Required,
        group: None,
        when_missing: "oom_victim_tp takes over: the victim's cgroup is not known, only the \
                       triggering task's",
    },
    ProgramSpec {
        name: prog::OOM_TP,
        family: Family::Oom,
        attach: tp("oom", "mark_victim"),
        needs: &[Need::TracepointFields(oom_tp::SLOT)],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::FallbackFor(prog::OOM_RAW),
        group: None,
        when_missing: "no OOM-kill events: OOM kills are seen only through cgroup memory events",
    },
    ProgramSpec {
        name: prog::DIRECT_BEGIN,
        family: Family::Reclaim,
        attach: tp("vmscan", "mm_vmscan_direct_reclaim_begin"),
        needs: &[need_tp("vmscan", "mm_vmscan_direct_reclaim_begin")],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("direct_reclaim"),
        when_missing: "no direct-reclaim stall events; OOM kills cannot be told global without \
                       both reclaim groups",
    },
    ProgramSpec {
        name: prog::DIRECT_END,
        family: Family::Reclaim,
        attach: tp("vmscan", "mm_vmscan_direct_reclaim_end"),
        needs: &[need_tp("vmscan", "mm_vmscan_direct_reclaim_end")],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("direct_reclaim"),
        when_missing: "as direct_rcl_beg",
    },
    ProgramSpec {
        name: prog::MEMCG_BEGIN,
        family: Family::Reclaim,
        attach: tp("vmscan", "mm_vmscan_memcg_reclaim_begin"),
        needs: &[need_tp("vmscan", "mm_vmscan_memcg_reclaim_begin")],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("memcg_reclaim"),
        when_missing: "no memcg-reclaim stall events; OOM kills cannot be told memcg from global",
    },
    ProgramSpec {
        name: prog::MEMCG_END,
        family: Family::Reclaim,
        attach: tp("vmscan", "mm_vmscan_memcg_reclaim_end"),
        needs: &[need_tp("vmscan", "mm_vmscan_memcg_reclaim_end")],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("memcg_reclaim"),
        when_missing: "as memcg_rcl_beg",
    },
    ProgramSpec {
        name: prog::KSWAPD_WAKE,
        family: Family::Kswapd,
        attach: tp("vmscan", "mm_vmscan_wakeup_kswapd"),
        needs: &[Need::TracepointFields(kswapd_tp::SLOT)],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: None,
        when_missing: "no kswapd wake-up events (node memory pressure is still seen through PSI \
                       and the housekeeping tick)",
    },
    ProgramSpec {
        name: prog::REBOOT,
        family: Family::Reboot,
        attach: tp("syscalls", "sys_enter_reboot"),
        needs: &[Need::TracepointFields(reboot_tp::SLOT)],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Required,
        group: None,
        when_missing: "shutdowns that bypass logind's inhibitor are not seen (needs \
                       CONFIG_FTRACE_SYSCALLS)",
    },
    ProgramSpec {
        name: prog::SYNTHETIC,
        family: Family::Synthetic,
        attach: tp("syscalls", "sys_enter_getppid"),
        needs: &[need_tp("syscalls", "sys_enter_getppid")],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::OptIn,
        group: None,
        when_missing: "benchmark only",
    },
];

/// The spec of a program by name.
pub fn spec(name: &str) -> Option<&'static ProgramSpec> {
    PROGRAMS.iter().find(|p| p.name == name)
}

/// What a program is doing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProgramState {
    /// Verified and loaded in the kernel, not attached.
    Loaded,
    Attached,
    /// It should run but could not: the reason says why.
    Failed {
        reason: String,
    },
    /// Not wanted: by configuration, as a standby fallback, or as an opt-in program.
    Disabled {
        reason: String,
    },
    /// Attached, with part of its function missing: the reason says which part and why.
    Degraded {
        reason: String,
    },
}

impl ProgramState {
    /// Attached, whether or not degraded.
    pub fn is_attached(&self) -> bool {
        matches!(self, Self::Attached | Self::Degraded { .. })
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Attached => "attached",
            Self::Failed { .. } => "failed",
            Self::Disabled { .. } => "disabled",
            Self::Degraded { .. } => "degraded",
        }
    }
}

/// The reboot program's state once attached: without the caller offsets it still reports every
/// reboot(2) call, but cannot tell a container's refused call from a real shutdown, so it marks
/// them `unverified` and the agent never takes them for a shutdown. Other programs and states
/// are left as they are.
pub fn with_caller_checks(
    name: &str,
    state: ProgramState,
    caller: &Option<Result<TaskOffsets, String>>,
) -> ProgramState {
    if name != prog::REBOOT || state != ProgramState::Attached {
        return state;
    }
    let why = match caller {
        Some(Ok(o)) if o.caller_valid != 0 => return state,
        Some(Ok(_)) => "caller offsets incomplete".to_owned(),
        Some(Err(e)) => e.clone(),
        None => "kernel BTF not probed".to_owned(),
    };
    ProgramState::Degraded {
        reason: format!(
            "reboot(2) callers cannot be checked ({why}): requests are reported unverified and \
             never count as a shutdown that bypassed the inhibitor"
        ),
    }
}

/// The kernel's version as `uname -r` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// Parses `6.18.44-fc-v669`, `5.15.0-91-generic`, `6.1`.
pub fn parse_kernel_release(release: &str) -> Option<KernelVersion> {
    let numeric = release
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut parts = numeric.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(KernelVersion {
        major,
        minor,
        patch,
    })
}

/// What the loader found on this kernel.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    /// `None` when `uname -r` could not be parsed (then no version gate applies).
    pub kernel: Option<KernelVersion>,
    /// The BTF-resolved task offsets, or why they are unavailable.
    pub task_offsets: Option<Result<TaskOffsets, String>>,
    /// The BTF-resolved offsets of the reboot program's caller checks (only the caller fields
    /// are set), or why they are unavailable.
    pub caller_offsets: Option<Result<TaskOffsets, String>>,
    /// Raw tracepoints the kernel's BTF declares, with their argument types (only the ones the
    /// table asks about).
    pub raw_tracepoints: BTreeMap<String, Vec<String>>,
    /// Why tracefs is unavailable; `None` when it is mounted.
    pub tracefs_error: Option<String>,
    /// Parsed formats (or why not) of the tracepoints the table names, by `category/name`.
    pub tracepoints: BTreeMap<String, Result<TracepointFormat, String>>,
}

impl Capabilities {
    fn tracepoint(&self, category: &str, name: &str) -> Result<&TracepointFormat, String> {
        if let Some(e) = &self.tracefs_error {
            return Err(format!("tracefs unavailable: {e}"));
        }
        match self.tracepoints.get(&format!("{category}/{name}")) {
            Some(Ok(f)) => Ok(f),
            Some(Err(e)) => Err(format!("tracepoint {category}/{name} unavailable: {e}")),
            None => Err(format!("tracepoint {category}/{name} not probed")),
        }
    }
}

/// What the agent asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Families or program names not to load.
    pub disabled: BTreeSet<String>,
    /// Load the opt-in programs (the benchmark generator).
    pub opt_in: bool,
}

/// The plan for one program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Load and attach; the layout to write first, for tracepoint-field programs.
    Attach { layout: Option<(u32, TpLayout)> },
    /// Attach only if `primary` did not attach (then as `Attach` with this layout).
    Fallback {
        primary: &'static str,
        layout: Option<(u32, TpLayout)>,
    },
    /// Do not load; the state to report.
    Skip(ProgramState),
}

/// Decides, for every program of `table`, whether to attach it, from the kernel's capabilities
/// and the agent's selection. Pure.
pub fn plan(
    table: &'static [ProgramSpec],
    caps: &Capabilities,
    selection: &Selection,
) -> Vec<(&'static ProgramSpec, Decision)> {
    let mut out: Vec<(&'static ProgramSpec, Decision)> = table
        .iter()
        .map(|spec| (spec, decide(spec, caps, selection)))
        .collect();
    // A group attaches whole or not at all: if one member cannot, none is loaded.
    let blocked: BTreeMap<&str, String> = out
        .iter()
        .filter_map(|(spec, d)| match (spec.group, d) {
            (Some(g), Decision::Skip(ProgramState::Failed { reason })) => {
                Some((g, format!("{} in group {g}: {reason}", spec.name)))
            }
            (Some(g), Decision::Skip(ProgramState::Disabled { .. })) => {
                Some((g, format!("{} in group {g} is disabled", spec.name)))
            }
            _ => None,
        })
        .collect();
    for (spec, d) in &mut out {
        if let (Some(g), Decision::Attach { .. }) = (spec.group, &*d)
            && let Some(why) = blocked.get(g)
        {
            *d = Decision::Skip(ProgramState::Disabled {
                reason: format!("group partner unavailable: {why}"),
            });
        }
    }
    out
}

fn decide(spec: &ProgramSpec, caps: &Capabilities, selection: &Selection) -> Decision {
    if selection.disabled.contains(spec.name) || selection.disabled.contains(spec.family.as_str()) {
        return Decision::Skip(ProgramState::Disabled {
            reason: "disabled by configuration".to_owned(),
        });
    }
    if spec.requirement == Requirement::OptIn && !selection.opt_in {
        return Decision::Skip(ProgramState::Disabled {
            reason: "opt-in program not requested".to_owned(),
        });
    }
    if let Some(k) = caps.kernel
        && (k.major, k.minor) < spec.min_kernel
    {
        return Decision::Skip(ProgramState::Failed {
            reason: format!(
                "kernel {}.{} is older than {}.{}",
                k.major, k.minor, spec.min_kernel.0, spec.min_kernel.1
            ),
        });
    }
    let mut layout = None;
    for need in spec.needs {
        let met = match need {
            Need::TaskOffsets => match &caps.task_offsets {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(format!("kernel BTF offsets unavailable: {e}")),
                None => Err("kernel BTF not probed".to_owned()),
            },
            Need::RawTracepoint { name, args } => match caps.raw_tracepoints.get(*name) {
                None => Err(format!("raw tracepoint {name} not in kernel BTF")),
                Some(have)
                    if have.len() < args.len() || args.iter().zip(have).any(|(a, h)| a != h) =>
                {
                    Err(format!(
                        "raw tracepoint {name} passes ({}), the program reads ({})",
                        have.join(", "),
                        args.join(", ")
                    ))
                }
                Some(_) => Ok(()),
            },
            Need::Tracepoint { category, name } => caps.tracepoint(category, name).map(|_| ()),
            Need::TracepointFields(slot) => caps
                .tracepoint(slot.category, slot.name)
                .and_then(|f| tracefs::layout(slot, f).map_err(|e| e.to_string()))
                .map(|l| layout = Some((slot.index, l))),
        };
        if let Err(reason) = met {
            return Decision::Skip(ProgramState::Failed { reason });
        }
    }
    match spec.requirement {
        Requirement::FallbackFor(primary) => Decision::Fallback { primary, layout },
        _ => Decision::Attach { layout },
    }
}

/// After attaching: members of a group whose partner failed at load or attach time must be
/// detached too. Returns `(program, reason)` for each attached program to detach. Pure.
pub fn broken_groups(
    table: &'static [ProgramSpec],
    states: &BTreeMap<&'static str, ProgramState>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for spec in table {
        let Some(g) = spec.group else { continue };
        if !states.get(spec.name).is_some_and(ProgramState::is_attached) {
            continue;
        }
        if let Some(partner) = table.iter().find(|p| {
            p.group == Some(g)
                && p.name != spec.name
                && !states.get(p.name).is_some_and(ProgramState::is_attached)
        }) {
            out.push((
                spec.name,
                format!("group {g} partner {} did not attach", partner.name),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
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
                    "mm_vmscan_wakeup_kswapd" => fmt::WAKEUP_KSWAPD_6_18,
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

    /// This machine: 6.18 with BTF and every tracepoint.
    fn full() -> Capabilities {
        Capabilities {
            kernel: parse_kernel_release("6.18.44-fc-v669"),
            task_offsets: Some(Ok(TaskOffsets {
                valid: 1,
                ..TaskOffsets::default()
            })),
            caller_offsets: Some(Ok(TaskOffsets {
                caller_valid: 1,
                ..TaskOffsets::default()
            })),
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
    fn plans_by_scenario() {
        type Tweak = fn(&mut Capabilities, &mut Selection);
        /// The decisions that differ from [`EVERYTHING`].
        type Changes = Vec<(&'static str, &'static str)>;
        /// The plan on a kernel with everything, and the default selection.
        const EVERYTHING: [(&str, &str); 9] = [
            (prog::OOM_RAW, "attach"),
            (prog::OOM_TP, "fallback"),
            (prog::DIRECT_BEGIN, "attach"),
            (prog::DIRECT_END, "attach"),
            (prog::MEMCG_BEGIN, "attach"),
            (prog::MEMCG_END, "attach"),
            (prog::KSWAPD_WAKE, "attach"),
            (prog::REBOOT, "attach"),
            (prog::SYNTHETIC, "disabled"),
        ];
        /// Every tracefs program fails.
        const NO_TRACEPOINTS: [(&str, &str); 7] = [
            (prog::OOM_TP, "failed"),
            (prog::DIRECT_BEGIN, "failed"),
            (prog::DIRECT_END, "failed"),
            (prog::MEMCG_BEGIN, "failed"),
            (prog::MEMCG_END, "failed"),
            (prog::KSWAPD_WAKE, "failed"),
            (prog::REBOOT, "failed"),
        ];
        let cases: Vec<(&str, Tweak, Changes)> = vec![
            ("everything available", |_, _| {}, vec![]),
            (
                "no kernel BTF",
                |c, _| c.task_offsets = Some(Err("no /sys/kernel/btf/vmlinux".into())),
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
        caps.task_offsets = Some(Err("struct task_struct has no member cgroups".into()));
        caps.tracepoints.insert(
            "vmscan/mm_vmscan_memcg_reclaim_end".into(),
            Err("no such event".into()),
        );
        let d = decisions(&caps, &Selection::default());
        assert!(
            reason(&d[prog::OOM_RAW]).contains("no member cgroups"),
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
    fn the_reboot_program_degrades_without_caller_offsets() {
        let ok = TaskOffsets {
            caller_valid: 1,
            ..TaskOffsets::default()
        };
        let attached = || ProgramState::Attached;
        type Case = (
            &'static str,
            ProgramState,
            Option<Result<TaskOffsets, String>>,
            &'static str,
        );
        let cases: [Case; 7] = [
            (prog::REBOOT, attached(), Some(Ok(ok)), "attached"),
            (
                prog::REBOOT,
                attached(),
                Some(Err("btf has no struct cred".into())),
                "degraded",
            ),
            (
                prog::REBOOT,
                attached(),
                Some(Ok(TaskOffsets::default())),
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
}
