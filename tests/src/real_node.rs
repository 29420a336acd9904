//! The real-node tier: the guest VM (Debian bookworm, systemd, cgroup v2) runs a real kubelet and
//! containerd and joins the host's control plane as a node; node-monitor runs there as the
//! DaemonSet pod installed from the shipped manifests.
//!
//! - Binaries: the kubelet, kube-scheduler, containerd, ctr, the runc shim and the pause binary
//!   from ``cargo xtask build node`` (cached); runc and the CNI plugins are Debian's, in the guest
//!   image.
//! - Images, without a registry: `cargo xtask image pause|workload|node-monitor` write OCI
//!   archives to `target/images/`; the guest imports them into containerd's `k8s.io` namespace.
//!   Pods use them with the default pull policy of a tagged image (`IfNotPresent`): nothing pulls.
//! - Joining: the node's client certificate (`system:node:<name>` in `system:nodes`) is issued by
//!   the harness's CA; the API server runs with NodeRestriction. The kubelet uses the systemd
//!   cgroup driver and its own default eviction thresholds, with a read-only port on the guest's
//!   loopback for `/stats/summary`.
//! - The `kubernetes` Service (10.0.0.1:443) reaches the API server on the host through a DNAT
//!   rule in the guest, which is the part of kube-proxy's job a single-Service cluster needs.
//!
//! The host steps the guest along with numbered shell scripts (`steps/<n>.sh` in the payload,
//! renamed into place); the guest runs each in order and writes `steps/<n>.rc` and `.log` to
//! `/mnt/out`. Everything the guest writes is in the run's output directory.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

pub mod pair;
pub mod scenario;
pub mod shutdown;

use crate::{
    control_plane::ControlPlane,
    vm::{
        ENTRY_PRELUDE, Guest, GuestKernel, GuestOptions, GuestRun, OutDir, Payload, SHELL_HELPERS,
        link_or_copy, tail,
    },
};

/// The node's name, as its certificate and `--hostname-override` give it.
pub const NODE: &str = "nm-real";
/// The images the tier imports, by archive name under `target/images/`, with the command that
/// builds each.
pub const IMAGES: [(&str, &str); 3] = [
    (
        "pause.oci.tar",
        "cargo xtask image pause --binary <`cargo xtask build node`>/pause",
    ),
    (
        "workload.oci.tar",
        "cargo xtask image workload --profile debug",
    ),
    ("node-monitor.oci.tar", "cargo xtask image node-monitor"),
];
/// remediate's image archive (with `fence_qmp`), which the failover pair's nodes import.
pub const REMEDIATE_IMAGE_ARCHIVE: (&str, &str) = (
    "node-monitor-remediate.oci.tar",
    "cargo xtask image node-monitor-remediate",
);
/// The workload image's reference (xtask's default).
pub const WORKLOAD_IMAGE: &str = "node-monitor.local/workload:0.1.0";
/// containerd's sandbox image (xtask's pause default).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// The guest's pod network (the CNI bridge).
const POD_SUBNET: &str = "10.88.0.0/16";

/// The directory `cargo xtask build node` prints (building once if needed).
pub fn node_binaries() -> Result<PathBuf> {
    Release::Current.node_binaries()
}

