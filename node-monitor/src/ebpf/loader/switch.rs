//! Attaching and detaching the memory push's programs on demand, on a thread of their own.
//!
//! Attached, the two programs run on every page allocation and free (~125 ns per page pair even
//! disarmed); detached they cost nothing. The decision loop asks for one state or the other
//! ([`PushSwitch::request`] returns at once); this thread does the work: an attach opens a perf
//! event per tracepoint, a detach closes it and may wait for an RCU grace period. Requests that
//! pile up while one is in progress collapse to the last.
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use aya::{Ebpf, programs::raw_trace_point::RawTracePointLinkId};
use node_monitor_common::names::prog;
use tracing::{debug, warn};

use super::attach::{attach_loaded, take_link};
use crate::ebpf::policy;

/// What the switch last did, for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushAttachment {
    /// Both programs are attached.
    pub attached: bool,
    /// Successful attaches and detaches so far.
    pub attaches: u64,
    pub detaches: u64,
    /// Attaches that failed (the push then stays detached; the agent samples instead).
    pub failures: u64,
    /// How long the last attach and detach took.
    pub last_attach: Option<Duration>,
    pub last_detach: Option<Duration>,
}

struct Shared {
    attached: AtomicBool,
    attaches: AtomicU64,
    detaches: AtomicU64,
    failures: AtomicU64,
    last_attach_ns: AtomicU64,
    last_detach_ns: AtomicU64,
}

/// Attaches and detaches the memory push's programs; cheap to clone. The thread ends when every
/// clone is dropped, detaching the programs.
#[derive(Clone)]
pub struct PushSwitch {
    tx: mpsc::Sender<bool>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PushSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSwitch")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl PushSwitch {
    /// Starts the switch's thread; the programs stay detached until the first request.
    pub(super) fn start(ebpf: Arc<Mutex<Ebpf>>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            attached: AtomicBool::new(false),
            attaches: AtomicU64::new(0),
            detaches: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last_attach_ns: AtomicU64::new(u64::MAX),
            last_detach_ns: AtomicU64::new(u64::MAX),
        });
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("nm-mem-push".to_owned())
            .spawn(move || run(&ebpf, &rx, &thread_shared))?;
        Ok(Self { tx, shared })
    }

    /// Asks for the programs attached (`true`) or detached. Returns at once.
    pub fn request(&self, attached: bool) {
        // The thread only ends when every sender is gone.
        let _ = self.tx.send(attached);
    }

    /// What the switch has done so far.
    pub fn state(&self) -> PushAttachment {
        let d = |a: &AtomicU64| match a.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        };
        PushAttachment {
            attached: self.shared.attached.load(Ordering::Acquire),
            attaches: self.shared.attaches.load(Ordering::Relaxed),
            detaches: self.shared.detaches.load(Ordering::Relaxed),
            failures: self.shared.failures.load(Ordering::Relaxed),
            last_attach: d(&self.shared.last_attach_ns),
            last_detach: d(&self.shared.last_detach_ns),
        }
    }
}

const NAMES: [&str; 2] = [prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE];

fn run(ebpf: &Mutex<Ebpf>, rx: &mpsc::Receiver<bool>, shared: &Shared) {
    let mut links: Option<[RawTracePointLinkId; 2]> = None;
    let mut failing = false;
    while let Ok(mut want) = rx.recv() {
        // Only the last of the requests waiting matters.
        while let Ok(w) = rx.try_recv() {
            want = w;
        }
        match (want, links.is_some()) {
            (true, false) => {
                let start = Instant::now();
                match attach_both(ebpf) {
                    Ok(ids) => {
                        let took = start.elapsed();
                        links = Some(ids);
                        failing = false;
                        shared.attached.store(true, Ordering::Release);
                        shared.attaches.fetch_add(1, Ordering::Relaxed);
                        store_ns(&shared.last_attach_ns, took);
                        debug!(took_us = took.as_micros(), "memory push attached");
                    }
                    Err(e) => {
                        shared.failures.fetch_add(1, Ordering::Relaxed);
                        if !failing {
                            warn!(error = %e, "attaching the memory push failed; the agent samples near thresholds instead");
                        }
                        failing = true;
                    }
                }
            }
            (false, true) => {
                let start = Instant::now();
                if let Some(ids) = links.take() {
                    detach(ebpf, ids);
                }
                let took = start.elapsed();
                shared.attached.store(false, Ordering::Release);
                shared.detaches.fetch_add(1, Ordering::Relaxed);
                store_ns(&shared.last_detach_ns, took);
                debug!(took_us = took.as_micros(), "memory push detached");
            }
            _ => {}
        }
    }
    if let Some(ids) = links.take() {
        detach(ebpf, ids);
    }
}

fn store_ns(a: &AtomicU64, d: Duration) {
    a.store(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1),
        Ordering::Relaxed,
    );
}

/// Attaches both programs, or neither.
fn attach_both(ebpf: &Mutex<Ebpf>) -> Result<[RawTracePointLinkId; 2], String> {
    let mut ids = Vec::with_capacity(2);
    for name in NAMES {
        let Some(spec) = policy::spec(name) else {
            return Err(format!("{name} is missing from the program table"));
        };
        let result = {
            let mut guard = ebpf
                .lock()
                .map_err(|_| "the eBPF object's lock is poisoned")?;
            attach_loaded(&mut guard, spec)
        };
        match result {
            Ok(id) => ids.push(id),
            Err(e) => {
                for (name, id) in NAMES.into_iter().zip(ids) {
                    detach_one(ebpf, name, id);
                }
                return Err(e);
            }
        }
    }
    match <[RawTracePointLinkId; 2]>::try_from(ids) {
        Ok(ids) => Ok(ids),
        Err(_) => Err("not both programs attached".to_owned()),
    }
}

fn detach(ebpf: &Mutex<Ebpf>, ids: [RawTracePointLinkId; 2]) {
    for (name, id) in NAMES.into_iter().zip(ids) {
        detach_one(ebpf, name, id);
    }
}

/// Takes the link under the lock and drops it outside: the drop may wait for the kernel.
fn detach_one(ebpf: &Mutex<Ebpf>, name: &str, id: RawTracePointLinkId) {
    let link = match ebpf.lock() {
        Ok(mut guard) => take_link(&mut guard, name, id),
        Err(_) => Err("the eBPF object's lock is poisoned".to_owned()),
    };
    match link {
        Ok(link) => drop(link),
        Err(e) => warn!(error = %e, "detaching the memory push failed"),
    }
}
