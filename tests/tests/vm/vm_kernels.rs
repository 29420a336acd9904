//! The kernel probes on each kernel of the guest image (docs/compatibility.md, "Kernels"):
//! bookworm's 6.1, bullseye's 5.10 and bookworm-backports' 6.12, the same bookworm user space
//! booted on each (`GuestKernel`). `node-monitor trace --json` runs as root in the guest; the
//! test records every program's load state, a memcg OOM kill with the victim's pid, cgroup id,
//! path and pod (`global: false`), and memcg reclaim stalls. docs/kernel-probes.md ("Kernel
//! compatibility") records what these tests observe. Each boot also checks what every other guest
//! test stands on: cgroup v2 with the memory controller, systemd-logind active, and the host's
//! loopback reachable at 10.0.2.2 (where the control plane of the other guest tests listens).
//!
//! Run them under `flock /tmp/nm-vm.lock` (one guest at a time on a shared machine), after `cargo
//! build --bins` (the guest runs the workspace's binaries from /mnt/host). The tests fail (never
//! skip) when qemu or the guest image is missing.
use std::{collections::BTreeMap, io::Read as _, net::TcpListener, time::Duration};

use node_monitor_tests::vm::{
    ENTRY_PRELUDE, GuestKernel, GuestOptions, Payload, report, run_guest,
};
use serde_json::Value;

const MI: f64 = 1024.0 * 1024.0;

/// The start of the guest script after [`ENTRY_PRELUDE`].
const COMMON: &str = r#"log "entry started; uptime $(uptime_s)"
uname -r > /mnt/out/uname
cat /sys/fs/cgroup/cgroup.controllers > /mnt/out/controllers
systemctl is-active systemd-logind > /mnt/out/logind
echo hello-from-guest > /dev/tcp/10.0.2.2/@HOST_PORT@ && echo sent > /mnt/out/net
"#;

/// The guest's files a failure message shows.
const REPORT_FILES: &[&str] = &["entry.log", "trace.stderr"];

