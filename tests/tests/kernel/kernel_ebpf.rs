//! Kernel tier: node-monitor's eBPF probes on the real kernel. Needs root; a test that cannot
//! run fails with the reason, it never skips. Kernel state is shared: run with
//! `--test-threads=1`.
//!
//! Memory pressure is real: `nm-memhog` (tests/src/bin) runs in a test memory cgroup
//! (`node-monitor-test/…`, removed afterwards) laid out like the kubelet's.
use std::{
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::Path,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use node_monitor::{
    attribution::{Attributor, CgroupPaths, NoApi},
    ebpf::{
        EventKind, EventStream, KernelEvent, OomKillEvent, ProbeConfig, Probes, ProgramState,
        ReclaimFlavor, StreamError, prog,
    },
};

use node_monitor_core::kubelet::layout::{CgroupDriver, QosClass, parse_cgroup_path};
use node_monitor_tests::cgroup::{TestCgroups, UNIFIED, require_root};

const MEMHOG: &str = env!("CARGO_BIN_EXE_nm-memhog");
const MIB: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A fresh pod UID (UUID-shaped) and a 64-hex container id.
fn pod_ids() -> (String, String) {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as u64;
    let p = std::process::id();
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        p,
        n & 0xffff,
        (t >> 12) & 0xfff,
        t & 0xfff,
        t >> 16 & 0xffff_ffff_ffff
    );
    let cid = format!("{t:016x}{p:016x}{n:016x}{:016x}", t ^ 0x5a5a_5a5a);
    (uid, cid)
}

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns()`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn load(config: &ProbeConfig) -> Probes {
    require_root("loading eBPF programs");
    Probes::load(config)
}

fn assert_attached(probes: &Probes, names: &[&str]) {
    for name in names {
        assert_eq!(
            probes.state(name),
            Some(&ProgramState::Attached),
            "{name} is not attached: {:#?}",
            probes.program_states()
        );
    }
}

/// Reads events until one matches, or panics after `timeout` listing what arrived.
async fn wait_for(
    stream: &mut EventStream,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&KernelEvent) -> bool,
) -> KernelEvent {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!(
                "no {what} within {timeout:?}; {} other events: {:?}",
                seen.len(),
                &seen[seen.len().saturating_sub(10)..]
            ),
            Ok(Ok(ev)) if pred(&ev) => return ev,
            Ok(Ok(ev)) => seen.push(ev),
            Ok(Err(StreamError::Decode(e))) => panic!("malformed record from the kernel: {e}"),
            Ok(Err(e)) => panic!("event stream failed: {e}"),
        }
    }
}

/// Runs `nm-memhog anon 256` in the cgroup `rel` (limited to less), which the kernel OOM-kills;
/// returns the hog's pid and the event of its kill.
async fn oom_kill_of_a_memhog(
    stream: &mut EventStream,
    cg: &TestCgroups,
    rel: &str,
    oom_score_adj: i32,
) -> (u32, OomKillEvent) {
    let mut cmd = Command::new(MEMHOG);
    cmd.args(["anon", "256"]);
    // SAFETY: between fork and exec only a write to the child's own procfs file.
    unsafe {
        cmd.pre_exec(move || std::fs::write("/proc/self/oom_score_adj", oom_score_adj.to_string()));
    }
    let mut child = cg.spawn_in(rel, &mut cmd).expect("spawn nm-memhog");
    let pid = child.id();
    let ev = wait_for(
        stream,
        Duration::from_secs(30),
        "oom_kill",
        |e| matches!(e, KernelEvent::OomKill(k) if k.victim_pid == pid),
    )
    .await;
    let status = child.wait().expect("wait for nm-memhog");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let KernelEvent::OomKill(k) = ev else {
        unreachable!("wait_for returned another event")
    };
    (pid, k)
}

#[test]
fn every_program_loads_and_attaches() {
    let probes = load(&ProbeConfig {
        // The benchmark generator too, so that every program in the object is verified.
        synthetic_tgid: Some(std::process::id()),
        ..ProbeConfig::default()
    });
    let states = probes.program_states();
    assert_eq!(states.len(), 13, "{states:#?}");
    for s in &states {
        if [prog::OOM_PID, prog::OOM_TP].contains(&s.name) {
            // The pid-only raw program and the tracepoint fallback stand by while the raw
            // tracepoint runs.
            assert!(
                matches!(&s.state, ProgramState::Disabled { reason } if reason.contains(prog::OOM_RAW)),
                "{s:?}"
            );
        } else if s.name == prog::REBOOT_RAW {
            // The raw sys_enter fallback stands by while the syscall tracepoint runs (it is
            // loaded and judged in kernel_reboot.rs).
            assert!(
                matches!(&s.state, ProgramState::Disabled { reason } if reason.contains(prog::REBOOT)),
                "{s:?}"
            );
        } else if [prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE].contains(&s.name) {
            // Attached once at load (so known to attach), then detached until a memory
            // threshold is near.
            assert_eq!(s.state, ProgramState::Loaded, "{s:?}");
            assert!(s.prog_id.is_some(), "{s:?}");
        } else {
            assert_eq!(s.state, ProgramState::Attached, "{s:?}");
            assert!(s.prog_id.is_some(), "{s:?}");
        }
    }
    assert!(probes.degraded().is_empty(), "{:?}", probes.degraded());
    assert!(probes.reclaim_attached());
    let c = probes.counters().expect("counters");
    assert_eq!(c.total_drops(), 0);
}

#[test]
fn the_tracepoint_fallback_takes_over_and_reports_an_oom_kill() {
    let probes_config = ProbeConfig {
        disable: [prog::OOM_RAW.to_owned()].into(),
        ..ProbeConfig::default()
    };
    let mut probes = load(&probes_config);
    assert_attached(&probes, &[prog::OOM_TP]);
    assert!(matches!(
        probes.state(prog::OOM_RAW),
        Some(ProgramState::Disabled { .. })
    ));
    // The fallback replaces the required program: not degraded.
    assert!(probes.degraded().is_empty());

    let mut cg = TestCgroups::new("oom-tp");
    let rel = "workload";
    cg.create(rel).unwrap();
    cg.set_memory_limit(rel, 32 * MIB).unwrap();
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        let (pid, k) = oom_kill_of_a_memhog(&mut stream, &cg, rel, 17).await;
        // The tracepoint does not carry the victim's cgroup: the trigger's (the victim itself
        // here) stands in.
        assert_eq!(k.victim_cgroup_id, None);
        assert_eq!(k.trigger.pid, pid);
        assert_eq!(k.cgroup_id(), cg.v2_id(rel));
        assert_eq!(k.victim_comm.as_deref(), Some("nm-memhog"));
        assert_eq!(k.global(), Some(false));
        let mem = k.memory.expect("the 6.x tracepoint has RSS figures");
        let rss = mem.anon_rss_bytes;
        assert!((16 * MIB..=64 * MIB).contains(&rss), "anon rss {rss}");
        // Every integer field read as one word shifted down (`tp_field`): the 8-byte sizes,
        // the 4-byte `uid` and the 2-byte `oom_score_adj` come out whole (raising it needs no privilege; lowering it is refused here).
        assert!(mem.total_vm_bytes >= mem.rss_bytes(), "{mem:?}");
        assert_eq!(k.victim_pid, pid);
        assert_eq!(k.uid, Some(0));
        assert_eq!(k.oom_score_adj, Some(17));
    });
}

#[test]
fn a_memcg_oom_kill_is_reported_with_the_victims_cgroup_and_pod() {
    let mut cg = TestCgroups::new("oom");
    let (uid, cid) = pod_ids();
    let rel = format!("kubepods/burstable/pod{uid}/{cid}");
    cg.create(&rel).unwrap();
    cg.set_memory_limit(&rel, 32 * MIB).unwrap();
    let mut probes = load(&ProbeConfig::default());
    assert_attached(
        &probes,
        &[prog::OOM_RAW, prog::MEMCG_BEGIN, prog::MEMCG_END],
    );
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        let (pid, k) = oom_kill_of_a_memhog(&mut stream, &cg, &rel, 0).await;
        assert_eq!(k.victim_cgroup_id, Some(cg.v2_id(&rel)), "{k:?}");
        assert_eq!(k.victim_tid, pid);
        assert_eq!(k.victim_comm.as_deref(), Some("nm-memhog"));
        // The hog charged its own memcg: it is also the trigger, and the OOM is the memcg's.
        assert_eq!(k.trigger.pid, pid);
        assert_eq!(k.trigger.cgroup_id, cg.v2_id(&rel));
        assert_eq!(k.global(), Some(false), "{k:?}");
        assert_eq!(k.trigger_reclaim, Some(ReclaimFlavor::Memcg));
        let mem = k.memory.expect("memory figures from BTF");
        assert!(
            (16 * MIB..=64 * MIB).contains(&mem.anon_rss_bytes),
            "anon rss {}",
            mem.anon_rss_bytes
        );
        assert!(mem.total_vm_bytes >= mem.rss_bytes(), "{mem:?}");
        assert_eq!(k.uid, Some(0));
        assert_eq!(k.oom_score_adj, Some(0));

        let mut attributor = Attributor::new(CgroupPaths::new(UNIFIED), Box::new(NoApi));
        let at = attributor.attribute(k.cgroup_id()).await;
        assert_eq!(
            at.cgroup_path.as_deref(),
            Some(format!("/{}/{rel}", cg.rel_root().display()).as_str())
        );
        let pod = at.pod.expect("a pod cgroup");
        assert_eq!(pod.pod_uid, uid);
        assert_eq!(pod.container_id.as_deref(), Some(cid.as_str()));
        assert_eq!(pod.qos, QosClass::Burstable);

        let c = probes.counters().unwrap();
        assert!(c.events[&EventKind::OomKill] >= 1, "{c:?}");
        assert_eq!(c.drops[&EventKind::OomKill], 0);
    });
}

#[test]
fn memcg_reclaim_pressure_gives_stall_events_for_that_cgroup() {
    let mut cg = TestCgroups::new("reclaim");
    let rel = "reclaimer";
    cg.create(rel).unwrap();
    cg.set_memory_limit(rel, 64 * MIB).unwrap();
    let mut probes = load(&ProbeConfig {
        stall_budget: Duration::from_micros(1),
        stall_window: Duration::from_millis(100),
        ..ProbeConfig::default()
    });
    assert_attached(&probes, &[prog::MEMCG_BEGIN, prog::MEMCG_END]);
    // Page cache on a disk file system (tmpfs pages are swap-backed and would OOM instead).
    let dir = tempfile::tempdir_in("/var/tmp").expect("a temporary directory on disk");
    let file = dir.path().join("cache");
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        let mut child = cg
            .spawn_in(
                rel,
                Command::new(MEMHOG).args(["pagecache", &file.to_string_lossy(), "200", "20"]),
            )
            .unwrap();
        let id = cg.v2_id(rel);
        let ev = wait_for(
            &mut stream,
            Duration::from_secs(30),
            "reclaim_stall",
            |e| matches!(e, KernelEvent::ReclaimStall(s) if s.cgroup_id == id),
        )
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let KernelEvent::ReclaimStall(s) = ev else {
            unreachable!()
        };
        assert_eq!(s.flavor, ReclaimFlavor::Memcg, "{s:?}");
        assert!(s.stall_ns >= 1_000, "{s:?}");
        assert!(s.count >= 1, "{s:?}");
        assert_eq!(s.window_ns, 100_000_000);
        assert!(s.window_start_ns <= s.ts_ns, "{s:?}");
        assert_eq!(s.task.pid, child.id());
        let c = probes.counters().unwrap();
        assert!(c.reclaim_episodes >= u64::from(s.count), "{c:?}");
    });
}

#[test]
fn kubelet_layouts_of_both_drivers_resolve_from_cgroup_id_to_pod() {
    require_root("creating cgroups");
    let mut cg = TestCgroups::new("attribution");
    let (uid, cid) = pod_ids();
    let uid_ = uid.replace('-', "_");
    let cases = [
        (
            format!("kubepods/besteffort/pod{uid}/{cid}"),
            CgroupDriver::Cgroupfs,
            QosClass::BestEffort,
        ),
        (
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope"
            ),
            CgroupDriver::Systemd,
            QosClass::Burstable,
        ),
        (
            format!("kubepods.slice/kubepods-pod{uid_}.slice/crio-{cid}.scope"),
            CgroupDriver::Systemd,
            QosClass::Guaranteed,
        ),
    ];
    for (rel, _, _) in &cases {
        cg.create(rel).unwrap();
    }
    let mut paths = CgroupPaths::new(UNIFIED);
    for (rel, driver, qos) in &cases {
        let id = cg.v2_id(rel);
        let path = paths
            .path(id)
            .unwrap_or_else(|| panic!("cgroup {rel} (id {id}) not found"));
        assert_eq!(path, format!("/{}/{rel}", cg.rel_root().display()));
        assert!(
            Path::new(UNIFIED)
                .join(path.trim_start_matches('/'))
                .is_dir()
        );
        let pod = parse_cgroup_path(&path).unwrap_or_else(|| panic!("{path} is not a pod"));
        assert_eq!(pod.pod_uid, uid, "{rel}");
        assert_eq!(pod.container_id.as_deref(), Some(cid.as_str()), "{rel}");
        assert_eq!((pod.driver, pod.qos), (*driver, *qos), "{rel}");
    }
    // The root and a non-pod cgroup resolve too, without a pod.
    let root_id = cg.v2_id("");
    let p = paths.path(root_id).unwrap();
    assert_eq!(parse_cgroup_path(&p), None);
}

#[test]
fn synthetic_events_cross_the_ring_buffer_intact() {
    let me = std::process::id();
    let mut probes = load(&ProbeConfig {
        synthetic_tgid: Some(me),
        disable: ["oom", "reclaim", "kswapd", "reboot", "mem_push"]
            .map(str::to_owned)
            .into(),
        ..ProbeConfig::default()
    });
    assert_attached(&probes, &[prog::SYNTHETIC]);
    assert_eq!(probes.attached(), 1);
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        let tid = nix::unistd::gettid().as_raw() as u32;
        let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        let comm = comm.trim_end();
        let before = Instant::now();
        const N: usize = 1000;
        for _ in 0..N {
            // SAFETY: getppid has no preconditions.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        let mut got = Vec::new();
        while got.len() < N {
            match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Ok(Ok(KernelEvent::Synthetic(s))) => got.push(s),
                Ok(Ok(other)) => panic!("only synthetic events expected, got {other:?}"),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => panic!("{} of {N} synthetic events arrived", got.len()),
            }
        }
        let now_ns = monotonic_ns();
        for s in &got {
            assert_eq!((s.task.pid, s.task.tid), (me, tid));
            assert_eq!(s.task.comm, comm);
            // Kernel timestamps are CLOCK_MONOTONIC: within this test's run.
            let age = now_ns.saturating_sub(s.ts_ns);
            assert!(
                age <= before.elapsed().as_nanos() as u64 + 1_000_000,
                "age {age}"
            );
        }
        let c = probes.counters().unwrap();
        assert_eq!(c.events[&EventKind::Synthetic], N as u64);
        assert_eq!(c.drops[&EventKind::Synthetic], 0);
        assert_eq!(stream.received(), N as u64);
        assert_eq!(stream.decode_errors(), 0);
    });
}

/// Runs `nm-memhog anon <mib>` in the test cgroup `rel` and waits for it to exit 0.
fn touch_anon(cg: &TestCgroups, rel: &str, mib: u64) {
    let status = cg
        .spawn_in(rel, Command::new(MEMHOG).args(["anon", &mib.to_string()]))
        .expect("spawn nm-memhog")
        .wait()
        .expect("wait for nm-memhog");
    assert!(status.success(), "nm-memhog anon {mib}: {status:?}");
}

/// Every memory push record that arrives within `window`.
async fn mem_push_records(
    wakes: &mut node_monitor::ebpf::MemPushWakes,
    window: Duration,
) -> Vec<node_monitor::ebpf::MemPushWake> {
    let deadline = tokio::time::Instant::now() + window;
    let mut out = Vec::new();
    while let Ok(r) = tokio::time::timeout_at(deadline, wakes.next()).await {
        out.extend(r.expect("memory push ring buffer readable"));
    }
    out
}

#[test]
fn the_memory_push_wakes_on_page_growth_only_when_armed() {
    let mut cg = TestCgroups::new("mem-push");
    let rel = "grower";
    cg.create(rel).unwrap();
    cg.set_memory_limit(rel, 512 * MIB).unwrap();
    let mut probes = load(&ProbeConfig::default());
    let ids: Vec<u32> = [prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE]
        .iter()
        .map(|name| {
            let s = probes
                .program_states()
                .into_iter()
                .find(|s| s.name == *name)
                .expect("in the table");
            assert_eq!(s.state, ProgramState::Loaded, "{s:?}");
            s.prog_id.expect("a loaded program has an id")
        })
        .collect();
    let control = probes.mem_push().expect("the memory push's control");
    assert_eq!(control.batch().unwrap(), 0, "loaded disarmed");
    assert_eq!(bpf_links_of(&ids), 0, "loaded, not attached");
    runtime().block_on(async {
        let mut wakes = probes.mem_push_wakes().expect("memory push records");
        control.set_attached(true);
        let state = wait_attachment(&control, true).await;
        assert_eq!(state.attaches, 1, "{state:?}");
        assert_eq!(bpf_links_of(&ids), 2, "attached: one link per program");

        // Disarmed: 128 MiB touched, not a record.
        touch_anon(&cg, rel, 128);
        let got = mem_push_records(&mut wakes, Duration::from_millis(500)).await;
        assert!(got.is_empty(), "disarmed, yet {got:?}");
        let c = probes.counters().unwrap();
        assert_eq!((c.mem_push_wakes, c.mem_push_suppressed), (0, 0), "{c:?}");

        // Armed with a batch far above the growth (4 TiB of pages): still silent.
        control.arm(1 << 30).unwrap();
        touch_anon(&cg, rel, 128);
        let got = mem_push_records(&mut wakes, Duration::from_millis(500)).await;
        assert!(got.is_empty(), "batch above the growth, yet {got:?}");

        // Armed with 16 MiB per CPU: 128 MiB touched on one CPU reaches it. The clock is read
        // before arming: a CPU whose count grew in the phase above reports at its next
        // allocation, which another process of the host may make at once.
        let batch = 4096;
        let start = monotonic_ns();
        control.arm(batch).unwrap();
        assert_eq!(control.batch().unwrap(), batch);
        touch_anon(&cg, rel, 128);
        let got = mem_push_records(&mut wakes, Duration::from_millis(500)).await;
        assert!(
            !got.is_empty(),
            "armed at {batch} pages, no record for 128 MiB"
        );
        for w in &got {
            assert_eq!(w.batch_pages, batch, "{w:?}");
            assert!(w.net_pages >= batch as i64, "{w:?}");
            assert!(w.ts_ns >= start, "{w:?}");
        }
        let c = probes.counters().unwrap();
        assert!(c.mem_push_wakes >= got.len() as u64, "{c:?}");
        assert_eq!(c.mem_push_drops, 0, "{c:?}");

        // Disarmed again: silent again. Records sent while armed (another process of the host
        // may have grown a CPU's count past the batch since) are read and set aside first.
        control.arm(0).unwrap();
        let _ = mem_push_records(&mut wakes, Duration::from_millis(100)).await;
        touch_anon(&cg, rel, 128);
        let got = mem_push_records(&mut wakes, Duration::from_millis(500)).await;
        assert!(got.is_empty(), "disarmed again, yet {got:?}");

        // Detached: no link left, and armed or not, not a record.
        control.set_attached(false);
        let state = wait_attachment(&control, false).await;
        assert_eq!((state.detaches, state.failures), (1, 0), "{state:?}");
        assert_eq!(bpf_links_of(&ids), 0, "detached");
        control.arm(batch).unwrap();
        touch_anon(&cg, rel, 128);
        let got = mem_push_records(&mut wakes, Duration::from_millis(500)).await;
        assert!(got.is_empty(), "detached, yet {got:?}");
        control.arm(0).unwrap();
    });
}

/// How many BPF links this process holds for the programs `ids` (from /proc/self/fdinfo: a
/// link's fd shows `link_type` and its program's `prog_id`).
fn bpf_links_of(ids: &[u32]) -> usize {
    std::fs::read_dir("/proc/self/fdinfo")
        .expect("/proc/self/fdinfo")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.lines().any(|l| l.starts_with("link_type:")))
        .filter(|info| {
            info.lines().any(|l| {
                l.strip_prefix("prog_id:")
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .is_some_and(|id| ids.contains(&id))
            })
        })
        .count()
}

/// Waits until the switch reports `attached` (the switch works on a thread of its own).
async fn wait_attachment(
    control: &node_monitor::ebpf::MemPushControl,
    attached: bool,
) -> node_monitor::ebpf::PushAttachment {
    for _ in 0..500 {
        let s = control.switch().state();
        if s.attached == attached {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the memory push never became attached={attached}: {:?}",
        control.switch().state()
    );
}
