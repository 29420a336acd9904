//! The I/O half of the load policy: probe the kernel, plan (pure, in [`super::policy`]), load the
//! object, fill the configuration maps, attach, and report a state per program. Nothing here
//! fails the agent: a failure becomes a program state and a warning.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
};
use aya_log::EbpfLogger;
use node_monitor_common::{
    counters,
    event::EventKind,
    logic::mem_push,
    names::{self, prog},
};
use tokio::io::{Interest, unix::AsyncFd};
use tracing::{debug, info, warn};

use super::{
    ProbeConfig,
    policy::{self, Decision, Family, PROGRAMS, ProgramSpec, ProgramState, Requirement, Selection},
    stream::EventStream,
};

use self::{
    attach::{attach, detach_mem_push, unload},
    maps::write_maps,
    probe::probe_capabilities,
};

mod attach;
mod maps;
mod probe;
mod push;
mod switch;

pub(crate) use self::push::register;
pub use self::push::{MemPushControl, MemPushWakes};
use self::push::{mem_push_control, mem_push_map};

pub use switch::{PushAttachment, PushSwitch};

/// The programs, built by node-monitor/build.rs (aya-build) from node-monitor-ebpf.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/node-monitor"));

/// The embedded eBPF object's SHA-256, in hex: which programs this binary loads.
pub fn object_sha256() -> String {
    ring::digest::digest(&ring::digest::SHA256, OBJECT)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One program's status, for logs, metrics and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStatus {
    pub name: &'static str,
    #[serde(serialize_with = "ser_family")]
    pub family: Family,
    /// `tracepoint oom/mark_victim`, `raw_tracepoint mark_victim`.
    pub attach: String,
    #[serde(serialize_with = "ser_requirement")]
    pub requirement: Requirement,
    #[serde(flatten)]
    pub state: ProgramState,
    /// The kernel's id for the loaded program (bpftool prog show id N).
    pub prog_id: Option<u32>,
}

fn ser_family<S: serde::Serializer>(f: &Family, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.as_str())
}

fn ser_requirement<S: serde::Serializer>(r: &Requirement, s: S) -> Result<S::Ok, S::Error> {
    match r {
        Requirement::Required => s.serialize_str("required"),
        Requirement::Optional => s.serialize_str("optional"),
        Requirement::FallbackFor(p) => s.serialize_str(&format!("fallback for {p}")),
        Requirement::OptIn => s.serialize_str("opt-in"),
    }
}

/// The in-kernel counters, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Records sent to the ring buffer, per kind.
    pub events: BTreeMap<EventKind, u64>,
    /// Records lost because the ring buffer was full, per kind.
    pub drops: BTreeMap<EventKind, u64>,
    pub read_errors: u64,
    pub reclaim_episodes: u64,
    pub reclaim_unmatched: u64,
    pub kswapd_suppressed: u64,
    pub map_errors: u64,
    /// Reboot requests the per-verdict rate limit withheld (never `allowed` ones).
    pub reboot_suppressed: u64,
    /// Memory push wake records sent, withheld by the rate limit, lost to a full ring.
    pub mem_push_wakes: u64,
    pub mem_push_suppressed: u64,
    pub mem_push_drops: u64,
}

impl Counters {
    pub fn total_events(&self) -> u64 {
        self.events.values().sum()
    }

    pub fn total_drops(&self) -> u64 {
        self.drops.values().sum()
    }
}

/// A program's cumulative run time from the kernel's BPF statistics (counted only while
/// `kernel.bpf_stats_enabled` is 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStats {
    pub name: &'static str,
    pub prog_id: u32,
    pub run_count: u64,
    pub run_time: Duration,
}