/// The probes on the guest kernel, after [`COMMON`]. The OOM victim's cgroup is laid out like a
/// systemd-driver container (`@UID_@`, `@CID@` are filled in by the host), so the trace line
/// carries a pod UID too.
const TRACE_SCRIPT: &str = r#"
ls -l /sys/kernel/btf/vmlinux > /mnt/out/btf 2>&1
CG=/sys/fs/cgroup/node-monitor-test
VICTIM="trace/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod@UID_@.slice/cri-containerd-@CID@.scope"
RECLAIMER="trace/reclaimer"
# cgroup v2: each parent hands the memory controller to its children (processes live in leaves
# only). Only directories inside node-monitor-test/ are written; the root's controllers are
# systemd's (recorded above).
mkcg() {
  local dir=$CG part
  mkdir -p "$dir"
  for part in ${1//\// }; do
    grep -qw memory "$dir/cgroup.subtree_control" || echo +memory > "$dir/cgroup.subtree_control"
    dir="$dir/$part"
    mkdir -p "$dir"
  done
}
mkcg "$VICTIM" && echo 32M > "$CG/$VICTIM/memory.max"
mkcg "$RECLAIMER" && echo 48M > "$CG/$RECLAIMER/memory.max"
stat -c %i "$CG/$VICTIM" > /mnt/out/victim-cgroup-id
stat -c %i "$CG/$RECLAIMER" > /mnt/out/reclaimer-cgroup-id

# The loader logs each program's state at info, and the disabled ones (with their reason) at
# debug: both are what this test records.
RUST_LOG=info,node_monitor::ebpf=debug NO_COLOR=1 /mnt/host/node-monitor trace --json \
  --stall-budget-ms 1 > /mnt/out/trace.jsonl 2> /mnt/out/trace.stderr &
TRACE=$!
within 300 grep -q listening /mnt/out/trace.stderr || log "trace did not start"
log "trace listening; uptime $(uptime_s)"
cat /sys/kernel/tracing/events/oom/mark_victim/format > /mnt/out/mark_victim.format 2>&1

# A memcg OOM: 256 MiB of anonymous memory in a 32 MiB cgroup (the guest has no swap).
( echo $BASHPID > "$CG/$VICTIM/cgroup.procs" && exec /mnt/host/nm-memhog anon 256 ) &
HOG=$!
echo $HOG > /mnt/out/victim-pid
wait $HOG
echo $? > /mnt/out/victim-status
cat "$CG/$VICTIM/memory.events" > /mnt/out/victim-memory.events
# memcg reclaim: a 96 MiB file read again and again in a 48 MiB cgroup, on the disk's file
# system (tmpfs pages are swap-backed and would OOM instead).
( echo $BASHPID > "$CG/$RECLAIMER/cgroup.procs" && exec /mnt/host/nm-memhog pagecache /var/tmp/nm-cache 96 3 ) \
  > /mnt/out/reclaimer.log 2>&1
within 60 grep -q '"kind":"oom_kill"' /mnt/out/trace.jsonl || log "no oom_kill line"
within 60 grep -q '"kind":"reclaim_stall"' /mnt/out/trace.jsonl || log "no reclaim_stall line"
# reboot(2) calls the kernel refuses, one per reason (nm-reboot-caller checks, before each call,
# that it cannot take the guest down).
for m in nobody userns pidns badmagic; do
  /mnt/host/nm-reboot-caller $m > /mnt/out/reboot-$m 2>&1
done
within 60 grep -q '"verdict":"refused_magic"' /mnt/out/trace.jsonl || log "no refused_magic line"
kill -TERM $TRACE
wait $TRACE
echo $? > /mnt/out/trace-exit
rm -f /var/tmp/nm-cache
rmdir "$CG/$RECLAIMER"
p="$VICTIM"; while [ -n "$p" ] && [ "$p" != . ]; do rmdir "$CG/$p"; p=$(dirname "$p"); done
log "done; uptime $(uptime_s)"
sync
systemctl poweroff -ff
"#;

/// A pod UID (UUID-shaped) and a 64-hex container id for the trace test's cgroup.
fn ids() -> (String, String) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        std::process::id(),
        (t >> 48) & 0xffff,
        (t >> 36) & 0xfff,
        (t >> 24) & 0xfff,
        t & 0xffff_ffff_ffff
    );
    let cid = format!("{t:032x}{:032x}", u128::from(std::process::id()));
    (uid, cid)
}

/// The `program="…"` line of the loader's log for `name`.
fn program_line<'a>(stderr: &'a str, name: &str) -> Option<&'a str> {
    let needle = format!("program=\"{name}\"");
    stderr.lines().find(|l| l.contains(&needle))
}

