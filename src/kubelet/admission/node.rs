//! The node admission checks pods against: what the configuration says (name, the labels it
//! registers, `--register-with-taints`, allocatable), and, once the node agent has the Node
//! back from the API server, the Node's own labels and taints, so that `kubectl label node`
//! and `kubectl taint node` count (upstream reads its Node from an informer the same way).
//! The Node comes from `node::watch` (a watch of the node's own Node) and from the node
//! agent's answers, whichever is newer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use super::{Allocatable, NodeInfo, requests};

/// The node for admission, current at each call.
#[derive(Debug, Clone)]
pub struct NodeSource {
    base: NodeInfo,
    node: Option<watch::Receiver<Option<Arc<Node>>>>,
}

impl NodeSource {
    /// A node known from the configuration only (no API server).
    pub fn fixed(base: NodeInfo) -> NodeSource {
        NodeSource { base, node: None }
    }

    /// The configuration's node, overlaid with the Node the node agent publishes.
    pub fn with_node_object(
        base: NodeInfo,
        node: watch::Receiver<Option<Arc<Node>>>,
    ) -> NodeSource {
        NodeSource {
            base,
            node: Some(node),
        }
    }

    /// The node as it stands now.
    pub fn current(&self) -> NodeInfo {
        let node = self.node.as_ref().and_then(|rx| rx.borrow().clone());
        match node {
            Some(node) => overlay(&self.base, &node),
            None => self.base.clone(),
        }
    }
}

/// The configuration's node with the Node object's labels and taints, and the extended
/// resources its allocatable lists that the node does not compute itself (advertised by hand
/// with a status patch, as upstream's documentation shows).
pub(super) fn overlay(base: &NodeInfo, node: &Node) -> NodeInfo {
    let mut info = base.clone();
    info.labels = node.metadata.labels.clone().unwrap_or_default();
    info.taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if let Some(list) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
        let from_node = Allocatable::from_quantities(list);
        for (name, amount) in from_node.scalar {
            if requests::is_extended(&name) && !info.allocatable.scalar.contains_key(&name) {
                info.allocatable.scalar.insert(name, amount);
            }
        }
    }
    info
}
