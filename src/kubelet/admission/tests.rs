//! Table tests of admission: every reason with upstream's words, the order of the checks, and
//! the request arithmetic (init containers, sidecars, pod-level requests, overhead).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::requests::{Amounts, host_ports, is_extended, is_scalar, pod_requests};
use super::*;

const GI: i64 = 1 << 30;

fn node() -> NodeInfo {
    NodeInfo {
        name: "n1".into(),
        labels: BTreeMap::from([
            ("kubernetes.io/hostname".into(), "n1".into()),
            ("kubernetes.io/os".into(), "linux".into()),
            ("zone".into(), "a".into()),
            ("cores".into(), "8".into()),
        ]),
        taints: vec![],
        allocatable: Allocatable {
            cpu_millis: 1000,
            memory_bytes: 2 * GI,
            ephemeral_storage_bytes: 10 * GI,
            pods: 4,
            scalar: BTreeMap::from([
                ("example.com/dongle".into(), 2),
                ("hugepages-2Mi".into(), 4 << 20),
            ]),
        },
    }
}

/// A pod from the API server (source annotation `api`) bound to n1, with `spec` merged in.
fn pod(name: &str, spec: Value) -> Pod {
    pod_from(name, "api", spec)
}

fn pod_from(name: &str, source: &str, spec: Value) -> Pod {
    let mut base = json!({
        "nodeName": "n1",
        "containers": [{"name": "app", "image": "busybox"}],
    });
    if let (Some(b), Some(s)) = (base.as_object_mut(), spec.as_object()) {
        for (k, v) in s {
            b.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": format!("uid-{name}"),
            "annotations": {"kubernetes.io/config.source": source},
        },
        "spec": base,
    }))
    .unwrap()
}

/// One app container with these requests.
fn requesting(requests: Value) -> Value {
    json!({"containers": [{"name": "app", "image": "busybox", "resources": {"requests": requests}}]})
}

fn refused(reason: &str, message: &str) -> Decision {
    Decision::Refuse(Refusal {
        reason: reason.into(),
        message: message.into(),
    })
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: effect.into(),
        time_added: None,
    }
}

/// The tolerations the DaemonSet controller adds to every DaemonSet pod (and, for
/// hostNetwork pods, network-unavailable).
fn daemonset_tolerations() -> Value {
    json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ])
}

const AFFINITY: &str =
    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector";
const PORTS: &str =
    "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports";
const NAME: &str = "Predicate NodeName failed: node(s) didn't match the requested node name";
const TAINTS: &str =
    "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate";

