use super::*;

const HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 33 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
";
const V2: &str = "\
33 25 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
const OTHER: &str = "\
40 25 0:40 / /run/my\\040cgroup rw,relatime - cgroup2 none rw
";

#[test]
fn finds_the_cgroup2_mount() {
    assert_eq!(
        find_cgroup2_mount(HYBRID),
        Some("/sys/fs/cgroup/unified".into())
    );
    assert_eq!(find_cgroup2_mount(V2), Some("/sys/fs/cgroup".into()));
    assert_eq!(find_cgroup2_mount(OTHER), Some("/run/my cgroup".into()));
    assert_eq!(find_cgroup2_mount("garbage\n\n- -"), None);
    assert_eq!(
        find_cgroup2_mount(&HYBRID.replace("cgroup2", "cgroup")),
        None
    );
}

/// Directories have inodes like cgroups do: a temporary tree stands in for the hierarchy.
#[test]
fn walks_resolves_and_rescans_on_miss() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    let cid = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let pod_dir = root.join(format!("kubepods/burstable/pod{uid}"));
    std::fs::create_dir_all(pod_dir.join(cid)).unwrap();
    std::fs::write(pod_dir.join("memory.max"), "max").unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();

    let mut paths = CgroupPaths::new(root).with_limits(1000, Duration::ZERO);
    assert_eq!(paths.path(ino(root)).as_deref(), Some("/"));
    assert_eq!(
        paths.path(ino(&pod_dir.join(cid))).as_deref(),
        Some(format!("/kubepods/burstable/pod{uid}/{cid}").as_str())
    );
    // Files are not cgroups.
    assert_eq!(paths.path(ino(&pod_dir.join("memory.max"))), None);
    let scans = paths.scans();
    // A hit does not walk again.
    paths.path(ino(&pod_dir)).unwrap();
    assert_eq!(paths.scans(), scans);
    // A cgroup created later is found by the walk a miss triggers.
    let late = root.join("kubepods/besteffort");
    std::fs::create_dir_all(&late).unwrap();
    assert_eq!(
        paths.path(ino(&late)).as_deref(),
        Some("/kubepods/besteffort")
    );
    assert_eq!(paths.scans(), scans + 1);
}

#[test]
fn misses_are_rate_limited_and_walks_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::create_dir_all(tmp.path().join(format!("d{i}"))).unwrap();
    }
    let mut paths = CgroupPaths::new(tmp.path()).with_limits(5, Duration::from_secs(3600));
    assert_eq!(paths.path(u64::MAX), None);
    assert_eq!(paths.scans(), 1);
    assert_eq!(paths.len(), 5);
    // Within min_rescan a second miss does not walk.
    assert_eq!(paths.path(u64::MAX - 1), None);
    assert_eq!(paths.scans(), 1);
}

#[test]
fn cgroups_noted_at_creation_resolve_after_removal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("kubepods.slice")).unwrap();
    let mut paths = CgroupPaths::new(dir.path());
    paths.watch().unwrap();
    let scope = dir
        .path()
        .join("kubepods.slice/pod.slice/cri-containerd-1.scope");
    std::fs::create_dir_all(&scope).unwrap();
    let id = std::fs::metadata(&scope).unwrap().ino();
    let pod_id = std::fs::metadata(scope.parent().unwrap()).unwrap().ino();
    // The watcher thread notes it asynchronously: a liveness bound, not a speed assertion.
    let deadline = Instant::now() + Duration::from_secs(10);
    while paths.created_path(id).is_none() {
        assert!(Instant::now() < deadline, "the new cgroup was never noted");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_dir(&scope).unwrap();
    // Gone from the hierarchy, so no walk can find it; the note still resolves it.
    paths.rescan().unwrap();
    assert_eq!(
        paths.path(id).as_deref(),
        Some("/kubepods.slice/pod.slice/cri-containerd-1.scope")
    );
    assert_eq!(
        paths.path(pod_id).as_deref(),
        Some("/kubepods.slice/pod.slice")
    );
}

#[test]
fn a_missing_root_is_an_error_not_a_panic() {
    let mut paths = CgroupPaths::new("/nonexistent/cgroup/root");
    assert!(matches!(paths.rescan(), Err(AttributionError::Read { .. })));
    assert_eq!(paths.path(1), None);
}

#[tokio::test]
async fn attributes_pods_and_non_pods() {
    let tmp = tempfile::tempdir().unwrap();
    let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    let uid_ = uid.replace('-', "_");
    let cid = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let pod = tmp.path().join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope"
        ));
    let system = tmp.path().join("system.slice/sshd.service");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::create_dir_all(&system).unwrap();
    let mut a = Attributor::new(
        CgroupPaths::new(tmp.path()).with_limits(1000, Duration::ZERO),
        Box::new(NoApi),
    );
    let got = a.attribute(std::fs::metadata(&pod).unwrap().ino()).await;
    let p = got.pod.unwrap();
    assert_eq!(p.pod_uid, uid);
    assert_eq!(p.container_id.as_deref(), Some(cid));
    assert_eq!(got.pod_ref, None);
    let got = a.attribute(std::fs::metadata(&system).unwrap().ino()).await;
    assert_eq!(
        got.cgroup_path.as_deref(),
        Some("/system.slice/sshd.service")
    );
    assert_eq!(got.pod, None);
    let got = a.attribute(u64::MAX).await;
    assert_eq!((got.cgroup_path, got.pod), (None, None));
}
