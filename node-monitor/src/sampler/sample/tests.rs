use std::{fs, path::PathBuf};

use super::*;

/// A trigger for tests: when, and the pass it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tick {
    at: Instant,
    pass: SampleKind,
}

impl Trigger for Tick {
    fn at(&self) -> Instant {
        self.at
    }

    fn pass(&self) -> SampleKind {
        self.pass
    }
}

const MIB: u64 = 1 << 20;
const UID_A: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
const UID_B: &str = "1a1b2c3d-4e5f-6789-abcd-ef0123456789";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let f = Self { _dir: dir, root };
        f.write(
            "proc/meminfo",
            "MemTotal:        1048576 kB\nMemFree: 1 kB\n",
        );
        f.write("proc/loadavg", "0.10 0.20 0.30 3/412 999\n");
        f.write("proc/sys/kernel/pid_max", "32768\n");
        f.write("proc/sys/kernel/threads-max", "20000\n");
        fs::create_dir_all(f.root.join("kubelet")).expect("mkdir");
        fs::create_dir_all(f.root.join("images")).expect("mkdir");
        f
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    fn config(&self, version: CgroupVersion, node: &str) -> SamplerConfig {
        SamplerConfig {
            cgroup_root: self.root.join("cg"),
            cgroup_version: Some(version),
            node_cgroup: node.into(),
            proc_root: self.root.join("proc"),
            kubelet_root: self.root.join("kubelet"),
            pod_log_root: self.root.join("logs"),
            image_fs: Some(self.root.join("images")),
            ..SamplerConfig::default()
        }
    }
}

fn obs(o: &Observations, s: Signal) -> Option<(i64, i64)> {
    o.signals.get(&s).map(|v| (v.available, v.capacity))
}

fn i(v: u64) -> i64 {
    i64::try_from(v).expect("fits")
}

#[test]
fn sampler_can_move_to_blocking_threads() {
    fn send<T: Send + 'static>() {}
    send::<Sampler>();
    send::<TimedObservations<Tick>>();
}

#[test]
fn cgroup_v2_root_follows_the_kubelet_v2_script() {
    let f = Fixture::new();
    // Root: no memory.current; usage = anon + file.
    f.write(
        "cg/memory.stat",
        &format!(
            "anon {}\nfile {}\ninactive_file {}\n",
            100 * MIB,
            50 * MIB,
            30 * MIB
        ),
    );
    f.write("cg/kubepods/memory.current", &format!("{}\n", 80 * MIB));
    f.write("cg/kubepods/memory.max", &format!("{}\n", 512 * MIB));
    f.write(
        "cg/kubepods/memory.stat",
        &format!("inactive_file {}\n", 10 * MIB),
    );
    let pod_a = format!("cg/kubepods/burstable/pod{UID_A}");
    f.write(
        &format!("{pod_a}/memory.current"),
        &format!("{}\n", 64 * MIB),
    );
    f.write(
        &format!("{pod_a}/memory.stat"),
        &format!("inactive_file {}\n", 4 * MIB),
    );
    f.write(&format!("{pod_a}/pids.current"), "7\n");
    // Pod B: no pids controller: threads counted from cgroup.threads, container included.
    let pod_b = format!("cg/kubepods/besteffort/pod{UID_B}");
    f.write(
        &format!("{pod_b}/memory.current"),
        &format!("{}\n", 8 * MIB),
    );
    f.write(
        &format!("{pod_b}/memory.stat"),
        &format!("inactive_file {}\n", 9 * MIB),
    );
    f.write(&format!("{pod_b}/cgroup.threads"), "");
    f.write(&format!("{pod_b}/ctr/cgroup.threads"), "10\n11\n12\n");

    let mut s = Sampler::new(f.config(CgroupVersion::V2, "/")).expect("sampler");
    let o = s.sample(SampleKind::Fast);
    let gib = i(1024 * MIB);
    assert_eq!(
        obs(&o, Signal::MemoryAvailable),
        Some((gib - i(150 * MIB - 30 * MIB), gib))
    );
    assert_eq!(
        s.last_node_memory(),
        Some(MemoryReading {
            capacity: 1024 * MIB,
            usage: 150 * MIB,
            inactive_file: 30 * MIB,
            reclaimable_active_file: 0,
            working_set: 120 * MIB
        })
    );
    assert_eq!(
        obs(&o, Signal::AllocatableMemoryAvailable),
        Some((i(512 * MIB - 70 * MIB), i(512 * MIB)))
    );
    assert_eq!(obs(&o, Signal::PidAvailable), Some((20000 - 412, 20000)));
    for sig in [
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ContainerFsAvailable,
    ] {
        let (avail, cap) = obs(&o, sig).unwrap_or_else(|| panic!("{sig} missing"));
        assert!(
            cap > 0 && avail >= 0 && avail <= cap,
            "{sig}: {avail}/{cap}"
        );
    }
    // Same filesystem (one tempdir): not a dedicated imagefs.
    assert_eq!(s.has_dedicated_image_fs(), Some(false));
    assert_eq!(o.pods.len(), 2);
    assert_eq!(
        o.pods[UID_A],
        PodUsage {
            memory: Some(60 * MIB),
            disk: None,
            writable_layers: None,
            processes: Some(7),
            ..PodUsage::default()
        }
    );
    // Inactive file above usage clamps the working set at 0.
    assert_eq!(o.pods[UID_B].memory, Some(0));
    assert_eq!(o.pods[UID_B].processes, Some(3));
}

