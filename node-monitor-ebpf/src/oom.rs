//! OOM kills: `mark_victim` fires when the OOM killer has chosen a victim
//! (`__oom_kill_process()` → `mark_oom_victim()`, mm/oom_kill.c), in the context of the task
//! whose allocation or charge invoked the killer (the trigger), not of the victim. The envelope
//! therefore describes the trigger; the payload describes the victim.
//!
//! Two programs, one attached:
//! - `oom_victim_raw` (raw tracepoint, preferred): `TP_PROTO(struct task_struct *task, uid_t
//!   uid)` gives the victim's task, so the victim's own cgroup v2 id is read from
//!   `task->cgroups->dfl_cgrp->kn->id`, at offsets the agent resolved from the kernel's BTF.
//! - `oom_victim_tp` (tracepoint, fallback without BTF): the stable tracepoint fields (pid, comm,
//!   RSS figures, uid, oom_score_adj) at offsets parsed from its tracefs format; the victim's
//!   cgroup is then unknown and only the trigger's is reported.
use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::info;
use node_monitor_common::{
    TASK_COMM_LEN,
    config::oom_tp,
    event::{EventKind, OomKill, oom_flags},
};

use crate::{
    maps::TASK_OFFSETS,
    reclaim::last_reclaim_flavor,
    util::{config, emit, kread, layout, tp_field, tp_str},
};

const KIB: u64 = 1024;

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_victim_raw(ctx: RawTracePointContext) -> u32 {
    let task: u64 = ctx.arg(0);
    let uid: u64 = ctx.arg(1);
    let Some(o) = TASK_OFFSETS.get(0) else {
        return 0;
    };
    if o.valid == 0 || task == 0 {
        return 0;
    }
    let mut ev = empty();
    ev.flags = oom_flags::FROM_TASK | oom_flags::UID;
    ev.uid = uid as u32;

    if let Some(tid) = kread::<i32>(task, o.task_pid) {
        ev.victim_tid = tid as u32;
        ev.victim_pid = tid as u32;
    }
    if let Some(tgid) = kread::<i32>(task, o.task_tgid) {
        ev.victim_pid = tgid as u32;
        ev.flags |= oom_flags::VICTIM_TGID;
    }
    if let Some(comm) = kread::<[u8; TASK_COMM_LEN]>(task, o.task_comm) {
        ev.victim_comm = comm;
        ev.flags |= oom_flags::COMM;
    }
    if let Some(signal) = kread::<u64>(task, o.task_signal)
        && let Some(adj) = kread::<i16>(signal, o.signal_oom_score_adj)
    {
        ev.oom_score_adj = adj as i32;
        ev.flags |= oom_flags::SCORE_ADJ;
    }
    // task->cgroups->dfl_cgrp->kn->id: the id `bpf_get_current_cgroup_id()` would return in the
    // victim's own context (kernel/bpf/helpers.c, `cgroup_id()` in include/linux/cgroup.h).
    if let Some(cset) = kread::<u64>(task, o.task_cgroups)
        && let Some(cgrp) = kread::<u64>(cset, o.css_set_dfl_cgrp)
        && let Some(kn) = kread::<u64>(cgrp, o.cgroup_kn)
        && let Some(id) = kread::<u64>(kn, o.kernfs_node_id)
    {
        ev.victim_cgroup_id = id;
        ev.flags |= oom_flags::VICTIM_CGROUP;
    }
    if o.memory_valid != 0 {
        read_task_memory(task, o, &mut ev);
    }
    ev.trigger_reclaim = last_reclaim_flavor();
    info!(
        &ctx,
        "oom victim pid {} cgroup {} (trigger reclaim flavor {})",
        ev.victim_pid,
        ev.victim_cgroup_id,
        ev.trigger_reclaim
    );
    emit(EventKind::OomKill, ev);
    0
}

