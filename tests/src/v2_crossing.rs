//! What `bench-v2-crossing` must find in its guest before its figures mean anything: facts about
//! cgroup v2's notifications and about `memory.available` on a v2 root, read from the lines the
//! guest prints (`available …`, `result …`, `push …`). The benchmark fails when one does not hold.
//!
//! - the agent's figure on the v2 root is the kubelet's (`MemTotal − (anon + file −
//!   inactive_file)` of the root's `memory.stat`), unmoved by 128 MiB of page cache and moved by
//!   256 MiB of anonymous memory by about 256 MiB;
//! - without a throttle, neither a PSI trigger nor `memory.low` reports a crossing that reclaim
//!   does not accompany; the sampling thread sees every one;
//! - the memory push, driven as the agent drives it, sends records in every climb, its reader
//!   sees every crossing, and a push record prompted the read that saw at least one;
//! - `memory.high` at the crossing level reports it (`memory.events` `high`), and throttles: the
//!   working set stays at the level, where without it the climb goes on.
use std::collections::BTreeMap;

/// `key=value` fields of the result lines starting with `prefix`.
fn fields<'a>(results: &'a str, prefix: &str) -> Vec<BTreeMap<&'a str, &'a str>> {
    results
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect()
        })
        .collect()
}

fn num(row: &BTreeMap<&str, &str>, key: &str) -> Result<i64, String> {
    row.get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{key} is not a number in {row:?}"))
}

fn field<'a>(row: &BTreeMap<&'a str, &'a str>, key: &str) -> Result<&'a str, String> {
    row.get(key)
        .copied()
        .ok_or_else(|| format!("no {key} in {row:?}"))
}

/// Checks the guest's results of `runs` climbs per trial and a node cgroup whose crossing level
/// is `level_mi` (capacity − threshold).
pub fn check(results: &str, runs: usize, level_mi: i64) -> Result<(), String> {
    check_available(results)?;
    let rows = fields(results, "result ");
    let trial = |t: &str| -> Vec<&BTreeMap<&str, &str>> {
        rows.iter().filter(|r| r.get("trial") == Some(&t)).collect()
    };
    let (observe, high) = (trial("Observe"), trial("High"));
    if (observe.len(), high.len()) != (runs, runs) {
        return Err(format!(
            "{} Observe and {} High climbs, expected {runs} each",
            observe.len(),
            high.len()
        ));
    }
    for r in &observe {
        if field(r, "sampling_ms")? == "-" {
            return Err(format!("sampling missed a crossing: {r:?}"));
        }
        if field(r, "low_ms")? != "-" {
            return Err(format!("memory.low reported a crossing: {r:?}"));
        }
        if field(r, "psi_ms")? != "-" {
            return Err(format!("PSI fired without a throttle: {r:?}"));
        }
        if num(r, "ws_plus_1s_mi")? <= level_mi {
            return Err(format!("the climb stopped: {r:?}"));
        }
    }
    let push: Vec<_> = fields(results, "push ")
        .into_iter()
        .filter(|r| r.get("trial") == Some(&"Observe"))
        .collect();
    if push.len() != runs {
        return Err(format!("{} push lines, expected {runs}", push.len()));
    }
    for r in &push {
        if field(r, "push_ms")? == "-" {
            return Err(format!("the push's reader missed a crossing: {r:?}"));
        }
        if num(r, "push_records")? < 1 {
            return Err(format!("no push record in a climb: {r:?}"));
        }
    }
    if !push.iter().any(|r| r.get("push_by") == Some(&"push")) {
        return Err(format!(
            "no crossing read was prompted by a push record: {push:?}"
        ));
    }
    for r in &high {
        if field(r, "high_ms")? == "-" {
            return Err(format!("memory.high did not report: {r:?}"));
        }
        if num(r, "ws_plus_1s_mi")? > level_mi + 16 {
            return Err(format!(
                "memory.high did not hold the working set at {level_mi} MiB: {r:?}"
            ));
        }
    }
    Ok(())
}

