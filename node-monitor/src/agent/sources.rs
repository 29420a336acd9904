//! How the agent reports its wake-up sources (`node_monitor_wakeup_source_state`, warnings and
//! the degraded state of `/readyz`). Pure: the run loop passes what it armed and loaded.
//!
//! A source the node cannot have is `not_applicable`, never a degradation: the cgroup v1
//! interfaces (memory thresholds through `cgroup.event_control`, `memory.oom_control`) on a
//! cgroup v2 node, `memory.events` on a v1 node. The kernel source is reported once the eBPF
//! probes are loaded, which happens after the other sources are armed.
use node_monitor_core::guarantees::Source;

use crate::wakeup::{SourceKind, SourceSetting, SourceState, WakeupConfig};

/// The sources `config` says this node cannot have.
pub fn not_applicable(config: &WakeupConfig) -> Vec<SourceKind> {
    let na = |s: &SourceSetting| matches!(s, SourceSetting::NotApplicable(_));
    let mut out = Vec::new();
    // `memory.oom_control` lives in the same v1 memory cgroup as the thresholds: without one the
    // other cannot exist either (`Wakeups` arms both from `memcg_node`).
    if na(&config.memcg_node) {
        out.extend([SourceKind::MemcgThreshold, SourceKind::MemcgOom]);
    }
    if na(&config.memory_events) {
        out.push(SourceKind::MemoryEvents);
    }
    if na(&config.psi) {
        out.push(SourceKind::Psi);
    }
    out
}

/// The metric state of a source (`active`, `disabled`, `not_applicable`, `unavailable`) and
/// whether it degrades the agent (only a source that should work and does not).
pub fn report(
    source: SourceKind,
    state: &SourceState,
    not_applicable: &[SourceKind],
) -> (&'static str, bool) {
    match state {
        SourceState::Armed { .. } => ("active", false),
        SourceState::Disabled => ("disabled", false),
        SourceState::Unavailable { .. } if not_applicable.contains(&source) => {
            ("not_applicable", false)
        }
        SourceState::Unavailable { .. } => ("unavailable", true),
    }
}

/// A source's state for the guarantees the agent publishes (`live::guarantees`).
pub fn guarantee_source(
    source: SourceKind,
    state: Option<&SourceState>,
    not_applicable: &[SourceKind],
) -> Source {
    match state {
        None => Source::Unavailable("not started".to_owned()),
        Some(SourceState::Armed { .. }) => Source::Active,
        Some(SourceState::Disabled) => Source::Disabled,
        Some(SourceState::Unavailable { reason }) if not_applicable.contains(&source) => {
            Source::NotApplicable(reason.clone())
        }
        Some(SourceState::Unavailable { reason }) => Source::Unavailable(reason.clone()),
    }
}

/// The kernel source's metric state: `disabled` when the configuration runs without eBPF,
/// `active` once at least one program is attached (its events wake the sampler), `unavailable`
/// otherwise. Never a degradation of its own: the probe loader already reports each program it
/// could not attach.
pub fn kernel_state(ebpf_requested: bool, attached_programs: Option<usize>) -> &'static str {
    match (ebpf_requested, attached_programs) {
        (false, _) => "disabled",
        (true, Some(n)) if n > 0 => "active",
        (true, _) => "unavailable",
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{
        metrics::Metrics,
        sampler::{CgroupVersion, Layout, ProcPaths},
    };

    fn layout(version: CgroupVersion) -> Layout {
        let node = PathBuf::from("/sys/fs/cgroup/node-monitor-test/n");
        Layout {
            version,
            node_is_root: false,
            node_memory: node.clone(),
            node_pids: Some(node.clone()),
            node_unified: Some(node.clone()),
            kubepods_name: "kubepods.slice".into(),
            kubepods_detection: crate::sampler::KubepodsDetection::Configured,
            kubepods_memory: node.join("kubepods.slice"),
            kubepods_pids: None,
            proc: ProcPaths {
                meminfo: "/proc/meminfo".into(),
                loadavg: "/proc/loadavg".into(),
                pid_max: "/proc/sys/kernel/pid_max".into(),
                threads_max: "/proc/sys/kernel/threads-max".into(),
                pressure_memory: "/proc/pressure/memory".into(),
            },
            kubelet_root: "/var/lib/kubelet".into(),
            pod_log_root: "/var/log/pods".into(),
            image_fs: None,
            container_fs: None,
        }
    }

    #[test]
    fn each_cgroup_version_lacks_the_other_versions_interfaces() {
        use SourceKind::*;
        let cases = [
            (CgroupVersion::V1, vec![MemoryEvents]),
            (CgroupVersion::V2, vec![MemcgThreshold, MemcgOom]),
        ];
        for (version, want) in cases {
            let config = WakeupConfig::for_layout(&layout(version));
            assert_eq!(not_applicable(&config), want, "{version:?}");
        }
        let mut config = WakeupConfig::for_layout(&layout(CgroupVersion::V2));
        config.psi = SourceSetting::NotApplicable("no pressure file".into());
        assert!(not_applicable(&config).contains(&Psi));
    }

    #[test]
    fn only_sources_that_should_work_degrade() {
        let armed = SourceState::Armed {
            detail: "memory.events".into(),
        };
        let missing = SourceState::Unavailable {
            reason: "not here".into(),
        };
        let v2 = [SourceKind::MemcgThreshold, SourceKind::MemcgOom];
        let cases = [
            (SourceKind::MemoryEvents, &armed, ("active", false)),
            (SourceKind::Psi, &SourceState::Disabled, ("disabled", false)),
            (SourceKind::MemcgOom, &missing, ("not_applicable", false)),
            (
                SourceKind::MemcgThreshold,
                &missing,
                ("not_applicable", false),
            ),
            (SourceKind::MemoryEvents, &missing, ("unavailable", true)),
            (SourceKind::Psi, &missing, ("unavailable", true)),
        ];
        for (source, state, want) in cases {
            assert_eq!(report(source, state, &v2), want, "{source:?} {state:?}");
        }
    }

    #[test]
    fn the_kernel_source_follows_the_probes() {
        let cases = [
            (false, None, "disabled"),
            (false, Some(7), "disabled"),
            (true, Some(7), "active"),
            (true, Some(0), "unavailable"),
            (true, None, "unavailable"),
        ];
        for (requested, attached, want) in cases {
            assert_eq!(
                kernel_state(requested, attached),
                want,
                "{requested} {attached:?}"
            );
        }
    }

    #[test]
    fn the_state_metric_is_one_hot_over_every_documented_state() {
        let m = Metrics::new();
        m.wakeups.set_source_state("memcg_oom", "unavailable");
        m.wakeups.set_source_state("memcg_oom", "not_applicable");
        let text = m.encode();
        for (state, value) in [
            ("not_applicable", 1),
            ("unavailable", 0),
            ("active", 0),
            ("disabled", 0),
        ] {
            let line = format!(
                "node_monitor_wakeup_source_state{{source=\"memcg_oom\",state=\"{state}\"}} {value}"
            );
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
    }
}
