//! OOM kills: `mark_victim` fires when the OOM killer has chosen a victim
//! (`__oom_kill_process()` → `mark_oom_victim()`, mm/oom_kill.c), in the context of the task
//! whose allocation or charge invoked the killer (the trigger), not of the victim. The envelope
//! therefore describes the trigger; the payload describes the victim.
//!
//! Three programs, one attached:
//! - `oom_victim_raw` (raw tracepoint, preferred): `TP_PROTO(struct task_struct *task, uid_t
//!   uid)` gives the victim's task, so the victim's own cgroup v2 id is read from
//!   `task->cgroups->dfl_cgrp->kn->id`, through CO-RE (c/task.c, see `crate::task`).
//! - `oom_victim_pid` (raw tracepoint, where `mark_victim` passes `(int pid)`, as on 5.10): the
//!   victim's pid, attached through bpf(2) alone, so under `perf_event_paranoid` above 2 too.
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
    reclaim::last_reclaim_flavor,
    task::{self, victim},
    util::{config, emit, layout, tp_field, tp_str},
};

const KIB: u64 = 1024;

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_victim_raw(ctx: RawTracePointContext) -> u32 {
    let task: u64 = ctx.arg(0);
    let uid: u64 = ctx.arg(1);
    let Some(v) = task::victim(task) else {
        return 0;
    };
    let mut ev = empty();
    ev.flags = oom_flags::FROM_TASK | oom_flags::UID;
    ev.uid = uid as u32;
    if v.flags & victim::PID != 0 {
        ev.victim_tid = v.pid as u32;
        ev.victim_pid = v.pid as u32;
    }
    if v.flags & victim::TGID != 0 {
        ev.victim_pid = v.tgid as u32;
        ev.flags |= oom_flags::VICTIM_TGID;
    }
    if v.flags & victim::COMM != 0 {
        ev.victim_comm = v.comm;
        ev.flags |= oom_flags::COMM;
    }
    if v.flags & victim::SCORE_ADJ != 0 {
        ev.oom_score_adj = v.oom_score_adj;
        ev.flags |= oom_flags::SCORE_ADJ;
    }
    if v.flags & victim::CGROUP != 0 {
        ev.victim_cgroup_id = v.cgroup_id;
        ev.flags |= oom_flags::VICTIM_CGROUP;
    }
    if let Some(m) = task::memory(task) {
        let page = config().map_or(4096, |c| c.page_size);
        let pages = |n: i64| if n < 0 { 0 } else { n as u64 * page };
        ev.total_vm_bytes = m.total_vm * page;
        ev.pgtables_bytes = if m.pgtables_bytes < 0 {
            0
        } else {
            m.pgtables_bytes as u64
        };
        ev.anon_rss_bytes = pages(m.anon);
        ev.file_rss_bytes = pages(m.file);
        ev.shmem_rss_bytes = pages(m.shmem);
        ev.flags |= oom_flags::MEMORY;
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

/// Where `mark_victim` passes the victim's pid alone (`TP_PROTO(int pid)`, before the task was
/// passed): what the tracepoint gives there too, through bpf(2) alone. The trigger's cgroup and
/// comm are the envelope's.
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_victim_pid(ctx: RawTracePointContext) -> u32 {
    let pid: u64 = ctx.arg(0);
    let mut ev = empty();
    ev.victim_pid = pid as u32;
    ev.victim_tid = pid as u32;
    ev.trigger_reclaim = last_reclaim_flavor();
    info!(&ctx, "oom victim pid {} (raw, pid only)", ev.victim_pid);
    emit(EventKind::OomKill, ev);
    0
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
