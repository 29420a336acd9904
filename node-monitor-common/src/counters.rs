//! Slots of the per-CPU counter array ([`crate::names::COUNTERS_MAP`], one `u64` per slot and
//! CPU). The agent sums the CPUs.

/// Room for per-kind counters (kinds use [`crate::event::EventKind::slot`]).
pub const KIND_SLOTS: usize = 8;

/// Records submitted to the ring buffer, per kind: `EVENTS + kind.slot()`.
pub const EVENTS: u32 = 0;
/// Ring-buffer reservations that failed (the record was lost), per kind: `DROPS + kind.slot()`.
pub const DROPS: u32 = EVENTS + KIND_SLOTS as u32;
/// Kernel reads (`bpf_probe_read_kernel`) that failed; the record was sent with what was read.
pub const READ_ERRORS: u32 = DROPS + KIND_SLOTS as u32;
/// Reclaim episodes (begin/end pairs) accounted, whether or not they crossed the budget.
pub const RECLAIM_EPISODES: u32 = READ_ERRORS + 1;
/// Reclaim ends without a matching begin (the begin was evicted from the in-flight map, or the
/// program attached mid-episode).
pub const RECLAIM_UNMATCHED: u32 = RECLAIM_EPISODES + 1;
/// kswapd wake-ups withheld by the rate limit.
pub const KSWAPD_SUPPRESSED: u32 = RECLAIM_UNMATCHED + 1;
/// Map updates that failed (e.g. a full map).
pub const MAP_ERRORS: u32 = KSWAPD_SUPPRESSED + 1;
/// Reboot requests withheld by the per-verdict rate limit (never `allowed` ones).
pub const REBOOT_SUPPRESSED: u32 = MAP_ERRORS + 1;
/// Memory push wake records withheld by the global rate limit.
pub const MEM_PUSH_SUPPRESSED: u32 = REBOOT_SUPPRESSED + 1;
/// Memory push wake records sent.
pub const MEM_PUSH_WAKES: u32 = MEM_PUSH_SUPPRESSED + 1;
/// Memory push wake records lost because their ring buffer was full.
pub const MEM_PUSH_DROPS: u32 = MEM_PUSH_WAKES + 1;
/// Number of slots.
pub const COUNT: u32 = MEM_PUSH_DROPS + 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_do_not_overlap() {
        let singles = [
            READ_ERRORS,
            RECLAIM_EPISODES,
            RECLAIM_UNMATCHED,
            KSWAPD_SUPPRESSED,
            MAP_ERRORS,
            REBOOT_SUPPRESSED,
            MEM_PUSH_SUPPRESSED,
            MEM_PUSH_WAKES,
            MEM_PUSH_DROPS,
        ];
        assert_eq!(DROPS - EVENTS, KIND_SLOTS as u32);
        assert_eq!(READ_ERRORS - DROPS, KIND_SLOTS as u32);
        for (i, a) in singles.iter().enumerate() {
            assert!(*a >= READ_ERRORS && *a < COUNT);
            for b in &singles[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
