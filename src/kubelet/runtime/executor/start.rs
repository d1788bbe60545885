//! Starting a pod: its volumes first (as upstream: nothing runs until they are ready), then its
//! sandbox, then each container (image, files, mounts, create, start, postStart).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::Instrument;

use crate::base::clock;
use crate::clients::cri::proto::{
    ContainerConfig, CreateContainerRequest, Image, ImageSpec, Mount, PodSandboxConfig,
    RunPodSandboxRequest,
};
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::api_objects::PodObjects;
use crate::kubelet::events::{EventType, reason};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};
use crate::kubelet::volume::{PodVolumes, VolumeError, VolumeProblem};

use super::super::actions::{ContainerKind, PodActions, StartContainer};
use super::super::backoff;
use super::super::hooks::{HookKind, run_hook};
use super::super::image_volumes::container_waiting;
use super::super::inspect::Made;
use super::super::pod_files;
use super::super::translate::{self, ContainerContext};
use super::image_volumes::ImageVolumePulls;
use super::{Executor, PodSyncState, grace_period, pod_name, pod_namespace, pod_uid};
use crate::base::observed::ObservedPod;
use crate::base::podspec::ephemeral;

/// Where a container is started: its sandbox, that sandbox's config and IP, the pod's volumes.
#[derive(Clone, Copy)]
struct StartTarget<'a> {
    sandbox_id: &'a str,
    sandbox_config: &'a PodSandboxConfig,
    pod_ip: Option<&'a str>,
    volumes: &'a PodVolumes,
    /// The API objects read for the pod, for the environment.
    objects: &'a PodObjects,
    /// The pod's user namespace, the same as its sandbox's.
    userns: Option<&'a crate::clients::cri::proto::UserNamespace>,
    /// The runtime's view of the pod, where an ephemeral container finds its target.
    observed: &'a ObservedPod,
    /// The pod's image volumes, pulled for this start.
    image_volumes: &'a ImageVolumePulls,
}

