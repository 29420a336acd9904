//! Reclaim stalls: time tasks spend in direct reclaim (`try_to_free_pages()`, node-level
//! shortage) and memcg reclaim (`try_to_free_mem_cgroup_pages()`, a cgroup at its limit), both
//! synchronous in the allocating task (mm/vmscan.c). Each begin/end pair is one episode; episodes
//! are summed per cgroup (the task's cgroup v2 id when it began) and flavor in tumbling windows,
//! and one event is sent per window once the sum reaches the budget, so heavy pressure costs the
//! ring buffer one record per cgroup and window.
//!
//! `mm_vmscan_memcg_softlimit_reclaim_*` are not traced: soft-limit reclaim runs nested inside
//! kswapd's and direct reclaim's node walk (`mem_cgroup_soft_limit_reclaim()` from
//! `shrink_zones()` / `balance_pgdat()`), so its time is already inside a direct episode or is
//! kswapd's own (not a stall of any task).
//!
//! Raw tracepoints (`BPF_RAW_TRACEPOINT_OPEN`): no perf event is opened, so a kernel whose
//! `perf_event_paranoid` admits only CAP_SYS_ADMIN to perf events (Debian's and Ubuntu's above 2)
//! still runs them. The programs read none of the tracepoints' arguments.
//!
//! The per-task record also remembers the flavor of the task's last reclaim: the OOM probe asks
//! for it to tell a memcg OOM from a global one (see `oom_scope` in node-monitor-common).
use aya_ebpf::{bindings::BPF_NOEXIST, macros::raw_tracepoint, programs::RawTracePointContext};
use aya_log_ebpf::debug;
use node_monitor_common::{
    counters,
    event::{EventKind, ReclaimStall},
    logic::{
        NO_RECLAIM_SEEN, ReclaimFlavor, ReclaimTask, StallKey, StallWindow, budget_exceeded,
        window_expired,
    },
};

use crate::{
    maps::{RECLAIM_TASKS, STALLS},
    util::{config, count, current_cgroup_id, current_tid, emit, now_ns, shared},
};

