//! What the benches share: numbers and the report, the agent's process and its /proc
//! samples, the plain-TCP HTTP client for its endpoints, static-pod manifests, and polling the
//! runtime over CRI. Each bench uses its part; the rest is dead code to it.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use deckhand::clients::cri::proto::{
    ContainerFilter, ContainerState, ContainerStateValue, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata,
};
use deckhand::clients::cri::{CriClient, RuntimeService};
use serde_json::{Map, Value, json};

pub mod proxy;

pub const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// How often the start, edit and delete phases list the runtime's state.
pub const CRI_POLL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------------------------
// Numbers

/// Nearest-rank percentiles of a set of samples (milliseconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dist {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn dist(values: &[f64]) -> Dist {
    if values.is_empty() {
        return Dist::default();
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Dist {
        n: v.len(),
        p50: rank(0.5),
        p99: rank(0.99),
        max: v[v.len() - 1],
    }
}

impl Dist {
    pub fn text(&self) -> String {
        if self.n == 0 {
            return "no samples".into();
        }
        format!(
            "p50 {:>7.0} ms   p99 {:>7.0} ms   max {:>7.0} ms   (n={})",
            self.p50, self.p99, self.max, self.n
        )
    }
    pub fn json(&self) -> Value {
        json!({"n": self.n, "p50_ms": r1(self.p50), "p99_ms": r1(self.p99), "max_ms": r1(self.max)})
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

pub fn max_of(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

pub fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The report: rows of text grouped in sections, and the same numbers as JSON.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<(String, String)>,
    pub json: Map<String, Value>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn section(&mut self, title: &str) {
        self.rows.push((String::new(), String::new()));
        self.rows.push((format!("== {title}"), String::new()));
    }
    pub fn row(&mut self, label: &str, value: impl Into<String>) {
        self.rows.push((label.to_string(), value.into()));
    }
    pub fn set(&mut self, path: &str, value: Value) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap_or(path);
        let mut map = &mut self.json;
        for p in parts {
            let entry = map
                .entry(p.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            map = entry.as_object_mut().expect("an object");
        }
        map.insert(last.to_string(), value);
    }
    pub fn note(&mut self, text: impl Into<String>) {
        let text = text.into();
        eprintln!("[bench] note: {text}");
        self.notes.push(text);
    }
    pub fn print(&mut self) {
        let width = self
            .rows
            .iter()
            .map(|(l, _)| l.len())
            .max()
            .unwrap_or(0)
            .min(48);
        let mut out = String::new();
        for (label, value) in &self.rows {
            if value.is_empty() {
                let _ = writeln!(out, "{label}");
            } else {
                let _ = writeln!(out, "  {label:<width$}  {value}");
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\n== Notes");
            for n in &self.notes {
                let _ = writeln!(out, "  - {n}");
            }
        }
        self.json.insert("notes".into(), json!(self.notes));
        print!("{out}");
        println!("{}", Value::Object(self.json.clone()));
    }
}

pub fn progress(text: impl AsRef<str>) {
    eprintln!("[bench] {}", text.as_ref());
}

// ---------------------------------------------------------------------------------------------
// The agent's process

/// RSS and CPU of one process from /proc.
#[derive(Clone, Copy, Debug)]
pub struct ProcSample {
    pub rss_kib: u64,
    /// The anonymous part of the RSS (heap, stacks): what the agent's state costs.
    pub anon_kib: u64,
    /// The file-backed part (the binary's and libraries' pages faulted in).
    pub file_kib: u64,
    pub hwm_kib: u64,
    pub threads: u64,
    pub cpu_s: f64,
}

pub fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let after = stat.get(stat.rfind(')')? + 1..)?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ProcSample {
        rss_kib: kib("VmRSS:")?,
        anon_kib: kib("RssAnon:").unwrap_or(0),
        file_kib: kib("RssFile:").unwrap_or(0),
        hwm_kib: kib("VmHWM:")?,
        threads: kib("Threads:").unwrap_or(0),
        cpu_s: (utime + stime) as f64 / ticks,
    })
}

pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 1..)?;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The child of `parent` running `exe` (the agent under strace).
pub fn find_child_running(parent: u32, exe: &Path) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if parent_of(pid) != Some(parent) {
            continue;
        }
        if std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            == Some(exe)
        {
            return Some(pid);
        }
    }
    None
}

