//! `fence_qmp`: a fence agent for QEMU virtual machines, driven through the QEMU Machine Protocol
//! (QMP) the way `fence_virsh` drives libvirt and `fence_xvm` a hypervisor's daemon.
//!
//! It follows the ClusterLabs fence agents' calling convention, which remediate's methods use
//! (docs/remediate.md, "Fence configuration"): `name=value` lines on standard input, exit 0 when
//! the action is done and confirmed.
//!
//! | key | meaning |
//! |---|---|
//! | `action` | `off`, `on`, `reboot`, `status` or `monitor` (default `reboot`, as the ClusterLabs agents) |
//! | `ip` | the host whose QMP socket serves the machine (an address or a name) |
//! | `ipport` | the QMP socket's TCP port (1–65535) |
//! | `power_timeout` | how long a connection and each answer may take, in seconds (1–600, default 20) |
//!
//! Other keys (`nodename`, which remediate adds, and the ClusterLabs options this agent has no
//! use for) are ignored. `status` exits 0 for a machine that runs and 2 for one that does not,
//! as the ClusterLabs agents do; any error exits 1.
//!
//! **What "off" means.** `off` stops the machine's CPUs (`stop`) and then resets it
//! (`system_reset`): nothing of the running kernel executes again, and `on` (`cont`) boots the
//! machine afresh, as a power cycle would. The machine is confirmed off when `query-status` says
//! it does not run. The QEMU process must run without `-no-reboot` (with it, a reset ends the
//! process, and `on` finds nothing to start).
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs as _},
    time::Duration,
};

use serde_json::{Value, json};

/// What the agent is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Off,
    On,
    Reboot,
    Status,
    Monitor,
}

/// The agent's options, read from its standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub action: Action,
    pub ip: String,
    pub port: u16,
    pub timeout: Duration,
}

/// The longest `power_timeout`, in seconds.
pub const MAX_TIMEOUT_SECS: u64 = 600;

/// Reads the `name=value` lines of `input` (`#` comments and blank lines skipped). Every error
/// names the key and the value.
pub fn parse(input: &str) -> Result<Options, String> {
    let mut action = Action::Reboot;
    let (mut ip, mut port) = (None, None);
    let mut timeout = Duration::from_secs(20);
    for line in input.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {line:?} is not name=value"));
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "action" | "option" => {
                action = match value {
                    "off" => Action::Off,
                    "on" => Action::On,
                    "reboot" => Action::Reboot,
                    "status" => Action::Status,
                    "monitor" => Action::Monitor,
                    _ => {
                        return Err(format!(
                            "action={value:?}: expected off, on, reboot, status or monitor"
                        ));
                    }
                }
            }
            "ip" => {
                if value.is_empty() || value.len() > 253 || value.contains(char::is_whitespace) {
                    return Err(format!("ip={value:?}: expected a host name or an address"));
                }
                ip = Some(value.to_owned());
            }
            "ipport" => {
                port = Some(
                    value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("ipport={value:?}: expected a port, 1–65535"))?,
                );
            }
            "power_timeout" => {
                let secs = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
                    .ok_or_else(|| {
                        format!("power_timeout={value:?}: expected seconds, 1–{MAX_TIMEOUT_SECS}")
                    })?;
                timeout = Duration::from_secs(secs);
            }
            _ => {}
        }
    }
    Ok(Options {
        action,
        ip: ip.ok_or("ip is missing: the host of the machine's QMP socket")?,
        port: port.ok_or("ipport is missing: the port of the machine's QMP socket")?,
        timeout,
    })
}

/// One QMP session, past the greeting and the capabilities negotiation.
pub struct Session<S: Read + Write> {
    reader: BufReader<S>,
}

