//! Release builds whose bytes do not depend on where they were built.
//!
//! rustc writes source paths into a binary (panic locations, and debug information where it is
//! kept): workspace files as cargo names them (relative to the workspace), but registry crates,
//! build-script outputs and the toolchain's sources by their absolute paths. The release builds of
//! xtask (the images, the benchmarks) therefore pass `--remap-path-prefix` for the workspace, the
//! target directory, `CARGO_HOME` and `RUSTUP_HOME`, so the same commit gives the same binary, and
//! the same image digest, in any checkout. The eBPF object that the agent embeds is built by
//! node-monitor's build script, which trims its paths itself (cargo's `trim-paths`).
//! `deploy/Dockerfile` passes the same remapping for its build paths (a unit test below checks).
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Result, bail};

use crate::sh;

/// Cargo's separator in `CARGO_ENCODED_RUSTFLAGS`.
const SEPARATOR: char = '\x1f';

/// The directories a build reads sources from and writes outputs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPaths {
    pub workspace: PathBuf,
    pub target_dir: PathBuf,
    pub cargo_home: PathBuf,
    pub rustup_home: PathBuf,
}

impl BuildPaths {
    /// This build's: the workspace, `$CARGO_TARGET_DIR`, `$CARGO_HOME` (else `~/.cargo`) and
    /// `$RUSTUP_HOME` (else `~/.rustup`), as absolute paths.
    pub fn of_this_build() -> Result<Self> {
        let home_or = |var: &str, default: &str| {
            env::var_os(var)
                .filter(|v| !v.is_empty())
                .map_or_else(|| sh::home().join(default), PathBuf::from)
        };
        Ok(Self {
            workspace: std::path::absolute(sh::workspace_root())?,
            target_dir: std::path::absolute(sh::target_dir())?,
            cargo_home: std::path::absolute(home_or("CARGO_HOME", ".cargo"))?,
            rustup_home: std::path::absolute(home_or("RUSTUP_HOME", ".rustup"))?,
        })
    }

    /// `(from, to)` prefixes for `--remap-path-prefix`, the most specific last (rustc applies the
    /// last one that matches): the workspace becomes `.`, as cargo already names its files, the
    /// target directory `./target`, `CARGO_HOME` `/cargo` and `RUSTUP_HOME` `/rustup`.
    pub fn remaps(&self) -> Vec<(&Path, &'static str)> {
        let mut remaps = vec![
            (self.workspace.as_path(), "."),
            (self.target_dir.as_path(), "./target"),
            (self.cargo_home.as_path(), "/cargo"),
            (self.rustup_home.as_path(), "/rustup"),
        ];
        // A directory inside another (the target directory in the workspace, say) must come
        // after it; the sort is stable, so unrelated directories keep the order above.
        remaps.sort_by_key(|(from, _)| from.components().count());
        remaps
    }
}

/// The `--remap-path-prefix=FROM=TO` arguments for `paths`.
pub fn remap_flags(paths: &BuildPaths) -> Result<Vec<String>> {
    paths
        .remaps()
        .into_iter()
        .map(|(from, to)| {
            let Some(from) = from.to_str() else {
                bail!(
                    "build path {} is not UTF-8; rustflags cannot name it",
                    from.display()
                );
            };
            if from.contains('=') || from.contains(SEPARATOR) {
                bail!("build path {from:?} contains '=' or a unit separator; rustflags cannot remap it");
            }
            Ok(format!("--remap-path-prefix={from}={to}"))
        })
        .collect()
}

