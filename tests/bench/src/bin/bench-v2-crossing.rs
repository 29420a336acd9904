//! cgroup v2 crossing benchmark: how soon each cgroup v2 notification learns that a node
//! cgroup's `memory.available` (`memory.max − (memory.current − inactive_file)`) crossed a
//! threshold, and what `memory.available` is on a cgroup v2 root next to `/proc/meminfo` and the
//! kubelet's formula. Runs in the Debian guest (kernel 6.1, cgroup v2; the host is cgroup v1).
//!
//! In the guest, a node cgroup (`memory.max` = `--capacity-mi`) holds a climber process that
//! touches anonymous memory at `--rate-mib-s` up to `--climb-mi`, past the level
//! `capacity − threshold`. Ground truth: an independent thread reading the node cgroup's
//! `memory.current` and `memory.stat` every 200 µs (as `bench-reaction` does on cgroup v1); the
//! crossing is the first reading at or past the level. Candidates, each timed from that crossing
//! to its first wake-up:
//!
//! - `sampling-100ms`: reading the same files every 100 ms (the agent's adaptive sampling near a
//!   threshold); its CPU time per pass is measured with the thread's CPU clock;
//! - `psi-500ms`: a PSI trigger on the node's `memory.pressure` with the smallest window the
//!   kernel accepts from a privileged writer (`some 50000 500000`);
//! - `memory.low`: `memory.low` = level on the climber's cgroup and inotify on the node's
//!   `memory.events` (`low` counts reclaim that breaches the protection);
//! - `ebpf-push`: the agent's memory push (`kmem:mm_page_alloc`/`mm_page_free` programs, loaded
//!   from the agent's own object), driven as the agent drives it: re-armed after each read with
//!   `node_monitor_core::arming::mem_push::batch_pages`, a read at each push record and, to arm it at all,
//!   every 100 ms (the agent's sampling inside the near band). Timed to the first read that sees
//!   the crossing, with what prompted that read (`push` or the 100 ms look);
//! - `memory.high` (its own trial, since it throttles): `memory.high` = level on the node cgroup
//!   and inotify on `memory.events` (`high` counts). The climber's rate past the crossing is
//!   reported beside it, to show the throttle.
//!
//! ```text
//! cargo build -p node-monitor-bench --bin bench-v2-crossing
//! flock /tmp/nm-vm.lock sudo -E target/debug/bench-v2-crossing --runs 5
//! ```
//! (root, qemu and the guest image are needed; `bench-v2-crossing guest …` is what the guest runs.)
//! It fails when a fact its figures stand on does not hold (`node_monitor_tests::v2_crossing`:
//! the v2 root's `memory.available` is the kubelet's, PSI and `memory.low` stay silent without a
//! throttle, the push's reader sees every crossing, `memory.high` reports and throttles).
use std::{
    fs,
    io::{Read as _, Write as _},
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use nix::{
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::inotify::{AddWatchFlags, InitFlags, Inotify},
};
use node_monitor_tests::vm::{ENTRY_PRELUDE, GuestOptions, Payload, report, run_guest};

const MI: u64 = 1 << 20;
const BIN: &str = "bench-v2-crossing";

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Clone, Debug)]
struct RunArgs {
    /// Climbs per trial.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The node cgroup's `memory.max` (MiB).
    #[arg(long, default_value_t = 512)]
    capacity_mi: u64,
    /// The `memory.available` threshold (MiB): the crossing is at `capacity − threshold` of
    /// working set.
    #[arg(long, default_value_t = 160)]
    threshold_mi: u64,
    /// How far the climber goes (MiB of anonymous memory); below the capacity, so the node
    /// cgroup never reclaims in the non-throttling trial.
    #[arg(long, default_value_t = 440)]
    climb_mi: u64,
    /// The climber's rate (MiB/s).
    #[arg(long, default_value_t = 64)]
    rate_mib_s: u64,
}

