//! Pod admission: whether the node takes a new pod, decided before anything of the pod
//! starts, as upstream's predicate admit handler decides it (`lifecycle/predicate.go` and the
//! scheduler checks it calls). A pure function of the pod, the node (name, labels, taints,
//! allocatable) and the pods the node has already admitted and not finished.
//!
//! The checks, in upstream's order; the first that fails gives the reason:
//! 1. the pod's `kubernetes.io/os` label against the node's OS
//!    (`PodOSSelectorNodeLabelDoesNotMatch`), and `spec.os.name` (`PodOSNotSupported`);
//! 2. resources against allocatable less what the admitted pods request: the pod count
//!    (`OutOfpods`, from `maxPods`), cpu, memory, ephemeral storage, then extended resources
//!    and huge pages by name (`OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`,
//!    `OutOf<name>`), each with "Node didn't have enough resource: …";
//! 3. `nodeSelector` and required node affinity (`NodeAffinity`), `spec.nodeName`
//!    (`NodeName`), host ports already taken (`NodePorts`), each with "Predicate … failed: …";
//! 4. NoExecute taints the pod does not tolerate (`TaintToleration`); static pods skip this
//!    check, as upstream.
//!
//! Upstream preempts (evicts) other pods to make room for a critical pod that lacks only
//! resources; Deckhand never preempts, so such a pod is refused like any other. An extended
//! resource the node does not have at all is not checked (upstream leaves those to
//! cluster-level resource managers), and pods are counted at what the node allocated them
//! (their spec's requests, until an in-place resize is allocated: [`resize`]).

pub(crate) mod allocation;
mod node;
pub(crate) mod requests;
pub(crate) mod resize;
mod selector;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use node::NodeSource;
use requests::{Amounts, CPU, EPHEMERAL_STORAGE, MEMORY, PODS, host_ports, pod_requests};
pub use selector::{
    node_affinity_matches, node_selector_matches, tolerates, untolerated_no_execute,
};

/// The OS every Deckhand node runs.
pub const NODE_OS: &str = "linux";
/// The label that names a node's (or a pod's intended) OS.
pub const OS_LABEL: &str = "kubernetes.io/os";

/// Upstream's reason words.
pub(crate) mod reason {
    pub(crate) const OS_SELECTOR: &str = "PodOSSelectorNodeLabelDoesNotMatch";
    pub(crate) const OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
    pub(crate) const OUT_OF_PREFIX: &str = "OutOf";
    pub(crate) const NODE_AFFINITY: &str = "NodeAffinity";
    pub(crate) const NODE_NAME: &str = "NodeName";
    pub(crate) const NODE_PORTS: &str = "NodePorts";
    pub(crate) const TAINT_TOLERATION: &str = "TaintToleration";
}

/// The scheduler plugins' own descriptions, which the node's messages quote.
mod description {
    pub(super) const NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
    pub(super) const NODE_NAME: &str = "node(s) didn't match the requested node name";
    pub(super) const NODE_PORTS: &str =
        "node(s) didn't have free ports for the requested pod ports";
    pub(super) const TAINT_TOLERATION: &str = "node(s) had taints that the pod didn't tolerate";
}

/// What the node offers pods, in the units the fit compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pods: i64,
    /// Extended resources and huge pages, by name, in whole units.
    pub scalar: BTreeMap<String, i64>,
}

impl Allocatable {
    /// From a resource list as a Node's `status.allocatable` holds it. Quantities that do not
    /// parse count as zero.
    pub fn from_quantities(list: &BTreeMap<String, Quantity>) -> Allocatable {
        let parse = |q: &Quantity| crate::base::podspec::quantity::parse(&q.0).ok();
        let mut out = Allocatable::default();
        for (name, q) in list {
            let Some(q) = parse(q) else { continue };
            match name.as_str() {
                CPU => out.cpu_millis = q.milli_value(),
                MEMORY => out.memory_bytes = q.value(),
                EPHEMERAL_STORAGE => out.ephemeral_storage_bytes = q.value(),
                PODS => out.pods = q.value(),
                n if requests::is_scalar(n) => {
                    out.scalar.insert(name.clone(), q.value());
                }
                _ => {}
            }
        }
        out
    }
}

/// The node as admission sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: Allocatable,
}

/// Why a pod is refused: upstream's reason word and message (without the "Pod was rejected: "
/// that the pod's status puts before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub message: String,
}

/// Admission's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Admit,
    Refuse(Refusal),
}

impl Decision {
    fn refuse(reason: impl Into<String>, message: impl Into<String>) -> Decision {
        Decision::Refuse(Refusal {
            reason: reason.into(),
            message: message.into(),
        })
    }

    fn predicate(reason: &str, description: &str) -> Decision {
        Decision::refuse(reason, format!("Predicate {reason} failed: {description}"))
    }
}

/// What the admitted pods hold on the node: their number, their requests and their host
/// ports. Built once and grown pod by pod when many pods are admitted in a row.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pods: i64,
    requested: Amounts,
    ports: Vec<(String, String, i32)>,
}

