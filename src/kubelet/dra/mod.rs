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
//! The cache's lock is held to read or change it and to write the checkpoint, never across a
//! driver call. Each claim has an operation lock of its own, held from the cache change to the
//! drivers' answers, so that pods sharing a claim see it prepared once (the second waits for
//! the first's prepare), while a driver that does not answer (up to its 45 s deadline) holds up
//! only the pods of its own claims. Housekeeping releases the claims of pods that went while
//! the agent was down ([`DraManager::release_pods`], upstream's reconcile loop). Upstream's
//! `dra_*` metrics are in `metrics.rs`.
//!
//! Where Deckhand differs: a claim whose driver cannot unprepare it (stopped, failing) does not
//! keep its pod terminating as upstream's does; the pod's teardown goes on, the claim stays in
//! the cache without pods and its unprepare is tried again when a driver registers and at
//! every later unprepare. Only `v1.DRAPlugin` is spoken (not `v1beta1.DRAPlugin`). A driver
//! that lists a `DRAResourceHealth` service has its device health read (`health_watch.rs`) into
//! the containers' `allocatedResourcesStatus` ([`DraManager::resources_status`]). The
//! pod-resources API lists the prepared claims through [`DraManager::container_claim_infos`].

pub(crate) mod claims;
pub(crate) mod health;
pub(crate) mod health_watch;
pub(crate) mod metrics;
pub(crate) mod slices;
pub(crate) mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
type ClaimGuard = tokio::sync::OwnedMutexGuard<()>;

fn key_of(info: &ClaimInfo) -> Key {
    (info.namespace.clone(), info.claim_name.clone())
}

struct Inner {
    checkpoint: PathBuf,
    client: Option<kube::Client>,
    /// The claims by namespace and name (upstream's claim-info cache). Held only to read or
    /// change them and to write the checkpoint, never across a driver call.
    claims: Mutex<BTreeMap<Key, ClaimInfo>>,
    /// The registered drivers' endpoints by name.
    drivers: Mutex<HashMap<String, String>>,
    /// One prepare or unprepare of a claim at a time, so a shared claim is prepared once; by
    /// claim, so that a driver that does not answer holds up only the pods of its own claims.
    ops: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
    /// What the drivers' health streams last said of their devices.
    health: Mutex<health::HealthCache>,
    /// The running health streams by driver, to stop them when it goes.
    health_watches: Mutex<HashMap<String, tokio_util::sync::CancellationToken>>,
    /// Where a health change that touches a pod's devices is told (the pods' pokes).
    status_pokes: std::sync::OnceLock<crate::base::resync_queue::Pokes>,
    /// The node whose stale ResourceSlices are deleted, and the agent's stop ([`slices`]);
    /// set once the daemon knows the node.
    wipe_scope: std::sync::OnceLock<(String, tokio_util::sync::CancellationToken)>,
    /// The deletions of a gone driver's slices that wait out [`slices::WIPING_DELAY`], by
    /// driver; one that registers again cancels its own.
    pending_wipes: Mutex<HashMap<String, tokio_util::sync::CancellationToken>>,
    /// The registered drivers' connection watches ([`slices::watch_connection`]), by driver.
    connection_watches: Mutex<HashMap<String, tokio_util::sync::CancellationToken>>,
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
    Ok(proto::dra_plugin_client::DraPluginClient::new(
        channel(endpoint).await?,
    ))
}

/// A channel to the driver's socket (a `unix://` prefix or a bare path).
async fn channel(endpoint: &str) -> Result<tonic::transport::Channel, ConnectError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    let failed = |source| ConnectError {
        path: path.to_string(),
        source,
    };
    tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
        .map_err(failed)?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(failed)
}

/// Which claims to send to each driver for one operation, and the drivers whose call
/// `skipNodeOperations` leaves out (pure).
fn batches(
    claims: &[ClaimInfo],
    operation: &str,
) -> (BTreeMap<String, Vec<proto::Claim>>, Vec<String>) {
    let mut out: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for info in claims {
        for (driver, state) in &info.drivers {
            if state.skips(operation) {
                skipped.push(driver.clone());
                continue;
            }
            out.entry(driver.clone()).or_default().push(proto::Claim {
                namespace: info.namespace.clone(),
                uid: info.claim_uid.clone(),
                name: info.claim_name.clone(),
            });
        }
    }
    (out, skipped)
}

