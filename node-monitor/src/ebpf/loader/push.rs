//! The memory push's handles: the control that arms it and switches its programs, and the
//! stream of its wake records.
use super::*;

/// Arms and disarms the memory push (the `mem_push` programs): cheap to clone, shared by the
/// decision loop that arms it and whoever reads it back.
#[derive(Clone)]
pub struct MemPushControl {
    map: Arc<Mutex<Array<MapData, u64>>>,
    switch: PushSwitch,
}

impl std::fmt::Debug for MemPushControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPushControl").finish_non_exhaustive()
    }
}

impl MemPushControl {
    /// Arms the push with a batch of `pages` per CPU, or disarms it with 0.
    pub fn arm(&self, pages: u64) -> Result<(), ProbeError> {
        let name = names::MEM_PUSH_MAP;
        let mut map = self.map.lock().map_err(|_| ProbeError::Poisoned { name })?;
        map.set(mem_push::BATCH, &pages, 0)
            .map_err(|source| ProbeError::Map { name, source })
    }

    /// Asks for the programs to be attached (`true`) or detached, on the switch's own thread:
    /// returns at once (see [`PushSwitch`]).
    pub fn set_attached(&self, attached: bool) {
        self.switch.request(attached);
    }

    /// The switch that attaches and detaches the programs.
    pub fn switch(&self) -> &PushSwitch {
        &self.switch
    }

    /// The batch in force (0: disarmed).
    pub fn batch(&self) -> Result<u64, ProbeError> {
        let name = names::MEM_PUSH_MAP;
        let map = self.map.lock().map_err(|_| ProbeError::Poisoned { name })?;
        map.get(&mem_push::BATCH, 0)
            .map_err(|source| ProbeError::Map { name, source })
    }
}

/// The memory push's wake records, as they arrive.
pub struct MemPushWakes {
    pub(super) fd: AsyncFd<RingBuf<MapData>>,
}

impl std::fmt::Debug for MemPushWakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPushWakes").finish_non_exhaustive()
    }
}

impl MemPushWakes {
    /// Waits for records and returns every one available (at least one). A record of the wrong
    /// size is skipped. An error means the ring buffer can no longer be read.
    pub async fn next(&mut self) -> std::io::Result<Vec<node_monitor_common::logic::MemPushWake>> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let mut out = Vec::new();
            while let Some(item) = ring.next() {
                if let Some(w) = node_monitor_common::from_bytes(&item) {
                    out.push(w);
                }
            }
            guard.clear_ready();
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }
}

/// Registers a map's fd with the current tokio runtime (an error, not a panic, without one).
pub(crate) fn register<T: std::os::fd::AsRawFd>(
    inner: T,
    what: &'static str,
) -> Result<AsyncFd<T>, ProbeError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ProbeError::Register {
            what,
            source: std::io::Error::other("no tokio runtime"),
        });
    }
    // SAFETY: `inner` owns its map fd (aya's `MapData` / `EbpfLogger`), which stays open and
    // unchanged until `inner`, owned by the AsyncFd from here on, is dropped.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| {
        ProbeError::Register {
            what,
            source: e.into_parts().1,
        }
    })
}

/// The memory push's control, with its switch's thread.
pub(super) fn mem_push_control(
    map: Array<MapData, u64>,
    ebpf: &Arc<Mutex<Ebpf>>,
) -> Option<MemPushControl> {
    match PushSwitch::start(ebpf.clone()) {
        Ok(switch) => Some(MemPushControl {
            map: Arc::new(Mutex::new(map)),
            switch,
        }),
        Err(e) => {
            warn!(error = %e, "no thread to attach the memory push; the push stays off");
            None
        }
    }
}

/// The memory push's control map, when both of its programs are loaded.
pub(super) fn mem_push_map(
    ebpf: &mut Ebpf,
    statuses: &[ProgramStatus],
) -> Option<Array<MapData, u64>> {
    [prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE]
        .iter()
        .all(|p| {
            statuses
                .iter()
                .any(|s| s.name == *p && s.state == ProgramState::Loaded)
        })
        .then(|| ebpf.take_map(names::MEM_PUSH_MAP))
        .flatten()
        .and_then(|m| match Array::try_from(m) {
            Ok(map) => Some(map),
            Err(e) => {
                warn!(error = %chain(&e), "memory push map unusable; the push stays off");
                None
            }
        })
}
