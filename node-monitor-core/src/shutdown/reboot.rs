//! Reboot requests seen by the kernel probe: the verdict the agent acts on, graceful or bypass,
//! and the rate limits on last gasps and log lines.
use std::{collections::BTreeMap, time::Duration};

use node_monitor_common::logic::{RebootCaller, RebootGate, reboot_gate};

use crate::units::clock::Timestamp;

/// A last gasp is sent at most once in this long: a process that may reboot the node but keeps
/// calling reboot(2) without effect (a kexec with no kernel loaded fails with EINVAL) makes one
/// API write per interval, not one per call.
pub const LAST_GASP_MIN_INTERVAL: Duration = Duration::from_secs(600);
/// Reboot requests that cannot take the node down are logged at most once in this long per
/// verdict; the line says how many went unlogged since the previous one.
pub const REBOOT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// A reboot(2) request from the kernel probe, as the shutdown manager decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebootRequest {
    /// The probe's verdict (see [`effective_gate`]).
    pub gate: RebootGate,
    /// Requests with the same verdict the probe withheld (rate limit) before this one.
    pub suppressed: u32,
}

/// The verdict the agent acts on: the probe's, unless the probe says `allowed` and the reported
/// caller and arguments say otherwise (the agent recomputes it from them; a disagreement means
/// mismatched kernel and agent builds, and never widens what counts as a shutdown).
pub fn effective_gate(
    reported: RebootGate,
    caller: Option<RebootCaller>,
    magic1: u32,
    magic2: u32,
    cmd: u32,
) -> RebootGate {
    match reported {
        RebootGate::Allowed => reboot_gate(caller, magic1, magic2, cmd),
        other => other,
    }
}

/// What the shutdown manager remembers about reboot requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebootRequests {
    /// When the last last gasp went out.
    last_gasp: Option<Timestamp>,
    /// Per verdict: when it was last logged, and requests not logged since.
    logged: BTreeMap<RebootGate, (Timestamp, u64)>,
}

/// What to do about a reboot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebootAction {
    /// Count `n` requests the kernel refuses, under `reason` (`RebootGate::refusal`).
    CountRefused {
        /// Why the kernel refuses them (`RebootGate::refusal`: `capability`, `magic`, …).
        reason: &'static str,
        /// How many: this request and those the probe withheld.
        n: u64,
    },
    /// Count `n` requests whose caller could not be checked.
    CountUnverified {
        /// How many: this request and those the probe withheld.
        n: u64,
    },
    /// Log the request; `unlogged` earlier requests with its verdict went unlogged (rate limit
    /// here or in the probe).
    Log {
        /// The request's verdict.
        gate: RebootGate,
        /// Earlier requests with this verdict not logged.
        unlogged: u64,
    },
    /// The end of a shutdown logind announced.
    Graceful,
    /// A shutdown that went around logind and every inhibitor: count it.
    Bypassed,
    /// Tell the API at once (the configured last gasp).
    LastGasp,
    /// A last gasp was due, but one went out at `previous`, less than
    /// [`LAST_GASP_MIN_INTERVAL`] ago: no API write.
    LastGaspSuppressed {
        /// When the previous last gasp went out.
        previous: Timestamp,
    },
}

impl RebootRequests {
    /// The actions for one request at `now`; `preparing` when logind announced a shutdown not
    /// cancelled since. Only an `allowed` request can become a bypass and a last gasp; refused
    /// and unverified ones are counted and logged at most once per [`REBOOT_LOG_INTERVAL`] per
    /// verdict.
    pub fn on_request(
        &mut self,
        req: RebootRequest,
        preparing: bool,
        now: Timestamp,
    ) -> Vec<RebootAction> {
        let n = 1 + u64::from(req.suppressed);
        let mut out = Vec::new();
        match req.gate {
            RebootGate::Allowed => {
                match classify_reboot(true, preparing) {
                    RebootVerdict::Graceful => out.push(RebootAction::Graceful),
                    _ => {
                        out.push(RebootAction::Bypassed);
                        match self.last_gasp {
                            Some(previous)
                                if now.saturating_since(previous) < LAST_GASP_MIN_INTERVAL =>
                            {
                                out.push(RebootAction::LastGaspSuppressed { previous });
                            }
                            _ => {
                                self.last_gasp = Some(now);
                                out.push(RebootAction::LastGasp);
                            }
                        }
                    }
                }
                return out;
            }
            RebootGate::Unverified => out.push(RebootAction::CountUnverified { n }),
            RebootGate::NotShutdown => {}
            refused => {
                if let Some(reason) = refused.refusal() {
                    out.push(RebootAction::CountRefused { reason, n });
                }
            }
        }
        let pending = match self.logged.get(&req.gate) {
            None => Some(0),
            Some(&(at, pending)) if now.saturating_since(at) >= REBOOT_LOG_INTERVAL => {
                Some(pending)
            }
            Some(_) => None,
        };
        match pending {
            Some(pending) => {
                self.logged.insert(req.gate, (now, 0));
                out.push(RebootAction::Log {
                    gate: req.gate,
                    unlogged: pending + u64::from(req.suppressed),
                });
            }
            None => {
                if let Some(entry) = self.logged.get_mut(&req.gate) {
                    entry.1 += n;
                }
            }
        }
        out
    }
}

/// What a reboot(2) seen by the kernel probe means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootVerdict {
    /// The command does not take the machine down (e.g. enabling Ctrl-Alt-Del).
    NotShutdown,
    /// The end of a shutdown logind announced: graceful.
    Graceful,
    /// A shutdown that went around logind and every inhibitor.
    BypassedInhibitor,
}

/// Classifies a reboot(2) call: `goes_down` from the command, `preparing` when logind announced
/// a shutdown (PrepareForShutdown(true)) not cancelled since.
pub fn classify_reboot(goes_down: bool, preparing: bool) -> RebootVerdict {
    match (goes_down, preparing) {
        (false, _) => RebootVerdict::NotShutdown,
        (true, true) => RebootVerdict::Graceful,
        (true, false) => RebootVerdict::BypassedInhibitor,
    }
}
