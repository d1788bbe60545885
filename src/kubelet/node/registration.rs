//! The Node object Deckhand registers, and how an existing one is brought in line, as
//! upstream does: the labels the node agent owns are set again, every other label, taint and
//! annotation is left as the cluster's operators made it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::status::go_arch;
use crate::config::ClusterSettings;

/// Tells the attach/detach controller that it, not the node agent, attaches volumes.
pub(crate) const CONTROLLER_MANAGED_ATTACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The labels the node agent sets and keeps current on an existing Node (upstream's list;
/// Deckhand sets the first five, the cloud ones are reconciled only when given).
const OWNED_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
];

/// The labels the node registers with: hostname, OS and architecture, then `--node-labels`
/// (which win over the defaults, as upstream). Admission matches node selectors against
/// these until the Node is read back from the API server.
pub(crate) fn node_labels(node_name: &str, settings: &ClusterSettings) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), node_name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), go_arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), go_arch().to_string()),
    ]);
    for (k, v) in &settings.node_labels {
        labels.insert(k.clone(), v.clone());
    }
    labels
}

/// The Node to create: name, labels ([`node_labels`]), taints, the attach/detach annotation,
/// and the first status (so it can be Ready at once).
pub(crate) fn initial_node(
    node_name: &str,
    settings: &ClusterSettings,
    status: NodeStatus,
) -> Node {
    let labels = node_labels(node_name, settings);
    Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_MANAGED_ATTACH.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!settings.register_with_taints.is_empty())
                .then(|| settings.register_with_taints.clone()),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// The JSON merge patch that brings an existing Node in line with the one Deckhand would
/// create, or `None` when it already is: owned labels set to our values (an owned label we
/// would set empty is removed), the attach/detach annotation set. Nothing else is touched.
pub(crate) fn reconcile_existing(existing: &Node, initial: &Node) -> Option<serde_json::Value> {
    let empty = BTreeMap::new();
    let have = existing.metadata.labels.as_ref().unwrap_or(&empty);
    let want = initial.metadata.labels.as_ref().unwrap_or(&empty);
    let mut labels = serde_json::Map::new();
    for key in OWNED_LABELS {
        let Some(value) = want.get(*key) else {
            continue;
        };
        if have.get(*key) != Some(value) {
            let v = if value.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::Value::String(value.clone())
            };
            labels.insert(key.to_string(), v);
        }
    }
    let annotation_set = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_MANAGED_ATTACH))
        .is_some_and(|v| v == "true");
    if labels.is_empty() && annotation_set {
        return None;
    }
    let mut metadata = serde_json::Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), serde_json::Value::Object(labels));
    }
    if !annotation_set {
        metadata.insert(
            "annotations".into(),
            serde_json::json!({ CONTROLLER_MANAGED_ATTACH: "true" }),
        );
    }
    Some(serde_json::json!({ "metadata": metadata }))
}

/// A strategic merge patch of the status subresource carrying our whole status: conditions
/// merge by type (so conditions others own stay), addresses are replaced as a list (a
/// strategic merge by type would keep a stale address), images are atomic already.
pub(crate) fn status_patch(status: &NodeStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(addresses) = value.get_mut("addresses").and_then(|a| a.as_array_mut()) {
        addresses.push(serde_json::json!({ "$patch": "replace" }));
    }
    serde_json::json!({ "status": value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ClusterSettings {
        ClusterSettings {
            node_labels: BTreeMap::from([
                ("tier".to_string(), "edge".to_string()),
                ("kubernetes.io/hostname".to_string(), "alias".to_string()),
            ]),
            register_with_taints: vec![crate::config::node::parse_taint("a=b:NoSchedule").unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn the_initial_node() {
        let node = initial_node("n1", &settings(), NodeStatus::default());
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["beta.kubernetes.io/arch"], go_arch());
        assert_eq!(labels["tier"], "edge");
        // --node-labels override the defaults, as upstream.
        assert_eq!(labels["kubernetes.io/hostname"], "alias");
        assert_eq!(
            node.metadata.annotations.as_ref().unwrap()[CONTROLLER_MANAGED_ATTACH],
            "true"
        );
        assert_eq!(
            node.spec.as_ref().unwrap().taints.as_ref().unwrap()[0].key,
            "a"
        );
        let bare = initial_node("n1", &ClusterSettings::default(), NodeStatus::default());
        assert_eq!(bare.spec.unwrap().taints, None);
    }

    #[test]
    fn reconciling_touches_only_owned_labels_and_the_annotation() {
        let initial = initial_node("n1", &ClusterSettings::default(), NodeStatus::default());
        let mut existing = initial.clone();
        assert_eq!(
            reconcile_existing(&existing, &initial),
            None,
            "already in line"
        );

        let labels = existing.metadata.labels.as_mut().unwrap();
        labels.insert("kubernetes.io/arch".into(), "mips".into());
        labels.insert("team".into(), "blue".into());
        labels.remove("beta.kubernetes.io/os");
        existing.metadata.annotations = None;
        let patch = reconcile_existing(&existing, &initial).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {
                "labels": {"kubernetes.io/arch": go_arch(), "beta.kubernetes.io/os": "linux"},
                "annotations": {CONTROLLER_MANAGED_ATTACH: "true"},
            }})
        );
    }

    #[test]
    fn the_status_patch_replaces_addresses() {
        let status = NodeStatus {
            addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                type_: "Hostname".into(),
                address: "n1".into(),
            }]),
            ..Default::default()
        };
        let patch = status_patch(&status);
        assert_eq!(
            patch["status"]["addresses"],
            serde_json::json!([{"type": "Hostname", "address": "n1"}, {"$patch": "replace"}])
        );
    }
}
