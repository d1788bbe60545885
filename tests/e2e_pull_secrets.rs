//! End to end, against the real test control plane, the private containerd and a real
//! registry: Debian's `docker-registry` with htpasswd (basic) auth on a free loopback port,
//! plain HTTP (`scripts/registry`), holding the testbed's busybox under a name only it has.
//! A pod whose `imagePullSecrets` hold the right password pulls it (`imagePullPolicy:
//! Always`) and runs, also when a more specific wrong credential is tried first; a wrong
//! password, no secret at all, a secret that does not exist (named in a
//! `FailedToRetrieveImagePullSecret` event) and a secret that does not parse each leave the
//! container in `ErrImagePull` with the reason in the status and a `Failed` event, and never
//! stop the others.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{admin, bound_pod, create_namespace, joined_agent, wait_node_ready};
use common::wait_until;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};

const WAIT: Duration = Duration::from_secs(40);
const NS: &str = "e2e-pull-secrets";
const USER: &str = "deckhand";
const PASSWORD: &str = "pull-secret-e2e";

fn repo_script(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A registry of this test's own (own dir, free port), and its entry in the testbed's
/// containerd registry hosts; both removed when dropped, even when the test failed.
struct Registry {
    dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`
    host: String,
    hosts_entry: PathBuf,
}

impl Registry {
    fn up() -> Registry {
        let testbed = match std::env::var("DECKHAND_TESTBED_DIR") {
            Ok(v) if !v.is_empty() => PathBuf::from(v),
            _ => panic!(
                "this test writes the registry's hosts.toml into the testbed: export \
                 DECKHAND_TESTBED_DIR=DIR (the DIR of `scripts/testbed up DIR`)"
            ),
        };
        let dir = tempfile::Builder::new()
            .prefix("deckhand-registry-")
            .tempdir()
            .expect("a temp dir");
        let reg_dir = dir.path().join("registry");
        let script = repo_script("scripts/registry");
        let env = run(
            "scripts/registry up",
            Command::new(&script).args([
                "up",
                &reg_dir.to_string_lossy(),
                "--user",
                USER,
                "--password",
                PASSWORD,
            ]),
        );
        let host = env
            .lines()
            .find_map(|l| l.strip_prefix("REGISTRY="))
            .expect("REGISTRY= in the output")
            .to_string();
        let registry = Registry {
            hosts_entry: testbed.join("certs.d").join(&host),
            dir,
            host,
        };
        run(
            "scripts/registry hosts",
            Command::new(&script).args([
                "hosts",
                &reg_dir.to_string_lossy(),
                &testbed.join("certs.d").to_string_lossy(),
            ]),
        );
        registry
    }

    /// Pushes the testbed's busybox as `NAME:TAG`; returns the image reference.
    fn push_busybox(&self, name: &str) -> String {
        let built = run(
            "scripts/images/build-images",
            &mut Command::new(repo_script("scripts/images/build-images")),
        );
        let tar = built
            .lines()
            .find_map(|l| {
                let mut cols = l.split('\t');
                (cols.next() == Some(common::BUSYBOX)).then(|| cols.next().map(str::to_string))
            })
            .flatten()
            .expect("the busybox tar");
        run(
            "scripts/registry push",
            Command::new(repo_script("scripts/registry")).args([
                "push",
                &self.dir.path().join("registry").to_string_lossy(),
                &tar,
                name,
            ]),
        );
        format!("{}/{name}", self.host)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(repo_script("scripts/registry"))
            .args(["down", &self.dir.path().join("registry").to_string_lossy()])
            .output();
        let _ = std::fs::remove_dir_all(&self.hosts_entry);
    }
}

/// Removes the pulled image's name from containerd when dropped. Only the name: CRI's
/// RemoveImage would remove every name of the image, and it is the testbed's busybox too.
struct ImageCleanup(String);

impl Drop for ImageCleanup {
    fn drop(&mut self) {
        let endpoint = common::runtime_endpoint();
        let socket = endpoint.strip_prefix("unix://").unwrap_or(&endpoint);
        let _ = Command::new("ctr")
            .args(["--address", socket, "-n", "k8s.io", "images", "rm", &self.0])
            .output();
    }
}

fn docker_config(host: &str, entries: &[(&str, &str, &str)]) -> String {
    let auths: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(key, user, password)| {
            let key = key.replace("HOST", host);
            (
                key,
                serde_json::json!({"username": user, "password": password}),
            )
        })
        .collect();
    serde_json::json!({ "auths": auths }).to_string()
}

fn pull_secret(name: &str, body: &str) -> Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": body},
    }))
    .unwrap()
}

fn private_pod(name: &str, node: &str, image: &str, secrets: &[&str]) -> Pod {
    let mut value = serde_json::to_value(bound_pod(name, node)).unwrap();
    let spec = &mut value["spec"];
    spec["terminationGracePeriodSeconds"] = 1.into();
    spec["containers"][0]["image"] = image.into();
    spec["containers"][0]["imagePullPolicy"] = "Always".into();
    if !secrets.is_empty() {
        spec["imagePullSecrets"] = secrets
            .iter()
            .map(|s| serde_json::json!({ "name": s }))
            .collect();
    }
    serde_json::from_value(value).unwrap()
}

/// Waits for `ErrImagePull` whose message satisfies `check`, and for the `Failed` event that
/// says the same; returns the status message.
async fn wait_pull_error(
    client: &kube::Client,
    pods: &Api<Pod>,
    name: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let (_, message) = wait_until(&format!("{name} in ErrImagePull"), WAIT, || async {
        common::cluster::first_waiting(pods, name)
            .await
            .filter(|(r, m)| r == "ErrImagePull" && check(m))
    })
    .await;
    wait_until(&format!("the Failed event of {name}"), WAIT, || async {
        common::cluster::event_reasons(client, NS, name)
            .await
            .into_iter()
            .find(|(r, m)| r == "Failed" && m.starts_with("Failed to pull image") && check(m))
    })
    .await;
    message
}

/// The registry's refusal in the runtime's words: containerd 1.6 (and 2.x with a wrong
/// password) quotes the 401; containerd 2.x without any credentials says it had none to offer.
fn unauthorized(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    (m.contains("401") && m.contains("unauthorized"))
        || m.contains("authorization failed: no basic auth credentials")
}

#[tokio::test]
async fn pods_pull_from_a_private_registry_with_their_pull_secrets() {
    let started = Instant::now();
    let registry = Registry::up();
    let tag = format!(
        "t{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let image = registry.push_busybox(&format!("e2e-pull/busybox:{tag}"));
    let _image_cleanup = ImageCleanup(image.clone());
    println!("registry up, image pushed: {:?}", started.elapsed());

    let client = admin().await;
    let node = "ps-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();
    let host = registry.host.as_str();

    for secret in [
        pull_secret("regcred", &docker_config(host, &[("HOST", USER, PASSWORD)])),
        // A more specific key (the repository's path): tried first, and refused.
        pull_secret(
            "wrongcred",
            &docker_config(host, &[("http://HOST/e2e-pull", USER, "not-the-password")]),
        ),
        // Valid JSON (the API server checks that much), but no docker config.
        pull_secret(
            "brokencred",
            &format!(r#"{{"auths": {{"{host}": {{"auth": "%%% not base64"}}}}}}"#),
        ),
    ] {
        secrets.create(&pp, &secret).await.expect("create a secret");
    }
    for p in [
        private_pod("right", node, &image, &["wrongcred", "regcred"]),
        private_pod("wrong", node, &image, &["wrongcred"]),
        private_pod("none", node, &image, &[]),
        private_pod("missing", node, &image, &["absent"]),
        private_pod("broken", node, &image, &["regcred", "brokencred"]),
    ] {
        pods.create(&pp, &p).await.expect("create a pod");
    }

    // The right password pulls the image only the registry has, and the pod runs.
    wait_until("right Running", WAIT, || async {
        let p = pods.get("right").await.ok()?;
        (p.status?.phase? == "Running").then_some(())
    })
    .await;
    let events = common::cluster::event_reasons(&client, NS, "right").await;
    assert!(
        events.iter().any(|(r, m)| r == "Pulled"
            && m.starts_with(&format!("Successfully pulled image {image:?}"))),
        "{events:?}"
    );
    println!("right pod Running: {:?}", started.elapsed());

    // A wrong password, and no secret at all: the registry's 401 in the status and event.
    for name in ["wrong", "none"] {
        let message = wait_pull_error(&client, &pods, name, unauthorized).await;
        assert!(
            message.starts_with(&format!("failed to pull image {image:?}: ")),
            "{message}"
        );
        println!("{name} ({:?}): {message}", started.elapsed());
    }
    // A pull secret that does not exist: pulled without, and named in an event after the 401.
    wait_pull_error(&client, &pods, "missing", unauthorized).await;
    wait_until("the FailedToRetrieveImagePullSecret event", WAIT, || async {
        common::cluster::event_reasons(&client, NS, "missing").await.into_iter().find(|(r, m)| {
            r == "FailedToRetrieveImagePullSecret"
                && m == "Unable to retrieve some image pull secrets (absent); attempting to pull the image may not succeed."
        })
    })
    .await;
    // A secret that does not parse: a message that names it.
    let message = wait_pull_error(&client, &pods, "broken", |m| {
        m.contains(&format!(
            "couldn't parse image pull secret \"{NS}/brokencred\" (.dockerconfigjson)"
        ))
    })
    .await;
    println!("broken ({:?}): {message}", started.elapsed());
    assert!(!message.contains(PASSWORD));

    // While the pull backs off, the status still gives the reason, as upstream.
    wait_until("wrong backs off with the reason", WAIT, || async {
        common::cluster::first_waiting(&pods, "wrong")
            .await
            .filter(|(r, m)| {
                r == "ImagePullBackOff"
                    && m.starts_with(&format!("Back-off pulling image {image:?}: ErrImagePull: "))
                    && unauthorized(m)
            })
    })
    .await;
    // No credential reaches the agent's log.
    let log = agent.log();
    assert!(
        !log.contains(PASSWORD) && !log.contains("not-the-password"),
        "a password in the log"
    );
    let phase = pods.get("right").await.ok().and_then(|p| p.status?.phase);
    assert_eq!(phase.as_deref(), Some("Running"), "the right pod runs on");

    for name in ["right", "wrong", "none", "missing", "broken"] {
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    println!("test body: {:?}", started.elapsed());
}
