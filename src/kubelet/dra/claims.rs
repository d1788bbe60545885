//! What a pod's claims mean, without I/O (upstream's `resourceclaim` helpers and the DRA
//! manager's checks): which `ResourceClaim` each of the pod's `spec.resourceClaims` names,
//! whether a claim read from the API server may be used by the pod now, and which of its
//! drivers must prepare it. Besides the claims the spec names, a pod may have one the
//! scheduler made for its extended resources backed by DRA
//! (`status.extendedResourceClaimStatus`, [`extended_claim`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::state::{ClaimInfo, DriverState};

/// Why a pod's claim cannot be prepared (yet); the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    #[error("pod \"{namespace}/{pod}\": ResourceClaim not created yet")]
    NotCreated { namespace: String, pod: String },
    #[error(
        "pod \"{namespace}/{pod}\", spec.resourceClaim {claim:?}: none of the supported fields are set"
    )]
    Unsupported {
        namespace: String,
        pod: String,
        claim: String,
    },
    #[error(
        "ResourceClaim {namespace}/{claim} was not created for Pod {namespace}/{pod} (Pod is not owner)"
    )]
    NotOwner {
        namespace: String,
        claim: String,
        pod: String,
    },
    #[error("pod {pod} ({pod_uid}) is not allowed to use ResourceClaim {claim} ({claim_uid})")]
    NotReserved {
        pod: String,
        pod_uid: String,
        claim: String,
        claim_uid: String,
    },
    #[error("ResourceClaim {0}: not allocated")]
    NotAllocated(String),
}

fn meta(pod: &Pod) -> (String, String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.uid.clone().unwrap_or_default(),
    )
}

/// The `ResourceClaim` one of the pod's claims names (upstream's `resourceclaim.Name`):
/// `resourceClaimName` as given; for a template, the generated claim that
/// `status.resourceClaimStatuses` names (`None`: none was needed), whose owner must then be
/// the pod (the `bool`).
pub(crate) fn claim_name(
    pod: &Pod,
    claim: &PodResourceClaim,
) -> Result<Option<(String, bool)>, ClaimError> {
    let (namespace, name, _) = meta(pod);
    if let Some(given) = &claim.resource_claim_name {
        return Ok(Some((given.clone(), false)));
    }
    if claim.resource_claim_template_name.is_none() {
        return Err(ClaimError::Unsupported {
            namespace,
            pod: name,
            claim: claim.name.clone(),
        });
    }
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    match statuses.and_then(|list| list.iter().find(|s| s.name == claim.name)) {
        Some(status) => Ok(status.resource_claim_name.clone().map(|n| (n, true))),
        None => Err(ClaimError::NotCreated {
            namespace,
            pod: name,
        }),
    }
}

/// Whether the pod may use the claim now (upstream's `IsForPod` for a generated claim, then
/// `IsReservedForPod`), and it is allocated.
pub(crate) fn check_usable(
    pod: &Pod,
    claim: &ResourceClaim,
    must_own: bool,
) -> Result<(), ClaimError> {
    let (namespace, pod_name, pod_uid) = meta(pod);
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    if must_own {
        let owned = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == pod_uid);
        if !owned {
            return Err(ClaimError::NotOwner {
                namespace,
                claim: claim_name,
                pod: pod_name,
            });
        }
    }
    let status = claim.status.as_ref();
    let reserved = status
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|list| list.iter().any(|r| r.uid == pod_uid));
    if !reserved {
        return Err(ClaimError::NotReserved {
            pod: pod_name,
            pod_uid,
            claim: claim_name,
            claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
        });
    }
    if status.and_then(|s| s.allocation.as_ref()).is_none() {
        return Err(ClaimError::NotAllocated(claim_name));
    }
    Ok(())
}

/// A claim's cache entry as its allocation makes it (upstream's `newClaimInfoFromClaim`):
/// one driver state per driver the allocation names, with the nodes' operations the
/// allocation says to skip; no devices until the driver prepares them.
pub(crate) fn claim_info(claim: &ResourceClaim) -> Result<ClaimInfo, ClaimError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated(name.clone()))?;
    let mut drivers: BTreeMap<String, DriverState> = BTreeMap::new();
    for result in allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
    {
        let state = drivers.entry(result.driver.clone()).or_default();
        for skip in result.skip_node_operations.iter().flatten() {
            if !state.skip_node_operations.contains(skip) {
                state.skip_node_operations.push(skip.clone());
            }
        }
    }
    Ok(ClaimInfo {
        claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
        claim_name: name,
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        pod_uids: Default::default(),
        drivers,
        prepared: false,
    })
}

