//! Where a node's kubelet keeps its configuration, as its command line says: the kubelet's own
//! flags (`--config`, `--config-dir`, `--cgroup-root`, `--eviction-hard`, …), or the flags a
//! wrapper hands its embedded kubelet (k3s and RKE2: `--kubelet-arg=eviction-hard=…`).
//!
//! Distributions configure the kubelet in different places:
//!
//! | layout | configuration file | drop-in directory | flags |
//! |---|---|---|---|
//! | kubeadm, kind | `/var/lib/kubelet/config.yaml` | (none) | a few |
//! | EKS (AL2023) | `/etc/kubernetes/kubelet/config.json` | `/etc/kubernetes/kubelet/config.json.d` | a few |
//! | EKS (AL2) | `/etc/kubernetes/kubelet/kubelet-config.json` | (none) | some |
//! | GKE | `/home/kubernetes/kubelet-config.yaml` | (none) | some |
//! | AKS | `/etc/default/kubeletconfig.json` (custom configuration only) | (none) | most |
//! | k3s, RKE2 | (none) | `/var/lib/rancher/{k3s,rke2}/agent/etc/kubelet.conf.d` | `--kubelet-arg` |
//!
//! The kubelet reads its file, then the drop-ins (`*.conf`, in name order), then its flags, each
//! overriding the one before. [`parse_command_line`] reads a command line; [`sources`] says
//! which files to look for, from the command line when one was found, else from the
//! well-known locations above. Pure: the agent reads `/proc` and the files.
use crate::config::EvictionOverrides;

/// Where kubeadm (and kind, which runs kubeadm) writes the kubelet's configuration.
pub const KUBEADM_CONFIG: &str = "/var/lib/kubelet/config.yaml";

/// Configuration files the managed and packaged distributions write, looked for in order when
/// the kubelet's command line is not visible or names none.
pub const WELL_KNOWN_CONFIG_FILES: [&str; 5] = [
    KUBEADM_CONFIG,
    // EKS on Amazon Linux 2023 (nodeadm)
    "/etc/kubernetes/kubelet/config.json",
    // EKS on Amazon Linux 2
    "/etc/kubernetes/kubelet/kubelet-config.json",
    // GKE
    "/home/kubernetes/kubelet-config.yaml",
    // AKS, with a custom kubelet configuration
    "/etc/default/kubeletconfig.json",
];

/// Drop-in directories, looked for in the same case.
pub const WELL_KNOWN_DROP_IN_DIRS: [&str; 3] = [
    "/etc/kubernetes/kubelet/config.json.d",
    "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d",
    "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d",
];

/// At most this many arguments are read from one command line; the rest are ignored.
pub const MAX_ARGS: usize = 4096;

/// Which program the command line belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// The kubelet itself.
    Kubelet,
    /// k3s (`k3s server`, `k3s agent`), whose kubelet runs in-process.
    K3s,
    /// RKE2 (`rke2 server`, `rke2 agent`).
    Rke2,
}

impl Launcher {
    /// The name used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Kubelet => "kubelet",
            Launcher::K3s => "k3s",
            Launcher::Rke2 => "rke2",
        }
    }
}

/// The kubelet settings a command line gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletInvocation {
    /// `--config`.
    pub config: Option<String>,
    /// `--config-dir`.
    pub config_dir: Option<String>,
    /// `--root-dir`.
    pub root_dir: Option<String>,
    /// `--cgroup-root`.
    pub cgroup_root: Option<String>,
    /// `--cgroup-driver`.
    pub cgroup_driver: Option<String>,
    /// The eviction flags, which override every file.
    pub eviction: EvictionOverrides,
}

impl KubeletInvocation {
    /// Whether any eviction flag is set.
    pub fn has_eviction_flags(&self) -> bool {
        let e = &self.eviction;
        !e.eviction_hard.is_empty()
            || !e.eviction_soft.is_empty()
            || !e.eviction_soft_grace_period.is_empty()
            || !e.eviction_minimum_reclaim.is_empty()
            || e.eviction_max_pod_grace_period.is_some()
            || e.eviction_pressure_transition_period.is_some()
    }

    fn set(&mut self, name: &str, value: &str) {
        let v = value.to_owned();
        let e = &mut self.eviction;
        match name {
            "config" => self.config = Some(v),
            "config-dir" => self.config_dir = Some(v),
            "root-dir" => self.root_dir = Some(v),
            "cgroup-root" => self.cgroup_root = Some(v),
            "cgroup-driver" => self.cgroup_driver = Some(v),
            // Repeated map flags merge, as the kubelet's `MapStringString` does.
            "eviction-hard" => e.eviction_hard.push(v),
            "eviction-soft" => e.eviction_soft.push(v),
            "eviction-soft-grace-period" => e.eviction_soft_grace_period.push(v),
            "eviction-minimum-reclaim" => e.eviction_minimum_reclaim.push(v),
            "eviction-max-pod-grace-period" => e.eviction_max_pod_grace_period = Some(v),
            "eviction-pressure-transition-period" => {
                e.eviction_pressure_transition_period = Some(v);
            }
            _ => {}
        }
    }
}

