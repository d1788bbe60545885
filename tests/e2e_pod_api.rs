//! End to end, against the real test control plane and the private containerd: the pod API
//! settings of upstream's NodeConformance specs that Deckhand did not honour (issue 32): the
//! `sleep` preStop action within the grace period, `activeDeadlineSeconds` set on a running
//! pod, `hostnameOverride`, `runAsNonRoot` with an explicit root user, a termination message
//! written by a non-root user at a path of its own, a pod for another OS, and the service
//! environment variables.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, create_namespace, first_waiting, joined_agent, sleeping_spec,
    wait_node_ready, wait_phase,
};
use common::wait_until;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);

async fn status_of(pods: &Api<Pod>, name: &str) -> Option<k8s_openapi::api::core::v1::PodStatus> {
    pods.get(name).await.ok()?.status
}

/// A sleeping pod whose container first runs `script` with `/out` a host directory.
fn pod_writing(out: &Path, script: &str) -> serde_json::Value {
    let mut spec = sleeping_spec(1);
    spec["volumes"] =
        serde_json::json!([{"name": "out", "hostPath": {"path": out, "type": "Directory"}}]);
    let c = &mut spec["containers"][0];
    c["command"] = serde_json::json!([
        "sh",
        "-c",
        format!("{script}; trap 'exit 0' TERM; sleep 600 & wait")
    ]);
    c["volumeMounts"] = serde_json::json!([{"name": "out", "mountPath": "/out"}]);
    spec
}

/// Waits for a file the pod writes to its host directory.
async fn read_out(path: &Path) -> String {
    wait_until(&format!("{} written", path.display()), WAIT, || async {
        std::fs::read_to_string(path)
            .ok()
            .filter(|t| t.ends_with('\n'))
    })
    .await
}

/// Removes a pod's finalizers when dropped, even when the test failed half-way (a pod held
/// by one would hold its namespace in Terminating).
struct Release(String, String);

impl Drop for Release {
    fn drop(&mut self) {
        let (ns, name) = (self.0.clone(), self.1.clone());
        common::cluster::clean_up_with_admin(move |client| async move {
            let _ = Api::<Pod>::namespaced(client, &ns)
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
                )
                .await;
        });
    }
}

/// Upstream's `Lifecycle Sleep Hook` specs, shortened: a preStop `sleep` holds the stop for
/// its seconds within the grace period, and a deletion with a shorter grace period cuts it
/// there. Measured as upstream measures it: the container's `finishedAt` against the
/// deletion timestamp (the deletion time plus the grace period), with a finalizer holding the
/// pod so its last status can be read.
#[tokio::test]
async fn a_sleep_pre_stop_hook_holds_the_stop_within_the_grace_period() {
    let client = admin().await;
    let node = "pa-sleep";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pa-sleep";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // (name, sleep seconds, the pod's grace, the deletion's grace, lowest and highest delay)
    let rows = [
        ("within", 6, 20, None, 6, 20),
        ("cut-short", 30, 100, Some(8), 8, 30),
    ];
    for (name, sleep, grace, delete_grace, low, high) in rows {
        let mut spec = sleeping_spec(grace);
        spec["containers"][0]["lifecycle"] =
            serde_json::json!({"preStop": {"sleep": {"seconds": sleep}}});
        let mut pod = bound_pod_with(name, node, spec);
        pod.metadata.finalizers = Some(vec!["e2e.deckhand/hold".into()]);
        let _release = Release(ns.to_string(), name.to_string());
        pods.create(&PostParams::default(), &pod).await.unwrap();
        wait_phase(&pods, name, "Running", WAIT).await;
        let params = match delete_grace {
            Some(g) => DeleteParams::default().grace_period(g),
            None => DeleteParams::default(),
        };
        pods.delete(name, &params).await.unwrap();
        let deletion = pods
            .get(name)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .unwrap()
            .0;
        let terminated = || async {
            let s = status_of(&pods, name).await?;
            let t = s.container_statuses?.first()?.state.clone()?.terminated?;
            t.finished_at.map(|f| f.0)
        };
        let started = std::time::Instant::now();
        let finished = loop {
            if let Some(at) = terminated().await {
                break at;
            }
            if started.elapsed() > WAIT * 2 {
                panic!(
                    "{name}'s container not shown terminated; status {:?}\nlog:\n{}",
                    status_of(&pods, name).await,
                    agent.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let effective = delete_grace.unwrap_or(grace as u32) as i64;
        let delay = finished.as_second() - deletion.as_second() + effective;
        assert!(
            (low..=high).contains(&delay),
            "{name}: the stop came {delay} s after the deletion; expected {low}..={high}"
        );
    }
}

/// `activeDeadlineSeconds` set on a running pod: the pod ends Failed with upstream's reason
/// and message once the deadline (from its start time) has passed.
#[tokio::test]
async fn an_active_deadline_set_on_a_running_pod_fails_it() {
    let client = admin().await;
    let node = "pa-deadline";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pa-deadline";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &bound_pod_with("p", node, sleeping_spec(1)),
    )
    .await
    .unwrap();
    wait_phase(&pods, "p", "Running", WAIT).await;
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"activeDeadlineSeconds": 5}})),
    )
    .await
    .unwrap();
    let failed = wait_phase(&pods, "p", "Failed", WAIT).await;
    let status = failed.status.unwrap();
    assert_eq!(
        status.reason.as_deref(),
        Some("DeadlineExceeded"),
        "{status:?}"
    );
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
}