/// `memory.available` on the v2 root: the agent's figure against the kubelet's formula, and what
/// page cache and anonymous memory do to it.
fn check_available(results: &str) -> Result<(), String> {
    let avail = fields(results, "available ");
    if avail.len() != 3 {
        return Err(format!("{} available lines, expected 3", avail.len()));
    }
    for row in &avail {
        // The agent's sample and the formula's `memory.stat` are two reads, a moment apart, each
        // rounded to MiB: the guest's own activity can move the root by a MiB or so.
        let apart = (num(row, "agent_mi")? - num(row, "kubelet_mi")?).abs();
        if apart > 2 {
            return Err(format!(
                "the agent's memory.available is {apart} MiB from the kubelet's formula: {row:?}"
            ));
        }
    }
    let cache_moved = (num(&avail[1], "agent_mi")? - num(&avail[0], "agent_mi")?).abs();
    if cache_moved > 8 {
        return Err(format!(
            "page cache moved available by {cache_moved} MiB: {avail:?}"
        ));
    }
    let anon_moved = num(&avail[1], "agent_mi")? - num(&avail[2], "agent_mi")?;
    if !(240..=272).contains(&anon_moved) {
        return Err(format!(
            "256 MiB of anon moved available by {anon_moved} MiB: {avail:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's output (kernel 6.1 under TCG, two climbs per trial).
    const GOOD: &str = "\
available label=rest MemTotal_mi=958 kubelet_mi=926 agent_mi=926
available label=cache+128Mi MemTotal_mi=958 kubelet_mi=924 agent_mi=924
available label=cache+128Mi,anon+256Mi MemTotal_mi=958 kubelet_mi=667 agent_mi=667
push trial=Observe run=0 push_ms=6.7 push_by=push push_records=32
result trial=Observe run=0 sampling_ms=33.2 psi_ms=- low_ms=- high_ms=- ws_plus_1s_mi=417
push trial=Observe run=1 push_ms=7.4 push_by=look push_records=33
result trial=Observe run=1 sampling_ms=31.1 psi_ms=- low_ms=- high_ms=- ws_plus_1s_mi=416
result trial=High run=0 sampling_ms=12.4 psi_ms=120.3 low_ms=- high_ms=1.4 ws_plus_1s_mi=359
result trial=High run=1 sampling_ms=13.4 psi_ms=176.6 low_ms=- high_ms=0.1 ws_plus_1s_mi=358
";

    #[test]
    fn the_facts_hold_in_a_good_run() {
        assert_eq!(check(GOOD, 2, 352), Ok(()));
    }

    #[test]
    fn each_fact_that_does_not_hold_is_named() {
        let cases = [
            (
                "agent_mi=926\n",
                "agent_mi=930\n",
                "from the kubelet's formula",
            ),
            (
                "kubelet_mi=667 agent_mi=667",
                "kubelet_mi=800 agent_mi=800",
                "256 MiB of anon",
            ),
            (
                "psi_ms=- low_ms=- high_ms=- ws_plus_1s_mi=417",
                "psi_ms=80 low_ms=- high_ms=- ws_plus_1s_mi=417",
                "PSI fired",
            ),
            (
                "psi_ms=- low_ms=- high_ms=- ws_plus_1s_mi=416",
                "psi_ms=- low_ms=3 high_ms=- ws_plus_1s_mi=416",
                "memory.low",
            ),
            ("sampling_ms=33.2", "sampling_ms=-", "sampling missed"),
            (
                "push_ms=6.7 push_by=push",
                "push_ms=6.7 push_by=look",
                "prompted by a push record",
            ),
            ("push_ms=7.4", "push_ms=-", "missed a crossing"),
            (
                "high_ms=0.1 ws_plus_1s_mi=358",
                "high_ms=- ws_plus_1s_mi=358",
                "memory.high did not report",
            ),
            (
                "high_ms=1.4 ws_plus_1s_mi=359",
                "high_ms=1.4 ws_plus_1s_mi=420",
                "did not hold",
            ),
        ];
        for (from, to, named) in cases {
            assert!(GOOD.contains(from), "{from}");
            let bad = GOOD.replacen(from, to, 1);
            let err = check(&bad, 2, 352).expect_err(named);
            assert!(err.contains(named), "{named}: {err}");
        }
        let err = check(GOOD, 3, 352).expect_err("three runs expected");
        assert!(err.contains("expected 3"), "{err}");
    }
}
