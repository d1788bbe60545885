//! Online expansion of a running pod's CSI persistent volumes (`volume::csi::expand` decides,
//! `volume::csi::expander` calls the driver): at each sync of a running pod, as the claims
//! and volumes were just read for it, each claim whose PV grew past its recorded capacity is
//! expanded by the driver and its status brought up to date, with upstream's events on the
//! pod and the claim. A failure backs off as a volume set-up does and is tried again; what
//! upstream gives up on (a read-only mount, a driver that cannot expand a volume in use, a
//! size the driver calls infeasible) is told once.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use tokio::time::Instant;

use crate::base::clock;
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::api_objects::{ApiObjects, PodObjects};
use crate::kubelet::events::{EventType, claim_ref, reason};
use crate::kubelet::volume::backoff::Turn;
use crate::kubelet::volume::csi::CsiError;
use crate::kubelet::volume::csi::expand::{self, Decision, Expansion, Failure};
use crate::kubelet::volume::csi::expander::{self, InUse};

use super::{Executor, PodSyncState, pod_uid};

/// A claim of the pod bound to a CSI persistent volume.
struct ClaimedCsi {
    /// The pod's volume name.
    volume: String,
    claim: Arc<PersistentVolumeClaim>,
    pv: Arc<PersistentVolume>,
    read_only: bool,
}

impl ClaimedCsi {
    fn pv_name(&self) -> &str {
        self.pv.metadata.name.as_deref().unwrap_or_default()
    }

    /// The key of what was settled for good at `size`.
    fn settled_key(&self, size: &str) -> String {
        format!("{}@{size}", self.volume)
    }
}

/// The pod's claims that are bound to CSI volumes, as read for this sync.
fn claimed_csi(pod: &Pod, objects: &PodObjects) -> Vec<ClaimedCsi> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let mut out = Vec::new();
    for v in volumes {
        let Some(source) = &v.persistent_volume_claim else {
            continue;
        };
        let Ok(claim) = objects.claim(&source.claim_name) else {
            continue;
        };
        let pv_name = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
        let Some(Ok(pv)) = pv_name.map(|n| objects.persistent_volume(&n)) else {
            continue;
        };
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            continue;
        };
        let read_only = source.read_only == Some(true) || csi.read_only == Some(true);
        out.push(ClaimedCsi {
            volume: v.name.clone(),
            claim,
            pv,
            read_only,
        });
    }
    out
}

fn earliest(
    a: Option<std::time::Duration>,
    b: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One expansion being tried: what it is about.
struct Attempt<'a> {
    pod: &'a Pod,
    api: &'a ApiObjects,
    used: &'a ClaimedCsi,
    expansion: &'a Expansion,
    now: Instant,
}

