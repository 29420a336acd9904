//! Rate limiting: one token bucket per zone, at the rate its state allows.
use std::collections::BTreeMap;

use super::{Assessment, ZoneKey};
use crate::units::clock::Timestamp;

/// `scheduler.EvictionRateLimiterBurst`: the node lifecycle controller's buckets hold one token.
pub const FENCE_RATE_BURST: u32 = 1;

/// A token bucket (client-go's `flowcontrol.NewTokenBucketRateLimiter`): `qps` tokens a second,
/// at most `burst`, full when made. A rate of 0 never gives a token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Timestamp,
}

impl TokenBucket {
    /// A full bucket of `qps` tokens a second holding at most `burst` (at least 1).
    pub fn new(qps: f64, burst: u32, now: Timestamp) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: if qps > 0.0 { burst } else { 0.0 },
            last: now,
        }
    }

    /// The bucket's rate, in tokens a second.
    pub fn qps(&self) -> f64 {
        self.qps
    }

    fn refill(&mut self, now: Timestamp) {
        if now > self.last {
            if self.qps > 0.0 {
                let elapsed = now.saturating_since(self.last).as_secs_f64();
                self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
            }
            self.last = now;
        }
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Timestamp) -> bool {
        self.refill(now);
        if self.qps > 0.0 && self.tokens >= 1.0 - TOKEN_EPSILON {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// Changes the rate (`RateLimitedTimedQueue.SwapLimiter`): a new bucket, drained by one
    /// token when the old one had none, so a state change never hands out a free token.
    pub fn swap_qps(&mut self, qps: f64, now: Timestamp) {
        // The same configured value, compared exactly as SwapLimiter does.
        if qps.to_bits() == self.qps.to_bits() {
            return;
        }
        self.refill(now);
        let had_token = self.qps > 0.0 && self.tokens >= 1.0 - TOKEN_EPSILON;
        let burst = self.burst;
        *self = TokenBucket {
            qps,
            burst,
            tokens: if qps > 0.0 { burst } else { 0.0 },
            last: now,
        };
        if qps > 0.0 && !had_token {
            self.tokens -= 1.0;
        }
    }
}

/// Rounding slack: 0.1 × 10 s must make a whole token.
const TOKEN_EPSILON: f64 = 1e-9;

/// One token bucket per zone, following the zones' rates.
#[derive(Debug, Clone, Default)]
pub struct ZoneLimiters {
    buckets: BTreeMap<ZoneKey, TokenBucket>,
}

impl ZoneLimiters {
    /// Follows the assessment: a bucket for each zone at its rate (changed rates swapped as
    /// [`TokenBucket::swap_qps`] does), none for zones that are gone.
    pub fn update(&mut self, assessment: &Assessment, now: Timestamp) {
        self.buckets.retain(|z, _| assessment.zones.contains_key(z));
        for (zone, status) in &assessment.zones {
            match self.buckets.get_mut(zone) {
                Some(b) => b.swap_qps(status.rate, now),
                None => {
                    self.buckets.insert(
                        zone.clone(),
                        TokenBucket::new(status.rate, FENCE_RATE_BURST, now),
                    );
                }
            }
        }
    }

    /// Takes a token from `zone`'s bucket if it has one; a zone without a bucket has none.
    pub fn try_take(&mut self, zone: &ZoneKey, now: Timestamp) -> bool {
        self.buckets.get_mut(zone).is_some_and(|b| b.try_take(now))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::remediation::{test_support::*, *};

    #[test]
    fn token_bucket_refills_at_qps_with_burst_one() {
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        // (seconds, expected take)
        let steps = [
            (0, true),
            (0, false),
            (5, false),
            (10, true),
            (19, false),
            (20, true),
        ];
        for (s, want) in steps {
            assert_eq!(b.try_take(Timestamp::from_secs(s)), want, "at {s}s");
        }
        let mut never = TokenBucket::new(0.0, 1, Timestamp::ZERO);
        assert!(!never.try_take(Timestamp::from_secs(1_000)));
    }

    #[test]
    fn swapping_the_rate_never_hands_out_a_free_token() {
        // Old bucket drained: the new one starts drained too.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        assert!(b.try_take(Timestamp::ZERO));
        b.swap_qps(1.0, Timestamp::from_secs(1));
        assert!(!b.try_take(Timestamp::from_secs(1)));
        assert!(b.try_take(Timestamp::from_secs(2)));
        // Old bucket with a token: the new one is full.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        b.swap_qps(0.5, Timestamp::from_secs(1));
        assert!(b.try_take(Timestamp::from_secs(1)));
        // To zero and back.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        b.swap_qps(0.0, Timestamp::from_secs(1));
        assert!(!b.try_take(Timestamp::from_secs(100)));
        b.swap_qps(0.1, Timestamp::from_secs(100));
        assert!(
            !b.try_take(Timestamp::from_secs(100)),
            "drained on the way back"
        );
        assert!(b.try_take(Timestamp::from_secs(110)));
    }

    #[test]
    fn zone_limiters_follow_the_assessment() {
        let cfg = storm();
        let mut l = ZoneLimiters::default();
        let healthy = assess(
            vec![(z("a"), false), (z("a"), true), (z("b"), false)],
            Duration::ZERO,
            &cfg,
        );
        l.update(&healthy, Timestamp::ZERO);
        assert!(l.try_take(&z("a"), Timestamp::ZERO));
        assert!(
            !l.try_take(&z("a"), Timestamp::from_secs(1)),
            "one node per 10 s"
        );
        assert!(
            l.try_take(&z("b"), Timestamp::from_secs(1)),
            "zones are independent"
        );
        assert!(!l.try_take(&z("unknown"), Timestamp::from_secs(1)));
    }
}
