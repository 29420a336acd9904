//! Replicated workloads for the node-failure tests and the failover benchmark: Deployments and
//! StatefulSets whose pods run `nm-workload --sleep` on kubelet stand-ins, a CSI volume pre-bound
//! to a claim (no binder or provisioner runs), a stand-in for the CSI external-attacher, and a
//! machine that loses power.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), node_monitor_tests::workload::Error> {
//! use node_monitor_tests::workload;
//! let pv = workload::create_bound_volume(&client, "data").await?;
//! workload::create_statefulset(&client, "db", Some("data")).await?;
//! let pods = workload::app_pods(&client, "db").await?;
//! let running = workload::running_pod(&pods, None); // (name, uid, node)
//! # let _ = (pv, running);
//! # Ok(()) }
//! ```
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec},
        core::v1::{
            CSIPersistentVolumeSource, ConfigMap, Container, Node, ObjectReference,
            PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
            PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, PodTemplateSpec,
            Volume, VolumeResourceRequirements,
        },
        storage::v1::VolumeAttachment,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
    },
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{e2e::binary, standin::StandIn};

/// The namespace the workloads run in.
pub const APPS: &str = "default";
/// The fake CSI driver of the volume scenarios.
pub const CSI_DRIVER: &str = "csi.node-monitor.test";
/// The topology label the node lifecycle controller groups nodes by.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The kube-controller-manager controller that attaches and detaches volumes (not among the
/// harness's default controllers).
pub const ATTACH_DETACH_CONTROLLER: &str = "persistentvolume-attach-detach-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

/// `app=<app>`, the label every workload's pods carry.
pub fn app_selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
        ..LabelSelector::default()
    }
}

/// A pod of `app` that sleeps until stopped, with the claim `volume_claim` mounted as `data`.
pub fn sleeping_pod_template(app: &str, volume_claim: Option<&str>) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: app_selector(app).match_labels,
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(5),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("nm-workload".to_owned()),
                command: Some(vec![
                    binary("nm-workload").display().to_string(),
                    "--sleep".to_owned(),
                ]),
                ..Container::default()
            }],
            volumes: volume_claim.map(|claim| {
                vec![Volume {
                    name: "data".to_owned(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.to_owned(),
                        read_only: None,
                    }),
                    ..Volume::default()
                }]
            }),
            ..PodSpec::default()
        }),
    }
}

