//! Placeholder until `node-monitor trace` lands.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: &Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("not available in this build")
}
