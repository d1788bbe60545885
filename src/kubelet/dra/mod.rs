//! Dynamic Resource Allocation, the kubelet's side (upstream's `cm/dra`): DRA drivers register
//! through the plugin watcher (type `DRAPlugin`, service `v1.DRAPlugin`); for a pod with
//! `spec.resourceClaims` the executor calls [`DraManager::prepare`] before it makes the
//! sandbox (the claims are read from the API server and must be allocated and reserved for
//! the pod; each driver's `NodePrepareResources` is called once per claim however many pods
//! share it), [`DraManager::cdi_devices`] gives each container the CDI device IDs of the
//! claims in its `resources.claims`, and [`DraManager::unprepare`] calls
//! `NodeUnprepareResources` once the last pod using a claim is gone. The claim-info cache is
//! checkpointed on every change in upstream's format (`state.rs`).
//!
//! Where Deckhand differs: a claim whose driver cannot unprepare it (stopped, failing) does not
//! keep its pod terminating as upstream's does; the pod's teardown goes on, the claim stays in
//! the cache without pods and its unprepare is tried again when a driver registers and at
//! every later unprepare. Only `v1.DRAPlugin` is spoken (not `v1beta1.DRAPlugin`), and the
//! drivers' health service is not read. The pod-resources API lists the prepared claims
//! through [`DraManager::container_claim_infos`].

pub(crate) mod claims;
pub(crate) mod state;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::kubelet::plugin_watcher::{HandlerError, PluginHandler};
use claims::ClaimError;
use state::ClaimInfo;

/// The `dra.v1` protocol (`proto/dra/v1/api.proto`).
pub(crate) mod proto {
    #![allow(unreachable_pub, clippy::all)]
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The `type` a DRA driver's registrar announces.
pub(crate) const DRA_PLUGIN: &str = "DRAPlugin";
/// The driver services this node speaks (upstream also speaks `v1beta1.DRAPlugin`).
pub(crate) const SUPPORTED_SERVICES: &[&str] = &["v1.DRAPlugin"];
/// How long one driver call may take (upstream's `defaultClientCallTimeout`).
const CALL_TIMEOUT: Duration = Duration::from_secs(45);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const PREPARE: &str = "NodePrepareResources";
const UNPREPARE: &str = "NodeUnprepareResources";

/// Why a pod's claims could not be prepared or unprepared; the messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DraError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("fetch ResourceClaim {name}: {reason}")]
    Fetch { name: String, reason: String },
    #[error("fetch ResourceClaim {0}: no API server to read ResourceClaims from")]
    Standalone(String),
    #[error("DRA driver {0} is not registered")]
    NotRegistered(String),
    #[error(
        "old ResourceClaim with same name {name} and different UID {uid} still exists (previous pod force-deleted?!)"
    )]
    OldClaim { name: String, uid: String },
    #[error("{call}: {reason}")]
    Call { call: &'static str, reason: String },
    #[error("{call} returned result for unknown claim UID {0}", call = .1)]
    UnknownClaim(String, &'static str),
    #[error("{call} failed for ResourceClaim {name}: {reason}")]
    ClaimFailed {
        call: &'static str,
        name: String,
        reason: String,
    },
    #[error("{call} skipped {count} ResourceClaims")]
    Skipped { call: &'static str, count: usize },
}

type Key = (String, String);

struct Inner {
    checkpoint: PathBuf,
    client: Option<kube::Client>,
    /// The claims by namespace and name (upstream's claim-info cache).
    claims: Mutex<BTreeMap<Key, ClaimInfo>>,
    /// The registered drivers' endpoints by name.
    drivers: Mutex<HashMap<String, String>>,
    /// One prepare or unprepare at a time, so a shared claim is prepared once.
    ops: tokio::sync::Mutex<()>,
}

/// The DRA manager; cheap to clone.
#[derive(Clone)]
pub(crate) struct DraManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DraManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraManager")
            .field("checkpoint", &self.inner.checkpoint)
            .finish()
    }
}

type DraClient = proto::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

/// Why a registered driver's socket could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("connect to {path}: {source}")]
struct ConnectError {
    path: String,
    source: tonic::transport::Error,
}

async fn connect(endpoint: &str) -> Result<DraClient, ConnectError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    let failed = |source| ConnectError {
        path: path.to_string(),
        source,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
        .map_err(failed)?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .map_err(failed)?;
    Ok(proto::dra_plugin_client::DraPluginClient::new(channel))
}

