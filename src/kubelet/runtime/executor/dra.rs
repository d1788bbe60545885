//! A pod's DRA claims (`kubelet::dra`): prepared before its sandbox is made, and each
//! container's CDI devices put into its config; and the health of a container's devices, from
//! both the device plugins and the DRA drivers, for its status.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceStatus};

use crate::clients::cri::proto::{CdiDevice, ContainerConfig};
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::events::{EventType, reason};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};

use super::super::actions::PodActions;
use super::{Executor, PodSyncState};

/// How soon a pod whose claims could not be prepared is looked at again. Upstream retries at
/// the pod's next resync (a minute); sooner here, so a pod starts within seconds of its claim
/// being reserved or its driver registering (one GET of each claim per try).
pub(super) const DRA_RETRY: Duration = Duration::from_secs(5);

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Prepares the pod's claims; `false` when they are not ready, with the containers to
    /// start waiting in `ContainerCreating` with the error, upstream's
    /// `FailedPrepareDynamicResources` event, and a look again after [`DRA_RETRY`].
    pub(super) async fn prepare_claims(
        &self,
        pod: &Pod,
        decision: &PodActions,
        state: &mut PodSyncState,
    ) -> bool {
        let Some(dra) = &self.node.dra else {
            return true;
        };
        let Err(err) = dra.prepare(pod).await else {
            return true;
        };
        let message = format!("prepare dynamic resources: {err}");
        tracing::warn!(error = %message, "Failed to prepare dynamic resources");
        self.events.pod(
            pod,
            EventType::Warning,
            reason::FAILED_PREPARE_DYNAMIC_RESOURCES,
            format!("Failed to prepare dynamic resources: {message}"),
        );
        for start in &decision.start_containers {
            state.waiting.insert(
                start.name.clone(),
                WaitingReason::new(WaitReason::ContainerCreating, message.clone()),
            );
        }
        state.start_blocked = Some(state.start_blocked.map_or(DRA_RETRY, |d| d.min(DRA_RETRY)));
        false
    }

    /// The CDI devices of the claims the container uses (upstream's `GetResources`), after
    /// any a device plugin gave.
    pub(super) fn add_claim_devices(
        &self,
        pod: &Pod,
        container: &Container,
        config: &mut ContainerConfig,
    ) {
        let Some(dra) = &self.node.dra else {
            return;
        };
        for name in dra.cdi_devices(pod, container) {
            if !config.cdi_devices.iter().any(|d| d.name == name) {
                config.cdi_devices.push(CdiDevice { name });
            }
        }
    }

    /// The container's `allocatedResourcesStatus` entries: the health of the device plugins'
    /// devices it holds, then of its claims' devices (upstream's container manager asks both
    /// managers in that order).
    pub(crate) fn allocated_resources_status(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Vec<ResourceStatus> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut out = match &self.node.devices {
            Some(devices) => devices.resources_status(uid, &container.name),
            None => Vec::new(),
        };
        if let Some(dra) = &self.node.dra {
            out.extend(dra.resources_status(pod, container));
        }
        out
    }

    /// The pod is gone or finished: its claims are released (upstream's
    /// `UnprepareDynamicResources`, after its containers stopped). A failure is logged; the
    /// manager tries again later.
    pub(crate) async fn release_claims(&self, uid: &str) {
        if let Some(dra) = &self.node.dra
            && let Err(err) = dra.unprepare(uid).await
        {
            tracing::warn!(pod_uid = %uid, error = %err, "cannot unprepare the pod's dynamic resources; trying again later");
        }
    }
}
