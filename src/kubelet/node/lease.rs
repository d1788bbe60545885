//! The node's heartbeat: the Lease `kube-node-lease/<node>` (coordination.k8s.io/v1), renewed
//! every quarter of `nodeLeaseDurationSeconds`, held by the node and owned by its Node object
//! (so deleting the Node deletes the Lease).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

/// The namespace upstream keeps node Leases in.
pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The Node a Lease belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeRef {
    pub name: String,
    pub uid: String,
}

/// A Lease to create for `node`.
pub(crate) fn new_lease(node: &NodeRef, duration_seconds: u32, now: jiff::Timestamp) -> Lease {
    let base = Lease {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.name.clone()),
            ..Default::default()
        }),
    };
    renewed(&base, node, duration_seconds, now)
}

/// `base` renewed at `now`: duration set (the configuration may have changed), the owner
/// reference to the Node added when there is none, everything else (resourceVersion
/// included, for the optimistic update) kept.
pub(crate) fn renewed(
    base: &Lease,
    node: &NodeRef,
    duration_seconds: u32,
    now: jiff::Timestamp,
) -> Lease {
    let mut lease = base.clone();
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.lease_duration_seconds = Some(i32::try_from(duration_seconds).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(now));
    if lease
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(|o| o.is_empty())
    {
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name.clone(),
            uid: node.uid.clone(),
            ..Default::default()
        }]);
    }
    lease
}

/// Renew every quarter of the duration (upstream's ratio), at least every second.
pub(crate) fn renew_interval(duration_seconds: u32) -> std::time::Duration {
    std::time::Duration::from_millis((u64::from(duration_seconds) * 250).max(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeRef {
        NodeRef {
            name: "n1".into(),
            uid: "uid-1".into(),
        }
    }

    #[test]
    fn a_new_lease_is_held_by_and_owned_by_the_node() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let lease = new_lease(&node(), 40, now);
        assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let spec = lease.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
    }

    #[test]
    fn renewing_keeps_the_version_and_a_foreign_owner() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut base = new_lease(&node(), 40, now);
        base.metadata.resource_version = Some("17".into());
        base.metadata.owner_references.as_mut().unwrap()[0].uid = "older".into();
        let later = now + jiff::SignedDuration::from_secs(10);
        let r = renewed(&base, &node(), 8, later);
        assert_eq!(r.metadata.resource_version.as_deref(), Some("17"));
        assert_eq!(
            r.metadata.owner_references.as_ref().unwrap()[0].uid,
            "older"
        );
        assert_eq!(r.spec.as_ref().unwrap().renew_time, Some(MicroTime(later)));
        assert_eq!(r.spec.as_ref().unwrap().lease_duration_seconds, Some(8));
        assert_eq!(renew_interval(40), std::time::Duration::from_secs(10));
        assert_eq!(renew_interval(2), std::time::Duration::from_secs(1));
    }
}
