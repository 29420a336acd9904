//! Frozen flight records on disk, so that a restart of the agent (after the OOM it recorded, an
//! upgrade, a node reboot) does not lose them: `<nodeMonitor.stateDir>/flight-records.json`.
//!
//! The records are written whole, atomically (a temporary file in the same directory, synced,
//! then renamed over the file), by a thread of their own, when a record freezes and when its tail
//! ends ([`node_monitor_core::flight::FlightRecorder::persist_due`]): the decision loop never
//! waits on the disk. The file is bounded: at most the recorder's 16 records and [`MAX_BYTES`]
//! (the oldest records are left out until it fits). At start the file is read back; a file that
//! is too large, unreadable as JSON or of another format version is logged, counted
//! (`node_monitor_flight_store_errors_total{reason}`) and set aside as
//! `flight-records.json.bad` (replacing an earlier one), and the agent starts without records.
use std::{
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::metrics::{counter::Counter, family::Family};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::FlightRecord;
use crate::metrics::ReasonLabels;

/// The file's name in the state directory.
pub const FILE: &str = "flight-records.json";
/// Where a file that could not be read back is moved.
pub const SET_ASIDE: &str = "flight-records.json.bad";
/// The largest file written or read back. 16 records at their bounds (170 samples, 320 events)
/// come to about 2.5 MB of JSON.
pub const MAX_BYTES: usize = 4 << 20;
/// The file's format version.
pub const VERSION: u32 = 1;

#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    records: Vec<&'a FlightRecord>,
}

#[derive(Deserialize)]
struct FileIn {
    version: u32,
    records: Vec<FlightRecord>,
}

/// Why the file could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {bytes} bytes, more than the {MAX_BYTES} a flight record file may hold")]
    Oversized { path: String, bytes: u64 },
    #[error("{path}: not a flight record file: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("{path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
}

impl LoadError {
    /// The `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Oversized { .. } => "oversized",
            Self::Corrupt { .. } => "corrupt",
            Self::Unreadable { .. } => "unreadable",
        }
    }
}

/// The record file of one state directory.
#[derive(Debug, Clone)]
pub struct FlightStore {
    dir: PathBuf,
    max_bytes: usize,
}

impl FlightStore {
    /// The file in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_bytes: MAX_BYTES,
        }
    }

    /// The same with another size bound (tests).
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The records of the file, oldest first; none when there is no file.
    pub fn load(&self) -> Result<Vec<FlightRecord>, LoadError> {
        let path = self.path();
        let shown = path.display().to_string();
        let unreadable = |source| LoadError::Unreadable {
            path: shown.clone(),
            source,
        };
        // Opened without blocking (a FIFO planted at the path would otherwise hold start-up
        // until a writer came), then judged by what was opened.
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(unreadable(e)),
        };
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.file_type().is_file() {
            return Err(unreadable(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let bytes = meta.len();
        if bytes > self.max_bytes as u64 {
            return Err(LoadError::Oversized { path: shown, bytes });
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, self.max_bytes as u64 + 1),
            &mut text,
        )
        .map_err(unreadable)?;
        let file: FileIn = serde_json::from_slice(&text).map_err(|e| LoadError::Corrupt {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        if file.version != VERSION {
            return Err(LoadError::Corrupt {
                path: shown,
                reason: format!(
                    "format version {}, this agent reads {VERSION}",
                    file.version
                ),
            });
        }
        Ok(file.records)
    }

    /// Moves the file out of the way (to [`SET_ASIDE`]); returns where.
    pub fn set_aside(&self) -> std::io::Result<PathBuf> {
        let to = self.dir.join(SET_ASIDE);
        std::fs::rename(self.path(), &to)?;
        Ok(to)
    }

    /// Writes `records` (oldest first) atomically, leaving out the oldest until the file fits
    /// in the size bound; returns how many were written.
    pub fn save(&self, records: &[Arc<FlightRecord>]) -> std::io::Result<usize> {
        let mut from = 0;
        let text = loop {
            let file = FileOut {
                version: VERSION,
                records: records[from..].iter().map(|r| &**r).collect(),
            };
            let text = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
            if text.len() <= self.max_bytes || from == records.len() {
                break text;
            }
            from += 1;
        };
        crate::io::write_atomically(&self.dir, FILE, &text)?;
        Ok(records.len() - from)
    }

    /// The records of an earlier run, at start: a file that cannot be read back is logged,
    /// counted on `errors` and set aside, and no record is restored.
    pub fn restore(&self, errors: &Family<ReasonLabels, Counter>) -> Vec<FlightRecord> {
        match self.load() {
            Ok(records) => {
                if !records.is_empty() {
                    info!(path = %self.path().display(), records = records.len(),
                          "flight records of an earlier run restored");
                }
                records
            }
            Err(e) => {
                count(errors, e.reason());
                let aside = match &e {
                    LoadError::Unreadable { .. } => None,
                    _ => Some(self.set_aside()),
                };
                match aside {
                    Some(Ok(to)) => warn!(error = %e, set_aside = %to.display(),
                                          "flight records not restored; the file was set aside"),
                    Some(Err(m)) => warn!(error = %e, move_error = %m,
                                          "flight records not restored; the file could not be set aside"),
                    None => warn!(error = %e, "flight records not restored"),
                }
                Vec::new()
            }
        }
    }
}

fn count(errors: &Family<ReasonLabels, Counter>, reason: &str) {
    errors
        .get_or_create(&ReasonLabels {
            reason: reason.to_owned(),
        })
        .inc();
}

/// The latest records to write, and whether the writer thread is writing.
#[derive(Default)]
struct Pending {
    records: Option<Vec<Arc<FlightRecord>>>,
    writing: bool,
}

/// [`Pending`], handed from the recorder to the writer thread.
type Slot = Arc<(Mutex<Pending>, Condvar)>;

/// Hands the records to a thread that writes them: [`FlightWriter::submit`] never waits on the
/// disk; a newer snapshot replaces one not yet written. [`FlightWriter::flush`] waits, bounded,
/// for what was handed over to be on disk (at a stop).
#[derive(Clone)]
pub struct FlightWriter {
    slot: Slot,
}

impl std::fmt::Debug for FlightWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlightWriter")
    }
}

