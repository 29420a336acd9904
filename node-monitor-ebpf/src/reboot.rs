//! Reboot, power-off, halt and kexec requests: `syscalls/sys_enter_reboot` fires on every
//! `reboot(2)` before the kernel checks anything, so an event is a request, not a promise. The
//! program therefore judges the call the way `SYSCALL_DEFINE4(reboot)` (kernel/reboot.c) will:
//! the caller's PID namespace (a call from a child namespace only ends that namespace's init,
//! `reboot_pid_ns()` in kernel/pid_namespace.c), its credentials' user namespace and
//! `CAP_SYS_BOOT`, the magic numbers and the command ([`reboot_gate`]). The caller is read from
//! `current` through CO-RE (c/task.c); without kernel BTF calls are reported `unverified`.
//!
//! Every verdict but `allowed` is rate-limited per verdict: within the configured interval calls
//! are only counted, and the next event carries how many were withheld. A container calling
//! reboot(2) in a loop thus costs one event per interval.
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP, helpers::bpf_get_current_task, macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::info;
use node_monitor_common::{
    config::reboot_tp,
    counters,
    event::{EventKind, Reboot, reboot_flags},
    logic::{RebootCaller, RebootGate, rate_limit_allows, reboot_gate},
};

use crate::{
    maps::{GASP, REBOOT},
    util::{config, count, emit_flags, emit_to, layout, now_ns, shared, tp_field},
};

#[tracepoint(category = "syscalls", name = "sys_enter_reboot")]
pub fn reboot_enter(ctx: TracePointContext) -> u32 {
    let (Some(l), Some(cfg)) = (layout(reboot_tp::SLOT.index), config()) else {
        return 0;
    };
    let Some(cmd) = tp_field(&ctx, &l.fields[reboot_tp::CMD]) else {
        return 0;
    };
    let cmd = cmd as u32;
    let magic1 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC1]).unwrap_or(0) as u32;
    let magic2 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC2]).unwrap_or(0) as u32;
    let caller = current_caller();
    let verdict = reboot_gate(caller, magic1, magic2, cmd);

    let mut suppressed = 0;
    if verdict != RebootGate::Allowed {
        let Some(slot) = REBOOT.get_ptr_mut(verdict as u32) else {
            return 0;
        };
        // SAFETY: `slot` points to a live array value; its fields are only accessed through
        // `shared`.
        let (last_p, suppressed_p) =
            unsafe { (&raw mut (*slot).last_emit_ns, &raw mut (*slot).suppressed) };
        let now = now_ns();
        // SAFETY (all `shared` calls below): the pointers are fields of the live map value
        // `slot`. Plain stores (see `util::shared`): two CPUs in the same instant may both send
        // an event, and a call counted while the count is reset may be lost from it (never
        // from the SUPPRESSED counter).
        let last = unsafe { shared::load(last_p) };
        if !rate_limit_allows(last, now, cfg.reboot_min_interval_ns) {
            unsafe { shared::add(suppressed_p, 1) };
            count(counters::REBOOT_SUPPRESSED);
            return 0;
        }
        suppressed = unsafe {
            shared::store(last_p, now);
            let n = shared::load(suppressed_p);
            shared::store(suppressed_p, 0);
            n
        };
    }
    let c = caller.unwrap_or(RebootCaller {
        cap_effective: 0,
        pid_ns_level: 0,
        user_ns_level: 0,
    });
    let record = Reboot {
        cmd,
        magic1,
        magic2,
        verdict: verdict as u32,
        cap_effective: c.cap_effective,
        pid_ns_level: c.pid_ns_level,
        user_ns_level: c.user_ns_level,
        suppressed: suppressed.min(u32::MAX as u64) as u32,
        flags: if caller.is_some() {
            reboot_flags::CALLER
        } else {
            0
        },
    };
    // The last gasp first: the kernel's restart path runs on as soon as this program returns,
    // and the forced wake-up has the agent's last-gasp thread woken before it does.
    if verdict == RebootGate::Allowed {
        emit_to(&GASP, EventKind::Reboot, record, BPF_RB_FORCE_WAKEUP as u64);
    }
    emit_flags(EventKind::Reboot, record, BPF_RB_FORCE_WAKEUP as u64);
    info!(
        &ctx,
        "reboot(2) requested, cmd {:x} verdict {}", cmd, verdict as u32
    );
    0
}

/// `current`'s reboot(2) caller checks, read through CO-RE (`crate::task::caller`); `None`
/// without kernel BTF or when a read fails.
#[inline(always)]
fn current_caller() -> Option<RebootCaller> {
    // SAFETY: no preconditions; the pointer is only passed to `bpf_probe_read_kernel`.
    crate::task::caller(unsafe { bpf_get_current_task() })
}
