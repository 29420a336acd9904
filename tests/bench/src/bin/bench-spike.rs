//! Spike-survival benchmark: allocation ramps of increasing speed on a node whose memory is the
//! whole machine, and how many kernel OOM kills happen with each contender.
//!
//! Each contender runs in its own fresh boot of the Debian guest (`tests/src/vm.rs`: kernel 6.1,
//! cgroup v2, no swap), with the same memory, the same pods and the same ramps:
//!
//! - `node-monitor@<N>`: the agent with its defaults (eBPF, cgroup v2 `memory.events`, PSI,
//!   adaptive sampling near a threshold) and the hard threshold `memory.available<N%`;
//! - `polling@<N>`: the same agent with `--polling-only` (the kubelet's 10 s housekeeping poll);
//! - `earlyoom`: Debian's earlyoom service with its packaged defaults (`-r 3600`: SIGTERM at
//!   MemAvailable ≤ 10 %, SIGKILL at ≤ 5 %), no agent;
//! - `none`: nothing but the kernel.
//!
//! `memory.available` is the kubelet's (MemTotal minus the root's working set), which counts
//! kernel memory and the pages below the kernel's watermarks as available; earlyoom's
//! MemAvailable does not. The same percentage is therefore a later point for the agent: the
//! default contenders run the agent at 10 % (the same number) and at 25 % (about the same point
//! in MemAvailable terms on the 1 GiB guest; the baselines printed at the end give the gap).
//!
//! The host runs the control plane; the guest runs the kubelet stand-in (node cgroup limit =
//! MemTotal, so the node is the machine) and the contender. The host creates a Guaranteed pod, then
//! for every run a BestEffort "ramp" pod that allocates at a fixed rate until something stops it
//! or it has allocated more than the guest has. A line protocol on a TCP connection from the guest
//! to the host (qemu user networking, 10.0.2.2) brackets every run: the guest records
//! `/proc/vmstat` `oom_kill`, the kernel log's `Killed process` lines, earlyoom's signals, the
//! agent's evictions and the ramp's own progress, waits for memory to come back, and reports.
//!
//! Root, qemu, the guest image and the control-plane binaries are required; the binaries copied
//! into the guest are the release build (`--guest-profile`). See docs/benchmarks.md
//! ("Spike survival").
//!
//! ```sh
//! cargo bins
//! cargo build --release -p node-monitor -p node-monitor-tests \
//!     --bin node-monitor --bin nm-kubelet-standin --bin nm-workload
//! flock /tmp/nm-vm.lock target/debug/bench-spike --runs 3
//! ```
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use node_monitor_tests::{
    cgroup::require_root,
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    vm::{ENTRY_PRELUDE, Guest, GuestKernel, GuestOptions, GuestRun, Payload},
};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines},
    net::{
        TcpListener,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
};

const NS: &str = "default";
const NODE: &str = "vm-node";
const MIB: u64 = 1 << 20;
/// The ramp's allocation period for paced ramps: small steps, so the ramp is close to linear.
const RAMP_PERIOD_MS: u64 = 40;
/// The step of the as-fast-as-possible ramp (no pause between steps).
const MAX_RATE_STEP: &str = "16Mi";
/// What the guest runs, from `target/<profile>/`.
const GUEST_BINARIES: [&str; 3] = ["node-monitor", "nm-kubelet-standin", "nm-workload"];
/// The Guaranteed pod's limit above what it holds (request = limit).
const GUARANTEED_HEADROOM_MIB: u64 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NodeMonitor,
    Polling,
    Earlyoom,
    None,
}

impl Kind {
    /// The name the guest script switches on.
    fn as_str(self) -> &'static str {
        match self {
            Self::NodeMonitor => "node-monitor",
            Self::Polling => "polling",
            Self::Earlyoom => "earlyoom",
            Self::None => "none",
        }
    }
}

/// A contender; the agent's two carry their hard threshold, `memory.available<N%`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Contender {
    kind: Kind,
    threshold_percent: Option<u32>,
}

impl Contender {
    fn label(self) -> String {
        match self.threshold_percent {
            Some(t) => format!("{}@{t}%", self.kind.as_str()),
            None => self.kind.as_str().to_owned(),
        }
    }

    /// For directory names.
    fn slug(self) -> String {
        match self.threshold_percent {
            Some(t) => format!("{}-{t}", self.kind.as_str()),
            None => self.kind.as_str().to_owned(),
        }
    }
}

/// `node-monitor@<percent>`, `polling@<percent>`, `earlyoom` or `none`.
fn parse_contender(s: &str) -> Result<Contender, String> {
    let (name, pct) = match s.split_once('@') {
        Some((n, p)) => (n, Some(p)),
        None => (s, None),
    };
    let kind = match name {
        "node-monitor" => Kind::NodeMonitor,
        "polling" => Kind::Polling,
        "earlyoom" => Kind::Earlyoom,
        "none" => Kind::None,
        _ => {
            return Err(format!(
                "contender {s:?}: expected node-monitor@<percent>, polling@<percent>, earlyoom \
                 or none"
            ));
        }
    };
    let threshold_percent = match (kind, pct) {
        (Kind::NodeMonitor | Kind::Polling, Some(p)) => {
            let v: u32 = p
                .trim_end_matches('%')
                .parse()
                .map_err(|_| format!("contender {s:?}: threshold {p:?} is not a whole percent"))?;
            if !(1..=50).contains(&v) {
                return Err(format!(
                    "contender {s:?}: threshold {v}% must be between 1% and 50%"
                ));
            }
            Some(v)
        }
        (Kind::NodeMonitor | Kind::Polling, None) => {
            return Err(format!(
                "contender {s:?}: the agent needs its threshold, e.g. {name}@10"
            ));
        }
        (_, Some(_)) => return Err(format!("contender {s:?}: {name} takes no threshold")),
        (_, None) => None,
    };
    Ok(Contender {
        kind,
        threshold_percent,
    })
}