/// Upstream's words for a failed call: `rpc error: code = … desc = …`, or its deadline.
fn status_reason(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        metrics::grpc_code_name(status.code()),
        status.message()
    )
}

/// Checks a driver's answer against the claims sent (pure): every result names a claim sent
/// and carries no error, and none is missing; upstream's messages.
fn check_results<'a>(
    call: &'static str,
    batch: &'a [proto::Claim],
    results: impl IntoIterator<Item = (&'a String, &'a str)>,
) -> Result<(), DraError> {
    let mut answered = 0;
    for (claim_uid, error) in results {
        let claim = batch
            .iter()
            .find(|c| &c.uid == claim_uid)
            .ok_or_else(|| DraError::UnknownClaim(claim_uid.clone(), call))?;
        if !error.is_empty() {
            return Err(DraError::ClaimFailed {
                call,
                name: claim.name.clone(),
                reason: error.to_string(),
            });
        }
        answered += 1;
    }
    let unfinished = batch.len().saturating_sub(answered);
    if unfinished != 0 {
        return Err(DraError::Skipped {
            call,
            count: unfinished,
        });
    }
    Ok(())
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
        let claims = restored.into_iter().map(|c| (key_of(&c), c)).collect();
        DraManager {
            inner: Arc::new(Inner {
                checkpoint,
                client,
                claims: Mutex::new(claims),
                drivers: Mutex::new(HashMap::new()),
                ops: Mutex::new(HashMap::new()),
                health: Mutex::new(health::HealthCache::default()),
                health_watches: Mutex::new(HashMap::new()),
                status_pokes: std::sync::OnceLock::new(),
                wipe_scope: std::sync::OnceLock::new(),
                pending_wipes: Mutex::new(HashMap::new()),
                connection_watches: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Deletes every ResourceSlice of `node` now (no driver has registered yet), and from now
    /// on a gone driver's slices after [`slices::WIPING_DELAY`], until `stop`. Without an API
    /// server there is nothing to delete.
    pub(crate) fn start_slice_wipes(&self, node: &str, stop: tokio_util::sync::CancellationToken) {
        let Some(client) = self.inner.client.clone() else {
            return;
        };
        if self
            .inner
            .wipe_scope
            .set((node.to_string(), stop.clone()))
            .is_err()
        {
            return;
        }
        let node = node.to_string();
        tokio::spawn(async move { slices::wipe(client, &node, None, &stop).await });
    }

    /// The driver is usable again, or is not: its pending slice deletion is cancelled, or
    /// scheduled (one already scheduled keeps its time, as upstream's).
    fn driver_slices(&self, name: &str, usable: bool) {
        let mut pending = self
            .inner
            .pending_wipes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if usable {
            if let Some(earlier) = pending.remove(name) {
                earlier.cancel();
            }
            return;
        }
        if pending.get(name).is_some_and(|p| !p.is_cancelled()) {
            return;
        }
        let (Some(client), Some((node, stop))) =
            (self.inner.client.clone(), self.inner.wipe_scope.get())
        else {
            return;
        };
        let cancel = stop.child_token();
        pending.insert(name.to_string(), cancel.clone());
        let (node, driver) = (node.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(slices::WIPING_DELAY) => {}
            }
            tracing::info!(driver = %driver, "the DRA driver has not come back; deleting its ResourceSlices");
            slices::wipe(client, &node, Some(&driver), &cancel).await;
        });
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, ClaimInfo>> {
        self.inner.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn endpoint(&self, driver: &str) -> Option<String> {
        let drivers = self.inner.drivers.lock().unwrap_or_else(|e| e.into_inner());
        drivers.get(driver).cloned()
    }

    /// Writes the checkpoint; called with the cache's lock held, so writes land in the order
    /// of the changes.
    fn save(&self, cache: &BTreeMap<Key, ClaimInfo>) {
        let list: Vec<ClaimInfo> = cache.values().cloned().collect();
        if let Err(err) = state::write(&self.inner.checkpoint, &list) {
            tracing::error!(error = %err, "cannot write the DRA checkpoint");
        }
    }

    /// The claim's operation lock (made on first use; those nobody holds or waits for are
    /// dropped here, so the map stays as small as the claims in work).
    fn op_lock(&self, key: &Key) -> Arc<tokio::sync::Mutex<()>> {
        let mut ops = self.inner.ops.lock().unwrap_or_else(|e| e.into_inner());
        ops.retain(|_, lock| Arc::strong_count(lock) > 1);
        ops.entry(key.clone()).or_default().clone()
    }

    /// Waits for the claims' operation locks, in key order, so that two pods sharing claims
    /// never wait for each other.
    async fn lock_claims(&self, keys: impl IntoIterator<Item = Key>) -> Vec<(Key, ClaimGuard)> {
        let keys: BTreeSet<Key> = keys.into_iter().collect();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let guard = self.op_lock(&key).lock_owned().await;
            guards.push((key, guard));
        }
        guards
    }

    /// Watches whether the registered driver's socket still answers (see
    /// [`slices::watch_connection`]); a watch it had before stops.
    fn start_connection_watch(&self, name: &str, endpoint: &str) {
        let stop = match self.inner.wipe_scope.get() {
            Some((_, stop)) => stop.child_token(),
            None => return,
        };
        let mut watches = self
            .inner
            .connection_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(old) = watches.insert(name.to_string(), stop.clone()) {
            old.cancel();
        }
        let (manager, name, endpoint) = (self.clone(), name.to_string(), endpoint.to_string());
        tokio::spawn(async move {
            slices::watch_connection(&endpoint, &stop, |usable| {
                manager.driver_slices(&name, usable)
            })
            .await
        });
    }

    fn stop_connection_watch(&self, name: &str) {
        let mut watches = self
            .inner
            .connection_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(old) = watches.remove(name) {
            old.cancel();
        }
    }

    /// Records a driver's endpoint (`None`: it went away), and schedules or cancels the
    /// deletion of its slices.
    pub(crate) fn set_driver(&self, name: &str, endpoint: Option<&str>) {
        {
            let mut drivers = self.inner.drivers.lock().unwrap_or_else(|e| e.into_inner());
            match endpoint {
                Some(e) => drivers.insert(name.to_string(), e.to_string()),
                None => drivers.remove(name),
            };
        }
        self.driver_slices(name, endpoint.is_some());
    }

    /// A copy of the cache.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Vec<ClaimInfo> {
        self.claims().values().cloned().collect()
    }

    /// `dra_resource_claims_in_use`, from the cache as it is now.
    pub(crate) fn render_metrics(&self) -> String {
        metrics::render_claims_in_use(&metrics::claims_in_use(self.claims().values()))
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
            out.push(self.read_claim(pod, &namespace, &name, must_own).await?);
        }
        if let Some(name) = claims::extended_claim(pod) {
            out.push(self.read_claim(pod, &namespace, name, false).await?);
        }
        Ok(out)
    }

    /// Reads one claim and checks that the pod may use it now and its drivers are here.
    async fn read_claim(
        &self,
        pod: &Pod,
        namespace: &str,
        name: &str,
        must_own: bool,
    ) -> Result<ClaimInfo, DraError> {
        let claim = self.fetch(namespace, name).await?;
        claims::check_usable(pod, &claim, must_own)?;
        let info = claims::claim_info(&claim)?;
        for (driver, state) in &info.drivers {
            if !state.skips(PREPARE) && self.endpoint(driver).is_none() {
                return Err(DraError::NotRegistered(driver.clone()));
            }
        }
        Ok(info)
    }

    /// Prepares the pod's claims before its sandbox is made (upstream's `PrepareResources`,
    /// timed into `dra_operations_duration_seconds` for every pod, as upstream's).
    pub(crate) async fn prepare(&self, pod: &Pod) -> Result<(), DraError> {
        let started = crate::base::clock::instant();
        let result = self.prepare_pod(pod).await;
        metrics::record_operation(
            metrics::PREPARE_OPERATION,
            started.elapsed(),
            result.is_err(),
        );
        result
    }

    /// Claims already prepared for another pod only get the pod added. Each of the pod's
    /// claims is locked from the cache change to the drivers' answers: a second pod sharing
    /// one waits for the first's prepare and then finds it prepared.
    async fn prepare_pod(&self, pod: &Pod) -> Result<(), DraError> {
        if !claims::has_claims(pod) {
            return Ok(());
        }
        let read = self.read_claims(pod).await?;
        let _locked = self.lock_claims(read.iter().map(key_of)).await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let todo = self.add_pod(&uid, read)?;
        let (calls, skipped) = batches(&todo, PREPARE);
        metrics::record_skips(true, &skipped);
        for (driver, batch) in calls {
            self.prepare_batch(&driver, batch).await?;
        }
        let mut cache = self.claims();
        for info in &todo {
            if let Some(entry) = cache.get_mut(&key_of(info)) {
                entry.prepared = true;
            }
        }
        self.save(&cache);
        Ok(())
    }

    /// Puts the pod on its claims in the cache (caching the new ones) and checkpoints that
    /// before any driver is called; returns the claims still to prepare.
    fn add_pod(&self, uid: &str, read: Vec<ClaimInfo>) -> Result<Vec<ClaimInfo>, DraError> {
        let mut cache = self.claims();
        let mut todo = Vec::new();
        let mut result = Ok(());
        for info in read {
            let entry = cache.entry(key_of(&info)).or_insert_with(|| info.clone());
            if entry.claim_uid != info.claim_uid {
                result = Err(DraError::OldClaim {
                    name: info.claim_name,
                    uid: entry.claim_uid.clone(),
                });
                break;
            }
            entry.pod_uids.insert(uid.to_string());
            if !entry.prepared {
                todo.push(entry.clone());
            }
        }
        self.save(&cache);
        result.map(|()| todo)
    }

    /// One call to a driver, connecting first, within upstream's deadline; timed into
    /// `dra_grpc_operations_duration_seconds` however it ends.
    async fn call<T, F, Fut>(&self, driver: &str, call: &'static str, rpc: F) -> Result<T, DraError>
    where
        F: FnOnce(DraClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let endpoint = self
            .endpoint(driver)
            .ok_or_else(|| DraError::NotRegistered(driver.to_string()))?;
        let started = crate::base::clock::instant();
        let answer = tokio::time::timeout(CALL_TIMEOUT, async {
            match connect(&endpoint).await {
                Ok(client) => rpc(client).await,
                Err(err) => Err(tonic::Status::unavailable(err.to_string())),
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(
                "context deadline exceeded",
            ))
        });
        let code = answer
            .as_ref()
            .map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        metrics::record_call(driver, call, started.elapsed(), code);
        answer
            .map(tonic::Response::into_inner)
            .map_err(|status| DraError::Call {
                call,
                reason: status_reason(&status),
            })
    }

    async fn prepare_batch(&self, driver: &str, batch: Vec<proto::Claim>) -> Result<(), DraError> {
        let started = crate::base::clock::instant();
        let request = proto::NodePrepareResourcesRequest {
            claims: batch.clone(),
        };
        let answer = self
            .call(driver, PREPARE, |mut client| async move {
                client.node_prepare_resources(request).await
            })
            .await?;
        tracing::info!(
            driver,
            claims = batch.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "DRA driver prepared claims"
        );
        let results = answer
            .claims
            .iter()
            .map(|(uid, result)| (uid, result.error.as_str()));
        check_results(PREPARE, &batch, results)?;
        let mut cache = self.claims();
        for (claim_uid, result) in &answer.claims {
            let Some(claim) = batch.iter().find(|c| &c.uid == claim_uid) else {
                continue;
            };
            if let Some(entry) = cache.get_mut(&(claim.namespace.clone(), claim.name.clone())) {
                let state = entry.drivers.entry(driver.to_string()).or_default();
                state.devices = result.devices.iter().map(device_of).collect();
            }
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
    /// (upstream's `UnprepareResources`, timed for every pod as upstream's). A claim whose
    /// driver fails stays cached without pods and is tried again later
    /// ([`Self::retry_unprepared`]).
    pub(crate) async fn unprepare(&self, pod_uid: &str) -> Result<(), DraError> {
        let started = crate::base::clock::instant();
        let result = self.release(|uid| uid == pod_uid).await;
        metrics::record_operation(
            metrics::UNPREPARE_OPERATION,
            started.elapsed(),
            result.is_err(),
        );
        result
    }

    /// The pods the cache holds claims for.
    pub(crate) fn pod_uids(&self) -> BTreeSet<String> {
        let cache = self.claims();
        cache
            .values()
            .flat_map(|c| c.pod_uids.iter().cloned())
            .collect()
    }

    /// Releases the claims of pods that no longer exist, and nothing of which is left to tear
    /// down (they went while the agent was down): upstream's reconcile loop.
    pub(crate) async fn release_pods(&self, uids: &HashSet<String>) -> Result<(), DraError> {
        self.release(|uid| uids.contains(uid)).await
    }

    /// Takes the pods `gone` names off their claims; then unprepares the claims that left
    /// without pods (waiting for their locks) and any other claim no pod uses whose lock is
    /// free (one a failing driver kept).
    async fn release(&self, gone: impl Fn(&str) -> bool) -> Result<(), DraError> {
        let freed = {
            let mut cache = self.claims();
            let mut touched = false;
            let mut freed = Vec::new();
            for (key, info) in cache.iter_mut() {
                let before = info.pod_uids.len();
                info.pod_uids.retain(|uid| !gone(uid));
                if info.pod_uids.len() != before {
                    touched = true;
                    if info.pod_uids.is_empty() {
                        freed.push(key.clone());
                    }
                }
            }
            if !touched {
                return Ok(());
            }
            self.save(&cache);
            freed
        };
        let mut locked = self.lock_claims(freed).await;
        let others = self.try_lock_unused(&locked);
        locked.extend(others);
        self.unprepare_locked(locked).await
    }

    /// The claims no pod uses, but those in `held`, whose locks are free now (a busy one is in
    /// someone's prepare or unprepare already).
    fn try_lock_unused(&self, held: &[(Key, ClaimGuard)]) -> Vec<(Key, ClaimGuard)> {
        let unused: Vec<Key> = self
            .claims()
            .iter()
            .filter(|(key, info)| info.pod_uids.is_empty() && !held.iter().any(|(k, _)| k == *key))
            .map(|(key, _)| key.clone())
            .collect();
        unused
            .into_iter()
            .filter_map(|key| {
                let guard = self.op_lock(&key).try_lock_owned().ok()?;
                Some((key, guard))
            })
            .collect()
    }

    /// Unprepares the locked claims that are still cached without pods; those whose driver
    /// failed stay cached, the rest leave the cache.
    async fn unprepare_locked(&self, locked: Vec<(Key, ClaimGuard)>) -> Result<(), DraError> {
        let unused: Vec<ClaimInfo> = {
            let cache = self.claims();
            locked
                .iter()
                .filter_map(|(key, _)| cache.get(key))
                .filter(|c| c.pod_uids.is_empty())
                .cloned()
                .collect()
        };
        if unused.is_empty() {
            return Ok(());
        }
        let (calls, skipped) = batches(&unused, UNPREPARE);
        metrics::record_skips(false, &skipped);
        let mut first_err = None;
        let mut failed: Vec<String> = Vec::new();
        for (driver, batch) in calls {
            if let Err(err) = self.unprepare_batch(&driver, &batch).await {
                tracing::warn!(driver, error = %err, "cannot unprepare ResourceClaims; trying again later");
                failed.extend(batch.iter().map(|c| c.uid.clone()));
                first_err.get_or_insert(err);
            }
        }
        let mut cache = self.claims();
        for info in &unused {
            if !failed.contains(&info.claim_uid) {
                cache.remove(&key_of(info));
            }
        }
        self.save(&cache);
        first_err.map_or(Ok(()), Err)
    }

    async fn unprepare_batch(&self, driver: &str, batch: &[proto::Claim]) -> Result<(), DraError> {
        let request = proto::NodeUnprepareResourcesRequest {
            claims: batch.to_vec(),
        };
        let answer = self
            .call(driver, UNPREPARE, |mut client| async move {
                client.node_unprepare_resources(request).await
            })
            .await?;
        let results = answer
            .claims
            .iter()
            .map(|(uid, result)| (uid, result.error.as_str()));
        check_results(UNPREPARE, batch, results)?;
        tracing::info!(driver, claims = batch.len(), "DRA driver unprepared claims");
        Ok(())
    }

    /// Tries again to unprepare the claims no pod uses (a driver came back), but those
    /// another operation holds.
    pub(crate) async fn retry_unprepared(&self) {
        let locked = self.try_lock_unused(&[]);
        let _ = self.unprepare_locked(locked).await;
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
            let health = health_watch::pick_health_service(versions);
            tracing::info!(
                driver = name,
                endpoint,
                health_service = health.unwrap_or("none"),
                "DRA driver registered"
            );
            match health {
                Some(service) => self.manager.start_health_watch(name, endpoint, service),
                None => self.manager.stop_health_watch(name),
            }
            self.manager.start_connection_watch(name, endpoint);
            let manager = self.manager.clone();
            tokio::spawn(async move { manager.retry_unprepared().await });
            Ok(())
        })
    }

    fn deregister<'a>(&'a self, name: &'a str, _endpoint: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.manager.set_driver(name, None);
            self.manager.stop_health_watch(name);
            self.manager.stop_connection_watch(name);
            tracing::info!(driver = name, "DRA driver deregistered");
        })
    }
}

#[cfg(test)]
mod tests;
