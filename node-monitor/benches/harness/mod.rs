//! The timing harness the benchmarks share (no extra dependencies): a warm-up, then samples of
//! repeated calls, reported as per-call percentiles.
use std::time::{Duration, Instant};

/// Per-call times over the samples of one measurement.
pub struct Stats {
    pub min: Duration,
    pub median: Duration,
    pub p95: Duration,
    pub p99: Duration,
}

/// Times `f`: warm-up for 300 ms, then `samples` samples of `per_sample` calls each.
pub fn measure(mut f: impl FnMut(), per_sample: u32, samples: usize) -> Stats {
    let warmup = Instant::now();
    while warmup.elapsed() < Duration::from_millis(300) {
        f();
    }
    let mut times: Vec<Duration> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_sample {
                f();
            }
            start.elapsed() / per_sample
        })
        .collect();
    times.sort();
    Stats {
        min: times[0],
        median: times[times.len() / 2],
        p95: times[times.len() * 95 / 100],
        p99: times[times.len() * 99 / 100],
    }
}