#[derive(Parser)]
#[command(about = "Kernel OOM kills under allocation ramps: node-monitor, polling, earlyoom, none")]
struct Args {
    /// Contenders, each in its own guest boot: `node-monitor@<percent>` (the agent with its push
    /// sources, hard threshold `memory.available<percent%`), `polling@<percent>` (the same
    /// agent with `--polling-only`), `earlyoom` (Debian's service, packaged defaults), `none`.
    #[arg(
        long,
        value_parser = parse_contender,
        value_delimiter = ',',
        default_value = "node-monitor@10,node-monitor@25,polling@25,earlyoom,none"
    )]
    contenders: Vec<Contender>,
    /// Ramp speeds in MiB/s; 0 allocates as fast as it can.
    #[arg(long, value_delimiter = ',', default_value = "25,50,100,200,0")]
    rates: Vec<u32>,
    /// Runs per ramp speed and contender.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Guest memory.
    #[arg(long, default_value_t = 1024)]
    memory_mib: u32,
    /// What the Guaranteed pod holds, in MiB (its request = limit is 32 MiB more): the node's
    /// steady workload, which also shortens every ramp.
    #[arg(long, default_value_t = 300)]
    guaranteed_mib: u64,
    /// Build profile of the binaries copied into the guest (`target/<profile>/`).
    #[arg(long, default_value = "release")]
    guest_profile: String,
    /// Also write the per-run TSV here.
    #[arg(long)]
    tsv: Option<PathBuf>,
    /// Keep every guest's logs under this directory (default: a new directory in /tmp).
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// One ramp speed: nominal MiB/s (0: as fast as possible) and the nm-workload arguments.
#[derive(Debug, Clone)]
struct Ramp {
    nominal: u32,
}

impl Ramp {
    fn label(&self) -> String {
        if self.nominal == 0 {
            "max".to_owned()
        } else {
            format!("{}", self.nominal)
        }
    }

    /// `--ramp-to <to> --step <s> --interval <i>`. nm-workload sleeps `interval` after each
    /// step, so the achieved rate is below nominal by the time a step takes; it is measured.
    fn workload_args(&self, ramp_to_mib: u64) -> Vec<String> {
        let (step, interval) = if self.nominal == 0 {
            (MAX_RATE_STEP.to_owned(), "0ms".to_owned())
        } else {
            let kib = u64::from(self.nominal) * 1024 * RAMP_PERIOD_MS / 1000;
            (format!("{kib}Ki"), format!("{RAMP_PERIOD_MS}ms"))
        };
        vec![
            "--ramp-to".into(),
            format!("{ramp_to_mib}Mi"),
            "--step".into(),
            step,
            "--interval".into(),
            interval,
        ]
    }

    /// How long a run may take before it is recorded as unfinished.
    fn run_timeout(&self, ramp_to_mib: u64) -> Duration {
        let rate = if self.nominal == 0 {
            200
        } else {
            u64::from(self.nominal)
        };
        Duration::from_secs(ramp_to_mib / rate * 3 + 90)
    }
}

/// What one run left behind.
#[derive(Debug, Clone, Default)]
struct Row {
    contender: String,
    ramp: String,
    run: usize,
    id: usize,
    /// `/proc/vmstat` `oom_kill` delta over the run.
    oom_kills: Option<u64>,
    /// `pid/comm/oom_score_adj` of each process the kernel killed.
    kernel_victims: String,
    ramp_killed_by_kernel: bool,
    /// An `Evicted` event on the ramp pod.
    evicted: bool,
    /// `SIG/name/pid` of each signal earlyoom sent.
    earlyoom: String,
    /// Who acted first, by the guest's clock: `evicted`, `earlyoom`, `kernel` or `-`.
    first: String,
    /// What woke the agent for the eviction.
    wake_source: String,
    /// MiB/s over the first half of the baseline MemAvailable (before any memory pressure) and
    /// over the whole ramp.
    rate_half: Option<f64>,
    rate_all: Option<f64>,
    /// MiB the ramp had allocated when it ended.
    peak_mib: Option<f64>,
    /// `sigterm` (clean exit on SIGTERM), `killed`, or `running`.
    ramp_end: String,
    /// From the pod's creation to its end, as the host saw it through the API.
    host_secs: f64,
    /// How the pod ended in the API: `gone`, `Failed/OOMKilled/137`, `timeout`, …
    api_end: String,
    guaranteed_ok: bool,
    /// Seconds the guest waited for memory to come back.
    settle_secs: Option<f64>,
}

impl Row {
    const HEADER: &'static str = "contender\tramp_mib_s\trun\tid\toom_kills\tkernel_victims\t\
        ramp_killed_by_kernel\tevicted\tearlyoom\tfirst\twake_source\trate_free_mib_s\t\
        rate_all_mib_s\tpeak_mib\tramp_end\tapi_end\thost_secs\tguaranteed_ok\tsettle_secs";

    fn tsv(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        let dash = |s: &str| {
            if s.is_empty() {
                "-".to_owned()
            } else {
                s.to_owned()
            }
        };
        [
            self.contender.clone(),
            self.ramp.clone(),
            self.run.to_string(),
            self.id.to_string(),
            self.oom_kills.map_or("-".to_owned(), |v| v.to_string()),
            dash(&self.kernel_victims),
            self.ramp_killed_by_kernel.to_string(),
            self.evicted.to_string(),
            dash(&self.earlyoom),
            dash(&self.first),
            dash(&self.wake_source),
            opt(self.rate_half),
            opt(self.rate_all),
            opt(self.peak_mib),
            dash(&self.ramp_end),
            dash(&self.api_end),
            format!("{:.1}", self.host_secs),
            self.guaranteed_ok.to_string(),
            opt(self.settle_secs),
        ]
        .join("\t")
    }
}

