//! End to end, against the real test control plane (`scripts/cluster`) and the private
//! containerd: Deckhand registers its Node with node credentials only, reports what the
//! machine is, renews its Lease, comes back as the same Node after a restart, and says clearly
//! when its credentials are refused or its kubeconfig is unusable.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    NodeCleanup, admin, condition, get_lease, get_node, joined_agent, node_kubeconfig,
    wait_node_ready,
};
use common::{Agent, cri, http_get, running_containers, sleeping_pod, wait_until};
use deckhand::base::podspec::quantity;
use deckhand::clients::cri::RuntimeService;

const WAIT: Duration = Duration::from_secs(30);

fn quantity_value(node: &k8s_openapi::api::core::v1::Node, list: &str, name: &str) -> i64 {
    let status = node.status.as_ref().unwrap();
    let map = if list == "capacity" {
        status.capacity.as_ref()
    } else {
        status.allocatable.as_ref()
    };
    let q = &map.unwrap_or_else(|| panic!("no {list}"))[name];
    quantity::parse(&q.0).unwrap().value()
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[tokio::test]
async fn the_node_registers_turns_ready_and_reports_the_machine() {
    let client = admin().await;
    let (mut agent, _cleanup) = joined_agent("dn-register");
    let port = agent.port;
    agent.extra_args.extend([
        "--max-pods=17".to_string(),
        "--node-labels=deckhand.test/suite=e2e,node.kubernetes.io/pool=blue".to_string(),
    ]);
    let started = Instant::now();
    agent.start();
    let node = wait_node_ready(&client, "dn-register", &agent).await;
    eprintln!("start → Node Ready: {:?}", started.elapsed());

    // Labels: the ones a node agent sets, and --node-labels.
    let labels = node.metadata.labels.clone().unwrap();
    for (k, v) in [
        ("kubernetes.io/hostname", "dn-register"),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
        ("deckhand.test/suite", "e2e"),
        ("node.kubernetes.io/pool", "blue"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }

    // Addresses: an address this machine has, and the node name.
    let status = node.status.clone().unwrap();
    let addresses = status.addresses.clone().unwrap();
    let internal = addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .expect("an InternalIP");
    let ip_out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ip_out.stdout).contains(&format!("inet {}/", internal.address)),
        "InternalIP {} is one of this machine's addresses",
        internal.address
    );
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "Hostname" && a.address == "dn-register")
    );

    // Capacity and allocatable, against /proc and the filesystem.
    let online = Command::new("nproc").arg("--all").output().unwrap();
    let cpus: i64 = String::from_utf8_lossy(&online.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(quantity_value(&node, "capacity", "cpu"), cpus);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let mem_kib: i64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(quantity_value(&node, "capacity", "memory"), mem_kib * 1024);
    assert_eq!(quantity_value(&node, "capacity", "pods"), 17);
    let fs = nix::sys::statvfs::statvfs(&agent.root_dir()).unwrap();
    let disk = (fs.blocks() * fs.fragment_size()) as i64;
    assert_eq!(quantity_value(&node, "capacity", "ephemeral-storage"), disk);
    // The hard eviction thresholds are reserved: the harness's 100Mi of memory and 1% of the
    // disk (`common::TEST_EVICTION_HARD`; upstream's 10% would be under pressure here).
    assert_eq!(
        quantity_value(&node, "allocatable", "memory"),
        mem_kib * 1024 - (100 << 20)
    );
    assert_eq!(
        quantity_value(&node, "allocatable", "ephemeral-storage"),
        disk - (disk as f64 * 1.0 / 100.0) as i64
    );
    assert_eq!(quantity_value(&node, "allocatable", "cpu"), cpus);

    // The runtime's handlers and features, as its CRI Status says them (containerd 2.x: the
    // default handler "" and "runc" with user namespaces; containerd 1.6: neither field).
    let cri_status = cri().await.status(false).await.unwrap();
    let handlers: Vec<(String, bool, bool)> = status
        .runtime_handlers
        .iter()
        .flatten()
        .map(|h| {
            let f = h.features.clone().unwrap_or_default();
            (
                h.name.clone().unwrap_or_default(),
                f.recursive_read_only_mounts.unwrap_or_default(),
                f.user_namespaces.unwrap_or_default(),
            )
        })
        .collect();
    let want: Vec<(String, bool, bool)> = cri_status
        .runtime_handlers
        .iter()
        .map(|h| {
            let f = h.features.unwrap_or_default();
            (
                h.name.clone(),
                f.recursive_read_only_mounts,
                f.user_namespaces,
            )
        })
        .collect();
    assert_eq!(handlers, want, "status.runtimeHandlers");
    assert_eq!(
        status
            .features
            .as_ref()
            .and_then(|f| f.supplemental_groups_policy),
        cri_status.features.map(|f| f.supplemental_groups_policy),
        "status.features"
    );
    if version_is_2x(&cri().await).await {
        assert!(
            handlers
                .iter()
                .any(|(name, _, userns)| name.is_empty() && *userns),
            "containerd 2.x's default handler has user namespaces: {handlers:?}"
        );
    }

    // nodeInfo, against the kernel, the OS and the runtime.
    let info = status.node_info.clone().unwrap();
    let version = cri().await.version().await.unwrap();
    assert_eq!(
        info.container_runtime_version,
        format!("{}://{}", version.runtime_name, version.runtime_version)
    );
    assert_eq!(info.boot_id, read_trim("/proc/sys/kernel/random/boot_id"));
    assert_eq!(info.machine_id, read_trim("/etc/machine-id"));
    let uname = Command::new("uname").arg("-r").output().unwrap();
    assert_eq!(
        info.kernel_version,
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    assert!(
        std::fs::read_to_string("/etc/os-release")
            .unwrap()
            .contains(&info.os_image)
    );
    assert_eq!(
        (info.operating_system.as_str(), info.architecture.as_str()),
        ("linux", "amd64")
    );
    assert!(
        info.kubelet_version.starts_with("v1.37.0+deckhand-"),
        "{}",
        info.kubelet_version
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(port)
    );
    assert!(
        !status.images.unwrap_or_default().is_empty(),
        "the runtime's images are listed"
    );
    for kind in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(condition(&node, kind).as_deref(), Some("False"), "{kind}");
    }

    // The Lease: held and owned by the Node, renewed while the agent runs.
    let uid = node.metadata.uid.clone().unwrap();
    let lease = wait_until("the node Lease", WAIT, || async {
        get_lease(&client, "dn-register").await
    })
    .await;
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("dn-register"));
    assert_eq!(spec.lease_duration_seconds, Some(8));
    let owner = &lease.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", uid.as_str())
    );
    let first = spec.renew_time.unwrap().0;
    wait_until("the Lease renewed", Duration::from_secs(10), || async {
        let renewed = get_lease(&client, "dn-register").await?.spec?.renew_time?.0;
        (renewed > first).then_some(())
    })
    .await;

    // /healthz is about the node agent and stays plain.
    let (code, body) = http_get(&format!("http://127.0.0.1:{}/healthz", agent.healthz_port))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
}