#[derive(Subcommand)]
enum Mode {
    /// Inside the guest: run the trials and print `result …` lines.
    Guest {
        #[command(flatten)]
        run: RunArgs,
    },
    /// Ground truth for a reaction measurement: reads `node`'s `memory.max`, `memory.current`
    /// and `memory.stat` (on cgroup v1 `memory.limit_in_bytes`, `memory.usage_in_bytes` and
    /// `total_inactive_file`) every `interval_us` and prints `crossing <RFC 3339 time>` each time
    /// its `memory.available` falls below `threshold_mi` (again only after it rose 32 MiB above).
    Truth {
        #[arg(long)]
        node: PathBuf,
        #[arg(long)]
        threshold_mi: u64,
        #[arg(long, default_value_t = 200)]
        interval_us: u64,
    },
    /// The memory push's cost per page event (root; on the host): loads the push, touches
    /// `mi` MiB `times` times with it disarmed, then armed with a batch never reached, and prints
    /// each program's run time per run from the kernel's BPF statistics (turned on for the
    /// measurement and restored after).
    PushCost {
        #[arg(long, default_value_t = 512)]
        mi: u64,
        #[arg(long, default_value_t = 5)]
        times: u32,
    },
    /// Inside the guest: join `cgroup` (if given), touch `mi` MiB at `rate` MiB/s, hold until
    /// killed (or exit at once with `--exit`).
    Climb {
        #[arg(long)]
        cgroup: Option<PathBuf>,
        #[arg(long)]
        mi: u64,
        #[arg(long)]
        rate_mib_s: u64,
        #[arg(long)]
        exit: bool,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    match args.mode {
        Some(Mode::Climb {
            cgroup,
            mi,
            rate_mib_s,
            exit,
        }) => climb(cgroup.as_deref(), mi, rate_mib_s, exit),
        Some(Mode::Guest { run }) => guest(&run),
        Some(Mode::Truth {
            node,
            threshold_mi,
            interval_us,
        }) => truth(&node, threshold_mi * MI, Duration::from_micros(interval_us)),
        Some(Mode::PushCost { mi, times }) => push_cost(mi, times),
        None => host(&args.run),
    }
}

// ---------------------------------------------------------------- host side

fn host(run: &RunArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("{BIN} must run as root (qemu guest)");
    }
    let payload = Payload::new("nm-v2-crossing")?;
    let exe = std::env::current_exe().context("current_exe")?;
    payload.link(BIN, &exe)?;
    let script = format!(
        "{ENTRY_PRELUDE}\nlog \"uname $(uname -r)\"\n\
         ( grep -E '^(memcg|vmscan|kmem):' /sys/kernel/tracing/available_events; \
           grep -oE '^(page_counter_try_charge|try_charge_memcg|memcg_check_events|mem_cgroup_charge_statistics)\\b' \
           /sys/kernel/tracing/available_filter_functions ) > /mnt/out/hooks 2>&1\n\
         /mnt/host/{BIN} guest --runs {} --capacity-mi {} --threshold-mi {} --climb-mi {} \
         --rate-mib-s {} > /mnt/out/results 2> /mnt/out/guest.stderr\n\
         log \"done rc=$?\"\nsync\nsystemctl poweroff -ff\n",
        run.runs, run.capacity_mi, run.threshold_mi, run.climb_mi, run.rate_mib_s
    );
    payload.entry(&script)?;
    let opts = GuestOptions {
        timeout: Duration::from_secs(900),
        ..GuestOptions::default()
    };
    let out = run_guest(payload.path(), &opts)?;
    let results = out.read_out("results").unwrap_or_default();
    if !results.lines().any(|l| l.starts_with("summary ")) {
        bail!(
            "the guest produced no summary:\n{}",
            report(&out, &["entry.log", "guest.stderr", "results"])
        );
    }
    println!("{results}");
    if let Ok(hooks) = out.read_out("hooks") {
        println!("guest tracepoints and hooks:\n{hooks}");
    }
    // The facts the figures stand on (node_monitor_tests::v2_crossing): the benchmark fails
    // when one does not hold.
    let level = i64::try_from(run.capacity_mi.saturating_sub(run.threshold_mi))?;
    node_monitor_tests::v2_crossing::check(&results, run.runs, level).map_err(|e| {
        anyhow::anyhow!(
            "{e}\n{}",
            report(&out, &["entry.log", "guest.stderr", "results"])
        )
    })?;
    println!("every fact the figures stand on holds (node_monitor_tests::v2_crossing)");
    Ok(())
}

/// Waits until the memory push's switch reports `attached`.
fn wait_switch(
    control: &node_monitor::ebpf::MemPushControl,
    attached: bool,
) -> Result<node_monitor::ebpf::PushAttachment> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = control.switch().state();
        if s.attached == attached {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("the memory push never became attached={attached}: {s:?}");
        }
        thread::sleep(Duration::from_micros(100));
    }
}

