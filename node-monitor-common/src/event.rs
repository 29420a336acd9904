//! The ring-buffer records: an envelope ([`EventHeader`]) followed by one payload per kind.
//!
//! Every record is an [`Event<T>`]: the header names the kind and the record's size, so the agent
//! can reject records it does not understand instead of misreading them. Kind ids are explicit and
//! never reused; a retired kind keeps its number reserved.
use core::fmt;

use crate::{Plain, TASK_COMM_LEN, from_bytes, plain};

/// What a record carries. Explicit ids: they are part of the kernel/agent ABI.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// The OOM killer chose a victim (`oom/mark_victim`).
    OomKill = 1,
    /// A cgroup's tasks stalled in direct or memcg reclaim beyond the configured budget.
    ReclaimStall = 2,
    /// An allocation woke kswapd (`vmscan/mm_vmscan_wakeup_kswapd`), rate-limited in the kernel.
    KswapdWake = 3,
    /// A task called `reboot(2)` (restart, power-off, halt, kexec, …).
    Reboot = 4,
    // 5..=99: reserved for further kernel probes.
    /// Emitted only by the benchmark's event generator (`getppid(2)` of one configured process).
    Synthetic = 100,
}

impl EventKind {
    pub const ALL: [EventKind; 5] = [
        EventKind::OomKill,
        EventKind::ReclaimStall,
        EventKind::KswapdWake,
        EventKind::Reboot,
        EventKind::Synthetic,
    ];

    /// The kind for a wire id, `None` for ids this build does not know.
    pub const fn from_u32(id: u32) -> Option<Self> {
        match id {
            1 => Some(Self::OomKill),
            2 => Some(Self::ReclaimStall),
            3 => Some(Self::KswapdWake),
            4 => Some(Self::Reboot),
            100 => Some(Self::Synthetic),
            _ => None,
        }
    }

    /// The name used in JSON output, metrics labels and `--kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::OomKill => "oom_kill",
            Self::ReclaimStall => "reclaim_stall",
            Self::KswapdWake => "kswapd_wake",
            Self::Reboot => "reboot",
            Self::Synthetic => "synthetic",
        }
    }

    /// The kind's slot in the per-kind counter arrays (see [`crate::counters`]).
    pub const fn slot(self) -> u32 {
        match self {
            Self::OomKill => 0,
            Self::ReclaimStall => 1,
            Self::KswapdWake => 2,
            Self::Reboot => 3,
            Self::Synthetic => 4,
        }
    }

    /// The exact size of this kind's record.
    pub const fn record_size(self) -> usize {
        match self {
            Self::OomKill => size_of::<Event<OomKill>>(),
            Self::ReclaimStall => size_of::<Event<ReclaimStall>>(),
            Self::KswapdWake => size_of::<Event<KswapdWake>>(),
            Self::Reboot => size_of::<Event<Reboot>>(),
            Self::Synthetic => size_of::<Event<Synthetic>>(),
        }
    }
}

/// The envelope of every record. The task fields describe the task the probe ran in (`current`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] id.
    pub kind: u32,
    /// The whole record's size in bytes (header included).
    pub size: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, comparable with the agent's clock.
    pub ts_ns: u64,
    /// Thread-group id (the process id userspace sees) of `current`.
    pub pid: u32,
    /// Thread id of `current`.
    pub tid: u32,
    /// cgroup v2 id of `current` (`bpf_get_current_cgroup_id()`: the inode of its unified dir).
    pub cgroup_id: u64,
    /// `comm` of `current`, NUL-padded.
    pub comm: [u8; TASK_COMM_LEN],
}

impl EventHeader {
    /// A header for `kind` with its record size filled in and the task fields zeroed.
    pub const fn new(kind: EventKind) -> Self {
        Self {
            kind: kind as u32,
            size: kind.record_size() as u32,
            ts_ns: 0,
            pid: 0,
            tid: 0,
            cgroup_id: 0,
            comm: [0; TASK_COMM_LEN],
        }
    }
}

/// A record: the envelope and one payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<T> {
    pub header: EventHeader,
    pub data: T,
}

