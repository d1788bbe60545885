//! End to end, against the real test control plane and the private containerd: the node API
//! on its `--port` (10250 upstream) over TLS.
//!
//! * Directly, with curl: no credentials → 401, a service account's token without RBAC →
//!   403 with upstream's body, the API server's kubelet-client certificate → 200.
//! * Through the API server with kubectl: `logs` (`--tail`, `-f`, `--previous`), `attach`,
//!   `exec` (with and without a terminal), `port-forward`.
//! * The serving certificate by CSR: the node asks for a `kubernetes.io/kubelet-serving`
//!   certificate, serves nothing until the test approves it, then serves the signed one
//!   (verified against the cluster's CA, for the node's IP and name).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::{
    admin, clean_up_with_admin, cluster_dir, cluster_env, create_namespace, joined_agent, kubectl,
    wait_node_ready,
};
use common::node_api::curl_node_api;
use common::{BUSYBOX, wait_until};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);

fn pki(name: &str) -> PathBuf {
    cluster_dir().join("pki").join(name)
}

/// `curl` against the node API; (HTTP status, body). `auth` adds curl arguments
/// (a client certificate, a bearer token, the CA to verify with).
fn curl(port: u16, path: &str, auth: &[String]) -> Option<(u16, String)> {
    curl_node_api(port, path, auth).ok()
}

fn client_cert() -> Vec<String> {
    vec![
        "--cert".into(),
        pki("apiserver-kubelet-client.crt").display().to_string(),
        "--key".into(),
        pki("apiserver-kubelet-client.key").display().to_string(),
    ]
}

/// A pod on `node` with four containers: `app` writes three lines (the second to stderr,
/// a little later: the two streams reach the log through separate pipes) and sleeps; `ticker` writes a line every 200 ms; `crasher` writes one line and fails after a
/// second (so it has a previous instance); `web` serves a page on 8080.
fn test_pod(node: &str) -> Pod {
    let c = |name: &str, script: &str| {
        serde_json::json!({
            "name": name, "image": BUSYBOX, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
        })
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "talk"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                c("app", "echo first; sleep 0.1; echo second >&2; sleep 0.1; echo third; trap 'exit 0' TERM; sleep 600 & wait"),
                c("ticker", "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.2; done"),
                c("crasher", "echo run-$(cat /proc/uptime); sleep 1; exit 1"),
                c("web", "mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www"),
            ],
        },
    }))
    .unwrap()
}

fn restart_count(pod: &Pod, container: &str) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .map_or(0, |c| c.restart_count)
}

fn all_running(pod: &Pod, names: &[&str]) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    names.iter().all(|n| {
        statuses
            .iter()
            .any(|c| c.name == *n && c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
    })
}

