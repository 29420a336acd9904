//! Finding the kubelet's configuration on this node (`nodeMonitor.kubeletConfigPath: auto`):
//! the kubelet's command line from the host's `/proc` (or k3s's and RKE2's, whose kubelet runs
//! in-process), then the files it names, else the places the distributions write them
//! ([`node_monitor_core::config::kubelet_invocation`]). Reads are bounded, and never open anything but
//! a regular file.
use std::{fs, path::Path};

use node_monitor_core::{
    config::EvictionOverrides,
    config::kubelet_invocation::{self, KubeletInvocation, Launcher},
};

use crate::io::{InputError, MAX_INPUT_BYTES, read_file_bounded};

/// A command line is read up to this many bytes.
const MAX_CMDLINE_BYTES: u64 = 256 * 1024;
/// At most this many drop-in files are read from a directory (the kubelet reads them all; a
/// directory with more is not a kubelet's).
pub(super) const MAX_DROP_INS: usize = 64;
/// At most this many `/proc` entries are looked at for the kubelet's process.
const MAX_PROCESSES: usize = 1 << 20;

/// Where one part of the kubelet's configuration came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Origin {
    /// Its configuration file.
    File(String),
    /// A drop-in file.
    DropIn(String),
    /// Its command line (`kubelet`, `k3s` or `rke2`, and the process ID).
    CommandLine(&'static str, u32),
}

impl Origin {
    /// `file`, `drop_in` or `command_line`: the metric's `kind` label.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Origin::File(_) => "file",
            Origin::DropIn(_) => "drop_in",
            Origin::CommandLine(..) => "command_line",
        }
    }

    /// The path, or the program and process ID.
    pub(super) fn name(&self) -> String {
        match self {
            Origin::File(p) | Origin::DropIn(p) => p.clone(),
            Origin::CommandLine(prog, pid) => format!("{prog} (pid {pid})"),
        }
    }
}

/// What was found: the documents in the kubelet's order, its flags, and where each came from.
#[derive(Debug, Default)]
pub(super) struct Found {
    /// (name, text) of the configuration file.
    pub file: Option<(String, String)>,
    /// (name, text) of the drop-ins, in name order.
    pub drop_ins: Vec<(String, String)>,
    pub flags: EvictionOverrides,
    pub origins: Vec<Origin>,
    /// What was looked for, for the message when nothing was found.
    pub searched: Vec<String>,
}

impl Found {
    /// Whether anything tells the kubelet's settings (a command line alone does: a kubelet
    /// without a file runs on its defaults and flags).
    pub(super) fn anything(&self) -> bool {
        !self.origins.is_empty()
    }

    /// The PID of the kubelet's (or k3s's, or RKE2's) process, when its command line was read.
    pub(super) fn kubelet_pid(&self) -> Option<u32> {
        self.origins.iter().find_map(|o| match o {
            Origin::CommandLine(_, pid) => Some(*pid),
            _ => None,
        })
    }
}

/// A file that exists and cannot be read.
#[derive(Debug)]
pub(super) struct Unreadable {
    pub path: String,
    pub error: String,
}

/// Reads the kubelet's configuration: `configured` names one file (the setting's explicit
/// path); `None` finds it from the kubelet's command line under `proc_root` (looking at
/// `last_pid`, the kubelet's PID at the previous look, first), else the distributions' paths. A
/// file that is not there is skipped; one that is there and cannot be read is an error.
pub(super) fn find(
    proc_root: &Path,
    configured: Option<&str>,
    last_pid: Option<u32>,
) -> Result<Found, Unreadable> {
    let seen = configured.map_or_else(|| kubelet_process(proc_root, last_pid), |_| None);
    let sources = kubelet_invocation::sources(configured, seen.as_ref().map(|(_, s)| s));
    let mut found = Found::default();
    if let Some((pid, (launcher, inv))) = &seen {
        found
            .origins
            .push(Origin::CommandLine(launcher.as_str(), *pid));
        found.flags = inv.eviction.clone();
    }
    for path in &sources.files {
        found.searched.push(path.clone());
        if let Some(text) = read_if_there(Path::new(path))? {
            found.origins.push(Origin::File(path.clone()));
            found.file = Some((path.clone(), text));
            break;
        }
    }
    for dir in &sources.drop_in_dirs {
        found.searched.push(format!("{dir}/*.conf"));
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| kubelet_invocation::is_drop_in(n))
            .collect();
        names.sort();
        names.truncate(MAX_DROP_INS);
        for n in names {
            let path = format!("{}/{n}", dir.trim_end_matches('/'));
            if let Some(text) = read_if_there(Path::new(&path))? {
                found.origins.push(Origin::DropIn(path.clone()));
                found.drop_ins.push((path, text));
            }
        }
        break;
    }
    Ok(found)
}

