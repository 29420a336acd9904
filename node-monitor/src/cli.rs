//! Subcommands. Each module owns its clap arguments and its `run`.
pub mod check_config;
pub mod cleanup;
pub mod explain;
