//! Guest VM tier smoke test: the cached Debian guest boots under qemu, runs the payload as a systemd
//! service with cgroup v2 (memory controller on), reaches the host's loopback at 10.0.2.2, and
//! powers off. Fails (never skips) when qemu or the image is missing.
use std::{io::Read as _, net::TcpListener, time::Duration};

use node_monitor_tests::vm::{GuestOptions, run_guest};

#[test]
fn guest_boots_with_cgroup_v2_and_reaches_host_loopback() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("addr").port();
    let payload = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        payload.path().join("guest-entry.sh"),
        format!(
            r#"#!/bin/bash
uname -r > /mnt/out/kernel
cat /sys/fs/cgroup/cgroup.controllers > /mnt/out/controllers
systemctl is-active systemd-logind > /mnt/out/logind
echo hello-from-guest > /dev/tcp/10.0.2.2/{port} && echo sent > /mnt/out/net
systemctl poweroff
"#
        ),
    )
    .expect("write entry");
    let accept = std::thread::spawn(move || {
        listener.set_nonblocking(false).expect("blocking");
        let (mut s, _) = listener.accept().expect("guest connects");
        let mut buf = String::new();
        s.read_to_string(&mut buf).expect("read");
        buf
    });
    let run = run_guest(
        payload.path(),
        &GuestOptions {
            timeout: Duration::from_secs(300),
            ..Default::default()
        },
    )
    .expect("guest run");
    let kernel = run.read_out("kernel").expect("kernel");
    assert!(
        kernel.starts_with("6.1."),
        "guest kernel is Debian bookworm's 6.1, got {kernel}"
    );
    let controllers = run.read_out("controllers").expect("controllers");
    assert!(
        controllers.split_whitespace().any(|c| c == "memory"),
        "cgroup v2 memory: {controllers}"
    );
    assert_eq!(run.read_out("logind").expect("logind").trim(), "active");
    assert_eq!(run.read_out("net").expect("net").trim(), "sent");
    assert_eq!(
        accept.join().expect("accept thread").trim(),
        "hello-from-guest"
    );
    eprintln!("guest boot-to-poweroff: {:?}", run.elapsed);
}