/// `node-monitor trace --json` on `kernel`: every program's load state, a memcg OOM kill
/// attributed to its pod, memcg reclaim stalls, and nothing dropped.
fn probes_on(kernel: GuestKernel) {
    let (uid, cid) = ids();
    let script = TRACE_SCRIPT
        .replace("@UID_@", &uid.replace('-', "_"))
        .replace("@CID@", &cid);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("addr").port();
    let accept = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("the guest connects");
        let mut buf = String::new();
        s.read_to_string(&mut buf).expect("read");
        buf
    });
    let payload = Payload::new("nm-vm-kernels").expect("payload dir");
    payload
        .link_binaries(&["node-monitor", "nm-memhog", "nm-reboot-caller"])
        .expect("binaries");
    let common = COMMON.replace("@HOST_PORT@", &port.to_string());
    payload
        .entry(&format!("{ENTRY_PRELUDE}{common}{script}"))
        .expect("entry script");
    let run = run_guest(
        payload.path(),
        &GuestOptions {
            timeout: Duration::from_secs(420),
            // One vCPU: under TCG with two, 6.12 panicked at boot on an `int3` left by its own
            // text patching (a qemu cross-CPU code-modification artefact, not the kernel's).
            cpus: 1,
            kernel,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("guest run failed: {e:#}"));
    let report = report(&run, REPORT_FILES);
    let read = |f: &str| {
        run.read_out(f)
            .unwrap_or_else(|e| panic!("{e}\n{report}"))
            .trim()
            .to_owned()
    };
    let uname = read("uname");
    assert!(
        uname.starts_with(kernel.release_prefix()),
        "guest kernel {uname}, expected {}",
        kernel.release_prefix()
    );
    // What the other guest tests stand on.
    assert!(
        read("controllers")
            .split_whitespace()
            .any(|c| c == "memory"),
        "cgroup v2 with the memory controller on {uname}: {}\n{report}",
        read("controllers")
    );
    assert_eq!(
        read("logind"),
        "active",
        "systemd-logind on {uname}\n{report}"
    );
    assert_eq!(
        read("net"),
        "sent",
        "the host's loopback from {uname}\n{report}"
    );
    assert_eq!(
        accept.join().expect("accept thread").trim(),
        "hello-from-guest"
    );
    assert_eq!(read("trace-exit"), "0", "trace exit status\n{report}");
    assert_eq!(
        read("victim-status"),
        "137",
        "the hog is SIGKILLed by the OOM killer\n{report}"
    );
    let stderr = run.read_out("trace.stderr").expect("trace stderr");

    // `mark_victim` passes the task only from 6.1 on (Debian's 6.1 has the change); on 5.10 it
    // passes the pid alone, the loader says so, and the pid-only raw program runs (through
    // bpf(2) alone, so in a DaemonSet pod under Debian's perf_event_paranoid too).
    let raw_oom = kernel != GuestKernel::Bullseye;
    assert_program_states(&stderr, raw_oom, &uname);

    assert_mark_victim_format(&read("mark_victim.format"), raw_oom);

    // --- The OOM kill.
    let victim_pid: u64 = read("victim-pid").parse().expect("victim pid");
    let victim_cgroup: u64 = read("victim-cgroup-id").parse().expect("victim cgroup id");
    let victim_path = format!(
        "/node-monitor-test/trace/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope",
        uid.replace('-', "_")
    );
    let lines: Vec<Value> = run
        .read_out("trace.jsonl")
        .expect("trace output")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let oom = lines
        .iter()
        .find(|v| v["kind"] == "oom_kill" && v["pid"] == victim_pid)
        .unwrap_or_else(|| panic!("no oom_kill for pid {victim_pid}: {lines:#?}\n{report}"));
    eprintln!("oom_kill on {uname}: {oom}");
    assert_the_oom_kill_attributed(
        oom,
        &Victim {
            pid: victim_pid,
            cgroup: victim_cgroup,
            path: &victim_path,
            uid: &uid,
            cid: &cid,
        },
        raw_oom,
    );

    // --- memcg reclaim stalls of the page-cache reader's cgroup.
    let reclaimer: u64 = read("reclaimer-cgroup-id").parse().expect("reclaimer id");
    let stall = lines
        .iter()
        .find(|v| v["kind"] == "reclaim_stall" && v["cgroup_id"] == reclaimer)
        .unwrap_or_else(|| panic!("no reclaim_stall for cgroup {reclaimer}\n{report}"));
    eprintln!("reclaim_stall on {uname}: {stall}");
    assert_eq!(stall["flavor"], "memcg", "{stall}");
    assert_eq!(stall["cgroup_path"], "/node-monitor-test/trace/reclaimer");

    assert_refused_reboots_classified(&lines, &read, &uname, &report);
    assert_nothing_dropped(&stderr);

    eprintln!("guest kernel: {uname}");
    eprintln!("btf: {}", read("btf"));
    eprintln!("mark_victim format:\n{}", read("mark_victim.format"));
    eprintln!("trace stderr:\n{stderr}");
    eprintln!("guest run total: {:.1?}", run.elapsed);
}

