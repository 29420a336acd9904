//! Disk that evicted pods still hold until the kubelet's garbage collection frees it.
//!
//! An evicted pod's emptyDir volumes go when the kubelet tears the pod down, but its containers'
//! writable layers and logs stay on disk until the kubelet's container garbage collection
//! removes the dead containers (`ContainerGCPeriod`, one minute). The kubelet never evicts a
//! second pod for that space: on disk pressure its eviction manager first reclaims node-level
//! resources (dead containers and unused images), and only then ranks pods. node-monitor leaves
//! that collection to the kubelet, so it must not count the space as lost either: for a bounded
//! window after a disk eviction, the evicted pod's measured usage is credited back to the disk
//! signals, until the disk shows it freed or the window ends.
//!
//! Each disk is credited with the part of the pod that lives on it, by the layout the
//! observations carry (the shares of [`DiskShare::for_signal`]): with a dedicated image
//! filesystem, the volumes and logs go back to nodefs and the writable layers to imagefs and
//! containerfs, rather than the whole pod to each (which would hide real nodefs pressure for the
//! window behind a pod whose bytes were all in its layer).
//!
//! Pure: [`PendingReclaim::record`] at an eviction, [`PendingReclaim::credited`] before each
//! decision, both with the observations and `now`.

use std::time::Duration;

use crate::{
    eviction::rank::DiskShare,
    signals::{Observations, Signal},
    units::clock::Timestamp,
};

/// How long an evicted pod's disk is credited: the kubelet's container garbage collection
/// period (one minute) and a margin for its pass to finish.
pub const RECLAIM_WINDOW: Duration = Duration::from_secs(90);

/// The byte signals of the disks a pod's ephemeral storage lives on.
const DISK_BYTES: [Signal; 3] = [
    Signal::NodeFsAvailable,
    Signal::ImageFsAvailable,
    Signal::ContainerFsAvailable,
];

/// One disk as an evicted pod left it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Disk {
    signal: Signal,
    /// The pod's bytes on this disk.
    bytes: i64,
    /// What the disk had available at the eviction.
    baseline: i64,
    /// The most the disk has risen since (what the kubelet has freed so far; never lowered, so
    /// a disk filling again does not bring the freed space back into the credit).
    freed: i64,
}

/// One evicted pod's disk, per disk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    uid: String,
    at: Timestamp,
    disks: Vec<Disk>,
}

impl Entry {
    /// Notes how far each disk has risen since the eviction.
    fn observe(&mut self, observations: &Observations) {
        for d in &mut self.disks {
            if let Some(now) = observations.signals.get(&d.signal) {
                d.freed = d.freed.max(now.available.saturating_sub(d.baseline));
            }
        }
    }

    /// What is still to be freed on `signal`'s disk: the pod's bytes there less the most the
    /// disk rose since the eviction.
    fn remaining(&self, signal: Signal) -> i64 {
        self.disks
            .iter()
            .find(|d| d.signal == signal)
            .map_or(0, |d| d.bytes.saturating_sub(d.freed).max(0))
    }
}

/// The disk evicted pods still hold, by pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingReclaim {
    entries: Vec<Entry>,
}

impl PendingReclaim {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes that pod `uid`, whose ephemeral storage measured `bytes`, was evicted at `now`,
    /// when the disks showed `observations`. Each disk is credited with the pod's share on it,
    /// by `observations.filesystem` and the pod's writable-layer figure in
    /// `observations.pods` (without one, the whole `bytes` on every disk). A pod recorded again
    /// replaces its entry.
    pub fn record(&mut self, uid: &str, bytes: u64, observations: &Observations, now: Timestamp) {
        self.entries.retain(|e| e.uid != uid);
        let layers = observations.pods.get(uid).and_then(|u| u.writable_layers);
        let disks: Vec<Disk> = DISK_BYTES
            .iter()
            .filter_map(|s| {
                let share = DiskShare::for_signal(*s, observations.filesystem);
                let on_disk = share.of(Some(bytes), layers).unwrap_or(0);
                Some(Disk {
                    signal: *s,
                    bytes: i64::try_from(on_disk).unwrap_or(i64::MAX),
                    baseline: observations.signals.get(s)?.available,
                    freed: 0,
                })
            })
            .filter(|d| d.bytes > 0)
            .collect();
        // Nothing on any observed disk: nothing to credit.
        if disks.is_empty() {
            return;
        }
        self.entries.push(Entry {
            uid: uid.to_owned(),
            at: now,
            disks,
        });
    }

