//! The load policy: which programs exist, what each needs from the kernel, whether the agent
//! depends on it and what it loses without it ([`PROGRAMS`]), and a pure function from the
//! kernel's probed capabilities to a plan ([`plan`]). No I/O here: the loader probes, plans, then
//! acts, so every degradation path is unit-tested.
use std::collections::{BTreeMap, BTreeSet};

use node_monitor_common::{
    config::{TpLayout, TpSlot, oom_tp, reboot_tp},
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
    /// Kernel BTF, against which the loader relocates the program's CO-RE reads of kernel
    /// structs.
    KernelBtf,
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
    MemPush,
    Synthetic,
}

impl Family {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Oom => "oom",
            Self::Reclaim => "reclaim",
            Self::Kswapd => "kswapd",
            Self::Reboot => "reboot",
            Self::MemPush => "mem_push",
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

/// A raw tracepoint: attached through `BPF_RAW_TRACEPOINT_OPEN`, no perf event, so a kernel
/// whose `perf_event_paranoid` admits only CAP_SYS_ADMIN to perf events (Debian's and
/// Ubuntu's above 2) still runs it.
const fn raw(name: &'static str) -> Attach {
    Attach::RawTracePoint { name }
}

/// The raw tracepoint exists and passes `args` first (checked in the kernel's BTF).
const fn need_raw(name: &'static str, args: &'static [&'static str]) -> Need {
    Need::RawTracepoint { name, args }
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
            Need::KernelBtf,
            // `TP_PROTO(struct task_struct *task, uid_t uid)`; before it, `(int pid)`.
            Need::RawTracepoint {
                name: "mark_victim",
                args: &["struct task_struct *", "uid_t"],
            },
        ],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Required,
        group: None,
        when_missing: "oom_victim_pid or oom_victim_tp takes over: the victim's cgroup is not known, only the \
                       triggering task's",
    },
    ProgramSpec {
        name: prog::OOM_PID,
        family: Family::Oom,
        attach: raw("mark_victim"),
        // Before the task was passed (5.10's `mark_victim`): the victim's pid alone.
        needs: &[need_raw("mark_victim", &["int"])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::FallbackFor(prog::OOM_RAW),
        group: None,
        when_missing: "oom_victim_tp takes over, through a perf event",
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
        attach: raw("mm_vmscan_direct_reclaim_begin"),
        needs: &[need_raw("mm_vmscan_direct_reclaim_begin", &[])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("direct_reclaim"),
        when_missing: "no direct-reclaim stall events; OOM kills cannot be told global without \
                       both reclaim groups",
    },
    ProgramSpec {
        name: prog::DIRECT_END,
        family: Family::Reclaim,
        attach: raw("mm_vmscan_direct_reclaim_end"),
        needs: &[need_raw("mm_vmscan_direct_reclaim_end", &[])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("direct_reclaim"),
        when_missing: "as direct_rcl_beg",
    },
    ProgramSpec {
        name: prog::MEMCG_BEGIN,
        family: Family::Reclaim,
        attach: raw("mm_vmscan_memcg_reclaim_begin"),
        needs: &[need_raw("mm_vmscan_memcg_reclaim_begin", &[])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("memcg_reclaim"),
        when_missing: "no memcg-reclaim stall events; OOM kills cannot be told memcg from global",
    },
    ProgramSpec {
        name: prog::MEMCG_END,
        family: Family::Reclaim,
        attach: raw("mm_vmscan_memcg_reclaim_end"),
        needs: &[need_raw("mm_vmscan_memcg_reclaim_end", &[])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("memcg_reclaim"),
        when_missing: "as memcg_rcl_beg",
    },
    ProgramSpec {
        name: prog::KSWAPD_WAKE,
        family: Family::Kswapd,
        attach: raw("mm_vmscan_wakeup_kswapd"),
        needs: &[need_raw(
            "mm_vmscan_wakeup_kswapd",
            &["int", "int", "int", "gfp_t"],
        )],
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
        when_missing: "reboot_raw takes over on the raw tracepoint sys_enter, which runs on \
                       every system call (a perf event is refused: kernel.perf_event_paranoid \
                       above 2 without CAP_SYS_ADMIN; or no CONFIG_FTRACE_SYSCALLS)",
    },
    ProgramSpec {
        name: prog::REBOOT_RAW,
        family: Family::Reboot,
        attach: raw("sys_enter"),
        // `TP_PROTO(struct pt_regs *regs, long id)`.
        needs: &[need_raw("sys_enter", &["struct pt_regs *", "long int"])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::FallbackFor(prog::REBOOT),
        group: None,
        when_missing: "shutdowns that bypass logind's inhibitor are not seen",
    },
    ProgramSpec {
        name: prog::MEM_PUSH_ALLOC,
        family: Family::MemPush,
        attach: raw("mm_page_alloc"),
        needs: &[need_raw(
            "mm_page_alloc",
            &["struct page *", "unsigned int"],
        )],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("mem_push"),
        when_missing: "no push as memory.available nears a threshold on cgroup v2: the agent \
                       looks every fastSamplingInterval inside the near band instead",
    },
    ProgramSpec {
        name: prog::MEM_PUSH_FREE,
        family: Family::MemPush,
        attach: raw("mm_page_free"),
        needs: &[need_raw("mm_page_free", &["struct page *", "unsigned int"])],
        min_kernel: RINGBUF_KERNEL,
        requirement: Requirement::Optional,
        group: Some("mem_push"),
        when_missing: "as mem_push_alloc",
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

/// The reboot program's state once attached: without kernel BTF its CO-RE reads of the caller
/// cannot be relocated, so it still reports every reboot(2) call but cannot tell a container's
/// refused call from a real shutdown; it marks them `unverified` and the agent never takes them
/// for a shutdown. Other programs and states are left as they are.
pub fn with_caller_checks(
    name: &str,
    state: ProgramState,
    kernel_btf: &Option<Result<(), String>>,
) -> ProgramState {
    if ![prog::REBOOT, prog::REBOOT_RAW].contains(&name) || state != ProgramState::Attached {
        return state;
    }
    let why = match kernel_btf {
        Some(Ok(())) => return state,
        Some(Err(e)) => format!("no kernel BTF: {e}"),
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
    /// Whether the kernel's BTF could be read, against which the loader relocates the programs'
    /// CO-RE reads of kernel structs, or why not.
    pub kernel_btf: Option<Result<(), String>>,
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
            Need::KernelBtf => match &caps.kernel_btf {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) => Err(format!("no kernel BTF for CO-RE: {e}")),
                None => Err("kernel BTF not probed".to_owned()),
            },
            Need::RawTracepoint { name, .. } if !matches!(caps.kernel_btf, Some(Ok(()))) => {
                Err(match &caps.kernel_btf {
                    Some(Err(e)) => format!(
                        "raw tracepoint {name}: its arguments cannot be checked without kernel \
                         BTF: {e}"
                    ),
                    _ => format!("raw tracepoint {name}: kernel BTF not probed"),
                })
            }
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

/// The program that makes `spec` stand by: when `spec` is a fallback, its primary or a fallback
/// of the same primary listed before it in `table`, whichever `attached` says runs. Pure.
pub fn standby(
    table: &'static [ProgramSpec],
    spec: &ProgramSpec,
    attached: impl Fn(&str) -> bool,
) -> Option<&'static str> {
    let Requirement::FallbackFor(primary) = spec.requirement else {
        return None;
    };
    let earlier = table
        .iter()
        .take_while(|p| p.name != spec.name)
        .filter(|p| p.requirement == Requirement::FallbackFor(primary))
        .map(|p| p.name);
    std::iter::once(primary)
        .chain(earlier)
        .find(|name| attached(name))
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
mod tests;
