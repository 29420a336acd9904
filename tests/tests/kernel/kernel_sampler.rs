//! Kernel tier: the sampler and the wake-up sources on real cgroups (root, real kernel).
//!
//! Each test builds its node under its own `node-monitor-test/` subtree (cgroup v1 memory and
//! pids, and the unified hierarchy), runs real processes in it and checks the sampler against
//! values computed here, independently, from the same kernel files. Tests that cannot run fail
//! loudly; none skips.
//!
//! cgroup v2 `memory.events` cannot be exercised on this host (the memory controller is bound
//! to v1); its parser and inotify plumbing are unit-tested in the crate, and the guest-VM tier
//! covers the v2 paths.

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use node_monitor::{
    agent::memcg,
    sampler::{SampleKind, Sampler, SamplerConfig, memcg_usage_threshold},
    wakeup::{
        KernelWakeKind, MemcgTarget, SourceKind, SourceSetting, SourceState,
        UNPRIVILEGED_PSI_WINDOW, WakeSource, Wakeup, WakeupConfig, Wakeups,
    },
};

use node_monitor_core::{
    config::{EvictionOverrides, load as load_eviction_config},
    signals::{Observations, Signal},
};
use node_monitor_tests::cgroup::{TestCgroups, require_root};

const MIB: u64 = 1 << 20;
/// A failure guard, not a speed expectation: how long to wait for a kernel notification.
const NOTIFY_GUARD: Duration = Duration::from_secs(60);

const UID_A: &str = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
const UID_B: &str = "6fa459ea-ee8a-4ca4-894e-db77e160355e";
const UID_C: &str = "16fd2706-8baf-433b-82eb-8c7fada847da";
const CID: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A process that allocates anonymous memory on command: `alloc <MiB>` reads that much from
/// /dev/zero into a fresh buffer (the kernel writes every page, so every page is charged),
/// `free` releases everything. glibc's mmap threshold is pinned so freed buffers go back to the
/// kernel.
const HOG: &str = r#"
$| = 1;
open(my $z, "<", "/dev/zero") or die "open /dev/zero: $!";
my @keep;
print "ready\n";
while (my $l = <STDIN>) {
    chomp $l;
    if ($l =~ /^alloc (\d+)$/) {
        my $b = "";
        my $n = $1 * 1048576;
        my $got = 0;
        while ($got < $n) {
            my $r = sysread($z, $b, $n - $got, $got);
            die "read: $!" unless $r;
            $got += $r;
        }
        push @keep, \$b;
        print "ok\n";
    } elsif ($l eq "free") {
        @keep = ();
        print "ok\n";
    }
}
"#;

struct Hog {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Hog {
    fn spawn(cg: &TestCgroups, rel: &str) -> Self {
        let mut cmd = Command::new("/usr/bin/perl");
        cmd.arg("-e")
            .arg(HOG)
            .env("MALLOC_MMAP_THRESHOLD_", "131072")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cg
            .spawn_in(rel, &mut cmd)
            .unwrap_or_else(|e| panic!("spawn the allocator in {rel}: {e:#}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut hog = Self {
            child,
            stdin,
            stdout,
        };
        hog.expect_line("ready");
        hog
    }

    fn expect_line(&mut self, want: &str) {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("allocator output: {e}"));
        assert_eq!(line.trim(), want, "allocator said {line:?}");
    }

    fn command(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap_or_else(|e| panic!("allocator input: {e}"));
        self.expect_line("ok");
    }

