//! The handful of API calls the node agent makes, behind a small trait so the retry and
//! conflict paths can be unit-tested; [`KubeNodeApi`] is the real one.

use std::future::Future;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::lease::LEASE_NAMESPACE;
use crate::clients::apiserver::Problem;

/// Node and Lease calls, each one request.
pub(crate) trait NodeApi: Clone + Send + Sync + 'static {
    fn create_node(&self, node: &Node) -> impl Future<Output = Result<Node, Problem>> + Send;
    fn get_node(&self, name: &str) -> impl Future<Output = Result<Node, Problem>> + Send;
    /// A JSON merge patch of the Node's metadata.
    fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Node, Problem>> + Send;
    /// A strategic merge patch of the status subresource.
    fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<Node, Problem>> + Send;
    fn get_lease(&self, name: &str) -> impl Future<Output = Result<Lease, Problem>> + Send;
    fn create_lease(&self, lease: &Lease) -> impl Future<Output = Result<Lease, Problem>> + Send;
    /// An update with the lease's resourceVersion (409 Conflict when it is stale).
    fn replace_lease(&self, lease: &Lease) -> impl Future<Output = Result<Lease, Problem>> + Send;
}

/// [`NodeApi`] on a kube client.
#[derive(Clone)]
pub(crate) struct KubeNodeApi {
    nodes: Api<Node>,
    leases: Api<Lease>,
}

impl KubeNodeApi {
    pub(crate) fn new(client: kube::Client) -> Self {
        KubeNodeApi {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, LEASE_NAMESPACE),
        }
    }
}

/// Field manager name in managedFields, so `kubectl get node --show-managed-fields` says who.
const FIELD_MANAGER: &str = "deckhand";

impl NodeApi for KubeNodeApi {
    async fn create_node(&self, node: &Node) -> Result<Node, Problem> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Ok(self.nodes.create(&pp, node).await?)
    }

    async fn get_node(&self, name: &str) -> Result<Node, Problem> {
        Ok(self.nodes.get(name).await?)
    }

    async fn patch_node(&self, name: &str, patch: &serde_json::Value) -> Result<Node, Problem> {
        let pp = PatchParams::apply(FIELD_MANAGER);
        let pp = PatchParams { force: false, ..pp };
        Ok(self.nodes.patch(name, &pp, &Patch::Merge(patch)).await?)
    }

    async fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, Problem> {
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Ok(self
            .nodes
            .patch_status(name, &pp, &Patch::Strategic(patch))
            .await?)
    }

    async fn get_lease(&self, name: &str) -> Result<Lease, Problem> {
        Ok(self.leases.get(name).await?)
    }

    async fn create_lease(&self, lease: &Lease) -> Result<Lease, Problem> {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Ok(self.leases.create(&pp, lease).await?)
    }

    async fn replace_lease(&self, lease: &Lease) -> Result<Lease, Problem> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Ok(self.leases.replace(&name, &pp, lease).await?)
    }
}
