//! Pod sources: static-pod manifests from a directory or file and from an HTTP URL, turned
//! into full pods (defaults, static-pod conventions) and merged, like upstream's `PodConfig`,
//! into one stream of [`PodChange`]s keyed by pod UID.
//!
//! Each source task sends full snapshots of its pods; the merger keeps the last snapshot per
//! source and emits only the differences. [`SourcesReady`] turns true once every configured
//! source delivered a first snapshot; [`SourceProblems`] lists the manifests that are
//! currently broken.

pub(crate) mod apiserver;
pub mod defaults;
pub(crate) mod file;
pub(crate) mod http;
pub(crate) mod manifest;
pub(crate) mod merge;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub use crate::base::podspec::full_name;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::defaults::ManifestOrigin;
use self::manifest::ManifestError;
use self::validate::ValidationError;
pub use self::validate::validate_security::NodeSecurity;

pub use crate::base::podspec::origin::{SOURCE_API, SOURCE_FILE, SOURCE_HTTP};

/// One change to the set of pods the node should run.
#[derive(Clone, Debug)]
pub enum PodChange {
    Add(Arc<Pod>),
    Update(Arc<Pod>),
    Remove(Arc<Pod>),
}

impl PodChange {
    /// The pod this change carries.
    pub fn pod(&self) -> &Arc<Pod> {
        match self {
            PodChange::Add(p) | PodChange::Update(p) | PodChange::Remove(p) => p,
        }
    }
}

/// Where pods come from, as configured.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    pub node_name: String,
    pub static_pod_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub static_pod_url: Option<String>,
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    pub http_check_frequency: Duration,
    /// What this node can enforce, detected once at start; every manifest is checked against it.
    pub security: Arc<NodeSecurity>,
    /// With `--kubeconfig`: the client the pods bound to this node are watched with.
    pub api: Option<apiserver::ApiSourceConfig>,
}

struct ReadyInner {
    expected: BTreeSet<&'static str>,
    seen: Mutex<BTreeSet<&'static str>>,
}

/// Cheap to clone; true once every configured source has delivered its first snapshot.
#[derive(Clone)]
pub struct SourcesReady {
    inner: Arc<ReadyInner>,
}

impl SourcesReady {
    pub(crate) fn new(expected: impl IntoIterator<Item = &'static str>) -> Self {
        SourcesReady {
            inner: Arc::new(ReadyInner {
                expected: expected.into_iter().collect(),
                seen: Mutex::new(BTreeSet::new()),
            }),
        }
    }

    pub(crate) fn mark_seen(&self, source: &'static str) {
        lock(&self.inner.seen).insert(source);
    }

    /// True once every configured source has delivered a first snapshot.
    pub fn all_ready(&self) -> bool {
        let seen = lock(&self.inner.seen);
        self.inner.expected.iter().all(|s| seen.contains(s))
    }
}

impl std::fmt::Debug for SourcesReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcesReady")
            .field("expected", &self.inner.expected)
            .field("seen", &*lock(&self.inner.seen))
            .finish()
    }
}

/// Current manifest problems, for status endpoints/metrics: path or URL → message.
#[derive(Clone, Default)]
pub struct SourceProblems {
    inner: Arc<Mutex<BTreeMap<String, String>>>,
}

impl SourceProblems {
    /// A copy of the current problems.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        lock(&self.inner).clone()
    }

    pub(crate) fn set(&self, key: &str, message: &str) {
        lock(&self.inner).insert(key.to_string(), message.to_string());
    }

    pub(crate) fn clear(&self, key: &str) {
        lock(&self.inner).remove(key);
    }

    /// Replace the problems a source owns (`owned`, updated in place) with `current`.
    pub(crate) fn replace(&self, owned: &mut BTreeSet<String>, current: &BTreeMap<String, String>) {
        let mut map = lock(&self.inner);
        for key in owned.iter() {
            if !current.contains_key(key) {
                map.remove(key);
            }
        }
        for (key, message) in current {
            map.insert(key.clone(), message.clone());
        }
        *owned = current.keys().cloned().collect();
    }
}

impl std::fmt::Debug for SourceProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.snapshot()).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A full snapshot of one source's pods, from a source task to the merger.
#[derive(Debug)]
pub(crate) struct SourceSnapshot {
    pub source: &'static str,
    pub pods: Vec<Pod>,
}