/// Why a sandbox was not made: its config could not be built (the FailedCreatePodSandBox
/// event names the reason alone, as upstream's: "Failed to create pod sandbox: failed to
/// construct FQDN …"), or the runtime refused it.
#[derive(Debug, thiserror::Error)]
enum SandboxError {
    #[error(transparent)]
    Config(#[from] translate::TranslateError),
    #[error(transparent)]
    Runtime(#[from] CriError),
}

impl From<SandboxError> for CriError {
    /// The sync fails either way and is tried again; a config error as the runtime would
    /// have refused it.
    fn from(err: SandboxError) -> Self {
        match err {
            SandboxError::Runtime(err) => err,
            SandboxError::Config(err) => CriError::Rpc {
                method: "RunPodSandbox",
                code: tonic::Code::InvalidArgument,
                message: format!("cannot build the sandbox config: {err}"),
            },
        }
    }
}

fn config_error(message: impl Into<String>) -> WaitingReason {
    WaitingReason::new(WaitReason::CreateContainerConfigError, message)
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// The start part of a decision: volumes, the sandbox, the containers to start.
    pub(super) async fn start(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        decision: &PodActions,
        state: &mut PodSyncState,
        made: &mut Made,
    ) -> Result<(), CriError> {
        if decision.create_sandbox.is_none() && decision.start_containers.is_empty() {
            if decision.sandbox_id.is_some() {
                let objects = self.pod_objects(pod).await;
                let volumes = self.volumes.clone();
                let (owned, read) = (pod.clone(), objects.clone());
                let refreshed =
                    tokio::task::spawn_blocking(move || volumes.refresh_with(&owned, &read)).await;
                if let Ok(Err(err)) = refreshed {
                    // The event's line is the warning.
                    tracing::debug!(error = %err, "cannot refresh the pod's volumes");
                    self.events.pod(
                        pod,
                        EventType::Warning,
                        reason::FAILED_MOUNT,
                        err.to_string(),
                    );
                }
                self.republish_csi(pod, &objects, state).await;
                self.expand_csi(pod, &objects, state).await;
            }
            return Ok(());
        }
        // Volumes come first, as upstream: no sandbox and no container until they are ready.
        let objects = self.pod_objects(pod).await;
        let Some(volumes) = self.set_up_volumes(pod, &objects, decision, state).await else {
            return Ok(());
        };
        let userns = match unsupported_runtime_class(pod) {
            Some(message) => Err(message),
            None => self
                .pod_userns(pod, decision.create_sandbox.is_some())
                .await
                .map_err(|refusal| refusal.to_string()),
        };
        let userns = match userns {
            Ok(userns) => userns,
            Err(message) => {
                self.sandbox_failed(pod, &message);
                for start in &decision.start_containers {
                    state.waiting.insert(
                        start.name.clone(),
                        WaitingReason::new(WaitReason::ContainerCreating, message.clone()),
                    );
                }
                return Ok(());
            }
        };
        // The pod's DRA claims are prepared before its sandbox, as upstream's SyncPod does.
        if decision.create_sandbox.is_some() && !self.prepare_claims(pod, decision, state).await {
            return Ok(());
        }
        let (sandbox_id, attempt) = match (decision.create_sandbox, &decision.sandbox_id) {
            (Some(attempt), _) => match self.create_sandbox(pod, attempt, userns.clone()).await {
                Ok(id) => {
                    if let Some(pleg) = &self.pleg {
                        pleg.made(pod_uid(pod), &id);
                    }
                    made.sandbox = Some(id.clone());
                    (id, attempt)
                }
                Err(err) => {
                    self.sandbox_failed(pod, &err.to_string());
                    return Err(err.into());
                }
            },
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
        let sandbox_config = match self.sandbox_config(pod, attempt, userns.clone()) {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!(error = %err, "cannot build the sandbox config");
                return Ok(());
            }
        };
        let pod_ip = self.pod_ip_for_start(pod, observed, &sandbox_id).await;
        let image_volumes = self
            .pull_image_volumes(pod, &sandbox_config, &objects, state)
            .await;
        for start in &decision.start_containers {
            let target = StartTarget {
                sandbox_id: &sandbox_id,
                sandbox_config: &sandbox_config,
                pod_ip: pod_ip.as_deref(),
                volumes: &volumes,
                objects: &objects,
                userns: userns.as_ref(),
                observed,
                image_volumes: &image_volumes,
            };
            // A restart after an exit updates the back-off, whether or not the start succeeds.
            if let (Some(entry), Some(c)) = (start.backoff, spec_of(pod, start)) {
                let key = backoff::container_key(&start.name, &super::spec_hash(&c));
                state.backoff.insert(key, entry);
            }
            let span = tracing::info_span!("container", container = %start.name);
            let result = self
                .start_container(pod, start, &target, state, made)
                .instrument(span)
                .await;
            match result {
                Ok(()) => {
                    state.waiting.remove(&start.name);
                }
                Err(waiting) => {
                    tracing::warn!(container = %start.name, reason = %waiting.reason, message = %waiting.message, "the container is waiting");
                    if let Some(message) = failed_event_message(&waiting) {
                        self.events.container(
                            pod,
                            &start.name,
                            EventType::Warning,
                            reason::FAILED,
                            message,
                        );
                    }
                    state.waiting.insert(start.name.clone(), waiting);
                }
            }
        }
        Ok(())
    }

    /// The FailedCreatePodSandBox event.
    fn sandbox_failed(&self, pod: &Pod, why: &str) {
        self.events.pod(
            pod,
            EventType::Warning,
            reason::FAILED_CREATE_POD_SANDBOX,
            format!("Failed to create pod sandbox: {why}"),
        );
    }

    /// The pod's IP: the node's for hostNetwork pods, else the sandbox's — already known for an
    /// existing sandbox, asked for once for a new one.
    async fn pod_ip_for_start(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        sandbox_id: &str,
    ) -> Option<String> {
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if host_network {
            return self.node.host_ip.clone();
        }
        if observed.sandboxes.iter().any(|s| s.id == sandbox_id) {
            return observed.reachable_ip(Some(sandbox_id), self.node.host_ip.as_deref());
        }
        // Remembered, so the observation after the start reads no status again.
        super::inspect::sandbox_ip(&self.rt, &self.details, sandbox_id)
            .await
            .ok()?
    }

    /// Creates the pod's sandbox and its log directory.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
        userns: Option<crate::clients::cri::proto::UserNamespace>,
    ) -> Result<String, SandboxError> {
        let uid = pod_uid(pod);
        let config = self.sandbox_config(pod, attempt, userns)?;
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

    /// Starts one container; on failure, says why it waits.
    async fn start_container(
        &self,
        pod: &Pod,
        start: &StartContainer,
        target: &StartTarget<'_>,
        state: &mut PodSyncState,
        made: &mut Made,
    ) -> Result<(), WaitingReason> {
        let StartTarget {
            sandbox_id,
            sandbox_config,
            pod_ip,
            volumes,
            objects,
            userns,
            observed,
            image_volumes,
        } = *target;
        let Some(container) = spec_of(pod, start) else {
            return Ok(());
        };
        let container: &Container = &container;
        let name = container.name.as_str();
        let pid_target =
            pid_target(pod, start, observed).map_err(|e| config_error(e.to_string()))?;
        // As upstream: an image volume it mounts that could not be had fails the container
        // before its own image is looked at.
        if let Some(waiting) = container_waiting(container, &image_volumes.failed) {
            return Err(waiting);
        }

        let began = clock::instant();
        let image = self
            .ensure_image(
                pod,
                container,
                sandbox_config,
                target.objects,
                &mut state.backoff,
                &mut state.pull_errors,
            )
            .await;
        state.image_time += began.elapsed();
        let image = image?;
        self.check_run_as_non_root(pod, container, image).await?;

        let dir = self.node.pod_dir(pod_uid(pod));
        let files = pod_files::prepare_container_files(
            &dir,
            pod,
            name,
            start.restart_count,
            pod_ip,
            self.node.cluster_domain.as_deref(),
        )
        .map_err(|e| config_error(e.to_string()))?;
        let mut ctx = ContainerContext {
            restart_count: start.restart_count,
            pod_ip: pod_ip.map(str::to_string),
            host_ip: self.node.host_ip.clone(),
            node_name: self.node.node_name.clone(),
            etc_hosts_path: files.hosts,
            termination_log_path: Some(files.termination_log),
            extra_mounts: Vec::new(),
            node_memory_capacity: self.node.node_memory_bytes,
            node_allocatable: self.node.allocatable,
            seccomp_profile_root: self.node.seccomp_profile_root(),
            seccomp_default: self.node.seccomp_default,
            resources: self.resources.clone(),
            userns: userns.cloned(),
            pid_target,
        };
        // Resolved once: the mounts need it (`subPathExpr`), then the container config.
        let resolved = translate::env::container_env_with(pod, container, &ctx, objects)
            .map_err(|e| config_error(e.to_string()))?;
        for skipped in &resolved.skipped {
            self.events.pod(
                pod,
                EventType::Warning,
                reason::INVALID_ENVIRONMENT_VARIABLE_NAMES,
                skipped.message(),
            );
        }
        let envs = resolved.vars;
        let env: HashMap<String, String> = envs.iter().cloned().collect();
        ctx.extra_mounts = self
            .container_mounts(pod, container, volumes, env, &image_volumes.specs)
            .await?;
        let mut config = translate::container_config_with_env(pod, container, &ctx, envs)
            .map_err(|e| config_error(e.to_string()))?;
        self.add_devices(pod, container, &mut config).await?;
        record_round(&mut config, start.round.as_deref());
        let log_dir = Path::new(&sandbox_config.log_directory).join(name);
        let _ = std::fs::create_dir_all(&log_dir);

        let container_type = match start.kind {
            ContainerKind::Init => "init_container",
            ContainerKind::App => "container",
            ContainerKind::Ephemeral => "ephemeral_container",
        };
        let start_failed = |err: &crate::clients::cri::CriError| {
            crate::base::metrics::KUBELET
                .started_containers_errors
                .inc(&[container_type, &err.code_name()]);
        };
        crate::base::metrics::KUBELET
            .started_containers
            .inc(&[container_type]);
        let id = self
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await
            .map_err(|err| {
                start_failed(&err);
                WaitingReason::new(WaitReason::CreateContainerError, err.to_string())
            })?;
        made.containers.push((id.clone(), sandbox_id.to_string()));
        // Before the start: an init container's exit may come within milliseconds of it.
        if let Some(pleg) = &self.pleg {
            pleg.made(pod_uid(pod), &id);
        }
        self.events.container(
            pod,
            name,
            EventType::Normal,
            reason::CREATED,
            "Container created",
        );
        self.rt.start_container(id.clone()).await.map_err(|err| {
            start_failed(&err);
            WaitingReason::new(WaitReason::RunContainerError, err.to_string())
        })?;
        tracing::info!(container_id = %id, restart_count = start.restart_count, "container started");
        self.events.container(
            pod,
            name,
            EventType::Normal,
            reason::STARTED,
            "Container started",
        );
        self.post_start(pod, container, &id, pod_ip).await
    }

    /// The container's CRI mounts. subPath mounts are system calls: made on a blocking thread.
    async fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        volumes: &PodVolumes,
        env: HashMap<String, String>,
        images: &HashMap<String, ImageSpec>,
    ) -> Result<Vec<Mount>, WaitingReason> {
        let manager = self.volumes.clone();
        let (pod, container, volumes) = (pod.clone(), container.clone(), volumes.clone());
        let images = images.clone();
        tokio::task::spawn_blocking(move || {
            manager.container_mounts(&pod, &container, &volumes, &env, &images)
        })
        .await
        .map_err(|join| config_error(format!("the mount task failed: {join}")))?
        .map_err(|e| config_error(e.to_string()))
    }

    /// The container's devices into its config, as upstream's `GetDeviceRunContainerOptions`:
    /// allocated at its first creation, `PreStartContainer` before each start when the plugin
    /// asks for it.
    async fn add_devices(
        &self,
        pod: &Pod,
        container: &k8s_openapi::api::core::v1::Container,
        config: &mut crate::clients::cri::proto::ContainerConfig,
    ) -> Result<(), WaitingReason> {
        let Some(devices) = &self.node.devices else {
            self.add_claim_devices(pod, container, config);
            return Ok(());
        };
        let options = devices
            .container_options(pod, container)
            .await
            .map_err(|e| config_error(e.to_string()))?;
        if let Some(options) = options {
            options.apply(config);
        }
        self.add_claim_devices(pod, container, config);
        Ok(())
    }

    /// runAsNonRoot is checked against the user the container runs as, as upstream does: an
    /// explicit `runAsUser` (0 is refused without looking at the image), else the image's.
    async fn check_run_as_non_root(
        &self,
        pod: &Pod,
        container: &Container,
        seen: Option<Image>,
    ) -> Result<(), WaitingReason> {
        if !translate::needs_image_user(pod, container) {
            return translate::verify_run_as_non_root(pod, container, None, "")
                .map_err(|e| config_error(e.to_string()));
        }
        let image = container.image.clone().unwrap_or_default();
        let found = match seen {
            Some(img) => Some(img),
            None => self.rt.image_status(image.clone()).await.map_err(|err| {
                config_error(format!("cannot read the user of image {image:?}: {err}"))
            })?,
        };
        let Some(img) = found else {
            return Err(config_error(format!(
                "cannot read the user of image {image:?}: not present"
            )));
        };
        let (uid, username) = translate::image_user(&img);
        translate::verify_run_as_non_root(pod, container, uid, &username)
            .map_err(|e| config_error(e.to_string()))
    }

    /// postStart runs right after the start, and the worker waits for it, as upstream; when it
    /// fails the container is killed.
    async fn post_start(
        &self,
        pod: &Pod,
        container: &Container,
        id: &str,
        pod_ip: Option<&str>,
    ) -> Result<(), WaitingReason> {
        let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return Ok(());
        };
        let result = run_hook(
            &self.rt,
            HookKind::PostStart,
            hook,
            container,
            id,
            pod_ip,
            // Upstream bounds a postStart hook by the runtime request timeout.
            self.node.runtime_request_timeout,
        )
        .await;
        let Err(err) = result else {
            return Ok(());
        };
        let message = err.to_string();
        tracing::warn!(%message, "FailedPostStartHook: killing the container");
        // As upstream, the hook's output stays out of the events (it may hold secrets).
        let name = container.name.as_str();
        let events = &self.events;
        events.container(
            pod,
            name,
            EventType::Warning,
            reason::FAILED_POST_START_HOOK,
            "PostStartHook failed",
        );
        events.container(
            pod,
            name,
            EventType::Normal,
            reason::KILLING,
            "FailedPostStartHook",
        );
        if let Err(err) = self.stop_container(id, grace_period(Some(pod), None)).await {
            tracing::warn!(error = %err, "cannot kill the container after its postStart hook failed");
        }
        Err(WaitingReason::new(WaitReason::PostStartHookError, message))
    }
}

