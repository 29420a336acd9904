use std::process::ExitCode;

use clap::{Parser, Subcommand};
use node_monitor::{agent, cli, telemetry, trace};

/// eBPF-assisted Kubernetes node agent: kubelet-compatible node-pressure eviction, graceful
/// shutdown and kernel-event tracing.
#[derive(Debug, Parser)]
#[command(name = "node-monitor", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: watch this node's pods, decide with the kubelet's eviction rules the moment
    /// pressure builds, and evict through the API.
    Run(Box<agent::Args>),
    /// Stream kernel events (OOM kills, reclaim stalls, kswapd wake-ups, reboots), attributed to pods.
    Trace(trace::Args),
    /// Validate the eviction configuration and print the effective thresholds as JSON.
    CheckConfig(cli::check_config::Args),
    /// Read a snapshot (pods, usage, observations) and print the eviction decision as JSON.
    Explain(cli::explain::Args),
    /// Remove every node-monitor mark (taints, conditions, annotations, its own cordon) from a
    /// node whose agent is gone; for uninstalling.
    Cleanup(cli::cleanup::Args),
}

fn main() -> ExitCode {
    telemetry::init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::CheckConfig(args) => cli::check_config::run(args),
        Command::Explain(args) => cli::explain::run(args),
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(agent::run(args))),
        Command::Trace(args) => runtime().and_then(|rt| rt.block_on(trace::run(args))),
        Command::Cleanup(args) => runtime().and_then(|rt| rt.block_on(cli::cleanup::run(args))),
    };
    match result {
        Ok(code) => code,
        // The reader of our output went away (`… | head -1`): it has what it wanted.
        Err(e) if node_monitor::io::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-monitor: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(node_monitor::WORKER_STACK_BYTES)
        .enable_all()
        .build()?)
}
