//! Making a container's image available: look it up, ask the pure image step
//! ([`crate::kubelet::runtime::images`]) what to do, and pull under the progress deadline with the
//! credentials of the pod's `imagePullSecrets` ([`crate::kubelet::pull_credentials`]) that match the image,
//! each in turn until one works, as upstream.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};

use crate::base::clock;
use crate::clients::cri::proto::{AuthConfig, Image, PodSandboxConfig};
use crate::clients::cri::pull_progress::pull_with_progress_deadline;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::config::format_go_duration;
use crate::kubelet::api_objects::PodObjects;
use crate::kubelet::events::{EventType, reason};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};
use crate::kubelet::pull_credentials::{Credential, Keyring};

use super::super::backoff::BackoffTable;
use super::super::images::{ImageStep, PullPolicy, backoff_key, image_step};
use super::Executor;

/// An image to make present, and whose it is: a container's (the events name the container)
/// or an image volume's (`container: None`: the events are the pod's, as upstream pulls
/// volumes with the pod's reference).
pub(super) struct PullFor<'a> {
    pub image: &'a str,
    pub policy: PullPolicy,
    pub container: Option<&'a str>,
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Makes sure the container's image is present, as its pull policy says (see
    /// [`Self::ensure_image_for`]).
    pub(super) async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: &PodSandboxConfig,
        objects: &PodObjects,
        backoff: &mut BackoffTable,
        pull_errors: &mut HashMap<String, String>,
    ) -> Result<Option<Image>, WaitingReason> {
        let target = PullFor {
            image: container.image.as_deref().unwrap_or_default(),
            policy: PullPolicy::of(container),
            container: Some(&container.name),
        };
        self.ensure_image_for(pod, &target, sandbox_config, objects, backoff, pull_errors)
            .await
    }

    /// Makes sure the image is present, as the policy says. Returns the image's record when it
    /// was already there (its user is needed for `runAsNonRoot`). Pull failures are recorded
    /// in `backoff` under the image's key, shared by the pod's containers and image volumes.
    pub(super) async fn ensure_image_for(
        &self,
        pod: &Pod,
        target: &PullFor<'_>,
        sandbox_config: &PodSandboxConfig,
        objects: &PodObjects,
        backoff: &mut BackoffTable,
        pull_errors: &mut HashMap<String, String>,
    ) -> Result<Option<Image>, WaitingReason> {
        let image = target.image.to_string();
        let event = |kind, why, message: String| match target.container {
            Some(name) => self.events.container(pod, name, kind, why, message),
            None => self.events.pod(pod, kind, why, message),
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
        let now = clock::now();
        match image_step(
            &image,
            target.policy,
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
            ImageStep::Wait(mut waiting) => {
                // Upstream's wording and types: the back-off is Normal, never-pull a Warning.
                let (kind, why) = match waiting.reason {
                    WaitReason::ErrImageNeverPull => {
                        (EventType::Warning, reason::ERR_IMAGE_NEVER_PULL)
                    }
                    _ => (EventType::Normal, reason::BACK_OFF),
                };
                event(kind, why, waiting.message.clone());
                // The status also says why the last pull failed; the event does not, as upstream.
                if waiting.reason == WaitReason::ImagePullBackOff
                    && let Some(last) = pull_errors.get(&key)
                {
                    waiting.message = format!("{}: ErrImagePull: {last}", waiting.message);
                }
                return Err(waiting);
            }
            ImageStep::Pull => {}
        }
        pull_errors.remove(&key);
        // As upstream: the pod's pull secrets are read first; a missing one is only worth an
        // event when the pull then fails, and one that does not parse fails the pull.
        let (secrets, missing) = pull_secrets(pod, objects);
        let keyring = match Keyring::from_secrets(secrets.iter().map(|s| s.as_ref())) {
            Ok(k) => k,
            Err(err) => {
                tracing::warn!(%image, error = %err, "cannot read the pod's image pull secrets");
                event(
                    EventType::Warning,
                    reason::FAILED,
                    format!("Failed to pull image {image:?}: {err}"),
                );
                let entry = self.policy.next(backoff.get(&key), now, now);
                backoff.insert(key.clone(), entry);
                pull_errors.insert(key, err.to_string());
                return Err(WaitingReason::new(
                    WaitReason::ErrImagePull,
                    err.to_string(),
                ));
            }
        };
        let credentials = keyring.lookup(&image);
        tracing::info!(%image, credentials = credentials.len(), "pulling image");
        event(
            EventType::Normal,
            reason::PULLING,
            format!("Pulling image {image:?}"),
        );
        let began = clock::instant();
        let pulled = self.pull_with(&image, &credentials, sandbox_config).await;
        match pulled {
            Ok(()) => {
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
                if !missing.is_empty() {
                    self.events.pod(
                        pod,
                        EventType::Warning,
                        reason::FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET,
                        format!(
                            "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                            missing.join(", ")
                        ),
                    );
                }
                let entry = self.policy.next(backoff.get(&key), now, now);
                backoff.insert(key.clone(), entry);
                let message = format!("failed to pull image {image:?}: {err}");
                pull_errors.insert(key, message.clone());
                Err(WaitingReason::new(WaitReason::ErrImagePull, message))
            }
        }
    }

    /// Pulls without credentials when none match, else with each in turn until one works
    /// (upstream's order: the most specific registry key first). All failing gives every
    /// error, as upstream's aggregate: one alone, several as `[a, b]`.
    async fn pull_with(
        &self,
        image: &str,
        credentials: &[Credential],
        sandbox_config: &PodSandboxConfig,
    ) -> Result<(), PullError> {
        let auths: Vec<Option<AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            credentials.iter().map(|c| Some(auth_config(c))).collect()
        };
        let mut errors = Vec::new();
        for (i, auth) in auths.into_iter().enumerate() {
            let from = credentials.get(i).map(|c| c.source.as_str());
            match pull_with_progress_deadline(
                &self.rt,
                image.to_string(),
                auth,
                Some(sandbox_config.clone()),
                self.node.image_pull_progress_deadline,
            )
            .await
            {
                Ok(_) => return Ok(()),
                Err(err) => {
                    if let Some(secret) = from {
                        tracing::debug!(%image, %secret, error = %err, "pull with this secret's credentials failed");
                    }
                    errors.push(err);
                }
            }
        }
        Err(PullError(errors))
    }
}

