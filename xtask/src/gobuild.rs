//! The Go-built parts, each built once and cached by version: the control plane (etcd,
//! kube-apiserver, kube-controller-manager) the integration tiers run, and the real node's kubelet,
//! kube-scheduler, containerd (with ctr and the runc shim) and pause; and helm, which the deploy
//! tier lints, renders and tests the chart with.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::sh::{self, cache_dir, log, quiet_stdout, run};

/// The Kubernetes release of the control plane and the real node (one version for both).
pub const K8S_VERSION: &str = "v1.36.3";
/// The oldest Kubernetes release the manifests support (the chart's `kubeVersion`): the
/// version-skew tier runs the control-plane and RBAC tests against its API server.
pub const SKEW_K8S_VERSION: &str = "v1.30.14";
/// etcd's release.
pub const ETCD_VERSION: &str = "v3.6.16";
/// containerd's release (2.x, from its Go module).
pub const CONTAINERD_VERSION: &str = "v2.2.9";

/// helm's release (v3, from its Go module helm.sh/helm/v3).
pub const HELM_VERSION: &str = "v3.22.0";
/// kustomize's release (v5, from its Go module sigs.k8s.io/kustomize/kustomize/v5), which the
/// deploy tier renders the Kustomize variants with.
pub const KUSTOMIZE_VERSION: &str = "v5.7.1";

/// `$name` from the environment, else `default` (the versions can be overridden for a trial).
fn version(name: &str, default: &str) -> String {
    env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn go() -> Result<Command> {
    if !sh::have("go") {
        bail!(
            "go is not installed: the control plane and the node binaries are built from Go modules"
        );
    }
    Ok(Command::new("go"))
}

/// Builds etcd, kube-apiserver and kube-controller-manager once; returns the directory that holds
/// them (usable as `KUBEBUILDER_ASSETS`).
pub fn control_plane() -> Result<PathBuf> {
    control_plane_at(&version("K8S_VERSION", K8S_VERSION))
}

/// [`control_plane`] at Kubernetes release `k8s` (`v1.X.Y`).
pub fn control_plane_at(k8s: &str) -> Result<PathBuf> {
    const CHORE: &str = "build control-plane";
    let etcd = version("ETCD_VERSION", ETCD_VERSION);
    let out = cache_dir().join(format!("control-plane/k8s-{k8s}-etcd-{etcd}"));
    if ["kube-apiserver", "kube-controller-manager", "etcd"]
        .iter()
        .all(|b| is_executable(&out.join(b)))
    {
        return Ok(out);
    }
    let work = cache_dir().join(format!("control-plane/build-{k8s}"));
    let tmp = with_suffix(&out, ".tmp");
    fs::create_dir_all(work.join("etcd"))?;
    fs::create_dir_all(&tmp)?;

    let k8s_dir = work.join("k8s");
    k8s_module(
        &k8s_dir,
        k8s,
        "node-monitor.local/control-plane",
        &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
        ],
    )?;
    log(
        CHORE,
        "building kube-apiserver and kube-controller-manager (several minutes on 2 cores)",
    );
    run(quiet_stdout(
        go()?
            .current_dir(&k8s_dir)
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-ldflags", &k8s_ldflags(k8s), "-o"])
            .arg(format!("{}/", tmp.display()))
            .args([
                "k8s.io/kubernetes/cmd/kube-apiserver",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
            ]),
    ))?;

    let etcd_dir = work.join("etcd");
    tools_module(
        &etcd_dir,
        "node-monitor.local/etcd",
        &["go.etcd.io/etcd/server/v3"],
    )?;
    run(go()?
        .current_dir(&etcd_dir)
        .args(["mod", "edit"])
        .arg(format!("-require=go.etcd.io/etcd/server/v3@{etcd}")))?;
    tidy(&etcd_dir)?;
    log(CHORE, format!("building etcd {etcd}"));
    run(quiet_stdout(
        go()?
            .current_dir(&etcd_dir)
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
            .arg(tmp.join("etcd"))
            .arg("go.etcd.io/etcd/server/v3"),
    ))?;
    replace_dir(&tmp, &out)?;
    Ok(out)
}

