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

/// Locks the agent's memory, in two parts, once start-up is over and its heap given back
/// ([`super::release_startup_heap`]: glibc cannot return memory from a locked mapping, so locking
/// first would keep every page start-up ever used resident and charged to the container):
///
/// - `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`: every page the agent has touched or
///   touches later stays resident; pages never touched (most of each thread's stack, the parts of
///   the shared libraries it never calls) are not made resident for nothing. Kernels before 4.4
///   lack `MCL_ONFAULT`: everything is then locked and populated, as `mlockall` always did;
/// - the agent's own executable (its code and read-only data) populated and locked in full, so
///   that no code path of the agent, the ones only pressure runs included (ranking, the eviction
///   request), waits on a read from disk while the node thrashes.
///
/// Returns whether the memory is locked.
pub fn lock_memory() -> bool {
    // SAFETY: mlockall takes flags only and touches no Rust-managed memory.
    let mut rc =
        unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    let mut on_fault = true;
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
        on_fault = false;
    }
    if rc != 0 {
        let e = io::Error::last_os_error();
        warn!(error = %e, "could not lock memory (needs CAP_IPC_LOCK or a memlock rlimit)");
        return false;
    }
    let executable = if on_fault { lock_executable() } else { Ok(0) };
    match executable {
        Ok(bytes) => info!(
            on_fault,
            executable_bytes = bytes,
            "memory locked (mlockall)"
        ),
        Err(e) => warn!(on_fault, error = %e,
            "memory locked as touched, but the agent's executable could not be locked in full"),
    }
    true
}

/// Populates and locks every read-only mapping of the agent's own executable (code, read-only
/// data). Returns the bytes locked.
fn lock_executable() -> io::Result<u64> {
    let exe = fs::read_link("/proc/self/exe")?;
    let maps = fs::read_to_string("/proc/self/maps")?;
    let mut locked = 0;
    for (start, end) in executable_ranges(&maps, &exe.to_string_lossy()) {
        let len = end - start;
        // SAFETY: the range is a mapping of this process, read from /proc/self/maps just now;
        // mlock only changes its residency, never its contents.
        if unsafe { libc::mlock(start as *const libc::c_void, len as usize) } != 0 {
            return Err(io::Error::last_os_error());
        }
        locked += len;
    }
    Ok(locked)
}

/// The address ranges of `/proc/self/maps` that map `path` without write permission.
fn executable_ranges(maps: &str, path: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            // offset, device, inode, then the path (which may hold spaces).
            let name = fields.skip(3).collect::<Vec<_>>().join(" ");
            if name != path || perms.contains('w') || !perms.starts_with('r') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executables_read_only_mappings_are_found() {
        let maps = "\
5581c7a00000-5581c7c00000 r--p 00000000 fd:01 1234 /usr/bin/node-monitor
5581c7c00000-5581c8600000 r-xp 00200000 fd:01 1234 /usr/bin/node-monitor
5581c8600000-5581c8700000 r--p 00c00000 fd:01 1234 /usr/bin/node-monitor
5581c8700000-5581c8710000 rw-p 00d00000 fd:01 1234 /usr/bin/node-monitor
5581c9000000-5581c9100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000200000 r-xp 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000300000-7f0000301000 r-xp 00000000 fd:01 1234 /usr/bin/node-monitor-other
7f0000400000-7f0000401000 ---p 00000000 fd:01 1234 /usr/bin/node-monitor
garbage line
";
        assert_eq!(
            executable_ranges(maps, "/usr/bin/node-monitor"),
            [
                (0x5581_c7a0_0000, 0x5581_c7c0_0000),
                (0x5581_c7c0_0000, 0x5581_c860_0000),
                (0x5581_c860_0000, 0x5581_c870_0000),
            ]
        );
        // A path with a space, as the kernel writes it.
        let spaced = "1000-2000 r-xp 00000000 fd:01 7 /opt/node monitor/bin\n";
        assert_eq!(
            executable_ranges(spaced, "/opt/node monitor/bin"),
            [(0x1000, 0x2000)]
        );
        assert!(executable_ranges(spaced, "/opt/node").is_empty());
    }
}