/// Everything one contender's boot produced.
struct BootResult {
    rows: Vec<Row>,
    /// `key=value` facts the guest reported at the baseline (memory before the runs).
    baseline: BTreeMap<String, String>,
    error: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    require_root("bench-spike (qemu guest, control plane)");
    if args.runs == 0 || args.rates.is_empty() || args.contenders.is_empty() {
        bail!("--runs, --rates and --contenders must not be empty");
    }
    if let Some(r) = args.rates.iter().find(|r| **r > 2000) {
        bail!("--rates: {r} MiB/s is beyond what the guest can allocate (at most 2000)");
    }
    if args.guaranteed_mib == 0 || args.guaranteed_mib * 2 > u64::from(args.memory_mib) {
        bail!(
            "--guaranteed-mib {} must be positive and at most half of --memory-mib {}",
            args.guaranteed_mib,
            args.memory_mib
        );
    }
    let bins = guest_binaries(&args.guest_profile)?;
    let logs = match &args.logs {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "bench-spike-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        )),
    };
    fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    eprintln!("bench-spike: guest logs in {}", logs.display());
    // Every boot runs the same binaries, whatever gets rebuilt in target/ during the run.
    let bins = snapshot_binaries(&bins, &logs.join("bin"))?;
    let started = Instant::now();

    let mut results: Vec<(Contender, BootResult)> = Vec::new();
    for &c in &args.contenders {
        eprintln!("bench-spike: {} — booting a fresh guest", c.label());
        let r = boot(c, &args, &bins, &logs.join(c.slug())).await;
        if let Some(e) = &r.error {
            eprintln!("bench-spike: {}: {e}", c.label());
        }
        results.push((c, r));
    }

    let mut tsv = String::from(Row::HEADER);
    tsv.push('\n');
    for (_, r) in &results {
        for row in &r.rows {
            tsv.push_str(&row.tsv());
            tsv.push('\n');
        }
    }
    println!("{tsv}");
    if let Some(p) = &args.tsv {
        fs::write(p, &tsv).with_context(|| format!("write {}", p.display()))?;
    }
    println!("{}", summary(&args, &results));
    println!(
        "total wall time {:.1} min; guest logs in {}",
        started.elapsed().as_secs_f64() / 60.0,
        logs.display()
    );
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, r)| r.error.is_some())
        .map(|(c, _)| c.label())
        .collect();
    if !failed.is_empty() {
        bail!("contenders that did not complete every run: {failed:?}");
    }
    Ok(())
}

/// The guest's binaries: release builds by default, checked before any guest boots.
fn guest_binaries(profile: &str) -> Result<PathBuf> {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = base.join(profile);
    for b in GUEST_BINARIES {
        if !dir.join(b).is_file() {
            bail!(
                "{} is missing: build it with `cargo build --profile {profile} -p node-monitor \
                 -p node-monitor-tests --bin node-monitor --bin nm-kubelet-standin --bin nm-workload`",
                dir.join(b).display()
            );
        }
    }
    Ok(dir)
}

/// Copies the guest's binaries into `dir` and prints their SHA-256, so a run names what it ran.
fn snapshot_binaries(from: &Path, dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for b in GUEST_BINARIES {
        let (src, dst) = (from.join(b), dir.join(b));
        fs::copy(&src, &dst).with_context(|| format!("copy {}", src.display()))?;
        let sum = std::process::Command::new("sha256sum")
            .arg(&dst)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .chars()
                    .take(16)
                    .collect::<String>()
            })
            .unwrap_or_else(|| "?".to_owned());
        eprintln!(
            "bench-spike: guest binary {b} sha256 {sum}… ({})",
            src.display()
        );
    }
    Ok(dir.to_owned())
}

/// One contender: a fresh control plane and guest, the Guaranteed pod, then every run.
async fn boot(c: Contender, args: &Args, bins: &Path, logs: &Path) -> BootResult {
    let mut out = BootResult {
        rows: Vec::new(),
        baseline: BTreeMap::new(),
        error: None,
    };
    let payload = match Payload::new("nm-spike") {
        Ok(d) => d,
        Err(e) => {
            out.error = Some(format!("payload directory: {e}"));
            return out;
        }
    };
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => {
            out.error = Some(format!("report listener: {e}"));
            return out;
        }
    };
    let result = async {
        let port = listener.local_addr()?.port();
        write_payload(&payload, c, bins, port)?;
        // A generous cap: the boot, then every run at its own timeout plus the settling.
        let ramp_to = u64::from(args.memory_mib) + 512;
        let cap: u64 = args
            .rates
            .iter()
            .map(|&r| {
                Ramp { nominal: r }
                    .run_timeout(ramp_to)
                    .as_secs()
                    .saturating_add(240)
            })
            .sum::<u64>()
            .saturating_mul(args.runs as u64)
            .saturating_add(600);
        let opts = GuestOptions {
            memory_mib: args.memory_mib,
            cpus: 2,
            cmdline: String::new(),
            timeout: Duration::from_secs(cap),
            kernel: GuestKernel::default(),
            qmp_port: None,
        };
        let guest = Guest::boot(payload.path(), opts);
        let cp = ControlPlane::start(ControlPlaneOptions::default())
            .await
            .context("control plane")?;
        payload.kubeconfig(&cp)?;
        let driven = drive(c, args, &cp.client(), &listener, &guest, &mut out).await;
        if let Err(e) = &driven {
            out.error = Some(format!("{e:#}"));
            // The guest may be wedged or waiting for a host that gave up: do not sit out its cap.
            if !!guest.running() {
                kill_guest(payload.path());
            }
        }
        // The guest powers off after `quit` (or on its own cap); its logs are kept either way.
        match guest.finish().await {
            Ok(run) => keep_logs(&run, logs),
            Err(e) => {
                out.error.get_or_insert_with(|| format!("guest: {e:#}"));
            }
        }
        if let Err(e) = cp.stop() {
            eprintln!("bench-spike: stopping the control plane: {e}");
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        out.error.get_or_insert_with(|| format!("{e:#}"));
    }
    out
}