impl Attempt<'_> {
    /// Writes the claim's status (a merge patch).
    async fn patch(
        &self,
        claim: &PersistentVolumeClaim,
        patch: serde_json::Value,
    ) -> Result<PersistentVolumeClaim, crate::clients::apiserver::Problem> {
        let (namespace, name) = claim_names(claim);
        self.api.patch_claim_status(&namespace, &name, patch).await
    }

    /// A failed try: backed off, and said once in the log.
    fn back_off(&self, state: &mut PodSyncState, message: String, what: &str) {
        tracing::warn!(volume = %self.used.volume, error = %message, "{what}");
        let volume = &self.used.volume;
        state.expansion.failed(volume, 0, self.now, message);
    }
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Expands the running pod's CSI volumes whose claims grew (see the module doc).
    pub(super) async fn expand_csi(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        state: &mut PodSyncState,
    ) {
        let Some(api) = &self.objects else {
            return;
        };
        let claimed = claimed_csi(pod, objects);
        state
            .expansion
            .retain(|name| claimed.iter().any(|c| c.volume == name));
        let now = clock::instant();
        for used in &claimed {
            if matches!(state.expansion.turn(&used.volume, 0, now), Turn::Wait(_)) {
                continue;
            }
            match expand::decide(&used.claim, &used.pv, used.read_only) {
                Decision::Nothing => {}
                Decision::ReadOnly { size } => {
                    self.not_expanded_read_only(pod, used, &size.0, state)
                }
                Decision::Expand(expansion) => {
                    let key = used.settled_key(&expansion.size.0);
                    if !state.expansion_settled.contains(&key) {
                        let attempt = Attempt {
                            pod,
                            api,
                            used,
                            expansion: &expansion,
                            now,
                        };
                        self.expand_one(&attempt, state).await;
                    }
                }
            }
        }
        state.republish_retry = earliest(state.republish_retry, state.expansion.next_try(now));
    }

    /// Upstream's refusal to grow a read-only mount, told once per size.
    fn not_expanded_read_only(
        &self,
        pod: &Pod,
        used: &ClaimedCsi,
        size: &str,
        state: &mut PodSyncState,
    ) {
        if !state.expansion_settled.insert(used.settled_key(size)) {
            return;
        }
        let message = format!(
            "MountVolume.NodeExpandVolume failed for volume {:?} requested read-only file system",
            used.pv_name()
        );
        let failed = reason::FILE_SYSTEM_RESIZE_FAILED;
        self.events
            .pod(pod, EventType::Warning, failed, message.clone());
        let claim = claim_ref(&used.claim);
        self.events
            .record(claim, EventType::Warning, failed, message);
    }

    /// One expansion: the claim marked in progress (when tracked), the driver's
    /// `NodeExpandVolume`, then the claim's status written or the failure told.
    async fn expand_one(&self, t: &Attempt<'_>, state: &mut PodSyncState) {
        let root = self.volumes.root_dir.clone();
        let dir = self.volumes.volume_dir(
            pod_uid(t.pod),
            crate::kubelet::volume::csi::CSI_PLUGIN_DIR,
            t.used.pv_name(),
        );
        if !expander::published(&dir) {
            return;
        }
        let mut claim = (*t.used.claim).clone();
        if t.expansion.tracked {
            match t.patch(&claim, expand::in_progress_patch(&claim)).await {
                Ok(updated) => claim = updated,
                Err(problem) => {
                    let message = format!(
                        "MountVolume.NodeExpandVolume failed to mark node expansion in progress: {problem}"
                    );
                    return t.back_off(state, message, "cannot start the volume expansion");
                }
            }
        }
        let spec = t.used.pv.spec.clone().unwrap_or_default();
        let Some(source) = spec.csi.as_ref() else {
            return;
        };
        let in_use = InUse {
            dir,
            source,
            access_modes: spec.access_modes.as_deref().unwrap_or_default(),
            mount_options: spec.mount_options.as_deref().unwrap_or_default(),
        };
        match expander::expand_in_use(&root, &in_use, t.expansion.bytes).await {
            Ok(()) => self.expanded(t, &claim, state).await,
            Err(err) => self.expand_failed(t, &claim, err, state).await,
        }
    }

    /// The driver grew the volume: upstream's events, and the claim's new capacity.
    async fn expanded(
        &self,
        t: &Attempt<'_>,
        claim: &PersistentVolumeClaim,
        state: &mut PodSyncState,
    ) {
        let spec = t.pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
        let message = format!(
            "MountVolume.NodeExpandVolume succeeded for volume {:?} {node}",
            t.used.pv_name()
        );
        let ok = reason::FILE_SYSTEM_RESIZE_SUCCESSFUL;
        self.events
            .pod(t.pod, EventType::Normal, ok, message.clone());
        self.events
            .record(claim_ref(claim), EventType::Normal, ok, message);
        let patch = expand::finished_patch(claim, &t.expansion.size);
        match t.patch(claim, patch).await {
            Ok(_) => state.expansion.succeeded(&t.used.volume),
            // The next try expands again (the call is idempotent) and writes the status.
            Err(problem) => t.back_off(
                state,
                format!("mountVolume.NodeExpandVolume update pvc status failed: {problem}"),
                "volume expanded; its claim's status not written",
            ),
        }
    }

    /// The driver did not grow the volume: upstream's `VolumeResizeFailed` on the pod, and
    /// the claim told as upstream tells it for the driver's code.
    async fn expand_failed(
        &self,
        t: &Attempt<'_>,
        claim: &PersistentVolumeClaim,
        err: CsiError,
        state: &mut PodSyncState,
    ) {
        let message = format!(
            "NodeExpandVolume.NodeExpandVolume failed for volume {:?} : {err}",
            t.used.pv_name()
        );
        let failed = reason::VOLUME_RESIZE_FAILED;
        self.events
            .pod(t.pod, EventType::Warning, failed, message.clone());
        state.expansion.failed(&t.used.volume, 0, t.now, message);
        let failure = match &err {
            CsiError::Expand { code, .. } => expand::classify(*code),
            _ => Failure::Transient,
        };
        let settled = t.used.settled_key(&t.expansion.size.0);
        let infeasible = match failure {
            Failure::Transient => return,
            Failure::InUse => {
                state.expansion_settled.insert(settled);
                return;
            }
            Failure::Infeasible => {
                state.expansion_settled.insert(settled);
                true
            }
            Failure::Final => false,
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(clock::timestamp());
        let patch = expand::failed_patch(claim, &err.to_string(), infeasible, now);
        if let Err(problem) = t.patch(claim, patch).await {
            let volume = &t.used.volume;
            tracing::warn!(volume = %volume, error = %problem, "cannot mark the claim's node expansion as failed");
        }
    }
}

fn claim_names(claim: &PersistentVolumeClaim) -> (String, String) {
    (
        claim.metadata.namespace.clone().unwrap_or_default(),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}