#[test]
fn every_reason_in_upstreams_words() {
    let others = vec![
        pod(
            "a",
            requesting(json!({"cpu": "500m", "memory": "1Gi", "example.com/dongle": "1"})),
        ),
        pod(
            "b",
            json!({"containers": [{"name": "web", "image": "busybox",
                "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
        ),
    ];
    let full = |n: i64| -> Vec<Pod> { (0..n).map(|i| pod(&format!("p{i}"), json!({}))).collect() };
    struct Case {
        name: &'static str,
        pod: Pod,
        others: Vec<Pod>,
        node: NodeInfo,
        want: Decision,
    }
    let tainted = NodeInfo {
        taints: vec![taint("dedicated", Some("infra"), "NoExecute")],
        ..node()
    };
    let cases = vec![
        Case {
            name: "a pod that fits",
            pod: pod("new", requesting(json!({"cpu": "500m", "memory": "1Gi"}))),
            others: others.clone(),
            node: node(),
            want: Decision::Admit,
        },
        Case {
            name: "cpu",
            pod: pod("new", requesting(json!({"cpu": "2"}))),
            others: others.clone(),
            node: node(),
            want: refused(
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 2000, used: 500, capacity: 1000",
            ),
        },
        Case {
            name: "memory",
            pod: pod("new", requesting(json!({"memory": "1025Mi"}))),
            others: others.clone(),
            node: node(),
            want: refused(
                "OutOfmemory",
                "Node didn't have enough resource: memory, requested: 1074790400, used: 1073741824, capacity: 2147483648",
            ),
        },
        Case {
            name: "ephemeral storage",
            pod: pod("new", requesting(json!({"ephemeral-storage": "11Gi"}))),
            others: vec![],
            node: node(),
            want: refused(
                "OutOfephemeral-storage",
                "Node didn't have enough resource: ephemeral-storage, requested: 11811160064, used: 0, capacity: 10737418240",
            ),
        },
        Case {
            name: "pods (maxPods)",
            pod: pod("new", json!({})),
            others: full(4),
            node: node(),
            want: refused(
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 4, capacity: 4",
            ),
        },
        Case {
            name: "the pod count comes first, even for a pod that asks nothing",
            pod: pod("new", requesting(json!({"cpu": "5"}))),
            others: full(4),
            node: node(),
            want: refused(
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 4, capacity: 4",
            ),
        },
        Case {
            name: "an extended resource the node has",
            pod: pod("new", requesting(json!({"example.com/dongle": "2"}))),
            others: others.clone(),
            node: node(),
            want: refused(
                "OutOfexample.com/dongle",
                "Node didn't have enough resource: example.com/dongle, requested: 2, used: 1, capacity: 2",
            ),
        },
        Case {
            name: "an extended resource the node does not have is not checked",
            pod: pod("new", requesting(json!({"example.org/cluster-thing": "5"}))),
            others: others.clone(),
            node: node(),
            want: Decision::Admit,
        },
        Case {
            name: "huge pages are checked even when the node has none",
            pod: pod(
                "new",
                requesting(json!({"hugepages-1Gi": "1Gi", "memory": "1Mi"})),
            ),
            others: vec![],
            node: node(),
            want: refused(
                "OutOfhugepages-1Gi",
                "Node didn't have enough resource: hugepages-1Gi, requested: 1073741824, used: 0, capacity: 0",
            ),
        },
        Case {
            name: "cpu is reported before memory",
            pod: pod("new", requesting(json!({"cpu": "4", "memory": "4Gi"}))),
            others: vec![],
            node: node(),
            want: refused(
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 4000, used: 0, capacity: 1000",
            ),
        },
        Case {
            name: "nodeSelector that matches",
            pod: pod("new", json!({"nodeSelector": {"zone": "a"}})),
            others: vec![],
            node: node(),
            want: Decision::Admit,
        },
        Case {
            name: "nodeSelector that does not match",
            pod: pod("new", json!({"nodeSelector": {"zone": "b"}})),
            others: vec![],
            node: node(),
            want: refused("NodeAffinity", AFFINITY),
        },
        Case {
            name: "required node affinity that does not match",
            pod: pod(
                "new",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]}]}]}}}}),
            ),
            others: vec![],
            node: node(),
            want: refused("NodeAffinity", AFFINITY),
        },
        Case {
            name: "resources are reported before node affinity",
            pod: pod(
                "new",
                json!({"nodeSelector": {"zone": "b"},
                       "containers": [{"name": "app", "image": "busybox", "resources": {"requests": {"memory": "3Gi"}}}]}),
            ),
            others: vec![],
            node: node(),
            want: refused(
                "OutOfmemory",
                "Node didn't have enough resource: memory, requested: 3221225472, used: 0, capacity: 2147483648",
            ),
        },
        Case {
            name: "another node's name",
            pod: pod("new", json!({"nodeName": "n2"})),
            others: vec![],
            node: node(),
            want: refused("NodeName", NAME),
        },
        Case {
            name: "node affinity is reported before the node name",
            pod: pod(
                "new",
                json!({"nodeName": "n2", "nodeSelector": {"zone": "b"}}),
            ),
            others: vec![],
            node: node(),
            want: refused("NodeAffinity", AFFINITY),
        },
        Case {
            name: "a host port another pod holds",
            pod: pod(
                "new",
                json!({"containers": [{"name": "web", "image": "busybox",
                    "ports": [{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}]}]}),
            ),
            others: others.clone(),
            node: node(),
            want: refused("NodePorts", PORTS),
        },
        Case {
            name: "the same host port over UDP is free",
            pod: pod(
                "new",
                json!({"containers": [{"name": "web", "image": "busybox",
                    "ports": [{"containerPort": 8080, "hostPort": 8080, "protocol": "UDP"}]}]}),
            ),
            others: others.clone(),
            node: node(),
            want: Decision::Admit,
        },
        Case {
            name: "a NoExecute taint the pod does not tolerate",
            pod: pod("new", json!({})),
            others: vec![],
            node: tainted.clone(),
            want: refused("TaintToleration", TAINTS),
        },
        Case {
            name: "a NoExecute taint the pod tolerates",
            pod: pod(
                "new",
                json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoExecute"}]}),
            ),
            others: vec![],
            node: tainted.clone(),
            want: Decision::Admit,
        },
        Case {
            name: "a static pod is not checked against taints",
            pod: pod_from("new", "file", json!({})),
            others: vec![],
            node: tainted.clone(),
            want: Decision::Admit,
        },
        Case {
            name: "a NoSchedule taint is the scheduler's business",
            pod: pod("new", json!({})),
            others: vec![],
            node: NodeInfo {
                taints: vec![taint("dedicated", Some("infra"), "NoSchedule")],
                ..node()
            },
            want: Decision::Admit,
        },
        Case {
            name: "a DaemonSet pod on a node that is not ready yet",
            pod: pod("new", json!({"tolerations": daemonset_tolerations()})),
            others: vec![],
            node: NodeInfo {
                taints: vec![
                    taint("node.kubernetes.io/not-ready", None, "NoExecute"),
                    taint("node.kubernetes.io/unreachable", None, "NoExecute"),
                    taint("node.kubernetes.io/not-ready", None, "NoSchedule"),
                    taint("node.kubernetes.io/disk-pressure", None, "NoSchedule"),
                ],
                ..node()
            },
            want: Decision::Admit,
        },
        Case {
            name: "ports are reported before taints",
            pod: pod(
                "new",
                json!({"containers": [{"name": "web", "image": "busybox",
                    "ports": [{"containerPort": 1, "hostPort": 8080}]}]}),
            ),
            others: others.clone(),
            node: tainted.clone(),
            want: refused("NodePorts", PORTS),
        },
        Case {
            name: "the pod's OS label",
            pod: {
                let mut p = pod("new", json!({}));
                p.metadata.labels = Some(BTreeMap::from([(
                    "kubernetes.io/os".to_string(),
                    "windows".to_string(),
                )]));
                p
            },
            others: vec![],
            node: node(),
            want: refused(
                "PodOSSelectorNodeLabelDoesNotMatch",
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
            ),
        },
        Case {
            name: "the pod's OS field",
            pod: pod("new", json!({"os": {"name": "windows"}})),
            others: full(4),
            node: node(),
            want: refused(
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS",
            ),
        },
        Case {
            name: "spec.os linux is fine",
            pod: pod("new", json!({"os": {"name": "linux"}})),
            others: vec![],
            node: node(),
            want: Decision::Admit,
        },
    ];
    for case in cases {
        let got = admit(&case.pod, &case.node, &case.others);
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn a_critical_pod_is_refused_too_there_is_no_preemption() {
    let critical = pod(
        "critical",
        json!({"priorityClassName": "system-node-critical", "priority": 2000001000,
               "containers": [{"name": "app", "image": "busybox", "resources": {"requests": {"cpu": "900m"}}}]}),
    );
    let others = [pod("a", requesting(json!({"cpu": "500m"})))];
    assert_eq!(
        admit(&critical, &node(), &others),
        refused(
            "OutOfcpu",
            "Node didn't have enough resource: cpu, requested: 900, used: 500, capacity: 1000"
        )
    );
}

fn requests_of(spec: Value) -> Amounts {
    pod_requests(&pod("p", spec), &|_| true)
}

fn amounts(cpu: i64, memory: i64) -> Amounts {
    Amounts {
        cpu_millis: cpu,
        memory_bytes: memory,
        ..Default::default()
    }
}

#[test]
fn requests_count_init_containers_sidecars_pod_level_requests_and_overhead() {
    let c = |name: &str, cpu: &str, mem: &str| json!({"name": name, "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": mem}}});
    let sidecar = |name: &str, cpu: &str, mem: &str| {
        let mut v = c(name, cpu, mem);
        v["restartPolicy"] = json!("Always");
        v
    };
    let cases: Vec<(&str, Value, Amounts)> = vec![
        (
            "app containers add up",
            json!({"containers": [c("a", "100m", "100"), c("b", "200m", "50")]}),
            amounts(300, 150),
        ),
        (
            "a larger init container sets the amount, resource by resource",
            json!({"initContainers": [c("i", "1", "10")],
                   "containers": [c("a", "100m", "100"), c("b", "200m", "50")]}),
            amounts(1000, 150),
        ),
        (
            "init containers run one at a time: the largest counts",
            json!({"initContainers": [c("i1", "400m", "10"), c("i2", "600m", "10")],
                   "containers": [c("a", "100m", "100")]}),
            amounts(600, 100),
        ),
        (
            "sidecars run beside the app containers and the init containers after them",
            json!({"initContainers": [sidecar("s", "200m", "100"), c("i", "700m", "10")],
                   "containers": [c("a", "100m", "100")]}),
            // Init i runs with s: 900m; afterwards s + a: 300m.
            amounts(900, 200),
        ),
        (
            "a sidecar started after an init container does not run beside it",
            json!({"initContainers": [c("i", "700m", "10"), sidecar("s", "200m", "100")],
                   "containers": [c("a", "100m", "100")]}),
            amounts(700, 200),
        ),
        (
            "pod-level requests replace the containers' cpu and memory",
            json!({"resources": {"requests": {"cpu": "2", "memory": "1Gi"}},
                   "containers": [c("a", "100m", "100")]}),
            amounts(2000, GI),
        ),
        (
            "the overhead is added",
            json!({"overhead": {"cpu": "250m", "memory": "120Mi"},
                   "containers": [c("a", "100m", "100")]}),
            amounts(350, 120 * (1 << 20) + 100),
        ),
        (
            "fractions of a unit round up once, at the end",
            json!({"containers": [c("a", "0.5m", "0.5"), c("b", "0.5m", "0.5")]}),
            amounts(2, 1),
        ),
    ];
    for (name, spec, want) in cases {
        assert_eq!(requests_of(spec), want, "{name}");
    }
}

