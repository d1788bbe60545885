//! The node side of CSI, as upstream's `pkg/volume/csi`: the drivers registered through the
//! plugin watcher (`kubelet::plugin_watcher`, type `CSIPlugin`), each one's `NodeGetInfo`
//! made into the node's `CSINode` object and its Node's `csi.volume.kubernetes.io/nodeid`
//! annotation and topology labels ([`node_info`]), and the volumes they serve ([`mount`]):
//! CSI inline ephemeral pod volumes end to end, and persistent volumes through
//! `VolumeManager::set_up_csi_persistent`, the entry point the PVC → PV resolution calls.
//! A CSIDriver's `tokenRequests` hand the pod's service-account tokens to the driver
//! ([`tokens`]); its `requiresRepublish` has the volumes published again on each sync of a
//! running pod ([`republish`]); a claim in use whose volume grew is expanded online
//! ([`expand`] decides, [`expander`] calls the driver).
//!
//! The registered drivers are one store for the whole process, as upstream's `csiDrivers`:
//! the volume code reaches them from its blocking threads without being handed them. What
//! the volume code reads of the cluster (`CSIDriver` objects, secrets) goes through the
//! [`CsiHost`] the daemon installs once; without one (standalone) no CSIDriver is known.

pub(crate) mod attach;
pub(crate) mod client;
pub(crate) mod expand;
pub(crate) mod expander;
pub(crate) mod mount;
pub(crate) mod node_info;
pub(crate) mod republish;
pub(crate) mod stats;
pub(crate) mod tokens;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock, RwLock};

use futures::future::BoxFuture;

use crate::kubelet::plugin_watcher::{HandlerError, PluginHandler};

/// The CSI Node service (`proto/csi/v1/csi.proto`).
pub(crate) mod proto {
    #![allow(unreachable_pub, clippy::all)]
    tonic::include_proto!("csi.v1");
}

/// Upstream's plugin name, and the directory name of its pod volumes.
pub(crate) const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";
pub(crate) const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";

/// One registered driver: where its Node service is, and the highest CSI version it speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Driver {
    pub endpoint: String,
    pub version: (u64, u64, u64),
}

/// The registered drivers by name.
static DRIVERS: RwLock<Option<HashMap<String, Driver>>> = RwLock::new(None);

pub(crate) fn driver(name: &str) -> Option<Driver> {
    let drivers = DRIVERS.read().unwrap_or_else(|e| e.into_inner());
    drivers.as_ref().and_then(|d| d.get(name).cloned())
}

fn set_driver(name: &str, driver: Option<Driver>) {
    let mut drivers = DRIVERS.write().unwrap_or_else(|e| e.into_inner());
    let map = drivers.get_or_insert_with(HashMap::new);
    match driver {
        Some(d) => map.insert(name.to_string(), d),
        None => map.remove(name),
    };
}

/// What the CSI code reads of the cluster and the node, installed once by the daemon.
#[derive(Clone)]
pub(crate) struct CsiHost {
    pub node_name: String,
    /// `None` standalone.
    pub client: Option<kube::Client>,
    /// The node's token manager (the projected volumes' too); `None` standalone.
    pub tokens: Option<crate::kubelet::api_objects::TokenManager>,
}

static HOST: OnceLock<CsiHost> = OnceLock::new();

/// Installs the host (the first call wins; later ones are ignored).
pub(crate) fn install_host(host: CsiHost) {
    let _ = HOST.set(host);
}

pub(crate) fn host() -> Option<&'static CsiHost> {
    HOST.get()
}

/// Why a CSI volume could not be set up or torn down; the messages are upstream's, with its
/// `kubernetes.io/csi: ` prefix where upstream's `log()` adds it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CsiError {
    #[error("volume mode {mode:?} not supported by driver {driver} (no CSIDriver object)")]
    NoCsiDriver { mode: &'static str, driver: String },
    #[error("volume mode {mode:?} not supported by driver {driver} (only supports {modes:?})")]
    LifecycleMode {
        mode: &'static str,
        driver: String,
        modes: Vec<String>,
    },
    #[error(
        "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {0} not found in the list of registered CSI drivers"
    )]
    NotRegistered(String),
    #[error(
        "kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: driver name {0} not found in the list of registered CSI drivers"
    )]
    NotRegisteredStage(String),
    /// An attachable volume the controller has not attached to this node yet.
    #[error(transparent)]
    NotAttached(#[from] attach::NotAttached),
    #[error("reading the {what} for the volume's attachment: {reason}")]
    ReadAttachment { what: &'static str, reason: String },
    #[error("fetching {what} {namespace}/{name} failed: {reason}")]
    Secret {
        what: &'static str,
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("kubernetes.io/csi: {call} failed: {reason}")]
    Call { call: &'static str, reason: String },
    /// `NodeExpandVolume` failed; the code decides what the claim is told (upstream's text).
    #[error("Expander.NodeExpand failed to expand the volume : {reason}")]
    Expand { code: tonic::Code, reason: String },
    #[error("NodeExpand is not supported by the CSI driver {0}")]
    ExpandNotSupported(String),
    #[error("kubernetes.io/csi: {what} {path}: {reason}")]
    Files {
        what: &'static str,
        path: String,
        reason: String,
    },
    /// A token of the CSIDriver's `tokenRequests` could not be had (upstream's message, its
    /// spelling included).
    #[error(
        "kubernetes.io/csi: mounter.SetUpAt failed to get service accoount token attributes: {0}"
    )]
    Tokens(#[source] crate::kubelet::api_objects::TokenError),
    #[error("reading CSIDriver {driver}: {reason}")]
    ReadDriver { driver: String, reason: String },
    #[error("no async runtime to call the CSI driver from")]
    NoRuntime,
}

impl CsiError {
    /// Upstream fails these in `NewMounter`, before `SetUp` (its event says so).
    pub(crate) fn is_new_mounter(&self) -> bool {
        matches!(
            self,
            CsiError::NoCsiDriver { .. } | CsiError::LifecycleMode { .. }
        )
    }
}

/// Runs `fut` on the runtime from a blocking thread (the volume code runs on those) and
/// waits for it.
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, CsiError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| CsiError::NoRuntime)?;
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| CsiError::NoRuntime)
}

