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
//!
//! Two programs share the judgement: `reboot_enter` on the syscall tracepoint, and `reboot_raw`,
//! its fallback, on the raw tracepoint `sys_enter`. The tracepoint attaches through a perf event,
//! which Debian's and Ubuntu's kernels refuse without CAP_SYS_ADMIN when
//! `kernel.perf_event_paranoid` is above 2 (their defaults, 3 and 4); the raw tracepoint
//! attaches through bpf(2) alone. It runs on every system call and returns at once unless the
//! number is reboot(2)'s (docs/benchmarks.md, "Reboot probe: cost per system call"). Neither
//! sees a 32-bit process's reboot(2) on a 64-bit kernel: the syscall tracepoints skip compat
//! calls, and `reboot_raw` does the same, since their numbers are another table's.
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
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
    let magic1 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC1]).unwrap_or(0) as u32;
    let magic2 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC2]).unwrap_or(0) as u32;
    judge(&ctx, cfg.reboot_min_interval_ns, cmd as u32, magic1, magic2)
}

/// reboot(2)'s number in the native system call table.
#[cfg(bpf_target_arch = "aarch64")]
const NR_REBOOT: i64 = 142;
#[cfg(not(bpf_target_arch = "aarch64"))]
const NR_REBOOT: i64 = 169;

/// `TP_PROTO(struct pt_regs *regs, long id)`: `regs` are the caller's registers at entry, and
/// the first three system call arguments are reboot(2)'s `magic1`, `magic2` and `cmd`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn reboot_raw(ctx: RawTracePointContext) -> u32 {
    if ctx.arg::<i64>(1) != NR_REBOOT || is_compat() {
        return 0;
    }
    let regs: *const aya_ebpf::bindings::pt_regs = ctx.arg(0);
    let Some(cfg) = config() else {
        return 0;
    };
    let Some((magic1, magic2, cmd)) = syscall_args(regs) else {
        count(counters::READ_ERRORS);
        return 0;
    };
    judge(
        &ctx,
        cfg.reboot_min_interval_ns,
        cmd as u32,
        magic1 as u32,
        magic2 as u32,
    )
}

/// The first three system call arguments, from the caller's saved registers.
#[inline(always)]
fn syscall_args(regs: *const aya_ebpf::bindings::pt_regs) -> Option<(u64, u64, u64)> {
    // SAFETY: `regs` is the tracepoint's argument; bpf_probe_read_kernel checks the reads.
    unsafe {
        #[cfg(bpf_target_arch = "aarch64")]
        {
            let r = bpf_probe_read_kernel(&raw const (*regs).regs).ok()?;
            Some((r[0], r[1], r[2]))
        }
        #[cfg(not(bpf_target_arch = "aarch64"))]
        {
            Some((
                bpf_probe_read_kernel(&raw const (*regs).rdi).ok()?,
                bpf_probe_read_kernel(&raw const (*regs).rsi).ok()?,
                bpf_probe_read_kernel(&raw const (*regs).rdx).ok()?,
            ))
        }
    }
}

/// Whether `current` is in a 32-bit compat system call, whose numbers are another table's
/// (i386's 169 is not reboot(2)). Read through CO-RE (c/task.c); without kernel BTF it cannot
/// be told, and the call is taken as native, as on a kernel without compat support.
#[inline(always)]
fn is_compat() -> bool {
    // SAFETY: no preconditions; the pointer is only passed to `bpf_probe_read_kernel`.
    crate::task::in_compat_syscall(unsafe { bpf_get_current_task() })
}

/// Judges one reboot(2) call and reports it (see the module's documentation). A function of its
/// own in the object (a BPF-to-BPF call): inlined into the tracepoint program, its register
/// allocation spilled the context pointer with a 4-byte store, which the verifier refuses.
#[inline(never)]
fn judge<C: EbpfContext>(ctx: &C, min_interval_ns: u64, cmd: u32, magic1: u32, magic2: u32) -> u32 {
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
        if !rate_limit_allows(last, now, min_interval_ns) {
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
        ctx,
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
