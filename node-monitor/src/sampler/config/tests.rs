use std::fs;

use super::*;

#[test]
fn image_fs_discovery_order() {
    let only = |want: &'static str| move |p: &Path| p == Path::new(want);
    assert_eq!(
        discover_image_fs(only("/var/lib/containerd")),
        Some(("/var/lib/containerd".into(), ImageFsSource::Containerd))
    );
    assert_eq!(
        discover_image_fs(only("/var/lib/containers/storage")),
        Some(("/var/lib/containers/storage".into(), ImageFsSource::CriO))
    );
    assert_eq!(
        discover_image_fs(|_| true),
        Some((
            "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into(),
            ImageFsSource::Containerd
        ))
    );
    // k3s: containerd's state under /var/lib/rancher.
    assert_eq!(
        discover_image_fs(|p: &Path| p.starts_with("/var/lib/rancher/k3s")),
        Some((
            "/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs".into(),
            ImageFsSource::Containerd
        ))
    );
    assert_eq!(discover_image_fs(|_| false), None);
}

#[test]
fn auto_follows_the_tree_then_the_kubelet_config() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let kubelet = dir.path().join("kubelet");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&kubelet).unwrap();
    let config = SamplerConfig {
        cgroup_root: root.clone(),
        cgroup_version: Some(CgroupVersion::V2),
        kubepods_cgroup: KUBEPODS_AUTO.into(),
        kubelet_root: kubelet.clone(),
        ..SamplerConfig::default()
    };
    // Nothing yet: the v2 guess, pending.
    let l = config.resolve().unwrap();
    assert_eq!(l.kubepods_name, "kubepods.slice");
    assert_eq!(l.kubepods_detection, KubepodsDetection::Pending);
    assert_eq!(
        l.kubepods_detection.driver_label(&l.kubepods_name),
        "unknown"
    );
    // The kubelet's configuration says cgroupfs.
    fs::write(
        kubelet.join("config.yaml"),
        "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n",
    )
    .unwrap();
    let l = config.resolve().unwrap();
    assert_eq!(l.kubepods_name, "kubepods");
    assert_eq!(
        l.kubepods_detection,
        KubepodsDetection::Detected(CgroupDriver::Cgroupfs, DriverEvidence::KubeletConfig)
    );
    // The tree wins over the configuration.
    fs::create_dir_all(root.join("kubepods.slice")).unwrap();
    let l = config.resolve().unwrap();
    assert_eq!(l.kubepods_memory, root.join("kubepods.slice"));
    assert_eq!(
        l.kubepods_detection,
        KubepodsDetection::Detected(CgroupDriver::Systemd, DriverEvidence::CgroupTree)
    );
    // A malformed configuration is no evidence, never an error.
    fs::write(kubelet.join("config.yaml"), "cgroupDriver: [").unwrap();
    assert_eq!(kubelet_config_driver(&kubelet.join("config.yaml")), None);
    assert_eq!(kubelet_config_driver(&kubelet.join("absent.yaml")), None);
    // A configured name is kept as it is.
    let l = SamplerConfig {
        kubepods_cgroup: "kubepods".into(),
        ..config.clone()
    }
    .resolve()
    .unwrap();
    assert_eq!(l.kubepods_name, "kubepods");
    assert_eq!(l.kubepods_detection, KubepodsDetection::Configured);
}

