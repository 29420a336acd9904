//! Kernel notification plumbing: cgroup v1 memcg eventfds, PSI triggers and inotify, each turned
//! into a tokio task that sends [`super::Wakeup`]s through a [`Sink`]. The public face is
//! [`super::Wakeups`].

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use nix::sys::{
    eventfd::{EfdFlags, EventFd},
    inotify::{AddWatchFlags, InitFlags, Inotify},
};
use tokio::io::{Interest, unix::AsyncFd};

use crate::sampler::parse::{self, MemoryEvents};

use super::{
    sink::Sink,
    vocab::{PsiKind, PsiTrigger, SourceKind, WakeSource},
};

/// What a notification source could not do. Messages name the file and the value written.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error("opening {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("creating an eventfd")]
    EventFd(#[source] nix::Error),
    #[error("writing {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("setting up inotify on {path}")]
    Inotify {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("registering with the tokio reactor")]
    Reactor(#[source] io::Error),
}

fn open(path: &Path, write: bool) -> Result<File, ArmError> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| ArmError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// Registers an eventfd with a cgroup v1 memory cgroup through `cgroup.event_control`
/// (<https://docs.kernel.org/admin-guide/cgroup-v1/memory.html#memory-thresholds>): with a
/// `threshold`, on `memory.usage_in_bytes` (fires when usage crosses it, either way); without,
/// on `memory.oom_control` (fires when the cgroup hits OOM). The registration lives as long as
/// the eventfd: dropping it unregisters. Same steps as the kubelet's `NewCgroupNotifier`
/// (pkg/kubelet/eviction/threshold_notifier_linux.go).
pub(crate) fn memcg_eventfd(
    dir: &Path,
    file: &str,
    threshold: Option<u64>,
) -> Result<EventFd, ArmError> {
    let watched = open(&dir.join(file), false)?;
    let control_path = dir.join("cgroup.event_control");
    let mut control = open(&control_path, true)?;
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(ArmError::EventFd)?;
    let value = match threshold {
        Some(t) => format!("{} {} {t}", efd.as_raw_fd(), watched.as_raw_fd()),
        None => format!("{} {}", efd.as_raw_fd(), watched.as_raw_fd()),
    };
    control
        .write_all(value.as_bytes())
        .map_err(|source| ArmError::Write {
            path: control_path,
            value,
            source,
        })?;
    // `watched` and `control` close here; the kernel keeps its own references.
    Ok(efd)
}

/// Forwards each eventfd notification as `source`.
pub(crate) async fn eventfd_task(fd: AsyncFd<EventFd>, source: WakeSource, sink: Sink) {
    let kind = source.kind();
    loop {
        let mut guard = match fd.readable().await {
            Ok(g) => g,
            Err(e) => {
                sink.failed(kind, format!("waiting on the eventfd: {e}"));
                return;
            }
        };
        match guard.try_io(|f| f.get_ref().read().map_err(io::Error::from)) {
            Ok(Ok(_count)) => {
                if !sink.deliver(source) {
                    return;
                }
            }
            Ok(Err(e)) => {
                sink.failed(kind, format!("reading the eventfd: {e}"));
                return;
            }
            Err(_would_block) => {}
        }
    }
}

/// The PSI trigger line, NUL-terminated: the kernel copies at most 128 bytes and overwrites the
/// last byte written with NUL (`psi_write` in kernel/sched/psi.c), so without the terminator
/// the window's last digit would be cut off.
pub(crate) fn psi_trigger_line(kind: PsiKind, stall: Duration, window: Duration) -> String {
    let kind = match kind {
        PsiKind::Some => "some",
        PsiKind::Full => "full",
    };
    format!("{kind} {} {}\0", stall.as_micros(), window.as_micros())
}

/// Unprivileged triggers (no CAP_SYS_RESOURCE) must use a window that is a multiple of 2 s
/// (kernel 6.5+, `psi_trigger_create`): they are evaluated by the 2-s averaging work.
pub const UNPRIVILEGED_PSI_WINDOW: Duration = Duration::from_secs(2);

/// The windows to try, in order: the configured one, then the unprivileged fallback when it
/// differs.
pub(crate) fn psi_windows(configured: Duration) -> Vec<Duration> {
    let two = UNPRIVILEGED_PSI_WINDOW.as_micros();
    if configured.as_micros().is_multiple_of(two) {
        vec![configured]
    } else {
        vec![configured, UNPRIVILEGED_PSI_WINDOW]
    }
}

/// Opens a PSI file and writes a trigger; on EINVAL with a window that is not a multiple of 2 s
/// (what an unprivileged writer gets), retries with 2 s. Returns the file (the trigger lives as
/// long as it is open) and the window that was accepted.
pub(crate) fn arm_psi(path: &Path, trigger: &PsiTrigger) -> Result<(File, Duration), ArmError> {
    let windows = psi_windows(trigger.window);
    let mut last_err = None;
    for (i, window) in windows.iter().copied().enumerate() {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|source| ArmError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let stall = trigger.stall.min(window);
        let line = psi_trigger_line(trigger.kind, stall, window);
        match f.write_all(line.as_bytes()) {
            Ok(()) => {
                if i > 0 {
                    tracing::warn!(
                        path = %path.display(),
                        configured_window_ms = trigger.window.as_millis(),
                        effective_window_ms = window.as_millis(),
                        "PSI trigger window rejected (no CAP_SYS_RESOURCE: windows must be \
                         multiples of 2 s); using the 2-s window"
                    );
                }
                return Ok((f, window));
            }
            Err(e) => {
                let einval = e.raw_os_error() == Some(libc::EINVAL);
                last_err = Some(ArmError::Write {
                    path: path.to_path_buf(),
                    value: line.trim_end_matches('\0').to_owned(),
                    source: e,
                });
                if !einval {
                    break;
                }
            }
        }
    }
    Err(last_err.unwrap_or_else(|| ArmError::Open {
        path: path.to_path_buf(),
        source: io::Error::other("no PSI window to try"),
    }))
}

/// Forwards each PSI trigger event (POLLPRI). POLLERR means the cgroup went away.
pub(crate) async fn psi_task(fd: AsyncFd<File>, sink: Sink) {
    let interest = Interest::PRIORITY | Interest::ERROR;
    loop {
        let mut guard = match fd.ready(interest).await {
            Ok(g) => g,
            Err(e) => {
                sink.failed(SourceKind::Psi, format!("polling the PSI trigger: {e}"));
                return;
            }
        };
        let ready = guard.ready();
        if ready.is_error() {
            sink.failed(
                SourceKind::Psi,
                "the PSI file reported an error (its cgroup was removed?)".into(),
            );
            return;
        }
        if ready.is_priority() && !sink.deliver(WakeSource::Psi) {
            return;
        }
        guard.clear_ready();
    }
}

/// An inotify watch for IN_MODIFY on a file (cgroup v2 `memory.events`: the kernel's
/// `cgroup_file_notify` raises IN_MODIFY whenever a counter changes).
pub(crate) fn watch_modify(path: &Path) -> Result<InotifyFd, ArmError> {
    let err = |source| ArmError::Inotify {
        path: path.to_path_buf(),
        source,
    };
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(err)?;
    ino.add_watch(path, AddWatchFlags::IN_MODIFY).map_err(err)?;
    Ok(InotifyFd(ino))
}

/// Reads `memory.events`; `None` (and a debug log) when it cannot be read or parsed.
pub(crate) fn read_memory_events(path: &Path) -> Option<MemoryEvents> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "reading memory.events");
            return None;
        }
    };
    match parse::parse_memory_events(&text) {
        Ok(ev) => Some(ev),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "parsing memory.events");
            None
        }
    }
}

