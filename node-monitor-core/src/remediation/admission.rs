//! Whether the NodeFence status policy is in force for this controller: the admission policy
//! that lets only remediate's own ServiceAccount write a fencing operation
//! (`deploy/remediate/validatingadmissionpolicy.yaml`). Without it, anyone who may update
//! `nodefences/status` can forge an operation (a release, a recovery). remediate cannot install
//! it for itself; it looks, says so in a metric and a warning, and fences on.
//!
//! Pure: the adapter reads the policy, its binding and the controller's own user name.

/// The policy's and its binding's name.
pub const NODEFENCE_STATUS_POLICY: &str = "node-monitor-nodefence-status";

/// What the adapter read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyFacts {
    /// The policy's validation expressions; `None`: no such policy.
    pub policy: Option<Vec<String>>,
    /// The binding's `policyName` and `validationActions`; `None`: no such binding.
    pub binding: Option<(String, Vec<String>)>,
    /// This controller's user name (`system:serviceaccount:<namespace>:<name>`); `None`: not
    /// known.
    pub user: Option<String>,
}

/// Whether the policy protects this controller's fencing operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionState {
    /// The policy and its binding are installed, the binding denies, and the policy names this
    /// controller's user.
    Enforced,
    /// No policy of that name.
    PolicyMissing,
    /// The policy without a binding that applies it.
    BindingMissing,
    /// A binding that does not deny (`Warn`, `Audit` only), or binds another policy.
    NotDenying,
    /// The policy names another user than this controller's: installed for another namespace or
    /// account, it refuses remediate's own writes.
    OtherUser,
    /// The objects or the user name could not be read (`reason`).
    Unknown(String),
}

impl AdmissionState {
    /// Every label of `node_monitor_remediation_admission_policy`.
    pub const LABELS: [&'static str; 6] = [
        "enforced",
        "policy_missing",
        "binding_missing",
        "not_denying",
        "other_user",
        "unknown",
    ];

    /// The state's label.
    pub fn label(&self) -> &'static str {
        match self {
            AdmissionState::Enforced => "enforced",
            AdmissionState::PolicyMissing => "policy_missing",
            AdmissionState::BindingMissing => "binding_missing",
            AdmissionState::NotDenying => "not_denying",
            AdmissionState::OtherUser => "other_user",
            AdmissionState::Unknown(_) => "unknown",
        }
    }

    /// What an operator reads in the warning.
    pub fn describe(&self) -> String {
        match self {
            AdmissionState::Enforced => "in force".to_owned(),
            AdmissionState::PolicyMissing => format!(
                "the ValidatingAdmissionPolicy {NODEFENCE_STATUS_POLICY} is not installed: anyone \
                 who may update nodefences/status can forge a fencing operation"
            ),
            AdmissionState::BindingMissing => format!(
                "the ValidatingAdmissionPolicyBinding {NODEFENCE_STATUS_POLICY} is not installed: \
                 the policy applies to nothing"
            ),
            AdmissionState::NotDenying => format!(
                "the ValidatingAdmissionPolicyBinding {NODEFENCE_STATUS_POLICY} does not bind the \
                 policy with validationActions Deny"
            ),
            AdmissionState::OtherUser => format!(
                "the ValidatingAdmissionPolicy {NODEFENCE_STATUS_POLICY} names another user than \
                 this controller's: installed for another namespace or ServiceAccount, it refuses \
                 this controller's own writes"
            ),
            AdmissionState::Unknown(reason) => format!("could not be checked: {reason}"),
        }
    }
}

/// Judges what the adapter read.
pub fn judge(f: &PolicyFacts) -> AdmissionState {
    let Some(expressions) = &f.policy else {
        return AdmissionState::PolicyMissing;
    };
    let Some((policy_name, actions)) = &f.binding else {
        return AdmissionState::BindingMissing;
    };
    if policy_name != NODEFENCE_STATUS_POLICY || !actions.iter().any(|a| a == "Deny") {
        return AdmissionState::NotDenying;
    }
    let Some(user) = &f.user else {
        return AdmissionState::Unknown("this controller's user name is not known".to_owned());
    };
    let quoted = format!("'{user}'");
    if expressions.iter().any(|e| e.contains(&quoted)) {
        AdmissionState::Enforced
    } else {
        AdmissionState::OtherUser
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "system:serviceaccount:node-monitor:node-monitor-remediate";

    fn facts(
        policy: Option<&str>,
        binding: Option<(&str, &[&str])>,
        user: Option<&str>,
    ) -> PolicyFacts {
        PolicyFacts {
            policy: policy.map(|e| vec![e.to_owned()]),
            binding: binding
                .map(|(p, a)| (p.to_owned(), a.iter().map(|s| (*s).to_owned()).collect())),
            user: user.map(str::to_owned),
        }
    }

    #[test]
    fn the_policy_is_enforced_only_installed_bound_denying_and_naming_this_controller() {
        let shipped = format!("request.userInfo.username == '{ME}'");
        let other = "request.userInfo.username == 'system:serviceaccount:node-monitor:node-monitor-remediate'"
            .replace("node-monitor:", "elsewhere:");
        let deny: &[&str] = &["Deny"];
        let cases = [
            (
                facts(
                    Some(&shipped),
                    Some((NODEFENCE_STATUS_POLICY, deny)),
                    Some(ME),
                ),
                "enforced",
            ),
            (
                facts(
                    Some(&shipped),
                    Some((NODEFENCE_STATUS_POLICY, &["Deny", "Audit"])),
                    Some(ME),
                ),
                "enforced",
            ),
            (
                facts(None, Some((NODEFENCE_STATUS_POLICY, deny)), Some(ME)),
                "policy_missing",
            ),
            (facts(Some(&shipped), None, Some(ME)), "binding_missing"),
            (
                facts(
                    Some(&shipped),
                    Some((NODEFENCE_STATUS_POLICY, &["Warn", "Audit"])),
                    Some(ME),
                ),
                "not_denying",
            ),
            (
                facts(Some(&shipped), Some(("another-policy", deny)), Some(ME)),
                "not_denying",
            ),
            // Installed under another namespace: its user name is not this controller's.
            (
                facts(
                    Some(&other),
                    Some((NODEFENCE_STATUS_POLICY, deny)),
                    Some(ME),
                ),
                "other_user",
            ),
            // A prefix of the name is no match: the name is compared quoted.
            (
                facts(
                    Some(
                        "request.userInfo.username == 'system:serviceaccount:node-monitor:node-monitor-remediate-2'",
                    ),
                    Some((NODEFENCE_STATUS_POLICY, deny)),
                    Some(ME),
                ),
                "other_user",
            ),
            (
                facts(Some(&shipped), Some((NODEFENCE_STATUS_POLICY, deny)), None),
                "unknown",
            ),
        ];
        for (f, want) in cases {
            let state = judge(&f);
            assert_eq!(state.label(), want, "{f:?}");
            assert!(AdmissionState::LABELS.contains(&state.label()));
            let text = state.describe();
            assert!(
                state == AdmissionState::Enforced
                    || text.contains(NODEFENCE_STATUS_POLICY)
                    || want == "unknown",
                "{text}"
            );
        }
    }
}