/// `OomKill::flags`: which fields the probe could fill.
pub mod oom_flags {
    /// `victim_cgroup_id` is the victim's own cgroup v2 id (read from its `task_struct`).
    pub const VICTIM_CGROUP: u32 = 1 << 0;
    /// `victim_pid` is the thread-group id (else it is the thread id the tracepoint reports).
    pub const VICTIM_TGID: u32 = 1 << 1;
    /// The memory figures are filled.
    pub const MEMORY: u32 = 1 << 2;
    /// `uid` is filled.
    pub const UID: u32 = 1 << 3;
    /// `oom_score_adj` is filled.
    pub const SCORE_ADJ: u32 = 1 << 4;
    /// `victim_comm` is filled.
    pub const COMM: u32 = 1 << 5;
    /// Produced by the raw-tracepoint program (task fields read with BTF offsets).
    pub const FROM_TASK: u32 = 1 << 6;
    pub const ALL: u32 = (1 << 7) - 1;
}

/// The OOM killer's victim. Figures are in bytes (the tracepoint prints kB; the task's counters
/// are pages: both are converted in the kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomKill {
    pub victim_pid: u32,
    pub victim_tid: u32,
    pub victim_comm: [u8; TASK_COMM_LEN],
    pub victim_cgroup_id: u64,
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    pub pgtables_bytes: u64,
    pub uid: u32,
    pub oom_score_adj: i32,
    /// The last reclaim the triggering task ran before this kill: a
    /// [`crate::logic::ReclaimFlavor`] id, or [`crate::logic::NO_RECLAIM_SEEN`].
    pub trigger_reclaim: u32,
    /// [`oom_flags`] bits.
    pub flags: u32,
}

/// A cgroup's reclaim stall in the current window crossed the budget. At most one per cgroup,
/// flavor and window.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimStall {
    /// cgroup v2 id of the stalled tasks.
    pub cgroup_id: u64,
    /// Time spent in reclaim by the cgroup's tasks since `window_start_ns`.
    pub stall_ns: u64,
    /// The configured window length.
    pub window_ns: u64,
    /// Start of the window (`bpf_ktime_get_ns()`).
    pub window_start_ns: u64,
    /// Reclaim episodes in the window.
    pub count: u32,
    /// A [`crate::logic::ReclaimFlavor`] id.
    pub flavor: u32,
}

/// kswapd was woken for a node.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KswapdWake {
    pub nid: i32,
    pub zid: i32,
    pub order: i32,
    /// Wake-ups on this node not reported since the previous event (rate limit).
    pub suppressed: u32,
    pub gfp_flags: u64,
}

/// `Reboot::flags`.
pub mod reboot_flags {
    /// `cap_effective`, `pid_ns_level` and `user_ns_level` were read from the caller's task.
    pub const CALLER: u32 = 1 << 0;
    pub const ALL: u32 = (1 << 1) - 1;
}

/// A `reboot(2)` call (a request: the kernel may still refuse it) and the probe's verdict on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reboot {
    pub cmd: u32,
    pub magic1: u32,
    pub magic2: u32,
    /// A [`crate::logic::RebootGate`] id.
    pub verdict: u32,
    /// The caller's `cred->cap_effective` (with [`reboot_flags::CALLER`]).
    pub cap_effective: u64,
    /// The depth of the caller's PID namespace and of its credentials' user namespace (with
    /// [`reboot_flags::CALLER`]).
    pub pid_ns_level: u32,
    pub user_ns_level: u32,
    /// Calls with this verdict withheld by the rate limit since the previous event.
    pub suppressed: u32,
    /// [`reboot_flags`] bits.
    pub flags: u32,
}

/// The benchmark generator's event.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synthetic {
    /// Per-CPU sequence number (gaps mean drops).
    pub seq: u64,
}

plain! {
    EventHeader { u32, u32, u64, u32, u32, u64, [u8; TASK_COMM_LEN] },
    OomKill { u32, u32, [u8; TASK_COMM_LEN], u64, u64, u64, u64, u64, u64, u32, i32, u32, u32 },
    ReclaimStall { u64, u64, u64, u64, u32, u32 },
    KswapdWake { i32, i32, i32, u32, u64 },
    Reboot { u32, u32, u32, u32, u64, u32, u32, u32, u32 },
    Synthetic { u64 },
    Event<OomKill> { EventHeader, OomKill },
    Event<ReclaimStall> { EventHeader, ReclaimStall },
    Event<KswapdWake> { EventHeader, KswapdWake },
    Event<Reboot> { EventHeader, Reboot },
    Event<Synthetic> { EventHeader, Synthetic },
}

// The ring buffer aligns records to 8 bytes; keep every record a multiple of 8 so the reserved
// size is the record size.
const _: () = {
    let mut i = 0;
    while i < EventKind::ALL.len() {
        assert!(EventKind::ALL[i].record_size().is_multiple_of(8));
        i += 1;
    }
};