#[test]
fn resource_names_are_classified_as_upstream() {
    for (name, extended, scalar) in [
        ("cpu", false, false),
        ("memory", false, false),
        ("example.com/dongle", true, true),
        ("nvidia.com/gpu", true, true),
        ("kubernetes.io/something", false, true),
        ("hugepages-2Mi", false, true),
        ("attachable-volumes-aws-ebs", false, true),
        ("requests.example.com/x", false, false),
        ("Bad_Domain.com/x", false, false),
        ("storage", false, false),
    ] {
        assert_eq!(is_extended(name), extended, "{name} extended");
        assert_eq!(is_scalar(name), scalar, "{name} scalar");
    }
}

#[test]
fn host_ports_take_defaults_and_skip_plain_init_containers() {
    let p = pod(
        "p",
        json!({
            "initContainers": [
                {"name": "i", "image": "busybox", "ports": [{"containerPort": 1, "hostPort": 9001}]},
                {"name": "s", "image": "busybox", "restartPolicy": "Always",
                 "ports": [{"containerPort": 1, "hostPort": 9002, "protocol": "UDP"}]},
            ],
            "containers": [{"name": "a", "image": "busybox", "ports": [
                {"containerPort": 1, "hostPort": 9003, "hostIP": "127.0.0.1"},
                {"containerPort": 2},
            ]}],
        }),
    );
    assert_eq!(
        host_ports(&p),
        vec![
            ("0.0.0.0".to_string(), "UDP".to_string(), 9002),
            ("127.0.0.1".to_string(), "TCP".to_string(), 9003),
        ]
    );
}