#[test]
fn cgroup_v1_node_cgroup_uses_its_limit_and_files() {
    let f = Fixture::new();
    let node = "cg/memory/sim/node";
    f.write(
        &format!("{node}/memory.usage_in_bytes"),
        &format!("{}\n", 300 * MIB),
    );
    f.write(
        &format!("{node}/memory.limit_in_bytes"),
        &format!("{}\n", 512 * MIB),
    );
    f.write(
        &format!("{node}/memory.stat"),
        &format!("inactive_file {}\ntotal_inactive_file {}\n", MIB, 100 * MIB),
    );
    let kp = format!("{node}/kubepods");
    f.write(
        &format!("{kp}/memory.usage_in_bytes"),
        &format!("{}\n", 50 * MIB),
    );
    f.write(
        &format!("{kp}/memory.limit_in_bytes"),
        "9223372036854771712\n",
    );
    f.write(&format!("{kp}/memory.stat"), "total_inactive_file 0\n");
    let mut s = Sampler::new(f.config(CgroupVersion::V1, "sim/node")).expect("sampler");
    let o = s.sample(SampleKind::Fast);
    assert_eq!(
        obs(&o, Signal::MemoryAvailable),
        Some((i(512 * MIB - 200 * MIB), i(512 * MIB)))
    );
    // kubepods without a limit and no allocatable configured: no signal, as in the kubelet.
    assert_eq!(obs(&o, Signal::AllocatableMemoryAvailable), None);
    // With allocatable from the Node's status.
    let mut cfg = f.config(CgroupVersion::V1, "sim/node");
    cfg.allocatable_memory = Some(400 * MIB);
    let mut s = Sampler::new(cfg).expect("sampler");
    let o = s.sample(SampleKind::Fast);
    assert_eq!(
        obs(&o, Signal::AllocatableMemoryAvailable),
        Some((i(350 * MIB), i(400 * MIB)))
    );
    // A limit above MemTotal does not bind: MemTotal is the capacity and the machine's
    // (the v1 root's) working set is what is used, not only the node cgroup's.
    f.write(
        &format!("{node}/memory.limit_in_bytes"),
        &format!("{}\n", 4096 * MIB),
    );
    f.write(
        "cg/memory/memory.usage_in_bytes",
        &format!("{}\n", 700 * MIB),
    );
    f.write(
        "cg/memory/memory.stat",
        &format!("total_inactive_file {}\n", 150 * MIB),
    );
    let o = s.sample(SampleKind::Fast);
    assert_eq!(
        obs(&o, Signal::MemoryAvailable),
        Some((i(1024 * MIB - 550 * MIB), i(1024 * MIB)))
    );
}

