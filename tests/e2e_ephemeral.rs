//! End to end, against the real test control plane and the private containerd (issue 32): an
//! ephemeral container added through the `ephemeralcontainers` subresource runs in the pod's
//! sandbox, in its target's PID namespace, with its status and its log; the pod's status
//! reports the generation it was computed from; `setHostnameAsFQDN` makes the FQDN the pod's
//! hostname, and one too long for the kernel is refused with upstream's event.
//!
//! The API server reaches the node API (the debugger's log) only at a non-loopback node
//! address, so that node gets one of this host's (on `lo`, removed by its guard) as in
//! `e2e_api_proxy`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, cluster_dir, create_namespace, event_reasons, joined_agent,
    sleeping_spec, wait_node_ready, wait_phase,
};
use common::{HostAddress, wait_until};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);
/// From TEST-NET-2 (RFC 5737), never a real address; .111 as this conformance runs.
const NODE_ADDRESS: &str = "198.51.100.111";

fn ephemeral_status(pod: &Pod, name: &str) -> Option<ContainerStatus> {
    pod.status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == name)
        .cloned()
}

/// The debugger, targeting `app`, prints the command line of PID 1 of its PID namespace (the
/// target's first process when it shares the target's namespace, its own otherwise) and sleeps.
#[tokio::test]
async fn an_ephemeral_container_runs_once_in_its_targets_pid_namespace() {
    let client = admin().await;
    let node = "eph-debug";
    let address = HostAddress::add(NODE_ADDRESS);
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.address = address.ip.clone();
    agent.extra_args.extend([
        format!("--node-ip={}", address.ip),
        format!(
            "--client-ca-file={}",
            cluster_dir().join("pki").join("ca.crt").display()
        ),
    ]);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-eph-debug";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &bound_pod_with("target", node, sleeping_spec(1)),
    )
    .await
    .unwrap();
    wait_phase(&pods, "target", "Running", WAIT).await;

    let patch = serde_json::json!({"spec": {"ephemeralContainers": [{
        "name": "debugger",
        "image": common::BUSYBOX,
        "imagePullPolicy": "Never",
        "targetContainerName": "app",
        "command": ["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; echo polo; sleep 600"],
        "terminationMessagePolicy": "File",
    }]}});
    let patched = pods
        .patch_subresource(
            "ephemeralcontainers",
            "target",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .expect("the ephemeralcontainers subresource takes the debugger");
    let generation = patched.metadata.generation.expect("a generation");

    let pod = wait_until("debugger running", WAIT, || async {
        let p = pods.get("target").await.ok()?;
        let s = ephemeral_status(&p, "debugger")?;
        s.state.as_ref()?.running.as_ref()?;
        Some(p)
    })
    .await;
    let status = ephemeral_status(&pod, "debugger").unwrap();
    assert!(!status.ready, "{status:?}");
    assert_eq!(status.restart_count, 0);

    // The status was computed from the spec with the debugger, and says so.
    let observed = wait_until("observedGeneration", WAIT, || async {
        let p = pods.get("target").await.ok()?;
        let s = p.status?;
        (s.observed_generation == Some(generation)).then_some(s)
    })
    .await;
    for c in observed.conditions.iter().flatten() {
        assert_eq!(c.observed_generation, Some(generation), "{c:?}");
    }

    // Its log through the node: PID 1 is the target's shell, not the debugger's own.
    let log = wait_until("debugger log", WAIT, || async {
        let params = LogParams {
            container: Some("debugger".into()),
            ..Default::default()
        };
        let log = pods.logs("target", &params).await.ok()?;
        log.contains("polo").then_some(log)
    })
    .await;
    let first = log.lines().next().unwrap_or_default();
    assert!(
        first.contains("trap 'exit 0' TERM"),
        "PID 1 is not the target's process: {log:?}"
    );

    // The app container kept running throughout: a debugger does not restart the pod.
    let app = pods.get("target").await.unwrap().status.unwrap();
    let app = &app.container_statuses.unwrap()[0];
    assert_eq!(app.restart_count, 0, "{app:?}");
    assert!(app.state.as_ref().unwrap().running.is_some(), "{app:?}");
}

/// A sleeping pod whose container first writes its hostname to `/out/<file>`.
fn writing_hostname(out: &Path, file: &str) -> serde_json::Value {
    let mut spec = sleeping_spec(1);
    spec["volumes"] =
        serde_json::json!([{"name": "out", "hostPath": {"path": out, "type": "Directory"}}]);
    let c = &mut spec["containers"][0];
    c["command"] = serde_json::json!([
        "sh",
        "-c",
        format!(
            "hostname > /out/{file}.tmp && mv /out/{file}.tmp /out/{file}; \
             trap 'exit 0' TERM; sleep 600 & wait"
        )
    ]);
    c["volumeMounts"] = serde_json::json!([{"name": "out", "mountPath": "/out"}]);
    spec["subdomain"] = "t".into();
    spec["setHostnameAsFQDN"] = true.into();
    spec
}

#[tokio::test]
async fn set_hostname_as_fqdn_makes_the_fqdn_the_hostname_within_the_kernels_limit() {
    let client = admin().await;
    let node = "eph-fqdn";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let config = agent.dir.path().join("config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("clusterDomain: cluster.local\n");
    std::fs::write(&config, text).unwrap();
    let out = agent.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-eph-fqdn";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    pods.create(
        &PostParams::default(),
        &bound_pod_with("fqdn", node, writing_hostname(&out, "fqdn")),
    )
    .await
    .unwrap();
    // 54 characters of name and `.t.e2e-eph-fqdn.svc.cluster.local`: over 64.
    let long = "hostfqdnveryveryveryverylongforfqdntobemorethan64bytes";
    pods.create(
        &PostParams::default(),
        &bound_pod_with(long, node, writing_hostname(&out, "long")),
    )
    .await
    .unwrap();

    let host = wait_until("fqdn's hostname written", WAIT, || async {
        std::fs::read_to_string(out.join("fqdn"))
            .ok()
            .filter(|t| t.ends_with('\n'))
    })
    .await;
    assert_eq!(host.trim(), "fqdn.t.e2e-eph-fqdn.svc.cluster.local");

    let message = wait_until("FailedCreatePodSandBox", WAIT, || async {
        event_reasons(&client, ns, long)
            .await
            .into_iter()
            .find(|(reason, _)| reason == "FailedCreatePodSandBox")
            .map(|(_, message)| message)
    })
    .await;
    let fqdn = format!("{long}.t.{ns}.svc.cluster.local");
    assert_eq!(
        message,
        format!(
            "Failed to create pod sandbox: failed to construct FQDN from pod hostname and \
             cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters \
             requested)",
            fqdn.len()
        )
    );
    let pending = pods.get(long).await.unwrap().status.unwrap();
    assert_eq!(pending.phase.as_deref(), Some("Pending"), "{pending:?}");
    assert!(!out.join("long").exists(), "the long pod never ran");
}
