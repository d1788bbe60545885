use super::*;

fn claim(
    capacity: Option<&str>,
    state: Option<&str>,
    allocated: Option<&str>,
) -> PersistentVolumeClaim {
    let mut status = json!({"conditions": [
        {"type": "FileSystemResizePending", "status": "True"},
        {"type": "ModifyingVolume", "status": "True"},
    ]});
    if let Some(c) = capacity {
        status["capacity"] = json!({"storage": c});
    }
    if let Some(s) = state {
        status["allocatedResourceStatuses"] = json!({"storage": s});
    }
    if let Some(a) = allocated {
        status["allocatedResources"] = json!({"storage": a});
    }
    serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "ns", "resourceVersion": "42"},
        "spec": {},
        "status": status,
    }))
    .unwrap()
}

fn pv(capacity: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv1"},
        "spec": {"capacity": {"storage": capacity}},
    }))
    .unwrap()
}

fn expand(size: &str, bytes: i64, tracked: bool) -> Decision {
    Decision::Expand(Expansion {
        size: Quantity(size.into()),
        bytes,
        tracked,
    })
}

/// (claim capacity, tracking state, allocated, PV capacity, read-only, decision)
type Row<'a> = (
    Option<&'a str>,
    Option<&'a str>,
    Option<&'a str>,
    &'a str,
    bool,
    Decision,
);

#[test]
fn a_grown_volume_is_expanded_as_upstream_decides() {
    let gi = 1 << 30;
    let rows: Vec<Row> = vec![
        (Some("1Gi"), None, None, "1Gi", false, Decision::Nothing),
        (Some("2Gi"), None, None, "1Gi", false, Decision::Nothing),
        (
            Some("1Gi"),
            None,
            None,
            "2Gi",
            false,
            expand("2Gi", 2 * gi, false),
        ),
        (None, None, None, "2Gi", false, expand("2Gi", 2 * gi, false)),
        (
            Some("1Gi"),
            None,
            None,
            "2Gi",
            true,
            Decision::ReadOnly {
                size: Quantity("2Gi".into()),
            },
        ),
        (
            Some("1Gi"),
            Some(NODE_RESIZE_PENDING),
            Some("3Gi"),
            "3Gi",
            false,
            expand("3Gi", 3 * gi, true),
        ),
        (
            Some("1Gi"),
            Some(NODE_RESIZE_IN_PROGRESS),
            Some("3Gi"),
            "3Gi",
            false,
            expand("3Gi", 3 * gi, true),
        ),
        // The controller's part still runs, or the node's failed for good.
        (
            Some("1Gi"),
            Some("ControllerResizeInProgress"),
            Some("3Gi"),
            "3Gi",
            false,
            Decision::Nothing,
        ),
        (
            Some("1Gi"),
            Some(NODE_RESIZE_INFEASIBLE),
            Some("3Gi"),
            "3Gi",
            false,
            Decision::Nothing,
        ),
        // Tracked but no allocated size: the PV's.
        (
            Some("1Gi"),
            Some(NODE_RESIZE_PENDING),
            None,
            "2Gi",
            false,
            expand("2Gi", 2 * gi, true),
        ),
        // Allocated without a state: nothing for the node (upstream's pre-check).
        (
            Some("1Gi"),
            None,
            Some("2Gi"),
            "2Gi",
            false,
            Decision::Nothing,
        ),
    ];
    for (capacity, state, allocated, pv_size, read_only, want) in rows {
        let got = decide(&claim(capacity, state, allocated), &pv(pv_size), read_only);
        assert_eq!(
            got, want,
            "{capacity:?} {state:?} {allocated:?} {pv_size} ro={read_only}"
        );
    }
    let sizeless: PersistentVolume = serde_json::from_value(json!({"spec": {}})).unwrap();
    assert_eq!(
        decide(&claim(None, None, None), &sizeless, false),
        Decision::Nothing
    );
}

#[test]
fn driver_errors_are_classed_as_upstream() {
    use tonic::Code;
    let rows = [
        (Code::InvalidArgument, Failure::Infeasible),
        (Code::OutOfRange, Failure::Infeasible),
        (Code::NotFound, Failure::Infeasible),
        (Code::FailedPrecondition, Failure::InUse),
        (Code::Unavailable, Failure::Transient),
        (Code::DeadlineExceeded, Failure::Transient),
        (Code::Aborted, Failure::Transient),
        (Code::Internal, Failure::Final),
        (Code::Unimplemented, Failure::Final),
    ];
    for (code, want) in rows {
        assert_eq!(classify(code), want, "{code:?}");
    }
}

#[test]
fn the_status_patches_mark_progress_success_and_failure() {
    let c = claim(Some("1Gi"), Some(NODE_RESIZE_PENDING), Some("3Gi"));
    assert_eq!(
        in_progress_patch(&c),
        json!({"metadata": {"resourceVersion": "42"},
               "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}})
    );
    assert_eq!(
        finished_patch(&c, &Quantity("3Gi".into())),
        json!({"metadata": {"resourceVersion": "42"},
               "status": {"capacity": {"storage": "3Gi"},
                          "allocatedResourceStatuses": {"storage": null},
                          "conditions": [{"type": "ModifyingVolume", "status": "True"}]}})
    );
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(1_800_000_000).unwrap(),
    );
    let failed = failed_patch(&c, "boom", true, now.clone());
    assert_eq!(
        failed["status"]["allocatedResourceStatuses"],
        json!({"storage": "NodeResizeInfeasible"})
    );
    let conditions = failed["status"]["conditions"].as_array().unwrap();
    let types: Vec<&str> = conditions
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "FileSystemResizePending",
            "ModifyingVolume",
            "NodeResizeError"
        ]
    );
    assert_eq!(conditions[2]["message"], "failed to expand pvc with boom");
    assert!(
        failed.get("metadata").is_none(),
        "unconditional, as upstream's"
    );
    let retried = failed_patch(&c, "again", false, now);
    assert!(retried["status"].get("allocatedResourceStatuses").is_none());
}
