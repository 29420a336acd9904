//! Reboot, power-off, halt and kexec requests: `syscalls/sys_enter_reboot` fires on every
//! `reboot(2)` before the kernel checks the caller's capability and magic numbers, so an event
//! is a request, not a promise; the agent decodes `cmd`. A call from a task in a child PID
//! namespace does not take the host down (`reboot_pid_ns()` in kernel/pid_namespace.c).
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use aya_log_ebpf::info;
use node_monitor_common::{
    config::reboot_tp,
    event::{EventKind, Reboot},
};

use crate::util::{emit, layout, tp_field};

#[tracepoint(category = "syscalls", name = "sys_enter_reboot")]
pub fn reboot_enter(ctx: TracePointContext) -> u32 {
    let Some(l) = layout(reboot_tp::SLOT.index) else {
        return 0;
    };
    let Some(cmd) = tp_field(&ctx, &l.fields[reboot_tp::CMD]) else {
        return 0;
    };
    let magic1 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC1]).unwrap_or(0);
    let magic2 = tp_field(&ctx, &l.fields[reboot_tp::MAGIC2]).unwrap_or(0);
    info!(&ctx, "reboot(2) requested, cmd {:x}", cmd as u32);
    emit(
        EventKind::Reboot,
        Reboot {
            cmd: cmd as u32,
            magic1: magic1 as u32,
            magic2: magic2 as u32,
            _pad: 0,
        },
    );
    0
}
