//! The guest VM tier: a Debian bookworm guest (systemd, logind, cgroup v2, kernel 6.1) booted under
//! qemu with software emulation (TCG).
//!
//! The image is built and cached by `cargo xtask build guest-image` (run from `scripts/setup.sh
//! --with-vm`). Each run boots it with the root disk in snapshot mode, so runs never leak into each
//! other. The payload directory is shared read-only at `/mnt/host`, and the guest's systemd unit
//! `nm-guest.service` runs `/mnt/host/guest-entry.sh` once the system is up; the output directory is
//! shared read-write at `/mnt/out`. The guest reaches the host's loopback at 10.0.2.2 (qemu user
//! networking), so a control plane bound to 127.0.0.1 on the host serves the guest too.
//!
//! /dev/kvm on these machines is a PVM hypervisor that cannot run stock kernels, so TCG is used
//! whenever `/sys/module/kvm_pvm` exists or /dev/kvm is absent.
use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Where the cached image lives: the directory `cargo xtask build guest-image` prints (building
/// once if needed).
pub fn image_dir() -> Result<PathBuf> {
    let out = crate::xtask(&["build", "guest-image"])?;
    if !out.status.success() {
        bail!(
            "the guest image is not available: run `scripts/setup.sh --with-vm` (`cargo xtask build guest-image` failed)"
        );
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let kernels = GuestKernel::ALL
        .iter()
        .flat_map(|k| [k.files().0, k.files().1]);
    for f in kernels.chain(["rootfs.ext4"]) {
        if !dir.join(f).is_file() {
            bail!("guest image incomplete: {} missing", dir.join(f).display());
        }
    }
    Ok(dir)
}

/// How to boot one guest.
#[derive(Debug, Clone)]
pub struct GuestOptions {
    pub memory_mib: u32,
    pub cpus: u32,
    /// Extra kernel command line.
    pub cmdline: String,
    /// Hard limit for the whole run; the guest is killed past it and the run fails.
    pub timeout: Duration,
    /// Which of the image's kernels boots.
    pub kernel: GuestKernel,
    /// A QMP socket on the host's 127.0.0.1 at this port, for a fence device (`fence_qmp`). The
    /// guest then boots without `-no-reboot`: a reset restarts the machine, as a power cycle
    /// does, where it would otherwise end qemu.
    pub qmp_port: Option<u16>,
}

/// The kernels of the guest image (`cargo xtask build guest-image`): the same bookworm user
/// space booted on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuestKernel {
    /// bookworm's 6.1, the one every other guest test runs on.
    #[default]
    Bookworm,
    /// bullseye's 5.10 (Debian 11).
    Bullseye,
    /// bookworm-backports' 6.12 (trixie's series).
    Backports,
}

impl GuestKernel {
    pub const ALL: [GuestKernel; 3] = [Self::Bookworm, Self::Bullseye, Self::Backports];

    /// The `uname -r` prefix of this kernel.
    pub fn release_prefix(self) -> &'static str {
        match self {
            Self::Bookworm => "6.1.",
            Self::Bullseye => "5.10.",
            Self::Backports => "6.12.",
        }
    }

    /// The image's file names of this kernel and its initramfs.
    fn files(self) -> (&'static str, &'static str) {
        match self {
            Self::Bookworm => ("vmlinuz", "initrd.img"),
            Self::Bullseye => ("vmlinuz-5.10", "initrd.img-5.10"),
            Self::Backports => ("vmlinuz-6.12", "initrd.img-6.12"),
        }
    }
}

impl Default for GuestOptions {
    fn default() -> Self {
        Self {
            memory_mib: 1024,
            cpus: 2,
            cmdline: String::new(),
            timeout: Duration::from_secs(420),
            kernel: GuestKernel::default(),
            qmp_port: None,
        }
    }
}

/// What a finished guest left behind.
#[derive(Debug)]
pub struct GuestRun {
    /// The serial console (kernel and `nm-guest.service` output).
    pub console: String,
    /// The guest's `/mnt/out`.
    pub out: OutDir,
    pub elapsed: Duration,
}

impl GuestRun {
    pub fn read_out(&self, name: &str) -> Result<String> {
        let p = self.out.path().join(name);
        fs::read_to_string(&p).with_context(|| format!("guest output {} missing", p.display()))
    }
}

/// The guest's `/mnt/out` on the host: a temporary directory removed with the run, or a
/// caller's directory, which is kept.
#[derive(Debug)]
pub enum OutDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl OutDir {
    /// A temporary `/mnt/out`, removed with the run.
    fn temp() -> Result<OutDir> {
        Ok(OutDir::Temp(
            tempfile::Builder::new().prefix("nm-guest-out").tempdir()?,
        ))
    }

