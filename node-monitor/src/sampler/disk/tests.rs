use std::{fs, path::Path};

use node_monitor_core::eviction::local_storage::ContainerStorage;
use serde_json::json;

use super::*;

const UID_A: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
const UID_B: &str = "1a1b2c3d-4e5f-6789-abcd-ef0123456789";

fn paths(root: &Path, budget: u64) -> DiskPaths {
    DiskPaths {
        pods_root: root.join("pods"),
        log_root: root.join("logs"),
        budget,
        proc_root: root.join("proc"),
        layer_roots: vec![root.join("containerd"), root.join("containers")],
    }
}

fn pods(root: &Path, uids: &[&str]) -> Vec<PodRef> {
    uids.iter()
        .map(|u| ((*u).to_owned(), root.join(format!("cgroup/pod{u}"))))
        .collect()
}

fn run_measure(paths: &DiskPaths, pods: &[PodRef]) -> DiskReport {
    measure(
        paths,
        pods,
        &mut LayerCache::new(paths.proc_root.clone(), &paths.layer_roots),
    )
}

#[test]
fn volumes_and_logs_are_summed_and_a_budget_gives_a_lower_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = dir
        .path()
        .join("pods")
        .join(UID_A)
        .join("volumes/kubernetes.io~empty-dir/d");
    fs::create_dir_all(&vol).expect("mkdir");
    fs::write(vol.join("blob"), vec![1u8; 256 * 1024]).expect("write");
    let logs = dir.path().join(format!("logs/default_web_{UID_A}/web"));
    fs::create_dir_all(&logs).expect("mkdir");
    fs::write(logs.join("0.log"), vec![b'x'; 128 * 1024]).expect("write");
    // Pod B: many small files, more entries than the budget.
    let many = dir
        .path()
        .join("pods")
        .join(UID_B)
        .join("volumes/kubernetes.io~empty-dir/d");
    fs::create_dir_all(&many).expect("mkdir");
    for i in 0..50 {
        fs::write(many.join(format!("f{i}")), vec![2u8; 8 * 1024]).expect("write");
    }

    let uids = pods(dir.path(), &[UID_A, UID_B, "absent"]);
    let r = run_measure(&paths(dir.path(), 20), &uids);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(
        r.usage[UID_A].total >= 384 * 1024,
        "{}",
        r.usage[UID_A].total
    );
    // Pod B's walk stopped at 20 entries: what it counted is kept, and flagged.
    assert!(r.usage[UID_B].total >= 8 * 1024, "{}", r.usage[UID_B].total);
    assert!(
        r.usage[UID_B].total < 50 * 8 * 1024,
        "{}",
        r.usage[UID_B].total
    );
    assert_eq!(r.truncated, vec![UID_B.to_owned()]);
    assert!(r.usage[UID_B].truncated && !r.usage[UID_A].truncated);
    assert!(!r.usage.contains_key("absent"));
    // Inodes of pod A: its pod directory, volumes, the plugin directory, the volume and the
    // blob; its log directory, the container's directory and the log file.
    assert_eq!(r.usage[UID_A].inodes, 5 + 3);
    assert_eq!(r.usage[UID_A].layer_inodes, 0);
    // Pod B stopped at the budget: a lower bound.
    assert!(r.usage[UID_B].inodes <= 21, "{}", r.usage[UID_B].inodes);

    let full = run_measure(&paths(dir.path(), 1000), &uids);
    assert!(full.truncated.is_empty());
    assert!(
        full.usage[UID_B].total >= 50 * 8 * 1024,
        "{}",
        full.usage[UID_B].total
    );
    // Four directories and the 50 files.
    assert_eq!(full.usage[UID_B].inodes, 4 + 50);
}

/// A container cgroup `c` of pod A whose process `pid` sees `upper` as its root's upper
/// directory.
fn container(root: &Path, c: &str, procs: &str, pid: u32, upper: &Path) {
    let cg = root.join(format!("cgroup/pod{UID_A}/{c}"));
    fs::create_dir_all(&cg).expect("mkdir");
    fs::write(cg.join("cgroup.procs"), procs).expect("write");
    let p = root.join(format!("proc/{pid}"));
    fs::create_dir_all(&p).expect("mkdir");
    let escaped = upper.display().to_string().replace(' ', "\\040");
    fs::write(
        p.join("mountinfo"),
        format!(
            "1 0 0:50 / / rw,relatime shared:1 - overlay overlay \
                 rw,lowerdir=/l1:/l2,upperdir={escaped},workdir=/w\n\
                 2 1 0:51 / /proc rw - proc proc rw\n"
        ),
    )
    .expect("write");
}

