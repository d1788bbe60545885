use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, HostPathVolumeSource, LocalVolumeSource, NFSVolumeSource,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::kubelet::api_objects::claims::{Claim, FetchError, Volume};

fn claim(phase: &str, volume: &str) -> PersistentVolumeClaim {
    let mut c = PersistentVolumeClaim {
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: (!volume.is_empty()).then(|| volume.to_string()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some(phase.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.metadata.name = Some("data".into());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some("claim-uid".into());
    c
}

fn pv(claim_uid: Option<&str>, edit: impl FnOnce(&mut PersistentVolumeSpec)) -> PersistentVolume {
    let mut spec = PersistentVolumeSpec {
        local: Some(LocalVolumeSource {
            path: "/mnt/disks/a".into(),
            fs_type: None,
        }),
        claim_ref: claim_uid.map(|uid| ObjectReference {
            uid: Some(uid.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    edit(&mut spec);
    let mut pv = PersistentVolume {
        spec: Some(spec),
        ..Default::default()
    };
    pv.metadata.name = Some("pv1".into());
    pv
}

fn affinity_for(host: &str) -> Option<VolumeNodeAffinity> {
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: "kubernetes.io/hostname".into(),
                    operator: "In".into(),
                    values: Some(vec![host.into()]),
                }]),
                match_fields: None,
            }],
        }),
    })
}

/// The node is `here`: a selector matches when it names `here`.
fn on_here(selector: &NodeSelector) -> bool {
    selector.node_selector_terms.iter().any(|t| {
        t.match_expressions
            .iter()
            .flatten()
            .all(|r| r.values.iter().flatten().any(|v| v == "here"))
    })
}

fn source(read_only: bool) -> PersistentVolumeClaimVolumeSource {
    PersistentVolumeClaimVolumeSource {
        claim_name: "data".into(),
        read_only: Some(read_only),
    }
}

/// What the row is, the claim and volume as read, the claim's readOnly, the use, the outcome.
type Row = (
    &'static str,
    Claim,
    Option<Volume>,
    bool,
    VolumeUse,
    &'static str,
);

const MOUNTS: VolumeUse = VolumeUse {
    mounts: true,
    devices: false,
};

fn run(claim: Claim, volume: Option<Volume>, read_only: bool, usage: VolumeUse) -> String {
    match resolve(
        "vol",
        "ns",
        &source(read_only),
        &claim,
        volume.as_ref(),
        usage,
        &on_here,
    ) {
        Ok(r) => match &r.served {
            Served::Csi { source, .. } => format!(
                "Csi {} {} ro={}",
                source.driver, source.volume_handle, r.read_only
            ),
            served => format!("{served:?} ro={}", r.read_only),
        },
        Err(e) => e.to_string(),
    }
}

