//! reboot(2) calls the kernel refuses, for the kernel tier's reboot-probe tests. Every mode
//! checks, before calling, that the call cannot take the machine down, and exits 2 without
//! calling when the check fails. It never calls reboot(2) with valid magic numbers while holding
//! CAP_SYS_BOOT in the initial PID and user namespaces.
//!
//! ```text
//! nm-reboot-caller nobody [N]   drop CAP_SYS_BOOT from the bounding set, become uid/gid 65534
//!                               (no capabilities left), then reboot(RESTART) N times (default
//!                               1) with valid magic numbers: EPERM each time
//! nm-reboot-caller unprivileged [N]
//!                               as it is, when it holds no capability at all (a pod's container
//!                               running as a user with every capability dropped):
//!                               reboot(RESTART) N times (default 1): EPERM each time
//! nm-reboot-caller userns       unshare a user namespace (full capabilities inside it, none in
//!                               the initial one), then reboot(RESTART): EPERM
//! nm-reboot-caller pidns        unshare a PID namespace and fork; the child, init of the new
//!                               namespace, calls reboot(RESTART), which ends that namespace
//!                               (the child is killed by SIGHUP), not the machine
//! nm-reboot-caller badmagic     as it is (root), reboot(RESTART) with an invalid second magic
//!                               number: EINVAL, checked before anything is done
//! ```
//! Prints one line, `caller=<pid in the initial namespace> result=<…>`, and exits 0 when the
//! kernel answered as expected, 1 when it answered otherwise.
use std::{fs, io::Error, process::exit};

const MAGIC1: u32 = 0xfee1_dead;
const MAGIC2: u32 = 672_274_793;
/// Not one of the four `LINUX_REBOOT_MAGIC2*`.
const BAD_MAGIC2: u32 = 0x0bad_0bad;
const ACCEPTED_MAGIC2: [u32; 4] = [672_274_793, 85_072_278, 369_367_448, 537_993_216];
const CMD_RESTART: u32 = 0x0123_4567;
const CAP_SYS_BOOT: u64 = 22;
const NOBODY: libc::uid_t = 65534;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("nobody") => nobody(count(args.get(1))),
        Some("unprivileged") => unprivileged(count(args.get(1))),
        Some("userns") => userns(),
        Some("pidns") => pidns(),
        Some("badmagic") => badmagic(),
        _ => usage("unknown mode"),
    }
}

/// The optional N: 1 by default, at most 1000.
fn count(arg: Option<&String>) -> u32 {
    match arg {
        None => 1,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .unwrap_or_else(|| usage("N must be a number from 1 to 1000")),
    }
}

fn usage(why: &str) -> ! {
    eprintln!(
        "nm-reboot-caller: {why}\nusage: nm-reboot-caller nobody [N] | unprivileged [N] | userns | pidns | badmagic"
    );
    exit(2)
}

/// Refuses to go on: the precondition that makes the call harmless does not hold.
fn unsafe_to_call(why: String) -> ! {
    eprintln!("nm-reboot-caller: not calling reboot(2): {why}");
    exit(2)
}

fn reboot(magic2: u32) -> Result<(), i32> {
    // SAFETY: reboot(2) with a null argument; every caller checked that it cannot act.
    let r = unsafe {
        libc::syscall(
            libc::SYS_reboot,
            MAGIC1 as libc::c_int,
            magic2 as libc::c_int,
            CMD_RESTART as libc::c_int,
            std::ptr::null::<libc::c_void>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// A line of /proc/self/status, e.g. `CapEff`.
fn status(field: &str) -> String {
    let text = fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| unsafe_to_call(format!("reading /proc/self/status: {e}")));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| unsafe_to_call(format!("/proc/self/status has no {field}")))
}

fn caps(field: &str) -> u64 {
    let v = status(field);
    u64::from_str_radix(&v, 16).unwrap_or_else(|_| unsafe_to_call(format!("{field} is {v:?}")))
}

fn report(ok: bool, result: String) -> ! {
    println!("caller={} result={result}", std::process::id());
    exit(if ok { 0 } else { 1 })
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EPERM => "EPERM".to_owned(),
        libc::EINVAL => "EINVAL".to_owned(),
        other => format!("errno {other}"),
    }
}

