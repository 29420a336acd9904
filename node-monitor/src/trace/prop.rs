use node_monitor_common::event::{DecodeError, EventHeader, EventKind, oom_flags, reboot_flags};
use proptest::{collection::vec, prelude::*, sample::select};

use crate::attribution::Attribution;
use crate::ebpf::event::*;

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
