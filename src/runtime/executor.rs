//! Carries out [`PodActions`] against the runtime: sandboxes, images, containers, teardown.
//!
//! Each step that fails is turned into the reason users know from upstream (`ErrImagePull`,
//! `CreateContainerConfigError`, `CreateContainerError`, `RunContainerError`) and recorded for the
//! status; one failing container never stops the others from being tried.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};

use crate::cri::proto::{CreateContainerRequest, PodSandboxConfig, RunPodSandboxRequest};
use crate::cri::pull_progress::pull_with_progress_deadline;
use crate::cri::{CriError, ImageService, RuntimeService};
use crate::paths::{PathError, component_problem, remove_tree_within};
use crate::prober::{ProbeView, Unhealthy};
use crate::status::WaitingReason;
use crate::volume::{PodVolumes, VolumeManager};

use super::actions::{self, ContainerKind, DecisionContext, PodActions, StartContainer};
use super::backoff::{BackoffPolicy, BackoffTable};
use super::hooks::{HookKind, run_hook};
use super::hosts::render_hosts_file;
use super::inspect::{self, DetailCache};
use super::observed::{ContainerState, ObservedPod};
use super::translate::{self, ContainerContext, HostDns, QosClass, SandboxContext};

/// Facts about the node that translation needs; fixed for the agent's lifetime.
#[derive(Clone, Debug)]
pub struct NodeContext {
    pub node_name: String,
    pub host_ip: Option<String>,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub host_dns: HostDns,
    pub cluster_domain: Option<String>,
    pub cluster_dns: Vec<String>,
    pub cgroup_driver: crate::config::CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// Where the cgroup hierarchies are mounted (for removing pod cgroups).
    pub cgroup_fs: PathBuf,
    pub node_memory_bytes: u64,
    /// `runtimeRequestTimeout`, also the bound of a postStart hook.
    pub runtime_request_timeout: Duration,
    /// `--image-pull-progress-deadline` (`None`: pulls wait as long as they take).
    pub image_pull_progress_deadline: Option<Duration>,
}

impl NodeContext {
    /// `<root>/pods/<uid>`: the pod's own files (hosts file, termination logs).
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }

    /// `<podLogsDir>/<namespace>_<name>_<uid>`, upstream's pod log directory.
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
    }
}

/// What a worker keeps between syncs of one pod.
#[derive(Default)]
pub struct PodSyncState {
    pub backoff: BackoffTable,
    pub waiting: HashMap<String, WaitingReason>,
    pub status: Option<PodStatus>,
    /// Termination messages already read, by container ID.
    pub messages: HashMap<String, String>,
}

/// Where a pod's back-off state is kept, so a restarted agent continues it.
const BACKOFF_FILE: &str = "backoff.json";

/// The result of one sync.
pub struct SyncOutcome {
    pub observed: ObservedPod,
    /// The runtime could not be read: `observed` means nothing, keep the last status.
    pub runtime_unreachable: bool,
    /// Sync again after this long even without events (a back-off ends, an error to retry).
    pub retry_after: Option<Duration>,
    /// Nothing of the pod will run again.
    pub terminal: bool,
}

/// True when a regular init container of the pod runs in its newest sandbox.
fn init_running(pod: &Pod, observed: &ObservedPod) -> bool {
    let Some(sandbox) = observed.newest_sandbox() else {
        return false;
    };
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| !actions::is_sidecar(c))
        .any(|c| {
            observed.containers.iter().any(|i| {
                i.name == c.name && i.sandbox_id == sandbox.id && i.state == ContainerState::Running
            })
        })
}