/// Builds helm (`helm.sh/helm/v3/cmd/helm`) once; returns the directory that holds it.
pub fn helm() -> Result<PathBuf> {
    let helm = version("HELM_VERSION", HELM_VERSION);
    let out = cache_dir().join(format!("helm/{helm}"));
    if is_executable(&out.join("helm")) {
        return Ok(out);
    }
    let work = cache_dir().join(format!("helm/build-{helm}"));
    let tmp = with_suffix(&out, ".tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    tools_module(
        &work,
        "node-monitor.local/helm",
        &["helm.sh/helm/v3/cmd/helm"],
    )?;
    run(go()?
        .current_dir(&work)
        .args(["mod", "edit"])
        .arg(format!("-require=helm.sh/helm/v3@{helm}")))?;
    tidy(&work)?;
    // As helm's Makefile stamps it: the Kubernetes version `helm template` and `helm lint`
    // assume (v1.20 otherwise) is the one of the client-go it is built with (v0.X.Y ↔ v1.X).
    let client_go = sh::output(go()?.current_dir(&work).args([
        "list",
        "-m",
        "-f",
        "{{.Version}}",
        "k8s.io/client-go",
    ]))?;
    let minor = client_go
        .trim()
        .strip_prefix("v0.")
        .and_then(|r| r.split('.').next())
        .with_context(|| format!("k8s.io/client-go version {client_go:?} is not v0.X.Y"))?
        .to_owned();
    let stamp = |pkg: &str| {
        format!(
            " -X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMinor={minor}"
        )
    };
    log("build helm", format!("building helm {helm}"));
    run(quiet_stdout(
        go()?
            .current_dir(&work)
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-ldflags"])
            .arg(format!(
                "-s -w -X helm.sh/helm/v3/internal/version.version={helm}{}{}",
                stamp("lint/rules"),
                stamp("chartutil")
            ))
            .arg("-o")
            .arg(tmp.join("helm"))
            .arg("helm.sh/helm/v3/cmd/helm"),
    ))?;
    replace_dir(&tmp, &out)?;
    Ok(out)
}

