//! What holds on this node: which of the agent's guarantees the node lets it keep, and why not
//! where one does not. Pure: the agent gathers the facts (its kernel probes, its wake-up
//! sources, the kubelet's configuration), [`assess`] judges them, and the verdicts go to the
//! node's [`crate::contract::names::GUARANTEES_ANNOTATION`] ([`encode`]), to `node_monitor_guarantee` and
//! to the `status` answer. `kubectl node-monitor status` reads the annotations of every node
//! back ([`decode`]) and sums them up ([`fleet_summary`]).
use std::collections::BTreeMap;

/// A guarantee the agent keeps where the node lets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Guarantee {
    /// A reboot or power-off that bypasses logind's inhibitor is seen (the reboot probe, or its
    /// fallback, attached with its caller checks), and sends the last gasp.
    RebootProbe,
    /// The kernel's BTF lets the probes' CO-RE reads relocate: the OOM victim's own cgroup, the
    /// reboot caller's namespaces and capabilities.
    CoreReads,
    /// cgroup v1 memory thresholds wake the agent as `memory.available` crosses one.
    MemcgThresholds,
    /// A PSI trigger wakes the agent when memory stalls.
    PsiTrigger,
    /// The eBPF memory push wakes the agent as memory grows near a threshold (cgroup v2).
    MemoryPush,
    /// The kubelet's own eviction thresholds are read, so the agent can tell which signals the
    /// kubelet acts on first.
    KubeletConfig,
}

impl Guarantee {
    /// Every guarantee, in the order the summary names them.
    pub const ALL: [Self; 6] = [
        Self::RebootProbe,
        Self::CoreReads,
        Self::MemcgThresholds,
        Self::PsiTrigger,
        Self::MemoryPush,
        Self::KubeletConfig,
    ];

    /// The key in the annotation and the metric's label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RebootProbe => "reboot-probe",
            Self::CoreReads => "core-reads",
            Self::MemcgThresholds => "memcg-thresholds",
            Self::PsiTrigger => "psi-trigger",
            Self::MemoryPush => "memory-push",
            Self::KubeletConfig => "kubelet-config",
        }
    }

    /// The guarantee named `key` ([`Self::as_str`]).
    pub fn parse(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == key)
    }

    /// What the nodes where it does not hold cannot do, for the fleet summary.
    pub const fn without(self) -> &'static str {
        match self {
            Self::RebootProbe => "cannot see a reboot that bypasses the inhibitor (no last gasp)",
            Self::CoreReads => {
                "cannot read kernel structs (OOM kills without the victim's cgroup, reboot callers \
                 unverified)"
            }
            Self::MemcgThresholds => "get no wake-up from cgroup v1 memory thresholds",
            Self::PsiTrigger => "get no wake-up from a PSI trigger",
            Self::MemoryPush => "get no memory push near a memory threshold",
            Self::KubeletConfig => "cannot tell which signals the kubelet acts on first",
        }
    }
}

/// Whether a guarantee holds on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// It holds.
    Yes,
    /// It should and does not: why.
    No(String),
    /// The node cannot have it, and needs it not (a cgroup v1 interface on a v2 node).
    NotApplicable(String),
}

/// The longest reason kept in the annotation, in bytes.
pub const MAX_REASON_BYTES: usize = 200;
/// The largest annotation [`decode`] reads.
pub const MAX_ANNOTATION_BYTES: usize = 8 << 10;

impl Holds {
    /// The metric's `holds` label.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Yes => "yes",
            Self::No(_) => "no",
            Self::NotApplicable(_) => "not_applicable",
        }
    }

    /// The annotation's value: `yes`, `no: <why>` or `n/a: <why>`, the reason cut at
    /// [`MAX_REASON_BYTES`].
    pub fn encode(&self) -> String {
        match self {
            Self::Yes => "yes".to_owned(),
            Self::No(why) => format!("no: {}", bounded(why)),
            Self::NotApplicable(why) => format!("n/a: {}", bounded(why)),
        }
    }

    /// Reads an annotation value back; anything else is `None`.
    pub fn decode(value: &str) -> Option<Self> {
        if value == "yes" {
            return Some(Self::Yes);
        }
        if let Some(why) = value.strip_prefix("no: ") {
            return Some(Self::No(bounded(why).to_owned()));
        }
        value
            .strip_prefix("n/a: ")
            .map(|why| Self::NotApplicable(bounded(why).to_owned()))
    }
}