/// Why a manifest yielded no pods.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Decode(#[from] ManifestError),
    #[error("{origin}: invalid pod {name:?}: {}", validate::join_errors(.errors))]
    Invalid {
        origin: String,
        name: String,
        errors: Vec<ValidationError>,
    },
}

/// Pods ready to run from one manifest, and the fields nobody understood.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub pods: Vec<Pod>,
    pub unknown_fields: Vec<String>,
}

/// Decode a manifest, apply static-pod conventions and API defaults, and validate against what
/// this node can enforce (`security`). One invalid pod fails the whole manifest (as upstream
/// does for lists).
pub fn load_static_pods(
    bytes: &[u8],
    origin: ManifestOrigin<'_>,
    node_name: &str,
    security: &NodeSecurity,
    seen: SystemTime,
) -> Result<Loaded, LoadError> {
    let origin_text = match origin {
        ManifestOrigin::File(path) => path.display().to_string(),
        ManifestOrigin::Http(url) => url.to_string(),
    };
    let allow_list = matches!(origin, ManifestOrigin::Http(_));
    let decoded = manifest::decode(bytes, &origin_text, allow_list)?;
    let from_list = decoded.from_list;
    let mut pods = Vec::with_capacity(decoded.pods.len());
    for (i, mut pod) in decoded.pods.into_iter().enumerate() {
        let prefix = if from_list {
            format!("items[{i}].")
        } else {
            String::new()
        };
        let original_name = pod.metadata.name.clone().unwrap_or_default();
        if original_name.is_empty() {
            return Err(LoadError::Invalid {
                origin: origin_text,
                name: String::new(),
                errors: vec![ValidationError {
                    field: format!("{prefix}metadata.name"),
                    reason: "required".into(),
                }],
            });
        }
        defaults::apply_static_pod_conventions(&mut pod, node_name, origin, seen);
        defaults::apply_api_defaults(&mut pod);
        if let Err(errors) = validate::validate_pod(&pod, security) {
            return Err(LoadError::Invalid {
                origin: origin_text,
                name: pod.metadata.name.clone().unwrap_or_default(),
                errors: errors
                    .into_iter()
                    .map(|e| ValidationError {
                        field: format!("{prefix}{}", e.field),
                        reason: e.reason,
                    })
                    .collect(),
            });
        }
        pods.push(pod);
    }
    Ok(Loaded {
        pods,
        unknown_fields: decoded.unknown_fields,
    })
}

/// How many snapshots or change batches may wait between the sources, the merger and the
/// sync loop.
const SOURCE_QUEUE: usize = 16;

