//! The device plugin manager (`deviceplugin.v1beta1`) and the pod-resources API
//! (`podresources.v1`), as upstream's `cm/devicemanager` and `apis/podresources`.
//!
//! Plugins register on `<root-dir>/device-plugins/kubelet.sock` (`plugin.rs`); each one's
//! `ListAndWatch` stream keeps its resource's devices in the [`table::Table`], which gives the
//! Node's capacity and allocatable (`node` reads [`DeviceManager::capacity`]), admission's
//! device check (the sync loop calls [`DeviceManager::admit`] before the resource fit, as
//! upstream's device manager runs before its predicate handler) and, at container creation,
//! the devices a container gets (the runtime manager calls
//! [`DeviceManager::container_options`], which asks `GetPreferredAllocation` when offered,
//! `Allocate` once per container and `PreStartContainer` before every start when asked). The
//! allocations go to upstream's checkpoint file (`checkpoint.rs`) on every change, so a
//! restart keeps them. The pod-resources server (`podresources.rs`) reads the same table, and
//! so does each container's `allocatedResourcesStatus` ([`DeviceManager::resources_status`]);
//! a report that changes a held device's health pokes the pods holding it.
//!
//! Where Deckhand differs: upstream chooses the devices and calls `Allocate` during admission;
//! here admission checks the count (the sync loop admits without waiting on I/O) and the
//! choice and `Allocate` happen when the container is created, so a plugin that fails
//! `Allocate` gives `CreateContainerConfigError` on the container instead of an
//! `UnexpectedAdmissionError` refusal. One plugin per resource: a new registration replaces the
//! older one (upstream 1.37 keeps several endpoints per resource and promotes another when one
//! leaves).

mod authority;
pub(crate) mod checkpoint;
pub(crate) mod options;
pub(crate) mod plugin;
pub(crate) mod podresources;
pub(crate) mod table;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use options::ContainerOptions;
use plugin::Plugin;
use table::{Allocation, Table};

/// The generated protocols.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub(crate) mod api {
    /// `deviceplugin.v1beta1` (package `v1beta1`).
    pub(crate) mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
    /// `podresources.v1` (package `v1`).
    pub(crate) mod podresources {
        tonic::include_proto!("v1");
    }
}

/// The directory under the root dir that holds the sockets and the checkpoint.
pub(crate) const DIR: &str = "device-plugins";
/// How long `Allocate`, `GetPreferredAllocation` and `PreStartContainer` may take
/// (upstream's `KubeletPreStartContainerRPCTimeoutInSecs` for the latter; the same bound here).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The pods the node has admitted and not finished, by UID; `None` until every pod source has
/// reported (until then no allocation is dropped).
pub(crate) type ActivePods = Arc<dyn Fn() -> Option<HashSet<String>> + Send + Sync>;

/// Why a container's devices could not be given.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeviceError {
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthy(String),
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        resource: String,
        requested: usize,
        available: usize,
    },
    #[error("device plugin for {0} is not connected")]
    NotConnected(String),
    #[error("{call} of the device plugin for {resource} failed: {message}")]
    Call {
        call: &'static str,
        resource: String,
        message: String,
    },
    #[error(
        "pod {pod_uid} container {container} changed request for resource {resource} from {held} to {requested}"
    )]
    Changed {
        pod_uid: String,
        container: String,
        resource: String,
        held: usize,
        requested: usize,
    },
}

/// The shared state behind [`DeviceManager`].
pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    table: Mutex<Table>,
    plugins: Mutex<HashMap<String, Plugin>>,
    generations: std::sync::atomic::AtomicU64,
    /// Set once the pod pipeline exists; until then no allocation is dropped.
    active: Mutex<Option<ActivePods>>,
    /// Serialises allocations, so two containers never get the same device.
    allocating: tokio::sync::Mutex<()>,
    /// Where a health change of devices a pod holds is told (the pods' pokes), so its
    /// status shows it within a sync.
    status_pokes: std::sync::OnceLock<crate::base::resync_queue::Pokes>,
    /// Grows whenever a resource's device or healthy count changes, so the node status loop
    /// reports the new capacity at once instead of at its next period (upstream's kubelet
    /// waits for `nodeStatusUpdateFrequency`).
    capacity_version: tokio::sync::watch::Sender<u64>,
}

