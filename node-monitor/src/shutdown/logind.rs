//! The systemd-logind adapter (D-Bus, `org.freedesktop.login1`): delay inhibitor locks,
//! `PrepareForShutdown`, `InhibitDelayMaxUSec`, `ListInhibitors`, and reloading logind after a
//! drop-in. It translates; it decides nothing.
//!
//! The protocol is systemd's inhibitor-lock one (<https://systemd.io/INHIBITOR_LOCKS/>), as the
//! kubelet uses it (`pkg/kubelet/nodeshutdown/systemd/inhibit_linux.go`): `Inhibit` returns a file
//! descriptor; the lock lasts until every copy of it is closed.
use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use futures::{Stream, StreamExt as _};
use tracing::{debug, info};
use zbus::{Connection, fdo::DBusProxy, names::BusName, proxy::CacheProperties};

use node_monitor_core::shutdown::Inhibitor;

pub const LOGIND_SERVICE: &str = "org.freedesktop.login1";
/// Where logind reads drop-ins (logind.conf(5)); later names win, so `99-` comes last.
pub const DROPIN_DIR: &str = "/etc/systemd/logind.conf.d";
pub const DROPIN_NAME: &str = "99-node-monitor.conf";

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
trait Login1Manager {
    /// `Inhibit(what, who, why, mode) -> h`.
    fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::Result<zbus::zvariant::OwnedFd>;

    /// `ListInhibitors() -> a(ssssuu)`: what, who, why, mode, uid, pid.
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;

    /// `PrepareForShutdown(b start)`: true before a shutdown, false when it was cancelled.
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;

    /// `PreparingForShutdown`: a shutdown is pending (between `PrepareForShutdown(true)` and
    /// the end of the delay).
    #[zbus(property, name = "PreparingForShutdown")]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;

    /// logind's `InhibitDelayMaxSec`, in microseconds.
    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Systemd1Manager {
    /// `KillUnit(name, whom, signal)`.
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
}

/// Errors talking to logind.
#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("connecting to the system bus")]
    Connect(#[source] Box<zbus::Error>),
    #[error("logind {method}")]
    Call {
        method: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("subscribing to {signal}")]
    Subscribe {
        signal: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("the logind drop-in {path}")]
    DropIn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reloading logind: KillUnit failed ({kill_unit}) and signalling pid {pid:?} failed")]
    Reload {
        kill_unit: String,
        pid: Option<u32>,
        #[source]
        source: Option<nix::Error>,
    },
    #[error("the system bus connection ended")]
    Disconnected,
    #[error("a malformed {signal} signal")]
    Signal {
        signal: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
}

impl LogindError {
    /// For `map_err` on a logind method call or property read.
    fn call(method: &'static str) -> impl FnOnce(zbus::Error) -> Self {
        move |source| Self::Call {
            method,
            source: Box::new(source),
        }
    }

    /// For `map_err` on a signal subscription.
    fn subscribe(signal: &'static str) -> impl FnOnce(zbus::Error) -> Self {
        move |source| Self::Subscribe {
            signal,
            source: Box::new(source),
        }
    }

    /// A signal whose arguments did not read.
    pub(super) fn signal(signal: &'static str) -> impl Fn(zbus::Error) -> Self {
        move |source| Self::Signal {
            signal,
            source: Box::new(source),
        }
    }

    /// The error's kind, for a log field or a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Call { .. } => "call",
            Self::Subscribe { .. } => "subscribe",
            Self::DropIn { .. } => "drop_in",
            Self::Reload { .. } => "reload",
            Self::Disconnected => "disconnected",
            Self::Signal { .. } => "signal",
        }
    }
}

/// A held delay inhibitor. Dropping it closes the descriptor, which releases the lock.
#[derive(Debug)]
pub struct InhibitorLock {
    fd: OwnedFd,
}

impl InhibitorLock {
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// One connection to the system bus with logind's manager object.
pub struct Logind {
    conn: Connection,
    manager: Login1ManagerProxy<'static>,
}

/// The system bus socket where systemd puts it, and where the shutdown overlay mounts it.
const RUN_SOCKET: &str = "/run/dbus/system_bus_socket";
/// The D-Bus specification's default, which is the same socket on a host (`/var/run` links to
/// `/run`) but not in a container image without that link.
const VAR_RUN_SOCKET: &str = "/var/run/dbus/system_bus_socket";

/// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS` when set, else `/run/dbus` when that
/// socket exists (a DaemonSet pod mounts it there), else the specification's default.
fn system_bus_address(env: Option<&str>, run_socket_exists: bool) -> String {
    match env.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => a.to_owned(),
        None if run_socket_exists => format!("unix:path={RUN_SOCKET}"),
        None => format!("unix:path={VAR_RUN_SOCKET}"),
    }
}