/// The directory `cargo xtask build <part>` prints (building once if needed).
fn xtask_part(part: &str) -> Result<PathBuf> {
    let out = crate::xtask(&["build", part])?;
    if !out.status.success() {
        bail!(
            "{part} is not available: run `scripts/setup.sh --with-vm` (`cargo xtask build {part}` failed)"
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The Kubernetes release of the node's kubelet and kube-scheduler and of its control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Release {
    /// The release every other tier runs (`cargo xtask build node`, `KUBEBUILDER_ASSETS`).
    #[default]
    Current,
    /// The oldest supported release (docs/compatibility.md), the version-skew tier's: the
    /// kubelet and its API server of the same minor (`cargo xtask build node-skew`,
    /// `control-plane-skew`).
    Skew,
}

impl Release {
    /// The directory of the node's binaries of this release.
    pub fn node_binaries(self) -> Result<PathBuf> {
        xtask_part(match self {
            Self::Current => "node",
            Self::Skew => "node-skew",
        })
    }

    /// The control plane's binaries of this release; `None`: the harness's default
    /// (`KUBEBUILDER_ASSETS`, then the setup script's cache).
    pub fn control_plane_assets(self) -> Result<Option<PathBuf>> {
        match self {
            Self::Current => Ok(None),
            Self::Skew => xtask_part("control-plane-skew").map(Some),
        }
    }

    /// The kubelet's version, `v1.X.Y`, read from the name of the directory of its build
    /// (`k8s-v1.X.Y-containerd-…`).
    pub fn kubelet_version(self) -> Result<String> {
        let dir = self.node_binaries()?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        name.strip_prefix("k8s-")
            .and_then(|n| n.split("-containerd-").next())
            .map(str::to_owned)
            .with_context(|| {
                format!(
                    "no release in the node binaries' directory {}",
                    dir.display()
                )
            })
    }
}

/// `target/images/<name>`, which must exist.
pub fn image_archive(name: &str) -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let p = target.join("images").join(name);
    if !p.is_file() {
        let how = IMAGES
            .iter()
            .chain([&REMEDIATE_IMAGE_ARCHIVE])
            .find(|(n, _)| *n == name)
            .map_or("cargo xtask image", |(_, how)| how);
        bail!(
            "{} is missing: build it with `{how}` (scripts/test.sh does)",
            p.display()
        );
    }
    Ok(p)
}

/// How the node is set up.
#[derive(Debug, Clone)]
pub struct RealNodeOptions {
    pub memory_mib: u32,
    /// The kubelet's and containerd's cgroup driver.
    pub cgroup_driver: CgroupDriver,
    /// Appended to the KubeletConfiguration (e.g. `shutdownGracePeriod: 30s`).
    pub kubelet_config_extra: String,
    /// Bound on the whole guest run.
    pub timeout: Duration,
    /// Where the kubelet and containerd keep their configuration and state.
    pub layout: NodeLayout,
    /// The kernel the node boots.
    pub kernel: GuestKernel,
    /// The kubelet's release, and its control plane's.
    pub release: Release,
    /// The node's name ([`NODE`] unless several nodes join).
    pub name: &'static str,
    /// The guest's CPUs.
    pub cpus: u32,
    /// A QMP socket for a fence device, at this port on the host's loopback
    /// ([`GuestOptions::qmp_port`]): a reset then reboots the node, which rejoins with the steps
    /// it already ran left done.
    pub qmp_port: Option<u16>,
    /// Image archives imported besides [`IMAGES`] (names under `target/images/`).
    pub extra_images: &'static [&'static str],
}

/// A distribution's node layout, reproduced with the real kubelet and containerd through their
/// own configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLayout {
    /// kubeadm's: containerd under /var/lib/containerd, the kubelet's file at
    /// /var/lib/kubelet/config.yaml, pods under the cgroup root.
    Kubeadm,
    /// kind's: kubeadm's paths, with the kubelet's `cgroupRoot: /kubelet`, so pods live under
    /// `kubelet.slice/kubelet-kubepods.slice` (systemd) or `kubelet/kubepods` (cgroupfs).
    Kind,
    /// k3s's: containerd's root under /var/lib/rancher/k3s/agent/containerd and its socket under
    /// /run/k3s/containerd; the kubelet without a configuration file, configured by a drop-in
    /// under /var/lib/rancher/k3s/agent/etc/kubelet.conf.d and by flags
    /// ([`K3S_KUBELET_EVICTION_FLAG`]).
    K3s,
}

/// The eviction flag the k3s layout's kubelet runs with: the kubelet's defaults, plus a
/// `pid.available` threshold its defaults do not have, so that a reader of its command line is
/// told apart from one that assumed the defaults.
pub const K3S_KUBELET_EVICTION_FLAG: &str = "--eviction-hard=memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,pid.available<1000";
/// The k3s layout's containerd root.
pub const K3S_CONTAINERD_ROOT: &str = "/var/lib/rancher/k3s/agent/containerd";
const K3S_CONTAINERD_STATE: &str = "/run/k3s/containerd";
const K3S_KUBELET_DROP_INS: &str = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d";

