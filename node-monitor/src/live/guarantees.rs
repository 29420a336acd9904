//! What the agent knows of its node, for the guarantees it publishes
//! (`node_monitor_core::guarantees`): the probe loader, the wake-up sources and the decision
//! loop's look at the kubelet's configuration each write their part here; the publisher
//! (`agent::guarantees`) and the `status` answer read the assessment. A poisoned lock loses the
//! view, never the agent.
use std::sync::Mutex;

use node_monitor_core::guarantees::{
    Assessment, Ebpf, Facts, KubeletConfig, Program, Source, assess,
};

use crate::ebpf::{Probes, ProgramStatus, prog};

/// The facts, written by their owners.
#[derive(Debug, Default)]
pub struct GuaranteeBoard {
    facts: Mutex<Facts>,
}

impl GuaranteeBoard {
    fn update(&self, f: impl FnOnce(&mut Facts)) {
        if let Ok(mut facts) = self.facts.lock() {
            f(&mut facts);
        }
    }

    /// The probes as loaded (`None`: not loaded, for `why`).
    pub fn set_ebpf(&self, probes: Option<&Probes>, why_not: &str) {
        let ebpf = match probes {
            None => Ebpf::Off(why_not.to_owned()),
            Some(p) => {
                let states = p.program_states();
                let of = |names: &[&str]| -> Vec<Program> {
                    states
                        .iter()
                        .filter(|s| names.contains(&s.name))
                        .map(program)
                        .collect()
                };
                Ebpf::Loaded {
                    reboot: of(&[prog::REBOOT, prog::REBOOT_RAW]),
                    memory_push: of(&[prog::MEM_PUSH_ALLOC, prog::MEM_PUSH_FREE]),
                    kernel_btf: match p.kernel_btf() {
                        Some(r) => r.clone(),
                        None => Err("not probed: the eBPF object did not load".to_owned()),
                    },
                }
            }
        };
        self.update(|f| f.ebpf = ebpf);
    }

    /// The cgroup v1 memory thresholds' and the PSI trigger's states.
    pub fn set_sources(&self, memcg_thresholds: Source, psi: Source) {
        self.update(|f| {
            f.memcg_thresholds = memcg_thresholds;
            f.psi = psi;
        });
    }

    /// The last look at the kubelet's configuration.
    pub fn set_kubelet_config(&self, k: KubeletConfig) {
        self.update(|f| f.kubelet_config = k);
    }

    /// The verdicts on what is known now.
    pub fn assessment(&self) -> Assessment {
        self.facts
            .lock()
            .map(|f| assess(&f))
            .unwrap_or_else(|_| assess(&Facts::default()))
    }
}

fn program(s: &ProgramStatus) -> Program {
    use crate::ebpf::ProgramState as S;
    let reason = match &s.state {
        S::Failed { reason } | S::Disabled { reason } | S::Degraded { reason } => {
            Some(reason.clone())
        }
        S::Attached | S::Loaded => None,
    };
    Program {
        name: s.name.to_owned(),
        state: s.state.label().to_owned(),
        reason,
    }
}