fn push_cost(mi: u64, times: u32) -> Result<()> {
    let stats = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let before = read(stats)?;
    write(stats, "1")?;
    let result = (|| -> Result<()> {
        let push = load_push()?;
        let snapshot = || -> Vec<(&'static str, u64, Duration)> {
            push._probes
                .run_stats()
                .into_iter()
                .map(|s| (s.name, s.run_count, s.run_time))
                .collect()
        };
        let work = || -> Result<Duration> {
            let start = Instant::now();
            for _ in 0..times {
                let status = Command::new(std::env::current_exe()?)
                    .args([
                        "climb",
                        "--mi",
                        &mi.to_string(),
                        "--rate-mib-s",
                        "100000",
                        "--exit",
                    ])
                    .status()?;
                if !status.success() {
                    bail!("the climber failed: {status}");
                }
            }
            Ok(start.elapsed())
        };
        // The attach and detach themselves, as the agent's switch does them.
        for i in 0..times {
            push.control.set_attached(true);
            let a = wait_switch(&push.control, true)?;
            push.control.set_attached(false);
            let d = wait_switch(&push.control, false)?;
            println!(
                "push_switch round={i} attach_us={} detach_us={}",
                a.last_attach.unwrap_or_default().as_micros(),
                d.last_detach.unwrap_or_default().as_micros()
            );
        }
        for (label, batch, attached) in [
            ("detached", 0u64, false),
            ("disarmed", 0, true),
            ("armed-unreached", 1 << 40, true),
        ] {
            push.control.set_attached(attached);
            wait_switch(&push.control, attached)?;
            push.control.arm(batch)?;
            let a = snapshot();
            let wall = work()?;
            let b = snapshot();
            for ((name, c0, t0), (_, c1, t1)) in a.iter().zip(&b) {
                let runs = c1.saturating_sub(*c0);
                let ns = t1.saturating_sub(*t0).as_nanos() as f64;
                println!(
                    "push_cost state={label} program={name} runs={runs} ns_per_run={:.0} wall_ms={}",
                    ns / runs.max(1) as f64,
                    wall.as_millis()
                );
            }
        }
        push.control.arm(0)?;
        push.control.set_attached(false);
        Ok(())
    })();
    write(stats, before.trim())?;
    result
}

// ---------------------------------------------------------------- guest side

/// The cgroups of one guest run.
struct Cgroups {
    base: PathBuf,
    node: PathBuf,
    pod: PathBuf,
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key)
            .then(|| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .flatten()
            .map(|kb| kb * 1024)
    })
}

/// The node cgroup's working set, `memory.current − inactive_file`.
fn working_set(node: &Path) -> Result<u64> {
    let current: u64 = read(&node.join("memory.current"))?
        .trim()
        .parse()
        .context("memory.current")?;
    let stat = read(&node.join("memory.stat"))?;
    let inactive = stat_field(&stat, "inactive_file").unwrap_or(0);
    Ok(current.saturating_sub(inactive))
}

/// The same on cgroup v1, as the kubelet reads it there: `memory.usage_in_bytes −
/// total_inactive_file`.
fn working_set_v1(node: &Path) -> Result<u64> {
    let usage: u64 = read(&node.join("memory.usage_in_bytes"))?
        .trim()
        .parse()
        .context("memory.usage_in_bytes")?;
    let stat = read(&node.join("memory.stat"))?;
    let inactive = stat_field(&stat, "total_inactive_file").unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

fn setup_cgroups(capacity: u64) -> Result<Cgroups> {
    let root = Path::new("/sys/fs/cgroup");
    let base = root.join("nm-crossing");
    let node = base.join("node");
    let pod = node.join("pod");
    fs::create_dir_all(&pod).context("creating the cgroups")?;
    for dir in [root, &base, &node] {
        let ctl = read(&dir.join("cgroup.subtree_control"))?;
        if !ctl.split_whitespace().any(|c| c == "memory") {
            write(&dir.join("cgroup.subtree_control"), "+memory")?;
        }
    }
    write(&node.join("memory.max"), &capacity.to_string())?;
    Ok(Cgroups { base, node, pod })
}

/// A trial: which notification knobs are set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Trial {
    /// sampling, PSI, memory.low: nothing that throttles.
    Observe,
    /// memory.high at the level: throttles.
    High,
}

