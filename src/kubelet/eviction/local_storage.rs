//! Local storage limits (upstream's `localStorageEviction`, on with
//! `localStorageCapacityIsolation`, the default): a pod is evicted at once, whatever the node's
//! pressure, when an emptyDir holds more than its `sizeLimit`, when the pod's ephemeral storage
//! exceeds the sum of its containers' `ephemeral-storage` limits, or when a container's writable
//! layer and logs exceed its own limit. The checks run in upstream's order and the first one that
//! holds decides. All pure; the manager measures only the pods that have such a limit, so a node
//! whose pods set none walks no pod's volumes for it (upstream reads every pod every round).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use super::decide::PodUsage;
use crate::base::podspec::is_sidecar;
use crate::base::podspec::quantity;
use crate::base::podspec::resources::{AmountsByName, sum_over_containers};

/// The resource the limits are set on.
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Upstream's `immediateEvictionGracePeriodSeconds`: an offender gets one second.
pub const GRACE_SECONDS: i64 = 1;

/// Which limit a pod broke: upstream's signal names (the `eviction_signal` label of
/// `kubelet_evictions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    EmptyDir,
    Pod,
    Container,
}

impl Limit {
    pub fn signal(self) -> &'static str {
        match self {
            Limit::EmptyDir => "emptydirfs.limit",
            Limit::Pod => "ephemeralpodfs.limit",
            Limit::Container => "ephemeralcontainerfs.limit",
        }
    }
}

/// A broken limit and upstream's message for the event and the pod's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub limit: Limit,
    pub message: String,
}

/// A container's `ephemeral-storage` limit: its bytes and the quantity as written (for the
/// message); `None` when unset, zero or not a quantity.
fn container_limit(c: &Container) -> Option<(i64, String)> {
    let written = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(EPHEMERAL_STORAGE)?;
    let q = quantity::parse(&written.0).ok()?;
    (!q.is_zero()).then(|| (q.value(), written.0.clone()))
}

/// A disk-backed emptyDir's `sizeLimit` in bytes (memory-backed ones are bounded by their
/// tmpfs, as upstream leaves them to the kernel).
fn empty_dir_limit(v: &Volume) -> Option<(i64, String)> {
    let e = v.empty_dir.as_ref()?;
    if e.medium.as_deref() == Some("Memory") {
        return None;
    }
    let written = e.size_limit.as_ref()?;
    let q = quantity::parse(&written.0).ok()?;
    (q.value() > 0).then(|| (q.value(), written.0.clone()))
}

/// The containers whose own limit counts: the app containers and the sidecars.
fn limited_containers(pod: &Pod) -> Vec<(&str, i64, String)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    spec.containers
        .iter()
        .chain(sidecars)
        .filter_map(|c| container_limit(c).map(|(b, w)| (c.name.as_str(), b, w)))
        .collect()
}

/// The pod's limit: its containers' limits summed as the scheduler sums them; `None` when no
/// container sets one.
fn pod_limit(pod: &Pod) -> Option<i64> {
    let total = sum_over_containers(pod, |c| {
        container_limit(c)
            .map(|(bytes, _)| AmountsByName::from([(EPHEMERAL_STORAGE.into(), i128::from(bytes))]))
            .unwrap_or_default()
    });
    total
        .get(EPHEMERAL_STORAGE)
        .map(|v| i64::try_from(*v).unwrap_or(i64::MAX))
}

/// Whether `pod` sets any limit this module enforces: only such pods are measured.
pub fn has_limits(pod: &Pod) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .any(|v| empty_dir_limit(v).is_some())
        || pod_limit(pod).is_some()
}

/// The first limit `pod` breaks with `usage`, in upstream's order (emptyDir, pod, container).
/// A container's usage is its logs, plus its writable layer unless images (and with them the
/// writable layers) live on a filesystem of their own.
pub fn exceeded(pod: &Pod, usage: &PodUsage, dedicated_imagefs: bool) -> Option<Exceeded> {
    empty_dir_exceeded(pod, &usage.volume_bytes)
        .or_else(|| pod_exceeded(pod, usage))
        .or_else(|| container_exceeded(pod, usage, dedicated_imagefs))
}

fn empty_dir_exceeded(pod: &Pod, volume_bytes: &BTreeMap<String, u64>) -> Option<Exceeded> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    volumes.iter().find_map(|v| {
        let (limit, written) = empty_dir_limit(v)?;
        let used = *volume_bytes.get(&v.name)?;
        (used > limit as u64).then(|| Exceeded {
            limit: Limit::EmptyDir,
            message: format!(
                "Usage of EmptyDir volume \"{}\" exceeds the limit \"{written}\". ",
                v.name
            ),
        })
    })
}

fn pod_exceeded(pod: &Pod, usage: &PodUsage) -> Option<Exceeded> {
    let limit = pod_limit(pod)?;
    let used = usage.ephemeral_bytes();
    (used > limit as u64).then(|| Exceeded {
        limit: Limit::Pod,
        message: format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            super::signals::format_binary(limit)
        ),
    })
}

fn container_exceeded(pod: &Pod, usage: &PodUsage, dedicated_imagefs: bool) -> Option<Exceeded> {
    let limits = limited_containers(pod);
    usage.containers.iter().find_map(|c| {
        let (name, limit, written) = limits.iter().find(|(n, _, _)| *n == c.name)?;
        let mut used = c.logs_bytes.unwrap_or(0);
        if !dedicated_imagefs {
            used += c.rootfs_bytes.unwrap_or(0);
        }
        (used > *limit as u64).then(|| Exceeded {
            limit: Limit::Container,
            message: format!(
                "Container {name} exceeded its local ephemeral storage limit \"{written}\". "
            ),
        })
    })
}
