//! `OOMKilling` Events on the Node: for a node-level (global) OOM kill, whatever its victim, and
//! for a victim outside any pod (the kubelet, the container runtime, sshd, a system service under
//! its own memory limit), which has no pod to carry an Event. In node-problem-detector's reason
//! and the kernel's wording (`Killed process <pid> (<comm>) total-vm:…kB, anon-rss:…kB,
//! file-rss:…kB, shmem-rss:…kB, UID:… pgtables:…kB oom_score_adj:…`), so that what watches its
//! `OOMKilling` on the Node sees them. Pure: the writer in the parent module sends them through
//! the same series and rate limit as the pods' (the node's own kills spend the node's share).
use k8s_openapi::api::core::v1::ObjectReference;

use super::{REASON, SeriesKey};
use crate::{cluster::events::EventRecord, ebpf::OomMemory};

/// Where the kubelet and the node lifecycle controller write a Node's Events.
pub const NODE_EVENT_NAMESPACE: &str = "default";

/// A kernel OOM kill the Node's Event tells (the parts the Event needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeKill {
    pub victim_pid: u32,
    pub victim_comm: Option<String>,
    /// `Some(true)` node-level, `Some(false)` a memory cgroup's limit, `None` unknown.
    pub global: Option<bool>,
    pub memory: Option<OomMemory>,
    pub uid: Option<u32>,
    pub oom_score_adj: Option<i32>,
    /// The victim's cgroup path, when known.
    pub cgroup: Option<String>,
}

/// Whether a kill gets a Node Event: a node-level kill always (the node ran out of memory,
/// whoever the victim); any kill whose victim is in no pod (nothing else would tell it).
pub fn tells_the_node(global: Option<bool>, in_a_pod: bool) -> bool {
    global == Some(true) || !in_a_pod
}

/// What to write on Node `node` about `kill`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOomEvent {
    pub node: String,
    /// The victim's command: a series per command, so a daemon killed in a loop is one Event
    /// with a count.
    pub comm: String,
    pub message: String,
}

impl NodeOomEvent {
    /// The aggregation key: the node's own share of the budget (no tenant's namespace), the
    /// victim's command.
    pub fn key(&self) -> SeriesKey {
        SeriesKey {
            namespace: String::new(),
            pod_uid: format!("node/{}", self.node),
            container: self.comm.clone(),
            reason: REASON,
        }
    }

    /// The Event record: a Warning on the Node, in `default`.
    pub fn record(&self) -> EventRecord {
        EventRecord {
            namespace: NODE_EVENT_NAMESPACE.to_owned(),
            involved: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.node.clone()),
                // The kubelet's own node Events carry the node's name as its uid.
                uid: Some(self.node.clone()),
                ..ObjectReference::default()
            },
            warning: true,
            reason: REASON.to_owned(),
            message: self.message.clone(),
            annotations: std::collections::BTreeMap::new(),
        }
    }
}

