//! Decisions the programs take in the kernel and the agent must interpret the same way. Pure
//! functions of their inputs (time passed in), so they are tested here and called from eBPF.
use crate::plain;

/// Which reclaim path a task stalled in.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReclaimFlavor {
    /// Page-allocator direct reclaim (`try_to_free_pages`, node-level shortage).
    Direct = 1,
    /// Memory-cgroup limit reclaim (`try_to_free_mem_cgroup_pages`: charge over a memcg limit,
    /// `memory.high`, a limit write, `memory.reclaim`).
    Memcg = 2,
}

/// `OomKill::trigger_reclaim` when the triggering task ran no reclaim the probes saw.
pub const NO_RECLAIM_SEEN: u32 = 0;

impl ReclaimFlavor {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Direct),
            2 => Some(Self::Memcg),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Memcg => "memcg",
        }
    }
}

/// Per-task reclaim state (`NM_RCL_TASKS`, keyed by thread id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimTask {
    /// Start of the reclaim in flight; 0 when none is.
    pub start_ns: u64,
    /// cgroup v2 id of the task when the reclaim began.
    pub cgroup_id: u64,
    /// The flavor of the last reclaim this task began (a [`ReclaimFlavor`] id).
    pub last_flavor: u32,
    pub _pad: u32,
}

/// Key of the stall accounting map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StallKey {
    pub cgroup_id: u64,
    pub flavor: u32,
    pub _pad: u32,
}

/// Stall accounting for one cgroup and flavor in the current window. Updated with atomic
/// operations from every CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallWindow {
    pub start_ns: u64,
    pub stall_ns: u64,
    pub count: u64,
    /// 1 once this window's event was emitted.
    pub emitted: u64,
}

/// The kswapd rate limit for one node.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KswapdSlot {
    pub last_emit_ns: u64,
    pub suppressed: u64,
}

/// Nodes the kswapd rate limit tracks separately; higher node ids share the last slot.
pub const KSWAPD_NODES: u32 = 64;

plain! {
    ReclaimTask { u64, u64, u32, u32 },
    StallKey { u64, u32, u32 },
    StallWindow { u64, u64, u64, u64 },
    KswapdSlot { u64, u64 },
}

/// Whether a reclaim ending at `now_ns` belongs to a new window (tumbling windows of
/// `window_ns`, starting at the first episode after the previous window ended).
pub const fn window_expired(start_ns: u64, now_ns: u64, window_ns: u64) -> bool {
    start_ns == 0 || now_ns.saturating_sub(start_ns) >= window_ns
}

/// Whether the stall accumulated in a window deserves its (single) event.
pub const fn budget_exceeded(stall_ns: u64, budget_ns: u64) -> bool {
    stall_ns >= budget_ns
}

/// Whether a rate-limited event may be sent at `now_ns` after the last one at `last_ns`.
pub const fn rate_limit_allows(last_ns: u64, now_ns: u64, min_interval_ns: u64) -> bool {
    last_ns == 0 || now_ns.saturating_sub(last_ns) >= min_interval_ns
}

/// The kswapd slot for a node id.
pub const fn kswapd_slot(nid: i32) -> u32 {
    if nid < 0 {
        0
    } else if (nid as u32) < KSWAPD_NODES {
        nid as u32
    } else {
        KSWAPD_NODES - 1
    }
}

/// Whether an OOM kill was node-level (global) or a memory cgroup's limit (memcg).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OomScope {
    Global,
    Memcg,
    /// The reclaim probes were not attached, so the path is not known.
    Unknown,
}

impl OomScope {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Memcg => "memcg",
            Self::Unknown => "unknown",
        }
    }

    /// `Some(true)` for a global OOM, `Some(false)` for a memcg OOM, `None` when unknown.
    pub const fn is_global(self) -> Option<bool> {
        match self {
            Self::Global => Some(true),
            Self::Memcg => Some(false),
            Self::Unknown => None,
        }
    }
}

/// Classifies an OOM kill from the last reclaim its triggering task began.
///
/// The kernel only knows the scope in `struct oom_control::memcg`, which no tracepoint passes.
/// Both OOM paths reclaim in the triggering task right before they invoke the killer, through
/// different functions with different tracepoints:
/// - memcg: `try_charge_memcg()` → `try_to_free_mem_cgroup_pages()` (fires
///   `mm_vmscan_memcg_reclaim_begin`) → `mem_cgroup_oom()` → `out_of_memory()`
///   (mm/memcontrol.c). A `memory.max` write reclaims the same way before its OOM.
/// - global: `__alloc_pages_slowpath()` → `__alloc_pages_direct_reclaim()` →
///   `try_to_free_pages()` (fires `mm_vmscan_direct_reclaim_begin`) → `__alloc_pages_may_oom()`
///   (mm/page_alloc.c); the slow path cannot reach the OOM killer without direct reclaim.
///
/// So the last flavor the task began decides; a task with no reclaim seen (sysrq-f runs the
/// killer from a kworker with no reclaim) is a global OOM, since only the page allocator and
/// sysrq invoke the killer without a memcg. Without the reclaim probes nothing is known.
pub const fn oom_scope(trigger_reclaim: u32, reclaim_probes_attached: bool) -> OomScope {
    if !reclaim_probes_attached {
        return OomScope::Unknown;
    }
    match ReclaimFlavor::from_u32(trigger_reclaim) {
        Some(ReclaimFlavor::Memcg) => OomScope::Memcg,
        Some(ReclaimFlavor::Direct) | None => OomScope::Global,
    }
}

