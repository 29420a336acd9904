use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
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
    /// Print the shell completion script for `shell` (bash, zsh, fish, elvish, powershell).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff: `node-monitor man | man -l -`).
    Man,
}

/// `--version`: the version, the commit and its date (never the build's time: two builds of one
/// commit are the same binary), and the embedded eBPF object's SHA-256.
fn long_version() -> String {
    format!(
        "{} (commit {}, source date {}, eBPF object sha256 {})",
        env!("CARGO_PKG_VERSION"),
        env!("NODE_MONITOR_COMMIT"),
        env!("NODE_MONITOR_SOURCE_DATE"),
        node_monitor::ebpf::object_sha256()
    )
}

/// The command as clap sees it, with the long version (hashed once per process).
fn command() -> clap::Command {
    static LONG_VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    Cli::command().long_version(LONG_VERSION.get_or_init(long_version).as_str())
}

fn main() -> ExitCode {
    telemetry::init();
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    let result = match &cli.command {
        Command::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut command(),
                "node-monitor",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => clap_mangen::Man::new(command())
            .render(&mut std::io::stdout())
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
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