#[test]
fn a_kubelet_cgroup_root_nests_kubepods() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let kubelet = dir.path().join("kubelet");
    fs::create_dir_all(root.join("system.slice/kubepods.slice.not")).unwrap();
    fs::create_dir_all(&kubelet).unwrap();
    let config = SamplerConfig {
        cgroup_root: root.clone(),
        cgroup_version: Some(CgroupVersion::V2),
        kubepods_cgroup: KUBEPODS_AUTO.into(),
        kubelet_root: kubelet.clone(),
        ..SamplerConfig::default()
    };
    // kind: `cgroupRoot: /kubelet` and the systemd driver in the kubelet's file, before the
    // kubelet made its slices: the name it will make, pending.
    fs::write(
        kubelet.join("config.yaml"),
        "kind: KubeletConfiguration
cgroupDriver: systemd
cgroupRoot: /kubelet
",
    )
    .unwrap();
    let l = config.resolve().unwrap();
    assert_eq!(l.kubepods_name, "kubelet.slice/kubelet-kubepods.slice");
    assert_eq!(l.kubepods_detection, KubepodsDetection::Pending);
    fs::create_dir_all(root.join("kubelet.slice/kubelet-kubepods.slice")).unwrap();
    let l = config.resolve().unwrap();
    assert_eq!(
        l.kubepods_memory,
        root.join("kubelet.slice/kubelet-kubepods.slice")
    );
    assert_eq!(
        l.kubepods_detection,
        KubepodsDetection::Detected(CgroupDriver::Systemd, DriverEvidence::KubeletConfig)
    );
    assert_eq!(
        l.kubepods_detection.driver_label(&l.kubepods_name),
        "systemd"
    );
    // Without a readable configuration, the tree alone: a kubepods cgroup a level down.
    fs::remove_file(kubelet.join("config.yaml")).unwrap();
    let l = config.resolve().unwrap();
    assert_eq!(l.kubepods_name, "kubelet.slice/kubelet-kubepods.slice");
    assert_eq!(
        l.kubepods_detection,
        KubepodsDetection::Detected(CgroupDriver::Systemd, DriverEvidence::CgroupTree)
    );
    // cgroupfs under a root.
    let other = tempfile::tempdir().unwrap();
    fs::create_dir_all(other.path().join("kubelet/kubepods/burstable")).unwrap();
    let l = SamplerConfig {
        cgroup_root: other.path().to_path_buf(),
        ..config.clone()
    }
    .resolve()
    .unwrap();
    assert_eq!(l.kubepods_name, "kubelet/kubepods");
    assert_eq!(
        l.kubepods_detection,
        KubepodsDetection::Detected(CgroupDriver::Cgroupfs, DriverEvidence::CgroupTree)
    );
    // A kubepods cgroup at the root wins over a nested one.
    fs::create_dir_all(other.path().join("kubepods")).unwrap();
    let l = SamplerConfig {
        cgroup_root: other.path().to_path_buf(),
        ..config.clone()
    }
    .resolve()
    .unwrap();
    assert_eq!(l.kubepods_name, "kubepods");
    // A nested path can also be configured.
    let l = SamplerConfig {
        kubepods_cgroup: "kubelet.slice/kubelet-kubepods.slice".into(),
        ..config
    }
    .resolve()
    .unwrap();
    assert_eq!(l.kubepods_detection, KubepodsDetection::Configured);
    assert_eq!(
        l.kubepods_memory,
        root.join("kubelet.slice/kubelet-kubepods.slice")
    );
}

#[test]
fn bad_kubepods_paths_are_named() {
    let base = SamplerConfig {
        cgroup_version: Some(CgroupVersion::V2),
        ..SamplerConfig::default()
    };
    for bad in [
        "kubelet.slice/../../escape".to_owned(),
        "/kubepods".to_owned(),
        "a//b".to_owned(),
        "k/".repeat(600),
    ] {
        let cfg = SamplerConfig {
            kubepods_cgroup: bad.clone(),
            ..base.clone()
        };
        assert_eq!(
            cfg.resolve(),
            Err(ConfigError::KubepodsCgroup { value: bad.clone() })
        );
    }
    let msg = ConfigError::KubepodsCgroup {
        value: "a//b".into(),
    }
    .to_string();
    assert!(
        msg.contains("kubepods_cgroup") && msg.contains("a//b"),
        "{msg}"
    );
}

#[test]
fn bad_values_are_named() {
    let base = SamplerConfig {
        cgroup_version: Some(CgroupVersion::V2),
        ..SamplerConfig::default()
    };
    let cases: Vec<(SamplerConfig, ConfigError)> = vec![
        (
            SamplerConfig {
                node_cgroup: "../escape".into(),
                ..base.clone()
            },
            ConfigError::NodeCgroup {
                value: "../escape".into(),
            },
        ),
        (
            SamplerConfig {
                kubepods_cgroup: String::new(),
                ..base.clone()
            },
            ConfigError::KubepodsCgroup {
                value: String::new(),
            },
        ),
        (
            SamplerConfig {
                full_sample_interval: Duration::ZERO,
                ..base.clone()
            },
            ConfigError::FullSampleInterval {
                value: Duration::ZERO,
            },
        ),
        (
            SamplerConfig {
                allocatable_memory: Some(0),
                ..base.clone()
            },
            ConfigError::AllocatableMemory { value: 0 },
        ),
        (
            SamplerConfig {
                pod_disk_budget: 0,
                ..base.clone()
            },
            ConfigError::PodDiskBudget { value: 0 },
        ),
        (
            SamplerConfig {
                writable_layer_roots: vec!["/var/lib/containerd".into(), "var/lib/x".into()],
                ..base.clone()
            },
            ConfigError::WritableLayerRoot {
                value: "var/lib/x".into(),
            },
        ),
        (
            SamplerConfig {
                writable_layer_roots: vec!["/var/lib/containerd/../..".into()],
                ..base.clone()
            },
            ConfigError::WritableLayerRoot {
                value: "/var/lib/containerd/../..".into(),
            },
        ),
        (
            SamplerConfig {
                writable_layer_roots: vec!["/".into()],
                ..base.clone()
            },
            ConfigError::WritableLayerRoot { value: "/".into() },
        ),
    ];
    for (cfg, want) in cases {
        assert_eq!(cfg.resolve(), Err(want));
    }
    let msg = ConfigError::NodeCgroup {
        value: "../escape".into(),
    }
    .to_string();
    assert!(
        msg.contains("node_cgroup") && msg.contains("../escape"),
        "{msg}"
    );
}

