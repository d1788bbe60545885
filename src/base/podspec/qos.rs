//! Pod QoS class, by the upstream rules.
//!
//! Only CPU and memory count. Requests and limits are summed over init and regular containers:
//! nothing set anywhere → BestEffort; every container limits both CPU and memory and the summed
//! requests equal the summed limits → Guaranteed; anything else → Burstable. A request left out
//! but with a limit given counts as equal to the limit (API-server defaulting, which pods read
//! from files never went through).
//!
//! A pod with pod-level resources (`spec.resources` naming cpu, memory or huge pages) takes its
//! class from them alone (upstream's `ComputePodQOS` with `PodLevelResourcesFixKubeletQOSClass`):
//! each of cpu and memory is Guaranteed when its request equals a non-zero limit, BestEffort
//! when neither is set, Burstable otherwise; the pod is Guaranteed or BestEffort only when both
//! agree.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::quantity;

/// The three QoS classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The name used in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// A resource amount in thousandths, or None when absent, zero or unparseable.
fn amount(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    name: &str,
) -> Option<i128> {
    let q = quantity::parse(&map?.get(name)?.0).ok()?;
    (!q.is_zero()).then(|| i128::from(q.milli_value()))
}

/// Effective (request, limit) of one container for one resource, in thousandths.
pub(crate) fn request_and_limit(container: &Container, name: &str) -> (Option<i128>, Option<i128>) {
    let res = container.resources.as_ref();
    let limit = amount(res.and_then(|r| r.limits.as_ref()), name);
    let request = amount(res.and_then(|r| r.requests.as_ref()), name).or(limit);
    (request, limit)
}

/// The class one set of requirements makes (upstream's `requirementsQOS`), a request left out
/// counting as its limit.
fn requirements_qos(r: &ResourceRequirements) -> QosClass {
    let mut classes = QOS_RESOURCES.iter().map(|name| {
        let limit = amount(r.limits.as_ref(), name);
        let request = amount(r.requests.as_ref(), name).or(limit);
        match (request, limit) {
            (None, None) => QosClass::BestEffort,
            (Some(a), Some(b)) if a == b => QosClass::Guaranteed,
            _ => QosClass::Burstable,
        }
    });
    let first = classes.next().unwrap_or(QosClass::BestEffort);
    if classes.all(|c| c == first) {
        first
    } else {
        QosClass::Burstable
    }
}

/// The QoS class of a pod.
pub fn qos_class(pod: &Pod) -> QosClass {
    if let Some(pod_level) = super::pod_level::pod_resources(pod) {
        return requirements_qos(pod_level);
    }
    let containers = super::pod::init_and_app_containers(pod);

    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    for c in containers {
        let mut limited = 0;
        for name in QOS_RESOURCES {
            let (req, lim) = request_and_limit(c, name);
            if let Some(r) = req {
                *requests.entry(name).or_default() += r;
            }
            if let Some(l) = lim {
                *limits.entry(name).or_default() += l;
                limited += 1;
            }
        }
        if limited != QOS_RESOURCES.len() {
            guaranteed = false;
        }
    }

    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed && requests == limits {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn res(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Q>> {
        if pairs.is_empty() {
            return None;
        }
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Q(v.to_string())))
                .collect(),
        )
    }

    fn c(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: res(requests),
                limits: res(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: (!init.is_empty()).then_some(init),
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn qos_table() {
        let both = [("cpu", "500m"), ("memory", "64Mi")];
        let cases: Vec<(&str, Pod, QosClass)> = vec![
            (
                "nothing set",
                pod(vec![], vec![c("a", &[], &[])]),
                QosClass::BestEffort,
            ),
            ("no spec at all", Pod::default(), QosClass::BestEffort),
            (
                "requests equal limits",
                pod(vec![], vec![c("a", &both, &both)]),
                QosClass::Guaranteed,
            ),
            (
                "only limits (requests default to them)",
                pod(vec![], vec![c("a", &[], &both)]),
                QosClass::Guaranteed,
            ),
            (
                "same amount, different spelling",
                pod(
                    vec![],
                    vec![c("a", &[("cpu", "0.5"), ("memory", "67108864")], &both)],
                ),
                QosClass::Guaranteed,
            ),
            (
                "request below limit",
                pod(
                    vec![],
                    vec![c("a", &[("cpu", "250m"), ("memory", "64Mi")], &both)],
                ),
                QosClass::Burstable,
            ),
            (
                "only a cpu request",
                pod(vec![], vec![c("a", &[("cpu", "100m")], &[])]),
                QosClass::Burstable,
            ),
            (
                "memory limit missing",
                pod(vec![], vec![c("a", &[], &[("cpu", "1")])]),
                QosClass::Burstable,
            ),
            (
                "one guaranteed, one best-effort container",
                pod(vec![], vec![c("a", &both, &both), c("b", &[], &[])]),
                QosClass::Burstable,
            ),
            (
                // Every container, init ones included, must limit both resources.
                "init container without limits",
                pod(vec![c("init", &[], &[])], vec![c("a", &both, &both)]),
                QosClass::Burstable,
            ),
            (
                "init container with a bare request",
                pod(
                    vec![c("init", &[("memory", "1Mi")], &[])],
                    vec![c("a", &both, &both)],
                ),
                QosClass::Burstable,
            ),
            (
                "zero quantities count as unset",
                pod(vec![], vec![c("a", &[("cpu", "0")], &[("memory", "0")])]),
                QosClass::BestEffort,
            ),
            (
                "other resources are ignored",
                pod(vec![], vec![c("a", &[("ephemeral-storage", "1Gi")], &[])]),
                QosClass::BestEffort,
            ),
        ];
        for (what, pod, want) in cases {
            assert_eq!(qos_class(&pod), want, "{what}");
        }
    }

    #[test]
    fn pod_level_resources_decide_the_class_alone() {
        let with = |pod_level: serde_json::Value, containers: Vec<Container>| {
            let mut p = pod(vec![], containers);
            p.spec.as_mut().expect("spec").resources =
                Some(serde_json::from_value(pod_level).expect("resources"));
            p
        };
        let both = [("cpu", "500m"), ("memory", "64Mi")];
        let cases = [
            (
                "equal requests and limits, containers without resources",
                with(
                    serde_json::json!({"requests": {"cpu": "1", "memory": "1Gi"},
                                       "limits": {"cpu": "1", "memory": "1Gi"}}),
                    vec![c("a", &[], &[])],
                ),
                QosClass::Guaranteed,
            ),
            (
                "only limits (requests default to them)",
                with(
                    serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
                    vec![c("a", &[], &[])],
                ),
                QosClass::Guaranteed,
            ),
            (
                "a cpu request alone, guaranteed containers",
                with(
                    serde_json::json!({"requests": {"cpu": "1"}}),
                    vec![c("a", &both, &both)],
                ),
                QosClass::Burstable,
            ),
            (
                "request below limit",
                with(
                    serde_json::json!({"requests": {"cpu": "1", "memory": "1Gi"},
                                       "limits": {"cpu": "2", "memory": "1Gi"}}),
                    vec![c("a", &[], &[])],
                ),
                QosClass::Burstable,
            ),
            (
                "unsupported pod-level resources fall back to the containers",
                with(
                    serde_json::json!({"requests": {"ephemeral-storage": "1Gi"}}),
                    vec![c("a", &both, &both)],
                ),
                QosClass::Guaranteed,
            ),
        ];
        for (what, pod, want) in cases {
            assert_eq!(qos_class(&pod), want, "{what}");
        }
    }
}
