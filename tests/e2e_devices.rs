//! End to end, with the real control plane and containerd: upstream's sample device plugin
//! (`k8s.io/kubernetes/test/images/sample-device-plugin`, built from the control plane's pin by
//! `scripts/cluster build-devices`) runs as a host process and registers on the agent's
//! `device-plugins/kubelet.sock`; the node offers `example.com/resource` (its two devices);
//! a pod asking for one runs with its device mounted inside; a pod asking for three is refused
//! with upstream's `UnexpectedAdmissionError`; the agent killed with SIGKILL and started again
//! keeps the running pod's device (the checkpoint) and gives a new pod the other one; the
//! plugin restarted registers again while the running pods keep running; upstream's
//! pod-resources client (`podresources.v1`, the same build) lists each container's devices.
//!
//! The plugin always registers on `/var/lib/kubelet/device-plugins/kubelet.sock`: it runs in a
//! mount namespace of its own where the agent's `device-plugins` directory is bind-mounted
//! there, so the test never touches the host's kubelet directory. Its devices are files
//! `/tmp/Dev-1` and `/tmp/Dev-2` on the host, mounted at the same paths in the container.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, built_dir, create_namespace, get_node, joined_agent, sleeping_spec,
    wait_node_ready,
};
use common::{containers_of, cri, wait_until};
use deckhand::clients::cri::RuntimeService;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

const WAIT: Duration = Duration::from_secs(90);
const RESOURCE: &str = "example.com/resource";
const NODE: &str = "e2e-devices";
const NS: &str = "e2e-devices";

/// The dir with `sample-device-plugin` and `devices` (the pod-resources client), built or
/// reused by `scripts/cluster build-devices`.
fn binaries() -> PathBuf {
    built_dir("build-devices")
}

/// The sample plugin as a host process in its own mount namespace; stopped (SIGTERM, as its
/// README's pod would be) when dropped.
struct SamplePlugin {
    child: Child,
}