#[tokio::test]
async fn a_stopped_agent_goes_unknown_and_comes_back_as_the_same_node_with_its_pods() {
    let client = admin().await;
    let (mut agent, _cleanup) = joined_agent("dn-restart");
    agent.write_manifest("keep.yaml", &sleeping_pod("keep"));
    agent.start();
    let node = wait_node_ready(&client, "dn-restart", &agent).await;
    let uid = node.metadata.uid.clone().unwrap();
    let cri = cri().await;
    let pod = agent.pod_name("keep");
    let before = running_containers(&cri, &pod, WAIT).await;

    // Stopped: no more Lease renewals, and the controller manager marks the Node Unknown.
    agent.stop();
    wait_until(
        "the Node marked Unknown",
        Duration::from_secs(90),
        || async {
            let n = get_node(&client, "dn-restart").await?;
            (condition(&n, "Ready").as_deref() == Some("Unknown")).then_some(())
        },
    )
    .await;

    // Started again: the same Node turns Ready, and the pod kept its container.
    agent.start();
    let node = wait_node_ready(&client, "dn-restart", &agent).await;
    assert_eq!(
        node.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the same Node object"
    );
    let after = running_containers(&cri, &pod, WAIT).await;
    assert_eq!(after, before, "the static pod's container was not touched");
    assert!(
        agent.log().contains("the Node was registered before"),
        "{}",
        agent.log()
    );
}