/// The kubelet flags node-monitor reads, all of which take a value.
const VALUE_FLAGS: [&str; 11] = [
    "config",
    "config-dir",
    "root-dir",
    "cgroup-root",
    "cgroup-driver",
    "eviction-hard",
    "eviction-soft",
    "eviction-soft-grace-period",
    "eviction-minimum-reclaim",
    "eviction-max-pod-grace-period",
    "eviction-pressure-transition-period",
];

/// Which launcher `argv` is, from its program name (and for k3s and RKE2 their subcommand):
/// `None` for any other program.
pub fn launcher(argv: &[String]) -> Option<Launcher> {
    let program = argv.first()?;
    let base = program.rsplit('/').next().unwrap_or(program);
    let sub = argv.get(1).map(String::as_str);
    let server_or_agent = matches!(sub, Some("server" | "agent"));
    match base {
        "kubelet" => Some(Launcher::Kubelet),
        // k3s renames its process after the subcommand (`k3s-server`, `k3s-agent`).
        "k3s-server" | "k3s-agent" => Some(Launcher::K3s),
        "k3s" if server_or_agent => Some(Launcher::K3s),
        "rke2" if server_or_agent => Some(Launcher::Rke2),
        _ => None,
    }
}

/// Reads a kubelet's (or k3s's or RKE2's) command line: `--flag=value`, `--flag value` and the
/// single-dash spelling Go's flag packages also take. For k3s and RKE2 only `--kubelet-arg`
/// values count (`--kubelet-arg=eviction-hard=memory.available<200Mi`). `None` when `argv` is
/// none of them. At most [`MAX_ARGS`] arguments are read.
pub fn parse_command_line(argv: &[String]) -> Option<(Launcher, KubeletInvocation)> {
    let which = launcher(argv)?;
    let mut out = KubeletInvocation::default();
    let args: Vec<&str> = argv
        .iter()
        .skip(1)
        .take(MAX_ARGS)
        .map(String::as_str)
        .collect();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        i += 1;
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        let wanted = match which {
            Launcher::Kubelet => VALUE_FLAGS.contains(&name),
            Launcher::K3s | Launcher::Rke2 => name == "kubelet-arg",
        };
        if !wanted {
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None if i < args.len() => {
                i += 1;
                args[i - 1]
            }
            None => break,
        };
        match which {
            Launcher::Kubelet => out.set(name, value),
            Launcher::K3s | Launcher::Rke2 => {
                let kv = value.trim_start_matches('-');
                if let Some((k, v)) = kv.split_once('=')
                    && VALUE_FLAGS.contains(&k)
                {
                    out.set(k, v);
                }
            }
        }
    }
    Some((which, out))
}

/// What to read for the kubelet's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    /// Configuration files to try, in order: the first that exists is the kubelet's file.
    pub files: Vec<String>,
    /// Drop-in directories to try, in order: the first that exists holds the kubelet's
    /// drop-ins.
    pub drop_in_dirs: Vec<String>,
    /// Whether the lists are what the kubelet's command line names (`true`) or the well-known
    /// locations, tried because no command line was seen.
    pub from_command_line: bool,
}

/// The files to read: an explicit `configured` path wins; else the command line's `--config`
/// and `--config-dir`; else (no kubelet command line seen, or k3s/RKE2, whose kubelet gets its
/// file from the wrapper) the well-known locations. A kubelet command line without `--config`
/// means the kubelet runs on its defaults and flags: no file is looked for.
pub fn sources(configured: Option<&str>, seen: Option<&(Launcher, KubeletInvocation)>) -> Sources {
    if let Some(path) = configured {
        return Sources {
            files: vec![path.to_owned()],
            drop_in_dirs: Vec::new(),
            from_command_line: false,
        };
    }
    match seen {
        Some((Launcher::Kubelet, inv)) => Sources {
            files: inv.config.iter().cloned().collect(),
            drop_in_dirs: inv.config_dir.iter().cloned().collect(),
            from_command_line: true,
        },
        Some((_, inv)) => Sources {
            files: Vec::new(),
            drop_in_dirs: inv.config_dir.clone().map_or_else(
                || {
                    WELL_KNOWN_DROP_IN_DIRS
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect()
                },
                |d| vec![d],
            ),
            from_command_line: true,
        },
        None => Sources {
            files: WELL_KNOWN_CONFIG_FILES
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            drop_in_dirs: WELL_KNOWN_DROP_IN_DIRS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            from_command_line: false,
        },
    }
}

/// Whether a file in a drop-in directory is one the kubelet reads: `*.conf`, not hidden.
pub fn is_drop_in(name: &str) -> bool {
    name.ends_with(".conf") && !name.starts_with('.')
}

#[cfg(test)]
mod tests;