#[test]
fn host_port_conflicts_follow_the_bind_address() {
    let holder = |ip: &str| {
        pod(
            "holder",
            json!({"containers": [{"name": "a", "image": "busybox",
                "ports": [{"containerPort": 1, "hostPort": 7000, "hostIP": ip}]}]}),
        )
    };
    let wants = |ip: &str| {
        pod(
            "new",
            json!({"containers": [{"name": "a", "image": "busybox",
                "ports": [{"containerPort": 1, "hostPort": 7000, "hostIP": ip}]}]}),
        )
    };
    for (held, wanted, conflict) in [
        ("", "", true),
        ("0.0.0.0", "127.0.0.1", true),
        ("127.0.0.1", "0.0.0.0", true),
        ("127.0.0.1", "127.0.0.1", true),
        ("127.0.0.1", "127.0.0.2", false),
    ] {
        let got = admit(&wants(wanted), &node(), &[holder(held)]);
        assert_eq!(
            got != Decision::Admit,
            conflict,
            "held on {held:?}, wanted on {wanted:?}: {got:?}"
        );
    }
}

fn term(expressions: Value, fields: Value) -> Value {
    json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": expressions, "matchFields": fields}]}}}})
}

#[test]
fn node_affinity_operators_terms_and_fields() {
    let expr = |key: &str, op: &str, values: Value| json!([{"key": key, "operator": op, "values": values}]);
    let cases: Vec<(&str, Value, bool)> = vec![
        (
            "In matches",
            term(expr("zone", "In", json!(["a", "b"])), json!([])),
            true,
        ),
        (
            "In misses",
            term(expr("zone", "In", json!(["b"])), json!([])),
            false,
        ),
        (
            "In without values is invalid",
            term(expr("zone", "In", json!([])), json!([])),
            false,
        ),
        (
            "NotIn of another value",
            term(expr("zone", "NotIn", json!(["b"])), json!([])),
            true,
        ),
        (
            "NotIn of a missing label",
            term(expr("gpu", "NotIn", json!(["x"])), json!([])),
            true,
        ),
        (
            "NotIn of the value",
            term(expr("zone", "NotIn", json!(["a"])), json!([])),
            false,
        ),
        (
            "Exists",
            term(expr("zone", "Exists", json!([])), json!([])),
            true,
        ),
        (
            "Exists with values is invalid",
            term(expr("zone", "Exists", json!(["a"])), json!([])),
            false,
        ),
        (
            "DoesNotExist",
            term(expr("gpu", "DoesNotExist", json!([])), json!([])),
            true,
        ),
        (
            "DoesNotExist of a label",
            term(expr("zone", "DoesNotExist", json!([])), json!([])),
            false,
        ),
        (
            "Gt",
            term(expr("cores", "Gt", json!(["4"])), json!([])),
            true,
        ),
        (
            "Gt at the bound",
            term(expr("cores", "Gt", json!(["8"])), json!([])),
            false,
        ),
        (
            "Lt",
            term(expr("cores", "Lt", json!(["16"])), json!([])),
            true,
        ),
        (
            "Gt of a label that is not a number",
            term(expr("zone", "Gt", json!(["1"])), json!([])),
            false,
        ),
        (
            "Gt with a bound that is not a number",
            term(expr("cores", "Gt", json!(["x"])), json!([])),
            false,
        ),
        (
            "an unknown operator",
            term(expr("zone", "Near", json!(["a"])), json!([])),
            false,
        ),
        (
            "matchFields on the node's name",
            term(
                json!([]),
                json!([{"key": "metadata.name", "operator": "In", "values": ["n1"]}]),
            ),
            true,
        ),
        (
            "matchFields on another name",
            term(
                json!([]),
                json!([{"key": "metadata.name", "operator": "In", "values": ["n2"]}]),
            ),
            false,
        ),
        (
            "matchFields NotIn",
            term(
                json!([]),
                json!([{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]),
            ),
            true,
        ),
        (
            "matchFields needs exactly one value",
            term(
                json!([]),
                json!([{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]),
            ),
            false,
        ),
        (
            "expressions and fields of one term must all hold",
            term(
                expr("zone", "In", json!(["a"])),
                json!([{"key": "metadata.name", "operator": "In", "values": ["n2"]}]),
            ),
            false,
        ),
        (
            "one of several terms is enough; an invalid term is skipped",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "Bogus"}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            ]}}}}),
            true,
        ),
        (
            "no terms but empty ones: nothing matches",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{}]}}}}),
            false,
        ),
        (
            "preferred terms are not required",
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}}
            ]}}}),
            true,
        ),
        (
            "nodeSelector and affinity must both hold",
            {
                let mut v = term(expr("zone", "In", json!(["a"])), json!([]));
                v["nodeSelector"] = json!({"zone": "b"});
                v
            },
            false,
        ),
    ];
    let n = node();
    for (name, spec, want) in cases {
        let p = pod("p", spec);
        assert_eq!(
            node_affinity_matches(&p, &n.labels, &n.name),
            want,
            "{name}"
        );
    }
}