/// The "Failed" event for a container that could not start, in upstream's words: the image
/// reasons by name ("Error: ErrImagePull"), other errors with their message. A postStart
/// failure has its own events, and a crash-loop wait its BackOff event.
fn failed_event_message(waiting: &WaitingReason) -> Option<String> {
    match waiting.reason {
        WaitReason::ErrImagePull | WaitReason::ImagePullBackOff | WaitReason::ErrImageNeverPull => {
            Some(format!("Error: {}", waiting.reason.as_str()))
        }
        WaitReason::CreateContainerConfigError
        | WaitReason::CreateContainerError
        | WaitReason::RunContainerError => Some(format!("Error: {}", waiting.message)),
        WaitReason::PostStartHookError
        | WaitReason::CrashLoopBackOff
        | WaitReason::ContainerCreating => None,
    }
}

/// The FailedMount event for volumes that could not be set up, in upstream's words: a volume
/// whose plugin failed is named with its reason (`MountVolume.SetUp failed for volume "x" :
/// configmap "y" not found`); a volume no plugin serves keeps the pod from mounting at all.
/// The spec of the container a start names (init, app or ephemeral, by index); an ephemeral
/// container as the plain container it is started as.
fn spec_of<'p>(pod: &'p Pod, start: &StartContainer) -> Option<Cow<'p, Container>> {
    let spec = pod.spec.as_ref()?;
    match start.kind {
        ContainerKind::Init => spec
            .init_containers
            .as_ref()?
            .get(start.index)
            .map(Cow::Borrowed),
        ContainerKind::App => spec.containers.get(start.index).map(Cow::Borrowed),
        ContainerKind::Ephemeral => spec
            .ephemeral_containers
            .as_ref()?
            .get(start.index)
            .map(|ec| Cow::Owned(ephemeral::as_container(ec))),
    }
}

