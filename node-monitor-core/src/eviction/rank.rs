//! Pod ranking for eviction, with the kubelet's comparator chains (`pkg/kubelet/eviction/helpers.go`):
//!
//! - memory: `orderedBy(exceedMemoryRequests, priority, memory)`
//! - disk: `orderedBy(exceedDiskRequests, priority, disk)` for ephemeral storage and inodes
//! - PIDs: `orderedBy(priority, process)`
//!
//! Pods with no usage sample rank first, as the kubelet "prioritize\[s\] evicting the pod for
//! which no stats were found". The kubelet sorts with Go's unstable `sort.Sort`, so its order
//! among complete ties is unspecified; here ties keep the input order (a stable sort).
//!
//! For inode signals a pod's usage is the inodes of the same share of its disk (`podDiskUsage`
//! with the `inodes` resource). No pod requests inodes, so every pod that uses one "exceeds its
//! request" and the order is priority, then the inode count less (a kubelet quirk, kept) the
//! pod's ephemeral-storage request in bytes. A pod whose inodes were not measured counts 0, as
//! the kubelet counts a summary without inode figures.

use std::{cmp::Ordering, collections::HashMap};

use serde::Serialize;

use crate::{
    kubelet::layout::QosClass,
    kubelet::pod::PodInfo,
    signals::threshold::Resource,
    signals::{FsLayout, PodUsage, Signal},
};

const NANO: i128 = 1_000_000_000;

/// A pod in eviction order, with the facts the comparators used.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankedPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// The pod's QoS class (reported; the comparators do not use it).
    pub qos: QosClass,
    /// `spec.priority` (0 when unset); lower is evicted first.
    pub priority: i32,
    /// Static, mirror or system-critical: ranked like any pod, then skipped by the eviction.
    pub critical: bool,
    /// The sampler had a usage sample for this pod.
    pub stats_found: bool,
    /// The sampled usage of the ranked resource (bytes, inodes or processes); `None` when not
    /// sampled.
    pub usage: Option<u64>,
    /// The request compared with usage (bytes; 0 for inodes and PIDs, which have no requests).
    pub request: i64,
    /// Usage above the request (memory and disk), the last tie-breaker.
    pub usage_above_request: Option<i64>,
    /// Usage exceeds the request (memory and disk), the first criterion.
    pub exceeds_request: Option<bool>,
    /// Index into the pods passed to [`rank_pods`].
    #[serde(skip)]
    pub index: usize,
}

struct Facts<'a> {
    sample: Option<&'a PodUsage>,
    found: bool,
    priority: i32,
    /// Nanos of the ranked resource (0 when not sampled).
    usage: i128,
    exceeds: bool,
    above: i128,
}

/// `cmpBool`: true before false.
fn cmp_bool(a: bool, b: bool) -> Ordering {
    match (a, b) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => Ordering::Equal,
    }
}

/// Pods without a sample first, then the given comparison.
fn with_stats(a: &Facts<'_>, b: &Facts<'_>, f: impl FnOnce() -> Ordering) -> Ordering {
    if !a.found || !b.found {
        cmp_bool(!a.found, !b.found)
    } else {
        f()
    }
}

/// `priority`: lower priority is evicted first.
fn priority(a: &Facts<'_>, b: &Facts<'_>) -> Ordering {
    a.priority.cmp(&b.priority)
}

/// `exceedMemoryRequests` / `exceedDiskRequests`.
fn exceeds(a: &Facts<'_>, b: &Facts<'_>) -> Ordering {
    with_stats(a, b, || cmp_bool(a.exceeds, b.exceeds))
}

/// `memory` / `disk`: the larger consumer relative to its request first.
fn above_request(a: &Facts<'_>, b: &Facts<'_>) -> Ordering {
    with_stats(a, b, || b.above.cmp(&a.above))
}

/// `process`: the larger process count first.
fn processes(a: &Facts<'_>, b: &Facts<'_>) -> Ordering {
    with_stats(a, b, || b.usage.cmp(&a.usage))
}