/// Idle cost over a window.
#[derive(Clone, Copy, Debug)]
pub struct Idle {
    pub secs: f64,
    pub rss_avg_mib: f64,
    pub rss_max_mib: f64,
    /// Averages of the anonymous and file-backed parts of the RSS.
    pub anon_avg_mib: f64,
    pub file_avg_mib: f64,
    /// Threads at the end of the window.
    pub threads: u64,
    pub cpu_s: f64,
}

impl Idle {
    pub fn cpu_per_30s(&self) -> f64 {
        self.cpu_s * 30.0 / self.secs.max(0.001)
    }
    pub fn cpu_per_min(&self) -> f64 {
        self.cpu_s * 60.0 / self.secs.max(0.001)
    }
    pub fn text(&self) -> String {
        format!(
            "RSS avg {:.1} MiB (anon {:.1} + file {:.1}), max {:.1} MiB, {} threads;  CPU {:.3} s over {:.0} s = {:.3} CPU-s per min",
            self.rss_avg_mib,
            self.anon_avg_mib,
            self.file_avg_mib,
            self.rss_max_mib,
            self.threads,
            self.cpu_s,
            self.secs,
            self.cpu_per_min()
        )
    }
    pub fn json(&self) -> Value {
        json!({
            "secs": r1(self.secs),
            "rss_avg_mib": r1(self.rss_avg_mib),
            "rss_max_mib": r1(self.rss_max_mib),
            "rss_anon_avg_mib": r1(self.anon_avg_mib),
            "rss_file_avg_mib": r1(self.file_avg_mib),
            "threads": self.threads,
            "cpu_s": r3(self.cpu_s),
            "cpu_s_per_30s": r3(self.cpu_per_30s()),
            "cpu_s_per_min": r3(self.cpu_per_min()),
        })
    }
}

