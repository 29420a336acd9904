//! The stand-in's cgroups: kubelet-layout directories under the node cgroup, in every hierarchy
//! the host has, at the same relative path.
//!
//! Two layouts are supported:
//! - cgroup v1 memory (+ pids v1, + the unified v2 hierarchy when mounted, which gives every cgroup
//!   its v2 id): the host's layout (`/sys/fs/cgroup/memory`, `/sys/fs/cgroup/pids`,
//!   `/sys/fs/cgroup/unified`).
//! - pure cgroup v2 at `/sys/fs/cgroup` (a systemd guest VM): limits in `memory.max`, OOM kills in
//!   `memory.events`, and `+memory +pids` enabled in `cgroup.subtree_control` of the stand-in's
//!   own parent directories (the "no internal processes" rule keeps processes in leaves only).
//!
//! Every path is relative to the hierarchy roots and must lie under `node-monitor-test/`: nothing
//! else is ever created, written or removed.
use std::{
    fs, io,
    path::{Component, Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The only subtree the stand-in touches.
pub const TEST_SUBTREE: &str = "node-monitor-test";

/// Which hierarchies hold the node's cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1 memory, with pids v1 and the unified (v2, no controllers) tree when mounted.
    V1 {
        memory: PathBuf,
        pids: Option<PathBuf>,
        unified: Option<PathBuf>,
    },
    /// cgroup v2 only, with the memory controller.
    V2 { root: PathBuf },
}

impl Layout {
    /// The host's layout: v1 memory when `/sys/fs/cgroup/memory` is a v1 hierarchy, else v2 at
    /// `/sys/fs/cgroup` when it has the memory controller.
    pub fn detect() -> io::Result<Layout> {
        let base = Path::new("/sys/fs/cgroup");
        let memory = base.join("memory");
        if memory.join("memory.limit_in_bytes").exists() {
            let pids = base.join("pids");
            let unified = base.join("unified");
            return Ok(Layout::V1 {
                memory,
                pids: pids.join("cgroup.procs").exists().then_some(pids),
                unified: unified.join("cgroup.procs").exists().then_some(unified),
            });
        }
        let controllers = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            return Ok(Layout::V2 {
                root: base.to_owned(),
            });
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no cgroup memory controller: neither /sys/fs/cgroup/memory (v1) nor a v2 \
             /sys/fs/cgroup with memory in cgroup.controllers",
        ))
    }

    /// Every hierarchy root the node's cgroups are created in; the memory one first.
    pub fn roots(&self) -> Vec<&Path> {
        match self {
            Layout::V1 {
                memory,
                pids,
                unified,
            } => std::iter::once(memory.as_path())
                .chain(pids.as_deref())
                .chain(unified.as_deref())
                .collect(),
            Layout::V2 { root } => vec![root.as_path()],
        }
    }

    /// The directory of `rel` in the hierarchy that has the memory controller.
    pub fn memory_dir(&self, rel: &Path) -> PathBuf {
        match self {
            Layout::V1 { memory, .. } => memory.join(rel),
            Layout::V2 { root } => root.join(rel),
        }
    }

    /// The directory of `rel` in the unified (v2) hierarchy, when there is one.
    pub fn unified_dir(&self, rel: &Path) -> Option<PathBuf> {
        match self {
            Layout::V1 { unified, .. } => unified.as_ref().map(|u| u.join(rel)),
            Layout::V2 { root } => Some(root.join(rel)),
        }
    }

    fn is_v2(&self) -> bool {
        matches!(self, Layout::V2 { .. })
    }
}

/// Rejects any path outside `node-monitor-test/` or with `..`/absolute components.
pub fn check_rel(rel: &Path) -> io::Result<()> {
    let mut comps = rel.components();
    let first_ok = matches!(comps.next(), Some(Component::Normal(c)) if c == TEST_SUBTREE);
    if !first_ok || !comps.all(|c| matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cgroup path {} is not under {TEST_SUBTREE}/ (relative to the hierarchy roots, \
                 without `..`)",
                rel.display()
            ),
        ));
    }
    Ok(())
}

/// Operations on the node's cgroups; every path is checked by [`check_rel`].
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Layout,
}