/// Kills the qemu this process started for `payload` (found by its parent, this process, and the
/// payload path on its command line).
fn kill_guest(payload: &Path) {
    let me = std::process::id().to_string();
    let needle = payload.display().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let ppid = fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_owned))
            })
            .unwrap_or_default();
        if ppid == me && cmdline.contains("qemu-system") && cmdline.contains(&needle) {
            eprintln!("bench-spike: killing the guest (qemu pid {pid})");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn keep_logs(run: &GuestRun, dir: &Path) {
    if let Err(e) = fs::create_dir_all(dir) {
        eprintln!("bench-spike: {}: {e}", dir.display());
        return;
    }
    let _ = fs::write(dir.join("console.log"), &run.console);
    for f in [
        "entry.log",
        "agent.log",
        "standin.log",
        "dmesg.txt",
        "earlyoom.log",
        "meminfo-end.txt",
    ] {
        if let Ok(t) = run.read_out(f) {
            let _ = fs::write(dir.join(f), t);
        }
    }
}

/// Binaries (hard links when the filesystem allows), the agent's configuration and the guest
/// script.
fn write_payload(payload: &Payload, c: Contender, bins: &Path, port: u16) -> Result<()> {
    for b in GUEST_BINARIES {
        payload.link(b, &bins.join(b))?;
    }
    if let Some(t) = c.threshold_percent {
        payload.write(
            "config.yaml",
            format!("evictionHard:\n  memory.available: \"{t}%\"\n"),
        )?;
    }
    let agent_flags = match c.kind {
        Kind::Polling => "--polling-only",
        _ => "",
    };
    let script = format!(
        "{ENTRY_PRELUDE}CONTENDER={}\nREPORT_PORT={port}\nAGENT_FLAGS='{agent_flags}'\n{GUEST_SCRIPT}",
        c.kind.as_str()
    );
    payload.write("guest-entry.sh", script)
}

/// The line protocol with the guest: the host sends `baseline`, `begin <id>`, `end <id>`,
/// `quit`; the guest answers with `key=value` lines.
struct Channel {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Channel {
    async fn send(&mut self, line: &str) -> Result<()> {
        self.write
            .write_all(format!("{line}\n").as_bytes())
            .await
            .with_context(|| format!("send {line:?} to the guest"))
    }

    /// The next line starting with `word`, as its `key=value` fields (other lines are progress,
    /// printed).
    async fn expect(
        &mut self,
        word: &str,
        timeout: Duration,
        guest: &Guest,
    ) -> Result<BTreeMap<String, String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the guest did not answer {word:?} within {timeout:?}");
            }
            if !guest.running() {
                bail!("the guest ended while the host waited for {word:?}");
            }
            let step = left.min(Duration::from_secs(2));
            match tokio::time::timeout(step, self.lines.next_line()).await {
                Err(_) => continue,
                Ok(Err(e)) => bail!("report channel: {e}"),
                Ok(Ok(None)) => bail!("the guest closed the report channel before {word:?}"),
                Ok(Ok(Some(line))) => {
                    let mut parts = line.split_whitespace();
                    if parts.next() == Some(word) {
                        return Ok(parts
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                            .collect());
                    }
                    eprintln!("  guest: {line}");
                }
            }
        }
    }
}

async fn drive(
    c: Contender,
    args: &Args,
    client: &Client,
    listener: &TcpListener,
    guest: &Guest,
    out: &mut BootResult,
) -> Result<()> {
    // The guest connects once its contender is up (boot, stand-in, agent ready).
    let deadline = Instant::now() + Duration::from_secs(420);
    let stream = loop {
        if !guest.running() {
            bail!("the guest ended before it connected");
        }
        if Instant::now() > deadline {
            bail!("the guest did not connect within 420 s");
        }
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(2), listener.accept()).await {
            break r.context("accept the guest")?.0;
        }
    };
    let (r, w) = stream.into_split();
    let mut ch = Channel {
        lines: BufReader::new(r).lines(),
        write: w,
    };
    let hello = ch.expect("hello", Duration::from_secs(60), guest).await?;
    let memtotal_kb: u64 = field(&hello, "memtotal_kb")?;
    eprintln!(
        "bench-spike: {} ready: MemTotal {} MiB, guest uptime {} s",
        c.label(),
        memtotal_kb / 1024,
        hello.get("uptime").map_or("?", String::as_str)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // The Guaranteed pod, then the memory baseline with it running.
    pods.create(&PostParams::default(), &guaranteed_pod(args.guaranteed_mib))
        .await
        .context("create the Guaranteed pod")?;
    let g = wait_running(&pods, "guaranteed", Duration::from_secs(120), guest).await?;
    let g_uid = g.metadata.uid.clone().unwrap_or_default();
    ch.send("baseline").await?;
    out.baseline = ch
        .expect("baseline", Duration::from_secs(90), guest)
        .await?;
    eprintln!("bench-spike: {} baseline {:?}", c.label(), out.baseline);

    let ramp_to_mib = memtotal_kb / 1024 + 512;
    let mut id = 0;
    for run in 0..args.runs {
        for &nominal in &args.rates {
            let ramp = Ramp { nominal };
            id += 1;
            let row = one_run(
                c,
                &ramp,
                run,
                id,
                ramp_to_mib,
                &pods,
                client,
                &mut ch,
                guest,
                &g_uid,
            )
            .await
            .with_context(|| format!("{} run {run} at {} MiB/s", c.label(), ramp.label()))?;
            eprintln!("bench-spike: {}", row.tsv());
            out.rows.push(row);
        }
    }
    ch.send("quit").await?;
    Ok(())
}

