//! The kubelet's cgroup layout: which pod (and container) a cgroup path belongs to.
//!
//! The kubelet puts pods under `kubepods` in a QoS tier (`pkg/kubelet/cm/qos_container_manager_linux.go`,
//! `pod_container_manager_linux.go`), named by the cgroup driver:
//!
//! | driver   | Guaranteed                                  | Burstable / BestEffort                                              |
//! |----------|---------------------------------------------|---------------------------------------------------------------------|
//! | cgroupfs | `/kubepods/pod<uid>/<container>`            | `/kubepods/burstable/pod<uid>/<container>`                          |
//! | systemd  | `/kubepods.slice/kubepods-pod<uid_>.slice/…` | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/<runtime>-<id>.scope` |
//!
//! With the systemd driver the UID's dashes become underscores (systemd reserves `-` as the slice
//! hierarchy separator). The same relative paths appear under each cgroup v1 hierarchy and under the
//! cgroup v2 root; the parser takes a path relative to any of them, or an absolute one that contains
//! the layout.

use std::fmt;

use serde::Serialize;

/// A pod's QoS class, as the kubelet derives it (`pkg/apis/core/v1/helper/qos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum QosClass {
    /// CPU and memory limits set, with requests equal to them, on every container (or at pod level).
    Guaranteed,
    /// Neither Guaranteed nor BestEffort: some request or limit is set.
    Burstable,
    /// No container sets a CPU or memory request or limit.
    BestEffort,
}

impl QosClass {
    /// The API spelling (`status.qosClass`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kubelet's cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// Plain cgroup directories (`kubepods/burstable/pod<uid>`).
    Cgroupfs,
    /// systemd slices (`kubepods.slice/kubepods-burstable.slice/…`).
    Systemd,
}

impl CgroupDriver {
    /// The kubepods cgroup this driver creates under the node's cgroup root.
    pub fn kubepods_name(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "kubepods",
            CgroupDriver::Systemd => "kubepods.slice",
        }
    }

    /// The KubeletConfiguration spelling (`cgroupfs`, `systemd`).
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }

    /// The KubeletConfiguration `cgroupDriver` value.
    pub fn parse(value: &str) -> Option<CgroupDriver> {
        match value {
            "cgroupfs" => Some(CgroupDriver::Cgroupfs),
            "systemd" => Some(CgroupDriver::Systemd),
            _ => None,
        }
    }
}

/// Where the cgroup driver was learnt from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverEvidence {
    /// Only one of `kubepods` and `kubepods.slice` exists.
    CgroupTree,
    /// The kubelet's configuration says so (both exist, or neither yet).
    KubeletConfig,
    /// Both exist and the kubelet's configuration is unreadable: the systemd slice, which a
    /// node switched to the systemd driver keeps using.
    BothPreferSystemd,
}

/// The kubepods layout as far as it can be told: from the cgroup tree under the node cgroup
/// (which directories exist) and the kubelet's configured `cgroupDriver`, when readable. `None`:
/// not yet known (no kubepods cgroup yet, and no readable kubelet configuration); the caller
/// looks again later rather than locking in a guess.
pub fn detect_driver(
    slice_exists: bool,
    plain_exists: bool,
    kubelet_driver: Option<CgroupDriver>,
) -> Option<(CgroupDriver, DriverEvidence)> {
    match (slice_exists, plain_exists, kubelet_driver) {
        (true, false, _) => Some((CgroupDriver::Systemd, DriverEvidence::CgroupTree)),
        (false, true, _) => Some((CgroupDriver::Cgroupfs, DriverEvidence::CgroupTree)),
        (_, _, Some(d)) => Some((d, DriverEvidence::KubeletConfig)),
        (true, true, None) => Some((CgroupDriver::Systemd, DriverEvidence::BothPreferSystemd)),
        (false, false, None) => None,
    }
}

