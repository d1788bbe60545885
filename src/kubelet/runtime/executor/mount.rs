//! Setting a pod's volumes up before anything of it starts, as upstream's volume manager does:
//! each volume on its own, and one that fails is tried again only after its back-off
//! (`kubelet::volume::backoff`: 500 ms doubling to 2 m 2 s), or at once when what it is made
//! from changed (the configMap it waits for appeared: the object's watch pokes the pod).
//! Each try that fails is told once: one `FailedMount` event, whose log line is the warning.
//! While a volume waits, the pod's containers wait in `ContainerCreating` with its last error
//! and the worker looks again when the first back-off ends ([`PodSyncState::start_blocked`]).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{Pod, Volume};
use tokio::time::Instant;

use crate::base::clock;
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::api_objects::PodObjects;
use crate::kubelet::events::{EventType, reason};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};
use crate::kubelet::volume::backoff::{POD_DIR, Turn};
use crate::kubelet::volume::{self, PodVolumes, VolumeAttempt, VolumeSetupError, csi};

use super::super::actions::PodActions;
use super::super::revisit::ERROR_RETRY;
use super::start::failed_mount_message;
use super::{Executor, PodSyncState, pod_uid};

/// How often the claim of a volume that waits for it is read again. Upstream's populator
/// reads it every 100 ms; once a second is enough to start within a second of the binding.
const CLAIM_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// What the blocking part of a set-up came to.
enum SetUp {
    /// The pod directory is there; the volumes that were due were tried.
    Tried(Vec<VolumeAttempt>),
    /// The pod directory could not be made (nothing else was tried).
    NoPodDir(String),
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Makes the pod's directory and sets up the volumes whose turn it is. `Some` when every
    /// volume is ready; else the containers to start wait in `ContainerCreating` and the sync
    /// ends with [`PodSyncState::start_blocked`] set.
    pub(super) async fn set_up_volumes(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        decision: &PodActions,
        state: &mut PodSyncState,
    ) -> Option<PodVolumes> {
        let now = clock::instant();
        let specs: Vec<&Volume> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .collect();
        state
            .mounts
            .retain(|name| name == POD_DIR || specs.iter().any(|v| v.name == name));
        let inputs: HashMap<String, u64> = specs
            .iter()
            .map(|v| (v.name.clone(), volume::volume_inputs(pod, v, objects)))
            .collect();
        let mut volumes = PodVolumes::default();
        let pod_dir_turn = state.mounts.turn(POD_DIR, 0, now);
        if !matches!(pod_dir_turn, Turn::Wait(_)) {
            let due = due_volumes(&specs, &inputs, state, now);
            match self.try_set_up(pod, objects, due).await {
                SetUp::Tried(attempts) => {
                    state.mounts.succeeded(POD_DIR);
                    volumes = self.note_attempts(pod, attempts, &inputs, now, state);
                }
                SetUp::NoPodDir(message) => {
                    let wait = state.mounts.failed(POD_DIR, 0, now, message.clone());
                    tracing::debug!(retry_in_ms = wait.as_millis() as u64, error = %message, "cannot make the pod's directory; backing off");
                    self.events.pod(
                        pod,
                        EventType::Warning,
                        reason::FAILED,
                        format!("error making pod data directories: {message}"),
                    );
                }
            }
        }
        let ready = state.mounts.message(POD_DIR).is_none()
            && specs.iter().all(|v| volumes.paths.contains_key(&v.name));
        if ready {
            return Some(volumes);
        }
        // The first problem in the spec's order is the one the containers wait on.
        let message = std::iter::once(POD_DIR)
            .chain(specs.iter().map(|v| v.name.as_str()))
            .find_map(|name| state.mounts.message(name))
            .unwrap_or("volumes are not ready")
            .to_string();
        for start in &decision.start_containers {
            state.waiting.insert(
                start.name.clone(),
                WaitingReason::new(WaitReason::ContainerCreating, message.clone()),
            );
        }
        let mut next = state.mounts.next_try(now).unwrap_or(ERROR_RETRY);
        // A claim cannot be watched (the Node authorizer allows a get only): while one waits,
        // it is read again this often, and the volume is tried as soon as it changed.
        let claim_waits = specs
            .iter()
            .any(|v| v.persistent_volume_claim.is_some() && !volumes.paths.contains_key(&v.name));
        if claim_waits {
            next = next.min(CLAIM_RECHECK);
        }
        state.start_blocked = Some(next);
        None
    }

    /// Makes the pod directory and tries the `due` volumes, on a blocking thread.
    async fn try_set_up(&self, pod: &Pod, objects: &PodObjects, due: HashSet<String>) -> SetUp {
        let manager = self.volumes.clone();
        let owned = pod.clone();
        let owned_objects = objects.clone();
        let uid = pod_uid(pod).to_string();
        let ran = tokio::task::spawn_blocking(move || {
            manager.ensure_pod_dir(&uid)?;
            Ok::<_, VolumeSetupError>(
                manager.setup_each(&owned, &owned_objects, &|name| due.contains(name)),
            )
        })
        .await;
        match ran {
            Ok(Ok(attempts)) => SetUp::Tried(attempts),
            Ok(Err(e)) => SetUp::NoPodDir(e.to_string()),
            Err(join) => SetUp::NoPodDir(join.to_string()),
        }
    }