#[expect(
    clippy::too_many_arguments,
    reason = "one run needs the whole boot's context"
)]
async fn one_run(
    c: Contender,
    ramp: &Ramp,
    run: usize,
    id: usize,
    ramp_to_mib: u64,
    pods: &Api<Pod>,
    client: &Client,
    ch: &mut Channel,
    guest: &Guest,
    g_uid: &str,
) -> Result<Row> {
    let name = format!("ramp-{id}");
    ch.send(&format!("begin {id}")).await?;
    ch.expect("begun", Duration::from_secs(60), guest).await?;
    let created = Instant::now();
    pods.create(
        &PostParams::default(),
        &ramp_pod(&name, &ramp.workload_args(ramp_to_mib)),
    )
    .await
    .with_context(|| format!("create {name}"))?;
    let api_end = wait_end(pods, &name, ramp.run_timeout(ramp_to_mib), guest).await?;
    let host_secs = created.elapsed().as_secs_f64();
    // A terminated pod stays in the API: delete it so the stand-in cleans up its cgroup.
    if pods.get_opt(&name).await?.is_some() {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = pods.delete(&name, &dp).await;
        wait_gone(pods, &name, Duration::from_secs(60)).await?;
    }
    let evicted = has_event(client, &name, "Evicted").await?;
    ch.send(&format!("end {id}")).await?;
    let res = ch.expect("result", Duration::from_secs(240), guest).await?;
    let guaranteed_ok = guaranteed_intact(pods, g_uid).await?;

    // The guest writes `-` for "none"; empty here.
    let text = |k: &str| {
        res.get(k)
            .filter(|v| v.as_str() != "-")
            .cloned()
            .unwrap_or_default()
    };
    let victims = text("kernel_victims");
    let ramp_pid = text("ramp_pid");
    let ramp_killed_by_kernel = !ramp_pid.is_empty()
        && victims
            .split(',')
            .any(|v| v.split('/').next() == Some(ramp_pid.as_str()));
    let num = |k: &str| res.get(k).and_then(|v| v.parse::<f64>().ok());
    let first = [
        ("evicted", num("t_evict")),
        ("earlyoom", num("t_earlyoom")),
        ("kernel", num("t_kernel")),
    ]
    .into_iter()
    .filter_map(|(who, t)| t.map(|t| (who, t)))
    .min_by(|a, b| a.1.total_cmp(&b.1))
    .map_or("-".to_owned(), |(who, _)| who.to_owned());
    let ramp_bytes = num("ramp_bytes");
    let ramp_ms = num("ramp_ms");
    Ok(Row {
        contender: c.label(),
        ramp: ramp.label(),
        run,
        id,
        oom_kills: res.get("oom_kills").and_then(|v| v.parse().ok()),
        kernel_victims: victims,
        ramp_killed_by_kernel,
        evicted,
        earlyoom: text("earlyoom"),
        first,
        wake_source: text("wake_source"),
        rate_half: match (num("half_bytes"), num("half_ms")) {
            (Some(b), Some(ms)) if ms > 0.0 => Some(b / MIB as f64 / (ms / 1e3)),
            _ => None,
        },
        rate_all: match (ramp_bytes, ramp_ms) {
            (Some(b), Some(ms)) if ms > 0.0 => Some(b / MIB as f64 / (ms / 1e3)),
            _ => None,
        },
        peak_mib: ramp_bytes.map(|b| b / MIB as f64),
        ramp_end: text("ramp_end"),
        host_secs,
        api_end,
        guaranteed_ok,
        settle_secs: num("settle_s"),
    })
}

fn field<T: std::str::FromStr>(m: &BTreeMap<String, String>, k: &str) -> Result<T> {
    let v = m
        .get(k)
        .with_context(|| format!("the guest did not report {k}: {m:?}"))?;
    v.parse()
        .map_err(|_| anyhow::anyhow!("the guest reported {k}={v:?}, not a number"))
}

fn workload_pod(name: &str, args: &[String]) -> PodBuilder {
    PodBuilder::new(name)
        .namespace(NS)
        .node(NODE)
        .termination_grace(5)
        .image("nm-workload")
        .command(std::iter::once("/mnt/host/nm-workload").chain(args.iter().map(String::as_str)))
}

/// Guaranteed: request = limit for memory and CPU, so oom_score_adj −997.
fn guaranteed_pod(hold_mib: u64) -> Pod {
    let limit = format!("{}Mi", hold_mib + GUARANTEED_HEADROOM_MIB);
    workload_pod("guaranteed", &["--hold".into(), format!("{hold_mib}Mi")])
        .memory(&limit, Some(&limit))
        .build()
}

/// BestEffort (oom_score_adj 1000), never restarted: one ramp per pod.
fn ramp_pod(name: &str, args: &[String]) -> Pod {
    workload_pod(name, args).restart_policy("Never").build()
}