impl Usage {
    /// What these pods hold.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Usage {
        let mut usage = Usage::default();
        for pod in pods {
            usage.add(pod);
        }
        usage
    }

    /// Counts one more admitted pod.
    pub fn add(&mut self, pod: &Pod) {
        self.pods += 1;
        self.requested.add(&pod_requests(pod, &|_| true));
        self.ports.extend(host_ports(pod));
    }

    /// What the admitted pods request of an extended resource, in whole units.
    pub(crate) fn requested_scalar(&self, name: &str) -> i64 {
        self.requested.scalar.get(name).copied().unwrap_or(0)
    }

    /// True when a port the pod wants is taken: the same protocol and port on the same host
    /// IP, or on any IP when either side binds every address (`0.0.0.0`).
    fn port_taken(&self, ip: &str, protocol: &str, port: i32) -> bool {
        self.ports
            .iter()
            .any(|(used_ip, used_protocol, used_port)| {
                *used_port == port
                    && used_protocol == protocol
                    && (ip == "0.0.0.0" || used_ip == "0.0.0.0" || used_ip == ip)
            })
    }
}

/// True for pods that did not come from the API server (upstream's `IsStaticPod`).
fn is_static(pod: &Pod) -> bool {
    crate::base::podspec::origin::is_not_from_api(pod)
}

/// The pod's effective requests of extended resources (init containers counted as upstream
/// counts them), for the device manager's admission check.
pub(crate) fn extended_requests(pod: &Pod) -> BTreeMap<String, i64> {
    pod_requests(pod, &requests::is_extended).scalar
}

/// Whether the node admits `pod`, given the pods it has admitted and not finished.
pub fn admit<'a>(
    pod: &Pod,
    node: &NodeInfo,
    others: impl IntoIterator<Item = &'a Pod>,
) -> Decision {
    admit_with_usage(pod, node, &Usage::of(others))
}

/// [`admit`] with the admitted pods' usage already added up.
pub fn admit_with_usage(pod: &Pod, node: &NodeInfo, usage: &Usage) -> Decision {
    let spec = pod.spec.clone().unwrap_or_default();
    let pod_os = pod.metadata.labels.as_ref().and_then(|l| l.get(OS_LABEL));
    if pod_os.is_some_and(|os| os != NODE_OS) {
        return Decision::refuse(
            reason::OS_SELECTOR,
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        );
    }
    if spec.os.as_ref().is_some_and(|os| os.name != NODE_OS) {
        return Decision::refuse(
            reason::OS_NOT_SUPPORTED,
            "Failed to admit pod as the OS field doesn't match node OS",
        );
    }
    if let Some(refusal) = insufficient_resource(pod, node, usage) {
        return refusal;
    }
    if !node_affinity_matches(pod, &node.labels, &node.name) {
        return Decision::predicate(reason::NODE_AFFINITY, description::NODE_AFFINITY);
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name)
    {
        return Decision::predicate(reason::NODE_NAME, description::NODE_NAME);
    }
    if host_ports(pod)
        .iter()
        .any(|(ip, protocol, port)| usage.port_taken(ip, protocol, *port))
    {
        return Decision::predicate(reason::NODE_PORTS, description::NODE_PORTS);
    }
    if !is_static(pod)
        && untolerated_no_execute(
            &node.taints,
            spec.tolerations.as_deref().unwrap_or_default(),
        )
        .is_some()
    {
        return Decision::predicate(reason::TAINT_TOLERATION, description::TAINT_TOLERATION);
    }
    Decision::Admit
}

/// Upstream's resource fit: the first resource the pod asks more of than is left, as a
/// refusal. Requests of extended resources the node does not have are left out first.
fn insufficient_resource(pod: &Pod, node: &NodeInfo, usage: &Usage) -> Option<Decision> {
    let short = |name: &str, requested: i64, used: i64, capacity: i64| {
        Some(Decision::refuse(
            format!("{}{name}", reason::OUT_OF_PREFIX),
            format!(
                "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        ))
    };
    let alloc = &node.allocatable;
    if usage.pods.saturating_add(1) > alloc.pods {
        return short(PODS, 1, usage.pods, alloc.pods);
    }
    let wanted = pod_requests(pod, &|name| {
        !requests::is_extended(name) || alloc.scalar.contains_key(name)
    });
    if wanted.is_zero() {
        return None;
    }
    let used = &usage.requested;
    let over =
        |want: i64, used: i64, capacity: i64| want > 0 && want > capacity.saturating_sub(used);
    if over(wanted.cpu_millis, used.cpu_millis, alloc.cpu_millis) {
        return short(CPU, wanted.cpu_millis, used.cpu_millis, alloc.cpu_millis);
    }
    if over(wanted.memory_bytes, used.memory_bytes, alloc.memory_bytes) {
        return short(
            MEMORY,
            wanted.memory_bytes,
            used.memory_bytes,
            alloc.memory_bytes,
        );
    }
    if over(
        wanted.ephemeral_storage_bytes,
        used.ephemeral_storage_bytes,
        alloc.ephemeral_storage_bytes,
    ) {
        return short(
            EPHEMERAL_STORAGE,
            wanted.ephemeral_storage_bytes,
            used.ephemeral_storage_bytes,
            alloc.ephemeral_storage_bytes,
        );
    }
    for (name, want) in &wanted.scalar {
        let used = used.scalar.get(name).copied().unwrap_or(0);
        let capacity = alloc.scalar.get(name).copied().unwrap_or(0);
        if over(*want, used, capacity) {
            return short(name, *want, used, capacity);
        }
    }
    None
}
