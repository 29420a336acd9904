//! Sampler and wake-up benchmarks (root, real kernel):
//!
//! 1. the cost of one sampling pass with N simulated pod cgroups under a test node cgroup
//!    (time and heap allocations per pass);
//! 2. memcg threshold crossing → `Wakeup` delivered, and wake-up → observations ready;
//! 3. PSI trigger latency under a real memory stall;
//! 4. with `--disk-files N`: one measurement of per-pod disk usage (bytes and inodes) with an
//!    emptyDir of N files in every pod, as the `pod-disk` thread runs it.
//!
//! `cargo run --release -p node-monitor-tests --bin bench-sampler -- [--pods 250]
//! [--passes 500] [--crossings 30] [--psi-rounds 5] [--disk-files 0] [--json]`
//!
//! Results go to docs/benchmarks.md ("Sampler and wake-ups").

use std::{
    alloc::{GlobalAlloc, Layout, System},
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_monitor::{
    sampler::{SampleKind, Sampler, SamplerConfig},
    wakeup::{SourceSetting, WakeSource, Wakeup, WakeupConfig, Wakeups},
};

use node_monitor_core::signals::Observations;
use node_monitor_tests::cgroup::{TestCgroups, require_root};

/// Counts heap allocations, to show the sampling pass's steady state.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MIB: u64 = 1 << 20;

/// An allocator process driven over stdin (see tests/tests/kernel/kernel_sampler.rs); `timed <MiB>`
/// also reports CLOCK_MONOTONIC before and after the allocation, in nanoseconds.
const HOG: &str = r#"
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC);
$| = 1;
open(my $z, "<", "/dev/zero") or die "open /dev/zero: $!";
my @keep;
sub grab { my $n = $_[0] * 1048576; my $b = ""; my $got = 0;
  while ($got < $n) { my $r = sysread($z, $b, $n - $got, $got); die "read: $!" unless $r; $got += $r; }
  push @keep, \$b; }
print "ready\n";
while (my $l = <STDIN>) {
    chomp $l;
    if ($l =~ /^alloc (\d+)$/) { grab($1); print "ok\n"; }
    elsif ($l =~ /^timed (\d+)$/) {
        my $t0 = clock_gettime(CLOCK_MONOTONIC); grab($1); my $t1 = clock_gettime(CLOCK_MONOTONIC);
        printf "t %.0f %.0f\n", $t0 * 1e9, $t1 * 1e9;
    }
    elsif ($l eq "free") { @keep = (); print "ok\n"; }
}
"#;

struct Hog {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Hog {
    fn spawn(cg: &TestCgroups, rel: &str) -> Result<Self> {
        let mut cmd = Command::new("/usr/bin/perl");
        cmd.arg("-e")
            .arg(HOG)
            .env("MALLOC_MMAP_THRESHOLD_", "131072")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cg.spawn_in(rel, &mut cmd)?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut hog = Self {
            child,
            stdin,
            stdout,
        };
        hog.line_is("ready")?;
        Ok(hog)
    }

    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        self.stdout.read_line(&mut l).context("allocator output")?;
        Ok(l.trim().to_owned())
    }

    fn line_is(&mut self, want: &str) -> Result<()> {
        let l = self.line()?;
        if l != want {
            bail!("allocator said {l:?}, expected {want:?}");
        }
        Ok(())
    }

    fn command(&mut self, cmd: &str) -> Result<()> {
        writeln!(self.stdin, "{cmd}")?;
        self.line_is("ok")
    }

