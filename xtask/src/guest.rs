//! The guest image of the VM tiers: Debian bookworm with systemd-logind, cgroup v2 and the kernels
//! of the matrix (bookworm's 6.1, bullseye's 5.10, bookworm-backports' 6.12), built once with
//! mmdebstrap and cached by its revision.
//!
//! The guest boots under qemu/TCG with the rootfs on a virtio disk in -snapshot mode, so every run
//! starts clean. Test payloads come in over a read-only 9p share (`host` → /mnt/host) and results
//! go out over a read-write one (`out` → /mnt/out); nm-guest.service runs
//! /mnt/host/guest-entry.sh at boot. runc, the CNI plugins (linked at /opt/cni/bin, where
//! containerd looks) and iptables are there for the real-node tier, whose kubelet and containerd
//! come over the share ([`crate::gobuild::node`]).
use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{
    gobuild::replace_dir,
    sh::{self, cache_dir, log, quiet_stdout, run},
};

/// Bump when the image contents change (packages, hooks): the cache is keyed by it.
const IMAGE_REV: u32 = 7;

/// The suites the image is built from: bookworm (with its updates and security suites, as
/// mmdebstrap's default) for everything, and the two the other kernels of
/// the matrix come from. Backports' priority is 100 and bullseye's versions are lower than
/// bookworm's, so neither replaces a bookworm package; their kernels are installed by name.
const MIRRORS: [&str; 5] = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
    "deb http://deb.debian.org/debian bookworm-backports main",
    "deb http://deb.debian.org/debian bullseye main",
];

/// The kernels besides bookworm's, by series: the image keeps each as `vmlinuz-<series>` and
/// `initrd.img-<series>` (bookworm's 6.1 is plain `vmlinuz` and `initrd.img`).
const EXTRA_KERNELS: [&str; 2] = ["5.10", "6.12"];

const PACKAGES: &str = "systemd,systemd-sysv,dbus,udev,kmod,linux-image-amd64,procps,iproute2,util-linux,stress-ng,earlyoom,runc,containernetworking-plugins,iptables";

/// mmdebstrap's customize hooks, run by its shell with the root directory as `$1`.
const HOOKS: [&str; 14] = [
    r#"echo nm-guest > "$1/etc/hostname""#,
    r#"printf "/dev/vda / ext4 defaults 0 1\nhost /mnt/host 9p trans=virtio,version=9p2000.L,ro,nofail 0 0\nout /mnt/out 9p trans=virtio,version=9p2000.L,rw,nofail 0 0\n" > "$1/etc/fstab""#,
    r#"mkdir -p "$1/mnt/host" "$1/mnt/out""#,
    // 5.10 does not load a 9p transport on demand (6.1 does): load virtio's before the mounts.
    r#"printf "9pnet_virtio\n9p\n" > "$1/etc/modules-load.d/9p.conf""#,
    r#"printf "[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n" > "$1/etc/systemd/network/10-qemu.network""#,
    r#"chroot "$1" systemctl enable systemd-networkd"#,
    r#"chroot "$1" passwd -d root"#,
    r#"printf "[Unit]\nDescription=node-monitor guest test entry\nWants=systemd-networkd.service\nAfter=systemd-networkd.service dbus.service systemd-logind.service mnt-host.mount mnt-out.mount\nRequires=mnt-host.mount mnt-out.mount\n[Service]\nType=simple\nExecStart=/bin/bash /mnt/host/guest-entry.sh\nStandardOutput=journal+console\nStandardError=journal+console\n[Install]\nWantedBy=multi-user.target\n" > "$1/etc/systemd/system/nm-guest.service""#,
    r#"chroot "$1" systemctl enable nm-guest.service"#,
    r#"chroot "$1" systemctl disable earlyoom.service"#,
    r#"mkdir -p "$1/opt/cni" && ln -s /usr/lib/cni "$1/opt/cni/bin""#,
    r#"chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer"#,
    // The boot's critical path, which every guest test pays (about 25 s of uptime to the entry
    // under TCG, 18 s without these): no wait for network-online (the entry script waits for the
    // default route itself, ENTRY_PRELUDE), no utmp, no console login, no e2scrub at boot, and
    // the journal in memory (no flush to the disk).
    r#"chroot "$1" systemctl mask systemd-networkd-wait-online.service systemd-update-utmp.service systemd-update-utmp-runlevel.service e2scrub_reap.service getty@tty1.service dpkg-db-backup.timer"#,
    r#"mkdir -p "$1/etc/systemd/journald.conf.d" && printf "[Journal]\nStorage=volatile\n" > "$1/etc/systemd/journald.conf.d/volatile.conf""#,
];

