//! End to end, against the private containerd: static pods from a directory and from an HTTP
//! URL become running pods, follow edits and deletions, restart per policy, survive bad
//! neighbours, and orphans left while the agent was down are removed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Agent, containers_of, cri, http_get, sandboxes_of, wait_until};
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(60);

fn httpd_pod(name: &str, greeting: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: httpd
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www && echo {greeting} > /www/index.html && trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait"]
    ports:
    - containerPort: 8080
"#
    )
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits until `/pods` shows the pod Running with an IP and a running container.
async fn wait_running(agent: &Agent, name: &str) -> Value {
    wait_until(&format!("pod {name} Running in /pods"), WAIT, || async {
        let pod = agent.pod(name).await?;
        let running = phase(&pod) == "Running"
            && pod["status"]["podIP"].is_string()
            && pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
        running.then_some(pod)
    })
    .await
}

#[tokio::test]
async fn dropped_manifest_runs_and_is_reachable_on_its_ip() {
    let mut agent = Agent::new("e2e-sp-drop");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("web.yaml", &httpd_pod("web", "hello-drop"));

    let pod = wait_running(&agent, "web").await;
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    let pod_uid = uid(&pod);
    assert_eq!(
        pod_uid.len(),
        32,
        "static pod UIDs are 32 hex digits: {pod_uid}"
    );
    assert_eq!(pod["metadata"]["namespace"], "default");
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.hash"],
        pod_uid.as_str()
    );
    assert!(pod["status"]["hostIP"].is_string());
    assert!(pod["status"]["startTime"].is_string());
    let cs = &pod["status"]["containerStatuses"][0];
    assert_eq!(cs["restartCount"], 0);
    assert!(
        cs["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert!(!cs["imageID"].as_str().unwrap_or_default().is_empty());

    // Over CRI: one ready sandbox and a running container with upstream's labels.
    let client = cri().await;
    let full = agent.pod_name("web");
    let sandboxes = sandboxes_of(&client, &full).await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0].state, 0, "sandbox ready");
    assert_eq!(sandboxes[0].labels["io.kubernetes.pod.uid"], pod_uid);
    assert_eq!(
        sandboxes[0].labels["io.kubernetes.pod.namespace"],
        "default"
    );
    let containers = containers_of(&client, &full).await;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].state, 1, "container running");
    assert_eq!(
        containers[0].labels["io.kubernetes.container.name"],
        "httpd"
    );

    // Reachable from the host on its IP.
    let body = wait_until("the pod to answer HTTP on its IP", WAIT, || {
        let url = format!("http://{ip}:8080/");
        async move {
            http_get(&url)
                .await
                .filter(|(c, _)| *c == 200)
                .map(|(_, b)| b)
        }
    })
    .await;
    assert_eq!(body.trim(), "hello-drop");

    // Logs in upstream's layout.
    let log = agent
        .logs_dir()
        .join(format!("default_{full}_{pod_uid}"))
        .join("httpd")
        .join("0.log");
    assert!(log.exists(), "container log at {}", log.display());
}

#[tokio::test]
async fn edited_manifest_replaces_the_pod_and_deleted_manifest_removes_everything() {
    let mut agent = Agent::new("e2e-sp-edit");
    agent.start();
    agent.wait_healthy(WAIT).await;
    let original = httpd_pod("edit", "v1");
    agent.write_manifest("edit.yaml", &original);
    let first = wait_running(&agent, "edit").await;
    let uid1 = uid(&first);

    // Edit: the content changes, so the UID changes (upstream's rule) and the pod is replaced.
    agent.write_manifest("edit.yaml", &httpd_pod("edit", "v2"));
    let second = wait_until("the edited pod to run under a new UID", WAIT, || async {
        let pod = agent.pod("edit").await?;
        (uid(&pod) != uid1
            && phase(&pod) == "Running"
            && pod["status"]["containerStatuses"][0]["state"]["running"].is_object())
        .then_some(pod)
    })
    .await;
    let uid2 = uid(&second);
    let client = cri().await;
    let full = agent.pod_name("edit");
    wait_until("only the new pod's sandbox to remain", WAIT, || async {
        let sbs = sandboxes_of(&client, &full).await;
        (sbs.len() == 1 && sbs[0].labels["io.kubernetes.pod.uid"] == uid2).then_some(())
    })
    .await;
    assert!(
        !agent
            .logs_dir()
            .join(format!("default_{full}_{uid1}"))
            .exists(),
        "the old pod's log directory is removed"
    );

    // The same content gives the same UID again: UIDs are derived, not random.
    agent.write_manifest("edit.yaml", &original);
    wait_until(
        "the original content to come back with its original UID",
        WAIT,
        || async {
            let pod = agent.pod("edit").await?;
            (uid(&pod) == uid1 && phase(&pod) == "Running").then_some(())
        },
    )
    .await;

    // Delete: sandbox, containers, log directory and pod directory go.
    agent.remove_manifest("edit.yaml");
    wait_until(
        "the deleted pod to be gone from the runtime",
        WAIT,
        || async {
            let gone = sandboxes_of(&client, &full).await.is_empty()
                && containers_of(&client, &full).await.is_empty();
            gone.then_some(())
        },
    )
    .await;
    wait_until(
        "the deleted pod's directories to be removed",
        WAIT,
        || async {
            let log_dir = agent.logs_dir().join(format!("default_{full}_{uid1}"));
            let pod_dir = agent.root_dir().join("pods").join(&uid1);
            (!log_dir.exists() && !pod_dir.exists()).then_some(())
        },
    )
    .await;
    assert!(agent.pod("edit").await.is_none(), "the pod left /pods");
}

