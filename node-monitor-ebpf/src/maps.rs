//! The maps every program shares. Names and value types come from node-monitor-common.
use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
};
use node_monitor_common::{
    config::{ProbeConfigRaw, TP_SLOTS, TpLayout},
    counters,
    logic::{
        KSWAPD_NODES, KswapdSlot, REBOOT_GATES, RebootSlot, ReclaimTask, StallKey, StallWindow,
        mem_push,
    },
};

/// The one ring buffer for every probe's records. The agent may resize it at load.
#[map(name = "NM_EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// The last gasp's own ring buffer: only the reboot program's `allowed` requests, so the agent's
/// last-gasp thread wakes for nothing else (`names::GASP_MAP`).
#[map(name = "NM_GASP")]
pub static GASP: RingBuf = RingBuf::with_byte_size(4096, 0);

#[map(name = "NM_COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counters::COUNT, 0);

#[map(name = "NM_CONFIG")]
pub static CONFIG: Array<ProbeConfigRaw> = Array::with_max_entries(1, 0);

#[map(name = "NM_TP_LAYOUT")]
pub static TP_LAYOUT: Array<TpLayout> = Array::with_max_entries(TP_SLOTS, 0);

/// Sized for the tasks that can be in reclaim at once plus the recently reclaiming ones whose
/// last flavor the OOM probe may still ask for; LRU eviction keeps it bounded.
#[map(name = "NM_RCL_TASKS")]
pub static RECLAIM_TASKS: LruHashMap<u32, ReclaimTask> = LruHashMap::with_max_entries(16384, 0);

#[map(name = "NM_STALLS")]
pub static STALLS: LruHashMap<StallKey, StallWindow> = LruHashMap::with_max_entries(8192, 0);

#[map(name = "NM_KSWAPD")]
pub static KSWAPD: Array<KswapdSlot> = Array::with_max_entries(KSWAPD_NODES, 0);

#[map(name = "NM_REBOOT")]
pub static REBOOT: Array<RebootSlot> = Array::with_max_entries(REBOOT_GATES, 0);

/// The memory push's batch, rate limit and state (`node_monitor_common::logic::mem_push`).
#[map(name = "NM_MEM_PUSH")]
pub static MEM_PUSH: Array<u64> = Array::with_max_entries(mem_push::SLOTS, 0);

/// Each CPU's net page growth since its last memory push report.
#[map(name = "NM_MEM_NET")]
pub static MEM_NET: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

/// The memory push's wake records alone, so that its reader wakes for nothing else.
#[map(name = "NM_MEM_WAKE")]
pub static MEM_WAKE: RingBuf = RingBuf::with_byte_size(4096, 0);
