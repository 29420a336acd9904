use std::process::ExitCode;

use clap::Parser;
use node_monitor_remediate::{Args, run};
use node_monitor_service::telemetry;

/// Fail over from dead nodes: detect them from their Leases, fence them, then release their
/// workload (out-of-service taint, pod deletion); a leader-elected Deployment.
#[derive(Debug, Parser)]
#[command(name = "node-monitor-remediate", version)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

/// The arguments, without the `remediate` subcommand word that releases before 0.2 (where remediate
/// was `node-monitor remediate`) put first; the migration is documented in docs/remediate.md.
fn arguments() -> (Vec<std::ffi::OsString>, bool) {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let legacy = argv.get(1).is_some_and(|a| a == "remediate");
    if legacy {
        argv.remove(1);
    }
    (argv, legacy)
}

fn main() -> ExitCode {
    telemetry::init();
    let (argv, legacy) = arguments();
    let cli = Cli::parse_from(argv);
    if legacy {
        tracing::warn!(
            "the leading `remediate` argument is no longer needed: this binary is remediate (docs/remediate.md, \"Upgrading\")"
        );
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(&cli.args)));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("node-monitor-remediate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
