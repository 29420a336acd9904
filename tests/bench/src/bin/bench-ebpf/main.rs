//! Kernel-probe benchmark: per-program run time (kernel BPF statistics), ring-buffer drops and
//! event-to-userspace latency at controlled event rates, and the idle cost of
//! `node-monitor trace`. Needs root. Results are printed as Markdown; docs/benchmarks.md
//! ("Kernel probes") records a run.
//!
//! ```text
//! cargo build --release -p node-monitor -p node-monitor-tests
//! sudo target/release/bench-ebpf [--rate-secs 5] [--idle-secs 30] [--node-monitor PATH]
//! sudo target/release/bench-ebpf --syscall-cost
//! ```
//!
//! `--syscall-cost` measures only what the reboot probe adds to every system call
//! ([`syscall_cost`]), with no other program loaded.
//!
//! Events at a controlled rate come from the benchmark's generator program: `getppid(2)` of this
//! process sends a synthetic record through the same path as the real probes (envelope, ring
//! buffer, counters, epoll wake-up, decoding). The real programs run on real work: OOM kills and
//! page-cache reclaim in test memory cgroups. kswapd wake-ups need node-level pressure and
//! `reboot(2)` is never called, so those two programs are reported without runs.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_monitor::ebpf::{EventKind, KernelEvent, ProbeConfig, Probes, RunStats};
use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    procfs,
};

const MIB: u64 = 1 << 20;
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

struct Args {
    rate_secs: u64,
    idle_secs: u64,
    node_monitor: PathBuf,
    memhog: PathBuf,
}

fn parse_args() -> Result<Args> {
    // Child mode: call getppid N times from another process (the generator filters it out).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--child-getppid") {
        let n: u64 = argv
            .get(2)
            .context("--child-getppid needs a count")?
            .parse()?;
        for _ in 0..n {
            getppid();
        }
        std::process::exit(0);
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe
        .parent()
        .context("executable has no directory")?
        .to_owned();
    let mut args = Args {
        rate_secs: 5,
        idle_secs: 30,
        node_monitor: dir.join("node-monitor"),
        memhog: dir.join("nm-memhog"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rate-secs" => args.rate_secs = value()?.parse().context("--rate-secs")?,
            "--idle-secs" => args.idle_secs = value()?.parse().context("--idle-secs")?,
            "--node-monitor" => args.node_monitor = value()?.into(),
            "--memhog" => args.memhog = value()?.into(),
            other => bail!("unknown argument {other:?}"),
        }
    }
    for (what, p) in [
        ("node-monitor", &args.node_monitor),
        ("nm-memhog", &args.memhog),
    ] {
        if !p.is_file() {
            bail!(
                "{what} not found at {} (build it next to this binary, or pass --{})",
                p.display(),
                if what == "nm-memhog" {
                    "memhog"
                } else {
                    "node-monitor"
                }
            );
        }
    }
    Ok(args)
}

/// Turns `kernel.bpf_stats_enabled` on and restores the previous value when dropped.
struct BpfStatsGuard {
    previous: String,
}

impl BpfStatsGuard {
    fn enable() -> Result<Self> {
        let previous = std::fs::read_to_string(BPF_STATS).context(BPF_STATS)?;
        std::fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled")?;
        Ok(Self {
            previous: previous.trim().to_owned(),
        })
    }
}

impl Drop for BpfStatsGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BPF_STATS, &self.previous) {
            eprintln!(
                "bench-ebpf: restoring kernel.bpf_stats_enabled={} failed: {e}",
                self.previous
            );
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn getppid() {
    // SAFETY: no preconditions.
    unsafe { libc::syscall(libc::SYS_getppid) };
}

/// Calls `getppid` `rate` times a second for `secs`, paced against a clock (sleeping when the
/// next call is far, spinning when it is near).
fn generate(rate: u64, secs: u64) -> u64 {
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let total = rate * secs;
    let start = Instant::now();
    let mut next = start;
    let mut sent = 0;
    while sent < total {
        let now = Instant::now();
        if now < next {
            let wait = next - now;
            if wait > Duration::from_micros(200) {
                std::thread::sleep(wait - Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        getppid();
        sent += 1;
        next += interval;
    }
    sent
}

#[derive(Default)]
struct Received {
    synthetic: u64,
    latencies_ns: Vec<u64>,
    other: BTreeMap<&'static str, u64>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct RateRow {
    label: String,
    sent: u64,
    received: u64,
    drops: u64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    achieved_rate: f64,
    kernel_ns: Option<f64>,
}

mod syscall_cost;

fn main() -> Result<()> {
    require_root("bench-ebpf");
    if std::env::args().nth(1).as_deref() == Some("--syscall-cost") {
        syscall_cost::print(&syscall_cost::run()?);
        return Ok(());
    }
    let args = parse_args()?;
    let stats_guard = BpfStatsGuard::enable()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _enter = rt.enter();

    let mut probes = Probes::load(&ProbeConfig {
        synthetic_tgid: Some(std::process::id()),
        ..ProbeConfig::default()
    });
    let attached = probes.attached();
    eprintln!("bench-ebpf: {attached} programs attached");
    let mut stream = probes.events().context("event stream")?;
    let received = Arc::new(Mutex::new(Received::default()));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let received = received.clone();
        let stop = stop.clone();
        rt.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(ev) = stream.next().await else {
                    continue;
                };
                let now = monotonic_ns();
                let mut r = received.lock().unwrap_or_else(|p| p.into_inner());
                match ev {
                    KernelEvent::Synthetic(s) => {
                        r.synthetic += 1;
                        r.latencies_ns.push(now.saturating_sub(s.ts_ns));
                    }
                    other => *r.other.entry(other.kind()).or_default() += 1,
                }
            }
        });
    }
    let baseline = run_stats(&probes);

