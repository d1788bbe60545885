//! Table tests of the resize decision: what changed, whether it fits the node, the pending
//! reasons and messages in upstream's words, and the pod the node runs meanwhile.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;
use crate::kubelet::admission::Allocatable;

const MI: i64 = 1 << 20;

fn node() -> NodeInfo {
    NodeInfo {
        name: "n1".into(),
        labels: BTreeMap::from([("kubernetes.io/os".into(), "linux".into())]),
        taints: vec![],
        allocatable: Allocatable {
            cpu_millis: 2000,
            memory_bytes: 1024 * MI,
            ephemeral_storage_bytes: 1 << 34,
            pods: 10,
            scalar: BTreeMap::new(),
        },
    }
}

/// An API pod on n1 whose container `app` asks `resources`, with a sidecar `side` asking
/// `side` and an init container `init` asking 1 cpu.
fn pod(name: &str, resources: Value, side: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "generation": 3,
                     "annotations": {"kubernetes.io/config.source": "api"}},
        "spec": {
            "nodeName": "n1",
            "initContainers": [
                {"name": "init", "image": "busybox", "resources": {"requests": {"cpu": "1"}}},
                {"name": "side", "image": "busybox", "restartPolicy": "Always", "resources": side},
            ],
            "containers": [{"name": "app", "image": "busybox", "resources": resources}],
        },
    }))
    .expect("valid pod")
}

fn req(cpu: &str, mem: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}})
}

#[test]
fn the_allocation_holds_every_container_init_containers_too() {
    let p = pod("a", req("100m", "64Mi"), req("50m", "32Mi"));
    let a = allocation_of(&p);
    assert_eq!(
        a.containers.keys().collect::<Vec<_>>(),
        vec!["app", "init", "side"],
        "an ordinary init container is resizable (InPlacePodVerticalScalingInitContainers)"
    );
    // An allocation from before names no ordinary init container: its spec stays allocated.
    let mut old = a.clone();
    old.containers.remove("init");
    let mut resized = p.clone();
    resized
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .resources = serde_json::from_value(req("2", "64Mi")).ok();
    assert!(!differs(&resized, &old));
    assert!(differs(&resized, &a));
}

#[test]
fn resources_compare_semantically() {
    let admitted = allocation_of(&pod("a", req("1", "64Mi"), json!({})));
    let cases = [
        ("same text", req("1", "64Mi"), false),
        ("1 is 1000m", req("1000m", "64Mi"), false),
        ("64Mi in bytes", req("1", "67108864"), false),
        ("more cpu", req("1500m", "64Mi"), true),
        ("less memory", req("1", "32Mi"), true),
        (
            "limits dropped",
            json!({"requests": {"cpu": "1", "memory": "64Mi"}}),
            true,
        ),
    ];
    for (what, resources, want) in cases {
        assert_eq!(
            differs(&pod("a", resources, json!({})), &admitted),
            want,
            "{what}"
        );
    }
    // The sidecar's resources count too.
    assert!(differs(
        &pod("a", req("1", "64Mi"), req("10m", "8Mi")),
        &admitted
    ));
}

#[test]
fn decisions_in_upstreams_words() {
    let admitted = allocation_of(&pod("a", req("500m", "128Mi"), json!({})));
    // Another pod holds 1 cpu and 512Mi; the init container's 1 cpu counts as upstream's
    // effective request (max of init and the sum of the rest).
    let others = Usage::of([&pod("b", req("1", "512Mi"), json!({}))]);
    let cases: Vec<(&str, Value, Verdict)> = vec![
        ("nothing changed", req("500m", "128Mi"), Verdict::Unchanged),
        ("fits", req("900m", "256Mi"), Verdict::Allocate),
        ("shrinks", req("100m", "64Mi"), Verdict::Allocate),
        (
            "more cpu than the node has",
            req("3", "128Mi"),
            Verdict::Pending(Pending {
                reason: INFEASIBLE,
                message: "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
                    .into(),
            }),
        ),
        (
            "memory is named first when both are too much",
            req("3", "2Gi"),
            Verdict::Pending(Pending {
                reason: INFEASIBLE,
                message: format!(
                    "Node didn't have enough capacity: memory, requested: {}, capacity: {}",
                    2048 * MI,
                    1024 * MI
                ),
            }),
        ),
        (
            "fits the node but not beside the other pod",
            req("1500m", "128Mi"),
            Verdict::Pending(Pending {
                reason: DEFERRED,
                message:
                    "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
                        .into(),
            }),
        ),
    ];
    for (what, resources, want) in cases {
        let p = pod("a", resources, json!({}));
        assert_eq!(decide(&p, &admitted, &node(), &others), want, "{what}");
    }
}

