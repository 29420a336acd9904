//! `node-monitor trace`: a live stream of kernel events attributed to pods, as text or JSON lines.
//!
//! Loads the kernel probes (degrading per program, see docs/kernel-probes.md), reads the event
//! ring buffer, resolves each event's cgroup to a path and a pod, and prints one line per event
//! until SIGINT, SIGTERM or `--duration`. On exit it prints the totals: what it received and what
//! the kernel counted as sent and dropped. docs/trace.md documents the output.
use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context as _, bail};
use serde_json::{Map, Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tracing::warn;

use crate::{
    attribution::{Attribution, Attributor, CgroupPaths, KubePods, NoApi, PodDirectory},
    ebpf::{EventKind, KernelEvent, ProbeConfig, Probes, StreamError},
};

mod flight;

/// Arguments of `node-monitor trace`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One JSON object per line on stdout (logs and totals go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Also show the eBPF programs' own log messages (aya-log), as logs on stderr.
    #[arg(long)]
    pub kernel_log: bool,
    /// Only these kinds (comma-separated): oom_kill, reclaim_stall, kswapd_wake, reboot.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    pub kind: Vec<EventKind>,
    /// Stop after this many seconds (default: until SIGINT or SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Reclaim-stall budget per cgroup and window, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub stall_budget_ms: u64,
    /// Reclaim-stall accounting window, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub stall_window_ms: u64,
    /// Minimum interval between kswapd wake-up events per NUMA node, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub kswapd_interval_ms: u64,
    /// The cgroup2 hierarchy to resolve cgroup ids in (default: from /proc/self/mountinfo).
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,
    /// Resolve pod namespace/name through the API with this kubeconfig.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Use the in-cluster service account to resolve pod namespace/name.
    #[arg(long)]
    pub in_cluster: bool,
    /// Node name for the API lookup (default: $NODE_NAME; unset lists pods of every node).
    #[arg(long, env = "NODE_NAME", value_parser = node_monitor_core::kubelet::node_name::parse_node_name)]
    pub node_name: Option<String>,
    /// Also print an OOM flight record of each OOM kill, 5 s after it: PSI (and with
    /// --flight-cgroup that cgroup's memory.available) sampled every second, the reclaim stalls
    /// and kswapd wake-ups of the 30 s before the kill. Every kind is recorded, whatever --kind.
    #[arg(long)]
    pub flight: bool,
    /// The memory cgroup (a cgroup2 directory, or a v1 memory hierarchy's) whose memory.available
    /// the flight records sample, as the kubelet computes it for the node cgroup.
    #[arg(long, value_name = "DIR", requires = "flight")]
    pub flight_cgroup: Option<PathBuf>,
    /// Write each flight record's SVG timeline into this directory (flight-<id>.svg).
    #[arg(long, value_name = "DIR", requires = "flight")]
    pub flight_svg: Option<PathBuf>,
}

const KINDS: [EventKind; 4] = [
    EventKind::OomKill,
    EventKind::ReclaimStall,
    EventKind::KswapdWake,
    EventKind::Reboot,
];