/// Errors of a teardown; the worker retries.
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    #[error("{0}")]
    Runtime(#[from] CriError),
    #[error("{0}")]
    Volumes(String),
    #[error("removing the pod's files: {0}")]
    Files(#[from] PathError),
}

/// Upstream never gives a container less than this to stop.
pub(super) const MIN_GRACE_SECONDS: i64 = 2;
/// How often a pod is looked at while one of its init containers runs.
const INIT_POLL: Duration = Duration::from_millis(50);
/// How soon a pod is looked at again after a step of its start-up went through.
const PROGRESS_RETRY: Duration = Duration::from_millis(20);
/// How soon a sync that hit an error is retried.
const ERROR_RETRY: Duration = Duration::from_secs(2);

/// Carries out decisions for pods on one runtime.
#[derive(Clone)]
pub struct Executor<R> {
    pub(super) rt: R,
    pub(super) node: Arc<NodeContext>,
    pub(super) details: DetailCache,
    pub(super) policy: BackoffPolicy,
    pub(super) volumes: VolumeManager,
}

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The grace period for stopping a pod's containers.
pub fn grace_period(pod: Option<&Pod>, override_seconds: Option<i64>) -> i64 {
    let from_spec = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    override_seconds.unwrap_or(from_spec).max(MIN_GRACE_SECONDS)
}

/// The spec hash in the form recorded on containers.
pub fn spec_hash(container: &Container) -> String {
    translate::hash::format_hash(translate::container_hash(container))
}

impl<R: RuntimeService + ImageService> Executor<R> {
    pub fn new(rt: R, node: Arc<NodeContext>, details: DetailCache, policy: BackoffPolicy) -> Self {
        let volumes = VolumeManager::new(node.root_dir.clone(), node.node_memory_bytes);
        Executor {
            rt,
            node,
            details,
            policy,
            volumes,
        }
    }

    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// Reads the pod's current state from the runtime.
    pub async fn observe(&self, uid: &str) -> Result<ObservedPod, CriError> {
        inspect::observe_pod(&self.rt, &self.details, &self.node.node_name, uid).await
    }

    fn sandbox_config(
        &self,
        pod: &Pod,
        attempt: u32,
    ) -> Result<PodSandboxConfig, translate::TranslateError> {
        let qos = translate::qos_class(pod);
        let ctx = SandboxContext {
            pod_logs_dir: self.node.pod_logs_dir.clone(),
            host_dns: self.node.host_dns.clone(),
            cluster_dns: self.node.cluster_dns.clone(),
            cluster_domain: self.node.cluster_domain.clone().unwrap_or_default(),
            cgroup_parent: crate::cm::pod_cgroup_parent(
                self.node.cgroup_driver,
                &self.node.cgroup_root,
                self.node.cgroups_per_qos,
                qos,
                pod_uid(pod),
            ),
            node_name: self.node.node_name.clone(),
            seccomp_profile_root: self.node.root_dir.join("seccomp"),
        };
        translate::pod_sandbox_config(pod, &ctx, attempt)
    }

    /// Brings the pod one step closer to its spec.
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        state: &mut PodSyncState,
        unhealthy: &HashMap<String, Unhealthy>,
        probes: &HashMap<String, ProbeView>,
    ) -> SyncOutcome {
        let uid = pod_uid(pod).to_string();
        let observed = match self.observe(&uid).await {
            Ok(o) => o,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the pod's state from the runtime");
                return SyncOutcome {
                    observed: ObservedPod::default(),
                    runtime_unreachable: true,
                    retry_after: Some(ERROR_RETRY),
                    terminal: false,
                };
            }
        };
        let backoff_before = state.backoff.clone();
        let hash = |c: &Container| spec_hash(c);
        let decide = |observed: &ObservedPod, backoff: &BackoffTable| {
            actions::compute_pod_actions(
                pod,
                observed,
                &DecisionContext {
                    now: SystemTime::now(),
                    backoff,
                    policy: self.policy,
                    spec_hash: &hash,
                    unhealthy,
                    probes,
                },
            )
        };
        let decision = decide(&observed, &state.backoff);
        let mut retry = decision.retry_after();
        let changed = decision
            != PodActions {
                sandbox_id: decision.sandbox_id.clone(),
                terminal: decision.terminal,
                ..Default::default()
            };
        if changed {
            tracing::debug!(?decision, "pod actions");
        }
        // Back-off waits are shown as CrashLoopBackOff until the container starts again.
        for w in &decision.waiting {
            state.waiting.insert(
                w.name.clone(),
                WaitingReason {
                    reason: "CrashLoopBackOff".into(),
                    message: w.message.clone(),
                },
            );
        }
        let executed = self.execute(pod, &observed, &decision, state).await;
        if let Err(err) = &executed {
            tracing::warn!(error = %err, "sync failed; will retry");
            retry = Some(retry.map_or(ERROR_RETRY, |r| r.min(ERROR_RETRY)));
        }
        if state
            .waiting
            .values()
            .any(|w| w.reason != "CrashLoopBackOff")
        {
            retry = Some(retry.map_or(ERROR_RETRY, |r| r.min(ERROR_RETRY)));
        }
        let mut observed = if changed {
            self.observe(&uid).await.unwrap_or(observed)
        } else {
            observed
        };
        // What the runtime shows now may already call for the next step (the next init
        // container, a restart of a container that exited meanwhile). The decision is pure and
        // cheap, so it is made again on the fresh view, and the worker comes back at once
        // instead of waiting for a relist that may see nothing new.
        if executed.is_ok() && changed {
            let followup = decide(&observed, &state.backoff);
            let blocked = |name: &str| {
                state
                    .waiting
                    .get(name)
                    .is_some_and(|w| w.reason != "CrashLoopBackOff")
            };
            let more = followup.create_sandbox.is_some()
                || followup.kill_pod.is_some()
                || !followup.kill_containers.is_empty()
                || followup.start_containers.iter().any(|s| !blocked(&s.name));
            if more {
                retry = Some(retry.map_or(PROGRESS_RETRY, |r| r.min(PROGRESS_RETRY)));
            }
            if let Some(wait) = followup.retry_after() {
                retry = Some(retry.map_or(wait, |r| r.min(wait)));
            }
        }
        if state.backoff != backoff_before {
            self.save_backoff(&uid, &state.backoff);
        }
        // Upstream notices an init container's exit one relist later; Deckhand looks again
        // soon while one runs, so the next one starts as soon as it is done.
        if init_running(pod, &observed) {
            retry = Some(retry.map_or(INIT_POLL, |r| r.min(INIT_POLL)));
        }
        let log_dir = self
            .node
            .pod_log_dir(pod_namespace(pod), pod_name(pod), &uid);
        super::termination_message::fill_messages(
            &mut observed,
            pod,
            &self.node.pod_dir(&uid),
            &log_dir,
            &mut state.messages,
        );
        SyncOutcome {
            observed,
            runtime_unreachable: false,
            retry_after: retry,
            terminal: decision.terminal,
        }
    }

    /// The sync state of a pod this agent may have run before it restarted: the back-off
    /// entries are read back from the pod's directory.
    pub fn load_state(&self, uid: &str) -> PodSyncState {
        let path = self.node.pod_dir(uid).join(BACKOFF_FILE);
        let backoff = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<BackoffTable>(&bytes).ok())
            .unwrap_or_default();
        PodSyncState {
            backoff,
            ..Default::default()
        }
    }

    fn save_backoff(&self, uid: &str, table: &BackoffTable) {
        let path = self.node.pod_dir(uid).join(BACKOFF_FILE);
        let result = serde_json::to_vec(table)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_atomically(&path, &bytes));
        if let Err(err) = result {
            tracing::warn!(path = %path.display(), error = %err, "cannot save the back-off state");
        }
    }

    async fn execute(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        decision: &PodActions,
        state: &mut PodSyncState,
    ) -> Result<(), CriError> {
        if let Some(reason) = &decision.kill_pod {
            tracing::info!(%reason, "stopping the pod");
            self.stop_pod(Some(pod), observed, grace_period(Some(pod), None))
                .await?;
        }
        for id in &decision.remove_containers {
            self.remove_container(id).await;
        }
        for id in &decision.remove_sandboxes {
            if let Err(err) = self.rt.remove_pod_sandbox(id.clone()).await
                && !err.is_not_found()
            {
                tracing::warn!(sandbox = %id, error = %err, "cannot remove an old sandbox");
            }
        }
        for kill in &decision.kill_containers {
            tracing::info!(container = %kill.name, reason = %kill.reason, "stopping container");
            if let Some(inst) = observed.containers.iter().find(|c| c.id == kill.id) {
                let pod_ip = super::stop::pod_ip(observed, self.node.host_ip.as_deref());
                self.stop_container_gracefully(
                    Some(pod),
                    inst,
                    grace_period(Some(pod), kill.grace_override),
                    pod_ip.as_deref(),
                )
                .await?;
            }
        }

        if decision.create_sandbox.is_none() && decision.start_containers.is_empty() {
            if decision.sandbox_id.is_some()
                && let Err(err) = self.volumes.refresh(pod)
            {
                tracing::warn!(error = %err, "cannot refresh the pod's volumes");
            }
            return Ok(());
        }
        // Volumes come first, as upstream: no sandbox and no container until they are ready.
        let volumes = match self.volumes.setup(pod) {
            Ok(v) => v,
            Err(err) => {
                tracing::warn!(error = %err, "volumes are not ready");
                for start in &decision.start_containers {
                    state.waiting.insert(
                        start.name.clone(),
                        WaitingReason {
                            reason: "ContainerCreating".into(),
                            message: err.to_string(),
                        },
                    );
                }
                return Ok(());
            }
        };
        let (sandbox_id, attempt) = match (decision.create_sandbox, &decision.sandbox_id) {
            (Some(attempt), _) => (self.create_sandbox(pod, attempt).await?, attempt),
            (None, Some(id)) => {
                let attempt = observed
                    .sandboxes
                    .iter()
                    .find(|s| &s.id == id)
                    .map(|s| s.attempt)
                    .unwrap_or(0);
                (id.clone(), attempt)
            }
            (None, None) => return Ok(()),
        };
        if decision.start_containers.is_empty() {
            return Ok(());
        }
        let sandbox_config = match self.sandbox_config(pod, attempt) {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!(error = %err, "cannot build the sandbox config");
                return Ok(());
            }
        };
        let pod_ip = self.pod_ip(pod, observed, &sandbox_id).await;
        for start in &decision.start_containers {
            let target = StartTarget {
                sandbox_id: &sandbox_id,
                sandbox_config: &sandbox_config,
                pod_ip: pod_ip.as_deref(),
                volumes: &volumes,
            };
            self.start_container(pod, start, &target, state).await;
        }
        Ok(())
    }

    /// The pod's IP: the node's for hostNetwork pods, else the sandbox's — already known for an
    /// existing sandbox, asked for once for a new one.
    async fn pod_ip(&self, pod: &Pod, observed: &ObservedPod, sandbox_id: &str) -> Option<String> {
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if host_network {
            return self.node.host_ip.clone();
        }
        if let Some(known) = observed.sandboxes.iter().find(|s| s.id == sandbox_id) {
            return known.ip.clone();
        }
        let status = self
            .rt
            .pod_sandbox_status(sandbox_id.to_string())
            .await
            .ok()?
            .status?;
        status.network.map(|n| n.ip).filter(|ip| !ip.is_empty())
    }

    /// Creates the pod's sandbox, its log directory and its managed files.
    async fn create_sandbox(&self, pod: &Pod, attempt: u32) -> Result<String, CriError> {
        let uid = pod_uid(pod);
        let config = match self.sandbox_config(pod, attempt) {
            Ok(c) => c,
            Err(err) => {
                return Err(CriError::Rpc {
                    method: "RunPodSandbox",
                    code: tonic::Code::InvalidArgument,
                    message: format!("cannot build the sandbox config: {err}"),
                });
            }
        };
        let log_dir = self
            .node
            .pod_log_dir(pod_namespace(pod), pod_name(pod), uid);
        if let Err(err) = std::fs::create_dir_all(&log_dir) {
            tracing::warn!(dir = %log_dir.display(), error = %err, "cannot create the pod log directory");
        }
        tracing::info!(attempt, "creating the pod sandbox");
        let resp = self
            .rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    async fn start_container(
        &self,
        pod: &Pod,
        start: &StartContainer,
        target: &StartTarget<'_>,
        state: &mut PodSyncState,
    ) {
        let StartTarget {
            sandbox_id,
            sandbox_config,
            pod_ip,
            volumes,
        } = *target;
        let spec = pod.spec.clone().unwrap_or_default();
        let container = match start.kind {
            ContainerKind::Init => spec
                .init_containers
                .as_ref()
                .and_then(|v| v.get(start.index)),
            ContainerKind::App => spec.containers.get(start.index),
        };
        let Some(container) = container else { return };
        let name = container.name.as_str();
        let span = tracing::info_span!("container", container = %name);
        let _enter = span.enter();

        // A restart after an exit updates the back-off, whether or not the start succeeds.
        if let Some(entry) = start.backoff {
            state.backoff.insert(name.to_string(), entry);
        }

        if let Err(waiting) = self.ensure_image(container, sandbox_config, state).await {
            tracing::warn!(reason = %waiting.reason, message = %waiting.message, "image not available");
            state.waiting.insert(name.to_string(), waiting);
            return;
        }
        // runAsNonRoot is checked against the user the image runs as, as upstream does.
        if translate::needs_image_user(pod, container) {
            let image = container.image.clone().unwrap_or_default();
            let checked = match self.rt.image_status(image.clone()).await {
                Ok(Some(img)) => {
                    let (uid, username) = translate::image_user(&img);
                    translate::verify_run_as_non_root(pod, container, uid, &username)
                        .map_err(|e| e.to_string())
                }
                Ok(None) => Err(format!(
                    "cannot read the user of image {image:?}: not present"
                )),
                Err(err) => Err(format!("cannot read the user of image {image:?}: {err}")),
            };
            if let Err(message) = checked {
                tracing::warn!(%message, "CreateContainerConfigError");
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "CreateContainerConfigError".into(),
                        message,
                    },
                );
                return;
            }
        }

        let files = match self.prepare_container_files(pod, name, start.restart_count, pod_ip) {
            Ok(f) => f,
            Err(err) => {
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "CreateContainerConfigError".into(),
                        message: err,
                    },
                );
                return;
            }
        };
        let mut ctx = ContainerContext {
            restart_count: start.restart_count,
            pod_ip: pod_ip.map(str::to_string),
            host_ip: self.node.host_ip.clone(),
            node_name: self.node.node_name.clone(),
            etc_hosts_path: files.hosts,
            termination_log_path: Some(files.termination_log),
            extra_mounts: Vec::new(),
            node_memory_capacity: self.node.node_memory_bytes,
            seccomp_profile_root: self.node.root_dir.join("seccomp"),
        };
        let mounts = translate::env::container_env(pod, container, &ctx)
            .map_err(|e| e.to_string())
            .and_then(|env| {
                let env: HashMap<String, String> = env.into_iter().collect();
                self.volumes
                    .container_mounts(pod, container, volumes, &env)
                    .map_err(|e| e.to_string())
            });
        match mounts {
            Ok(m) => ctx.extra_mounts = m,
            Err(message) => {
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "CreateContainerConfigError".into(),
                        message,
                    },
                );
                return;
            }
        }
        let config = match translate::container_config(pod, container, &ctx) {
            Ok(c) => c,
            Err(err) => {
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "CreateContainerConfigError".into(),
                        message: err.to_string(),
                    },
                );
                return;
            }
        };
        let log_dir = Path::new(&sandbox_config.log_directory).join(name);
        let _ = std::fs::create_dir_all(&log_dir);

        let created = self
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await;
        let id = match created {
            Ok(id) => id,
            Err(err) => {
                tracing::warn!(error = %err, "cannot create the container");
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "CreateContainerError".into(),
                        message: err.to_string(),
                    },
                );
                return;
            }
        };
        if let Err(err) = self.rt.start_container(id.clone()).await {
            tracing::warn!(error = %err, "cannot start the container");
            state.waiting.insert(
                name.to_string(),
                WaitingReason {
                    reason: "RunContainerError".into(),
                    message: err.to_string(),
                },
            );
            return;
        }
        state.waiting.remove(name);
        tracing::info!(id = %id, restart_count = start.restart_count, "container started");

        // postStart runs right after the start, and the worker waits for it, as upstream.
        if let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        {
            let result = run_hook(
                &self.rt,
                HookKind::PostStart,
                hook,
                container,
                &id,
                pod_ip,
                self.rt_timeout(),
            )
            .await;
            if let Err(err) = result {
                let message = err.to_string();
                tracing::warn!(%message, "FailedPostStartHook: killing the container");
                if let Err(err) = self
                    .stop_container(&id, grace_period(Some(pod), None))
                    .await
                {
                    tracing::warn!(error = %err, "cannot kill the container after its postStart hook failed");
                }
                state.waiting.insert(
                    name.to_string(),
                    WaitingReason {
                        reason: "PostStartHookError".into(),
                        message,
                    },
                );
            }
        }
    }

    /// How long a postStart hook may run (upstream bounds it by the runtime request timeout).
    fn rt_timeout(&self) -> Duration {
        self.node.runtime_request_timeout
    }

    /// Makes sure the image is present, as the container's pull policy says.
    async fn ensure_image(
        &self,
        container: &Container,
        sandbox_config: &PodSandboxConfig,
        state: &mut PodSyncState,
    ) -> Result<(), WaitingReason> {
        let image = container.image.clone().unwrap_or_default();
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let present = match self.rt.image_status(image.clone()).await {
            Ok(found) => found.is_some(),
            Err(err) => {
                return Err(WaitingReason {
                    reason: "ErrImagePull".into(),
                    message: format!("cannot check image {image:?}: {err}"),
                });
            }
        };
        if policy == "Never" {
            return if present {
                Ok(())
            } else {
                Err(WaitingReason {
                    reason: "ErrImageNeverPull".into(),
                    message: format!(
                        "Container image {image:?} is not present with pull policy of Never"
                    ),
                })
            };
        }
        if present && policy != "Always" {
            return Ok(());
        }
        // Pull failures back off per image, like crash loops.
        let key = format!("image:{image}");
        let now = SystemTime::now();
        if let Some(entry) = state.backoff.get(&key)
            && self
                .policy
                .remaining(Some(entry), entry.last_update, now)
                .is_some()
        {
            return Err(WaitingReason {
                reason: "ImagePullBackOff".into(),
                message: format!("Back-off pulling image {image:?}"),
            });
        }
        tracing::info!(%image, "pulling image");
        match pull_with_progress_deadline(
            &self.rt,
            image.clone(),
            Some(sandbox_config.clone()),
            self.node.image_pull_progress_deadline,
        )
        .await
        {
            Ok(_) => {
                state.backoff.remove(&key);
                Ok(())
            }
            Err(err) => {
                let entry = self.policy.next(state.backoff.get(&key), now);
                state.backoff.insert(key, entry);
                Err(WaitingReason {
                    reason: "ErrImagePull".into(),
                    message: format!("failed to pull image {image:?}: {err}"),
                })
            }
        }
    }

    /// Writes the files the kubelet provides to a container: `/etc/hosts` (own network only)
    /// and an empty termination-message file.
    fn prepare_container_files(
        &self,
        pod: &Pod,
        container: &str,
        restart_count: u32,
        pod_ip: Option<&str>,
    ) -> Result<ContainerFiles, String> {
        let dir = self.node.pod_dir(pod_uid(pod));
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let hosts = if host_network {
            None
        } else {
            let path = dir.join("etc-hosts");
            let text = render_hosts_file(pod, pod_ip, self.node.cluster_domain.as_deref());
            write_atomically(&path, text.as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Some(path)
        };
        let term_dir = dir.join("containers").join(container);
        std::fs::create_dir_all(&term_dir)
            .map_err(|e| format!("cannot create {}: {e}", term_dir.display()))?;
        let termination_log = term_dir.join(restart_count.to_string());
        std::fs::write(&termination_log, b"")
            .map_err(|e| format!("cannot create {}: {e}", termination_log.display()))?;
        Ok(ContainerFiles {
            hosts,
            termination_log,
        })
    }

    pub(super) async fn stop_container(&self, id: &str, grace: i64) -> Result<(), CriError> {
        match self.rt.stop_container(id.to_string(), grace).await {
            Err(err) if !err.is_not_found() => Err(err),
            _ => {
                self.details.forget_container(id);
                Ok(())
            }
        }
    }

    async fn remove_container(&self, id: &str) {
        if let Err(err) = self.rt.remove_container(id.to_string()).await
            && !err.is_not_found()
        {
            tracing::warn!(container_id = %id, error = %err, "cannot remove an old container");
        }
        self.details.forget_container(id);
    }

    /// Stops and removes everything of a pod, then its log directory, files and cgroup.
    /// `pod` is absent for orphans found in the runtime; their names come from the labels.
    pub async fn terminate_pod(
        &self,
        uid: &str,
        pod: Option<&Pod>,
        grace_override: Option<i64>,
    ) -> Result<(), TeardownError> {
        let observed = self.observe(uid).await?;
        let grace = match pod {
            Some(p) => grace_period(Some(p), grace_override),
            // Orphans: each container's own recorded grace period applies (see stop_pod).
            None => grace_override.unwrap_or(30),
        };
        self.stop_pod(pod, &observed, grace).await?;
        for c in &observed.containers {
            self.remove_container(&c.id).await;
        }
        for s in &observed.sandboxes {
            match self.rt.remove_pod_sandbox(s.id.clone()).await {
                Err(err) if !err.is_not_found() => return Err(err.into()),
                _ => {}
            }
        }
        // A UID that is not one safe path component (only possible for objects someone else
        // labelled as ours: the sources refuse such manifests) has its runtime objects removed
        // above, and no path is ever built from it.
        if let Some(problem) = component_problem(uid) {
            tracing::warn!(pod_uid = %uid, problem, "not touching any file for a pod whose UID cannot be a path component");
            return Ok(());
        }
        // Logs and pod files go with the pod, as upstream's garbage collector would do later.
        let names = pod
            .map(|p| (pod_namespace(p).to_string(), pod_name(p).to_string()))
            .or_else(|| observed.names.clone());
        if let Some((ns, name)) = names {
            remove_tree_within(
                &self.node.pod_logs_dir,
                &self.node.pod_log_dir(&ns, &name, uid),
            )?;
        }
        if let Err(err) = self.volumes.teardown(uid) {
            tracing::warn!(error = %err, "volume teardown failed; will retry");
            return Err(TeardownError::Volumes(err.to_string()));
        }
        remove_tree_within(&self.node.root_dir.join("pods"), &self.node.pod_dir(uid))?;
        // The QoS class of an orphan is unknown, so every place its cgroup could be is tried.
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let parent = crate::cm::pod_cgroup_parent(
                self.node.cgroup_driver,
                &self.node.cgroup_root,
                self.node.cgroups_per_qos,
                qos,
                uid,
            );
            for problem in parent
                .map(|p| crate::cm::remove_pod_cgroup(&self.node.cgroup_fs, &p))
                .unwrap_or_default()
            {
                tracing::warn!(%problem, "cannot remove the pod's cgroup");
            }
        }
        Ok(())
    }
}

/// Where a container is started: its sandbox, that sandbox's config and IP, the pod's volumes.
#[derive(Clone, Copy)]
struct StartTarget<'a> {
    sandbox_id: &'a str,
    sandbox_config: &'a PodSandboxConfig,
    pod_ip: Option<&'a str>,
    volumes: &'a PodVolumes,
}

struct ContainerFiles {
    hosts: Option<PathBuf>,
    termination_log: PathBuf,
}

/// Writes a file through a temporary name and a rename, so readers never see half of it.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}