    // Ring buffer at controlled rates, then as fast as one thread can call getppid.
    let mut rows = Vec::new();
    for rate in [1_000u64, 10_000, 0] {
        rows.push(measure_rate(rate, &args, &probes, &received)?);
    }

    // The generator's cost for other processes' calls: a config lookup and a compare.
    let filtered_runs = 200_000u64;
    let before = run_stats(&probes);
    let status = Command::new(std::env::current_exe()?)
        .args(["--child-getppid", &filtered_runs.to_string()])
        .status()?;
    if !status.success() {
        bail!("the getppid child failed: {status}");
    }
    let after = run_stats(&probes);
    let filtered_mean_ns = mean_ns(&before, &after, "synthetic_evt");

    oom_kills_and_memcg_reclaim(&args.memhog, 5)?;
    std::thread::sleep(Duration::from_millis(500));
    let end: Vec<RunStats> = run_stats(&probes)
        .into_iter()
        .map(|mut s| {
            // The filtered-out child calls are reported on their own line.
            if s.name == "synthetic_evt"
                && let (Some(b), Some(a)) = (
                    before.iter().find(|x| x.name == s.name),
                    after.iter().find(|x| x.name == s.name),
                )
            {
                s.run_count -= a.run_count - b.run_count;
                s.run_time -= a.run_time - b.run_time;
            }
            s
        })
        .collect();
    let counters = probes.counters()?;
    stop.store(true, Ordering::Relaxed);
    // Generates one more event so the consumer sees the stop flag.
    getppid();
    drop(stats_guard);

    let idle = idle_agent(&args)?;

    println!("## Kernel probes: bench-ebpf results\n");
    println!(
        "kernel {}, {} CPUs, {attached} programs attached\n",
        nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print_program_times(&end, &baseline, filtered_runs, filtered_mean_ns);
    println!("\n### Ring buffer at controlled rates (synthetic events)\n");
    println!(
        "| rate | achieved/s | sent | received | kernel drops | kernel ns/event | p50 µs | p99 µs | max µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            r.label,
            r.achieved_rate,
            r.sent,
            r.received,
            r.drops,
            r.kernel_ns.map_or("n/a".to_owned(), |m| format!("{m:.0}")),
            r.p50_us,
            r.p99_us,
            r.max_us
        );
    }
    let other = received.lock().map(|r| r.other.clone()).unwrap_or_default();
    println!(
        "\nkernel totals: sent {} dropped {}; other events received during the run: {other:?}",
        counters.total_events(),
        counters.total_drops()
    );
    println!("\n### Idle `node-monitor trace` ({} s)\n", args.idle_secs);
    println!(
        "CPU {:.3}% of one core ({} ticks in {:.1} s), RSS {} KiB (peak {} KiB), events printed {}",
        idle.cpu_percent, idle.ticks, idle.secs, idle.rss_kib, idle.hwm_kib, idle.events
    );
    Ok(())
}

/// One row of the ring buffer's table: synthetic events at `rate` a second for the configured
/// time (0: as fast as one thread can call getppid, for 1 s), with the consumer's latencies.
fn measure_rate(
    rate: u64,
    args: &Args,
    probes: &Probes,
    received: &Mutex<Received>,
) -> Result<RateRow> {
    {
        let mut r = received.lock().unwrap_or_else(|p| p.into_inner());
        r.synthetic = 0;
        r.latencies_ns.clear();
    }
    let before = probes.counters()?;
    let stats_before = run_stats(probes);
    let start = Instant::now();
    let sent = if rate == 0 {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut n = 0;
        while Instant::now() < deadline {
            for _ in 0..1000 {
                getppid();
            }
            n += 1000;
        }
        n
    } else {
        generate(rate, args.rate_secs)
    };
    let elapsed = start.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let after = probes.counters()?;
    let kernel_ns = mean_ns(&stats_before, &run_stats(probes), "synthetic_evt");
    let drops = after.drops[&EventKind::Synthetic] - before.drops[&EventKind::Synthetic];
    let mut r = received.lock().unwrap_or_else(|p| p.into_inner());
    r.latencies_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(RateRow {
        label: if rate == 0 {
            "max (1 s burst)".to_owned()
        } else {
            format!("{rate}/s for {} s", args.rate_secs)
        },
        sent,
        received: r.synthetic,
        drops,
        p50_us: us(percentile(&r.latencies_ns, 0.50)),
        p99_us: us(percentile(&r.latencies_ns, 0.99)),
        max_us: us(r.latencies_ns.last().copied().unwrap_or(0)),
        achieved_rate: sent as f64 / elapsed.as_secs_f64(),
        kernel_ns,
    })
}

