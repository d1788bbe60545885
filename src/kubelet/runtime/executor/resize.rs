//! Carrying an allocated resize out (upstream's `doPodResizeAction`): the pod cgroup's limits
//! grown first, `UpdateContainerResources` for each container the decision resizes in place,
//! then the pod cgroup's new settings (which shrinks what shrank). What each container was
//! given is kept in the worker's state (upstream's actuated resources), which the next
//! decision and the status read.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

use super::{Executor, PodSyncState};
use crate::base::observed::{ContainerState, ObservedPod};
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::runtime::actions::PodActions;
use crate::kubelet::runtime::translate::container::linux_resources;

/// The resources of the spec's container `name` (app container or sidecar).
fn spec_resources(pod: &Pod, name: &str) -> Option<ResourceRequirements> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .map(|c| c.resources.clone().unwrap_or_default())
}

/// Records what the running instances run with: an instance not known yet (just started, or
/// adopted after a restart of the agent) runs with its spec's resources as the pod has them
/// now. Instances no longer running are forgotten.
pub(super) fn note_actuated(pod: &Pod, observed: &ObservedPod, state: &mut PodSyncState) {
    let running: HashMap<&str, &str> = observed
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    state
        .actuated
        .retain(|id, _| running.contains_key(id.as_str()));
    for (id, name) in running {
        if !state.actuated.contains_key(id)
            && let Some(r) = spec_resources(pod, name)
        {
            state.actuated.insert(id.to_string(), r);
        }
    }
}

/// The pod as it ran before the resize: each resized container at its actuated resources.
fn before_resize(pod: &Pod, decision: &PodActions, state: &PodSyncState) -> Pod {
    let mut before = pod.clone();
    if let Some(spec) = before.spec.as_mut() {
        for r in &decision.resize_containers {
            let c = spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten())
                .find(|c| c.name == r.name);
            if let Some(c) = c
                && let Some(was) = state.actuated.get(&r.id)
            {
                c.resources = Some(was.clone());
            }
        }
    }
    before
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Resizes the decision's containers in place, the pod cgroup around them.
    pub(super) async fn resize_in_place(
        &self,
        pod: &Pod,
        decision: &PodActions,
        state: &mut PodSyncState,
    ) -> Result<(), CriError> {
        if decision.resize_containers.is_empty() {
            return Ok(());
        }
        let before = before_resize(pod, decision, state);
        self.set_pod_cgroup(&before, pod, true).await;
        for r in &decision.resize_containers {
            let Some(c) = pod.spec.as_ref().and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == r.name)
            }) else {
                continue;
            };
            let linux = match linux_resources(pod, c, self.node.node_memory_bytes, &self.resources)
            {
                Ok(linux) => linux,
                Err(error) => {
                    tracing::warn!(container = %r.name, error = %error, "cannot translate the container's new resources");
                    continue;
                }
            };
            tracing::info!(container = %r.name, container_id = %r.id, "resizing the container in place");
            self.rt
                .update_container_resources(r.id.clone(), linux)
                .await?;
            state
                .actuated
                .insert(r.id.clone(), c.resources.clone().unwrap_or_default());
        }
        self.set_pod_cgroup(&before, pod, false).await;
        Ok(())
    }

    /// Writes the pod cgroup's settings for a resize from `before` to `after`: during it
    /// (`during`) each limit at the larger of the two, else `after`'s. A refusal is logged, as
    /// upstream logs it; the containers' own limits still hold.
    async fn set_pod_cgroup(&self, before: &Pod, after: &Pod, during: bool) {
        let Some(cgroups) = self.cgroups.clone() else {
            return;
        };
        let (before, after) = (before.clone(), after.clone());
        let written = tokio::task::spawn_blocking(move || {
            let new = cgroups.pod_config(&after);
            let config = if during {
                crate::kubelet::cm::resize::grown(&cgroups.pod_config(&before), &new)
            } else {
                new
            };
            cgroups.set_pod_resources(&after, &config)
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %error, "cannot resize the pod's cgroup");
            }
            Err(error) => tracing::warn!(error = %error, "the pod cgroup task failed"),
        }
    }
}