#[test]
fn tolerations_match_as_upstream() {
    let tol =
        |v: Value| serde_json::from_value::<k8s_openapi::api::core::v1::Toleration>(v).unwrap();
    let t = taint("k", Some("v"), "NoExecute");
    for (toleration, want) in [
        (
            json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"}),
            true,
        ),
        (json!({"key": "k", "value": "v"}), true),
        (json!({"key": "k", "value": "w"}), false),
        (json!({"key": "k", "operator": "Exists"}), true),
        (json!({"operator": "Exists"}), true),
        (
            json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"}),
            false,
        ),
        (json!({"key": "other", "operator": "Exists"}), false),
        // Numeric comparison is an alpha feature upstream keeps off.
        (json!({"key": "k", "operator": "Gt", "value": "1"}), false),
        (json!({"key": "k", "operator": "Sometimes"}), false),
    ] {
        assert_eq!(
            tolerates(&tol(toleration.clone()), &t),
            want,
            "{toleration}"
        );
    }
    let no_value = taint("k", None, "NoExecute");
    assert!(tolerates(
        &tol(json!({"key": "k", "operator": "Equal"})),
        &no_value
    ));
    assert!(tolerates(&tol(json!({"key": "k", "value": ""})), &no_value));
}

#[test]
fn allocatable_is_read_from_a_resource_list() {
    let list: BTreeMap<String, Quantity> = [
        ("cpu", "1900m"),
        ("memory", "1Gi"),
        ("ephemeral-storage", "10G"),
        ("pods", "110"),
        ("hugepages-2Mi", "4Mi"),
        ("example.com/dongle", "3"),
        ("bogus", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    assert_eq!(
        Allocatable::from_quantities(&list),
        Allocatable {
            cpu_millis: 1900,
            memory_bytes: GI,
            ephemeral_storage_bytes: 10_000_000_000,
            pods: 110,
            scalar: BTreeMap::from([
                ("example.com/dongle".into(), 3),
                ("hugepages-2Mi".into(), 4 << 20)
            ]),
        }
    );
}

#[test]
fn the_node_objects_labels_taints_and_extended_resources_count_once_known() {
    let base = node();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let source = NodeSource::with_node_object(base.clone(), rx);
    assert_eq!(source.current(), base, "before the Node is known");
    let object = Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n1".into()),
            labels: Some(BTreeMap::from([("zone".to_string(), "b".to_string())])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![taint("dedicated", None, "NoExecute")]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("64".into())),
                ("example.com/dongle".to_string(), Quantity("9".into())),
                ("example.com/widget".to_string(), Quantity("5".into())),
            ])),
            ..Default::default()
        }),
    };
    tx.send_replace(Some(std::sync::Arc::new(object)));
    let now = source.current();
    assert_eq!(now.labels, BTreeMap::from([("zone".into(), "b".into())]));
    assert_eq!(now.taints, vec![taint("dedicated", None, "NoExecute")]);
    // cpu and what the node computes itself stay the configuration's.
    assert_eq!(now.allocatable.cpu_millis, 1000);
    assert_eq!(now.allocatable.scalar["example.com/dongle"], 2);
    assert_eq!(now.allocatable.scalar["example.com/widget"], 5);
    let selective = pod("p", json!({"nodeSelector": {"zone": "a"}}));
    assert_eq!(
        admit(&selective, &now, &[]),
        refused("NodeAffinity", AFFINITY)
    );
}