/// Creates the Deployment `app` with `replicas` sleeping pods.
pub async fn create_deployment(client: &Client, app: &str, replicas: i32) -> Result<()> {
    let d = Deployment {
        metadata: ObjectMeta {
            name: Some(app.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: app_selector(app),
            template: sleeping_pod_template(app, None),
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    Api::<Deployment>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &d)
        .await
        .map_err(api_error(format!("create the Deployment {app}")))?;
    Ok(())
}

/// Creates the StatefulSet `app` with one sleeping pod (`<app>-0`), mounting `claim` if given.
pub async fn create_statefulset(client: &Client, app: &str, claim: Option<&str>) -> Result<()> {
    let s = StatefulSet {
        metadata: ObjectMeta {
            name: Some(app.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(app.to_owned()),
            selector: app_selector(app),
            template: sleeping_pod_template(app, claim),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    Api::<StatefulSet>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &s)
        .await
        .map_err(api_error(format!("create the StatefulSet {app}")))?;
    Ok(())
}

/// Creates the ConfigMap `namespace/name` holding `text` under `key`.
pub async fn create_configmap(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
    text: &str,
) -> Result<()> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(key.to_owned(), text.to_owned())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .map_err(api_error(format!("create ConfigMap {namespace}/{name}")))?;
    Ok(())
}

/// The pods of `app`.
pub async fn app_pods(client: &Client, app: &str) -> Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(client.clone(), APPS)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map_err(api_error(format!("list the pods of {app}")))?
        .items)
}

/// (name, uid, node) of the first pod of `pods` that is Running, not terminating, and not the
/// pod `not_uid` (the one a replacement is awaited for).
pub fn running_pod(pods: &[Pod], not_uid: Option<&str>) -> Option<(String, String, String)> {
    pods.iter().find_map(|p| {
        let uid = p.metadata.uid.clone()?;
        let node = p.spec.as_ref()?.node_name.clone()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running")
            && p.metadata.deletion_timestamp.is_none();
        (running && not_uid != Some(uid.as_str()))
            .then(|| (p.metadata.name.clone().unwrap_or_default(), uid, node))
    })
}

/// A machine that lost power: its stand-in stops (no heartbeats, nothing finalized) and the
/// processes of the pod `pod_uid` are killed. Returns how many processes were killed.
pub fn power_off(standin: &StandIn, pod_uid: &str) -> usize {
    standin.pause();
    let pids = standin.pod_pids(pod_uid);
    for pid in &pids {
        // A process that already exited is what a dead machine leaves too.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    pids.len()
}

/// Lets the attach-detach controller manage the volumes of `nodes` (the annotation the kubelet
/// sets with `--enable-controller-attach-detach`).
pub async fn manage_attach_detach<'a>(
    client: &Client,
    nodes: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {
        "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}});
    for n in nodes {
        api.patch(n, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error(format!(
                "let the attach-detach controller manage {n}"
            )))?;
    }
    Ok(())
}

/// A PersistentVolume of [`CSI_DRIVER`] (handle `vol-1`), pre-bound to the claim `claim` in
/// [`APPS`]; both marked Bound (no binder controller runs). Returns the PV's name.
pub async fn create_bound_volume(client: &Client, claim: &str) -> Result<String> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), APPS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = format!("{claim}-pv");
    let storage = BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))]);
    let pvc = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(String::new()),
            volume_name: Some(pv_name.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(storage.clone()),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    let pvc = pvcs
        .create(&PostParams::default(), &pvc)
        .await
        .map_err(api_error(format!("create the claim {claim}")))?;
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(storage),
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            storage_class_name: Some(String::new()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(APPS.to_owned()),
                name: Some(claim.to_owned()),
                uid: pvc.metadata.uid.clone(),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: CSI_DRIVER.to_owned(),
                volume_handle: "vol-1".to_owned(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    };
    pvs.create(&PostParams::default(), &pv)
        .await
        .map_err(api_error(format!("create the volume {pv_name}")))?;
    pvs.patch_status(
        &pv_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await
    .map_err(api_error(format!("mark the volume {pv_name} Bound")))?;
    pvcs.patch_status(
        claim,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Bound",
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"}
        }})),
    )
    .await
    .map_err(api_error(format!("mark the claim {claim} Bound")))?;
    Ok(pv_name)
}

/// The unique name of [`create_bound_volume`]'s volume in a node's `status.volumesInUse`, as the
/// kubelet reports a mounted CSI volume.
pub fn volume_in_use_name() -> String {
    format!("kubernetes.io/csi/{CSI_DRIVER}^vol-1")
}

/// Marks every VolumeAttachment of [`CSI_DRIVER`] attached, as the CSI external-attacher does
/// after ControllerPublishVolume. Runs until aborted.
pub async fn fake_external_attacher(client: Client) {
    let vas: Api<VolumeAttachment> = Api::all(client);
    loop {
        if let Ok(list) = vas.list(&ListParams::default()).await {
            for va in list.items {
                let pending = va.spec.attacher == CSI_DRIVER
                    && va.metadata.deletion_timestamp.is_none()
                    && !va.status.as_ref().is_some_and(|s| s.attached);
                if let (true, Some(name)) = (pending, va.metadata.name.as_deref()) {
                    // A failed write is retried on the next round, as the attacher would.
                    let _ = vas
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"attached": true}})),
                        )
                        .await;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The attached VolumeAttachment of the volume `pv` on `node`, if any.
pub async fn attachment(client: &Client, pv: &str, node: &str) -> Result<Option<VolumeAttachment>> {
    Ok(Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_error("list VolumeAttachments"))?
        .items
        .into_iter()
        .find(|va| {
            va.spec.node_name == node
                && va.spec.source.persistent_volume_name.as_deref() == Some(pv)
                && va.status.as_ref().is_some_and(|s| s.attached)
        }))
}
