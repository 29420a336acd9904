//! The shipped manifests as a real API server sees them: a kustomization rendered the way
//! `kubectl kustomize` renders the subset deploy/ uses (resources, bases, components, inline JSON
//! 6902 patches with a kind/name target), server-side apply of the result with strict field
//! validation, and the prometheus-operator CRDs the monitoring manifests need.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), node_monitor_tests::manifests::Error> {
//! use node_monitor_tests::manifests;
//! let objects = manifests::render(&manifests::kustomize_dir("overlays/shutdown"))?;
//! manifests::apply(&client, &objects).await?;
//! manifests::install_monitoring_crds(&client).await?;
//! # Ok(()) }
//! ```
//!
//! Anything else in a kustomization is an error naming the field, so a manifest change this
//! renderer does not understand fails the tests instead of being applied half-rendered.
use std::{
    env, fs,
    path::{Path, PathBuf},
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

const KUSTOMIZATION_FIELDS: [&str; 5] =
    ["apiVersion", "kind", "resources", "components", "patches"];

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
        "{path}: unsupported kustomization field {field:?}; supported: resources, components, \
         and patches with an inline JSON 6902 patch and a kind/name target"
    )]
    Unsupported { path: PathBuf, field: String },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("{path}: patch {index} cannot be applied to {kind}/{name}")]
    Patch {
        path: PathBuf,
        index: usize,
        kind: String,
        name: String,
        #[source]
        source: json_patch::PatchError,
    },
    #[error("{path}: patch {index} targets {kind}/{name}, which no resource matches")]
    NoTarget {
        path: PathBuf,
        index: usize,
        kind: String,
        name: String,
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
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let object: Value = serde::Deserialize::deserialize(doc).map_err(|source| Error::Yaml {
            path: path.to_owned(),
            source,
        })?;
        if !object.is_null() {
            out.push(Manifest {
                origin: path.to_owned(),
                object,
            });
        }
    }
    Ok(out)
}

/// Renders the kustomization in `dir`: its resources in order (a directory is a base, rendered
/// first where it is listed), then its components in order (each adds its resources and patches
/// everything rendered so far), then its own patches on the result.
pub fn render(dir: &Path) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    render_into(dir, Kind::Kustomization, &mut out)?;
    Ok(out)
}

/// What a kustomization directory must declare itself as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `kind: Kustomization` (or no kind): a base or an overlay; renders on its own.
    Kustomization,
    /// `kind: Component` (kustomize.config.k8s.io/v1alpha1): listed under `components:`,
    /// patches what the kustomization that lists it has rendered.
    Component,
}

