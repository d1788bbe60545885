//! Pod-level resources (`spec.resources` of a pod, upstream's `PodLevelResources`): whether a
//! pod sets them, and what a container runs with under them. Pure.
//!
//! Only cpu, memory and huge pages count at pod level (upstream's
//! `IsSupportedPodLevelResource`); a pod whose `spec.resources` names none of them is sized
//! from its containers as before. Under pod-level resources a container that sets no cpu or
//! memory limit of its own is limited by the pod's (upstream's `getCPULimit`/`getMemoryLimit`
//! and, for resize, `kubeutil.GetLimits`): the pod's budget is the container's ceiling.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity;

/// Whether `name` may be set at pod level.
pub(crate) fn is_supported(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

fn names_supported(list: Option<&BTreeMap<String, Quantity>>) -> bool {
    list.is_some_and(|l| l.keys().any(|k| is_supported(k)))
}

/// The pod's `spec.resources` when it sets a supported resource (upstream's
/// `IsPodLevelResourcesSet`), else `None`.
pub(crate) fn pod_resources(pod: &Pod) -> Option<&ResourceRequirements> {
    pod.spec
        .as_ref()?
        .resources
        .as_ref()
        .filter(|r| names_supported(r.requests.as_ref()) || names_supported(r.limits.as_ref()))
}

/// Whether the pod sets a supported pod-level request (upstream's `IsPodLevelRequestsSet`).
pub(crate) fn requests_set(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .is_some_and(|r| names_supported(r.requests.as_ref()))
}

/// A limit that is set and not zero.
fn nonzero(list: Option<&BTreeMap<String, Quantity>>, name: &str) -> Option<Quantity> {
    list?
        .get(name)
        .filter(|q| quantity::parse(&q.0).is_ok_and(|v| !v.is_zero()))
        .cloned()
}

/// The container's resources with the pod-level cpu and memory limits standing in for those
/// it does not set (upstream's `GetLimits`): what the runtime limits it to. `pod_level` is the
/// pod's `spec.resources` (or its actuated counterpart), `None` without pod-level resources.
pub(crate) fn effective_resources(
    pod_level: Option<&ResourceRequirements>,
    container: &ResourceRequirements,
) -> ResourceRequirements {
    let mut out = container.clone();
    let Some(pod_level) = pod_level else {
        return out;
    };
    for name in ["cpu", "memory"] {
        if nonzero(out.limits.as_ref(), name).is_some() {
            continue;
        }
        if let Some(q) = nonzero(pod_level.limits.as_ref(), name) {
            out.limits
                .get_or_insert_with(BTreeMap::new)
                .insert(name.to_string(), q);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn res(v: serde_json::Value) -> ResourceRequirements {
        serde_json::from_value(v).expect("resources")
    }

    fn pod(resources: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c"}], "resources": resources}}),
        )
        .expect("pod")
    }

    #[test]
    fn only_cpu_memory_and_huge_pages_make_pod_level_resources() {
        let cases = [
            ("none", json!(null), false, false),
            ("empty", json!({}), false, false),
            ("cpu request", json!({"requests": {"cpu": "1"}}), true, true),
            (
                "memory limit",
                json!({"limits": {"memory": "1Gi"}}),
                true,
                false,
            ),
            (
                "huge pages",
                json!({"limits": {"hugepages-2Mi": "4Mi"}}),
                true,
                false,
            ),
            (
                "only ephemeral storage",
                json!({"requests": {"ephemeral-storage": "1Gi"}}),
                false,
                false,
            ),
        ];
        for (what, r, set, requests) in cases {
            let p = pod(r);
            assert_eq!(pod_resources(&p).is_some(), set, "{what}");
            assert_eq!(requests_set(&p), requests, "{what}");
        }
    }

    #[test]
    fn a_container_without_its_own_limit_takes_the_pods() {
        let pod_level = res(json!({"limits": {"cpu": "200m", "memory": "100Mi"}}));
        let cases = [
            (
                "no resources",
                json!({}),
                json!({"limits": {"cpu": "200m", "memory": "100Mi"}}),
            ),
            (
                "own cpu limit kept",
                json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "100m"}}),
                json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "100m", "memory": "100Mi"}}),
            ),
            (
                "zero counts as unset",
                json!({"limits": {"memory": "0"}}),
                json!({"limits": {"cpu": "200m", "memory": "100Mi"}}),
            ),
        ];
        for (what, c, want) in cases {
            assert_eq!(
                effective_resources(Some(&pod_level), &res(c)),
                res(want),
                "{what}"
            );
        }
        let own = res(json!({"requests": {"cpu": "50m"}}));
        assert_eq!(
            effective_resources(None, &own),
            own,
            "no pod-level resources"
        );
    }
}