impl<S: Read + Write> Session<S> {
    /// Reads the greeting and leaves capabilities negotiation mode.
    pub fn open(stream: S) -> Result<Self, String> {
        let mut s = Session {
            reader: BufReader::new(stream),
        };
        let greeting = s.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(format!("not a QMP greeting: {greeting}"));
        }
        s.execute("qmp_capabilities")?;
        Ok(s)
    }

    fn read_message(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        // A QMP message is one line; a longer one is not an answer this agent can use.
        let n = (&mut self.reader)
            .take(1 << 20)
            .read_line(&mut line)
            .map_err(|e| format!("reading from QMP: {e}"))?;
        if n == 0 {
            return Err("QMP closed the connection".to_owned());
        }
        serde_json::from_str(&line).map_err(|e| format!("QMP sent {line:?}: {e}"))
    }

    /// Runs `command`; its `return` value, events before it skipped.
    pub fn execute(&mut self, command: &str) -> Result<Value, String> {
        let mut msg = json!({ "execute": command }).to_string();
        msg.push('\n');
        self.reader
            .get_mut()
            .write_all(msg.as_bytes())
            .map_err(|e| format!("writing to QMP: {e}"))?;
        loop {
            let m = self.read_message()?;
            if m.get("event").is_some() {
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                return Err(format!("QMP {command}: {e}"));
            }
            return Err(format!("QMP {command}: unexpected answer {m}"));
        }
    }

    /// Whether the machine's CPUs run.
    pub fn running(&mut self) -> Result<bool, String> {
        let status = self.execute("query-status")?;
        status
            .get("running")
            .and_then(Value::as_bool)
            .ok_or_else(|| format!("QMP query-status: no `running` in {status}"))
    }

    /// Stops and resets the machine; an error unless it is then confirmed not running.
    pub fn off(&mut self) -> Result<(), String> {
        self.execute("stop")?;
        self.execute("system_reset")?;
        if self.running()? {
            return Err("the machine still runs after stop and system_reset".to_owned());
        }
        Ok(())
    }

    /// Starts the machine's CPUs; an error unless it is then confirmed running.
    pub fn on(&mut self) -> Result<(), String> {
        if !self.running()? {
            self.execute("cont")?;
        }
        if !self.running()? {
            return Err("the machine does not run after cont".to_owned());
        }
        Ok(())
    }
}

/// What the agent prints and its exit code.
pub fn act<S: Read + Write>(session: &mut Session<S>, action: Action) -> (String, i32) {
    let done = match action {
        Action::Off => session.off().map(|()| "Success: Powered OFF".to_owned()),
        Action::On => session.on().map(|()| "Success: Powered ON".to_owned()),
        Action::Reboot => session
            .off()
            .and_then(|()| session.on())
            .map(|()| "Success: Rebooted".to_owned()),
        Action::Status => {
            return match session.running() {
                Ok(true) => ("Status: ON".to_owned(), 0),
                Ok(false) => ("Status: OFF".to_owned(), 2),
                Err(e) => (format!("Failed: {e}"), 1),
            };
        }
        Action::Monitor => Ok("Success: the QMP socket answers".to_owned()),
    };
    match done {
        Ok(m) => (m, 0),
        Err(e) => (format!("Failed: {e}"), 1),
    }
}

/// Connects to `options`' socket and acts; what to print and the exit code.
pub fn run(options: &Options) -> (String, i32) {
    let addr = match (options.ip.as_str(), options.port).to_socket_addrs() {
        Ok(mut a) => a.next(),
        Err(e) => return (format!("Failed: ip={}: {e}", options.ip), 1),
    };
    let Some(addr) = addr else {
        return (format!("Failed: ip={}: no address", options.ip), 1);
    };
    let stream = match TcpStream::connect_timeout(&addr, options.timeout) {
        Ok(s) => s,
        Err(e) => return (format!("Failed: connecting to QMP at {addr}: {e}"), 1),
    };
    let timeouts = stream
        .set_read_timeout(Some(options.timeout))
        .and_then(|()| stream.set_write_timeout(Some(options.timeout)));
    if let Err(e) = timeouts {
        return (format!("Failed: {e}"), 1);
    }
    match Session::open(stream) {
        Ok(mut session) => act(&mut session, options.action),
        Err(e) => (format!("Failed: {e}"), 1),
    }
}

#[cfg(test)]
mod tests;