impl SamplePlugin {
    fn start(binary: &Path, device_plugins: &Path, log: &Path) -> SamplePlugin {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mkdir -p /var/lib/kubelet/device-plugins && mount --bind \"$1\" /var/lib/kubelet/device-plugins && exec \"$2\"")
            .arg("sh")
            .arg(device_plugins)
            .arg(binary)
            .env("PLUGIN_SOCK_DIR", "/var/lib/kubelet/device-plugins")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the sample device plugin under unshare");
        SamplePlugin { child }
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SamplePlugin {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node's capacity and allocatable of the resource.
async fn node_devices(client: &kube::Client) -> Option<(String, String)> {
    let node = get_node(client, NODE).await?;
    let status = node.status?;
    let cap = status.capacity?.get(RESOURCE)?.0.clone();
    let alloc = status.allocatable?.get(RESOURCE)?.0.clone();
    Some((cap, alloc))
}

async fn wait_node_devices(client: &kube::Client, want: (&str, &str), agent: &common::Agent) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let got = node_devices(client).await;
        if got.as_ref().map(|(c, a)| (c.as_str(), a.as_str())) == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {RESOURCE} never reached capacity/allocatable {want:?} (last {got:?}); log tail:\n{}",
            tail(&agent.log())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A sleeping pod bound to the node asking for `count` devices.
fn device_pod(name: &str, count: u32) -> Pod {
    let mut spec = sleeping_spec(1);
    spec["containers"][0]["resources"] =
        serde_json::json!({"limits": {RESOURCE: count.to_string()}});
    bound_pod_with(name, NODE, spec)
}

/// What the pod-resources API lists: pod name → container name → device IDs.
fn listed(client_bin: &Path, socket: &Path) -> Option<serde_json::Value> {
    let out = Command::new(client_bin)
        .arg(socket)
        .arg("list")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

fn devices_in(list: &serde_json::Value, pod: &str) -> Vec<String> {
    list["pod_resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == pod && p["namespace"] == NS)
        .flat_map(|p| p["containers"].as_array().cloned().unwrap_or_default())
        .flat_map(|c| c["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["resource_name"] == RESOURCE)
        .flat_map(|d| d["device_ids"].as_array().cloned().unwrap_or_default())
        .filter_map(|id| id.as_str().map(str::to_string))
        .collect()
}

/// The pod's device from pod-resources, once listed.
async fn device_of(client_bin: &Path, socket: &Path, pod: &str) -> String {
    wait_until(
        &format!("pod-resources lists {pod}'s device"),
        WAIT,
        || async {
            let list = listed(client_bin, socket)?;
            let ids = devices_in(&list, pod);
            (ids.len() == 1).then(|| ids[0].clone())
        },
    )
    .await
}

async fn wait_running(pods: &Api<Pod>, name: &str, agent: &common::Agent) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let phase = pods.get(name).await.ok().and_then(|p| p.status?.phase);
        if phase.as_deref() == Some("Running") {
            return;
        }
        let status = pods.get(name).await.ok().and_then(|p| p.status);
        assert!(
            std::time::Instant::now() < deadline,
            "pod {name} not Running: {status:?}; log tail:\n{}",
            tail(&agent.log())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The running container's ID of the pod (by its name label).
async fn running_container(cri: &deckhand::clients::cri::CriClient, pod: &str) -> Option<String> {
    containers_of(cri, pod)
        .await
        .into_iter()
        .find(|c| c.state == 1)
        .map(|c| c.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_device_plugins_devices_reach_pods_and_survive_restarts() {
    let bin = binaries();
    let (plugin_bin, client_bin) = (bin.join("sample-device-plugin"), bin.join("devices"));
    let client = admin().await;
    let cri = cri().await;
    let (mut agent, _node) = joined_agent(NODE);
    // The test machines' disks run nearly full: no disk threshold, so DiskPressure never
    // refuses the pods this test is about.
    agent
        .extra_args
        .push("--eviction-hard=memory.available<100Mi".into());
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_node_ready(&client, NODE, &agent).await;
    let device_plugins = agent.root_dir().join("device-plugins");
    let pod_resources = agent.root_dir().join("pod-resources/kubelet.sock");
    let plugin_log = agent.dir.path().join("plugin.log");
    let mut plugin = SamplePlugin::start(&plugin_bin, &device_plugins, &plugin_log);
    wait_node_devices(&client, ("2", "2"), &agent).await;

    let _ns = create_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &device_pod("dev-one", 1))
        .await
        .unwrap();
    wait_running(&pods, "dev-one", &agent).await;
    let first = device_of(&client_bin, &pod_resources, "dev-one").await;
    let first_container = running_container(&cri, "dev-one")
        .await
        .expect("dev-one's container");
    let seen = cri
        .exec_sync(
            first_container.clone(),
            vec!["test".into(), "-e".into(), format!("/tmp/{first}")],
            10,
        )
        .await
        .expect("exec in dev-one");
    assert_eq!(
        seen.exit_code, 0,
        "the device's mount /tmp/{first} is inside the container"
    );

    // More than the node has free: refused as upstream's device manager refuses.
    pods.create(&PostParams::default(), &device_pod("dev-three", 3))
        .await
        .unwrap();
    let refused = wait_until("dev-three refused", WAIT, || async {
        let status = pods.get("dev-three").await.ok()?.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status)
    })
    .await;
    assert_eq!(refused.reason.as_deref(), Some("UnexpectedAdmissionError"));
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains("Allocate failed due to requested number of devices unavailable for example.com/resource. Requested: 3, Available: 1, which is unexpected"),
        "{message}"
    );
    assert!(
        containers_of(&cri, "dev-three").await.is_empty(),
        "nothing of dev-three started"
    );

    // SIGKILL and start again: the running pod keeps its device; a new pod gets the other
    // once the plugin has registered again (it watches for the new kubelet.sock; until then
    // the node has no healthy device, as upstream's).
    let connected = |log: &str| log.matches("device plugin connected").count();
    let before = connected(&agent.log());
    agent.kill();
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_until(
        "the plugin registered with the restarted agent",
        WAIT,
        || async { (connected(&agent.log()) > before).then_some(()) },
    )
    .await;
    wait_node_devices(&client, ("2", "2"), &agent).await;
    pods.create(&PostParams::default(), &device_pod("dev-two", 1))
        .await
        .unwrap();
    wait_running(&pods, "dev-two", &agent).await;
    let second = device_of(&client_bin, &pod_resources, "dev-two").await;
    assert_ne!(first, second, "never the device a running container holds");
    assert_eq!(
        device_of(&client_bin, &pod_resources, "dev-one").await,
        first
    );
    assert_eq!(
        running_container(&cri, "dev-one").await.as_deref(),
        Some(first_container.as_str()),
        "dev-one untouched by the restart"
    );

    // The plugin restarted: registered again, running pods untouched.
    let before = connected(&agent.log());
    let second_container = running_container(&cri, "dev-two")
        .await
        .expect("dev-two's container");
    plugin.stop();
    wait_node_devices(&client, ("2", "0"), &agent).await;
    // The plugin names its socket after the second it started in.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _plugin = SamplePlugin::start(&plugin_bin, &device_plugins, &plugin_log);
    wait_until("the plugin registered again", WAIT, || async {
        (connected(&agent.log()) > before).then_some(())
    })
    .await;
    wait_node_devices(&client, ("2", "2"), &agent).await;
    assert_eq!(
        running_container(&cri, "dev-one").await.as_deref(),
        Some(first_container.as_str())
    );
    assert_eq!(
        running_container(&cri, "dev-two").await.as_deref(),
        Some(second_container.as_str())
    );
    let list = listed(&client_bin, &pod_resources).expect("pod-resources answers");
    assert_eq!(devices_in(&list, "dev-one"), vec![first]);
    assert_eq!(devices_in(&list, "dev-two"), vec![second]);
}
