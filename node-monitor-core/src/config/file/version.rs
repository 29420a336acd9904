//! Which form a configuration document is written in: its `apiVersion` and `kind`.
//!
//! node-monitor's own form is `apiVersion: node-monitor.io/v1alpha1`, `kind:
//! NodeMonitorConfiguration`. A document without either is today's form, read as that version
//! (so every configuration written before the field still reads). A kubelet's own file
//! (`kubelet.config.k8s.io/v1beta1`, `KubeletConfiguration`) is read as it is, its node-monitor
//! fields taken and the rest skipped. Anything else is refused, naming the field and the value:
//! a renamed key of a later version has a version to be migrated from.
use serde_norway::{Mapping, Value};

use super::{ReadError, de::describe};

/// node-monitor's configuration `apiVersion`.
pub const API_VERSION: &str = "node-monitor.io/v1alpha1";
/// node-monitor's configuration `kind`.
pub const KIND: &str = "NodeMonitorConfiguration";
/// A kubelet's own configuration file.
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// A kubelet's own configuration file's `kind`.
pub const KUBELET_KIND: &str = "KubeletConfiguration";

/// The form of one document.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DocumentVersion {
    /// No `apiVersion` nor `kind`: today's form, read as [`API_VERSION`].
    #[default]
    Implicit,
    /// [`API_VERSION`], [`KIND`].
    V1Alpha1,
    /// A kubelet's own file.
    Kubelet,
}

impl DocumentVersion {
    /// Whether the document says its version itself.
    pub fn is_explicit(self) -> bool {
        self != DocumentVersion::Implicit
    }
}

/// The document's form, from its top-level `apiVersion` and `kind`.
pub fn document_version(map: &Mapping) -> Result<DocumentVersion, ReadError> {
    let field = |name: &str| -> Result<Option<String>, ReadError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ReadError::Value {
                field: name.to_owned(),
                message: format!("expected a string, found {}", describe(other)),
            }),
        }
    };
    let (api_version, kind) = (field("apiVersion")?, field("kind")?);
    let wrong_kind = |found: &str, want: &str, of: &str| ReadError::Value {
        field: "kind".to_owned(),
        message: format!("{found:?}: a document of {of} is of kind {want}"),
    };
    match (api_version.as_deref(), kind.as_deref()) {
        (None, None) => Ok(DocumentVersion::Implicit),
        (Some(API_VERSION) | None, Some(KIND)) => Ok(DocumentVersion::V1Alpha1),
        (Some(API_VERSION), None) => Err(ReadError::Value {
            field: "kind".to_owned(),
            message: format!("missing: a document of {API_VERSION} is of kind {KIND}"),
        }),
        (Some(API_VERSION), Some(k)) => Err(wrong_kind(k, KIND, API_VERSION)),
        (Some(KUBELET_API_VERSION) | None, Some(KUBELET_KIND))
        | (Some(KUBELET_API_VERSION), None) => Ok(DocumentVersion::Kubelet),
        (Some(KUBELET_API_VERSION), Some(k)) => {
            Err(wrong_kind(k, KUBELET_KIND, KUBELET_API_VERSION))
        }
        (None, Some(k)) => Err(ReadError::Value {
            field: "kind".to_owned(),
            message: format!("{k:?}: expected {KIND} (or a kubelet's {KUBELET_KIND})"),
        }),
        (Some(v), _) => Err(ReadError::Value {
            field: "apiVersion".to_owned(),
            message: format!(
                "{v:?}: expected {API_VERSION} (or a kubelet's {KUBELET_API_VERSION}); this \
                 node-monitor reads no other version"
            ),
        }),
    }
}

/// The document in node-monitor's current form: an implicit document with its `apiVersion` and
/// `kind` stated first; any other as it is.
pub fn migrated(text: &str, version: DocumentVersion) -> String {
    match version {
        DocumentVersion::Implicit => format!("apiVersion: {API_VERSION}\nkind: {KIND}\n{text}"),
        DocumentVersion::V1Alpha1 | DocumentVersion::Kubelet => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_of(yaml: &str) -> Result<DocumentVersion, String> {
        let map: Mapping = serde_norway::from_str(yaml).expect("a mapping");
        document_version(&map).map_err(|e| match e {
            ReadError::Value { field, message } => format!("{field}: {message}"),
            other => format!("{other:?}"),
        })
    }

    #[test]
    fn a_document_says_its_version_or_is_read_as_v1alpha1() {
        let ok = [
            ("evictionHard: {}", DocumentVersion::Implicit),
            (
                "apiVersion: node-monitor.io/v1alpha1\nkind: NodeMonitorConfiguration",
                DocumentVersion::V1Alpha1,
            ),
            ("kind: NodeMonitorConfiguration", DocumentVersion::V1Alpha1),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration",
                DocumentVersion::Kubelet,
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1",
                DocumentVersion::Kubelet,
            ),
        ];
        for (yaml, want) in ok {
            assert_eq!(version_of(yaml), Ok(want), "{yaml}");
        }
        let refused = [
            (
                "apiVersion: node-monitor.io/v2\nkind: NodeMonitorConfiguration",
                "apiVersion: \"node-monitor.io/v2\"",
            ),
            ("apiVersion: v1", "apiVersion: \"v1\""),
            ("apiVersion: node-monitor.io/v1alpha1", "kind: missing"),
            (
                "apiVersion: node-monitor.io/v1alpha1\nkind: ConfigMap",
                "kind: \"ConfigMap\"",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod",
                "kind: \"Pod\"",
            ),
            ("kind: Pod", "kind: \"Pod\""),
            ("apiVersion: 1", "apiVersion: expected a string, found"),
            ("kind: [a]", "kind: expected a string, found"),
        ];
        for (yaml, want) in refused {
            let err = version_of(yaml).expect_err(yaml);
            assert!(err.starts_with(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn migrating_states_the_version_of_an_implicit_document_only() {
        let text = "evictionHard:\n  memory.available: 100Mi\n";
        let m = migrated(text, DocumentVersion::Implicit);
        assert_eq!(
            m,
            "apiVersion: node-monitor.io/v1alpha1\nkind: NodeMonitorConfiguration\nevictionHard:\n  memory.available: 100Mi\n"
        );
        let map: Mapping = serde_norway::from_str(&m).expect("YAML");
        assert_eq!(document_version(&map).ok(), Some(DocumentVersion::V1Alpha1));
        assert_eq!(migrated(&m, DocumentVersion::V1Alpha1), m);
    }
}