/// The pod's pull secrets that could be read, and the names of those that could not.
fn pull_secrets(pod: &Pod, objects: &PodObjects) -> (Vec<std::sync::Arc<Secret>>, Vec<String>) {
    let namespace = crate::base::podspec::pod::namespace(pod);
    let mut found = Vec::new();
    let mut missing = Vec::new();
    let names = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty());
    for name in names {
        match objects.secret(namespace, name) {
            Ok(secret) => {
                let mut secret = secret.clone();
                // The watch's objects carry their namespace; a fake's may not.
                secret
                    .metadata
                    .namespace
                    .get_or_insert_with(|| namespace.to_string());
                secret.metadata.name.get_or_insert_with(|| name.to_string());
                found.push(std::sync::Arc::new(secret));
            }
            Err(err) => {
                tracing::info!(secret = %name, error = %err, "unable to retrieve pull secret, the image pull may not succeed");
                missing.push(name.to_string());
            }
        }
    }
    (found, missing)
}

/// CRI's credential: username and password (an `auth` entry is decoded into them, as upstream),
/// or docker's identity and registry tokens.
fn auth_config(c: &Credential) -> AuthConfig {
    AuthConfig {
        username: c.username.clone(),
        password: c.password.clone(),
        identity_token: c.identity_token.clone(),
        registry_token: c.registry_token.clone(),
        ..Default::default()
    }
}

/// The errors of every attempt of one pull.
#[derive(Debug)]
struct PullError(Vec<CriError>);

impl std::fmt::Display for PullError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                let parts: Vec<String> = many.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", parts.join(", "))
            }
        }
    }
}

/// Upstream shows pull times to the millisecond.
fn truncate_to_millis(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis() as u64)
}
