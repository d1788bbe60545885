//! What the status says of in-place resize: the node's `PodResizePending` verdict, which the
//! sync loop puts in the conditions of the pod it gives the worker
//! (`kubelet::sync_loop`'s resize part), and each container's `allocatedResources` and
//! `resources`. Pure.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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
/// every container has its allocation), or the pod's cgroup with other pod-level resources
/// (`actuated_pod`, what it was last given), with reason `Error` and the error as its message
/// when the last try to carry the resize out failed (`error`). The pod-level fields as
/// [`with_pod_level`] writes them.
pub(crate) fn with_actuated(
    mut status: PodStatus,
    pod: &Pod,
    (actuated, actuated_pod): (
        &std::collections::HashMap<String, ResourceRequirements>,
        Option<&ResourceRequirements>,
    ),
    error: Option<&str>,
    previous: Option<&PodStatus>,
    now: SystemTime,
) -> PodStatus {
    let mut in_progress = with_pod_level(&mut status, pod, actuated_pod);
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

/// A pod's summed requests as quantities (upstream's `PodRequests`): sums in millicores for
/// cpu and units for the rest, pod-level requests as the pod spells them (a `10m` of memory
/// stays `10m`, where a sum in bytes would round it up).
fn pod_requests(pod: &Pod) -> BTreeMap<String, Quantity> {
    let mut out: BTreeMap<String, Quantity> = crate::kubelet::cm::pod_config::pod_requests(pod)
        .into_iter()
        .map(|(name, v)| {
            let q = if name == "cpu" {
                format!("{v}m")
            } else {
                v.to_string()
            };
            (name, Quantity(q))
        })
        .collect();
    let spec = pod.spec.as_ref();
    let no_overhead = spec
        .and_then(|s| s.overhead.as_ref())
        .is_none_or(|o| o.is_empty());
    if no_overhead && crate::base::podspec::pod_level::requests_set(pod) {
        let pod_level = spec
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref());
        for (name, q) in pod_level.into_iter().flatten() {
            if crate::base::podspec::pod_level::is_supported(name) {
                out.insert(name.clone(), q.clone());
            }
        }
    }
    out
}

/// Writes the pod-level fields of a running pod's status (upstream's
/// `InPlacePodLevelResourcesVerticalScaling` ones): `allocatedResources`, the pod's requests
/// at its allocation, pod-level requests standing for what they name; and, for a pod with
/// pod-level resources, `resources`: what the pod's cgroup was last given (`actuated_pod`; the
/// allocation's while none is recorded), its memory request the containers' sum when the pod
/// sets none. Upstream reads these values back from the cgroup; they are what was written to
/// it. True when the cgroup's pod-level resources are not the allocation's yet.
fn with_pod_level(
    status: &mut PodStatus,
    pod: &Pod,
    actuated_pod: Option<&ResourceRequirements>,
) -> bool {
    let requests = pod_requests(pod);
    status.allocated_resources = (!requests.is_empty()).then(|| requests.clone());
    let Some(wanted) = crate::base::podspec::pod_level::pod_resources(pod) else {
        return false;
    };
    let given = actuated_pod.unwrap_or(wanted);
    let mut shown = ResourceRequirements {
        claims: None,
        ..given.clone()
    };
    if let Some(memory) = requests.get("memory") {
        shown
            .requests
            .get_or_insert_with(BTreeMap::new)
            .entry("memory".to_string())
            .or_insert_with(|| memory.clone());
    }
    status.resources = Some(shown);
    let running = status
        .container_statuses
        .iter()
        .flatten()
        .any(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()));
    running && !crate::kubelet::admission::resize::same_resources(wanted, given)
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
            (&given, None),
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
        let s = with_actuated(status(), &pod, (&old, None), None, None, now);
        assert!(in_progress(&s));
        let shown = s.container_statuses.as_ref().unwrap()[0].resources.clone();
        assert_eq!(shown, Some(res(json!({"requests": {"cpu": "100m"}}))));
        let s = with_actuated(
            status(),
            &pod,
            (&old, None),
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
        let s = with_actuated(status(), &pod, (&applied, None), None, None, now);
        assert!(!in_progress(&s), "cleared once applied");
    }

    #[test]
    fn pod_level_fields_show_the_allocation_and_what_the_pod_cgroup_was_given() {
        let now = SystemTime::UNIX_EPOCH;
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "200m"}}}],
            "resources": {"requests": {"cpu": "5m", "memory": "25m"}},
        }}))
        .expect("pod");
        let was = res(json!({"requests": {"cpu": "4m", "memory": "10m"}}));
        let given = std::collections::HashMap::from([(
            "c1".to_string(),
            res(json!({"requests": {"cpu": "200m"}})),
        )]);
        let s = with_actuated(status(), &pod, (&given, Some(&was)), None, None, now);
        assert_eq!(
            serde_json::to_value(&s.allocated_resources).unwrap(),
            json!({"cpu": "5m", "memory": "25m"}),
            "the pod-level requests as spelled"
        );
        assert_eq!(s.resources, Some(was.clone()));
        assert!(in_progress(&s), "the pod cgroup is not resized yet");
        let pod_level = pod.spec.as_ref().unwrap().resources.clone().unwrap();
        let s = with_actuated(status(), &pod, (&given, Some(&pod_level)), None, None, now);
        assert!(!in_progress(&s));

        let plain: Pod = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "50m"}}},
        ]}}))
        .expect("pod");
        let s = with_actuated(status(), &plain, (&given, None), None, None, now);
        assert_eq!(
            serde_json::to_value(&s.allocated_resources).unwrap(),
            json!({"cpu": "150m", "memory": "67108864"})
        );
        assert_eq!(s.resources, None, "no pod-level resources, nothing shown");
    }
}
