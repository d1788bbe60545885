//! Shared harness for the end-to-end tests: a real containerd (the private testbed that
//! `scripts/test` starts), a real `deckhand` process per test with its own node name, ports and
//! directories, and waits with deadlines instead of sleeps.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deckhand::clients::cri::proto::{ContainerFilter, PodSandboxFilter};
use deckhand::clients::cri::{CriClient, RuntimeService, parse_endpoint};

pub mod cluster;
pub mod node_api;
pub mod pressure;
#[path = "../../src/base/test_ca.rs"]
pub mod test_ca;

/// The busybox image the testbed builds (no registry needed).
pub const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";

/// A static pod whose one container `app` sleeps until told to stop (1 s of grace).
pub fn sleeping_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
"#
    )
}

/// A static pod `crash` whose one container `crash` runs `script` in `sh -c` (each exit is a
/// crash to restart; 1 s of grace).
pub fn crashing_pod(script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: crash, image: {BUSYBOX}, command: ["sh", "-c", "{script}"]}}
"#
    )
}

/// The runtime endpoint of the private testbed, or a failure that says how to get one.
pub fn runtime_endpoint() -> String {
    match std::env::var("DECKHAND_TEST_RUNTIME") {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "end-to-end tests need the private containerd: run `scripts/test`, or start it with \
             `scripts/testbed up DIR` and export DECKHAND_TEST_RUNTIME=unix://DIR/containerd.sock"
        ),
    }
}

/// A CRI client on the testbed, failing clearly when it does not answer.
pub async fn cri() -> CriClient {
    let endpoint =
        parse_endpoint(&runtime_endpoint()).expect("DECKHAND_TEST_RUNTIME is a unix endpoint");
    match CriClient::connect(&endpoint, Duration::from_secs(30)).await {
        Ok(c) => c,
        Err(err) => panic!(
            "the private containerd at {} does not answer ({err}); start it with `scripts/testbed up DIR`",
            endpoint.original
        ),
    }
}

/// The deckhand binary under test: `DECKHAND_BIN` when set (a release build, or another
/// commit's binary to compare with), else the one cargo built for the tests.
pub fn deckhand_bin() -> PathBuf {
    std::env::var_os("DECKHAND_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_deckhand")))
}

/// A free TCP port on loopback (bound and released), never one this test process handed out
/// before: the kernel may give the same port to two binds in a row once the first is
/// released, and an agent given it twice (say, as its node API and healthz ports) cannot start.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port on 127.0.0.1");
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Polls `check` until it returns `Some`, or fails the test with `what` after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One `deckhand` process with its own node name, ports and directories.
pub struct Agent {
    pub node: String,
    pub dir: tempfile::TempDir,
    pub healthz_port: u16,
    pub read_only_port: u16,
    /// The node API's port (`--port`; 10250 is never used, tests share the machine).
    pub port: u16,
    /// Where the node API and the read-only port listen (`--address`): 127.0.0.1 unless a
    /// test needs the API server to reach the node, which it refuses to do on loopback (see
    /// [`HostAddress`]).
    pub address: String,
    pub child: Option<Child>,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Another runtime endpoint than the shared testbed's.
    pub runtime: Option<String>,
}

/// The hard eviction thresholds every test agent runs with unless its test sets its own:
/// upstream's memory threshold, and disk thresholds this machine's full disk does not reach.
pub const TEST_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%";