    pub fn path(&self) -> &Path {
        match self {
            OutDir::Temp(t) => t.path(),
            OutDir::Kept(p) => p,
        }
    }
}

/// Which accelerator qemu can use here.
pub fn accelerator() -> &'static str {
    if Path::new("/sys/module/kvm_pvm").exists() || !Path::new("/dev/kvm").exists() {
        "tcg"
    } else {
        "kvm"
    }
}

/// The qemu command for one boot, its console written to `console`.
fn qemu_command(
    payload: &Path,
    opts: &GuestOptions,
    out: &OutDir,
    image: &Path,
    console: fs::File,
) -> Result<Command> {
    let qemu = which_qemu()?;
    let accel = accelerator();
    let cpu = if accel == "tcg" { "max" } else { "host" };
    let mut cmd = Command::new(qemu);
    cmd.args(["-machine", &format!("q35,accel={accel}"), "-cpu", cpu])
        .args([
            "-smp",
            &opts.cpus.to_string(),
            "-m",
            &opts.memory_mib.to_string(),
        ])
        .args(["-nographic", "-nodefaults", "-serial", "stdio"])
        .arg("-kernel")
        .arg(image.join(opts.kernel.files().0))
        .arg("-initrd")
        .arg(image.join(opts.kernel.files().1))
        .args([
            "-append",
            &format!(
                "root=/dev/vda rw console=ttyS0 quiet loglevel=5 panic=-1 systemd.unified_cgroup_hierarchy=1 {}",
                opts.cmdline
            ),
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=raw,snapshot=on",
            image.join("rootfs.ext4").display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=host,security_model=none,readonly=on",
            payload.display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=out,security_model=none",
            out.path().display()
        ))
        .args([
            "-netdev",
            "user,id=n0",
            "-device",
            "virtio-net-pci,netdev=n0",
        ])
        .stdin(Stdio::null());
    match opts.qmp_port {
        Some(port) => cmd.args(["-qmp", &format!("tcp:127.0.0.1:{port},server=on,wait=off")]),
        None => cmd.arg("-no-reboot"),
    };
    cmd.stdout(console.try_clone()?).stderr(console);
    // The guest dies with the thread that waits for it: a test that fails (and exits) never
    // leaves a guest running, holding the VM lock and two cores.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// Boots the guest with `payload` shared at /mnt/host (it must contain `guest-entry.sh`) and waits
/// until the guest powers off (the entry script ends with a shutdown of some kind).
pub fn run_guest(payload: &Path, opts: &GuestOptions) -> Result<GuestRun> {
    run_guest_in(payload, opts, OutDir::temp()?)
}

/// [`run_guest`] with the guest's `/mnt/out` at `out`, which the caller can read while the guest
/// runs and which outlives a failed run.
pub fn run_guest_in(payload: &Path, opts: &GuestOptions, out: OutDir) -> Result<GuestRun> {
    run_guest_until(
        payload,
        opts,
        out,
        &AtomicBool::new(false),
        OnStall::BootAgain,
    )
}

/// What the runner does with a guest whose kernel locked up ([`stalled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnStall {
    /// Boots it again with an emptied `/mnt/out`, at most twice: a guest that runs its entry
    /// script alone, with nothing on the host waiting on its state.
    BootAgain,
    /// Ends it at once: the test talking to it sees the guest gone, with the console's report.
    End,
}

/// The guest kernel's own report of a lockup that lasted [`STALL_LIMIT`] or more: `watchdog:
/// BUG: soft lockup - CPU#0 stuck for 130s!`. Both emulated CPUs have been seen spinning in the
/// kernel for the rest of the run under TCG on a loaded host; a shorter report is a host that
/// did not schedule the vCPU thread for a while, which the guest survives.
pub fn stalled(console: &str) -> Option<&str> {
    console.lines().find(|l| {
        l.split_once("soft lockup - CPU#")
            .and_then(|(_, rest)| rest.split_once("stuck for ")?.1.split_once('s'))
            .and_then(|(secs, _)| secs.parse::<u64>().ok())
            .is_some_and(|secs| secs >= STALL_LIMIT.as_secs())
    })
}

/// The guest kernel's panic (`Kernel panic - not syncing: …`), when its console has one. Under
/// TCG the 6.12 kernel has been seen to die in its network stack during boot
/// (`inet_ehashfn`, "Fatal exception in interrupt"), before anything of the test ran.
pub fn panicked(console: &str) -> Option<&str> {
    console
        .lines()
        .find(|l| l.contains("Kernel panic - not syncing"))
}