    fn alloc(&mut self, mib: u64) {
        self.command(&format!("alloc {mib}"));
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_u64(path: &Path) -> u64 {
    let t = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    t.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {t:?}: {e}", path.display()))
}

fn stat_field(path: &Path, key: &str) -> u64 {
    let t = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    t.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("{key} not in {}", path.display()))
}

/// `limit − max(0, usage − total_inactive_file)` for a v1 memory cgroup, read here.
fn independent_available(dir: &Path, capacity: u64) -> i64 {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"));
    let inactive = stat_field(&dir.join("memory.stat"), "total_inactive_file");
    i(capacity) - i(usage.saturating_sub(inactive))
}

fn i(v: u64) -> i64 {
    i64::try_from(v).expect("fits in i64")
}

fn signal(o: &Observations, s: Signal) -> (i64, i64) {
    let v = o
        .signals
        .get(&s)
        .unwrap_or_else(|| panic!("{s} missing from {:?}", o.signals));
    (v.available, v.capacity)
}

/// Asserts `got` lies within `[min(a, b) − slack, max(a, b) + slack]`: the sampler read between
/// two independent reads, so only what changed in between (plus kernel batching) separates them.
fn assert_bracketed(what: &str, got: i64, a: i64, b: i64, slack: i64) {
    let (lo, hi) = (a.min(b) - slack, a.max(b) + slack);
    assert!(
        (lo..=hi).contains(&got),
        "{what}: sampler {got}, independent reads {a} and {b} (slack {slack})"
    );
}

fn node_config(cg: &TestCgroups, node: &str, kubepods: &str) -> SamplerConfig {
    SamplerConfig {
        node_cgroup: cg.rel_root().join(node),
        kubepods_cgroup: kubepods.into(),
        ..SamplerConfig::default()
    }
}

#[test]
fn memory_available_of_a_limited_node_cgroup_follows_its_files() {
    let mut cg = TestCgroups::new("sampler-mem");
    cg.create("node/system").expect("create node/system");
    cg.create("node/kubepods").expect("create node/kubepods");
    let limit = 512 * MIB;
    cg.set_memory_limit("node", limit).expect("limit");
    let mut hog = Hog::spawn(&cg, "node/system");
    hog.alloc(64);

    let mut sampler = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let dir = cg.memory("node");
    let before = independent_available(&dir, limit);
    let o = sampler.sample(SampleKind::Fast);
    let after = independent_available(&dir, limit);
    let (avail, cap) = signal(&o, Signal::MemoryAvailable);
    assert_eq!(cap, i(limit), "capacity of a node cgroup is its limit");
    assert_bracketed("memory.available", avail, before, after, i(4 * MIB));
    // The allocation shows: at least 64 MiB is in the working set.
    assert!(avail <= i(limit - 64 * MIB), "available {avail}");
    let m = sampler.last_node_memory().expect("node memory read");
    assert_eq!(m.working_set, m.usage.saturating_sub(m.inactive_file));

    hog.alloc(64);
    let o2 = sampler.sample(SampleKind::Fast);
    let (avail2, _) = signal(&o2, Signal::MemoryAvailable);
    let dropped = avail - avail2;
    assert!(
        (i(56 * MIB)..=i(72 * MIB)).contains(&dropped),
        "another 64 MiB should lower available by about 64 MiB, it moved by {dropped}"
    );
}

/// `memoryWorkingSet`: a pod writes a file (synced), reads it twice so its page cache goes
/// active, and puts data on tmpfs. With the default the active cache counts as used; with
/// `reclaimable` it counts as available, the tmpfs data (shmem) never does. Both signals are
/// checked against the node cgroup's own `memory.stat` figures, read before and after.
#[test]
fn reclaimable_working_set_counts_active_page_cache_of_a_file_read_twice_as_available() {
    use node_monitor_core::signals::MemoryWorkingSet;
    let mut cg = TestCgroups::new("sampler-pagecache");
    cg.create("node/kubepods/pod")
        .expect("create node/kubepods/pod");
    let limit = 1024 * MIB;
    cg.set_memory_limit("node", limit).expect("limit");
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir on a disk filesystem");
    let file = scratch.path().join("data");
    let shm = Path::new("/dev/shm").join(format!("nm-pagecache-{}", std::process::id()));
    // Write 128 MiB and sync it (clean pages), read it twice (active), and 48 MiB on tmpfs.
    let script = format!(
        "dd if=/dev/zero of={f} bs=1M count=128 conv=fsync status=none && \
         cat {f} > /dev/null && cat {f} > /dev/null && \
         dd if=/dev/zero of={shm} bs=1M count=48 status=none",
        f = file.display(),
        shm = shm.display()
    );
    let status = cg
        .spawn_in(
            "node/kubepods/pod",
            Command::new("/bin/sh").arg("-c").arg(&script),
        )
        .expect("spawn the reader")
        .wait()
        .expect("wait for the reader");
    assert!(status.success(), "{script}: {status}");

    let dir = cg.memory("node");
    let figures = || {
        let stat = dir.join("memory.stat");
        let f = |k| stat_field(&stat, k);
        let usage = read_u64(&dir.join("memory.usage_in_bytes"));
        let (inactive, active, cache, shmem) = (
            f("total_inactive_file"),
            f("total_active_file"),
            f("total_cache"),
            f("total_shmem"),
        );
        let unwritten = f("total_dirty") + f("total_writeback");
        let reclaimable_active = active
            .min(cache.saturating_sub(shmem).saturating_sub(inactive))
            .saturating_sub(unwritten);
        (usage, inactive, active, shmem, reclaimable_active)
    };
    let mut kubelet = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let mut cfg = node_config(&cg, "node", "kubepods");
    cfg.memory_working_set = MemoryWorkingSet::Reclaimable;
    let mut reclaimable = Sampler::new(cfg).expect("sampler");

    let before = figures();
    let k = kubelet.sample(SampleKind::Signals);
    let r = reclaimable.sample(SampleKind::Signals);
    let after = figures();
    let _ = fs::remove_file(&shm);
    let (_, _, active, shmem, reclaimable_active) = before;
    // The setting is tested, not the kernel: the cache must have gone active, the tmpfs data
    // must be shmem.
    assert!(active >= 120 * MIB, "file read twice: active_file {active}");
    assert!(shmem >= 44 * MIB, "tmpfs data: total_shmem {shmem}");

    let kubelet_available = |(usage, inactive, ..): (u64, u64, u64, u64, u64)| {
        i(limit) - i(usage.saturating_sub(inactive))
    };
    let reclaimable_available = |(usage, inactive, _, _, ra): (u64, u64, u64, u64, u64)| {
        i(limit) - i(usage.saturating_sub(inactive + ra))
    };
    let (ka, kc) = signal(&k, Signal::MemoryAvailable);
    let (ra, rc) = signal(&r, Signal::MemoryAvailable);
    assert_eq!((kc, rc), (i(limit), i(limit)));
    let slack = i(4 * MIB);
    assert_bracketed(
        "memory.available (kubelet)",
        ka,
        kubelet_available(before),
        kubelet_available(after),
        slack,
    );
    assert_bracketed(
        "memory.available (reclaimable)",
        ra,
        reclaimable_available(before),
        reclaimable_available(after),
        slack,
    );
    // The difference is the reclaimable active cache: the file's 128 MiB, not the tmpfs data.
    let gained = ra - ka;
    assert!(
        (i(reclaimable_active) - slack..=i(reclaimable_active) + slack).contains(&gained),
        "reclaimable counts {gained} more available; reclaimable active file {reclaimable_active}"
    );
    assert!(
        (i(120 * MIB)..=i(136 * MIB)).contains(&gained),
        "the 128 MiB read twice should count available, tmpfs not: gained {gained}"
    );
    // The reading the memcg thresholds are armed with leaves the same cache out.
    let m = reclaimable.last_node_memory().expect("node memory read");
    assert_eq!(
        m.file_outside_working_set(),
        m.inactive_file + m.reclaimable_active_file
    );
    assert_eq!(
        m.working_set,
        m.usage.saturating_sub(m.file_outside_working_set())
    );
    assert_eq!(
        kubelet
            .last_node_memory()
            .expect("node memory read")
            .reclaimable_active_file,
        0
    );
}

#[test]
fn memory_available_at_the_host_root_matches_the_kubelet_script() {
    require_root("reading the host's root memory cgroup");
    let mut sampler = Sampler::new(SamplerConfig::default()).expect("sampler on the host");
    assert!(sampler.layout().node_is_root);
    let mem_total = {
        let t = fs::read_to_string("/proc/meminfo").expect("meminfo");
        let kb: u64 = t
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("MemTotal");
        kb * 1024
    };
    // The kubelet's cgroup v1 script: capacity from MemTotal, working set from the root
    // memory cgroup's usage minus total_inactive_file, floored at 0.
    let root = Path::new("/sys/fs/cgroup/memory");
    let before = independent_available(root, mem_total);
    let o = sampler.sample(SampleKind::Fast);
    let after = independent_available(root, mem_total);
    let (avail, cap) = signal(&o, Signal::MemoryAvailable);
    assert_eq!(cap, i(mem_total));
    // Other builds run on this host: memory moves between the reads. The slack still tells
    // the formula apart from free(1)'s or from one that keeps inactive_file.
    assert_bracketed("host memory.available", avail, before, after, i(32 * MIB));
    let m = sampler.last_node_memory().expect("node memory");
    assert_eq!(m.capacity, mem_total);
    assert_eq!(m.working_set, m.usage.saturating_sub(m.inactive_file));
}

/// Builds a kubelet layout under `node` for one driver and returns the pod UIDs it put there.
fn build_pods(cg: &mut TestCgroups, node: &str, systemd: bool) -> [(String, &'static str); 3] {
    let sd = |u: &str| u.replace('-', "_");
    let (a, b, c) = if systemd {
        (
            format!(
                "{node}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
                sd(UID_A)
            ),
            format!(
                "{node}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CID}.scope",
                sd(UID_B)
            ),
            format!(
                "{node}/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{CID}.scope",
                sd(UID_C)
            ),
        )
    } else {
        (
            format!("{node}/kubepods/burstable/pod{UID_A}/{CID}"),
            format!("{node}/kubepods/besteffort/pod{UID_B}/{CID}"),
            format!("{node}/kubepods/pod{UID_C}/{CID}"),
        )
    };
    for p in [&a, &b, &c] {
        cg.create(p).unwrap_or_else(|e| panic!("create {p}: {e:#}"));
    }
    [(a, UID_A), (b, UID_B), (c, UID_C)]
}

fn check_pods(systemd: bool) {
    let name = if systemd {
        "sampler-pods-sd"
    } else {
        "sampler-pods"
    };
    let kubepods = if systemd {
        "kubepods.slice"
    } else {
        "kubepods"
    };
    let mut cg = TestCgroups::new(name);
    let [(a, _), (b, _), (c, _)] = build_pods(&mut cg, "node", systemd);
    let mut hog_a = Hog::spawn(&cg, &a);
    hog_a.alloc(64);
    let mut hog_b = Hog::spawn(&cg, &b);
    hog_b.alloc(8);
    let sleepers: Vec<Child> = (0..2)
        .map(|_| {
            cg.spawn_in(&c, Command::new("sleep").arg("600"))
                .expect("spawn sleep")
        })
        .collect();
    // The kubepods cgroup gets a limit: allocatableMemory.available is read against it.
    let kp_limit = 1024 * MIB;
    cg.set_memory_limit(Path::new("node").join(kubepods), kp_limit)
        .expect("kubepods limit");

    let mut sampler = Sampler::new(node_config(&cg, "node", kubepods)).expect("sampler");
    let kp_dir = cg.memory(Path::new("node").join(kubepods));
    let before = independent_available(&kp_dir, kp_limit);
    let o = sampler.sample(SampleKind::Fast);
    let after = independent_available(&kp_dir, kp_limit);

    let uids: BTreeSet<&str> = o.pods.keys().map(String::as_str).collect();
    assert_eq!(uids, BTreeSet::from([UID_A, UID_B, UID_C]), "{kubepods}");
    let mem = |u: &str| o.pods[u].memory.unwrap_or_else(|| panic!("{u}: no memory"));
    let procs = |u: &str| {
        o.pods[u]
            .processes
            .unwrap_or_else(|| panic!("{u}: no processes"))
    };
    assert!(mem(UID_A) >= 64 * MIB, "64 MiB pod: {}", mem(UID_A));
    assert!(mem(UID_B) >= 8 * MIB, "8 MiB pod: {}", mem(UID_B));
    assert!(
        mem(UID_A) > mem(UID_B) + 48 * MIB,
        "{} vs {}",
        mem(UID_A),
        mem(UID_B)
    );
    // Each pod's working set equals its own cgroup files (read here).
    for (rel, uid) in [(&a, UID_A), (&b, UID_B)] {
        let pod_dir = cg.memory(rel).parent().expect("pod dir").to_path_buf();
        let usage = read_u64(&pod_dir.join("memory.usage_in_bytes"));
        let inactive = stat_field(&pod_dir.join("memory.stat"), "total_inactive_file");
        assert!(
            mem(uid).abs_diff(usage.saturating_sub(inactive)) < 2 * MIB,
            "{uid}: {} vs {}",
            mem(uid),
            usage.saturating_sub(inactive)
        );
    }
    assert_eq!(procs(UID_A), 1);
    assert_eq!(procs(UID_B), 1);
    assert_eq!(procs(UID_C), 2);

    let (avail, cap) = signal(&o, Signal::AllocatableMemoryAvailable);
    assert_eq!(cap, i(kp_limit));
    assert_bracketed(
        "allocatableMemory.available",
        avail,
        before,
        after,
        i(4 * MIB),
    );
    assert!(
        avail < i(kp_limit - 72 * MIB),
        "pods use at least 72 MiB: {avail}"
    );
    drop(sleepers);
}

#[test]
fn per_pod_usage_cgroupfs_driver() {
    check_pods(false);
}

#[test]
fn per_pod_usage_systemd_driver() {
    check_pods(true);
}

/// Waits for a wake-up matching `want`, skipping others (housekeeping, crossings of other
/// levels). The timeout is a failure guard.
async fn wait_for(wakeups: &mut Wakeups, what: &str, want: impl Fn(&WakeSource) -> bool) -> Wakeup {
    let deadline = tokio::time::Instant::now() + NOTIFY_GUARD;
    loop {
        let w = tokio::time::timeout_at(deadline, wakeups.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {what} wake-up within {NOTIFY_GUARD:?}; sources: {:?}",
                    wakeups.source_states()
                )
            })
            .expect("wake-up queue open");
        if want(&w.source) {
            return w;
        }
    }
}

fn state(w: &Wakeups, kind: SourceKind) -> SourceState {
    w.source_states()
        .into_iter()
        .find(|s| s.source == kind)
        .map(|s| s.state)
        .expect("every kind is listed")
}

fn quiet_config(sampler: &Sampler) -> WakeupConfig {
    WakeupConfig {
        housekeeping: Duration::from_secs(3600),
        ..WakeupConfig::for_layout(sampler.layout())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcg_threshold_fires_under_real_pressure_and_rearms() {
    let mut cg = TestCgroups::new("sampler-memcg");
    cg.create("node/system").expect("create");
    cg.create("node/kubepods").expect("create");
    let limit = 512 * MIB;
    cg.set_memory_limit("node", limit).expect("limit");
    let mut hog = Hog::spawn(&cg, "node/system");
    hog.alloc(16);

    let mut sampler = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let mut wakeups = Wakeups::start(quiet_config(&sampler)).expect("wake-ups");
    assert!(
        state(&wakeups, SourceKind::MemcgOom).is_armed(),
        "{:?}",
        state(&wakeups, SourceKind::MemcgOom)
    );
    sampler.sample(SampleKind::Fast);
    let m = sampler.last_node_memory().expect("node memory");
    assert_eq!(m.capacity, limit);

    // An eviction threshold that the working set reaches 48 MiB from now.
    let threshold = m.capacity - (m.working_set + 48 * MIB);
    wakeups.arm_memory_thresholds(&[threshold], m.capacity, m.inactive_file);
    let level = memcg_usage_threshold(m.capacity, threshold, m.inactive_file);
    let armed = wakeups.armed_thresholds();
    assert_eq!(armed.len(), 1);
    assert_eq!(armed[0].usage_bytes, level);
    assert_eq!(armed[0].target, MemcgTarget::Node);
    assert!(state(&wakeups, SourceKind::MemcgThreshold).is_armed());

    // Drive the cgroup past it.
    hog.alloc(96);
    let w = wait_for(
        &mut wakeups,
        "memcg threshold",
        |s| matches!(s, WakeSource::MemcgThreshold { usage_bytes, .. } if *usage_bytes == level),
    )
    .await;
    assert_eq!(
        w.source,
        WakeSource::MemcgThreshold {
            target: MemcgTarget::Node,
            usage_bytes: level
        }
    );
    // The pass the wake-up triggers sees the threshold met.
    let timed = sampler.observe(w);
    let (avail, _) = signal(&timed.observations, Signal::MemoryAvailable);
    assert!(
        avail < i(threshold),
        "available {avail} not below {threshold}"
    );

    // A move of inactive_file within the tolerance keeps the registration.
    let first_armed_at = armed[0].armed_at;
    wakeups.arm_memory_thresholds(&[threshold], m.capacity, m.inactive_file + 256 * 1024);
    assert_eq!(wakeups.armed_thresholds()[0].armed_at, first_armed_at);
    // A larger move re-arms at the new level (as if the kernel had 96 MiB more inactive file).
    wakeups.arm_memory_thresholds(&[threshold], m.capacity, m.inactive_file + 96 * MIB);
    let rearmed = wakeups.armed_thresholds();
    assert_eq!(rearmed.len(), 1);
    let level2 = level + 96 * MIB;
    assert_eq!(rearmed[0].usage_bytes, level2);
    assert_ne!(rearmed[0].armed_at, first_armed_at);
    while wakeups.try_next().is_some() {}

    hog.alloc(96);
    let w2 = wait_for(&mut wakeups, "re-armed memcg threshold", |s| {
        matches!(s, WakeSource::MemcgThreshold { .. })
    })
    .await;
    assert_eq!(
        w2.source,
        WakeSource::MemcgThreshold {
            target: MemcgTarget::Node,
            usage_bytes: level2
        },
        "only the re-armed level may fire; the old registration is gone"
    );

    // Allocatable thresholds live on kubepods, independently of the node's.
    wakeups.arm_allocatable_thresholds(&[64 * MIB], 256 * MIB, 0);
    let on_kubepods: Vec<_> = wakeups
        .armed_thresholds()
        .into_iter()
        .filter(|a| a.target == MemcgTarget::Allocatable)
        .collect();
    assert_eq!(on_kubepods.len(), 1);
    assert_eq!(on_kubepods[0].usage_bytes, 192 * MIB);
    // Thresholds no longer wanted are disarmed; the other target's stay.
    wakeups.arm_memory_thresholds(&[], m.capacity, m.inactive_file);
    let left = wakeups.armed_thresholds();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].target, MemcgTarget::Allocatable);
    assert!(state(&wakeups, SourceKind::MemcgThreshold).is_armed());
}

/// The agent's arming after a pass (`agent::memcg::rearm`, with the thresholds the config
/// loader makes) puts the `allocatableMemory.available` copy of the hard `memory.available`
/// threshold on kubepods, and a crossing there wakes the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocatable_memcg_threshold_armed_by_the_agent_wakes_on_kubepods_pressure() {
    let mut cg = TestCgroups::new("sampler-alloc");
    cg.create("node/system").expect("create");
    cg.create("node/kubepods").expect("create");
    cg.set_memory_limit("node", 512 * MIB).expect("limit");
    let allocatable = 256 * MIB;
    cg.set_memory_limit("node/kubepods", allocatable)
        .expect("limit");
    let mut hog = Hog::spawn(&cg, "node/kubepods");
    hog.alloc(16);

