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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn windows_tumble() {
        // (window start, now, window length, expired)
        let cases = [
            (0, 5 * MS, 1000 * MS, true), // no window yet
            (1, 1, 1000 * MS, false),
            (100 * MS, 1099 * MS, 1000 * MS, false),
            (100 * MS, 1100 * MS, 1000 * MS, true), // exactly one window later
            (100 * MS, 5000 * MS, 1000 * MS, true),
            (100 * MS, 50 * MS, 1000 * MS, false), // clock read before start on another CPU
        ];
        for (start, now, len, want) in cases {
            assert_eq!(window_expired(start, now, len), want, "{start} {now} {len}");
        }
    }

    #[test]
    fn budget_is_inclusive() {
        let cases = [
            (0, 1, false),
            (9 * MS, 10 * MS, false),
            (10 * MS, 10 * MS, true),
            (11 * MS, 10 * MS, true),
        ];
        for (stall, budget, want) in cases {
            assert_eq!(budget_exceeded(stall, budget), want, "{stall} {budget}");
        }
    }

    #[test]
    fn rate_limit() {
        let cases = [
            (0, 10, 1000, true), // never sent
            (10, 500, 1000, false),
            (10, 1010, 1000, true),
            (10, 1009, 1000, false),
            (2000, 1000, 1000, false), // a stale clock never underflows into "allowed"
            (10, 11, 0, true),         // no limit
        ];
        for (last, now, min, want) in cases {
            assert_eq!(
                rate_limit_allows(last, now, min),
                want,
                "{last} {now} {min}"
            );
        }
    }

    #[test]
    fn kswapd_slots_are_bounded() {
        assert_eq!(kswapd_slot(0), 0);
        assert_eq!(kswapd_slot(3), 3);
        assert_eq!(kswapd_slot(63), 63);
        assert_eq!(kswapd_slot(64), 63);
        assert_eq!(kswapd_slot(i32::MAX), 63);
        assert_eq!(kswapd_slot(-1), 0);
    }

    #[test]
    fn oom_scope_follows_the_last_reclaim() {
        let direct = ReclaimFlavor::Direct as u32;
        let memcg = ReclaimFlavor::Memcg as u32;
        let cases = [
            (memcg, true, OomScope::Memcg),
            (direct, true, OomScope::Global),
            (NO_RECLAIM_SEEN, true, OomScope::Global),
            (memcg, false, OomScope::Unknown),
            (NO_RECLAIM_SEEN, false, OomScope::Unknown),
        ];
        for (evidence, attached, want) in cases {
            assert_eq!(oom_scope(evidence, attached), want, "{evidence} {attached}");
        }
        assert_eq!(OomScope::Memcg.is_global(), Some(false));
        assert_eq!(OomScope::Global.is_global(), Some(true));
        assert_eq!(OomScope::Unknown.is_global(), None);
    }

    #[test]
    fn reboot_commands_decode() {
        let cases = [
            (0x0123_4567, RebootCmd::Restart, "restart", true),
            (0xCDEF_0123, RebootCmd::Halt, "halt", true),
            (0x4321_FEDC, RebootCmd::PowerOff, "power_off", true),
            (0xA1B2_C3D4, RebootCmd::Restart2, "restart2", true),
            (0x4558_4543, RebootCmd::Kexec, "kexec", true),
            (0xD000_FCE2, RebootCmd::SoftwareSuspend, "sw_suspend", false),
            (0x89AB_CDEF, RebootCmd::CadOn, "cad_on", false),
            (0, RebootCmd::CadOff, "cad_off", false),
            (7, RebootCmd::Unknown(7), "unknown", false),
        ];
        for (raw, cmd, name, down) in cases {
            assert_eq!(RebootCmd::from_raw(raw), cmd);
            assert_eq!(cmd.as_str(), name);
            assert_eq!(cmd.goes_down(), down, "{name}");
        }
    }
}
