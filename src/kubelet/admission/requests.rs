//! What a pod asks of the node, as upstream's resource fit counts it (`PodRequests` of
//! component-helpers, the formula of the sidecar KEP): the sum of the app containers and the
//! restartable init containers (sidecars), or, when more, what the node needs while an init
//! container runs (it plus the sidecars started before it); pod-level requests (cpu, memory,
//! huge pages) replace the containers' sum for those resources; the pod overhead is added.
//!
//! Amounts are added up in thousandths and rounded up to whole units at the end (cpu stays in
//! millicores). Upstream adds exact quantities and rounds once; the two differ only for
//! amounts finer than a thousandth, which no real request uses. An amount that does not parse
//! counts as zero: the sources refuse such pods before they get here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::base::podspec::resources::{add_amounts, sum_over_containers};
use crate::base::podspec::{is_sidecar, labels::check_label_key, quantity};

/// `cpu`, in millicores.
pub(crate) const CPU: &str = "cpu";
/// `memory`, in bytes.
pub(crate) const MEMORY: &str = "memory";
/// `ephemeral-storage`, in bytes.
pub(crate) const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// `pods`, a count (only the node has it).
pub(crate) const PODS: &str = "pods";

const HUGEPAGES_PREFIX: &str = "hugepages-";
const ATTACHABLE_VOLUMES_PREFIX: &str = "attachable-volumes-";
const NATIVE_PREFIX: &str = "kubernetes.io/";
const QUOTA_REQUESTS_PREFIX: &str = "requests.";

/// A resource in the default (`kubernetes.io/`) namespace: unprefixed names and prefixed ones.
fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains(NATIVE_PREFIX)
}

/// An extended resource (`example.com/dongle`): outside the default namespace, and a valid
/// quota name once `requests.` is put before it.
pub(crate) fn is_extended(name: &str) -> bool {
    !is_native(name)
        && !name.starts_with(QUOTA_REQUESTS_PREFIX)
        && check_label_key(&format!("{QUOTA_REQUESTS_PREFIX}{name}")).is_ok()
}

/// The resources the fit counts besides cpu, memory and ephemeral storage (upstream's
/// "scalar" resources): extended resources, huge pages, prefixed native resources and
/// attachable volumes.
pub(crate) fn is_scalar(name: &str) -> bool {
    is_extended(name)
        || name.starts_with(HUGEPAGES_PREFIX)
        || name.contains(NATIVE_PREFIX)
        || name.starts_with(ATTACHABLE_VOLUMES_PREFIX)
}

/// Resource amounts the fit compares, in the units upstream compares them in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Amounts {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    /// Scalar resources by name, in whole units.
    pub scalar: BTreeMap<String, i64>,
}

impl Amounts {
    /// Nothing asked at all (upstream then checks only the pod count).
    pub(crate) fn is_zero(&self) -> bool {
        self.cpu_millis == 0
            && self.memory_bytes == 0
            && self.ephemeral_storage_bytes == 0
            && self.scalar.is_empty()
    }

    /// Adds `other` (saturating: amounts near the i64 limit cannot wrap round).
    pub(crate) fn add(&mut self, other: &Amounts) {
        self.cpu_millis = self.cpu_millis.saturating_add(other.cpu_millis);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
        self.ephemeral_storage_bytes = self
            .ephemeral_storage_bytes
            .saturating_add(other.ephemeral_storage_bytes);
        for (name, v) in &other.scalar {
            let e = self.scalar.entry(name.clone()).or_default();
            *e = e.saturating_add(*v);
        }
    }
}

/// Amounts in thousandths by resource name, while they are being added up.
type Milli = BTreeMap<String, i128>;

fn milli_of(q: &Quantity) -> i128 {
    match quantity::parse(&q.0) {
        Ok(q) if !q.is_negative() => q
            .checked_milli_value()
            .map(i128::from)
            .unwrap_or_else(|| i128::from(q.value()) * 1000),
        _ => 0,
    }
}

fn list(map: Option<&BTreeMap<String, Quantity>>, keep: &dyn Fn(&str) -> bool) -> Milli {
    map.into_iter()
        .flatten()
        .filter(|(name, _)| keep(name))
        .map(|(name, q)| (name.clone(), milli_of(q)))
        .collect()
}

fn container_requests(c: &Container, keep: &dyn Fn(&str) -> bool) -> Milli {
    list(c.resources.as_ref().and_then(|r| r.requests.as_ref()), keep)
}

/// A pod-level request replaces the containers' sum only for cpu, memory and huge pages.
fn is_pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

/// The pod's requests as the fit counts them. `keep_container_request` drops container
/// requests by name (upstream drops extended resources the node does not have, so that
/// cluster-level resources do not block admission); pod-level requests and the overhead are
/// never dropped.
pub(crate) fn pod_requests(pod: &Pod, keep_container_request: &dyn Fn(&str) -> bool) -> Amounts {
    let Some(spec) = pod.spec.as_ref() else {
        return Amounts::default();
    };
    let mut total = sum_over_containers(pod, |c| container_requests(c, keep_container_request));
    let pod_level = list(
        spec.resources.as_ref().and_then(|r| r.requests.as_ref()),
        &|_| true,
    );
    if pod_level.keys().any(|n| is_pod_level_resource(n)) {
        for (name, v) in pod_level {
            if is_pod_level_resource(&name) {
                total.insert(name, v);
            }
        }
    }
    add_amounts(&mut total, &list(spec.overhead.as_ref(), &|_| true));
    to_amounts(total)
}

fn to_i64(v: i128) -> i64 {
    i64::try_from(v.max(0)).unwrap_or(i64::MAX)
}

/// Thousandths to whole units, rounded up (cpu stays in millicores).
fn to_amounts(milli: Milli) -> Amounts {
    let whole = |v: i128| to_i64((v + 999).div_euclid(1000));
    let mut out = Amounts::default();
    for (name, v) in milli {
        match name.as_str() {
            CPU => out.cpu_millis = to_i64(v),
            MEMORY => out.memory_bytes = whole(v),
            EPHEMERAL_STORAGE => out.ephemeral_storage_bytes = whole(v),
            n if is_scalar(n) => {
                out.scalar.insert(name, whole(v));
            }
            _ => {}
        }
    }
    out
}

/// The pod's host ports as upstream's port check sees them: every `hostPort` of the app
/// containers and of the sidecars (other init containers end before the pod runs), as
/// (host IP, protocol, port) with `0.0.0.0` and `TCP` for what is left unset.
pub(crate) fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c))
        .chain(spec.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|hp| hp > 0))
        .map(|p| {
            let ip = p
                .host_ip
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into());
            let protocol = p
                .protocol
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "TCP".into());
            (ip, protocol, p.host_port.unwrap_or_default())
        })
        .collect()
}
