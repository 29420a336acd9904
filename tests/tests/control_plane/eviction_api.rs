//! The agent's actuator against a real kube-apiserver: how the eviction API refuses, in the
//! server's own words, and what the agent makes of each answer. No kubelet runs: pods are bound to
//! a node no kubelet serves, and their status is written by the test (Running and Ready, so that
//! disruption budgets apply to them).
//!
//! Needs the binaries from `scripts/setup.sh --with-control-plane` (KUBEBUILDER_ASSETS); without
//! them every test fails naming what is missing.
use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        core::v1::{Node, Pod},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use node_monitor::{
    agent::backoff::react,
    cluster::actuator::{
        Actuator, ActuatorConfig, EvictOutcome, EvictionRequest, FailureKind, NodeConditionUpdate,
    },
};

use node_monitor_core::config::PdbPolicy;
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    wait::must,
};
use serde_json::json;

const NODE: &str = "ghost";

async fn start() -> ControlPlane {
    must(
        ControlPlane::start(ControlPlaneOptions::default()).await,
        "start the control plane",
    )
}

fn actuator(client: Client, pdb_policy: PdbPolicy) -> Actuator {
    Actuator::new(
        client,
        ActuatorConfig {
            node_name: NODE.into(),
            pdb_policy,
            dry_run: false,
        },
    )
}

fn hard(pod: &Pod) -> EvictionRequest {
    EvictionRequest {
        namespace: "default".into(),
        name: pod.metadata.name.clone().expect("name"),
        uid: pod.metadata.uid.clone().expect("uid"),
        grace_period_seconds: 1,
        hard: true,
        signal: "memory.available".into(),
        message: "test".into(),
        annotations: Default::default(),
    }
}

/// A pod bound to the ghost node, Running and Ready (written by the test, as a kubelet would).
async fn running_pod(pods: &Api<Pod>, name: &str, app: &str) -> Pod {
    let pod = PodBuilder::new(name)
        .label("app", app)
        .node(NODE)
        .container_name("c")
        .image("none")
        .build();
    must(
        pods.create(&PostParams::default(), &pod).await,
        &format!("create pod {name}"),
    );
    must(
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
            }})),
        )
        .await,
        &format!("mark {name} running"),
    )
}

async fn pdb(client: &Client, name: &str, app: &str) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };
    must(
        pdbs.create(&PostParams::default(), &pdb).await,
        &format!("create PDB {name}"),
    );
}

async fn terminating(pods: &Api<Pod>, name: &str) -> bool {
    must(pods.get(name).await, &format!("get {name}"))
        .metadata
        .deletion_timestamp
        .is_some()
}

/// A pod selected by two PodDisruptionBudgets: the eviction API answers 500 for ever. The agent
/// classifies it, puts that pod into backoff and moves on to the next candidate, which is evicted.
#[tokio::test]
async fn a_pod_with_two_budgets_backs_off_and_the_next_candidate_is_evicted() {
    let cp = start().await;
    let client = cp.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let stuck = running_pod(&pods, "stuck", "twice").await;
    let next = running_pod(&pods, "next", "free").await;
    pdb(&client, "first", "twice").await;
    pdb(&client, "second", "twice").await;
    let actuator = actuator(client.clone(), PdbPolicy::Respect);
    let outcome = actuator.evict(&hard(&stuck)).await;
    match &outcome {
        EvictOutcome::Failed {
            code: Some(500),
            kind: FailureKind::MultiplePdbs,
            reason,
        } => assert!(
            reason.contains("more than one PodDisruptionBudget"),
            "{reason}"
        ),
        other => panic!("the server's two-budget refusal, classified: got {other:?}"),
    }
    let reaction = react(&outcome);
    assert!(
        reaction.back_off_pod && reaction.next_candidate_now,
        "{reaction:?}"
    );
    assert_eq!(reaction.failure, Some("multiple_pdbs"));
    assert_eq!(
        actuator.evict(&hard(&next)).await,
        EvictOutcome::Evicted,
        "the next candidate is not held up"
    );
    assert!(!terminating(&pods, "stuck").await);
    assert!(terminating(&pods, "next").await);
    must(cp.stop(), "stop the control plane");
}

/// A budget's refusal in the server's words (429 with a DisruptionBudget cause): blocked under
/// `respect`, escalated to a delete under `escalate` for a hard threshold.
#[tokio::test]
async fn a_budget_refusal_is_recognised_by_its_cause() {
    let cp = start().await;
    let client = cp.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let guarded = running_pod(&pods, "guarded", "guarded").await;
    pdb(&client, "guarded", "guarded").await;
    assert_eq!(
        actuator(client.clone(), PdbPolicy::Respect)
            .evict(&hard(&guarded))
            .await,
        EvictOutcome::PdbBlocked
    );
    assert!(!terminating(&pods, "guarded").await);
    assert_eq!(
        actuator(client.clone(), PdbPolicy::Escalate)
            .evict(&hard(&guarded))
            .await,
        EvictOutcome::Escalated
    );
    assert!(terminating(&pods, "guarded").await);
    must(cp.stop(), "stop the control plane");
}