/// Which part of a pod's disk ranks it for a disk signal (`buildSignalToRankFunc`'s `fsStatsType`
/// lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DiskShare {
    /// Local volumes, logs and writable layers: every disk signal on a single filesystem, and
    /// `nodefs`/`containerfs` when writable layers live apart from images.
    All,
    /// Local volumes and logs: `nodefs` when images and writable layers share a dedicated
    /// filesystem.
    VolumesAndLogs,
    /// Writable layers: `imagefs` and `containerfs` on that dedicated filesystem.
    WritableLayers,
    /// Images, which no pod owns (every pod with a figure counts 0): `imagefs` when writable
    /// layers live apart from images.
    Images,
}

impl DiskShare {
    /// The share that ranks pods for `signal` on a node whose filesystems are `layout`.
    pub fn for_signal(signal: Signal, layout: FsLayout) -> DiskShare {
        use Signal::{
            ContainerFsAvailable, ContainerFsInodesFree, ImageFsAvailable, ImageFsInodesFree,
            NodeFsAvailable, NodeFsInodesFree,
        };
        match (
            layout.dedicated_image_fs,
            layout.split_container_image_fs,
            signal,
        ) {
            (true, false, NodeFsAvailable | NodeFsInodesFree) => DiskShare::VolumesAndLogs,
            (
                true,
                false,
                ImageFsAvailable | ImageFsInodesFree | ContainerFsAvailable | ContainerFsInodesFree,
            ) => DiskShare::WritableLayers,
            (true, true, ImageFsAvailable | ImageFsInodesFree) => DiskShare::Images,
            _ => DiskShare::All,
        }
    }

    /// The share of a pod's figure whose writable-layer part is `layers` (a pod without a
    /// layer figure counts it all as volumes and logs).
    pub(crate) fn of(self, total: Option<u64>, layers: Option<u64>) -> Option<u64> {
        let total = total?;
        let layers = layers.unwrap_or(0).min(total);
        Some(match self {
            DiskShare::All => total,
            DiskShare::VolumesAndLogs => total - layers,
            DiskShare::WritableLayers => layers,
            DiskShare::Images => 0,
        })
    }
}

fn sample(resource: Resource, disk: DiskShare, u: &PodUsage) -> Option<u64> {
    match resource {
        Resource::Memory => u.memory,
        Resource::EphemeralStorage => disk.of(u.disk, u.writable_layers),
        Resource::Inodes => disk.of(u.inodes, u.writable_layer_inodes),
        Resource::Pids => u.processes,
    }
}

fn units(nanos: i128) -> i64 {
    // Rounded away from zero, like Quantity.Value().
    let v = if nanos >= 0 {
        (nanos + NANO - 1) / NANO
    } else {
        -((-nanos + NANO - 1) / NANO)
    };
    i64::try_from(v).unwrap_or(if v > 0 { i64::MAX } else { i64::MIN })
}

/// The kubelet's comparator chain for `resource`.
fn compare(resource: Resource, a: &Facts<'_>, b: &Facts<'_>) -> Ordering {
    match resource {
        Resource::Pids => priority(a, b).then_with(|| processes(a, b)),
        _ => exceeds(a, b)
            .then_with(|| priority(a, b))
            .then_with(|| above_request(a, b)),
    }
}

type SortKey = (u8, i32, (u8, i128));

/// A key that orders like [`compare`].
fn sort_key(resource: Resource, f: &Facts<'_>) -> SortKey {
    let unsampled_first = |v: i128| if f.found { (1, -v) } else { (0, 0) };
    match resource {
        Resource::Pids => (0, f.priority, unsampled_first(f.usage)),
        _ => {
            let exceed = match (f.found, f.exceeds) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => 2,
            };
            (exceed, f.priority, unsampled_first(f.above))
        }
    }
}

/// Ranks `pods` for reclaiming `resource`, with all of a pod's disk for disk signals; `usage` is
/// keyed by pod UID.
pub fn rank_pods(
    resource: Resource,
    pods: &[PodInfo],
    usage: &HashMap<String, PodUsage>,
) -> Vec<RankedPod> {
    rank_pods_by(resource, DiskShare::All, pods, usage)
}