#[tokio::test]
async fn a_credential_for_another_node_is_refused_and_said_so() {
    let client = admin().await;
    let (mut agent, _cleanup) = joined_agent("dn-wrong-name");
    let _other = NodeCleanup("dn-credential-owner".into());
    // The credential of another node, used under this node's name.
    agent.extra_args.retain(|a| !a.starts_with("--kubeconfig="));
    agent.extra_args.push(format!(
        "--kubeconfig={}",
        node_kubeconfig("dn-credential-owner").display()
    ));
    agent.start();
    agent.wait_healthy(WAIT).await;
    let needle = r#"node "dn-credential-owner" is not allowed to modify node "dn-wrong-name""#;
    wait_until("the refusal in the log", WAIT, || async {
        let log = agent.log();
        (log.contains("registering node") && log.contains("forbids it") && log.contains(needle))
            .then_some(())
    })
    .await;
    assert!(
        get_node(&client, "dn-wrong-name").await.is_none(),
        "no Node was made"
    );
    // Retried with back-off: one warning per distinct problem, later tries at debug level.
    wait_until("a retry", WAIT, || async {
        agent.log().contains("failed again; retrying").then_some(())
    })
    .await;
    let warnings = agent
        .log()
        .matches("registering node \"dn-wrong-name\" failed; retrying with back-off")
        .count();
    assert_eq!(
        warnings,
        1,
        "one warning for a repeated refusal:\n{}",
        agent.log()
    );
    // The agent itself stays healthy: the API server's refusal is not its health.
    let (code, _) = http_get(&format!("http://127.0.0.1:{}/healthz", agent.healthz_port))
        .await
        .unwrap();
    assert_eq!(code, 200);
}

#[tokio::test]
async fn an_unusable_kubeconfig_stops_the_agent_naming_the_file() {
    let agent = Agent::new("dn-bad-kubeconfig");
    let dir = agent.dir.path();
    let missing_cert = dir.join("gone.crt");
    let kubeconfig = dir.join("node.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\n\
             contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n\
             users:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            missing_cert.display(),
            missing_cert.display()
        ),
    )
    .unwrap();
    let cases = [
        (dir.join("absent.kubeconfig"), dir.join("absent.kubeconfig")),
        (kubeconfig.clone(), missing_cert.clone()),
    ];
    for (path, named) in cases {
        let mut args = agent.args();
        args.push(format!("--kubeconfig={}", path.display()));
        let out = Command::new(common::deckhand_bin())
            .args(&args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "exit status {:?}", out.status);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].contains(&named.display().to_string()),
            "names {}: {stderr}",
            named.display()
        );
    }
}

/// The API server's address, from the cluster's `cluster.env`.
fn apiserver_url() -> String {
    let env = std::fs::read_to_string(common::cluster::cluster_dir().join("cluster.env")).unwrap();
    env.lines()
        .find_map(|l| l.strip_prefix("APISERVER_URL="))
        .expect("APISERVER_URL in cluster.env")
        .trim_matches(|c| c == '"' || c == '\'')
        .to_string()
}

