//! End to end, against the real test control plane and the private containerd: pods read
//! configMaps and secrets (volumes, env, envFrom) and the service-account token the API
//! server's `kube-api-access-*` volume projects, with no `automountServiceAccountToken:
//! false`. A changed configMap reaches the file in the running pod (the time it takes is
//! measured and printed); a missing optional object is fine; a missing required one keeps
//! the pod waiting with upstream's FailedMount event, tried with back-off, until the object is
//! created, and then the pod starts at once.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{
    admin, bound_pod, cluster_dir, create_namespace, joined_agent, wait_node_ready,
};
use common::wait_until;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(45);
const NS: &str = "e2e-api-volumes";
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A pod bound to `node` that runs `script` and then sleeps; the service-account token is
/// mounted as the API server decides (no `automountServiceAccountToken: false`).
fn pod(name: &str, node: &str, script: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let mut value = serde_json::to_value(bound_pod(name, node)).unwrap();
    let spec = &mut value["spec"];
    spec.as_object_mut()
        .unwrap()
        .remove("automountServiceAccountToken");
    spec["terminationGracePeriodSeconds"] = 1.into();
    spec["containers"][0]["command"] = serde_json::json!([
        "sh",
        "-c",
        format!("{script}; trap 'exit 0' TERM; sleep 600 & wait")
    ]);
    edit(spec);
    serde_json::from_value(value).unwrap()
}

