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
mod tests {
    use node_monitor_common::{
        as_bytes,
        event::{Event, OomKill, Reboot},
        logic::NO_RECLAIM_SEEN,
    };

    use super::*;

    fn oom(flags: u32, trigger_reclaim: u32) -> Event<OomKill> {
        Event {
            header: EventHeader {
                ts_ns: 10,
                pid: 1,
                tid: 2,
                cgroup_id: 300,
                comm: *b"trigger\0\0\0\0\0\0\0\0\0",
                ..EventHeader::new(EventKind::OomKill)
            },
            data: OomKill {
                victim_pid: 40,
                victim_tid: 41,
                victim_comm: *b"victim\0\0\0\0\0\0\0\0\0\0",
                victim_cgroup_id: 500,
                total_vm_bytes: 7,
                anon_rss_bytes: 100,
                file_rss_bytes: 20,
                shmem_rss_bytes: 3,
                pgtables_bytes: 4,
                uid: 0,
                oom_score_adj: 1000,
                trigger_reclaim,
                flags,
            },
        }
    }

    /// The record decoded, as an OOM kill.
    fn decoded(e: &Event<OomKill>, reclaim_probes_attached: bool) -> OomKillEvent {
        match KernelEvent::decode(as_bytes(e), reclaim_probes_attached) {
            Ok(KernelEvent::OomKill(k)) => k,
            other => panic!("not an oom kill: {other:?}"),
        }
    }

    #[test]
    fn oom_kill_from_the_raw_program() {
        let e = oom(oom_flags::ALL, ReclaimFlavor::Memcg as u32);
        let k = decoded(&e, true);
        assert_eq!(k.victim_pid, 40);
        assert_eq!(k.victim_comm.as_deref(), Some("victim"));
        assert_eq!(k.victim_cgroup_id, Some(500));
        assert_eq!(k.cgroup_id(), 500);
        assert_eq!(k.trigger.comm, "trigger");
        assert_eq!(k.memory.map(|m| m.rss_bytes()), Some(123));
        assert_eq!(k.global(), Some(false));
        assert_eq!(k.oom_score_adj, Some(1000));
    }

    #[test]
    fn oom_kill_from_the_fallback_attributes_to_the_trigger() {
        // The tracepoint fallback knows neither the victim's cgroup nor its tgid.
        let e = oom(oom_flags::COMM | oom_flags::MEMORY, NO_RECLAIM_SEEN);
        let k = decoded(&e, true);
        assert_eq!(k.victim_cgroup_id, None);
        assert_eq!(k.cgroup_id(), 300);
        assert_eq!(k.uid, None);
        assert_eq!(k.global(), Some(true));
        // Without the reclaim probes the scope is unknown.
        let k = decoded(&e, false);
        assert_eq!(k.global(), None);
        assert_eq!(KernelEvent::OomKill(k).kind(), "oom_kill");
    }