/// The name of the claim the scheduler made for the pod's extended resources backed by DRA
/// (`status.extendedResourceClaimStatus`); it is the pod's without owning it, as upstream
/// reads it.
pub(crate) fn extended_claim(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.as_str())
        .filter(|name| !name.is_empty())
}

/// Upstream's `IsDRAExtendedResourceName`: an extended resource, or a device class's
/// implicit one (`deviceclass.resource.kubernetes.io/<class>`).
fn is_dra_extended(name: &str) -> bool {
    crate::kubelet::devices::plugin::is_extended_resource_name(name)
        || name.starts_with("deviceclass.resource.kubernetes.io/")
}

/// The requests of the extended-resource claim that serve the container: the scheduler's
/// mappings for it whose resource the container requests (a non-zero amount).
pub(crate) fn extended_requests(pod: &Pod, container: &Container) -> Vec<String> {
    let Some(status) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    else {
        return Vec::new();
    };
    let requests = container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref());
    let requested = |name: &str| {
        is_dra_extended(name)
            && requests
                .and_then(|r| r.get(name))
                .and_then(|q| crate::base::podspec::quantity::parse(&q.0).ok())
                .is_some_and(|q| q.value() != 0)
    };
    status
        .request_mappings
        .iter()
        .filter(|m| m.container_name == container.name && requested(&m.resource_name))
        .map(|m| m.request_name.clone())
        .collect()
}

/// The claims (by `ResourceClaim` name) and their requests a container uses, from its
/// `resources.claims` (an empty request: every request of the claim) and, for its extended
/// resources backed by DRA, the extended-resource claim's requests, as upstream's
/// `GetResources`.
pub(crate) fn container_claims(pod: &Pod, container: &Container) -> Vec<(String, Vec<String>)> {
    let used: Vec<(&str, &str)> = container
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.request.as_deref().unwrap_or("")))
        .collect();
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    for pod_claim in pod_claims.into_iter().flatten() {
        let requests: Vec<String> = used
            .iter()
            .filter(|(name, _)| *name == pod_claim.name)
            .map(|(_, request)| request.to_string())
            .collect();
        if requests.is_empty() {
            continue;
        }
        if let Ok(Some((name, _))) = claim_name(pod, pod_claim) {
            add_requests(&mut out, name, requests);
        }
    }
    let extended = extended_requests(pod, container);
    if let (Some(name), false) = (extended_claim(pod), extended.is_empty()) {
        add_requests(&mut out, name.to_string(), extended);
    }
    out
}

fn add_requests(out: &mut Vec<(String, Vec<String>)>, name: String, requests: Vec<String>) {
    match out.iter_mut().find(|(n, _)| *n == name) {
        Some((_, r)) => r.extend(requests),
        None => out.push((name, requests)),
    }
}

/// The CDI device IDs of a prepared claim for the given requests (an empty request name: all
/// of the claim's devices; `req/sub` matches a device allocated for subrequest `sub` of `req`).
pub(crate) fn cdi_devices(info: &ClaimInfo, requests: &[String]) -> Vec<String> {
    let wanted = |device_requests: &[String]| {
        requests.iter().any(|r| {
            r.is_empty()
                || device_requests
                    .iter()
                    .any(|d| d == r || d.split('/').next() == Some(r.as_str()))
        })
    };
    let mut out = Vec::new();
    for state in info.drivers.values() {
        for device in &state.devices {
            if wanted(&device.request_names) {
                for id in &device.cdi_device_ids {
                    if !out.contains(id) {
                        out.push(id.clone());
                    }
                }
            }
        }
    }
    out
}

/// Whether the pod has any claim at all: in its spec, or for its extended resources.
pub(crate) fn has_claims(pod: &Pod) -> bool {
    let in_spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    in_spec || extended_claim(pod).is_some()
}
