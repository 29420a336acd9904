//! Jitter for periodic API work, so that agents started together (a DaemonSet rollout, every
//! agent reconnecting after an API server restart) do not keep hitting the API server in the
//! same second, as the kubelet spreads its own periodic calls (`wait.Jitter`).
use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher as _, Hasher as _},
    time::Duration,
};

/// `base` lengthened by a random share of up to `factor` of it: `base × (1 + factor × u)` with `u`
/// uniform in [0, 1).
pub fn jittered(base: Duration, factor: f64) -> Duration {
    jittered_with(base, factor, random_u64())
}

/// [`jittered`] with the random draw given (`r` spread over the whole `u64` range).
pub fn jittered_with(base: Duration, factor: f64, r: u64) -> Duration {
    let u = (r >> 11) as f64 / (1u64 << 53) as f64;
    base.mul_f64(1.0 + factor.clamp(0.0, 1.0) * u)
}

/// A random draw from the standard library's per-process hash keys (enough for spreading
/// timers; not for anything secret).
fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_share_and_spreads() {
        let base = Duration::from_secs(60);
        assert_eq!(jittered_with(base, 0.25, 0), base);
        assert!(jittered_with(base, 0.25, u64::MAX) <= Duration::from_secs(75));
        assert_eq!(
            jittered_with(base, 0.25, u64::MAX / 2).as_secs(),
            67,
            "the middle of the range"
        );
        // Out-of-range factors are clamped: never shorter than the base, never over double.
        assert_eq!(jittered_with(base, -1.0, u64::MAX), base);
        assert!(jittered_with(base, 5.0, u64::MAX) <= Duration::from_secs(120));
        // Draws differ: 64 of them do not all land in the same second.
        let seconds: std::collections::BTreeSet<u64> =
            (0..64).map(|_| jittered(base, 0.25).as_secs()).collect();
        assert!(seconds.len() > 1, "{seconds:?}");
        assert!(seconds.iter().all(|s| (60..75).contains(s)), "{seconds:?}");
    }
}