async fn wait_running(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
    guest: &Guest,
) -> Result<Pod> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = pods.get_opt(name).await?
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        {
            return Ok(p);
        }
        if !guest.running() {
            bail!("the guest ended before {name} ran");
        }
        if Instant::now() > deadline {
            bail!("{name} not Running within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the ramp pod is gone (evicted) or terminated (killed), and says how it ended.
async fn wait_end(pods: &Api<Pod>, name: &str, timeout: Duration, guest: &Guest) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut deleting = false;
    loop {
        match pods.get_opt(name).await {
            Ok(None) => {
                return Ok(if deleting { "deleted" } else { "gone" }.to_owned());
            }
            Ok(Some(p)) => {
                deleting |= p.metadata.deletion_timestamp.is_some();
                let status = p.status.as_ref();
                let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
                if phase == "Failed" || phase == "Succeeded" {
                    let term = status
                        .and_then(|s| s.container_statuses.as_ref())
                        .and_then(|c| c.first())
                        .and_then(|c| c.state.as_ref())
                        .and_then(|s| s.terminated.as_ref());
                    return Ok(match term {
                        Some(t) => format!(
                            "{phase}/{}/{}",
                            t.reason.as_deref().unwrap_or("-"),
                            t.exit_code
                        ),
                        None => phase.to_owned(),
                    });
                }
            }
            // The API server answers from the host; an error here is the host's, retry.
            Err(e) => eprintln!("bench-spike: get {name}: {e}"),
        }
        if !guest.running() {
            bail!("the guest ended during {name}");
        }
        if Instant::now() > deadline {
            return Ok("timeout".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_gone(pods: &Api<Pod>, name: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while pods.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            bail!("{name} still in the API {timeout:?} after its deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn has_event(client: &Client, name: &str, reason: &str) -> Result<bool> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Ok(events
        .list(&lp)
        .await?
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some(reason)))
}

/// The Guaranteed pod is the same pod, Running, never restarted and not being deleted.
async fn guaranteed_intact(pods: &Api<Pod>, uid: &str) -> Result<bool> {
    let Some(p) = pods.get_opt("guaranteed").await? else {
        return Ok(false);
    };
    let status = p.status.as_ref();
    let restarts: i32 = status
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
    Ok(p.metadata.uid.as_deref() == Some(uid)
        && p.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && restarts == 0)
}

/// The markdown tables: OOM kills per contender and ramp, who acted first, the rates achieved
/// and how far the ramps got.
fn summary(args: &Args, results: &[(Contender, BootResult)]) -> String {
    let ramps: Vec<String> = args
        .rates
        .iter()
        .map(|&r| Ramp { nominal: r }.label())
        .collect();
    let header = |extra: &[&str]| {
        let mut s = String::from("| contender \\ ramp MiB/s |");
        for r in ramps
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
        {
            let _ = write!(s, " {r} |");
        }
        s.push_str("\n|---|");
        for _ in 0..ramps.len() + extra.len() {
            s.push_str("---|");
        }
        s.push('\n');
        s
    };
    let rows_of = |res: &BootResult, ramp: &str| -> Vec<Row> {
        res.rows
            .iter()
            .filter(|r| r.ramp == ramp)
            .cloned()
            .collect()
    };
    // Median (min–max) of a per-run figure, per contender and ramp.
    let spread = |title: &str, f: &dyn Fn(&Row) -> Option<f64>| {
        let mut s = format!("\n{title} (median over the runs; min–max):\n\n");
        s.push_str(&header(&[]));
        for (c, res) in results {
            let _ = write!(s, "| {} |", c.label());
            for r in &ramps {
                let mut v: Vec<f64> = rows_of(res, r).iter().filter_map(f).collect();
                v.sort_by(f64::total_cmp);
                match (v.first(), v.get(v.len() / 2), v.last()) {
                    (Some(lo), Some(mid), Some(hi)) => {
                        let _ = write!(s, " {mid:.0} ({lo:.0}–{hi:.0}) |");
                    }
                    _ => s.push_str(" - |"),
                }
            }
            s.push('\n');
        }
        s
    };
    let mut s = String::new();
    s.push_str(
        "\nKernel OOM kills / runs (runs whose ramp the kernel itself killed in brackets):\n\n",
    );
    s.push_str(&header(&[]));
    for (c, res) in results {
        let _ = write!(s, "| {} |", c.label());
        for r in &ramps {
            let rows = rows_of(res, r);
            let kills: u64 = rows.iter().filter_map(|x| x.oom_kills).sum();
            let by_kernel = rows.iter().filter(|x| x.ramp_killed_by_kernel).count();
            let _ = write!(s, " {kills} / {} ({by_kernel}) |", rows.len());
        }
        s.push('\n');
    }
    s.push_str(
        "\nWho acted first in each run (E the agent's eviction, O earlyoom, K the kernel OOM \
         killer, - nobody), the Guaranteed pod, and what woke the agent for its evictions:\n\n",
    );
    s.push_str(&header(&["Guaranteed intact", "eviction wake-ups"]));
    for (c, res) in results {
        let _ = write!(s, "| {} |", c.label());
        for r in &ramps {
            let seq: String = rows_of(res, r)
                .iter()
                .map(|x| match x.first.as_str() {
                    "evicted" => 'E',
                    "earlyoom" => 'O',
                    "kernel" => 'K',
                    _ => '-',
                })
                .collect();
            let _ = write!(s, " {seq} |");
        }
        let intact = res.rows.iter().all(|x| x.guaranteed_ok);
        let mut wakes: BTreeMap<&str, usize> = BTreeMap::new();
        for x in res.rows.iter().filter(|x| !x.wake_source.is_empty()) {
            *wakes.entry(x.wake_source.as_str()).or_default() += 1;
        }
        let wakes: Vec<String> = wakes.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        let _ = writeln!(
            s,
            " {} | {} |",
            if intact { "yes" } else { "NO" },
            if wakes.is_empty() {
                "-".to_owned()
            } else {
                wakes.join(", ")
            }
        );
    }
    s.push_str(&spread(
        "Achieved ramp rate, MiB/s over the first half of the baseline MemAvailable",
        &|x| x.rate_half,
    ));
    s.push_str(&spread(
        "MiB the ramp had allocated when it was stopped",
        &|x| x.peak_mib,
    ));
    s.push_str("\nBaselines (guest, Guaranteed pod running, before the runs):\n\n");
    for (c, res) in results {
        let b = &res.baseline;
        let get = |k: &str| b.get(k).map_or("?", String::as_str);
        let _ = writeln!(
            s,
            "- {}: MemTotal {} kB, MemAvailable {} kB, kubelet memory.available {} kB, \
             MemFree {} kB, min_free_kbytes {}{}",
            c.label(),
            get("memtotal_kb"),
            get("memavailable_kb"),
            get("kubelet_available_kb"),
            get("memfree_kb"),
            get("min_free_kbytes"),
            res.error
                .as_ref()
                .map_or(String::new(), |e| format!("; INCOMPLETE: {e}"))
        );
    }
    s
}

/// The guest side. Prepended by the host: [`ENTRY_PRELUDE`], then CONTENDER, REPORT_PORT,
/// AGENT_FLAGS.
const GUEST_SCRIPT: &str = r#"log "entry started; contender $CONTENDER; uptime $(uptime_s)"
for _ in $(seq 750); do [ -e /mnt/host/kubeconfig ] && break; sleep 0.2; done
[ -e /mnt/host/kubeconfig ] || { log "no kubeconfig from the host"; sync; systemctl poweroff -ff; }

meminfo_kb() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }
oom_kills() { awk '$1 == "oom_kill" { print $2 }' /proc/vmstat; }
# memory.available as the kubelet computes it for a cgroup v2 node: MemTotal minus the root's
# working set (anon + file - inactive_file from the root's memory.stat, floored at 0).
kubelet_available_kb() {
  awk -v total="$(meminfo_kb MemTotal)" '
    $1 == "anon" { a = $2 } $1 == "file" { f = $2 } $1 == "inactive_file" { i = $2 }
    END { ws = a + f - i; if (ws < 0) ws = 0; printf "%d\n", total - ws / 1024 }' /sys/fs/cgroup/memory.stat
}
now() { date +%s.%N; }
ready() {
  ( exec 4<>/dev/tcp/127.0.0.1/9101 && printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4 \
      && read -r _ status _ <&4 && [ "$status" = 200 ] ) 2>/dev/null
}

# Logs on tmpfs: a write to the 9p share can stall under memory pressure, and the agent logs its
# eviction before it sends it.
mkdir -p /run/nm /var/lib/kubelet /var/lib/nm-standin /sys/fs/cgroup/node-monitor-test/agent
MEMTOTAL=$(( $(meminfo_kb MemTotal) * 1024 ))
# The node is the machine: the node cgroup's limit is MemTotal (it never binds).
/mnt/host/nm-kubelet-standin --kubeconfig /mnt/host/kubeconfig --node-name vm-node \
  --cgroup-root /node-monitor-test/vm-node --memory "$MEMTOTAL" --state-dir /var/lib/nm-standin \
  > /run/nm/standin.log 2>&1 &
STANDIN=$!
# The stand-in plays the kubelet, which runs at oom_score_adj -999 (pkg/kubelet/qos/policy.go).
echo -999 > /proc/$STANDIN/oom_score_adj
case "$CONTENDER" in
  node-monitor|polling)
    (
      echo $BASHPID > /sys/fs/cgroup/node-monitor-test/agent/cgroup.procs
      export RUST_LOG=info NO_COLOR=1
      exec /mnt/host/node-monitor run --config /mnt/host/config.yaml --node-name vm-node \
        --node-cgroup node-monitor-test/vm-node --kubeconfig /mnt/host/kubeconfig \
        --metrics-addr 127.0.0.1:9101 $AGENT_FLAGS > /run/nm/agent.log 2>&1
    ) &
    for _ in $(seq 600); do ready && break; sleep 0.5; done
    ready || log "agent not ready after 300 s"
    ;;
  earlyoom)
    systemctl start earlyoom.service
    until systemctl is-active -q earlyoom.service; do sleep 0.2; done
    systemctl show -p ExecStart earlyoom.service
    cat /etc/default/earlyoom
    ;;
esac
until grep -q NM_READY=1 /run/nm/standin.log; do sleep 0.5; done
log "contender up; uptime $(uptime_s)"

exec 9<>/dev/tcp/10.0.2.2/$REPORT_PORT || { log "no report channel"; sync; systemctl poweroff -ff; }
say() { echo "$*" >&9; log "said: $*"; }
say "hello contender=$CONTENDER memtotal_kb=$(meminfo_kb MemTotal) uptime=$(uptime_s)"

BASE_AVAIL=0
baseline() {
  sleep 5
  local best=0 v
  for _ in 1 2 3 4 5; do
    v=$(meminfo_kb MemAvailable); [ "$v" -gt "$best" ] && best=$v; sleep 1
  done
  BASE_AVAIL=$best
  say "baseline memtotal_kb=$(meminfo_kb MemTotal) memavailable_kb=$BASE_AVAIL memfree_kb=$(meminfo_kb MemFree) kubelet_available_kb=$(kubelet_available_kb) min_free_kbytes=$(cat /proc/sys/vm/min_free_kbytes)"
}

begin() {
  ID=$1
  OOM0=$(oom_kills)
  T0_UP=$(uptime_s)
  T0=$(now)
  # The kernel log is stamped with time since boot; this maps it onto the wall clock.
  OFFSET=$(awk -v n="$T0" -v u="$T0_UP" 'BEGIN { printf "%.6f", n - u }')
  say "begun $ID oom_kill=$OOM0 memavailable_kb=$(meminfo_kb MemAvailable)"
}

finish() {
  local id=$1 dir logf pid settle_start settled
  dir=$(ls -d /var/lib/nm-standin/pods/default_ramp-${id}_* 2>/dev/null | head -n1)
  logf=$(ls "$dir"/main/*.log 2>/dev/null | head -n1)
  pid=$(sed -n 's/^nm-workload: start pid=\([0-9]*\).*/\1/p' "$logf" 2>/dev/null | head -n1)
  settle_start=$(now)
  # Memory back: the ramp's process gone and MemAvailable within 64 MiB of the baseline.
  for _ in $(seq 600); do
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
      [ "$(meminfo_kb MemAvailable)" -ge $(( BASE_AVAIL - 65536 )) ] && break
    fi
    sleep 0.2
  done
  sleep 1
  settled=$(awk -v a="$settle_start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  local oom=$(( $(oom_kills) - OOM0 ))
  # "[  123.456789] Out of memory: Killed process 1234 (nm-workload) ... oom_score_adj:1000"
  local kills
  kills=$(dmesg | sed -n 's/^\[ *\([0-9.]*\)\].*Killed process \([0-9]*\) (\(.*\)).*oom_score_adj:\(-\{0,1\}[0-9]*\).*/\1 \2 \3 \4/p' \
    | awk -v t0="$T0_UP" -v off="$OFFSET" '$1 > t0 {
        v = v (v == "" ? "" : ",") $2 "/" $3 "/" $4; if (t == "") t = sprintf("%.6f", $1 + off) }
        END { print (v == "" ? "-" : v), (t == "" ? "-" : t) }')
  local victims=${kills% *} t_kernel=${kills#* }
  # earlyoom: "sending SIGTERM to process 1234 uid 0 "nm-workload": badness 1000, VmRSS 700 MiB"
  local eo="-" t_eo="-"
  if [ "$CONTENDER" = earlyoom ]; then
    local e
    e=$(journalctl -u earlyoom.service -o short-unix --no-pager --since "@${T0%.*}" 2>/dev/null \
      | awk -v t0="$T0" '$1 > t0 && /sending SIG/ {
          sig = ""; pid = ""; name = ""
          for (i = 1; i <= NF; i++) { if ($i ~ /^SIG/) sig = $i; if ($i == "process") pid = $(i + 1) }
          if (match($0, /"[^"]*"/)) name = substr($0, RSTART + 1, RLENGTH - 2)
          v = v (v == "" ? "" : ",") sig "/" name "/" pid; if (t == "") t = $1 }
          END { print (v == "" ? "-" : v), (t == "" ? "-" : t) }')
    eo=${e% *}; t_eo=${e#* }
  fi
  # The agent's eviction of this ramp pod: when it decided, and what woke it.
  local t_ev="-" wake="-" evictions=0
  if [ -f /run/nm/agent.log ]; then
    local line
    line=$(grep " evicting " /run/nm/agent.log | grep "pod=default/ramp-$id " | head -n1)
    evictions=$(grep " evicting " /run/nm/agent.log | grep -c "pod=default/ramp-$id ")
    if [ -n "$line" ]; then
      t_ev=$(date -d "$(echo "$line" | awk '{ print $1 }')" +%s.%N)
      wake=$(echo "$line" | sed -n 's/.*wake_source=\([^ ]*\).*/\1/p' | tr -d '"')
    fi
  fi
  # The ramp's own account: its last progress line, the point where it passed half of the
  # baseline MemAvailable (before any memory pressure: its free-running rate), and how it ended.
  local last half end=killed
  last=$(grep '^nm-workload: ramp bytes=' "$logf" 2>/dev/null | tail -n1)
  half=$(grep '^nm-workload: ramp bytes=' "$logf" 2>/dev/null \
    | awk -v h=$(( BASE_AVAIL * 512 )) '{ split($3, b, "="); if (b[2] + 0 >= h) { print; exit } }')
  if tail -n1 "$logf" 2>/dev/null | grep -q 'signalled; exiting'; then end=sigterm; fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then end=running; fi
  local rb rm hb hm
  rb=$(echo "$last" | sed -n 's/.*bytes=\([0-9]*\).*/\1/p'); rm=$(echo "$last" | sed -n 's/.*elapsed_ms=\([0-9]*\).*/\1/p')
  hb=$(echo "$half" | sed -n 's/.*bytes=\([0-9]*\).*/\1/p'); hm=$(echo "$half" | sed -n 's/.*elapsed_ms=\([0-9]*\).*/\1/p')
  say "result $id oom_kills=$oom kernel_victims=$victims t_kernel=$t_kernel earlyoom=$eo t_earlyoom=$t_eo evictions=$evictions t_evict=$t_ev wake_source=$wake ramp_pid=${pid:--} ramp_bytes=${rb:--} ramp_ms=${rm:--} half_bytes=${hb:--} half_ms=${hm:--} ramp_end=$end settle_s=$settled memavailable_kb=$(meminfo_kb MemAvailable)"
}

while read -r cmd arg <&9; do
  case "$cmd" in
    baseline) baseline ;;
    begin) begin "$arg" ;;
    end) finish "$arg" ;;
    quit) break ;;
    *) say "unknown command=$cmd" ;;
  esac
done
log "done; uptime $(uptime_s)"
cp /run/nm/agent.log /mnt/out/agent.log 2>/dev/null
cp /run/nm/standin.log /mnt/out/standin.log 2>/dev/null
dmesg > /mnt/out/dmesg.txt
cat /proc/meminfo > /mnt/out/meminfo-end.txt
[ "$CONTENDER" = earlyoom ] && journalctl -u earlyoom.service -o short-unix --no-pager > /mnt/out/earlyoom.log
sync
systemctl poweroff -ff
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_parse_and_bad_ones_are_named() {
        let ok = [
            (
                "node-monitor@10",
                Kind::NodeMonitor,
                Some(10),
                "node-monitor@10%",
            ),
            ("polling@25%", Kind::Polling, Some(25), "polling@25%"),
            ("earlyoom", Kind::Earlyoom, None, "earlyoom"),
            ("none", Kind::None, None, "none"),
        ];
        for (text, kind, t, label) in ok {
            let c = parse_contender(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((c.kind, c.threshold_percent), (kind, t), "{text}");
            assert_eq!(c.label(), label);
        }
        let bad = [
            ("kubelet", "kubelet"),
            ("node-monitor", "needs its threshold"),
            ("polling@ten", "\"ten\""),
            ("node-monitor@0", "0%"),
            ("node-monitor@51", "51%"),
            ("earlyoom@10", "takes no threshold"),
        ];
        for (text, needle) in bad {
            let e = parse_contender(text).expect_err(text);
            assert!(e.contains(needle) && e.contains(text), "{text}: {e}");
        }
    }

    #[test]
    fn ramps_pace_their_steps() {
        let cases = [
            // (nominal MiB/s, step, interval, label)
            (25, "1024Ki", "40ms", "25"),
            (100, "4096Ki", "40ms", "100"),
            (200, "8192Ki", "40ms", "200"),
            (0, MAX_RATE_STEP, "0ms", "max"),
        ];
        for (nominal, step, interval, label) in cases {
            let r = Ramp { nominal };
            let args = r.workload_args(1500);
            assert_eq!(
                args,
                [
                    "--ramp-to",
                    "1500Mi",
                    "--step",
                    step,
                    "--interval",
                    interval
                ],
                "{nominal}"
            );
            assert_eq!(r.label(), label);
        }
        // Slower ramps get longer to finish.
        assert!(Ramp { nominal: 25 }.run_timeout(1500) > Ramp { nominal: 200 }.run_timeout(1500));
    }

    #[test]
    fn summary_counts_kills_and_wake_ups() {
        let args = Args::parse_from(["bench-spike", "--rates", "25,0", "--runs", "2"]);
        let row = |ramp: &str, kills: u64, by_kernel: bool, first: &str, wake: &str| Row {
            contender: "node-monitor@25%".into(),
            ramp: ramp.into(),
            oom_kills: Some(kills),
            ramp_killed_by_kernel: by_kernel,
            first: first.into(),
            wake_source: wake.into(),
            guaranteed_ok: true,
            ..Row::default()
        };
        let c = parse_contender("node-monitor@25").expect("contender");
        let res = BootResult {
            rows: vec![
                row("25", 0, false, "evicted", "kernel_kswapd_wake"),
                row("max", 1, true, "evicted", "housekeeping"),
                row("25", 0, false, "evicted", "kernel_kswapd_wake"),
                row("max", 2, true, "kernel", ""),
            ],
            baseline: BTreeMap::new(),
            error: None,
        };
        let s = summary(&args, &[(c, res)]);
        assert!(
            s.contains("| node-monitor@25% | 0 / 2 (0) | 3 / 2 (2) |"),
            "{s}"
        );
        assert!(
            s.contains("| EE | EK | yes | housekeeping ×1, kernel_kswapd_wake ×2 |"),
            "{s}"
        );
    }
}
