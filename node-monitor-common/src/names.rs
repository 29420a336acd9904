//! Names the agent looks programs and maps up by. Kernel object names are cut at 15 bytes, so
//! these stay short.

/// The ring buffer every probe writes its records to.
pub const EVENTS_MAP: &str = "NM_EVENTS";
/// A small ring buffer for the last gasp alone: the reboot program's `allowed` requests, each
/// with a forced wake-up, read by the agent's dedicated last-gasp thread.
pub const GASP_MAP: &str = "NM_GASP";
/// Per-CPU `u64` counters (see [`crate::counters`]).
pub const COUNTERS_MAP: &str = "NM_COUNTERS";
/// `Array<ProbeConfigRaw>` with one entry.
pub const CONFIG_MAP: &str = "NM_CONFIG";
/// A read-only `u8` global: 1 when the loader relocated the CO-RE reads of kernel structs
/// against the running kernel's BTF, 0 when it had none (the programs then skip those reads).
pub const CORE_GLOBAL: &str = "NM_CORE";
/// `Array<TpLayout>` indexed by [`crate::config::TpSlot::index`].
pub const TP_LAYOUT_MAP: &str = "NM_TP_LAYOUT";
/// `LruHashMap<tid, ReclaimTask>`: reclaim in flight and the last reclaim flavor per task.
pub const RECLAIM_TASKS_MAP: &str = "NM_RCL_TASKS";
/// `LruHashMap<StallKey, StallWindow>`: stall accounting per cgroup and flavor.
pub const STALLS_MAP: &str = "NM_STALLS";
/// `Array<KswapdSlot>` indexed by NUMA node: the kswapd rate limit.
pub const KSWAPD_MAP: &str = "NM_KSWAPD";
/// `Array<RebootSlot>` indexed by reboot verdict: the reboot rate limit.
pub const REBOOT_MAP: &str = "NM_REBOOT";
/// `Array<u64>` of [`crate::logic::mem_push`] slots: the memory push's batch (written by the
/// agent to arm or disarm it), its rate limit and its state.
pub const MEM_PUSH_MAP: &str = "NM_MEM_PUSH";
/// `PerCpuArray<i64>` with one entry: each CPU's net page growth since its last report.
pub const MEM_NET_MAP: &str = "NM_MEM_NET";
/// A small ring buffer for the memory push's wake records alone ([`crate::logic::MemPushWake`]),
/// each submitted with a forced wake-up.
pub const MEM_PUSH_RING: &str = "NM_MEM_WAKE";

/// Program names (the functions in node-monitor-ebpf).
pub mod prog {
    /// raw_tracepoint `mark_victim`: the victim's task, read through CO-RE.
    pub const OOM_RAW: &str = "oom_victim_raw";
    /// raw_tracepoint `mark_victim` where it passes `(int pid)` (before the task was passed,
    /// e.g. 5.10): the victim's pid, and the trigger's cgroup. A raw tracepoint attaches through
    /// bpf(2) alone, so under `perf_event_paranoid` above 2 too, unlike [`OOM_TP`].
    pub const OOM_PID: &str = "oom_victim_pid";
    /// tracepoint `oom/mark_victim`: fallback when the raw programs cannot run.
    pub const OOM_TP: &str = "oom_victim_tp";
    pub const DIRECT_BEGIN: &str = "direct_rcl_beg";
    pub const DIRECT_END: &str = "direct_rcl_end";
    pub const MEMCG_BEGIN: &str = "memcg_rcl_beg";
    pub const MEMCG_END: &str = "memcg_rcl_end";
    pub const KSWAPD_WAKE: &str = "kswapd_wake";
    /// tracepoint `syscalls/sys_enter_reboot`: reboot(2) requests.
    pub const REBOOT: &str = "reboot_enter";
    /// raw_tracepoint `sys_enter`, filtered on reboot(2)'s number: fallback when the tracepoint
    /// cannot attach (a perf event, which Debian's and Ubuntu's kernels refuse without
    /// CAP_SYS_ADMIN when `kernel.perf_event_paranoid` is above 2).
    pub const REBOOT_RAW: &str = "reboot_raw";
    /// tracepoint `syscalls/sys_enter_getppid`: benchmark event generator, off by default.
    pub const SYNTHETIC: &str = "synthetic_evt";
    /// tracepoint `kmem/mm_page_alloc`: the memory push's per-CPU growth count.
    pub const MEM_PUSH_ALLOC: &str = "mem_push_alloc";
    /// tracepoint `kmem/mm_page_free`: the memory push's per-CPU growth count.
    pub const MEM_PUSH_FREE: &str = "mem_push_free";
}