    /// `observations` with the disk still held by evicted pods added back to each disk's
    /// available bytes (never above its capacity). Entries whose space the disk shows freed, or
    /// older than [`RECLAIM_WINDOW`], are dropped first.
    pub fn credited(&mut self, observations: &Observations, now: Timestamp) -> Observations {
        for e in &mut self.entries {
            e.observe(observations);
        }
        self.entries.retain(|e| {
            now.saturating_since(e.at) < RECLAIM_WINDOW
                && DISK_BYTES.iter().any(|s| e.remaining(*s) > 0)
        });
        let mut out = observations.clone();
        for signal in DISK_BYTES {
            let credit: i64 = self
                .entries
                .iter()
                .map(|e| e.remaining(signal))
                .fold(0, i64::saturating_add);
            if let Some(o) = out.signals.get_mut(&signal)
                && credit > 0
            {
                o.available = o.available.saturating_add(credit).min(o.capacity);
            }
        }
        out
    }

    /// Bytes still credited on the node's disk (`nodefs.available`), as of the last
    /// [`PendingReclaim::credited`].
    pub fn pending_bytes(&self) -> i64 {
        self.entries
            .iter()
            .map(|e| e.remaining(Signal::NodeFsAvailable))
            .fold(0, i64::saturating_add)
    }

    /// The number of evicted pods whose disk is still credited.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no evicted pod's disk is credited.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::SignalObservation;

    const MIB: i64 = 1 << 20;

    fn disk(nodefs: i64) -> Observations {
        let mut o = Observations::default();
        o.signals.insert(
            Signal::NodeFsAvailable,
            SignalObservation {
                available: nodefs,
                capacity: 2_000 * MIB,
            },
        );
        o.signals.insert(
            Signal::MemoryAvailable,
            SignalObservation {
                available: 1_000 * MIB,
                capacity: 2_000 * MIB,
            },
        );
        o
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp::ZERO + Duration::from_secs(secs)
    }

    fn nodefs(o: &Observations) -> i64 {
        o.signals[&Signal::NodeFsAvailable].available
    }

    #[test]
    fn an_evicted_pods_disk_is_credited_until_freed_or_the_window_ends() {
        // (available at the eviction, pod bytes, available later, seconds later, credited nodefs)
        let cases = [
            // Nothing freed yet: the whole pod is credited.
            (1_100, 600, 1_100, 10, 1_700),
            // The disk kept filling meanwhile: only the pod's bytes are credited.
            (1_100, 600, 1_000, 10, 1_600),
            // Part freed (the volumes went, the layer not yet): the rest is credited.
            (1_100, 600, 1_300, 10, 1_700),
            // All freed: nothing more.
            (1_100, 600, 1_700, 10, 1_700),
            (1_100, 600, 1_800, 10, 1_800),
            // The window ended: the disk is taken as it is.
            (1_100, 600, 1_100, 90, 1_100),
            // Never above capacity.
            (1_900, 600, 1_900, 10, 2_000),
        ];
        for (before, bytes, later, secs, want) in cases {
            let mut p = PendingReclaim::new();
            p.record(
                "uid-1",
                u64::try_from(bytes * MIB).expect("bytes"),
                &disk(before * MIB),
                at(0),
            );
            let got = p.credited(&disk(later * MIB), at(secs));
            assert_eq!(nodefs(&got) / MIB, want, "{before} {bytes} {later} {secs}");
            // Other signals are untouched.
            assert_eq!(
                got.signals[&Signal::MemoryAvailable],
                disk(0).signals[&Signal::MemoryAvailable]
            );
        }
    }

