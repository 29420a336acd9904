#![no_std]
// A library target so the agent's build-dependency on this crate resolves (aya-template layout);
// the programs are the `node-monitor` binary in main.rs.
