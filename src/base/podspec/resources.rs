//! Container resources as the downward API reads them (`resourceFieldRef`), with the node's
//! allocatable amounts (or the pod's own cpu and memory limits, under pod-level resources)
//! standing in for limits a container does not set.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};

use super::quantity;

/// What the node can give a container, standing in for a limit the container does not set.
/// Detected once at start, from the node's facts, and passed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NodeAllocatable {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
}

/// Why a `resourceFieldRef` has no value; the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResourceFieldError {
    /// The named container (empty: the current one) is not in the pod.
    #[error("container {0} not found")]
    NoContainer(String),
    #[error("invalid divisor {value:?}: {source}")]
    BadDivisor {
        value: String,
        #[source]
        source: quantity::QuantityError,
    },
    #[error("invalid {name} quantity {value:?}: {source}")]
    BadQuantity {
        name: String,
        value: String,
        #[source]
        source: quantity::QuantityError,
    },
    #[error("unsupported container resource : {0}")]
    Unsupported(String),
    #[error("invalid divisor {0:?}")]
    ZeroDivisor(String),
}

/// The value of a `resourceFieldRef`, as upstream computes it: the amount divided by the
/// divisor (default 1), rounded up; CPU in millicores before the division, the rest in bytes.
/// A limit the container does not set (or sets to zero) is the node's allocatable amount, or
/// the pod's own limit for cpu and memory when it sets one (see [`fallback_limits`]).
///
/// `current` is the container the reference belongs to (env vars); `containerName` in the
/// selector, when set, picks another container of the pod (volumes always name it).
pub(crate) fn resource_field_value(
    pod: &Pod,
    current: Option<&Container>,
    selector: &ResourceFieldSelector,
    node: &NodeAllocatable,
) -> Result<String, ResourceFieldError> {
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => pod
            .spec
            .as_ref()
            .and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == name)
            })
            .ok_or_else(|| ResourceFieldError::NoContainer(name.to_string()))?,
        None => current.ok_or_else(|| ResourceFieldError::NoContainer(String::new()))?,
    };
    // An absent or zero divisor means 1.
    let one = quantity::parse("1").expect("1 is a quantity");
    let divisor = match &selector.divisor {
        Some(q) if !q.0.is_empty() => {
            let d = quantity::parse(&q.0).map_err(|source| ResourceFieldError::BadDivisor {
                value: q.0.clone(),
                source,
            })?;
            if d.is_zero() { one } else { d }
        }
        _ => one,
    };
    let node = &fallback_limits(pod, node)?;
    let resources = container.resources.as_ref();
    let amount =
        |map: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >,
         name: &str|
         -> Result<Option<quantity::Quantity>, ResourceFieldError> {
            match map.and_then(|m| m.get(name)) {
                Some(q) => quantity::parse(&q.0).map(Some).map_err(|source| {
                    ResourceFieldError::BadQuantity {
                        name: name.to_string(),
                        value: q.0.clone(),
                        source,
                    }
                }),
                None => Ok(None),
            }
        };
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    // A limit that is absent or zero falls back to the node's allocatable amount.
    let limit = |name: &str, node_amount: i64, milli: bool| -> Result<i64, ResourceFieldError> {
        Ok(match amount(limits, name)? {
            Some(q) if !q.is_zero() => {
                if milli {
                    q.milli_value()
                } else {
                    q.value()
                }
            }
            _ => node_amount,
        })
    };
    let request = |name: &str, milli: bool| -> Result<i64, ResourceFieldError> {
        Ok(match amount(requests, name)? {
            Some(q) if milli => q.milli_value(),
            Some(q) => q.value(),
            None => 0,
        })
    };
    let (value, milli) = match selector.resource.as_str() {
        "limits.cpu" => (limit("cpu", node.cpu_millis, true)?, true),
        "limits.memory" => (limit("memory", node.memory_bytes, false)?, false),
        "limits.ephemeral-storage" => (
            limit("ephemeral-storage", node.ephemeral_storage_bytes, false)?,
            false,
        ),
        "requests.cpu" => (request("cpu", true)?, true),
        "requests.memory" => (request("memory", false)?, false),
        "requests.ephemeral-storage" => (request("ephemeral-storage", false)?, false),
        other => {
            if let Some(name) = other.strip_prefix("limits.hugepages-") {
                let name = format!("hugepages-{name}");
                (
                    amount(limits, &name)?.map(|q| q.value()).unwrap_or(0),
                    false,
                )
            } else if let Some(name) = other.strip_prefix("requests.hugepages-") {
                let name = format!("hugepages-{name}");
                (
                    amount(requests, &name)?.map(|q| q.value()).unwrap_or(0),
                    false,
                )
            } else {
                return Err(ResourceFieldError::Unsupported(other.to_string()));
            }
        }
    };
    let per = if milli {
        divisor.milli_value()
    } else {
        divisor.value()
    };
    if per <= 0 {
        return Err(ResourceFieldError::ZeroDivisor(
            selector
                .divisor
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_default(),
        ));
    }
    Ok(ceil_div(value, per).to_string())
}