/// A decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    OomKill(Event<OomKill>),
    ReclaimStall(Event<ReclaimStall>),
    KswapdWake(Event<KswapdWake>),
    Reboot(Event<Reboot>),
    Synthetic(Event<Synthetic>),
}

impl Record {
    pub fn header(&self) -> &EventHeader {
        match self {
            Self::OomKill(e) => &e.header,
            Self::ReclaimStall(e) => &e.header,
            Self::KswapdWake(e) => &e.header,
            Self::Reboot(e) => &e.header,
            Self::Synthetic(e) => &e.header,
        }
    }
}

/// Why a record was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header or than the kind's record.
    Short { need: usize, got: usize },
    /// A kind id this build does not know.
    UnknownKind { kind: u32 },
    /// The header's size does not match the kind's record size.
    SizeMismatch {
        kind: EventKind,
        header_size: u32,
        expected: usize,
    },
    /// A field holds a value outside its domain.
    InvalidField { field: &'static str, value: u64 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Short { need, got } => {
                write!(f, "record too short: {got} bytes, need {need}")
            }
            Self::UnknownKind { kind } => write!(f, "unknown event kind {kind}"),
            Self::SizeMismatch {
                kind,
                header_size,
                expected,
            } => write!(
                f,
                "{} record declares size {header_size}, expected {expected}",
                kind.as_str()
            ),
            Self::InvalidField { field, value } => {
                write!(f, "field {field} has invalid value {value}")
            }
        }
    }
}

impl core::error::Error for DecodeError {}

fn read<T: Plain>(bytes: &[u8]) -> Result<T, DecodeError> {
    from_bytes(bytes).ok_or(DecodeError::Short {
        need: size_of::<T>(),
        got: bytes.len(),
    })
}

/// Decodes one ring-buffer record. Never panics: short, unknown or inconsistent records are
/// errors.
pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let header: EventHeader = read(bytes)?;
    let kind =
        EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind { kind: header.kind })?;
    let expected = kind.record_size();
    if header.size as usize != expected {
        return Err(DecodeError::SizeMismatch {
            kind,
            header_size: header.size,
            expected,
        });
    }
    let record = match kind {
        EventKind::OomKill => {
            let e: Event<OomKill> = read(bytes)?;
            check_reclaim_evidence(e.data.trigger_reclaim)?;
            if e.data.flags & !oom_flags::ALL != 0 {
                return Err(DecodeError::InvalidField {
                    field: "oom_kill.flags",
                    value: e.data.flags.into(),
                });
            }
            Record::OomKill(e)
        }
        EventKind::ReclaimStall => {
            let e: Event<ReclaimStall> = read(bytes)?;
            if crate::logic::ReclaimFlavor::from_u32(e.data.flavor).is_none() {
                return Err(DecodeError::InvalidField {
                    field: "reclaim_stall.flavor",
                    value: e.data.flavor.into(),
                });
            }
            Record::ReclaimStall(e)
        }
        EventKind::KswapdWake => Record::KswapdWake(read(bytes)?),
        EventKind::Reboot => {
            let e: Event<Reboot> = read(bytes)?;
            if crate::logic::RebootGate::from_u32(e.data.verdict).is_none() {
                return Err(DecodeError::InvalidField {
                    field: "reboot.verdict",
                    value: e.data.verdict.into(),
                });
            }
            if e.data.flags & !reboot_flags::ALL != 0 {
                return Err(DecodeError::InvalidField {
                    field: "reboot.flags",
                    value: e.data.flags.into(),
                });
            }
            Record::Reboot(e)
        }
        EventKind::Synthetic => Record::Synthetic(read(bytes)?),
    };
    Ok(record)
}

fn check_reclaim_evidence(v: u32) -> Result<(), DecodeError> {
    if v == crate::logic::NO_RECLAIM_SEEN || crate::logic::ReclaimFlavor::from_u32(v).is_some() {
        Ok(())
    } else {
        Err(DecodeError::InvalidField {
            field: "oom_kill.trigger_reclaim",
            value: v.into(),
        })
    }
}

/// The text of a NUL-padded `comm` (up to the first NUL; invalid UTF-8 is cut at the error).
pub fn comm_str(comm: &[u8; TASK_COMM_LEN]) -> &str {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    match core::str::from_utf8(&comm[..end]) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&comm[..e.valid_up_to()]).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
