//! The shipped manifests as a real API server sees them: a kustomization rendered by a real
//! `kustomize build` (v5, built from its Go module by `cargo xtask build kustomize`, cached under
//! `~/.cache/node-monitor/kustomize/current`; `NODE_MONITOR_KUSTOMIZE` names another binary),
//! server-side apply of the result with strict field validation, and the prometheus-operator
//! CRDs the monitoring manifests need.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), node_monitor_tests::manifests::Error> {
//! use node_monitor_tests::manifests;
//! let objects = manifests::render(&manifests::kustomize_dir("overlays/shutdown"))?;
//! manifests::apply(&client, &objects).await?;
//! manifests::install_monitoring_crds(&client).await?;
//! # Ok(()) }
//! ```
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
    core::GroupVersionKind,
    discovery::{Scope, pinned_kind},
};
use serde_json::Value;

use crate::control_plane::SETUP_COMMAND;

/// The prometheus-operator release whose CRDs `scripts/setup.sh` fetches.
pub const PROMETHEUS_OPERATOR_VERSION: &str = "v0.85.0";
/// The CRDs the monitoring manifests need, as named in the module's
/// `example/prometheus-operator-crd/`.
pub const CRD_FILES: [&str; 2] = [
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
];
/// Field manager of every apply.
pub const FIELD_MANAGER: &str = "node-monitor-tests";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    #[error(
        "no kustomize at {path}: run `{SETUP_COMMAND}` (or point NODE_MONITOR_KUSTOMIZE at a \
         kustomize v5 binary)"
    )]
    NoKustomize { path: PathBuf },
    #[error("run {kustomize} build {dir}")]
    RunKustomize {
        kustomize: PathBuf,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kustomize build {dir} failed ({status}): {stderr}")]
    Kustomize {
        dir: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{origin}: {what}")]
    Object { origin: PathBuf, what: String },
    #[error("discover the API resource for {kind} ({origin})")]
    Discovery {
        kind: String,
        origin: PathBuf,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("server-side apply of {kind} {name} from {origin}")]
    Apply {
        kind: String,
        name: String,
        origin: PathBuf,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "no prometheus-operator {PROMETHEUS_OPERATOR_VERSION} CRDs: {path} is missing; run \
         `{SETUP_COMMAND}` (or point NODE_MONITOR_CRDS at a directory holding {CRD_FILES:?})"
    )]
    NoCrds { path: PathBuf },
    #[error("CRD {name} is not Established after {timeout:?}; last conditions: {conditions}")]
    NotEstablished {
        name: String,
        timeout: Duration,
        conditions: String,
    },
    #[error("read CRD {name}")]
    ReadCrd {
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One rendered object and the file it came from.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub origin: PathBuf,
    pub object: Value,
}

impl Manifest {
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// The workspace's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A directory under `deploy/kustomize`, e.g. `base` or `overlays/shutdown`.
pub fn kustomize_dir(rel: &str) -> PathBuf {
    deploy_dir().join("kustomize").join(rel)
}

/// The objects of one manifest file (every YAML document that is not empty).
pub fn read_objects(path: &Path) -> Result<Vec<Manifest>> {
    let text = fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_objects(&text, path)
}

/// The objects of a YAML stream (every document that is not empty), from `origin`.
fn parse_objects(text: &str, origin: &Path) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let object: Value = serde::Deserialize::deserialize(doc).map_err(|source| Error::Yaml {
            path: origin.to_owned(),
            source,
        })?;
        if !object.is_null() {
            out.push(Manifest {
                origin: origin.to_owned(),
                object,
            });
        }
    }
    Ok(out)
}

/// The kustomize binary: `NODE_MONITOR_KUSTOMIZE`, else the setup's cache.
pub fn kustomize_binary() -> Result<PathBuf> {
    let path = env::var_os("NODE_MONITOR_KUSTOMIZE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || cache_dir().join("kustomize/current/kustomize"),
            PathBuf::from,
        );
    if !path.is_file() {
        return Err(Error::NoKustomize { path });
    }
    Ok(path)
}