/// An ephemeral container's `targetContainerName` names no container of the pod (upstream's
/// message).
#[derive(Debug, thiserror::Error)]
#[error("unable to find target container {0}")]
struct TargetNotFound(String);

/// The container whose PID namespace an ephemeral container joins: the newest instance of its
/// `targetContainerName`, in whatever state (upstream's `getTargetID`, with its message when
/// there is none). `None` for every other container, and for an ephemeral one without a target.
fn pid_target(
    pod: &Pod,
    start: &StartContainer,
    observed: &ObservedPod,
) -> Result<Option<String>, TargetNotFound> {
    if start.kind != ContainerKind::Ephemeral {
        return Ok(None);
    }
    let Some(target) = ephemeral::of(pod)
        .get(start.index)
        .and_then(|ec| ec.target_container_name.as_deref())
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    match observed.latest(target) {
        Some(inst) => Ok(Some(inst.id.clone())),
        None => Err(TargetNotFound(target.to_string())),
    }
}

pub(super) fn failed_mount_message(message: &str, err: Option<&VolumeError>) -> String {
    match err {
        Some(VolumeError::SetUp { reason, .. }) if !matches!(**reason, VolumeProblem::Plan(_)) => {
            message.to_string()
        }
        Some(VolumeError::NewMounter { .. }) => message.to_string(),
        Some(VolumeError::NodeAffinity { .. }) => message.to_string(),
        _ => format!("Unable to attach or mount volumes: {message}"),
    }
}

