//! The eviction pass with predictive eviction: a ramp at the kubelet's default threshold.
use super::*;
use crate::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    eviction::rank::tests::{mem, pod},
};

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn config(yaml: &str) -> EvictionConfig {
    load_sources(
        &[ConfigSource {
            name: "test",
            text: yaml,
        }],
        &EvictionOverrides::default(),
    )
    .expect("config")
}

/// A 2 GiB node: `memory.available` and the kernel's headroom (100 MiB less: the kernel's
/// own memory and watermarks), the ramping pod using what the node lost.
fn node(available: i64, headroom: Option<i64>) -> Observations {
    let used = u64::try_from(1800 * MI - available).unwrap_or(0);
    Observations {
        signals: [(
            Signal::MemoryAvailable,
            SignalObservation {
                available,
                capacity: 2 * GI,
            },
        )]
        .into_iter()
        .collect(),
        pods: [mem("ramp", used), mem("quiet", (50 * MI) as u64)]
            .into_iter()
            .collect(),
        kernel_headroom: headroom,
        ..Default::default()
    }
}

/// Every 100 ms, the node loses `rate` MiB/s from 1.8 GiB available; the first pass (its
/// `memory.available` in MiB) that evicts, and that pass's decision.
fn first_eviction(c: &EvictionConfig, rate: i64, cache_only: bool) -> Option<(i64, Decision)> {
    let pods = [pod("ramp", 0, ""), pod("quiet", 0, "")];
    let mut s = EvictionState::new();
    for step in 0..1000u64 {
        let available = 1800 * MI - rate * MI * step as i64 / 10;
        // Page cache filled by reads: the kernel can reclaim it, its headroom holds.
        let headroom = if cache_only {
            1700 * MI
        } else {
            available - 100 * MI
        };
        let d = synchronize(
            &mut s,
            c,
            &node(available, Some(headroom)),
            &pods,
            Timestamp::from_millis(step * 100),
        );
        if !d.evict.is_empty() {
            return Some((available / MI, d));
        }
    }
    None
}

#[test]
fn at_the_kubelets_default_a_fast_ramp_is_evicted_one_lead_before_the_oom_point() {
    let shipped = config("");
    // 250 MiB/s, 2 s lead: predicted once the headroom is at most 500 MiB above the 64 MiB
    // floor (available 664 MiB).
    let (at, d) = first_eviction(&shipped, 250, false).expect("a predicted eviction");
    assert!((639..=664).contains(&at), "evicted at {at} MiB available");
    // A slow climb too: 20 MiB/s is 40 MiB in a lead, above the floor: 204 MiB available.
    let (slow, _) = first_eviction(&shipped, 20, false).expect("a predicted slow climb");
    assert!(
        (200..=204).contains(&slow),
        "slow climb evicted at {slow} MiB"
    );
    let t = &d.thresholds_met[0];
    assert_eq!(
        (t.signal, t.reason, t.hard, t.quantity),
        (
            Signal::MemoryAvailable,
            MetReason::Predicted,
            true,
            100 * MI
        )
    );
    let p = d.prediction.expect("the prediction is reported");
    assert!((p.rate_bytes_per_second - 250 * MI).abs() < MI, "{p:?}");
    assert_eq!(p.lead_ms, 2000);
    assert!(p.exhaustion_ms <= 2000, "{p:?}");
    // The kubelet's ranking chooses the victim; its Event says it was predicted.
    assert_eq!(d.evict[0].name, "ramp");
    assert_eq!(d.evict[0].grace_period_seconds, 1);
    assert!(
        d.evict[0]
            .message
            .starts_with("The node was low on resource: memory. Threshold quantity: 100Mi")
    );
    assert!(
        d.evict[0]
            .message
            .contains("Predicted: memory falling at 2")
    );
    assert!(d.evict[0].annotations[PREDICTED_KEY].starts_with("rate="));
    // Sized for memory.available one lead from now: 2 s at 250 MiB/s below what is observed.
    let r = d.reclaim.clone().expect("reclaim");
    assert!((r.available - (at * MI - 500 * MI)).abs() < 2 * MI, "{r:?}");
    let published = conditions::published_conditions(&d);
    let memory = published
        .iter()
        .find(|c| c.type_ == "NodeMonitorMemoryPressure")
        .expect("the memory condition");
    assert!(
        memory.status && memory.message.contains("predicted to run out of memory"),
        "{memory:?}"
    );
    // The node was within one eviction of the OOM killer: memory pressure, as at a crossing.
    assert!(
        d.conditions
            .iter()
            .any(|c| c.condition == NodeConditionType::MemoryPressure && c.status),
        "{:?}",
        d.conditions
    );
}