#[test]
fn layouts_for_both_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    // A v1 fixture with pids and a hybrid unified mount.
    for d in ["memory", "pids", "unified"] {
        fs::create_dir(root.join(d)).expect("mkdir");
    }
    fs::write(root.join("memory/memory.usage_in_bytes"), "0\n").expect("write");
    fs::write(root.join("unified/cgroup.controllers"), "\n").expect("write");
    let cfg = SamplerConfig {
        cgroup_root: root.to_path_buf(),
        node_cgroup: "/sim/node-a".into(),
        kubepods_cgroup: "kubepods.slice".into(),
        image_fs: Some("/images".into()),
        ..SamplerConfig::default()
    };
    let l = cfg.resolve().expect("resolves");
    assert_eq!(l.version, CgroupVersion::V1);
    assert!(!l.node_is_root);
    assert_eq!(l.node_memory, root.join("memory/sim/node-a"));
    assert_eq!(l.node_pids, Some(root.join("pids/sim/node-a")));
    assert_eq!(l.node_unified, Some(root.join("unified/sim/node-a")));
    assert_eq!(
        l.kubepods_memory,
        root.join("memory/sim/node-a/kubepods.slice")
    );
    assert_eq!(
        l.image_fs,
        Some(("/images".into(), ImageFsSource::Configured))
    );
    // Without a split container filesystem, containerfs is the image filesystem.
    assert_eq!(l.container_fs, Some("/images".into()));

    // A v2 fixture: the root cgroup.
    let dir2 = tempfile::tempdir().expect("tempdir");
    fs::write(dir2.path().join("cgroup.controllers"), "memory pids\n").expect("write");
    let cfg2 = SamplerConfig {
        cgroup_root: dir2.path().to_path_buf(),
        node_cgroup: "/".into(),
        ..SamplerConfig::default()
    };
    let l2 = cfg2.resolve().expect("resolves");
    assert_eq!(l2.version, CgroupVersion::V2);
    assert!(l2.node_is_root);
    assert_eq!(l2.node_memory, dir2.path());
    assert_eq!(l2.kubepods_memory, dir2.path().join("kubepods"));
    assert_eq!(l2.node_unified.as_deref(), Some(dir2.path()));

    // Neither.
    let empty = tempfile::tempdir().expect("tempdir");
    let cfg3 = SamplerConfig {
        cgroup_root: empty.path().to_path_buf(),
        ..SamplerConfig::default()
    };
    assert_eq!(
        cfg3.resolve(),
        Err(ConfigError::NoMemoryHierarchy {
            root: empty.path().to_path_buf()
        })
    );
}

#[test]
fn the_writable_layer_filesystem_is_walked_for_layers_unless_layers_are_off() {
    let roots = |container_fs: Option<&str>, layer_roots: Vec<&str>| {
        SamplerConfig {
            container_fs: container_fs.map(PathBuf::from),
            writable_layer_roots: layer_roots.into_iter().map(PathBuf::from).collect(),
            ..SamplerConfig::default()
        }
        .layer_roots()
    };
    let default = vec!["/var/lib/containerd", "/var/lib/containers"];
    let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    assert_eq!(roots(None, default.clone()), p(&default));
    assert_eq!(
        roots(Some("/mnt/layers"), default.clone()),
        p(&["/var/lib/containerd", "/var/lib/containers", "/mnt/layers"])
    );
    // Already below a root: nothing added.
    assert_eq!(
        roots(Some("/var/lib/containers/storage"), default.clone()),
        p(&default)
    );
    // Writable layers not counted: still not.
    assert_eq!(roots(Some("/mnt/layers"), vec![]), Vec::<PathBuf>::new());
}
