//! The Helm chart deploy/helm/node-monitor as helm itself renders it: `helm` built from its Go
//! module by `cargo xtask setup --with-control-plane` (cached under
//! `~/.cache/node-monitor/helm/current`; `NODE_MONITOR_HELM` names another binary), run on the
//! chart in the working tree. The rendered objects are [`Manifest`]s, for
//! [`crate::manifests::apply`].
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use crate::{
    control_plane::SETUP_COMMAND,
    manifests::{self, Manifest},
};

/// The release name and namespace the tests render with.
pub const RELEASE: &str = "node-monitor";
pub const NAMESPACE: &str = "node-monitor";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no helm at {path}: run `{SETUP_COMMAND}` (or point NODE_MONITOR_HELM at a helm v3 binary)"
    )]
    NoHelm { path: PathBuf },
    #[error("run {helm} {args:?}")]
    Run {
        helm: PathBuf,
        args: Vec<String>,
        #[source]
        source: std::io::Error,
    },
    #[error("helm {args:?} failed ({status}): {stderr}")]
    Failed {
        args: Vec<String>,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("helm {args:?}: output document {index} is not YAML")]
    Yaml {
        args: Vec<String>,
        index: usize,
        #[source]
        source: serde_norway::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    manifests::deploy_dir().join("helm/node-monitor")
}

/// The helm binary: `NODE_MONITOR_HELM`, else the setup's cache.
pub fn binary() -> Result<PathBuf> {
    let path = env::var_os("NODE_MONITOR_HELM")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || {
                env::var_os("HOME")
                    .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
                    .join(".cache/node-monitor/helm/current/helm")
            },
            PathBuf::from,
        );
    if !path.is_file() {
        return Err(Error::NoHelm { path });
    }
    Ok(path)
}

/// Runs helm with `args`; its standard output and error.
pub fn run(args: &[&str]) -> Result<(String, String)> {
    let helm = binary()?;
    let owned: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = Command::new(&helm)
        .args(args)
        // No user state: repositories, plugins and caches of this host's helm stay out.
        .env(
            "HELM_CACHE_HOME",
            env::temp_dir().join("node-monitor-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            env::temp_dir().join("node-monitor-helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            env::temp_dir().join("node-monitor-helm/data"),
        )
        .output()
        .map_err(|source| Error::Run {
            helm: helm.clone(),
            args: owned.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(Error::Failed {
            args: owned,
            status: out.status,
            stderr,
        });
    }
    Ok((stdout, stderr))
}

/// Runs helm with `args` against the cluster of `kubeconfig`, in [`NAMESPACE`]: the release
/// commands (`install`, `upgrade`, `test`, `rollback`, `uninstall` of [`RELEASE`]).
pub fn release(kubeconfig: &Path, args: &[&str]) -> Result<(String, String)> {
    let kubeconfig = kubeconfig.to_string_lossy();
    let mut all = args.to_vec();
    all.extend(["--kubeconfig", &kubeconfig, "--namespace", NAMESPACE]);
    run(&all)
}

/// A values file (for `-f`) whose `config` is `config`, the agent's configuration as YAML; helm
/// merges it key by key over the chart's `config`.
pub fn config_values(config: &str) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write as _;
    let mut file = tempfile::Builder::new()
        .prefix("node-monitor-values")
        .suffix(".yaml")
        .tempfile()?;
    writeln!(file, "config:")?;
    for line in config.lines() {
        writeln!(file, "  {line}")?;
    }
    file.flush()?;
    Ok(file)
}

/// `helm template` of the chart with `--set` values (`key=value`), hooks and test pods included,
/// as [`Manifest`]s in helm's install order.
pub fn template(set: &[&str]) -> Result<Vec<Manifest>> {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let mut args = vec!["template", RELEASE, &*chart, "--namespace", NAMESPACE];
    for s in set {
        args.extend(["--set", s]);
    }
    let (stdout, _) = run(&args)?;
    parse(&stdout, &args)
}

fn parse(text: &str, args: &[&str]) -> Result<Vec<Manifest>> {
    let origin = Path::new("helm template").to_owned();
    let mut out = Vec::new();
    for (index, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let object: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|source| Error::Yaml {
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                index,
                source,
            })?;
        if !object.is_null() {
            out.push(Manifest {
                origin: origin.clone(),
                object,
            });
        }
    }
    Ok(out)
}