/// Reads lines from a child's stdout on a thread, so a test can wait for them with a deadline.
fn line_reader(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[tokio::test]
async fn kubectl_reaches_the_node_through_the_api_server() {
    let client = admin().await;
    let node = "dn-napi";
    let ns = "napi-e2e";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.backoff("1s", "2s");
    agent.extra_args.extend([
        "--node-ip=127.0.0.1".to_string(),
        format!("--client-ca-file={}", pki("ca.crt").display()),
    ]);
    let _ns_cleanup = create_namespace(&client, ns).await;
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let port = agent.port;

    // Directly: who may ask.
    let (code, body) = curl(port, "/pods", &["-k".into()]).expect("the node API answers");
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));
    kubectl(&["create", "serviceaccount", "nobody", "-n", ns]);
    let token = kubectl(&["create", "token", "nobody", "-n", ns])
        .trim()
        .to_string();
    let (code, body) = curl(
        port,
        "/pods",
        &[
            "-k".into(),
            "-H".into(),
            format!("Authorization: Bearer {token}"),
        ],
    )
    .unwrap();
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body,
        format!(
            "Forbidden (user=system:serviceaccount:{ns}:nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        )
    );
    let mut with_cert = client_cert();
    with_cert.push("-k".into());
    let (code, body) = curl(port, "/healthz", &with_cert).unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = curl(port, "/configz", &with_cert).unwrap();
    assert_eq!(code, 200, "{body}");
    let configz: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(configz["kubeletconfig"]["port"], port);
    assert_eq!(configz["kubeletconfig"]["authorization"]["mode"], "Webhook");

    // The node's own logs (directly: the API server's node proxy refuses loopback nodes).
    let (code, listing) = curl(port, "/logs/", &with_cert).unwrap();
    assert_eq!(code, 200, "{listing}");
    assert!(listing.contains("<pre>"), "{listing}");

    // A pod to talk to.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &test_pod(node))
        .await
        .unwrap();
    wait_until("the pod's containers run", WAIT, || async {
        let p = pods.get("talk").await.ok()?;
        (all_running(&p, &["app", "ticker", "web"]) && restart_count(&p, "crasher") >= 1)
            .then_some(())
    })
    .await;
    let (code, body) = curl(port, "/pods", &with_cert).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"name\":\"talk\""), "{body}");
    let (code, body) = curl(port, "/runningpods/", &with_cert).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"name\":\"talk\""), "{body}");

    // Directly, then with kubectl logs through the API server.
    wait_until("the app's three lines", WAIT, || async {
        curl(port, &format!("/containerLogs/{ns}/talk/app"), &with_cert)
            .filter(|(_, body)| body == "first\nsecond\nthird\n")
    })
    .await;
    let logs = kubectl(&["logs", "-n", ns, "talk", "-c", "app"]);
    assert_eq!(logs, "first\nsecond\nthird\n");
    assert_eq!(
        kubectl(&["logs", "-n", ns, "talk", "-c", "app", "--tail=1"]),
        "third\n"
    );
    let stamped = kubectl(&[
        "logs",
        "-n",
        ns,
        "talk",
        "-c",
        "app",
        "--timestamps",
        "--limit-bytes=40",
    ]);
    assert!(
        stamped.ends_with(" first\n") || stamped.len() == 40,
        "{stamped:?}"
    );
    let previous = kubectl(&["logs", "-n", ns, "talk", "-c", "crasher", "--previous"]);
    assert!(previous.starts_with("run-"), "{previous:?}");

    // kubectl logs -f: new lines keep coming.
    let mut follow = Command::new(cluster_env("KUBECTL"))
        .arg(format!(
            "--kubeconfig={}",
            cluster_dir().join("admin.kubeconfig").display()
        ))
        .args(["logs", "-f", "--tail=1", "-n", ns, "talk", "-c", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = line_reader(follow.stdout.take().unwrap());
    let mut seen = Vec::new();
    while seen.len() < 4 {
        match lines.recv_timeout(Duration::from_secs(10)) {
            Ok(l) => seen.push(l),
            Err(e) => panic!("kubectl logs -f stalled after {seen:?}: {e}"),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let numbers: Vec<u64> = seen
        .iter()
        .map(|l| l.strip_prefix("tick-").unwrap().parse().unwrap())
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");

    // kubectl attach: the ticker's output, live.
    let mut attached = Command::new(cluster_env("KUBECTL"))
        .arg(format!(
            "--kubeconfig={}",
            cluster_dir().join("admin.kubeconfig").display()
        ))
        .args(["attach", "-n", ns, "talk", "-c", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = line_reader(attached.stdout.take().unwrap());
    let line = lines.recv_timeout(Duration::from_secs(20));
    let _ = attached.kill();
    let _ = attached.wait();
    let line = line.expect("kubectl attach shows the ticker's output");
    assert!(line.starts_with("tick-"), "{line:?}");

    // kubectl exec.
    let started = std::time::Instant::now();
    let out = kubectl(&[
        "exec",
        "-n",
        ns,
        "talk",
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "echo $((6*7)); echo to-stderr >&2",
    ]);
    eprintln!("kubectl exec round trip: {:?}", started.elapsed());
    assert_eq!(out, "42\n");

    // kubectl exec with a terminal (`script` gives kubectl one): the shell sees a tty.
    let command = format!(
        "{} --kubeconfig={} exec -it -n {ns} talk -c app -- sh -c 'tty; echo done'",
        cluster_env("KUBECTL"),
        cluster_dir().join("admin.kubeconfig").display()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("/dev/pts/") && text.contains("done\r\n"),
        "{text:?}"
    );

    // kubectl port-forward.
    let mut forward = Command::new(cluster_env("KUBECTL"))
        .arg(format!(
            "--kubeconfig={}",
            cluster_dir().join("admin.kubeconfig").display()
        ))
        .args(["port-forward", "-n", ns, "pod/talk", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = line_reader(forward.stdout.take().unwrap());
    let local: u16 = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("kubectl port-forward says where it listens");
        // "Forwarding from 127.0.0.1:41234 -> 8080"
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let page = common::http_get(&format!("http://127.0.0.1:{local}/")).await;
    let _ = forward.kill();
    let _ = forward.wait();
    let (code, body) = page.expect("the forwarded port answers");
    assert_eq!((code, body.trim()), (200, "hello-from-pod"));

    // A bad request: a container the pod does not have.
    let (code, body) = curl(port, &format!("/containerLogs/{ns}/talk/nope"), &with_cert).unwrap();
    assert_eq!(code, 404, "{body}");
    agent.stop();
}

/// Deletes the node's serving CSRs when dropped.
struct CsrCleanup(Vec<String>);

impl Drop for CsrCleanup {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        clean_up_with_admin(move |client| async move {
            let api: Api<CertificateSigningRequest> = Api::all(client);
            for n in names {
                let _ = api.delete(&n, &DeleteParams::default()).await;
            }
        });
    }
}

#[tokio::test]
async fn the_serving_certificate_comes_from_an_approved_csr() {
    let client = admin().await;
    let node = "dn-napi-csr";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.extra_args.extend([
        "--node-ip=127.0.0.1".to_string(),
        "--rotate-server-certificates".to_string(),
        format!("--client-ca-file={}", pki("ca.crt").display()),
    ]);
    agent.start();
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let user = format!("system:node:{node}");
    let csr = wait_until("the node's kubelet-serving CSR", WAIT, || async {
        csrs.list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|c| {
                c.spec.signer_name == "kubernetes.io/kubelet-serving"
                    && c.spec.username.as_deref() == Some(user.as_str())
                    && c.status
                        .as_ref()
                        .and_then(|s| s.certificate.as_ref())
                        .is_none()
            })
    })
    .await;
    let name = csr.metadata.name.clone().unwrap();
    let _csr_cleanup = CsrCleanup(vec![name.clone()]);
    assert_eq!(
        deckhand::kubelet::certificate::csr::csr_common_name(&csr.spec.request.0).as_deref(),
        Some(user.as_str())
    );

    // Not approved: no handshake succeeds (the controller-manager does not approve these).
    let port = agent.port;
    let mut verified = client_cert();
    verified.extend(["--cacert".into(), pki("ca.crt").display().to_string()]);
    assert_eq!(
        curl(port, "/healthz", &verified),
        None,
        "served before approval"
    );

    kubectl(&["certificate", "approve", &name]);
    let (code, body) = wait_until(
        "the node API serves the signed certificate",
        WAIT,
        || async { curl(port, "/healthz", &verified) },
    )
    .await;
    assert_eq!((code, body.as_str()), (200, "ok"));

    // The served certificate: the CSR's, issued by the cluster CA, for the node's name and IP.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 -noout -issuer -subject -ext subjectAltName"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let ca_subject = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(pki("ca.crt"))
        .output()
        .unwrap();
    let ca_cn = String::from_utf8_lossy(&ca_subject.stdout)
        .trim()
        .trim_start_matches("subject=")
        .trim()
        .to_string();
    assert!(
        text.contains(&format!("issuer={ca_cn}")),
        "{text} (CA {ca_cn})"
    );
    assert!(
        text.contains(&format!("CN = {user}")) || text.contains(&format!("CN={user}")),
        "{text}"
    );
    assert!(text.contains(&format!("DNS:{node}")), "{text}");
    assert!(text.contains("IP Address:127.0.0.1"), "{text}");
    let current = agent.root_dir().join("pki/kubelet-server-current.pem");
    assert!(current.exists(), "{} is missing", current.display());
    agent.stop();
}

/// Made-up bearer tokens at the node API from many TLS connections at once, each connection
/// sending one request at a time (keep-alive, a new connection when one is closed), on a
/// thread and runtime of its own so the test's own requests never wait behind it.
struct TokenFlood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counts: std::sync::Arc<FloodCounts>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default, Debug)]
struct FloodCounts {
    sent: std::sync::atomic::AtomicU64,
    unauthorized: std::sync::atomic::AtomicU64,
    /// 403: let through (as `system:anonymous`) instead of refused.
    forbidden: std::sync::atomic::AtomicU64,
    other: std::sync::atomic::AtomicU64,
    broken: std::sync::atomic::AtomicU64,
}

/// Accepts any serving certificate: the flood is about what the node does with tokens.
#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl TokenFlood {
    /// `connections` connections, each sending a request with a new token every `pace`.
    fn start(port: u16, connections: usize, pace: Duration) -> TokenFlood {
        use std::sync::Arc;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counts = Arc::new(FloodCounts::default());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
        let (s, c) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for n in 0..connections {
                    tasks.spawn(hammer(
                        port,
                        n,
                        pace,
                        connector.clone(),
                        s.clone(),
                        c.clone(),
                    ));
                }
                while tasks.join_next().await.is_some() {}
            });
        });
        TokenFlood {
            stop,
            counts,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) -> &FloodCounts {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        &self.counts
    }
}