#[test]
fn cgroup_v2_node_cgroup_without_a_binding_limit_reads_the_machine() {
    let f = Fixture::new();
    // The node cgroup holds 200 MiB; the machine (the v2 root: anon + file) 600 MiB, of
    // which 100 MiB inactive file.
    f.write(
        "cg/memory.stat",
        &format!(
            "anon {}\nfile {}\ninactive_file {}\n",
            400 * MIB,
            200 * MIB,
            100 * MIB
        ),
    );
    let node = "cg/sim/node";
    f.write(
        &format!("{node}/memory.current"),
        &format!("{}\n", 200 * MIB),
    );
    f.write(
        &format!("{node}/memory.stat"),
        "anon 1\nfile 1\ninactive_file 0\n",
    );
    let machine = Some((i(1024 * MIB - 500 * MIB), i(1024 * MIB)));
    let own = |limit: u64| Some((i(limit - 200 * MIB), i(limit)));
    // (memory.max, what memory.available must be)
    let cases = [
        ("max".to_owned(), machine),
        (format!("{}", 1024 * MIB), machine),
        (format!("{}", 8192 * MIB), machine),
        (format!("{}", 512 * MIB), own(512 * MIB)),
        (format!("{}", 1024 * MIB - 4096), own(1024 * MIB - 4096)),
    ];
    let mut s = Sampler::new(f.config(CgroupVersion::V2, "sim/node")).expect("sampler");
    for (max, want) in cases {
        f.write(&format!("{node}/memory.max"), &format!("{max}\n"));
        let o = s.sample(SampleKind::Signals);
        assert_eq!(obs(&o, Signal::MemoryAvailable), want, "memory.max {max}");
    }
    // The machine's files unreadable: the signal is left out, not taken from the node alone.
    // (A new sampler: one that read the file keeps it open.)
    f.write(&format!("{node}/memory.max"), "max\n");
    fs::remove_file(f.root.join("cg/memory.stat")).expect("rm");
    let mut s = Sampler::new(f.config(CgroupVersion::V2, "sim/node")).expect("sampler");
    let o = s.sample(SampleKind::Signals);
    assert_eq!(obs(&o, Signal::MemoryAvailable), None);
}