/// Real work for the real programs: `oom_kills` OOM kills of a hog in a 32 MiB memcg, and
/// page-cache churn in a 64 MiB one (memcg reclaim).
fn oom_kills_and_memcg_reclaim(memhog: &std::path::Path, oom_kills: u32) -> Result<()> {
    let mut cg = TestCgroups::new("bench-oom");
    cg.create("hog")?;
    cg.set_memory_limit("hog", 32 * MIB)?;
    for _ in 0..oom_kills {
        let mut child = cg.spawn_in(
            "hog",
            Command::new(memhog)
                .args(["anon", "256"])
                .stdout(Stdio::null()),
        )?;
        child.wait()?;
    }
    cg.create("cache")?;
    cg.set_memory_limit("cache", 64 * MIB)?;
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let file = dir.path().join("cache");
    let mut child = cg.spawn_in(
        "cache",
        Command::new(memhog)
            .args(["pagecache", &file.to_string_lossy(), "200", "5"])
            .stdout(Stdio::null()),
    )?;
    child.wait()?;
    Ok(())
}

/// The per-program run time table: each program's runs and mean run time since `baseline`, and
/// the generator's cost for other processes' calls.
fn print_program_times(
    end: &[RunStats],
    baseline: &[RunStats],
    filtered_runs: u64,
    filtered_mean_ns: Option<f64>,
) {
    println!("### Per-program run time (kernel BPF statistics)\n");
    println!("| program | runs | mean ns/run | workload |");
    println!("|---|---:|---:|---|");
    for s in end {
        let base = baseline.iter().find(|b| b.name == s.name);
        let runs = s.run_count - base.map_or(0, |b| b.run_count);
        let time = s
            .run_time
            .saturating_sub(base.map_or(Duration::ZERO, |b| b.run_time));
        let mean = if runs == 0 {
            "n/a".to_owned()
        } else {
            format!("{:.0}", time.as_nanos() as f64 / runs as f64)
        };
        let workload = match s.name {
            "synthetic_evt" => "getppid from every process on the host (events only for ours)",
            "oom_victim_raw" => "5 memcg OOM kills",
            "direct_rcl_beg" | "direct_rcl_end" => "direct reclaim on the host (if any)",
            "memcg_rcl_beg" | "memcg_rcl_end" => "page-cache churn in a 64 MiB memcg + OOM kills",
            "kswapd_wake" => "needs node-level pressure (not generated)",
            "reboot_enter" => "never triggered",
            _ => "",
        };
        println!("| {} | {runs} | {mean} | {workload} |", s.name);
    }
    println!(
        "| synthetic_evt (other processes, filtered out) | {filtered_runs} | {} | getppid from a child process |",
        filtered_mean_ns.map_or("n/a".to_owned(), |m| format!("{m:.0}"))
    );
}

fn run_stats(probes: &Probes) -> Vec<RunStats> {
    probes.run_stats()
}

fn mean_ns(before: &[RunStats], after: &[RunStats], name: &str) -> Option<f64> {
    let b = before.iter().find(|s| s.name == name)?;
    let a = after.iter().find(|s| s.name == name)?;
    let runs = a.run_count.checked_sub(b.run_count).filter(|r| *r > 0)?;
    Some(a.run_time.saturating_sub(b.run_time).as_nanos() as f64 / runs as f64)
}

struct Idle {
    cpu_percent: f64,
    ticks: u64,
    secs: f64,
    rss_kib: u64,
    hwm_kib: u64,
    events: u64,
}

fn idle_agent(args: &Args) -> Result<Idle> {
    let child = Command::new(&args.node_monitor)
        .args([
            "trace",
            "--json",
            "--duration",
            &(args.idle_secs + 5).to_string(),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running {}", args.node_monitor.display()))?;
    let pid = child.id();
    // Let it load and settle before measuring.
    std::thread::sleep(Duration::from_secs(3));
    let t0 = procfs::cpu_ticks(pid)?;
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let t1 = procfs::cpu_ticks(pid)?;
    let secs = start.elapsed().as_secs_f64();
    let rss_kib = procfs::status_kib(pid, "VmRSS:")?;
    let hwm_kib = procfs::status_kib(pid, "VmHWM:")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let out = child.wait_with_output()?;
    let events = String::from_utf8_lossy(&out.stdout).lines().count() as u64;
    let hz = procfs::ticks_per_second();
    let ticks = t1 - t0;
    Ok(Idle {
        cpu_percent: ticks as f64 / hz / secs * 100.0,
        ticks,
        secs,
        rss_kib,
        hwm_kib,
        events,
    })
}
