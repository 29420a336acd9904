//! The kernel tier (root, a kernel with BTF): the eBPF programs, the sampler against real cgroups,
//! the reboot probes, `node-monitor trace`. One test binary for the tier (`cargo test -p
//! node-monitor-tests --test kernel`); each module is one concern, run alone with a filter (`--
//! kernel_ebpf::`).
mod kernel_ebpf;
mod kernel_reboot;
mod kernel_sampler;
mod trace_cli;