/// Builds kustomize (`sigs.k8s.io/kustomize/kustomize/v5`) once; returns the directory that
/// holds it.
pub fn kustomize() -> Result<PathBuf> {
    const PKG: &str = "sigs.k8s.io/kustomize/kustomize/v5";
    let kustomize = version("KUSTOMIZE_VERSION", KUSTOMIZE_VERSION);
    let out = cache_dir().join(format!("kustomize/{kustomize}"));
    if is_executable(&out.join("kustomize")) {
        return Ok(out);
    }
    let work = cache_dir().join(format!("kustomize/build-{kustomize}"));
    let tmp = with_suffix(&out, ".tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    tools_module(&work, "node-monitor.local/kustomize", &[PKG])?;
    run(go()?
        .current_dir(&work)
        .args(["mod", "edit"])
        .arg(format!("-require={PKG}@{kustomize}")))?;
    tidy(&work)?;
    log("build kustomize", format!("building kustomize {kustomize}"));
    run(quiet_stdout(
        go()?
            .current_dir(&work)
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
            .arg(tmp.join("kustomize"))
            .arg(PKG),
    ))?;
    replace_dir(&tmp, &out)?;
    Ok(out)
}

/// Builds what the real node's guest runs besides Debian's packages; returns the directory.
///
/// The kubelet and kube-scheduler come from the control plane's k8s.io/kubernetes version (the
/// tier's control plane schedules its DaemonSet and pods with it); containerd 2.x, ctr and the
/// runc shim from containerd's Go module; pause from the kubelet's own `build/pause/linux/pause.c`,
/// compiled static. runc and the CNI plugins are Debian's, in the guest image.
pub fn node() -> Result<PathBuf> {
    node_at(&version("K8S_VERSION", K8S_VERSION))
}

/// [`node`] with the kubelet and kube-scheduler of Kubernetes release `k8s` (`v1.X.Y`).
pub fn node_at(k8s: &str) -> Result<PathBuf> {
    const CHORE: &str = "build node";
    const BINARIES: [&str; 6] = [
        "kubelet",
        "kube-scheduler",
        "containerd",
        "ctr",
        "containerd-shim-runc-v2",
        "pause",
    ];
    let containerd = version("CONTAINERD_VERSION", CONTAINERD_VERSION);
    let out = cache_dir().join(format!("node/k8s-{k8s}-containerd-{containerd}"));
    if BINARIES.iter().all(|b| is_executable(&out.join(b))) {
        return Ok(out);
    }
    if !sh::have("cc") {
        bail!("a C compiler (cc) is needed for pause");
    }
    let tmp = with_suffix(&out, ".tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let work = cache_dir().join("node/build");

    // kubelet and kube-scheduler
    let kubelet_dir = work.join(format!("kubelet-{k8s}"));
    k8s_module(
        &kubelet_dir,
        k8s,
        "node-monitor.local/kubelet",
        &[
            "k8s.io/kubernetes/cmd/kubelet",
            "k8s.io/kubernetes/cmd/kube-scheduler",
        ],
    )?;
    log(CHORE, format!("building kubelet and kube-scheduler {k8s}"));
    run(quiet_stdout(
        go()?
            .current_dir(&kubelet_dir)
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-ldflags", &k8s_ldflags(k8s), "-o"])
            .arg(format!("{}/", tmp.display()))
            .args([
                "k8s.io/kubernetes/cmd/kubelet",
                "k8s.io/kubernetes/cmd/kube-scheduler",
            ]),
    ))?;

    // pause: the kubelet's own source, from the same module
    let k8s_src = sh::output(go()?.current_dir(&kubelet_dir).args([
        "list",
        "-m",
        "-f",
        "{{.Dir}}",
        "k8s.io/kubernetes",
    ]))?;
    let pause_c = Path::new(k8s_src.trim()).join("build/pause/linux/pause.c");
    if !pause_c.is_file() {
        bail!("no {} in the k8s.io/kubernetes module", pause_c.display());
    }
    log(CHORE, format!("building pause from {}", pause_c.display()));
    run(Command::new("cc")
        .args(["-Os", "-Wall", "-Werror", "-static"])
        .arg(format!("-DVERSION=\"node-monitor-{k8s}\""))
        .arg("-o")
        .arg(tmp.join("pause"))
        .arg(&pause_c))?;
    run(Command::new("strip").arg(tmp.join("pause")))?;

    // containerd, ctr, containerd-shim-runc-v2
    const CONTAINERD_CMDS: [&str; 3] = [
        "github.com/containerd/containerd/v2/cmd/containerd",
        "github.com/containerd/containerd/v2/cmd/ctr",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    ];
    let cd_dir = work.join(format!("containerd-{containerd}"));
    tools_module(&cd_dir, "node-monitor.local/containerd", &CONTAINERD_CMDS)?;
    run(go()?
        .current_dir(&cd_dir)
        .args(["mod", "edit"])
        .arg(format!(
            "-require=github.com/containerd/containerd/v2@{containerd}"
        )))?;
    tidy(&cd_dir)?;
    log(CHORE, format!("building containerd {containerd}"));
    run(quiet_stdout(
        go()?
            .current_dir(&cd_dir)
            .env("CGO_ENABLED", "0")
            .args([
                "build",
                "-tags",
                "no_btrfs no_devmapper",
                "-trimpath",
                "-ldflags",
            ])
            .arg(format!(
                "-s -w -X github.com/containerd/containerd/v2/version.Version={containerd}"
            ))
            .arg("-o")
            .arg(format!("{}/", tmp.display()))
            .args(CONTAINERD_CMDS),
    ))?;
    replace_dir(&tmp, &out)?;
    Ok(out)
}

/// Makes `dir` a Go module that imports the k8s.io/kubernetes commands `packages` at `k8s`,
/// ready for `go build`.
///
/// k8s.io/kubernetes requires its staging modules at v0.0.0 (resolved by `replace` to ./staging in
/// its own tree); a module that imports it must replace each of them with the published version
/// that matches the release (v1.X.Y ↔ v0.X.Y). The list is read from the release's own go.mod, so
/// it stays right across versions.
fn k8s_module(dir: &Path, k8s: &str, module: &str, packages: &[&str]) -> Result<()> {
    const CHORE: &str = "k8s-module";
    tools_module(dir, module, packages)?;
    log(CHORE, format!("resolving k8s.io/kubernetes@{k8s}"));
    sh::output(
        go()?
            .current_dir(dir)
            .args(["mod", "download", "-json"])
            .arg(format!("k8s.io/kubernetes@{k8s}")),
    )?;
    let modcache = sh::output(go()?.current_dir(dir).args(["env", "GOMODCACHE"]))?;
    let modfile = Path::new(modcache.trim())
        .join("cache/download/k8s.io/kubernetes/@v")
        .join(format!("{k8s}.mod"));
    let text =
        fs::read_to_string(&modfile).with_context(|| format!("reading {}", modfile.display()))?;
    let staging = staging_modules(&text);
    if staging.is_empty() {
        bail!("no staging modules found in {}", modfile.display());
    }
    let staging_version = staging_version(k8s)?;
    let mut edit = go()?;
    edit.current_dir(dir)
        .args(["mod", "edit"])
        .arg(format!("-require=k8s.io/kubernetes@{k8s}"));
    for m in &staging {
        edit.arg(format!("-replace={m}={m}@{staging_version}"));
    }
    run(&mut edit)?;
    log(
        CHORE,
        format!(
            "go mod tidy ({} staging modules at {staging_version})",
            staging.len()
        ),
    );
    tidy(dir)
}

/// The staging modules a k8s.io/kubernetes go.mod replaces with its own tree: every
/// `k8s.io/x => ./staging/src/k8s.io/x` line.
fn staging_modules(gomod: &str) -> Vec<String> {
    gomod
        .lines()
        .filter_map(|line| {
            let (module, target) = line.trim().split_once(" => ")?;
            (module.starts_with("k8s.io/") && target.starts_with("./staging/src/"))
                .then(|| module.trim().to_owned())
        })
        .collect()
}

/// The published version of the staging modules for a release: v1.X.Y ↔ v0.X.Y.
fn staging_version(k8s: &str) -> Result<String> {
    let rest = k8s
        .strip_prefix("v1.")
        .with_context(|| format!("K8S_VERSION {k8s:?} is not of the form v1.X.Y"))?;
    Ok(format!("v0.{rest}"))
}

/// The -ldflags that stamp a Kubernetes binary with its version.
fn k8s_ldflags(k8s: &str) -> String {
    let minor = k8s
        .strip_prefix("v1.")
        .and_then(|r| r.split('.').next())
        .unwrap_or_default();
    format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={k8s} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={minor}"
    )
}

/// A fresh go.mod for `module` and a tools.go that imports `packages`.
fn tools_module(dir: &Path, module: &str, packages: &[&str]) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(dir.join("go.mod"), format!("module {module}\n\ngo 1.26\n"))?;
    let imports: String = packages.iter().map(|p| format!("\t_ \"{p}\"\n")).collect();
    fs::write(
        dir.join("tools.go"),
        format!("//go:build tools\n\npackage tools\n\nimport (\n{imports})\n"),
    )?;
    Ok(())
}