#[test]
fn without_a_sustained_fall_of_the_headroom_only_the_threshold_evicts() {
    // (case, configuration, rate MiB/s, cache only, evicted at or below MiB available)
    let cases = [
        (
            "predictive eviction off",
            "nodeMonitor:\n  predictiveEviction: false\n",
            250,
            false,
            100,
        ),
        ("page cache from reads", "", 250, true, 100),
    ];
    for (case, yaml, rate, cache_only, at_most) in cases {
        let (at, d) = first_eviction(&config(yaml), rate, cache_only).expect(case);
        assert!(at <= at_most, "{case}: evicted at {at} MiB available");
        if at < 100 {
            assert_eq!(
                d.thresholds_met[0].reason,
                MetReason::BelowThreshold,
                "{case}"
            );
            assert!(d.prediction.is_none(), "{case}");
            assert!(!d.evict[0].message.contains("Predicted"), "{case}");
        }
    }
}

#[test]
fn the_lead_follows_the_recent_evictions() {
    let shipped = config("");
    let pods = [pod("ramp", 0, ""), pod("quiet", 0, "")];
    let mut s = EvictionState::new();
    s.note_eviction(Some(Duration::from_millis(3500)));
    let mut evicted = None;
    for step in 0..200u64 {
        let available = 1800 * MI - 250 * MI * step as i64 / 10;
        let obs = node(available, Some(available - 100 * MI));
        let d = synchronize(
            &mut s,
            &shipped,
            &obs,
            &pods,
            Timestamp::from_millis(step * 100),
        );
        if let Some(p) = d.prediction {
            evicted = Some((available / MI, p.lead_ms));
            break;
        }
    }
    let (at, lead) = evicted.expect("predicted");
    assert_eq!(lead, 3500);
    // 3.5 s at 250 MiB/s: 875 MiB above the 64 MiB floor, 1039 MiB available.
    assert!((1014..=1039).contains(&at), "evicted at {at} MiB available");
}

/// A pod fills the node at 300 MiB/s and another is evicted for it; while the first finishes its
/// allocation the victim's memory comes back, so the headroom seen after the wait for cleanup
/// is barely above the last one before it. The fall measured before the eviction (its peak, its
/// start) must not predict a second eviction: the next one needs a fall of its own, observed from
/// the eviction on, and a plateau needs none.
#[test]
fn an_eviction_ends_the_fall_it_answered() {
    let shipped = config("");
    let pods = [pod("ramp", 0, ""), pod("quiet", 0, "")];
    // (case, the eviction recorded, samples after the wait (ms after it, MiB of
    //  `memory.available` from the last pass before it), predicts again)
    type Case = (&'static str, bool, Vec<(u64, i64)>, bool);
    // The allocation's tail outran the victim's exit by 28 MiB, then the node holds.
    let plateau: Vec<(u64, i64)> = (0..30)
        .map(|i| (i * 100, -10 - 6 * i.min(3) as i64))
        .collect();
    let still_falling: Vec<(u64, i64)> = (0..40).map(|i| (i * 100, -10 - 30 * i as i64)).collect();
    let cases: Vec<Case> = vec![
        (
            "the eviction recorded: the tail of the allocation, then a plateau",
            true,
            plateau.clone(),
            false,
        ),
        (
            "no eviction recorded: the fall from before the 1.5 s gap still counts",
            false,
            plateau,
            true,
        ),
        (
            "the eviction recorded: a fall that goes on at 300 MiB/s counts again",
            true,
            still_falling,
            true,
        ),
    ];
    for (case, recorded, after, predicts_again) in cases {
        let mut s = EvictionState::new();
        let mut step = 0u64;
        // The fall, until the first prediction.
        loop {
            let available = 1800 * MI - 300 * MI * step as i64 / 10;
            let d = synchronize(
                &mut s,
                &shipped,
                &node(available, Some(available - 100 * MI)),
                &pods,
                Timestamp::from_millis(step * 100),
            );
            if d.prediction.is_some() {
                break;
            }
            step += 1;
            assert!(step < 100, "{case}: the fall was never predicted");
        }
        let evicted_at = step * 100;
        let last = (1800 * MI - 300 * MI * step as i64 / 10) / MI;
        if recorded {
            s.note_eviction(Some(Duration::from_millis(1500)));
        }
        // The wait for cleanup took 1.5 s; sampling resumes.
        let again = after.iter().any(|&(ms, delta)| {
            let available = last + delta;
            let d = synchronize(
                &mut s,
                &shipped,
                &node(available * MI, Some((available - 100) * MI)),
                &pods,
                Timestamp::from_millis(evicted_at + 1500 + ms),
            );
            d.prediction.is_some()
        });
        assert_eq!(again, predicts_again, "{case}");
    }
}
