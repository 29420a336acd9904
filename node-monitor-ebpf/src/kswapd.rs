//! kswapd wake-ups: `mm_vmscan_wakeup_kswapd` fires in `wakeup_kswapd()` (mm/vmscan.c) only when
//! an allocation found a node below its low watermark and its kswapd asleep, so it marks the
//! start of background reclaim on that node. Rate-limited per node in the kernel: within the
//! configured minimum interval wake-ups are only counted, and the next event carries how many were
//! withheld.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_monitor_common::{
    config::kswapd_tp,
    counters,
    event::{EventKind, KswapdWake},
    logic::{kswapd_slot, rate_limit_allows},
};

use crate::{
    maps::KSWAPD,
    util::{config, count, emit, layout, now_ns, shared, tp_field},
};

#[tracepoint(category = "vmscan", name = "mm_vmscan_wakeup_kswapd")]
pub fn kswapd_wake(ctx: TracePointContext) -> u32 {
    let (Some(l), Some(cfg)) = (layout(kswapd_tp::SLOT.index), config()) else {
        return 0;
    };
    let Some(nid) = tp_field(&ctx, &l.fields[kswapd_tp::NID]) else {
        return 0;
    };
    let nid = nid as i32;
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
            zid: tp_field(&ctx, &l.fields[kswapd_tp::ZID]).map_or(-1, |v| v as i32),
            order: tp_field(&ctx, &l.fields[kswapd_tp::ORDER]).map_or(-1, |v| v as i32),
            suppressed: suppressed.min(u32::MAX as u64) as u32,
            gfp_flags: tp_field(&ctx, &l.fields[kswapd_tp::GFP_FLAGS]).unwrap_or(0),
        },
    );
    0
}