async fn phase_of(pods: &Api<Pod>, name: &str) -> Option<(String, Pod)> {
    let p = pods.get(name).await.ok()?;
    Some((p.status.as_ref()?.phase.clone()?, p))
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Pod {
    wait_until(&format!("{name} Running"), WAIT, || async {
        phase_of(pods, name)
            .await
            .and_then(|(phase, p)| (phase == "Running").then_some(p))
    })
    .await
}

/// Where a volume of the pod lives on the node.
fn volume_dir(root: &Path, pod: &Pod, plugin: &str, volume: &str) -> PathBuf {
    root.join("pods")
        .join(pod.metadata.uid.as_deref().unwrap())
        .join("volumes")
        .join(plugin)
        .join(volume)
}

fn config_map(name: &str, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": data})).unwrap()
}

#[tokio::test]
async fn pods_read_config_maps_secrets_and_their_service_account_token() {
    let started = Instant::now();
    let client = admin().await;
    let node = "av-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();

    config_maps
        .create(
            &pp,
            &config_map(
                "app-config",
                serde_json::json!({"greeting": "hello", "level": "3"}),
            ),
        )
        .await
        .expect("create the configMap");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db-creds"},
        "stringData": {"password": "hunter2"},
    }))
    .unwrap();
    secrets
        .create(&pp, &secret)
        .await
        .expect("create the secret");

    let reader = pod(
        "reader",
        node,
        &format!(
            "echo \"env GREETING=$GREETING PASSWORD=$PASSWORD CFG_level=$CFG_level\"; \
             grep -E ' /etc/creds | {SA_DIR} ' /proc/mounts; \
             echo \"maybe has $(ls /etc/maybe | wc -l) files\""
        ),
        |s| {
            s["volumes"] = serde_json::json!([
                {"name": "cfg", "configMap": {"name": "app-config"}},
                {"name": "creds", "secret": {"secretName": "db-creds", "defaultMode": 0o400}},
                {"name": "maybe", "configMap": {"name": "absent", "optional": true}}
            ]);
            let c = &mut s["containers"][0];
            c["volumeMounts"] = serde_json::json!([
                {"name": "cfg", "mountPath": "/etc/cfg"},
                {"name": "creds", "mountPath": "/etc/creds"},
                {"name": "maybe", "mountPath": "/etc/maybe"}
            ]);
            c["env"] = serde_json::json!([
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "greeting"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "password"}}}
            ]);
            c["envFrom"] =
                serde_json::json!([{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"}]);
        },
    );
    // Waits for a configMap created later; and a key that is not there.
    let waiter = pod("waiter", node, "cat /etc/late/k; echo", |s| {
        s["volumes"] = serde_json::json!([{"name": "late", "configMap": {"name": "later"}}]);
        s["containers"][0]["volumeMounts"] =
            serde_json::json!([{"name": "late", "mountPath": "/etc/late"}]);
    });
    let bad_env = pod("bad-env", node, "true", |s| {
        s["containers"][0]["env"] = serde_json::json!([
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "nope"}}}
        ]);
    });
    for p in [&reader, &waiter, &bad_env] {
        pods.create(&pp, p).await.expect("create a pod");
    }

    // The reader runs, with its environment and mounts as asked.
    let reader = wait_running(&pods, "reader").await;
    let out = wait_until("the reader's output", WAIT, || async {
        let log = common::cluster::first_run_log(&agent.logs_dir(), NS, "reader", "app");
        log.contains("files").then_some(log)
    })
    .await;
    assert!(
        out.contains("env GREETING=hello PASSWORD=hunter2 CFG_level=3"),
        "{out}"
    );
    assert!(
        out.contains("tmpfs /etc/creds tmpfs ro"),
        "the secret is on a tmpfs: {out}"
    );
    assert!(
        out.contains(&format!("tmpfs {SA_DIR} tmpfs ro")),
        "the token volume is on a tmpfs: {out}"
    );
    assert!(out.contains("maybe has 0 files"), "{out}");

    // The service-account token: the API server accepts it as the pod's account.
    let access = reader
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("the API server injected kube-api-access")
        .name
        .clone();
    let root = agent.root_dir();
    let access_dir = volume_dir(&root, &reader, "kubernetes.io~projected", &access);
    let token = std::fs::read_to_string(access_dir.join("token")).expect("the token file");
    let review: TokenReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }))
    .unwrap();
    let review = Api::<TokenReview>::all(client.clone())
        .create(&pp, &review)
        .await
        .expect("a TokenReview");
    let status = review.status.expect("a review status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("a user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:e2e-api-volumes:default")
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["reader".to_string()]),
        "the token is bound to the pod"
    );
    let ca = std::fs::read_to_string(cluster_dir().join("pki/ca.crt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(access_dir.join("ca.crt")).unwrap(),
        ca
    );
    assert_eq!(
        std::fs::read_to_string(access_dir.join("namespace")).unwrap(),
        NS
    );
    let creds = volume_dir(&root, &reader, "kubernetes.io~secret", "creds");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(creds.join("password"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o400);

    // A changed configMap reaches the running pod's file.
    let greeting = volume_dir(&root, &reader, "kubernetes.io~configmap", "cfg").join("greeting");
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "hello");
    let mut rounds = Vec::new();
    for round in 1..=5 {
        let want = format!("hello-{round}");
        let patch = serde_json::json!({"data": {"greeting": want}});
        let sent = Instant::now();
        config_maps
            .patch("app-config", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("update the configMap");
        // Polled every 5 ms (wait_until's 100 ms would round the measurement up).
        loop {
            if std::fs::read_to_string(&greeting).ok().as_deref() == Some(want.as_str()) {
                break;
            }
            assert!(
                sent.elapsed() < WAIT,
                "the file did not follow the configMap (round {round})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        rounds.push(sent.elapsed());
    }
    rounds.sort();
    println!(
        "configMap update -> file changed: median {:?}, rounds {rounds:?}",
        rounds[rounds.len() / 2]
    );

    // A missing key keeps its container waiting with upstream's message.
    let (reason, message) = wait_until("bad-env waits", WAIT, || async {
        common::cluster::first_waiting(&pods, "bad-env")
            .await
            .filter(|(r, _)| r == "CreateContainerConfigError")
    })
    .await;
    assert_eq!(reason, "CreateContainerConfigError");
    assert_eq!(
        message,
        "couldn't find key nope in ConfigMap e2e-api-volumes/app-config"
    );

    // A missing configMap keeps the pod waiting, with upstream's FailedMount event…
    let (_, message) = wait_until("waiter waits in ContainerCreating", WAIT, || async {
        common::cluster::first_waiting(&pods, "waiter")
            .await
            .filter(|(r, _)| r == "ContainerCreating")
    })
    .await;
    let want = "MountVolume.SetUp failed for volume \"late\" : configmap \"later\" not found";
    assert_eq!(message, want);
    wait_until("the FailedMount event", WAIT, || async {
        common::cluster::event_reasons(&client, NS, "waiter")
            .await
            .into_iter()
            .find(|(r, m)| r == "FailedMount" && m == want)
    })
    .await;
    // …tried again with upstream's back-off (issue 27, item 5), not 35–40 times a second:
    // the tries at 0, 0.5, 1.5, 3.5 and 7.5 s; the next would come 8 s later…
    let failed_mount_seen = Instant::now();
    let tries = || {
        agent
            .log()
            .lines()
            .filter(|l| l.contains("FailedMount") && l.contains("/waiter"))
            .count()
    };
    wait_until("five FailedMount tries of the waiter", WAIT, || async {
        (tries() >= 5).then_some(())
    })
    .await;
    let backing_off = failed_mount_seen.elapsed();
    assert!(
        backing_off >= Duration::from_secs(5),
        "{} tries within {backing_off:?}: the volume is not backed off",
        tries()
    );
    // …while the other pods run on, and starts as soon as the configMap exists (its watch
    // pokes the pod), not when the back-off ends.
    assert_eq!(phase_of(&pods, "reader").await.unwrap().0, "Running");
    let waiter_now = pods.get("waiter").await.expect("the waiter");
    let created = Instant::now();
    config_maps
        .create(
            &pp,
            &config_map("later", serde_json::json!({"k": "at last"})),
        )
        .await
        .expect("create the missing configMap");
    // The volume is set up (its file written: the start goes on from there) within about a
    // second, however long the back-off had grown.
    let file = volume_dir(&root, &waiter_now, "kubernetes.io~configmap", "late").join("k");
    loop {
        if file.exists() {
            break;
        }
        assert!(
            created.elapsed() < Duration::from_secs(2),
            "the waiter's volume was not set up within 2 s of its configMap being created"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let set_up = created.elapsed();
    wait_running(&pods, "waiter").await;
    let waited = created.elapsed();
    println!("missing configMap created -> volume set up: {set_up:?}");
    wait_until("the waiter read its file", WAIT, || async {
        common::cluster::first_run_log(&agent.logs_dir(), NS, "waiter", "app")
            .contains("at last")
            .then_some(())
    })
    .await;
    println!("missing configMap created -> pod Running: {waited:?}");

    for name in ["reader", "waiter", "bad-env"] {
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    println!("test body: {:?}", started.elapsed());
}
