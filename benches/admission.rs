//! Admission benchmark: the time to decide on 110 new pods (upstream's default `maxPods`), one
//! after the other, each against the pods admitted before it, as the sync loop does when a
//! source delivers them in one batch. Pure computation, no runtime needed:
//!
//! ```text
//! cargo bench --bench admission [-- --rounds 200]
//! ```
//!
//! The pods are a mix a node sees: two app containers and an init container with requests,
//! a sidecar on every third pod, a host port on every fifth, a node selector and a required
//! node affinity term on every fourth, and tolerations (the node has a NoExecute taint) on
//! all of them. Two ways are measured:
//! - `incremental`: the usage of the admitted pods is kept and grown pod by pod (what
//!   `SyncLoop::handle_changes` does within a batch);
//! - `from scratch`: every decision adds up the admitted pods again (`admission::admit`,
//!   what a batch of one pod costs with N pods already on the node).
//!
//! Reported: per-decision p50/p99/max and the total for the 110 (median over the rounds), as
//! a table and then one JSON line. Numbers are printed, never asserted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use deckhand::kubelet::admission::{self, Allocatable, Decision, NodeInfo, Usage};
use k8s_openapi::api::core::v1::{Pod, Taint};
use serde_json::json;

const PODS: usize = 110;

#[derive(Parser)]
struct Args {
    /// How many times the 110 decisions are made.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Accepted and ignored (`cargo bench` passes it).
    #[arg(long)]
    bench: bool,
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "bench-node".into(),
        labels: BTreeMap::from([
            ("kubernetes.io/hostname".into(), "bench-node".into()),
            ("kubernetes.io/os".into(), "linux".into()),
            ("kubernetes.io/arch".into(), "amd64".into()),
            ("disk".into(), "ssd".into()),
            ("zone".into(), "a".into()),
        ]),
        taints: vec![Taint {
            key: "dedicated".into(),
            value: Some("infra".into()),
            effect: "NoExecute".into(),
            time_added: None,
        }],
        allocatable: Allocatable {
            cpu_millis: 64_000,
            memory_bytes: 256 << 30,
            ephemeral_storage_bytes: 1 << 40,
            pods: PODS as i64,
            scalar: BTreeMap::new(),
        },
    }
}

fn pod(i: usize) -> Pod {
    let container = |name: &str, cpu: &str, mem: &str| {
        json!({"name": name, "image": "busybox",
               "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}}})
    };
    let mut app = container("app", "100m", "128Mi");
    if i.is_multiple_of(5) {
        app["ports"] = json!([{"containerPort": 8080, "hostPort": 20000 + i}]);
    }
    let mut init = vec![container("setup", "200m", "64Mi")];
    if i.is_multiple_of(3) {
        let mut sidecar = container("proxy", "50m", "32Mi");
        sidecar["restartPolicy"] = json!("Always");
        init.push(sidecar);
    }
    let mut spec = json!({
        "nodeName": "bench-node",
        "initContainers": init,
        "containers": [app, container("helper", "50m", "64Mi")],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoExecute"},
        ],
    });
    if i.is_multiple_of(4) {
        spec["nodeSelector"] = json!({"disk": "ssd"});
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "kubernetes.io/arch", "operator": "NotIn", "values": ["arm"]},
        ]}]}}});
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("pod-{i}"),
            "namespace": "default",
            "uid": format!("uid-{i}"),
            "annotations": {"kubernetes.io/config.source": "api"},
        },
        "spec": spec,
    }))
    .expect("a valid pod")
}

struct Stats {
    p50: Duration,
    p99: Duration,
    max: Duration,
    total_p50: Duration,
}

fn stats(mut each: Vec<Duration>, mut totals: Vec<Duration>) -> Stats {
    each.sort();
    totals.sort();
    let at = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: at(&each, 0.5),
        p99: at(&each, 0.99),
        max: *each.last().unwrap_or(&Duration::ZERO),
        total_p50: at(&totals, 0.5),
    }
}

/// One round of 110 decisions; returns each decision's time.
fn round(pods: &[Pod], node: &NodeInfo, incremental: bool) -> Vec<Duration> {
    let mut times = Vec::with_capacity(pods.len());
    let mut usage = Usage::default();
    for (i, pod) in pods.iter().enumerate() {
        let start = Instant::now();
        let decision = if incremental {
            let d = admission::admit_with_usage(pod, node, &usage);
            if d == Decision::Admit {
                usage.add(pod);
            }
            d
        } else {
            admission::admit(pod, node, &pods[..i])
        };
        times.push(start.elapsed());
        assert_eq!(decision, Decision::Admit, "pod {i} fits by construction");
    }
    times
}

fn main() {
    let args = Args::parse();
    let rounds = args.rounds.max(1);
    let node = node();
    let pods: Vec<Pod> = (0..PODS).map(pod).collect();
    // One round unmeasured, to warm caches and the allocator.
    round(&pods, &node, true);
    let mut report = serde_json::Map::new();
    println!("admission of {PODS} pods, {rounds} rounds");
    println!(
        "{:<14} {:>12} {:>12} {:>12} {:>16}",
        "way", "p50/decision", "p99", "max", "total (p50)"
    );
    for (name, incremental) in [("incremental", true), ("from scratch", false)] {
        let mut each = Vec::with_capacity(rounds * PODS);
        let mut totals = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let times = round(&pods, &node, incremental);
            totals.push(times.iter().sum());
            each.extend(times);
        }
        let s = stats(each, totals);
        println!(
            "{:<14} {:>10.1}µs {:>10.1}µs {:>10.1}µs {:>14.2}ms",
            name,
            s.p50.as_secs_f64() * 1e6,
            s.p99.as_secs_f64() * 1e6,
            s.max.as_secs_f64() * 1e6,
            s.total_p50.as_secs_f64() * 1e3,
        );
        report.insert(
            name.replace(' ', "_"),
            json!({
                "p50_us": s.p50.as_secs_f64() * 1e6,
                "p99_us": s.p99.as_secs_f64() * 1e6,
                "max_us": s.max.as_secs_f64() * 1e6,
                "total_ms_p50": s.total_p50.as_secs_f64() * 1e3,
            }),
        );
    }
    report.insert("pods".into(), json!(PODS));
    report.insert("rounds".into(), json!(rounds));
    report.insert(
        "profile".into(),
        json!(if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        }),
    );
    println!("{}", serde_json::Value::Object(report));
}