impl Drop for TokenFlood {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One connection's loop: a request with a new random token, its answer, a pause, again.
async fn hammer(
    port: u16,
    n: usize,
    pace: Duration,
    connector: tokio_rustls::TlsConnector,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counts: std::sync::Arc<FloodCounts>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncWriteExt;
    let mut seed = (n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    let mut token = move || {
        let mut words = [0u64; 4];
        for w in &mut words {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *w = seed;
        }
        words
            .iter()
            .map(|w| format!("{w:016x}"))
            .collect::<String>()
    };
    // Spread the connections' first requests over one pace.
    tokio::time::sleep(pace.mul_f64((n % 97) as f64 / 97.0)).await;
    while !stop.load(Relaxed) {
        let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
            counts.broken.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let Ok(mut tls) = connector.connect(name, tcp).await else {
            counts.broken.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        while !stop.load(Relaxed) {
            let request = format!(
                "GET /pods HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\r\n",
                token()
            );
            if tls.write_all(request.as_bytes()).await.is_err() {
                break;
            }
            counts.sent.fetch_add(1, Relaxed);
            match tokio::time::timeout(Duration::from_secs(30), read_status(&mut tls)).await {
                Ok(Some(401)) => counts.unauthorized.fetch_add(1, Relaxed),
                Ok(Some(403)) => counts.forbidden.fetch_add(1, Relaxed),
                Ok(Some(_)) => counts.other.fetch_add(1, Relaxed),
                _ => {
                    counts.broken.fetch_add(1, Relaxed);
                    break;
                }
            };
            tokio::time::sleep(pace).await;
        }
    }
}

/// Reads one HTTP/1.1 response (headers and a Content-Length body); its status.
async fn read_status<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(status)
}

/// The Lease's renewTime as the API server has it.
async fn renew_time(client: &kube::Client, node: &str) -> Option<jiff::Timestamp> {
    let lease = common::cluster::get_lease(client, node).await?;
    Some(lease.spec?.renew_time?.0)
}

/// Anyone who can reach the node API can make the node ask the API server a TokenReview: a
/// made-up bearer token is enough. Thousands of them, from a hundred connections, while the
/// test reads the node's Lease from the API server and asks `/healthz` with the API
/// server's client certificate once a second: every renewal must come on time (the agent's
/// Lease here lasts 8 s and is renewed every 2 s; 3 s of slack for a busy machine) and every
/// legitimate request must be answered (200 within curl's 5 s). Before heartbeats had a
/// client of their own, every review spent the one client's rate limit, and the Lease
/// waited behind the flood; the agent runs with `--kube-api-qps=10 --kube-api-burst=20` so
/// that the flood's debt (about 20 s then) is far beyond any slack, not a matter of timing.
///
/// With anonymous auth on, a made-up token is a 401 (not `system:anonymous`), while a request
/// with no credentials is anonymous (403: no RBAC lets `system:anonymous` read nodes/proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_tokens_neither_delays_the_lease_nor_shuts_out_a_client() {
    const RENEW_EVERY: f64 = 2.0;
    const SLACK: f64 = 3.0;
    const FLOOD_FOR: Duration = Duration::from_secs(25);
    let client = admin().await;
    let node = "dn-napi-flood";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.extra_args.extend([
        "--node-ip=127.0.0.1".to_string(),
        format!("--client-ca-file={}", pki("ca.crt").display()),
        "--anonymous-auth=true".to_string(),
        "--kube-api-qps=10".to_string(),
        "--kube-api-burst=20".to_string(),
    ]);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let port = agent.port;

    let bearer = |t: &str| {
        vec![
            "-k".to_string(),
            "-H".into(),
            format!("Authorization: Bearer {t}"),
        ]
    };
    let (code, body) = curl(port, "/pods", &["-k".into()]).expect("the node API answers");
    assert_eq!(code, 403, "no credentials, anonymous on: {body}");
    assert!(body.contains("user=system:anonymous"), "{body}");
    let (code, body) = curl(port, "/pods", &bearer("made-up-token")).unwrap();
    assert_eq!(
        (code, body.as_str()),
        (401, "Unauthorized"),
        "a token the API server refuses is not anonymous"
    );

    let mut flood = TokenFlood::start(port, 100, Duration::from_millis(300));
    let mut renewals: Vec<jiff::Timestamp> = Vec::new();
    let mut legit: Vec<(Option<u16>, Duration)> = Vec::new();
    let started = std::time::Instant::now();
    let mut next_legit = started;
    while started.elapsed() < FLOOD_FOR {
        if let Some(t) = renew_time(&client, node).await
            && renewals.last() != Some(&t)
        {
            renewals.push(t);
        }
        if std::time::Instant::now() >= next_legit {
            next_legit += Duration::from_secs(1);
            let asked = std::time::Instant::now();
            let mut auth = client_cert();
            auth.extend(["-k".into(), "--max-time".into(), "5".into()]);
            let answer = tokio::task::spawn_blocking(move || curl(port, "/healthz", &auth))
                .await
                .unwrap();
            legit.push((answer.map(|(code, _)| code), asked.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = jiff::Timestamp::now();
    let counts = flood.stop();
    eprintln!("flood: {counts:?}; legitimate requests (status, time): {legit:?}");
    eprintln!("lease renewTimes: {renewals:?}");

    let mut points = renewals.clone();
    points.push(now);
    let gaps: Vec<f64> = points
        .windows(2)
        .map(|w| (w[1] - w[0]).total(jiff::Unit::Second).unwrap_or(f64::MAX))
        .collect();
    let worst = gaps.iter().cloned().fold(0.0, f64::max);
    assert!(
        renewals.len() >= 2 && worst <= RENEW_EVERY + SLACK,
        "the Lease was not renewed on time under the flood: longest gap {worst:.1} s \
         (renewed every {RENEW_EVERY} s), renewTimes {renewals:?}; log:\n{}",
        tail(&agent.log())
    );
    assert!(
        legit.len() >= 10 && legit.iter().all(|(code, _)| *code == Some(200)),
        "a legitimate client was not answered under the flood: {legit:?}"
    );
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let sent = load(&counts.sent);
    assert!(
        sent >= 2000,
        "the flood sent only {sent} tokens in {FLOOD_FOR:?}: {counts:?}"
    );
    assert_eq!(
        load(&counts.forbidden),
        0,
        "made-up tokens were let through as system:anonymous: {counts:?}"
    );
    assert!(
        load(&counts.unauthorized) >= 2000,
        "made-up tokens are a 401: {counts:?}"
    );
    agent.stop();
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