/// `reboot(2)` commands (`include/uapi/linux/reboot.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RebootCmd {
    Restart,
    Halt,
    PowerOff,
    Restart2,
    CadOn,
    CadOff,
    SoftwareSuspend,
    Kexec,
    Unknown(u32),
}

impl RebootCmd {
    pub const fn from_raw(cmd: u32) -> Self {
        match cmd {
            0x0123_4567 => Self::Restart,
            0xCDEF_0123 => Self::Halt,
            0x4321_FEDC => Self::PowerOff,
            0xA1B2_C3D4 => Self::Restart2,
            0x89AB_CDEF => Self::CadOn,
            0x0000_0000 => Self::CadOff,
            0xD000_FCE2 => Self::SoftwareSuspend,
            0x4558_4543 => Self::Kexec,
            other => Self::Unknown(other),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::Halt => "halt",
            Self::PowerOff => "power_off",
            Self::Restart2 => "restart2",
            Self::CadOn => "cad_on",
            Self::CadOff => "cad_off",
            Self::SoftwareSuspend => "sw_suspend",
            Self::Kexec => "kexec",
            Self::Unknown(_) => "unknown",
        }
    }

    /// Whether the command takes the machine (or its kernel) down when the kernel accepts it.
    pub const fn goes_down(self) -> bool {
        matches!(
            self,
            Self::Restart | Self::Halt | Self::PowerOff | Self::Restart2 | Self::Kexec
        )
    }
}

/// `LINUX_REBOOT_MAGIC1` (`include/uapi/linux/reboot.h`).
pub const REBOOT_MAGIC1: u32 = 0xfee1_dead;
/// `LINUX_REBOOT_MAGIC2`, `…2A`, `…2B`, `…2C`: the kernel accepts any one of them.
pub const REBOOT_MAGIC2: [u32; 4] = [672_274_793, 85_072_278, 369_367_448, 537_993_216];
/// `CAP_SYS_BOOT` (`include/uapi/linux/capability.h`).
pub const CAP_SYS_BOOT: u32 = 22;

/// Whether reboot(2) accepts these magic numbers; it refuses any other call with EINVAL (or
/// EPERM, when the caller lacks the capability, which the kernel checks first), so such a call
/// takes nothing down.
pub const fn reboot_magic_accepted(magic1: u32, magic2: u32) -> bool {
    magic1 == REBOOT_MAGIC1
        && (magic2 == REBOOT_MAGIC2[0]
            || magic2 == REBOOT_MAGIC2[1]
            || magic2 == REBOOT_MAGIC2[2]
            || magic2 == REBOOT_MAGIC2[3])
}

/// What the reboot probe concludes about a `reboot(2)` call. The tracepoint fires on syscall
/// entry, before `SYSCALL_DEFINE4(reboot)` (kernel/reboot.c) checks anything; the kernel then
/// refuses a caller without `CAP_SYS_BOOT` in the user namespace owning its PID namespace
/// (EPERM), refuses bad magic numbers (EINVAL), and hands a call from a child PID namespace to
/// `reboot_pid_ns()`, which ends that namespace's init instead of the machine. Only
/// [`RebootGate::Allowed`] can take the node down. Ids are part of the kernel/agent ABI.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RebootGate {
    /// The caller is in the initial PID and user namespaces with `CAP_SYS_BOOT`, the magic
    /// numbers are valid and the command takes the machine down.
    Allowed = 1,
    /// The caller is in a child PID namespace: at most that namespace goes down.
    RefusedPidNs = 2,
    /// The caller's credentials belong to a child user namespace: its capabilities do not count
    /// in the initial one (EPERM).
    RefusedUserNs = 3,
    /// The caller lacks `CAP_SYS_BOOT` (EPERM).
    RefusedCap = 4,
    /// Invalid magic numbers (EINVAL).
    RefusedMagic = 5,
    /// A command that does not take the machine down (Ctrl-Alt-Del on/off, suspend, unknown).
    NotShutdown = 6,
    /// The caller could not be checked (kernel offsets unavailable or a read failed); the
    /// arguments would take the machine down. Never treated as a shutdown.
    Unverified = 7,
}

/// Slots of the reboot rate-limit map: one per [`RebootGate`] id.
pub const REBOOT_GATES: u32 = 8;

