//! Which running containers an allocated resize reaches, and how (upstream's
//! `computePodResizeAction`): pure.
//!
//! A container runs with the resources it was last given (at its start, or by the last
//! `UpdateContainerResources`): its *actuated* resources, which the worker keeps. When the
//! allocation (the container's spec as the node runs it) differs in what the runtime enforces
//! (the cpu request as shares, the cpu limit, the memory limit), the container's `resizePolicy`
//! for each changed resource says whether the change is applied in place
//! (`NotRequired`, the default) or by restarting the container (`RestartContainer`). A change
//! of the memory request alone counts too, as upstream: under `NotRequired` it is recorded in
//! place (nothing in the runtime enforces it), under `RestartContainer` the container restarts.
//!
//! Under pod-level resources (`spec.resources`) a container without a cpu or memory limit of
//! its own runs limited by the pod's, so a pod-level resize reaches it too: both sides are
//! compared with the pod's limits standing in ([`PodLevel`], upstream's
//! `containerResourcesFromRequirements`), and the pod-level resources themselves resize the
//! pod's cgroup ([`pod_level_changed`]).

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};

use crate::base::podspec::pod_level::effective_resources;
use crate::base::podspec::quantity;

/// How a container takes a resize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResizeStep {
    /// `UpdateContainerResources` with the new resources.
    InPlace,
    /// Stop the container and start it again with them.
    Restart,
}

/// One amount of a resource list (0 when absent or unparseable: no request, no limit).
fn amount(r: &ResourceRequirements, limits: bool, name: &str, milli: bool) -> i64 {
    let list = if limits { &r.limits } else { &r.requests };
    list.as_ref()
        .and_then(|l| l.get(name))
        .and_then(|q| quantity::parse(&q.0).ok())
        .map_or(0, |q| if milli { q.milli_value() } else { q.value() })
}

/// The cpu request as the runtime enforces it: shares, where no request means the limit and
/// neither means the minimum (upstream's `MilliCPUToShares`, with 2 as its floor).
fn cpu_request(r: &ResourceRequirements) -> i64 {
    let requested = r.requests.as_ref().is_some_and(|l| l.contains_key("cpu"));
    let milli = if requested {
        amount(r, false, "cpu", true)
    } else {
        amount(r, true, "cpu", true)
    };
    (milli * 1024 / 1000).max(2)
}

/// Whether `resource`'s change restarts the container, per its `resizePolicy`.
fn restarts_for(c: &Container, resource: &str) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == resource)
        .is_some_and(|p| p.restart_policy == "RestartContainer")
}

/// The pod-level resources a container's resize is judged under: what the allocation sets
/// (`wanted`) and what the pod's cgroup was last given (`actuated`); both `None` without
/// pod-level resources.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PodLevel<'a> {
    pub wanted: Option<&'a ResourceRequirements>,
    pub actuated: Option<&'a ResourceRequirements>,
}

impl PodLevel<'_> {
    /// The container as the runtime limits it at the allocation, and what it runs with, both
    /// with the pod's limits standing in for those it does not set.
    fn effective(
        &self,
        c: &Container,
        actuated: &ResourceRequirements,
    ) -> (Container, ResourceRequirements) {
        let own = c.resources.clone().unwrap_or_default();
        let wanted = Container {
            resources: Some(effective_resources(self.wanted, &own)),
            ..c.clone()
        };
        (wanted, effective_resources(self.actuated, actuated))
    }

    fn is_set(&self) -> bool {
        self.wanted.is_some() || self.actuated.is_some()
    }
}

/// [`resize_step`] under pod-level resources.
pub(crate) fn resize_step_under(
    c: &Container,
    actuated: &ResourceRequirements,
    pod: PodLevel,
) -> Option<ResizeStep> {
    if !pod.is_set() {
        return resize_step(c, actuated);
    }
    let (wanted, actuated) = pod.effective(c, actuated);
    resize_step(&wanted, &actuated)
}

/// [`lowered_memory_limit`] under pod-level resources.
pub(crate) fn lowered_memory_limit_under(
    c: &Container,
    actuated: &ResourceRequirements,
    pod: PodLevel,
) -> Option<i64> {
    if !pod.is_set() {
        return lowered_memory_limit(c, actuated);
    }
    let (wanted, actuated) = pod.effective(c, actuated);
    lowered_memory_limit(&wanted, &actuated)
}

/// Whether the pod-level resources the pod's cgroup was given differ from the allocation's
/// (upstream's `computePodLevelResourcesResizeAction`), semantically.
pub(crate) fn pod_level_changed(pod: PodLevel) -> bool {
    let wanted = pod.wanted.cloned().unwrap_or_default();
    let actuated = pod.actuated.cloned().unwrap_or_default();
    !crate::kubelet::admission::resize::same_resources(&wanted, &actuated)
}

/// The pod-level memory limit an in-place resize lowers the pod's cgroup to (or sets where
/// there was none); `None` when it does not go down.
pub(crate) fn lowered_pod_memory_limit(pod: PodLevel) -> Option<i64> {
    lowered_memory(pod.wanted, pod.actuated)
}

