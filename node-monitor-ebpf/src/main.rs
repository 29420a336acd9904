//! node-monitor's kernel probes: tracepoints and raw tracepoints only (no kprobes, no fentry),
//! one module per probe family. Every probe writes typed records (node-monitor-common's
//! `Event<T>`) into one ring buffer and counts what it sent and what it dropped in per-CPU
//! counters. Kernel structs are read through CO-RE, in C (c/task.c, see `task`); tracepoint
//! fields at offsets the agent parsed from tracefs. docs/kernel-probes.md describes each
//! program and what it needs.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "the atomic add intrinsic: see util::shared"
)]

mod kswapd;
mod maps;
mod mem_push;
mod oom;
mod reboot;
mod reclaim;
mod synthetic;
mod task;
mod util;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// `bpf_probe_read_kernel` and the ring buffer helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