/// The shell the node's entry script sources for its layout: `SOCK` (containerd's socket),
/// `KUBELET_ARGS` (how the kubelet finds its configuration) and `prepare_layout` (run before
/// containerd starts: the configuration files and cgroups the layout needs).
fn layout_script(layout: NodeLayout, driver: CgroupDriver) -> String {
    const KUBEADM: &str = r#"SOCK=/run/containerd/containerd.sock
KUBELET_ARGS=--config=/var/lib/kubelet/config.yaml
prepare_layout() { cp $H/kubelet-config.yaml /var/lib/kubelet/config.yaml; }
"#;
    // The kubelet checks that its cgroupRoot exists with the cpu, cpuset, memory, hugetlb and
    // pids controllers (kind's entrypoint enables the root's controllers likewise).
    const ENABLE: &str = r#"for c in $(cat /sys/fs/cgroup/cgroup.controllers); do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done"#;
    match layout {
        NodeLayout::Kubeadm => KUBEADM.to_owned(),
        NodeLayout::Kind => {
            let root = match driver {
                CgroupDriver::Systemd => {
                    r#"printf '[Unit]\nDescription=kind kubelet cgroup root\n[Slice]\nCPUAccounting=yes\nMemoryAccounting=yes\nTasksAccounting=yes\n' > /etc/systemd/system/kubelet.slice
  systemctl daemon-reload; systemctl start kubelet.slice"#
                }
                CgroupDriver::Cgroupfs => "mkdir -p /sys/fs/cgroup/kubelet",
            };
            format!(
                r#"SOCK=/run/containerd/containerd.sock
KUBELET_ARGS=--config=/var/lib/kubelet/config.yaml
prepare_layout() {{
  cp $H/kubelet-config.yaml /var/lib/kubelet/config.yaml
  {ENABLE}
  {root}
  {ENABLE}
  log "the kubelet's cgroup root: $(ls -d /sys/fs/cgroup/kubelet* 2>&1), controllers: $(cat /sys/fs/cgroup/kubelet*/cgroup.controllers 2>&1)"
}}
"#
            )
        }
        NodeLayout::K3s => format!(
            r#"SOCK={K3S_CONTAINERD_STATE}/containerd.sock
KUBELET_ARGS="--config-dir={K3S_KUBELET_DROP_INS} {K3S_KUBELET_EVICTION_FLAG}"
prepare_layout() {{
  mkdir -p {K3S_KUBELET_DROP_INS}
  cp $H/kubelet-config.yaml {K3S_KUBELET_DROP_INS}/00-k3s-defaults.conf
}}
"#
        ),
    }
}

impl Default for RealNodeOptions {
    fn default() -> Self {
        Self {
            memory_mib: 2048,
            cgroup_driver: CgroupDriver::Systemd,
            kubelet_config_extra: String::new(),
            timeout: Duration::from_secs(1500),
            layout: NodeLayout::Kubeadm,
            kernel: GuestKernel::default(),
            release: Release::default(),
            name: NODE,
            cpus: 2,
            qmp_port: None,
            extra_images: &[],
        }
    }
}

/// The cgroup driver the kubelet and containerd share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`:
    /// kubeadm's default since 1.22.
    Systemd,
    /// `kubepods/burstable/pod<uid>/<id>`: the kubelet writes the cgroup tree itself.
    Cgroupfs,
}

impl CgroupDriver {
    /// The kubelet's `cgroupDriver` value.
    pub fn name(self) -> &'static str {
        match self {
            CgroupDriver::Systemd => "systemd",
            CgroupDriver::Cgroupfs => "cgroupfs",
        }
    }
}

