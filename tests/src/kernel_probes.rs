//! The kernel probes on the node's kernel, as `node-monitor trace --json` reports them: every
//! program's load state, a memcg OOM kill with the victim's pid, cgroup id, path and pod
//! (`global: false`), memcg reclaim stalls, and refused reboot(2) calls classified by the kernel's
//! reason (docs/compatibility.md, "Kernels"; docs/kernel-probes.md, "Kernel compatibility").
//!
//! A guest step ([`step_script`]) run at the end of each real-node boot, one per kernel of the
//! matrix (bookworm's 6.1 on the kubeadm node, bullseye's 5.10 on the failover pair's kind node, bookworm-backports'
//! 6.12 on the k3s node): the boots are shared, and the probes meet the node's real kubelet,
//! containerd and node-monitor's own pod beside them. Its files go to the guest's
//! `/mnt/out/probes/`; [`check`] reads them.
use std::collections::BTreeMap;

use serde_json::Value;

use crate::vm::GuestKernel;

const MI: f64 = 1024.0 * 1024.0;

/// The binaries the step runs from `/mnt/host`.
pub const BINARIES: [&str; 3] = ["node-monitor", "nm-memhog", "nm-reboot-caller"];

/// The OOM victim's cgroup is laid out like a systemd-driver container (`@UID_@`, `@CID@` are
/// filled in by [`step_script`]), so the trace line carries a pod UID too; no pod of the node has
/// it.
const TRACE_SCRIPT: &str = r#"
# `log`, `uptime_s` and `within` come from the step library (`vm::SHELL_HELPERS`).
O=/mnt/out/probes
mkdir -p $O
uname -r > $O/uname
ls -l /sys/kernel/btf/vmlinux > $O/btf 2>&1
CG=/sys/fs/cgroup/node-monitor-test
VICTIM="trace/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod@UID_@.slice/cri-containerd-@CID@.scope"
RECLAIMER="trace/reclaimer"
# cgroup v2: each parent hands the memory controller to its children (processes live in leaves
# only). Only directories inside node-monitor-test/ are written; the root's controllers are
# systemd's.
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
stat -c %i "$CG/$VICTIM" > $O/victim-cgroup-id
stat -c %i "$CG/$RECLAIMER" > $O/reclaimer-cgroup-id

# The loader logs each program's state at info, and the disabled ones (with their reason) at
# debug: both are what this test records.
RUST_LOG=info,node_monitor::ebpf=debug NO_COLOR=1 /mnt/host/node-monitor trace --json \
  --stall-budget-ms 1 > $O/trace.jsonl 2> $O/trace.stderr &
TRACE=$!
within 300 grep -q listening $O/trace.stderr || log "trace did not start"
log "trace listening; uptime $(uptime_s)"
cat /sys/kernel/tracing/events/oom/mark_victim/format > $O/mark_victim.format 2>&1

# A memcg OOM: 256 MiB of anonymous memory in a 32 MiB cgroup (the guest has no swap).
( echo $BASHPID > "$CG/$VICTIM/cgroup.procs" && exec /mnt/host/nm-memhog anon 256 ) &
HOG=$!
echo $HOG > $O/victim-pid
wait $HOG
echo $? > $O/victim-status
cat "$CG/$VICTIM/memory.events" > $O/victim-memory.events
# memcg reclaim: a 96 MiB file read again and again in a 48 MiB cgroup, on the disk's file
# system (tmpfs pages are swap-backed and would OOM instead).
( echo $BASHPID > "$CG/$RECLAIMER/cgroup.procs" && exec /mnt/host/nm-memhog pagecache /var/tmp/nm-cache 96 3 ) \
  > $O/reclaimer.log 2>&1
within 60 grep -q '"kind":"oom_kill"' $O/trace.jsonl || log "no oom_kill line"
within 60 grep -q '"kind":"reclaim_stall"' $O/trace.jsonl || log "no reclaim_stall line"
# reboot(2) calls the kernel refuses, one per reason (nm-reboot-caller checks, before each call,
# that it cannot take the guest down).
for m in nobody userns pidns badmagic; do
  /mnt/host/nm-reboot-caller $m > $O/reboot-$m 2>&1
done
within 60 grep -q '"verdict":"refused_magic"' $O/trace.jsonl || log "no refused_magic line"
kill -TERM $TRACE
wait $TRACE
echo $? > $O/trace-exit
rm -f /var/tmp/nm-cache
rmdir "$CG/$RECLAIMER"
p="$VICTIM"; while [ -n "$p" ] && [ "$p" != . ]; do rmdir "$CG/$p"; p=$(dirname "$p"); done
log "done; uptime $(uptime_s)"
sync
"#;

/// A pod UID (UUID-shaped) and a 64-hex container id for the trace test's cgroup.
pub fn ids() -> (String, String) {
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

/// The step's script for a victim pod UID and container id ([`ids`]).
pub fn step_script(uid: &str, cid: &str) -> String {
    TRACE_SCRIPT
        .replace("@UID_@", &uid.replace('-', "_"))
        .replace("@CID@", cid)
}

/// Checks the step's files on `kernel`. `read` reads a file of the guest's `/mnt/out/probes/`;
/// `report` goes into every failure message.
pub fn check(
    kernel: GuestKernel,
    uid: &str,
    cid: &str,
    read: &dyn Fn(&str) -> String,
    report: &str,
) {
    let uname = read("uname");
    assert!(
        uname.starts_with(kernel.release_prefix()),
        "guest kernel {uname}, expected {}",
        kernel.release_prefix()
    );
    assert_eq!(read("trace-exit"), "0", "trace exit status\n{report}");
    assert_eq!(
        read("victim-status"),
        "137",
        "the hog is SIGKILLed by the OOM killer\n{report}"
    );
    let stderr = read("trace.stderr");

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
    let lines: Vec<Value> = read("trace.jsonl")
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
            uid,
            cid,
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

    assert_refused_reboots_classified(&lines, read, &uname, report);
    assert_nothing_dropped(&stderr);
    eprintln!("kernel probes on {uname}: btf {}", read("btf"));
}

/// The `program="…"` line of the loader's log for `name`.
fn program_line<'a>(stderr: &'a str, name: &str) -> Option<&'a str> {
    let needle = format!("program=\"{name}\"");
    stderr.lines().find(|l| l.contains(&needle))
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
