//! End to end, with the real control plane and containerd 2.x: upstream's DRA test driver
//! (`k8s.io/kubernetes/test/e2e/dra/test-driver`, built from the control plane's pin by
//! `scripts/cluster build-dra`) runs its kubelet plugin as a host process that registers in
//! the agent's `plugins_registry`, publishes its devices as ResourceSlices and writes its CDI
//! specs into the testbed's CDI directory. The real scheduler allocates a ResourceClaim from a
//! DeviceClass; the pod runs with the driver's CDI environment variable inside; a second pod
//! shares the claim (prepared once); the claim is unprepared after the last pod (and after a
//! pod that finishes); a SIGKILL of the agent keeps it prepared; with the
//! driver killed a new pod waits with the driver's error while the running pod keeps running.
//! Upstream's `dra_*` metrics count the driver calls, the pods' prepares and unprepares, and
//! the claims in use, along the way. The driver's health stream is read: the claim's device
//! shows in the container's `allocatedResourcesStatus` (`Unknown`: the driver reports no
//! device). A DeviceClass with an `extendedResourceName` lets a pod ask for the driver's
//! devices as an extended resource: the scheduler makes the claim, the node prepares it and
//! the container gets the driver's variable for the claim's request.
//!
//! A second case shows CDI on the testbed without DRA: upstream's sample device plugin in its
//! CDI mode answers `Allocate` with a CDI device name, whose spec (an environment variable and
//! a mount) the test writes into the testbed's CDI directory; both reach the container, and
//! the device's health (`Healthy`) its status.
//!
//! Needs the containerd 2.x testbed (CDI): `DECKHAND_TESTBED_DIR` names it, its `testbed.env`
//! its CDI directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, built_dir, cluster_dir, create_namespace, event_reasons, joined_agent,
    sleeping_spec, wait_node_ready,
};
use common::{containers_of, cri, wait_until};
use deckhand::clients::cri::RuntimeService;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "e2e-dra";
const NS: &str = "e2e-dra";
const DRIVER: &str = "test-driver.cdi.k8s.io";
const CLASS: &str = "e2e-dra.deckhand.test";
/// The class that backs an extended resource with the driver's devices.
const EXTENDED_CLASS: &str = "e2e-dra-extended.deckhand.test";
const EXTENDED_RESOURCE: &str = "deckhand.test/dra-gpu";

/// The dir with `test-driver`, built or reused by `scripts/cluster build-dra`.
fn driver_binary() -> PathBuf {
    built_dir("build-dra").join("test-driver")
}

/// The testbed's CDI directory, from its `testbed.env`; fails when the testbed has none.
fn cdi_dir() -> PathBuf {
    let dir = std::env::var("DECKHAND_TESTBED_DIR").expect(
        "DECKHAND_TESTBED_DIR must name the containerd 2.x testbed (scripts/testbed up DIR)",
    );
    let env = std::fs::read_to_string(Path::new(&dir).join("testbed.env"))
        .expect("the testbed's testbed.env");
    let cdi = env
        .lines()
        .find_map(|l| l.strip_prefix("CDI_DIR="))
        .unwrap_or_default();
    assert!(
        !cdi.is_empty(),
        "the testbed {dir} has no CDI directory: DRA needs the containerd 2.x testbed"
    );
    PathBuf::from(cdi)
}

/// The driver's kubelet plugin as a host process; killed (SIGKILL) when dropped.
struct TestDriver {
    child: Child,
}

impl TestDriver {
    fn start(binary: &Path, root: &Path, cdi: &Path, log: &Path) -> TestDriver {
        // It makes its data dir's parent, not the dir its socket goes in.
        std::fs::create_dir_all(root.join("plugins").join(DRIVER)).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--kubeconfig={}",
                cluster_dir().join("admin.kubeconfig").display()
            ))
            .arg("-v=3")
            .arg("kubelet-plugin")
            .arg(format!("--node-name={NODE}"))
            .arg(format!("--cdi-dir={}", cdi.display()))
            .arg(format!(
                "--plugin-registration-path={}",
                root.join("plugins_registry").display()
            ))
            .arg(format!("--datadir={}", root.join("plugins").display()))
            .arg("--num-devices=2")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the DRA test driver");
        TestDriver { child }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Deletes the named DeviceClass when the test ends.