/// Forwards each change of `memory.events` with the counter increases since the previous one;
/// `last` holds the counters read when the watch was set up.
pub(crate) async fn memory_events_task(
    fd: AsyncFd<InotifyFd>,
    path: PathBuf,
    mut last: MemoryEvents,
    sink: Sink,
) {
    loop {
        let mut guard = match fd.readable().await {
            Ok(g) => g,
            Err(e) => {
                sink.failed(SourceKind::MemoryEvents, format!("waiting on inotify: {e}"));
                return;
            }
        };
        let events = match guard.try_io(|f| f.get_ref().0.read_events().map_err(io::Error::from)) {
            Ok(Ok(ev)) => ev,
            Ok(Err(e)) => {
                sink.failed(SourceKind::MemoryEvents, format!("reading inotify: {e}"));
                return;
            }
            Err(_would_block) => continue,
        };
        if events
            .iter()
            .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
        {
            sink.failed(
                SourceKind::MemoryEvents,
                format!("{} was removed", path.display()),
            );
            return;
        }
        // A file that cannot be parsed this time still means something changed: wake with an
        // empty delta and keep the previous counters.
        let delta = match read_memory_events(&path) {
            Some(now) => {
                let d = now.delta_since(&last);
                last = now;
                d
            }
            None => MemoryEvents::default(),
        };
        if !sink.deliver(WakeSource::MemoryEvents(delta)) {
            return;
        }
    }
}

