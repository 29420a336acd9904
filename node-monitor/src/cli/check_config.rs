//! Placeholder until this subcommand lands.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("not available in this build")
}