#[test]
fn the_pod_the_node_runs_has_the_allocation() {
    let admitted = allocation_of(&pod("a", req("500m", "128Mi"), json!({})));
    let asked = pod("a", req("3", "128Mi"), req("10m", "8Mi"));
    let runs = with_allocation(&asked, &admitted);
    assert!(!differs(&runs, &admitted));
    let spec = runs.spec.as_ref().expect("spec");
    assert_eq!(
        spec.init_containers.as_ref().expect("inits")[1].resources,
        None,
        "the sidecar had no resources when it was allocated"
    );
    assert_eq!(
        spec.init_containers.as_ref().expect("inits")[0].resources,
        asked
            .spec
            .as_ref()
            .expect("spec")
            .init_containers
            .as_ref()
            .expect("inits")[0]
            .resources,
        "an ordinary init container keeps its spec"
    );
    // A container the allocation does not know keeps its spec.
    let none = Allocation::default();
    assert_eq!(with_allocation(&asked, &none), asked);
    assert!(!differs(&asked, &none));
}

#[test]
fn the_pending_condition_names_the_generation() {
    let p = pod("a", req("3", "128Mi"), json!({}));
    let c = pending_condition(
        &p,
        &Pending {
            reason: DEFERRED,
            message: "m".into(),
        },
    );
    assert_eq!(
        (
            c.type_.as_str(),
            c.status.as_str(),
            c.reason.as_deref(),
            c.message.as_deref()
        ),
        ("PodResizePending", "True", Some("Deferred"), Some("m"))
    );
    assert_eq!(c.observed_generation, Some(3));
}

/// `p` with pod-level `resources`.
fn with_pod_level(mut p: Pod, resources: Value) -> Pod {
    p.spec.as_mut().expect("spec").resources =
        Some(serde_json::from_value(resources).expect("resources"));
    p
}

#[test]
fn pod_level_resources_are_allocated_and_resized_with_the_containers() {
    let base = pod("a", json!({}), json!({}));
    let before = with_pod_level(base.clone(), req("200m", "128Mi"));
    let allocation = allocation_of(&before);
    assert_eq!(
        allocation.pod,
        Some(serde_json::from_value(req("200m", "128Mi")).expect("resources"))
    );
    assert_eq!(
        decide(&before, &allocation, &node(), &Usage::default()),
        Verdict::Unchanged
    );
    let same_amount = with_pod_level(base.clone(), req("0.2", "134217728"));
    assert!(!differs(&same_amount, &allocation), "1000m is 1");

    let resized = with_pod_level(base.clone(), req("400m", "128Mi"));
    assert!(differs(&resized, &allocation));
    assert_eq!(
        decide(&resized, &allocation, &node(), &Usage::default()),
        Verdict::Allocate
    );
    let runs = with_allocation(&resized, &allocation);
    assert_eq!(
        runs.spec.as_ref().and_then(|s| s.resources.clone()),
        allocation.pod,
        "a pending resize runs at the allocation"
    );

    let too_big = with_pod_level(base, req("3", "128Mi"));
    match decide(&too_big, &allocation, &node(), &Usage::default()) {
        Verdict::Pending(p) => assert_eq!(
            (p.reason, p.message.as_str()),
            (
                INFEASIBLE,
                "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
            )
        ),
        other => panic!("want Infeasible, got {other:?}"),
    }

    let old_checkpoint: Allocation =
        serde_json::from_value(json!({"containers": {"app": {}, "side": {}}}))
            .expect("an older checkpoint reads");
    assert_eq!(old_checkpoint.pod, None);
    assert!(
        !differs(&before, &old_checkpoint),
        "an older checkpoint leaves the pod-level resources to the spec"
    );
    let plain = allocation_of(&pod("b", json!({}), json!({})));
    assert_eq!(
        plain.pod,
        Some(Default::default()),
        "none is recorded as none"
    );
    let added = with_pod_level(pod("b", json!({}), json!({})), req("100m", "64Mi"));
    assert!(
        differs(&added, &plain),
        "pod-level resources added by a resize"
    );
    assert_eq!(
        with_allocation(&added, &plain)
            .spec
            .and_then(|s| s.resources),
        None
    );
}