/// The same figures the tracepoint prints: `get_mm_counter()` (the counter's global value, as
/// `percpu_counter_read_positive()` gives it), `mm->total_vm`, `mm_pgtables_bytes()`.
#[inline(always)]
fn read_task_memory(task: u64, o: &node_monitor_common::config::TaskOffsets, ev: &mut OomKill) {
    let page = config().map_or(4096, |c| c.page_size);
    let Some(mm) = kread::<u64>(task, o.task_mm) else {
        return;
    };
    if mm == 0 {
        return;
    }
    let rss = |idx: u32| -> Option<u64> {
        let off = o.mm_rss_stat + idx * o.rss_stride + o.rss_count;
        kread::<i64>(mm, off).map(|v| if v < 0 { 0 } else { v as u64 * page })
    };
    // One read after another, leaving at the first failure. Matching all five `Option`s at once
    // let LLVM merge the failed reads' undefined payloads into one register and test the
    // discriminants together; the 6.1 verifier cannot prove that path dead and refuses the
    // program ("R1 !read_ok": a register clobbered by a helper call is read). Newer verifiers
    // prune it, so only an older kernel shows it (tests/tests/vm_cgroup2.rs).
    let Some(total_vm) = kread::<u64>(mm, o.mm_total_vm) else {
        return;
    };
    let Some(pgtables) = kread::<i64>(mm, o.mm_pgtables_bytes) else {
        return;
    };
    let Some(anon) = rss(o.rss_anon_idx) else {
        return;
    };
    let Some(file) = rss(o.rss_file_idx) else {
        return;
    };
    let Some(shmem) = rss(o.rss_shmem_idx) else {
        return;
    };
    ev.total_vm_bytes = total_vm * page;
    ev.pgtables_bytes = if pgtables < 0 { 0 } else { pgtables as u64 };
    ev.anon_rss_bytes = anon;
    ev.file_rss_bytes = file;
    ev.shmem_rss_bytes = shmem;
    ev.flags |= oom_flags::MEMORY;
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_victim_tp(ctx: TracePointContext) -> u32 {
    let Some(l) = layout(oom_tp::SLOT.index) else {
        return 0;
    };
    let Some(pid) = tp_field(&ctx, &l.fields[oom_tp::PID]) else {
        return 0;
    };
    let mut ev = empty();
    ev.victim_pid = pid as u32;
    ev.victim_tid = pid as u32;
    if tp_str(&ctx, &l.fields[oom_tp::COMM], &mut ev.victim_comm) {
        ev.flags |= oom_flags::COMM;
    }
    // The tracepoint reports these in kB (`K()` in mm/oom_kill.c).
    if let (Some(total_vm), Some(anon), Some(file), Some(shmem)) = (
        tp_field(&ctx, &l.fields[oom_tp::TOTAL_VM]),
        tp_field(&ctx, &l.fields[oom_tp::ANON_RSS]),
        tp_field(&ctx, &l.fields[oom_tp::FILE_RSS]),
        tp_field(&ctx, &l.fields[oom_tp::SHMEM_RSS]),
    ) {
        ev.total_vm_bytes = total_vm * KIB;
        ev.anon_rss_bytes = anon * KIB;
        ev.file_rss_bytes = file * KIB;
        ev.shmem_rss_bytes = shmem * KIB;
        ev.pgtables_bytes = tp_field(&ctx, &l.fields[oom_tp::PGTABLES]).unwrap_or(0) * KIB;
        ev.flags |= oom_flags::MEMORY;
    }
    if let Some(uid) = tp_field(&ctx, &l.fields[oom_tp::UID]) {
        ev.uid = uid as u32;
        ev.flags |= oom_flags::UID;
    }
    if let Some(adj) = tp_field(&ctx, &l.fields[oom_tp::OOM_SCORE_ADJ]) {
        ev.oom_score_adj = adj as i64 as i32;
        ev.flags |= oom_flags::SCORE_ADJ;
    }
    ev.trigger_reclaim = last_reclaim_flavor();
    info!(&ctx, "oom victim pid {} (tracepoint)", ev.victim_pid);
    emit(EventKind::OomKill, ev);
    0
}

#[inline(always)]
const fn empty() -> OomKill {
    OomKill {
        victim_pid: 0,
        victim_tid: 0,
        victim_comm: [0; TASK_COMM_LEN],
        victim_cgroup_id: 0,
        total_vm_bytes: 0,
        anon_rss_bytes: 0,
        file_rss_bytes: 0,
        shmem_rss_bytes: 0,
        pgtables_bytes: 0,
        uid: 0,
        oom_score_adj: 0,
        trigger_reclaim: 0,
        flags: 0,
    }
}