impl Agent {
    /// Prepares (does not start) an agent whose node name is `node` (unique per test).
    pub fn new(node: &str) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix(&format!("deckhand-{node}-"))
            .tempdir()
            .expect("a temp dir");
        for sub in ["manifests", "root", "logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        Agent {
            node: node.to_string(),
            dir,
            healthz_port: free_port(),
            read_only_port: free_port(),
            port: free_port(),
            address: "127.0.0.1".to_string(),
            child: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            runtime: None,
        }
    }

    /// Shortens the crash-loop back-off (initial and maximum delay, Go durations) so restarts
    /// happen within a test's patience.
    pub fn backoff(&mut self, initial: &str, max: &str) {
        self.env
            .push(("DECKHAND_BACKOFF_INITIAL".into(), initial.into()));
        self.env.push(("DECKHAND_BACKOFF_MAX".into(), max.into()));
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("deckhand.log")
    }

    /// The full name a static pod gets on this node.
    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.node)
    }

    /// The command line the agent runs with.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            format!(
                "--container-runtime-endpoint={}",
                self.runtime.clone().unwrap_or_else(runtime_endpoint)
            ),
            format!("--hostname-override={}", self.node),
            format!("--pod-manifest-path={}", self.manifests().display()),
            format!("--root-dir={}", self.root_dir().display()),
            format!("--pod-logs-dir={}", self.logs_dir().display()),
            format!("--healthz-port={}", self.healthz_port),
            format!("--read-only-port={}", self.read_only_port),
            format!("--port={}", self.port),
            format!("--address={}", self.address),
            "--v=4".to_string(),
            // The testbed's images are built locally and cannot be pulled again; on a nearly
            // full disk an agent living past the first image GC pass would remove the unused ones.
            "--image-gc-high-threshold=100".to_string(),
        ];
        // Upstream's default disk thresholds (10 % and 15 % free) would put every test agent
        // under DiskPressure on a nearly full disk, refusing and evicting its pods; a test
        // that is about eviction gives its own.
        if !self
            .extra_args
            .iter()
            .any(|a| a.starts_with("--eviction-hard"))
        {
            args.push(format!("--eviction-hard={TEST_EVICTION_HARD}"));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// Starts the process (logs go to `deckhand.log` in the agent's dir).
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .unwrap();
        let mut cmd = Command::new(deckhand_bin());
        cmd.args(self.args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env("DECKHAND_RELIST_PERIOD", "1s");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn deckhand"));
    }

    /// The agent's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// Waits until `/healthz` answers `ok`.
    pub async fn wait_healthy(&mut self, timeout: Duration) {
        let url = format!("http://127.0.0.1:{}/healthz", self.healthz_port);
        let start = Instant::now();
        loop {
            if let Some((200, body)) = http_get(&url).await
                && body == "ok"
            {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("deckhand exited early with {status}; log:\n{}", self.log());
            }
            if start.elapsed() > timeout {
                panic!(
                    "deckhand not healthy after {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process with SIGKILL (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Writes a manifest into the static pod directory (through a rename, as editors do).
    pub fn write_manifest(&self, file: &str, text: &str) {
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests().join(file)).unwrap();
    }

    pub fn remove_manifest(&self, file: &str) {
        let _ = std::fs::remove_file(self.manifests().join(file));
    }

    /// `GET /pods` on the read-only port.
    pub async fn pods(&self) -> Option<serde_json::Value> {
        let url = format!("http://{}:{}/pods", self.address, self.read_only_port);
        let (code, body) = http_get(&url).await?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// One pod from `/pods` by its name on this node.
    pub async fn pod(&self, name: &str) -> Option<serde_json::Value> {
        let full = self.pod_name(name);
        let list = self.pods().await?;
        list["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
            .cloned()
    }
}

impl Drop for Agent {
    /// Stops the agent and removes every sandbox of its node from the runtime, even when the
    /// test failed half-way.
    fn drop(&mut self) {
        self.kill();
        if let Ok(dir) = std::env::var("DECKHAND_TEST_KEEP_LOGS") {
            let _ = std::fs::copy(
                self.log_file(),
                Path::new(&dir).join(format!("{}.log", self.node)),
            );
        }
        if std::thread::panicking() {
            // The agent's own account of what happened is the first thing to read on a failure.
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let from = lines.len().saturating_sub(80);
            eprintln!("---- last lines of deckhand's log ({}) ----", self.node);
            for line in &lines[from..] {
                eprintln!("{line}");
            }
        }
        let node = self.node.clone();
        let runtime = self
            .runtime
            .clone()
            .or_else(|| std::env::var("DECKHAND_TEST_RUNTIME").ok());
        let cleanup = async move {
            let Some(runtime) = runtime else {
                return;
            };
            let Ok(endpoint) = parse_endpoint(&runtime) else {
                return;
            };
            let Ok(cri) = CriClient::connect(&endpoint, Duration::from_secs(30)).await else {
                return;
            };
            remove_node_pods(&cri, &node).await;
        };
        let handle = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(cleanup)
        });
        let _ = handle.join();
        unmount_under(self.dir.path());
    }
}

/// Detaches every mount below `dir` (deepest first): volumes the killed agent left mounted
/// (secrets and tokens are tmpfs mounts) would otherwise outlive the test and keep its temporary
/// directory from being removed.
pub fn unmount_under(dir: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(dir) && point != dir)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Stops and removes every sandbox (and its containers) of node `node`: its static pods (named
/// `<name>-<node>`) and the pods the API server bound to it (labelled `deckhand.io/node`).
pub async fn remove_node_pods(cri: &CriClient, node: &str) {
    let suffix = format!("-{node}");
    let Ok(sandboxes) = cri.list_pod_sandbox(None).await else {
        return;
    };
    for sb in sandboxes {
        let name = sb
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let labelled = sb
            .labels
            .get(deckhand::base::cri_labels::NODE_LABEL)
            .map(String::as_str)
            == Some(node);
        if !name.ends_with(&suffix) && !labelled {
            continue;
        }
        let containers = cri
            .list_containers(Some(ContainerFilter {
                pod_sandbox_id: sb.id.clone(),
                ..Default::default()
            }))
            .await
            .unwrap_or_default();
        for c in containers {
            let _ = cri.stop_container(c.id.clone(), 0).await;
            let _ = cri.remove_container(c.id).await;
        }
        let _ = cri.stop_pod_sandbox(sb.id.clone()).await;
        let _ = cri.remove_pod_sandbox(sb.id).await;
    }
}

/// Sandboxes of the pod named `full_name` (any state).
pub async fn sandboxes_of(
    cri: &CriClient,
    full_name: &str,
) -> Vec<deckhand::clients::cri::proto::PodSandbox> {
    cri.list_pod_sandbox(Some(PodSandboxFilter {
        label_selector: HashMap::from([(
            "io.kubernetes.pod.name".to_string(),
            full_name.to_string(),
        )]),
        ..Default::default()
    }))
    .await
    .unwrap_or_default()
}

/// Containers of the pod named `full_name` (any state).
pub async fn containers_of(
    cri: &CriClient,
    full_name: &str,
) -> Vec<deckhand::clients::cri::proto::Container> {
    cri.list_containers(Some(ContainerFilter {
        label_selector: HashMap::from([(
            "io.kubernetes.pod.name".to_string(),
            full_name.to_string(),
        )]),
        ..Default::default()
    }))
    .await
    .unwrap_or_default()
}

/// A tiny HTTP/1.1 GET over a plain TCP stream: status code and body.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let connect = tokio::net::TcpStream::connect(host);
    let mut stream = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((code, body))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// The body of a `GET` on the agent's local socket (`<root-dir>/deckhand.sock`), which also
/// serves the `/debug/*` pages; empty when the agent does not answer.
pub async fn local_socket_get(socket: &Path, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.ok()?;
        Some(reply.split_once("\r\n\r\n")?.1.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// `memory.available` as the agent reckons it on this cgroup v1 host: `MemTotal` less the root
/// memory cgroup's working set (its usage less `total_inactive_file`). Panics, naming the
/// file, where the host has no v1 memory controller.
pub fn node_memory_available() -> u64 {
    let file = |p: &str| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            panic!("{p}: {e} (the memory tests need cgroup v1's memory controller)")
        })
    };
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .filter_map(|l| l.split_once(char::is_whitespace))
            .find(|(k, _)| k.trim_end_matches(':') == name)
            .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} to read"))
    };
    let total = field(&file("/proc/meminfo"), "MemTotal") * 1024;
    let usage: u64 = file("/sys/fs/cgroup/memory/memory.usage_in_bytes")
        .trim()
        .parse()
        .expect("memory.usage_in_bytes is a number");
    let inactive = field(
        &file("/sys/fs/cgroup/memory/memory.stat"),
        "total_inactive_file",
    );
    total.saturating_sub(usage.saturating_sub(inactive))
}

/// Reads a file if it exists.
pub fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// IDs of the running containers of the pod named `full_name`, once there is at least one
/// (fails the test after `timeout`).
pub async fn running_containers(
    cri: &CriClient,
    full_name: &str,
    timeout: Duration,
) -> Vec<String> {
    wait_until(
        &format!("a running container of {full_name}"),
        timeout,
        || async {
            let ids: Vec<String> = containers_of(cri, full_name)
                .await
                .into_iter()
                .filter(|c| {
                    c.state
                        == deckhand::clients::cri::proto::ContainerState::ContainerRunning as i32
                })
                .map(|c| c.id)
                .collect();
            (!ids.is_empty()).then_some(ids)
        },
    )
    .await
}

/// A private containerd of a test's own (`scripts/testbed` in a temp dir, with its own bridge
/// and subnet), for tests that stop or restart containerd without disturbing the tests that
/// share the suite's testbed. Torn down even when the test fails.
pub struct OwnTestbed {
    dir: tempfile::TempDir,
    bridge: &'static str,
    subnet: &'static str,
    env: Vec<(String, String)>,
}

impl OwnTestbed {
    /// Prepares (does not start) a testbed; `bridge` and `subnet` must be unique in the suite.
    pub fn new(prefix: &str, bridge: &'static str, subnet: &'static str) -> OwnTestbed {
        OwnTestbed {
            dir: tempfile::Builder::new().prefix(prefix).tempdir().unwrap(),
            bridge,
            subnet,
            env: Vec::new(),
        }
    }

    /// Sets an environment variable for `scripts/testbed up` (e.g. `TESTBED_EXTRA_IMAGES`).
    pub fn with_env(mut self, key: &str, value: &str) -> OwnTestbed {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed")
    }

    /// Starts (or restarts) its containerd; the shims and pods of a stopped one live on.
    pub fn up(&self) {
        let out = Command::new(Self::script())
            .args([
                "up",
                &self.tb(),
                "--bridge",
                self.bridge,
                "--subnet",
                self.subnet,
            ])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run scripts/testbed");
        assert!(
            out.status.success(),
            "testbed up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The testbed's directory.
    pub fn tb(&self) -> String {
        self.dir.path().join("tb").display().to_string()
    }

    /// containerd's root (content store and snapshots: the image filesystem); a test may
    /// mount a filesystem of its own here before `up`, and `down` unmounts it.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("tb/root")
    }

    /// The CRI endpoint of its containerd.
    pub fn endpoint(&self) -> String {
        format!("unix://{}/containerd.sock", self.tb())
    }

    /// The PID of its containerd.
    pub fn containerd_pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.path().join("tb/containerd.pid"))
            .expect("containerd.pid")
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for OwnTestbed {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .args(["down", &self.tb()])
            .output();
    }
}

/// promtool, unpacked by `scripts/install-deps`; a clear failure when it is missing.
fn promtool() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".testbed/tools/promtool");
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-deps (it unpacks promtool from Debian's prometheus package)",
        path.display()
    );
    path
}

