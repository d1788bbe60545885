//! What the status says of in-place resize: the node's `PodResizePending` verdict, which the
//! sync loop puts in the conditions of the pod it gives the worker
//! (`kubelet::sync_loop`'s resize part), and each container's `allocatedResources` and
//! `resources`. Pure.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodStatus, ResourceRequirements,
};

use crate::base::observed::ContainerState as RtState;
use crate::kubelet::admission::resize::{RESIZE_IN_PROGRESS, RESIZE_PENDING};

/// `PodResizeInProgress`'s reason when the last try to carry the resize out failed
/// (upstream's `PodReasonError`).
const RESIZE_ERROR: &str = "Error";

/// The conditions with the pod's `PodResizePending` verdict added, its transition time kept
/// from the previous status while the condition stays (the reason may change meanwhile, as
/// upstream keeps it).
pub(crate) fn with_resize_verdict(
    mut conditions: Vec<PodCondition>,
    pod: &Pod,
    previous: Option<&PodStatus>,
    now: SystemTime,
) -> Vec<PodCondition> {
    let verdict = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == RESIZE_PENDING));
    let Some(verdict) = verdict else {
        return conditions;
    };
    let kept = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == RESIZE_PENDING))
        .and_then(|c| c.last_transition_time.clone());
    let mut c = verdict.clone();
    c.last_transition_time = Some(kept.unwrap_or_else(|| super::time(now)));
    c.last_probe_time = None;
    conditions.push(c);
    conditions
}

/// A container's `allocatedResources` (the requests the node allocated it) and, once it has an
/// instance, its `resources`: the allocation (the container is the spec as the node runs it),
/// which [`with_actuated`] replaces by what a running instance was last given. A container
/// with no requests or limits shows `resources: {}`, as upstream's
/// `convertContainerStatusResources` writes it (the resize e2e specs read it as given); one
/// never created shows none.
pub(crate) fn resources(
    container: &Container,
    state: Option<RtState>,
    status: &mut ContainerStatus,
) {
    let allocated = container.resources.clone().unwrap_or_default();
    status.allocated_resources = allocated.requests.clone().filter(|r| !r.is_empty());
    if state.is_some() {
        status.resources = Some(ResourceRequirements {
            requests: allocated.requests,
            limits: allocated.limits,
            claims: None,
        });
    }
}

