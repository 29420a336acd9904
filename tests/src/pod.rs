//! The pods the tiers create, from one builder: a pod with a single container, and only the fields
//! a test sets (everything else is left to the API server's defaults).
use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};

/// The CPU request and limit that make a pod Guaranteed when its memory request equals its limit
/// (a Guaranteed pod needs both resources with request = limit).
pub const GUARANTEED_CPU: &str = "100m";

/// A pod with one container named `main`; each method sets one field.
#[derive(Debug, Clone)]
pub struct PodBuilder {
    pod: Pod,
}

impl PodBuilder {
    /// A pod named `name`: no namespace, node, image or command yet.
    pub fn new(name: &str) -> Self {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        Self { pod }
    }

    /// A pod in `default`, labelled `app=<name>`, on the stand-in's `node`, whose container runs
    /// the host's `nm-workload` with `workload_args`, with 5 s to terminate.
    pub fn workload(name: &str, node: &str, workload_args: &[&str]) -> Self {
        let workload = crate::e2e::binary("nm-workload").display().to_string();
        Self::new(name)
            .namespace("default")
            .label("app", name)
            .node(node)
            .termination_grace(5)
            .image("nm-workload")
            .command(std::iter::once(workload.as_str()).chain(workload_args.iter().copied()))
    }

    /// A [`PodBuilder::workload`] whose memory climbs to `to` by `step` every `interval`
    /// (`nm-workload --ramp-to`).
    pub fn ramping(name: &str, node: &str, to: &str, step: &str, interval: &str) -> Self {
        Self::workload(
            name,
            node,
            &["--ramp-to", to, "--step", step, "--interval", interval],
        )
    }

    fn spec(&mut self) -> &mut PodSpec {
        self.pod.spec.get_or_insert_default()
    }

    fn container(&mut self) -> &mut Container {
        let spec = self.spec();
        if spec.containers.is_empty() {
            spec.containers.push(Container {
                name: "main".into(),
                ..Default::default()
            });
        }
        &mut spec.containers[0]
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.pod.metadata.namespace = Some(ns.into());
        self
    }

    /// Binds the pod to `node` (no scheduler involved).
    pub fn node(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }

    pub fn container_name(mut self, name: &str) -> Self {
        self.container().name = name.into();
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.container().image = Some(image.into());
        self
    }

    /// The container's command, verbatim.
    pub fn command<S: AsRef<str>>(mut self, command: impl IntoIterator<Item = S>) -> Self {
        self.container().command =
            Some(command.into_iter().map(|s| s.as_ref().to_owned()).collect());
        self
    }

    /// `Always`, `OnFailure` or `Never`.
    pub fn restart_policy(mut self, policy: &str) -> Self {
        self.spec().restart_policy = Some(policy.into());
        self
    }

    pub fn service_account(mut self, name: &str) -> Self {
        self.spec().service_account_name = Some(name.into());
        self
    }

    /// Memory request, and limit when given. A limit equal to the request comes with a CPU request
    /// and limit of [`GUARANTEED_CPU`], so the pod is Guaranteed; otherwise it is Burstable.
    pub fn memory(self, request: &str, limit: Option<&str>) -> Self {
        let mut requests = BTreeMap::from([("memory".to_owned(), Quantity(request.into()))]);
        let mut limits = BTreeMap::new();
        if let Some(l) = limit {
            limits.insert("memory".to_owned(), Quantity(l.into()));
            if l == request {
                requests.insert("cpu".to_owned(), Quantity(GUARANTEED_CPU.into()));
                limits.insert("cpu".to_owned(), Quantity(GUARANTEED_CPU.into()));
            }
        }
        self.resources(ResourceRequirements {
            requests: Some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..Default::default()
        })
    }

    /// The container's resources, verbatim.
    pub fn resources(mut self, resources: ResourceRequirements) -> Self {
        self.container().resources = Some(resources);
        self
    }

    pub fn priority_class(mut self, name: &str) -> Self {
        self.spec().priority_class_name = Some(name.into());
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.pod
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }

    /// Sets the labels (present, if empty, with no pairs).
    pub fn labels(mut self, labels: &[(&str, &str)]) -> Self {
        let map = self.pod.metadata.labels.get_or_insert_default();
        map.extend(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        self
    }

    pub fn termination_grace(mut self, secs: i64) -> Self {
        self.spec().termination_grace_period_seconds = Some(secs);
        self
    }

    pub fn build(self) -> Pod {
        self.pod
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(v: &str) -> Quantity {
        Quantity(v.to_owned())
    }

    fn resources(p: &Pod) -> ResourceRequirements {
        p.spec.as_ref().expect("spec").containers[0]
            .resources
            .clone()
            .expect("resources")
    }

    #[test]
    fn a_limit_equal_to_the_request_makes_the_pod_guaranteed() {
        let guaranteed = resources(&PodBuilder::new("g").memory("64Mi", Some("64Mi")).build());
        let both = BTreeMap::from([
            ("cpu".to_owned(), q("100m")),
            ("memory".to_owned(), q("64Mi")),
        ]);
        assert_eq!(guaranteed.requests, Some(both.clone()));
        assert_eq!(guaranteed.limits, Some(both));

        let burstable = resources(&PodBuilder::new("b").memory("16Mi", Some("64Mi")).build());
        assert_eq!(
            burstable.requests,
            Some(BTreeMap::from([("memory".to_owned(), q("16Mi"))]))
        );
        assert_eq!(
            burstable.limits,
            Some(BTreeMap::from([("memory".to_owned(), q("64Mi"))]))
        );

        let request_only = resources(&PodBuilder::new("r").memory("16Mi", None).build());
        assert_eq!(
            request_only.requests,
            Some(BTreeMap::from([("memory".to_owned(), q("16Mi"))]))
        );
        assert_eq!(request_only.limits, None);
    }

    /// The guest tier's Guaranteed workload pod, field by field.
    #[test]
    fn a_guest_workload_pod_is_exactly_what_the_guest_tier_creates() {
        let command = ["/mnt/host/nm-workload", "--hold", "150Mi"];
        let built = PodBuilder::new("steady")
            .namespace("default")
            .node("vm-node")
            .termination_grace(5)
            .image("nm-workload")
            .command(command)
            .memory("200Mi", Some("200Mi"))
            .build();
        let both = BTreeMap::from([
            ("memory".to_owned(), q("200Mi")),
            ("cpu".to_owned(), q("100m")),
        ]);
        let want = Pod {
            metadata: ObjectMeta {
                name: Some("steady".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("vm-node".into()),
                termination_grace_period_seconds: Some(5),
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("nm-workload".into()),
                    command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
                    resources: Some(ResourceRequirements {
                        requests: Some(both.clone()),
                        limits: Some(both),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(built, want);
    }
}
