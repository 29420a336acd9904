//! Attaching and unloading one program.
use aya::{Ebpf, programs::Program};
use tracing::error;

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
/// (the OOM program) do not, and keep working.
pub(super) fn tracepoint_denied_hint(error: &str, paranoid: Option<i32>) -> String {
    match paranoid {
        Some(level) if level > 2 && error.contains("Permission denied") => format!(
            " (kernel.perf_event_paranoid is {level}: this kernel lets only CAP_SYS_ADMIN open \
             perf events; set kernel.perf_event_paranoid=2 on the node, see docs/install.md)"
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