#[test]
fn writable_layers_under_the_allowed_roots_are_added_to_the_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let vol = root
        .join("pods")
        .join(UID_A)
        .join("volumes/kubernetes.io~empty-dir/d");
    fs::create_dir_all(&vol).expect("mkdir");
    fs::write(vol.join("blob"), vec![1u8; 64 * 1024]).expect("write");
    // Container 1 (containerd layout, a space in the path, visible pids): 1 MiB written to
    // its layer.
    let upper1 = root.join("containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/7 x/fs");
    fs::create_dir_all(upper1.join("var/cache")).expect("mkdir");
    fs::write(upper1.join("var/cache/blob"), vec![3u8; 1 << 20]).expect("write");
    container(root, "c1", "4242\n4243\n", 4242, &upper1);
    // Container 2 (CRI-O layout), its processes hidden from cgroup.procs (the reader is in
    // another pid namespace): found by the proc root's <pid>/cgroup.
    let upper2 = root.join("containers/storage/overlay/9f/diff");
    fs::create_dir_all(&upper2).expect("mkdir");
    fs::write(upper2.join("blob"), vec![4u8; 512 * 1024]).expect("write");
    container(root, "c2", "0\n", 777, &upper2);
    fs::write(
        root.join("proc/777/cgroup"),
        format!("0::/../../kubepods/besteffort/pod{UID_A}/c2\n"),
    )
    .expect("write");
    // Container 5 on cgroup v1: the kernel leaves processes outside the reader's pid namespace
    // out of cgroup.procs altogether; found by the proc root's <pid>/cgroup (v1 lines).
    let upper5 = root.join("containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs");
    fs::create_dir_all(&upper5).expect("mkdir");
    fs::write(upper5.join("blob"), vec![7u8; 256 * 1024]).expect("write");
    container(root, "c5", "", 555, &upper5);
    fs::write(
        root.join("proc/555/cgroup"),
        format!(
            "12:pids:/kubepods/besteffort/pod{UID_A}/c5
4:memory:/kubepods/besteffort/pod{UID_A}/c5
"
        ),
    )
    .expect("write");
    // Container 3 points outside the allowed roots: not walked.
    let elsewhere = root.join("elsewhere");
    fs::create_dir_all(&elsewhere).expect("mkdir");
    fs::write(elsewhere.join("blob"), vec![5u8; 4 << 20]).expect("write");
    container(root, "c3", "99\n", 99, &elsewhere);
    // Container 4 climbs out of an allowed root with "..": not walked.
    container(
        root,
        "c4",
        "98\n",
        98,
        &root.join("containerd/../elsewhere"),
    );

    let p = paths(root, 1000);
    let pods = pods(root, &[UID_A]);
    let mut layers = LayerCache::new(p.proc_root.clone(), &p.layer_roots);
    let r = measure(&p, &pods, &mut layers);
    assert!(r.error.is_none(), "{:?}", r.error);
    let with_layers = r.usage[UID_A].total;
    assert!(
        with_layers >= 64 * 1024 + (1 << 20) + 512 * 1024 + 256 * 1024,
        "{with_layers}"
    );
    // The writable layers' part is told apart from the volume's: the kubelet ranks nodefs and
    // imagefs pressure by different parts on a node with a dedicated image filesystem.
    let layer_part = r.usage[UID_A].layers;
    assert!(
        (((1 << 20) + 512 * 1024 + 256 * 1024)..with_layers).contains(&layer_part),
        "layers {layer_part} of {with_layers}"
    );
    assert!(
        with_layers < 4 << 20,
        "a layer outside the roots was walked: {with_layers}"
    );
    // Inodes: the volume's 5 (pod directory, volumes, plugin directory, volume, blob) and the
    // layers' 8 (container 1: fs, var, cache, blob; container 2: diff, blob; container 5: fs,
    // blob); the layer outside the roots adds none.
    assert_eq!(r.usage[UID_A].inodes, 5 + 8);
    assert_eq!(r.usage[UID_A].layer_inodes, 8);

    // The mapping is cached: the processes exit (their proc entries vanish) and the
    // layers still count, including what was written since.
    fs::remove_dir_all(root.join("proc")).expect("rm");
    fs::write(upper1.join("more"), vec![6u8; 1 << 20]).expect("write");
    let r = measure(&p, &pods, &mut layers);
    assert!(
        r.usage[UID_A].total >= with_layers + (1 << 20),
        "{}",
        r.usage[UID_A].total
    );
    assert_eq!(
        r.usage[UID_A].layer_inodes, 9,
        "the new file in container 1's layer"
    );

    // Without allowed roots the pod is volumes only.
    let mut none = p.clone();
    none.layer_roots.clear();
    let r = run_measure(&none, &pods);
    assert!(r.usage[UID_A].total < 1 << 20, "{}", r.usage[UID_A].total);
    assert_eq!(r.usage[UID_A].layers, 0);
}

