//! Who can write the agents' liveness Leases (`node-monitor-agent-<node>`), with the base's Role
//! and admission policy (deploy/kustomize/base/role-liveness.yaml,
//! validatingadmissionpolicy-liveness.yaml): the agent's pod-bound token, for its own node only;
//! no tenant.
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor::cluster::liveness_lease::{
    LivenessLease, Renewal, RenewalLabels, RenewalMetrics,
};
use node_monitor_tests::control_plane::client_from_kubeconfig;
use serde_json::json;

use super::{Base, allowed, forbidden, wait_for_denial};

const NS: &str = "node-monitor";
/// The base's denial of another node's liveness Lease.
const OWN_LEASE_ONLY: &str =
    "node-monitor may only write the liveness Lease of the node it runs on";

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            ..LeaseSpec::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_agent_writes_its_own_nodes_liveness_lease() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    let leases: Api<Lease> = Api::namespaced(agent.clone(), NS);
    let pp = PostParams::default();
    // Another node's Lease, or its own held by another name: refused by the policy.
    let other_node = lease("node-monitor-agent-node-b", "node-b");
    wait_for_denial("creating node-b's liveness Lease", OWN_LEASE_ONLY, || {
        leases.create(&pp, &other_node)
    })
    .await;
    let other_holder = lease("node-monitor-agent-node-a", "node-b");
    wait_for_denial(
        "creating its own Lease held by node-b",
        OWN_LEASE_ONLY,
        || leases.create(&pp, &other_holder),
    )
    .await;
    // The agent's own renewer: creates its Lease, then renews it with one merge patch; each is
    // counted by its result and moves the last renewal's time.
    let metrics = RenewalMetrics::default();
    let own = LivenessLease::new(agent.clone(), NS, "node-a").with_metrics(metrics.clone());
    let count = |result: &str| {
        metrics
            .renewals
            .get_or_create(&RenewalLabels {
                result: result.to_owned(),
            })
            .get()
    };
    assert_eq!(
        allowed("create its own liveness Lease", own.renew().await),
        Renewal::Created
    );
    assert_eq!((count("created"), count("renewed")), (1, 0));
    let created_at = metrics.last_renewal.get();
    assert!(created_at > 0.0, "{created_at}");
    let first = Api::<Lease>::namespaced(admin.clone(), NS)
        .get("node-monitor-agent-node-a")
        .await
        .expect("the Lease exists");
    let spec = first.spec.clone().expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert!(spec.renew_time.is_some());
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(
        allowed("renew its own liveness Lease", own.renew().await),
        Renewal::Renewed
    );
    assert_eq!(
        (count("created"), count("renewed"), count("error")),
        (1, 1, 0)
    );
    assert!(metrics.last_renewal.get() >= created_at);
    // A renewal the API refuses (another node's Lease) counts as an error and moves no time.
    let renewed_at = metrics.last_renewal.get();
    let other = LivenessLease::new(agent.clone(), NS, "node-b").with_metrics(metrics.clone());
    assert!(other.renew().await.is_err(), "node-b's Lease is refused");
    assert_eq!(count("error"), 1);
    assert_eq!(metrics.last_renewal.get(), renewed_at);
    let renewed = Api::<Lease>::namespaced(admin.clone(), NS)
        .get("node-monitor-agent-node-a")
        .await
        .expect("the Lease exists");
    assert!(
        renewed.spec.and_then(|s| s.renew_time) > spec.renew_time,
        "the renewal moved renewTime forward"
    );
    // The agent may not hand its Lease to another name, nor read, list or delete Leases.
    let pa = PatchParams::default();
    let give_away = Patch::Merge(json!({"spec": {"holderIdentity": "node-b"}}));
    forbidden(
        "handing its Lease to node-b",
        leases
            .patch("node-monitor-agent-node-a", &pa, &give_away)
            .await,
    );
    forbidden(
        "reading its Lease",
        leases.get("node-monitor-agent-node-a").await,
    );
    forbidden(
        "deleting its Lease",
        leases
            .delete("node-monitor-agent-node-a", &Default::default())
            .await,
    );
    // Nor the kubelets' Leases (kube-node-lease).
    forbidden(
        "creating a kubelet's Lease",
        Api::<Lease>::namespaced(agent.clone(), "kube-node-lease")
            .create(&pp, &lease("node-b", "node-b"))
            .await,
    );
    // A tenant (an ordinary user) can neither forge liveness nor death.
    let tenant = client_from_kubeconfig(
        &base
            .cp
            .user_kubeconfig("tenant", None)
            .expect("a tenant's kubeconfig"),
    )
    .await
    .expect("a tenant's client");
    let as_tenant: Api<Lease> = Api::namespaced(tenant, NS);
    forbidden(
        "a tenant creating a liveness Lease",
        as_tenant
            .create(&pp, &lease("node-monitor-agent-node-b", "node-b"))
            .await,
    );
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}));
    forbidden(
        "a tenant renewing the agent's Lease",
        as_tenant
            .patch("node-monitor-agent-node-a", &pa, &renew)
            .await,
    );
    forbidden(
        "a tenant deleting the agent's Lease",
        as_tenant
            .delete("node-monitor-agent-node-a", &Default::default())
            .await,
    );
}