/// The status with what the running containers run with: each running container's
/// `resources` as it was last given (`actuated`, by container ID), and `PodResizeInProgress`
/// while one of them runs with other resources than it was allocated (upstream clears it once
/// every container has its allocation), with reason `Error` and the error as its message when
/// the last try to carry the resize out failed (`error`).
pub(crate) fn with_actuated(
    mut status: PodStatus,
    pod: &Pod,
    actuated: &std::collections::HashMap<String, ResourceRequirements>,
    error: Option<&str>,
    previous: Option<&PodStatus>,
    now: SystemTime,
) -> PodStatus {
    let mut in_progress = false;
    let statuses = status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten());
    for cs in statuses {
        let running = cs.state.as_ref().is_some_and(|s| s.running.is_some());
        let id = cs
            .container_id
            .as_deref()
            .and_then(|id| id.split_once("://"))
            .map(|(_, id)| id);
        let Some(given) = id.and_then(|id| actuated.get(id)).filter(|_| running) else {
            continue;
        };
        let allocated = cs.resources.clone().unwrap_or_default();
        if !crate::kubelet::admission::resize::same_resources(&allocated, given) {
            in_progress = true;
        }
        cs.resources = Some(ResourceRequirements {
            requests: given.requests.clone(),
            limits: given.limits.clone(),
            claims: None,
        });
    }
    let kept = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == RESIZE_IN_PROGRESS))
        .and_then(|c| c.last_transition_time.clone());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != RESIZE_IN_PROGRESS);
    if in_progress {
        conditions.push(PodCondition {
            type_: RESIZE_IN_PROGRESS.to_string(),
            status: "True".to_string(),
            reason: error.map(|_| RESIZE_ERROR.to_string()),
            message: error.map(str::to_string),
            last_transition_time: Some(kept.unwrap_or_else(|| super::time(now))),
            observed_generation: super::observed_generation(pod),
            ..Default::default()
        });
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning};
    use serde_json::json;

    fn res(v: serde_json::Value) -> ResourceRequirements {
        serde_json::from_value(v).expect("resources")
    }

    /// A status whose one running container `app` (ID c1) was allocated 200m.
    fn status() -> PodStatus {
        PodStatus {
            conditions: Some(vec![]),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some("containerd://c1".into()),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }),
                resources: Some(res(json!({"requests": {"cpu": "200m"}}))),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn in_progress(s: &PodStatus) -> bool {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == RESIZE_IN_PROGRESS && c.status == "True")
    }

    #[test]
    fn every_created_container_shows_its_resources_an_empty_list_as_empty() {
        let best_effort = Container {
            name: "be".into(),
            ..Default::default()
        };
        let burstable = Container {
            name: "b".into(),
            resources: Some(res(json!({"requests": {"cpu": "20m"}}))),
            ..Default::default()
        };
        let cases = [
            // (what, container, state, resources shown, allocatedResources shown)
            (
                "BestEffort, running",
                &best_effort,
                Some(RtState::Running),
                Some(res(json!({}))),
                None,
            ),
            (
                "BestEffort, exited",
                &best_effort,
                Some(RtState::Exited),
                Some(res(json!({}))),
                None,
            ),
            (
                "never created",
                &burstable,
                None,
                None,
                Some(json!({"cpu": "20m"})),
            ),
            (
                "exited: the allocation",
                &burstable,
                Some(RtState::Exited),
                Some(res(json!({"requests": {"cpu": "20m"}}))),
                Some(json!({"cpu": "20m"})),
            ),
        ];
        for (what, c, state, want, want_allocated) in cases {
            let mut status = ContainerStatus::default();
            resources(c, state, &mut status);
            assert_eq!(status.resources, want, "{what}");
            let allocated = status
                .allocated_resources
                .map(|a| serde_json::to_value(a).unwrap());
            assert_eq!(allocated, want_allocated, "{what}");
        }
        // What a running BestEffort container was given (nothing) is shown as `{}` too.
        let mut s = status();
        s.container_statuses.as_mut().unwrap()[0].resources = Some(res(json!({})));
        let given = std::collections::HashMap::from([("c1".to_string(), res(json!({})))]);
        let s = with_actuated(
            s,
            &Pod::default(),
            &given,
            None,
            None,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            s.container_statuses.as_ref().unwrap()[0].resources,
            Some(res(json!({})))
        );
        assert!(!in_progress(&s));
    }

    #[test]
    fn resources_show_what_runs_and_the_resize_is_in_progress_until_applied() {
        let pod = Pod::default();
        let now = SystemTime::UNIX_EPOCH;
        let old = std::collections::HashMap::from([(
            "c1".to_string(),
            res(json!({"requests": {"cpu": "100m"}})),
        )]);
        let s = with_actuated(status(), &pod, &old, None, None, now);
        assert!(in_progress(&s));
        let shown = s.container_statuses.as_ref().unwrap()[0].resources.clone();
        assert_eq!(shown, Some(res(json!({"requests": {"cpu": "100m"}}))));
        let s = with_actuated(
            status(),
            &pod,
            &old,
            Some("cannot decrease memory limits: x"),
            None,
            now,
        );
        let c = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == RESIZE_IN_PROGRESS)
            .unwrap();
        assert_eq!(c.reason.as_deref(), Some("Error"), "a failed try is told");
        assert_eq!(
            c.message.as_deref(),
            Some("cannot decrease memory limits: x")
        );
        let applied = std::collections::HashMap::from([(
            "c1".to_string(),
            res(json!({"requests": {"cpu": "0.2"}})),
        )]);
        let s = with_actuated(status(), &pod, &applied, None, None, now);
        assert!(!in_progress(&s), "cleared once applied");
    }
}