/// `1.2.3` or `v1.2.3` (upstream's generic version parse, which also takes two parts).
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let text = text.strip_prefix('v').unwrap_or(text);
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = match parts.next() {
        Some(p) => p?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor, patch))
}

/// The highest CSI version a driver announces that this node speaks (1.x), as upstream's
/// `validateVersions`; `existing`: the highest version of a driver of that name already
/// registered.
pub(crate) fn validate_versions(
    name: &str,
    versions: &[String],
    existing: Option<(u64, u64, u64)>,
) -> Result<(u64, u64, u64), HandlerError> {
    if versions.is_empty() {
        return Err(HandlerError(format!(
            "kubernetes.io/csi: ValidatePlugin for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
        )));
    }
    let highest = versions
        .iter()
        .filter_map(|v| parse_version(v))
        .filter(|v| v.0 == 1)
        .max()
        .ok_or_else(|| {
            HandlerError(format!(
                "kubernetes.io/csi: ValidatePlugin for CSI driver {name:?} failed. None of the versions specified {versions:?} are supported. err=none of the CSI versions reported by this driver are supported"
            ))
        })?;
    if let Some(have) = existing.filter(|have| *have >= highest) {
        return Err(HandlerError(format!(
            "kubernetes.io/csi: ValidatePlugin for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: \"{}.{}.{}\"",
            have.0, have.1, have.2
        )));
    }
    Ok(highest)
}

/// The `CSIPlugin` handler of the plugin watcher (upstream's `RegistrationHandler`).
pub(crate) struct CsiHandler {
    pub host: CsiHost,
}

impl CsiHandler {
    pub(crate) fn new(host: CsiHost) -> Arc<Self> {
        Arc::new(CsiHandler { host })
    }

    async fn register_driver(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        let version = validate_versions(name, versions, None)?;
        set_driver(
            name,
            Some(Driver {
                endpoint: endpoint.to_string(),
                version,
            }),
        );
        let info = match client::NodeClient::connect(endpoint).await {
            Ok(mut c) => c.node_get_info().await,
            Err(e) => Err(e),
        };
        let info = match info {
            Ok(info) => info,
            Err(err) => {
                set_driver(name, None);
                return Err(HandlerError(format!(
                    "kubernetes.io/csi: RegisterPlugin error -- nodeGetInfo error: {err}"
                )));
            }
        };
        if let Some(kube) = &self.host.client {
            let installed = node_info::install(kube, &self.host.node_name, name, &info).await;
            if let Err(err) = installed {
                set_driver(name, None);
                return Err(HandlerError(format!(
                    "kubernetes.io/csi: RegisterPlugin error -- failed to update node info: {err}"
                )));
            }
        }
        tracing::info!(driver = %name, endpoint, node_id = %info.node_id, "CSI driver registered");
        Ok(())
    }
}

impl PluginHandler for CsiHandler {
    fn validate(
        &self,
        name: &str,
        _endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        validate_versions(name, versions, driver(name).map(|d| d.version)).map(|_| ())
    }

    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.register_driver(name, endpoint, versions))
    }

    fn deregister<'a>(&'a self, name: &'a str, _endpoint: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            set_driver(name, None);
            if let Some(kube) = &self.host.client
                && let Err(err) = node_info::uninstall(kube, &self.host.node_name, name).await
            {
                tracing::warn!(driver = %name, error = %err, "cannot remove the driver from the node's CSINode");
            }
            tracing::info!(driver = %name, "CSI driver deregistered");
        })
    }
}

#[cfg(test)]
mod tests;
