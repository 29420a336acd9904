//! The vocabulary of the `nodeMonitor.shutdown` section that the configuration model reads: its
//! keys and its enumerations. The model owns them; `crate::shutdown` validates and uses them.
use serde::Serialize;

/// What node-monitor does when the kubelet holds a shutdown inhibitor of its own
/// (`nodeMonitor.shutdown.kubeletInhibitorPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum KubeletInhibitorPolicy {
    /// Terminate the pods through the API anyway, with node-monitor's plan.
    TakeOver,
    /// Hold a lock and mark the node, but leave terminating the pods to the kubelet; wait for
    /// the API to show them finished before releasing.
    #[default]
    Cooperate,
    /// Take no lock and mark nothing; only watch (bypass detection still works).
    StandAside,
}

impl KubeletInhibitorPolicy {
    /// Every policy with its configuration spelling.
    pub const ALL: [(&'static str, KubeletInhibitorPolicy); 3] = [
        ("takeOver", KubeletInhibitorPolicy::TakeOver),
        ("cooperate", KubeletInhibitorPolicy::Cooperate),
        ("standAside", KubeletInhibitorPolicy::StandAside),
    ];
}

/// What to tell the API when a reboot or power-off bypassed the inhibitor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LastGasp {
    /// Nothing: log and count only.
    None,
    /// Set the `NodeMonitorShuttingDown` condition to True with reason `NonGracefulShutdown`.
    #[default]
    Condition,
    /// Set the `node-monitor.io/last-gasp` annotation on the node.
    Annotation,
}

/// The keys accepted under `nodeMonitor.shutdown`; any other key is rejected with this list.
pub const SHUTDOWN_OPTION_KEYS: [&str; 8] = [
    "enabled",
    "manageInhibitDelay",
    "inhibitDelayMargin",
    "kubeletInhibitorPolicy",
    "cordon",
    "lastGasp",
    "lastGaspTimeout",
    "pollInterval",
];

/// The keys of one `shutdownGracePeriodByPodPriority` entry; any other key is rejected.
pub const PRIORITY_ENTRY_KEYS: [&str; 2] = ["priority", "shutdownGracePeriodSeconds"];