struct ClassCleanup(kube::Client, &'static str);

impl Drop for ClassCleanup {
    fn drop(&mut self) {
        let (client, name) = (self.0.clone(), self.1);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let api: Api<DeviceClass> = Api::all(client);
                let _ = api.delete(name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// The DeviceClass of the driver's devices; with `extended`, also the extended resource
/// name pods may ask for it by (the scheduler then makes a claim for them).
fn device_class(name: &str, extended: Option<&str>) -> DeviceClass {
    let mut spec = serde_json::json!({
        "selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]
    });
    if let Some(resource) = extended {
        spec["extendedResourceName"] = resource.into();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// Creates a DeviceClass afresh, deleted when the returned guard drops.
async fn create_class(client: &kube::Client, class: DeviceClass) -> ClassCleanup {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let name = class.metadata.name.clone().unwrap_or_default();
    let _ = classes.delete(&name, &DeleteParams::default()).await;
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    ClassCleanup(
        client.clone(),
        if name == CLASS { CLASS } else { EXTENDED_CLASS },
    )
}

/// The `allocatedResourcesStatus` of the pod's first container, as (name, resource ID,
/// health) rows, once the API server shows any.
async fn allocated_resources(pods: &Api<Pod>, name: &str) -> Option<Vec<(String, String, String)>> {
    let pod = pods.get(name).await.ok()?;
    let status = pod.status?.container_statuses?.into_iter().next()?;
    let rows: Vec<(String, String, String)> = status
        .allocated_resources_status?
        .into_iter()
        .flat_map(|s| {
            let name = s.name.clone();
            s.resources
                .into_iter()
                .flatten()
                .map(move |r| (name.clone(), r.resource_id, r.health.unwrap_or_default()))
        })
        .collect();
    (!rows.is_empty()).then_some(rows)
}

fn claim(name: &str) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}
    }))
    .unwrap()
}

/// A sleeping pod for the scheduler (it allocates the claim), kept to this node.
fn claim_pod(name: &str, claim: &str) -> Pod {
    let mut spec = sleeping_spec(1);
    spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": NODE});
    spec["resourceClaims"] = serde_json::json!([{"name": "gpu", "resourceClaimName": claim}]);
    spec["containers"][0]["resources"] = serde_json::json!({"claims": [{"name": "gpu"}]});
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn wait_running(pods: &Api<Pod>, name: &str, agent: &common::Agent, driver_log: &Path) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let status = pods.get(name).await.ok().and_then(|p| p.status);
        if status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pod {name} not Running: {status:?}; agent log tail:\n{}\ndriver log tail:\n{}",
            tail(&agent.log()),
            tail(&std::fs::read_to_string(driver_log).unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn running_container(cri: &deckhand::clients::cri::CriClient, pod: &str) -> Option<String> {
    containers_of(cri, pod)
        .await
        .into_iter()
        .find(|c| c.state == 1)
        .map(|c| c.id)
}

/// The value of `var` in the pod's running container.
async fn env_in(cri: &deckhand::clients::cri::CriClient, pod: &str, var: &str) -> String {
    let id = running_container(cri, pod)
        .await
        .expect("a running container");
    let out = cri
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), format!("echo \"${var}\"")],
            10,
        )
        .await
        .expect("exec in the container");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn count(log: &str, line: &str) -> usize {
    log.matches(line).count()
}

/// The value of one series (name and labels as the page prints them) on the agent's
/// `/metrics`; fails naming the series when the page lacks it.
async fn metric(agent: &common::Agent, series: &str) -> f64 {
    let line = common::pressure::metrics_line(agent, &format!("{series} "))
        .await
        .unwrap_or_else(|| panic!("{series} is not on /metrics"));
    line[series.len()..].trim().parse().unwrap()
}

/// `dra_grpc_operations_duration_seconds_count` of the test driver's `method` ending in `code`.
fn grpc_count(method: &str, code: &str) -> String {
    format!(
        "dra_grpc_operations_duration_seconds_count{{driver_name=\"{DRIVER}\",grpc_status_code=\"{code}\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}\"}}"
    )
}

/// `dra_operations_duration_seconds_count` of `operation` that failed or not.
fn operation_count(operation: &str, failed: bool) -> String {
    format!(
        "dra_operations_duration_seconds_count{{is_error=\"{failed}\",operation_name=\"{operation}\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_test_drivers_claims_reach_pods_prepared_once_and_released() {
    let binary = driver_binary();
    let cdi = cdi_dir();
    let client = admin().await;
    let cri = cri().await;
    let (mut agent, _node) = joined_agent(NODE);
    agent
        .extra_args
        .push("--eviction-hard=memory.available<100Mi".into());
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_node_ready(&client, NODE, &agent).await;
    let root = agent.root_dir();
    let driver_log = agent.dir.path().join("driver.log");
    let mut driver = TestDriver::start(&binary, &root, &cdi, &driver_log);
    wait_until("the DRA driver registered", WAIT, || async {
        (count(&agent.log(), "DRA driver registered") > 0).then_some(())
    })
    .await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    wait_until("the driver published its ResourceSlice", WAIT, || async {
        let list = slices.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|s| s.spec.node_name.as_deref() == Some(NODE))
            .then_some(())
    })
    .await;
    let _class = create_class(&client, device_class(CLASS, None)).await;
    let _ns = create_namespace(&client, NS).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // One claim, two pods: prepared once, its CDI env in both containers.
    claims
        .create(&PostParams::default(), &claim("shared"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &claim_pod("dra-a", "shared"))
        .await
        .unwrap();
    wait_running(&pods, "dra-a", &agent, &driver_log).await;
    assert_eq!(env_in(&cri, "dra-a", "claim_shared_gpu").await, "true");
    // The driver serves the health service but reports no device: the claim's device reads
    // Unknown in the container's status, under its CDI ID.
    assert!(
        count(&agent.log(), "reading the DRA driver's device health") > 0,
        "the health stream opened: {}",
        tail(&agent.log())
    );
    let health = wait_until("dra-a's allocatedResourcesStatus", WAIT, || async {
        allocated_resources(&pods, "dra-a").await
    })
    .await;
    assert_eq!(health.len(), 1, "{health:?}");
    assert_eq!(health[0].0, "claim:gpu");
    assert!(
        health[0].1.starts_with(&format!("{DRIVER}/test=claim-")),
        "{health:?}"
    );
    assert_eq!(health[0].2, "Unknown");
    pods.create(&PostParams::default(), &claim_pod("dra-b", "shared"))
        .await
        .unwrap();
    wait_running(&pods, "dra-b", &agent, &driver_log).await;
    assert_eq!(env_in(&cri, "dra-b", "claim_shared_gpu").await, "true");
    assert_eq!(count(&agent.log(), "DRA driver prepared claims"), 1);
    // Upstream's DRA metrics: one driver call, two pods' prepares, one claim in use.
    assert_eq!(
        metric(&agent, &grpc_count("NodePrepareResources", "OK")).await,
        1.0
    );
    assert!(metric(&agent, &operation_count("PrepareResources", false)).await >= 2.0);
    for driver in ["<any>", DRIVER] {
        let series = format!("dra_resource_claims_in_use{{driver_name=\"{driver}\"}}");
        assert_eq!(metric(&agent, &series).await, 1.0, "{series}");
    }
    // Upstream's pod-resources client lists the claim with the driver's device.
    let out = Command::new(devices_dir().join("devices"))
        .arg(root.join("pod-resources/kubelet.sock"))
        .arg("list")
        .output()
        .expect("run the pod-resources client");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let dynamic: Vec<&serde_json::Value> = list["pod_resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == "dra-a" && p["namespace"] == NS)
        .flat_map(|p| p["containers"].as_array().into_iter().flatten())
        .flat_map(|c| c["dynamic_resources"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(dynamic.len(), 1, "dra-a's claims in pod-resources: {list}");
    assert_eq!(dynamic[0]["claim_name"], "shared");
    let resource = &dynamic[0]["claim_resources"][0];
    assert_eq!(resource["driver_name"], DRIVER, "{list}");
    assert!(
        resource["cdi_devices"][0]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(&format!("{DRIVER}/test=claim-"))),
        "{list}"
    );
    let state = std::fs::read_to_string(root.join("dra_manager_state")).unwrap();
    assert!(
        state.contains("DRACheckpoint") && state.contains("shared"),
        "{state}"
    );

    // SIGKILL and start again: the claim stays prepared (the checkpoint), the pods run on,
    // and nothing is prepared again.
    let (a, b) = (
        running_container(&cri, "dra-a").await,
        running_container(&cri, "dra-b").await,
    );
    let registered = count(&agent.log(), "DRA driver registered");
    agent.kill();
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_until("the DRA driver registered again", WAIT, || async {
        (count(&agent.log(), "DRA driver registered") > registered).then_some(())
    })
    .await;
    // The start deleted the node's slices (upstream's start-up wipe); the driver publishes
    // its own again.
    assert!(
        agent.log().contains("deleted the node's ResourceSlices"),
        "the start-up wipe is logged"
    );
    wait_until(
        "the driver's ResourceSlice published again",
        WAIT,
        || async { node_slices(&slices).await?.then_some(()) },
    )
    .await;
    assert_eq!(running_container(&cri, "dra-a").await, a);
    assert_eq!(running_container(&cri, "dra-b").await, b);

    // Unprepared after the last pod only.
    pods.delete("dra-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("dra-a gone", WAIT, || async {
        pods.get_opt("dra-a").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(count(&agent.log(), "DRA driver unprepared claims"), 0);
    pods.delete("dra-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the shared claim unprepared", WAIT, || async {
        (count(&agent.log(), "DRA driver unprepared claims") == 1).then_some(())
    })
    .await;
    assert_eq!(
        metric(&agent, &grpc_count("NodeUnprepareResources", "OK")).await,
        1.0
    );
    assert!(metric(&agent, &operation_count("UnprepareResources", false)).await >= 2.0);
    assert_eq!(
        metric(&agent, "dra_resource_claims_in_use{driver_name=\"<any>\"}").await,
        0.0
    );

    // A pod that finishes releases its claim without being deleted.
    claims
        .create(&PostParams::default(), &claim("once"))
        .await
        .unwrap();
    let mut once = claim_pod("dra-once", "once");
    let spec = once.spec.as_mut().unwrap();
    spec.restart_policy = Some("Never".into());
    spec.containers[0].command = Some(vec!["true".into()]);
    pods.create(&PostParams::default(), &once).await.unwrap();
    wait_until("the finished pod's claim unprepared", WAIT, || async {
        (count(&agent.log(), "DRA driver unprepared claims") == 2).then_some(())
    })
    .await;
    let phase = pods
        .get("dra-once")
        .await
        .unwrap()
        .status
        .and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Succeeded"));

    // An extended resource backed by the driver: the scheduler makes the claim, the node
    // prepares it and gives the container the devices of its requests.
    let _extended = create_class(
        &client,
        device_class(EXTENDED_CLASS, Some(EXTENDED_RESOURCE)),
    )
    .await;
    let mut spec = sleeping_spec(1);
    spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": NODE});
    spec["containers"][0]["resources"] = serde_json::json!({"limits": {EXTENDED_RESOURCE: "1"}});
    let ext: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra-ext"}, "spec": spec,
    }))
    .unwrap();
    pods.create(&PostParams::default(), &ext).await.unwrap();
    wait_running(&pods, "dra-ext", &agent, &driver_log).await;
    let status = pods.get("dra-ext").await.unwrap().status.unwrap();
    let made = status
        .extended_resource_claim_status
        .expect("the scheduler made a claim for the extended resource");
    let id = running_container(&cri, "dra-ext").await.unwrap();
    let env = cri
        .exec_sync(id, vec!["env".into()], 10)
        .await
        .expect("exec env");
    let env = String::from_utf8_lossy(&env.stdout).to_string();
    // The driver's variable: claim_<claim>_<base request>, every other character `_`.
    let request = &made.request_mappings[0].request_name;
    let base = request.split('/').next().unwrap_or_default();
    let wanted: String = format!("claim_{}_{base}", made.resource_claim_name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        + "=true";
    assert!(
        env.lines().any(|l| l == wanted),
        "{wanted} in the container's env:\n{env}"
    );
    pods.delete("dra-ext", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the extended resource's claim unprepared", WAIT, || async {
        (count(&agent.log(), "DRA driver unprepared claims") == 3).then_some(())
    })
    .await;

    // The driver killed: a running pod keeps running, a new one waits with the driver's error.
    let solo = claims
        .create(&PostParams::default(), &claim("solo"))
        .await
        .unwrap();
    // The killed driver cannot remove the claim's CDI spec: the test does.
    let _solo_spec = SpecCleanup(cdi.join(format!(
        "{DRIVER}-{}-gpu.json",
        solo.metadata.uid.unwrap_or_default()
    )));
    pods.create(&PostParams::default(), &claim_pod("dra-c", "solo"))
        .await
        .unwrap();
    wait_running(&pods, "dra-c", &agent, &driver_log).await;
    let running = running_container(&cri, "dra-c").await.expect("dra-c runs");
    driver.kill();
    claims
        .create(&PostParams::default(), &claim("late"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &claim_pod("dra-d", "late"))
        .await
        .unwrap();
    let (_, message) = wait_until(
        "dra-d's FailedPrepareDynamicResources event",
        WAIT,
        || async {
            event_reasons(&client, NS, "dra-d")
                .await
                .into_iter()
                // The first try may come before the Node authorizer saw the binding (Forbidden).
                .find(|(reason, message)| {
                    reason == "FailedPrepareDynamicResources"
                        && message.contains("NodePrepareResources")
                })
        },
    )
    .await;
    assert!(
        message.starts_with(
            "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources: "
        ),
        "{message}"
    );
    let status = pods.get("dra-d").await.unwrap().status.unwrap();
    let waiting = status.container_statuses.unwrap_or_default()[0]
        .state
        .clone()
        .and_then(|s| s.waiting)
        .expect("dra-d's container waits");
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        containers_of(&cri, "dra-d").await.is_empty(),
        "nothing of dra-d started"
    );
    assert_eq!(
        running_container(&cri, "dra-c").await.as_deref(),
        Some(running.as_str()),
        "dra-c untouched by the driver's end"
    );
    // The failed calls and prepares are timed too, under gRPC's code.
    assert!(metric(&agent, &grpc_count("NodePrepareResources", "Unavailable")).await >= 1.0);
    assert!(metric(&agent, &operation_count("PrepareResources", true)).await >= 1.0);

    // The driver does not come back (killed, it leaves its registration socket behind; its
    // service socket refuses): 30 s after that is seen (upstream's wiping delay) its slices
    // are deleted, so the scheduler no longer allocates its devices here.
    wait_until(
        "the gone driver's ResourceSlices deleted",
        Duration::from_secs(120),
        || async { (!node_slices(&slices).await?).then_some(()) },
    )
    .await;
    assert!(
        agent
            .log()
            .contains("the DRA driver has not come back; deleting its ResourceSlices")
    );
}

/// Whether the test driver has a ResourceSlice for the node (`None`: the list failed).
async fn node_slices(slices: &Api<ResourceSlice>) -> Option<bool> {
    let list = slices.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .any(|s| s.spec.node_name.as_deref() == Some(NODE) && s.spec.driver == DRIVER),
    )
}

/// The dir of the sample device plugin and the pod-resources client (`devices`), built or
/// reused by `scripts/cluster build-devices`.
fn devices_dir() -> PathBuf {
    built_dir("build-devices")
}

/// The sample plugin in CDI mode, in a mount namespace of its own where the agent's
/// `device-plugins` is its `/var/lib/kubelet/device-plugins` and a scratch dir its
/// `/var/run/cdi` (where it writes a spec of its own, which containerd never reads).
fn start_cdi_sample_plugin(
    binary: &Path,
    device_plugins: &Path,
    scratch: &Path,
    log: &Path,
) -> TestDriver {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mkdir -p /var/lib/kubelet/device-plugins /var/run/cdi \
             && mount --bind \"$1\" /var/lib/kubelet/device-plugins \
             && mount --bind \"$2\" /var/run/cdi && exec \"$3\"",
        )
        .arg("sh")
        .arg(device_plugins)
        .arg(scratch)
        .arg(binary)
        .env("PLUGIN_SOCK_DIR", "/var/lib/kubelet/device-plugins")
        .env("CDI_ENABLED", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the sample device plugin under unshare");
    TestDriver { child }
}

/// Removes a CDI spec from the testbed when the test ends.
struct SpecCleanup(PathBuf);

impl Drop for SpecCleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdi_device_named_by_a_device_plugin_reaches_the_container() {
    const CDI_NODE: &str = "e2e-cdi";
    const CDI_NS: &str = "e2e-cdi";
    let binary = devices_dir().join("sample-device-plugin");
    let cdi = cdi_dir();
    let client = admin().await;
    let cri = cri().await;
    let (mut agent, _node) = joined_agent(CDI_NODE);
    agent
        .extra_args
        .push("--eviction-hard=memory.available<100Mi".into());
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_node_ready(&client, CDI_NODE, &agent).await;
    // The spec the plugin's names resolve to: per device an env var and a mounted file.
    let files = agent.dir.path().join("cdi-files");
    std::fs::create_dir_all(&files).unwrap();
    let devices: Vec<serde_json::Value> = ["Dev-1", "Dev-2"]
        .iter()
        .map(|dev| {
            let host = files.join(dev);
            std::fs::write(&host, format!("mounted {dev}\n")).unwrap();
            serde_json::json!({
                "name": format!("CDI-{dev}"),
                "containerEdits": {
                    "env": [format!("DECKHAND_CDI={dev}")],
                    "mounts": [{"hostPath": host, "containerPath": "/cdi/mounted", "options": ["ro", "bind"]}]
                }
            })
        })
        .collect();
    let spec = cdi.join("deckhand-e2e-example.com.json");
    let spec_json = serde_json::json!({"cdiVersion": "0.6.0", "kind": "example.com/resource", "devices": devices});
    std::fs::write(&spec, serde_json::to_vec(&spec_json).unwrap()).unwrap();
    let _spec = SpecCleanup(spec);
    let scratch = agent.dir.path().join("plugin-cdi");
    std::fs::create_dir_all(&scratch).unwrap();
    let log = agent.dir.path().join("plugin.log");
    let _plugin = start_cdi_sample_plugin(
        &binary,
        &agent.root_dir().join("device-plugins"),
        &scratch,
        &log,
    );
    wait_until("the sample plugin reported its devices", WAIT, || async {
        (count(&agent.log(), "device plugin reported devices") > 0).then_some(())
    })
    .await;

    let _ns = create_namespace(&client, CDI_NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), CDI_NS);
    let mut spec = sleeping_spec(1);
    spec["containers"][0]["resources"] =
        serde_json::json!({"limits": {"example.com/resource": "1"}});
    pods.create(
        &PostParams::default(),
        &bound_pod_with("cdi-one", CDI_NODE, spec),
    )
    .await
    .unwrap();
    wait_running(&pods, "cdi-one", &agent, &log).await;
    let dev = env_in(&cri, "cdi-one", "DECKHAND_CDI").await;
    assert!(
        dev == "Dev-1" || dev == "Dev-2",
        "the CDI env inside: {dev:?}"
    );
    let id = running_container(&cri, "cdi-one").await.unwrap();
    let out = cri
        .exec_sync(id, vec!["cat".into(), "/cdi/mounted".into()], 10)
        .await
        .expect("exec cat");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("mounted {dev}\n")
    );
    // The device's health, as the plugin reports it, in the container's status.
    let health = wait_until("cdi-one's allocatedResourcesStatus", WAIT, || async {
        allocated_resources(&pods, "cdi-one").await
    })
    .await;
    assert_eq!(
        health,
        vec![(
            "example.com/resource".to_string(),
            dev.clone(),
            "Healthy".to_string()
        )]
    );
}
