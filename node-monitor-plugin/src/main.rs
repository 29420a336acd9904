//! `kubectl node-monitor`: install this binary on $PATH as `kubectl-node_monitor` and kubectl
//! runs it for `kubectl node-monitor …` (docs/cli.md).
use std::process::ExitCode;

use clap::Parser as _;
use kubectl_node_monitor::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(&cli)));
    match result {
        Ok(code) => code,
        Err(e) if node_monitor_base::io::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubectl-node_monitor: {e:#}");
            ExitCode::FAILURE
        }
    }
}
