//! The kubelet's arithmetic for each signal, as pure functions of values already read.

use node_monitor_core::signals::SignalObservation;

use super::parse::MemoryLimit;

/// Working set = usage − inactive_file, clamped at 0, exactly as cadvisor computes it
/// (`container/libcontainer/handler.go` `setMemoryStats`: "if workingSet < inactive then 0").
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// `available = capacity − working_set` (pkg/kubelet/eviction/helpers.go
/// `makeSignalObservations`; cadvisor's `AvailableBytes = limit − workingSet`).
///
/// Computed in signed arithmetic: a working set above capacity (possible for a moment when a
/// cgroup limit is lowered under a running workload) gives a negative available, where the
/// kubelet's unsigned subtraction would wrap. A negative value meets every `<` threshold, which
/// is the truthful reading.
pub fn memory_observation(capacity: u64, working_set: u64) -> SignalObservation {
    let capacity = to_i64(capacity);
    SignalObservation {
        available: capacity.saturating_sub(to_i64(working_set)),
        capacity,
    }
}

/// The capacity of a non-root node cgroup: its memory limit, bounded by the machine's memory (a
/// limit above `MemTotal` can never be reached, so `MemTotal` is the truthful capacity, the same
/// value the kubelet uses for the root).
pub fn cgroup_capacity(limit: MemoryLimit, mem_total: u64) -> u64 {
    match limit {
        MemoryLimit::Bytes(b) => b.min(mem_total),
        MemoryLimit::Unlimited => mem_total,
    }
}

/// Whether a node cgroup's limit bounds its memory below the machine's. A limit at or above
/// `MemTotal` (or none) never binds: the cgroup then shares the machine's memory with everything
/// outside it, and only the machine's working set tells how much is left, which is what the
/// kubelet reads for the node whatever its `--cgroup-root` (the root container's stats,
/// pkg/kubelet/eviction/helpers.go `makeSignalObservations` from the summary's node stats).
pub fn limit_binds(limit: MemoryLimit, mem_total: u64) -> bool {
    matches!(limit, MemoryLimit::Bytes(b) if b < mem_total)
}

/// What `statvfs(2)` says about a filesystem, in the units cadvisor reads
/// (`fs/fs.go` `getVfsStats`: sizes in `f_frsize` units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    pub frsize: u64,
    pub blocks: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    /// `st_dev` of the path, to tell whether two paths share a filesystem.
    pub device: u64,
}

/// `*.available` (bytes: `f_bavail × f_frsize` of `f_blocks × f_frsize`) and `*.inodesFree`
/// (`f_ffree` of `f_files`). Filesystems without an inode limit report `f_files == 0` (btrfs,
/// some FUSE and network filesystems); they get no inode observation rather than a 0-of-0 one
/// that a percentage threshold would misread.
pub fn fs_observations(s: &FsStat) -> (SignalObservation, Option<SignalObservation>) {
    let bytes = SignalObservation {
        available: to_i64(s.blocks_available.saturating_mul(s.frsize)),
        capacity: to_i64(s.blocks.saturating_mul(s.frsize)),
    };
    let inodes = (s.files > 0).then(|| SignalObservation {
        available: to_i64(s.files_free),
        capacity: to_i64(s.files),
    });
    (bytes, inodes)
}

/// `pid.available = min(pid_max, threads-max) − tasks`, as pkg/kubelet/stats/pidlimit does: both
/// sysctls bound the number of tasks, the smaller wins; a sysctl that could not be read is left
/// out, and with neither there is no observation.
pub fn pid_observation(
    pid_max: Option<u64>,
    threads_max: Option<u64>,
    tasks: u64,
) -> Option<SignalObservation> {
    let max = match (pid_max, threads_max) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return None,
    };
    let max = to_i64(max);
    Some(SignalObservation {
        available: max.saturating_sub(to_i64(tasks)),
        capacity: max,
    })
}

/// Where a memory threshold must sit on `memory.usage_in_bytes` so the kernel notifies when the
/// working set reaches `capacity − threshold`: `capacity − threshold + outside`, where `outside`
/// is the page cache the working-set formula leaves out
/// ([`node_monitor_core::signals::file_outside_working_set`]): `inactive_file` with the
/// kubelet's formula (pkg/kubelet/eviction/memory_threshold_notifier.go `UpdateThreshold`),
/// plus the reclaimable active file pages with `memoryWorkingSet: reclaimable`.
pub fn memcg_usage_threshold(capacity: u64, available_threshold: u64, outside: u64) -> u64 {
    capacity
        .saturating_sub(available_threshold)
        .saturating_add(outside)
}