/// First wake-up of each candidate in one climb, as instants.
#[derive(Default, Debug)]
struct Firsts {
    crossing: Option<Instant>,
    sampling: Option<Instant>,
    psi: Option<Instant>,
    low: Option<Instant>,
    high: Option<Instant>,
    /// The memory push emulation's first read at or past the level, and whether a push record
    /// (not its 100 ms look) prompted it; its push records over the climb.
    push: Option<Instant>,
    push_woke: bool,
    push_records: u32,
    /// CPU time of the 100-ms sampling thread and its passes.
    sampling_cpu: Duration,
    sampling_passes: u32,
    /// Ground-truth passes and their wall time (the achieved period).
    truth_passes: u32,
    truth_wall: Duration,
    /// The working set 1 s after the crossing, and at the crossing (to show a throttle).
    ws_at_crossing: u64,
    ws_one_second_later: u64,
}

fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut t) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

fn spawn_climber(pod: &Path, run: &RunArgs) -> Result<Child> {
    Command::new(std::env::current_exe().context("current_exe")?)
        .args(["climb", "--cgroup"])
        .arg(pod)
        .args([
            "--mi",
            &run.climb_mi.to_string(),
            "--rate-mib-s",
            &run.rate_mib_s.to_string(),
        ])
        .spawn()
        .context("starting the climber")
}

/// The agent's memory push, loaded once per guest run.
struct Push {
    rt: tokio::runtime::Runtime,
    control: node_monitor::ebpf::MemPushControl,
    wakes: node_monitor::ebpf::MemPushWakes,
    /// Kept loaded for the run.
    _probes: node_monitor::ebpf::Probes,
}

fn load_push() -> Result<Push> {
    use node_monitor::ebpf::{ProbeConfig, Probes};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _enter = rt.enter();
    // Only the push: the other families would add their own wake-ups and costs.
    let disable = ["oom", "reclaim", "kswapd", "reboot"]
        .map(str::to_owned)
        .into();
    let mut probes = Probes::load(&ProbeConfig {
        disable,
        ..ProbeConfig::default()
    });
    let Some(control) = probes.mem_push() else {
        bail!(
            "the memory push did not load: {:?}",
            probes.program_states()
        );
    };
    let wakes = probes.mem_push_wakes()?;
    drop(_enter);
    Ok(Push {
        rt,
        control,
        wakes,
        _probes: probes,
    })
}

/// The push as the agent drives it, until `stop`: read, re-arm with the batch for the reading,
/// wait for a push record or 100 ms, read again.
fn spawn_push(
    node: &Path,
    run: &RunArgs,
    push: &Arc<Mutex<Push>>,
    firsts: &Arc<Mutex<Firsts>>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    use node_monitor_core::{
        arming::mem_push::{self, PushPolicy, batch_pages},
        signals::threshold::{Operator, Threshold, ThresholdSource, ThresholdValue},
        signals::{Observations, Signal, SignalObservation},
        units::quantity::{Format, Quantity},
    };
    let (node, push, firsts, stop) = (
        node.to_path_buf(),
        push.clone(),
        firsts.clone(),
        stop.clone(),
    );
    let capacity = run.capacity_mi * MI;
    let level = (run.capacity_mi - run.threshold_mi) * MI;
    let threshold = Threshold {
        signal: Signal::MemoryAvailable,
        operator: Operator::LessThan,
        value: ThresholdValue::Quantity(Quantity::new(
            i64::try_from(run.threshold_mi * MI).unwrap_or(i64::MAX),
            Format::BinarySI,
        )),
        grace_period: Duration::ZERO,
        min_reclaim: None,
        source: ThresholdSource::EvictionHard,
        derived_from: None,
    };
    let cpus = thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let policy = PushPolicy::new(4096, cpus);
    thread::spawn(move || {
        let mut guard = push
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = &mut *guard;
        let mut armed = u64::MAX;
        let mut records = 0u32;
        let mut woke = false;
        let mut last_armed: Option<Instant> = None;
        let mut attach_asked = false;
        while !stop.load(Ordering::SeqCst) {
            let ws = working_set(&node).unwrap_or(0);
            let now = Instant::now();
            if ws >= level {
                let mut f = lock(&firsts);
                if f.push.is_none() {
                    f.push = Some(now);
                    f.push_woke = woke;
                }
            }
            let mut o = Observations::default();
            o.signals.insert(
                Signal::MemoryAvailable,
                SignalObservation {
                    available: capacity as i64 - ws as i64,
                    capacity: capacity as i64,
                },
            );
            let batch = batch_pages(&o, std::slice::from_ref(&threshold), policy);
            if batch != armed && p.control.arm(batch).is_ok() {
                armed = batch;
            }
            // Attached while armed and for DETACH_AFTER after, as the agent does.
            if batch > 0 {
                last_armed = Some(now);
            }
            let attach = batch > 0
                || last_armed.is_some_and(|t| now.duration_since(t) < mem_push::DETACH_AFTER);
            if attach != attach_asked {
                p.control.set_attached(attach);
                attach_asked = attach;
            }
            let wakes = &mut p.wakes;
            woke = match p.rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(100), wakes.next()).await
            }) {
                Ok(Ok(r)) => {
                    records += r.len() as u32;
                    true
                }
                _ => false,
            };
        }
        let _ = p.control.arm(0);
        p.control.set_attached(false);
        // Drain what came in after the last read.
        let wakes = &mut p.wakes;
        let _ = p.rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(50), wakes.next()).await
        });
        lock(&firsts).push_records = records;
    })
}