#[test]
fn unreadable_values_are_left_out_never_guessed() {
    let f = Fixture::new();
    let node = "cg/memory/n";
    f.write(&format!("{node}/memory.usage_in_bytes"), "100\n");
    f.write(&format!("{node}/memory.limit_in_bytes"), "1000\n");
    f.write(&format!("{node}/memory.stat"), "total_inactive_file 10\n");
    let mut cfg = f.config(CgroupVersion::V1, "n");
    cfg.image_fs = Some(f.root.join("no-such-dir"));
    let mut s = Sampler::new(cfg).expect("sampler");
    let mut o = s.sample(SampleKind::Fast);
    assert_eq!(obs(&o, Signal::MemoryAvailable), Some((910, 1000)));
    assert_eq!(obs(&o, Signal::ImageFsAvailable), None);
    assert_eq!(obs(&o, Signal::ContainerFsAvailable), None);
    assert!(obs(&o, Signal::NodeFsAvailable).is_some());
    // No kubepods directory: no pods, no allocatable signal.
    assert!(o.pods.is_empty());
    assert_eq!(obs(&o, Signal::AllocatableMemoryAvailable), None);

    // A malformed memory.stat removes the signal from the reused observations.
    f.write(&format!("{node}/memory.stat"), "total_inactive_file lots\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::MemoryAvailable), None);
    assert!(obs(&o, Signal::PidAvailable).is_some());
    // total_inactive_file missing entirely.
    f.write(&format!("{node}/memory.stat"), "inactive_file 10\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::MemoryAvailable), None);
    // Recovery puts it back.
    f.write(&format!("{node}/memory.stat"), "total_inactive_file 10\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::MemoryAvailable), Some((910, 1000)));

    // Unreadable meminfo: memory signals go, the others stay. (Kept-open fixture files
    // would still read after an unlink, so the fixtures are corrupted instead; procfs and
    // cgroupfs files do not disappear under an open descriptor without failing it.)
    f.write("proc/meminfo", "MemTotal: many\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::MemoryAvailable), None);
    assert!(obs(&o, Signal::PidAvailable).is_some());

    // One pid sysctl gone: the other bounds; both gone: no signal.
    f.write("proc/sys/kernel/threads-max", "unlimited\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::PidAvailable), Some((32768 - 412, 32768)));
    f.write("proc/sys/kernel/pid_max", "\n");
    s.sample_into(SampleKind::Fast, &mut o);
    assert_eq!(obs(&o, Signal::PidAvailable), None);
}

/// A pod whose walk hits the budget (decoy files in front of a large one) has no disk figures
/// for ranking, so it ranks first for the disk signals, as a pod without statistics; its memory
/// figure stays.
#[test]
fn a_truncated_pod_disk_walk_leaves_the_pod_without_disk_figures() {
    let f = Fixture::new();
    let pod = format!("cg/kubepods/pod{UID_A}");
    f.write(&format!("{pod}/memory.current"), "4096\n");
    f.write(&format!("{pod}/memory.stat"), "inactive_file 0\n");
    f.write(&format!("{pod}/pids.current"), "1\n");
    let vol = f.root.join(format!(
        "kubelet/pods/{UID_A}/volumes/kubernetes.io~empty-dir/data"
    ));
    fs::create_dir_all(&vol).expect("mkdir");
    for i in 0..40 {
        fs::write(vol.join(format!("decoy{i}")), b"x").expect("write");
    }
    fs::write(vol.join("zz-large"), vec![1u8; 1024 * 1024]).expect("write");
    let mut cfg = f.config(CgroupVersion::V2, "/");
    cfg.full_sample_interval = Duration::from_secs(3600);
    cfg.pod_disk_budget = 10;
    let mut s = Sampler::new(cfg).expect("sampler");
    let mut o = Observations::default();
    s.sample_into(SampleKind::Fast, &mut o);
    s.disk.as_ref().expect("disk meter").wait_passes(1);
    s.sample_into(SampleKind::Fast, &mut o);
    let usage = &o.pods[UID_A];
    assert_eq!(usage.disk, None, "{usage:?}");
    assert_eq!(usage.inodes, None, "{usage:?}");
    assert!(usage.memory.is_some(), "{usage:?}");
}

#[test]
fn pod_disk_is_measured_off_the_pass_and_kept_between() {
    let f = Fixture::new();
    let pod = format!("cg/kubepods/pod{UID_A}");
    f.write(&format!("{pod}/memory.current"), "1\n");
    f.write(&format!("{pod}/memory.stat"), "inactive_file 0\n");
    f.write(&format!("{pod}/pids.current"), "1\n");
    let vol = f.root.join(format!(
        "kubelet/pods/{UID_A}/volumes/kubernetes.io~empty-dir/data"
    ));
    fs::create_dir_all(&vol).expect("mkdir");
    fs::write(vol.join("blob"), vec![1u8; 512 * 1024]).expect("write");
    f.write(
        &format!("logs/default_web_{UID_A}/web/0.log"),
        &"x".repeat(128 * 1024),
    );
    let mut cfg = f.config(CgroupVersion::V2, "/");
    cfg.full_sample_interval = Duration::from_secs(3600);
    let mut s = Sampler::new(cfg).expect("sampler");
    fn meter(s: &Sampler) -> &DiskMeter {
        s.disk.as_ref().expect("disk meter")
    }
    // The first pass is always full: it asks the meter for the pod, and a later pass reads
    // the figure once the meter has it.
    let mut o = Observations::default();
    assert_eq!(s.sample_into(SampleKind::Fast, &mut o), SampleKind::Full);
    meter(&s).wait_passes(1);
    assert_eq!(s.sample_into(SampleKind::Fast, &mut o), SampleKind::Fast);
    let disk = o.pods[UID_A].disk.expect("disk measured");
    assert!(disk >= 640 * 1024, "{disk}");
    // More data; a fast pass asks for nothing and keeps the old figure, a full pass asks
    // for a new measurement.
    fs::write(vol.join("blob2"), vec![1u8; 1024 * 1024]).expect("write");
    assert_eq!(s.sample_into(SampleKind::Fast, &mut o), SampleKind::Fast);
    assert_eq!(o.pods[UID_A].disk, Some(disk));
    assert_eq!(meter(&s).passes(), 1);
    assert_eq!(s.sample_into(SampleKind::Full, &mut o), SampleKind::Full);
    meter(&s).wait_passes(2);
    s.sample_into(SampleKind::Fast, &mut o);
    assert!(o.pods[UID_A].disk.expect("disk") >= disk + 1024 * 1024);

    // A trigger asking for a full pass gets a full, measured pass.
    let w = Tick {
        at: Instant::now(),
        pass: SampleKind::Full,
    };
    let t = s.observe(w);
    assert_eq!(t.kind, SampleKind::Full);
    assert!(t.since_wakeup >= t.sampling);
    assert_eq!(t.observations.pods.len(), 1);

    // A signals-only pass leaves the pods as they were and runs no disk walk.
    let t = s.observe_as(w, SampleKind::Signals);
    assert_eq!(t.kind, SampleKind::Signals);
    assert!(t.observations.pods.is_empty());
    assert!(t.observations.signals.contains_key(&Signal::PidAvailable));
    let before = o.pods.clone();
    assert_eq!(
        s.sample_into(SampleKind::Signals, &mut o),
        SampleKind::Signals
    );
    assert_eq!(o.pods, before);

    // The pod goes away: gone from the next pass.
    fs::remove_dir_all(f.root.join(&pod)).expect("rm");
    s.sample_into(SampleKind::Fast, &mut o);
    assert!(o.pods.is_empty());
}

#[test]
fn a_full_pass_never_walks_pod_directories_itself() {
    let f = Fixture::new();
    let pod = format!("cg/kubepods/pod{UID_A}");
    f.write(&format!("{pod}/memory.current"), "1\n");
    f.write(&format!("{pod}/memory.stat"), "inactive_file 0\n");
    f.write(&format!("{pod}/pids.current"), "1\n");
    let vol = f.root.join(format!(
        "kubelet/pods/{UID_A}/volumes/kubernetes.io~empty-dir/data"
    ));
    fs::create_dir_all(&vol).expect("mkdir");
    fs::write(vol.join("blob"), vec![1u8; 64 * 1024]).expect("write");
    let cfg = f.config(CgroupVersion::V2, "/");
    let mut s = Sampler::new(cfg).expect("sampler");
    // A meter whose walks never run: whatever a pass reports for disk, it did not walk.
    let paths = DiskPaths {
        pods_root: s.layout.kubelet_root.join("pods"),
        log_root: s.layout.pod_log_root.clone(),
        budget: 1000,
        proc_root: f.root.join("proc"),
        layer_roots: Vec::new(),
    };
    s.disk = Some(DiskMeter::parked(paths));
    let mut o = Observations::default();
    assert_eq!(s.sample_into(SampleKind::Full, &mut o), SampleKind::Full);
    assert_eq!(
        o.pods[UID_A].disk, None,
        "the pass walked the pod's volumes"
    );
    assert!(o.pods[UID_A].memory.is_some());
    let meter = s.disk.as_ref().expect("meter");
    assert_eq!(meter.requested(), vec![UID_A.to_owned()]);
    // The same walk, run for a tool that needs it now, gives the figure.
    s.measure_pod_disk_now();
    s.sample_into(SampleKind::Fast, &mut o);
    assert!(o.pods[UID_A].disk.expect("measured") >= 64 * 1024);
}

/// `memoryWorkingSet: reclaimable` on cgroup v1: the node and kubepods working sets leave out
/// the active page cache that is neither dirty, under writeback nor shmem; a pod's working set
/// stays the kubelet's; the kubelet's formula never needs the extra fields.
#[test]
fn reclaimable_working_set_on_cgroup_v1() {
    let f = Fixture::new();
    let node = "cg/memory/sim/node";
    f.write(
        &format!("{node}/memory.usage_in_bytes"),
        &format!("{}\n", 400 * MIB),
    );
    f.write(
        &format!("{node}/memory.limit_in_bytes"),
        &format!("{}\n", 512 * MIB),
    );
    // 300 MiB of page cache: 50 inactive, 230 active (20 dirty, 10 under writeback) and
    // 20 shmem on the anon lists.
    let stat = |usage_scale: u64| {
        format!(
            "cache 1\nactive_file 2\ntotal_cache {}\ntotal_shmem {}\ntotal_dirty {}\n\
             total_writeback {}\ntotal_inactive_file {}\ntotal_active_file {}\n",
            300 * MIB / usage_scale,
            20 * MIB / usage_scale,
            20 * MIB / usage_scale,
            10 * MIB / usage_scale,
            50 * MIB / usage_scale,
            230 * MIB / usage_scale,
        )
    };
    f.write(&format!("{node}/memory.stat"), &stat(1));
    let kp = format!("{node}/kubepods");
    f.write(
        &format!("{kp}/memory.usage_in_bytes"),
        &format!("{}\n", 200 * MIB),
    );
    f.write(
        &format!("{kp}/memory.limit_in_bytes"),
        &format!("{}\n", 256 * MIB),
    );
    f.write(&format!("{kp}/memory.stat"), &stat(2));
    let pod = format!("{kp}/burstable/pod{UID_A}");
    f.write(
        &format!("{pod}/memory.usage_in_bytes"),
        &format!("{}\n", 100 * MIB),
    );
    f.write(&format!("{pod}/memory.stat"), &stat(4));

    let mut kubelet = Sampler::new(f.config(CgroupVersion::V1, "sim/node")).expect("sampler");
    let mut cfg = f.config(CgroupVersion::V1, "sim/node");
    cfg.memory_working_set = MemoryWorkingSet::Reclaimable;
    let mut reclaimable = Sampler::new(cfg).expect("sampler");
    let k = kubelet.sample(SampleKind::Fast);
    let r = reclaimable.sample(SampleKind::Fast);
    // Kubelet: 400 − 50. Reclaimable: also 230 − 20 − 10 = 200 MiB of active cache.
    assert_eq!(
        obs(&k, Signal::MemoryAvailable),
        Some((i(512 * MIB - 350 * MIB), i(512 * MIB)))
    );
    assert_eq!(
        obs(&r, Signal::MemoryAvailable),
        Some((i(512 * MIB - 150 * MIB), i(512 * MIB)))
    );
    assert_eq!(
        obs(&k, Signal::AllocatableMemoryAvailable),
        Some((i(256 * MIB - 175 * MIB), i(256 * MIB)))
    );
    assert_eq!(
        obs(&r, Signal::AllocatableMemoryAvailable),
        Some((i(256 * MIB - 75 * MIB), i(256 * MIB)))
    );
    let node_reading = reclaimable.last_node_memory().expect("node");
    assert_eq!(node_reading.reclaimable_active_file, 200 * MIB);
    assert_eq!(node_reading.file_outside_working_set(), 250 * MIB);
    assert_eq!(
        kubelet
            .last_node_memory()
            .expect("node")
            .file_outside_working_set(),
        50 * MIB
    );
    // Pods rank by the kubelet's working set either way: 100 − 12.5 MiB.
    for o in [&k, &r] {
        assert_eq!(o.pods[UID_A].memory, Some(100 * MIB - 50 * MIB / 4));
    }

    // A kernel without total_shmem: the reclaimable formula names the field and the file;
    // the kubelet's does not need it.
    f.write(
        &format!("{node}/memory.stat"),
        &format!(
            "total_cache {}\ntotal_dirty 0\ntotal_writeback 0\ntotal_inactive_file {}\n\
             total_active_file {}\n",
            300 * MIB,
            50 * MIB,
            230 * MIB
        ),
    );
    let r = reclaimable.sample(SampleKind::Fast);
    assert_eq!(obs(&r, Signal::MemoryAvailable), None);
    let err = reclaimable
        .read_node_memory(1024 * MIB)
        .expect_err("missing total_shmem");
    let msg = crate::sampler::ErrorChain(&err).to_string();
    assert!(
        msg.contains("total_shmem") && msg.contains("sim/node/memory.stat"),
        "{msg}"
    );
    let k = kubelet.sample(SampleKind::Fast);
    assert_eq!(
        obs(&k, Signal::MemoryAvailable),
        Some((i(512 * MIB - 350 * MIB), i(512 * MIB)))
    );
}

/// `memoryWorkingSet: reclaimable` on cgroup v2, root node (usage = anon + file): `active_file`,
/// `shmem`, `file_dirty` and `file_writeback`.
#[test]
fn reclaimable_working_set_on_cgroup_v2() {
    let f = Fixture::new();
    f.write(
        "cg/memory.stat",
        &format!(
            "anon {}\nfile {}\nshmem {}\nfile_dirty {}\nfile_writeback {}\n\
             inactive_file {}\nactive_file {}\n",
            100 * MIB,
            400 * MIB,
            100 * MIB,
            30 * MIB,
            0,
            60 * MIB,
            240 * MIB
        ),
    );
    let mut cfg = f.config(CgroupVersion::V2, "/");
    cfg.memory_working_set = MemoryWorkingSet::Reclaimable;
    let mut s = Sampler::new(cfg).expect("sampler");
    let o = s.sample(SampleKind::Signals);
    // usage 500; out: 60 inactive + min(240, 400 − 100 − 60) − 30 = 270.
    assert_eq!(
        obs(&o, Signal::MemoryAvailable),
        Some((i(1024 * MIB - 230 * MIB), i(1024 * MIB)))
    );
    let mut k = Sampler::new(f.config(CgroupVersion::V2, "/")).expect("sampler");
    let o = k.sample(SampleKind::Signals);
    assert_eq!(
        obs(&o, Signal::MemoryAvailable),
        Some((i(1024 * MIB - 440 * MIB), i(1024 * MIB)))
    );
}

/// A calm node reads no pod on its passes; the local-storage limits still need measurements:
/// the meter is asked once per full-sample interval, signals passes or not.
#[test]
fn pod_disk_is_requested_once_per_full_sample_interval_without_pod_passes() {
    let f = Fixture::new();
    let pod = format!("cg/kubepods/pod{UID_A}");
    f.write(&format!("{pod}/memory.current"), "1\n");
    f.write(&format!("{pod}/memory.stat"), "inactive_file 0\n");
    let mut cfg = f.config(CgroupVersion::V2, "/");
    cfg.full_sample_interval = Duration::from_secs(3600);
    let mut s = Sampler::new(cfg).expect("sampler");
    let paths = DiskPaths {
        pods_root: s.layout.kubelet_root.join("pods"),
        log_root: s.layout.pod_log_root.clone(),
        budget: 1000,
        proc_root: f.root.join("proc"),
        layer_roots: Vec::new(),
    };
    s.disk = Some(DiskMeter::parked(paths));
    let mut o = Observations::default();
    s.sample_into(SampleKind::Signals, &mut o);
    let meter = |s: &Sampler| s.disk.as_ref().expect("meter").requested();
    assert_eq!(
        meter(&s),
        Vec::<String>::new(),
        "a signals pass asks nothing"
    );
    s.request_pod_disk();
    assert_eq!(meter(&s), vec![UID_A.to_owned()]);
    // Taken by the meter's thread (here: cleared by hand); not asked again within the interval.
    s.disk.as_ref().expect("meter").clear_request();
    s.request_pod_disk();
    assert_eq!(meter(&s), Vec::<String>::new());
}

#[test]
fn a_pod_read_that_gives_way_stops_between_pods_and_reads_no_signal() {
    let f = Fixture::new();
    for (uid, bytes) in [(UID_A, 4096), (UID_B, 8192)] {
        let pod = format!("cg/kubepods/pod{uid}");
        f.write(&format!("{pod}/memory.current"), &format!("{bytes}\n"));
        f.write(&format!("{pod}/memory.stat"), "inactive_file 0\n");
        f.write(&format!("{pod}/pids.current"), "1\n");
    }
    let mut s = Sampler::new(f.config(CgroupVersion::V2, "/")).expect("sampler");
    // Given up before the first pod: nothing read.
    let mut o = Observations::default();
    let mut asked = 0;
    let done = s.read_pods_unless(&mut o, &mut || {
        asked += 1;
        true
    });
    assert!(!done);
    assert_eq!(asked, 1, "asked before the first pod");
    assert!(o.pods.is_empty(), "{:?}", o.pods);
    // Given up before the second: one pod read.
    let mut o = Observations::default();
    let mut asked = 0;
    let done = s.read_pods_unless(&mut o, &mut || {
        asked += 1;
        asked > 1
    });
    assert!(!done);
    assert_eq!(o.pods.len(), 1, "{:?}", o.pods);
    // Never given up: every pod, and no signal (the read is the pods' alone).
    let mut o = Observations::default();
    let mut asked = 0;
    assert!(s.read_pods_unless(&mut o, &mut || {
        asked += 1;
        false
    }));
    assert_eq!(asked, 2, "asked before each pod");
    assert_eq!(o.pods.len(), 2, "{:?}", o.pods);
    assert!(o.signals.is_empty(), "{:?}", o.signals);
}
