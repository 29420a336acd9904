//! Keeps the agent responsive under the memory pressure it exists to handle: its pages locked in
//! RAM (no major faults while the node thrashes) and an `oom_score_adj` that keeps the kernel OOM
//! killer off it. Each step degrades with a warning when not permitted; none is fatal.
use std::{fs, io};

use tracing::{info, warn};

/// The kubelet gives itself -999 (pkg/kubelet/qos/policy.go `KubeletOOMScoreAdj`); node-critical
/// DaemonSet pods get -997 (Guaranteed). The agent sits just above the kubelet.
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -998;

/// What was achieved, for logs and readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    pub memory_locked: bool,
    pub oom_score_adj: Option<i32>,
}

/// Locks current and future pages and lowers `oom_score_adj`.
pub fn protect_self(oom_score_adj: i32, lock_memory: bool) -> Protection {
    let memory_locked = lock_memory && lock_all();
    let adj = match fs::write("/proc/self/oom_score_adj", oom_score_adj.to_string()) {
        Ok(()) => {
            info!(oom_score_adj, "oom_score_adj set");
            Some(oom_score_adj)
        }
        Err(e) => {
            warn!(oom_score_adj, error = %e, "could not lower oom_score_adj (needs CAP_SYS_RESOURCE)");
            None
        }
    };
    Protection {
        memory_locked,
        oom_score_adj: adj,
    }
}

fn lock_all() -> bool {
    // SAFETY: mlockall takes flags only and touches no Rust-managed memory.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if rc == 0 {
        info!("memory locked (mlockall)");
        true
    } else {
        let e = io::Error::last_os_error();
        warn!(error = %e, "could not lock memory (needs CAP_IPC_LOCK or a memlock rlimit)");
        false
    }
}