/// `s` cut at [`MAX_REASON_BYTES`], on a character boundary.
fn bounded(s: &str) -> &str {
    if s.len() <= MAX_REASON_BYTES {
        return s;
    }
    let mut end = MAX_REASON_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A wake-up source as the agent armed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Not known yet.
    Pending,
    /// Armed: it wakes the agent.
    Active,
    /// Off by configuration (`--polling-only`).
    Disabled,
    /// The node cannot have it: why.
    NotApplicable(String),
    /// It should work and does not: why.
    Unavailable(String),
}

/// One eBPF program's state (`ProgramState::label`) and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The program's name (`node_monitor_common::names::prog`).
    pub name: String,
    /// `attached`, `degraded`, `loaded`, `failed`, `disabled`.
    pub state: String,
    /// Why it is not attached, or what it lacks.
    pub reason: Option<String>,
}

/// The kernel probes as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ebpf {
    /// Not loaded yet.
    Pending,
    /// Not loaded: why (`--no-ebpf`, `--polling-only`, the object failed to load).
    Off(String),
    /// Loaded: the programs' states.
    Loaded {
        /// The reboot family: the syscall tracepoint and its raw fallback.
        reboot: Vec<Program>,
        /// The memory push's programs.
        memory_push: Vec<Program>,
        /// The kernel's BTF: `Err` says why there is none.
        kernel_btf: Result<(), String>,
    },
}

/// The kubelet's configuration, as last looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletConfig {
    /// Not looked for yet.
    Pending,
    /// `nodeMonitor.kubeletConfigPath` is empty.
    Off,
    /// Read, from these sources.
    Read(String),
    /// Not found, unreadable or malformed: why.
    Missing(String),
}

/// What the agent knows of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The kernel probes.
    pub ebpf: Ebpf,
    /// The cgroup v1 memory thresholds (`cgroup.event_control`).
    pub memcg_thresholds: Source,
    /// The PSI trigger on memory pressure.
    pub psi: Source,
    /// The kubelet's configuration.
    pub kubelet_config: KubeletConfig,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            ebpf: Ebpf::Pending,
            memcg_thresholds: Source::Pending,
            psi: Source::Pending,
            kubelet_config: KubeletConfig::Pending,
        }
    }
}

/// Every guarantee's verdict.
pub type Assessment = BTreeMap<Guarantee, Holds>;

const NOT_YET: &str = "not known yet (the agent is starting)";

/// Judges `facts`.
pub fn assess(facts: &Facts) -> Assessment {
    let mut out = BTreeMap::new();
    out.insert(Guarantee::RebootProbe, reboot_probe(&facts.ebpf));
    out.insert(
        Guarantee::CoreReads,
        match &facts.ebpf {
            Ebpf::Pending => Holds::No(NOT_YET.to_owned()),
            Ebpf::Off(why) => Holds::No(format!("no eBPF probes: {why}")),
            Ebpf::Loaded {
                kernel_btf: Ok(()), ..
            } => Holds::Yes,
            Ebpf::Loaded {
                kernel_btf: Err(why),
                ..
            } => Holds::No(format!("no kernel BTF: {why}")),
        },
    );
    out.insert(Guarantee::MemcgThresholds, source(&facts.memcg_thresholds));
    out.insert(Guarantee::PsiTrigger, source(&facts.psi));
    out.insert(
        Guarantee::MemoryPush,
        memory_push(&facts.ebpf, &facts.memcg_thresholds),
    );
    out.insert(
        Guarantee::KubeletConfig,
        match &facts.kubelet_config {
            KubeletConfig::Pending => Holds::No(NOT_YET.to_owned()),
            KubeletConfig::Off => {
                Holds::No("not read: nodeMonitor.kubeletConfigPath is empty".to_owned())
            }
            KubeletConfig::Read(_) => Holds::Yes,
            KubeletConfig::Missing(why) => Holds::No(why.clone()),
        },
    );
    out
}

/// One program's state and reason, for a verdict's reason.
fn described(p: &Program) -> String {
    match &p.reason {
        Some(r) => format!("{} {}: {r}", p.name, p.state),
        None => format!("{} {}", p.name, p.state),
    }
}

fn reboot_probe(ebpf: &Ebpf) -> Holds {
    let reboot = match ebpf {
        Ebpf::Pending => return Holds::No(NOT_YET.to_owned()),
        Ebpf::Off(why) => return Holds::No(format!("no eBPF probes: {why}")),
        Ebpf::Loaded { reboot, .. } => reboot,
    };
    if reboot.iter().any(|p| p.state == "attached") {
        return Holds::Yes;
    }
    if let Some(p) = reboot.iter().find(|p| p.state == "degraded") {
        return Holds::No(described(p));
    }
    let why: Vec<String> = reboot
        .iter()
        .filter(|p| p.state != "disabled" || reboot.iter().all(|q| q.state == "disabled"))
        .map(described)
        .collect();
    Holds::No(if why.is_empty() {
        "no reboot program in the probes".to_owned()
    } else {
        why.join("; ")
    })
}