/// `hostnameOverride` is the pod's whole hostname (`hostname` and `hostname -f` both), over
/// `hostname` and `subdomain`; a pod with `runAsNonRoot` and `runAsUser: 0` waits in
/// `CreateContainerConfigError` with upstream's message; a non-root container writes its
/// termination message at a path of its own; a pod for Windows is refused with
/// `PodOSNotSupported`.
#[tokio::test]
async fn hostname_override_root_refusal_termination_message_and_pod_os() {
    let client = admin().await;
    let node = "pa-misc";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let out = agent.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pa-misc";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let mut spec = pod_writing(
        &out,
        "{ hostname; tail -n 1 /etc/hosts; } > /out/host.tmp && mv /out/host.tmp /out/host",
    );
    spec["hostname"] = "custom-host".into();
    spec["subdomain"] = "t".into();
    spec["hostnameOverride"] = "override.example.host".into();
    pods.create(&PostParams::default(), &bound_pod_with("host", node, spec))
        .await
        .unwrap();

    let mut spec = sleeping_spec(1);
    spec["containers"][0]["securityContext"] =
        serde_json::json!({"runAsNonRoot": true, "runAsUser": 0});
    pods.create(&PostParams::default(), &bound_pod_with("root", node, spec))
        .await
        .unwrap();

    let mut spec = sleeping_spec(1);
    spec["restartPolicy"] = "Never".into();
    let c = &mut spec["containers"][0];
    c["command"] = serde_json::json!(["sh", "-c", "echo -n DONE > /dev/termination-custom-log"]);
    c["terminationMessagePath"] = "/dev/termination-custom-log".into();
    c["securityContext"] = serde_json::json!({"runAsUser": 1000});
    pods.create(
        &PostParams::default(),
        &bound_pod_with("message", node, spec),
    )
    .await
    .unwrap();

    let mut spec = sleeping_spec(1);
    spec["os"] = serde_json::json!({"name": "windows"});
    spec["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("command");
    pods.create(
        &PostParams::default(),
        &bound_pod_with("windows", node, spec),
    )
    .await
    .unwrap();

    // The hostname, and the pod's own /etc/hosts line (`hostname -f` resolves through it):
    // the override alone, no domain.
    let text = read_out(&out.join("host")).await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "override.example.host", "{text}");
    assert!(
        lines[1].ends_with("\toverride.example.host") && lines[1].split('\t').count() == 2,
        "{text}"
    );

    let (reason, message) = wait_until("root waiting", WAIT, || async {
        first_waiting(&pods, "root")
            .await
            .filter(|(r, _)| r == "CreateContainerConfigError")
    })
    .await;
    assert_eq!(reason, "CreateContainerConfigError");
    assert!(
        message
            .starts_with("container's runAsUser breaks non-root policy (pod: \"root_e2e-pa-misc("),
        "{message}"
    );

    let done = wait_phase(&pods, "message", "Succeeded", WAIT).await;
    let terminated = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        terminated.message.as_deref(),
        Some("DONE"),
        "{terminated:?}"
    );

    let refused = wait_phase(&pods, "windows", "Failed", WAIT).await;
    assert_eq!(
        refused.status.unwrap().reason.as_deref(),
        Some("PodOSNotSupported")
    );
}

/// Every container gets the service variables of its namespace's Services and of
/// `kubernetes` in `default`; with `enableServiceLinks: false` only the latter.
#[tokio::test]
async fn containers_get_the_service_environment_variables() {
    let client = admin().await;
    let node = "pa-svcenv";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let out = agent.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pa-svcenv";
    let _ns = create_namespace(&client, ns).await;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "fooservice"},
        "spec": {"selector": {"app": "x"}, "ports": [{"name": "http", "port": 8765, "targetPort": 8080}]},
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    let kubernetes = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap();
    let master_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, links) in [("links", true), ("nolinks", false)] {
        let mut spec = pod_writing(
            &out,
            &format!("env > /out/{name}.tmp && mv /out/{name}.tmp /out/{name}"),
        );
        spec["enableServiceLinks"] = links.into();
        pods.create(&PostParams::default(), &bound_pod_with(name, node, spec))
            .await
            .unwrap();
    }
    let with = read_out(&out.join("links")).await;
    for line in [
        format!("FOOSERVICE_SERVICE_HOST={ip}"),
        "FOOSERVICE_SERVICE_PORT=8765".to_string(),
        "FOOSERVICE_SERVICE_PORT_HTTP=8765".to_string(),
        format!("FOOSERVICE_PORT=tcp://{ip}:8765"),
        format!("FOOSERVICE_PORT_8765_TCP_ADDR={ip}"),
        format!("KUBERNETES_SERVICE_HOST={master_ip}"),
    ] {
        assert!(
            with.lines().any(|l| l == line),
            "{line} missing from:\n{with}"
        );
    }
    let without = read_out(&out.join("nolinks")).await;
    assert!(
        without
            .lines()
            .any(|l| l == format!("KUBERNETES_SERVICE_HOST={master_ip}")),
        "{without}"
    );
    assert!(!without.contains("FOOSERVICE"), "{without}");
}