impl Cgroups {
    pub fn new(layout: Layout) -> Self {
        Self { layout }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Creates `rel` and its missing parents in every hierarchy; returns the relative paths it
    /// created, parents first (never the shared `node-monitor-test` itself: see
    /// [`Cgroups::remove_shared_parent`]).
    pub fn create(&self, rel: &Path) -> io::Result<Vec<PathBuf>> {
        check_rel(rel)?;
        let mut created = Vec::new();
        let mut acc = PathBuf::new();
        let parts: Vec<_> = rel.components().collect();
        for (i, part) in parts.iter().enumerate() {
            acc.push(part);
            let mut made = false;
            for root in self.layout.roots() {
                let dir = root.join(&acc);
                match fs::create_dir(&dir) {
                    Ok(()) => made = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("mkdir {}: {e}", dir.display()),
                        ));
                    }
                }
            }
            // The shared parent is never claimed: other tests may be using it.
            if made && acc != Path::new(TEST_SUBTREE) {
                created.push(acc.clone());
            }
            // v2: a parent must delegate the controllers to its children before they can use
            // them. Only directories inside the test subtree are written.
            if self.layout.is_v2() && i + 1 < parts.len() {
                self.enable_controllers(&acc)?;
            }
        }
        Ok(created)
    }

    fn enable_controllers(&self, rel: &Path) -> io::Result<()> {
        let dir = self.layout.memory_dir(rel);
        let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        for c in ["memory", "pids"] {
            if enabled.split_whitespace().any(|e| e == c) {
                continue;
            }
            fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "enable +{c} in {}/cgroup.subtree_control: {e}",
                        dir.display()
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// Removes `rel` (which must hold no process, nor child cgroups) from every hierarchy,
    /// retrying briefly while the kernel finishes tearing down exited tasks.
    pub fn remove(&self, rel: &Path) -> io::Result<()> {
        check_rel(rel)?;
        for root in self.layout.roots() {
            let dir = root.join(rel);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("rmdir {}: {e}", dir.display()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes `rel` and everything below it, deepest first, after killing what runs there.
    pub fn remove_tree(&self, rel: &Path) -> io::Result<()> {
        check_rel(rel)?;
        self.kill_all(rel, Duration::from_secs(5));
        let mut dirs = Vec::new();
        for root in self.layout.roots() {
            collect_dirs(&root.join(rel), root, &mut dirs);
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        dirs.dedup();
        for d in dirs {
            self.remove(&d)?;
        }
        Ok(())
    }

    /// Removes the shared `node-monitor-test` directory when nothing uses it any more; failure
    /// means another test still does.
    pub fn remove_shared_parent(&self) {
        for root in self.layout.roots() {
            let _ = fs::remove_dir(root.join(TEST_SUBTREE));
        }
    }

    /// Sets the memory limit of `rel` (`memory.limit_in_bytes` on v1, `memory.max` on v2).
    pub fn set_memory_limit(&self, rel: &Path, bytes: u64) -> io::Result<()> {
        check_rel(rel)?;
        let file = match self.layout {
            Layout::V1 { .. } => "memory.limit_in_bytes",
            Layout::V2 { .. } => "memory.max",
        };
        let p = self.layout.memory_dir(rel).join(file);
        fs::write(&p, bytes.to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("write {bytes} to {}: {e}", p.display())))
    }

    /// The memory limit of `rel`; `None` when unlimited.
    pub fn memory_limit(&self, rel: &Path) -> io::Result<Option<u64>> {
        let (file, unlimited_above) = match self.layout {
            // v1 reports "no limit" as PAGE_COUNTER_MAX pages, a value near i64::MAX.
            Layout::V1 { .. } => ("memory.limit_in_bytes", 1u64 << 62),
            Layout::V2 { .. } => ("memory.max", u64::MAX),
        };
        let p = self.layout.memory_dir(rel).join(file);
        let text = fs::read_to_string(&p)
            .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", p.display())))?;
        let text = text.trim();
        if text == "max" {
            return Ok(None);
        }
        let v: u64 = text.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {text:?} is not a byte count", p.display()),
            )
        })?;
        Ok((v < unlimited_above).then_some(v))
    }

    /// How many processes the kernel OOM killer has killed in `rel` and below (`oom_kill` in
    /// `memory.oom_control` on v1 — hierarchical, kernel ≥ 4.13 — or `memory.events` on v2).
    pub fn oom_kills(&self, rel: &Path) -> u64 {
        let file = match self.layout {
            Layout::V1 { .. } => "memory.oom_control",
            Layout::V2 { .. } => "memory.events",
        };
        let text = fs::read_to_string(self.layout.memory_dir(rel).join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The `cgroup.procs` files of `rel` in every hierarchy: a child writes `0` to each before it
    /// execs (see `TestCgroups::spawn_in`).
    pub fn procs_files(&self, rel: &Path) -> io::Result<Vec<PathBuf>> {
        check_rel(rel)?;
        Ok(self
            .layout
            .roots()
            .into_iter()
            .map(|r| r.join(rel).join("cgroup.procs"))
            .collect())
    }

    /// Every process in `rel` and below, in any hierarchy.
    pub fn pids(&self, rel: &Path) -> Vec<i32> {
        let mut out = Vec::new();
        for root in self.layout.roots() {
            let mut dirs = Vec::new();
            collect_dirs(&root.join(rel), root, &mut dirs);
            for d in dirs {
                if let Ok(s) = fs::read_to_string(root.join(d).join("cgroup.procs")) {
                    out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Sends `sig` to every process in `rel` and below.
    pub fn signal_all(&self, rel: &Path, sig: Signal) {
        for pid in self.pids(rel) {
            // ESRCH: it exited meanwhile.
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    /// SIGKILLs everything in `rel` and below until it is empty (bounded by `timeout`; forks
    /// racing the kill are caught by the next round). Returns whether it emptied.
    pub fn kill_all(&self, rel: &Path, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.pids(rel).is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            self.signal_all(rel, Signal::SIGKILL);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `dir` and its subdirectories, as paths relative to `root`.
fn collect_dirs(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(rel) = dir.strip_prefix(root) {
        out.push(rel.to_owned());
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), root, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_test_subtree_is_accepted() {
        assert!(check_rel(Path::new("node-monitor-test/a/kubepods")).is_ok());
        for bad in [
            "kubepods",
            "/node-monitor-test/a",
            "node-monitor-test/../process_api",
            "node-monitor-testx/a",
            "",
        ] {
            let err = check_rel(Path::new(bad)).expect_err(bad);
            assert!(err.to_string().contains("node-monitor-test"), "{err}");
        }
    }
}