    /// Allocates `mib` and returns CLOCK_MONOTONIC (ns) at its start and end.
    fn timed(&mut self, mib: u64) -> Result<(u64, u64)> {
        writeln!(self.stdin, "timed {mib}")?;
        let l = self.line()?;
        let mut it = l.split_whitespace();
        match (it.next(), it.next(), it.next()) {
            (Some("t"), Some(a), Some(b)) => Ok((a.parse()?, b.parse()?)),
            _ => bail!("allocator said {l:?}"),
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread (user + system): the pass's own cost, whatever the CPU
/// contention on the host.
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// `Instant`s are CLOCK_MONOTONIC on Linux but opaque: map them through a reference pair.
struct MonoRef {
    inst: Instant,
    ns: u64,
}

impl MonoRef {
    fn now() -> Self {
        Self {
            inst: Instant::now(),
            ns: mono_ns(),
        }
    }

    fn ns(&self, at: Instant) -> i128 {
        match at.checked_duration_since(self.inst) {
            Some(d) => i128::from(self.ns) + d.as_nanos() as i128,
            None => i128::from(self.ns) - self.inst.duration_since(at).as_nanos() as i128,
        }
    }
}

#[derive(Debug, Default, serde::Serialize)]
struct Stats {
    n: usize,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    mean_us: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats::default();
    }
    v.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[idx.min(v.len() - 1)]
    };
    Stats {
        n: v.len(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        max_us: v[v.len() - 1],
        mean_us: v.iter().sum::<f64>() / v.len() as f64,
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Args {
    pods: usize,
    passes: usize,
    crossings: usize,
    psi_rounds: usize,
    disk_files: usize,
    json: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        pods: 250,
        passes: 500,
        crossings: 30,
        psi_rounds: 5,
        disk_files: 0,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> Result<usize> {
            let v = it.next().with_context(|| format!("{name} needs a value"))?;
            v.parse()
                .with_context(|| format!("{name}: {v:?} is not a number"))
        };
        match arg.as_str() {
            "--pods" => a.pods = num("--pods")?,
            "--passes" => a.passes = num("--passes")?,
            "--crossings" => a.crossings = num("--crossings")?,
            "--psi-rounds" => a.psi_rounds = num("--psi-rounds")?,
            "--disk-files" => a.disk_files = num("--disk-files")?,
            "--json" => a.json = true,
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(a)
}

/// A deterministic pod UID for index `i`.
fn uid(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-{i:012x}")
}

#[derive(Debug, serde::Serialize)]
struct PassResult {
    pods_found: usize,
    signals: Stats,
    fast: Stats,
    fast_cpu: Stats,
    fast_allocations_per_pass: f64,
    full: Stats,
}

fn bench_passes(sampler: &mut Sampler, passes: usize) -> PassResult {
    let mut out = Observations::default();
    for _ in 0..20 {
        sampler.sample_into(SampleKind::Fast, &mut out);
    }
    let mut fast = Vec::with_capacity(passes);
    let mut fast_cpu = Vec::with_capacity(passes);
    let mut allocs = 0u64;
    for _ in 0..passes {
        let a0 = ALLOCATIONS.load(Ordering::Relaxed);
        let c0 = thread_cpu_ns();
        let t0 = Instant::now();
        let kind = sampler.sample_into(SampleKind::Fast, &mut out);
        let dt = t0.elapsed();
        let cpu = thread_cpu_ns().saturating_sub(c0);
        allocs += ALLOCATIONS.load(Ordering::Relaxed) - a0;
        if kind == SampleKind::Fast {
            fast.push(us(dt));
            fast_cpu.push(cpu as f64 / 1e3);
        }
    }
    let mut signals = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t0 = Instant::now();
        sampler.sample_into(SampleKind::Signals, &mut out);
        signals.push(us(t0.elapsed()));
    }
    let mut full = Vec::new();
    for _ in 0..(passes / 10).max(10) {
        let t0 = Instant::now();
        sampler.sample_into(SampleKind::Full, &mut out);
        full.push(us(t0.elapsed()));
    }
    PassResult {
        pods_found: out.pods.len(),
        fast_allocations_per_pass: allocs as f64 / passes as f64,
        signals: stats(signals),
        fast: stats(fast),
        fast_cpu: stats(fast_cpu),
        full: stats(full),
    }
}

#[derive(Debug, serde::Serialize)]
struct DiskResult {
    files_per_pod: usize,
    /// Inodes the measurement counted over all pods (checked against what was created).
    inodes: u64,
    wall: Stats,
    cpu: Stats,
    /// CPU per inode walked, nanoseconds (p50 of the measurements).
    cpu_ns_per_inode: f64,
}

/// Gives every pod an emptyDir of `files` one-byte files (100 per directory) under the
/// kubelet root, then times whole measurements of per-pod disk usage on this thread.
fn bench_disk(
    sampler: &mut Sampler,
    kubelet_root: &std::path::Path,
    pods: usize,
    files: usize,
) -> Result<DiskResult> {
    let mut expected = 0u64;
    for i in 0..pods {
        let pod = kubelet_root.join("pods").join(uid(i));
        let volume = pod.join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&volume)?;
        // The pod directory, volumes, the plugin directory and the volume.
        expected += 4;
        for d in 0..files.div_ceil(100) {
            let dir = volume.join(format!("d{d}"));
            std::fs::create_dir(&dir)?;
            expected += 1;
            for f in (d * 100)..((d + 1) * 100).min(files) {
                std::fs::write(dir.join(format!("f{f}")), b"x")?;
                expected += 1;
            }
        }
    }
    let mut out = Observations::default();
    sampler.sample_into(SampleKind::Fast, &mut out);
    sampler.measure_pod_disk_now();
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..10 {
        let c0 = thread_cpu_ns();
        let t0 = Instant::now();
        sampler.measure_pod_disk_now();
        wall.push(us(t0.elapsed()));
        cpu.push(thread_cpu_ns().saturating_sub(c0) as f64 / 1e3);
    }
    sampler.sample_into(SampleKind::Fast, &mut out);
    let inodes: u64 = out.pods.values().filter_map(|u| u.inodes).sum();
    if inodes != expected {
        bail!("the measurement counted {inodes} inodes, {expected} were created");
    }
    let cpu = stats(cpu);
    Ok(DiskResult {
        files_per_pod: files,
        inodes,
        cpu_ns_per_inode: cpu.p50_us * 1e3 / inodes as f64,
        wall: stats(wall),
        cpu,
    })
}

#[derive(Debug, serde::Serialize)]
struct MemcgResult {
    crossing_to_wakeup: Stats,
    crossing_to_wakeup_estimated: Stats,
    crossing_alloc_duration: Stats,
    wakeup_to_signals: Stats,
    wakeup_to_pods: Stats,
    sampling: Stats,
    coalesced: u64,
}

async fn bench_memcg(
    cg: &TestCgroups,
    sampler: &mut Sampler,
    crossings: usize,
) -> Result<MemcgResult> {
    let mut hog = Hog::spawn(cg, "node/system")?;
    hog.command("alloc 8")?;
    let mut wakeups = Wakeups::start(WakeupConfig {
        housekeeping: Duration::from_secs(3600),
        psi: SourceSetting::Disabled,
        ..WakeupConfig::for_layout(sampler.layout())
    })?;
    sampler.sample(SampleKind::Fast);
    let m = sampler.last_node_memory().context("node memory")?;
    let level_usage = m.usage + 32 * MIB;
    let threshold = m.capacity + m.inactive_file - level_usage;
    wakeups.arm_memory_thresholds(&[threshold], m.capacity, m.inactive_file);
    let armed = wakeups.armed_thresholds();
    let level = armed.first().context("threshold armed")?.usage_bytes;

    let mut latency = Vec::new();
    let mut estimated = Vec::new();
    let mut alloc_time = Vec::new();
    let mut to_signals = Vec::new();
    let mut to_pods = Vec::new();
    let mut sampling = Vec::new();
    let mut above = false;
    for round in 0..crossings {
        hog.command("free")?;
        if above {
            // The kernel checks thresholds every 128 page events per CPU, so the way down is
            // only seen once enough pages moved: nudge with small allocations until the
            // downward crossing is reported (otherwise the next crossing up would not count
            // as one).
            let mut seen = false;
            for _ in 0..50 {
                if let Ok(Some(w)) =
                    tokio::time::timeout(Duration::from_millis(100), wakeups.next()).await
                    && matches!(w.source, WakeSource::MemcgThreshold { .. })
                {
                    seen = true;
                    break;
                }
                hog.command("alloc 1")?;
                hog.command("free")?;
            }
            if !seen {
                bail!("round {round}: the crossing down was never reported");
            }
        }
        while wakeups.try_next().is_some() {}
        sampler.sample(SampleKind::Fast);
        let usage = sampler.last_node_memory().context("node memory")?.usage;
        if usage >= level {
            bail!("round {round}: usage {usage} already above the level {level}");
        }
        // Fill to 1–2 MiB below the level, then cross it with a timed 4 MiB allocation: at
        // least 2 MiB (512 page events) follow the crossing, so a threshold check runs.
        let below = (level - usage) / MIB;
        if below > 1 {
            hog.command(&format!("alloc {}", below - 1))?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        while wakeups.try_next().is_some() {}
        sampler.sample(SampleKind::Signals);
        let to_go = level.saturating_sub(sampler.last_node_memory().context("node memory")?.usage);
        let r = MonoRef::now();
        // The allocation runs on a blocking thread so the wake-up is handled the moment it
        // arrives, as the agent's loop would, not after the allocator answers.
        let mut driver = hog;
        let crossing = tokio::task::spawn_blocking(move || {
            let t = driver.timed(4);
            (driver, t)
        });
        above = true;
        let w: Wakeup = loop {
            let w = tokio::time::timeout(Duration::from_secs(10), wakeups.next())
                .await
                .with_context(|| format!("round {round}: no memcg wake-up within 10 s"))?
                .context("queue closed")?;
            if matches!(w.source, WakeSource::MemcgThreshold { .. }) {
                break w;
            }
        };
        // Decide on the node signals first, then read the pods (what ranking needs).
        let decided = sampler.observe_as(w, SampleKind::Signals);
        let ranked = sampler.observe_as(w, SampleKind::Fast);
        let (driver, t) = crossing.await?;
        hog = driver;
        let (t0, t1) = t?;
        latency.push((r.ns(w.at) - i128::from(t0)) as f64 / 1e3);
        // Where in the allocation the level was passed, assuming pages are charged at a steady
        // rate through it.
        let crossed = t0 as f64 + (to_go as f64 / (4 * MIB) as f64).min(1.0) * (t1 - t0) as f64;
        estimated.push((r.ns(w.at) as f64 - crossed) / 1e3);
        alloc_time.push((t1.saturating_sub(t0)) as f64 / 1e3);
        to_signals.push(us(decided.since_wakeup));
        to_pods.push(us(ranked.since_wakeup));
        sampling.push(us(ranked.sampling));
    }
    Ok(MemcgResult {
        crossing_to_wakeup: stats(latency),
        crossing_to_wakeup_estimated: stats(estimated),
        crossing_alloc_duration: stats(alloc_time),
        wakeup_to_signals: stats(to_signals),
        wakeup_to_pods: stats(to_pods),
        sampling: stats(sampling),
        coalesced: wakeups.coalesced(),
    })
}

#[derive(Debug, serde::Serialize)]
struct PsiResult {
    effective_window_ms: u128,
    stall_start_to_wakeup: Stats,
}

async fn bench_psi(cg: &mut TestCgroups, rounds: usize) -> Result<PsiResult> {
    cg.create("psi-node/system")?;
    cg.set_memory_limit("psi-node", 32 * MIB)?;
    let psi = cg.unified("psi-node").join("memory.pressure");
    let mut wakeups = Wakeups::start(WakeupConfig {
        housekeeping: Duration::from_secs(3600),
        memcg_node: SourceSetting::Disabled,
        memcg_kubepods: SourceSetting::Disabled,
        memory_events: SourceSetting::Disabled,
        psi: SourceSetting::Path(psi),
        ..WakeupConfig::for_layout(&SamplerConfig::default().resolve()?)
    })?;
    let window = wakeups
        .psi_effective_window()
        .context("PSI trigger not armed")?;
    let scratch = tempfile::tempdir_in("/var/tmp")?;
    let file = scratch.path().join("thrash");
    let script = format!(
        "[ -f {f} ] || dd if=/dev/zero of={f} bs=1M count=256 status=none; \
         while :; do cat {f} > /dev/null; done",
        f = file.display()
    );
    let mut lat = Vec::new();
    for round in 0..rounds {
        // Let the previous round's stall leave the window before starting again.
        tokio::time::sleep(window * 3).await;
        while wakeups.try_next().is_some() {}
        let r = MonoRef::now();
        let start = r.ns;
        let mut thrash = cg.spawn_in(
            "psi-node/system",
            Command::new("bash").arg("-c").arg(&script),
        )?;
        let w = loop {
            let w = tokio::time::timeout(Duration::from_secs(60), wakeups.next())
                .await
                .with_context(|| format!("PSI round {round}: no wake-up within 60 s"))?
                .context("queue closed")?;
            if w.source == WakeSource::Psi {
                break w;
            }
        };
        lat.push((r.ns(w.at) - i128::from(start)) as f64 / 1e3);
        let _ = thrash.kill();
        let _ = thrash.wait();
        cg.kill_all();
    }
    Ok(PsiResult {
        effective_window_ms: window.as_millis(),
        stall_start_to_wakeup: stats(lat),
    })
}

fn fmt_stats(s: &Stats) -> String {
    format!(
        "p50 {:.1} µs · p99 {:.1} µs · max {:.1} µs (n={})",
        s.p50_us, s.p99_us, s.max_us, s.n
    )
}

fn main() -> Result<()> {
    require_root("bench-sampler");
    let args = parse_args()?;
    let nofile = node_monitor::sampler::raise_nofile_limit()?;
    let mut cg = TestCgroups::new("bench-sampler");
    cg.create("node/system")?;
    cg.create("node/kubepods")?;
    cg.set_memory_limit("node", 2048 * MIB)?;
    let tiers = ["", "burstable/", "besteffort/"];
    let mut sleepers = Vec::new();
    for i in 0..args.pods {
        let tier = tiers[i % tiers.len()];
        let rel = format!("node/kubepods/{tier}pod{}/ctr", uid(i));
        cg.create(&rel)?;
        if i % 10 == 0 {
            sleepers.push(cg.spawn_in(&rel, Command::new("sleep").arg("3600"))?);
        }
    }
    let fsdir = tempfile::tempdir()?;
    std::fs::create_dir(fsdir.path().join("images"))?;
    let config = SamplerConfig {
        node_cgroup: cg.rel_root().join("node"),
        kubelet_root: fsdir.path().to_path_buf(),
        image_fs: Some(fsdir.path().join("images")),
        pod_log_root: fsdir.path().join("logs"),
        full_sample_interval: Duration::from_secs(3600),
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(config)?;
    let passes = bench_passes(&mut sampler, args.passes);
    if passes.pods_found != args.pods {
        bail!(
            "the sampler found {} pods, {} were created",
            passes.pods_found,
            args.pods
        );
    }

    let disk = if args.disk_files > 0 {
        Some(bench_disk(
            &mut sampler,
            fsdir.path(),
            args.pods,
            args.disk_files,
        )?)
    } else {
        None
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let memcg = rt.block_on(bench_memcg(&cg, &mut sampler, args.crossings))?;
    let psi = if args.psi_rounds > 0 {
        Some(rt.block_on(bench_psi(&mut cg, args.psi_rounds))?)
    } else {
        None
    };
    for mut s in sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }

    if args.json {
        let v = serde_json::json!({
            "pods": args.pods,
            "nofile": nofile,
            "passes": passes,
            "disk": disk,
            "memcg": memcg,
            "psi": psi,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "sampler pass, {} pod cgroups (node cgroup, cgroup v1; RLIMIT_NOFILE {nofile}):",
        args.pods
    );
    println!("  signals only, wall: {}", fmt_stats(&passes.signals));
    println!("  fast, wall: {}", fmt_stats(&passes.fast));
    println!("  fast, CPU:  {}", fmt_stats(&passes.fast_cpu));
    println!(
        "  fast: {:.1} heap allocations per pass (steady state)",
        passes.fast_allocations_per_pass
    );
    println!("  full, wall: {}", fmt_stats(&passes.full));
    if let Some(d) = &disk {
        println!(
            "pod disk measurement, {} files per pod ({} inodes counted):",
            d.files_per_pod, d.inodes
        );
        println!("  wall: {}", fmt_stats(&d.wall));
        println!("  CPU:  {}", fmt_stats(&d.cpu));
        println!("  CPU per inode walked: {:.0} ns", d.cpu_ns_per_inode);
    }
    println!("memcg threshold, {} crossings:", args.crossings);
    println!(
        "  start of the crossing allocation → Wakeup delivered: {}",
        fmt_stats(&memcg.crossing_to_wakeup)
    );
    println!(
        "  crossing (interpolated) → Wakeup delivered: {}",
        fmt_stats(&memcg.crossing_to_wakeup_estimated)
    );
    println!(
        "  (the crossing 4 MiB allocation itself took {})",
        fmt_stats(&memcg.crossing_alloc_duration)
    );
    println!(
        "  Wakeup → node signals observed (signals pass): {}",
        fmt_stats(&memcg.wakeup_to_signals)
    );
    println!(
        "  Wakeup → pods observed too (then a fast pass): {}",
        fmt_stats(&memcg.wakeup_to_pods)
    );
    println!("  the fast pass itself: {}", fmt_stats(&memcg.sampling));
    if let Some(p) = psi {
        println!(
            "PSI trigger (window {} ms), stall start → Wakeup: {}",
            p.effective_window_ms,
            fmt_stats(&p.stall_start_to_wakeup)
        );
    }
    Ok(())
}
