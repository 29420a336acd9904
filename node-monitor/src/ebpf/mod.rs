//! Loading, attaching and reading the eBPF programs.
