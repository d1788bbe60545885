//! The real test control plane (`scripts/cluster up DIR`, started by `scripts/test`): admin
//! and per-node credentials, and clean-up of the Nodes a test registers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The cluster's directory, or a failure that says how to get one.
pub fn cluster_dir() -> PathBuf {
    match std::env::var("DECKHAND_TEST_CLUSTER") {
        Ok(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!(
            "tests that join a cluster need the test control plane: run `scripts/test`, or start \
             it with `scripts/cluster up DIR` and export DECKHAND_TEST_CLUSTER=DIR"
        ),
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster")
}

/// Runs `scripts/cluster ARGS...` and fails the test with its output when it fails; its
/// standard output.
pub fn cluster_cmd(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .expect("run scripts/cluster");
    assert!(
        out.status.success(),
        "scripts/cluster {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cache dir of an upstream program `scripts/cluster BUILD` builds or reuses (`build-dra`,
/// `build-devices`): the last line the build prints.
pub fn built_dir(build: &str) -> PathBuf {
    let text = cluster_cmd(&[build]);
    PathBuf::from(
        text.lines()
            .last()
            .expect("the build printed its dir")
            .trim(),
    )
}

/// A kubeconfig with the client certificate of node `name` (`system:node:<name>`).
pub fn node_kubeconfig(name: &str) -> PathBuf {
    let dir = cluster_dir();
    let path = dir.join(format!("{name}.kubeconfig"));
    if !path.exists() {
        cluster_cmd(&["node-kubeconfig", &dir.to_string_lossy(), name]);
    }
    path
}

/// A client with the cluster's admin credentials, failing clearly when there is no cluster.
pub async fn admin() -> kube::Client {
    let path = cluster_dir().join("admin.kubeconfig");
    match deckhand::clients::apiserver::connect(
        &path,
        &deckhand::clients::apiserver::ClientOptions {
            qps: -1.0,
            burst: 0,
            timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(10),
        },
    )
    .await
    {
        Ok(c) => c,
        Err(err) => panic!(
            "the test control plane is not usable ({err}); start it with `scripts/cluster up DIR`"
        ),
    }
}

/// The Node `name`, if it exists.
pub async fn get_node(client: &kube::Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// The node Lease of `name`, if it exists.
pub async fn get_lease(client: &kube::Client, name: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// The status of the Node's condition `kind` ("True", "False", "Unknown").
pub fn condition(node: &Node, kind: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

/// An agent for node `node` that joins the cluster with that node's credentials and a short
/// Lease (8 s, renewed every 2 s), so tests see renewals within seconds; and the clean-up of
/// its Node.
pub fn joined_agent(node: &str) -> (super::Agent, NodeCleanup) {
    let cleanup = NodeCleanup(node.to_string());
    let mut agent = super::Agent::new(node);
    let config = agent.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeLeaseDurationSeconds: 8\n",
    )
    .unwrap();
    agent.extra_args.extend([
        format!("--kubeconfig={}", node_kubeconfig(node).display()),
        format!("--config={}", config.display()),
    ]);
    (agent, cleanup)
}

/// Runs a clean-up with the admin client to its end, from a `Drop` (which may run inside the
/// test's runtime, or after a panic): on a thread of its own with a runtime of its own.
pub fn clean_up_with_admin<F, Fut>(cleanup: F)
where
    F: FnOnce(kube::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move { cleanup(admin().await).await })
    })
    .join();
}

/// Deletes a Node (and its Lease) when dropped, even when the test failed half-way.
pub struct NodeCleanup(pub String);

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        clean_up_with_admin(move |client| async move {
            let _ = Api::<Node>::all(client.clone())
                .delete(&name, &DeleteParams::default())
                .await;
            let _ = Api::<Lease>::namespaced(client, "kube-node-lease")
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// The waiting (reason, message) of the pod's first container, if it waits.
pub async fn first_waiting(pods: &Api<Pod>, name: &str) -> Option<(String, String)> {
    let p = pods.get(name).await.ok()?;
    let w = p
        .status?
        .container_statuses?
        .first()?
        .state
        .clone()?
        .waiting?;
    Some((w.reason?, w.message.unwrap_or_default()))
}

/// Deletes the test's namespace (its pods at once) when dropped.
pub struct NamespaceCleanup(pub String);

impl Drop for NamespaceCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        clean_up_with_admin(move |client| async move {
            // Pods bound to a node that is gone would hold the namespace in Terminating: they
            // go first, at once.
            let _ = Api::<Pod>::namespaced(client.clone(), &name)
                .delete_collection(
                    &DeleteParams::default().grace_period(0),
                    &Default::default(),
                )
                .await;
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// The spec of a pod that sleeps until told to stop: busybox from the testbed (never
/// pulled), `grace` seconds to stop, and no service-account token volume (these tests are
/// about other things; `e2e_api_volumes` covers the token, and leaving it out saves a
/// TokenRequest per pod).
pub fn sleeping_spec(grace: i64) -> serde_json::Value {
    serde_json::json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": grace,
        "containers": [{
            "name": "app",
            "image": super::BUSYBOX,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"],
        }],
    })
}

/// A bare pod bound to `node` directly (no scheduler, no controller to replace it).
pub fn bound_pod(name: &str, node: &str) -> Pod {
    bound_pod_with(name, node, sleeping_spec(30))
}

/// [`bound_pod`] with a spec of the caller's.
pub fn bound_pod_with(name: &str, node: &str, mut spec: serde_json::Value) -> Pod {
    spec["nodeName"] = node.into();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// Waits up to `within` for the pod `name` to be in `phase` and returns it as last read.
pub async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str, within: Duration) -> Pod {
    super::wait_until(&format!("{name} {phase}"), within, || async {
        let p = pods.get(name).await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(p)
    })
    .await
}

pub async fn create_namespace(client: &kube::Client, ns: &str) -> NamespaceCleanup {
    create_namespace_waiting(client, ns, Duration::from_secs(60)).await
}

/// [`create_namespace`], waiting up to `account_wait` for the controller-manager to make the
/// namespace's default service account.
pub async fn create_namespace_waiting(
    client: &kube::Client,
    ns: &str,
    account_wait: Duration,
) -> NamespaceCleanup {
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    // The same test's namespace from an earlier run may still be going away.
    let namespaces = Api::<Namespace>::all(client.clone());
    super::wait_until(
        &format!("namespace {ns} created"),
        Duration::from_secs(90),
        || async {
            match namespaces.create(&PostParams::default(), &namespace).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(s)) if s.code == 409 => None,
                Err(e) => panic!("cannot create namespace {ns}: {e}"),
            }
        },
    )
    .await;
    // Pods need the namespace's default service account (the controller manager makes it).
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    super::wait_until(
        "the default service account (made by the controller-manager)",
        account_wait,
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await;
    NamespaceCleanup(ns.into())
}

/// Waits until the Node is Ready; on time-out, fails with the agent's log.
pub async fn wait_node_ready(client: &kube::Client, node: &str, agent: &super::Agent) -> Node {
    let deadline = Duration::from_secs(30);
    let start = std::time::Instant::now();
    loop {
        if let Some(n) = get_node(client, node).await
            && condition(&n, "Ready").as_deref() == Some("True")
        {
            return n;
        }
        if start.elapsed() > deadline {
            panic!(
                "node {node} not Ready after {deadline:?}; log:\n{}",
                agent.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A value from the cluster's `cluster.env` (`KUBECTL`, `AUDIT_LOG`, ...).
pub fn cluster_env(key: &str) -> String {
    let path = cluster_dir().join("cluster.env");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} is not in {}", path.display()))
        .trim_matches('"')
        .to_string()
}

/// Runs the cluster's own `kubectl` with the admin credentials; its stdout, or a failure with
/// its output.
pub fn kubectl(args: &[&str]) -> String {
    let out = Command::new(cluster_env("KUBECTL"))
        .arg(format!(
            "--kubeconfig={}",
            cluster_dir().join("admin.kubeconfig").display()
        ))
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The events about the object `name` in `ns` (any kind), as the API server lists them.
pub async fn events_of(client: &kube::Client, ns: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The (reason, message) of every event about `name` in `ns`.
pub async fn event_reasons(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    events_of(client, ns, name)
        .await
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// metrics-server for the cluster (`scripts/cluster metrics-server DIR --address IP`), on a
/// non-loopback address of this host, behind the APIService `v1beta1.metrics.k8s.io`. It
/// starts on a thread of its own (a test does other things meanwhile); when dropped, even
/// when the test failed half-way, the start is waited for, then metrics-server is stopped
/// and its API objects removed.
pub struct MetricsServer {
    starting: Option<std::thread::JoinHandle<std::io::Result<std::process::Output>>>,
}

impl MetricsServer {
    /// Starts it in the background.
    pub fn start(address: &str) -> MetricsServer {
        let dir = cluster_dir().to_string_lossy().into_owned();
        let address = address.to_string();
        let starting = std::thread::spawn(move || {
            Command::new(script())
                .args(["metrics-server", &dir, "--address", &address])
                .output()
        });
        MetricsServer {
            starting: Some(starting),
        }
    }

    /// Waits until the API server finds the APIService Available; fails the test with
    /// scripts/cluster's output when it does not get there.
    pub fn wait_available(&mut self) {
        let Some(starting) = self.starting.take() else {
            return;
        };
        let out = starting
            .join()
            .expect("the thread running scripts/cluster metrics-server")
            .expect("run scripts/cluster");
        assert!(
            out.status.success(),
            "scripts/cluster metrics-server failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(starting) = self.starting.take() {
            let _ = starting.join();
        }
        let _ = Command::new(script())
            .args(["metrics-server-down", &cluster_dir().to_string_lossy()])
            .output();
    }
}

/// Everything container `container` of pod `namespace/pod` printed in its first run, as the
/// CRI log under `logs` (the agent's pod logs dir) holds it; empty until the file exists.
pub fn first_run_log(logs: &Path, namespace: &str, pod: &str, container: &str) -> String {
    let prefix = format!("{namespace}_{pod}_");
    let Ok(entries) = std::fs::read_dir(logs) else {
        return String::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| std::fs::read_to_string(e.path().join(container).join("0.log")).ok())
        .collect()
}