pub async fn sample_idle(pid: u32, secs: u64) -> Result<Idle> {
    let start = Instant::now();
    let first = proc_sample(pid).ok_or_else(|| anyhow!("deckhand (pid {pid}) is gone"))?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut rss = vec![mib(first.rss_kib)];
    let mut anon = vec![mib(first.anon_kib)];
    let mut file = vec![mib(first.file_kib)];
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    for _ in 0..secs {
        ticker.tick().await;
        let s =
            proc_sample(pid).ok_or_else(|| anyhow!("deckhand (pid {pid}) exited while idle"))?;
        rss.push(mib(s.rss_kib));
        anon.push(mib(s.anon_kib));
        file.push(mib(s.file_kib));
    }
    let last = proc_sample(pid).ok_or_else(|| anyhow!("deckhand (pid {pid}) is gone"))?;
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Ok(Idle {
        secs: start.elapsed().as_secs_f64(),
        rss_avg_mib: avg(&rss),
        rss_max_mib: max_of(&rss),
        anon_avg_mib: avg(&anon),
        file_avg_mib: avg(&file),
        threads: last.threads,
        cpu_s: last.cpu_s - first.cpu_s,
    })
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// What every agent of a run shares: the binary, the runtime and the log level.
#[derive(Clone, Debug)]
pub struct AgentOpts {
    pub deckhand: PathBuf,
    /// The testbed's CRI endpoint (unix://DIR/containerd.sock).
    pub endpoint: String,
    /// The agent's --v.
    pub verbosity: u8,
}

/// One running agent with its own node name, ports and directories.
pub struct Agent {
    /// What was spawned: deckhand itself, or strace running it.
    pub child: Child,
    /// The deckhand process (differs from the child's under strace).
    pub pid: u32,
    /// When the process was spawned.
    pub spawned: Instant,
    pub node: String,
    pub dir: PathBuf,
    pub healthz_port: u16,
    pub read_only_port: u16,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Agent {
    /// A new agent on two free ports, logging to `dir/deckhand.log`.
    pub fn start(
        opts: &AgentOpts,
        node: &str,
        dir: &Path,
        strace_out: Option<(&Path, &Path)>,
    ) -> Result<Agent> {
        let ports = (free_port()?, free_port()?);
        Agent::spawn(opts, node, dir, ports, "deckhand.log", strace_out)
    }

    /// An agent with the given (healthz, read-only) ports, logging to `dir/log_name`: with
    /// the same node, directory and ports as an earlier one, the same flags again.
    pub fn spawn(
        opts: &AgentOpts,
        node: &str,
        dir: &Path,
        (healthz_port, read_only_port): (u16, u16),
        log_name: &str,
        strace_out: Option<(&Path, &Path)>,
    ) -> Result<Agent> {
        for sub in ["manifests", "root", "logs", "staging"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let deckhand = std::fs::canonicalize(&opts.deckhand)
            .with_context(|| format!("the deckhand binary {}", opts.deckhand.display()))?;
        let agent_args = vec![
            format!("--container-runtime-endpoint={}", opts.endpoint),
            format!("--hostname-override={node}"),
            format!("--pod-manifest-path={}", dir.join("manifests").display()),
            format!("--root-dir={}", dir.join("root").display()),
            format!("--pod-logs-dir={}", dir.join("logs").display()),
            format!("--healthz-port={healthz_port}"),
            format!("--read-only-port={read_only_port}"),
            format!("--port={}", free_port()?),
            "--address=127.0.0.1".to_string(),
            format!("--v={}", opts.verbosity),
            // Benches run up to 240 pods; admission would refuse those past the default 110.
            "--max-pods=250".to_string(),
            // The bench images are built locally and cannot be pulled again.
            "--image-gc-high-threshold=100".to_string(),
            // Upstream's disk thresholds would put the bench node under DiskPressure on a
            // nearly full disk; these do not trigger here.
            format!("--eviction-hard={}", BENCH_EVICTION_HARD),
        ];
        let log_path = dir.join(log_name);
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = match strace_out {
            None => Command::new(&deckhand),
            Some((strace, out)) => {
                let mut c = Command::new(strace);
                c.args([
                    "-f",
                    "--seccomp-bpf",
                    "-qq",
                    "-e",
                    "trace=connect,sendto,sendmsg,sendmmsg",
                    "-o",
                ])
                .arg(out)
                .arg("--")
                .arg(&deckhand);
                c
            }
        };
        cmd.args(&agent_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env_remove("RUST_LOG");
        let spawned = Instant::now();
        let mut child = cmd.spawn().context("spawning deckhand")?;
        let pid = if strace_out.is_some() {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(pid) = find_child_running(child.id(), &deckhand) {
                    break pid;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("strace exited early with {status}");
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("deckhand did not appear under strace within 10 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            child.id()
        };
        Ok(Agent {
            child,
            pid,
            spawned,
            node: node.to_string(),
            dir: dir.to_path_buf(),
            healthz_port,
            read_only_port,
            log: log_path,
        })
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn full(&self, name: &str) -> String {
        format!("{name}-{}", self.node)
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Writes a manifest under a temporary name outside the watched directory.
    pub fn stage(&self, file: &str, text: &str) -> Result<()> {
        std::fs::write(self.dir.join("staging").join(file), text)?;
        Ok(())
    }
    /// Moves a staged manifest into the watched directory (an atomic rename).
    pub fn publish(&self, file: &str) -> Result<()> {
        std::fs::rename(
            self.dir.join("staging").join(file),
            self.manifests().join(file),
        )?;
        Ok(())
    }
    pub fn remove(&self, file: &str) -> Result<()> {
        std::fs::remove_file(self.manifests().join(file))?;
        Ok(())
    }

    /// Polls `/healthz` every 20 ms until it says `ok`; the time since the call.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<Duration> {
        self.wait_healthy_every(timeout, Duration::from_millis(20))
            .await
    }

    pub async fn wait_healthy_every(
        &mut self,
        timeout: Duration,
        period: Duration,
    ) -> Result<Duration> {
        let start = Instant::now();
        let url = format!("127.0.0.1:{}", self.healthz_port);
        loop {
            if let Some((200, body)) = http_get(&url, "/healthz").await
                && body.trim() == "ok"
            {
                return Ok(start.elapsed());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "deckhand exited early with {status}; log:\n{}",
                    self.log_text()
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "deckhand not healthy after {timeout:?}; log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(period).await;
        }
    }

    pub async fn pods(&self) -> Option<Value> {
        let (code, body) = http_get(&format!("127.0.0.1:{}", self.read_only_port), "/pods").await?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// SIGTERM, then the exit status (SIGKILL after 30 s).
    pub async fn stop(&mut self) -> (Duration, Option<ExitStatus>) {
        let start = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return (start.elapsed(), Some(status));
            }
            if start.elapsed() > Duration::from_secs(30) {
                self.kill();
                return (start.elapsed(), None);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn kill(&mut self) {
        if self.pid != self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    /// An agent left behind by a failed or timed-out phase is killed, never orphaned.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// A tiny HTTP/1.1 GET over plain TCP to 127.0.0.1: status code and body.
pub async fn http_get(host: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(host))
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
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        code,
        if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    ))
}

pub fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
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

/// Whether `/pods` shows the pod named `full` with a running container, and its UID.
pub fn pod_running_in(list: &Value, full: &str) -> Option<String> {
    list["items"].as_array()?.iter().find_map(|p| {
        let running = p["metadata"]["name"] == full
            && p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| {
                    !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object())
                });
        running.then(|| {
            p["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    })
}

/// A static pod with one busybox container `main` running `script`, 2 s of grace.
pub fn manifest(name: &str, script: &str) -> String {
    manifest_with_grace(name, script, 2)
}

pub fn manifest_with_grace(name: &str, script: &str, grace_secs: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: {grace_secs}
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["sh", "-c", "{script}"]
"#
    )
}

// ---------------------------------------------------------------------------------------------
// CRI helpers

pub fn running_filter(labels: HashMap<String, String>) -> ContainerFilter {
    ContainerFilter {
        state: Some(ContainerStateValue {
            state: ContainerState::ContainerRunning as i32,
        }),
        label_selector: labels,
        ..Default::default()
    }
}

pub fn name_selector(full: &str) -> HashMap<String, String> {
    HashMap::from([(POD_NAME.to_string(), full.to_string())])
}

/// Polls running containers until every pod in `want` has one; returns the time since `t0`
/// each was first seen (pods never seen are missing from the map).
pub async fn poll_running(
    cri: &CriClient,
    t0: Instant,
    want: &HashSet<String>,
    period: Duration,
    deadline: Duration,
) -> HashMap<String, Duration> {
    let mut seen = HashMap::new();
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while seen.len() < want.len() && t0.elapsed() < deadline {
        ticker.tick().await;
        let Ok(list) = cri
            .list_containers(Some(running_filter(HashMap::new())))
            .await
        else {
            continue;
        };
        let now = t0.elapsed();
        for c in list {
            if let Some(name) = c.labels.get(POD_NAME)
                && want.contains(name)
                && !seen.contains_key(name)
            {
                seen.insert(name.clone(), now);
            }
        }
    }
    seen
}

/// Polls sandboxes until none of the pods in `want` has one left; returns the time since `t0`
/// each pod's last sandbox was first seen gone.
pub async fn poll_sandboxes_gone(
    cri: &CriClient,
    t0: Instant,
    want: &HashSet<String>,
    deadline: Duration,
) -> HashMap<String, Duration> {
    let mut gone = HashMap::new();
    let mut ticker = tokio::time::interval(CRI_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while gone.len() < want.len() && t0.elapsed() < deadline {
        ticker.tick().await;
        let Ok(list) = cri.list_pod_sandbox(None).await else {
            continue;
        };
        let now = t0.elapsed();
        let present: HashSet<&str> = list
            .iter()
            .filter_map(|s| s.metadata.as_ref().map(|m| m.name.as_str()))
            .collect();
        for name in want {
            if !present.contains(name.as_str()) && !gone.contains_key(name) {
                gone.insert(name.clone(), now);
            }
        }
    }
    gone
}

/// Stops and removes every sandbox whose name `matches`; how many there were.
pub async fn remove_sandboxes(cri: &CriClient, matches: impl Fn(&str) -> bool) -> usize {
    let Ok(list) = cri.list_pod_sandbox(None).await else {
        return 0;
    };
    let mut removed = 0;
    for sb in list {
        let name = sb
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        if !matches(&name) {
            continue;
        }
        progress(format!(
            "removing sandbox {name} (state {}, created {})",
            sb.state, sb.created_at
        ));
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
        removed += 1;
    }
    removed
}

/// `rmdir` a pod cgroup in every v1 hierarchy (and v2); runc leaves them behind.
pub fn remove_pod_cgroup(parent: &str) {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for e in entries.flatten() {
        let _ = std::fs::remove_dir(e.path().join(parent.trim_start_matches('/')));
    }
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(parent.trim_start_matches('/')));
}

/// Opens a report with the facts every bench states first: the title, the runtime's version,
/// the machine's CPUs and load average, and the agent binary with its verbosity.
pub async fn report_header(
    report: &mut Report,
    cri: &CriClient,
    title: String,
    n: usize,
    agent: &Path,
    verbosity: u8,
) {
    let version = cri
        .version()
        .await
        .map(|v| format!("{} {}", v.runtime_name, v.runtime_version))
        .unwrap_or_else(|_| "unknown".into());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    report.rows.push((title, String::new()));
    report.row("runtime", version.clone());
    report.row("CPUs / load average at start", format!("{cpus} / {load}"));
    report.row("agent", format!("{} --v={verbosity}", agent.display()));
    report.set("n", json!(n));
    report.set("runtime", json!(version));
    report.set("cpus", json!(cpus));
    report.set("loadavg_start", json!(load));
}

/// Ends a run made under a time budget: notes why it stopped early, if it did, records `ok`,
/// prints the report, and passes the outcome on.
pub fn conclude(
    report: &mut Report,
    outcome: std::result::Result<Result<()>, tokio::time::error::Elapsed>,
    budget: Duration,
) -> Result<()> {
    let result = match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => {
            report.note(format!("the run stopped early: {err:#}"));
            Err(err)
        }
        Err(_) => {
            report.note(format!("the run exceeded its budget of {budget:?}"));
            Err(anyhow!("the run exceeded its budget of {budget:?}"))
        }
    };
    report.set("ok", json!(result.is_ok()));
    report.print();
    result
}

/// Hard eviction thresholds for bench agents: upstream's memory one, disk ones that a nearly
/// full disk does not reach.
pub const BENCH_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%";

/// The labels Deckhand puts on what it makes for pod `uid` (named `pod_name`) of `node`, and on
/// its container `container`: what the benches that drive CRI directly make look like ours.
pub fn pod_labels(
    node: &str,
    uid: &str,
    pod_name: &str,
    container: Option<&str>,
) -> HashMap<String, String> {
    use deckhand::base::cri_labels;
    let mut l = deckhand::kubelet::runtime::inspect::managed_selector(node);
    l.insert(cri_labels::POD_UID_LABEL.into(), uid.into());
    l.insert(cri_labels::POD_NAME_LABEL.into(), pod_name.into());
    l.insert(cri_labels::POD_NAMESPACE_LABEL.into(), "default".into());
    if let Some(c) = container {
        l.insert(cri_labels::CONTAINER_NAME_LABEL.into(), c.into());
    }
    l
}

/// A host-network sandbox for pod `uid` of `node` (no CNI work, so a bench measures what it
/// means to and not the network set-up), its logs under `logs`.
pub fn host_network_sandbox(
    node: &str,
    uid: &str,
    pod_name: &str,
    logs: &Path,
) -> deckhand::clients::cri::proto::PodSandboxConfig {
    use deckhand::clients::cri::proto::*;
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "bench".into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: logs.to_string_lossy().into_owned(),
        labels: pod_labels(node, uid, pod_name, None),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creating container `name` (log `<name>/0.log`) running `command` in the testbed's busybox,
/// in the sandbox `sandbox` made from `sandbox_config`, labelled `labels`.
pub fn busybox_container(
    sandbox: &str,
    sandbox_config: &deckhand::clients::cri::proto::PodSandboxConfig,
    name: &str,
    command: Vec<String>,
    labels: HashMap<String, String>,
) -> deckhand::clients::cri::proto::CreateContainerRequest {
    use deckhand::clients::cri::proto::*;
    CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config: Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
            command,
            log_path: format!("{name}/0.log"),
            labels,
            ..Default::default()
        }),
        sandbox_config: Some(sandbox_config.clone()),
    }
}

/// A pod-network sandbox for a raw-CRI floor, labelled without the managed-by labels (the
/// agent must not take it for an orphan of its own), its logs in `logs` and its cgroup under
/// `cgroup` (a QoS tier, as Deckhand would put the pod).
pub fn floor_sandbox(name: &str, uid: &str, logs: &Path, cgroup: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: logs.to_string_lossy().into_owned(),
        labels: HashMap::from([
            (POD_NAME.to_string(), name.to_string()),
            (POD_NAMESPACE.to_string(), "default".to_string()),
            (POD_UID.to_string(), uid.to_string()),
        ]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup.to_string(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
