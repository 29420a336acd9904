//! The memory push: `kmem/mm_page_alloc` and `kmem/mm_page_free` keep a per-CPU net page count
//! (allocations add `1 << order`, frees subtract it). When one CPU's growth since its last report
//! reaches the batch the agent wrote (`mem_push::BATCH`), that CPU's count is reset and a small
//! record goes to a ring buffer of its own with a forced wake-up, at most one per configured
//! interval over all CPUs (a churning node cannot flood the agent). A batch of 0 disarms: both
//! programs then return after one map lookup. The count is only a trigger: the agent re-reads
//! memory and decides on what it reads.
//!
//! Raw tracepoints: `mm_page_alloc` passes `(struct page *page, unsigned int order, gfp_t
//! gfp_flags, int migratetype)`, `mm_page_free` `(struct page *page, unsigned int order)`, each
//! argument in a 64-bit slot (the loader checks the prototypes against the kernel's BTF). No perf
//! event is opened, so Debian's and Ubuntu's `perf_event_paranoid` above 2 does not stop them.
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP, helpers::bpf_get_smp_processor_id, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use node_monitor_common::{
    counters,
    logic::{MemPushWake, mem_push, mem_push_step, rate_limit_allows},
};

use crate::{
    maps::{MEM_NET, MEM_PUSH, MEM_WAKE},
    util::{count, now_ns, shared},
};

#[raw_tracepoint(tracepoint = "mm_page_alloc")]
pub fn mem_push_alloc(ctx: RawTracePointContext) -> u32 {
    let batch = armed_batch();
    if batch == 0 {
        return 0;
    }
    // A failed allocation passes no page.
    if ctx.arg::<u64>(0) == 0 {
        return 0;
    }
    account(order(&ctx), true, batch);
    0
}

#[raw_tracepoint(tracepoint = "mm_page_free")]
pub fn mem_push_free(ctx: RawTracePointContext) -> u32 {
    let batch = armed_batch();
    if batch == 0 {
        return 0;
    }
    account(order(&ctx), false, batch);
    0
}

/// The `unsigned int order` both tracepoints pass second.
#[inline(always)]
fn order(ctx: &RawTracePointContext) -> u64 {
    ctx.arg::<u64>(1) & u64::from(u32::MAX)
}

/// The batch in pages, 0 when disarmed.
#[inline(always)]
fn armed_batch() -> u64 {
    MEM_PUSH.get(mem_push::BATCH).copied().unwrap_or(0)
}

#[inline(always)]
fn account(order: u64, grow: bool, batch: u64) {
    let Some(net) = MEM_NET.get_ptr_mut(0) else {
        return;
    };
    let pages = 1i64 << (order & 31);
    let batch = batch.min(i64::MAX as u64) as i64;
    // Per-CPU value, and tracing programs do not nest on one CPU: plain accesses.
    // SAFETY: `net` points to this CPU's live map value.
    let (n, report) = mem_push_step(unsafe { *net }, pages, grow, batch);
    if !report {
        unsafe { *net = n };
        return;
    }
    let (Some(last_p), Some(suppressed_p), Some(min)) = (
        MEM_PUSH.get_ptr_mut(mem_push::LAST_EMIT),
        MEM_PUSH.get_ptr_mut(mem_push::SUPPRESSED),
        MEM_PUSH.get(mem_push::MIN_INTERVAL),
    ) else {
        return;
    };
    let now = now_ns();
    // SAFETY (all `shared` calls below): the pointers are live values of the array map. Plain
    // stores (see `util::shared`): two CPUs reporting in the same instant may both send.
    if !rate_limit_allows(unsafe { shared::load(last_p) }, now, *min) {
        // Keep the count: the next allocation on this CPU after the interval reports it.
        unsafe {
            *net = n;
            shared::add(suppressed_p, 1);
        }
        count(counters::MEM_PUSH_SUPPRESSED);
        return;
    }
    let suppressed = unsafe {
        *net = 0;
        shared::store(last_p, now);
        let s = shared::load(suppressed_p);
        shared::store(suppressed_p, 0);
        s
    };
    let sent = match MEM_WAKE.reserve::<MemPushWake>(0) {
        Some(mut entry) => {
            entry.write(MemPushWake {
                ts_ns: now,
                net_pages: n,
                batch_pages: batch as u64,
                // SAFETY: no preconditions.
                cpu: unsafe { bpf_get_smp_processor_id() },
                suppressed: suppressed.min(u32::MAX as u64) as u32,
            });
            entry.submit(BPF_RB_FORCE_WAKEUP as u64);
            true
        }
        None => false,
    };
    count(if sent {
        counters::MEM_PUSH_WAKES
    } else {
        counters::MEM_PUSH_DROPS
    });
}
