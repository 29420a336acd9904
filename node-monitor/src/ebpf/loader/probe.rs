//! Probing the kernel: what it offers the programs, read before the plan.
use std::os::unix::ffi::OsStrExt as _;

use tracing::warn;

use crate::ebpf::{
    ProbeConfig,
    btf::Btf,
    policy::{self, Attach, Capabilities, PROGRAMS},
    tracefs,
};

/// What the running kernel offers the programs: its release, BTF (offsets and raw tracepoint
/// prototypes) and tracefs (tracepoint formats).
pub(super) fn probe_capabilities(config: &ProbeConfig) -> Capabilities {
    let mut caps = Capabilities {
        kernel: nix::sys::utsname::uname().ok().and_then(|u| {
            std::str::from_utf8(u.release().as_bytes())
                .ok()
                .and_then(policy::parse_kernel_release)
        }),
        ..Capabilities::default()
    };

    caps.task_offsets = Some(match std::fs::read(&config.btf_path) {
        Err(e) => Err(format!("read {}: {e}", config.btf_path.display())),
        Ok(bytes) => match Btf::parse(&bytes) {
            Err(e) => Err(format!("parse {}: {e}", config.btf_path.display())),
            Ok(btf) => {
                for spec in PROGRAMS {
                    if let Attach::RawTracePoint { name } = spec.attach
                        && let Some(args) = btf.raw_tracepoint_args(name)
                    {
                        caps.raw_tracepoints.insert(name.to_owned(), args);
                    }
                }
                caps.caller_offsets = Some(btf.caller_offsets().map_err(|e| e.to_string()));
                let offsets = btf.task_offsets().map_err(|e| e.to_string());
                if let Ok(o) = &offsets
                    && o.memory_valid == 0
                    && let Err(e) = btf.memory_offsets()
                {
                    warn!(error = %e, "oom victim memory figures unavailable from BTF");
                }
                offsets
            }
        },
    });

    let tracefs = match tracefs::find() {
        Some(p) => Ok(p),
        None if config.mount_tracefs => tracefs::mount().map_err(|e| {
            format!("not mounted, and mounting it at /sys/kernel/tracing failed: {e}")
        }),
        None => Err("not mounted (mounting disabled)".to_owned()),
    };
    match tracefs {
        Err(e) => caps.tracefs_error = Some(e),
        Ok(root) => {
            for spec in PROGRAMS {
                if let Attach::TracePoint { category, name } = spec.attach {
                    caps.tracepoints.insert(
                        format!("{category}/{name}"),
                        tracefs::read_format(&root, category, name),
                    );
                }
            }
        }
    }
    caps
}