/// Ranks `pods` for reclaiming `resource`, with the `disk` share of each pod's disk for disk
/// signals ([`DiskShare::for_signal`]); `usage` is keyed by pod UID.
pub fn rank_pods_by(
    resource: Resource,
    disk: DiskShare,
    pods: &[PodInfo],
    usage: &HashMap<String, PodUsage>,
) -> Vec<RankedPod> {
    let facts: Vec<Facts<'_>> = pods
        .iter()
        .map(|p| {
            let u = usage.get(&p.uid);
            let used = u
                .and_then(|u| sample(resource, disk, u))
                .map_or(0, |v| i128::from(v) * NANO);
            // The request compared with usage, and the one subtracted from it: the kubelet's
            // disk comparator subtracts the ephemeral-storage request even for inodes.
            let (compare, subtract) = match resource {
                Resource::Memory => (p.memory_request.nanos(), p.memory_request.nanos()),
                Resource::EphemeralStorage => (
                    p.ephemeral_storage_request.nanos(),
                    p.ephemeral_storage_request.nanos(),
                ),
                Resource::Inodes => (0, p.ephemeral_storage_request.nanos()),
                Resource::Pids => (0, 0),
            };
            Facts {
                sample: u,
                found: u.is_some(),
                priority: p.priority,
                usage: used,
                exceeds: u.is_some() && used > compare,
                above: used - subtract,
            }
        })
        .collect();

    // The comparator chains as sort keys (a pod without a sample sorts first in every
    // criterion that looks at usage); the index makes the order total and ties stable.
    let mut keyed: Vec<(SortKey, usize)> = facts
        .iter()
        .enumerate()
        .map(|(i, f)| (sort_key(resource, f), i))
        .collect();
    keyed.sort_unstable();
    debug_assert!(keyed.windows(2).all(|w| {
        let (a, b) = (&facts[w[0].1], &facts[w[1].1]);
        compare(resource, a, b) != Ordering::Greater
    }));
    let order = keyed.into_iter().map(|(_, i)| i);

    order
        .map(|i| {
            let p = &pods[i];
            let f = &facts[i];
            let u = f.sample;
            let request = match resource {
                Resource::Memory => p.memory_request.value(),
                Resource::EphemeralStorage => p.ephemeral_storage_request.value(),
                Resource::Inodes | Resource::Pids => 0,
            };
            let has_request = !matches!(resource, Resource::Pids);
            RankedPod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                qos: p.qos,
                priority: p.priority,
                critical: p.critical,
                stats_found: f.found,
                usage: u.and_then(|u| sample(resource, disk, u)),
                request,
                usage_above_request: (has_request && f.found).then(|| units(f.above)),
                exceeds_request: has_request.then_some(f.exceeds),
                index: i,
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{kubelet::pod::ContainerInfo, units::quantity::Quantity};

    /// A pod builder in the style of the kubelet's `newPod` test helpers.
    pub(crate) fn pod(name: &str, priority: i32, memory_request: &str) -> PodInfo {
        let request = if memory_request.is_empty() {
            Quantity::default()
        } else {
            Quantity::parse(memory_request).expect("request")
        };
        PodInfo {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            qos: if request.is_zero() {
                QosClass::BestEffort
            } else {
                QosClass::Burstable
            },
            priority,
            critical: false,
            static_pod: false,
            mirror_pod: false,
            owner: None,
            termination_grace_period_seconds: Some(30),
            memory_request: request.clone(),
            ephemeral_storage_request: Quantity::default(),
            pod_memory_request: None,
            containers: vec![ContainerInfo {
                name: name.into(),
                memory_request: request,
                ephemeral_storage_request: Quantity::default(),
                usage: Default::default(),
            }],
        }
    }

    pub(crate) fn mem(name: &str, bytes: u64) -> (String, PodUsage) {
        (
            format!("uid-{name}"),
            PodUsage {
                memory: Some(bytes),
                ..PodUsage::default()
            },
        )
    }

    const MI: u64 = 1 << 20;

    fn names(r: &[RankedPod]) -> Vec<&str> {
        r.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn memory_exceeding_requests_first() {
        // Same priority: the pod over its request goes first even if it uses less.
        let pods = vec![pod("under", 0, "1Gi"), pod("over", 0, "100Mi")];
        let usage = HashMap::from([mem("under", 900 * MI), mem("over", 200 * MI)]);
        let r = rank_pods(Resource::Memory, &pods, &usage);
        assert_eq!(names(&r), ["over", "under"]);
        assert_eq!(r[0].exceeds_request, Some(true));
        assert_eq!(r[0].usage_above_request, Some((100 * MI) as i64));
        assert_eq!(r[1].exceeds_request, Some(false));
    }

    #[test]
    fn memory_priority_before_usage() {
        // Both over their requests: lower priority first, regardless of usage.
        let pods = vec![pod("high", 1000, "100Mi"), pod("low", 0, "100Mi")];
        let usage = HashMap::from([mem("high", 2000 * MI), mem("low", 150 * MI)]);
        assert_eq!(
            names(&rank_pods(Resource::Memory, &pods, &usage)),
            ["low", "high"]
        );
        // Exceeding requests outranks priority.
        let pods = vec![pod("low-under", 0, "1Gi"), pod("high-over", 1000, "100Mi")];
        let usage = HashMap::from([mem("low-under", 10 * MI), mem("high-over", 101 * MI)]);
        assert_eq!(
            names(&rank_pods(Resource::Memory, &pods, &usage)),
            ["high-over", "low-under"]
        );
    }

    #[test]
    fn memory_usage_above_request_breaks_ties() {
        let pods = vec![pod("a", 0, "100Mi"), pod("b", 0, "100Mi"), pod("c", 0, "")];
        let usage = HashMap::from([mem("a", 150 * MI), mem("b", 400 * MI), mem("c", 250 * MI)]);
        assert_eq!(
            names(&rank_pods(Resource::Memory, &pods, &usage)),
            ["b", "c", "a"]
        );
        // Under requests too: the one closest to (or least below) its request first.
        let pods = vec![pod("far", 0, "1Gi"), pod("near", 0, "1Gi")];
        let usage = HashMap::from([mem("far", 100 * MI), mem("near", 1000 * MI)]);
        assert_eq!(
            names(&rank_pods(Resource::Memory, &pods, &usage)),
            ["near", "far"]
        );
    }

    #[test]
    fn pods_without_stats_rank_first() {
        let pods = vec![pod("measured", 0, ""), pod("unmeasured", 1000, "1Gi")];
        let usage = HashMap::from([mem("measured", 5000 * MI)]);
        let r = rank_pods(Resource::Memory, &pods, &usage);
        assert_eq!(names(&r), ["unmeasured", "measured"]);
        assert!(!r[0].stats_found);
        assert_eq!(r[0].usage_above_request, None);
    }

    #[test]
    fn the_docs_ordering_best_effort_burstable_guaranteed() {
        let mut guaranteed = pod("guaranteed", 0, "512Mi");
        guaranteed.qos = QosClass::Guaranteed;
        let pods = vec![
            guaranteed,
            pod("burstable-over", 0, "256Mi"),
            pod("burstable-under", 0, "128Mi"),
            pod("besteffort-big", 0, ""),
            pod("besteffort-small", 0, ""),
        ];
        let usage = HashMap::from([
            mem("guaranteed", 500 * MI),
            mem("burstable-over", 512 * MI),
            mem("burstable-under", 64 * MI),
            mem("besteffort-big", 2048 * MI),
            mem("besteffort-small", 1024 * MI),
        ]);
        assert_eq!(
            names(&rank_pods(Resource::Memory, &pods, &usage)),
            [
                "besteffort-big",
                "besteffort-small",
                "burstable-over",
                "guaranteed",
                "burstable-under",
            ]
        );
    }

    #[test]
    fn disk_ranks_by_ephemeral_storage() {
        let mut a = pod("a", 0, "");
        a.ephemeral_storage_request = Quantity::parse("1Gi").expect("q");
        let b = pod("b", 0, "");
        let pods = vec![a, b];
        let usage = HashMap::from([
            (
                "uid-a".to_owned(),
                PodUsage {
                    disk: Some(900 * MI),
                    ..Default::default()
                },
            ),
            (
                "uid-b".to_owned(),
                PodUsage {
                    disk: Some(10 * MI),
                    ..Default::default()
                },
            ),
        ]);
        let r = rank_pods(Resource::EphemeralStorage, &pods, &usage);
        assert_eq!(names(&r), ["b", "a"], "b exceeds its zero request");
        // Inodes not measured: every pod counts 0, so priority and then the ephemeral-storage
        // request decide.
        let r = rank_pods(Resource::Inodes, &pods, &usage);
        assert_eq!(names(&r), ["b", "a"]);
        assert_eq!(r[0].exceeds_request, Some(false));
    }

    /// `buildSignalToRankFunc`: which part of a pod's disk ranks it, per signal and layout.
    #[test]
    fn the_disk_share_follows_the_kubelets_rank_functions() {
        use Signal::*;
        let single = FsLayout::default();
        let image = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: false,
        };
        let split = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: true,
        };
        let cases = [
            (single, NodeFsAvailable, DiskShare::All),
            (single, ImageFsAvailable, DiskShare::All),
            (single, ContainerFsInodesFree, DiskShare::All),
            (image, NodeFsAvailable, DiskShare::VolumesAndLogs),
            (image, NodeFsInodesFree, DiskShare::VolumesAndLogs),
            (image, ImageFsAvailable, DiskShare::WritableLayers),
            (image, ImageFsInodesFree, DiskShare::WritableLayers),
            (image, ContainerFsAvailable, DiskShare::WritableLayers),
            (split, NodeFsAvailable, DiskShare::All),
            (split, ContainerFsAvailable, DiskShare::All),
            (split, ImageFsAvailable, DiskShare::Images),
            (split, ImageFsInodesFree, DiskShare::Images),
            (image, MemoryAvailable, DiskShare::All),
        ];
        for (layout, signal, want) in cases {
            assert_eq!(
                DiskShare::for_signal(signal, layout),
                want,
                "{signal:?} on {layout:?}"
            );
        }
    }

    /// On a dedicated image filesystem the pod with the large volume goes first for nodefs, the
    /// pod with the large writable layer for imagefs; on one filesystem their totals decide.
    #[test]
    fn disk_ranking_uses_the_share_of_the_signals_filesystem() {
        let pods = vec![pod("volume", 0, ""), pod("layer", 0, "")];
        let disk = |total: u64, layers: u64| PodUsage {
            disk: Some(total * MI),
            writable_layers: Some(layers * MI),
            ..Default::default()
        };
        let usage = HashMap::from([
            ("uid-volume".to_owned(), disk(600, 10)),
            ("uid-layer".to_owned(), disk(700, 500)),
        ]);
        let rank = |share| {
            let r = rank_pods_by(Resource::EphemeralStorage, share, &pods, &usage);
            r.into_iter().map(|p| p.name).collect::<Vec<_>>()
        };
        assert_eq!(rank(DiskShare::All), ["layer", "volume"]);
        assert_eq!(rank(DiskShare::VolumesAndLogs), ["volume", "layer"]);
        assert_eq!(rank(DiskShare::WritableLayers), ["layer", "volume"]);
        // Images belong to no pod: every pod counts 0, the input order stays.
        let r = rank_pods_by(Resource::EphemeralStorage, DiskShare::Images, &pods, &usage);
        assert_eq!(names(&r), ["volume", "layer"]);
        assert!(r.iter().all(|p| p.stats_found));
        // A pod without a layer figure counts its whole disk as volumes and logs.
        let usage = HashMap::from([
            (
                "uid-volume".to_owned(),
                PodUsage {
                    disk: Some(600 * MI),
                    ..Default::default()
                },
            ),
            ("uid-layer".to_owned(), disk(700, 500)),
        ]);
        let r = rank_pods_by(
            Resource::EphemeralStorage,
            DiskShare::WritableLayers,
            &pods,
            &usage,
        );
        assert_eq!(names(&r), ["layer", "volume"]);
    }

    #[test]
    fn pid_ranks_by_priority_then_process_count() {
        let pods = vec![pod("few", 0, ""), pod("many", 0, ""), pod("low", -10, "")];
        let procs = |n| PodUsage {
            processes: Some(n),
            ..Default::default()
        };
        let usage = HashMap::from([
            ("uid-few".to_owned(), procs(3)),
            ("uid-many".to_owned(), procs(300)),
            ("uid-low".to_owned(), procs(1)),
        ]);
        let r = rank_pods(Resource::Pids, &pods, &usage);
        assert_eq!(names(&r), ["low", "many", "few"]);
        assert_eq!(r[1].usage, Some(300));
        assert_eq!(r[1].exceeds_request, None);
    }

    #[test]
    fn ties_keep_input_order() {
        let pods = vec![pod("x", 0, ""), pod("y", 0, ""), pod("z", 0, "")];
        let usage = HashMap::from([mem("x", MI), mem("y", MI), mem("z", MI)]);
        let r = rank_pods(Resource::Memory, &pods, &usage);
        assert_eq!(names(&r), ["x", "y", "z"]);
        assert_eq!(r.iter().map(|p| p.index).collect::<Vec<_>>(), [0, 1, 2]);
    }

    /// A pod as the kubelet's `newPod` makes it, with a priority and an ephemeral-storage
    /// request.
    fn disk_pod(name: &str, priority: i32, ephemeral_request: &str) -> PodInfo {
        let mut p = pod(name, priority, "");
        if !ephemeral_request.is_empty() {
            let q = Quantity::parse(ephemeral_request).expect("request");
            p.ephemeral_storage_request = q.clone();
            p.containers[0].ephemeral_storage_request = q;
        }
        p
    }

    /// `newPodDiskStats(pod, rootFsUsed, logsUsed, perLocalVolumeUsed)`, in MiB: one container
    /// and one emptyDir volume.
    fn disk_stats(name: &str, rootfs: u64, logs: u64, volume: u64) -> (String, PodUsage) {
        (
            format!("uid-{name}"),
            PodUsage {
                disk: Some((rootfs + logs + volume) * MI),
                writable_layers: Some(rootfs * MI),
                ..PodUsage::default()
            },
        )
    }

    /// `newPodInodeStats(pod, rootFsInodesUsed, logsInodesUsed, perLocalVolumeInodesUsed)`.
    fn inode_stats(name: &str, rootfs: u64, logs: u64, volume: u64) -> (String, PodUsage) {
        (
            format!("uid-{name}"),
            PodUsage {
                inodes: Some(rootfs + logs + volume),
                writable_layer_inodes: Some(rootfs),
                ..PodUsage::default()
            },
        )
    }

    /// The kubelet's `TestOrderedbyInodes`: the greediest inode consumer first.
    #[test]
    fn kubelet_ordered_by_inodes() {
        let pods = vec![
            disk_pod("low", 0, ""),
            disk_pod("medium", 0, ""),
            disk_pod("high", 0, ""),
        ];
        let usage = HashMap::from([
            inode_stats("low", 50_000, 100_000, 50_000),     // 200000
            inode_stats("medium", 100_000, 150_000, 50_000), // 300000
            inode_stats("high", 200_000, 150_000, 50_000),   // 400000
        ]);
        let r = rank_pods(Resource::Inodes, &pods, &usage);
        assert_eq!(names(&r), ["high", "medium", "low"]);
        assert_eq!(r[0].usage, Some(400_000));
        // No pod requests inodes: every pod that uses one exceeds its (zero) request.
        assert!(r.iter().all(|p| p.exceeds_request == Some(true)));
    }

    /// The kubelet's `TestOrderedByPriorityInodes`: priority, then inodes.
    #[test]
    fn kubelet_ordered_by_priority_inodes() {
        let (low, high) = (-134, 12534);
        let pods = vec![
            disk_pod("high-priority-low-usage", high, ""),
            disk_pod("high-priority-high-usage", high, ""),
            disk_pod("low-priority-low-usage", low, ""),
            disk_pod("low-priority-high-usage", low, ""),
        ];
        let usage = HashMap::from([
            inode_stats("low-priority-high-usage", 50_000, 100_000, 250_000),
            inode_stats("low-priority-low-usage", 60_000, 30_000, 10_000),
            inode_stats("high-priority-high-usage", 150_000, 150_000, 50_000),
            inode_stats("high-priority-low-usage", 10_000, 40_000, 100_000),
        ]);
        assert_eq!(
            names(&rank_pods(Resource::Inodes, &pods, &usage)),
            [
                "low-priority-high-usage",
                "low-priority-low-usage",
                "high-priority-high-usage",
                "high-priority-low-usage",
            ]
        );
    }

    /// `TestOrderedbyInodes`' pods on each layout and inode signal: the inodes of the share of
    /// the signal's filesystem rank them (`buildSignalToRankFunc` with `resourceInodes`).
    #[test]
    fn kubelet_ordered_by_inodes_per_filesystem() {
        use Signal::*;
        let pods = vec![
            disk_pod("layers", 0, ""),
            disk_pod("logs", 0, ""),
            disk_pod("volume", 0, ""),
        ];
        let usage = HashMap::from([
            inode_stats("layers", 300_000, 10_000, 10_000), // 320000, 20000 without layers
            inode_stats("logs", 10_000, 200_000, 10_000),   // 220000, 210000
            inode_stats("volume", 10_000, 10_000, 250_000), // 270000, 260000
        ]);
        let image = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: false,
        };
        let split = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: true,
        };
        let cases: [(FsLayout, Signal, [&str; 3]); 7] = [
            (
                FsLayout::default(),
                NodeFsInodesFree,
                ["layers", "volume", "logs"],
            ),
            (
                FsLayout::default(),
                ImageFsInodesFree,
                ["layers", "volume", "logs"],
            ),
            (image, NodeFsInodesFree, ["volume", "logs", "layers"]),
            (image, ImageFsInodesFree, ["layers", "logs", "volume"]),
            (image, ContainerFsInodesFree, ["layers", "logs", "volume"]),
            (split, ContainerFsInodesFree, ["layers", "volume", "logs"]),
            // Images belong to no pod: all count 0 and the input order stays.
            (split, ImageFsInodesFree, ["layers", "logs", "volume"]),
        ];
        for (layout, signal, want) in cases {
            let share = DiskShare::for_signal(signal, layout);
            let r = rank_pods_by(Resource::Inodes, share, &pods, &usage);
            assert_eq!(names(&r), want, "{signal:?} on {layout:?}");
        }
    }

    /// The kubelet's `TestOrderedbyDisk` (usage above the ephemeral-storage request), through
    /// the whole `rankDiskPressureFunc` chain.
    #[test]
    fn kubelet_ordered_by_disk() {
        let pods = vec![
            disk_pod("best-effort-high", 0, ""),
            disk_pod("best-effort-low", 0, ""),
            disk_pod("burstable-high", 0, "100Mi"),
            disk_pod("burstable-low", 0, "100Mi"),
            disk_pod("guaranteed-high", 0, "400Mi"),
            disk_pod("guaranteed-low", 0, "400Mi"),
        ];
        let usage = HashMap::from([
            disk_stats("best-effort-high", 50, 100, 150), // 300Mi - 0 = 300Mi
            disk_stats("best-effort-low", 25, 25, 50),    // 100Mi - 0 = 100Mi
            disk_stats("burstable-high", 150, 150, 50),   // 350Mi - 100Mi = 250Mi
            disk_stats("burstable-low", 25, 35, 50),      // 110Mi - 100Mi = 10Mi
            disk_stats("guaranteed-high", 225, 100, 50),  // 375Mi - 400Mi = -25Mi
            disk_stats("guaranteed-low", 25, 45, 50),     // 120Mi - 400Mi = -280Mi
        ]);
        let r = rank_pods(Resource::EphemeralStorage, &pods, &usage);
        assert_eq!(
            names(&r),
            [
                "best-effort-high",
                "burstable-high",
                "best-effort-low",
                "burstable-low",
                "guaranteed-high",
                "guaranteed-low",
            ]
        );
        assert_eq!(r[4].usage_above_request, Some(-25 * MI as i64));
    }

    /// `TestOrderedbyDisk`'s pods with a dedicated imagefs: nodefs ranks by logs and volumes
    /// (`fsStatsLogs, fsStatsLocalVolumeSource`), imagefs and containerfs by the writable layer
    /// (`fsStatsRoot, fsStatsImages`); with a split containerfs, nodefs and containerfs rank by
    /// all three and imagefs by images alone.
    #[test]
    fn kubelet_ordered_by_disk_per_filesystem() {
        use Signal::*;
        let pods = vec![
            disk_pod("best-effort-high", 0, ""),
            disk_pod("best-effort-low", 0, ""),
            disk_pod("burstable-high", 0, "100Mi"),
            disk_pod("burstable-low", 0, "100Mi"),
            disk_pod("guaranteed-high", 0, "400Mi"),
            disk_pod("guaranteed-low", 0, "400Mi"),
        ];
        let usage = HashMap::from([
            disk_stats("best-effort-high", 50, 100, 150), // logs+volume 250, root 50
            disk_stats("best-effort-low", 25, 25, 50),    // 75, 25
            disk_stats("burstable-high", 150, 150, 50),   // 200-100 = 100, 150-100 = 50
            disk_stats("burstable-low", 25, 35, 50),      // 85-100 = -15, 25-100 = -75
            disk_stats("guaranteed-high", 225, 100, 50),  // 150-400 = -250, 225-400 = -175
            disk_stats("guaranteed-low", 25, 45, 50),     // 95-400 = -305, 25-400 = -375
        ]);
        let image = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: false,
        };
        let split = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: true,
        };
        let all = [
            "best-effort-high",
            "burstable-high",
            "best-effort-low",
            "burstable-low",
            "guaranteed-high",
            "guaranteed-low",
        ];
        let logs_and_volumes = [
            "best-effort-high",
            "burstable-high",
            "best-effort-low",
            "burstable-low",
            "guaranteed-high",
            "guaranteed-low",
        ];
        // Writable layers: the best-effort pods and burstable-high exceed their requests, by
        // 50, 25 and 50 MiB (a tie the kubelet's unstable sort leaves open; input order here).
        let layers = [
            "best-effort-high",
            "burstable-high",
            "best-effort-low",
            "burstable-low",
            "guaranteed-high",
            "guaranteed-low",
        ];
        // Images: every pod uses 0, none exceeds its request; usage less request decides.
        let images = [
            "best-effort-high",
            "best-effort-low",
            "burstable-high",
            "burstable-low",
            "guaranteed-high",
            "guaranteed-low",
        ];
        let cases: [(FsLayout, Signal, [&str; 6]); 7] = [
            (FsLayout::default(), NodeFsAvailable, all),
            (FsLayout::default(), ImageFsAvailable, all),
            (image, NodeFsAvailable, logs_and_volumes),
            (image, ImageFsAvailable, layers),
            (image, ContainerFsAvailable, layers),
            (split, ContainerFsAvailable, all),
            (split, ImageFsAvailable, images),
        ];
        for (layout, signal, want) in cases {
            let share = DiskShare::for_signal(signal, layout);
            let r = rank_pods_by(Resource::EphemeralStorage, share, &pods, &usage);
            assert_eq!(names(&r), want, "{signal:?} on {layout:?}");
        }
        // The shares themselves, for the pod that tells them apart.
        let burstable = |signal, layout| {
            let share = DiskShare::for_signal(signal, layout);
            let r = rank_pods_by(Resource::EphemeralStorage, share, &pods, &usage);
            r.into_iter()
                .find(|p| p.name == "burstable-high")
                .and_then(|p| p.usage)
        };
        assert_eq!(
            burstable(NodeFsAvailable, FsLayout::default()),
            Some(350 * MI)
        );
        assert_eq!(burstable(NodeFsAvailable, image), Some(200 * MI));
        assert_eq!(burstable(ImageFsAvailable, image), Some(150 * MI));
        assert_eq!(burstable(NodeFsAvailable, split), Some(350 * MI));
        assert_eq!(burstable(ImageFsAvailable, split), Some(0));
    }
}
