//! Typed kernel events, decoded from ring-buffer records.
use node_monitor_common::{
    event::{self, DecodeError, EventHeader, EventKind, Record, comm_str, oom_flags, reboot_flags},
    logic::{OomScope, RebootCaller, RebootCmd, RebootGate, ReclaimFlavor, oom_scope},
};
use serde::Serialize;

/// The task a probe ran in (`current`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskInfo {
    /// Process (thread-group) id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub comm: String,
    /// cgroup v2 id (the inode of its directory in the unified hierarchy).
    pub cgroup_id: u64,
}

impl TaskInfo {
    fn from_header(h: &EventHeader) -> Self {
        Self {
            pid: h.pid,
            tid: h.tid,
            comm: comm_str(&h.comm).to_owned(),
            cgroup_id: h.cgroup_id,
        }
    }
}

/// The victim's memory when it was chosen, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OomMemory {
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    pub pgtables_bytes: u64,
}

impl OomMemory {
    /// Resident set: anonymous + file + shmem, as the kernel's OOM report sums it (saturating:
    /// the figures come from a record and are not trusted to be sane).
    pub fn rss_bytes(&self) -> u64 {
        self.anon_rss_bytes
            .saturating_add(self.file_rss_bytes)
            .saturating_add(self.shmem_rss_bytes)
    }
}

/// The OOM killer chose a victim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomKillEvent {
    pub ts_ns: u64,
    /// The task whose allocation or charge invoked the OOM killer.
    pub trigger: TaskInfo,
    /// The victim's process id (its thread id when only that is known).
    pub victim_pid: u32,
    pub victim_tid: u32,
    pub victim_comm: Option<String>,
    /// The victim's own cgroup v2 id, when the probe could read it from the victim's task.
    pub victim_cgroup_id: Option<u64>,
    pub memory: Option<OomMemory>,
    pub uid: Option<u32>,
    pub oom_score_adj: Option<i32>,
    #[serde(serialize_with = "ser_scope")]
    pub scope: OomScope,
    /// The last reclaim the trigger ran before the kill (the evidence for `scope`).
    #[serde(serialize_with = "ser_opt_flavor")]
    pub trigger_reclaim: Option<ReclaimFlavor>,
}

impl OomKillEvent {
    /// The cgroup the kill is attributed to: the victim's, else the trigger's (the same for a
    /// memcg OOM caused by the victim itself).
    pub fn cgroup_id(&self) -> u64 {
        self.victim_cgroup_id.unwrap_or(self.trigger.cgroup_id)
    }

    /// `Some(true)` for a node-level OOM, `Some(false)` for a memory-cgroup limit, `None` if
    /// unknown.
    pub fn global(&self) -> Option<bool> {
        self.scope.is_global()
    }
}

/// A cgroup's reclaim stall crossed the budget in a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimStallEvent {
    pub ts_ns: u64,
    /// The task whose reclaim episode crossed the budget.
    pub task: TaskInfo,
    pub cgroup_id: u64,
    #[serde(serialize_with = "ser_flavor")]
    pub flavor: ReclaimFlavor,
    pub stall_ns: u64,
    pub count: u32,
    pub window_ns: u64,
    pub window_start_ns: u64,
}

/// kswapd was woken on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KswapdWakeEvent {
    pub ts_ns: u64,
    /// The allocating task that woke it.
    pub task: TaskInfo,
    pub nid: i32,
    pub zid: i32,
    pub order: i32,
    pub gfp_flags: u64,
    /// Wake-ups withheld by the in-kernel rate limit since the previous event on this node.
    pub suppressed: u32,
}

/// A `reboot(2)` request and the probe's verdict on its caller and arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebootEvent {
    pub ts_ns: u64,
    pub task: TaskInfo,
    #[serde(serialize_with = "ser_cmd")]
    pub cmd: RebootCmd,
    pub cmd_raw: u32,
    pub magic1: u32,
    pub magic2: u32,
    /// Only [`RebootGate::Allowed`] can take the node down.
    #[serde(serialize_with = "ser_gate")]
    pub verdict: RebootGate,
    /// The caller's credentials, when the probe could read them.
    #[serde(serialize_with = "ser_caller")]
    pub caller: Option<RebootCaller>,
    /// Calls with the same verdict the in-kernel rate limit withheld since the previous event.
    pub suppressed: u32,
}

fn ser_gate<S: serde::Serializer>(g: &RebootGate, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(g.as_str())
}

fn ser_caller<S: serde::Serializer>(c: &Option<RebootCaller>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    match c {
        None => s.serialize_none(),
        Some(c) => {
            let mut st = s.serialize_struct("RebootCaller", 3)?;
            st.serialize_field("pid_ns_level", &c.pid_ns_level)?;
            st.serialize_field("user_ns_level", &c.user_ns_level)?;
            st.serialize_field("cap_effective", &format!("{:#x}", c.cap_effective))?;
            st.end()
        }
    }
}

fn ser_scope<S: serde::Serializer>(scope: &OomScope, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(scope.as_str())
}

fn ser_flavor<S: serde::Serializer>(f: &ReclaimFlavor, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.as_str())
}

fn ser_opt_flavor<S: serde::Serializer>(
    f: &Option<ReclaimFlavor>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match f {
        Some(f) => s.serialize_str(f.as_str()),
        None => s.serialize_none(),
    }
}

fn ser_cmd<S: serde::Serializer>(cmd: &RebootCmd, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(cmd.as_str())
}

/// The benchmark generator's event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyntheticEvent {
    pub ts_ns: u64,
    pub task: TaskInfo,
    pub seq: u64,
}

