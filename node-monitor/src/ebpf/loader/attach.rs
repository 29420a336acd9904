//! Attaching and unloading one program.
use aya::{
    Ebpf,
    programs::{
        Program,
        raw_trace_point::{RawTracePointLink, RawTracePointLinkId},
    },
};
use tracing::error;

use node_monitor_common::names::prog;

use super::chain;
use crate::ebpf::policy::{Attach, ProgramSpec, ProgramState};

/// Loads and attaches one program of the object.
pub(super) fn attach(ebpf: &mut Ebpf, spec: &ProgramSpec) -> ProgramState {
    let Some(program) = ebpf.program_mut(spec.name) else {
        return ProgramState::Failed {
            reason: "program missing from the eBPF object".to_owned(),
        };
    };
    let result = match (spec.attach, program) {
        (Attach::TracePoint { category, name }, Program::TracePoint(p)) => p
            .load()
            .map_err(|e| format!("load: {}", chain(&e)))
            .and_then(|()| {
                p.attach(category, name).map(drop).map_err(|e| {
                    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                        .ok()
                        .and_then(|t| t.trim().parse::<i32>().ok());
                    format!(
                        "attach: {}{}",
                        chain(&e),
                        tracepoint_denied_hint(&chain(&e), paranoid)
                    )
                })
            }),
        (Attach::RawTracePoint { name }, Program::RawTracePoint(p)) => p
            .load()
            .map_err(|e| format!("load: {}", chain(&e)))
            .and_then(|()| {
                p.attach(name)
                    .map(drop)
                    .map_err(|e| format!("attach: {}", chain(&e)))
            }),
        (attach, p) => Err(format!(
            "the object's program is a {:?}, the table says {attach}",
            p.prog_type()
        )),
    };
    match result {
        Ok(()) => ProgramState::Attached,
        Err(reason) => ProgramState::Failed { reason },
    }
}

/// Why a tracepoint attach was refused, when the cause is the one Debian and Ubuntu kernels add:
/// with `kernel.perf_event_paranoid` above 2 their patch lets only CAP_SYS_ADMIN open any perf
/// event, CAP_PERFMON included, and a tracepoint program attaches through one. Raw tracepoints
/// do not: every program the pressure decisions lean on is one, and the reboot probe's fallback
/// (`reboot_raw`, on the raw `sys_enter`) takes over from the syscall tracepoint.
pub(super) fn tracepoint_denied_hint(error: &str, paranoid: Option<i32>) -> String {
    match paranoid {
        Some(level) if level > 2 && error.contains("Permission denied") => format!(
            " (kernel.perf_event_paranoid is {level}: this kernel lets only CAP_SYS_ADMIN open \
             perf events; the raw tracepoint fallback, if any, takes over; see docs/install.md)"
        ),
        _ => String::new(),
    }
}

/// Unloads one program (its links detached with it); a failure is logged.
pub(super) fn unload(ebpf: &mut Ebpf, name: &str) {
    let result = match ebpf.program_mut(name) {
        Some(Program::TracePoint(p)) => p.unload(),
        Some(Program::RawTracePoint(p)) => p.unload(),
        _ => Ok(()),
    };
    if let Err(e) = result {
        error!(program = name, error = %chain(&e), "unloading a kernel probe failed");
    }
}

/// Detaches every link of a raw tracepoint program that attached at load, keeping it loaded:
/// the program is unloaded and loaded again (verified a second time). `Loaded` on success.
pub(super) fn detach_keep_loaded(ebpf: &mut Ebpf, name: &str) -> ProgramState {
    let result = match ebpf.program_mut(name) {
        Some(Program::RawTracePoint(p)) => p
            .unload()
            .and_then(|()| p.load())
            .map_err(|e| format!("reload: {}", chain(&e))),
        _ => Err("not a raw tracepoint program".to_owned()),
    };
    match result {
        Ok(()) => ProgramState::Loaded,
        Err(reason) => ProgramState::Failed { reason },
    }
}

/// The memory push's programs, known to attach, are detached until a memory threshold is near
/// (see `switch`): `Loaded` both, or `Failed` both.
pub(super) fn detach_mem_push(
    ebpf: &mut Ebpf,
    states: &mut std::collections::BTreeMap<&'static str, ProgramState>,
) {
    const NAMES: [&str; 2] = [prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE];
    for name in NAMES {
        if states.get(name).is_some_and(ProgramState::is_attached) {
            let state = detach_keep_loaded(ebpf, name);
            states.insert(name, state);
        }
    }
    if NAMES
        .iter()
        .all(|n| states.get(n) == Some(&ProgramState::Loaded))
    {
        return;
    }
    for name in NAMES {
        if states.get(name) == Some(&ProgramState::Loaded) {
            unload(ebpf, name);
            states.insert(
                name,
                ProgramState::Failed {
                    reason: "group mem_push partner did not load".to_owned(),
                },
            );
        }
    }
}

/// Attaches a loaded raw tracepoint program of the object; the link id detaches it.
pub(super) fn attach_loaded(
    ebpf: &mut Ebpf,
    spec: &ProgramSpec,
) -> Result<RawTracePointLinkId, String> {
    match (spec.attach, ebpf.program_mut(spec.name)) {
        (Attach::RawTracePoint { name }, Some(Program::RawTracePoint(p))) => p
            .attach(name)
            .map_err(|e| format!("attach {}: {}", spec.name, chain(&e))),
        _ => Err(format!("{} is not a raw tracepoint program", spec.name)),
    }
}

/// Takes a raw tracepoint program's link out of the object: dropping it detaches the program
/// (which may wait for an RCU grace period, so it is done outside any lock).
pub(super) fn take_link(
    ebpf: &mut Ebpf,
    name: &str,
    id: RawTracePointLinkId,
) -> Result<RawTracePointLink, String> {
    match ebpf.program_mut(name) {
        Some(Program::RawTracePoint(p)) => p
            .take_link(id)
            .map_err(|e| format!("detach {name}: {}", chain(&e))),
        _ => Err(format!("{name} is not a raw tracepoint program")),
    }
}
