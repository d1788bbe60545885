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

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};

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
    let wanted = amount(
        &c.resources.clone().unwrap_or_default(),
        true,
        "memory",
        false,
    );
    let was = amount(actuated, true, "memory", false);
    (wanted != 0 && (was == 0 || wanted < was)).then_some(wanted)
}

/// Why a container's memory limit cannot go down to `limit` while it uses `usage` bytes, in
/// upstream's words (`validateMemoryResizeAction`); `None` when it can.
pub(crate) fn below_usage(name: &str, limit: i64, usage: u64) -> Option<String> {
    (usage >= u64::try_from(limit).unwrap_or(0)).then(|| {
        format!("attempting to set container {name:?} memory limit ({limit}) below current usage ({usage})")
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