    #[test]
    fn reboot_cmd_is_decoded() {
        let e = Event {
            header: EventHeader::new(EventKind::Reboot),
            data: Reboot {
                cmd: 0x4558_4543,
                magic1: 0xfee1_dead,
                magic2: 0x2812_1969,
                verdict: RebootGate::RefusedPidNs as u32,
                cap_effective: 0x1ff_ffff_ffff,
                pid_ns_level: 1,
                user_ns_level: 0,
                suppressed: 4,
                flags: reboot_flags::CALLER,
            },
        };
        let ev = KernelEvent::decode(as_bytes(&e), true).unwrap();
        assert_eq!(ev.kind(), "reboot");
        let KernelEvent::Reboot(r) = ev else { panic!() };
        assert_eq!(r.cmd, RebootCmd::Kexec);
        assert_eq!(r.verdict, RebootGate::RefusedPidNs);
        assert_eq!(r.suppressed, 4);
        assert_eq!(r.caller.map(|c| c.pid_ns_level), Some(1));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["cmd"], "kexec");
        assert_eq!(v["verdict"], "refused_pidns");
        assert_eq!(v["caller"]["cap_effective"], "0x1ffffffffff");
        // Without the caller flag the caller fields mean nothing.
        let mut e = e;
        e.data.flags = 0;
        e.data.verdict = RebootGate::Unverified as u32;
        let KernelEvent::Reboot(r) = KernelEvent::decode(as_bytes(&e), true).unwrap() else {
            panic!()
        };
        assert_eq!((r.caller, r.verdict), (None, RebootGate::Unverified));
        assert_eq!(
            serde_json::to_value(&r).unwrap()["caller"],
            serde_json::Value::Null
        );
    }

    /// Found by `prop_records_decode_to_their_kind`: memory figures whose sum overflows u64 made
    /// `rss_bytes` (and every trace line of the event) panic.
    #[test]
    fn absurd_memory_figures_saturate() {
        let mut e = oom(oom_flags::MEMORY, NO_RECLAIM_SEEN);
        e.data.anon_rss_bytes = u64::MAX;
        e.data.file_rss_bytes = 1;
        e.data.shmem_rss_bytes = u64::MAX;
        let k = decoded(&e, true);
        assert_eq!(k.memory.map(|m| m.rss_bytes()), Some(u64::MAX));
        let at = crate::attribution::Attribution {
            cgroup_id: k.cgroup_id(),
            cgroup_path: None,
            pod: None,
            pod_ref: None,
        };
        let ev = KernelEvent::OomKill(k);
        let text = crate::trace::event_text(&ev, &at);
        assert!(
            text.contains(&format!("rss={}KiB", u64::MAX / 1024)),
            "{text}"
        );
        assert_eq!(
            crate::trace::event_json(&ev, &at, None)["rss_bytes"],
            serde_json::json!(u64::MAX)
        );
    }

    #[test]
    fn short_records_are_errors() {
        let e = oom(0, 0);
        let bytes = as_bytes(&e);
        assert!(matches!(
            KernelEvent::decode(&bytes[..bytes.len() - 1], true),
            Err(DecodeError::Short { .. })
        ));
        assert!(KernelEvent::decode(&[], true).is_err());
    }
}

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop {
    use node_monitor_common::event::EventKind;
    use proptest::{collection::vec, prelude::*, sample::select};

    use super::*;
    use crate::attribution::Attribution;

    /// Everything the agent does with a decoded event: its accessors, its JSON and text forms.
    fn use_event(ev: &KernelEvent) {
        let _ = (ev.kind(), ev.ts_ns(), ev.cgroup_id());
        if let KernelEvent::OomKill(e) = ev {
            let _ = (e.global(), e.memory.map(|m| m.rss_bytes()));
        }
        let at = Attribution {
            cgroup_id: ev.cgroup_id(),
            cgroup_path: None,
            pod: None,
            pod_ref: None,
        };
        let _ = crate::trace::event_json(ev, &at, Some(&at));
        let _ = crate::trace::event_text(ev, &at);
    }

    /// Records with a known kind and its size in the header (so decoding reaches the fields),
    /// random contents, cut short or padded.
    fn record() -> impl Strategy<Value = (EventKind, Vec<u8>)> {
        (select(EventKind::ALL.to_vec()), any::<u64>(), -8_isize..=8).prop_flat_map(
            |(kind, seed, extra)| {
                let size = kind.record_size();
                let len = size.saturating_add_signed(extra).max(8);
                (Just(kind), vec(any::<u8>(), len), Just(seed)).prop_map(
                    move |(kind, mut bytes, seed)| {
                        bytes[..4].copy_from_slice(&(kind as u32).to_ne_bytes());
                        bytes[4..8].copy_from_slice(&(size as u32).to_ne_bytes());
                        // Valid enumerations half of the time, so that decoding succeeds often.
                        if seed % 2 == 0 {
                            set_valid_fields(kind, &mut bytes, seed);
                        }
                        (kind, bytes)
                    },
                )
            },
        )
    }

    /// Puts in-domain values into the fields `decode` checks.
    fn set_valid_fields(kind: EventKind, bytes: &mut [u8], seed: u64) {
        use std::mem::offset_of;

        use node_monitor_common::event::{OomKill, Reboot, ReclaimStall};

        let header = size_of::<EventHeader>();
        let put = |bytes: &mut [u8], offset: usize, v: u32| {
            if let Some(dst) = bytes.get_mut(offset..offset + 4) {
                dst.copy_from_slice(&v.to_ne_bytes());
            }
        };
        let pick = |shift: u32, n: u64| ((seed >> shift) % n) as u32;
        match kind {
            EventKind::OomKill => {
                // NO_RECLAIM_SEEN (0), direct (1) or memcg (2).
                put(
                    bytes,
                    header + offset_of!(OomKill, trigger_reclaim),
                    pick(8, 3),
                );
                let flags = pick(16, u64::from(oom_flags::ALL) + 1);
                put(bytes, header + offset_of!(OomKill, flags), flags);
            }
            EventKind::ReclaimStall => {
                put(
                    bytes,
                    header + offset_of!(ReclaimStall, flavor),
                    1 + pick(8, 2),
                );
            }
            EventKind::Reboot => {
                put(bytes, header + offset_of!(Reboot, verdict), 1 + pick(8, 7));
                let flags = pick(16, u64::from(reboot_flags::ALL) + 1);
                put(bytes, header + offset_of!(Reboot, flags), flags);
            }
            EventKind::KswapdWake | EventKind::Synthetic => {}
        }
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Any bytes: an event or an error, never a panic.
        #[test]
        fn prop_arbitrary_bytes_decode_or_fail(bytes in vec(any::<u8>(), 0..512), attached in any::<bool>()) {
            if let Ok(ev) = KernelEvent::decode(&bytes, attached) {
                use_event(&ev);
            }
        }

        /// A record of a known kind decodes to that kind exactly when it is long enough and its
        /// checked fields are in their domains; a short one is a `Short` error.
        #[test]
        fn prop_records_decode_to_their_kind((kind, bytes) in record(), attached in any::<bool>()) {
            match KernelEvent::decode(&bytes, attached) {
                Ok(ev) => {
                    prop_assert!(bytes.len() >= kind.record_size());
                    prop_assert_eq!(ev.event_kind(), kind);
                    use_event(&ev);
                }
                Err(DecodeError::Short { need, got }) => {
                    prop_assert_eq!(got, bytes.len());
                    prop_assert!(got < need && need <= kind.record_size());
                }
                Err(DecodeError::InvalidField { .. }) => {
                    prop_assert!(bytes.len() >= kind.record_size());
                }
                Err(e) => prop_assert!(false, "{kind:?}: unexpected {e}"),
            }
        }
    }
}
