//! End to end, against the real test control plane and the private containerd: the node's
//! stats as the API server and metrics-server read them.
//!
//! * `kubectl get --raw /api/v1/nodes/<node>/proxy/{stats/summary,metrics/resource,pods}`:
//!   the API server's `nodes/proxy` on the node API. It refuses loopback node addresses, so
//!   the node gets a non-loopback address of this host ([`HostAddress`], on `lo`) as its
//!   InternalIP (`--node-ip`) and listens there (`--address`).
//! * metrics-server (built by scripts/cluster from its module) on the same address behind the
//!   aggregation layer's APIService `v1beta1.metrics.k8s.io`; it scrapes `/metrics/resource`
//!   on the node, and `kubectl top pod` / `kubectl top node` show the pod's and node's CPU and
//!   memory.
//!
//! metrics-server starts on a thread while the node registers and the pod starts; everything
//! (metrics-server and its API objects, the address, the namespace, the Node) is removed by
//! guards, also on failure.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::cluster::{
    MetricsServer, admin, cluster_dir, create_namespace, joined_agent, kubectl, wait_node_ready,
};
use common::{BUSYBOX, HostAddress};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
/// From TEST-NET-2 (RFC 5737), never a real address; .73 as the helper's testbed subnet.
const NODE_ADDRESS: &str = "198.51.100.73";

fn pki(name: &str) -> PathBuf {
    cluster_dir().join("pki").join(name)
}

/// A pod whose container `spin` keeps a shell busy, so its CPU use is well above zero.
fn busy_pod(node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "busy"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "spin", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "while true; do :; done"],
            }],
        },
    }))
    .unwrap()
}

/// kubectl's last complaint, for the failure message of a wait that timed out.
static LAST_ERROR: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn last_error() -> String {
    LAST_ERROR.lock().map(|e| e.clone()).unwrap_or_default()
}