/// A file descriptor type the reactor may watch: one that owns its descriptor, so the raw fd
/// stays valid and unchanged for the value's whole life.
pub(crate) trait OwnsFd: std::os::fd::AsRawFd {}
impl OwnsFd for EventFd {}
impl OwnsFd for File {}
impl OwnsFd for InotifyFd {}

/// nix's `Inotify` with the `AsRawFd` the reactor needs.
#[derive(Debug)]
pub(crate) struct InotifyFd(pub Inotify);

impl std::os::fd::AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers `inner` with the reactor for `interest`.
pub(crate) fn async_fd<T: OwnsFd>(inner: T, interest: Interest) -> Result<AsyncFd<T>, ArmError> {
    // SAFETY: `OwnsFd` types own their descriptor: it stays open, and is the same descriptor,
    // for as long as the value (moved into the AsyncFd) lives.
    unsafe { AsyncFd::register_with_interest(inner, interest) }
        .map_err(|e| ArmError::Reactor(e.into_parts().1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_lines_and_windows() {
        assert_eq!(
            psi_trigger_line(
                PsiKind::Some,
                Duration::from_millis(150),
                Duration::from_secs(2)
            ),
            "some 150000 2000000\0"
        );
        assert_eq!(
            psi_trigger_line(
                PsiKind::Full,
                Duration::from_millis(100),
                Duration::from_millis(500)
            ),
            "full 100000 500000\0"
        );
        assert_eq!(
            psi_windows(Duration::from_secs(1)),
            vec![Duration::from_secs(1), Duration::from_secs(2)]
        );
        assert_eq!(
            psi_windows(Duration::from_secs(4)),
            vec![Duration::from_secs(4)]
        );
        assert_eq!(
            psi_windows(Duration::from_millis(500)),
            vec![Duration::from_millis(500), Duration::from_secs(2)]
        );
    }

    #[test]
    fn arming_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = memcg_eventfd(dir.path(), "memory.usage_in_bytes", Some(1)).expect_err("no file");
        assert!(e.to_string().contains("memory.usage_in_bytes"), "{e}");
        let t = PsiTrigger::default();
        let e = arm_psi(&dir.path().join("memory.pressure"), &t).expect_err("no file");
        assert!(e.to_string().contains("memory.pressure"), "{e}");
        let e = watch_modify(&dir.path().join("memory.events")).expect_err("no file");
        assert!(e.to_string().contains("memory.events"), "{e}");
    }
}