    let mut sampler = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let mut wakeups = Wakeups::start(quiet_config(&sampler)).expect("wake-ups");
    sampler.sample(SampleKind::Fast);
    let kp = sampler.last_kubepods_memory().expect("kubepods memory");
    assert_eq!(kp.capacity, allocatable);

    // evictionHard memory.available at a level the kubepods working set reaches 48 MiB from
    // now; the loader adds its allocatable copy (enforceNodeAllocatable defaults to pods). On the
    // 512 MiB node the same amount is far away.
    let threshold = kp.capacity - (kp.working_set + 48 * MIB);
    let flags = EvictionOverrides {
        eviction_hard: vec![format!("memory.available<{threshold}")],
        ..EvictionOverrides::default()
    };
    let config = load_eviction_config(None, &flags).expect("eviction config");
    memcg::rearm(
        &mut wakeups,
        &config.thresholds,
        sampler.last_node_memory(),
        sampler.last_kubepods_memory(),
    );
    let level = memcg_usage_threshold(kp.capacity, threshold, kp.inactive_file);
    let on_kubepods: Vec<_> = wakeups
        .armed_thresholds()
        .into_iter()
        .filter(|a| a.target == MemcgTarget::Allocatable)
        .collect();
    assert_eq!(on_kubepods.len(), 1, "{:?}", wakeups.armed_thresholds());
    assert_eq!(on_kubepods[0].usage_bytes, level);
    assert_eq!(on_kubepods[0].available_threshold, threshold);

