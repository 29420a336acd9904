use super::*;

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn kubelet_command_lines() {
    // kubeadm's unit: --config, a few flags, and an eviction flag given twice (merged).
    let (which, inv) = parse_command_line(&argv(
        "/usr/bin/kubelet --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
         --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml \
         --container-runtime-endpoint=unix:///var/run/containerd/containerd.sock \
         --eviction-hard memory.available<200Mi --eviction-hard=nodefs.available<5% \
         --cgroup-root=/kubelet --v=2",
    ))
    .expect("a kubelet");
    assert_eq!(which, Launcher::Kubelet);
    assert_eq!(inv.config.as_deref(), Some("/var/lib/kubelet/config.yaml"));
    assert_eq!(inv.cgroup_root.as_deref(), Some("/kubelet"));
    assert_eq!(
        inv.eviction.eviction_hard,
        vec!["memory.available<200Mi", "nodefs.available<5%"]
    );
    assert!(inv.has_eviction_flags());

    // EKS AL2023: a file and a drop-in directory; Go's single-dash spelling.
    let (_, inv) = parse_command_line(&argv(
        "kubelet -config /etc/kubernetes/kubelet/config.json \
         --config-dir=/etc/kubernetes/kubelet/config.json.d --node-ip=10.0.0.5",
    ))
    .expect("a kubelet");
    assert_eq!(
        inv.config.as_deref(),
        Some("/etc/kubernetes/kubelet/config.json")
    );
    assert_eq!(
        inv.config_dir.as_deref(),
        Some("/etc/kubernetes/kubelet/config.json.d")
    );
    assert!(!inv.has_eviction_flags());

    // AKS: everything in flags.
    let (_, inv) = parse_command_line(&argv(
        "/usr/local/bin/kubelet --enable-server --cgroup-driver=systemd \
         --eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5% \
         --eviction-pressure-transition-period 30s --eviction-max-pod-grace-period=60",
    ))
    .expect("a kubelet");
    assert_eq!(inv.cgroup_driver.as_deref(), Some("systemd"));
    assert_eq!(inv.config, None);
    assert_eq!(
        inv.eviction.eviction_pressure_transition_period.as_deref(),
        Some("30s")
    );
    assert_eq!(
        inv.eviction.eviction_max_pod_grace_period.as_deref(),
        Some("60")
    );

    // A trailing flag without its value is not a value.
    let (_, inv) = parse_command_line(&argv("kubelet --config")).expect("a kubelet");
    assert_eq!(inv.config, None);
}

#[test]
fn k3s_and_rke2_pass_kubelet_args() {
    let (which, inv) = parse_command_line(&argv(
        "/usr/local/bin/k3s server --disable=traefik \
         --kubelet-arg=eviction-hard=memory.available<300Mi \
         --kubelet-arg eviction-soft=memory.available<500Mi \
         --kubelet-arg=--eviction-soft-grace-period=memory.available=1m \
         --kubelet-arg=max-pods=200 --config=/etc/rancher/k3s/config.yaml",
    ))
    .expect("k3s");
    assert_eq!(which, Launcher::K3s);
    assert_eq!(inv.eviction.eviction_hard, vec!["memory.available<300Mi"]);
    assert_eq!(inv.eviction.eviction_soft, vec!["memory.available<500Mi"]);
    assert_eq!(
        inv.eviction.eviction_soft_grace_period,
        vec!["memory.available=1m"]
    );
    // k3s's own --config is its own file, not the kubelet's.
    assert_eq!(inv.config, None);
    assert_eq!(
        launcher(&argv("k3s-agent")),
        Some(Launcher::K3s),
        "k3s renames its process"
    );
    assert_eq!(
        launcher(&argv("/usr/local/bin/rke2 agent --server https://x:9345")),
        Some(Launcher::Rke2)
    );
    // Not a kubelet: other programs, and k3s's other subcommands (`k3s kubectl`).
    for other in [
        "",
        "/usr/bin/containerd",
        "k3s kubectl get pods",
        "/bin/bash -c kubelet --config=/x",
        "kubelet-wrapper --config=/x",
    ] {
        assert_eq!(parse_command_line(&argv(other)), None, "{other:?}");
    }
}

#[test]
fn sources_follow_the_command_line_else_the_well_known_places() {
    // An explicit path wins over everything.
    let s = sources(Some("/etc/kubelet.yaml"), None);
    assert_eq!(s.files, vec!["/etc/kubelet.yaml"]);
    assert!(s.drop_in_dirs.is_empty());

    // No command line seen: every well-known place.
    let s = sources(None, None);
    assert!(!s.from_command_line);
    assert_eq!(s.files[0], KUBEADM_CONFIG);
    assert!(
        s.files
            .contains(&"/etc/kubernetes/kubelet/config.json".to_owned())
    );
    assert!(
        s.files
            .contains(&"/home/kubernetes/kubelet-config.yaml".to_owned())
    );
    assert!(
        s.drop_in_dirs
            .contains(&"/var/lib/rancher/k3s/agent/etc/kubelet.conf.d".to_owned())
    );

    // A kubelet without --config runs on defaults and flags: nothing to look for.
    let kubelet = parse_command_line(&argv("kubelet --cgroup-driver=systemd")).expect("kubelet");
    let s = sources(None, Some(&kubelet));
    assert!(s.from_command_line);
    assert!(s.files.is_empty() && s.drop_in_dirs.is_empty());

    // With --config and --config-dir: exactly those.
    let kubelet =
        parse_command_line(&argv("kubelet --config=/a.yaml --config-dir=/a.d")).expect("kubelet");
    let s = sources(None, Some(&kubelet));
    assert_eq!(s.files, vec!["/a.yaml"]);
    assert_eq!(s.drop_in_dirs, vec!["/a.d"]);

    // k3s: its drop-in directories.
    let k3s = parse_command_line(&argv("k3s agent")).expect("k3s");
    let s = sources(None, Some(&k3s));
    assert!(s.files.is_empty());
    assert_eq!(s.drop_in_dirs.len(), WELL_KNOWN_DROP_IN_DIRS.len());
}

#[test]
fn drop_ins_are_conf_files() {
    for (name, want) in [
        ("00-k3s-defaults.conf", true),
        ("10-eviction.conf", true),
        (".hidden.conf", false),
        ("config.yaml", false),
        ("99.conf.bak", false),
    ] {
        assert_eq!(is_drop_in(name), want, "{name}");
    }
}

#[test]
fn a_huge_command_line_is_cut() {
    let mut a = vec!["kubelet".to_owned()];
    a.extend(std::iter::repeat_n("--v=2".to_owned(), MAX_ARGS + 10));
    a.push("--config=/late.yaml".to_owned());
    let (_, inv) = parse_command_line(&a).expect("kubelet");
    assert_eq!(inv.config, None, "arguments past MAX_ARGS are not read");
}
