use clap::Parser;

use super::*;
use crate::ebpf::{
    OomKillEvent, OomMemory, OomScope, RebootCmd, RebootEvent, ReclaimFlavor, TaskInfo,
};

use node_monitor_core::kubelet::layout::parse_cgroup_path;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
    Cli::try_parse_from(std::iter::once("trace").chain(argv.iter().copied())).map(|c| c.args)
}

const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
const CID: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn task(pid: u32, comm: &str, cgroup_id: u64) -> TaskInfo {
    TaskInfo {
        pid,
        tid: pid,
        comm: comm.into(),
        cgroup_id,
    }
}

fn pod_attribution(cgroup_id: u64) -> Attribution {
    let path = format!("/kubepods/burstable/pod{UID}/{CID}");
    Attribution {
        cgroup_id,
        pod: parse_cgroup_path(&path),
        cgroup_path: Some(path),
        pod_ref: None,
    }
}

fn oom(victim_cgroup: Option<u64>) -> KernelEvent {
    KernelEvent::OomKill(OomKillEvent {
        ts_ns: 1_500_000_000,
        trigger: task(10, "trigger", 7),
        victim_pid: 42,
        victim_tid: 42,
        victim_comm: Some("memhog".into()),
        victim_cgroup_id: victim_cgroup,
        memory: Some(OomMemory {
            total_vm_bytes: 300 << 20,
            anon_rss_bytes: 30 << 20,
            file_rss_bytes: 1 << 20,
            shmem_rss_bytes: 0,
            pgtables_bytes: 4096,
        }),
        uid: Some(0),
        oom_score_adj: Some(0),
        scope: OomScope::Memcg,
        trigger_reclaim: Some(ReclaimFlavor::Memcg),
    })
}

#[test]
fn args_parse_and_reject_bad_values() {
    let a = parse(&["--json", "--kind", "oom_kill,reboot", "--duration", "2.5"]).unwrap();
    assert!(a.json);
    assert_eq!(a.kind, vec![EventKind::OomKill, EventKind::Reboot]);
    assert_eq!(a.duration, Some(Duration::from_millis(2500)));
    let c = a.probe_config();
    assert!(c.disable.contains("kswapd"));
    assert!(
        !c.disable.contains("reclaim"),
        "OOM classification needs reclaim"
    );
    assert!(!c.disable.contains("oom"));
    assert!(a.wants(EventKind::Reboot) && !a.wants(EventKind::ReclaimStall));
    let all = parse(&[]).unwrap();
    // Every family but the memory push, which has no events to show.
    assert_eq!(all.probe_config().disable, ["mem_push".to_owned()].into());
    assert!(all.wants(EventKind::KswapdWake) && !all.wants(EventKind::Synthetic));

    let e = parse(&["--kind", "oom"]).unwrap_err().to_string();
    assert!(e.contains("unknown kind \"oom\""), "{e}");
    for bad in ["0", "-1", "NaN", "inf", "soon"] {
        let e = parse(&[&format!("--duration={bad}")])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("duration {bad:?}")), "{e}");
    }
    let e = parse(&["--stall-window-ms", "0"])
        .unwrap()
        .probe_config()
        .validate();
    assert_eq!(e.unwrap_err().field, "stall_window");
}

#[test]
fn oom_json_has_the_documented_fields() {
    let at = pod_attribution(99);
    let v = event_json(&oom(Some(99)), &at, None);
    assert_eq!(v["kind"], "oom_kill");
    assert_eq!(v["ts_ns"], 1_500_000_000u64);
    assert_eq!(v["pid"], 42);
    assert_eq!(v["comm"], "memhog");
    assert_eq!(v["cgroup_id"], 99);
    assert_eq!(
        v["cgroup_path"],
        format!("/kubepods/burstable/pod{UID}/{CID}")
    );
    assert_eq!(v["pod_uid"], UID);
    assert_eq!(v["container_id"], CID);
    assert_eq!(v["qos_class"], "Burstable");
    assert_eq!(v["global"], false);
    assert_eq!(v["rss_bytes"], (31u64 << 20));
    assert_eq!(v["cgroup_source"], "victim");
    assert_eq!(v["trigger_pid"], 10);
    assert_eq!(v["pod_name"], Value::Null);
}

#[test]
fn non_pod_and_unknown_cgroups_are_null() {
    let at = Attribution {
        cgroup_id: 5,
        cgroup_path: Some("/system.slice/sshd.service".into()),
        pod: None,
        pod_ref: None,
    };
    let ev = KernelEvent::Reboot(RebootEvent {
        ts_ns: 1,
        task: task(1, "systemd", 5),
        cmd: RebootCmd::PowerOff,
        cmd_raw: 0x4321_fedc,
        magic1: 0xfee1_dead,
        magic2: 0x2812_1969,
        verdict: crate::ebpf::RebootGate::Allowed,
        caller: None,
        suppressed: 0,
    });
    let v = event_json(&ev, &at, None);
    assert_eq!(v["verdict"], "allowed");
    assert_eq!(v["caller"], Value::Null);
    assert_eq!(v["pod_uid"], Value::Null);
    assert_eq!(v["container_id"], Value::Null);
    assert_eq!(v["cmd"], "power_off");
    assert_eq!(v["goes_down"], true);
    assert_eq!(v["comm"], "systemd");
    let t = event_text(&ev, &at);
    assert!(
        t.contains("reboot")
            && t.contains("cmd=power_off")
            && t.contains("cgroup=/system.slice/sshd.service"),
        "{t}"
    );
    let unknown = Attribution {
        cgroup_path: None,
        ..at
    };
    assert!(event_text(&ev, &unknown).contains("cgroup_id=5"));
}