    hog.alloc(96);
    let w = wait_for(&mut wakeups, "allocatable memcg threshold", |s| {
        matches!(
            s,
            WakeSource::MemcgThreshold {
                target: MemcgTarget::Allocatable,
                ..
            }
        )
    })
    .await;
    assert_eq!(
        w.source,
        WakeSource::MemcgThreshold {
            target: MemcgTarget::Allocatable,
            usage_bytes: level
        }
    );
    let timed = sampler.observe(w);
    let (avail, _) = signal(&timed.observations, Signal::AllocatableMemoryAvailable);
    assert!(
        avail < i(threshold),
        "allocatable available {avail} not below {threshold}"
    );
}

/// With `memoryWorkingSet: reclaimable` the node's memcg threshold sits above usage by the
/// page cache the formula leaves out, active cache included: it fires when the reclaimable
/// working set reaches the threshold. The kubelet's level (`+ inactive_file` only) would sit
/// below the current usage, met already although the signal is 48 MiB away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimable_memcg_threshold_follows_the_reclaimable_working_set() {
    use node_monitor_core::signals::MemoryWorkingSet;
    let mut cg = TestCgroups::new("sampler-pagecache-memcg");
    cg.create("node/system").expect("create");
    cg.create("node/kubepods/pod").expect("create");
    cg.set_memory_limit("node", 1024 * MIB).expect("limit");
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir on a disk filesystem");
    let file = scratch.path().join("data");
    let script = format!(
        "dd if=/dev/zero of={f} bs=1M count=128 conv=fsync status=none && \
         cat {f} > /dev/null && cat {f} > /dev/null",
        f = file.display()
    );
    let status = cg
        .spawn_in(
            "node/kubepods/pod",
            Command::new("/bin/sh").arg("-c").arg(&script),
        )
        .expect("spawn the reader")
        .wait()
        .expect("wait for the reader");
    assert!(status.success(), "{script}: {status}");
    let mut hog = Hog::spawn(&cg, "node/system");
    hog.alloc(16);

    let mut cfg = node_config(&cg, "node", "kubepods");
    cfg.memory_working_set = MemoryWorkingSet::Reclaimable;
    let mut sampler = Sampler::new(cfg).expect("sampler");
    let mut wakeups = Wakeups::start(quiet_config(&sampler)).expect("wake-ups");
    sampler.sample(SampleKind::Signals);
    let m = sampler.last_node_memory().expect("node memory");
    assert!(
        m.reclaimable_active_file >= 120 * MIB,
        "file read twice: reclaimable active {}",
        m.reclaimable_active_file
    );
    let threshold = m.capacity - (m.working_set + 48 * MIB);
    let flags = EvictionOverrides {
        eviction_hard: vec![format!("memory.available<{threshold}")],
        ..EvictionOverrides::default()
    };
    let config = load_eviction_config(None, &flags).expect("eviction config");
    memcg::rearm(&mut wakeups, &config.thresholds, Some(m), None);
    let level = memcg_usage_threshold(m.capacity, threshold, m.file_outside_working_set());
    let on_node: Vec<_> = wakeups
        .armed_thresholds()
        .into_iter()
        .filter(|a| a.target == MemcgTarget::Node && a.available_threshold == threshold)
        .collect();
    assert_eq!(on_node.len(), 1, "{:?}", wakeups.armed_thresholds());
    assert_eq!(on_node[0].usage_bytes, level);
    let kubelet_level = memcg_usage_threshold(m.capacity, threshold, m.inactive_file);
    assert!(
        kubelet_level < m.usage && level > m.usage,
        "usage {}: the kubelet's level {kubelet_level} is met already, the reclaimable one \
         {level} is not",
        m.usage
    );

    hog.alloc(96);
    let w = wait_for(&mut wakeups, "node memcg threshold", |s| {
        matches!(
            s,
            WakeSource::MemcgThreshold {
                target: MemcgTarget::Node,
                usage_bytes
            } if *usage_bytes == level
        )
    })
    .await;
    let timed = sampler.observe(w);
    let (avail, _) = signal(&timed.observations, Signal::MemoryAvailable);
    assert!(
        avail < i(threshold),
        "memory.available (reclaimable) {avail} not below {threshold} at the notification"
    );
    drop(hog);
    let _ = fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcg_oom_control_wakes_on_a_node_oom() {
    let mut cg = TestCgroups::new("sampler-oom");
    cg.create("node/system").expect("create");
    cg.create("node/kubepods").expect("create");
    cg.set_memory_limit("node", 64 * MIB).expect("limit");
    let sampler = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let mut wakeups = Wakeups::start(quiet_config(&sampler)).expect("wake-ups");
    assert!(state(&wakeups, SourceKind::MemcgOom).is_armed());
    let mut hog = Hog::spawn(&cg, "node/system");
    // 128 MiB into a 64 MiB node without swap: the kernel OOM-kills the allocator.
    writeln!(hog.stdin, "alloc 128").expect("allocator input");
    let w = wait_for(&mut wakeups, "memcg OOM", |s| *s == WakeSource::MemcgOom).await;
    assert_eq!(w.source.label(), "memcg_oom");
    let status = hog.child.wait().expect("wait for the allocator");
    assert!(
        !status.success(),
        "the allocator should have been killed: {status}"
    );
}