/// Errors reading from loaded probes.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the eBPF object is not loaded")]
    NotLoaded,
    #[error("map {name} is missing from the eBPF object")]
    MissingMap { name: &'static str },
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {name}: a thread panicked while writing it")]
    Poisoned { name: &'static str },
    #[error("registering {what} with the async runtime")]
    Register {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The loaded kernel probes.
pub struct Probes {
    /// Shared with the memory push's switch, which attaches and detaches its programs.
    ebpf: Option<Arc<Mutex<Ebpf>>>,
    statuses: Vec<ProgramStatus>,
    logger: Option<EbpfLogger<TracingLog>>,
    mem_push: Option<MemPushControl>,
    /// The kernel's BTF, as probed: `Err` says why there is none; `None` when not probed.
    kernel_btf: Option<Result<(), String>>,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("loaded", &self.ebpf.is_some())
            .field("statuses", &self.statuses)
            .finish_non_exhaustive()
    }
}

impl Probes {
    /// Loads and attaches every program the kernel supports and the configuration wants. Never
    /// fails: programs that cannot run are reported with a reason, and each is logged.
    pub fn load(config: &ProbeConfig) -> Self {
        let this = Self::try_load(config);
        for s in &this.statuses {
            let required = s.requirement == Requirement::Required;
            let fallback = this.fallback_attached(s.name);
            match &s.state {
                ProgramState::Attached => {
                    info!(program = s.name, attach = %s.attach, prog_id = ?s.prog_id, "kernel probe attached");
                }
                ProgramState::Failed { reason } if let Some(fallback) = fallback => {
                    info!(program = s.name, attach = %s.attach, reason, fallback, "kernel probe failed; its fallback is attached");
                }
                ProgramState::Failed { reason } if required => {
                    warn!(program = s.name, attach = %s.attach, reason, required, "kernel probe failed");
                }
                ProgramState::Failed { reason } => {
                    warn!(program = s.name, attach = %s.attach, reason, "kernel probe failed");
                }
                ProgramState::Disabled { reason } => {
                    debug!(program = s.name, reason, "kernel probe disabled");
                }
                ProgramState::Loaded => {
                    info!(program = s.name, "kernel probe loaded, not attached");
                }
                ProgramState::Degraded { reason } => {
                    warn!(program = s.name, attach = %s.attach, prog_id = ?s.prog_id, reason, "kernel probe attached, degraded");
                }
            }
        }
        for feature in this.degraded() {
            warn!(
                program = feature.name,
                missing = feature.when_missing,
                "kernel probe feature degraded"
            );
        }
        this
    }

    fn try_load(config: &ProbeConfig) -> Self {
        if let Err(e) = config.validate() {
            return Self::all(ProgramState::Failed {
                reason: e.to_string(),
            });
        }
        let (caps, kernel_btf) = probe_capabilities(config);
        let selection = Selection {
            disabled: config.disable.clone(),
            opt_in: config.synthetic_tgid.is_some(),
        };
        let plan = policy::plan(PROGRAMS, &caps, &selection);

        let level: u8 = if config.kernel_log {
            aya_log::Level::Trace as u8
        } else {
            0
        };
        // Without kernel BTF the CO-RE reads are relocated against nothing: aya leaves them
        // poisoned, and the programs, told so by the CORE global, never reach them (the
        // verifier prunes them as dead code).
        let empty = aya::Btf::new();
        let core: u8 = kernel_btf.is_some().into();
        let mut loader = EbpfLoader::new();
        loader
            .btf(kernel_btf.as_ref().unwrap_or(&empty))
            .map_max_entries(names::EVENTS_MAP, config.ring_buffer_bytes)
            .override_global(aya_log::LEVEL, &level, false)
            .override_global(names::CORE_GLOBAL, &core, true);
        let mut ebpf = match loader.load(OBJECT) {
            Ok(e) => e,
            Err(e) => {
                return Self::unloaded(&plan, format!("loading the eBPF object: {}", chain(&e)));
            }
        };
        if let Err(e) = write_maps(&mut ebpf, config, &plan) {
            return Self::unloaded(&plan, format!("writing configuration maps: {}", chain(&e)));
        }
        let logger = if config.kernel_log {
            match EbpfLogger::init_with_logger(&mut ebpf, TracingLog) {
                Ok(l) => Some(l),
                Err(e) => {
                    warn!(error = %chain(&e), "kernel log forwarding unavailable");
                    None
                }
            }
        } else {
            None
        };

        let mut states: BTreeMap<&'static str, ProgramState> = BTreeMap::new();
        for (spec, decision) in &plan {
            // A fallback stands by while its primary, or a fallback of the same primary listed
            // before it, runs, whether or not it could run itself.
            let standby = policy::standby(PROGRAMS, spec, |name| {
                states.get(name).is_some_and(ProgramState::is_attached)
            });
            let state = match (standby, decision) {
                (Some(running), _) => ProgramState::Disabled {
                    reason: format!("standby: {running} is attached"),
                },
                (None, Decision::Skip(state)) => state.clone(),
                (None, Decision::Attach { .. } | Decision::Fallback { .. }) => {
                    attach(&mut ebpf, spec)
                }
            };
            states.insert(spec.name, state);
        }
        for (name, reason) in policy::broken_groups(PROGRAMS, &states) {
            unload(&mut ebpf, name);
            states.insert(name, ProgramState::Failed { reason });
        }
        // The memory push attaches only near a memory threshold (see `switch`).
        detach_mem_push(&mut ebpf, &mut states);
        let statuses: Vec<ProgramStatus> = PROGRAMS
            .iter()
            .map(|spec| {
                let state = states.remove(spec.name).unwrap_or(ProgramState::Disabled {
                    reason: "not planned".to_owned(),
                });
                let state = policy::with_caller_checks(spec.name, state, &caps.kernel_btf);
                let prog_id = match state {
                    ProgramState::Attached
                    | ProgramState::Degraded { .. }
                    | ProgramState::Loaded => ebpf
                        .program(spec.name)
                        .and_then(|p| p.info().ok())
                        .map(|i| i.id()),
                    _ => None,
                };
                status(spec, state, prog_id)
            })
            .collect();
        let map = mem_push_map(&mut ebpf, &statuses);
        let ebpf = Arc::new(Mutex::new(ebpf));
        let mem_push = map.and_then(|map| mem_push_control(map, &ebpf));
        Self {
            ebpf: Some(ebpf),
            statuses,
            logger,
            mem_push,
            kernel_btf: caps.kernel_btf.clone(),
        }
    }

    fn all(state: ProgramState) -> Self {
        Self {
            ebpf: None,
            statuses: PROGRAMS
                .iter()
                .map(|spec| status(spec, state.clone(), None))
                .collect(),
            logger: None,
            mem_push: None,
            kernel_btf: None,
        }
    }

    /// Every program that was to run failed for `reason`; the rest keep their planned state.
    fn unloaded(plan: &[(&'static ProgramSpec, Decision)], reason: String) -> Self {
        Self {
            ebpf: None,
            statuses: plan
                .iter()
                .map(|(spec, d)| {
                    let state = match d {
                        Decision::Skip(s) => s.clone(),
                        _ => ProgramState::Failed {
                            reason: reason.clone(),
                        },
                    };
                    status(spec, state, None)
                })
                .collect(),
            logger: None,
            mem_push: None,
            kernel_btf: None,
        }
    }

    /// One status per program in the table.
    pub fn program_states(&self) -> Vec<ProgramStatus> {
        self.statuses.clone()
    }

    /// The kernel's BTF as the loader probed it (`Err`: why there is none); `None` when the
    /// probes did not get that far.
    pub fn kernel_btf(&self) -> Option<&Result<(), String>> {
        self.kernel_btf.as_ref()
    }

    /// The state of one program.
    pub fn state(&self, name: &str) -> Option<&ProgramState> {
        self.statuses
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.state)
    }

    /// How many programs are attached.
    pub fn attached(&self) -> usize {
        self.statuses
            .iter()
            .filter(|s| s.state.is_attached())
            .count()
    }

    fn is_attached(&self, name: &str) -> bool {
        self.state(name).is_some_and(ProgramState::is_attached)
    }

    /// The attached fallback of `primary`, if any.
    pub fn fallback_attached(&self, primary: &str) -> Option<&'static str> {
        PROGRAMS
            .iter()
            .find(|f| {
                matches!(f.requirement, Requirement::FallbackFor(p) if p == primary)
                    && self.is_attached(f.name)
            })
            .map(|f| f.name)
    }

    /// Required programs that are not attached and that no fallback replaces.
    pub fn degraded(&self) -> Vec<&'static ProgramSpec> {
        PROGRAMS
            .iter()
            .filter(|spec| {
                spec.requirement == Requirement::Required && !self.is_attached(spec.name)
            })
            .filter(|spec| self.fallback_attached(spec.name).is_none())
            .collect()
    }

    /// Whether both reclaim groups run, which telling a memcg OOM from a global one needs.
    pub fn reclaim_attached(&self) -> bool {
        [
            prog::DIRECT_BEGIN,
            prog::DIRECT_END,
            prog::MEMCG_BEGIN,
            prog::MEMCG_END,
        ]
        .iter()
        .all(|p| self.is_attached(p))
    }

    /// The in-kernel counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, ProbeError> {
        let ebpf = self.ebpf.as_ref().ok_or(ProbeError::NotLoaded)?;
        let ebpf = ebpf
            .lock()
            .map_err(|_| ProbeError::Poisoned { name: "the object" })?;
        let name = names::COUNTERS_MAP;
        let map = ebpf.map(name).ok_or(ProbeError::MissingMap { name })?;
        let array: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        let read = |slot: u32| -> Result<u64, ProbeError> {
            let values = array
                .get(&slot, 0)
                .map_err(|source| ProbeError::Map { name, source })?;
            Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
        };
        let mut c = Counters::default();
        for kind in EventKind::ALL {
            c.events.insert(kind, read(counters::EVENTS + kind.slot())?);
            c.drops.insert(kind, read(counters::DROPS + kind.slot())?);
        }
        c.read_errors = read(counters::READ_ERRORS)?;
        c.reclaim_episodes = read(counters::RECLAIM_EPISODES)?;
        c.reclaim_unmatched = read(counters::RECLAIM_UNMATCHED)?;
        c.kswapd_suppressed = read(counters::KSWAPD_SUPPRESSED)?;
        c.map_errors = read(counters::MAP_ERRORS)?;
        c.reboot_suppressed = read(counters::REBOOT_SUPPRESSED)?;
        c.mem_push_wakes = read(counters::MEM_PUSH_WAKES)?;
        c.mem_push_suppressed = read(counters::MEM_PUSH_SUPPRESSED)?;
        c.mem_push_drops = read(counters::MEM_PUSH_DROPS)?;
        Ok(c)
    }

    /// The event stream. Takes the ring buffer: callable once. Needs a tokio runtime.
    pub fn events(&mut self) -> Result<EventStream, ProbeError> {
        let reclaim = self.reclaim_attached();
        let ebpf = self.ebpf.as_ref().ok_or(ProbeError::NotLoaded)?;
        let mut ebpf = ebpf
            .lock()
            .map_err(|_| ProbeError::Poisoned { name: "the object" })?;
        let name = names::EVENTS_MAP;
        let map = ebpf.take_map(name).ok_or(ProbeError::MissingMap { name })?;
        let ring = RingBuf::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        let fd = register(ring, "the event ring buffer")?;
        Ok(EventStream::new(fd, reclaim))
    }

    /// The last gasp's own ring buffer (`allowed` reboot(2) requests only, each with a forced
    /// wake-up), for a reader of its own. Takes the map: callable once.
    pub fn gasp_ring(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let ebpf = self.ebpf.as_ref().ok_or(ProbeError::NotLoaded)?;
        let mut ebpf = ebpf
            .lock()
            .map_err(|_| ProbeError::Poisoned { name: "the object" })?;
        let name = names::GASP_MAP;
        let map = ebpf.take_map(name).ok_or(ProbeError::MissingMap { name })?;
        RingBuf::try_from(map).map_err(|source| ProbeError::Map { name, source })
    }

    /// The memory push's control, when both of its programs are loaded.
    pub fn mem_push(&self) -> Option<MemPushControl> {
        self.mem_push.clone()
    }

    /// The memory push's wake records (each submitted with a forced wake-up), for a reader of
    /// their own. Takes the ring buffer: callable once. Needs a tokio runtime.
    pub fn mem_push_wakes(&mut self) -> Result<MemPushWakes, ProbeError> {
        let ebpf = self.ebpf.as_ref().ok_or(ProbeError::NotLoaded)?;
        let mut ebpf = ebpf
            .lock()
            .map_err(|_| ProbeError::Poisoned { name: "the object" })?;
        let name = names::MEM_PUSH_RING;
        let map = ebpf.take_map(name).ok_or(ProbeError::MissingMap { name })?;
        let ring = RingBuf::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        Ok(MemPushWakes {
            fd: register(ring, "the memory push ring buffer")?,
        })
    }

    /// Forwards the programs' aya-log records to tracing (target `node_monitor::ebpf::kernel`)
    /// from a task. `None` unless loaded with `kernel_log`. Needs a tokio runtime.
    pub fn forward_kernel_log(
        &mut self,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, ProbeError> {
        let Some(logger) = self.logger.take() else {
            return Ok(None);
        };
        let mut fd = register(logger, "the kernel log ring buffer")?;
        Ok(Some(tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    warn!("kernel log ring buffer is no longer readable");
                    return;
                };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        })))
    }

    /// Run-time statistics of the attached and loaded programs (see [`RunStats`]).
    pub fn run_stats(&self) -> Vec<RunStats> {
        let Some(Ok(ebpf)) = self.ebpf.as_ref().map(|e| e.lock()) else {
            return Vec::new();
        };
        self.statuses
            .iter()
            .filter(|s| s.state.is_attached() || s.state == ProgramState::Loaded)
            .filter_map(|s| {
                let info = ebpf.program(s.name)?.info().ok()?;
                Some(RunStats {
                    name: s.name,
                    prog_id: info.id(),
                    run_count: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }
}

fn status(spec: &'static ProgramSpec, state: ProgramState, prog_id: Option<u32>) -> ProgramStatus {
    ProgramStatus {
        name: spec.name,
        family: spec.family,
        attach: spec.attach.to_string(),
        requirement: spec.requirement,
        state,
        prog_id,
    }
}

/// An error and its causes on one line, its end kept: verifier logs can be long, and the
/// verifier says at the end what it refused.
fn chain(e: &dyn std::error::Error) -> String {
    crate::telemetry::error_chain_tail(e, 2000)
}

/// Hands aya-log records (the `log` facade) to tracing.
pub(crate) struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let module = record.target();
        let message = record.args();
        match record.level() {
            log::Level::Error => {
                tracing::error!(target: "node_monitor::ebpf::kernel", module, "{message}");
            }
            log::Level::Warn => {
                tracing::warn!(target: "node_monitor::ebpf::kernel", module, "{message}");
            }
            log::Level::Info => {
                tracing::info!(target: "node_monitor::ebpf::kernel", module, "{message}");
            }
            log::Level::Debug => {
                tracing::debug!(target: "node_monitor::ebpf::kernel", module, "{message}");
            }
            log::Level::Trace => {
                tracing::trace!(target: "node_monitor::ebpf::kernel", module, "{message}");
            }
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests;