/// What a cgroup path says about the pod that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodCgroup {
    /// The pod UID in its API form (with dashes).
    pub pod_uid: String,
    /// The QoS tier the pod's cgroup sits in.
    pub qos: QosClass,
    /// The layout the path follows.
    pub driver: CgroupDriver,
    /// The container ID when the path reaches into a container's cgroup (runtime prefix removed).
    pub container_id: Option<String>,
    /// The pod-level cgroup path: the input cut after the pod directory.
    pub pod_path: String,
}

/// Parses a cgroup path in either kubelet layout. Returns `None` for paths outside `kubepods`.
///
/// A kubelet with a `cgroupRoot` (kind's `/kubelet`) nests the layout: `kubelet/kubepods/…` with
/// cgroupfs, and with systemd every slice carries the root's prefix
/// (`kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod<uid_>.slice`).
pub fn parse_cgroup_path(path: &str) -> Option<PodCgroup> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let start = parts
        .iter()
        .position(|p| *p == "kubepods" || systemd_kubepods_prefix(p).is_some())?;
    if parts[start] == "kubepods" {
        parse_cgroupfs(&parts, start)
    } else {
        parse_systemd(&parts, start)
    }
}

/// The slice-name prefix of a systemd kubepods slice: `kubepods-` for `kubepods.slice`,
/// `kubelet-kubepods-` for `kubelet-kubepods.slice`; `None` for any other name.
fn systemd_kubepods_prefix(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".slice")?;
    (stem == "kubepods" || stem.ends_with("-kubepods")).then(|| format!("{stem}-"))
}

/// The kubepods cgroup, relative to the node's cgroup root, for a kubelet's `cgroupRoot` and
/// cgroup driver, as the kubelet names it (`NewCgroupName(cgroupRoot, "kubepods")`, then
/// `ToSystemd` or `ToCgroupfs`): `/` gives `kubepods` or `kubepods.slice`; kind's `/kubelet`
/// gives `kubelet/kubepods` or `kubelet.slice/kubelet-kubepods.slice`. `None` for a root with
/// `..` or `.` components.
pub fn kubepods_relative(cgroup_root: &str, driver: CgroupDriver) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in cgroup_root.split('/').filter(|c| !c.is_empty()) {
        if c == ".." || c == "." {
            return None;
        }
        parts.push(c.to_owned());
    }
    match driver {
        CgroupDriver::Cgroupfs => {
            parts.push("kubepods".to_owned());
            Some(parts.join("/"))
        }
        CgroupDriver::Systemd => {
            // A root given in systemd's own form (`/kubelet.slice`) names the same slice.
            let names: Vec<String> = parts
                .iter()
                .map(|p| p.strip_suffix(".slice").unwrap_or(p).replace('-', "_"))
                .chain(std::iter::once("kubepods".to_owned()))
                .collect();
            let mut out = Vec::new();
            for i in 0..names.len() {
                out.push(format!("{}.slice", names[..=i].join("-")));
            }
            Some(out.join("/"))
        }
    }
}

fn parse_cgroupfs(parts: &[&str], start: usize) -> Option<PodCgroup> {
    let mut i = start + 1;
    let qos = match *parts.get(i)? {
        "burstable" => {
            i += 1;
            QosClass::Burstable
        }
        "besteffort" => {
            i += 1;
            QosClass::BestEffort
        }
        _ => QosClass::Guaranteed,
    };
    let uid = parts.get(i)?.strip_prefix("pod")?;
    if !is_uid(uid) {
        return None;
    }
    let container_id = parts.get(i + 1).map(|c| container_id(c));
    Some(PodCgroup {
        pod_uid: uid.to_owned(),
        qos,
        driver: CgroupDriver::Cgroupfs,
        container_id,
        pod_path: join_prefix(parts, i),
    })
}