/// `kubectl get --raw` of a path on the node through the API server, or `None` while it
/// fails (kubectl's complaint is kept in [`LAST_ERROR`]).
async fn raw(node: &str, path: &str) -> Option<String> {
    let url = format!("/api/v1/nodes/{node}/proxy{path}");
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(common::cluster::cluster_env("KUBECTL"))
            .arg(format!(
                "--kubeconfig={}",
                cluster_dir().join("admin.kubeconfig").display()
            ))
            .args(["get", "--raw", &url])
            .output()
            .expect("run kubectl");
        if out.status.success() {
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if let Ok(mut e) = LAST_ERROR.lock() {
            *e = format!(
                "kubectl get --raw {url}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        None
    })
    .await
    .ok()?
}

/// As `common::wait_until` (with [`WAIT`]), failing with kubectl's last complaint too.
async fn wait_kubectl<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > WAIT {
            panic!(
                "timed out after {WAIT:?} waiting for {what}; kubectl's last complaint: {}",
                last_error()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl top ...`'s rows (header left out), or `None` while metrics-server has no
/// metrics for them yet (kubectl then fails).
async fn top(args: &'static [&'static str], ns: Option<&'static str>) -> Option<Vec<String>> {
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(common::cluster::cluster_env("KUBECTL"));
        cmd.arg(format!(
            "--kubeconfig={}",
            cluster_dir().join("admin.kubeconfig").display()
        ))
        .arg("top")
        .args(args)
        .arg("--no-headers");
        if let Some(ns) = ns {
            cmd.args(["-n", ns]);
        }
        let out = cmd.output().expect("run kubectl");
        if !out.status.success() {
            if let Ok(mut e) = LAST_ERROR.lock() {
                *e = format!(
                    "kubectl top {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            return None;
        }
        let rows: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        (!rows.is_empty()).then_some(rows)
    })
    .await
    .ok()?
}

/// The number in a `kubectl top` quantity column ("12m", "3Mi", "0%").
fn leading_number(field: &str) -> u64 {
    field
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

#[tokio::test]
async fn node_stats_through_the_api_server_and_metrics_server() {
    let client = admin().await;
    let node = "dn-apiproxy";
    let ns = "apiproxy-e2e";
    let address = HostAddress::add(NODE_ADDRESS);

    // metrics-server and its APIService come up while the node registers and runs the pod.
    let mut metrics_server = MetricsServer::start(&address.ip);

    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.address = address.ip.clone();
    agent.extra_args.extend([
        format!("--node-ip={}", address.ip),
        format!("--client-ca-file={}", pki("ca.crt").display()),
    ]);
    let _ns_cleanup = create_namespace(&client, ns).await;
    agent.start();
    let n = wait_node_ready(&client, node, &agent).await;
    let internal: Vec<String> = n
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(internal, [NODE_ADDRESS], "the node's InternalIP");

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &busy_pod(node))
        .await
        .expect("create the pod");

    // stats/summary through the API server: the node, and the pod with its container's CPU
    // rate (the second scrape of the agent's stats gives one) and memory.
    let summary: Value = wait_kubectl(
        "the pod with a CPU rate in stats/summary through the API server",
        || async {
            let s: Value = serde_json::from_str(&raw(node, "/stats/summary").await?).ok()?;
            let pod = s["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["name"] == "busy" && p["podRef"]["namespace"] == ns)?;
            pod["cpu"]["usageNanoCores"].as_u64()?;
            Some(s)
        },
    )
    .await;
    assert_eq!(summary["node"]["nodeName"], node, "{summary}");
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{summary}"
    );
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "busy")
        .unwrap();
    assert_eq!(pod["containers"][0]["name"], "spin", "{pod}");
    assert!(
        pod["containers"][0]["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{pod}"
    );
    // A spinning shell uses a good part of a core; 10m leaves room for a crowded machine.
    assert!(
        pod["cpu"]["usageNanoCores"]
            .as_u64()
            .is_some_and(|v| v > 10_000_000),
        "CPU of a spinning shell: {pod}"
    );

    // /metrics/resource (what metrics-server scrapes) and /pods, the same way.
    let page = raw(node, "/metrics/resource")
        .await
        .expect("GET metrics/resource through the API server");
    for series in [
        format!(
            "container_cpu_usage_seconds_total{{container=\"spin\",namespace=\"{ns}\",pod=\"busy\"}} "
        ),
        format!(
            "container_memory_working_set_bytes{{container=\"spin\",namespace=\"{ns}\",pod=\"busy\"}} "
        ),
        "node_cpu_usage_seconds_total ".to_string(),
    ] {
        assert!(
            page.lines().any(|l| l.starts_with(&series)),
            "{series} in\n{page}"
        );
    }
    let list: Value = serde_json::from_str(
        &raw(node, "/pods")
            .await
            .expect("GET pods through the API server"),
    )
    .expect("/pods is JSON");
    assert!(
        list["items"].as_array().is_some_and(|items| items
            .iter()
            .any(|p| p["metadata"]["name"] == "busy" && p["metadata"]["namespace"] == ns)),
        "{list}"
    );

    // kubectl top, once metrics-server has scraped the node twice (a CPU rate needs two).
    metrics_server.wait_available();
    let rows = wait_kubectl("kubectl top pod busy", || async {
        top(&["pod", "busy"], Some(ns)).await
    })
    .await;
    println!("kubectl top pod: {rows:?}");
    // NAME CPU(cores) MEMORY(bytes)
    let cols: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cols.len(), 3, "{rows:?}");
    assert_eq!(cols[0], "busy", "{rows:?}");
    assert!(
        cols[1].ends_with('m') && leading_number(cols[1]) > 10,
        "CPU: {rows:?}"
    );
    assert!(cols[2].ends_with("Mi"), "memory: {rows:?}");
    // kubectl rounds a shell's few hundred KiB down to 0Mi: the PodMetrics object has them.
    let metrics: Value = serde_json::from_str(&kubectl(&[
        "get",
        "--raw",
        &format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/busy"),
    ]))
    .unwrap();
    let usage = &metrics["containers"][0]["usage"];
    assert_eq!(metrics["containers"][0]["name"], "spin", "{metrics}");
    assert!(
        usage["memory"]
            .as_str()
            .is_some_and(|m| leading_number(m) > 0),
        "{metrics}"
    );

    let rows = wait_kubectl("kubectl top node", || async {
        top(&["node", "dn-apiproxy"], None).await
    })
    .await;
    println!("kubectl top node: {rows:?}");
    // NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)
    let cols: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cols.len(), 5, "{rows:?}");
    assert_eq!(cols[0], node, "{rows:?}");
    assert!(leading_number(cols[1]) > 0, "CPU: {rows:?}");
    assert!(leading_number(cols[3]) > 0, "memory: {rows:?}");
    // The node's metrics are also read through the API as an object.
    let metrics: Value = serde_json::from_str(&kubectl(&[
        "get",
        "--raw",
        &format!("/apis/metrics.k8s.io/v1beta1/nodes/{node}"),
    ]))
    .unwrap();
    assert_eq!(metrics["metadata"]["name"], node, "{metrics}");

    agent.stop();
}
