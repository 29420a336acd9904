//! The benchmark's event generator: `getppid(2)` of one configured process sends a synthetic
//! record through the same path as the real probes (envelope, ring buffer, counters), so the
//! benchmark can drive the ring buffer at a known rate. The agent attaches it only when asked to
//! (a non-zero `synthetic_tgid`); every other caller returns after one comparison.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use node_monitor_common::{
    counters,
    event::{EventKind, Synthetic},
};

use crate::{
    maps::COUNTERS,
    util::{config, emit},
};

#[tracepoint(category = "syscalls", name = "sys_enter_getppid")]
pub fn synthetic_evt(_ctx: TracePointContext) -> u32 {
    let Some(cfg) = config() else {
        return 0;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if cfg.synthetic_tgid == 0 || tgid != cfg.synthetic_tgid {
        return 0;
    }
    let slot = EventKind::Synthetic.slot();
    let sent = COUNTERS.get(counters::EVENTS + slot).copied().unwrap_or(0);
    let dropped = COUNTERS.get(counters::DROPS + slot).copied().unwrap_or(0);
    emit(
        EventKind::Synthetic,
        Synthetic {
            seq: sent + dropped,
        },
    );
    0
}
