//! Kernel tier: the real `node-monitor trace` binary streams a real OOM kill as a JSON line
//! attributed to its pod, by UID from the cgroup layout and by name through a real API server.
//! Needs root, the binary (`cargo build -p node-monitor`) and, for the API test, the control-plane
//! binaries (scripts/setup.sh); fails, never skips, without them.
use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::ExitStatusExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
};
use serde_json::Value;

const MEMHOG: &str = env!("CARGO_BIN_EXE_nm-memhog");
const MIB: u64 = 1 << 20;

/// The workspace's `node-monitor` binary (another package's binaries have no
/// `CARGO_BIN_EXE_*`). `NODE_MONITOR_BIN` overrides.
fn node_monitor_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NODE_MONITOR_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("debug/node-monitor");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build -p node-monitor` (or set NODE_MONITOR_BIN)",
        bin.display()
    );
    bin
}

/// Kills the trace process if the test panics.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Lines of a pipe, read on a thread.
fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `node-monitor trace --json --kind oom_kill` with `extra` arguments, once it listens.
struct Trace {
    process: Guard,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// The stderr lines read so far.
    err_lines: Vec<String>,
}

impl Trace {
    fn start(extra: &[&std::ffi::OsStr]) -> Trace {
        let bin = node_monitor_bin();
        let mut process = Guard(
            Command::new(&bin)
                .args(["trace", "--json", "--kind", "oom_kill", "--duration", "120"])
                .args(extra)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("running {}: {e}", bin.display())),
        );
        let stdout = lines(process.0.stdout.take().expect("piped stdout"));
        let stderr = lines(process.0.stderr.take().expect("piped stderr"));
        let mut err_lines = Vec::new();
        wait_line(
            &stderr,
            Duration::from_secs(60),
            "readiness line",
            &mut err_lines,
            |l| l.contains("listening"),
        );
        Trace {
            process,
            stdout,
            stderr,
            err_lines,
        }
    }

    /// Runs `nm-memhog anon 256` in the cgroup `rel` (limited to less), which the kernel OOM-kills;
    /// returns the trace's line for that kill, and the other stdout lines read before it.
    fn oom_kill_line(&self, cg: &TestCgroups, rel: &str) -> (String, Vec<String>) {
        let mut hog = cg
            .spawn_in(rel, Command::new(MEMHOG).args(["anon", "256"]))
            .expect("spawn nm-memhog");
        let pid = hog.id();
        let status = hog.wait().expect("wait for nm-memhog");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        let mut out_lines = Vec::new();
        let line = wait_line(
            &self.stdout,
            Duration::from_secs(30),
            "oom_kill line",
            &mut out_lines,
            |l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["pid"] == pid),
        );
        (line, out_lines)
    }
}

fn wait_line(
    rx: &mpsc::Receiver<String>,
    timeout: Duration,
    what: &str,
    seen: &mut Vec<String>,
    mut pred: impl FnMut(&str) -> bool,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if pred(&line) => return line,
            Ok(line) => seen.push(line),
            Err(_) => panic!("no {what} within {timeout:?}; lines so far: {seen:#?}"),
        }
    }
}

#[test]
fn trace_json_reports_a_real_oom_kill_with_its_pod() {
    require_root("node-monitor trace");
    let mut cg = TestCgroups::new("trace-cli");
    let uid = format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), 0x7ace);
    let cid = format!("{:064x}", u128::from(std::process::id()) << 64 | 0xc1d);
    // The systemd driver's layout (the kernel-tier test of the probes uses cgroupfs').
    let rel = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope",
        uid.replace('-', "_")
    );
    cg.create(&rel).unwrap();
    cg.set_memory_limit(&rel, 32 * MIB).unwrap();

    let mut trace = Trace::start(&[]);
    let (line, out_lines) = trace.oom_kill_line(&cg, &rel);
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["kind"], "oom_kill", "{v}");
    assert!(v["ts_ns"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(v["comm"], "nm-memhog", "{v}");
    assert_eq!(v["cgroup_id"], cg.v2_id(&rel), "{v}");
    assert_eq!(
        v["cgroup_path"],
        format!("/{}/{rel}", cg.rel_root().display()),
        "{v}"
    );
    assert_eq!(v["pod_uid"], uid, "{v}");
    assert_eq!(v["container_id"], cid, "{v}");
    assert_eq!(v["qos_class"], "Burstable", "{v}");
    assert_eq!(v["global"], false, "{v}");
    assert_eq!(v["cgroup_source"], "victim", "{v}");
    let rss = v["rss_bytes"].as_u64().expect("rss_bytes");
    assert!((16 * MIB..=64 * MIB).contains(&rss), "{v}");
    // Only the requested kind is printed, and every line is JSON.
    for l in &out_lines {
        let o: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert_eq!(o["kind"], "oom_kill", "{l}");
    }

    // SIGINT ends the stream with the totals on stderr (stdout stays JSON lines).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(trace.process.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let totals = wait_line(
        &trace.stderr,
        Duration::from_secs(30),
        "totals",
        &mut trace.err_lines,
        |l| l.contains("\"totals\""),
    );
    let status = trace.process.0.wait().unwrap();
    assert!(
        status.success(),
        "trace exited with {status:?}; stderr: {:#?}",
        trace.err_lines
    );
    let t: Value = serde_json::from_str(&totals).unwrap();
    assert!(
        t["totals"]["printed"].as_u64().is_some_and(|n| n >= 1),
        "{t}"
    );
    assert!(
        t["totals"]["kernel_events"]["oom_kill"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{t}"
    );
    assert_eq!(t["totals"]["drops"], 0, "{t}");
    for l in trace.stdout.try_iter() {
        assert!(
            serde_json::from_str::<Value>(&l).is_ok(),
            "non-JSON on stdout: {l}"
        );
    }
}

/// `trace --flight`: a real memcg OOM kill gets a flight record on stdout after its tail: the
/// kill attributed to its pod, the samples of the seconds before it (the pod cgroup's
/// memory.available against its 64 MiB limit, PSI), and an SVG timeline with the kill's marker.
#[test]
fn trace_flight_records_a_real_oom_kill() {
    require_root("node-monitor trace");
    let mut cg = TestCgroups::new("trace-flight");
    let uid = format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), 0xf1a);
    let cid = format!("{:064x}", u128::from(std::process::id()) << 64 | 0xf1a);
    let pod = format!("kubepods/burstable/pod{uid}");
    let rel = format!("{pod}/{cid}");
    cg.create(&rel).unwrap();
    cg.set_memory_limit(&pod, 64 * MIB).unwrap();
    cg.set_memory_limit(&rel, 32 * MIB).unwrap();
    let svg_dir = tempfile::tempdir().unwrap();
    // The memory hierarchy's directory (v1 on a hybrid host, the unified one otherwise).
    let pod_dir = if cg.memory(&pod).is_dir() {
        cg.memory(&pod)
    } else {
        cg.unified(&pod)
    };
    let trace = Trace::start(&[
        "--flight".as_ref(),
        "--flight-cgroup".as_ref(),
        pod_dir.as_os_str(),
        "--flight-svg".as_ref(),
        svg_dir.path().as_os_str(),
    ]);
    // The recorder samples every second: let a few samples precede the kill.
    std::thread::sleep(Duration::from_millis(2500));
    let (line, mut seen) = trace.oom_kill_line(&cg, &rel);
    let kill: Value = serde_json::from_str(&line).unwrap();
    let record = wait_line(
        &trace.stdout,
        Duration::from_secs(30),
        "flight_record line",
        &mut seen,
        |l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["kind"] == "flight_record"),
    );
    let r: Value = serde_json::from_str(&record).unwrap();
    assert_eq!(r["trigger"]["kind"], "oom_kill", "{r}");
    assert_eq!(r["trigger"]["pid"], kill["pid"], "{r}");
    assert_eq!(r["trigger"]["pod"], uid, "{r}");
    assert_eq!(r["trigger"]["global"], false, "{r}");
    let at = r["trigger"]["at_ms"].as_u64().expect("at_ms");
    let samples = r["samples"].as_array().expect("samples");
    let before: Vec<&Value> = samples
        .iter()
        .filter(|s| s["at_ms"].as_u64().is_some_and(|t| t <= at))
        .collect();
    assert!(!before.is_empty(), "samples before the kill: {r}");
    let signal = &before[0]["signals"][0];
    assert_eq!(signal["signal"], "memory.available", "{r}");
    assert_eq!(signal["capacity"], 64 * MIB, "{r}");
    assert!(
        signal["available"]
            .as_i64()
            .is_some_and(|a| a > 0 && a <= 64 * MIB as i64),
        "{r}"
    );
    assert!(before[0]["psi"]["some_avg10"].is_number(), "{r}");
    assert!(
        r["verdict"]
            .as_str()
            .is_some_and(|v| v.contains("in a cgroup's own limit")),
        "{r}"
    );
    let svg = std::fs::read_to_string(svg_dir.path().join(format!("flight-{}.svg", r["id"])))
        .expect("the record's SVG");
    assert!(
        svg.contains("OOM kill: cgroup OOM kill of nm-memhog"),
        "{svg}"
    );
    assert!(svg.contains("memory.available available"), "{svg}");
}

#[test]
fn trace_names_the_pod_through_the_api() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};

    require_root("node-monitor trace");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cp = rt
        .block_on(ControlPlane::start(ControlPlaneOptions::default()))
        .unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    // A pod bound to a node name; nothing runs it: its UID names the test cgroup.
    let node = "nm-trace-node";
    let pods: Api<Pod> = Api::namespaced(cp.client(), "default");
    let pod = PodBuilder::new("memhog")
        .node(node)
        .container_name("hog")
        .image("registry.invalid/memhog:1")
        .build();
    let created = rt
        .block_on(pods.create(&PostParams::default(), &pod))
        .unwrap_or_else(|e| panic!("creating the pod: {e}"));
    let uid = created.metadata.uid.expect("the API server assigns a UID");

    let mut cg = TestCgroups::new("trace-api");
    let cid = format!("{:064x}", u128::from(std::process::id()) << 32 | 0xa91);
    let rel = format!("kubepods/burstable/pod{uid}/{cid}");
    cg.create(&rel).unwrap();
    cg.set_memory_limit(&rel, 32 * MIB).unwrap();

    let trace = Trace::start(&[
        "--node-name".as_ref(),
        node.as_ref(),
        "--kubeconfig".as_ref(),
        cp.kubeconfig_path().as_os_str(),
    ]);
    let (line, _) = trace.oom_kill_line(&cg, &rel);
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["pod_uid"], uid.as_str(), "{v}");
    assert_eq!(v["pod_namespace"], "default", "{v}");
    assert_eq!(v["pod_name"], "memhog", "{v}");
    assert_eq!(v["container_id"], cid, "{v}");
    drop(trace);
    drop(cp);
}