fn has_cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").expect("status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim)
        .expect("CapEff");
    let bits = u64::from_str_radix(eff, 16).expect("hex caps");
    // CAP_SYS_RESOURCE is capability 24 (include/uapi/linux/capability.h).
    bits & (1 << 24) != 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psi_trigger_falls_back_to_2s_and_fires_under_a_real_stall() {
    let mut cg = TestCgroups::new("sampler-psi");
    cg.create("node/system").expect("create");
    cg.create("node/kubepods").expect("create");
    cg.set_memory_limit("node", 32 * MIB).expect("limit");
    let sampler = Sampler::new(node_config(&cg, "node", "kubepods")).expect("sampler");
    let mut config = quiet_config(&sampler);
    // This host has per-cgroup PSI on its cgroup2 (unified) mount: the node cgroup's own file.
    let psi_file = cg.unified("node").join("memory.pressure");
    assert!(psi_file.is_file(), "{} missing", psi_file.display());
    assert_eq!(config.psi, SourceSetting::Path(psi_file.clone()));
    config.psi_trigger.window = Duration::from_secs(1);
    let mut wakeups = Wakeups::start(config).expect("wake-ups");
    assert!(
        state(&wakeups, SourceKind::Psi).is_armed(),
        "{:?}",
        state(&wakeups, SourceKind::Psi)
    );
    let want = if has_cap_sys_resource() {
        Duration::from_secs(1)
    } else {
        UNPRIVILEGED_PSI_WINDOW
    };
    assert_eq!(wakeups.psi_effective_window(), Some(want));

    // Page-cache thrashing in a 32 MiB node: the file is written and re-read from inside the
    // cgroup, so every read reclaims the node's own cache (memory stall).
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let file = scratch.path().join("thrash");
    let script = format!(
        "dd if=/dev/zero of={f} bs=1M count=256 status=none; \
         while :; do cat {f} > /dev/null; done",
        f = file.display()
    );
    let mut thrash = cg
        .spawn_in("node/system", Command::new("bash").arg("-c").arg(script))
        .expect("spawn the thrasher");
    let w = wait_for(&mut wakeups, "PSI", |s| *s == WakeSource::Psi).await;
    assert_eq!(w.source.label(), "psi");
    let pressure = fs::read_to_string(&psi_file).expect("pressure");
    let stalled = node_monitor::sampler::parse::parse_pressure(&pressure).expect("parses");
    assert!(stalled.some.total_us > 0, "{pressure}");
    let _ = thrash.kill();
    let _ = thrash.wait();
}

