//! `node-monitor trace --flight`: an OOM flight record of each kill the trace sees. Without the
//! agent's loop, the trace samples what it can every second (PSI; with `--flight-cgroup`, that
//! memory cgroup's `memory.available` as the kubelet computes it), keeps the
//! kernel events (reclaim stalls, kswapd wake-ups, OOM kills) in the same recorder as the agent
//! ([`node_monitor_core::flight`]) and prints each record once its tail has passed (or at exit).
use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::{
    attribution::Attribution,
    ebpf::KernelEvent,
    flight::{FlightRecord, FlightRecorder, Sample, SignalPoint},
    sampler::{
        cgroup_capacity, memory_observation,
        parse::{parse_meminfo_total, parse_memory_limit, parse_memory_stat, parse_single_u64},
        working_set,
    },
};

/// How often the trace samples for its flight records.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// The trace's recorder and where its records go.
pub struct TraceFlight {
    recorder: FlightRecorder,
    /// The cgroup whose `memory.available` is sampled.
    cgroup: Option<PathBuf>,
    /// The PSI file: the cgroup's `memory.pressure`, else `/proc/pressure/memory`.
    psi: PathBuf,
    svg_dir: Option<PathBuf>,
    /// Records numbered below this are printed.
    printed: u64,
    /// Why the last sample had no memory signal (reported once).
    warned: bool,
}

/// One sample now, then the records whose tail has passed.
pub fn tick(
    flight: Option<&mut TraceFlight>,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let Some(f) = flight else {
        return Ok(());
    };
    let now = crate::live::unix_ms();
    f.sample(now);
    f.flush(Some(now), json, out)
}

impl TraceFlight {
    /// The recorder `--flight` asks for, if it does.
    pub fn for_args(args: &super::Args) -> anyhow::Result<Option<Self>> {
        args.flight
            .then(|| Self::new(args.flight_cgroup.clone(), args.flight_svg.clone()))
            .transpose()
    }

    pub fn new(cgroup: Option<PathBuf>, svg_dir: Option<PathBuf>) -> anyhow::Result<Self> {
        if let Some(dir) = &svg_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--flight-svg: creating {}", dir.display()))?;
        }
        if let Some(cg) = &cgroup
            && !cg.join("memory.current").is_file()
            && !cg.join("memory.usage_in_bytes").is_file()
        {
            anyhow::bail!(
                "--flight-cgroup {}: not a memory cgroup (neither memory.current nor \
                 memory.usage_in_bytes)",
                cg.display()
            );
        }
        let psi = cgroup
            .as_ref()
            .map(|c| c.join("memory.pressure"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("/proc/pressure/memory"));
        Ok(Self {
            recorder: FlightRecorder::new(),
            cgroup,
            psi,
            svg_dir,
            printed: 0,
            warned: false,
        })
    }

    /// One sample, now.
    pub fn sample(&mut self, at_ms: u64) {
        let signals = match self.cgroup.as_deref().map(memory_available) {
            Some(Ok(p)) => vec![p],
            Some(Err(e)) => {
                if !self.warned {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "flight record: memory.available not sampled"
                    );
                    self.warned = true;
                }
                Vec::new()
            }
            None => Vec::new(),
        };
        self.recorder.sample(Sample {
            at_ms,
            signals,
            top_pods: Vec::new(),
            pod_figures_age_ms: None,
            psi: crate::flight::read_psi(&self.psi),
            thresholds_met: Vec::new(),
            evict: Vec::new(),
            prediction: None,
        });
    }

    /// A kernel event, as attributed for the trace.
    pub fn event(&mut self, ev: &KernelEvent, at: &Attribution, at_ms: u64) {
        if let Some(e) = crate::flight::kernel_event(ev, Some(at), at_ms) {
            self.recorder.event(e);
        }
    }

    /// Prints the records whose tail has passed by `now_ms` (all of them when `now_ms` is
    /// `None`, at exit): a JSON line (`"kind": "flight_record"`) or the text summary, and the
    /// SVG file when asked.
    pub fn flush(
        &mut self,
        now_ms: Option<u64>,
        json: bool,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let due: Vec<FlightRecord> = self
            .recorder
            .records()
            .filter(|r| r.id >= self.printed && now_ms.is_none_or(|now| r.until_ms < now))
            .cloned()
            .collect();
        for r in due {
            let line = if json {
                record_line(&r).to_string()
            } else {
                crate::flight::record_text(&r, "node")
            };
            if let Some(dir) = &self.svg_dir {
                let path = dir.join(format!("flight-{}.svg", r.id));
                let svg = crate::flight::svg::render(&r, "node")?;
                std::fs::write(&path, svg)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            writeln!(out, "{}", crate::io::terminal_safe(&line)).context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
            self.printed = r.id + 1;
        }
        Ok(())
    }
}

/// A record as `trace --json --flight` prints it: `"kind": "flight_record"` and the record as
/// the node API answers it.
pub fn record_line(r: &FlightRecord) -> Value {
    let mut v = crate::flight::record_json(r, "");
    if let Value::Object(m) = &mut v {
        m.remove("node");
        m.insert("kind".into(), json!("flight_record"));
    }
    v
}

/// `memory.available` of a memory cgroup (cgroup2, or a v1 memory hierarchy's): its limit
/// (bounded by `MemTotal`) less its working set (usage − inactive file pages).
fn memory_available(dir: &Path) -> anyhow::Result<SignalPoint> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    };
    let stat = parse_memory_stat(&read("memory.stat")?)?;
    let (usage, inactive, limit) = if dir.join("memory.current").is_file() {
        (
            parse_single_u64("memory.current", &read("memory.current")?)?,
            stat.inactive_file,
            parse_memory_limit("memory.max", &read("memory.max")?)?,
        )
    } else {
        (
            parse_single_u64("memory.usage_in_bytes", &read("memory.usage_in_bytes")?)?,
            stat.total_inactive_file,
            parse_memory_limit("memory.limit_in_bytes", &read("memory.limit_in_bytes")?)?,
        )
    };
    let total = parse_meminfo_total(
        &std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?,
    )?;
    let o = memory_observation(
        cgroup_capacity(limit, total),
        working_set(usage, inactive.unwrap_or(0)),
    );
    Ok(SignalPoint {
        signal: "memory.available".into(),
        available: o.available,
        capacity: o.capacity,
        hard: None,
        soft: None,
    })
}
