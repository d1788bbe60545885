//! Pulling a pod's image volumes before its containers start (the decisions are in
//! [`crate::kubelet::runtime::image_volumes`]): each image through the container image step
//! ([`Executor::ensure_image_for`]), then its ID into CRI's image mount.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use crate::base::clock;
use crate::clients::cri::proto::{ImageSpec, PodSandboxConfig};
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::api_objects::PodObjects;
use crate::kubelet::pod_status::{WaitReason, WaitingReason};

use super::super::image_volumes::{ImageVolume, image_volumes, runtime_refusal};
use super::image_pull::PullFor;
use super::{Executor, PodSyncState};

/// What the pulls of a pod's image volumes came to for one start.
#[derive(Clone, Debug, Default)]
pub(super) struct ImageVolumePulls {
    /// The image each volume whose image is present mounts, by volume name.
    pub specs: HashMap<String, ImageSpec>,
    /// Why each other volume has no image: what a container mounting it waits for.
    pub failed: HashMap<String, WaitingReason>,
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Pulls every image volume of the pod, as upstream's `getImageVolumes` does before the
    /// containers of a sync start (whether or not a container starting now mounts it); on a
    /// runtime that cannot mount images, none is pulled and each is refused.
    pub(super) async fn pull_image_volumes(
        &self,
        pod: &Pod,
        sandbox_config: &PodSandboxConfig,
        objects: &PodObjects,
        state: &mut PodSyncState,
    ) -> ImageVolumePulls {
        let mut out = ImageVolumePulls::default();
        let volumes = image_volumes(pod);
        if volumes.is_empty() {
            return out;
        }
        if let Some(refusal) = self.image_volume_refusal().await {
            tracing::warn!(reason = %refusal, "cannot mount the pod's image volumes");
            for v in volumes {
                let waiting = WaitingReason::new(WaitReason::CreateContainerError, &refusal);
                out.failed.insert(v.name, waiting);
            }
            return out;
        }
        for volume in volumes {
            let began = clock::instant();
            let pulled = self
                .pull_one(pod, &volume, sandbox_config, objects, state)
                .await;
            state.image_time += began.elapsed();
            match pulled {
                Ok(spec) => {
                    out.specs.insert(volume.name, spec);
                }
                Err(waiting) => {
                    tracing::warn!(volume = %volume.name, image = %volume.reference, reason = %waiting.reason, "the image volume's image is not there");
                    out.failed.insert(volume.name, waiting);
                }
            }
        }
        out
    }

    async fn pull_one(
        &self,
        pod: &Pod,
        volume: &ImageVolume,
        sandbox_config: &PodSandboxConfig,
        objects: &PodObjects,
        state: &mut PodSyncState,
    ) -> Result<ImageSpec, WaitingReason> {
        let target = PullFor {
            image: &volume.reference,
            policy: volume.policy,
            container: None,
        };
        let found = self
            .ensure_image_for(
                pod,
                &target,
                sandbox_config,
                objects,
                &mut state.backoff,
                &mut state.pull_errors,
            )
            .await?;
        // The runtime mounts the image by its ID, as upstream passes the pull's image ref.
        let id = match found {
            Some(image) => image.id,
            None => match self.rt.image_status(volume.reference.clone()).await {
                Ok(Some(image)) => image.id,
                _ => volume.reference.clone(),
            },
        };
        Ok(ImageSpec {
            image: id,
            user_specified_image: volume.reference.clone(),
            annotations: pod
                .metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            ..Default::default()
        })
    }

    /// Why the runtime cannot mount image volumes (its name and version, asked each time: pods
    /// with image volumes are few), or `None`.
    async fn image_volume_refusal(&self) -> Option<String> {
        match self.rt.version().await {
            Ok(v) => runtime_refusal(&v.runtime_name, &v.runtime_version),
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the runtime's version");
                None
            }
        }
    }
}
