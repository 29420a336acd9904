//! Running commands, and the paths every chore shares (the workspace, the build cache).
use std::{
    env,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (the directory that holds `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The build cache: `$NODE_MONITOR_CACHE`, else `$XDG_CACHE_HOME/node-monitor`, else
/// `~/.cache/node-monitor`. Control-plane and node binaries, the guest image and the CRDs live
/// here, keyed by version, so a second setup returns in seconds.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = env::var_os("NODE_MONITOR_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("node-monitor");
    }
    home().join(".cache/node-monitor")
}

/// `$HOME` (`/root` when unset, as for a root shell without one).
pub fn home() -> PathBuf {
    env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

/// A progress line on stderr, prefixed with the chore's name (stdout carries only results).
pub fn log(chore: &str, msg: impl std::fmt::Display) {
    eprintln!("{chore}: {msg}");
}

/// `cmd` with its stdout sent to our stderr, so a chore's stdout carries only its result.
pub fn quiet_stdout(cmd: &mut Command) -> &mut Command {
    cmd.stdout(Stdio::from(std::io::stderr()))
}

/// Runs `cmd` to completion; a failure names the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = show(cmd);
    let status = cmd.status().with_context(|| format!("running {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; a failure names the command and carries its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = show(cmd);
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `program` runs (found on `PATH` and executable).
pub fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0")
}

/// A command run as root: itself when we are root, else through sudo.
pub fn as_root(program: impl AsRef<OsStr>) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg(program);
        cmd
    }
}

/// Cargo, as the one that runs us (`$CARGO`), with `~/.cargo/bin` on `PATH` for what it runs.
pub fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root())
        .env("PATH", path_with_cargo_bin());
    cmd
}

/// `PATH` with `~/.cargo/bin` in front (rustup's proxies and bpf-linker live there).
pub fn path_with_cargo_bin() -> std::ffi::OsString {
    let mut dirs = vec![home().join(".cargo/bin")];
    if let Some(path) = env::var_os("PATH") {
        dirs.extend(env::split_paths(&path));
    }
    env::join_paths(dirs).unwrap_or_else(|_| env::var_os("PATH").unwrap_or_default())
}

/// Replaces `link` with a symlink to `target` (`ln -sfn`).
pub fn symlink_force(target: &Path, link: &Path) -> Result<()> {
    if let Some(dir) = link.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = link.with_extension("tmp-link");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {} to {}", tmp.display(), target.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("replacing {}", link.display()))
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args().take(4) {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    if cmd.get_args().len() > 4 {
        s.push_str(" …");
    }
    format!("`{s}`")
}
