//! The out-of-service taint a release applies (KEP-2268) and the toleration matching that
//! decides which pods a release spares.
/// The taint of KEP-2268 (non-graceful node shutdown): pods without a matching toleration are
/// deleted, the pod GC force-deletes terminating pods of a NotReady node carrying it, and the
/// attach-detach controller detaches volumes still marked in use on it at once instead of after
/// 6 minutes.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// The value the KEP and the Kubernetes documentation use.
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// The taint's effect.
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";
/// A pod's toleration, as the API has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TolerationRef<'a> {
    /// The taint key it tolerates; empty or `None` with `Exists`: every key.
    pub key: Option<&'a str>,
    /// `Equal` (also when empty) or `Exists`.
    pub operator: Option<&'a str>,
    /// The taint value it tolerates (with `Equal`).
    pub value: Option<&'a str>,
    /// The taint effect it tolerates; empty or `None`: every effect.
    pub effect: Option<&'a str>,
}

/// `Toleration.ToleratesTaint` (k8s.io/api/core/v1/toleration.go) for a taint of `key`, `value`,
/// `effect`: an empty effect matches every effect, an empty key (with `Exists`) every key;
/// `Exists` matches any value, `Equal` (or no operator) only the same value; any other operator
/// matches nothing.
pub fn tolerates(t: &TolerationRef<'_>, key: &str, value: &str, effect: &str) -> bool {
    if t.effect.is_some_and(|e| !e.is_empty() && e != effect) {
        return false;
    }
    if t.key.is_some_and(|k| !k.is_empty() && k != key) {
        return false;
    }
    match t.operator.unwrap_or("") {
        "" | "Equal" => t.value.unwrap_or("") == value,
        "Exists" => true,
        _ => false,
    }
}

/// Whether a pod with these tolerations tolerates the out-of-service taint. Such a pod is meant to
/// stay on (or be evicted from, after its `tolerationSeconds`) an out-of-service node by the
/// taint's own rules, so a release never force-deletes it.
pub fn tolerates_out_of_service<'a>(
    tolerations: impl IntoIterator<Item = TolerationRef<'a>>,
) -> bool {
    tolerations.into_iter().any(|t| {
        tolerates(
            &t,
            OUT_OF_SERVICE_TAINT,
            OUT_OF_SERVICE_VALUE,
            OUT_OF_SERVICE_EFFECT,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toleration_matching_follows_tolerates_taint() {
        let t = |key, operator, value, effect| TolerationRef {
            key,
            operator,
            value,
            effect,
        };
        let oos = Some(OUT_OF_SERVICE_TAINT);
        let cases = [
            // key, operator, value, effect
            (t(oos, Some("Exists"), None, None), true),
            (t(oos, Some("Exists"), None, Some("NoExecute")), true),
            (t(oos, Some("Exists"), None, Some("NoSchedule")), false),
            (t(oos, Some("Exists"), Some("ignored"), Some("")), true),
            (
                t(oos, Some("Equal"), Some("nodeshutdown"), Some("NoExecute")),
                true,
            ),
            (t(oos, None, Some("nodeshutdown"), None), true),
            (t(oos, Some(""), Some("nodeshutdown"), None), true),
            (t(oos, Some("Equal"), Some("other"), None), false),
            (t(oos, Some("Equal"), None, None), false),
            // Tolerates everything.
            (t(None, Some("Exists"), None, None), true),
            (t(Some(""), Some("Exists"), None, Some("NoExecute")), true),
            (t(None, Some("Exists"), None, Some("NoSchedule")), false),
            // Another key.
            (
                t(
                    Some("node.kubernetes.io/unreachable"),
                    Some("Exists"),
                    None,
                    None,
                ),
                false,
            ),
            // Numeric comparison operators only apply to numeric values.
            (t(oos, Some("Gt"), Some("1"), None), false),
            // A malformed empty key with Equal compares values ("" ≠ "nodeshutdown").
            (t(None, Some("Equal"), None, None), false),
        ];
        for (tol, want) in cases {
            assert_eq!(
                tolerates(
                    &tol,
                    OUT_OF_SERVICE_TAINT,
                    OUT_OF_SERVICE_VALUE,
                    "NoExecute"
                ),
                want,
                "{tol:?}"
            );
            assert_eq!(tolerates_out_of_service([tol]), want, "{tol:?}");
        }
        assert!(!tolerates_out_of_service([]));
    }
}
