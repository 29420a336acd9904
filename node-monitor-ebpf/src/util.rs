//! Helpers shared by the probe families: the record envelope, counters and tracepoint fields.
use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
    },
    maps::RingBuf,
    programs::TracePointContext,
};
use node_monitor_common::{
    TASK_COMM_LEN,
    config::{FieldLoc, ProbeConfigRaw, TpLayout, field_flags},
    counters,
    event::{Event, EventHeader, EventKind},
};

use crate::maps::{CONFIG, COUNTERS, EVENTS, TP_LAYOUT};

/// Adds one to a per-CPU counter slot. Atomic because another program may interrupt this one on
/// the same CPU (tracing programs run with migration, not preemption, disabled).
#[inline(always)]
pub fn count(slot: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(slot) {
        // SAFETY: the map value is a live, aligned u64 for the program's lifetime.
        unsafe { shared::add(p, 1) };
    }
}

#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn current_cgroup_id() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

#[inline(always)]
pub fn current_tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

/// The agent's tunables; `None` until the agent wrote them (programs then do nothing).
#[inline(always)]
pub fn config() -> Option<&'static ProbeConfigRaw> {
    CONFIG.get(0)
}

/// An envelope for `kind` describing `current`.
#[inline(always)]
pub fn header(kind: EventKind) -> EventHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    EventHeader {
        ts_ns: now_ns(),
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        cgroup_id: current_cgroup_id(),
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        ..EventHeader::new(kind)
    }
}

/// Sends a record, counting it, or counting the drop when the ring buffer is full.
#[inline(always)]
pub fn emit<T: 'static>(kind: EventKind, data: T) {
    emit_flags(kind, data, 0);
}

/// [`emit`] with the submit `flags` (`BPF_RB_FORCE_WAKEUP` wakes the reader at once, whatever
/// the kernel's adaptive notification would do).
#[inline(always)]
pub fn emit_flags<T: 'static>(kind: EventKind, data: T, flags: u64) {
    if emit_to(&EVENTS, kind, data, flags) {
        count(counters::EVENTS + kind.slot());
    } else {
        count(counters::DROPS + kind.slot());
    }
}

/// Sends a record to `ring` with the submit `flags`, uncounted; false when the ring is full.
#[inline(always)]
pub fn emit_to<T: 'static>(ring: &RingBuf, kind: EventKind, data: T, flags: u64) -> bool {
    match ring.reserve::<Event<T>>(0) {
        Some(mut entry) => {
            entry.write(Event {
                header: header(kind),
                data,
            });
            entry.submit(flags);
            true
        }
        None => false,
    }
}

/// The field layout of a tracepoint; `None` until the agent wrote it.
#[inline(always)]
pub fn layout(index: u32) -> Option<&'static TpLayout> {
    TP_LAYOUT.get(index)
}

/// Reads an integer field of a tracepoint record, sign-extended when the field is signed.
/// `None` when the field is absent on this kernel or cannot be read.
///
/// One 8-byte read that ends where the field ends, shifted down: the field's bytes are the top
/// `size` of the little-endian word, and an arithmetic shift sign-extends a signed field. No
/// branch per size, so a program reading several fields gives the verifier one state per field
/// rather than one per size: with a `match` on the size, 5.10's verifier ran out of its
/// million-instruction budget on `oom_victim_tp`. Every field of a tracepoint record starts
/// after its 8-byte common header, so the word never starts before the record.
#[inline(always)]
pub fn tp_field(ctx: &TracePointContext, loc: &FieldLoc) -> Option<u64> {
    let size = loc.size as usize;
    let end = loc.offset as usize + size;
    if size == 0 || size > 8 || end < 8 {
        return None;
    }
    let shift = ((8 - size) * 8) as u32;
    // SAFETY: the word lies inside the tracepoint record (its end is the field's, whose offset
    // comes from the tracepoint's own format on this kernel); the helper checks the read.
    match unsafe { ctx.read_at::<u64>(end - 8) } {
        Ok(word) if loc.flags & field_flags::SIGNED != 0 => {
            Some(((word as i64).wrapping_shr(shift)) as u64)
        }
        Ok(word) => Some(word.wrapping_shr(shift)),
        Err(_) => {
            count(counters::READ_ERRORS);
            None
        }
    }
}

/// Reads a string field (`__data_loc char[]` or a fixed `char[N]`) into `out`.
#[inline(always)]
pub fn tp_str(ctx: &TracePointContext, loc: &FieldLoc, out: &mut [u8; TASK_COMM_LEN]) -> bool {
    if !loc.is_present() {
        return false;
    }
    let mut off = loc.offset as usize;
    if loc.flags & field_flags::DATA_LOC != 0 {
        // SAFETY: as in `tp_field`.
        match unsafe { ctx.read_at::<u32>(off) } {
            Ok(data_loc) => off = (data_loc & 0xffff) as usize,
            Err(_) => {
                count(counters::READ_ERRORS);
                return false;
            }
        }
    }
    // SAFETY: the source is inside the tracepoint record; the helper bounds the copy by `out`.
    let src = unsafe { (ctx.as_ptr() as *const u8).add(off) };
    if unsafe { bpf_probe_read_kernel_str_bytes(src, out) }.is_err() {
        count(counters::READ_ERRORS);
        return false;
    }
    true
}

/// Shared map values. The BPF target is built for the baseline instruction set (`--cpu
/// generic`, which aya-build's linker invocation uses), which has an atomic add without fetch
/// (BPF_XADD) but no fetch-add, exchange or compare-exchange. So sums are atomic adds and every
/// other update is a plain volatile store; callers document the (rare) races this leaves.
pub mod shared {
    use core::intrinsics::{self, AtomicOrdering::Relaxed};

    /// Adds `v` atomically (the result is not read, so this is BPF_XADD).
    ///
    /// # Safety
    /// `p` must point to a live, 8-byte-aligned map value.
    #[inline(always)]
    pub unsafe fn add(p: *mut u64, v: u64) {
        unsafe { intrinsics::atomic_xadd::<u64, u64, { Relaxed }>(p, v) };
    }

    /// Safety as for [`add`].
    #[inline(always)]
    pub unsafe fn load(p: *mut u64) -> u64 {
        unsafe { core::ptr::read_volatile(p) }
    }

    /// Safety as for [`add`].
    #[inline(always)]
    pub unsafe fn store(p: *mut u64, v: u64) {
        unsafe { core::ptr::write_volatile(p, v) }
    }
}