fn statvfs_pair(path: &Path) -> (i64, i64, i64, i64) {
    let s = nix::sys::statvfs::statvfs(path).expect("statvfs");
    (
        i(s.blocks_available() * s.fragment_size()),
        i(s.blocks() * s.fragment_size()),
        i(s.files_free()),
        i(s.files()),
    )
}

#[test]
fn nodefs_and_imagefs_from_directories() {
    require_root("the kernel tier");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubelet = dir.path().join("kubelet");
    fs::create_dir(&kubelet).expect("mkdir");
    // A dedicated image filesystem: tmpfs at /dev/shm.
    let image = Path::new("/dev/shm");
    let cfg = SamplerConfig {
        kubelet_root: kubelet.clone(),
        image_fs: Some(image.to_path_buf()),
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(cfg).expect("sampler");
    let (nb, nc, ni, nic) = statvfs_pair(&kubelet);
    let (ib, ic, ii, iic) = statvfs_pair(image);
    let o = sampler.sample(SampleKind::Fast);
    let (nb2, _, ni2, _) = statvfs_pair(&kubelet);
    let (ib2, _, ii2, _) = statvfs_pair(image);

    let (avail, cap) = signal(&o, Signal::NodeFsAvailable);
    assert_eq!(cap, nc);
    assert_bracketed("nodefs.available", avail, nb, nb2, i(64 * MIB));
    let (avail, cap) = signal(&o, Signal::NodeFsInodesFree);
    assert_eq!(cap, nic);
    assert_bracketed("nodefs.inodesFree", avail, ni, ni2, 1000);
    let (avail, cap) = signal(&o, Signal::ImageFsAvailable);
    assert_eq!(cap, ic);
    assert_bracketed("imagefs.available", avail, ib, ib2, i(16 * MIB));
    let (avail, cap) = signal(&o, Signal::ImageFsInodesFree);
    assert_eq!(cap, iic);
    assert_bracketed("imagefs.inodesFree", avail, ii, ii2, 100);
    // Not split: containerfs is the image filesystem.
    assert_eq!(
        signal(&o, Signal::ContainerFsAvailable).1,
        signal(&o, Signal::ImageFsAvailable).1
    );
    assert_eq!(sampler.has_dedicated_image_fs(), Some(true));
    // The pass carries the layout, which chooses the disk share each signal ranks pods by.
    assert_eq!(
        (
            o.filesystem.dedicated_image_fs,
            o.filesystem.split_container_image_fs
        ),
        (true, false)
    );

    // An image directory on the same filesystem: imagefs is reported (as the kubelet reports
    // it from CRI) with nodefs' capacity, and it is not dedicated.
    let same = dir.path().join("images");
    fs::create_dir(&same).expect("mkdir");
    let mut sampler = Sampler::new(SamplerConfig {
        kubelet_root: kubelet,
        image_fs: Some(same),
        ..SamplerConfig::default()
    })
    .expect("sampler");
    let o = sampler.sample(SampleKind::Fast);
    assert_eq!(signal(&o, Signal::ImageFsAvailable).1, nc);
    assert_eq!(sampler.has_dedicated_image_fs(), Some(false));
    assert!(!o.filesystem.dedicated_image_fs);
}

/// A container as a runtime makes one: a process in a private mount namespace whose root is an
/// overlay (lower: the host's `/`, upper: a directory under `store`). It prints `ready` once
/// chrooted, then, on a line of input, writes `mib` MiB to `/blob` (into the upper layer) and
/// prints `written`.
fn overlay_container(cg: &TestCgroups, rel: &str, store: &Path, mib: u64) -> Hog {
    let (upper, work, merged) = (store.join("u/fs"), store.join("w"), store.join("m"));
    for d in [&upper, &work, &merged] {
        fs::create_dir_all(d).expect("mkdir");
    }
    let inner = format!(
        "echo ready; read go; yes abcdefgh | head -c {} > /blob && sync && echo written; \
         exec sleep 600",
        mib * MIB
    );
    let outer = format!(
        "mount -t overlay overlay -o lowerdir=/,upperdir={},workdir={} {} && \
         exec chroot {} /bin/sh -c '{inner}'",
        upper.display(),
        work.display(),
        merged.display(),
        merged.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &outer])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = cg
        .spawn_in(rel, &mut cmd)
        .unwrap_or_else(|e| panic!("spawn the container in {rel}: {e:#}"));
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut c = Hog {
        child,
        stdin,
        stdout,
    };
    c.expect_line("ready");
    c
}