#[tokio::test]
async fn restart_policy_always_restarts_and_never_keeps_the_container_exited() {
    let mut agent = Agent::new("e2e-sp-restart");
    agent.backoff("200ms", "1s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "crash.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  restartPolicy: Always
  containers:
  - name: crash
    image: {BUSYBOX}
    command: ["sh", "-c", "echo crashing; exit 3"]
"#
        ),
    );
    agent.write_manifest(
        "never.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: never}}
spec:
  restartPolicy: Never
  containers:
  - name: once
    image: {BUSYBOX}
    command: ["sh", "-c", "exit 0"]
"#
        ),
    );

    let crash = wait_until(
        "the crashing container to be restarted at least twice",
        WAIT,
        || async {
            let pod = agent.pod("crash").await?;
            (pod["status"]["containerStatuses"][0]["restartCount"].as_i64()? >= 2).then_some(pod)
        },
    )
    .await;
    let cs = &crash["status"]["containerStatuses"][0];
    assert_eq!(
        phase(&crash),
        "Running",
        "restartPolicy Always keeps the pod Running"
    );
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
    assert_eq!(cs["lastState"]["terminated"]["reason"], "Error");

    let never = wait_until("the Never pod to succeed", WAIT, || async {
        let pod = agent.pod("never").await?;
        (phase(&pod) == "Succeeded").then_some(pod)
    })
    .await;
    let cs = &never["status"]["containerStatuses"][0];
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
    // It stays exited: still one instance after the crash pod restarted twice more.
    let client = cri().await;
    let before =
        agent.pod("crash").await.unwrap()["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap();
    wait_until("two more restarts of the crashing pod", WAIT, || async {
        let n =
            agent.pod("crash").await?["status"]["containerStatuses"][0]["restartCount"].as_i64()?;
        (n >= before + 2).then_some(())
    })
    .await;
    let instances = containers_of(&client, &agent.pod_name("never")).await;
    assert_eq!(
        instances.len(),
        1,
        "the Never container was not restarted: {instances:?}"
    );
    assert_eq!(instances[0].state, 2, "exited");
}

/// A tiny HTTP server on loopback that serves whatever body the test sets (or a status code).
struct ManifestServer {
    port: u16,
    body: Arc<Mutex<(u16, String)>>,
}

impl ManifestServer {
    async fn start() -> ManifestServer {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = Arc::new(Mutex::new((200u16, String::new())));
        let shared = body.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let (code, text) = shared.lock().unwrap().clone();
                    let resp = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = stream.write_all(resp.as_bytes()).await;
                });
            }
        });
        ManifestServer { port, body }
    }

    fn serve(&self, code: u16, text: &str) {
        *self.body.lock().unwrap() = (code, text.to_string());
    }
}

fn pod_list(pods: &[String]) -> String {
    let items: Vec<Value> = pods
        .iter()
        .map(|p| deckhand::base::yaml::from_str::<Value>(p).expect("test manifest parses"))
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": items}).to_string()
}