/// Why the pod's memory limit cannot go down to `limit` while the pod uses `usage` bytes, in
/// upstream's words; `None` when it can.
pub(crate) fn pod_below_usage(limit: i64, usage: u64) -> Option<String> {
    limit_below_usage("pod", limit, usage)
}

/// How the running container `c` takes its allocation, given what it runs with; `None` when
/// nothing changed.
pub(crate) fn resize_step(c: &Container, actuated: &ResourceRequirements) -> Option<ResizeStep> {
    let wanted = c.resources.clone().unwrap_or_default();
    let cpu_changed = cpu_request(&wanted) != cpu_request(actuated)
        || amount(&wanted, true, "cpu", true) != amount(actuated, true, "cpu", true);
    let memory_limit_changed =
        amount(&wanted, true, "memory", false) != amount(actuated, true, "memory", false);
    let memory_request_changed =
        amount(&wanted, false, "memory", false) != amount(actuated, false, "memory", false);
    if (cpu_changed && restarts_for(c, "cpu"))
        || ((memory_limit_changed || memory_request_changed) && restarts_for(c, "memory"))
    {
        return Some(ResizeStep::Restart);
    }
    (cpu_changed || memory_limit_changed || memory_request_changed).then_some(ResizeStep::InPlace)
}

/// The memory limit an in-place resize sets on a running container when that limit goes down
/// (or appears): the container must use less than it, or the kernel refuses the write.
/// `None` when the memory limit does not go down.
pub(crate) fn lowered_memory_limit(c: &Container, actuated: &ResourceRequirements) -> Option<i64> {
    lowered_memory(c.resources.as_ref(), Some(actuated))
}

/// The memory limit `wanted` sets when it lowers the one `was` set (or sets one where there
/// was none); `None` when it does not go down. Missing requirements set no limit.
fn lowered_memory(
    wanted: Option<&ResourceRequirements>,
    was: Option<&ResourceRequirements>,
) -> Option<i64> {
    let limit =
        |r: Option<&ResourceRequirements>| r.map_or(0, |r| amount(r, true, "memory", false));
    let (wanted, was) = (limit(wanted), limit(was));
    (wanted != 0 && (was == 0 || wanted < was)).then_some(wanted)
}

/// Why a container's memory limit cannot go down to `limit` while it uses `usage` bytes, in
/// upstream's words (`validateMemoryResizeAction`); `None` when it can.
pub(crate) fn below_usage(name: &str, limit: i64, usage: u64) -> Option<String> {
    limit_below_usage(&format!("container {name:?}"), limit, usage)
}

/// Upstream's words for a memory limit of `subject` (`container "c1"`, `pod`) that cannot go
/// down to `limit` while `usage` bytes are in use; `None` when it can.
fn limit_below_usage(subject: &str, limit: i64, usage: u64) -> Option<String> {
    (usage >= u64::try_from(limit).unwrap_or(0)).then(|| {
        format!("attempting to set {subject} memory limit ({limit}) below current usage ({usage})")
    })
}

/// The resize error of the memory limits that cannot go down (upstream's aggregate: one
/// error as it is, several in brackets).
pub(crate) fn memory_resize_error(errors: &[String]) -> String {
    let all = match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!("cannot decrease memory limits: {all}")
}