fn parse_systemd(parts: &[&str], start: usize) -> Option<PodCgroup> {
    let root = systemd_kubepods_prefix(parts[start])?;
    let mut i = start + 1;
    let tier = parts.get(i)?;
    let qos = match tier.strip_prefix(root.as_str()) {
        Some("burstable.slice") => {
            i += 1;
            QosClass::Burstable
        }
        Some("besteffort.slice") => {
            i += 1;
            QosClass::BestEffort
        }
        _ => QosClass::Guaranteed,
    };
    let prefix = match qos {
        QosClass::Guaranteed => format!("{root}pod"),
        QosClass::Burstable => format!("{root}burstable-pod"),
        QosClass::BestEffort => format!("{root}besteffort-pod"),
    };
    let uid = parts
        .get(i)?
        .strip_prefix(prefix.as_str())?
        .strip_suffix(".slice")?
        .replace('_', "-");
    if !is_uid(&uid) {
        return None;
    }
    let container_id = parts.get(i + 1).map(|c| container_id(c));
    Some(PodCgroup {
        pod_uid: uid,
        qos,
        driver: CgroupDriver::Systemd,
        container_id,
        pod_path: join_prefix(parts, i),
    })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, `crio-<id>` or a bare id.
fn container_id(segment: &str) -> String {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    for prefix in [
        "cri-containerd-",
        "crio-conmon-",
        "crio-",
        "docker-",
        "containerd-",
    ] {
        if let Some(id) = s.strip_prefix(prefix) {
            return id.to_owned();
        }
    }
    s.to_owned()
}

/// A Kubernetes UID: a UUID (36 chars, 8-4-4-4-12 hex), or for static pods a 32-hex hash.
fn is_uid(s: &str) -> bool {
    let hex = |c: char| c.is_ascii_hexdigit();
    match s.len() {
        36 => s.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                hex(c)
            }
        }),
        32 => s.chars().all(hex),
        _ => false,
    }
}