/// The rustflags the caller already set, as cargo reads them: `CARGO_ENCODED_RUSTFLAGS`, else
/// `RUSTFLAGS` split on whitespace.
fn existing_rustflags(encoded: Option<&str>, plain: Option<&str>) -> Vec<String> {
    match (encoded, plain) {
        (Some(e), _) if !e.is_empty() => e.split(SEPARATOR).map(str::to_owned).collect(),
        (_, Some(p)) => p.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// `CARGO_ENCODED_RUSTFLAGS` for a reproducible build: the caller's rustflags, then the remapping.
pub fn encoded_rustflags(
    paths: &BuildPaths,
    encoded: Option<&str>,
    plain: Option<&str>,
) -> Result<String> {
    let mut flags = existing_rustflags(encoded, plain);
    flags.extend(remap_flags(paths)?);
    Ok(flags.join(&SEPARATOR.to_string()))
}

/// Makes `cmd` (a `cargo build --release`) reproducible across checkouts.
pub fn apply(cmd: &mut Command) -> Result<()> {
    let encoded = env::var("CARGO_ENCODED_RUSTFLAGS").ok();
    let plain = env::var("RUSTFLAGS").ok();
    let flags = encoded_rustflags(
        &BuildPaths::of_this_build()?,
        encoded.as_deref(),
        plain.as_deref(),
    )?;
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(ws: &str, target: &str, cargo: &str, rustup: &str) -> BuildPaths {
        BuildPaths {
            workspace: ws.into(),
            target_dir: target.into(),
            cargo_home: cargo.into(),
            rustup_home: rustup.into(),
        }
    }

    #[test]
    fn every_build_path_is_remapped_the_most_specific_last() {
        let p = paths(
            "/work/wt/b",
            "/work/target-b",
            "/root/.cargo",
            "/root/.rustup",
        );
        assert_eq!(
            encoded_rustflags(&p, None, None).unwrap(),
            "--remap-path-prefix=/work/target-b=./target\x1f\
             --remap-path-prefix=/root/.cargo=/cargo\x1f\
             --remap-path-prefix=/root/.rustup=/rustup\x1f\
             --remap-path-prefix=/work/wt/b=."
        );
        // The default target directory lies in the workspace: its remap must win, so it comes
        // after the workspace's.
        let nested = paths(
            "/home/op/node-monitor",
            "/home/op/node-monitor/target",
            "/home/op/.cargo",
            "/opt/rustup",
        );
        assert_eq!(
            remap_flags(&nested).unwrap(),
            [
                "--remap-path-prefix=/opt/rustup=/rustup",
                "--remap-path-prefix=/home/op/node-monitor=.",
                "--remap-path-prefix=/home/op/.cargo=/cargo",
                "--remap-path-prefix=/home/op/node-monitor/target=./target",
            ]
        );
    }

    #[test]
    fn the_callers_rustflags_are_kept_before_the_remapping() {
        let p = paths("/w", "/w/target", "/c", "/r");
        let remaps = "--remap-path-prefix=/w=.\x1f--remap-path-prefix=/c=/cargo\x1f\
                      --remap-path-prefix=/r=/rustup\x1f--remap-path-prefix=/w/target=./target";
        assert_eq!(
            encoded_rustflags(&p, Some("-Ctarget-cpu=native\x1f-Dwarnings"), Some("-g")).unwrap(),
            format!("-Ctarget-cpu=native\x1f-Dwarnings\x1f{remaps}")
        );
        assert_eq!(
            encoded_rustflags(&p, Some(""), Some(" -Ctarget-cpu=native  -g ")).unwrap(),
            format!("-Ctarget-cpu=native\x1f-g\x1f{remaps}")
        );
    }

    #[test]
    fn a_path_rustflags_cannot_name_is_refused_by_name() {
        let p = paths("/src/a=b", "/t", "/c", "/r");
        let err = remap_flags(&p).unwrap_err().to_string();
        assert!(err.contains("\"/src/a=b\""), "{err}");
    }

    /// deploy/Dockerfile builds in /src with the rust image's CARGO_HOME and RUSTUP_HOME; its
    /// RUSTFLAGS must remap them as xtask would.
    #[test]
    fn the_dockerfile_remaps_its_build_paths_as_xtask_does() {
        let dockerfile =
            std::fs::read_to_string(sh::workspace_root().join("deploy/Dockerfile")).unwrap();
        let in_dockerfile: Vec<&str> = dockerfile
            .split(|c: char| c.is_whitespace() || c == '"')
            .filter(|w| w.starts_with("--remap-path-prefix="))
            .collect();
        let docker = paths(
            "/src",
            "/src/target",
            "/usr/local/cargo",
            "/usr/local/rustup",
        );
        assert_eq!(in_dockerfile, remap_flags(&docker).unwrap());
    }
}