/// A kubeconfig for the test cluster's API server with the given CA file and user entry.
fn kubeconfig(
    dir: &std::path::Path,
    name: &str,
    ca: &std::path::Path,
    user: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters:\n- name: k\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n\
             users:\n- name: u\n  user:\n{user}",
            apiserver_url(),
            ca.display()
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn a_wrong_ca_or_a_refused_token_is_logged_once_and_retried() {
    let cluster = common::cluster::cluster_dir();
    // A CA that did not sign the API server's certificate.
    let wrong_ca = common::test_ca::TestCa::new("wrong-ca").pem;
    let cases = [
        ("dn-wrong-ca", "UnknownIssuer", true),
        ("dn-bad-token", "(401 Unauthorized)", false),
    ];
    for (node, expected, use_wrong_ca) in cases {
        let _cleanup = NodeCleanup(node.into());
        let mut agent = Agent::new(node);
        let dir = agent.dir.path().to_path_buf();
        let ca = if use_wrong_ca {
            let path = dir.join("wrong-ca.crt");
            std::fs::write(&path, &wrong_ca).unwrap();
            path
        } else {
            cluster.join("pki/ca.crt")
        };
        let node_pki = cluster.join("pki/nodes");
        node_kubeconfig("dn-wrong-ca"); // makes the node certificate used below
        let user = if use_wrong_ca {
            format!(
                "    client-certificate: {}\n    client-key: {}\n",
                node_pki.join("dn-wrong-ca.crt").display(),
                node_pki.join("dn-wrong-ca.key").display()
            )
        } else {
            "    token: not-a-token-the-cluster-knows\n".to_string()
        };
        let path = kubeconfig(&dir, node, &ca, &user);
        agent
            .extra_args
            .push(format!("--kubeconfig={}", path.display()));
        agent.start();
        agent.wait_healthy(WAIT).await;
        wait_until(
            &format!("{node}: a retry after {expected}"),
            WAIT,
            || async {
                let log = agent.log();
                (log.contains(expected) && log.contains("failed again; retrying")).then_some(())
            },
        )
        .await;
        let log = agent.log();
        let warnings = log
            .lines()
            .filter(|l| {
                l.contains(" WARN ") && l.contains("registering node") && l.contains(expected)
            })
            .count();
        assert_eq!(
            warnings, 1,
            "{node}: one warning for the repeated problem:\n{log}"
        );
        assert!(get_node(&admin().await, node).await.is_none());
    }
}

/// Fault injection (`DECKHAND_TEST_PANIC_TASK`): the task that registers the Node and renews
/// its Lease panics once. The supervisor catches it, says so in `/healthz` and `/metrics`, and
/// starts it again after a second: the Node registers and the Lease is renewed as usual.
#[tokio::test]
async fn a_panicking_node_status_task_is_restarted_and_named_in_healthz() {
    let client = admin().await;
    let (mut agent, _cleanup) = joined_agent("dn-task-panic");
    agent
        .env
        .push(("DECKHAND_TEST_PANIC_TASK".into(), "node-status".into()));
    agent.start();
    let healthz = format!("http://127.0.0.1:{}/healthz?verbose", agent.healthz_port);
    let failing = wait_until("/healthz to name the task that panicked", WAIT, || async {
        let (code, body) = http_get(&healthz).await?;
        (code == 500 && body.contains("[-]tasks failed: node-status panicked 1 time"))
            .then_some(body)
    })
    .await;
    assert!(failing.contains("[+]syncloop ok"), "{failing}");
    let metrics = format!("http://127.0.0.1:{}/metrics", agent.read_only_port);
    let (_, body) = http_get(&metrics).await.expect("/metrics answers");
    assert!(
        body.contains("deckhand_task_panics_total{task=\"node-status\"} 1\n"),
        "{body}"
    );
    assert!(
        agent.log().contains("a background task panicked"),
        "the panic is logged"
    );
    wait_node_ready(&client, "dn-task-panic", &agent).await;
    let first = wait_until("the node Lease", WAIT, || async {
        get_lease(&client, "dn-task-panic").await?.spec?.renew_time
    })
    .await
    .0;
    wait_until("the Lease renewed", Duration::from_secs(15), || async {
        let renewed = get_lease(&client, "dn-task-panic")
            .await?
            .spec?
            .renew_time?
            .0;
        (renewed > first).then_some(())
    })
    .await;
}

/// The runtime is containerd 2.x (handlers and features are reported from 2.0 on).
async fn version_is_2x(client: &deckhand::clients::cri::CriClient) -> bool {
    let version = client.version().await.unwrap();
    !version
        .runtime_version
        .trim_start_matches('v')
        .starts_with("1.")
}