#[tokio::test]
async fn http_source_adds_changes_and_removes_pods() {
    let server = ManifestServer::start().await;
    server.serve(200, &pod_list(&[httpd_pod("fromurl", "one")]));
    let mut agent = Agent::new("e2e-sp-http");
    agent.extra_args.push(format!(
        "--manifest-url=http://127.0.0.1:{}/pods",
        server.port
    ));
    agent.extra_args.push("--http-check-frequency=1s".into());
    agent.start();
    agent.wait_healthy(WAIT).await;

    let first = wait_running(&agent, "fromurl").await;
    assert_eq!(
        first["metadata"]["annotations"]["kubernetes.io/config.source"],
        "http"
    );
    let uid1 = uid(&first);

    // A server error keeps the last good set.
    server.serve(500, "boom");
    wait_until("the agent to log the failed fetch", WAIT, || async {
        agent.log().contains("500").then_some(())
    })
    .await;
    let still = agent
        .pod("fromurl")
        .await
        .expect("the pod is kept while the URL fails");
    assert_eq!(uid(&still), uid1);

    // A change replaces the pod.
    server.serve(200, &pod_list(&[httpd_pod("fromurl", "two")]));
    wait_until("the changed pod from the URL to run", WAIT, || async {
        let pod = agent.pod("fromurl").await?;
        (uid(&pod) != uid1 && phase(&pod) == "Running").then_some(())
    })
    .await;

    // An empty list removes it.
    server.serve(200, &pod_list(&[]));
    let client = cri().await;
    let full = agent.pod_name("fromurl");
    wait_until("the pod removed from the URL to be gone", WAIT, || async {
        (agent.pod("fromurl").await.is_none() && sandboxes_of(&client, &full).await.is_empty())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_manifests_are_reported_and_do_not_disturb_the_good_pod() {
    let mut agent = Agent::new("e2e-sp-bad");
    let good = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: good}}
spec:
  hostNetwrk: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
"#
    );
    let container = format!("  - name: c\n    image: {BUSYBOX}\n");
    let bad: Vec<(&str, String)> = vec![
        ("bad-yaml.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [oops\n".into()),
        ("not-a-pod.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: svc}\n".into()),
        ("no-containers.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n".into()),
        ("dup-names.yaml", format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: dup}}\nspec:\n  containers:\n{container}{container}")),
        ("bad-name.yaml", format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: Bad_Name}}\nspec:\n  containers:\n{container}")),
        ("no-image.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: noimage}\nspec:\n  containers:\n  - name: c\n".into()),
        ("bad-policy.yaml", format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: policy}}\nspec:\n  restartPolicy: Sometimes\n  containers:\n{container}")),
        ("bad-port.yaml", format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: port}}\nspec:\n  containers:\n{container}    ports: [{{containerPort: 70000}}]\n")),
        ("zz-same-pod.yaml", good.replace("sleep 3600", "sleep 3601")),
        ("garbage.json", "{not json".into()),
    ];
    agent.write_manifest("good.yaml", &good);
    for (file, text) in &bad {
        agent.write_manifest(file, text);
    }
    agent.start();
    agent.wait_healthy(WAIT).await;
    let pod = wait_until(
        "the good pod to run beside ten bad manifests",
        WAIT,
        || async {
            let pod = agent.pod("good").await?;
            (phase(&pod) == "Running").then_some(pod)
        },
    )
    .await;
    assert_eq!(
        agent.pods().await.unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "only the good pod runs"
    );
    assert!(
        pod["spec"]["hostNetwork"].is_null(),
        "the misspelt field is not applied"
    );
    wait_until(
        "every bad manifest to be reported by file name",
        WAIT,
        || async {
            let log = agent.log();
            bad.iter().all(|(file, _)| log.contains(file)).then_some(())
        },
    )
    .await;
    let log = agent.log();
    assert!(
        log.contains("hostNetwrk"),
        "the unknown field is warned about"
    );
    // Reported once per change, not on every rescan.
    let mentions = log.matches("bad-port.yaml").count();
    assert!(mentions <= 2, "bad-port.yaml reported {mentions} times");
}

#[tokio::test]
async fn orphans_left_while_the_agent_was_down_are_removed_at_start() {
    let mut agent = Agent::new("e2e-sp-orphan");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("keep.yaml", &httpd_pod("keep", "k"));
    agent.write_manifest("orphan.yaml", &httpd_pod("orphan", "o"));
    wait_running(&agent, "keep").await;
    let orphan = wait_running(&agent, "orphan").await;
    let orphan_uid = uid(&orphan);
    let keep_uid = uid(&agent.pod("keep").await.unwrap());

    let status = agent.stop().unwrap();
    assert!(status.success());
    agent.remove_manifest("orphan.yaml");

    agent.start();
    agent.wait_healthy(WAIT).await;
    let client = cri().await;
    let full = agent.pod_name("orphan");
    wait_until("the orphan to be stopped and removed", WAIT, || async {
        sandboxes_of(&client, &full).await.is_empty().then_some(())
    })
    .await;
    wait_until("the orphan's log directory to be removed", WAIT, || async {
        (!agent
            .logs_dir()
            .join(format!("default_{full}_{orphan_uid}"))
            .exists())
        .then_some(())
    })
    .await;
    // The pod that is still wanted was adopted, not restarted.
    let keep = wait_running(&agent, "keep").await;
    assert_eq!(uid(&keep), keep_uid);
    assert_eq!(keep["status"]["containerStatuses"][0]["restartCount"], 0);
    let sbs = sandboxes_of(&client, &agent.pod_name("keep")).await;
    assert_eq!(sbs.len(), 1, "no second sandbox for the adopted pod");
}
