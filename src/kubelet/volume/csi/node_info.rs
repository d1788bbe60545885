//! What a registered driver changes in the cluster, as upstream's `nodeinfomanager`: the
//! Node's `csi.volume.kubernetes.io/nodeid` annotation (a JSON map of driver → node ID) and
//! the driver's topology segments as Node labels, and the driver's entry in the node's
//! `CSINode` object (created with the Node as its owner when missing).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::client::NodeInfo;

/// Upstream's annotation of driver node IDs on the Node.
pub(crate) const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The node ID annotation with `driver` set to `node_id` (or removed, with `None`) (pure).
pub(crate) fn node_ids(
    current: Option<&str>,
    driver: &str,
    node_id: Option<&str>,
) -> Option<String> {
    let mut ids: BTreeMap<String, String> = current
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    match node_id {
        Some(id) => ids.insert(driver.to_string(), id.to_string()),
        None => ids.remove(driver),
    };
    (!ids.is_empty()).then(|| serde_json::to_string(&ids).unwrap_or_default())
}

/// The CSINode's drivers with `driver`'s entry put in (or taken out, with `None`) (pure).
pub(crate) fn with_driver(
    mut drivers: Vec<CSINodeDriver>,
    name: &str,
    info: Option<&NodeInfo>,
) -> Vec<CSINodeDriver> {
    drivers.retain(|d| d.name != name);
    if let Some(info) = info {
        let keys: Vec<String> = info.topology.keys().cloned().collect();
        drivers.push(CSINodeDriver {
            name: name.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: (!keys.is_empty()).then_some(keys),
            allocatable: (info.max_volumes > 0).then(|| VolumeNodeResources {
                count: Some(i32::try_from(info.max_volumes).unwrap_or(i32::MAX)),
            }),
        });
    }
    drivers
}

/// Records the driver on the Node and in the CSINode.
pub(crate) async fn install(
    client: &kube::Client,
    node_name: &str,
    driver: &str,
    info: &NodeInfo,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(node_name).await?;
    let current = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION));
    let ids = node_ids(current.map(String::as_str), driver, Some(&info.node_id));
    let patch = serde_json::json!({
        "metadata": {"annotations": {NODE_ID_ANNOTATION: ids}, "labels": info.topology}
    });
    nodes
        .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    update_csi_node(client, &node, driver, Some(info)).await
}

/// Takes the driver off the Node's annotation and out of the CSINode.
pub(crate) async fn uninstall(
    client: &kube::Client,
    node_name: &str,
    driver: &str,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(node_name).await?;
    let current = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION));
    if current.is_some() {
        let ids = node_ids(current.map(String::as_str), driver, None);
        let patch = serde_json::json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: ids}}});
        nodes
            .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    update_csi_node(client, &node, driver, None).await
}

async fn update_csi_node(
    client: &kube::Client,
    node: &Node,
    driver: &str,
    info: Option<&NodeInfo>,
) -> Result<(), kube::Error> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    match csi_nodes.get_opt(&node_name).await? {
        Some(mut csi_node) => {
            csi_node.spec.drivers =
                with_driver(std::mem::take(&mut csi_node.spec.drivers), driver, info);
            csi_nodes
                .replace(&node_name, &PostParams::default(), &csi_node)
                .await?;
        }
        None => {
            let csi_node = CSINode {
                metadata: ObjectMeta {
                    name: Some(node_name.clone()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node_name,
                        uid: node.metadata.uid.clone().unwrap_or_default(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: CSINodeSpec {
                    drivers: with_driver(Vec::new(), driver, info),
                },
                ..Default::default()
            };
            csi_nodes.create(&PostParams::default(), &csi_node).await?;
        }
    }
    Ok(())
}