/// Renders the kustomization in `dir` with `kustomize build`: its objects in kustomize's order.
pub fn render(dir: &Path) -> Result<Vec<Manifest>> {
    let kustomize = kustomize_binary()?;
    let out = Command::new(&kustomize)
        .arg("build")
        .arg(dir)
        .output()
        .map_err(|source| Error::RunKustomize {
            kustomize: kustomize.clone(),
            dir: dir.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Kustomize {
            dir: dir.to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    parse_objects(&String::from_utf8_lossy(&out.stdout), dir)
}

/// `target` as a path relative to `root`, both absolute (the symbolic links resolved): a
/// kustomization composed in a temporary directory names the shipped bases and components this
/// way, since kustomize refuses an absolute root.
pub fn relative_path(root: &Path, target: &Path) -> PathBuf {
    let resolve = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let (root, target) = (resolve(root), resolve(target));
    let common = root
        .components()
        .zip(target.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in root.components().skip(common) {
        out.push("..");
    }
    for c in target.components().skip(common) {
        out.push(c);
    }
    out
}

/// The first rendered object of this kind and name.
pub fn find<'a>(objects: &'a [Manifest], kind: &str, name: &str) -> Option<&'a Manifest> {
    objects
        .iter()
        .find(|m| m.kind() == kind && m.name() == name)
}

/// Server-side applies every object, in order, with strict field validation: an unknown or
/// mistyped field is an error, not a warning.
pub async fn apply(client: &Client, objects: &[Manifest]) -> Result<Vec<DynamicObject>> {
    apply_objects(client, objects, false).await
}

/// As [`apply`], as a server-side dry run: every object is validated and admitted, none stored
/// (no controller acts on it).
pub async fn apply_dry_run(client: &Client, objects: &[Manifest]) -> Result<Vec<DynamicObject>> {
    apply_objects(client, objects, true).await
}

async fn apply_objects(
    client: &Client,
    objects: &[Manifest],
    dry_run: bool,
) -> Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for m in objects {
        let object_err = |what: String| Error::Object {
            origin: m.origin.clone(),
            what,
        };
        let obj: DynamicObject = serde_json::from_value(m.object.clone())
            .map_err(|e| object_err(format!("not a Kubernetes object: {e}")))?;
        let types = obj
            .types
            .clone()
            .ok_or_else(|| object_err("no apiVersion/kind".into()))?;
        let gvk = GroupVersionKind::try_from(&types)
            .map_err(|e| object_err(format!("apiVersion {:?}: {e}", types.api_version)))?;
        let (resource, caps) =
            pinned_kind(client, &gvk)
                .await
                .map_err(|source| Error::Discovery {
                    kind: types.kind.clone(),
                    origin: m.origin.clone(),
                    source: Box::new(source),
                })?;
        let name = obj
            .metadata
            .name
            .clone()
            .ok_or_else(|| object_err(format!("a {} without a name", types.kind)))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let mut params = PatchParams::apply(FIELD_MANAGER)
            .force()
            .validation_strict();
        params.dry_run = dry_run;
        let out = api
            .patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|source| Error::Apply {
                kind: types.kind.clone(),
                name: name.clone(),
                origin: m.origin.clone(),
                source: Box::new(source),
            })?;
        applied.push(out);
    }
    Ok(applied)
}

fn cache_dir() -> PathBuf {
    env::var_os("NODE_MONITOR_CACHE")
        .map(PathBuf::from)
        .or_else(|| env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("node-monitor")))
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/node-monitor")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/node-monitor"))
}

/// The directory holding [`CRD_FILES`]: `NODE_MONITOR_CRDS`, else the setup script's cache
/// (`<cache>/prometheus-operator/current`).
pub fn crd_dir() -> Result<PathBuf> {
    let dir = env::var_os("NODE_MONITOR_CRDS")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || cache_dir().join("prometheus-operator/current"),
            PathBuf::from,
        );
    for f in CRD_FILES {
        let p = dir.join(f);
        if !fs::metadata(&p).is_ok_and(|m| m.is_file() && m.len() > 0) {
            return Err(Error::NoCrds { path: p });
        }
    }
    Ok(dir)
}

/// Applies the ServiceMonitor and PrometheusRule CRDs and waits until the API server serves them
/// (`Established`).
pub async fn install_monitoring_crds(client: &Client) -> Result<Vec<String>> {
    let dir = crd_dir()?;
    let mut crds = Vec::new();
    for f in CRD_FILES {
        crds.extend(read_objects(&dir.join(f))?);
    }
    install_crds(client, &crds).await
}

/// Applies the CustomResourceDefinitions `node-monitor remediate` ships (deploy/remediate/crd.yaml:
/// NodeFence) and waits until they are served.
pub async fn install_remediate_crds(client: &Client) -> Result<Vec<String>> {
    let crds = read_objects(&deploy_dir().join("remediate/crd.yaml"))?;
    install_crds(client, &crds).await
}

/// Applies CustomResourceDefinitions and waits until the API server serves them (`Established`);
/// their names.
pub async fn install_crds(client: &Client, crds: &[Manifest]) -> Result<Vec<String>> {
    apply(client, crds).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let timeout = Duration::from_secs(60);
    let names: Vec<String> = crds.iter().map(|m| m.name().to_owned()).collect();
    for name in &names {
        let deadline = Instant::now() + timeout;
        loop {
            let crd = api.get(name).await.map_err(|source| Error::ReadCrd {
                name: name.clone(),
                source: Box::new(source),
            })?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::NotEstablished {
                    name: name.clone(),
                    timeout,
                    conditions: format!("{conditions:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        for (root, target, want) in [
            ("/tmp/a", "/work/main/deploy", "../../work/main/deploy"),
            ("/work/main/x", "/work/main/deploy/base", "../deploy/base"),
            ("/work/main", "/work/main/deploy", "deploy"),
            ("/work/main/deploy", "/work/main", ".."),
        ] {
            assert_eq!(
                relative_path(Path::new(root), Path::new(target)),
                PathBuf::from(want),
                "{root} → {target}"
            );
        }
    }
}