#[raw_tracepoint(tracepoint = "mm_vmscan_direct_reclaim_begin")]
pub fn direct_rcl_beg(_ctx: RawTracePointContext) -> u32 {
    begin(ReclaimFlavor::Direct);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_direct_reclaim_end")]
pub fn direct_rcl_end(ctx: RawTracePointContext) -> u32 {
    end(&ctx, ReclaimFlavor::Direct);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_memcg_reclaim_begin")]
pub fn memcg_rcl_beg(_ctx: RawTracePointContext) -> u32 {
    begin(ReclaimFlavor::Memcg);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_memcg_reclaim_end")]
pub fn memcg_rcl_end(ctx: RawTracePointContext) -> u32 {
    end(&ctx, ReclaimFlavor::Memcg);
    0
}

/// The flavor of the last reclaim the current task began, for the OOM probe.
#[inline(always)]
pub fn last_reclaim_flavor() -> u32 {
    // SAFETY: the value is only read; a concurrent update of another task's entry is harmless.
    unsafe { RECLAIM_TASKS.get(&current_tid()) }.map_or(NO_RECLAIM_SEEN, |t| t.last_flavor)
}

#[inline(always)]
fn begin(flavor: ReclaimFlavor) {
    let tid = current_tid();
    let (now, cgroup_id) = (now_ns(), current_cgroup_id());
    // A task that reclaims once usually reclaims again: update its entry in place, which costs a
    // lookup, instead of an LRU insert, which takes a node from the free list every time.
    if let Some(task) = RECLAIM_TASKS.get_ptr_mut(&tid) {
        // SAFETY: the entry is keyed by the current task's id; only this task writes it.
        unsafe {
            (*task).start_ns = now;
            (*task).cgroup_id = cgroup_id;
            (*task).last_flavor = flavor as u32;
        }
        return;
    }
    let task = ReclaimTask {
        start_ns: now,
        cgroup_id,
        last_flavor: flavor as u32,
        _pad: 0,
    };
    if RECLAIM_TASKS.insert(&tid, &task, 0).is_err() {
        count(counters::MAP_ERRORS);
    }
}

#[inline(always)]
fn end(ctx: &RawTracePointContext, flavor: ReclaimFlavor) {
    let Some(task) = RECLAIM_TASKS.get_ptr_mut(&current_tid()) else {
        count(counters::RECLAIM_UNMATCHED);
        return;
    };
    // SAFETY: the entry belongs to the current task; only this task writes it.
    let (start, cgroup_id, last) =
        unsafe { ((*task).start_ns, (*task).cgroup_id, (*task).last_flavor) };
    if start == 0 || last != flavor as u32 {
        count(counters::RECLAIM_UNMATCHED);
        return;
    }
    // SAFETY: as above.
    unsafe { (*task).start_ns = 0 };
    let now = now_ns();
    count(counters::RECLAIM_EPISODES);
    account(ctx, cgroup_id, flavor, now, now.saturating_sub(start));
}

/// Adds one episode to its cgroup's window and emits when the window's sum reaches the budget.
/// Several CPUs may update one window at once: the sums are atomic adds; the window reset and the
/// `emitted` flag are plain stores (no compare-exchange on the baseline BPF instruction set, see
/// `util::shared`), so two CPUs crossing the budget in the same instant may both send the
/// window's event, and an episode racing a reset may be lost from the new window.
#[inline(always)]
fn account(
    ctx: &RawTracePointContext,
    cgroup_id: u64,
    flavor: ReclaimFlavor,
    now: u64,
    stall: u64,
) {
    let Some(cfg) = config() else {
        return;
    };
    let key = StallKey {
        cgroup_id,
        flavor: flavor as u32,
        _pad: 0,
    };
    let w = match STALLS.get_ptr_mut(&key) {
        Some(w) => w,
        None => {
            let fresh = StallWindow {
                start_ns: now,
                ..StallWindow::default()
            };
            // Another CPU may create it first (BPF_NOEXIST then fails): look it up again either way.
            let _ = STALLS.insert(&key, &fresh, BPF_NOEXIST.into());
            match STALLS.get_ptr_mut(&key) {
                Some(w) => w,
                None => {
                    count(counters::MAP_ERRORS);
                    return;
                }
            }
        }
    };
    // SAFETY: `w` points to a live map value; fields are only accessed through `shared`.
    let (start_p, stall_p, count_p, emitted_p) = unsafe {
        (
            &raw mut (*w).start_ns,
            &raw mut (*w).stall_ns,
            &raw mut (*w).count,
            &raw mut (*w).emitted,
        )
    };
    // SAFETY (all `shared` calls below): the pointers are fields of the live map value `w`.
    let start = unsafe { shared::load(start_p) };
    if window_expired(start, now, cfg.stall_window_ns) {
        unsafe {
            shared::store(start_p, now);
            shared::store(stall_p, 0);
            shared::store(count_p, 0);
            shared::store(emitted_p, 0);
        }
    }
    unsafe {
        shared::add(stall_p, stall);
        shared::add(count_p, 1);
    }
    let total = unsafe { shared::load(stall_p) };
    let episodes = unsafe { shared::load(count_p) };
    if budget_exceeded(total, cfg.stall_budget_ns) && unsafe { shared::load(emitted_p) } == 0 {
        unsafe { shared::store(emitted_p, 1) };
        debug!(
            ctx,
            "reclaim stall cgroup {} flavor {}: {} ns in {} episodes",
            cgroup_id,
            flavor as u32,
            total,
            episodes
        );
        emit(
            EventKind::ReclaimStall,
            ReclaimStall {
                cgroup_id,
                stall_ns: total,
                window_ns: cfg.stall_window_ns,
                window_start_ns: unsafe { shared::load(start_p) },
                count: episodes as u32,
                flavor: flavor as u32,
            },
        );
    }
}
