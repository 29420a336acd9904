//! `fence_qmp`, remediate's QMP fence agent, against a real qemu machine: the binary as
//! remediate's methods run it (`name=value` lines on standard input), with the ClusterLabs exit
//! codes (`status`: 0 on, 2 off; 1 on an error). The machine is qemu with no disk: its firmware
//! runs, which is all a power state needs. The failover pair (`real_node_failover`) runs the same
//! agent from remediate's pod against a real node.
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use node_monitor_tests::e2e::{binary, free_port};

/// A qemu machine with a QMP socket on the host's loopback, killed when dropped.
struct Machine(std::process::Child);

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn machine(port: u16) -> Machine {
    let child = Command::new("qemu-system-x86_64")
        .args(["-machine", "q35,accel=tcg", "-m", "64", "-nodefaults"])
        .args(["-display", "none"])
        .args(["-qmp", &format!("tcp:127.0.0.1:{port},server=on,wait=off")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64 (scripts/setup.sh --with-vm installs it)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "qemu's QMP socket never listened"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Machine(child)
}

/// Runs `fence_qmp` with `options` on its standard input: its exit code and output.
fn fence(options: &str) -> (i32, String) {
    let mut child = Command::new(binary("fence_qmp"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fence_qmp");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(options.as_bytes())
        .expect("write options");
    let out = child.wait_with_output().expect("fence_qmp output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn fence_qmp_powers_a_real_qemu_machine_off_and_on_with_the_fence_agents_exit_codes() {
    let port = free_port().expect("port");
    let _machine = machine(port);
    let with = |action: &str| {
        fence(&format!(
            "nodename=nm-a\nip=127.0.0.1\nipport={port}\naction={action}\n"
        ))
    };
    assert_eq!(with("monitor").0, 0, "monitor");
    assert_eq!(with("status"), (0, "Status: ON\n".into()));
    assert_eq!(with("off"), (0, "Success: Powered OFF\n".into()));
    assert_eq!(with("status"), (2, "Status: OFF\n".into()));
    // Idempotent, as remediate's methods must be.
    assert_eq!(with("off").0, 0, "off again");
    assert_eq!(with("on"), (0, "Success: Powered ON\n".into()));
    assert_eq!(with("status").0, 0, "on after on");
    assert_eq!(with("reboot"), (0, "Success: Rebooted\n".into()));
    assert_eq!(with("status").0, 0, "on after a reboot");

    let (code, text) = fence(&format!("ip=127.0.0.1\nipport={port}\naction=destroy\n"));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("action=\"destroy\""), "{text}");
    let closed = free_port().expect("port");
    let (code, text) = fence(&format!("ip=127.0.0.1\nipport={closed}\naction=off\n"));
    assert_eq!(
        code, 1,
        "an unreachable machine is never confirmed off: {text}"
    );
    assert!(text.contains("connecting to QMP"), "{text}");
}