/// Every program's load state on this kernel, as the loader logged it.
fn assert_program_states(stderr: &str, raw_oom: bool, uname: &str) {
    let programs = [
        "oom_victim_raw",
        "oom_victim_pid",
        "oom_victim_tp",
        "direct_rcl_beg",
        "direct_rcl_end",
        "memcg_rcl_beg",
        "memcg_rcl_end",
        "kswapd_wake",
        "reboot_enter",
        "reboot_raw",
        "synthetic_evt",
    ];
    let mut states = BTreeMap::new();
    for p in programs {
        let line = program_line(stderr, p)
            .unwrap_or_else(|| panic!("no load state logged for {p}\n{stderr}"));
        states.insert(p, line.to_owned());
    }
    for (p, line) in &states {
        eprintln!("{p}: {line}");
    }
    let attached = |p: &str| states[p].contains("kernel probe attached");
    if raw_oom {
        // The raw tracepoint program passes the 6.1 verifier (before the fix in
        // `read_task_memory` it did not, and the fallback ran with the trigger's cgroup only).
        assert!(attached("oom_victim_raw"), "{}", states["oom_victim_raw"]);
        for fallback in ["oom_victim_pid", "oom_victim_tp"] {
            assert!(
                states[fallback].contains("standby: oom_victim_raw is attached"),
                "{}",
                states[fallback]
            );
        }
    } else {
        assert!(
            states["oom_victim_raw"].contains("its fallback is attached")
                && states["oom_victim_raw"].contains("mark_victim passes (int)"),
            "{}",
            states["oom_victim_raw"]
        );
        assert!(attached("oom_victim_pid"), "{}", states["oom_victim_pid"]);
        assert!(
            states["oom_victim_tp"].contains("standby: oom_victim_pid is attached"),
            "{}",
            states["oom_victim_tp"]
        );
    }
    for p in [
        "direct_rcl_beg",
        "direct_rcl_end",
        "memcg_rcl_beg",
        "memcg_rcl_end",
        "kswapd_wake",
        "reboot_enter",
    ] {
        assert!(attached(p), "{p} on {uname}: {}", states[p]);
    }
    assert!(
        states["reboot_raw"].contains("standby: reboot_enter is attached"),
        "{}",
        states["reboot_raw"]
    );
    assert!(
        states["synthetic_evt"].contains("opt-in program not requested"),
        "{}",
        states["synthetic_evt"]
    );
}

/// The tracepoint fallback's fields on this kernel: from 6.1 on, every one the program can
/// read, at the offsets 6.18 has too; on 5.10, the pid alone (docs/kernel-probes.md, "Per
/// kernel").
fn assert_mark_victim_format(format: &str, raw_oom: bool) {
    let fields: &[(&str, u32)] = if raw_oom {
        &[
            ("int pid", 8),
            ("__data_loc char[] comm", 12),
            ("unsigned long total_vm", 16),
            ("unsigned long anon_rss", 24),
            ("unsigned long file_rss", 32),
            ("unsigned long shmem_rss", 40),
            ("uid_t uid", 48),
            ("unsigned long pgtables", 56),
            ("short oom_score_adj", 64),
        ]
    } else {
        &[("int pid", 8)]
    };
    for (field, offset) in fields {
        assert!(
            format.contains(&format!("field:{field};\toffset:{offset};")),
            "mark_victim {field} at {offset}:\n{format}"
        );
    }
    if !raw_oom {
        assert!(
            !format.contains("char[] comm"),
            "5.10's mark_victim:\n{format}"
        );
    }
}

/// The OOM-killed hog, as the guest recorded it.
struct Victim<'a> {
    pid: u64,
    cgroup: u64,
    path: &'a str,
    uid: &'a str,
    cid: &'a str,
}