#[test]
fn oom_text_names_pod_and_scope() {
    let t = event_text(&oom(Some(99)), &pod_attribution(99));
    assert!(t.starts_with("1.500000 oom_kill"), "{t}");
    assert!(t.contains(&format!("pod={UID} qos=Burstable")), "{t}");
    assert!(t.contains("container=9f86d081884c"), "{t}");
    assert!(t.contains("oom=memcg") && t.contains("rss=31744KiB"), "{t}");
    assert!(t.contains("trigger=10/trigger"), "{t}");
}

#[test]
fn text_cuts_long_container_ids_on_char_boundaries() {
    let mut at = pod_attribution(99);
    if let Some(p) = at.pod.as_mut() {
        p.container_id = Some("é".repeat(20));
    }
    let t = event_text(&oom(Some(99)), &at);
    assert!(t.contains(&format!("container={} ", "é".repeat(12))), "{t}");
}

#[test]
fn oom_without_victim_cgroup_says_so() {
    let v = event_json(&oom(None), &pod_attribution(7), None);
    assert_eq!(v["cgroup_source"], "trigger");
    assert_eq!(v["cgroup_id"], 7);
}

/// `--flight` keeps every probe family loaded whatever `--kind`, and its options need it.
#[test]
fn flight_keeps_every_kind_and_its_options_need_it() {
    let a = parse(&["--kind", "oom_kill", "--flight"]).unwrap();
    assert!(
        a.probe_config().disable == ["mem_push".to_owned()].into(),
        "{:?}",
        a.probe_config().disable
    );
    assert!(parse(&["--flight-cgroup", "/x"]).is_err());
    assert!(parse(&["--flight-svg", "/x"]).is_err());
}

/// The trace's flight record: the cgroup's memory.available sampled, the kill attributed to its
/// pod, printed as a JSON line once the tail has passed (not before), with its SVG file; the rest
/// at exit. A directory that is no memory cgroup is refused, naming it.
#[test]
fn the_trace_prints_a_flight_record_after_the_tail() {
    let cg = tempfile::tempdir().unwrap();
    for (f, v) in [
        ("memory.current", "300000000\n"),
        ("memory.stat", "anon 1\nfile 2\ninactive_file 100000000\n"),
        ("memory.max", "1073741824\n"),
    ] {
        std::fs::write(cg.path().join(f), v).unwrap();
    }
    let svg = tempfile::tempdir().unwrap();
    let mut f =
        flight::TraceFlight::new(Some(cg.path().to_owned()), Some(svg.path().join("out"))).unwrap();
    f.sample(10_000);
    f.sample(11_000);
    f.event(&oom(Some(9)), &pod_attribution(9), 11_500);
    let mut out = Vec::new();
    f.flush(Some(12_000), true, &mut out).unwrap();
    assert!(out.is_empty(), "printed before its tail");
    f.flush(
        Some(11_500 + node_monitor_core::flight::TAIL_MS + 1),
        true,
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out.clone()).unwrap();
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["kind"], "flight_record", "{v}");
    assert_eq!(v["trigger"]["kind"], "oom_kill", "{v}");
    assert_eq!(v["trigger"]["pod"], UID, "{v}");
    assert_eq!(v["samples"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        v["samples"][0]["signals"][0]["signal"], "memory.available",
        "{v}"
    );
    assert_eq!(
        v["samples"][0]["signals"][0]["available"],
        1_073_741_824 - 200_000_000,
        "{v}"
    );
    let drawn = std::fs::read_to_string(svg.path().join("out/flight-0.svg")).unwrap();
    assert!(drawn.contains("OOM kill"), "{drawn}");
    // Printed once; a kill whose tail has not passed is printed at exit.
    f.event(&oom(Some(9)), &pod_attribution(9), 30_000);
    out.clear();
    f.flush(Some(30_001), true, &mut out).unwrap();
    assert!(out.is_empty());
    f.flush(None, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("node record 1"), "{text}");
    // A v1 memory hierarchy's cgroup: usage_in_bytes, total_inactive_file, limit_in_bytes.
    let v1 = tempfile::tempdir().unwrap();
    for (name, v) in [
        ("memory.usage_in_bytes", "300000000\n"),
        (
            "memory.stat",
            "inactive_file 1\ntotal_inactive_file 200000000\n",
        ),
        ("memory.limit_in_bytes", "1073741824\n"),
    ] {
        std::fs::write(v1.path().join(name), v).unwrap();
    }
    let mut f = flight::TraceFlight::new(Some(v1.path().to_owned()), None).unwrap();
    f.sample(1_000);
    f.event(&oom(Some(9)), &pod_attribution(9), 1_500);
    let mut out = Vec::new();
    f.flush(None, true, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["samples"][0]["signals"][0]["available"],
        1_073_741_824 - 100_000_000,
        "{v}"
    );
    let e = flight::TraceFlight::new(Some(svg.path().to_owned()), None)
        .err()
        .expect("not a cgroup");
    assert!(e.to_string().contains("--flight-cgroup"), "{e}");
}
