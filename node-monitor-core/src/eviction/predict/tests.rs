use super::*;

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;
const CAPACITY: i64 = 2 * GI;

/// `(ms, headroom)` passes.
type Samples = Vec<(u64, i64)>;

/// Feeds `(ms, headroom)` samples and returns the prediction after each.
fn run(policy: PredictionPolicy, exits: &[u64], samples: &[(u64, i64)]) -> Vec<Option<Prediction>> {
    let mut trend = Trend::new();
    for ms in exits {
        trend.note_exit(Duration::from_millis(*ms));
    }
    samples
        .iter()
        .map(|&(ms, h)| {
            trend.observe(Timestamp::from_millis(ms), Some(h), CAPACITY);
            trend.predict(policy)
        })
        .collect()
}

/// A ramp: headroom falling from `from` at `rate` bytes/s, sampled every `every_ms` for `ms`.
fn ramp(start_ms: u64, from: i64, rate: i64, every_ms: u64, ms: u64) -> Vec<(u64, i64)> {
    (0..=ms / every_ms)
        .map(|i| {
            let t = i * every_ms;
            (start_ms + t, from - rate * t as i64 / 1000)
        })
        .collect()
}

/// The first sample (its headroom) after which a prediction was made.
fn first_fired(samples: &[(u64, i64)], predictions: &[Option<Prediction>]) -> Option<i64> {
    samples
        .iter()
        .zip(predictions)
        .find(|(_, p)| p.is_some())
        .map(|((_, h), _)| *h)
}

#[test]
fn a_sustained_fall_is_predicted_within_one_lead_of_the_oom_point_and_not_before() {
    let on = PredictionPolicy::default();
    // (case, exits learnt (ms), samples, fires at a headroom within (low, high])
    type Band = Option<(i64, i64)>;
    let cases: Vec<(&str, Vec<u64>, Samples, Band)> = vec![
        (
            "300 MiB/s from 1.5 GiB, every 100 ms: fires 2 s (600 MiB) above the 64 MiB floor",
            vec![],
            ramp(0, 1536 * MI, 300 * MI, 100, 5000),
            Some((634 * MI, 664 * MI)),
        ),
        (
            "the same ramp after evictions that took 4 s (median): the lead doubles the distance",
            vec![1500, 4000, 4500, 9000, 4000],
            ramp(0, 1536 * MI, 300 * MI, 100, 5000),
            Some((1234 * MI, 1264 * MI)),
        ),
        (
            "an exit longer than MAX_LEAD (5 s) is held at it",
            vec![60_000],
            ramp(0, 4 * GI, 100 * MI, 250, 40_000),
            Some((539 * MI, 564 * MI)),
        ),
        (
            "a slow climb (10 MiB/s): 2 s of it is 20 MiB above the floor",
            vec![],
            ramp(0, 400 * MI, 10 * MI, 200, 40_000),
            Some((64 * MI, 84 * MI)),
        ),
        (
            "1 GiB/s from 3 GiB: not before the fall has lasted MIN_SPAN (1 s)",
            vec![],
            ramp(0, 3 * GI, GI, 100, 2000),
            Some((1900 * MI, 2048 * MI)),
        ),
    ];
    // 300 MiB/s to 700 MiB, then 60 MiB/s: the kernel's reclaim slows the allocator; the
    // prediction keeps the peak and fires at 600 MiB, not at 120.
    let mut slowed = ramp(0, 1500 * MI, 300 * MI, 100, 2700);
    slowed.extend(
        ramp(2700, 690 * MI, 60 * MI, 100, 10_000)
            .into_iter()
            .skip(1),
    );
    let cases = cases.into_iter().chain([(
        "a ramp slowed by reclaim keeps its peak rate",
        vec![],
        slowed,
        Some((634 * MI, 664 * MI)),
    )]);
    for (case, exits, samples, want) in cases {
        let got = first_fired(&samples, &run(on, &exits, &samples));
        match (got, want) {
            (None, None) => {}
            (Some(h), Some((low, high))) => assert!(
                h > low && h <= high,
                "{case}: fired at {} MiB, want ({}, {}] MiB",
                h / MI,
                low / MI,
                high / MI
            ),
            _ => panic!("{case}: fired at {got:?}, want {want:?}"),
        }
    }
}

/// Sawtooth: `cycles` of a fall at `rate` for `fall_ms` from `top`, then everything freed at once.
fn sawtooth(top: i64, rate: i64, fall_ms: u64, cycles: u64) -> Vec<(u64, i64)> {
    (0..cycles)
        .flat_map(|c| ramp(c * (fall_ms + 100), top, rate, 100, fall_ms))
        .collect()
}

