use super::*;

const CONTAINERD: &str =
    "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/42/fs";

fn line(mountpoint: &str, optional: &str, fstype: &str, supers: &str) -> String {
    format!("1234 1200 0:91 / {mountpoint} rw,relatime {optional}- {fstype} overlay {supers}\n")
}

#[test]
fn root_layer_table() {
    let proc_lines = "1300 1234 0:95 / /proc rw,nosuid - proc proc rw\n";
    let cases: Vec<(&str, String, Result<RootLayer, ()>)> = vec![
        (
            "containerd overlay, shared optional field",
            line(
                "/",
                "shared:5 ",
                "overlay",
                &format!(
                    "rw,lowerdir=/var/lib/containerd/a/fs:/var/lib/containerd/b/fs,upperdir={CONTAINERD},workdir=/w"
                ),
            ) + proc_lines,
            Ok(RootLayer::Upper(CONTAINERD.into())),
        ),
        (
            "CRI-O overlay, several optional fields",
            line(
                "/",
                "shared:1 master:2 ",
                "overlay",
                "rw,lowerdir=/var/lib/containers/storage/overlay/l/A,upperdir=/var/lib/containers/storage/overlay/9f/diff,workdir=/var/lib/containers/storage/overlay/9f/work,volatile",
            ),
            Ok(RootLayer::Upper(
                "/var/lib/containers/storage/overlay/9f/diff".into(),
            )),
        ),
        (
            "no optional fields",
            line("/", "", "overlay", "rw,upperdir=/u,workdir=/w"),
            Ok(RootLayer::Upper("/u".into())),
        ),
        (
            "escaped space, tab, newline, backslash and comma in the upper path",
            line(
                "/",
                "",
                "overlay",
                r"rw,upperdir=/var/lib/containerd/my\040dir\011x\012y\134z\054w/fs,workdir=/w",
            ),
            Ok(RootLayer::Upper(
                "/var/lib/containerd/my dir\tx\ny\\z,w/fs".into(),
            )),
        ),
        (
            "escaped mount point is not the root",
            line(r"/\040", "", "overlay", "rw,upperdir=/u"),
            Ok(RootLayer::NoRoot),
        ),
        (
            "the mount on top of / wins",
            line("/", "", "overlay", "rw,upperdir=/first")
                + &line("/", "", "overlay", "rw,upperdir=/second"),
            Ok(RootLayer::Upper("/second".into())),
        ),
        (
            "a read-only overlay",
            line("/", "", "overlay", "ro,lowerdir=/a:/b"),
            Ok(RootLayer::NoUpperdir),
        ),
        (
            "not an overlay",
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n".into(),
            Ok(RootLayer::NotOverlay {
                fstype: "ext4".into(),
            }),
        ),
        (
            "a '-' as mount point is not the separator",
            "22 1 8:1 / - rw - ext4 /dev/sda1 rw\n".into(),
            Ok(RootLayer::NoRoot),
        ),
        ("empty", String::new(), Ok(RootLayer::NoRoot)),
        (
            "no separator",
            "22 1 8:1 / / rw,relatime shared:1 ext4 /dev/sda1 rw\n".into(),
            Err(()),
        ),
        (
            "missing super options",
            "22 1 8:1 / / rw,relatime - ext4 /dev/sda1\n".into(),
            Err(()),
        ),
    ];
    for (name, text, want) in cases {
        let got = root_layer(text.as_bytes());
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{name}"),
            (Err(e), Err(())) => {
                assert!(e.to_string().contains("mountinfo line"), "{name}: {e}")
            }
            _ => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn unescape_keeps_what_is_not_an_escape() {
    assert_eq!(unescape(br"a\040b"), b"a b");
    assert_eq!(unescape(br"a\04"), br"a\04");
    assert_eq!(unescape(br"a\089"), br"a\089");
    assert_eq!(unescape(br"\\"), br"\\");
    assert_eq!(unescape(br"x\"), br"x\");
    // \777 is not a byte: kept verbatim.
    assert_eq!(unescape(br"\777"), br"\777");
}

#[test]
fn allowed_upper_table() {
    let roots = [
        PathBuf::from("/var/lib/containerd"),
        PathBuf::from("/var/lib/containers"),
    ];
    let cases = [
        (CONTAINERD, true),
        ("/var/lib/containers/storage/overlay/9f/diff", true),
        ("/var/lib/containerd", false),
        ("/var/lib/containerdX/snapshots/1/fs", false),
        ("/var/lib/kubelet/pods/u/volumes", false),
        ("/", false),
        ("/var/lib/containerd/../kubelet/pods", false),
        ("/var/lib/containerd/./x/../../../etc", false),
        ("var/lib/containerd/x", false),
        ("/etc", false),
    ];
    for (path, want) in cases {
        assert_eq!(allowed_upper(Path::new(path), &roots), want, "{path}");
    }
    assert!(!allowed_upper(Path::new(CONTAINERD), &[]), "no roots");
}

#[test]
fn cgroup_procs_and_container_keys() {
    assert_eq!(procs(b"17\n3\n"), (vec![17, 3], 0));
    assert_eq!(procs(b"0\n0\n"), (vec![], 2));
    assert_eq!(procs(b""), (vec![], 0));
    assert_eq!(
        container_key(Path::new("/../../kubepods/burstable/podA/c1")).as_deref(),
        Some("podA/c1")
    );
    assert_eq!(container_key(Path::new("/")), None);
}