/// `promtool check metrics` on `page`: its complaints, empty when there are none.
pub fn promtool_lint(page: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        String::new()
    } else {
        text
    }
}

/// A non-loopback IPv4 address of this host, for as long as the value lives: the API server
/// refuses to proxy to a node (`nodes/proxy`) or to route to an extension API server on a
/// loopback or link-local address, and the tests' agents otherwise listen on 127.0.0.1.
/// The address (a /32 from a documentation range, which no network routes to this host)
/// goes on `lo`: that needs no kernel module (dummy interfaces may be missing here).
/// One left on `lo` by an earlier, killed run is taken over; the same address on any other
/// interface is someone's real address and fails the test.
pub struct HostAddress {
    pub ip: String,
}

impl HostAddress {
    pub fn add(ip: &str) -> HostAddress {
        let out = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .expect("run ip (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout);
        let needle = format!(" inet {ip}/");
        match text.lines().find(|l| l.contains(&needle)) {
            Some(line) if line.split_whitespace().nth(1) == Some("lo") => {}
            Some(line) => panic!("{ip} is already an address of this host ({line}); pick another"),
            None => {
                let out = Command::new("ip")
                    .args(["addr", "add", &format!("{ip}/32"), "dev", "lo"])
                    .output()
                    .expect("run ip (iproute2)");
                assert!(
                    out.status.success(),
                    "ip addr add {ip}/32 dev lo failed (the tests run as root): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        HostAddress { ip: ip.to_string() }
    }
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{}/32", self.ip), "dev", "lo"])
            .output();
    }
}
