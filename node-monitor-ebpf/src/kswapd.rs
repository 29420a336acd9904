//! kswapd wake-ups: `mm_vmscan_wakeup_kswapd` fires in `wakeup_kswapd()` (mm/vmscan.c) only when
//! an allocation found a node below its low watermark and its kswapd asleep, so it marks the
//! start of background reclaim on that node. Rate-limited per node in the kernel: within the
//! configured minimum interval wake-ups are only counted, and the next event carries how many were
//! withheld. A raw tracepoint: `TP_PROTO(int nid, int zid, int order, gfp_t gfp_flags)`, each
//! argument in a 64-bit slot (the loader checks the prototype against the kernel's BTF).
use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use node_monitor_common::{
    counters,
    event::{EventKind, KswapdWake},
    logic::{kswapd_slot, rate_limit_allows},
};

use crate::{
    maps::KSWAPD,
    util::{config, count, emit, now_ns, shared},
};

#[raw_tracepoint(tracepoint = "mm_vmscan_wakeup_kswapd")]
pub fn kswapd_wake(ctx: RawTracePointContext) -> u32 {
    let Some(cfg) = config() else {
        return 0;
    };
    // `int` arguments: the low 32 bits of their slots.
    let nid = ctx.arg::<u64>(0) as i32;
    let Some(slot) = KSWAPD.get_ptr_mut(kswapd_slot(nid)) else {
        return 0;
    };
    // SAFETY: `slot` points to a live array value; its fields are only accessed through `shared`.
    let (last_p, suppressed_p) =
        unsafe { (&raw mut (*slot).last_emit_ns, &raw mut (*slot).suppressed) };
    let now = now_ns();
    // SAFETY (all `shared` calls below): the pointers are fields of the live map value `slot`.
    // Plain stores (see `util::shared`): two CPUs waking kswapd on one node in the same instant
    // may both send an event, and a wake-up counted while the count is reset may be lost.
    let last = unsafe { shared::load(last_p) };
    if !rate_limit_allows(last, now, cfg.kswapd_min_interval_ns) {
        unsafe { shared::add(suppressed_p, 1) };
        count(counters::KSWAPD_SUPPRESSED);
        return 0;
    }
    let suppressed = unsafe {
        shared::store(last_p, now);
        let n = shared::load(suppressed_p);
        shared::store(suppressed_p, 0);
        n
    };
    emit(
        EventKind::KswapdWake,
        KswapdWake {
            nid,
            zid: ctx.arg::<u64>(1) as i32,
            order: ctx.arg::<u64>(2) as i32,
            suppressed: suppressed.min(u32::MAX as u64) as u32,
            // `gfp_t` is an `unsigned int`.
            gfp_flags: ctx.arg::<u64>(3) & u64::from(u32::MAX),
        },
    );
    0
}