/// Why a container is restarted for a resize, in upstream's words.
pub(crate) fn restart_message(name: &str) -> String {
    format!("Container {name} resize requires restart")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn container(resources: Value, policy: Value) -> Container {
        serde_json::from_value(json!({
            "name": "c", "image": "busybox", "resources": resources, "resizePolicy": policy,
        }))
        .expect("container")
    }

    fn res(v: Value) -> ResourceRequirements {
        serde_json::from_value(v).expect("resources")
    }

    #[test]
    fn each_change_goes_in_place_or_by_restart_as_its_policy_says() {
        let was = json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"cpu": "200m", "memory": "128Mi"}});
        let restart_mem = json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        let restart_cpu = json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"},
                                 {"resourceName": "memory", "restartPolicy": "NotRequired"}]);
        let cases = [
            ("nothing changed", was.clone(), json!([]), None),
            (
                "1000m is 1 (semantically equal)",
                json!({"requests": {"cpu": "0.1", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "134217728"}}),
                json!([]),
                None,
            ),
            (
                "cpu request, default policy",
                json!({"requests": {"cpu": "150m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "128Mi"}}),
                json!([]),
                Some(ResizeStep::InPlace),
            ),
            (
                "cpu limit under a memory restart policy",
                json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "300m", "memory": "128Mi"}}),
                restart_mem.clone(),
                Some(ResizeStep::InPlace),
            ),
            (
                "memory limit under a memory restart policy",
                json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "256Mi"}}),
                restart_mem.clone(),
                Some(ResizeStep::Restart),
            ),
            (
                "memory request only under a memory restart policy (upstream restarts)",
                json!({"requests": {"cpu": "100m", "memory": "96Mi"},
                    "limits": {"cpu": "200m", "memory": "128Mi"}}),
                restart_mem,
                Some(ResizeStep::Restart),
            ),
            (
                "memory request only under the default policy",
                json!({"requests": {"cpu": "100m", "memory": "96Mi"},
                    "limits": {"cpu": "200m", "memory": "128Mi"}}),
                json!([]),
                Some(ResizeStep::InPlace),
            ),
            (
                "cpu under a cpu restart policy",
                json!({"requests": {"cpu": "120m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "128Mi"}}),
                restart_cpu.clone(),
                Some(ResizeStep::Restart),
            ),
            (
                "memory limit under NotRequired",
                json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "100Mi"}}),
                restart_cpu,
                Some(ResizeStep::InPlace),
            ),
        ];
        for (what, now, policy, want) in cases {
            assert_eq!(
                resize_step(&container(now, policy), &res(was.clone())),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn a_memory_limit_goes_down_only_above_what_the_container_uses() {
        let was = res(json!({"limits": {"memory": "30Mi"}}));
        let cases = [
            (
                "lowered",
                json!({"limits": {"memory": "10Ki"}}),
                &was,
                Some(10240),
            ),
            ("raised", json!({"limits": {"memory": "35Mi"}}), &was, None),
            (
                "unchanged",
                json!({"limits": {"memory": "30Mi"}}),
                &was,
                None,
            ),
            ("removed", json!({}), &was, None),
        ];
        for (what, now, actuated, want) in cases {
            let c = container(now, json!([]));
            assert_eq!(lowered_memory_limit(&c, actuated), want, "{what}");
        }
        let added = container(json!({"limits": {"memory": "64Mi"}}), json!([]));
        assert_eq!(
            lowered_memory_limit(&added, &res(json!({}))),
            Some(64 << 20)
        );
        assert_eq!(below_usage("c1", 10240, 10239), None);
        let error = below_usage("c1", 10240, 10240).expect("at the usage");
        assert_eq!(
            memory_resize_error(std::slice::from_ref(&error)),
            "cannot decrease memory limits: attempting to set container \"c1\" memory limit \
             (10240) below current usage (10240)"
        );
        assert_eq!(
            memory_resize_error(&["a".into(), "b".into()]),
            "cannot decrease memory limits: [a, b]"
        );
    }

    #[test]
    fn a_pod_level_resize_reaches_containers_without_limits_of_their_own() {
        let pod_was = res(json!({"requests": {"cpu": "40m", "memory": "100Mi"},
                                 "limits": {"cpu": "40m", "memory": "100Mi"}}));
        let pod_cpu = res(json!({"requests": {"cpu": "80m", "memory": "100Mi"},
                                 "limits": {"cpu": "80m", "memory": "100Mi"}}));
        let restart_cpu = json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]);
        let own = json!({"requests": {"cpu": "20m", "memory": "20Mi"},
                         "limits": {"cpu": "20m", "memory": "20Mi"}});
        let cases = [
            (
                "no limits, default policy",
                json!({}),
                json!([]),
                Some(ResizeStep::InPlace),
            ),
            (
                "no limits, cpu restart",
                json!({}),
                restart_cpu.clone(),
                Some(ResizeStep::Restart),
            ),
            ("its own limits: untouched", own.clone(), restart_cpu, None),
        ];
        for (what, c, policy, want) in cases {
            let pod = PodLevel {
                wanted: Some(&pod_cpu),
                actuated: Some(&pod_was),
            };
            let actuated = res(c.clone());
            assert_eq!(
                resize_step_under(&container(c, policy), &actuated, pod),
                want,
                "{what}"
            );
        }
        let same = PodLevel {
            wanted: Some(&pod_was),
            actuated: Some(&pod_was),
        };
        assert!(!pod_level_changed(same));
        let changed = PodLevel {
            wanted: Some(&pod_cpu),
            actuated: Some(&pod_was),
        };
        assert!(pod_level_changed(changed));
        assert_eq!(lowered_pod_memory_limit(changed), None);
        let lowered = res(json!({"limits": {"memory": "10Ki"}}));
        let down = PodLevel {
            wanted: Some(&lowered),
            actuated: Some(&pod_was),
        };
        assert_eq!(lowered_pod_memory_limit(down), Some(10240));
        assert_eq!(
            lowered_memory_limit_under(&container(json!({}), json!([])), &res(json!({})), down),
            Some(10240),
            "a container without a limit of its own follows the pod's down"
        );
        assert_eq!(
            pod_below_usage(10240, 5_000_000).as_deref(),
            Some("attempting to set pod memory limit (10240) below current usage (5000000)")
        );
    }

    #[test]
    fn cpu_shares_follow_the_limit_without_a_request_and_have_a_floor() {
        // 1m and 0 both give the floor of 2 shares: nothing for the runtime to change.
        let tiny = container(json!({"requests": {"cpu": "1m"}}), json!([]));
        assert_eq!(resize_step(&tiny, &res(json!({}))), None);
        let by_limit = container(json!({"limits": {"cpu": "500m"}}), json!([]));
        assert_eq!(
            resize_step(
                &by_limit,
                &res(json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}))
            ),
            None
        );
    }
}