fn parse_kind(s: &str) -> Result<EventKind, String> {
    KINDS
        .into_iter()
        .find(|k| k.as_str() == s.trim())
        .ok_or_else(|| {
            format!("unknown kind {s:?} (expected oom_kill, reclaim_stall, kswapd_wake or reboot)")
        })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("duration {s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!(
            "duration {s:?} must be a positive number of seconds"
        ));
    }
    if secs > MAX_DURATION_SECS {
        return Err(format!(
            "duration {s:?} is too long: at most {MAX_DURATION_SECS} seconds (7 days)"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("duration {s:?} is too long"))
}

/// The longest `--duration` (7 days): beyond it, run without one and stop it with a signal.
const MAX_DURATION_SECS: f64 = 7.0 * 24.0 * 3600.0;

impl Args {
    /// The probe configuration these arguments ask for. Families whose events are filtered out
    /// are not loaded, except reclaim, which OOM classification needs.
    pub fn probe_config(&self) -> ProbeConfig {
        let mut config = ProbeConfig {
            stall_budget: Duration::from_millis(self.stall_budget_ms),
            stall_window: Duration::from_millis(self.stall_window_ms),
            kswapd_min_interval: Duration::from_millis(self.kswapd_interval_ms),
            kernel_log: self.kernel_log,
            ..ProbeConfig::default()
        };
        // The memory push only wakes the agent: nothing to show, and a cost on every page.
        config.disable.insert("mem_push".to_owned());
        // A flight record keeps every kind of event.
        if !self.kind.is_empty() && !self.flight {
            for (kind, family) in [
                (EventKind::OomKill, "oom"),
                (EventKind::KswapdWake, "kswapd"),
                (EventKind::Reboot, "reboot"),
            ] {
                if !self.kind.contains(&kind) {
                    config.disable.insert(family.to_owned());
                }
            }
        }
        config
    }

    fn wants(&self, kind: EventKind) -> bool {
        if self.kind.is_empty() {
            KINDS.contains(&kind)
        } else {
            self.kind.contains(&kind)
        }
    }
}

/// Runs `node-monitor trace`.
pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let config = args.probe_config();
    config.validate()?;
    let mut probes = Probes::load(&config);
    let states = probes.program_states();
    if probes.attached() == 0 {
        let summary: Vec<String> = states
            .iter()
            .map(|s| match &s.state {
                crate::ebpf::ProgramState::Failed { reason } => format!("{}: {reason}", s.name),
                other => format!("{}: {}", s.name, other.label()),
            })
            .collect();
        bail!("no kernel probe could be attached ({})", summary.join("; "));
    }
    let mut stream = probes.events().context("opening the kernel event stream")?;
    let log_task = probes
        .forward_kernel_log()
        .context("forwarding kernel logs")?;

    let mut paths = match &args.cgroup_root {
        Some(root) => CgroupPaths::new(root),
        None => CgroupPaths::detect().context("finding the cgroup2 hierarchy")?,
    };
    if let Err(e) = paths.watch() {
        warn!(error = %e, "not watching cgroup creation: short-lived containers may go unattributed");
    }
    let mut attributor = Attributor::new(paths, directory(args).await);

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);

    let mut flight = flight::TraceFlight::for_args(args)?;
    eprintln!(
        "node-monitor trace: {} kernel programs attached, listening",
        probes.attached()
    );
    let mut out = std::io::stdout().lock();
    let mut totals = Totals::default();
    let mut flight_tick = tokio::time::interval(flight::SAMPLE_INTERVAL);
    loop {
        let event = tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            () = sleep_until(deadline) => break,
            _ = flight_tick.tick(), if flight.is_some() => {
                match flight::tick(flight.as_mut(), args.json, &mut out) {
                    Err(e) if crate::io::is_broken_pipe(&e) => return Ok(ExitCode::SUCCESS),
                    r => r?,
                }
                continue;
            }
            r = stream.next() => r,
        };
        match event {
            Ok(ev) => match emit(
                args,
                &mut attributor,
                &mut out,
                &mut totals,
                &ev,
                flight.as_mut(),
            )
            .await
            {
                // The reader went away (`trace | head`): stop as on SIGINT, quietly.
                Err(e) if crate::io::is_broken_pipe(&e) => return Ok(ExitCode::SUCCESS),
                r => r?,
            },
            Err(StreamError::Decode(_)) => {}
            Err(e @ StreamError::Io(_)) => return Err(e).context("reading kernel events"),
        }
    }
    // What arrived before the stop is still reported.
    for ev in stream.try_drain().into_iter().flatten() {
        emit(
            args,
            &mut attributor,
            &mut out,
            &mut totals,
            &ev,
            flight.as_mut(),
        )
        .await?;
    }
    if let Some(f) = flight.as_mut() {
        f.flush(None, args.json, &mut out)?;
    }
    drop(out);
    if let Some(task) = log_task {
        task.abort();
    }

    print_totals(args, &probes, &stream, &totals)?;
    Ok(ExitCode::SUCCESS)
}

