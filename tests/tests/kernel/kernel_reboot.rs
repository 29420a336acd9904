//! Kernel tier: the reboot probe's verdict on real reboot(2) calls. Needs root; a test that cannot
//! run fails with the reason, it never skips. Run with `--test-threads=1`.
//!
//! Every call comes from `nm-reboot-caller` (tests/src/bin), and every one is a call the kernel
//! refuses or confines: a process without CAP_SYS_BOOT (EPERM), one in a child user namespace
//! (EPERM), the init of a child PID namespace (the namespace ends, not the machine), root with an
//! invalid magic number (EINVAL). No test here calls reboot(2) in a way that could reboot the
//! host; an `allowed` verdict on a real reboot is the guest VM tier's (tests/tests/vm/vm_shutdown.rs).
use std::{path::PathBuf, process::Command, time::Duration};

use node_monitor::{
    ebpf::{
        EventKind, EventStream, KernelEvent, ProbeConfig, Probes, ProgramState, RebootEvent,
        RebootGate, StreamError, prog,
    },
    shutdown::RebootSeen,
};

use node_monitor_core::{
    shutdown::{RebootAction, RebootRequest, RebootRequests},
    units::clock::Timestamp,
};
use node_monitor_tests::cgroup::require_root;

const CALLER: &str = env!("CARGO_BIN_EXE_nm-reboot-caller");
const CAP_SYS_BOOT: u64 = 1 << 22;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Only the reboot program: nothing else writes to the ring buffer.
fn reboot_only(config: ProbeConfig) -> Probes {
    reboot_program_only(config, prog::REBOOT)
}

/// Only `program` of the reboot family (`reboot_raw`: `reboot_enter` left out, as when its perf
/// event is refused).
fn reboot_program_only(config: ProbeConfig, program: &str) -> Probes {
    require_root("loading eBPF programs");
    let mut disable: std::collections::BTreeSet<String> = ["oom", "reclaim", "kswapd", "mem_push"]
        .map(str::to_owned)
        .into();
    if program == prog::REBOOT_RAW {
        disable.insert(prog::REBOOT.to_owned());
    }
    let probes = Probes::load(&ProbeConfig { disable, ..config });
    assert!(
        probes.state(program).is_some_and(ProgramState::is_attached),
        "{program} is not attached: {:#?}",
        probes.program_states()
    );
    probes
}

/// Runs `nm-reboot-caller <args>`; returns the calling process's pid (in the initial namespace)
/// and what the kernel answered. Panics when the helper refused to call or the kernel answered
/// otherwise than expected.
fn call(args: &[&str]) -> (u32, String) {
    let out = Command::new(CALLER)
        .args(args)
        .output()
        .expect("run nm-reboot-caller");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nm-reboot-caller {args:?}: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.trim();
    let rest = line
        .strip_prefix("caller=")
        .unwrap_or_else(|| panic!("unexpected output {line:?}"));
    let (pid, result) = rest
        .split_once(" result=")
        .unwrap_or_else(|| panic!("unexpected output {line:?}"));
    (pid.parse().expect("caller pid"), result.to_owned())
}

/// The next reboot event of `pid`; panics listing the other events after 10 s.
async fn reboot_of(stream: &mut EventStream, pid: u32) -> RebootEvent {
    let mut other = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Ok(KernelEvent::Reboot(r))) if r.task.pid == pid => return r,
            Ok(Ok(ev)) => other.push(ev),
            Ok(Err(StreamError::Decode(e))) => panic!("malformed record from the kernel: {e}"),
            Ok(Err(e)) => panic!("event stream failed: {e}"),
            Err(_) => panic!("no reboot event from pid {pid}; other events: {other:?}"),
        }
    }
}

/// What the shutdown manager does with the event, from a fresh state, with no shutdown announced.
fn agent_actions(ev: &RebootEvent) -> Vec<RebootAction> {
    let seen = RebootSeen::from(ev);
    RebootRequests::default().on_request(
        RebootRequest {
            gate: seen.gate,
            suppressed: seen.suppressed,
        },
        false,
        Timestamp::from_secs(1),
    )
}

fn assert_no_shutdown(ev: &RebootEvent) {
    let actions = agent_actions(ev);
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            RebootAction::Bypassed
                | RebootAction::LastGasp
                | RebootAction::LastGaspSuppressed { .. }
        )),
        "{ev:?} must never count as a shutdown: {actions:?}"
    );
}

#[test]
fn refused_reboot_requests_are_reported_with_the_kernels_reason() {
    refused_requests_seen_by(prog::REBOOT);
}

/// The same calls, seen by the fallback on the raw tracepoint `sys_enter` (Debian's and Ubuntu's
/// kernels refuse the syscall tracepoint's perf event in a pod): the same verdicts, read from
/// the caller's registers instead of the tracepoint's fields.
#[test]
fn the_raw_sys_enter_fallback_reports_the_same_verdicts() {
    refused_requests_seen_by(prog::REBOOT_RAW);
}