/// Which claims to send to each driver for one operation (pure): the claims' drivers that
/// do not skip it.
fn batches(claims: &[&ClaimInfo], operation: &str) -> BTreeMap<String, Vec<proto::Claim>> {
    let mut out: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
    for info in claims {
        for (driver, state) in &info.drivers {
            if state.skips(operation) {
                continue;
            }
            out.entry(driver.clone()).or_default().push(proto::Claim {
                namespace: info.namespace.clone(),
                uid: info.claim_uid.clone(),
                name: info.claim_name.clone(),
            });
        }
    }
    out
}

impl DraManager {
    /// The manager with the claims of the checkpoint under `root_dir` (a checkpoint that cannot
    /// be read is logged and started afresh, as upstream would refuse to start instead).
    pub(crate) fn new(root_dir: &std::path::Path, client: Option<kube::Client>) -> DraManager {
        let checkpoint = root_dir.join(state::FILE_NAME);
        let restored = match state::read(&checkpoint) {
            Ok(list) => list.unwrap_or_default(),
            Err(err) => {
                tracing::error!(error = %err, "cannot read the DRA checkpoint; starting without it");
                Vec::new()
            }
        };
        let claims = restored
            .into_iter()
            .map(|c| ((c.namespace.clone(), c.claim_name.clone()), c))
            .collect();
        DraManager {
            inner: Arc::new(Inner {
                checkpoint,
                client,
                claims: Mutex::new(claims),
                drivers: Mutex::new(HashMap::new()),
                ops: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, ClaimInfo>> {
        self.inner.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn endpoint(&self, driver: &str) -> Option<String> {
        let drivers = self.inner.drivers.lock().unwrap_or_else(|e| e.into_inner());
        drivers.get(driver).cloned()
    }

    fn save(&self) {
        let list: Vec<ClaimInfo> = self.claims().values().cloned().collect();
        if let Err(err) = state::write(&self.inner.checkpoint, &list) {
            tracing::error!(error = %err, "cannot write the DRA checkpoint");
        }
    }

    /// Records a driver's endpoint (`None`: it went away).
    pub(crate) fn set_driver(&self, name: &str, endpoint: Option<&str>) {
        let mut drivers = self.inner.drivers.lock().unwrap_or_else(|e| e.into_inner());
        match endpoint {
            Some(e) => drivers.insert(name.to_string(), e.to_string()),
            None => drivers.remove(name),
        };
    }

    /// A copy of the cache.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Vec<ClaimInfo> {
        self.claims().values().cloned().collect()
    }

    async fn fetch(&self, namespace: &str, name: &str) -> Result<ResourceClaim, DraError> {
        let client = self
            .inner
            .client
            .clone()
            .ok_or_else(|| DraError::Standalone(name.to_string()))?;
        kube::Api::<ResourceClaim>::namespaced(client, namespace)
            .get(name)
            .await
            .map_err(|e| DraError::Fetch {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }

    /// Reads and checks the pod's claims, without touching the cache (upstream's validation
    /// pass: a pod that fails here can be deleted without anything to unprepare).
    async fn read_claims(&self, pod: &Pod) -> Result<Vec<ClaimInfo>, DraError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut out = Vec::new();
        let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
        for pod_claim in pod_claims.into_iter().flatten() {
            let Some((name, must_own)) = claims::claim_name(pod, pod_claim)? else {
                continue;
            };
            let claim = self.fetch(&namespace, &name).await?;
            claims::check_usable(pod, &claim, must_own)?;
            let info = claims::claim_info(&claim)?;
            for (driver, state) in &info.drivers {
                if !state.skips(PREPARE) && self.endpoint(driver).is_none() {
                    return Err(DraError::NotRegistered(driver.clone()));
                }
            }
            out.push(info);
        }
        Ok(out)
    }

    /// Prepares the pod's claims before its sandbox is made (upstream's `PrepareResources`);
    /// claims already prepared for another pod only get the pod added.
    pub(crate) async fn prepare(&self, pod: &Pod) -> Result<(), DraError> {
        if !claims::has_claims(pod) {
            return Ok(());
        }
        let read = self.read_claims(pod).await?;
        let _op = self.inner.ops.lock().await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut todo: Vec<ClaimInfo> = Vec::new();
        {
            let mut cache = self.claims();
            for info in read {
                let key = (info.namespace.clone(), info.claim_name.clone());
                let entry = cache.entry(key).or_insert_with(|| info.clone());
                if entry.claim_uid != info.claim_uid {
                    return Err(DraError::OldClaim {
                        name: info.claim_name,
                        uid: entry.claim_uid.clone(),
                    });
                }
                entry.pod_uids.insert(uid.clone());
                if !entry.prepared {
                    todo.push(entry.clone());
                }
            }
        }
        self.save();
        let refs: Vec<&ClaimInfo> = todo.iter().collect();
        for (driver, batch) in batches(&refs, PREPARE) {
            self.prepare_batch(&driver, batch).await?;
        }
        {
            let mut cache = self.claims();
            for info in &todo {
                if let Some(entry) =
                    cache.get_mut(&(info.namespace.clone(), info.claim_name.clone()))
                {
                    entry.prepared = true;
                }
            }
        }
        self.save();
        Ok(())
    }

    async fn prepare_batch(&self, driver: &str, batch: Vec<proto::Claim>) -> Result<(), DraError> {
        let call_err = |reason: String| DraError::Call {
            call: PREPARE,
            reason,
        };
        let endpoint = self
            .endpoint(driver)
            .ok_or_else(|| DraError::NotRegistered(driver.to_string()))?;
        let mut client = connect(&endpoint)
            .await
            .map_err(|e| call_err(e.to_string()))?;
        let started = crate::base::clock::instant();
        let answer = client
            .node_prepare_resources(proto::NodePrepareResourcesRequest {
                claims: batch.clone(),
            })
            .await
            .map_err(|s| {
                call_err(format!(
                    "rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                ))
            })?
            .into_inner();
        tracing::info!(
            driver,
            claims = batch.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "DRA driver prepared claims"
        );
        for (claim_uid, result) in &answer.claims {
            let claim = batch
                .iter()
                .find(|c| &c.uid == claim_uid)
                .ok_or_else(|| DraError::UnknownClaim(claim_uid.clone(), PREPARE))?;
            if !result.error.is_empty() {
                return Err(DraError::ClaimFailed {
                    call: PREPARE,
                    name: claim.name.clone(),
                    reason: result.error.clone(),
                });
            }
            let mut cache = self.claims();
            if let Some(entry) = cache.get_mut(&(claim.namespace.clone(), claim.name.clone())) {
                let state = entry.drivers.entry(driver.to_string()).or_default();
                state.devices = result.devices.iter().map(device_of).collect();
            }
        }
        let unfinished = batch.len().saturating_sub(answer.claims.len());
        if unfinished != 0 {
            return Err(DraError::Skipped {
                call: PREPARE,
                count: unfinished,
            });
        }
        Ok(())
    }

    /// The CDI device IDs for the container (upstream's `GetResources`), from the claims its
    /// `resources.claims` names and the pod prepared.
    pub(crate) fn cdi_devices(&self, pod: &Pod, container: &Container) -> Vec<String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let used = claims::container_claims(pod, container);
        let cache = self.claims();
        let mut out: Vec<String> = Vec::new();
        for (name, requests) in used {
            if let Some(info) = cache.get(&(namespace.clone(), name)) {
                for id in claims::cdi_devices(info, &requests) {
                    if !out.contains(&id) {
                        out.push(id);
                    }
                }
            }
        }
        out
    }

    /// The cached claims the container uses (upstream's `GetContainerClaimInfos`), for the
    /// pod-resources API.
    pub(crate) fn container_claim_infos(&self, pod: &Pod, container: &Container) -> Vec<ClaimInfo> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let cache = self.claims();
        claims::container_claims(pod, container)
            .into_iter()
            .filter_map(|(name, _)| cache.get(&(namespace.clone(), name)).cloned())
            .collect()
    }

    /// The pod is gone: it no longer uses its claims, and those no pod uses are unprepared
    /// (upstream's `UnprepareResources`). A claim whose driver fails stays cached without pods
    /// and is tried again later ([`Self::retry_unprepared`]).
    pub(crate) async fn unprepare(&self, pod_uid: &str) -> Result<(), DraError> {
        let _op = self.inner.ops.lock().await;
        let touched = {
            let mut cache = self.claims();
            let mut touched = false;
            for info in cache.values_mut() {
                touched |= info.pod_uids.remove(pod_uid);
            }
            touched
        };
        if !touched {
            return Ok(());
        }
        self.save();
        self.unprepare_unused().await
    }

    /// Unprepares every cached claim no pod uses.
    async fn unprepare_unused(&self) -> Result<(), DraError> {
        let unused: Vec<ClaimInfo> = self
            .claims()
            .values()
            .filter(|c| c.pod_uids.is_empty())
            .cloned()
            .collect();
        let refs: Vec<&ClaimInfo> = unused.iter().collect();
        let mut first_err = None;
        let mut failed: Vec<String> = Vec::new();
        for (driver, batch) in batches(&refs, UNPREPARE) {
            if let Err(err) = self.unprepare_batch(&driver, &batch).await {
                tracing::warn!(driver, error = %err, "cannot unprepare ResourceClaims; trying again later");
                failed.extend(batch.iter().map(|c| c.uid.clone()));
                first_err.get_or_insert(err);
            }
        }
        {
            let mut cache = self.claims();
            cache.retain(|_, c| !c.pod_uids.is_empty() || failed.contains(&c.claim_uid));
        }
        self.save();
        first_err.map_or(Ok(()), Err)
    }

    async fn unprepare_batch(&self, driver: &str, batch: &[proto::Claim]) -> Result<(), DraError> {
        let call_err = |reason: String| DraError::Call {
            call: UNPREPARE,
            reason,
        };
        let endpoint = self
            .endpoint(driver)
            .ok_or_else(|| DraError::NotRegistered(driver.to_string()))?;
        let mut client = connect(&endpoint)
            .await
            .map_err(|e| call_err(e.to_string()))?;
        let answer = client
            .node_unprepare_resources(proto::NodeUnprepareResourcesRequest {
                claims: batch.to_vec(),
            })
            .await
            .map_err(|s| {
                call_err(format!(
                    "rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                ))
            })?
            .into_inner();
        for (claim_uid, result) in &answer.claims {
            let claim = batch
                .iter()
                .find(|c| &c.uid == claim_uid)
                .ok_or_else(|| DraError::UnknownClaim(claim_uid.clone(), UNPREPARE))?;
            if !result.error.is_empty() {
                return Err(DraError::ClaimFailed {
                    call: UNPREPARE,
                    name: claim.name.clone(),
                    reason: result.error.clone(),
                });
            }
        }
        tracing::info!(driver, claims = batch.len(), "DRA driver unprepared claims");
        let unfinished = batch.len().saturating_sub(answer.claims.len());
        if unfinished != 0 {
            return Err(DraError::Skipped {
                call: UNPREPARE,
                count: unfinished,
            });
        }
        Ok(())
    }

    /// Tries again to unprepare the claims no pod uses (a driver came back).
    pub(crate) async fn retry_unprepared(&self) {
        let _op = self.inner.ops.lock().await;
        let _ = self.unprepare_unused().await;
    }
}

fn device_of(d: &proto::Device) -> state::Device {
    state::Device {
        pool_name: d.pool_name.clone(),
        device_name: d.device_name.clone(),
        share_id: d.share_id.clone(),
        request_names: d.request_names.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
    }
}

/// Whether the driver speaks a service this node does (pure), with upstream's messages.
pub(crate) fn validate_services(
    name: &str,
    endpoint: &str,
    services: &[String],
) -> Result<(), HandlerError> {
    let prefix = format!(
        "invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}"
    );
    if services.is_empty() {
        return Err(HandlerError(format!(
            "{prefix}: empty list of supported gRPC services (aka supported versions)"
        )));
    }
    if services
        .iter()
        .any(|s| SUPPORTED_SERVICES.contains(&s.as_str()))
    {
        return Ok(());
    }
    Err(HandlerError(format!(
        "{prefix}: none of services supported by the plugin ({services:?}) are supported by the kubelet ({SUPPORTED_SERVICES:?})"
    )))
}

/// The plugin watcher's handler for `DRAPlugin` (upstream's `DRAPluginManager`).
pub(crate) struct DraHandler {
    pub manager: DraManager,
}

impl PluginHandler for DraHandler {
    fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        if name.is_empty() {
            return Err(HandlerError("DRA driver name is empty".to_string()));
        }
        validate_services(name, endpoint, versions)
    }

    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.validate(name, endpoint, versions)?;
            self.manager.set_driver(name, Some(endpoint));
            tracing::info!(driver = name, endpoint, "DRA driver registered");
            let manager = self.manager.clone();
            tokio::spawn(async move { manager.retry_unprepared().await });
            Ok(())
        })
    }

    fn deregister<'a>(&'a self, name: &'a str, _endpoint: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.manager.set_driver(name, None);
            tracing::info!(driver = name, "DRA driver deregistered");
        })
    }
}

#[cfg(test)]
mod tests;