fn source(s: &Source) -> Holds {
    match s {
        Source::Pending => Holds::No(NOT_YET.to_owned()),
        Source::Active => Holds::Yes,
        Source::Disabled => Holds::No("disabled by configuration (--polling-only)".to_owned()),
        Source::NotApplicable(why) => Holds::NotApplicable(why.clone()),
        Source::Unavailable(why) => Holds::No(why.clone()),
    }
}

/// The memory push is for cgroup v2, where no memory threshold pushes: where the thresholds
/// are active it is not needed.
fn memory_push(ebpf: &Ebpf, thresholds: &Source) -> Holds {
    if *thresholds == Source::Active {
        return Holds::NotApplicable("cgroup v1: memory thresholds push instead".to_owned());
    }
    let programs = match ebpf {
        Ebpf::Pending => return Holds::No(NOT_YET.to_owned()),
        Ebpf::Off(why) => return Holds::No(format!("no eBPF probes: {why}")),
        Ebpf::Loaded { memory_push, .. } => memory_push,
    };
    match programs
        .iter()
        .find(|p| !matches!(p.state.as_str(), "loaded" | "attached"))
    {
        None if !programs.is_empty() => Holds::Yes,
        None => Holds::No("no memory push program in the probes".to_owned()),
        Some(p) => Holds::No(described(p)),
    }
}

/// The verdicts as a JSON object: `{"reboot-probe": "yes", "psi-trigger": "no: …", …}`.
pub fn to_json(a: &Assessment) -> serde_json::Value {
    serde_json::Value::Object(
        a.iter()
            .map(|(g, h)| (g.as_str().to_owned(), serde_json::Value::String(h.encode())))
            .collect(),
    )
}

/// The annotation's text: [`to_json`], serialized.
pub fn encode(a: &Assessment) -> String {
    to_json(a).to_string()
}

/// Reads an annotation back: the guarantees it names (unknown keys and values left out).
pub fn decode(annotation: &str) -> Result<Assessment, String> {
    if annotation.len() > MAX_ANNOTATION_BYTES {
        return Err(format!(
            "{} bytes, more than {MAX_ANNOTATION_BYTES}",
            annotation.len()
        ));
    }
    let v: serde_json::Value = serde_json::from_str(annotation).map_err(|e| e.to_string())?;
    let serde_json::Value::Object(map) = v else {
        return Err("not a JSON object".to_owned());
    };
    Ok(map
        .iter()
        .filter_map(|(k, v)| Some((Guarantee::parse(k)?, Holds::decode(v.as_str()?)?)))
        .collect())
}

/// The most nodes named on one line of the summary.
pub const NODES_NAMED: usize = 5;

/// The fleet's summary from each node's annotation (`None`: the node has none): a line per
/// guarantee that does not hold somewhere ("2 of 40 nodes cannot see a reboot that bypasses the
/// inhibitor …: a (why), b (why)"), a line for the nodes that publish none, or one line saying
/// that everything holds.
pub fn fleet_summary(nodes: &[(String, Option<String>)]) -> Vec<String> {
    let total = nodes.len();
    let mut silent = Vec::new();
    let mut failing: BTreeMap<Guarantee, Vec<String>> = BTreeMap::new();
    for (node, annotation) in nodes {
        let Some(a) = annotation else {
            silent.push(node.clone());
            continue;
        };
        match decode(a) {
            Err(e) => silent.push(format!("{node} (unreadable: {e})")),
            Ok(assessment) => {
                for (g, h) in assessment {
                    if let Holds::No(why) = h {
                        failing
                            .entry(g)
                            .or_default()
                            .push(format!("{node} ({why})"));
                    }
                }
            }
        }
    }
    let named = |list: &[String]| {
        let mut s = list
            .iter()
            .take(NODES_NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if list.len() > NODES_NAMED {
            s.push_str(&format!(", and {} more", list.len() - NODES_NAMED));
        }
        s
    };
    let mut out = Vec::new();
    for g in Guarantee::ALL {
        if let Some(list) = failing.get(&g) {
            out.push(format!(
                "{} of {total} nodes {}: {}",
                list.len(),
                g.without(),
                named(list)
            ));
        }
    }
    if !silent.is_empty() {
        out.push(format!(
            "{} of {total} nodes publish no guarantees (no agent there yet, or an older one): {}",
            silent.len(),
            named(&silent)
        ));
    }
    if out.is_empty() {
        out.push(format!(
            "every guarantee holds, or cannot apply, on all {total} nodes"
        ));
    }
    out
}

#[cfg(test)]
mod tests;