/// A kernel event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    OomKill(OomKillEvent),
    ReclaimStall(ReclaimStallEvent),
    KswapdWake(KswapdWakeEvent),
    Reboot(RebootEvent),
    Synthetic(SyntheticEvent),
}

impl KernelEvent {
    /// `oom_kill`, `reclaim_stall`, `kswapd_wake`, `reboot` (or `synthetic`).
    pub fn kind(&self) -> &'static str {
        self.event_kind().as_str()
    }

    pub fn event_kind(&self) -> EventKind {
        match self {
            Self::OomKill(_) => EventKind::OomKill,
            Self::ReclaimStall(_) => EventKind::ReclaimStall,
            Self::KswapdWake(_) => EventKind::KswapdWake,
            Self::Reboot(_) => EventKind::Reboot,
            Self::Synthetic(_) => EventKind::Synthetic,
        }
    }

    /// `bpf_ktime_get_ns()` when the probe ran (CLOCK_MONOTONIC).
    pub fn ts_ns(&self) -> u64 {
        match self {
            Self::OomKill(e) => e.ts_ns,
            Self::ReclaimStall(e) => e.ts_ns,
            Self::KswapdWake(e) => e.ts_ns,
            Self::Reboot(e) => e.ts_ns,
            Self::Synthetic(e) => e.ts_ns,
        }
    }

    /// The cgroup the event is about (the victim's for an OOM kill).
    pub fn cgroup_id(&self) -> u64 {
        match self {
            Self::OomKill(e) => e.cgroup_id(),
            Self::ReclaimStall(e) => e.cgroup_id,
            Self::KswapdWake(e) => e.task.cgroup_id,
            Self::Reboot(e) => e.task.cgroup_id,
            Self::Synthetic(e) => e.task.cgroup_id,
        }
    }

    /// Decodes one record. `reclaim_probes_attached` says whether both reclaim groups were
    /// attached, which OOM scope classification depends on.
    pub fn decode(bytes: &[u8], reclaim_probes_attached: bool) -> Result<Self, DecodeError> {
        Ok(Self::from_record(
            event::decode(bytes)?,
            reclaim_probes_attached,
        ))
    }

    pub fn from_record(record: Record, reclaim_probes_attached: bool) -> Self {
        match record {
            Record::OomKill(e) => {
                let d = e.data;
                let has = |flag| d.flags & flag != 0;
                Self::OomKill(OomKillEvent {
                    ts_ns: e.header.ts_ns,
                    trigger: TaskInfo::from_header(&e.header),
                    victim_pid: d.victim_pid,
                    victim_tid: d.victim_tid,
                    victim_comm: has(oom_flags::COMM).then(|| comm_str(&d.victim_comm).to_owned()),
                    victim_cgroup_id: has(oom_flags::VICTIM_CGROUP).then_some(d.victim_cgroup_id),
                    memory: has(oom_flags::MEMORY).then_some(OomMemory {
                        total_vm_bytes: d.total_vm_bytes,
                        anon_rss_bytes: d.anon_rss_bytes,
                        file_rss_bytes: d.file_rss_bytes,
                        shmem_rss_bytes: d.shmem_rss_bytes,
                        pgtables_bytes: d.pgtables_bytes,
                    }),
                    uid: has(oom_flags::UID).then_some(d.uid),
                    oom_score_adj: has(oom_flags::SCORE_ADJ).then_some(d.oom_score_adj),
                    scope: oom_scope(d.trigger_reclaim, reclaim_probes_attached),
                    trigger_reclaim: ReclaimFlavor::from_u32(d.trigger_reclaim),
                })
            }
            Record::ReclaimStall(e) => Self::ReclaimStall(ReclaimStallEvent {
                ts_ns: e.header.ts_ns,
                task: TaskInfo::from_header(&e.header),
                cgroup_id: e.data.cgroup_id,
                // `decode` checked the flavor; a record built otherwise counts as direct.
                flavor: ReclaimFlavor::from_u32(e.data.flavor).unwrap_or(ReclaimFlavor::Direct),
                stall_ns: e.data.stall_ns,
                count: e.data.count,
                window_ns: e.data.window_ns,
                window_start_ns: e.data.window_start_ns,
            }),
            Record::KswapdWake(e) => Self::KswapdWake(KswapdWakeEvent {
                ts_ns: e.header.ts_ns,
                task: TaskInfo::from_header(&e.header),
                nid: e.data.nid,
                zid: e.data.zid,
                order: e.data.order,
                gfp_flags: e.data.gfp_flags,
                suppressed: e.data.suppressed,
            }),
            Record::Reboot(e) => Self::Reboot(RebootEvent {
                ts_ns: e.header.ts_ns,
                task: TaskInfo::from_header(&e.header),
                cmd: RebootCmd::from_raw(e.data.cmd),
                cmd_raw: e.data.cmd,
                magic1: e.data.magic1,
                magic2: e.data.magic2,
                // `decode` checked the verdict; a record built otherwise cannot count as a
                // shutdown.
                verdict: RebootGate::from_u32(e.data.verdict).unwrap_or(RebootGate::Unverified),
                caller: (e.data.flags & reboot_flags::CALLER != 0).then_some(RebootCaller {
                    cap_effective: e.data.cap_effective,
                    pid_ns_level: e.data.pid_ns_level,
                    user_ns_level: e.data.user_ns_level,
                }),
                suppressed: e.data.suppressed,
            }),
            Record::Synthetic(e) => Self::Synthetic(SyntheticEvent {
                ts_ns: e.header.ts_ns,
                task: TaskInfo::from_header(&e.header),
                seq: e.data.seq,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