/// The memcg OOM kill's trace line: its cgroup, pod, container and QoS class, its victim and
/// trigger, and on 6.1 and later the victim's memory figures.
fn assert_the_oom_kill_attributed(oom: &Value, v: &Victim<'_>, raw_oom: bool) {
    assert_eq!(oom["cgroup_id"], v.cgroup, "{oom}");
    assert_eq!(oom["cgroup_path"], v.path, "{oom}");
    assert_eq!(oom["global"], false, "{oom}");
    assert_eq!(oom["scope"], "memcg", "{oom}");
    assert_eq!(oom["trigger_reclaim"], "memcg", "{oom}");
    if raw_oom {
        assert_eq!(oom["comm"], "nm-memhog", "{oom}");
    } else {
        // 5.10's tracepoint names no victim; the trigger (the victim itself here) is named.
        assert_eq!(oom["comm"], Value::Null, "{oom}");
    }
    assert_eq!(oom["trigger_comm"], "nm-memhog", "{oom}");
    assert_eq!(oom["trigger_pid"], v.pid, "{oom}");
    assert_eq!(oom["pod_uid"], v.uid, "{oom}");
    assert_eq!(oom["container_id"], v.cid, "{oom}");
    assert_eq!(oom["qos_class"], "Burstable", "{oom}");
    if raw_oom {
        // Read from the victim's task_struct through CO-RE, relocated against this kernel's
        // BTF (6.1's pre-6.2 `rss_stat`, 6.12's per-CPU counters).
        assert_eq!(oom["cgroup_source"], "victim", "{oom}");
        let anon = oom["anon_rss_bytes"].as_f64().unwrap_or_default();
        assert!(
            (16.0 * MI..=64.0 * MI).contains(&anon),
            "anon RSS of the 32 MiB-limited hog: {oom}"
        );
        assert!(
            oom["total_vm_bytes"].as_f64() >= oom["rss_bytes"].as_f64(),
            "{oom}"
        );
    } else {
        // The fallback knows the trigger's cgroup, which a memcg OOM kill of the allocating
        // process shares with the victim; 5.10's tracepoint carries no memory figures.
        assert_eq!(oom["cgroup_source"], "trigger", "{oom}");
    }
}

/// Refused reboot(2) calls, each classified by the kernel's reason: the CO-RE reads of the
/// caller checks (`kernel_cap_t` as `u32[2]` before 6.3, one `u64` after) relocate here.
fn assert_refused_reboots_classified(
    lines: &[Value],
    read: &dyn Fn(&str) -> String,
    uname: &str,
    report: &str,
) {
    for (mode, verdict) in [
        ("nobody", "refused_cap"),
        ("userns", "refused_userns"),
        ("pidns", "refused_pidns"),
        ("badmagic", "refused_magic"),
    ] {
        let out = read(&format!("reboot-{mode}"));
        let pid: u64 = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix("caller="))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("nm-reboot-caller {mode}: {out}\n{report}"));
        let ev = lines
            .iter()
            .find(|v| v["kind"] == "reboot" && v["pid"] == pid)
            .unwrap_or_else(|| panic!("no reboot line for {mode} (pid {pid}): {out}\n{report}"));
        eprintln!("reboot {mode} on {uname}: {ev}");
        assert_eq!(ev["verdict"], verdict, "{mode}: {ev}");
    }
}

/// The trace's totals: nothing dropped or malformed, and the OOM kill counted.
fn assert_nothing_dropped(stderr: &str) {
    let totals: Value = stderr
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v.get("totals").is_some())
        })
        .unwrap_or_else(|| panic!("no totals on stderr\n{stderr}"))["totals"]
        .clone();
    assert_eq!(totals["malformed"], 0, "{totals}");
    assert_eq!(totals["drops"], 0, "{totals}");
    assert!(
        totals["kernel_events"]["oom_kill"].as_u64() >= Some(1),
        "{totals}"
    );
}

#[test]
fn probes_on_bookworm_6_1() {
    probes_on(GuestKernel::Bookworm);
}

#[test]
fn probes_on_bullseye_5_10() {
    probes_on(GuestKernel::Bullseye);
}

#[test]
fn probes_on_backports_6_12() {
    probes_on(GuestKernel::Backports);
}
