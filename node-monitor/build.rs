//! Builds the eBPF programs with the pinned nightly (its LLVM must match bpf-linker's; see
//! scripts/setup.sh) and leaves the object in OUT_DIR for `include_bytes_aligned!`.
use aya_build::{Package, Toolchain};

/// The nightly that compiles the eBPF crate. Keep in step with `EBPF_TOOLCHAIN` in xtask/src/setup.rs (a unit test there checks).
const EBPF_TOOLCHAIN: &str = "nightly-2026-07-20";

/// What `--version` says of the source: the commit (`NODE_MONITOR_COMMIT`, else git's HEAD) and
/// its date (git's committer date, else `SOURCE_DATE_EPOCH`), never the time of the build, so two
/// builds of one commit are the same binary.
fn source_info() {
    println!("cargo::rerun-if-env-changed=NODE_MONITOR_COMMIT");
    println!("cargo::rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let git_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../.git");
    for f in ["HEAD", "refs/heads", "packed-refs"] {
        if std::path::Path::new(git_dir).join(f).exists() {
            println!("cargo::rerun-if-changed={git_dir}/{f}");
        }
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let commit = std::env::var("NODE_MONITOR_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let date = git(&["log", "-1", "--format=%cI"])
        .or_else(|| {
            std::env::var("SOURCE_DATE_EPOCH")
                .ok()
                .map(|s| format!("@{s}"))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo::rustc-env=NODE_MONITOR_COMMIT={commit}");
    println!("cargo::rustc-env=NODE_MONITOR_SOURCE_DATE={date}");
}

fn main() -> anyhow::Result<()> {
    source_info();
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../node-monitor-ebpf");
    println!("cargo::rerun-if-env-changed=NODE_MONITOR_EBPF_TOOLCHAIN");
    let toolchain =
        std::env::var("NODE_MONITOR_EBPF_TOOLCHAIN").unwrap_or_else(|_| EBPF_TOOLCHAIN.to_owned());
    // The eBPF object keeps its debug information and BTF (file names, the compilation
    // directory), and the agent embeds it. aya-build sets the rustflags of its cargo itself, so
    // no --remap-path-prefix reaches it; instead its (nightly) cargo trims every path: workspace
    // files to `./<crate>/src/…`, registry crates to `<index>/<crate>-<version>/…`, the standard
    // library to `/rustc/<commit>/…`. The object, and so the image, do not depend on where the
    // checkout, CARGO_HOME, rustup or the target directory live.
    // SAFETY: the build script has not started a thread; aya-build's cargo inherits these.
    unsafe {
        std::env::set_var("CARGO_UNSTABLE_TRIM_PATHS", "true");
        std::env::set_var("CARGO_PROFILE_RELEASE_TRIM_PATHS", "all");
    }
    aya_build::build_ebpf(
        [Package {
            name: "node-monitor-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Custom(&toolchain),
    )
}