#[test]
fn what_is_not_a_sustained_fall_toward_the_oom_point_predicts_nothing() {
    let on = PredictionPolicy::default();
    let flat = |h: i64| (0..50).map(|i| (i * 100, h)).collect::<Vec<_>>();
    let noisy: Vec<(u64, i64)> = (0..50)
        .map(|i| {
            (
                i * 100,
                700 * MI + if i % 2 == 0 { 3 * MI } else { -3 * MI },
            )
        })
        .collect();
    // A 200 ms burst of 2 GiB/s that stops at 900 MiB, then holds.
    let mut burst = ramp(0, 1300 * MI, 2 * GI, 100, 200);
    let stopped = burst[2].1;
    burst.extend((3..40).map(|i| (i * 100, stopped)));
    // A 1 s burst at 300 MiB/s that stops at 1.2 GiB.
    let mut long_burst = ramp(0, 1500 * MI, 300 * MI, 100, 1000);
    long_burst.extend((11..60).map(|i| (i * 100, 1200 * MI)));
    // (case, policy, samples)
    let cases: Vec<(&str, PredictionPolicy, Samples)> = vec![
        (
            "page cache filled by reads: the headroom holds",
            on,
            flat(300 * MI),
        ),
        ("noise of 6 MiB around 700 MiB", on, noisy),
        ("a 200 ms burst that stops at 900 MiB", on, burst),
        (
            "a 1 s burst at 300 MiB/s that stops at 1.2 GiB",
            on,
            long_burst,
        ),
        (
            "a sawtooth of 600 MiB/s for 800 ms from 1.8 GiB, freed each time",
            on,
            sawtooth(1800 * MI, 600 * MI, 800, 10),
        ),
        (
            "predictive eviction off: the fastest ramp predicts nothing",
            PredictionPolicy {
                enabled: false,
                ..on
            },
            ramp(0, 1536 * MI, 1000 * MI, 100, 1500),
        ),
    ];
    for (case, policy, samples) in cases {
        let got = first_fired(&samples, &run(policy, &[], &samples));
        assert_eq!(got, None, "{case}: fired at {:?} MiB", got.map(|h| h / MI));
    }
}

#[test]
fn the_trend_restarts_after_memory_is_freed_or_the_headroom_is_unobserved() {
    let on = PredictionPolicy::default();
    let mut trend = Trend::new();
    let t = Timestamp::from_millis;
    for (ms, h) in ramp(0, 1000 * MI, 500 * MI, 100, 1000) {
        trend.observe(t(ms), Some(h), CAPACITY);
    }
    let rate = trend.rate().expect("a 1 s fall at 500 MiB/s");
    assert!((rate - 500 * MI).abs() < MI, "rate {rate}");
    let p = trend
        .predict(on)
        .expect("500 MiB left at 500 MiB/s, less the floor: 0.9 s");
    assert_eq!(p.exhaustion_ms, 872);
    assert_eq!(p.lead_ms, 2000);
    assert!(
        p.projected(1000 * MI).abs() < MI,
        "2 s at 500 MiB/s from 1000 MiB: {}",
        p.projected(1000 * MI)
    );

    // The same instant again (a second decision on one observation) changes nothing.
    trend.observe(t(1000), Some(2 * GI), CAPACITY);
    assert_eq!(trend.predict(on), Some(p));

    // 300 MiB freed: the trend starts again from the new sample.
    trend.observe(t(1100), Some(800 * MI), CAPACITY);
    assert_eq!(trend.rate(), None);
    // Unobserved: nothing is kept.
    for (ms, h) in ramp(1200, 800 * MI, 500 * MI, 100, 1200) {
        trend.observe(t(ms), Some(h), CAPACITY);
    }
    assert!(trend.rate().is_some());
    trend.observe(t(2500), None, CAPACITY);
    assert_eq!(trend.rate(), None);

    // Nothing seen for longer than the window (a wait for cleanup): no peak from before it.
    for (ms, h) in ramp(3000, 1200 * MI, 500 * MI, 100, 1200) {
        trend.observe(t(ms), Some(h), CAPACITY);
    }
    assert!(trend.rate().is_some());
    trend.observe(t(4200 + 2100), Some(500 * MI), CAPACITY);
    trend.observe(t(4200 + 2200), Some(490 * MI), CAPACITY);
    assert_eq!(trend.rate(), None, "a fall of 100 ms after a gap");

    // An eviction took effect: the fall is forgotten at once.
    for (ms, h) in ramp(7000, 1200 * MI, 500 * MI, 100, 1200) {
        trend.observe(t(ms), Some(h), CAPACITY);
    }
    assert!(trend.predict(on).is_some());
    trend.restart();
    trend.observe(t(8300), Some(550 * MI), CAPACITY);
    trend.observe(t(8400), Some(500 * MI), CAPACITY);
    assert_eq!(trend.predict(on), None);
}

#[test]
fn the_message_states_rate_headroom_estimate_and_lead() {
    let p = Prediction {
        rate_bytes_per_second: 250 * MI,
        headroom_bytes: 300 * MI,
        exhaustion_ms: 1200,
        lead_ms: 2000,
    };
    assert_eq!(
        p.sentence(),
        "Predicted: memory falling at 250 MiB/s would reach the kernel's OOM point (300 MiB \
         left) in 1.2s, within the 2.0s an eviction takes. "
    );
    assert_eq!(rise_tolerance(CAPACITY), 64 * MI);
    assert_eq!(rise_tolerance(64 * MI), 4 * MI);
}