#[test]
fn claims_resolve_to_their_bound_volume_or_say_why_not_as_upstream() {
    let bound = || Ok(Arc::new(claim("Bound", "pv1")));
    let local =
        |edit: fn(&mut PersistentVolumeSpec)| Some(Ok(Arc::new(pv(Some("claim-uid"), edit))));
    let mut deleting = claim("Bound", "pv1");
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    let rows: Vec<Row> = vec![
        (
            "local, bound",
            bound(),
            local(|_| {}),
            false,
            MOUNTS,
            "Local { path: \"/mnt/disks/a\" } ro=false",
        ),
        (
            "readOnly from the pod's claim source",
            bound(),
            local(|_| {}),
            true,
            MOUNTS,
            "Local { path: \"/mnt/disks/a\" } ro=true",
        ),
        (
            "hostPath volume",
            bound(),
            local(|s| {
                s.local = None;
                s.host_path = Some(HostPathVolumeSource {
                    path: "/srv/x".into(),
                    type_: Some("DirectoryOrCreate".into()),
                });
            }),
            false,
            MOUNTS,
            "HostPath { path: \"/srv/x\", kind: \"DirectoryOrCreate\" } ro=false",
        ),
        (
            "claim not found",
            Err(FetchError::NotFound {
                resource: "persistentvolumeclaims",
                name: "data".into(),
            }),
            None,
            false,
            MOUNTS,
            "error processing PVC ns/data: failed to fetch PVC from API server: persistentvolumeclaims \"data\" not found",
        ),
        (
            "pending claim",
            Ok(Arc::new(claim("Pending", ""))),
            None,
            false,
            MOUNTS,
            "error processing PVC ns/data: PVC is not bound",
        ),
        (
            "claim being deleted",
            Ok(Arc::new(deleting)),
            local(|_| {}),
            false,
            MOUNTS,
            "error processing PVC ns/data: PVC is being deleted",
        ),
        (
            "bound without a volume name",
            Ok(Arc::new(claim("Bound", ""))),
            None,
            false,
            MOUNTS,
            "error processing PVC ns/data: PVC has empty pvc.Spec.VolumeName",
        ),
        (
            "volume not found",
            bound(),
            Some(Err(FetchError::NotFound {
                resource: "persistentvolumes",
                name: "pv1".into(),
            })),
            false,
            MOUNTS,
            "error processing PVC ns/data: failed to fetch PV pv1 from API server: persistentvolumes \"pv1\" not found",
        ),
        (
            "volume not bound back",
            bound(),
            Some(Ok(Arc::new(pv(None, |_| {})))),
            false,
            MOUNTS,
            "error processing PVC ns/data: found PV object pv1 but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim",
        ),
        (
            "volume bound to another claim",
            bound(),
            Some(Ok(Arc::new(pv(Some("other"), |_| {})))),
            false,
            MOUNTS,
            "error processing PVC ns/data: found PV object pv1 but its pv.Spec.ClaimRef.UID other does not point to claim.UID claim-uid",
        ),
        (
            "block volume in volumeMounts",
            bound(),
            local(|s| s.volume_mode = Some("Block".into())),
            false,
            MOUNTS,
            "volume vol has volumeMode Block, but is specified in volumeMounts",
        ),
        (
            "block volume in volumeDevices",
            bound(),
            local(|s| s.volume_mode = Some("Block".into())),
            false,
            VolumeUse {
                mounts: false,
                devices: true,
            },
            "volume vol has volumeMode Block: raw block volumes (volumeDevices) are not supported on this node",
        ),
        (
            "csi goes to the CSI plugin",
            bound(),
            local(|s| {
                s.local = None;
                s.csi = Some(CSIPersistentVolumeSource {
                    driver: "d.example.com".into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                });
            }),
            false,
            MOUNTS,
            "Csi d.example.com h ro=false",
        ),
        (
            "nfs is not served",
            bound(),
            local(|s| {
                s.local = None;
                s.nfs = Some(NFSVolumeSource {
                    path: "/".into(),
                    server: "s".into(),
                    read_only: None,
                });
            }),
            false,
            MOUNTS,
            "volume type nfs is not supported on this node",
        ),
        (
            "node affinity for this node",
            bound(),
            local(|s| s.node_affinity = affinity_for("here")),
            false,
            MOUNTS,
            "Local { path: \"/mnt/disks/a\" } ro=false",
        ),
        (
            "node affinity for another node",
            bound(),
            local(|s| s.node_affinity = affinity_for("elsewhere")),
            false,
            MOUNTS,
            "no matching NodeSelectorTerms",
        ),
    ];
    for (what, claim, volume, read_only, usage, want) in rows {
        assert_eq!(run(claim, volume, read_only, usage), want, "{what}");
    }
}

#[test]
fn unique_names_follow_upstreams_plugins() {
    let local = Resolved {
        pv: "pv1".into(),
        served: Served::Local {
            path: "/mnt".into(),
        },
        read_only: false,
        once_per_pod: false,
    };
    assert_eq!(unique_name(&local, "u1"), "kubernetes.io/local-volume/pv1");
    let host = Resolved {
        served: Served::HostPath {
            path: "/srv".into(),
            kind: String::new(),
        },
        ..local
    };
    assert_eq!(unique_name(&host, "u1"), "kubernetes.io/host-path/u1-pv1");
    let csi = Resolved {
        served: Served::Csi {
            source: Box::new(CSIPersistentVolumeSource {
                driver: "d.example.com".into(),
                volume_handle: "h1".into(),
                ..Default::default()
            }),
            access_modes: vec![],
            mount_options: vec![],
        },
        ..host
    };
    assert_eq!(
        unique_name(&csi, "u1"),
        "kubernetes.io/csi/d.example.com^h1"
    );
}
