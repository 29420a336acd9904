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

plain! {
    RebootCaller { u64, u32, u32 },
    RebootSlot { u64, u64 },
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

    #[test]
    fn reboot_gate_follows_the_kernels_checks() {
        const RESTART: u32 = 0x0123_4567;
        const CAD_ON: u32 = 0x89AB_CDEF;
        const M1: u32 = REBOOT_MAGIC1;
        const M2: u32 = REBOOT_MAGIC2[0];
        let root = RebootCaller {
            cap_effective: 0x1ff_ffff_ffff,
            pid_ns_level: 0,
            user_ns_level: 0,
        };
        let no_boot = RebootCaller {
            cap_effective: root.cap_effective & !(1 << CAP_SYS_BOOT),
            ..root
        };
        let container = RebootCaller {
            pid_ns_level: 1,
            ..root
        };
        let userns = RebootCaller {
            user_ns_level: 2,
            ..root
        };
        let only_boot = RebootCaller {
            cap_effective: 1 << CAP_SYS_BOOT,
            ..root
        };
        let cases = [
            (Some(root), M1, M2, RESTART, RebootGate::Allowed),
            (
                Some(only_boot),
                M1,
                REBOOT_MAGIC2[3],
                0x4558_4543,
                RebootGate::Allowed,
            ),
            (Some(root), M1, M2, 0x4321_FEDC, RebootGate::Allowed),
            (Some(root), M1, M2, 0xCDEF_0123, RebootGate::Allowed),
            (Some(root), M1, M2, 0xA1B2_C3D4, RebootGate::Allowed),
            // A container's own PID namespace: whatever its capabilities.
            (Some(container), M1, M2, RESTART, RebootGate::RefusedPidNs),
            (
                Some(RebootCaller {
                    pid_ns_level: 3,
                    cap_effective: 0,
                    user_ns_level: 1,
                }),
                0,
                0,
                CAD_ON,
                RebootGate::RefusedPidNs,
            ),
            // Full capabilities, but in a child user namespace.
            (Some(userns), M1, M2, RESTART, RebootGate::RefusedUserNs),
            (Some(no_boot), M1, M2, RESTART, RebootGate::RefusedCap),
            (
                Some(RebootCaller::default()),
                M1,
                M2,
                RESTART,
                RebootGate::RefusedCap,
            ),
            (Some(root), M1, 7, RESTART, RebootGate::RefusedMagic),
            (
                Some(root),
                0xdead_beef,
                M2,
                RESTART,
                RebootGate::RefusedMagic,
            ),
            (Some(root), M1, M2, CAD_ON, RebootGate::NotShutdown),
            (Some(root), M1, M2, 0, RebootGate::NotShutdown),
            (Some(root), M1, M2, 0xD000_FCE2, RebootGate::NotShutdown),
            (Some(root), M1, M2, 42, RebootGate::NotShutdown),
            // Unknown caller: the arguments still decide what they can.
            (None, M1, M2, RESTART, RebootGate::Unverified),
            (None, M1, 1, RESTART, RebootGate::RefusedMagic),
            (None, M1, M2, CAD_ON, RebootGate::NotShutdown),
        ];
        for (caller, m1, m2, cmd, want) in cases {
            assert_eq!(
                reboot_gate(caller, m1, m2, cmd),
                want,
                "{caller:?} {m1:#x} {m2} {cmd:#x}"
            );
        }
    }

    #[test]
    fn reboot_gates_have_stable_ids_names_and_slots() {
        for (i, g) in RebootGate::ALL.iter().enumerate() {
            assert_eq!(*g as u32, i as u32 + 1);
            assert_eq!(RebootGate::from_u32(*g as u32), Some(*g));
            assert!((*g as u32) < REBOOT_GATES);
        }
        assert_eq!(RebootGate::from_u32(0), None);
        assert_eq!(RebootGate::from_u32(8), None);
        let names: std::vec::Vec<&str> = RebootGate::ALL.iter().map(|g| g.as_str()).collect();
        assert_eq!(
            names,
            [
                "allowed",
                "refused_pidns",
                "refused_userns",
                "refused_cap",
                "refused_magic",
                "not_shutdown",
                "unverified"
            ]
        );
        let refused: std::vec::Vec<&str> =
            RebootGate::ALL.iter().filter_map(|g| g.refusal()).collect();
        assert_eq!(
            refused,
            ["pid_namespace", "user_namespace", "capability", "magic"]
        );
    }

    #[test]
    fn reboot_magic_numbers() {
        // The magic numbers glibc's reboot(3) passes, and ones the kernel refuses.
        let cases = [
            (0xfee1_dead, 672_274_793, true),
            (0xfee1_dead, 85_072_278, true),
            (0xfee1_dead, 369_367_448, true),
            (0xfee1_dead, 537_993_216, true),
            (0xfee1_dead, 1, false),
            (0xdead_beef, 672_274_793, false),
        ];
        for (m1, m2, want) in cases {
            assert_eq!(reboot_magic_accepted(m1, m2), want, "{m1:#x} {m2}");
        }
    }
}