fn nobody(n: u32) {
    // SAFETY: plain syscalls on this single-threaded process.
    unsafe {
        if libc::prctl(
            libc::PR_CAPBSET_DROP,
            CAP_SYS_BOOT as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            unsafe_to_call(format!("PR_CAPBSET_DROP: {}", Error::last_os_error()));
        }
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
            || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
        {
            unsafe_to_call(format!("becoming nobody: {}", Error::last_os_error()));
        }
    }
    // Leaving uid 0 cleared the permitted and effective sets; check that nothing is left.
    let (eff, prm, bnd) = (caps("CapEff"), caps("CapPrm"), caps("CapBnd"));
    if eff != 0 || prm != 0 || bnd & (1 << CAP_SYS_BOOT) != 0 {
        unsafe_to_call(format!(
            "capabilities left: CapEff {eff:#x} CapPrm {prm:#x} CapBnd {bnd:#x}"
        ));
    }
    let uids = status("Uid");
    if uids.split_whitespace().any(|u| u != NOBODY.to_string()) {
        unsafe_to_call(format!("uids are {uids}"));
    }
    calls(n)
}

/// `n` calls that nothing can let through: no capability is held, permitted or effective.
fn unprivileged(n: u32) {
    let (eff, prm) = (caps("CapEff"), caps("CapPrm"));
    if eff != 0 || prm != 0 {
        unsafe_to_call(format!(
            "capabilities held: CapEff {eff:#x} CapPrm {prm:#x}"
        ));
    }
    calls(n)
}

/// Calls reboot(RESTART) `n` times and reports: EPERM each time is the expected answer.
fn calls(n: u32) -> ! {
    let mut results = Vec::new();
    for _ in 0..n {
        results.push(reboot(MAGIC2));
    }
    let eperm = results.iter().filter(|r| **r == Err(libc::EPERM)).count();
    report(
        eperm == results.len(),
        format!("EPERM x{eperm} of {}", results.len()),
    )
}

fn userns() {
    let before = fs::read_link("/proc/self/ns/user")
        .unwrap_or_else(|e| unsafe_to_call(format!("/proc/self/ns/user: {e}")));
    // SAFETY: a single-threaded process may unshare its user namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        unsafe_to_call(format!(
            "unshare(CLONE_NEWUSER): {}",
            Error::last_os_error()
        ));
    }
    let after = fs::read_link("/proc/self/ns/user")
        .unwrap_or_else(|e| unsafe_to_call(format!("/proc/self/ns/user: {e}")));
    if after == before {
        unsafe_to_call(format!("still in user namespace {}", before.display()));
    }
    match reboot(MAGIC2) {
        Err(libc::EPERM) => report(true, "EPERM".to_owned()),
        Err(e) => report(false, errno_name(e)),
        Ok(()) => report(false, "accepted".to_owned()),
    }
}

fn pidns() {
    // SAFETY: a single-threaded process may unshare its PID namespace (for its children).
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        unsafe_to_call(format!("unshare(CLONE_NEWPID): {}", Error::last_os_error()));
    }
    // SAFETY: single-threaded; the child only makes syscalls and exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        unsafe_to_call(format!("fork: {}", Error::last_os_error()));
    }
    if child == 0 {
        // The namespace's init: pid 1 in it, and a nested entry in NSpid (host /proc).
        // SAFETY: no preconditions.
        let pid = unsafe { libc::getpid() };
        let nspid = status("NSpid");
        let levels: Vec<&str> = nspid.split_whitespace().collect();
        if pid != 1 || levels.len() < 2 || levels.last() != Some(&"1") {
            eprintln!("nm-reboot-caller: not calling reboot(2): pid {pid}, NSpid {nspid}");
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(2) };
        }
        let r = reboot(MAGIC2);
        // Only reached when the kernel did not end the namespace.
        eprintln!("nm-reboot-caller: reboot(2) in the child PID namespace returned {r:?}");
        // SAFETY: as above.
        unsafe { libc::_exit(3) };
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(child, &mut st, 0) } != child {
        report(false, format!("waitpid: {}", Error::last_os_error()));
    }
    // The caller is the child: name it, not this process.
    let (ok, how) = if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        (sig == libc::SIGHUP, format!("signal {sig}"))
    } else {
        (false, format!("exit {}", libc::WEXITSTATUS(st)))
    };
    println!("caller={child} result=child ended by {how}");
    exit(if ok { 0 } else { 1 })
}

fn badmagic() {
    if ACCEPTED_MAGIC2.contains(&BAD_MAGIC2) {
        unsafe_to_call(format!("{BAD_MAGIC2:#x} is a valid magic number"));
    }
    match reboot(BAD_MAGIC2) {
        Err(libc::EINVAL) => report(true, "EINVAL".to_owned()),
        Err(e) => report(false, errno_name(e)),
        Ok(()) => report(false, "accepted".to_owned()),
    }
}
