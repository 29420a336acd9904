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

/// The climbers' evictions paired with the ground truth's crossings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reactions {
    /// One per eviction made at a crossing, in order.
    pub at_crossing: Vec<Reaction>,
    /// Evictions made before any crossing, on a prediction (`Predicted:` in their message): no
    /// crossing → eviction time exists for them.
    pub predicted: usize,
    /// Evictions at a crossing the ground truth did not see since the eviction before (its
    /// sampler was not scheduled through the whole dip, or the fall stopped short of its re-arm
    /// level): the agent's own `available:` in the line says where the node stood.
    pub unseen: Vec<String>,
}

impl Reactions {
    /// Every eviction: at a crossing seen or unseen, or predicted.
    pub fn evictions(&self) -> usize {
        self.at_crossing.len() + self.predicted + self.unseen.len()
    }
}

/// Pairs the agent's `evicting` lines for pods whose name starts with `pod_prefix` (in
/// `default`) with the `crossing` lines, in order. An eviction at a crossing pairs with the last
/// crossing since the eviction before it (the climbs run one at a time, so that crossing is its
/// climb's). A predicted eviction pairs with nothing, and a crossing after it (its climber kept
/// climbing while it stopped) is its climb's too. An eviction at a crossing with no crossing since
/// the previous eviction is `unseen`: it has no figure.
pub fn reaction_times(crossings: &str, agent_log: &str, pod_prefix: &str) -> Reactions {
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
    let mut out = Reactions::default();
    let mut since: Option<Timestamp> = None;
    for e in evictions(agent_log, pod_prefix) {
        let previous = since.replace(e.at);
        if e.predicted {
            out.predicted += 1;
            continue;
        }
        let Some(crossing) = crossed
            .iter()
            .rfind(|c| previous.is_none_or(|p| **c > p) && **c <= e.at)
        else {
            out.unseen.push(e.line);
            continue;
        };
        out.at_crossing.push(Reaction {
            ms: e.at.duration_since(*crossing).as_secs_f64() * 1e3,
            source: e.source,
            decision: e.decision,
        });
    }
    out
}

/// One `evicting` line of the agent's.
struct Eviction {
    at: Timestamp,
    source: String,
    decision: String,
    predicted: bool,
    line: String,
}

/// The agent's `evicting` lines for `pod=default/<pod_prefix>…`, in order.
fn evictions(agent_log: &str, pod_prefix: &str) -> Vec<Eviction> {
    let marker = format!("pod=default/{pod_prefix}");
    let lines: Vec<&str> = agent_log.lines().collect();
    let mut out = Vec::new();
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
        out.push(Eviction {
            at,
            source,
            decision,
            predicted: l.contains("Predicted:"),
            line: (*l).to_owned(),
        });
    }
    out
}

/// The threshold and the `memory.available` an `evicting` line's message reports, in bytes
/// (`Threshold quantity: 350Mi, available: 357668Ki.`).
pub fn reported_memory(line: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let rest = &line[line.find(name)? + name.len()..];
        let text = rest.split([',', ' ']).find(|w| !w.is_empty())?;
        let text = text.trim_end_matches('.');
        let (digits, unit) = text.split_at(
            text.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(text.len()),
        );
        let shift = match unit {
            "" => 0,
            "Ki" => 10,
            "Mi" => 20,
            "Gi" => 30,
            _ => return None,
        };
        digits.parse::<u64>().ok()?.checked_shl(shift)
    };
    Some((field("Threshold quantity:")?, field("available:")?))
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
        let r = reaction_times(crossings, log, "climber");
        assert_eq!((r.predicted, r.unseen.len()), (0, 0));
        let r = r.at_crossing;
        assert_eq!(r.len(), 2);
        assert!((r[0].ms - 12.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r[0].source, "memcg_threshold");
        assert!(r[0].decision.contains("decided_us=120"));
        assert!((r[1].ms - 50.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r[1].source, "kernel_memory_growth");
        // An eviction at a crossing with no crossing since the previous eviction: unseen.
        let missed = "crossing 2026-11-29T10:00:00.000Z available_mi=349\n";
        let r = reaction_times(missed, log, "climber");
        assert_eq!(r.at_crossing.len(), 1);
        assert_eq!(r.unseen.len(), 1);
        assert!(r.unseen[0].contains("climber-2"), "{r:?}");
        assert_eq!(r.evictions(), 2);
    }

    #[test]
    fn a_predicted_eviction_pairs_with_no_crossing() {
        // Climb 1 crossed; climb 2 was predicted and crossed while its climber stopped; climb 3
        // crossed. The crossing after the prediction is not climb 3's.
        let crossings = "crossing 2026-11-29T10:00:00.000Z available_mi=349\n\
                         crossing 2026-11-29T10:00:10.300Z available_mi=349\n\
                         crossing 2026-11-29T10:00:20.000Z available_mi=348\n";
        let log = "2026-11-29T10:00:00.020Z INFO x: evicting pod=default/climber wake_source=\"headroom\" Threshold quantity: 350Mi\n\
                   2026-11-29T10:00:10.000Z INFO x: evicting pod=default/climber-2 wake_source=\"kernel_memory_growth\" Threshold quantity: 350Mi, available: 400Mi. Predicted: memory falling at 200Mi/s\n\
                   2026-11-29T10:00:20.040Z INFO x: evicting pod=default/climber-3 wake_source=\"kernel_memory_growth\" Threshold quantity: 350Mi\n";
        let r = reaction_times(crossings, log, "climber");
        assert_eq!(r.predicted, 1);
        assert!(r.unseen.is_empty(), "{r:?}");
        assert_eq!(r.evictions(), 3);
        let ms: Vec<f64> = r.at_crossing.iter().map(|r| r.ms.round()).collect();
        assert_eq!(ms, [20.0, 40.0]);
        // Without climb 3's own crossing, its eviction has none: the truth missed it.
        let missed = "crossing 2026-11-29T10:00:00.000Z available_mi=349\n";
        let r = reaction_times(missed, log, "climber");
        assert_eq!(
            (r.at_crossing.len(), r.predicted, r.unseen.len()),
            (1, 1, 1)
        );
        assert!(r.unseen[0].contains("climber-3"), "{r:?}");
    }

    #[test]
    fn the_reported_threshold_and_available() {
        let line = "2026-11-29T15:34:23.009039Z  INFO x: evicting pod=default/climber-5 signal=memory.available \
                    The node was low on resource: memory. Threshold quantity: 350Mi, available: 357668Ki.  dry_run=false";
        assert_eq!(reported_memory(line), Some((350 << 20, 357_668 << 10)));
        assert_eq!(reported_memory("evicting pod=default/x"), None);
        assert_eq!(
            reported_memory("Threshold quantity: 350Mi, available: 12Xi."),
            None
        );
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