fn render_into(dir: &Path, want: Kind, out: &mut Vec<Manifest>) -> Result<()> {
    let path = dir.join("kustomization.yaml");
    let text = fs::read_to_string(&path).map_err(|source| Error::Read {
        path: path.clone(),
        source,
    })?;
    let k: Value = serde_norway::from_str(&text).map_err(|source| Error::Yaml {
        path: path.clone(),
        source,
    })?;
    let invalid = |what: String| Error::Invalid {
        path: path.clone(),
        what,
    };
    let map = k
        .as_object()
        .ok_or_else(|| invalid("not a mapping".into()))?;
    if let Some(field) = map
        .keys()
        .find(|f| !KUSTOMIZATION_FIELDS.contains(&f.as_str()))
    {
        return Err(Error::Unsupported {
            path: path.clone(),
            field: field.clone(),
        });
    }
    let kind = map
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("Kustomization");
    let (found, api_version) = match kind {
        "Kustomization" => (Kind::Kustomization, "kustomize.config.k8s.io/v1beta1"),
        "Component" => (Kind::Component, "kustomize.config.k8s.io/v1alpha1"),
        other => {
            return Err(invalid(format!(
                "kind {other:?} is neither Kustomization nor Component"
            )));
        }
    };
    if found != want {
        return Err(invalid(format!(
            "kind {kind:?} listed where a {want:?} belongs (a Component goes under \
             `components:`, a base under `resources:`)"
        )));
    }
    if let Some(v) = map.get("apiVersion").and_then(Value::as_str)
        && v != api_version
    {
        return Err(invalid(format!(
            "apiVersion {v:?} for kind {kind}; expected {api_version:?}"
        )));
    }
    let list = |field: &str| {
        map.get(field)
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
    };
    for res in list("resources") {
        let rel = res
            .as_str()
            .ok_or_else(|| invalid(format!("resource {res} is not a path")))?;
        let p = dir.join(rel);
        if p.is_dir() {
            // A base renders on its own; its objects join the rest.
            let mut base = Vec::new();
            render_into(&p, Kind::Kustomization, &mut base)?;
            out.extend(base);
        } else {
            out.extend(read_objects(&p)?);
        }
    }
    for c in list("components") {
        let rel = c
            .as_str()
            .ok_or_else(|| invalid(format!("component {c} is not a path")))?;
        render_into(&dir.join(rel), Kind::Component, out)?;
    }
    for (index, entry) in list("patches").iter().enumerate() {
        let entry = entry
            .as_object()
            .ok_or_else(|| invalid(format!("patch {index} is not a mapping")))?;
        if let Some(field) = entry.keys().find(|f| *f != "target" && *f != "patch") {
            return Err(Error::Unsupported {
                path: path.clone(),
                field: format!("patches[{index}].{field}"),
            });
        }
        let target = entry
            .get("target")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(format!("patch {index} has no target")))?;
        if let Some(field) = target.keys().find(|f| *f != "kind" && *f != "name") {
            return Err(Error::Unsupported {
                path: path.clone(),
                field: format!("patches[{index}].target.{field}"),
            });
        }
        let kind = target.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = target.get("name").and_then(Value::as_str).unwrap_or("");
        let patch_text = entry
            .get("patch")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("patch {index} has no inline patch")))?;
        let ops: json_patch::Patch =
            serde_norway::from_str(patch_text).map_err(|source| Error::Yaml {
                path: path.clone(),
                source,
            })?;
        let mut matched = 0;
        for m in out
            .iter_mut()
            .filter(|m| m.kind() == kind && (name.is_empty() || m.name() == name))
        {
            json_patch::patch(&mut m.object, &ops).map_err(|source| Error::Patch {
                path: path.clone(),
                index,
                kind: kind.to_owned(),
                name: name.to_owned(),
                source,
            })?;
            matched += 1;
        }
        if matched == 0 {
            return Err(Error::NoTarget {
                path: path.clone(),
                index,
                kind: kind.to_owned(),
                name: name.to_owned(),
            });
        }
    }
    Ok(())
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

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).expect("write");
    }

    /// Bases, resources and JSON 6902 patches render as `kubectl kustomize` renders them.
    #[test]
    fn renders_bases_resources_and_patches() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().join("base");
        let overlay = root.path().join("overlay");
        fs::create_dir_all(&base).expect("mkdir");
        fs::create_dir_all(&overlay).expect("mkdir");
        write(
            &base,
            "kustomization.yaml",
            "resources:\n  - cm.yaml\n  - ds.yaml\n",
        );
        write(
            &base,
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: \"1\"}\n---\n",
        );
        write(
            &base,
            "ds.yaml",
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: d}\nspec: {template: {spec: {volumes: [{name: x}]}}}\n",
        );
        write(
            &overlay,
            "kustomization.yaml",
            "resources:\n  - ../base\n  - extra.yaml\npatches:\n  - target: {kind: ConfigMap, name: c}\n    patch: |-\n      - op: replace\n        path: /data/a\n        value: \"2\"\n  - target: {kind: DaemonSet, name: d}\n    patch: |-\n      - op: add\n        path: /spec/template/spec/volumes/-\n        value: {name: y}\n",
        );
        write(
            &overlay,
            "extra.yaml",
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: s}\n",
        );
        let objects = render(&overlay).expect("renders");
        let kinds: Vec<&str> = objects.iter().map(Manifest::kind).collect();
        assert_eq!(kinds, ["ConfigMap", "DaemonSet", "ServiceAccount"]);
        assert_eq!(objects[0].object["data"]["a"], "2");
        assert_eq!(
            objects[1].object["spec"]["template"]["spec"]["volumes"],
            serde_json::json!([{"name": "x"}, {"name": "y"}])
        );

        // A component adds its resources and patches what the kustomization rendered so far.
        let component = root.path().join("component");
        fs::create_dir_all(&component).expect("mkdir");
        write(
            &component,
            "kustomization.yaml",
            "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n  - role.yaml\npatches:\n  - target: {kind: ConfigMap, name: c}\n    patch: |-\n      - op: add\n        path: /data/b\n        value: \"3\"\n",
        );
        write(
            &component,
            "role.yaml",
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n",
        );
        let with = root.path().join("with");
        fs::create_dir_all(&with).expect("mkdir");
        write(
            &with,
            "kustomization.yaml",
            "resources:\n  - ../overlay\ncomponents:\n  - ../component\n",
        );
        let objects = render(&with).expect("renders with a component");
        let kinds: Vec<&str> = objects.iter().map(Manifest::kind).collect();
        assert_eq!(
            kinds,
            ["ConfigMap", "DaemonSet", "ServiceAccount", "ClusterRole"]
        );
        assert_eq!(
            objects[0].object["data"],
            serde_json::json!({"a": "2", "b": "3"})
        );
        // A component is not a base, nor a base a component.
        write(
            &with,
            "kustomization.yaml",
            "resources:\n  - ../component\n",
        );
        let err = render(&with).expect_err("component as a base").to_string();
        assert!(err.contains("\"Component\""), "{err}");
        write(&with, "kustomization.yaml", "components:\n  - ../base\n");
        let err = render(&with).expect_err("base as a component").to_string();
        assert!(err.contains("\"Kustomization\""), "{err}");

        // What it does not understand, or a patch that hits nothing, is an error.
        write(
            &overlay,
            "kustomization.yaml",
            "resources:\n  - ../base\nnamePrefix: x-\n",
        );
        let err = render(&overlay).expect_err("unsupported").to_string();
        assert!(err.contains("\"namePrefix\""), "{err}");
        write(
            &overlay,
            "kustomization.yaml",
            "resources:\n  - ../base\npatches:\n  - target: {kind: ConfigMap, name: other}\n    patch: |-\n      - op: remove\n        path: /data\n",
        );
        let err = render(&overlay).expect_err("no target").to_string();
        assert!(err.contains("ConfigMap/other"), "{err}");
        write(
            &overlay,
            "kustomization.yaml",
            "resources:\n  - ../base\npatches:\n  - path: p.yaml\n",
        );
        let err = render(&overlay).expect_err("patch file").to_string();
        assert!(err.contains("patches[0].path"), "{err}");
    }
}