fn tidy(dir: &Path) -> Result<()> {
    run(quiet_stdout(
        go()?
            .current_dir(dir)
            .env("GOFLAGS", "-mod=mod")
            .args(["mod", "tidy"]),
    ))
}

/// Fetches the prometheus-operator CRDs (ServiceMonitor, PrometheusRule) from the Go module proxy
/// into a module cache of their own, keeps the two files, and returns their directory.
pub fn prometheus_operator_crds(version: &str) -> Result<PathBuf> {
    const FILES: [&str; 2] = [
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ];
    let po = cache_dir().join("prometheus-operator");
    let crds = po.join(format!("crds-{version}"));
    if FILES
        .iter()
        .all(|f| fs::metadata(crds.join(f)).is_ok_and(|m| m.len() > 0))
    {
        return Ok(crds);
    }
    log(
        "setup",
        format!("fetching the prometheus-operator {version} CRDs from the Go module proxy"),
    );
    fs::create_dir_all(&po)?;
    let gomod = po.join("gomod");
    let json = sh::output(
        go()?
            .current_dir(&po)
            .env("GOMODCACHE", &gomod)
            .env("GOFLAGS", "-mod=mod")
            .args(["mod", "download", "-json"])
            .arg(format!(
                "github.com/prometheus-operator/prometheus-operator@{version}"
            )),
    )?;
    let info: serde_json::Value =
        serde_json::from_str(&json).context("reading `go mod download -json`")?;
    let Some(moddir) = info.get("Dir").and_then(|d| d.as_str()) else {
        bail!("go mod download gave no module directory");
    };
    let tmp = with_suffix(&crds, ".tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    for f in FILES {
        let from = Path::new(moddir)
            .join("example/prometheus-operator-crd")
            .join(f);
        fs::copy(&from, tmp.join(f)).with_context(|| format!("copying {}", from.display()))?;
        // The module cache's files are read-only; the copies are plain 0644 files.
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(tmp.join(f), fs::Permissions::from_mode(0o644))?;
    }
    replace_dir(&tmp, &crds)?;
    // Only the two files are kept; the module cache (read-only files) goes.
    run(go()?.env("GOMODCACHE", &gomod).args(["clean", "-modcache"]))?;
    Ok(crds)
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Moves `from` into place at `to`, replacing what was there.
pub fn replace_dir(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        fs::remove_dir_all(to).with_context(|| format!("removing {}", to.display()))?;
    }
    fs::rename(from, to).with_context(|| format!("moving {} to {}", from.display(), to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_are_the_replaced_k8s_io_lines() {
        let gomod = "module k8s.io/kubernetes\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n)\n\nreplace github.com/x/y => github.com/x/z v1.0.0\nrequire k8s.io/klog/v2 v2.130.1\n";
        assert_eq!(staging_modules(gomod), ["k8s.io/api", "k8s.io/client-go"]);
    }

    #[test]
    fn staging_version_and_ldflags_follow_the_release() {
        assert_eq!(staging_version("v1.36.3").expect("v1"), "v0.36.3");
        assert!(staging_version("1.36.3").is_err());
        let flags = k8s_ldflags("v1.36.3");
        assert!(flags.contains("gitVersion=v1.36.3"), "{flags}");
        assert!(flags.ends_with("gitMinor=36"), "{flags}");
    }
}
