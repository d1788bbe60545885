//! The claims of a pod's `persistentVolumeClaim` volumes and the volumes bound to them, read
//! as upstream's desired-state populator reads them: a plain GET of the claim, then of its
//! volume once the claim is bound. The Node authorizer lets a node get these objects for its
//! own pods but neither list nor watch them, so they are read again on each try of a pod
//! whose volumes wait (see `kubelet::volume::persistent`).

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

use super::ObjectApi;
use crate::clients::apiserver::{Problem, ProblemKind};

/// Why a claim or a volume could not be read; the texts are client-go's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{resource} {name:?} not found")]
    NotFound {
        resource: &'static str,
        name: String,
    },
    #[error("{0}")]
    Request(String),
    /// Without `--kubeconfig` there is no API server to read claims from.
    #[error("no API server to read {resource} {name:?} from")]
    NoApiServer {
        resource: &'static str,
        name: String,
    },
}

impl FetchError {
    fn from_problem(resource: &'static str, name: &str, problem: Problem) -> Self {
        if problem.is(ProblemKind::NotFound) {
            FetchError::NotFound {
                resource,
                name: name.to_string(),
            }
        } else {
            FetchError::Request(problem.message)
        }
    }
}

pub(crate) const CLAIMS: &str = "persistentvolumeclaims";
pub(crate) const VOLUMES: &str = "persistentvolumes";

pub(crate) type Claim = Result<Arc<PersistentVolumeClaim>, FetchError>;
pub(crate) type Volume = Result<Arc<PersistentVolume>, FetchError>;

/// The claim names the pod's volumes refer to, in the spec's order, without repeats.
pub(crate) fn claim_names(pod: &Pod) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for claim in volumes.filter_map(|v| v.persistent_volume_claim.as_ref()) {
        if !names.contains(&claim.claim_name) {
            names.push(claim.claim_name.clone());
        }
    }
    names
}

/// The name of the volume a claim is bound to, when the claim says it is bound (upstream
/// reads the volume only then).
pub(crate) fn bound_volume(claim: &PersistentVolumeClaim) -> Option<&str> {
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    name.filter(|n| bound && !n.is_empty())
}

/// Reads every claim of the pod, then the volume of each bound one.
pub(crate) async fn fetch(
    api: &dyn ObjectApi,
    namespace: &str,
    pod: &Pod,
) -> (Vec<(String, Claim)>, Vec<(String, Volume)>) {
    let names = claim_names(pod);
    let claims: Vec<Claim> = join_all(names.iter().map(|name| {
        let get = api.get_claim(namespace, name);
        async move {
            get.await
                .map(Arc::new)
                .map_err(|p| FetchError::from_problem(CLAIMS, name, p))
        }
    }))
    .await;
    let mut volume_names: Vec<String> = Vec::new();
    for claim in claims.iter().flatten() {
        if let Some(name) = bound_volume(claim)
            && !volume_names.iter().any(|n| n == name)
        {
            volume_names.push(name.to_string());
        }
    }
    let volumes: Vec<Volume> = join_all(volume_names.iter().map(|name| {
        let get = api.get_volume(name);
        async move {
            get.await
                .map(Arc::new)
                .map_err(|p| FetchError::from_problem(VOLUMES, name, p))
        }
    }))
    .await;
    (
        names.into_iter().zip(claims).collect(),
        volume_names.into_iter().zip(volumes).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_named_once_and_read_on_only_when_bound() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "volumes": [
                {"name": "a", "persistentVolumeClaim": {"claimName": "c1"}},
                {"name": "b", "emptyDir": {}},
                {"name": "c", "persistentVolumeClaim": {"claimName": "c2"}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "c1", "readOnly": true}},
            ]},
        }))
        .unwrap();
        assert_eq!(claim_names(&pod), ["c1", "c2"]);
        let claim = |phase: &str, volume: &str| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "spec": {"volumeName": volume},
                "status": {"phase": phase},
            }))
            .unwrap()
        };
        let rows = [
            (claim("Bound", "pv1"), Some("pv1")),
            (claim("Pending", "pv1"), None),
            (claim("Bound", ""), None),
            (claim("Lost", "pv1"), None),
        ];
        for (c, want) in rows {
            assert_eq!(bound_volume(&c), want, "{c:?}");
        }
    }
}
