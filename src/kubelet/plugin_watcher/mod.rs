//! The plugin watcher, as upstream's `pkg/kubelet/pluginmanager`: node plugins (CSI node
//! plugins today, DRA drivers later) announce themselves by a Unix socket in
//! `<root-dir>/plugins_registry/` that serves the `pluginregistration.v1` `Registration`
//! service. For each socket found the watcher asks `GetInfo`, hands the plugin to the handler
//! of its `type` (which checks the versions and registers it), and tells the plugin the
//! outcome with `NotifyRegistrationStatus`, in upstream's words. A socket that goes away is
//! deregistered; a socket made again (another inode or time) is deregistered and registered
//! anew. A registration that fails is tried again after a back-off (500 ms doubling to
//! 2 m 2 s, upstream's operation back-off), or at once when the socket is made again.
//!
//! The directory is looked at once a second, upstream's reconciler period (upstream's
//! fsnotify events only feed that reconciler, so a plugin is not registered any sooner
//! there); one look is a directory walk, and the loop never spins. The watcher knows no
//! plugin type: handlers are given by type name ([`PluginHandler`]).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::base::clock;

/// The `pluginregistration` protocol (`proto/pluginregistration/v1/api.proto`).
pub(crate) mod proto {
    #![allow(unreachable_pub, clippy::all)]
    tonic::include_proto!("pluginregistration");
}

/// The `type` a CSI node plugin announces.
pub(crate) const CSI_PLUGIN: &str = "CSIPlugin";
/// How often the directory is looked at (upstream's reconciler period).
const LOOP_PERIOD: Duration = Duration::from_secs(1);
/// How long a plugin may take to answer one registration call (upstream's dial timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait after a failed registration, and the longest (upstream's operation back-off).
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_millis(122_000);
/// How deep below the registry the walk looks for sockets.
const MAX_DEPTH: usize = 4;

/// A handler refused or failed a plugin; the message is what the plugin is told.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct HandlerError(pub String);

/// What a plugin type's handler does with the plugins of its type (upstream's
/// `cache.PluginHandler`).
pub(crate) trait PluginHandler: Send + Sync {
    /// Whether the plugin may register (its versions, a name already taken).
    fn validate(&self, name: &str, endpoint: &str, versions: &[String])
    -> Result<(), HandlerError>;
    /// Registers a validated plugin.
    fn register<'a>(
        &'a self,
        name: &'a str,
        endpoint: &'a str,
        versions: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
    /// The plugin's socket went away.
    fn deregister<'a>(&'a self, name: &'a str, endpoint: &'a str) -> BoxFuture<'a, ()>;
}

/// The handlers by plugin type.
pub(crate) type Handlers = HashMap<String, Arc<dyn PluginHandler>>;

/// One socket as found: what tells a socket made again from the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SocketId {
    pub inode: u64,
    pub mtime_ns: i128,
}

/// A plugin the watcher registered (upstream's actual state of the world).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registered {
    pub id: SocketId,
    pub kind: String,
    pub name: String,
    pub endpoint: String,
}

/// A socket whose registration failed: not tried again before `until` unless it changes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failed {
    pub id: SocketId,
    pub until: Instant,
    pub wait: Duration,
}

/// One thing to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Deregister(PathBuf),
    Register(PathBuf),
}

/// What to do about the sockets found against those registered and those backing off
/// (pure): deregister what is gone or was made again, then register what is new, changed
/// or whose back-off ended.
pub(crate) fn reconcile(
    found: &BTreeMap<PathBuf, SocketId>,
    registered: &BTreeMap<PathBuf, Registered>,
    failed: &HashMap<PathBuf, Failed>,
    now: Instant,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for (path, plugin) in registered {
        if found.get(path) != Some(&plugin.id) {
            steps.push(Step::Deregister(path.clone()));
        }
    }
    for (path, id) in found {
        if registered.get(path).is_some_and(|r| r.id == *id) {
            continue;
        }
        if failed
            .get(path)
            .is_some_and(|f| f.id == *id && f.until > now)
        {
            continue;
        }
        steps.push(Step::Register(path.clone()));
    }
    steps
}

/// The next back-off after a failure, given the last one (pure).
pub(crate) fn next_backoff(last: Option<&Failed>, id: SocketId) -> Duration {
    match last {
        Some(f) if f.id == id => (f.wait * 2).min(BACKOFF_MAX),
        _ => BACKOFF_FIRST,
    }
}

/// The sockets under `dir` (not following links, hidden entries skipped as upstream does).
pub(crate) fn scan(dir: &Path) -> BTreeMap<PathBuf, SocketId> {
    let mut out = BTreeMap::new();
    walk(dir, 0, &mut out);
    out
}

fn walk(dir: &Path, depth: usize, out: &mut BTreeMap<PathBuf, SocketId>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let kind = meta.file_type();
        if kind.is_socket() {
            let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
            out.insert(
                entry.path(),
                SocketId {
                    inode: meta.ino(),
                    mtime_ns,
                },
            );
        } else if kind.is_dir() && depth < MAX_DEPTH {
            walk(&entry.path(), depth + 1, out);
        }
    }
}