#[test]
fn pod_disk_usage_counts_a_real_overlay_writable_layer() {
    const WRITE_MIB: u64 = 8;
    let mut cg = TestCgroups::new("sampler-layer");
    let rel = format!("node/kubepods/pod{UID_A}/{CID}");
    cg.create(&rel).expect("create the container cgroup");
    // On a disk filesystem (an overlay upper directory cannot be on overlayfs).
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let store = scratch.path().join("containerd");
    let mut container = overlay_container(&cg, &rel, &store, WRITE_MIB);

    let mut sampler = Sampler::new(SamplerConfig {
        kubelet_root: scratch.path().join("kubelet"),
        pod_log_root: scratch.path().join("logs"),
        writable_layer_roots: vec![store.clone()],
        full_sample_interval: Duration::from_secs(3600),
        ..node_config(&cg, "node", "kubepods")
    })
    .expect("sampler");
    // The first pass is full and asks the meter; wait (bounded) for its figure. The pod has no
    // volume and no log directory: only its writable layer can give it one.
    let deadline = std::time::Instant::now() + NOTIFY_GUARD;
    let before = loop {
        let o = sampler.sample(SampleKind::Fast);
        if let Some(d) = o.pods.get(UID_A).and_then(|p| p.disk) {
            break d;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no disk figure for the pod from its writable layer: {:?}",
            o.pods.get(UID_A)
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    writeln!(container.stdin, "go").expect("container input");
    container.expect_line("written");
    sampler.measure_pod_disk_now();
    let o = sampler.sample(SampleKind::Fast);
    let after = o.pods[UID_A].disk.expect("disk figure");
    assert!(
        after >= before + WRITE_MIB * MIB,
        "writable layer grew by {WRITE_MIB} MiB: before {before}, after {after}"
    );
    drop(container);
}

/// Inodes under `root` on its filesystem, counted by `find -xdev` (every entry and the root
/// itself; there are no hard links here): the count the kubelet's `fs.DiskUsage` makes.
fn find_inodes(root: &Path) -> u64 {
    let out = Command::new("find")
        .arg(root)
        .arg("-xdev")
        .output()
        .expect("run find");
    assert!(out.status.success(), "find {}: {:?}", root.display(), out);
    out.stdout.iter().filter(|b| **b == b'\n').count() as u64
}

/// Per-pod inodes on a real kernel: a container's overlay writable layer, its log directory and
/// an emptyDir with many small files, each counted as `find` counts it; the writable layer's
/// part apart; a file the container creates shows up on the next measurement.
#[test]
fn pod_inodes_count_a_real_writable_layer_logs_and_empty_dir() {
    let mut cg = TestCgroups::new("sampler-inodes");
    let rel = format!("node/kubepods/pod{UID_A}/{CID}");
    cg.create(&rel).expect("create the container cgroup");
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let store = scratch.path().join("containerd");
    let mut container = overlay_container(&cg, &rel, &store, 1);
    // An emptyDir of 40 directories of 25 files each, and two log files.
    let pod_dir = scratch.path().join("kubelet/pods").join(UID_A);
    let volume = pod_dir.join("volumes/kubernetes.io~empty-dir/cache");
    for d in 0..40 {
        let dir = volume.join(format!("d{d}"));
        fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..25 {
            fs::write(dir.join(format!("f{f}")), b"x").expect("write");
        }
    }
    let logs = scratch
        .path()
        .join(format!("logs/default_web-0_{UID_A}/web"));
    fs::create_dir_all(&logs).expect("mkdir");
    fs::write(logs.join("0.log"), b"line\n").expect("write");
    fs::write(logs.join("1.log"), b"line\n").expect("write");

    let mut sampler = Sampler::new(SamplerConfig {
        kubelet_root: scratch.path().join("kubelet"),
        pod_log_root: scratch.path().join("logs"),
        writable_layer_roots: vec![store.clone()],
        full_sample_interval: Duration::from_secs(3600),
        ..node_config(&cg, "node", "kubepods")
    })
    .expect("sampler");
    // The first pass lists the pod cgroups the measurement walks.
    let _ = sampler.sample(SampleKind::Fast);
    let upper = store.join("u/fs");
    let expected_layer = || find_inodes(&upper);
    let expected_total = || {
        find_inodes(&pod_dir)
            + find_inodes(&scratch.path().join(format!("logs/default_web-0_{UID_A}")))
            + find_inodes(&upper)
    };
    sampler.measure_pod_disk_now();
    let o = sampler.sample(SampleKind::Fast);
    let u = o.pods.get(UID_A).copied().expect("pod A sampled");
    assert_eq!(u.inodes, Some(expected_total()), "{u:?}");
    assert_eq!(u.writable_layer_inodes, Some(expected_layer()), "{u:?}");
    // The emptyDir alone holds 1 040 inodes: the figure is the pod's, not a constant.
    assert!(u.inodes.unwrap_or(0) > 1040, "{u:?}");

    // The container writes /blob: one more inode in its writable layer.
    let layer_before = u.writable_layer_inodes.unwrap_or(0);
    writeln!(container.stdin, "go").expect("container input");
    container.expect_line("written");
    sampler.measure_pod_disk_now();
    let o = sampler.sample(SampleKind::Fast);
    let u = o.pods.get(UID_A).copied().expect("pod A sampled");
    assert_eq!(u.writable_layer_inodes, Some(expected_layer()), "{u:?}");
    assert_eq!(u.writable_layer_inodes, Some(layer_before + 1), "{u:?}");
    assert_eq!(u.inodes, Some(expected_total()), "{u:?}");
    drop(container);
}

/// Unmounts a test mount when dropped, whatever the test's outcome.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Allocated bytes under `root` on its filesystem, as `du -s -B1 -x` counts them.
fn du_bytes(root: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-s", "-B1", "-x"])
        .arg(root)
        .output()
        .expect("run du");
    assert!(out.status.success(), "du {}: {:?}", root.display(), out);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du figure")
}

/// The kubelet's local-storage limit eviction on a real walk: an emptyDir on disk filled past
/// its `sizeLimit` is measured apart (as `du` counts it) and the decision evicts the pod with
/// the kubelet's message; a memory-backed emptyDir (a tmpfs mount, sized to its limit as the
/// kubelet sizes it) is not local storage on nodefs and is not measured; the container's logs and its real overlay writable layer are found by its name
/// and by the container ID its status reports.
#[test]
fn an_empty_dir_over_its_size_limit_is_found_by_the_real_walk() {
    use node_monitor_core::{
        eviction::local_storage::{LimitKind, StorageLimits, limit_evictions},
        kubelet::pod::PodInfo,
    };
    const WRITE_MIB: u64 = 6;
    require_root("an emptyDir over its sizeLimit on a real walk");
    let mut cg = TestCgroups::new("sampler-sizelimit");
    let rel = format!("node/kubepods/pod{UID_A}/{CID}");
    cg.create(&rel).expect("create the container cgroup");
    let scratch = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let store = scratch.path().join("containerd");
    let mut container = overlay_container(&cg, &rel, &store, WRITE_MIB);
    writeln!(container.stdin, "go").expect("container input");
    container.expect_line("written");

    let volumes = scratch
        .path()
        .join("kubelet/pods")
        .join(UID_A)
        .join("volumes/kubernetes.io~empty-dir");
    let cache = volumes.join("cache");
    fs::create_dir_all(&cache).expect("mkdir");
    fs::write(cache.join("blob"), vec![7u8; 8 * MIB as usize]).expect("write");
    let mem = volumes.join("mem");
    fs::create_dir_all(&mem).expect("mkdir");
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&mem)
        .status()
        .expect("run mount");
    assert!(status.success(), "mount a tmpfs emptyDir: {status}");
    let _mem = Mounted(mem.clone());
    fs::write(mem.join("blob"), vec![9u8; 32 * MIB as usize]).expect("write");
    let logs = scratch
        .path()
        .join(format!("logs/default_web-0_{UID_A}/web"));
    fs::create_dir_all(&logs).expect("mkdir");
    fs::write(logs.join("0.log"), vec![b'l'; MIB as usize]).expect("write");

    let mut sampler = Sampler::new(SamplerConfig {
        kubelet_root: scratch.path().join("kubelet"),
        pod_log_root: scratch.path().join("logs"),
        writable_layer_roots: vec![store.clone()],
        full_sample_interval: Duration::from_secs(3600),
        ..node_config(&cg, "node", "kubepods")
    })
    .expect("sampler");
    // The first pass lists the pod cgroups and asks the meter's thread for a measurement; it
    // is waited for (bounded), so that no later one comes from the thread.
    let _ = sampler.sample(SampleKind::Fast);
    let deadline = std::time::Instant::now() + NOTIFY_GUARD;
    while sampler.take_pod_disk_detail().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first pass's measurement never finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        sampler.take_pod_disk_detail().is_none(),
        "a measurement is handed over once"
    );
    sampler.measure_pod_disk_now();
    let detail = sampler
        .take_pod_disk_detail()
        .expect("a measurement")
        .remove(UID_A)
        .expect("pod A measured");
    assert_eq!(
        detail.empty_dirs.get("cache").copied(),
        Some(du_bytes(&cache)),
        "{detail:?}"
    );
    assert!(!detail.empty_dirs.contains_key("mem"), "{detail:?}");
    // 8 MiB of emptyDir, the writable layer and 1 MiB of logs; not the 32 MiB in memory.
    assert!(
        detail.total >= (8 + WRITE_MIB + 1) * MIB && detail.total < 30 * MIB,
        "{detail:?}"
    );

    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "default", "uid": UID_A},
        "spec": {
            "containers": [{"name": "web", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}],
            "volumes": [
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "cache", "emptyDir": {"sizeLimit": "4Mi"}},
            ],
        },
        "status": {"containerStatuses": [{
            "name": "web", "containerID": format!("containerd://{CID}"), "ready": true,
            "restartCount": 0, "image": "", "imageID": "",
        }]},
    }))
    .expect("pod");
    let usage = detail.storage_usage(&pod);
    let web = &usage.containers[0];
    assert_eq!(web.name, "web");
    assert_eq!(web.logs, Some(du_bytes(&logs)), "{usage:?}");
    let layer = web.rootfs.expect("the writable layer, by container ID");
    assert!(layer >= WRITE_MIB * MIB, "{layer}");
    assert_eq!(layer, du_bytes(&store.join("u/fs")), "{usage:?}");

    let pods = vec![(
        PodInfo::from_pod(&pod).expect("pod info"),
        StorageLimits::from_pod(&pod).expect("limits"),
    )];
    let evict = limit_evictions(&pods, &HashMap::from([(UID_A.to_owned(), usage)]), false);
    assert_eq!(evict.len(), 1, "{evict:?}");
    assert_eq!(evict[0].kind, LimitKind::EmptyDir);
    assert_eq!(
        evict[0].message,
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"4Mi\". "
    );

    // Emptied below its limit: the next measurement evicts nobody.
    fs::remove_file(cache.join("blob")).expect("rm");
    sampler.measure_pod_disk_now();
    let detail = sampler
        .take_pod_disk_detail()
        .expect("a measurement")
        .remove(UID_A)
        .expect("pod A measured");
    let usage = detail.storage_usage(&pod);
    let evict = limit_evictions(&pods, &HashMap::from([(UID_A.to_owned(), usage)]), false);
    assert_eq!(evict, vec![]);
    drop(container);
}

