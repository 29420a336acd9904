use std::vec::Vec;

use super::*;
use crate::{as_bytes, logic::ReclaimFlavor};

fn header(kind: EventKind) -> EventHeader {
    EventHeader {
        ts_ns: 123_456_789,
        pid: 4242,
        tid: 4243,
        cgroup_id: 0xdead_beef,
        comm: *b"stress-ng\0\0\0\0\0\0\0",
        ..EventHeader::new(kind)
    }
}

fn oom() -> Event<OomKill> {
    Event {
        header: header(EventKind::OomKill),
        data: OomKill {
            victim_pid: 77,
            victim_tid: 78,
            victim_comm: *b"python3\0\0\0\0\0\0\0\0\0",
            victim_cgroup_id: 9001,
            total_vm_bytes: 1 << 30,
            anon_rss_bytes: 1 << 25,
            file_rss_bytes: 4096,
            shmem_rss_bytes: 0,
            pgtables_bytes: 8192,
            uid: 1000,
            oom_score_adj: -999,
            trigger_reclaim: ReclaimFlavor::Memcg as u32,
            flags: oom_flags::ALL,
        },
    }
}

fn stall() -> Event<ReclaimStall> {
    Event {
        header: header(EventKind::ReclaimStall),
        data: ReclaimStall {
            cgroup_id: 55,
            stall_ns: 12_000_000,
            window_ns: 1_000_000_000,
            window_start_ns: 100,
            count: 12,
            flavor: ReclaimFlavor::Direct as u32,
        },
    }
}

fn reboot() -> Reboot {
    Reboot {
        cmd: 0x4321_fedc,
        magic1: 0xfee1_dead,
        magic2: 672_274_793,
        verdict: crate::logic::RebootGate::RefusedCap as u32,
        cap_effective: 0x1ff_ffbf_ffff,
        pid_ns_level: 0,
        user_ns_level: 0,
        suppressed: 3,
        flags: reboot_flags::CALLER,
    }
}

#[test]
fn every_kind_round_trips() {
    let records = [
        Record::OomKill(oom()),
        Record::ReclaimStall(stall()),
        Record::KswapdWake(Event {
            header: header(EventKind::KswapdWake),
            data: KswapdWake {
                nid: 1,
                zid: 2,
                order: 3,
                suppressed: 17,
                gfp_flags: 0xcc0,
            },
        }),
        Record::Reboot(Event {
            header: header(EventKind::Reboot),
            data: reboot(),
        }),
        Record::Synthetic(Event {
            header: header(EventKind::Synthetic),
            data: Synthetic { seq: 99 },
        }),
    ];
    for record in records {
        let bytes: Vec<u8> = match &record {
            Record::OomKill(e) => as_bytes(e).to_vec(),
            Record::ReclaimStall(e) => as_bytes(e).to_vec(),
            Record::KswapdWake(e) => as_bytes(e).to_vec(),
            Record::Reboot(e) => as_bytes(e).to_vec(),
            Record::Synthetic(e) => as_bytes(e).to_vec(),
        };
        let kind = EventKind::from_u32(record.header().kind).unwrap();
        assert_eq!(bytes.len(), kind.record_size(), "{kind:?}");
        assert_eq!(decode(&bytes), Ok(record), "{kind:?}");
    }
}

#[test]
fn kind_ids_are_stable_and_unique() {
    let ids: Vec<u32> = EventKind::ALL.iter().map(|k| *k as u32).collect();
    assert_eq!(ids, [1, 2, 3, 4, 100]);
    for kind in EventKind::ALL {
        assert_eq!(EventKind::from_u32(kind as u32), Some(kind));
    }
    let mut slots: Vec<u32> = EventKind::ALL.iter().map(|k| k.slot()).collect();
    slots.dedup();
    assert_eq!(slots.len(), EventKind::ALL.len());
    assert!(
        slots
            .iter()
            .all(|s| (*s as usize) < crate::counters::KIND_SLOTS)
    );
    assert_eq!(EventKind::from_u32(5), None);
    assert_eq!(EventKind::from_u32(0), None);
}

#[test]
fn every_truncation_is_rejected() {
    let e = oom();
    let bytes = as_bytes(&e);
    for len in 0..bytes.len() {
        let err = decode(&bytes[..len]).unwrap_err();
        assert!(
            matches!(err, DecodeError::Short { got, .. } if got == len),
            "len {len}: {err:?}"
        );
    }
}

#[test]
fn unknown_kind_is_rejected() {
    let mut e = stall();
    e.header.kind = 7;
    assert_eq!(
        decode(as_bytes(&e)),
        Err(DecodeError::UnknownKind { kind: 7 })
    );
}

#[test]
fn size_mismatch_is_rejected() {
    // A stall record that claims to be an OOM kill: the sizes disagree.
    let mut e = stall();
    e.header.kind = EventKind::OomKill as u32;
    let err = decode(as_bytes(&e)).unwrap_err();
    assert_eq!(
        err,
        DecodeError::SizeMismatch {
            kind: EventKind::OomKill,
            header_size: EventKind::ReclaimStall.record_size() as u32,
            expected: EventKind::OomKill.record_size(),
        }
    );
}

#[test]
fn out_of_domain_fields_are_rejected() {
    let mut s = stall();
    s.data.flavor = 9;
    assert_eq!(
        decode(as_bytes(&s)),
        Err(DecodeError::InvalidField {
            field: "reclaim_stall.flavor",
            value: 9
        })
    );
    let mut o = oom();
    o.data.trigger_reclaim = 3;
    assert!(matches!(
        decode(as_bytes(&o)),
        Err(DecodeError::InvalidField {
            field: "oom_kill.trigger_reclaim",
            value: 3
        })
    ));
    for (verdict, flags, field) in [
        (0, 0, "reboot.verdict"),
        (8, 0, "reboot.verdict"),
        (1, 2, "reboot.flags"),
    ] {
        let e = Event {
            header: header(EventKind::Reboot),
            data: Reboot {
                verdict,
                flags,
                ..reboot()
            },
        };
        assert_eq!(
            decode(as_bytes(&e)),
            Err(DecodeError::InvalidField {
                field,
                value: if field == "reboot.flags" {
                    flags.into()
                } else {
                    verdict.into()
                }
            })
        );
    }
    let mut o = oom();
    o.data.flags = 1 << 20;
    assert!(matches!(
        decode(as_bytes(&o)),
        Err(DecodeError::InvalidField {
            field: "oom_kill.flags",
            ..
        })
    ));
}

#[test]
fn garbage_never_panics() {
    // A deterministic pseudo-random byte soup of every length up to two records.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = Vec::new();
    for len in 0..2 * EventKind::OomKill.record_size() {
        buf.clear();
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.push(x as u8);
        }
        let _ = decode(&buf);
    }
}

#[test]
fn comm_is_cut_at_nul_and_at_invalid_utf8() {
    assert_eq!(comm_str(b"bash\0\0\0\0\0\0\0\0\0\0\0\0"), "bash");
    assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    assert_eq!(comm_str(b"ab\xffcd\0\0\0\0\0\0\0\0\0\0\0"), "ab");
    assert_eq!(comm_str(&[0; 16]), "");
}