/// How long a reported soft lockup must have lasted to count as the guest's end ([`stalled`]).
pub const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Empties a guest's `/mnt/out` before it is booted again.
fn empty_out(out: &OutDir) -> Result<()> {
    for entry in fs::read_dir(out.path())? {
        let path = entry?.path();
        if path.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// [`run_guest_in`], killing qemu as soon as `abort` is set (the run is then returned as it
/// stands, for its files and console).
fn run_guest_until(
    payload: &Path,
    opts: &GuestOptions,
    out: OutDir,
    abort: &AtomicBool,
    on_stall: OnStall,
) -> Result<GuestRun> {
    if !payload.join("guest-entry.sh").is_file() {
        bail!("{} has no guest-entry.sh", payload.display());
    }
    let image = image_dir()?;
    let console_path = out.path().join(".console.log");
    let mut started = Instant::now();
    let mut boots = 1;
    // Each boot writes a fresh console.
    let boot = |out: &OutDir| -> Result<std::process::Child> {
        let console = fs::File::create(&console_path)?;
        qemu_command(payload, opts, out, &image, console)?
            .spawn()
            .context("starting qemu")
    };
    let mut child = boot(&out)?;
    loop {
        if let Some(status) = child.try_wait()? {
            let console = fs::read_to_string(&console_path).unwrap_or_default();
            if !status.success() {
                bail!(
                    "qemu exited with {status}; console:\n{}",
                    tail(&console, 80)
                );
            }
            return Ok(GuestRun {
                console,
                out,
                elapsed: started.elapsed(),
            });
        }
        let console = fs::read_to_string(&console_path).unwrap_or_default();
        // virtio-9p sometimes attaches after the guest's early mounts ("9pnet_virtio: no
        // channels available for device host"): the share is missing and the guest's entry
        // never runs. That is qemu's and the guest kernel's boot race, not the test's subject:
        // boot again, at most twice, and say so.
        if boots < 3 && console.contains("no channels available for device") {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("guest boot {boots}: a 9p share did not attach; booting again");
            boots += 1;
            started = Instant::now();
            child = boot(&out)?;
            continue;
        }
        // A kernel locked up under emulation: the same kind of race, booted again where nothing
        // on the host depends on the guest's state, and ended at once elsewhere.
        if let Some(report) = stalled(&console) {
            let _ = child.kill();
            let _ = child.wait();
            if on_stall == OnStall::BootAgain && boots < 3 {
                eprintln!(
                    "guest boot {boots}: the guest's kernel locked up ({report}); booting again"
                );
                boots += 1;
                empty_out(&out)?;
                started = Instant::now();
                child = boot(&out)?;
                continue;
            }
            bail!(
                "the guest's kernel locked up ({report}); console:\n{}",
                tail(&console, 80)
            );
        }
        if abort.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            let console = fs::read_to_string(&console_path).unwrap_or_default();
            return Ok(GuestRun {
                console,
                out,
                elapsed: started.elapsed(),
            });
        }
        if started.elapsed() > opts.timeout {
            let _ = child.kill();
            let _ = child.wait();
            let console = fs::read_to_string(&console_path).unwrap_or_default();
            bail!(
                "guest did not power off within {:?}; console:\n{}",
                opts.timeout,
                tail(&console, 80)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn which_qemu() -> Result<PathBuf> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("qemu-system-x86_64");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("qemu-system-x86_64 not found: run `scripts/setup.sh --with-vm`")
}

/// The last `n` lines of a log, for failure messages.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The shell helpers of every guest script: `log` (a timestamped line), `uptime_s`, `wait_for
/// FILE` (the host's flag files) and `within SECONDS COMMAND…`.
macro_rules! shell_helpers {
    () => {
        r#"log() { echo "$(date +%s.%N) $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
wait_for() { while [ ! -e "$1" ]; do sleep 0.2; done; }
# Waits up to $1 seconds for the command that follows; false on timeout.
within() { local n=$(( $1 * 5 )); shift; for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done; return 1; }
"#
    };
}

/// [`ENTRY_PRELUDE`]'s helpers alone, for scripts that run beside the entry (a real node's steps).
pub const SHELL_HELPERS: &str = shell_helpers!();

/// The start of a guest entry script: bash, `set -u`, everything into `/mnt/out/entry.log`, and
/// the [`SHELL_HELPERS`].
pub const ENTRY_PRELUDE: &str = concat!(
    "#!/bin/bash\nset -u\nexec >>/mnt/out/entry.log 2>&1\n",
    shell_helpers!(),
    r#"# The entry starts once systemd-networkd runs, not at network-online (seconds of boot under
# emulation): the address and the route to the host come a moment later.
for _ in $(seq 100); do ip -4 route show default | grep -q . && break; sleep 0.1; done
"#
);

/// Hard-links `src` to `dst`, or copies it when they are on different file systems. A `dst`
/// already there is removed first: copying onto a hard link of `src` itself would truncate
/// `src` (they are one file).
pub fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    match fs::remove_file(dst) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove {}", dst.display())),
    }
    if fs::hard_link(src, dst).is_err() {
        fs::copy(src, dst).with_context(|| format!("copy {}", src.display()))?;
    }
    Ok(())
}

/// A guest's payload directory, shared read-only at `/mnt/host`: binaries, configuration, the
/// entry script, and the files the host hands over while the guest runs (the kubeconfig, flag
/// files that step the guest along).
#[derive(Debug)]
pub struct Payload {
    dir: tempfile::TempDir,
}

impl Payload {
    /// An empty payload directory named `<prefix>…` under the temporary directory.
    pub fn new(prefix: &str) -> Result<Payload> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("payload directory")?;
        Ok(Payload { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Links (or copies) a host file to `/mnt/host/<name>`.
    pub fn link(&self, name: &str, src: &Path) -> Result<()> {
        link_or_copy(src, &self.path().join(name))
    }

    /// Links (or copies) each of this workspace's binaries to `/mnt/host/<bin>`.
    pub fn link_binaries(&self, bins: &[&str]) -> Result<()> {
        for bin in bins {
            self.link(bin, &crate::e2e::binary(bin))?;
        }
        Ok(())
    }

    /// Writes `/mnt/host/<name>` before the guest boots.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<()> {
        let p = self.path().join(name);
        fs::write(&p, contents).with_context(|| format!("write {}", p.display()))
    }

    /// Writes the executable entry script, `/mnt/host/guest-entry.sh`.
    pub fn entry(&self, script: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        self.write("guest-entry.sh", script)?;
        fs::set_permissions(
            self.path().join("guest-entry.sh"),
            fs::Permissions::from_mode(0o755),
        )
        .context("chmod guest-entry.sh")
    }

    /// A file for the running guest, renamed into place: the guest waits for the name and must
    /// never read half a file.
    pub fn put(&self, name: &str, contents: &[u8]) -> Result<PathBuf> {
        let tmp = self.path().join(format!(".{name}"));
        let dst = self.path().join(name);
        fs::write(&tmp, contents).with_context(|| format!("write {}", tmp.display()))?;
        fs::rename(&tmp, &dst).with_context(|| format!("rename into {}", dst.display()))?;
        Ok(dst)
    }

    /// Hands the control plane's guest kubeconfig over, as `/mnt/host/kubeconfig`.
    pub fn kubeconfig(&self, cp: &crate::control_plane::ControlPlane) -> Result<()> {
        let text = fs::read(cp.guest_kubeconfig_path()).context("the guest kubeconfig")?;
        self.put("kubeconfig", &text)?;
        Ok(())
    }

    /// Drops the empty flag file `/mnt/host/<flag>`, which the guest waits for.
    pub fn signal(&self, flag: &str) -> Result<()> {
        self.put(flag, b"")?;
        Ok(())
    }
}

/// A guest booting or running in a thread while the test talks to the API.
#[derive(Debug)]
pub struct Guest {
    /// Taken by [`Guest::finish`]; a guest dropped with it still here is ended ([`Drop`]).
    handle: Option<std::thread::JoinHandle<Result<GuestRun>>>,
    abort: Arc<AtomicBool>,
    /// When the boot began.
    pub started: Instant,
}

impl Guest {
    /// Boots the guest from `payload` ([`run_guest`]) in a thread.
    pub fn boot(payload: &Path, opts: GuestOptions) -> Guest {
        let path = payload.to_owned();
        Self::spawn(move |abort| {
            run_guest_until(&path, &opts, OutDir::temp()?, abort, OnStall::End)
        })
    }

    /// [`Guest::boot`] with the guest's `/mnt/out` at `out` ([`run_guest_in`]).
    pub fn boot_in(payload: &Path, opts: GuestOptions, out: OutDir) -> Guest {
        let path = payload.to_owned();
        Self::spawn(move |abort| run_guest_until(&path, &opts, out, abort, OnStall::End))
    }

    fn spawn(run: impl FnOnce(&AtomicBool) -> Result<GuestRun> + Send + 'static) -> Guest {
        let abort = Arc::new(AtomicBool::new(false));
        let flag = abort.clone();
        Guest {
            handle: Some(std::thread::spawn(move || run(&flag))),
            abort,
            started: Instant::now(),
        }
    }

    /// Is qemu still running?
    pub fn running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Waits until qemu exits (the guest powered off, or the run's timeout killed it).
    pub async fn finish(mut self) -> Result<GuestRun> {
        let handle = self
            .handle
            .take()
            .context("the guest was already finished")?;
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .context("join task")?
            .map_err(|_| anyhow::anyhow!("the guest thread panicked"))?
    }

    /// Fails the test with `what` and the tails of the guest's `files` and console, once it
    /// ended: for a guest that ended (or must be ended) before the host told it to.
    pub async fn fail(self, what: &str, files: &[&str]) -> ! {
        match self.finish().await {
            Ok(run) => panic!("{what}\n{}", report(&run, files)),
            Err(e) => panic!("{what}\nguest run failed: {e:#}"),
        }
    }

    /// Fails the test with `what` and the tails of the guest's `files` and console, killing
    /// the guest first: for a guest still running when the test gave up waiting on it.
    pub async fn abort(self, what: &str, files: &[&str]) -> ! {
        self.abort.store(true, Ordering::Relaxed);
        self.fail(what, files).await
    }
}

/// A guest dropped before it finished (its test failed) is killed within the runner's 200 ms
/// poll: it must not run on, holding two cores, through the tests that follow.
impl Drop for Guest {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.abort.store(true, Ordering::Relaxed);
        }
    }
}

/// The last 60 lines of each of the guest's `files` (those it wrote) and the last 40 of its
/// console, for a failure message.
pub fn report(run: &GuestRun, files: &[&str]) -> String {
    let mut out = String::new();
    for f in files {
        if let Ok(text) = run.read_out(f) {
            out.push_str(&format!("--- {f}:\n{}\n", tail(&text, 60)));
        }
    }
    out.push_str(&format!("--- console:\n{}\n", tail(&run.console, 40)));
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_payload_holds_an_executable_entry_and_files_put_whole() {
        let payload = Payload::new("nm-payload-test").expect("payload");
        payload
            .entry(&format!("{ENTRY_PRELUDE}log hello\n"))
            .expect("entry");
        let entry = payload.path().join("guest-entry.sh");
        assert!(
            fs::read_to_string(&entry)
                .expect("entry")
                .starts_with("#!/bin/bash\n")
        );
        assert_eq!(
            fs::metadata(&entry).expect("entry").permissions().mode() & 0o777,
            0o755
        );
        let src = payload.path().join("src");
        fs::write(&src, "bin").expect("src");
        payload.link("linked", &src).expect("link");
        assert_eq!(
            fs::read_to_string(payload.path().join("linked")).expect("linked"),
            "bin"
        );
        // Linked again (a later step of the same boot): the source stays whole, where a copy
        // onto its own hard link truncated it.
        payload.link("linked", &src).expect("link again");
        assert_eq!(fs::read_to_string(&src).expect("src"), "bin");
        assert_eq!(
            fs::read_to_string(payload.path().join("linked")).expect("linked"),
            "bin"
        );
        payload.put("kubeconfig", b"apiVersion: v1\n").expect("put");
        payload.signal("go").expect("signal");
        let mut names: Vec<String> = fs::read_dir(payload.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        // Renamed into place: no temporary name is left behind.
        assert_eq!(
            names,
            ["go", "guest-entry.sh", "kubeconfig", "linked", "src"]
        );
    }

    #[test]
    fn a_lockup_counts_once_it_lasted_the_limit() {
        let short = "[   64.38] watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [bash:627]";
        let long =
            "[  972.38] watchdog: BUG: soft lockup - CPU#0 stuck for 872s! [tokio-rt-worker:623]";
        let limit = "[  200.00] watchdog: BUG: soft lockup - CPU#1 stuck for 120s! [bash:627]";
        assert_eq!(stalled(short), None, "a host that paused the vCPU thread");
        assert_eq!(stalled(&format!("boot\n{short}\n{long}\n")), Some(long));
        assert_eq!(stalled(limit), Some(limit));
        assert_eq!(
            stalled("rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:"),
            None
        );
        assert_eq!(stalled("soft lockup - CPU#0 stuck for lots! [x]"), None);
    }

    #[test]
    fn a_kernel_panic_is_found_in_the_console() {
        let line = "[   52.400102] Kernel panic - not syncing: Fatal exception in interrupt";
        assert_eq!(
            panicked(&format!("[ 52.39] RIP: inet_ehashfn\n{line}\n")),
            Some(line)
        );
        assert_eq!(panicked("[ 1.0] panic=10 in the command line\n"), None);
    }
}