/// KEP-4191's split layout on real filesystems: images in a directory on nodefs' disk and the
/// writable layers on a tmpfs. The kubelet then calls the image filesystem dedicated
/// (`HasDedicatedImageFs` compares the image and container filesystems too) and the container
/// filesystem separate; `containerfs.*` are the tmpfs'.
#[test]
fn a_split_writable_layer_filesystem_is_told_as_the_kubelet_tells_it() {
    require_root("the kernel tier");
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let kubelet = dir.path().join("kubelet");
    let images = dir.path().join("images");
    for d in [&kubelet, &images] {
        fs::create_dir(d).expect("mkdir");
    }
    let containers = Path::new("/dev/shm");
    let mut sampler = Sampler::new(SamplerConfig {
        kubelet_root: kubelet.clone(),
        image_fs: Some(images),
        container_fs: Some(containers.to_path_buf()),
        ..SamplerConfig::default()
    })
    .expect("sampler");
    let o = sampler.sample(SampleKind::Fast);
    let (_, nodefs_capacity, _, _) = statvfs_pair(&kubelet);
    let (_, shm_capacity, _, _) = statvfs_pair(containers);
    assert_eq!(signal(&o, Signal::ImageFsAvailable).1, nodefs_capacity);
    assert_eq!(signal(&o, Signal::ContainerFsAvailable).1, shm_capacity);
    assert_eq!(
        (
            o.filesystem.dedicated_image_fs,
            o.filesystem.split_container_image_fs
        ),
        (true, true)
    );
    assert_eq!(sampler.has_dedicated_image_fs(), Some(true));
}

#[test]
fn pid_available_is_sane() {
    require_root("the kernel tier");
    let mut sampler = Sampler::new(SamplerConfig::default()).expect("sampler");
    let o = sampler.sample(SampleKind::Fast);
    let (avail, cap) = signal(&o, Signal::PidAvailable);
    let pid_max = read_u64(Path::new("/proc/sys/kernel/pid_max"));
    let threads_max = read_u64(Path::new("/proc/sys/kernel/threads-max"));
    assert_eq!(cap, i(pid_max.min(threads_max)));
    assert!(avail > 0 && avail < cap, "pid.available {avail} of {cap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_wakeups_reach_a_measured_pass() {
    require_root("the kernel tier");
    let mut sampler = Sampler::new(SamplerConfig::default()).expect("sampler");
    let mut wakeups = Wakeups::start(quiet_config(&sampler)).expect("wake-ups");
    let sender = wakeups.kernel_sender();
    assert!(state(&wakeups, SourceKind::Kernel).is_armed());
    let tx = sender.clone();
    std::thread::spawn(move || tx.wake(KernelWakeKind::OomKill));
    let w = wait_for(&mut wakeups, "kernel", |s| {
        *s == WakeSource::Kernel(KernelWakeKind::OomKill)
    })
    .await;
    let timed = sampler.observe(w);
    assert_eq!(timed.wakeup, w);
    assert_eq!(timed.kind, SampleKind::Full, "the first pass is a full one");
    assert!(timed.since_wakeup >= timed.sampling);
    assert!(
        timed
            .observations
            .signals
            .contains_key(&Signal::MemoryAvailable)
    );
    let states: HashMap<SourceKind, SourceState> = wakeups
        .source_states()
        .into_iter()
        .map(|s| (s.source, s.state))
        .collect();
    // On this host (memory controller on v1) memory.events is not applicable and says why.
    let SourceState::Unavailable { reason } = &states[&SourceKind::MemoryEvents] else {
        panic!("memory_events: {:?}", states[&SourceKind::MemoryEvents]);
    };
    assert!(reason.contains("cgroup v1"), "{reason}");
}
