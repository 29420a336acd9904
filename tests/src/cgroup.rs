//! Test cgroups on the host: a private subtree per test, in the cgroup v1 memory and pids
//! hierarchies and in the cgroup v2 (unified) hierarchy, removed on drop.
//!
//! The host's memory controller is cgroup v1 (`/sys/fs/cgroup/memory`); the unified hierarchy at
//! `/sys/fs/cgroup/unified` carries no memory controller but gives every cgroup the v2 id that
//! `bpf_get_current_cgroup_id()` reports, so test processes are placed in the same relative path in
//! all three. Nothing outside `node-monitor-test/` is ever touched.
use std::{
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Where the host mounts its hierarchies. A test that needs another layout says so and fails.
pub const MEMORY_V1: &str = "/sys/fs/cgroup/memory";
pub const PIDS_V1: &str = "/sys/fs/cgroup/pids";
pub const UNIFIED: &str = "/sys/fs/cgroup/unified";
/// The subtree all test cgroups live under.
pub const TEST_SUBTREE: &str = "node-monitor-test";

/// Panics (the test fails loudly, it never skips) unless the process runs as root.
pub fn require_root(what: &str) {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "{what} needs root and the real kernel (run the kernel tier as root: scripts/test.sh)"
    );
}

/// A private subtree `node-monitor-test/<name>-<pid>-<n>` in every host hierarchy used by tests.
pub struct TestCgroups {
    rel_root: PathBuf,
    created: Vec<PathBuf>,
}

impl TestCgroups {
    /// Creates the subtree. Panics with context when not root or when the hierarchies are missing.
    pub fn new(name: &str) -> Self {
        require_root("creating test cgroups");
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let rel_root =
            PathBuf::from(TEST_SUBTREE).join(format!("{name}-{}-{n}", std::process::id()));
        let mut this = Self {
            rel_root,
            created: Vec::new(),
        };
        this.mkdir_all(Path::new(""))
            .expect("create the test cgroup subtree");
        this
    }

    /// The subtree's path relative to each hierarchy's mount point.
    pub fn rel_root(&self) -> &Path {
        &self.rel_root
    }

    /// Creates `rel` (relative to the test subtree) in every hierarchy; parents first.
    pub fn create(&mut self, rel: impl AsRef<Path>) -> Result<()> {
        let rel = rel.as_ref();
        let mut acc = PathBuf::new();
        for part in rel.components() {
            acc.push(part);
            self.mkdir_all(&acc)?;
        }
        Ok(())
    }

    fn mkdir_all(&mut self, rel: &Path) -> Result<()> {
        for mount in [MEMORY_V1, PIDS_V1, UNIFIED] {
            if !Path::new(mount).is_dir() {
                bail!("cgroup hierarchy {mount} is not mounted on this host");
            }
            let mut p = PathBuf::from(mount);
            for part in self.rel_root.join(rel).components() {
                p.push(part);
                if !p.exists() {
                    fs::create_dir(&p).with_context(|| format!("mkdir {}", p.display()))?;
                    // The shared parent is removed separately, only when empty.
                    if p != Path::new(mount).join(TEST_SUBTREE) {
                        self.created.push(p.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// `MEMORY_V1/<subtree>/<rel>`.
    pub fn memory(&self, rel: impl AsRef<Path>) -> PathBuf {
        Path::new(MEMORY_V1).join(&self.rel_root).join(rel)
    }

    /// `PIDS_V1/<subtree>/<rel>`.
    pub fn pids(&self, rel: impl AsRef<Path>) -> PathBuf {
        Path::new(PIDS_V1).join(&self.rel_root).join(rel)
    }

    /// `UNIFIED/<subtree>/<rel>`.
    pub fn unified(&self, rel: impl AsRef<Path>) -> PathBuf {
        Path::new(UNIFIED).join(&self.rel_root).join(rel)
    }

    /// The cgroup v2 id of `rel` (the inode of its unified directory), as the kernel reports it.
    pub fn v2_id(&self, rel: impl AsRef<Path>) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        let p = self.unified(rel);
        fs::metadata(&p)
            .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
            .ino()
    }

    /// Writes `value` to `file` in the memory hierarchy at `rel`.
    pub fn write_memory(&self, rel: impl AsRef<Path>, file: &str, value: &str) -> Result<()> {
        let p = self.memory(rel).join(file);
        fs::write(&p, value).with_context(|| format!("write {value:?} to {}", p.display()))
    }

    /// Sets `memory.limit_in_bytes` (and turns swap accounting off the path by leaving swap
    /// untouched: the host has no swap).
    pub fn set_memory_limit(&self, rel: impl AsRef<Path>, bytes: u64) -> Result<()> {
        self.write_memory(rel, "memory.limit_in_bytes", &bytes.to_string())
    }

    /// Spawns `cmd` with the child placed in `rel` of every hierarchy before it execs.
    pub fn spawn_in(&self, rel: impl AsRef<Path>, cmd: &mut Command) -> Result<Child> {
        let procs: Vec<PathBuf> = [self.memory(&rel), self.pids(&rel), self.unified(&rel)]
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect();
        for p in &procs {
            if !p.exists() {
                bail!("{} does not exist: create the cgroup first", p.display());
            }
        }
        // SAFETY: the closure only opens files and writes to them (async-signal-safe syscalls via
        // std's thin wrappers); it allocates nothing after fork because `procs` was built before.
        unsafe {
            cmd.pre_exec(move || {
                for p in &procs {
                    let mut f = fs::OpenOptions::new().write(true).open(p)?;
                    f.write_all(b"0")?;
                }
                Ok(())
            });
        }
        cmd.spawn().context("spawn test process")
    }

    /// Kills every process in the subtree and waits (bounded) until the cgroups are empty.
    pub fn kill_all(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids_in_subtree();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pids_in_subtree(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for dir in &self.created {
            if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        self.kill_all();
        // Deepest first: `created` is in creation order, parents before children.
        for dir in self.created.iter().rev() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for mount in [MEMORY_V1, PIDS_V1, UNIFIED] {
            // Remove the shared parent when no other test uses it; failure means it is in use.
            let _ = fs::remove_dir(Path::new(mount).join(TEST_SUBTREE));
        }
    }
}