/// What stands in for a limit a container does not set: the node's allocatable amounts, with
/// the pod's cpu and memory limits in their place when the pod sets them (upstream's
/// `defaultPodLimitsForDownwardAPI` under `PodLevelResources`: a container without a limit of
/// its own can use the pod's budget, not the node's).
fn fallback_limits(
    pod: &Pod,
    node: &NodeAllocatable,
) -> Result<NodeAllocatable, ResourceFieldError> {
    let mut out = *node;
    let Some(limits) = super::pod_level::pod_resources(pod).and_then(|r| r.limits.as_ref()) else {
        return Ok(out);
    };
    for (name, slot, milli) in [
        ("cpu", &mut out.cpu_millis, true),
        ("memory", &mut out.memory_bytes, false),
    ] {
        let Some(q) = limits.get(name) else { continue };
        let parsed = quantity::parse(&q.0).map_err(|source| ResourceFieldError::BadQuantity {
            name: name.to_string(),
            value: q.0.clone(),
            source,
        })?;
        if !parsed.is_zero() {
            *slot = if milli {
                parsed.milli_value()
            } else {
                parsed.value()
            };
        }
    }
    Ok(out)
}

/// `a / b` rounded towards +∞ (b > 0).
fn ceil_div(a: i64, b: i64) -> i64 {
    let q = a / b;
    if a % b != 0 && a > 0 { q + 1 } else { q }
}

/// Amounts by resource name while they are added up (units are the caller's).
pub(crate) type AmountsByName = std::collections::BTreeMap<String, i128>;

/// Adds `from` into `into`, name by name.
pub(crate) fn add_amounts(into: &mut AmountsByName, from: &AmountsByName) {
    for (name, v) in from {
        *into.entry(name.clone()).or_default() += v;
    }
}

/// Keeps the larger of `into` and `from`, name by name.
pub(crate) fn max_amounts(into: &mut AmountsByName, from: &AmountsByName) {
    for (name, v) in from {
        let e = into.entry(name.clone()).or_insert(*v);
        *e = (*e).max(*v);
    }
}

/// One resource list (`of`: a container's requests or limits) summed over the pod's
/// containers as upstream's scheduler and kubelet count it (the sidecar KEP's formula): the app
/// containers and the sidecars (restartable init containers) add up; while a plain init
/// container runs the node holds it and the sidecars started before it; the pod needs the
/// larger of the two. Admission (fit) and the pod cgroup (its limits) both count this way.
pub(crate) fn sum_over_containers(
    pod: &Pod,
    of: impl Fn(&Container) -> AmountsByName,
) -> AmountsByName {
    let mut total = AmountsByName::new();
    let Some(spec) = pod.spec.as_ref() else {
        return total;
    };
    for c in &spec.containers {
        add_amounts(&mut total, &of(c));
    }
    let mut sidecars = AmountsByName::new();
    let mut init_peak = AmountsByName::new();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        if super::is_sidecar(c) {
            add_amounts(&mut total, &own);
            add_amounts(&mut sidecars, &own);
            max_amounts(&mut init_peak, &sidecars);
        } else {
            let mut running = own;
            add_amounts(&mut running, &sidecars);
            max_amounts(&mut init_peak, &running);
        }
    }
    max_amounts(&mut total, &init_peak);
    total
}