/// The file's text; `None` when it is not there.
fn read_if_there(path: &Path) -> Result<Option<String>, Unreadable> {
    match read_file_bounded(path, "the kubelet config file", MAX_INPUT_BYTES) {
        Ok(t) => Ok(Some(t)),
        Err(InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(Unreadable {
            path: path.display().to_string(),
            error: e.to_string(),
        }),
    }
}

/// The kubelet's process (or k3s's, or RKE2's) under `proc_root`: `last` (the PID found at the
/// previous look) when it still is one, else the lowest PID whose command line is one.
/// Processes are told apart by their `comm` first, so only candidates' command lines are read.
fn kubelet_process(
    proc_root: &Path,
    last: Option<u32>,
) -> Option<(u32, (Launcher, KubeletInvocation))> {
    if let Some(found) = last.and_then(|pid| probe(proc_root, pid)) {
        return Some(found);
    }
    let mut pids: Vec<u32> = fs::read_dir(proc_root)
        .ok()?
        .flatten()
        .take(MAX_PROCESSES)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find_map(|pid| probe(proc_root, pid))
}

/// Process `pid`'s kubelet settings, when it is a kubelet, k3s or RKE2.
fn probe(proc_root: &Path, pid: u32) -> Option<(u32, (Launcher, KubeletInvocation))> {
    let dir = proc_root.join(pid.to_string());
    let comm = read_file_bounded(&dir.join("comm"), "a process name", 64).ok()?;
    let comm = comm.trim();
    if !(comm == "kubelet" || comm.starts_with("k3s") || comm.starts_with("rke2")) {
        return None;
    }
    let argv = read_cmdline(&dir.join("cmdline"))?;
    kubelet_invocation::parse_command_line(&argv).map(|p| (pid, p))
}

/// `/proc/<pid>/cmdline`, split at its NULs.
fn read_cmdline(path: &Path) -> Option<Vec<String>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    fs::File::open(path)
        .ok()?
        .take(MAX_CMDLINE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(
        bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(proc: &Path, pid: u32, comm: &str, argv: &[&str]) {
        let d = proc.join(pid.to_string());
        fs::create_dir_all(&d).expect("mkdir");
        fs::write(d.join("comm"), format!("{comm}\n")).expect("comm");
        let mut cmdline = argv.join("\0");
        cmdline.push('\0');
        fs::write(d.join("cmdline"), cmdline).expect("cmdline");
    }

    #[test]
    fn the_kubelets_command_line_names_its_file_drop_ins_and_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = dir.path().join("proc");
        let etc = dir.path().join("etc");
        fs::create_dir_all(etc.join("config.json.d")).expect("mkdir");
        let file = etc.join("config.json");
        fs::write(&file, r#"{"evictionHard":{"memory.available":"100Mi"}}"#).expect("file");
        fs::write(
            etc.join("config.json.d/20-b.conf"),
            "evictionHard:\n  memory.available: 300Mi\n",
        )
        .expect("b");
        fs::write(
            etc.join("config.json.d/10-a.conf"),
            "evictionHard:\n  memory.available: 200Mi\n",
        )
        .expect("a");
        fs::write(etc.join("config.json.d/notes.txt"), "not read").expect("txt");
        process(&proc, 1, "systemd", &["/sbin/init"]);
        process(&proc, 7, "containerd", &["/usr/bin/containerd"]);
        let config = format!("--config={}", file.display());
        let config_dir = format!("--config-dir={}", etc.join("config.json.d").display());
        process(
            &proc,
            42,
            "kubelet",
            &[
                "/usr/bin/kubelet",
                &config,
                &config_dir,
                "--eviction-hard=pid.available<1000",
            ],
        );
        let found = find(&proc, None, None).expect("readable");
        let kinds: Vec<&str> = found.origins.iter().map(Origin::kind).collect();
        assert_eq!(kinds, ["command_line", "file", "drop_in", "drop_in"]);
        assert_eq!(found.origins[0].name(), "kubelet (pid 42)");
        let names: Vec<&str> = found.drop_ins.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names[0].ends_with("10-a.conf") && names[1].ends_with("20-b.conf"));
        assert!(found.file.is_some());
        assert_eq!(found.flags.eviction_hard, ["pid.available<1000"]);
        assert!(found.anything());
        assert_eq!(found.kubelet_pid(), Some(42));
        // The last PID is looked at first; a PID that is no longer a kubelet is not taken.
        let found = find(&proc, None, Some(42)).expect("readable");
        assert_eq!(found.origins[0], Origin::CommandLine("kubelet", 42));
        let found = find(&proc, None, Some(7)).expect("readable");
        assert_eq!(found.origins[0], Origin::CommandLine("kubelet", 42));

        // An explicit path: that file only, no command line looked for.
        let found = find(&proc, Some(&file.display().to_string()), None).expect("readable");
        assert_eq!(found.origins, [Origin::File(file.display().to_string())]);
        assert!(found.flags.eviction_hard.is_empty());
    }

    #[test]
    fn k3s_passes_its_kubelet_args_and_a_missing_file_is_not_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = dir.path().join("proc");
        process(
            &proc,
            300,
            "k3s-agent",
            &[
                "/usr/local/bin/k3s",
                "agent",
                "--kubelet-arg=eviction-hard=memory.available<250Mi",
            ],
        );
        let found = find(&proc, None, None).expect("readable");
        assert_eq!(found.origins, [Origin::CommandLine("k3s", 300)]);
        assert_eq!(found.flags.eviction_hard, ["memory.available<250Mi"]);
        // Nothing at all: no process, no file in the (absent) well-known places.
        let empty = dir.path().join("empty");
        fs::create_dir_all(&empty).expect("mkdir");
        let found = find(&empty, Some("/nonexistent/kubelet.yaml"), None).expect("skipped");
        assert!(!found.anything());
        assert_eq!(found.searched, ["/nonexistent/kubelet.yaml"]);
    }

    #[test]
    fn a_fifo_is_unreadable_not_a_hang() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRUSR).expect("mkfifo");
        let e = find(dir.path(), Some(&path.display().to_string()), None).expect_err("a FIFO");
        assert!(e.error.contains("not a regular file"), "{}", e.error);
    }
}
