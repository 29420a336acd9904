//! node-monitor's shared library, without eBPF and without a runtime: what the agent and
//! `kubectl node-monitor` both need. Bounded input and pipe-safe output ([`io`]); how a flight
//! record is shown ([`flight_view`]). It builds on stable Rust alone, for Linux and macOS.
pub mod flight_view;
pub mod io;
