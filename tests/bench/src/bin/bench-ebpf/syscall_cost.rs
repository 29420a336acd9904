//! The reboot probe's cost per system call. `reboot_enter` sits on the syscall tracepoint
//! `syscalls/sys_enter_reboot`; `reboot_raw`, its fallback where perf events are refused, on the
//! raw tracepoint `sys_enter`, so it runs on every system call of every process and returns at
//! once unless the number is reboot(2)'s. Either one turns on the kernel's syscall-tracepoint
//! work for every task. The figure: `getppid(2)` in a tight loop, nanoseconds per call, with no
//! probe, with each program alone (the other families not loaded).
use std::time::Instant;

use anyhow::{Result, bail};
use node_monitor::ebpf::{ProbeConfig, Probes};

/// Calls per round, and rounds per configuration (the fastest and the median are reported).
const CALLS: u32 = 2_000_000;
const ROUNDS: usize = 7;

/// One configuration's figures.
pub struct Row {
    pub label: &'static str,
    pub min_ns: f64,
    pub median_ns: f64,
}

fn getppid() {
    // SAFETY: no preconditions.
    unsafe { libc::syscall(libc::SYS_getppid) };
}

/// Nanoseconds per `getppid(2)`: the fastest and the median of [`ROUNDS`] rounds.
fn measure() -> (f64, f64) {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CALLS {
                getppid();
            }
            start.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    (rounds[0], rounds[ROUNDS / 2])
}

/// Loads the reboot family alone, with `disable` also left out, and checks that `program`
/// attached.
fn load_only(program: &str, disable: &[&str]) -> Result<Probes> {
    let mut off: Vec<String> = ["oom", "reclaim", "kswapd", "mem_push"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    off.extend(disable.iter().map(|s| (*s).to_owned()));
    let probes = Probes::load(&ProbeConfig {
        disable: off.into_iter().collect(),
        ..ProbeConfig::default()
    });
    match probes.state(program) {
        Some(s) if s.is_attached() => Ok(probes),
        other => bail!("{program} did not attach: {other:?}"),
    }
}

/// No probe, `reboot_enter` alone, `reboot_raw` alone.
pub fn run() -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let (min_ns, median_ns) = measure();
    rows.push(Row {
        label: "no probe",
        min_ns,
        median_ns,
    });
    {
        let _probes = load_only("reboot_enter", &[])?;
        let (min_ns, median_ns) = measure();
        rows.push(Row {
            label: "reboot_enter (tracepoint syscalls/sys_enter_reboot)",
            min_ns,
            median_ns,
        });
    }
    {
        let _probes = load_only("reboot_raw", &["reboot_enter"])?;
        let (min_ns, median_ns) = measure();
        rows.push(Row {
            label: "reboot_raw (raw tracepoint sys_enter)",
            min_ns,
            median_ns,
        });
    }
    Ok(rows)
}

/// The Markdown table.
pub fn print(rows: &[Row]) {
    println!("\n### Reboot probe: cost per system call\n");
    println!(
        "`getppid(2)` in a loop, {CALLS} calls a round, {ROUNDS} rounds; the fastest and the median round.\n"
    );
    println!("| probe attached | ns per call (fastest) | ns per call (median) | added (median) |");
    println!("|---|---:|---:|---:|");
    let base = rows.first().map_or(0.0, |r| r.median_ns);
    for r in rows {
        println!(
            "| {} | {:.1} | {:.1} | {:+.1} |",
            r.label,
            r.min_ns,
            r.median_ns,
            r.median_ns - base
        );
    }
}
