//! Reaction times read from a guest's files: the ground truth's `crossing <time>` lines
//! (`bench-v2-crossing truth`) paired with the agent's `evicting` log lines, both on the guest's
//! clock.
use k8s_openapi::jiff::Timestamp;

/// One climber's reaction: crossing → the agent's `evicting` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Reaction {
    /// Milliseconds from the ground truth's crossing to the `evicting` line.
    pub ms: f64,
    /// The wake-up source the agent logged (`wake_source=`).
    pub source: String,
    /// The agent's `decision` line before the `evicting` line (wake-up → decision, time queued
    /// behind the previous cycle, the pass itself), empty when there is none.
    pub decision: String,
}

/// Pairs the `crossing` lines with the agent's `evicting` lines for pods whose name starts with
/// `pod_prefix` (in `default`), in order. `None` when the counts differ: a crossing without an
/// eviction or the other way round, which makes every pairing after it wrong.
pub fn reaction_times(crossings: &str, agent_log: &str, pod_prefix: &str) -> Option<Vec<Reaction>> {
    let crossed: Vec<Timestamp> = crossings
        .lines()
        .filter_map(|l| {
            l.strip_prefix("crossing ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let marker = format!("pod=default/{pod_prefix}");
    let lines: Vec<&str> = agent_log.lines().collect();
    let mut evictions: Vec<(Timestamp, String, String)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !(l.contains("evicting") && l.contains(&marker)) {
            continue;
        }
        let Some(at) = l
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        let source = l
            .split_whitespace()
            .find_map(|f| f.strip_prefix("wake_source="))
            .unwrap_or("-")
            .trim_matches('"')
            .to_owned();
        let decision = lines[..i]
            .iter()
            .rev()
            .find(|d| d.contains("decided_us="))
            .map_or_else(String::new, |d| (*d).to_owned());
        evictions.push((at, source, decision));
    }
    if crossed.len() != evictions.len() {
        return None;
    }
    Some(
        crossed
            .iter()
            .zip(evictions)
            .map(|(c, (e, source, decision))| Reaction {
                ms: e.duration_since(*c).as_secs_f64() * 1e3,
                source,
                decision,
            })
            .collect(),
    )
}

/// The `p`-th percentile (0–100) of `sorted` (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossings_pair_with_evictions_in_order() {
        let crossings = "crossing 2026-11-29T10:00:00.000Z available_mi=349\n\
                         crossing 2026-11-29T10:00:10.000Z available_mi=348\n";
        let log = "2026-11-29T10:00:00.010Z DEBUG x: decision decided_us=120 queued_us=5\n\
                   2026-11-29T10:00:00.012Z INFO x: evicting pod=default/climber-1 wake_source=\"memcg_threshold\"\n\
                   2026-11-29T10:00:05.000Z INFO x: evicting pod=default/other wake_source=\"psi\"\n\
                   2026-11-29T10:00:10.050Z INFO x: evicting pod=default/climber-2 wake_source=\"kernel_memory_growth\"\n";
        let r = reaction_times(crossings, log, "climber").expect("paired");
        assert_eq!(r.len(), 2);
        assert!((r[0].ms - 12.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r[0].source, "memcg_threshold");
        assert!(r[0].decision.contains("decided_us=120"));
        assert!((r[1].ms - 50.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r[1].source, "kernel_memory_growth");
        // A crossing with no eviction: no pairing at all.
        let extra = format!("{crossings}crossing 2026-11-29T10:00:20.000Z available_mi=340\n");
        assert_eq!(reaction_times(&extra, log, "climber"), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 99.0), 10.0);
        assert_eq!(percentile(&v[..1], 50.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
