#!/usr/bin/env bash
# Builds the Debian bookworm guest used by the VM test tier (systemd-logind, cgroup v2, a second
# kernel), once, and caches it keyed by this script's content. Prints the directory holding
# vmlinuz, initrd.img and rootfs.ext4.
#
# The guest boots under qemu/TCG with the rootfs on a virtio disk in -snapshot mode, so every run
# starts clean. Test payloads come in over a read-only 9p share (`host` -> /mnt/host) and results go
# out over a read-write one (`out` -> /mnt/out); nm-guest.service runs /mnt/host/guest-entry.sh at boot.
# runc, the CNI plugins (linked at /opt/cni/bin, where containerd looks) and iptables are there for
# the real-node tier, whose kubelet and containerd come over the share (scripts/build-node.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${NODE_MONITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/node-monitor}"
# Bump when the image contents change (packages, hooks): the cache is keyed by it.
IMAGE_REV=4
key="r$IMAGE_REV"
OUT="$CACHE/guest/bookworm-$key"
if [[ -f "$OUT/rootfs.ext4" && -f "$OUT/vmlinuz" && -f "$OUT/initrd.img" ]]; then
  echo "$OUT"; exit 0
fi
log() { echo "build-guest-image: $*" >&2; }
command -v mmdebstrap >/dev/null || { log "mmdebstrap missing: run scripts/setup.sh --with-vm"; exit 1; }

TMP="$CACHE/guest/tmp-$key"
rm -rf "$TMP"; mkdir -p "$TMP"
ROOT="$TMP/rootfs"
log "mmdebstrap bookworm (about 2 minutes)"
mmdebstrap --mode=root --variant=minbase \
  --include=systemd,systemd-sysv,dbus,udev,kmod,linux-image-amd64,procps,iproute2,util-linux,stress-ng,earlyoom,runc,containernetworking-plugins,iptables \
  --customize-hook='echo nm-guest > "$1/etc/hostname"' \
  --customize-hook='printf "/dev/vda / ext4 defaults 0 1\nhost /mnt/host 9p trans=virtio,version=9p2000.L,ro,nofail 0 0\nout /mnt/out 9p trans=virtio,version=9p2000.L,rw,nofail 0 0\n" > "$1/etc/fstab"' \
  --customize-hook='mkdir -p "$1/mnt/host" "$1/mnt/out"' \
  --customize-hook='printf "[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n" > "$1/etc/systemd/network/10-qemu.network"' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd' \
  --customize-hook='chroot "$1" passwd -d root' \
  --customize-hook='printf "[Unit]\nDescription=node-monitor guest test entry\nWants=network-online.target\nAfter=network-online.target dbus.service systemd-logind.service mnt-host.mount mnt-out.mount\nRequires=mnt-host.mount mnt-out.mount\n[Service]\nType=simple\nExecStart=/bin/bash /mnt/host/guest-entry.sh\nStandardOutput=journal+console\nStandardError=journal+console\n[Install]\nWantedBy=multi-user.target\n" > "$1/etc/systemd/system/nm-guest.service"' \
  --customize-hook='chroot "$1" systemctl enable nm-guest.service' \
  --customize-hook='chroot "$1" systemctl disable earlyoom.service' \
  --customize-hook='mkdir -p "$1/opt/cni" && ln -s /usr/lib/cni "$1/opt/cni/bin"' \
  --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer' \
  bookworm "$ROOT" >&2
cp "$ROOT"/boot/vmlinuz-* "$TMP/vmlinuz"
cp "$ROOT"/boot/initrd.img-* "$TMP/initrd.img"
log "ext4 image"
mkfs.ext4 -q -L root -d "$ROOT" "$TMP/rootfs.ext4" 3G >&2
rm -rf "$ROOT"
rm -rf "$OUT"; mv "$TMP" "$OUT"
echo "$OUT"
