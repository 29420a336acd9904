//! Child processes that never outlive their owner.
//!
//! Every process is spawned from one dedicated thread (the [`Spawner`]) with `PR_SET_PDEATHSIG =
//! SIGKILL`. The kernel delivers that signal when the *thread* that forked the child exits
//! (`prctl(2)`), so tying it to a thread owned by the harness object means: the children live exactly
//! as long as that object, and a test binary that dies abruptly (SIGKILL, abort) takes them with it.
//! Orderly teardown (`Drop`, `stop()`) terminates them first, with a grace period.
use std::{
    fs,
    io::{self, Read as _, Seek as _, SeekFrom},
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// A thread that forks children on behalf of its owner (see the module documentation).
pub struct Spawner {
    tx: Option<mpsc::Sender<SpawnRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    /// Starts the spawner thread, named `name` (visible in `/proc/<pid>/task/*/comm`).
    pub fn new(name: &str) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // The receiver only goes away when the requester gave up; the child is then
                    // dropped and, being unreaped, killed by the owner's teardown or this thread's exit.
                    let _ = reply.send(cmd.spawn());
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Spawns `cmd` from the spawner thread, with `PR_SET_PDEATHSIG = SIGKILL` set in the child.
    /// Callers add their own `pre_exec` hooks (cgroup placement, process group) before this one.
    pub fn spawn(&self, mut cmd: Command) -> io::Result<Child> {
        // SAFETY: prctl is async-signal-safe and the closure allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| io::Error::other("the spawner thread is stopped"))?;
        tx.send((cmd, reply_tx))
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        reply_rx
            .recv()
            .map_err(|_| io::Error::other("the spawner thread is gone"))?
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A long-running child in its own process group, with its output captured in a log file.
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl ManagedProcess {
    /// Spawns `cmd` through `spawner` in a new process group (so the whole group can be
    /// signalled), with stdout and stderr appended to `log`.
    pub fn spawn(
        spawner: &Spawner,
        name: &str,
        mut cmd: Command,
        log: &Path,
    ) -> io::Result<ManagedProcess> {
        let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = spawner.spawn(cmd)?;
        Ok(ManagedProcess {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            status: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status once the process has exited (reaping it), `None` while it runs.
    pub fn exited(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// SIGTERM to the process group, up to `grace` for it to exit, then SIGKILL to the group;
    /// reaps the process. Idempotent.
    pub fn terminate(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        if let Some(s) = self.exited()? {
            self.kill_group(Signal::SIGKILL);
            return Ok(s);
        }
        self.kill_group(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(s) = self.exited()? {
                // Anything else left in the group goes too.
                self.kill_group(Signal::SIGKILL);
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_group(Signal::SIGKILL);
        let s = self.child.wait()?;
        self.status = Some(s);
        Ok(s)
    }

    fn kill_group(&self, sig: Signal) {
        let Ok(pgid) = i32::try_from(self.child.id()) else {
            return;
        };
        // ESRCH: the group is already gone, which is the goal.
        let _ = killpg(Pid::from_raw(pgid), sig);
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.log, lines)
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        let _ = self.terminate(Duration::from_secs(5));
    }
}

/// Describes an exit status the way a shell would ("exit code 1", "signal 9 (SIGKILL)").
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => match Signal::try_from(s) {
            Ok(sig) => format!("signal {s} ({sig})"),
            Err(_) => format!("signal {s}"),
        },
        (None, None) => "an unknown status".to_owned(),
    }
}

/// Whether `pid` names a live (not yet reaped or still running) process.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    kill(Pid::from_raw(pid), None).is_ok()
}

/// The last `lines` lines of a text file (reading at most the last 64 KiB).
pub fn tail_file(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let Ok(mut f) = fs::File::open(path) else {
        return format!("({} is missing)", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX {
        let _ = f.seek(SeekFrom::Start(len - MAX));
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return format!("({} is unreadable)", path.display());
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
