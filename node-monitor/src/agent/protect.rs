//! Keeps the agent responsive under the memory pressure it exists to handle: its pages locked in
//! RAM (no major faults while the node thrashes) and an `oom_score_adj` that keeps the kernel OOM
//! killer off it. Each step degrades with a warning when not permitted; none is fatal.
use std::{fs, io};

use tracing::{info, warn};

/// The kubelet gives itself -999 (pkg/kubelet/qos/policy.go `KubeletOOMScoreAdj`); node-critical
/// DaemonSet pods get -997 (Guaranteed). The agent sits just above the kubelet.
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -998;

/// glibc's allocation threshold above which a block gets its own mapping (its default).
const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Keeps large, short-lived buffers (a pod list's body, the kernel's BTF) out of glibc's arenas.
/// By default glibc raises its mmap threshold each time such a block is freed, so the next ones
/// come from an arena, which then keeps the pages; under `mlockall` they stay resident and charged
/// to the container for the agent's life. A fixed threshold gives every large block its own
/// mapping, returned to the kernel when freed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets glibc's allocator parameters; no allocation is touched.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
        // SAFETY: as above.
        let one_arena = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if set != 1 || one_arena != 1 {
            warn!(
                "could not fix the allocator's mmap threshold; freed start-up memory may stay resident"
            );
        }
    }
}

/// Lowers `oom_score_adj` at once, and returns what is achieved. Memory is locked later, by
/// [`lock_memory`], once start-up has given back what it used.
pub fn protect_self(oom_score_adj: i32) -> Option<i32> {
    match fs::write("/proc/self/oom_score_adj", oom_score_adj.to_string()) {
        Ok(()) => {
            info!(oom_score_adj, "oom_score_adj set");
            Some(oom_score_adj)
        }
        Err(e) => {
            warn!(oom_score_adj, error = %e, "could not lower oom_score_adj (needs CAP_SYS_RESOURCE)");
            None
        }
    }
}

/// Locks current and future pages (`mlockall`). Called once start-up is over and its heap given
/// back ([`super::release_startup_heap`]): glibc cannot return memory from a locked mapping, so
/// locking first would keep every page start-up ever used (the kernel's BTF, parsed and freed)
/// resident and charged to the container.
pub fn lock_memory() -> bool {
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
