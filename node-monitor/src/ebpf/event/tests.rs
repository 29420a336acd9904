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
