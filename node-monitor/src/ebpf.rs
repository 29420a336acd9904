//! Loading, attaching and reading the eBPF programs.
//!
//! The rest of the agent calls [`Probes::load`] (never fails hard: every program ends up
//! attached, failed or disabled, with a reason), reads [`Probes::program_states`] and
//! [`Probes::counters`], and takes an [`EventStream`] of [`KernelEvent`]s. Which programs load is
//! decided by the pure [`policy`] from capabilities the loader probes ([`btf`], [`tracefs`]);
//! docs/kernel-probes.md describes each program.
pub mod btf;
pub mod event;
pub(crate) mod loader;
pub mod policy;
mod stream;
pub mod tracefs;

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

pub use event::{
    KernelEvent, KswapdWakeEvent, OomKillEvent, OomMemory, RebootEvent, ReclaimStallEvent,
    SyntheticEvent, TaskInfo,
};
pub use loader::{
    Counters, MemPushControl, MemPushWakes, ProbeError, Probes, ProgramStatus, PushAttachment,
    PushSwitch, RunStats, object_sha256,
};
pub use node_monitor_common::logic::MemPushWake;
pub use node_monitor_common::{
    event::{DecodeError, EventKind},
    logic::{OomScope, RebootCaller, RebootCmd, RebootGate, ReclaimFlavor},
    names::prog,
};
pub use policy::{Family, ProgramState, Requirement};
pub use stream::{EventStream, StreamError};

/// Tunables of the kernel probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// A reclaim-stall event is sent when a cgroup's reclaim time in one window reaches this.
    pub stall_budget: Duration,
    /// The reclaim-stall accounting window.
    pub stall_window: Duration,
    /// Minimum interval between two kswapd wake-up events for one NUMA node.
    pub kswapd_min_interval: Duration,
    /// Minimum interval between two reboot events of one verdict, for every verdict but
    /// `allowed` (a container calling reboot(2) in a loop); withheld calls are counted.
    pub reboot_min_interval: Duration,
    /// Minimum interval between two memory push wake records, over all CPUs.
    pub mem_push_min_interval: Duration,
    /// Size of the event ring buffer: a power of two, at least one page.
    pub ring_buffer_bytes: u32,
    /// Let the programs log through aya-log (see [`Probes::forward_kernel_log`]).
    pub kernel_log: bool,
    /// Families (`oom`, `reclaim`, `kswapd`, `reboot`) or program names not to load.
    pub disable: BTreeSet<String>,
    /// Attach the benchmark's event generator for this process (`getppid(2)` calls).
    pub synthetic_tgid: Option<u32>,
    /// Mount tracefs at /sys/kernel/tracing when it is not mounted.
    pub mount_tracefs: bool,
    /// Kernel BTF.
    pub btf_path: PathBuf,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            stall_budget: Duration::from_millis(100),
            stall_window: Duration::from_secs(1),
            kswapd_min_interval: Duration::from_secs(1),
            reboot_min_interval: Duration::from_secs(10),
            mem_push_min_interval: Duration::from_millis(2),
            ring_buffer_bytes: 256 * 1024,
            kernel_log: false,
            disable: BTreeSet::new(),
            synthetic_tgid: None,
            mount_tracefs: true,
            btf_path: PathBuf::from("/sys/kernel/btf/vmlinux"),
        }
    }
}

/// A configuration value out of its domain.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("probe configuration {field} = {value}: {why}")]
pub struct ConfigError {
    pub field: &'static str,
    pub value: String,
    pub why: &'static str,
}

impl ProbeConfig {
    /// Checks every field; the error names the field and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, value: String, why| Err(ConfigError { field, value, why });
        if self.stall_window.is_zero() {
            return err(
                "stall_window",
                format!("{:?}", self.stall_window),
                "must be positive",
            );
        }
        if self.stall_budget.is_zero() {
            return err(
                "stall_budget",
                format!("{:?}", self.stall_budget),
                "must be positive",
            );
        }
        if u64::try_from(self.stall_window.as_nanos()).is_err() {
            return err(
                "stall_window",
                format!("{:?}", self.stall_window),
                "too long",
            );
        }
        if u64::try_from(self.stall_budget.as_nanos()).is_err() {
            return err(
                "stall_budget",
                format!("{:?}", self.stall_budget),
                "too long",
            );
        }
        if u64::try_from(self.kswapd_min_interval.as_nanos()).is_err() {
            return err(
                "kswapd_min_interval",
                format!("{:?}", self.kswapd_min_interval),
                "too long",
            );
        }
        if u64::try_from(self.reboot_min_interval.as_nanos()).is_err() {
            return err(
                "reboot_min_interval",
                format!("{:?}", self.reboot_min_interval),
                "too long",
            );
        }
        if u64::try_from(self.mem_push_min_interval.as_nanos()).is_err() {
            return err(
                "mem_push_min_interval",
                format!("{:?}", self.mem_push_min_interval),
                "too long",
            );
        }
        let rb = self.ring_buffer_bytes;
        if !rb.is_power_of_two() || rb < 4096 {
            return err(
                "ring_buffer_bytes",
                rb.to_string(),
                "must be a power of two of at least 4096",
            );
        }
        let known: Vec<&str> = policy::PROGRAMS
            .iter()
            .flat_map(|p| [p.name, p.family.as_str()])
            .collect();
        if let Some(unknown) = self.disable.iter().find(|d| !known.contains(&d.as_str())) {
            return err(
                "disable",
                unknown.clone(),
                "not a probe family or program name",
            );
        }
        if self.synthetic_tgid == Some(0) {
            return err("synthetic_tgid", "0".to_owned(), "must be a process id");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(ProbeConfig::default().validate(), Ok(()));
    }

    #[test]
    fn invalid_configs_name_field_and_value() {
        type Tweak = fn(&mut ProbeConfig);
        let cases: Vec<(Tweak, &str, &str)> = vec![
            (|c| c.stall_window = Duration::ZERO, "stall_window", "0ns"),
            (|c| c.stall_budget = Duration::ZERO, "stall_budget", "0ns"),
            (|c| c.ring_buffer_bytes = 1000, "ring_buffer_bytes", "1000"),
            (|c| c.ring_buffer_bytes = 2048, "ring_buffer_bytes", "2048"),
            (
                |c| c.stall_window = Duration::from_secs(u64::MAX),
                "stall_window",
                "18446744073709551615s",
            ),
            (
                |c| c.reboot_min_interval = Duration::from_secs(u64::MAX),
                "reboot_min_interval",
                "18446744073709551615s",
            ),
            (
                |c| c.disable = ["oomm".to_owned()].into(),
                "disable",
                "oomm",
            ),
            (|c| c.synthetic_tgid = Some(0), "synthetic_tgid", "0"),
            (
                |c| c.mem_push_min_interval = Duration::from_secs(u64::MAX),
                "mem_push_min_interval",
                "18446744073709551615s",
            ),
        ];
        for (tweak, field, value) in cases {
            let mut c = ProbeConfig::default();
            tweak(&mut c);
            let e = c.validate().unwrap_err();
            assert_eq!((e.field, e.value.as_str()), (field, value), "{e}");
            assert!(e.to_string().contains(field));
        }
        let ok = ProbeConfig {
            disable: ["reclaim".to_owned(), "kswapd_wake".to_owned()].into(),
            ..ProbeConfig::default()
        };
        assert_eq!(ok.validate(), Ok(()));
    }
}