impl RebootGate {
    pub const ALL: [RebootGate; 7] = [
        Self::Allowed,
        Self::RefusedPidNs,
        Self::RefusedUserNs,
        Self::RefusedCap,
        Self::RefusedMagic,
        Self::NotShutdown,
        Self::Unverified,
    ];

    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Allowed),
            2 => Some(Self::RefusedPidNs),
            3 => Some(Self::RefusedUserNs),
            4 => Some(Self::RefusedCap),
            5 => Some(Self::RefusedMagic),
            6 => Some(Self::NotShutdown),
            7 => Some(Self::Unverified),
            _ => None,
        }
    }

    /// The name in JSON output and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::RefusedPidNs => "refused_pidns",
            Self::RefusedUserNs => "refused_userns",
            Self::RefusedCap => "refused_cap",
            Self::RefusedMagic => "refused_magic",
            Self::NotShutdown => "not_shutdown",
            Self::Unverified => "unverified",
        }
    }

    /// Why the kernel refuses the call, for refused verdicts: the `reason` label of
    /// `node_monitor_reboot_requests_refused_total`.
    pub const fn refusal(self) -> Option<&'static str> {
        match self {
            Self::RefusedPidNs => Some("pid_namespace"),
            Self::RefusedUserNs => Some("user_namespace"),
            Self::RefusedCap => Some("capability"),
            Self::RefusedMagic => Some("magic"),
            Self::Allowed | Self::NotShutdown | Self::Unverified => None,
        }
    }
}

/// The calling task's credentials, as the reboot probe reads them from `current`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebootCaller {
    /// `cred->cap_effective` (capabilities in `cred->user_ns`).
    pub cap_effective: u64,
    /// `task->thread_pid->level`: 0 in the initial PID namespace.
    pub pid_ns_level: u32,
    /// `cred->user_ns->level`: 0 for the initial user namespace.
    pub user_ns_level: u32,
}

/// The verdict on a `reboot(2)` call; `caller` is `None` when its credentials could not be read.
/// The magic numbers and the command are checked either way, so an unreadable caller only leaves
/// calls that would otherwise be allowed [`RebootGate::Unverified`].
pub const fn reboot_gate(
    caller: Option<RebootCaller>,
    magic1: u32,
    magic2: u32,
    cmd: u32,
) -> RebootGate {
    if let Some(c) = caller {
        if c.pid_ns_level != 0 {
            return RebootGate::RefusedPidNs;
        }
        if c.user_ns_level != 0 {
            return RebootGate::RefusedUserNs;
        }
        if c.cap_effective & (1 << CAP_SYS_BOOT) == 0 {
            return RebootGate::RefusedCap;
        }
    }
    if !reboot_magic_accepted(magic1, magic2) {
        return RebootGate::RefusedMagic;
    }
    if !RebootCmd::from_raw(cmd).goes_down() {
        return RebootGate::NotShutdown;
    }
    if caller.is_none() {
        return RebootGate::Unverified;
    }
    RebootGate::Allowed
}

/// The reboot rate limit for one verdict: every verdict but [`RebootGate::Allowed`] sends at most
/// one event per configured interval; the next event carries how many were withheld.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebootSlot {
    pub last_emit_ns: u64,
    pub suppressed: u64,
}

/// The memory push: the page-allocator tracepoints keep a per-CPU net page count (allocations
/// add `1 << order`, frees subtract it) and, when one CPU's growth since its last report reaches
/// the batch the agent wrote, report it in a [`MemPushWake`] (rate-limited globally). The count
/// is a trigger only: the agent re-reads memory and decides on what it reads.
pub mod mem_push {
    /// Slot of the batch in pages; 0 = disarmed (the programs return at once).
    pub const BATCH: u32 = 0;
    /// Slot of the minimum interval between two wake records, in ns.
    pub const MIN_INTERVAL: u32 = 1;
    /// Slot of the last wake record's time (kernel-written).
    pub const LAST_EMIT: u32 = 2;
    /// Slot of the wake records withheld since the last one sent (kernel-written).
    pub const SUPPRESSED: u32 = 3;
    /// Entries in the map.
    pub const SLOTS: u32 = 4;
}

/// What a CPU's net page count becomes after an allocation (`grow`) or a free of `pages` under
/// `batch`, and whether it reached the batch (then the caller reports it and resets the count
/// to 0). A free cannot take the count below `-batch`: frees of pages allocated on another CPU
/// must not bank unbounded credit against later growth here.
pub const fn mem_push_step(net: i64, pages: i64, grow: bool, batch: i64) -> (i64, bool) {
    if grow {
        let n = net.saturating_add(pages);
        (n, n >= batch)
    } else {
        let n = net.saturating_sub(pages);
        (if n < -batch { -batch } else { n }, false)
    }
}

/// A memory push wake record ([`crate::names::MEM_PUSH_RING`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemPushWake {
    pub ts_ns: u64,
    /// The reporting CPU's net growth, in pages, when it reached the batch.
    pub net_pages: i64,
    /// The batch in force.
    pub batch_pages: u64,
    pub cpu: u32,
    /// Records withheld by the rate limit since the previous one sent.
    pub suppressed: u32,
}

plain! {
    RebootCaller { u64, u32, u32 },
    RebootSlot { u64, u64 },
    MemPushWake { u64, i64, u64, u32, u32 },
}

#[cfg(test)]
mod tests;