/// The `PrepareForShutdown` stream, led by a `true` when logind was already preparing for a
/// shutdown (its `PreparingForShutdown`) at the subscription.
pub fn led_by_pending<E, S>(pending: bool, signals: S) -> impl Stream<Item = Result<bool, E>>
where
    S: Stream<Item = Result<bool, E>>,
{
    futures::stream::iter(pending.then_some(Ok(true))).chain(signals)
}

impl Logind {
    pub async fn connect() -> Result<Self, LogindError> {
        let address = system_bus_address(
            std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok().as_deref(),
            Path::new(RUN_SOCKET).exists(),
        );
        let conn = zbus::connection::Builder::address(address.as_str())
            .map_err(|e| LogindError::Connect(Box::new(e)))?
            .build()
            .await
            .map_err(|e| LogindError::Connect(Box::new(e)))?;
        // Uncached: InhibitDelayMaxUSec changes on a reload without a PropertiesChanged signal.
        let manager = Login1ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| LogindError::Connect(Box::new(e)))?;
        Ok(Self { conn, manager })
    }

    /// logind's current `InhibitDelayMaxSec`.
    pub async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        let usec = self
            .manager
            .inhibit_delay_max_usec()
            .await
            .map_err(LogindError::call("InhibitDelayMaxUSec"))?;
        Ok(Duration::from_micros(usec))
    }

    /// Takes a `delay` inhibitor for `shutdown`.
    pub async fn inhibit(&self, who: &str, why: &str) -> Result<InhibitorLock, LogindError> {
        let fd = self
            .manager
            .inhibit("shutdown", who, why, "delay")
            .await
            .map_err(LogindError::call("Inhibit"))?;
        Ok(InhibitorLock {
            fd: OwnedFd::from(fd),
        })
    }

    pub async fn list_inhibitors(&self) -> Result<Vec<Inhibitor>, LogindError> {
        let rows = self
            .manager
            .list_inhibitors()
            .await
            .map_err(LogindError::call("ListInhibitors"))?;
        Ok(rows
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| Inhibitor {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    /// `PrepareForShutdown` as a stream of its argument, led by a `true` when a shutdown was
    /// already pending at the subscription (the agent started, or reconnected, after logind sent
    /// the signal: it still drains, and releases the lock it takes). Ends when the connection does.
    pub async fn prepare_for_shutdown(
        &self,
    ) -> Result<impl Stream<Item = Result<bool, zbus::Error>> + Unpin + use<>, LogindError> {
        // Subscribed first, then the property read: a signal between the two is not lost.
        let stream = self
            .manager
            .receive_prepare_for_shutdown()
            .await
            .map_err(LogindError::subscribe("PrepareForShutdown"))?;
        let pending = self
            .manager
            .preparing_for_shutdown()
            .await
            .map_err(LogindError::call("PreparingForShutdown"))?;
        Ok(led_by_pending(
            pending,
            stream.map(|s| s.args().map(|a| a.start)),
        ))
    }

    /// Owner changes of logind's bus name (`NameOwnerChanged`): the new owner, `None` when logind
    /// left the bus. Ends when the connection does.
    pub async fn owner_changes(
        &self,
    ) -> Result<impl Stream<Item = Result<Option<String>, zbus::Error>> + Unpin + use<>, LogindError>
    {
        let dbus = DBusProxy::builder(&self.conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(LogindError::subscribe("NameOwnerChanged"))?;
        let stream = dbus
            .receive_name_owner_changed_with_args(&[(0, LOGIND_SERVICE)])
            .await
            .map_err(LogindError::subscribe("NameOwnerChanged"))?;
        Ok(stream.map(|s| {
            s.args()
                .map(|a| a.new_owner().as_ref().map(|o| o.to_string()))
        }))
    }

    /// A cheap round trip to tell a live connection from a dead one.
    pub async fn ping(&self) -> Result<(), LogindError> {
        self.inhibit_delay_max().await.map(|_| ())
    }

    /// Makes logind re-read its configuration: SIGHUP through systemd (`KillUnit`, as the kubelet
    /// does), else straight to logind's pid from the bus (`GetConnectionUnixProcessID`).
    pub async fn reload(&self) -> Result<(), LogindError> {
        let kill_unit = match Systemd1ManagerProxy::new(&self.conn).await {
            Ok(systemd) => match systemd.kill_unit("systemd-logind.service", "main", 1).await {
                Ok(()) => {
                    debug!("sent SIGHUP to systemd-logind through KillUnit");
                    return Ok(());
                }
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        let pid = match DBusProxy::new(&self.conn).await {
            Ok(dbus) => match BusName::try_from(LOGIND_SERVICE) {
                Ok(name) => dbus.get_connection_unix_process_id(name).await.ok(),
                Err(_) => None,
            },
            Err(_) => None,
        };
        let Some(pid) = pid.filter(|p| *p > 1) else {
            return Err(LogindError::Reload {
                kill_unit,
                pid,
                source: None,
            });
        };
        let raw = i32::try_from(pid).map_err(|_| LogindError::Reload {
            kill_unit: kill_unit.clone(),
            pid: Some(pid),
            source: None,
        })?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGHUP,
        )
        .map_err(|e| LogindError::Reload {
            kill_unit,
            pid: Some(pid),
            source: Some(e),
        })?;
        info!(pid, "sent SIGHUP to systemd-logind");
        Ok(())
    }
}

/// Writes the drop-in raising `InhibitDelayMaxSec` (atomically: a temporary file renamed).
pub fn write_dropin(dir: &Path, contents: &str) -> Result<PathBuf, LogindError> {
    let path = dir.join(DROPIN_NAME);
    let err = |source| LogindError::DropIn {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    crate::io::write_atomically(dir, DROPIN_NAME, contents.as_bytes()).map_err(err)
}

/// What [`remove_dropin`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropinRemoval {
    /// node-monitor's drop-in, unchanged: removed.
    Removed,
    /// No drop-in there.
    Absent,
    /// A file with another content (edited by someone): kept.
    Foreign,
}

/// Removes node-monitor's drop-in from `dir` when it still holds what node-monitor wrote
/// ([`node_monitor_core::shutdown::is_own_dropin`]); an edited file is someone else's and stays.
pub fn remove_dropin(dir: &Path) -> Result<DropinRemoval, LogindError> {
    let path = dir.join(DROPIN_NAME);
    let err = |source| LogindError::DropIn {
        path: path.clone(),
        source,
    };
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DropinRemoval::Absent),
        Err(e) => return Err(err(e)),
    };
    let own = std::str::from_utf8(&text).is_ok_and(node_monitor_core::shutdown::is_own_dropin);
    if !own {
        return Ok(DropinRemoval::Foreign);
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(DropinRemoval::Removed),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DropinRemoval::Absent),
        Err(e) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_bus_is_found_where_a_pod_mounts_it() {
        let cases = [
            // (DBUS_SYSTEM_BUS_ADDRESS, /run/dbus socket present, address)
            (None, true, "unix:path=/run/dbus/system_bus_socket"),
            // Nothing at /run/dbus: the specification's default.
            (None, false, "unix:path=/var/run/dbus/system_bus_socket"),
            (Some(""), true, "unix:path=/run/dbus/system_bus_socket"),
            (Some("unix:path=/host/bus"), true, "unix:path=/host/bus"),
            (Some(" unix:path=/host/bus "), false, "unix:path=/host/bus"),
        ];
        for (env, exists, want) in cases {
            assert_eq!(system_bus_address(env, exists), want, "{env:?} {exists}");
        }
    }

    #[test]
    fn dropin_is_written_where_logind_reads_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("logind.conf.d");
        let text = node_monitor_core::shutdown::logind_dropin(42);
        let path = write_dropin(&sub, &text).expect("write");
        assert_eq!(path, sub.join("99-node-monitor.conf"));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
        // Rewriting replaces it.
        write_dropin(&sub, "[Login]\nInhibitDelayMaxSec=7\n").expect("rewrite");
        assert!(std::fs::read_to_string(&path).expect("read").contains("=7"));
        // A path that cannot be a directory is an error naming the file.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").expect("file");
        let err = write_dropin(&blocker.join("sub"), &text).expect_err("not a directory");
        assert!(err.to_string().contains("99-node-monitor.conf"), "{err}");
    }

    #[test]
    fn only_an_unchanged_dropin_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("logind.conf.d");
        // Nothing written yet (the directory itself is missing).
        assert_eq!(remove_dropin(&sub).expect("absent"), DropinRemoval::Absent);
        let path =
            write_dropin(&sub, &node_monitor_core::shutdown::logind_dropin(29)).expect("write");
        let neighbour = sub.join("10-site.conf");
        std::fs::write(&neighbour, "[Login]\nKillUserProcesses=no\n").expect("neighbour");
        assert_eq!(remove_dropin(&sub).expect("remove"), DropinRemoval::Removed);
        assert!(!path.exists());
        assert!(neighbour.exists(), "other drop-ins are never touched");
        assert_eq!(remove_dropin(&sub).expect("again"), DropinRemoval::Absent);
        // Edited by an operator: kept as it is.
        let edited = "[Login]\nInhibitDelayMaxSec=600\n";
        std::fs::write(&path, edited).expect("edit");
        assert_eq!(
            remove_dropin(&sub).expect("foreign"),
            DropinRemoval::Foreign
        );
        assert_eq!(std::fs::read_to_string(&path).expect("read"), edited);
        // A file that cannot be read is an error naming it.
        std::fs::remove_file(&path).expect("rm");
        std::fs::create_dir(&path).expect("a directory in its place");
        let err = remove_dropin(&sub).expect_err("unreadable");
        assert!(err.to_string().contains("99-node-monitor.conf"), "{err}");
    }
}
