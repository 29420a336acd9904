//! Types shared by node-monitor's eBPF programs and the agent. `no_std`, `#[repr(C)]`.
#![no_std]