/// Start the configured sources and the merger. Must be called inside a Tokio runtime.
/// Every task stops when `cancel` fires; the receiver then ends.
pub fn spawn_sources(
    cfg: SourceConfig,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> (mpsc::Receiver<Vec<PodChange>>, SourcesReady, SourceProblems) {
    let problems = SourceProblems::default();
    // Bounded: a source that gets ahead of the merger (or the merger of the sync loop) waits
    // for it. Nothing is lost by waiting: every message is a full snapshot or the changes
    // between two, and the sources only ever need their newest one to go through.
    let (snap_tx, snap_rx) = mpsc::channel(SOURCE_QUEUE);
    let (out_tx, out_rx) = mpsc::channel(SOURCE_QUEUE);

    let mut expected = Vec::new();
    if let Some(path) = cfg
        .static_pod_path
        .clone()
        .filter(|p| !p.as_os_str().is_empty())
    {
        expected.push(SOURCE_FILE);
        let source = file::FileSource::new(
            path,
            cfg.node_name.clone(),
            cfg.security.clone(),
            cfg.file_check_frequency,
            problems.clone(),
        );
        tracker.spawn(source.run(snap_tx.clone(), cancel.clone()));
    }
    if let Some(url) = cfg.static_pod_url.clone().filter(|u| !u.is_empty()) {
        expected.push(SOURCE_HTTP);
        let source = http::HttpSource::new(
            url,
            cfg.static_pod_url_header.clone(),
            cfg.node_name.clone(),
            cfg.security.clone(),
            cfg.http_check_frequency,
            problems.clone(),
        );
        tracker.spawn(source.run(snap_tx.clone(), cancel.clone()));
    }
    if let Some(api) = cfg.api.clone() {
        expected.push(SOURCE_API);
        let source = apiserver::ApiSource::new(api, cfg.node_name.clone(), cfg.security.clone());
        tracker.spawn(source.run(snap_tx.clone(), cancel.clone()));
    }
    drop(snap_tx);

    let ready = SourcesReady::new(expected);
    tracker.spawn(merge::run(snap_rx, out_tx, ready.clone(), cancel));
    (out_rx, ready, problems)
}

/// `add <name>` / `update <name>` / `remove <name>` lines, for tests that compare batches.
#[cfg(test)]
pub(crate) fn describe_changes(changes: &[PodChange]) -> Vec<String> {
    changes
        .iter()
        .map(|c| {
            let op = match c {
                PodChange::Add(_) => "add",
                PodChange::Update(_) => "update",
                PodChange::Remove(_) => "remove",
            };
            format!(
                "{op} {}",
                c.pod().metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn load_applies_conventions_then_defaults_then_validates() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: c, image: nginx}]\n";
        let loaded = load_static_pods(
            text.as_bytes(),
            ManifestOrigin::File(Path::new("/m/web.yaml")),
            "n1",
            &NodeSecurity::default(),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let pod = &loaded.pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("web-n1"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
    }

    #[test]
    fn load_reports_all_validation_errors() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  restartPolicy: Sometimes\n  containers: [{name: c}, {name: c, image: x}]\n";
        let err = load_static_pods(
            text.as_bytes(),
            ManifestOrigin::File(Path::new("/m/web.yaml")),
            "n1",
            &NodeSecurity::default(),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("/m/web.yaml: invalid pod \"web-n1\": "),
            "{shown}"
        );
        for part in [
            "spec.containers[0].image: required",
            "spec.containers[1].name: duplicate",
            "spec.restartPolicy",
        ] {
            assert!(shown.contains(part), "{shown}");
        }
    }

    #[test]
    fn load_requires_a_name() {
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers: [{name: c, image: x}]\n";
        let err = load_static_pods(
            text.as_bytes(),
            ManifestOrigin::Http("http://h/p"),
            "n1",
            &NodeSecurity::default(),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap_err();
        assert!(err.to_string().contains("metadata.name: required"), "{err}");
    }

    #[test]
    fn load_refuses_a_uid_that_is_not_one_path_component() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: x/../../../../tmp/victim}\nspec:\n  containers: [{name: c, image: x}]\n";
        for origin in [
            ManifestOrigin::File(Path::new("/m/evil.yaml")),
            ManifestOrigin::Http("http://h/pods"),
        ] {
            let err = load_static_pods(
                text.as_bytes(),
                origin,
                "n1",
                &NodeSecurity::default(),
                SystemTime::UNIX_EPOCH,
            )
            .unwrap_err();
            let shown = err.to_string();
            let origin_text = match origin {
                ManifestOrigin::File(p) => p.display().to_string(),
                ManifestOrigin::Http(u) => u.to_string(),
            };
            assert!(shown.starts_with(&origin_text), "{shown}");
            assert!(shown.contains("metadata.uid: "), "{shown}");
            assert!(shown.contains("not a safe UID"), "{shown}");
        }
        // A UID the manifest sets and that is safe is kept as it is.
        let ok = text.replace("x/../../../../tmp/victim", "my-uid-1");
        let loaded = load_static_pods(
            ok.as_bytes(),
            ManifestOrigin::File(Path::new("/m/ok.yaml")),
            "n1",
            &NodeSecurity::default(),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(loaded.pods[0].metadata.uid.as_deref(), Some("my-uid-1"));
    }

    #[tokio::test]
    async fn no_sources_ready_at_once() {
        let cancel = CancellationToken::new();
        let cfg = SourceConfig {
            node_name: "n".into(),
            static_pod_path: None,
            file_check_frequency: Duration::from_secs(20),
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: Duration::from_secs(20),
            security: Default::default(),
            api: None,
        };
        let (mut rx, ready, problems) = spawn_sources(cfg, &TaskTracker::new(), cancel.clone());
        assert!(ready.all_ready());
        assert!(problems.snapshot().is_empty());
        cancel.cancel();
        assert!(rx.recv().await.is_none());
    }
}
