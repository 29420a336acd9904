//! node-monitor: an eBPF-assisted Kubernetes node agent.
//!
//! Layering (imports point down only): the decision core is its own crate, `node_monitor_core`,
//! pure (no I/O, no async, time passed in); adapters ([`ebpf`], [`sampler`], [`cluster`])
//! translate between the outside world and core values; [`wakeup`] (the wake-up sources) sits on
//! the sampler's layout; the agent loop and the CLI sit on top. What the agent shares with
//! remediate (the API client, the endpoint, the metrics base, logging) is `node_monitor_service`.
pub mod agent;
pub mod attribution;
pub mod cli;
pub mod cluster;
pub mod ebpf;
pub mod flight;
pub mod http;
pub use node_monitor_base::io;
pub use node_monitor_service::jitter;
pub mod live;
pub mod metrics;
pub mod sampler;
pub mod settings;
pub mod shutdown;
pub use node_monitor_service::telemetry;
pub mod trace;
pub mod wakeup;

/// The settings of the property tests (`mod prop` next to the code they test, docs/testing.md):
/// proptest's defaults (256 cases, `PROPTEST_CASES` overrides), without regression files: a
/// failing input found once is kept as a table-test case instead.
#[cfg(test)]
pub(crate) fn proptest_config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// Stack size of the async runtime's threads (its workers, the threads that stand in for a
/// worker while the sampler blocks, and the blocking thread that loads the probes). The DaemonSet
/// locks the agent's memory (`mlockall`), which makes every page of every thread stack resident:
/// tokio's default of 2 MiB per thread would be RAM used by nothing. The deepest stack measured on
/// a worker of the release build (start-up with the kernel's BTF, a pod list of 250 pods decoded,
/// the probes' events; pages touched in `/proc/<pid>/smaps`, docs/benchmarks.md) is 128 KiB:
/// 1 MiB leaves eight times that before the guard page. Debug builds, whose frames are several
/// times larger, keep tokio's default.
pub const WORKER_STACK_BYTES: usize = if cfg!(debug_assertions) {
    2 * 1024 * 1024
} else {
    1024 * 1024
};

/// Stack size of the agent's two plain threads (`pod-disk`, whose walk keeps its own stack of
/// directories on the heap, and `cgroup-watch`, an inotify loop): neither recurses.
pub const SMALL_THREAD_STACK_BYTES: usize = 256 * 1024;