impl FlightWriter {
    /// Starts the writer thread on `store`; a failed write is logged (once until a write
    /// succeeds again) and counted on `errors` as `write`.
    pub fn spawn(
        store: FlightStore,
        errors: Family<ReasonLabels, Counter>,
    ) -> std::io::Result<Self> {
        let slot: Slot = Arc::default();
        let theirs = slot.clone();
        std::thread::Builder::new()
            .name("nm-flight-store".into())
            .spawn(move || {
                let mut failing = false;
                let (lock, ready) = &*theirs;
                loop {
                    let Ok(mut pending) = lock.lock() else { return };
                    while pending.records.is_none() {
                        pending = match ready.wait(pending) {
                            Ok(p) => p,
                            Err(_) => return,
                        };
                    }
                    let Some(records) = pending.records.take() else {
                        continue;
                    };
                    pending.writing = true;
                    drop(pending);
                    match store.save(&records) {
                        Ok(written) => {
                            if written < records.len() {
                                warn!(kept = written, records = records.len(),
                                      "flight record file at its size bound: the oldest records left out");
                            }
                            if failing {
                                info!(path = %store.path().display(), "flight records written again");
                            }
                            failing = false;
                        }
                        Err(e) => {
                            count(&errors, "write");
                            if !failing {
                                warn!(path = %store.path().display(), error = %e,
                                      "could not write the flight records; they stay in memory");
                            }
                            failing = true;
                        }
                    }
                    let Ok(mut pending) = lock.lock() else { return };
                    pending.writing = false;
                    drop(pending);
                    // The writer and a flush may both wait on the condition variable.
                    ready.notify_all();
                }
            })?;
        Ok(Self { slot })
    }

    /// The records to write (oldest first), replacing any not yet written.
    pub fn submit(&self, records: Vec<Arc<FlightRecord>>) {
        let (lock, ready) = &*self.slot;
        if let Ok(mut pending) = lock.lock() {
            pending.records = Some(records);
            ready.notify_all();
        }
    }

    /// Waits until everything submitted was written (or its write failed), at most `bound`.
    /// Blocking; returns false when the bound ran out first.
    pub fn flush(&self, bound: Duration) -> bool {
        let (lock, ready) = &*self.slot;
        let deadline = Instant::now() + bound;
        let Ok(mut pending) = lock.lock() else {
            return false;
        };
        while pending.records.is_some() || pending.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pending = match ready.wait_timeout(pending, left) {
                Ok((p, _)) => p,
                Err(_) => return false,
            };
        }
        true
    }
}

/// The store of `state_dir` (`nodeMonitor.stateDir`; empty: none), its directory created.
pub fn open(state_dir: &str) -> Option<Result<FlightStore, (PathBuf, std::io::Error)>> {
    if state_dir.is_empty() {
        return None;
    }
    let dir = Path::new(state_dir);
    Some(
        std::fs::create_dir_all(dir)
            .map(|()| FlightStore::new(dir))
            .map_err(|e| (dir.to_owned(), e)),
    )
}

#[cfg(test)]
mod tests;
