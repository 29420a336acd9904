//! Probing the kernel: what it offers the programs, read before the plan.
use std::os::unix::ffi::OsStrExt as _;

use tracing::warn;

use crate::ebpf::{
    ProbeConfig,
    btf::Btf,
    policy::{self, Attach, Capabilities, PROGRAMS},
    tracefs,
};

/// What the running kernel offers the programs: its release, BTF (the target of the CO-RE
/// relocations, parsed by aya, and the raw tracepoint prototypes) and tracefs (tracepoint
/// formats). The kernel BTF comes back too, for the loader to relocate against.
pub(super) fn probe_capabilities(config: &ProbeConfig) -> (Capabilities, Option<aya::Btf>) {
    let mut caps = Capabilities {
        kernel: nix::sys::utsname::uname().ok().and_then(|u| {
            std::str::from_utf8(u.release().as_bytes())
                .ok()
                .and_then(policy::parse_kernel_release)
        }),
        ..Capabilities::default()
    };
    let path = config.btf_path.display();
    let target = match std::fs::read(&config.btf_path) {
        Err(e) => Err(format!("read {path}: {e}")),
        Ok(bytes) => aya::Btf::parse(&bytes, aya::Endianness::default())
            .map_err(|e| format!("parse {path}: {e}"))
            .inspect(|_| raw_tracepoints(&mut caps, &bytes)),
    };
    caps.kernel_btf = Some(target.as_ref().map(|_| ()).map_err(Clone::clone));
    (tracepoints(caps, config), target.ok())
}

/// The prototypes of the raw tracepoints the table names, from the kernel's BTF.
fn raw_tracepoints(caps: &mut Capabilities, bytes: &[u8]) {
    match Btf::parse(bytes) {
        Err(e) => warn!(error = %e, "raw tracepoint prototypes unreadable from the kernel BTF"),
        Ok(btf) => {
            for spec in PROGRAMS {
                if let Attach::RawTracePoint { name } = spec.attach
                    && let Some(args) = btf.raw_tracepoint_args(name)
                {
                    caps.raw_tracepoints.insert(name.to_owned(), args);
                }
            }
        }
    }
}

fn tracepoints(mut caps: Capabilities, config: &ProbeConfig) -> Capabilities {
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