/// What the node can still allocate before the kernel must OOM-kill: the kernel's
/// `MemAvailable` (free memory above the low watermarks, plus the page cache and slab it can
/// reclaim), bounded by the node cgroup's headroom where that cgroup's limit binds. `None`
/// without `MemAvailable` (kernels before 3.14).
pub fn kernel_headroom(mem_available: Option<u64>, node_cgroup: Option<i64>) -> Option<i64> {
    let machine = to_i64(mem_available?);
    Some(node_cgroup.map_or(machine, |cgroup| machine.min(cgroup)))
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_set_is_clamped_at_zero() {
        let cases = [(100, 30, 70), (100, 100, 0), (30, 100, 0), (0, 0, 0)];
        for (usage, inactive, want) in cases {
            assert_eq!(working_set(usage, inactive), want, "{usage} - {inactive}");
        }
    }

    #[test]
    fn kernel_headroom_is_memavailable_bounded_by_a_binding_node_cgroup() {
        assert_eq!(kernel_headroom(None, Some(5)), None);
        assert_eq!(kernel_headroom(Some(800), None), Some(800));
        assert_eq!(kernel_headroom(Some(800), Some(300)), Some(300));
        assert_eq!(kernel_headroom(Some(800), Some(-20)), Some(-20));
        assert_eq!(kernel_headroom(Some(u64::MAX), None), Some(i64::MAX));
    }

    #[test]
    fn memory_available() {
        let cases = [
            // (capacity, working set, available)
            (1000, 300, 700),
            (1000, 1000, 0),
            (1000, 1200, -200),
            (u64::MAX, 0, i64::MAX),
        ];
        for (cap, ws, want) in cases {
            let o = memory_observation(cap, ws);
            assert_eq!(o.available, want, "{cap} {ws}");
            assert_eq!(o.capacity, to_i64(cap));
        }
    }

    #[test]
    fn capacity_of_a_node_cgroup() {
        let total = 16 << 30;
        assert_eq!(
            cgroup_capacity(MemoryLimit::Bytes(512 << 20), total),
            512 << 20
        );
        assert_eq!(cgroup_capacity(MemoryLimit::Bytes(64 << 30), total), total);
        assert_eq!(cgroup_capacity(MemoryLimit::Unlimited, total), total);
    }

    #[test]
    fn a_limit_binds_only_below_the_machine() {
        let total = 1 << 30;
        let cases = [
            (MemoryLimit::Bytes(512 << 20), true),
            (MemoryLimit::Bytes(total - 1), true),
            (MemoryLimit::Bytes(total), false),
            (MemoryLimit::Bytes(4 << 30), false),
            (MemoryLimit::Unlimited, false),
        ];
        for (limit, want) in cases {
            assert_eq!(limit_binds(limit, total), want, "{limit:?}");
        }
    }

    #[test]
    fn filesystems() {
        let s = FsStat {
            frsize: 4096,
            blocks: 1000,
            blocks_available: 250,
            files: 500,
            files_free: 100,
            device: 1,
        };
        let (bytes, inodes) = fs_observations(&s);
        assert_eq!(
            bytes,
            SignalObservation {
                available: 250 * 4096,
                capacity: 1000 * 4096
            }
        );
        assert_eq!(
            inodes,
            Some(SignalObservation {
                available: 100,
                capacity: 500
            })
        );
        let no_inodes = FsStat {
            files: 0,
            files_free: 0,
            ..s
        };
        assert_eq!(fs_observations(&no_inodes).1, None);
    }

    #[test]
    fn pids() {
        let obs = |a, b, t| pid_observation(a, b, t).map(|o| (o.available, o.capacity));
        assert_eq!(
            obs(Some(32768), Some(192_730), 86),
            Some((32768 - 86, 32768))
        );
        assert_eq!(
            obs(Some(4_194_304), Some(100_000), 1000),
            Some((99_000, 100_000))
        );
        assert_eq!(obs(None, Some(500), 10), Some((490, 500)));
        assert_eq!(obs(Some(500), None, 10), Some((490, 500)));
        assert_eq!(obs(None, None, 10), None);
        assert_eq!(obs(Some(10), None, 20), Some((-10, 10)));
    }

    #[test]
    fn memcg_threshold_level() {
        // 1 GiB capacity, evict below 100 MiB, 50 MiB inactive file: notify when usage reaches
        // 1024 − 100 + 50 MiB.
        assert_eq!(
            memcg_usage_threshold(1 << 30, 100 << 20, 50 << 20),
            (1024 - 100 + 50) << 20
        );
        assert_eq!(memcg_usage_threshold(100, 200, 7), 7);
    }
}
