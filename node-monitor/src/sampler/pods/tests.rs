use std::fs;

use std::{collections::HashSet, path::Path};

use super::*;
use crate::sampler::config::{CgroupVersion, SamplerConfig};
use crate::sampler::walk::{disk_usage, pod_log_dirs};

const UID_A: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
const UID_B: &str = "1a1b2c3d-4e5f-6789-abcd-ef0123456789";
const UID_C: &str = "2a1b2c3d-4e5f-6789-abcd-ef0123456789";

fn layout(root: &Path, kubepods: &str) -> Layout {
    SamplerConfig {
        cgroup_root: root.to_path_buf(),
        cgroup_version: Some(CgroupVersion::V2),
        node_cgroup: "node".into(),
        kubepods_cgroup: kubepods.into(),
        ..SamplerConfig::default()
    }
    .resolve()
    .expect("resolves")
}

fn uids(t: &PodTable) -> Vec<String> {
    let mut v: Vec<String> = t.iter().map(|p| p.uid.clone()).collect();
    v.sort();
    v
}

#[test]
fn walks_both_drivers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let mk = |p: &str| fs::create_dir_all(root.join(p)).expect("mkdir");
    // cgroupfs
    mk(&format!("node/kubepods/pod{UID_A}/c1"));
    mk(&format!("node/kubepods/burstable/pod{UID_B}/c2"));
    mk(&format!("node/kubepods/besteffort/pod{UID_C}"));
    mk("node/kubepods/besteffort/not-a-pod");
    fs::write(root.join("node/kubepods/memory.stat"), "").expect("write");
    let l = layout(root, "kubepods");
    let mut t = PodTable::default();
    t.refresh(&l).expect("refresh");
    assert_eq!(uids(&t), vec![UID_A, UID_B, UID_C]);
    let b = t.iter().find(|p| p.uid == UID_B).expect("pod b");
    assert_eq!(
        b.memory_dir,
        root.join(format!("node/kubepods/burstable/pod{UID_B}"))
    );
    assert_eq!(b.pids_dir.as_ref(), Some(&b.memory_dir));

    // A pod goes away, another comes.
    fs::remove_dir_all(root.join(format!("node/kubepods/pod{UID_A}"))).expect("rm");
    mk(&format!("node/kubepods/burstable/pod{UID_A}"));
    fs::remove_dir_all(root.join(format!("node/kubepods/besteffort/pod{UID_C}"))).expect("rm");
    t.refresh(&l).expect("refresh");
    assert_eq!(uids(&t), vec![UID_A, UID_B]);
    assert!(
        t.iter()
            .any(|p| p.memory_dir.ends_with(format!("burstable/pod{UID_A}")))
    );

    // systemd
    let sd = |u: &str| u.replace('-', "_");
    mk(&format!(
        "node/kubepods.slice/kubepods-pod{}.slice/cri-containerd-x.scope",
        sd(UID_A)
    ));
    mk(&format!(
        "node/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        sd(UID_B)
    ));
    mk(&format!(
        "node/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        sd(UID_C)
    ));
    // The wrong tier prefix is not a pod.
    mk(&format!(
        "node/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{}.slice",
        sd(UID_A)
    ));
    let l = layout(root, "kubepods.slice");
    let mut t = PodTable::default();
    t.refresh(&l).expect("refresh");
    assert_eq!(uids(&t), vec![UID_A, UID_B, UID_C]);
}

#[test]
fn missing_kubepods_is_an_error_and_keeps_the_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let l = layout(dir.path(), "kubepods");
    let mut t = PodTable::default();
    let e = t.refresh(&l).expect_err("no kubepods");
    assert!(e.to_string().contains("kubepods"), "{e}");
    assert_eq!(t.len(), 0);
}

#[test]
fn disk_usage_counts_blocks_once_and_respects_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("pod");
    fs::create_dir_all(root.join("volumes/kubernetes.io~empty-dir/cache")).expect("mkdir");
    let data = vec![7u8; 256 * 1024];
    fs::write(root.join("volumes/kubernetes.io~empty-dir/cache/a"), &data).expect("write");
    fs::hard_link(
        root.join("volumes/kubernetes.io~empty-dir/cache/a"),
        root.join("volumes/kubernetes.io~empty-dir/cache/b"),
    )
    .expect("link");
    let mut seen = HashSet::new();
    let walk = disk_usage(&root, 1000, &mut seen)
        .expect("walks")
        .expect("exists");
    assert!(walk.complete);
    let got = walk.bytes;
    // The file's blocks once, plus directories (a few KiB each at most).
    assert!(got >= 256 * 1024, "{got}");
    assert!(got < 256 * 1024 + 64 * 1024, "{got}");
    // Inodes: pod, volumes, kubernetes.io~empty-dir, cache and the file (its second name is
    // the same inode).
    assert_eq!(walk.inodes, 5);
    seen.clear();
    // Past the budget the walk stops, and what it counted stays as a lower bound: a pod
    // cannot hide its usage behind many entries.
    let part = disk_usage(&root, 3, &mut seen)
        .expect("walks")
        .expect("exists");
    assert!(!part.complete);
    assert!(part.bytes > 0 && part.bytes <= got, "{part:?} vs {got}");
    assert!(part.inodes >= 1 && part.inodes < 5, "{part:?}");
    assert_eq!(
        disk_usage(&dir.path().join("absent"), 10, &mut seen).expect("ok"),
        None
    );
}

#[test]
fn log_dirs_by_uid() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::create_dir(dir.path().join(format!("default_web-0_{UID_A}"))).expect("mkdir");
    fs::create_dir(dir.path().join("junk")).expect("mkdir");
    let m = pod_log_dirs(dir.path());
    assert_eq!(m.len(), 1);
    assert_eq!(m[UID_A], dir.path().join(format!("default_web-0_{UID_A}")));
    assert!(pod_log_dirs(&dir.path().join("absent")).is_empty());
}