/// Why the pod's `runtimeClassName` cannot be honoured, if it names one. Deckhand runs every
/// sandbox with containerd's default runtime handler and does not read RuntimeClass objects
/// yet, so a pod asking for another runtime waits with this message rather than running on
/// one it did not ask for.
pub(super) fn unsupported_runtime_class(pod: &Pod) -> Option<String> {
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref())
        .filter(|n| !n.is_empty())?;
    Some(format!(
        "RuntimeClass {name:?} is not supported by this node: Deckhand runs pods with the \
         container runtime's default handler only"
    ))
}

/// Records on a container the `RestartAllContainers` round it is made for, so that the next
/// look tells it from the earlier rounds' instances (`base::restart_round`).
fn record_round(config: &mut ContainerConfig, round: Option<&str>) {
    if let Some(round) = round {
        config.annotations.insert(
            crate::base::cri_labels::RESTART_ROUND_ANNOTATION.into(),
            round.to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn failed_events_name_image_reasons_and_carry_other_messages() {
        let rows = [
            (WaitReason::ErrImagePull, "x", Some("Error: ErrImagePull")),
            (
                WaitReason::ImagePullBackOff,
                "x",
                Some("Error: ImagePullBackOff"),
            ),
            (
                WaitReason::ErrImageNeverPull,
                "x",
                Some("Error: ErrImageNeverPull"),
            ),
            (
                WaitReason::CreateContainerConfigError,
                "secret \"s\" not found",
                Some("Error: secret \"s\" not found"),
            ),
            (WaitReason::RunContainerError, "boom", Some("Error: boom")),
            (WaitReason::PostStartHookError, "x", None),
            (WaitReason::CrashLoopBackOff, "x", None),
        ];
        for (reason, message, want) in rows {
            let got = failed_event_message(&WaitingReason::new(reason, message));
            assert_eq!(got.as_deref(), want, "{reason:?}");
        }
    }

    #[test]
    fn a_runtime_class_is_refused_by_name_and_none_or_empty_is_fine() {
        let pod = |rc: Option<&str>| Pod {
            spec: Some(PodSpec {
                runtime_class_name: rc.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(unsupported_runtime_class(&pod(None)), None);
        assert_eq!(unsupported_runtime_class(&pod(Some(""))), None);
        assert!(
            unsupported_runtime_class(&pod(Some("gvisor")))
                .unwrap()
                .starts_with("RuntimeClass \"gvisor\" is not supported")
        );
    }
}
