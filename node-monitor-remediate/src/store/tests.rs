use super::*;

use node_monitor_core::remediation::{DeathEvidence, NodeFacts, Phase, ReadyStatus, Step, ZoneKey};

fn op(node: &str) -> FenceOp {
    let facts = NodeFacts {
        name: node.to_owned(),
        zone: ZoneKey::default(),
        ready: ReadyStatus::Unknown,
        lease: None,
        agent_heartbeat: None,
        agent_lease: None,
        last_gasp: None,
        eligible: true,
        boot_id: None,
        ready_heartbeat: None,
    };
    FenceOp::new(&facts, "uid-a", &DeathEvidence::LastGasp { at: 1 }, 0)
}

/// The shipped CustomResourceDefinition.
fn crd() -> Value {
    let text = include_str!("../../../deploy/remediate/crd.yaml");
    serde_norway::from_str(text).expect("crd.yaml is YAML")
}

#[test]
fn a_node_fence_is_named_after_its_node() {
    assert_eq!(node_fence_name("node-a"), "node-a");
    let long = "n".repeat(253);
    assert_eq!(node_fence_name(&long), long, "node names already fit");
}

#[test]
fn the_operation_round_trips_through_the_status() {
    let mut o = op("node-a");
    o.confirmed_by = Some(Step::Isolation);
    let written = op_object(&o, Some("7".to_owned())).expect("encode");
    assert_eq!(written.metadata.name.as_deref(), Some("node-a"));
    assert_eq!(
        written.data["spec"],
        json!({"nodeName": "node-a", "nodeUID": "uid-a"})
    );
    assert_eq!(written.data["status"]["phase"], "fencing");
    assert_eq!(written.data["status"]["step"], "isolation");
    assert_eq!(written.data["status"]["confirmedBy"], "isolation");
    let owner = &written.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", "uid-a")
    );
    let read = decode_op(&written).expect("decode").expect("an operation");
    assert_eq!(read.op, o);
    assert_eq!(read.resource_version.as_deref(), Some("7"));

    o.phase = Phase::Released;
    let released = op_object(&o, None).expect("encode");
    assert_eq!(released.data["status"]["phase"], "released");
    assert!(
        released.data["status"].get("step").is_none(),
        "no step outside fencing"
    );
}

/// A NodeFence created and not yet given an operation (the controller stopped between the create
/// and the status write) holds no operation: it is neither trusted nor an error.
#[test]
fn a_node_fence_without_status_is_no_operation() {
    let mut obj = op_object(&op("node-a"), None).expect("encode");
    obj.data.as_object_mut().expect("object").remove("status");
    assert!(decode_op(&obj).expect("decodes").is_none());
}

#[test]
fn an_undecodable_status_names_the_object_and_the_field() {
    let mut obj = op_object(&op("node-a"), None).expect("encode");
    obj.data["status"]["operation"] = json!({"node": 3});
    let err = decode_op(&obj).expect_err("not an operation");
    assert!(matches!(err, StoreError::Decode { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("NodeFence node-a status.operation"),
        "{err}"
    );
}

#[test]
fn operations_are_keyed_by_their_object_not_their_status() {
    let written = op_object(&op("node-a"), None).expect("encode");
    // (what is changed, the reason)
    type Edit = fn(&mut DynamicObject);
    let cases: [(Edit, &str); 7] = [
        // Another node's NodeFence carrying this operation.
        (|o| o.metadata.name = Some("node-b".to_owned()), "name"),
        // The operation points at another node than the object.
        (
            |o| o.data["status"]["operation"]["node"] = json!("node-b"),
            "name",
        ),
        (
            |o| o.data["spec"]["nodeName"] = json!("node-b"),
            "spec.nodeName",
        ),
        (
            |o| o.data["spec"]["nodeUID"] = json!("uid-other"),
            "spec.nodeUID",
        ),
        // The operation is of an earlier Node of the same name.
        (
            |o| o.data["status"]["operation"]["nodeUid"] = json!("uid-old"),
            "spec.nodeUID",
        ),
        (|o| o.metadata.owner_references = None, "owned"),
        (
            |o| {
                o.metadata.owner_references.as_mut().expect("owner")[0].uid = "uid-other".to_owned()
            },
            "owned",
        ),
    ];
    for (edit, needle) in cases {
        let mut obj = written.clone();
        edit(&mut obj);
        let err = decode_op(&obj).expect_err(needle);
        assert!(
            matches!(err, StoreError::Mismatch { .. }) && err.to_string().contains(needle),
            "{needle}: {err}"
        );
    }
}

#[test]
fn legacy_configmaps_are_named_not_read() {
    let names = [
        "fence-config-default",
        "fence-method-ipmi",
        "node-monitor-fence-node-a",
        "node-monitor-remediate",
        "node-monitor-fence-node-b",
    ];
    assert_eq!(
        legacy_operations(names),
        ["node-monitor-fence-node-a", "node-monitor-fence-node-b"]
    );
}

/// The shipped CRD serves what the store reads and writes: its group, version, kind and plural,
/// cluster scope, the status subresource, and every phase and step the status can name.
#[test]
fn the_shipped_crd_matches_the_store() {
    let crd = crd();
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], CRD_NAME);
    assert_eq!(spec["group"], GROUP);
    assert_eq!(spec["scope"], "Cluster");
    assert_eq!(spec["names"]["kind"], KIND);
    assert_eq!(spec["names"]["plural"], PLURAL);
    let v = &spec["versions"][0];
    assert_eq!(v["name"], VERSION);
    assert!(
        v["subresources"]["status"].is_object(),
        "status subresource"
    );
    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    let phases: Vec<&str> = status["phase"]["enum"]
        .as_array()
        .expect("phase enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(phases, Phase::LABELS);
    let steps: Vec<&str> = status["step"]["enum"]
        .as_array()
        .expect("step enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(steps, Step::ALL.map(Step::as_str));
    assert_eq!(
        status["operation"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for c in ["Node", "Phase", "Age"] {
        assert!(columns.contains(&c), "{columns:?}");
    }
}

/// Without the CRD the API server answers a list with 404: the error says what to install.
#[test]
fn a_missing_crd_says_what_to_install() {
    let status = kube::core::Status::failure(
        "the server could not find the requested resource",
        "NotFound",
    )
    .with_code(404);
    let err = not_installed(StoreError::Api {
        action: "list",
        name: "*".to_owned(),
        source: Box::new(kube::Error::Api(Box::new(status))),
    });
    assert!(matches!(err, StoreError::NotInstalled), "{err}");
    assert!(
        err.to_string().contains("deploy/remediate/crd.yaml"),
        "{err}"
    );
    let other = not_installed(StoreError::Conflict {
        name: "node-a".to_owned(),
    });
    assert!(matches!(other, StoreError::Conflict { .. }), "{other}");
}