/// Re-publishing a condition with the same status keeps its lastTransitionTime (the heartbeat
/// moves); a status change moves both.
#[tokio::test]
async fn condition_transition_time_moves_only_with_the_status() {
    let cp = start().await;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": NODE } })).expect("node");
    must(
        nodes.create(&PostParams::default(), &node).await,
        "create the node",
    );
    let actuator = actuator(client.clone(), PdbPolicy::Respect);
    let update = |status: bool| NodeConditionUpdate {
        type_: "NodeMonitorMemoryPressure".into(),
        status,
        reason: "r".into(),
        message: "m".into(),
    };
    let times = async || {
        let n = must(nodes.get(NODE).await, "get the node");
        let c = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "NodeMonitorMemoryPressure")
            .expect("the condition");
        (
            c.status,
            c.last_transition_time.expect("transition").0,
            c.last_heartbeat_time.expect("heartbeat").0,
        )
    };
    // API timestamps have whole seconds: publishes more than a second apart differ.
    let apart = Duration::from_millis(1100);
    must(actuator.set_conditions(&[update(false)]).await, "publish");
    let (_, transition0, heartbeat0) = times().await;
    tokio::time::sleep(apart).await;
    must(
        actuator.set_conditions(&[update(false)]).await,
        "re-publish",
    );
    let (status, transition1, heartbeat1) = times().await;
    assert_eq!(status, "False");
    assert_eq!(transition1, transition0, "same status: transition kept");
    assert!(heartbeat1 > heartbeat0, "the heartbeat moves");
    tokio::time::sleep(apart).await;
    must(actuator.set_conditions(&[update(true)]).await, "flip");
    let (status, transition2, _) = times().await;
    assert_eq!(status, "True");
    assert!(transition2 > transition1, "a status change is a transition");
    must(cp.stop(), "stop the control plane");
}

/// API Priority and Fairness throttling, from the real server: a priority level with no seats of
/// its own and nothing to borrow, whose limit response is `Reject`, and a flow schema that sends
/// one ServiceAccount's requests to it. The server answers that account's eviction with APF's own
/// 429 (no DisruptionBudget cause). Under `escalate` and a hard threshold the agent takes it for
/// throttling: it waits for the Retry-After and never deletes the pod.
#[tokio::test]
async fn api_priority_and_fairness_throttling_is_never_escalated() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let cp = start().await;
    let client = cp.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let guarded = running_pod(&pods, "throttled", "throttled").await;
    let throttled = must(
        cp.service_account_client("default", "throttled-agent")
            .await,
        "a client for the throttled ServiceAccount",
    );
    let level: PriorityLevelConfiguration = must(
        serde_json::from_value(json!({
            "metadata": { "name": "no-seats" },
            "spec": { "type": "Limited", "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": { "type": "Reject" },
            }},
        })),
        "the priority level",
    );
    let schema: FlowSchema = must(
        serde_json::from_value(json!({
            "metadata": { "name": "throttled-agent" },
            "spec": {
                "priorityLevelConfiguration": { "name": "no-seats" },
                "matchingPrecedence": 100,
                "distinguisherMethod": { "type": "ByUser" },
                "rules": [{
                    "subjects": [{ "kind": "ServiceAccount",
                        "serviceAccount": { "namespace": "default", "name": "throttled-agent" } }],
                    "resourceRules": [{ "verbs": ["*"], "apiGroups": ["*"],
                        "resources": ["*"], "namespaces": ["*"] }],
                }],
            },
        })),
        "the flow schema",
    );
    must(
        Api::<PriorityLevelConfiguration>::all(client.clone())
            .create(&PostParams::default(), &level)
            .await,
        "create the priority level",
    );
    must(
        Api::<FlowSchema>::all(client.clone())
            .create(&PostParams::default(), &schema)
            .await,
        "create the flow schema",
    );
    // A level without seats still admits a request while nothing of it executes; the account's
    // own reads, kept in flight by a few loops, make the eviction wait for a seat that never
    // comes. The schema takes effect within seconds, so the eviction is tried until the server
    // throttles it; until then each try is refused by RBAC (the account may not evict).
    let flood: Vec<_> = (0..6)
        .map(|_| {
            let api: Api<Pod> = Api::namespaced(throttled.clone(), "default");
            tokio::spawn(async move {
                loop {
                    let _ = api.list(&Default::default()).await;
                }
            })
        })
        .collect();
    let actuator = actuator(throttled, PdbPolicy::Escalate);
    let mut outcome = None;
    let mut others = Vec::new();
    for _ in 0..1200 {
        match actuator.evict(&hard(&guarded)).await {
            o @ EvictOutcome::Throttled { .. } => {
                outcome = Some(o);
                break;
            }
            o => others.push(o),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    flood.iter().for_each(tokio::task::JoinHandle::abort);
    let Some(outcome) = outcome else {
        panic!("the server never throttled the eviction; its answers: {others:?}")
    };
    assert!(
        others.iter().all(|o| matches!(
            o,
            EvictOutcome::Failed {
                code: Some(403),
                ..
            }
        )),
        "before the schema applies, RBAC refuses: {others:?}"
    );
    let EvictOutcome::Throttled { retry_after } = outcome else {
        unreachable!()
    };
    assert!(
        (Duration::from_secs(1)..=Duration::from_secs(30)).contains(&retry_after),
        "Retry-After clamped to 1–30 s: {retry_after:?}"
    );
    eprintln!(
        "APF throttled the eviction after {} refused tries; Retry-After {retry_after:?}",
        others.len()
    );
    let reaction = react(&outcome);
    assert!(
        !reaction.back_off_pod && reaction.hold_evictions.is_some(),
        "the pod keeps its rank, every eviction waits: {reaction:?}"
    );
    assert_eq!(reaction.failure, Some("throttled"));
    assert!(
        !terminating(&pods, "throttled").await,
        "throttling never becomes a delete"
    );
    must(cp.stop(), "stop the control plane");
}