/// containerd 2.x: the kubelet's cgroup driver, and the pause image imported from the archive
/// pinned as the sandbox so it is never collected.
fn containerd_config(driver: CgroupDriver, layout: NodeLayout) -> String {
    let systemd = driver == CgroupDriver::Systemd;
    let paths = if layout == NodeLayout::K3s {
        format!(
            "root = '{K3S_CONTAINERD_ROOT}'\nstate = '{K3S_CONTAINERD_STATE}'\n\
             [grpc]\n  address = '{K3S_CONTAINERD_STATE}/containerd.sock'\n"
        )
    } else {
        String::new()
    };
    format!(
        "version = 3\n{paths}\
         [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = '{PAUSE_IMAGE}'\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = {systemd}\n"
    )
}

fn cni_config() -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"nm-pods","plugins":[{{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{POD_SUBNET}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}}}]}}"#
    )
}

/// The kubelet's configuration: the cgroup `driver`, x509 client auth against the cluster CA, and
/// nothing about eviction, so its defaults (`memory.available<100Mi`, `nodefs.available<10%`,
/// `imagefs.available<15%`, `nodefs.inodesFree<5%`) are in force.
fn kubelet_config(driver: CgroupDriver, extra: &str, layout: NodeLayout) -> String {
    let driver = driver.name();
    let (socket, root) = match layout {
        NodeLayout::Kubeadm => ("/run/containerd/containerd.sock".to_owned(), ""),
        NodeLayout::Kind => (
            "/run/containerd/containerd.sock".to_owned(),
            "cgroupRoot: /kubelet\n",
        ),
        NodeLayout::K3s => (format!("{K3S_CONTAINERD_STATE}/containerd.sock"), ""),
    };
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         cgroupDriver: {driver}\n\
         {root}\
         containerRuntimeEndpoint: unix://{socket}\n\
         authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: false}}\n  x509: {{clientCAFile: /etc/kubernetes/pki/ca.crt}}\n\
         authorization: {{mode: AlwaysAllow}}\n\
         # /stats/summary for the signal-parity checks, on the guest's loopback only.\n\
         readOnlyPort: 10255\n\
         address: 127.0.0.1\n\
         healthzBindAddress: 127.0.0.1\n\
         failSwapOn: false\n\
         clusterDomain: cluster.local\n\
         serializeImagePulls: false\n\
         {extra}\n"
    )
}

/// The node's entry script, after [`ENTRY_PRELUDE`].
const ENTRY: &str = r#"H=/mnt/host
log "entry started; uptime $(uptime_s)"
uname -r > /mnt/out/uname
mkdir -p /mnt/out/steps
for _ in $(seq 3000); do [ -e $H/kubelet.conf ] && break; sleep 0.2; done
[ -e $H/kubelet.conf ] || { log "no node credentials from the host"; systemctl poweroff -ff; }
PORT=$(cat $H/apiserver-port)
install -m 0755 $H/bin/containerd $H/bin/ctr $H/bin/containerd-shim-runc-v2 $H/bin/kubelet /usr/local/bin/
mkdir -p /etc/containerd /etc/cni/net.d /etc/kubernetes/pki /var/lib/kubelet
cp $H/containerd.toml /etc/containerd/config.toml
cp $H/cni.conflist /etc/cni/net.d/10-nm-pods.conflist
cp $H/ca.crt /etc/kubernetes/pki/ca.crt
cp $H/kubelet.conf /etc/kubernetes/kubelet.conf
source $H/layout.sh
prepare_layout
modprobe overlay
sysctl -qw net.ipv4.ip_forward=1
# Pods with the Default DNS policy copy the node's resolver (qemu user networking's).
[ -s /etc/resolv.conf ] || echo "nameserver 10.0.2.3" > /etc/resolv.conf
# The `kubernetes` Service's cluster IP -> the API server on the host (kube-proxy's part here).
for chain in OUTPUT PREROUTING; do
  iptables -t nat -A $chain -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.0.2.2:$PORT
done
systemd-run --unit=containerd -p Delegate=yes -p KillMode=process -p OOMScoreAdjust=-999 \
  -p LimitNOFILE=1048576 -p StandardOutput=append:/mnt/out/containerd.log \
  -p StandardError=append:/mnt/out/containerd.log /usr/local/bin/containerd