    #[test]
    fn settled_and_expired_pods_are_forgotten_and_a_pod_recorded_twice_counts_once() {
        let mut p = PendingReclaim::new();
        p.record("a", 100 * (1 << 20), &disk(1_000 * MIB), at(0));
        p.record("b", 200 * (1 << 20), &disk(1_000 * MIB), at(50));
        p.record("b", 200 * (1 << 20), &disk(1_000 * MIB), at(50));
        assert_eq!(p.len(), 2);
        let o = p.credited(&disk(1_000 * MIB), at(60));
        assert_eq!(nodefs(&o), 1_300 * MIB);
        assert_eq!(p.pending_bytes(), 300 * MIB);
        // "a" ages out of the window; "b" is still held.
        let o = p.credited(&disk(1_000 * MIB), at(95));
        assert_eq!((p.len(), nodefs(&o)), (1, 1_200 * MIB));
        // The disk shows b's 200 MiB freed: nothing is left to credit.
        let o = p.credited(&disk(1_200 * MIB), at(100));
        assert_eq!((p.len(), nodefs(&o)), (0, 1_200 * MIB));
        // An empty pod, or a disk that was never observed, credits nothing.
        p.record("c", 0, &disk(1_000 * MIB), at(100));
        assert!(p.is_empty());
        p.record("d", 100, &Observations::default(), at(100));
        let o = p.credited(&disk(1_000 * MIB), at(101));
        assert_eq!((p.len(), nodefs(&o)), (0, 1_000 * MIB));
    }

    /// With a dedicated image filesystem the pod's volumes and logs go back to nodefs and its
    /// writable layer to imagefs and containerfs; on one filesystem the whole pod to each; with
    /// a split containerfs, nothing to imagefs (images are no pod's).
    #[test]
    fn each_disk_is_credited_with_the_pods_share_on_it() {
        use crate::signals::{FsLayout, PodUsage, SignalObservation};
        let obs = |layout: FsLayout, available: i64| {
            let mut o = Observations::default();
            for s in DISK_BYTES {
                o.signals.insert(
                    s,
                    SignalObservation {
                        available: available * MIB,
                        capacity: 10_000 * MIB,
                    },
                );
            }
            o.pods.insert(
                "uid-1".into(),
                PodUsage {
                    disk: Some(600 << 20),
                    writable_layers: Some(500 << 20),
                    ..PodUsage::default()
                },
            );
            o.filesystem = layout;
            o
        };
        let image = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: false,
        };
        let split = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: true,
        };
        // (layout, credited nodefs, imagefs, containerfs) over 1 000 MiB available.
        let cases = [
            (FsLayout::default(), 1_600, 1_600, 1_600),
            (image, 1_100, 1_500, 1_500),
            (split, 1_600, 1_000, 1_600),
        ];
        for (layout, nodefs, imagefs, containerfs) in cases {
            let mut p = PendingReclaim::new();
            p.record("uid-1", 600 << 20, &obs(layout, 1_000), at(0));
            let o = p.credited(&obs(layout, 1_000), at(5));
            let got = |s: Signal| o.signals[&s].available / MIB;
            assert_eq!(
                (
                    got(Signal::NodeFsAvailable),
                    got(Signal::ImageFsAvailable),
                    got(Signal::ContainerFsAvailable)
                ),
                (nodefs, imagefs, containerfs),
                "{layout:?}"
            );
            assert_eq!(p.pending_bytes(), (nodefs - 1_000) * MIB, "{layout:?}");
        }
    }

    #[test]
    fn space_once_freed_is_not_credited_again_when_the_disk_fills_anew() {
        let mut p = PendingReclaim::new();
        p.record("filler", 600 * (1 << 20), &disk(1_100 * MIB), at(0));
        // The kubelet freed 590 MiB of the pod's 600 (the rest was never the pod's alone).
        let o = p.credited(&disk(1_690 * MIB), at(5));
        assert_eq!((p.len(), nodefs(&o)), (1, 1_700 * MIB));
        // Another pod now fills the disk below where it was at the eviction: only the 10 MiB
        // not yet seen freed are credited, not the 600 again.
        let o = p.credited(&disk(1_000 * MIB), at(20));
        assert_eq!(nodefs(&o), 1_010 * MIB);
        assert_eq!(p.pending_bytes(), 10 * MIB);
    }
}