    /// Keeps each try's outcome in the back-off, tells each failure in one event, and returns
    /// the volumes that are ready.
    fn note_attempts(
        &self,
        pod: &Pod,
        attempts: Vec<VolumeAttempt>,
        inputs: &HashMap<String, u64>,
        now: Instant,
        state: &mut PodSyncState,
    ) -> PodVolumes {
        let mut volumes = PodVolumes::default();
        for attempt in attempts {
            match attempt.result {
                Ok(set_up) => {
                    state.mounts.succeeded(&attempt.name);
                    volumes.add(attempt.name, set_up);
                }
                Err(err) => {
                    let message = err.to_string();
                    let made_from = inputs.get(&attempt.name).copied().unwrap_or_default();
                    let wait = state
                        .mounts
                        .failed(&attempt.name, made_from, now, message.clone());
                    // The event's own line is the one warning of this try.
                    tracing::debug!(volume = %attempt.name, retry_in_ms = wait.as_millis() as u64, "volume set-up failed; backing off");
                    self.events.pod(
                        pod,
                        EventType::Warning,
                        reason::FAILED_MOUNT,
                        failed_mount_message(&message, Some(&err)),
                    );
                }
            }
        }
        volumes
    }
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Publishes again the running pod's CSI volumes whose driver asks for it
    /// (`requiresRepublish`, see `volume::csi::republish`): on every sync, as upstream's
    /// remount, so at least once per `syncFrequency`. A failure is told in a `FailedMount`
    /// event and tried again after its back-off; the volume stays mounted and the pod runs on.
    pub(super) async fn republish_csi(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        state: &mut PodSyncState,
    ) {
        let specs: Vec<&Volume> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .collect();
        state
            .republish
            .retain(|name| specs.iter().any(|v| v.name == name));
        // Only a CSI volume, or a claim's, can be one: the others need no look at the disk.
        if !specs
            .iter()
            .any(|v| v.csi.is_some() || v.persistent_volume_claim.is_some())
        {
            return;
        }
        let manager = self.volumes.clone();
        let uid = pod_uid(pod).to_string();
        let published = tokio::task::spawn_blocking(move || manager.csi_published(&uid))
            .await
            .unwrap_or_default();
        let now = clock::instant();
        let due = csi::republish::due(&published, &state.republish, now);
        if !due.is_empty() {
            let due: HashSet<String> = due.into_iter().collect();
            let (manager, owned, owned_objects) =
                (self.volumes.clone(), pod.clone(), objects.clone());
            let attempts = tokio::task::spawn_blocking(move || {
                manager.republish_each(&owned, &owned_objects, &|name| due.contains(name))
            })
            .await
            .unwrap_or_default();
            self.note_republished(pod, attempts, now, state);
        }
        state.republish_retry = state.republish.next_try(now);
    }

    /// Keeps each republish's outcome in its back-off and tells each failure in one event
    /// (upstream's remount failure: `MountVolume.SetUp failed for volume …`).
    fn note_republished(
        &self,
        pod: &Pod,
        attempts: Vec<VolumeAttempt>,
        now: Instant,
        state: &mut PodSyncState,
    ) {
        for attempt in attempts {
            match attempt.result {
                Ok(_) => {
                    state.republish.succeeded(&attempt.name);
                    tracing::debug!(volume = %attempt.name, "CSI volume published again");
                }
                Err(err) => {
                    let message = err.to_string();
                    let wait = state
                        .republish
                        .failed(&attempt.name, 0, now, message.clone());
                    // The event's own line is the one warning of this try.
                    tracing::debug!(volume = %attempt.name, retry_in_ms = wait.as_millis() as u64, "CSI volume republish failed; backing off");
                    self.events
                        .pod(pod, EventType::Warning, reason::FAILED_MOUNT, message);
                }
            }
        }
    }
}

/// The volumes whose turn it is: never failed, back-off over, or made from something that
/// changed since.
fn due_volumes(
    specs: &[&Volume],
    inputs: &HashMap<String, u64>,
    state: &PodSyncState,
    now: Instant,
) -> HashSet<String> {
    let mut due = HashSet::new();
    for v in specs {
        let made_from = inputs.get(&v.name).copied().unwrap_or_default();
        match state.mounts.turn(&v.name, made_from, now) {
            Turn::Try => {}
            Turn::Changed => {
                tracing::debug!(volume = %v.name, "what the volume is made from changed; tried before its back-off ends");
            }
            Turn::Wait(_) => continue,
        }
        due.insert(v.name.clone());
    }
    due
}