within 120 test -S $SOCK || log "containerd did not start"
# Imported once: after a reset (a fence device's power cycle) the store on the disk has them.
mkdir -p /var/lib/nm-imported
for img in $H/images/*.oci.tar; do
  done_mark=/var/lib/nm-imported/$(basename "$img")
  [ -e "$done_mark" ] && continue
  ctr --address $SOCK -n k8s.io images import --platform linux/amd64 "$img" >> /mnt/out/import.log 2>&1 \
    && touch "$done_mark" || log "import $img failed"
done
ctr --address $SOCK -n k8s.io images ls -q > /mnt/out/images
log "containerd ready, images imported; uptime $(uptime_s)"
systemd-run --unit=kubelet -p OOMScoreAdjust=-999 -p StandardOutput=append:/mnt/out/kubelet.log \
  -p StandardError=append:/mnt/out/kubelet.log /usr/local/bin/kubelet \
  $KUBELET_ARGS --kubeconfig=/etc/kubernetes/kubelet.conf \
  --hostname-override=@NODE@ --node-ip=10.0.2.15 --v=1
log "kubelet started; uptime $(uptime_s)"
# Container logs (the agent's included) mirrored out, so a failed run still has them (whole, each
# second: `cp -u` would skip a file appended to while it was being copied); in a unit without
# default dependencies, so a graceful power-off stops it only with the last processes.
systemd-run --unit=nm-log-mirror -p DefaultDependencies=no \
  bash -c 'while true; do cp -r /var/log/pods /mnt/out/ 2>/dev/null; sleep 1; done'
# After a reset (a fence device's power cycle) the steps already run stay done.
n=1
while [ -e /mnt/out/steps/$n.rc ]; do n=$((n + 1)); done
while true; do
  if [ -e $H/steps/$n.sh ]; then
    log "step $n: $(head -1 $H/steps/$n.sh)"
    bash $H/steps/$n.sh > /mnt/out/steps/$n.log 2>&1
    echo $? > /mnt/out/steps/.$n.rc && mv /mnt/out/steps/.$n.rc /mnt/out/steps/$n.rc
    n=$((n + 1))
  elif [ -e $H/finish ]; then
    break
  else
    sleep 0.2
  fi
done
log "finishing; uptime $(uptime_s)"
journalctl -u kubelet -u containerd --no-pager -o short-monotonic > /mnt/out/journal.log 2>&1
sync
systemctl poweroff -ff
"#;

/// Shell helpers every step script starts with (then `vm::SHELL_HELPERS`).
const STEP_LIB: &str = r#"set -u
# HTTP/1.0 GET over bash's /dev/tcp (the guest has no curl): get HOST PORT PATH OUTFILE; the body
# only, written whole or not at all.
get() {
  ( exec 3<>/dev/tcp/$1/$2 && printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3 \
      && cat <&3 > "$4.tmp" ) 2>/dev/null || return 1
  sed '1,/^\r\{0,1\}$/d' "$4.tmp" > "$4" && rm -f "$4.tmp"
}
"#;

/// The guest node, booting or running in a thread while the test talks to the API.
pub struct RealNode {
    /// The node's name.
    pub name: &'static str,
    payload: Payload,
    guest: Option<Guest>,
    out: PathBuf,
    next_step: u32,
    pub started: Instant,
}

impl RealNode {
    /// Prepares the payload (binaries, images, configuration) and boots the guest, which waits
    /// for [`RealNode::join`].
    pub fn boot(opts: &RealNodeOptions) -> Result<RealNode> {
        let bins = opts.release.node_binaries()?;
        let payload = Payload::new("nm-real-node")?;
        let p = payload.path();
        fs::create_dir_all(p.join("bin"))?;
        fs::create_dir_all(p.join("images"))?;
        fs::create_dir_all(p.join("steps"))?;
        for b in ["kubelet", "containerd", "ctr", "containerd-shim-runc-v2"] {
            link_or_copy(&bins.join(b), &p.join("bin").join(b))?;
        }
        for name in IMAGES
            .iter()
            .map(|(n, _)| *n)
            .chain(opts.extra_images.iter().copied())
        {
            link_or_copy(&image_archive(name)?, &p.join("images").join(name))?;
        }
        fs::write(
            p.join("containerd.toml"),
            containerd_config(opts.cgroup_driver, opts.layout),
        )?;
        fs::write(p.join("cni.conflist"), cni_config())?;
        fs::write(
            p.join("kubelet-config.yaml"),
            kubelet_config(opts.cgroup_driver, &opts.kubelet_config_extra, opts.layout),
        )?;
        fs::write(
            p.join("layout.sh"),
            layout_script(opts.layout, opts.cgroup_driver),
        )?;
        fs::write(p.join("step-lib.sh"), format!("{STEP_LIB}{SHELL_HELPERS}"))?;
        payload.entry(&format!(
            "{ENTRY_PRELUDE}{}",
            ENTRY.replace("@NODE@", opts.name)
        ))?;
        let guest_opts = GuestOptions {
            memory_mib: opts.memory_mib,
            timeout: opts.timeout,
            kernel: opts.kernel,
            cpus: opts.cpus,
            qmp_port: opts.qmp_port,
            // A fenced node's kernel panics on purpose and must stay down until powered off.
            cmdline: if opts.qmp_port.is_some() {
                "panic=0".to_owned()
            } else {
                String::new()
            },
        };
        // The guest's /mnt/out, read while it runs (step results) and kept after a failed run
        // for its logs, and after a good run for its figures.
        let out_dir = tempfile::Builder::new()
            .prefix("nm-real-node-out")
            .tempdir()?
            .keep();
        let out_for_guest = OutDir::Kept(out_dir.clone());
        let guest = Guest::boot_in(payload.path(), guest_opts, out_for_guest);
        Ok(RealNode {
            started: guest.started,
            name: opts.name,
            payload,
            guest: Some(guest),
            out: out_dir,
            next_step: 1,
        })
    }

    /// Hands the guest its node credentials (a `system:node:<NODE>` client certificate) and the
    /// API server's port; it then starts containerd and the kubelet.
    pub fn join(&self, cp: &ControlPlane) -> Result<()> {
        let p = self.payload.path();
        fs::write(p.join("ca.crt"), cp.ca_pem())?;
        fs::write(p.join("apiserver-port"), cp.port().to_string())?;
        let kc = cp.user_kubeconfig(&format!("system:node:{}", self.name), Some("system:nodes"))?;
        let text = fs::read_to_string(&kc)?.replace(cp.server(), &cp.guest_server());
        // Renamed into place: the guest waits for the name and must never read half a file.
        fs::write(p.join(".kubelet.conf"), text)?;
        fs::rename(p.join(".kubelet.conf"), p.join("kubelet.conf"))?;
        Ok(())
    }

    /// A file for the guest (e.g. the admin kubeconfig for `node-monitor trace`), renamed into
    /// place.
    pub fn put(&self, name: &str, contents: &[u8]) -> Result<PathBuf> {
        self.payload.put(name, contents)
    }

    /// Links (or copies) a host file into the payload, for the guest at `/mnt/host/<name>`.
    pub fn put_file(&self, name: &str, src: &Path) -> Result<()> {
        self.payload.link(name, src)
    }

    pub fn running(&self) -> bool {
        self.guest.as_ref().is_some_and(Guest::running)
    }

    /// A file the guest wrote to /mnt/out.
    pub fn read_out(&self, name: &str) -> Result<String> {
        let p = self.out.join(name);
        fs::read_to_string(&p).with_context(|| format!("guest output {} missing", p.display()))
    }

    /// The guest's output directory (its /mnt/out).
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// Runs `script` in the guest (after the step helpers: `get HOST PORT PATH OUT`) and waits
    /// for it, at most `timeout`; returns its output. A non-zero exit is an error with the output.
    pub async fn step(&mut self, what: &str, script: &str, timeout: Duration) -> Result<String> {
        let n = self.next_step;
        self.next_step += 1;
        let body = format!("# {what}\nsource /mnt/host/step-lib.sh\n{script}\n");
        let steps = self.payload.path().join("steps");
        fs::write(steps.join(format!(".{n}.sh")), body)?;
        fs::rename(
            steps.join(format!(".{n}.sh")),
            steps.join(format!("{n}.sh")),
        )?;
        let rc_path = self.out.join(format!("steps/{n}.rc"));
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(rc) = fs::read_to_string(&rc_path) {
                let log = self.read_out(&format!("steps/{n}.log")).unwrap_or_default();
                if rc.trim() != "0" {
                    bail!(
                        "guest step {n} ({what}) exited {}:\n{}",
                        rc.trim(),
                        tail(&log, 40)
                    );
                }
                return Ok(log);
            }
            if !self.running() {
                bail!("the guest ended during step {n} ({what})");
            }
            if Instant::now() > deadline {
                bail!("guest step {n} ({what}) did not finish within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Tells the guest to collect its logs and power off, and waits for it.
    pub async fn finish(mut self) -> Result<GuestRun> {
        self.put("finish", b"")?;
        self.guest
            .take()
            .context("the guest was already finished")?
            .finish()
            .await
    }

    /// The guest kernel's report of a lockup ([`crate::vm::stalled`]) or of its panic
    /// ([`crate::vm::panicked`]), when its console has one.
    pub fn stalled(&self) -> Option<String> {
        let console = fs::read_to_string(self.out.join(".console.log")).ok()?;
        crate::vm::stalled(&console)
            .or_else(|| crate::vm::panicked(&console))
            .map(str::to_owned)
    }

    /// The guest's logs, for a failure message.
    pub fn report(&self) -> String {
        // The agent's log first: a failure's output may be shortened in the middle, and the
        // agent's own account is what explains most failures of this tier.
        let mut out = String::new();
        let logs = self.agent_logs();
        for log in &logs[logs.len().saturating_sub(2)..] {
            if let Ok(text) = fs::read_to_string(log) {
                out.push_str(&format!(
                    "--- {}:\n{}\n",
                    log.display(),
                    clip(&tail(&text, 40), 400)
                ));
            }
        }
        for (f, n) in [
            ("entry.log", 20),
            ("kubelet.log", 15),
            ("containerd.log", 10),
            ("import.log", 10),
        ] {
            if let Ok(text) = self.read_out(f) {
                out.push_str(&format!("--- {f}:\n{}\n", clip(&tail(&text, n), 300)));
            }
        }
        out.push_str(&format!("--- the guest's files: {}\n", self.out.display()));
        if let Ok(console) = fs::read_to_string(self.out.join(".console.log")) {
            // The kernel's complaints of a stalled guest (TCG on a loaded host), then the tail.
            let stalls: Vec<&str> = console
                .lines()
                .filter(|l| {
                    ["soft lockup", "rcu_", "hung_task", "blocked for more than"]
                        .iter()
                        .any(|k| l.contains(k))
                })
                .collect();
            if !stalls.is_empty() {
                out.push_str(&format!(
                    "--- console, stall reports ({}):\n{}\n",
                    stalls.len(),
                    tail(&stalls.join("\n"), 5)
                ));
            }
            out.push_str(&format!(
                "--- console:\n{}\n",
                clip(&tail(&console, 15), 300)
            ));
        }
        out
    }

    /// The agent's container logs, as the guest mirrors them (`pods/node-monitor_*`).
    pub fn agent_logs(&self) -> Vec<PathBuf> {
        let Ok(dirs) = fs::read_dir(self.out.join("pods")) else {
            return Vec::new();
        };
        let mut logs: Vec<PathBuf> = dirs
            .flatten()
            .filter(|d| d.file_name().to_string_lossy().starts_with("node-monitor_"))
            .flat_map(|d| {
                fs::read_dir(d.path().join("node-monitor"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        logs
    }
}

/// Each line of `text` cut to `width` characters.
fn clip(text: &str, width: usize) -> String {
    text.lines()
        .map(|l| match l.char_indices().nth(width) {
            Some((i, _)) => format!("{}…", &l[..i]),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