fn join_prefix(parts: &[&str], last: usize) -> String {
    let mut s = String::new();
    for p in &parts[..=last] {
        s.push('/');
        s.push_str(p);
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn drivers_from_the_tree_and_the_kubelet_config() {
        use CgroupDriver::*;
        use DriverEvidence::*;
        let cases = [
            // (kubepods.slice, kubepods, kubelet config) -> detected
            (true, false, None, Some((Systemd, CgroupTree))),
            (true, false, Some(Cgroupfs), Some((Systemd, CgroupTree))),
            (false, true, None, Some((Cgroupfs, CgroupTree))),
            (false, true, Some(Systemd), Some((Cgroupfs, CgroupTree))),
            (true, true, Some(Cgroupfs), Some((Cgroupfs, KubeletConfig))),
            (true, true, None, Some((Systemd, BothPreferSystemd))),
            (false, false, Some(Systemd), Some((Systemd, KubeletConfig))),
            (
                false,
                false,
                Some(Cgroupfs),
                Some((Cgroupfs, KubeletConfig)),
            ),
            (false, false, None, None),
        ];
        for (slice, plain, config, want) in cases {
            assert_eq!(
                detect_driver(slice, plain, config),
                want,
                "slice={slice} plain={plain} config={config:?}"
            );
        }
        assert_eq!(Systemd.kubepods_name(), "kubepods.slice");
        assert_eq!(Cgroupfs.kubepods_name(), "kubepods");
        assert_eq!(CgroupDriver::parse("systemd"), Some(Systemd));
        assert_eq!(CgroupDriver::parse("Systemd"), None);
    }

    use super::*;

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    const CID: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn layouts() {
        let uid_ = UID.replace('-', "_");
        type Want<'a> = Option<(QosClass, CgroupDriver, Option<&'a str>)>;
        let cases: Vec<(String, Want<'_>)> = vec![
            (
                format!("/kubepods/pod{UID}/{CID}"),
                Some((QosClass::Guaranteed, CgroupDriver::Cgroupfs, Some(CID))),
            ),
            (
                format!("/kubepods/burstable/pod{UID}"),
                Some((QosClass::Burstable, CgroupDriver::Cgroupfs, None)),
            ),
            (
                format!("/sys/fs/cgroup/memory/kubepods/besteffort/pod{UID}/crio-{CID}"),
                Some((QosClass::BestEffort, CgroupDriver::Cgroupfs, Some(CID))),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{CID}.scope"),
                Some((QosClass::Guaranteed, CgroupDriver::Systemd, Some(CID))),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-{CID}.scope"
                ),
                Some((QosClass::Burstable, CgroupDriver::Systemd, Some(CID))),
            ),
            (
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice"
                ),
                Some((QosClass::BestEffort, CgroupDriver::Systemd, None)),
            ),
            // A test subtree prefix in front of the layout still parses.
            (
                format!("/node-monitor-test/x/kubepods/burstable/pod{UID}/{CID}"),
                Some((QosClass::Burstable, CgroupDriver::Cgroupfs, Some(CID))),
            ),
            // kind: `cgroupRoot: /kubelet`, each slice prefixed with the root's name.
            (
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{uid_}.slice/cri-containerd-{CID}.scope"
                ),
                Some((QosClass::Burstable, CgroupDriver::Systemd, Some(CID))),
            ),
            (
                format!("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{uid_}.slice"),
                Some((QosClass::Guaranteed, CgroupDriver::Systemd, None)),
            ),
            (
                format!("/kubelet/kubepods/besteffort/pod{UID}/{CID}"),
                Some((QosClass::BestEffort, CgroupDriver::Cgroupfs, Some(CID))),
            ),
            // A root-prefixed tier with the plain pod name (or the other way) is not a pod.
            (
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
                ),
                None,
            ),
            (
                format!("/kubelet.slice/kubelet-kubepods.slice/kubepods-pod{uid_}.slice"),
                None,
            ),
            // Not pods.
            ("/system.slice/containerd.service".to_owned(), None),
            ("/kubelet.slice/kubelet-kubepods.slice".to_owned(), None),
            ("/kubepods/burstable".to_owned(), None),
            ("/kubepods.slice/kubepods-burstable.slice".to_owned(), None),
            ("/kubepods/burstable/podnot-a-uid".to_owned(), None),
            // Wrong QoS prefix for the tier.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{uid_}.slice"
                ),
                None,
            ),
            (String::new(), None),
        ];
        for (path, want) in cases {
            let got = parse_cgroup_path(&path);
            match (got, want) {
                (None, None) => {}
                (Some(g), Some((qos, driver, cid))) => {
                    assert_eq!(g.pod_uid, UID, "{path}");
                    assert_eq!(g.qos, qos, "{path}");
                    assert_eq!(g.driver, driver, "{path}");
                    assert_eq!(g.container_id.as_deref(), cid, "{path}");
                }
                (g, w) => panic!("{path}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn the_kubepods_cgroup_under_a_cgroup_root() {
        use CgroupDriver::*;
        for (root, driver, want) in [
            ("/", Systemd, Some("kubepods.slice")),
            ("/", Cgroupfs, Some("kubepods")),
            ("", Systemd, Some("kubepods.slice")),
            // kind
            (
                "/kubelet",
                Systemd,
                Some("kubelet.slice/kubelet-kubepods.slice"),
            ),
            ("/kubelet", Cgroupfs, Some("kubelet/kubepods")),
            (
                "/kubelet.slice",
                Systemd,
                Some("kubelet.slice/kubelet-kubepods.slice"),
            ),
            (
                "/a/b-c",
                Systemd,
                Some("a.slice/a-b_c.slice/a-b_c-kubepods.slice"),
            ),
            ("/a/b", Cgroupfs, Some("a/b/kubepods")),
            ("/../x", Cgroupfs, None),
            ("/./x", Systemd, None),
        ] {
            assert_eq!(
                kubepods_relative(root, driver).as_deref(),
                want,
                "{root} {driver:?}"
            );
        }
        // What it names is what the parser reads.
        let uid_ = UID.replace('-', "_");
        let kp = kubepods_relative("/kubelet", Systemd).expect("valid");
        let pod = format!(
            "{kp}/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{uid_}.slice"
        );
        assert_eq!(
            parse_cgroup_path(&pod).map(|p| p.qos),
            Some(QosClass::BestEffort)
        );
    }

    #[test]
    fn pod_path_is_cut_after_the_pod_directory() {
        let g = parse_cgroup_path(&format!("/kubepods/burstable/pod{UID}/{CID}")).expect("parses");
        assert_eq!(g.pod_path, format!("/kubepods/burstable/pod{UID}"));
    }
}