/// The Node Event for `kill` on `node`.
pub fn node_oom_event(kill: &NodeKill, node: &str) -> NodeOomEvent {
    let scope = match kill.global {
        Some(false) => "Memory cgroup out of memory",
        _ => "Out of memory",
    };
    let comm = kill.victim_comm.clone().unwrap_or_else(|| "?".to_owned());
    let kb = |b: u64| b / 1024;
    let mut message = format!("{scope}: Killed process {} ({comm})", kill.victim_pid);
    if let Some(m) = kill.memory {
        message.push_str(&format!(
            " total-vm:{}kB, anon-rss:{}kB, file-rss:{}kB, shmem-rss:{}kB",
            kb(m.total_vm_bytes),
            kb(m.anon_rss_bytes),
            kb(m.file_rss_bytes),
            kb(m.shmem_rss_bytes)
        ));
        if let Some(uid) = kill.uid {
            message.push_str(&format!(", UID:{uid}"));
        }
        message.push_str(&format!(" pgtables:{}kB", kb(m.pgtables_bytes)));
        if let Some(adj) = kill.oom_score_adj {
            message.push_str(&format!(" oom_score_adj:{adj}"));
        }
    }
    if let Some(cg) = &kill.cgroup {
        message.push_str(&format!(" (cgroup {cg})"));
    }
    NodeOomEvent {
        node: node.to_owned(),
        comm: node_monitor_base::io::terminal_safe(&comm).into_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn kill(global: Option<bool>, memory: bool) -> NodeKill {
        NodeKill {
            victim_pid: 812,
            victim_comm: Some("sshd".to_owned()),
            global,
            memory: memory.then_some(OomMemory {
                total_vm_bytes: 100 * MI,
                anon_rss_bytes: 31 * MI,
                file_rss_bytes: MI,
                shmem_rss_bytes: 0,
                pgtables_bytes: 256 * 1024,
            }),
            uid: Some(0),
            oom_score_adj: Some(-1000),
            cgroup: Some("/system.slice/ssh.service".to_owned()),
        }
    }

    #[test]
    fn node_level_kills_and_victims_outside_pods_tell_the_node() {
        // (global, in a pod) → a Node Event?
        for (global, in_pod, tells) in [
            (Some(true), true, true),
            (Some(true), false, true),
            (Some(false), false, true),
            (None, false, true),
            (Some(false), true, false),
            (None, true, false),
        ] {
            assert_eq!(tells_the_node(global, in_pod), tells, "{global:?} {in_pod}");
        }
    }

    #[test]
    fn the_message_is_the_kernels_line_as_node_problem_detector_matches_it() {
        let ev = node_oom_event(&kill(Some(true), true), "worker-3");
        assert_eq!(
            ev.message,
            "Out of memory: Killed process 812 (sshd) total-vm:102400kB, anon-rss:31744kB, \
             file-rss:1024kB, shmem-rss:0kB, UID:0 pgtables:256kB oom_score_adj:-1000 \
             (cgroup /system.slice/ssh.service)"
        );
        // node-problem-detector's kernel monitor rule for OOMKilling:
        // `Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*`.
        let rest = ev
            .message
            .split_once("Killed process ")
            .map(|(_, r)| r)
            .expect("Killed process");
        let (pid, rest) = rest.split_once(' ').expect("pid");
        assert!(pid.chars().all(|c| c.is_ascii_digit()), "{pid}");
        let fields = rest.split_once(" total-vm:").expect("total-vm").1;
        let (vm, fields) = fields.split_once("kB, anon-rss:").expect("anon-rss");
        let (anon, fields) = fields.split_once("kB, file-rss:").expect("file-rss");
        let (file, _) = fields.split_once("kB").expect("kB");
        for n in [vm, anon, file] {
            assert!(
                n.chars().all(|c| c.is_ascii_digit()),
                "{n} in {}",
                ev.message
            );
        }
        let memcg = node_oom_event(&kill(Some(false), false), "worker-3");
        assert_eq!(
            memcg.message,
            "Memory cgroup out of memory: Killed process 812 (sshd) (cgroup /system.slice/ssh.service)"
        );
    }

    #[test]
    fn the_event_is_a_warning_on_the_node_in_default_one_series_per_command() {
        let ev = node_oom_event(&kill(Some(true), true), "worker-3");
        let rec = ev.record();
        assert_eq!(rec.namespace, "default");
        assert!(rec.warning);
        assert_eq!(rec.reason, "OOMKilling");
        assert_eq!(rec.involved.kind.as_deref(), Some("Node"));
        assert_eq!(rec.involved.name.as_deref(), Some("worker-3"));
        assert!(rec.involved.namespace.is_none());
        let key = ev.key();
        assert_eq!(key.namespace, "", "the node's own share of the budget");
        let mut other = kill(Some(true), true);
        other.victim_pid = 900;
        assert_eq!(
            node_oom_event(&other, "worker-3").key(),
            key,
            "same command"
        );
        other.victim_comm = Some("containerd".to_owned());
        assert_ne!(node_oom_event(&other, "worker-3").key(), key);
    }
}