/// The totals at exit: what the trace received and printed, what the kernel counted as sent
/// and dropped; a JSON object on stderr with `--json`, text otherwise.
fn print_totals(
    args: &Args,
    probes: &Probes,
    stream: &crate::ebpf::EventStream,
    totals: &Totals,
) -> anyhow::Result<()> {
    let counters = match probes.counters() {
        Ok(c) => Some(c),
        Err(e) => {
            warn!(error = %e, "reading the kernel counters failed");
            None
        }
    };
    let mut summary = json!({
        "received": stream.received(),
        "printed": totals.printed,
        "filtered": totals.filtered,
        "malformed": stream.decode_errors(),
        "printed_by_kind": totals.by_kind,
    });
    if let Some(c) = &counters {
        let per_kind = |m: &BTreeMap<EventKind, u64>| -> Value {
            KINDS
                .iter()
                .map(|k| (k.as_str().to_owned(), json!(m.get(k).copied().unwrap_or(0))))
                .collect::<Map<String, Value>>()
                .into()
        };
        summary["kernel_events"] = per_kind(&c.events);
        summary["kernel_drops"] = per_kind(&c.drops);
        summary["drops"] = json!(c.total_drops());
    }
    if args.json {
        eprintln!("{}", json!({ "totals": summary }));
    } else {
        crate::io::print_line(&totals_text(&summary))?;
    }
    Ok(())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn directory(args: &Args) -> Box<dyn PodDirectory> {
    if args.kubeconfig.is_none() && !args.in_cluster {
        return Box::new(NoApi);
    }
    match KubePods::connect(args.kubeconfig.as_deref(), args.node_name.clone()).await {
        Ok(k) => Box::new(k),
        Err(e) => {
            warn!(
                error = format!("{:#}", anyhow::Error::new(e)),
                "pod names unavailable: API not reachable"
            );
            Box::new(NoApi)
        }
    }
}

#[derive(Debug, Default)]
struct Totals {
    printed: u64,
    filtered: u64,
    by_kind: BTreeMap<&'static str, u64>,
}

async fn emit(
    args: &Args,
    attributor: &mut Attributor,
    out: &mut impl std::io::Write,
    totals: &mut Totals,
    ev: &KernelEvent,
    flight: Option<&mut flight::TraceFlight>,
) -> anyhow::Result<()> {
    let wanted = args.wants(ev.event_kind());
    if !wanted && flight.is_none() {
        totals.filtered += 1;
        return Ok(());
    }
    let at = attributor.attribute(ev.cgroup_id()).await;
    if let Some(f) = flight {
        f.event(ev, &at, crate::live::unix_ms());
    }
    if !wanted {
        totals.filtered += 1;
        return Ok(());
    }
    let trigger = match ev {
        KernelEvent::OomKill(e) if e.trigger.cgroup_id != at.cgroup_id => {
            Some(attributor.attribute(e.trigger.cgroup_id).await)
        }
        _ => None,
    };
    let line = if args.json {
        event_json(ev, &at, trigger.as_ref()).to_string()
    } else {
        event_text(ev, &at)
    };
    writeln!(out, "{}", crate::io::terminal_safe(&line)).context("writing to stdout")?;
    out.flush().context("writing to stdout")?;
    totals.printed += 1;
    *totals.by_kind.entry(ev.kind()).or_default() += 1;
    Ok(())
}

/// The subject task of an event: the victim for an OOM kill, `current` otherwise.
fn subject(ev: &KernelEvent) -> (u32, Option<&str>) {
    match ev {
        KernelEvent::OomKill(e) => (e.victim_pid, e.victim_comm.as_deref()),
        KernelEvent::ReclaimStall(e) => (e.task.pid, Some(&e.task.comm)),
        KernelEvent::KswapdWake(e) => (e.task.pid, Some(&e.task.comm)),
        KernelEvent::Reboot(e) => (e.task.pid, Some(&e.task.comm)),
        KernelEvent::Synthetic(e) => (e.task.pid, Some(&e.task.comm)),
    }
}

/// One JSON line. Pure.
pub fn event_json(ev: &KernelEvent, at: &Attribution, trigger: Option<&Attribution>) -> Value {
    let (pid, comm) = subject(ev);
    let pod = at.pod.as_ref();
    let mut m = json!({
        "kind": ev.kind(),
        "ts_ns": ev.ts_ns(),
        "pid": pid,
        "comm": comm,
        "cgroup_id": at.cgroup_id,
        "cgroup_path": at.cgroup_path,
        "pod_uid": pod.map(|p| &p.pod_uid),
        "container_id": pod.and_then(|p| p.container_id.as_ref()),
        "qos_class": pod.map(|p| p.qos.as_str()),
        "pod_namespace": at.pod_ref.as_ref().map(|r| &r.namespace),
        "pod_name": at.pod_ref.as_ref().map(|r| &r.name),
    });
    let extra = match ev {
        KernelEvent::OomKill(e) => {
            let mem = e.memory.as_ref();
            json!({
                "global": e.global(),
                "scope": e.scope.as_str(),
                "trigger_reclaim": e.trigger_reclaim.map(|f| f.as_str()),
                "tid": e.victim_tid,
                "rss_bytes": mem.map(|m| m.rss_bytes()),
                "anon_rss_bytes": mem.map(|m| m.anon_rss_bytes),
                "file_rss_bytes": mem.map(|m| m.file_rss_bytes),
                "shmem_rss_bytes": mem.map(|m| m.shmem_rss_bytes),
                "total_vm_bytes": mem.map(|m| m.total_vm_bytes),
                "pgtables_bytes": mem.map(|m| m.pgtables_bytes),
                "oom_score_adj": e.oom_score_adj,
                "uid": e.uid,
                "cgroup_source": if e.victim_cgroup_id.is_some() { "victim" } else { "trigger" },
                "trigger_pid": e.trigger.pid,
                "trigger_comm": e.trigger.comm,
                "trigger_cgroup_id": e.trigger.cgroup_id,
                "trigger_cgroup_path": if e.trigger.cgroup_id == at.cgroup_id {
                    at.cgroup_path.clone()
                } else {
                    trigger.and_then(|t| t.cgroup_path.clone())
                },
            })
        }
        KernelEvent::ReclaimStall(e) => json!({
            "tid": e.task.tid,
            "flavor": e.flavor.as_str(),
            "stall_ns": e.stall_ns,
            "count": e.count,
            "window_ns": e.window_ns,
            "window_start_ns": e.window_start_ns,
        }),
        KernelEvent::KswapdWake(e) => json!({
            "tid": e.task.tid,
            "nid": e.nid,
            "zid": e.zid,
            "order": e.order,
            "gfp_flags": format!("{:#x}", e.gfp_flags),
            "suppressed": e.suppressed,
        }),
        KernelEvent::Reboot(e) => json!({
            "tid": e.task.tid,
            "cmd": e.cmd.as_str(),
            "cmd_raw": format!("{:#010x}", e.cmd_raw),
            "goes_down": e.cmd.goes_down(),
            "magic1": format!("{:#010x}", e.magic1),
            "magic2": format!("{:#010x}", e.magic2),
            "verdict": e.verdict.as_str(),
            "caller": serde_json::to_value(e).ok().map(|v| v["caller"].clone()),
            "suppressed": e.suppressed,
        }),
        KernelEvent::Synthetic(e) => json!({ "tid": e.task.tid, "seq": e.seq }),
    };
    if let (Value::Object(m), Value::Object(extra)) = (&mut m, extra) {
        m.extend(extra);
    }
    m
}

/// One text line. Pure.
pub fn event_text(ev: &KernelEvent, at: &Attribution) -> String {
    let (pid, comm) = subject(ev);
    let ts = ev.ts_ns();
    let mut s = format!(
        "{}.{:06} {:<13} pid={pid} comm={}",
        ts / 1_000_000_000,
        (ts % 1_000_000_000) / 1000,
        ev.kind(),
        comm.unwrap_or("?")
    );
    match (&at.pod, &at.cgroup_path) {
        (Some(p), _) => {
            s.push_str(&format!(" pod={} qos={}", p.pod_uid, p.qos));
            if let Some(r) = &at.pod_ref {
                s.push_str(&format!(" ({}/{})", r.namespace, r.name));
            }
            if let Some(c) = &p.container_id {
                let short: String = c.chars().take(12).collect();
                s.push_str(&format!(" container={short}"));
            }
        }
        (None, Some(path)) => s.push_str(&format!(" cgroup={path}")),
        (None, None) => s.push_str(&format!(" cgroup_id={}", at.cgroup_id)),
    }
    match ev {
        KernelEvent::OomKill(e) => {
            let scope = match e.global() {
                Some(true) => "global",
                Some(false) => "memcg",
                None => "unknown",
            };
            s.push_str(&format!(" oom={scope}"));
            if let Some(m) = e.memory {
                s.push_str(&format!(" rss={}KiB", m.rss_bytes() / 1024));
            }
            if let Some(adj) = e.oom_score_adj {
                s.push_str(&format!(" oom_score_adj={adj}"));
            }
            if e.trigger.pid != e.victim_pid {
                s.push_str(&format!(" trigger={}/{}", e.trigger.pid, e.trigger.comm));
            }
        }
        KernelEvent::ReclaimStall(e) => s.push_str(&format!(
            " {} reclaim {:.1}ms in {} episodes within {}ms",
            e.flavor.as_str(),
            e.stall_ns as f64 / 1e6,
            e.count,
            e.window_ns / 1_000_000
        )),
        KernelEvent::KswapdWake(e) => s.push_str(&format!(
            " node={} zone={} order={} gfp={:#x} suppressed={}",
            e.nid, e.zid, e.order, e.gfp_flags, e.suppressed
        )),
        KernelEvent::Reboot(e) => s.push_str(&format!(
            " cmd={} ({:#010x}) verdict={} suppressed={}",
            e.cmd.as_str(),
            e.cmd_raw,
            e.verdict.as_str(),
            e.suppressed
        )),
        KernelEvent::Synthetic(e) => s.push_str(&format!(" seq={}", e.seq)),
    }
    s
}

fn totals_text(summary: &Value) -> String {
    let mut s = format!(
        "totals: received {} (printed {}, filtered {}, malformed {})",
        summary["received"], summary["printed"], summary["filtered"], summary["malformed"]
    );
    if let (Some(sent), Some(dropped)) = (
        summary["kernel_events"].as_object(),
        summary["kernel_drops"].as_object(),
    ) {
        let fmt = |m: &Map<String, Value>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        s.push_str(&format!(
            "; kernel sent: {}; dropped: {} (total {})",
            fmt(sent),
            fmt(dropped),
            summary["drops"]
        ));
    }
    s
}

#[cfg(test)]
mod tests;

/// Property tests of decoding and formatting random kernel records (docs/testing.md):
/// `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
