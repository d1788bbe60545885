//! Making a container's image available: look it up, ask the pure image step
//! ([`crate::runtime::images`]) what to do, and pull under the progress deadline.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Container;

use crate::cri::proto::{Image, PodSandboxConfig};
use crate::cri::pull_progress::pull_with_progress_deadline;
use crate::cri::{ImageService, RuntimeService};
use crate::status::{WaitReason, WaitingReason};

use super::super::backoff::BackoffTable;
use super::super::images::{ImageStep, PullPolicy, backoff_key, image_step};
use super::Executor;

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Makes sure the image is present, as the container's pull policy says. Returns the
    /// image's record when it was already there (its user is needed for `runAsNonRoot`).
    /// Pull failures are recorded in `backoff` under the image's key.
    pub(super) async fn ensure_image(
        &self,
        container: &Container,
        sandbox_config: &PodSandboxConfig,
        backoff: &mut BackoffTable,
    ) -> Result<Option<Image>, WaitingReason> {
        let image = container.image.clone().unwrap_or_default();
        let found = self.rt.image_status(image.clone()).await.map_err(|err| {
            WaitingReason::new(
                WaitReason::ErrImagePull,
                format!("cannot check image {image:?}: {err}"),
            )
        })?;
        let key = backoff_key(&image);
        let now = SystemTime::now();
        match image_step(
            &image,
            PullPolicy::of(container),
            found.is_some(),
            backoff.get(&key),
            self.policy,
            now,
        ) {
            ImageStep::Ready => return Ok(found),
            ImageStep::Wait(waiting) => return Err(waiting),
            ImageStep::Pull => {}
        }
        tracing::info!(%image, "pulling image");
        let pulled = pull_with_progress_deadline(
            &self.rt,
            image.clone(),
            Some(sandbox_config.clone()),
            self.node.image_pull_progress_deadline,
        )
        .await;
        match pulled {
            Ok(_) => {
                backoff.remove(&key);
                Ok(None)
            }
            Err(err) => {
                let entry = self.policy.next(backoff.get(&key), now);
                backoff.insert(key, entry);
                Err(WaitingReason::new(
                    WaitReason::ErrImagePull,
                    format!("failed to pull image {image:?}: {err}"),
                ))
            }
        }
    }
}
