//! Looks whether the NodeFence status policy is in force for this controller (the core's
//! `remediation::admission`): at start, then every [`CHECK_INTERVAL`]. The state goes to
//! `node_monitor_remediation_admission_policy`, and a warning is logged whenever it changes to
//! anything but `enforced`. Fencing goes on either way: the policy protects the operations from
//! others, and its absence is the cluster administrator's to fix.
use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    authentication::v1::SelfSubjectReview,
};
use kube::{Api, Client, api::PostParams};
use node_monitor_core::remediation::admission::{
    AdmissionState, NODEFENCE_STATUS_POLICY, PolicyFacts, judge,
};
use tracing::{info, warn};

use crate::metrics::RemediateMetrics;

/// How often the policy is looked at again.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// Reads the policy, its binding and this controller's user name.
pub async fn read_facts(client: &Client) -> Result<PolicyFacts, kube::Error> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let policy = policies.get_opt(NODEFENCE_STATUS_POLICY).await?.map(|p| {
        p.spec
            .and_then(|s| s.validations)
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.expression)
            .collect()
    });
    let binding = bindings.get_opt(NODEFENCE_STATUS_POLICY).await?.map(|b| {
        let spec = b.spec;
        (spec.policy_name, spec.validation_actions)
    });
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    Ok(PolicyFacts {
        policy,
        binding,
        user,
    })
}

/// One look: the state, recorded in `metrics`.
pub async fn check(client: &Client, metrics: &RemediateMetrics) -> AdmissionState {
    let state = match read_facts(client).await {
        Ok(facts) => judge(&facts),
        Err(e) => AdmissionState::Unknown(e.to_string()),
    };
    metrics.set_admission_policy(state.label());
    state
}

/// Looks at start and every [`CHECK_INTERVAL`], until the task is aborted.
pub fn spawn(client: Client, metrics: Arc<RemediateMetrics>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Option<&'static str> = None;
        loop {
            let state = check(&client, &metrics).await;
            if last != Some(state.label()) {
                match &state {
                    AdmissionState::Enforced => {
                        info!(
                            policy = NODEFENCE_STATUS_POLICY,
                            "fencing operations protected by the admission policy"
                        );
                    }
                    other => {
                        warn!(
                            policy = NODEFENCE_STATUS_POLICY,
                            state = other.label(),
                            "fencing operations not protected: {}",
                            other.describe()
                        );
                    }
                }
                last = Some(state.label());
            }
            tokio::time::sleep(CHECK_INTERVAL).await;
        }
    })
}
