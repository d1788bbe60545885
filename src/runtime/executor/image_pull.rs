//! Making a container's image available: look it up, ask the pure image step
//! ([`crate::runtime::images`]) what to do, and pull under the progress deadline.

use std::time::{Instant, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::format_go_duration;
use crate::cri::proto::{Image, PodSandboxConfig};
use crate::cri::pull_progress::pull_with_progress_deadline;
use crate::cri::{ImageService, RuntimeService};
use crate::events::{EventType, reason};
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
        pod: &Pod,
        container: &Container,
        sandbox_config: &PodSandboxConfig,
        backoff: &mut BackoffTable,
    ) -> Result<Option<Image>, WaitingReason> {
        let image = container.image.clone().unwrap_or_default();
        let event = |kind, why, message: String| {
            self.events
                .container(pod, &container.name, kind, why, message)
        };
        let found = self.rt.image_status(image.clone()).await.map_err(|err| {
            event(
                EventType::Warning,
                reason::INSPECT_FAILED,
                format!("Failed to inspect image {image:?}: {err}"),
            );
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
            ImageStep::Ready => {
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(found);
            }
            ImageStep::Wait(waiting) => {
                // Upstream's wording and types: the back-off is Normal, never-pull a Warning.
                let (kind, why) = match waiting.reason {
                    WaitReason::ErrImageNeverPull => {
                        (EventType::Warning, reason::ERR_IMAGE_NEVER_PULL)
                    }
                    _ => (EventType::Normal, reason::BACK_OFF),
                };
                event(kind, why, waiting.message.clone());
                return Err(waiting);
            }
            ImageStep::Pull => {}
        }
        tracing::info!(%image, "pulling image");
        event(
            EventType::Normal,
            reason::PULLING,
            format!("Pulling image {image:?}"),
        );
        let began = Instant::now();
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
                let took = format_go_duration(truncate_to_millis(began.elapsed()));
                let size = match self.rt.image_status(image.clone()).await {
                    Ok(Some(img)) => img.size.to_string(),
                    _ => "unknown".to_string(),
                };
                event(
                    EventType::Normal,
                    reason::PULLED,
                    format!(
                        "Successfully pulled image {image:?} in {took} ({took} including waiting). Image size: {size} bytes."
                    ),
                );
                Ok(None)
            }
            Err(err) => {
                event(
                    EventType::Warning,
                    reason::FAILED,
                    format!("Failed to pull image {image:?}: {err}"),
                );
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

/// Upstream shows pull times to the millisecond.
fn truncate_to_millis(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}