/// Builds the guest image once; returns the directory holding vmlinuz, initrd.img and
/// rootfs.ext4.
pub fn image() -> Result<PathBuf> {
    const CHORE: &str = "build guest-image";
    let key = format!("r{IMAGE_REV}");
    let out = cache_dir().join(format!("guest/bookworm-{key}"));
    let files = ["rootfs.ext4", "vmlinuz", "initrd.img"]
        .map(str::to_owned)
        .into_iter()
        .chain(
            EXTRA_KERNELS
                .iter()
                .flat_map(|s| [format!("vmlinuz-{s}"), format!("initrd.img-{s}")]),
        );
    if files.clone().all(|f| out.join(f).is_file()) {
        return Ok(out);
    }
    if !sh::have("mmdebstrap") {
        bail!("mmdebstrap missing: run `cargo xtask setup --with-vm`");
    }
    let tmp = cache_dir().join(format!("guest/tmp-{key}"));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let root = tmp.join("rootfs");
    log(CHORE, "mmdebstrap bookworm (about 2 minutes)");
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--mode=root", "--variant=minbase"])
        .arg(format!("--include={PACKAGES}"));
    for hook in HOOKS {
        cmd.arg(format!("--customize-hook={hook}"));
    }
    // The other kernels of the matrix: the ABI package each series' `linux-image-amd64` depends
    // on (5.10 from bullseye, 6.12 from bookworm-backports), with their initramfs built by
    // bookworm's initramfs-tools.
    cmd.arg(format!(
        r#"--customize-hook=for s in {}; do p=$(chroot "$1" apt-cache show linux-image-amd64 | sed -n "s/^Depends: \(linux-image-$s[^ ,]*\).*/\1/p" | head -n1); [ -n "$p" ] || {{ echo "no linux-image for $s" >&2; exit 1; }}; chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -t bookworm-backports "$p" || exit 1; done"#,
        EXTRA_KERNELS.join(" ")
    ));
    cmd.arg("bookworm").arg(&root).args(MIRRORS);
    run(quiet_stdout(&mut cmd))?;
    // bookworm's kernel under the plain names, the others under their series.
    let kernels = [("6.1.", "")]
        .into_iter()
        .chain(EXTRA_KERNELS.map(|series| (series, series)));
    for (series, suffix) in kernels {
        for (glob_prefix, name) in [("vmlinuz-", "vmlinuz"), ("initrd.img-", "initrd.img")] {
            let prefix = format!("{glob_prefix}{series}");
            let found = fs::read_dir(root.join("boot"))?
                .filter_map(Result::ok)
                .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .with_context(|| format!("no /boot/{prefix}* in the guest root"))?;
            let name = if suffix.is_empty() {
                name.to_owned()
            } else {
                format!("{name}-{suffix}")
            };
            fs::copy(found.path(), tmp.join(&name))
                .with_context(|| format!("copying {}", found.path().display()))?;
        }
    }
    log(CHORE, "ext4 image");
    run(quiet_stdout(
        Command::new("mkfs.ext4")
            .args(["-q", "-L", "root", "-d"])
            .arg(&root)
            .arg(tmp.join("rootfs.ext4"))
            // The file system the real-node tier's disk scenarios fill. It held bookworm alone
            // in 3 GiB; the two extra kernels take about 490 MiB, and 3600 MiB leaves the same
            // free space as before (about 2 GiB), so a 600 MiB fill still crosses a 40%
            // `nodefs.available` and never the kubelet's own 10% and 15%.
            .arg("3600M"),
    ))?;
    fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    replace_dir(&tmp, &out)?;
    Ok(out)
}
