//! The configuration maps the programs read.
use std::time::Duration;

use aya::{Ebpf, maps::Array};
use node_monitor_common::{
    config::{ProbeConfigRaw, TpLayout, config_flags},
    logic::mem_push,
    names,
};

use super::ProbeError;
use crate::ebpf::{
    ProbeConfig,
    policy::{Decision, ProgramSpec},
};

/// Fills the configuration maps: `NM_CONFIG` and the planned tracepoint layouts.
pub(super) fn write_maps(
    ebpf: &mut Ebpf,
    config: &ProbeConfig,
    plan: &[(&'static ProgramSpec, Decision)],
) -> Result<(), ProbeError> {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    let raw = ProbeConfigRaw {
        stall_budget_ns: nanos(config.stall_budget),
        stall_window_ns: nanos(config.stall_window),
        kswapd_min_interval_ns: nanos(config.kswapd_min_interval),
        reboot_min_interval_ns: nanos(config.reboot_min_interval),
        page_size,
        synthetic_tgid: config.synthetic_tgid.unwrap_or(0),
        flags: if config.kernel_log {
            config_flags::KERNEL_LOG
        } else {
            0
        },
    };
    set(ebpf, names::CONFIG_MAP, 0, &raw)?;
    // Disarmed until the agent writes a batch.
    set::<u64>(ebpf, names::MEM_PUSH_MAP, mem_push::BATCH, &0)?;
    set::<u64>(
        ebpf,
        names::MEM_PUSH_MAP,
        mem_push::MIN_INTERVAL,
        &nanos(config.mem_push_min_interval),
    )?;
    for (_, decision) in plan {
        if let Decision::Attach {
            layout: Some((index, layout)),
        }
        | Decision::Fallback {
            layout: Some((index, layout)),
            ..
        } = decision
        {
            set::<TpLayout>(ebpf, names::TP_LAYOUT_MAP, *index, layout)?;
        }
    }
    Ok(())
}

fn set<V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    index: u32,
    value: &V,
) -> Result<(), ProbeError> {
    let map = ebpf.map_mut(name).ok_or(ProbeError::MissingMap { name })?;
    let mut array: Array<_, V> =
        Array::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
    array
        .set(index, value, 0)
        .map_err(|source| ProbeError::Map { name, source })
}