/// The device plugin manager; cheap to clone.
#[derive(Clone)]
pub(crate) struct DeviceManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(checkpoint::FILE_NAME)
    }

    /// Writes the checkpoint from the table as it stands.
    fn save(&self) {
        let data = {
            let table = self.lock();
            let healthy: BTreeMap<String, Vec<String>> = table
                .resources
                .iter()
                .map(|(name, r)| {
                    let ids = r
                        .devices
                        .values()
                        .filter(|d| d.healthy)
                        .map(|d| d.id.clone())
                        .collect();
                    (name.clone(), ids)
                })
                .collect();
            checkpoint::Data::of(&table.allocations, &healthy)
        };
        if let Err(e) = checkpoint::write(&self.checkpoint_path(), data) {
            tracing::error!(error = %e, "cannot write the device manager checkpoint");
        }
    }

    pub(crate) fn plugin_connected(
        &self,
        resource: &str,
        client: api::v1beta1::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
        options: api::v1beta1::DevicePluginOptions,
    ) -> u64 {
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        tracing::info!(
            resource,
            pre_start_required = options.pre_start_required,
            preferred_allocation = options.get_preferred_allocation_available,
            "device plugin connected"
        );
        self.plugins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                resource.to_string(),
                Plugin {
                    client,
                    options,
                    generation,
                },
            );
        let moved = {
            let mut table = self.lock();
            let before = table.counts(resource);
            table.connected(resource);
            table.counts(resource) != before
        };
        if moved {
            self.capacity_moved();
        }
        generation
    }

    pub(crate) fn devices_reported(&self, resource: &str, devices: Vec<table::Device>) {
        let healthy = devices.iter().filter(|d| d.healthy).count();
        tracing::info!(
            resource,
            total = devices.len(),
            healthy,
            "device plugin reported devices"
        );
        let (holders, moved) = {
            let mut table = self.lock();
            let before = table.counts(resource);
            let changed = table.health_changes(resource, &devices);
            table.update_devices(resource, devices);
            let moved = table.counts(resource) != before;
            (table.pods_holding(resource, &changed), moved)
        };
        self.save();
        if moved {
            self.capacity_moved();
        }
        self.poke(holders);
    }

    /// Tells the node status loop that capacity or allocatable changed.
    fn capacity_moved(&self) {
        self.capacity_version
            .send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Asks for a look at the pods (their devices' health changed).
    fn poke(&self, pods: std::collections::BTreeSet<String>) {
        let Some(pokes) = self.status_pokes.get() else {
            return;
        };
        for uid in pods {
            pokes.poke(&uid);
        }
    }

    pub(crate) fn plugin_gone(&self, resource: &str, generation: u64) {
        let mut plugins = self.plugins.lock().unwrap_or_else(|e| e.into_inner());
        if plugins
            .get(resource)
            .is_some_and(|p| p.generation == generation)
        {
            plugins.remove(resource);
            drop(plugins);
            tracing::warn!(
                resource,
                "device plugin disconnected; its devices are unhealthy until it registers again"
            );
            let (holders, moved) = {
                let mut table = self.lock();
                let turned = table.disconnected(resource, clock::instant());
                (table.pods_holding(resource, &turned), !turned.is_empty())
            };
            if moved {
                self.capacity_moved();
            }
            self.poke(holders);
        }
    }

    fn plugin(&self, resource: &str) -> Option<Plugin> {
        self.plugins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(resource)
            .cloned()
    }
}

impl DeviceManager {
    /// Serves the Registration service on `kubelet.sock` until `stop`.
    pub(crate) fn serve_registration(
        self,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        plugin::serve(self.inner, stop)
    }

    /// Where health changes are told (the pod pipeline's pokes); set once.
    pub(crate) fn set_status_pokes(&self, pokes: crate::base::resync_queue::Pokes) {
        let _ = self.inner.status_pokes.set(pokes);
    }

    /// The container's `allocatedResourcesStatus` entries for the devices it holds.
    pub(crate) fn resources_status(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Vec<k8s_openapi::api::core::v1::ResourceStatus> {
        self.inner.lock().resources_status(pod_uid, container)
    }

    /// Where the active pods come from (see [`ActivePods`]).
    pub(crate) fn set_active_pods(&self, active: ActivePods) {
        *self.inner.active.lock().unwrap_or_else(|e| e.into_inner()) = Some(active);
    }

    /// Makes `<root>/device-plugins`, removes stale sockets and reads the checkpoint (the
    /// resources it names stay in capacity at 0 until their plugins register again, as
    /// upstream).
    pub(crate) fn new(root_dir: &Path) -> DeviceManager {
        let dir = root_dir.join(DIR);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(path = %dir.display(), error = %e, "cannot make the device plugin directory");
        }
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750));
        }
        plugin::clean_directory(&dir);
        let mut table = Table::default();
        match checkpoint::read(&dir.join(checkpoint::FILE_NAME)) {
            Ok(Some(data)) => {
                table.allocations = data.allocations();
                table.restored = table
                    .allocations
                    .iter()
                    .map(|a| a.pod_uid.clone())
                    .collect();
                let now = clock::instant();
                for name in data.registered.iter().flatten().map(|(n, _)| n) {
                    table.connected(name);
                    table.disconnected(name, now);
                }
                tracing::info!(
                    allocations = table.allocations.len(),
                    "device manager checkpoint read"
                );
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "continuing without the device manager checkpoint; device allocations may not be up to date")
            }
        }
        DeviceManager {
            inner: Arc::new(Inner {
                dir,
                table: Mutex::new(table),
                plugins: Mutex::new(HashMap::new()),
                generations: std::sync::atomic::AtomicU64::new(0),
                active: Mutex::new(None),
                allocating: tokio::sync::Mutex::new(()),
                status_pokes: std::sync::OnceLock::new(),
                capacity_version: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// The current capacity version (see [`Inner::capacity_version`]); read before
    /// [`DeviceManager::capacity`], it is what [`DeviceManager::capacity_changed_since`] waits
    /// to move past.
    pub(crate) fn capacity_version(&self) -> u64 {
        *self.inner.capacity_version.borrow()
    }

    /// Resolves once the capacity version is no longer `seen` (at once if it already moved).
    pub(crate) fn capacity_changed_since(
        &self,
        seen: u64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.capacity_version.subscribe();
        async move {
            if rx.wait_for(|v| *v != seen).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Capacity and allocatable of the device resources, for the Node's status.
    pub(crate) fn capacity(&self) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
        let (capacity, allocatable, removed) = {
            let mut table = self.inner.lock();
            let before = table.removed.len();
            let (c, a) = table.capacity(clock::instant());
            (c, a, table.removed.len() != before)
        };
        if removed {
            self.inner.save();
        }
        (capacity, allocatable)
    }

    /// Admission's device check: `Err((reason, message))` when the pod asks for more devices
    /// of a registered resource than are free (`wanted`: the pod's effective requests;
    /// `used`: what the pods admitted before it request).
    pub(crate) fn admit(
        &self,
        pod_uid: &str,
        wanted: &BTreeMap<String, i64>,
        used: &dyn Fn(&str) -> i64,
    ) -> Result<(), (&'static str, String)> {
        self.inner
            .lock()
            .admit(pod_uid, wanted, used)
            .map_err(|e| (table::UNEXPECTED_ADMISSION_ERROR, e.to_string()))
    }

    /// The devices `container` of `pod` gets: allocated at its first creation (then kept, in
    /// the checkpoint), `PreStartContainer` called before each start when the plugin asks.
    /// `None` when the container asks for no device resource.
    pub(crate) async fn container_options(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Option<ContainerOptions>, DeviceError> {
        let wanted = self.device_limits(container);
        if wanted.is_empty() {
            return Ok(None);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let _serial = self.inner.allocating.lock().await;
        self.drop_inactive(&uid);
        let mut answers = Vec::new();
        for (resource, count) in wanted {
            let allocation = self
                .allocate(pod, &uid, container, &resource, count)
                .await?;
            let plugin = self.inner.plugin(&resource);
            if let Some(plugin) = plugin.filter(|p| p.options.pre_start_required) {
                let ids: Vec<String> = allocation.ids().map(str::to_string).collect();
                let mut client = plugin.client.clone();
                let call = client.pre_start_container(api::v1beta1::PreStartContainerRequest {
                    devices_ids: ids,
                });
                tokio::time::timeout(CALL_TIMEOUT, call)
                    .await
                    .map_err(|_| call_error("PreStartContainer", &resource, "timed out"))?
                    .map_err(|e| call_error("PreStartContainer", &resource, e.message()))?;
            }
            let answer =
                api::v1beta1::ContainerAllocateResponse::decode(allocation.response.as_slice())
                    .unwrap_or_default();
            answers.push(answer);
        }
        Ok(Some(ContainerOptions::merge(&answers)))
    }

    /// The container's limits of device resources (upstream allocates by limits; for an
    /// extended resource request and limit are equal).
    fn device_limits(&self, container: &Container) -> BTreeMap<String, usize> {
        let table = self.inner.lock();
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        limits
            .into_iter()
            .flatten()
            .filter(|(name, _)| table.is_device_resource(name))
            .filter_map(|(name, q)| {
                let n = crate::base::podspec::quantity::parse(&q.0).ok()?.value();
                (n > 0).then(|| (name.clone(), usize::try_from(n).unwrap_or(0)))
            })
            .collect()
    }

    fn drop_inactive(&self, current: &str) {
        let provider = self
            .inner
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(mut active) = provider.and_then(|p| p()) else {
            return;
        };
        active.insert(current.to_string());
        if self.inner.lock().retain_active(&active) {
            self.inner.save();
        }
    }

    /// The container's allocation of one resource: the one it holds, or a new one.
    async fn allocate(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        resource: &str,
        count: usize,
    ) -> Result<Allocation, DeviceError> {
        if let Some(held) = self
            .inner
            .lock()
            .held(uid, &container.name, resource)
            .cloned()
        {
            let n = held.ids().count();
            if n != count {
                return Err(DeviceError::Changed {
                    pod_uid: uid.to_string(),
                    container: container.name.clone(),
                    resource: resource.to_string(),
                    held: n,
                    requested: count,
                });
            }
            return Ok(held);
        }
        let keeps = keeping_containers(pod);
        let (reuse, free) = {
            let table = self.inner.lock();
            let Some(entry) = table.resources.get(resource) else {
                return Err(DeviceError::Unregistered(resource.to_string()));
            };
            if !entry.devices.values().any(|d| d.healthy) {
                return Err(DeviceError::NoHealthy(resource.to_string()));
            }
            table.free_for(resource, uid, &|c| keeps.contains(c))
        };
        let plugin = self
            .inner
            .plugin(resource)
            .ok_or_else(|| DeviceError::NotConnected(resource.to_string()))?;
        let preferred = if plugin.options.get_preferred_allocation_available {
            preferred(&plugin, resource, &reuse, &free, count).await
        } else {
            None
        };
        let ids = table::choose(count, &reuse, &free, preferred.as_deref()).ok_or_else(|| {
            DeviceError::Unavailable {
                resource: resource.to_string(),
                requested: count,
                available: reuse.len() + free.len(),
            }
        })?;
        let mut client = plugin.client.clone();
        let request = api::v1beta1::AllocateRequest {
            container_requests: vec![api::v1beta1::ContainerAllocateRequest {
                devices_ids: ids.clone(),
            }],
        };
        let answer = tokio::time::timeout(CALL_TIMEOUT, client.allocate(request))
            .await
            .map_err(|_| call_error("Allocate", resource, "timed out"))?
            .map_err(|e| call_error("Allocate", resource, e.message()))?
            .into_inner();
        let Some(response) = answer.container_responses.into_iter().next() else {
            return Err(call_error(
                "Allocate",
                resource,
                "no response for the container",
            ));
        };
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        tracing::info!(pod = %pod_name, pod_uid = %uid, container = %container.name, resource, devices = ?ids, "devices allocated");
        let allocation = {
            let mut table = self.inner.lock();
            let allocation = Allocation {
                pod_uid: uid.to_string(),
                container: container.name.clone(),
                resource: resource.to_string(),
                devices: table.by_numa(resource, &ids),
                response: response.encode_to_vec(),
            };
            table.record(allocation.clone());
            allocation
        };
        self.inner.save();
        Ok(allocation)
    }

    /// The devices each container of the pod holds: resource → (device IDs, NUMA nodes).
    pub(crate) fn devices_of(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Vec<(String, Vec<String>, Vec<i64>)> {
        let table = self.inner.lock();
        table
            .allocations
            .iter()
            .filter(|a| a.pod_uid == pod_uid && a.container == container)
            .map(|a| {
                let numa = a
                    .devices
                    .keys()
                    .copied()
                    .filter(|n| *n != table::NO_TOPOLOGY)
                    .collect();
                (
                    a.resource.clone(),
                    a.ids().map(str::to_string).collect(),
                    numa,
                )
            })
            .collect()
    }

    /// Every healthy device of every resource, with its NUMA nodes (pod-resources'
    /// `GetAllocatableResources`).
    pub(crate) fn allocatable_devices(&self) -> Vec<(String, String, Vec<i64>)> {
        let table = self.inner.lock();
        table
            .resources
            .iter()
            .flat_map(|(name, r)| {
                r.devices
                    .values()
                    .filter(|d| d.healthy)
                    .map(move |d| (name.clone(), d.id.clone(), d.numa.clone()))
            })
            .collect()
    }
}

/// Asks the plugin which devices it prefers; `None` when it fails (upstream fails the
/// allocation; here the choice falls back to ID order and a warning is logged).
async fn preferred(
    plugin: &Plugin,
    resource: &str,
    reuse: &[String],
    free: &[String],
    count: usize,
) -> Option<Vec<String>> {
    let mut client = plugin.client.clone();
    let request = api::v1beta1::PreferredAllocationRequest {
        container_requests: vec![api::v1beta1::ContainerPreferredAllocationRequest {
            available_device_i_ds: reuse.iter().chain(free).cloned().collect(),
            must_include_device_i_ds: Vec::new(),
            allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
        }],
    };
    match tokio::time::timeout(CALL_TIMEOUT, client.get_preferred_allocation(request)).await {
        Ok(Ok(answer)) => answer
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds),
        Ok(Err(e)) => {
            tracing::warn!(resource, error = %e.message(), "GetPreferredAllocation failed; choosing devices in ID order");
            None
        }
        Err(_) => {
            tracing::warn!(
                resource,
                "GetPreferredAllocation timed out; choosing devices in ID order"
            );
            None
        }
    }
}

fn call_error(call: &'static str, resource: &str, message: &str) -> DeviceError {
    DeviceError::Call {
        call,
        resource: resource.to_string(),
        message: message.to_string(),
    }
}

/// The containers that keep their devices while the pod runs: app containers and sidecars
/// (init containers that always restart). Other init containers' devices are reused.
fn keeping_containers(pod: &Pod) -> HashSet<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return HashSet::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.clone());
    spec.containers
        .iter()
        .map(|c| c.name.clone())
        .chain(sidecars)
        .collect()
}

#[cfg(test)]
mod tests;