#[test]
fn the_thread_measures_on_request_and_keeps_the_last_figures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = dir
        .path()
        .join("pods")
        .join(UID_A)
        .join("volumes/kubernetes.io~empty-dir/d");
    fs::create_dir_all(&vol).expect("mkdir");
    fs::write(vol.join("blob"), vec![1u8; 64 * 1024]).expect("write");
    let m = DiskMeter::start(paths(dir.path(), 1000));
    assert!(m.latest(|u| u.is_empty()));
    let cg = dir.path().join("cgroup");
    m.request([(UID_A, cg.as_path())].into_iter());
    m.wait_passes(1);
    let first = m.latest(|u| u[UID_A].total);
    assert!(first >= 64 * 1024, "{first}");
    let (truncated, error) = m.take_outcome().expect("an outcome");
    assert!(truncated.is_empty() && error.is_none());
    assert!(m.take_outcome().is_none(), "taken once");

    fs::write(vol.join("blob2"), vec![1u8; 64 * 1024]).expect("write");
    // Until the next pass finishes, the figures are the last ones.
    assert_eq!(m.latest(|u| u[UID_A].total), first);
    m.request([(UID_A, cg.as_path())].into_iter());
    m.wait_passes(2);
    assert!(m.latest(|u| u[UID_A].total) >= first + 64 * 1024);
}

#[test]
fn empty_dirs_and_container_logs_are_measured_apart_and_add_up_to_the_total() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pod_dir = dir.path().join("pods").join(UID_A);
    for (name, kib) in [("cache", 512usize), ("scratch", 64)] {
        let vol = pod_dir.join("volumes/kubernetes.io~empty-dir").join(name);
        fs::create_dir_all(&vol).expect("mkdir");
        fs::write(vol.join("blob"), vec![1u8; kib * 1024]).expect("write");
    }
    fs::write(pod_dir.join("etc-hosts"), vec![b'h'; 4096]).expect("write");
    for (c, kib) in [("web", 128usize), ("sidecar", 16)] {
        let logs = dir.path().join(format!("logs/default_web_{UID_A}/{c}"));
        fs::create_dir_all(&logs).expect("mkdir");
        fs::write(logs.join("0.log"), vec![b'x'; kib * 1024]).expect("write");
    }

    let r = run_measure(&paths(dir.path(), 1000), &pods(dir.path(), &[UID_A]));
    assert!(r.error.is_none(), "{:?}", r.error);
    let d = &r.detail[UID_A];
    let cache = d.empty_dirs["cache"];
    let scratch = d.empty_dirs["scratch"];
    assert!((512 * 1024..600 * 1024).contains(&cache), "{cache}");
    assert!((64 * 1024..100 * 1024).contains(&scratch), "{scratch}");
    assert_eq!(d.empty_dirs.len(), 2);
    assert!(
        (128 * 1024..160 * 1024).contains(&d.logs["web"]),
        "{:?}",
        d.logs
    );
    assert!(
        (16 * 1024..40 * 1024).contains(&d.logs["sidecar"]),
        "{:?}",
        d.logs
    );
    assert_eq!(d.total, r.usage[UID_A].total);
    // Every part is within the total, which also holds the pod's other files.
    assert!(d.total >= cache + scratch + d.logs["web"] + d.logs["sidecar"] + 4096);
    // Inodes as one walk of each tree counts them: pod directory, etc-hosts, volumes, the
    // plugin directory, two volumes with a blob each; log directory, two containers' with a
    // file each.
    assert_eq!(r.usage[UID_A].inodes, 8 + 5);
}

#[test]
fn containers_get_their_logs_by_name_and_their_layer_by_the_id_their_status_reports() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]},
        "status": {
            "containerStatuses": [{"name": "app", "containerID": "containerd://abc123",
                "ready": true, "restartCount": 0, "image": "", "imageID": ""}],
            "initContainerStatuses": [{"name": "init", "containerID": "cri-o://def456",
                "ready": false, "restartCount": 0, "image": "", "imageID": ""}],
        },
    }))
    .expect("pod");
    let detail = PodDiskDetail {
        total: 1000,
        empty_dirs: BTreeMap::from([("cache".to_owned(), 300)]),
        logs: BTreeMap::from([("app".to_owned(), 40), ("starting".to_owned(), 5)]),
        // The sandbox's layer (no container status) belongs to no container.
        layers: BTreeMap::from([
            ("abc123".to_owned(), 200),
            ("def456".to_owned(), 7),
            ("sandbox".to_owned(), 1),
        ]),
    };
    let u = detail.storage_usage(&pod);
    assert_eq!(u.pod, Some(1000));
    assert_eq!(u.volumes, BTreeMap::from([("cache".to_owned(), 300)]));
    let c = |name: &str, logs: Option<u64>, rootfs: Option<u64>| ContainerStorage {
        name: name.into(),
        logs,
        rootfs,
    };
    assert_eq!(
        u.containers,
        vec![
            c("app", Some(40), Some(200)),
            c("init", None, Some(7)),
            c("starting", Some(5), None),
        ]
    );
}