fn refused_requests_seen_by(program: &str) {
    let mut probes = reboot_program_only(ProbeConfig::default(), program);
    assert_eq!(probes.state(program), Some(&ProgramState::Attached));
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");

        // Without CAP_SYS_BOOT, in the initial namespaces.
        let (pid, result) = call(&["nobody"]);
        assert_eq!(result, "EPERM x1 of 1");
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::RefusedCap, "{ev:?}");
        assert_eq!(ev.cmd.as_str(), "restart");
        let c = ev.caller.expect("the caller's credentials");
        assert_eq!((c.pid_ns_level, c.user_ns_level), (0, 0), "{c:?}");
        assert_eq!(c.cap_effective, 0, "{c:?}");
        assert_no_shutdown(&ev);
        assert!(agent_actions(&ev).contains(&RebootAction::CountRefused {
            reason: "capability",
            n: 1
        }));

        // Full capabilities, but in a child user namespace.
        let (pid, result) = call(&["userns"]);
        assert_eq!(result, "EPERM");
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::RefusedUserNs, "{ev:?}");
        let c = ev.caller.expect("the caller's credentials");
        assert_eq!((c.pid_ns_level, c.user_ns_level), (0, 1), "{c:?}");
        assert_ne!(c.cap_effective & CAP_SYS_BOOT, 0, "{c:?}");
        assert_no_shutdown(&ev);

        // A container's init: CAP_SYS_BOOT, valid magic, RESTART; the kernel ends the PID
        // namespace (its init killed by SIGHUP), not the machine.
        let (pid, result) = call(&["pidns"]);
        assert_eq!(result, "child ended by signal 1");
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::RefusedPidNs, "{ev:?}");
        let c = ev.caller.expect("the caller's credentials");
        assert_eq!((c.pid_ns_level, c.user_ns_level), (1, 0), "{c:?}");
        assert_ne!(c.cap_effective & CAP_SYS_BOOT, 0, "{c:?}");
        assert_no_shutdown(&ev);
        assert!(agent_actions(&ev).contains(&RebootAction::CountRefused {
            reason: "pid_namespace",
            n: 1
        }));

        // Root in the initial namespaces: the caller checks pass, the magic number does not.
        let (pid, result) = call(&["badmagic"]);
        assert_eq!(result, "EINVAL");
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::RefusedMagic, "{ev:?}");
        let c = ev.caller.expect("the caller's credentials");
        assert_eq!((c.pid_ns_level, c.user_ns_level), (0, 0), "{c:?}");
        assert_ne!(c.cap_effective & CAP_SYS_BOOT, 0, "{c:?}");
        assert_no_shutdown(&ev);

        let counters = probes.counters().expect("counters");
        assert_eq!(counters.drops[&EventKind::Reboot], 0);
    });
}

#[test]
fn a_flood_of_refused_requests_is_one_event_and_a_count() {
    let mut probes = reboot_only(ProbeConfig {
        reboot_min_interval: Duration::from_secs(3600),
        ..ProbeConfig::default()
    });
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        const N: u32 = 500;
        let (flooder, result) = call(&["nobody", &N.to_string()]);
        assert_eq!(result, format!("EPERM x{N} of {N}"));
        // Another verdict afterwards marks the end: records arrive in the order they were sent.
        let (marker, _) = call(&["badmagic"]);
        let mut from_flooder = Vec::new();
        let end = loop {
            let ev = match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Ok(Ok(KernelEvent::Reboot(r))) => r,
                Ok(Ok(other)) => panic!("only reboot events expected: {other:?}"),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => panic!("the marker's event did not arrive"),
            };
            if ev.task.pid == marker {
                break ev;
            }
            if ev.task.pid == flooder {
                from_flooder.push(ev);
            }
        };
        assert_eq!(end.verdict, RebootGate::RefusedMagic);
        assert_eq!(from_flooder.len(), 1, "{from_flooder:?}");
        assert_eq!(from_flooder[0].verdict, RebootGate::RefusedCap);
        assert_eq!(from_flooder[0].suppressed, 0);
        let c = probes.counters().expect("counters");
        assert_eq!(c.reboot_suppressed, u64::from(N - 1), "{c:?}");
        assert_eq!(c.events[&EventKind::Reboot], 2, "{c:?}");
        assert_no_shutdown(&from_flooder[0]);
    });
}

#[test]
fn without_the_caller_offsets_requests_are_unverified_and_never_a_shutdown() {
    // No BTF: the caller checks cannot be resolved; the program still runs, degraded.
    let mut probes = reboot_only(ProbeConfig {
        btf_path: PathBuf::from("/nonexistent/btf/vmlinux"),
        ..ProbeConfig::default()
    });
    match probes.state(prog::REBOOT) {
        Some(ProgramState::Degraded { reason }) => {
            assert!(reason.contains("unverified"), "{reason}")
        }
        other => panic!("reboot_enter should be degraded: {other:?}"),
    }
    runtime().block_on(async {
        let mut stream = probes.events().expect("event stream");
        // A refused call the probe can no longer tell from a real shutdown.
        let (pid, result) = call(&["nobody"]);
        assert_eq!(result, "EPERM x1 of 1");
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::Unverified, "{ev:?}");
        assert_eq!(ev.caller, None);
        assert_no_shutdown(&ev);
        assert!(agent_actions(&ev).contains(&RebootAction::CountUnverified { n: 1 }));
        // The arguments are still checked.
        let (pid, _) = call(&["badmagic"]);
        let ev = reboot_of(&mut stream, pid).await;
        assert_eq!(ev.verdict, RebootGate::RefusedMagic, "{ev:?}");
    });
}