/// Why a plugin was not registered; shown to the plugin as upstream words it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("failed to dial socket {socket}, err: {reason}")]
    Dial { socket: String, reason: String },
    #[error(
        "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {socket}, err: {reason}"
    )]
    GetInfo { socket: String, reason: String },
    #[error(
        "RegisterPlugin error -- no handler registered for plugin type: {kind} at socket {socket}"
    )]
    NoHandler { kind: String, socket: String },
    #[error("RegisterPlugin error -- plugin validation failed with err: {0}")]
    Validation(HandlerError),
    #[error("RegisterPlugin error -- plugin registration failed with err: {0}")]
    Registration(HandlerError),
}

type RegistrationClient = proto::registration_client::RegistrationClient<tonic::transport::Channel>;

async fn dial(socket: &Path) -> Result<RegistrationClient, RegisterError> {
    let shown = socket.display().to_string();
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{shown}"))
        .map_err(|e| RegisterError::Dial {
            socket: shown.clone(),
            reason: e.to_string(),
        })?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .map_err(|e| RegisterError::Dial {
            socket: shown,
            reason: e.to_string(),
        })?;
    Ok(proto::registration_client::RegistrationClient::new(channel))
}

/// Registers the plugin behind one socket (upstream's `GenerateRegisterPluginFunc`).
pub(crate) async fn register(
    socket: &Path,
    id: SocketId,
    handlers: &Handlers,
) -> Result<Registered, RegisterError> {
    let shown = socket.display().to_string();
    let mut client = dial(socket).await?;
    let info = client
        .get_info(proto::InfoRequest {})
        .await
        .map_err(|status| RegisterError::GetInfo {
            socket: shown.clone(),
            reason: status.message().to_string(),
        })?
        .into_inner();
    let outcome = hand_over(&info, &shown, handlers).await;
    let status = proto::RegistrationStatus {
        plugin_registered: outcome.is_ok(),
        error: outcome
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default(),
    };
    if let Err(status) = client.notify_registration_status(status).await {
        tracing::warn!(socket = %shown, error = %status.message(), "cannot tell the plugin its registration status");
    }
    let endpoint = outcome?;
    Ok(Registered {
        id,
        kind: info.r#type,
        name: info.name,
        endpoint,
    })
}

/// Validates and registers with the handler of the plugin's type; returns the endpoint.
async fn hand_over(
    info: &proto::PluginInfo,
    socket: &str,
    handlers: &Handlers,
) -> Result<String, RegisterError> {
    let handler = handlers
        .get(&info.r#type)
        .ok_or_else(|| RegisterError::NoHandler {
            kind: info.r#type.clone(),
            socket: socket.to_string(),
        })?;
    let endpoint = if info.endpoint.is_empty() {
        socket.to_string()
    } else {
        info.endpoint.clone()
    };
    handler
        .validate(&info.name, &endpoint, &info.supported_versions)
        .map_err(RegisterError::Validation)?;
    handler
        .register(&info.name, &endpoint, &info.supported_versions)
        .await
        .map_err(RegisterError::Registration)?;
    Ok(endpoint)
}

/// Watches `dir` until cancelled.
pub(crate) async fn run(dir: PathBuf, handlers: Handlers, cancel: CancellationToken) {
    if let Err(err) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %err, "cannot make the plugin registration directory");
    }
    tracing::info!(dir = %dir.display(), "plugin watcher started");
    let mut registered: BTreeMap<PathBuf, Registered> = BTreeMap::new();
    let mut failed: HashMap<PathBuf, Failed> = HashMap::new();
    loop {
        let found = scan(&dir);
        failed.retain(|path, _| found.contains_key(path));
        for step in reconcile(&found, &registered, &failed, clock::instant()) {
            match step {
                Step::Deregister(path) => {
                    if let Some(plugin) = registered.remove(&path) {
                        deregister(&path, &plugin, &handlers).await;
                    }
                }
                Step::Register(path) => {
                    let Some(&id) = found.get(&path) else {
                        continue;
                    };
                    match register(&path, id, &handlers).await {
                        Ok(plugin) => {
                            tracing::info!(socket = %path.display(), plugin_type = %plugin.kind, plugin_name = %plugin.name, endpoint = %plugin.endpoint, "plugin registered");
                            failed.remove(&path);
                            registered.insert(path, plugin);
                        }
                        Err(err) => {
                            let wait = next_backoff(failed.get(&path), id);
                            tracing::warn!(socket = %path.display(), error = %err, retry_in_ms = wait.as_millis() as u64, "plugin registration failed");
                            let until = clock::instant() + wait;
                            failed.insert(path, Failed { id, until, wait });
                        }
                    }
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(LOOP_PERIOD) => {}
        }
    }
}

async fn deregister(path: &Path, plugin: &Registered, handlers: &Handlers) {
    tracing::info!(socket = %path.display(), plugin_type = %plugin.kind, plugin_name = %plugin.name, "plugin socket gone; deregistering");
    if let Some(handler) = handlers.get(&plugin.kind) {
        handler.deregister(&plugin.name, &plugin.endpoint).await;
    }
}

#[cfg(test)]
mod tests;