fn one_climb(cg: &Cgroups, run: &RunArgs, trial: Trial, push: &Arc<Mutex<Push>>) -> Result<Firsts> {
    let level = (run.capacity_mi - run.threshold_mi) * MI;
    let (high, low) = match trial {
        Trial::Observe => ("max".to_owned(), level.to_string()),
        Trial::High => (level.to_string(), "0".to_owned()),
    };
    write(&cg.node.join("memory.high"), &high)?;
    write(&cg.pod.join("memory.low"), &low)?;
    let firsts = Arc::new(Mutex::new(Firsts::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = vec![
        spawn_truth(&cg.node, level, &firsts, &stop),
        spawn_sampling(&cg.node, level, &firsts, &stop),
        spawn_psi(&cg.node, &firsts, &stop)?,
        spawn_events(&cg.node, &firsts, &stop)?,
    ];
    if trial == Trial::Observe {
        handles.push(spawn_push(&cg.node, run, push, &firsts, &stop));
    }
    let mut climber = spawn_climber(&cg.pod, run)?;
    let started = Instant::now();
    let cap = Duration::from_secs(run.climb_mi / run.rate_mib_s.max(1) + 20);
    // Hold until 3 s past the crossing (every candidate had its chance), or the cap.
    loop {
        thread::sleep(Duration::from_millis(50));
        let crossed = lock(&firsts).crossing;
        if crossed.is_some_and(|c| c.elapsed() > Duration::from_secs(3)) || started.elapsed() > cap
        {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = climber.kill();
    let _ = climber.wait();
    for h in handles {
        let _ = h.join();
    }
    // Let the node cgroup drain before the next climb.
    for _ in 0..100 {
        if working_set(&cg.node)? < 32 * MI {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let f = std::mem::take(&mut *lock(&firsts));
    Ok(f)
}

fn lock(f: &Mutex<Firsts>) -> std::sync::MutexGuard<'_, Firsts> {
    f.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn spawn_truth(
    node: &Path,
    level: u64,
    firsts: &Arc<Mutex<Firsts>>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let (node, firsts, stop) = (node.to_path_buf(), firsts.clone(), stop.clone());
    thread::spawn(move || {
        let start = Instant::now();
        let mut passes = 0;
        let mut one_second: Option<Instant> = None;
        while !stop.load(Ordering::SeqCst) {
            let ws = working_set(&node).unwrap_or(0);
            let now = Instant::now();
            passes += 1;
            let mut f = lock(&firsts);
            if f.crossing.is_none() && ws >= level {
                f.crossing = Some(now);
                f.ws_at_crossing = ws;
                one_second = Some(now + Duration::from_secs(1));
            }
            if one_second.is_some_and(|t| now >= t) {
                f.ws_one_second_later = ws;
                one_second = None;
            }
            drop(f);
            thread::sleep(Duration::from_micros(200));
        }
        let mut f = lock(&firsts);
        f.truth_passes = passes;
        f.truth_wall = start.elapsed();
    })
}

fn spawn_sampling(
    node: &Path,
    level: u64,
    firsts: &Arc<Mutex<Firsts>>,
    stop: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let (node, firsts, stop) = (node.to_path_buf(), firsts.clone(), stop.clone());
    thread::spawn(move || {
        let mut cpu = Duration::ZERO;
        let mut passes = 0;
        while !stop.load(Ordering::SeqCst) {
            let c0 = thread_cpu();
            let ws = working_set(&node).unwrap_or(0);
            let now = Instant::now();
            cpu += thread_cpu().saturating_sub(c0);
            passes += 1;
            {
                let mut f = lock(&firsts);
                if f.sampling.is_none() && ws >= level {
                    f.sampling = Some(now);
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        let mut f = lock(&firsts);
        f.sampling_cpu = cpu;
        f.sampling_passes = passes;
    })
}

fn spawn_psi(
    node: &Path,
    firsts: &Arc<Mutex<Firsts>>,
    stop: &Arc<AtomicBool>,
) -> Result<thread::JoinHandle<()>> {
    let path = node.join("memory.pressure");
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let line = "some 50000 500000\0";
    file.write_all(line.as_bytes())
        .with_context(|| format!("writing {line:?} to {}", path.display()))?;
    let (firsts, stop) = (firsts.clone(), stop.clone());
    Ok(thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLPRI)];
            if let Ok(n) = poll(&mut fds, PollTimeout::from(50u16))
                && n > 0
            {
                let now = Instant::now();
                let mut f = lock(&firsts);
                if f.psi.is_none() {
                    f.psi = Some(now);
                }
            }
        }
    }))
}

fn spawn_events(
    node: &Path,
    firsts: &Arc<Mutex<Firsts>>,
    stop: &Arc<AtomicBool>,
) -> Result<thread::JoinHandle<()>> {
    let path = node.join("memory.events");
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    ino.add_watch(&path, AddWatchFlags::IN_MODIFY)?;
    let before = read(&path)?;
    let (firsts, stop) = (firsts.clone(), stop.clone());
    Ok(thread::spawn(move || {
        let (low0, high0) = (
            stat_field(&before, "low").unwrap_or(0),
            stat_field(&before, "high").unwrap_or(0),
        );
        while !stop.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut fds, PollTimeout::from(50u16)), Ok(n) if n > 0) {
                continue;
            }
            let now = Instant::now();
            let _ = ino.read_events();
            let Ok(text) = read(&path) else { continue };
            let mut f = lock(&firsts);
            if f.low.is_none() && stat_field(&text, "low").unwrap_or(0) > low0 {
                f.low = Some(now);
            }
            if f.high.is_none() && stat_field(&text, "high").unwrap_or(0) > high0 {
                f.high = Some(now);
            }
        }
    }))
}

/// Milliseconds from the crossing to `at`; `None` when either is missing.
fn after(crossing: Option<Instant>, at: Option<Instant>) -> Option<f64> {
    let (c, a) = (crossing?, at?);
    Some(if a >= c {
        a.duration_since(c).as_secs_f64() * 1e3
    } else {
        -(c.duration_since(a).as_secs_f64() * 1e3)
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize(name: &str, values: &[Option<f64>]) -> String {
    let mut v: Vec<f64> = values.iter().flatten().copied().collect();
    v.sort_by(f64::total_cmp);
    let missed = values.len() - v.len();
    if v.is_empty() {
        return format!("summary {name}: no wake-up within 3 s of the crossing in {missed} climbs");
    }
    format!(
        "summary {name}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} climbs; no wake-up in {missed}",
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    )
}

fn guest(run: &RunArgs) -> Result<()> {
    if run.climb_mi >= run.capacity_mi || run.threshold_mi >= run.climb_mi {
        bail!(
            "--climb-mi {} must lie between the level and --capacity-mi {}",
            run.climb_mi,
            run.capacity_mi
        );
    }
    compare_root_formulas()?;
    let cg = setup_cgroups(run.capacity_mi * MI)?;
    if let Err(e) = profile_charge_calls(&cg) {
        println!("charge_calls error={e:#}");
    }
    let push = Arc::new(Mutex::new(load_push()?));
    let mut rows: Vec<(Trial, Firsts)> = Vec::new();
    for trial in [Trial::Observe, Trial::High] {
        for i in 0..run.runs {
            let f = one_climb(&cg, run, trial, &push)?;
            let ms = |at| after(f.crossing, at).map_or_else(|| "-".into(), |v| format!("{v:.1}"));
            if trial == Trial::Observe {
                println!(
                    "push trial={trial:?} run={i} push_ms={} push_by={} push_records={}",
                    ms(f.push),
                    if f.push_woke { "push" } else { "look" },
                    f.push_records
                );
            }
            println!(
                "result trial={trial:?} run={i} sampling_ms={} psi_ms={} low_ms={} high_ms={} \
                 ws_at_crossing_mi={} ws_plus_1s_mi={} sampling_cpu_us_per_pass={:.0} \
                 truth_period_us={:.0}",
                ms(f.sampling),
                ms(f.psi),
                ms(f.low),
                ms(f.high),
                f.ws_at_crossing / MI,
                f.ws_one_second_later / MI,
                f.sampling_cpu.as_secs_f64() * 1e6 / f64::from(f.sampling_passes.max(1)),
                f.truth_wall.as_secs_f64() * 1e6 / f64::from(f.truth_passes.max(1)),
            );
            rows.push((trial, f));
        }
    }
    let pick = |trial: Trial, get: fn(&Firsts) -> Option<Instant>| -> Vec<Option<f64>> {
        rows.iter()
            .filter(|(t, _)| *t == trial)
            .map(|(_, f)| after(f.crossing, get(f)))
            .collect()
    };
    println!(
        "{}",
        summarize("sampling-100ms", &pick(Trial::Observe, |f| f.sampling))
    );
    println!(
        "{}",
        summarize("ebpf-push", &pick(Trial::Observe, |f| f.push))
    );
    let by_push = rows
        .iter()
        .filter(|(t, f)| *t == Trial::Observe && f.push.is_some() && f.push_woke)
        .count();
    println!(
        "summary ebpf-push: the crossing read was prompted by a push record in {by_push} climbs"
    );
    println!(
        "{}",
        summarize("psi-500ms", &pick(Trial::Observe, |f| f.psi))
    );
    println!(
        "{}",
        summarize("memory.low", &pick(Trial::Observe, |f| f.low))
    );
    println!(
        "{}",
        summarize("memory.high", &pick(Trial::High, |f| f.high))
    );
    let _ = fs::remove_dir(&cg.pod);
    let _ = fs::remove_dir(&cg.node);
    let _ = fs::remove_dir(&cg.base);
    Ok(())
}

/// `memory.available` on the cgroup v2 root three ways, at rest, with 128 MiB of page cache, and
/// with 256 MiB of anonymous memory more (the ground truth the formulas should move by).
fn compare_root_formulas() -> Result<()> {
    let cache = Path::new("/var/tmp/nm-crossing-cache");
    let line = |label: &str| -> Result<()> {
        let mi = read(Path::new("/proc/meminfo"))?;
        let stat = read(Path::new("/sys/fs/cgroup/memory.stat"))?;
        let total = meminfo_field(&mi, "MemTotal").unwrap_or(0);
        let avail = meminfo_field(&mi, "MemAvailable").unwrap_or(0);
        let (anon, file, inactive) = (
            stat_field(&stat, "anon").unwrap_or(0),
            stat_field(&stat, "file").unwrap_or(0),
            stat_field(&stat, "inactive_file").unwrap_or(0),
        );
        let kubelet = total as i64 - (anon + file) as i64 + inactive as i64;
        let agent = agent_available();
        println!(
            "available label={label} MemTotal_mi={} MemAvailable_mi={} MemFree_mi={} \
             root_anon_mi={} root_file_mi={} root_inactive_file_mi={} kubelet_mi={} agent_mi={}",
            total / MI,
            avail / MI,
            meminfo_field(&mi, "MemFree").unwrap_or(0) / MI,
            anon / MI,
            file / MI,
            inactive / MI,
            kubelet / MI as i64,
            agent.map_or_else(|e| format!("error:{e}"), |a| (a / MI as i64).to_string()),
        );
        Ok(())
    };
    line("rest")?;
    {
        let mut f = fs::File::create(cache).context("creating the cache file")?;
        let block = vec![0x5au8; MI as usize];
        for _ in 0..128 {
            f.write_all(&block)?;
        }
        f.sync_all()?;
        let mut buf = Vec::new();
        fs::File::open(cache)?.read_to_end(&mut buf)?;
    }
    line("cache+128Mi")?;
    let mut climber = Command::new(std::env::current_exe()?)
        .args(["climb", "--cgroup", "/sys/fs/cgroup/nm-crossing-anon"])
        .args(["--mi", "256", "--rate-mib-s", "512"])
        .spawn()?;
    thread::sleep(Duration::from_secs(5));
    line("cache+128Mi,anon+256Mi")?;
    let _ = climber.kill();
    let _ = climber.wait();
    let _ = fs::remove_file(cache);
    let _ = fs::remove_dir("/sys/fs/cgroup/nm-crossing-anon");
    Ok(())
}

/// How often the charge path calls `page_counter_try_charge` (the hook a push at the crossing
/// would use) while 256 MiB of anonymous memory is charged: a kprobe event's hit count
/// (`kprobe_profile`), the event itself left disabled.
fn profile_charge_calls(cg: &Cgroups) -> Result<()> {
    let tracing = Path::new("/sys/kernel/tracing");
    let events = tracing.join("kprobe_events");
    fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .and_then(|mut f| f.write_all(b"p:nm_crossing/charge page_counter_try_charge\n"))
        .with_context(|| format!("adding a kprobe to {}", events.display()))?;
    let enable = tracing.join("events/nm_crossing/charge/enable");
    write(&enable, "1")?;
    let hits = || -> Result<u64> {
        Ok(read(&tracing.join("kprobe_profile"))?
            .lines()
            .find(|l| l.split_whitespace().next() == Some("charge"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0))
    };
    let before = hits()?;
    let mut climber = Command::new(std::env::current_exe()?)
        .args(["climb", "--cgroup"])
        .arg(&cg.pod)
        .args(["--mi", "256", "--rate-mib-s", "256"])
        .spawn()?;
    let start = Instant::now();
    while working_set(&cg.node)? < 250 * MI && start.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(20));
    }
    let ws = working_set(&cg.node)?;
    let calls = hits()? - before;
    let _ = climber.kill();
    let _ = climber.wait();
    write(&enable, "0")?;
    let _ = fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .and_then(|mut f| f.write_all(b"-:nm_crossing/charge\n"));
    let mi = (ws / MI).max(1);
    println!(
        "charge_calls function=page_counter_try_charge hits={calls} charged_mi={mi} per_mi={:.1}",
        calls as f64 / mi as f64
    );
    Ok(())
}

/// The agent's own `memory.available` for a cgroup v2 root node (its sampler, as `run` uses it).
fn agent_available() -> Result<i64> {
    use node_monitor::sampler::{SampleKind, Sampler, SamplerConfig};
    let mut s = Sampler::new(SamplerConfig::default()).context("the agent's sampler")?;
    let _ = s.sample(SampleKind::Signals);
    let m = s
        .last_node_memory()
        .context("the sampler read no node memory")?;
    Ok(m.capacity as i64 - m.working_set as i64)
}

// ---------------------------------------------------------------- ground truth

fn truth(node: &Path, threshold: u64, interval: Duration) -> Result<()> {
    // cgroup v2's `memory.max`, or cgroup v1's `memory.limit_in_bytes` (a guest booted with
    // `systemd.unified_cgroup_hierarchy=0`).
    let v1 = !node.join("memory.max").exists();
    let limit_file = if v1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    let max = read(&node.join(limit_file))?;
    let capacity: i64 = max.trim().parse().with_context(|| {
        format!(
            "{limit_file} of {} is {max:?}, expected bytes",
            node.display()
        )
    })?;
    let threshold = i64::try_from(threshold).context("--threshold-mi")?;
    let rearm = threshold + 32 * MI as i64;
    let mut armed = true;
    let mut out = std::io::stdout().lock();
    loop {
        let ws = if v1 {
            working_set_v1(node)?
        } else {
            working_set(node)?
        };
        let available = capacity - i64::try_from(ws).unwrap_or(i64::MAX);
        if armed && available < threshold {
            let now = k8s_openapi::jiff::Timestamp::now();
            writeln!(out, "crossing {now} available_mi={}", available / MI as i64)?;
            out.flush()?;
            armed = false;
        } else if !armed && available > rearm {
            armed = true;
        }
        thread::sleep(interval);
    }
}

// ---------------------------------------------------------------- climber

fn climb(cgroup: Option<&Path>, mi: u64, rate_mib_s: u64, exit: bool) -> Result<()> {
    if let Some(cgroup) = cgroup {
        fs::create_dir_all(cgroup).ok();
        write(
            &cgroup.join("cgroup.procs"),
            &std::process::id().to_string(),
        )?;
    }
    let step = Duration::from_secs_f64(1.0 / rate_mib_s.max(1) as f64);
    let start = Instant::now();
    let mut held: Vec<Vec<u8>> = Vec::new();
    for i in 0..mi {
        let mut chunk = vec![0u8; MI as usize];
        for page in chunk.iter_mut().step_by(4096) {
            *page = 1;
        }
        held.push(chunk);
        let due = start + step * u32::try_from(i + 1).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
    if exit {
        std::hint::black_box(&held);
        return Ok(());
    }
    loop {
        thread::sleep(Duration::from_secs(60));
        std::hint::black_box(&held);
    }
}
