//! Startup benchmark: how fast Deckhand turns a directory of static pods into running
//! containers, measured against the floor of raw CRI calls on the same containerd, plus what it
//! costs at rest and how quickly it follows edits and deletions.
//!
//! Run through `scripts/bench-startup [N]`, which builds, brings up a private testbed and passes
//! the runtime socket here. By hand:
//!
//! ```text
//! target/release/deps/startup-<hash> --endpoint unix://DIR/containerd.sock --pods 30 \
//!     --deckhand target/release/deckhand --work-dir .testbed/bench-run [--strace /usr/bin/strace]
//! ```
//!
//! Phases (each bounded by a deadline; the whole run by a budget):
//! 1. floor: N pods by direct CRI calls, all at once (RunPodSandbox, CreateContainer,
//!    StartContainer), then all removed at once (StopPodSandbox, RemovePodSandbox);
//! 2. Deckhand start: N manifests dropped at once, each pod's container RUNNING over CRI;
//! 3. /pods lag: a few pods added one by one, RUNNING over CRI versus `state.running` in `/pods`;
//! 4. idle: RSS and CPU of the agent at rest, with 0 and with N pods;
//! 5. edit: one manifest changed, time to the new container RUNNING, and stop-before-start;
//! 6. delete: one manifest, then all the others at once, time to the sandbox removed;
//! 7. DNS: a separate short run under strace, counting connects and sends to port 53.
//!
//! The report goes to stdout as a table, then one JSON line; progress goes to stderr.
//!
//! Two more modes serve `scripts/bench-cluster`, which compares pods from the API server with
//! the same floor in the same run:
//! - `--floor-only`: waits until the runtime holds no sandbox, then runs only the warm-up and
//!   the floor for N pods (with `--script` as the container's command and no CRI poll unless
//!   `--floor-poll-ms` asks for one), removes them, and prints the report and its JSON line;
//! - `--poll-ready URL`: polls an agent's read-only `/pods` every `--poll-ms` and prints
//!   `<unix time> <pod name>` the first time each pod's Ready condition is True, until killed.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use common::*;
use deckhand::clients::cri::proto::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, CreateContainerRequest,
    ImageSpec, LinuxContainerConfig, PodSandboxConfig, PodSandboxFilter, PodSandboxState,
    RunPodSandboxRequest,
};
use deckhand::clients::cri::{CriClient, ImageService, RuntimeService, parse_endpoint};
use serde_json::{Value, json};

const NODE: &str = "bench";
const DNS_NODE: &str = "benchdns";
const SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
const EDITED_SCRIPT: &str = "trap 'exit 0' TERM; sleep 3601 & wait";
/// How often the /pods lag phase polls both sides.
const LAG_POLL: Duration = Duration::from_millis(10);

#[derive(Parser, Debug, Clone)]
#[command(about = "Deckhand startup benchmark (see scripts/bench-startup)")]
struct Args {
    /// The testbed's CRI endpoint (unix://DIR/containerd.sock).
    #[arg(long)]
    endpoint: String,
    /// How many pods to start at once.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// The deckhand binary to measure (not needed with --floor-only).
    #[arg(long, required_unless_present_any = ["floor_only", "poll_ready"])]
    deckhand: Option<PathBuf>,
    /// A scratch directory (emptied first); the agent's log stays there afterwards.
    #[arg(long, required_unless_present = "poll_ready")]
    work_dir: Option<PathBuf>,
    /// Only the warm-up and the floor (after waiting for an empty runtime): for bench-cluster.
    #[arg(long)]
    floor_only: bool,
    /// How long --floor-only waits for an empty runtime before it runs beside what is there
    /// (seconds; 0 for scripts/bench-devices, where upstream's kubelet leaves stopped
    /// sandboxes to its GC).
    #[arg(long, default_value_t = 120)]
    floor_wait_secs: u64,
    /// The floor containers' command (`sh -c SCRIPT`).
    #[arg(long, default_value = SCRIPT)]
    script: String,
    /// The ListContainers poll that runs during the floor, as during Deckhand's batch
    /// (ms; 0: none). The default: 20 ms, or none with --floor-only.
    #[arg(long)]
    floor_poll_ms: Option<u64>,
    /// Poll this read-only /pods URL and print when each pod is first Ready (until killed).
    #[arg(long)]
    poll_ready: Option<String>,
    /// The period of --poll-ready (ms).
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// Seconds of each idle sample (0 pods, N pods).
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// Pods added one by one to measure the /pods lag.
    #[arg(long, default_value_t = 3)]
    lag_pods: usize,
    /// strace, for the DNS phase (skipped without it).
    #[arg(long)]
    strace: Option<PathBuf>,
    /// Pods in the DNS phase.
    #[arg(long, default_value_t = 5)]
    dns_pods: usize,
    /// containerd's log, for a per-call breakdown of the start batches.
    #[arg(long)]
    containerd_log: Option<PathBuf>,
    /// The agent's --v.
    #[arg(long, default_value_t = 4)]
    verbosity: u8,
    /// Instead of the phases: R rounds of the floor and R of Deckhand, alternately, at N pods,
    /// with Deckhand behind a counting gRPC proxy (CRI calls per pod start by method) and
    /// containerd's CPU measured during each batch; reports the medians and the ratio.
    #[arg(long)]
    rounds: Option<usize>,
    /// containerd's PID (for its CPU time during each batch in --rounds).
    #[arg(long)]
    containerd_pid: Option<u32>,
    /// Only what start-up and rest cost: the agent, idle with 0 pods, N pods started, idle
    /// with N pods, all deleted (no floor, /pods lag, edit or DNS phase). For memory and CPU work.
    #[arg(long)]
    idle_only: bool,
    /// Ignored: `cargo bench` passes it to harness-less benches.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(url) = &args.poll_ready {
        return runtime.block_on(poll_ready(url, Duration::from_millis(args.poll_ms)));
    }
    // One floor pod is a figure of its own (scripts/bench-devices); a batch of Deckhand's needs two.
    let least = if args.floor_only { 1 } else { 2 };
    if args.pods < least || args.pods > 1000 {
        bail!("--pods must be between {least} and 1000 (and the testbed's subnet must hold them)");
    }
    runtime.block_on(run(args))
}

/// Prints `<unix time> <name>` the first time each pod in the agent's `/pods` at `url` has its
/// Ready condition True; runs until killed.
async fn poll_ready(url: &str, period: Duration) -> Result<()> {
    use std::io::Write as _;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("--poll-ready wants an http:// URL"))?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h.to_string(), format!("/{p}")))
        .unwrap_or((rest.to_string(), "/".into()));
    let mut seen = HashSet::new();
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = std::io::stdout().lock();
    loop {
        ticker.tick().await;
        let at = unix_ns(SystemTime::now());
        let Some((200, body)) = http_get(&host, &path).await else {
            continue;
        };
        let Ok(list) = serde_json::from_str::<Value>(&body) else {
            continue;
        };
        for pod in list["items"].as_array().into_iter().flatten() {
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if let Some(name) = pod["metadata"]["name"].as_str()
                && ready
                && seen.insert(name.to_string())
            {
                writeln!(
                    out,
                    "{}.{:09} {name}",
                    at / 1_000_000_000,
                    at % 1_000_000_000
                )?;
                out.flush()?;
            }
        }
    }
}

fn agent_opts(args: &Args) -> AgentOpts {
    AgentOpts {
        deckhand: args.deckhand.clone().unwrap_or_default(),
        endpoint: args.endpoint.clone(),
        verbosity: args.verbosity,
    }
}

/// The floor's own sandboxes (the warm-up's too).
fn floor_names(name: &str) -> bool {
    name.starts_with("floor-") || name.starts_with("warmup-")
}

fn ours(name: &str) -> bool {
    name.starts_with("floor-")
        || name.starts_with("warmup-")
        || name.ends_with(&format!("-{NODE}"))
        || name.ends_with(&format!("-{DNS_NODE}"))
}

// ---------------------------------------------------------------------------------------------
// The floor: raw CRI calls

struct FloorPod {
    uid: String,
    sandbox: String,
    container: String,
    running_at: Duration,
    run: Duration,
    create: Duration,
    start: Duration,
}

fn fake_uid(i: usize) -> String {
    let nanos = unix_ns(SystemTime::now()) as u64;
    format!("{nanos:016x}{:016x}", (i as u64) ^ 0xbe_0000)
}

fn floor_cgroup(uid: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}")
}

fn floor_sandbox_config(name: &str, uid: &str, logs: &Path) -> PodSandboxConfig {
    common::floor_sandbox(
        name,
        uid,
        &logs.join(format!("default_{name}_{uid}")),
        &floor_cgroup(uid),
    )
}

fn floor_container_config(name: &str, uid: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: BUSYBOX.into(),
            user_specified_image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: "main/0.log".into(),
        labels: HashMap::from([
            (POD_NAME.to_string(), name.to_string()),
            (POD_NAMESPACE.to_string(), "default".to_string()),
            (POD_UID.to_string(), uid.to_string()),
            (CONTAINER_NAME.to_string(), "main".to_string()),
        ]),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    }
}

async fn floor_pod(
    cri: CriClient,
    name: String,
    uid: String,
    logs: PathBuf,
    script: String,
    t0: Instant,
) -> Result<FloorPod> {
    let config = floor_sandbox_config(&name, &uid, &logs);
    std::fs::create_dir_all(Path::new(&config.log_directory).join("main"))?;
    let a = Instant::now();
    let sandbox = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .pod_sandbox_id;
    let run = a.elapsed();
    let b = Instant::now();
    let container = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(floor_container_config(&name, &uid, &script)),
            sandbox_config: Some(config),
        })
        .await?;
    let create = b.elapsed();
    let c = Instant::now();
    cri.start_container(container.clone()).await?;
    Ok(FloorPod {
        uid,
        sandbox,
        container,
        running_at: t0.elapsed(),
        run,
        create,
        start: c.elapsed(),
    })
}

/// Stop then remove one sandbox; the time since `t0` it was gone.
async fn floor_remove(
    cri: CriClient,
    sandbox: String,
    t0: Instant,
) -> Result<(Duration, Duration, Duration)> {
    let a = Instant::now();
    cri.stop_pod_sandbox(sandbox.clone()).await?;
    let stop = a.elapsed();
    let b = Instant::now();
    cri.remove_pod_sandbox(sandbox).await?;
    Ok((t0.elapsed(), stop, b.elapsed()))
}

/// Wall-clock `started_at` of each container, relative to `t0_wall` (ms).
async fn started_offsets(cri: &CriClient, ids: &[String], t0_wall: SystemTime) -> Vec<f64> {
    let base = unix_ns(t0_wall);
    let mut out = Vec::new();
    for id in ids {
        if let Ok(resp) = cri.container_status(id.clone()).await
            && let Some(st) = resp.status
            && st.started_at > 0
        {
            out.push((st.started_at - base) as f64 / 1e6);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// containerd's own log: where the time of a batch goes

/// Per pod (ms): from the batch start to containerd receiving RunPodSandbox, the time each call
/// spent inside containerd, and the client's gaps between one call's return and the next call.
#[derive(Default, Debug)]
struct Breakdown {
    pods: usize,
    to_run_req: Vec<f64>,
    run: Vec<f64>,
    gap_create: Vec<f64>,
    create: Vec<f64>,
    gap_start: Vec<f64>,
    start: Vec<f64>,
}

/// The unix time (ns) of a logrus line (`time="2026-...Z" level=info msg="..."`).
fn log_time(line: &str) -> Option<i64> {
    let rest = line.split("time=\"").nth(1)?;
    let text = rest.split('"').next()?;
    let ts: jiff::Timestamp = text.parse().ok()?;
    i64::try_from(ts.as_nanosecond()).ok()
}

/// The text between `after` and the next `until` in `line`.
fn between<'a>(line: &'a str, after: &str, until: &str) -> Option<&'a str> {
    let rest = &line[line.find(after)? + after.len()..];
    Some(&rest[..rest.find(until)?])
}

fn call_breakdown(log: &str, names: &HashSet<String>, t0_ns: i64) -> Breakdown {
    // name -> (run request, run return, sandbox id)
    let mut run: HashMap<String, (Option<i64>, Option<i64>, String)> = HashMap::new();
    // sandbox id -> (create request, create return, container id)
    let mut create: HashMap<String, (Option<i64>, Option<i64>, String)> = HashMap::new();
    // container id -> (start request, start return)
    let mut start: HashMap<String, (Option<i64>, Option<i64>)> = HashMap::new();
    for line in log.lines() {
        let Some(t) = log_time(line) else { continue };
        if t < t0_ns - 1_000_000_000 {
            continue;
        }
        if let Some(name) = between(line, "RunPodSandbox for &PodSandboxMetadata{Name:", ",") {
            if !names.contains(name) {
                continue;
            }
            let e = run.entry(name.to_string()).or_default();
            if let Some(id) = between(line, "returns sandbox id \\\"", "\\\"") {
                e.1 = Some(t);
                e.2 = id.to_string();
            } else if !line.contains("returns") && !line.contains("level=error") {
                e.0.get_or_insert(t);
            }
        } else if let Some(sb) = between(line, "CreateContainer within sandbox \\\"", "\\\"") {
            let e = create.entry(sb.to_string()).or_default();
            if let Some(id) = between(line, "returns container id \\\"", "\\\"") {
                e.1 = Some(t);
                e.2 = id.to_string();
            } else if !line.contains("returns") && !line.contains("level=error") {
                e.0.get_or_insert(t);
            }
        } else if let Some(id) = between(line, "StartContainer for \\\"", "\\\"") {
            let e = start.entry(id.to_string()).or_default();
            if line.contains("returns successfully") {
                e.1 = Some(t);
            } else if !line.contains("level=error") {
                e.0.get_or_insert(t);
            }
        }
    }
    let ms_of = |ns: i64| ns as f64 / 1e6;
    let mut b = Breakdown::default();
    for (run_req, run_ret, sb) in run.values() {
        let (Some(run_req), Some(run_ret)) = (run_req, run_ret) else {
            continue;
        };
        let Some((Some(c_req), Some(c_ret), cid)) = create.get(sb) else {
            continue;
        };
        let Some((Some(s_req), Some(s_ret))) = start.get(cid) else {
            continue;
        };
        b.pods += 1;
        b.to_run_req.push(ms_of(run_req - t0_ns));
        b.run.push(ms_of(run_ret - run_req));
        b.gap_create.push(ms_of(c_req - run_ret));
        b.create.push(ms_of(c_ret - c_req));
        b.gap_start.push(ms_of(s_req - c_ret));
        b.start.push(ms_of(s_ret - s_req));
    }
    b
}

// ---------------------------------------------------------------------------------------------
// The run

struct Bench {
    args: Args,
    work_dir: PathBuf,
    cri: CriClient,
    agent: Option<Agent>,
    report: Report,
    floor_cgroups: Vec<String>,
    floor: Option<(Dist, Dist)>,
}

async fn run(args: Args) -> Result<()> {
    let endpoint = parse_endpoint(&args.endpoint)?;
    let cri = CriClient::connect(&endpoint, Duration::from_secs(120))
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    if cri.image_status(BUSYBOX.to_string()).await?.is_none() {
        bail!("{BUSYBOX} is not in the testbed (scripts/testbed up imports it)");
    }
    let work_dir = args.work_dir.clone().context("--work-dir is needed")?;
    if work_dir.exists() {
        std::fs::remove_dir_all(&work_dir)
            .with_context(|| format!("emptying {}", work_dir.display()))?;
    }
    std::fs::create_dir_all(&work_dir)?;
    let matches = if args.floor_only { floor_names } else { ours };
    let stale = remove_sandboxes(&cri, matches).await;
    if stale > 0 {
        progress(format!(
            "removed {stale} sandbox(es) left by an earlier run"
        ));
    }

    let mut bench = Bench {
        args: args.clone(),
        work_dir,
        cri,
        agent: None,
        report: Report::default(),
        floor_cgroups: Vec::new(),
        floor: None,
    };
    bench.header().await;
    let budget = Duration::from_secs(900 + 10 * args.pods as u64 + 2 * args.idle_secs);
    let outcome = if args.floor_only {
        tokio::time::timeout(budget, bench.floor_only()).await
    } else if let Some(rounds) = args.rounds {
        let budget = budget * rounds.max(1) as u32;
        tokio::time::timeout(budget, bench.rounds(rounds)).await
    } else {
        tokio::time::timeout(budget, bench.phases()).await
    };
    bench.cleanup().await;
    conclude(&mut bench.report, outcome, budget)
}

impl Bench {
    async fn header(&mut self) {
        let title = if self.args.floor_only {
            format!("Raw-CRI floor: N = {} pods", self.args.pods)
        } else {
            format!("Deckhand startup bench: N = {} pods", self.args.pods)
        };
        report_header(
            &mut self.report,
            &self.cri,
            title,
            self.args.pods,
            self.args.deckhand.as_deref().unwrap_or(Path::new("-")),
            self.args.verbosity,
        )
        .await;
    }

    /// The floor alone, for bench-cluster: once the runtime holds no sandbox (what an agent
    /// removes may still be going), the warm-up pod, then the N pods.
    async fn floor_only(&mut self) -> Result<()> {
        let waited = Instant::now();
        let deadline = Duration::from_secs(self.args.floor_wait_secs);
        loop {
            let left = self.cri.list_pod_sandbox(None).await?.len();
            if left == 0 {
                break;
            }
            if waited.elapsed() > deadline {
                self.report.note(format!(
                    "{left} sandbox(es) still in the runtime after {deadline:?}; the floor runs beside them"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.report
            .set("floor.waited_for_empty_ms", json!(r1(ms(waited.elapsed()))));
        self.warm_up().await?;
        self.floor_phase().await
    }

    async fn phases(&mut self) -> Result<()> {
        self.warm_up().await?;
        if self.args.idle_only {
            self.report
                .note("--idle-only: no floor, /pods lag, edit or DNS phase");
            self.deckhand_phases().await?;
            self.targets();
            return Ok(());
        }
        self.floor_phase().await?;
        self.deckhand_phases().await?;
        if let Some(strace) = self.args.strace.clone() {
            self.dns_phase(&strace).await?;
        } else {
            self.report.note("DNS phase skipped: no --strace");
        }
        self.targets();
        Ok(())
    }

    /// One pod created and removed before anything is timed, so the floor is not a cold start.
    async fn warm_up(&mut self) -> Result<()> {
        progress("warm-up: one pod by raw CRI calls");
        let logs = self.work_dir.join("floor-logs");
        let uid = fake_uid(9999);
        self.floor_cgroups.push(floor_cgroup(&uid));
        let pod = floor_pod(
            self.cri.clone(),
            "warmup-0".into(),
            uid,
            logs,
            self.args.script.clone(),
            Instant::now(),
        )
        .await?;
        floor_remove(self.cri.clone(), pod.sandbox, Instant::now()).await?;
        Ok(())
    }

    async fn floor_phase(&mut self) -> Result<()> {
        let n = self.args.pods;
        progress(format!("floor: {n} pods by raw CRI calls, all at once"));
        let logs = self.work_dir.join("floor-logs");
        let uids: Vec<String> = (0..n).map(fake_uid).collect();
        self.floor_cgroups
            .extend(uids.iter().map(|u| floor_cgroup(u)));
        // The same observer load as in Deckhand's batch: a ListContainers every 20 ms (none
        // for bench-cluster, whose Deckhand rounds have no CRI observer either).
        let poll = match self.args.floor_poll_ms {
            Some(ms) => Duration::from_millis(ms),
            None if self.args.floor_only => Duration::ZERO,
            None => CRI_POLL,
        };
        let observer = {
            let cri = self.cri.clone();
            tokio::spawn(async move {
                if poll.is_zero() {
                    return;
                }
                let mut ticker = tokio::time::interval(poll);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticker.tick().await;
                    let _ = cri
                        .list_containers(Some(running_filter(HashMap::new())))
                        .await;
                }
            })
        };
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, uid) in uids.iter().enumerate() {
            tasks.spawn(floor_pod(
                self.cri.clone(),
                format!("floor-{i}"),
                uid.clone(),
                logs.clone(),
                self.args.script.clone(),
                t0,
            ));
        }
        let mut pods = Vec::new();
        let mut errors = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(p)) => pods.push(p),
                Ok(Err(e)) => errors.push(format!("{e:#}")),
                Err(e) => errors.push(e.to_string()),
            }
        }
        observer.abort();
        if !errors.is_empty() {
            self.report.note(format!(
                "floor: {} of {n} pods failed; first: {}",
                errors.len(),
                errors[0]
            ));
        }
        if pods.is_empty() {
            bail!("no floor pod started");
        }
        let running: Vec<f64> = pods.iter().map(|p| ms(p.running_at)).collect();
        let run: Vec<f64> = pods.iter().map(|p| ms(p.run)).collect();
        let create: Vec<f64> = pods.iter().map(|p| ms(p.create)).collect();
        let start: Vec<f64> = pods.iter().map(|p| ms(p.start)).collect();
        let ids: Vec<String> = pods.iter().map(|p| p.container.clone()).collect();
        let started = started_offsets(&self.cri, &ids, t0_wall).await;
        let names: HashSet<String> = (0..n).map(|i| format!("floor-{i}")).collect();
        let breakdown = self.breakdown(&names, t0_wall);

        progress(format!("floor: removing {} pods, all at once", pods.len()));
        let t1 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for p in &pods {
            tasks.spawn(floor_remove(self.cri.clone(), p.sandbox.clone(), t1));
        }
        let mut removed = Vec::new();
        let mut stops = Vec::new();
        let mut removes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok((at, stop, remove))) => {
                    removed.push(ms(at));
                    stops.push(ms(stop));
                    removes.push(ms(remove));
                }
                Ok(Err(e)) => self.report.note(format!("floor removal failed: {e:#}")),
                Err(e) => self.report.note(format!("floor removal task failed: {e}")),
            }
        }
        for p in &pods {
            remove_pod_cgroup(&floor_cgroup(&p.uid));
        }
        let _ = std::fs::remove_dir_all(&logs);

        let r = &mut self.report;
        let observed = if poll.is_zero() {
            "no ListContainers poll".to_string()
        } else {
            format!(
                "a ListContainers poll every {} ms running",
                poll.as_millis()
            )
        };
        r.section(&format!(
            "1. Floor: {} pods by raw CRI calls, all at once ({observed})",
            pods.len()
        ));
        let d_running = dist(&running);
        let d_started = dist(&started);
        r.row("batch start -> StartContainer returned", d_running.text());
        r.row("batch start -> started_at (containerd)", d_started.text());
        r.row("  RunPodSandbox call", dist(&run).text());
        r.row("  CreateContainer call", dist(&create).text());
        r.row("  StartContainer call", dist(&start).text());
        r.row("batch start -> sandbox removed", dist(&removed).text());
        r.row("  StopPodSandbox call", dist(&stops).text());
        r.row("  RemovePodSandbox call", dist(&removes).text());
        r.set("floor.start", d_running.json());
        r.set("floor.started_at", d_started.json());
        r.set("floor.run_pod_sandbox", dist(&run).json());
        r.set("floor.create_container", dist(&create).json());
        r.set("floor.start_container", dist(&start).json());
        r.set("floor.remove", dist(&removed).json());
        r.set("floor.stop_pod_sandbox", dist(&stops).json());
        r.set("floor.remove_pod_sandbox", dist(&removes).json());
        r.set("floor.failed", json!(errors.len()));
        self.floor = Some((d_running, d_started));
        if let Some(b) = breakdown {
            self.breakdown_rows("floor", "floor", &b);
        }
        Ok(())
    }

    async fn deckhand_phases(&mut self) -> Result<()> {
        let n = self.args.pods;
        let dir = self.work_dir.join("agent");
        progress(format!(
            "deckhand: starting (log in {})",
            dir.join("deckhand.log").display()
        ));
        // At rest the agent's CPU is mostly its CRI calls: with --idle-only it runs behind
        // the counting proxy, which counts them by method during each idle sample.
        let mut opts = agent_opts(&self.args);
        let proxy = match (
            self.args.idle_only,
            self.args.endpoint.strip_prefix("unix://"),
        ) {
            (true, Some(upstream)) => {
                let socket = self.work_dir.join("cri-proxy.sock");
                let proxy = proxy::CountingProxy::start(Path::new(upstream), &socket).await?;
                opts.endpoint = proxy.endpoint();
                Some(proxy)
            }
            _ => None,
        };
        let agent = self.agent.insert(Agent::start(&opts, NODE, &dir, None)?);
        let healthy = agent.wait_healthy(Duration::from_secs(60)).await?;
        let pid = agent.pid;
        let binary_mib = std::fs::metadata(&agent_opts(&self.args).deckhand)
            .map(|m| m.len() as f64 / 1048576.0)
            .unwrap_or(0.0);
        self.report.section("2. Deckhand start");
        self.report
            .row("binary size", format!("{binary_mib:.2} MiB"));
        self.report
            .set("deckhand.binary_mib", json!(r3(binary_mib)));
        self.report.row(
            "process start -> /healthz ok",
            format!("{:.0} ms", ms(healthy)),
        );
        self.report
            .set("deckhand.healthy_ms", json!(r1(ms(healthy))));

        // Idle with no pods.
        tokio::time::sleep(Duration::from_secs(2)).await;
        progress(format!(
            "deckhand: idle with 0 pods for {} s",
            self.args.idle_secs
        ));
        if let Some(p) = &proxy {
            p.reset();
        }
        let idle0 = sample_idle(pid, self.args.idle_secs).await?;
        self.keep_smaps(pid, "smaps-0.txt");
        let calls0 = proxy.as_ref().map(|p| p.counts());

        let cpu_before = proc_sample(pid).map(|s| s.cpu_s);
        self.start_phase(n).await?;
        // The agent's CPU for the whole batch, from the drop until every container ran.
        if let (Some(before), Some(after)) = (cpu_before, proc_sample(pid).map(|s| s.cpu_s)) {
            let per_pod_ms = (after - before) * 1000.0 / n as f64;
            self.report.row(
                "agent CPU during the batch",
                format!("{:.2} s = {per_pod_ms:.1} ms per pod", after - before),
            );
            self.report
                .set("deckhand.start_cpu_ms_per_pod", json!(r1(per_pod_ms)));
        }
        if !self.args.idle_only {
            self.lag_phase().await?;
        }

        progress(format!(
            "deckhand: idle with {n} pods for {} s",
            self.args.idle_secs
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(p) = &proxy {
            p.reset();
        }
        let idle_n = sample_idle(pid, self.args.idle_secs).await?;
        let calls_n = proxy.as_ref().map(|p| p.counts());
        self.keep_smaps(pid, &format!("smaps-{n}.txt"));
        {
            let r = &mut self.report;
            r.section("4. Idle (after the pods settled 2 s)");
            r.row("0 pods", idle0.text());
            r.row(&format!("{n} pods"), idle_n.text());
            r.set("idle.zero_pods", idle0.json());
            r.set("idle.n_pods", idle_n.json());
            let per_min = 60.0 / self.args.idle_secs.max(1) as f64;
            for (label, key, counts) in [
                ("0 pods", "idle.zero_pods.cri_calls_per_min", calls0),
                (
                    &format!("{n} pods")[..],
                    "idle.n_pods.cri_calls_per_min",
                    calls_n,
                ),
            ] {
                let Some(counts) = counts else { continue };
                let by_method: BTreeMap<String, f64> = counts
                    .into_iter()
                    .map(|(path, c)| (proxy::method(&path).to_string(), r1(c as f64 * per_min)))
                    .collect();
                let total: f64 = by_method.values().sum();
                let text = by_method
                    .iter()
                    .map(|(m, c)| format!("{m} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                r.row(
                    &format!("CRI calls per minute at rest, {label}"),
                    format!("{total:.0} ({text})"),
                );
                r.set(key, json!(by_method));
            }
        }

        if !self.args.idle_only {
            self.edit_phase().await?;
        }
        self.delete_phases(n).await?;

        let agent = self.agent.as_mut().expect("the agent");
        let last =
            proc_sample(agent.pid).ok_or_else(|| anyhow!("deckhand exited before the end"))?;
        let (stop_took, status) = agent.stop().await;
        let left = remove_sandboxes(&self.cri, |name| name.ends_with(&format!("-{NODE}"))).await;
        let leftover_logs = std::fs::read_dir(dir.join("logs"))
            .map(|d| d.count())
            .unwrap_or(0);
        self.agent = None;
        let r = &mut self.report;
        r.section("Whole run of the agent");
        r.row(
            "peak RSS (VmHWM)",
            format!("{:.1} MiB", last.hwm_kib as f64 / 1024.0),
        );
        r.row("total CPU (utime+stime)", format!("{:.2} s", last.cpu_s));
        r.row(
            "SIGTERM -> exit",
            format!(
                "{:.0} ms ({})",
                ms(stop_took),
                status.map(|s| s.to_string()).unwrap_or("killed".into())
            ),
        );
        r.row(
            "sandboxes / log dirs left after the run",
            format!("{left} / {leftover_logs}"),
        );
        r.set(
            "deckhand.peak_rss_mib",
            json!(r1(last.hwm_kib as f64 / 1024.0)),
        );
        r.set("deckhand.cpu_total_s", json!(r3(last.cpu_s)));
        r.set("deckhand.stop_ms", json!(r1(ms(stop_took))));
        r.set("deckhand.left_sandboxes", json!(left));
        r.set("deckhand.left_log_dirs", json!(leftover_logs));
        Ok(())
    }

    /// The per-call breakdown of a batch from containerd's log, when it is readable.
    /// A copy of the agent's /proc/PID/smaps in the work directory: which mappings the RSS
    /// is made of (the binary's text, heap, thread stacks, malloc arenas).
    fn keep_smaps(&mut self, pid: u32, name: &str) {
        let to = self.work_dir.join(name);
        if let Err(e) = std::fs::copy(format!("/proc/{pid}/smaps"), &to) {
            self.report.note(format!(
                "could not keep /proc/{pid}/smaps as {}: {e}",
                to.display()
            ));
        }
    }

    fn breakdown(&mut self, names: &HashSet<String>, t0_wall: SystemTime) -> Option<Breakdown> {
        let path = self.args.containerd_log.as_ref()?;
        match std::fs::read_to_string(path) {
            Ok(text) => Some(call_breakdown(&text, names, unix_ns(t0_wall))),
            Err(e) => {
                self.report
                    .note(format!("cannot read {}: {e}", path.display()));
                None
            }
        }
    }

    fn breakdown_rows(&mut self, who: &str, key: &str, b: &Breakdown) {
        let r = &mut self.report;
        r.row(
            &format!("{who}, per containerd's log:"),
            format!("(n={})", b.pods),
        );
        let rows: [(&str, &str, &Vec<f64>); 6] = [
            (
                "batch start -> RunPodSandbox received",
                "to_run_req",
                &b.to_run_req,
            ),
            ("  RunPodSandbox inside containerd", "run", &b.run),
            (
                "  sandbox returned -> CreateContainer received",
                "gap_create",
                &b.gap_create,
            ),
            ("  CreateContainer inside containerd", "create", &b.create),
            (
                "  container created -> StartContainer received",
                "gap_start",
                &b.gap_start,
            ),
            ("  StartContainer inside containerd", "start", &b.start),
        ];
        for (label, k, v) in rows {
            let d = dist(v);
            r.row(&format!("  {label}"), d.text());
            r.set(&format!("{key}.containerd_log.{k}"), d.json());
        }
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("the agent is running")
    }

    async fn start_phase(&mut self, n: usize) -> Result<()> {
        progress(format!("deckhand: dropping {n} manifests at once"));
        let agent = self.agent();
        let names: Vec<String> = (0..n).map(|i| format!("b-{i}")).collect();
        for name in &names {
            agent.stage(&format!("{name}.yaml"), &manifest(name, SCRIPT))?;
        }
        let want: HashSet<String> = names.iter().map(|n| agent.full(n)).collect();
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        for name in &names {
            agent.publish(&format!("{name}.yaml"))?;
        }
        let drop_took = t0.elapsed();
        let deadline = Duration::from_secs(60 + 2 * n as u64);
        let seen = poll_running(&self.cri, t0, &want, CRI_POLL, deadline).await;
        let running: Vec<f64> = seen.values().map(|d| ms(*d)).collect();
        // containerd's own start times, read after the fact (no load during the phase).
        let mut ids = Vec::new();
        for c in self
            .cri
            .list_containers(Some(running_filter(HashMap::new())))
            .await
            .unwrap_or_default()
        {
            if c.labels.get(POD_NAME).is_some_and(|n| want.contains(n)) {
                ids.push(c.id);
            }
        }
        let started = started_offsets(&self.cri, &ids, t0_wall).await;

        let d = dist(&running);
        let d_started = dist(&started);
        let breakdown = self.breakdown(&want, t0_wall);
        let r = &mut self.report;
        r.row(
            &format!("drop of {n} manifests (renames) took"),
            format!("{:.1} ms", ms(drop_took)),
        );
        r.row("drop -> container RUNNING (CRI poll 20 ms)", d.text());
        r.row("drop -> started_at (containerd)", d_started.text());
        r.set("deckhand.drop_ms", json!(r3(ms(drop_took))));
        r.set("deckhand.start", d.json());
        r.set("deckhand.started_at", d_started.json());
        if let Some((floor, floor_started)) = self.floor {
            let p50 = d.p50 / floor.p50;
            let max = d.max / floor.max;
            r.row(
                "ratio Deckhand / floor (poll vs StartContainer)",
                format!("p50 {p50:.2}x   max {max:.2}x"),
            );
            let sp50 = d_started.p50 / floor_started.p50;
            let smax = d_started.max / floor_started.max;
            r.row(
                "ratio Deckhand / floor (started_at both)",
                format!("p50 {sp50:.2}x   max {smax:.2}x"),
            );
            r.set("ratio.p50", json!(r3(p50)));
            r.set("ratio.max", json!(r3(max)));
            r.set("ratio.started_at_p50", json!(r3(sp50)));
            r.set("ratio.started_at_max", json!(r3(smax)));
        }
        if let Some(b) = breakdown {
            self.breakdown_rows("Deckhand", "deckhand", &b);
        }
        if seen.len() < n {
            bail!(
                "only {} of {n} pods were running after {deadline:?}",
                seen.len()
            );
        }
        Ok(())
    }

    /// A few pods added one at a time: RUNNING over CRI, then `state.running` in /pods.
    async fn lag_phase(&mut self) -> Result<()> {
        let k = self.args.lag_pods;
        if k == 0 {
            return Ok(());
        }
        progress(format!(
            "deckhand: /pods lag over {k} pods added one by one"
        ));
        let mut lags = Vec::new();
        let mut lags_started = Vec::new();
        let mut files = Vec::new();
        for i in 0..k {
            let agent = self.agent();
            let name = format!("l-{i}");
            let file = format!("{name}.yaml");
            let full = agent.full(&name);
            agent.stage(&file, &manifest(&name, SCRIPT))?;
            let t0 = Instant::now();
            agent.publish(&file)?;
            files.push(file);
            let deadline = Duration::from_secs(60);
            let cri = self.cri.clone();
            let cri_side = async {
                let mut ticker = tokio::time::interval(LAG_POLL);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while t0.elapsed() < deadline {
                    ticker.tick().await;
                    if let Ok(list) = cri
                        .list_containers(Some(running_filter(name_selector(&full))))
                        .await
                        && let Some(c) = list.first()
                    {
                        return Some((t0.elapsed(), c.id.clone()));
                    }
                }
                None
            };
            let pods_side = async {
                let mut ticker = tokio::time::interval(LAG_POLL);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while t0.elapsed() < deadline {
                    ticker.tick().await;
                    if let Some(list) = agent.pods().await
                        && pod_running_in(&list, &full).is_some()
                    {
                        return Some((t0.elapsed(), SystemTime::now()));
                    }
                }
                None
            };
            let (cri_seen, pods_seen) = tokio::join!(cri_side, pods_side);
            let (Some((t_cri, id)), Some((t_pods, pods_wall))) = (cri_seen, pods_seen) else {
                bail!("pod {full} not running in both CRI and /pods within {deadline:?}");
            };
            lags.push(ms(t_pods) - ms(t_cri));
            if let Ok(Some(st)) = self.cri.container_status(id).await.map(|r| r.status) {
                lags_started.push((unix_ns(pods_wall) - st.started_at) as f64 / 1e6);
            }
        }
        // Remove them again (not part of the delete measurements).
        let agent = self.agent();
        let want: HashSet<String> = (0..k).map(|i| agent.full(&format!("l-{i}"))).collect();
        let t0 = Instant::now();
        for f in &files {
            agent.remove(f)?;
        }
        let gone = poll_sandboxes_gone(&self.cri, t0, &want, Duration::from_secs(60)).await;
        let gone_ms: Vec<f64> = gone.values().map(|d| ms(*d)).collect();

        let r = &mut self.report;
        r.section("3. /pods lag (pods added one at a time, both sides polled every 10 ms)");
        r.row(
            "RUNNING over CRI -> running in /pods",
            format!(
                "median {:.0} ms   max {:.0} ms   (n={})",
                median(&lags),
                max_of(&lags),
                lags.len()
            ),
        );
        r.row(
            "containerd started_at -> running in /pods",
            format!(
                "median {:.0} ms   max {:.0} ms   (n={})",
                median(&lags_started),
                max_of(&lags_started),
                lags_started.len()
            ),
        );
        r.row(
            &format!("(cleanup: {k} lag pods deleted -> removed)"),
            dist(&gone_ms).text(),
        );
        r.set("pods_lag.median_ms", json!(r1(median(&lags))));
        r.set("pods_lag.max_ms", json!(r1(max_of(&lags))));
        r.set(
            "pods_lag.samples_ms",
            json!(lags.iter().map(|x| r1(*x)).collect::<Vec<_>>()),
        );
        r.set(
            "pods_lag.from_started_at_median_ms",
            json!(r1(median(&lags_started))),
        );
        r.set(
            "pods_lag.from_started_at_max_ms",
            json!(r1(max_of(&lags_started))),
        );
        if gone.len() < k {
            bail!("the lag pods were not all removed within 60 s");
        }
        Ok(())
    }

    /// One manifest changed: the new container RUNNING, and the old one stopped before it.
    async fn edit_phase(&mut self) -> Result<()> {
        progress("deckhand: editing b-1");
        let agent = self.agent();
        let full = agent.full("b-1");
        let old = self
            .cri
            .list_containers(Some(running_filter(name_selector(&full))))
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("b-1 has no running container before the edit"))?;
        let old_uid = old.labels.get(POD_UID).cloned().unwrap_or_default();
        agent.stage("b-1.yaml", &manifest("b-1", EDITED_SCRIPT))?;
        let t0 = Instant::now();
        agent.publish("b-1.yaml")?;
        let deadline = Duration::from_secs(60);
        let mut old_finished: Option<i64> = None;
        let mut old_gone_before_exit_seen = false;
        let mut old_stopped_seen: Option<Duration> = None;
        let mut new: Option<(Duration, String, String)> = None;
        let mut ticker = tokio::time::interval(CRI_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while new.is_none() && t0.elapsed() < deadline {
            ticker.tick().await;
            let list = self
                .cri
                .list_containers(Some(ContainerFilter {
                    label_selector: name_selector(&full),
                    ..Default::default()
                }))
                .await
                .unwrap_or_default();
            let now = t0.elapsed();
            if let Some(c) = list.iter().find(|c| {
                c.state == ContainerState::ContainerRunning as i32
                    && c.labels.get(POD_UID).is_some_and(|u| *u != old_uid)
            }) {
                let uid = c.labels.get(POD_UID).cloned().unwrap_or_default();
                new = Some((now, c.id.clone(), uid));
            }
            if old_finished.is_none() && !old_gone_before_exit_seen {
                match self.cri.container_status(old.id.clone()).await {
                    Ok(resp) => {
                        if let Some(st) = resp.status
                            && st.state == ContainerState::ContainerExited as i32
                        {
                            old_finished = Some(st.finished_at);
                            old_stopped_seen = Some(t0.elapsed());
                        }
                    }
                    Err(e) if e.is_not_found() => old_gone_before_exit_seen = true,
                    Err(_) => {}
                }
            }
        }
        let Some((t_new, new_id, new_uid)) = new else {
            bail!("the edited pod b-1 had no new running container within {deadline:?}");
        };
        let new_status = self
            .cri
            .container_status(new_id)
            .await?
            .status
            .unwrap_or_default();
        let r = &mut self.report;
        r.section("5. Edit (one manifest's command changed)");
        r.row(
            "write -> new container RUNNING (CRI poll 20 ms)",
            format!("{:.0} ms", ms(t_new)),
        );
        r.row(
            "pod UID changed",
            format!("{} ({old_uid} -> {new_uid})", old_uid != new_uid),
        );
        r.set("edit.new_running_ms", json!(r1(ms(t_new))));
        r.set("edit.uid_changed", json!(old_uid != new_uid));
        match old_finished {
            Some(fin) => {
                let gap = (new_status.created_at - fin) as f64 / 1e6;
                let gap_started = (new_status.started_at - fin) as f64 / 1e6;
                let ok = fin <= new_status.created_at;
                r.row(
                    "old finished -> new created / started",
                    format!(
                        "{gap:+.0} ms / {gap_started:+.0} ms  ({})",
                        if ok { "stopped first: yes" } else { "OVERLAP" }
                    ),
                );
                if let Some(seen) = old_stopped_seen {
                    r.row(
                        "write -> old container seen exited",
                        format!("{:.0} ms", ms(seen)),
                    );
                }
                r.set("edit.old_finished_to_new_created_ms", json!(r1(gap)));
                r.set(
                    "edit.old_finished_to_new_started_ms",
                    json!(r1(gap_started)),
                );
                r.set("edit.stopped_before_start", json!(ok));
            }
            None => {
                r.row(
                    "old finished -> new created",
                    "unknown (the old container was removed before it was seen exited)",
                );
                r.set("edit.stopped_before_start", Value::Null);
            }
        }
        Ok(())
    }

    async fn delete_phases(&mut self, n: usize) -> Result<()> {
        progress("deckhand: deleting b-0");
        let agent = self.agent();
        let full = agent.full("b-0");
        let uid = self
            .cri
            .list_pod_sandbox(Some(PodSandboxFilter {
                label_selector: name_selector(&full),
                ..Default::default()
            }))
            .await?
            .first()
            .and_then(|s| s.metadata.as_ref().map(|m| m.uid.clone()))
            .ok_or_else(|| anyhow!("b-0 has no sandbox before the delete"))?;
        let log_dir = agent.logs().join(format!("default_{full}_{uid}"));
        let log_dir_existed = log_dir.exists();
        let t0 = Instant::now();
        agent.remove("b-0.yaml")?;
        let deadline = Duration::from_secs(60);
        let (mut stopped, mut removed, mut logs_gone) = (None, None, None);
        let mut ticker = tokio::time::interval(CRI_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while (removed.is_none() || logs_gone.is_none()) && t0.elapsed() < deadline {
            ticker.tick().await;
            let list = self
                .cri
                .list_pod_sandbox(Some(PodSandboxFilter {
                    label_selector: name_selector(&full),
                    ..Default::default()
                }))
                .await;
            let now = t0.elapsed();
            if let Ok(list) = list {
                if stopped.is_none()
                    && list
                        .iter()
                        .all(|s| s.state != PodSandboxState::SandboxReady as i32)
                {
                    stopped = Some(now);
                }
                if removed.is_none() && list.is_empty() {
                    removed = Some(now);
                }
            }
            if logs_gone.is_none() && !log_dir.exists() {
                logs_gone = Some(t0.elapsed());
            }
        }
        let show = |d: Option<Duration>| {
            d.map(|d| format!("{:.0} ms", ms(d)))
                .unwrap_or("not within 60 s".into())
        };
        let fmt_json = |d: Option<Duration>| d.map(|d| json!(r1(ms(d)))).unwrap_or(Value::Null);
        if !log_dir_existed {
            self.report.note(format!(
                "b-0's log dir {} did not exist before the delete",
                log_dir.display()
            ));
        }
        {
            let r = &mut self.report;
            r.section("6. Delete");
            r.row("one manifest: delete -> sandbox not ready", show(stopped));
            r.row("one manifest: delete -> sandbox removed", show(removed));
            r.row("one manifest: delete -> log dir removed", show(logs_gone));
            r.set("delete_one.stopped_ms", fmt_json(stopped));
            r.set("delete_one.removed_ms", fmt_json(removed));
            r.set("delete_one.log_dir_removed_ms", fmt_json(logs_gone));
        }

        progress(format!(
            "deckhand: deleting the other {} manifests at once",
            n - 1
        ));
        let agent = self.agent();
        let names: Vec<String> = (1..n).map(|i| format!("b-{i}")).collect();
        let want: HashSet<String> = names.iter().map(|n| agent.full(n)).collect();
        let t0 = Instant::now();
        for name in &names {
            agent.remove(&format!("{name}.yaml"))?;
        }
        let deadline = Duration::from_secs(60 + n as u64);
        let gone = poll_sandboxes_gone(&self.cri, t0, &want, deadline).await;
        let gone_ms: Vec<f64> = gone.values().map(|d| ms(*d)).collect();
        // Log dirs: wait (bounded) until none is left.
        let logs = agent.logs();
        let mut logs_left = usize::MAX;
        let mut logs_gone_at = None;
        while t0.elapsed() < deadline {
            logs_left = std::fs::read_dir(&logs).map(|d| d.count()).unwrap_or(0);
            if logs_left == 0 {
                logs_gone_at = Some(t0.elapsed());
                break;
            }
            tokio::time::sleep(CRI_POLL).await;
        }
        let d = dist(&gone_ms);
        let r = &mut self.report;
        r.row(
            &format!("{} at once: delete -> sandbox removed", n - 1),
            d.text(),
        );
        r.row(
            &format!("{} at once: delete -> all log dirs removed", n - 1),
            match logs_gone_at {
                Some(t) => format!("{:.0} ms", ms(t)),
                None => format!("{logs_left} still there after {deadline:?}"),
            },
        );
        r.set("delete_all.removed", d.json());
        r.set(
            "delete_all.log_dirs_removed_ms",
            logs_gone_at
                .map(|t| json!(r1(ms(t))))
                .unwrap_or(Value::Null),
        );
        if gone.len() < want.len() {
            bail!(
                "{} of {} sandboxes still there after {deadline:?}",
                want.len() - gone.len(),
                want.len()
            );
        }
        Ok(())
    }

    /// A separate short run under strace: connects and sends to port 53.
    async fn dns_phase(&mut self, strace: &Path) -> Result<()> {
        let k = self.args.dns_pods;
        progress(format!("dns: deckhand under strace with {k} pods"));
        let dir = self.work_dir.join("dns");
        let trace = dir.join("strace.out");
        std::fs::create_dir_all(&dir)?;
        let mut agent = Agent::start(
            &agent_opts(&self.args),
            DNS_NODE,
            &dir,
            Some((strace, &trace)),
        )?;
        let outcome = async {
            agent.wait_healthy(Duration::from_secs(60)).await?;
            let names: Vec<String> = (0..k).map(|i| format!("d-{i}")).collect();
            for name in &names {
                agent.stage(&format!("{name}.yaml"), &manifest(name, SCRIPT))?;
            }
            let want: HashSet<String> = names.iter().map(|n| agent.full(n)).collect();
            let t0 = Instant::now();
            for name in &names {
                agent.publish(&format!("{name}.yaml"))?;
            }
            let seen = poll_running(&self.cri, t0, &want, CRI_POLL, Duration::from_secs(90)).await;
            let start_max = max_of(&seen.values().map(|d| ms(*d)).collect::<Vec<_>>());
            let _ = agent.pods().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let t1 = Instant::now();
            for name in &names {
                agent.remove(&format!("{name}.yaml"))?;
            }
            poll_sandboxes_gone(&self.cri, t1, &want, Duration::from_secs(60)).await;
            anyhow::Ok((seen.len(), start_max))
        }
        .await;
        let _ = agent.stop().await;
        remove_sandboxes(&self.cri, |name| name.ends_with(&format!("-{DNS_NODE}"))).await;
        let (running, start_max) = outcome?;

        let text = std::fs::read_to_string(&trace)
            .with_context(|| format!("reading {}", trace.display()))?;
        let mut by_call: BTreeMap<String, usize> = BTreeMap::new();
        let mut inet: BTreeMap<String, usize> = BTreeMap::new();
        let mut unix_connects = 0;
        for line in text.lines() {
            let Some(call) = ["connect(", "sendto(", "sendmsg(", "sendmmsg("]
                .iter()
                .find(|c| line.contains(*c))
            else {
                continue;
            };
            if line.contains("htons(53)") {
                *by_call
                    .entry(call.trim_end_matches('(').to_string())
                    .or_default() += 1;
            }
            if call == &"connect(" {
                if line.contains("AF_UNIX") {
                    unix_connects += 1;
                } else if let Some(pos) = line.find("_port=htons(") {
                    let port: String = line[pos + 12..]
                        .chars()
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    let addr = line
                        .split("inet_addr(\"")
                        .nth(1)
                        .or_else(|| line.split("inet_pton(AF_INET6, \"").nth(1))
                        .and_then(|s| s.split('"').next())
                        .unwrap_or("?");
                    *inet.entry(format!("{addr}:{port}")).or_default() += 1;
                }
            }
        }
        let dns_connects = by_call.get("connect").copied().unwrap_or(0);
        let dns_total: usize = by_call.values().sum();
        let r = &mut self.report;
        r.section(&format!(
            "7. DNS (separate run under strace -f --seccomp-bpf, {k} pods started and deleted)"
        ));
        r.row("connect() to port 53", format!("{dns_connects}"));
        r.row(
            "all syscalls naming port 53",
            if by_call.is_empty() {
                "0".to_string()
            } else {
                by_call
                    .iter()
                    .map(|(c, n)| format!("{c} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        r.row(
            "connect() over AF_UNIX (CRI socket etc.)",
            format!("{unix_connects}"),
        );
        r.row(
            "connect() over IP (destination: count)",
            if inet.is_empty() {
                "none".to_string()
            } else {
                inet.iter()
                    .map(|(a, n)| format!("{a}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        r.row(
            "(under strace: pods running / drop -> all RUNNING)",
            format!("{running}/{k} / {start_max:.0} ms"),
        );
        r.set("dns.connects_port_53", json!(dns_connects));
        r.set("dns.syscalls_port_53", json!(dns_total));
        r.set("dns.unix_connects", json!(unix_connects));
        r.set("dns.inet_connects", json!(inet));
        Ok(())
    }

    /// The issue's targets (stated for 30 pods).
    fn targets(&mut self) {
        let j = Value::Object(self.report.json.clone());
        let num = |path: &str| -> Option<f64> {
            let mut v = &j;
            for p in path.split('.') {
                v = v.get(p)?;
            }
            v.as_f64()
        };
        let checks: Vec<(&str, &str, Option<f64>, f64, &str)> = vec![
            (
                "start_ratio_p50",
                "start ratio p50 (Deckhand / floor)",
                num("ratio.p50"),
                1.05,
                "x",
            ),
            (
                "start_ratio_max",
                "start ratio max (Deckhand / floor)",
                num("ratio.max"),
                1.05,
                "x",
            ),
            (
                "edit",
                "edit -> new RUNNING",
                num("edit.new_running_ms"),
                1500.0,
                "ms",
            ),
            (
                "delete_one",
                "delete one -> sandbox removed",
                num("delete_one.removed_ms"),
                3000.0,
                "ms",
            ),
            (
                "delete_all_max",
                "delete all -> sandbox removed (max)",
                num("delete_all.removed.max_ms"),
                3000.0,
                "ms",
            ),
            (
                "pods_lag_max",
                "RUNNING -> /pods (max)",
                num("pods_lag.max_ms"),
                100.0,
                "ms",
            ),
            (
                "idle_rss_zero",
                "idle RSS, 0 pods (max)",
                num("idle.zero_pods.rss_max_mib"),
                18.0,
                "MiB",
            ),
            (
                "idle_rss_n",
                "idle RSS, N pods (max)",
                num("idle.n_pods.rss_max_mib"),
                20.0,
                "MiB",
            ),
            (
                "idle_cpu_n",
                "idle CPU, N pods",
                num("idle.n_pods.cpu_s_per_30s"),
                0.15,
                "CPU-s/30s",
            ),
            // Issue 16's, stated for 110 pods.
            (
                "idle_rss_n_issue16",
                "idle RSS, N pods (avg; issue 16, 110 pods)",
                num("idle.n_pods.rss_avg_mib"),
                30.0,
                "MiB",
            ),
            (
                "idle_cpu_n_issue16",
                "idle CPU, N pods (issue 16, 110 pods)",
                num("idle.n_pods.cpu_s_per_min"),
                0.2,
                "CPU-s/min",
            ),
        ];
        let n = self.args.pods;
        self.report
            .section(&format!("Targets (stated for 30 pods; this run has {n})"));
        for (key, label, value, limit, unit) in checks {
            let verdict = match value {
                Some(v) if v <= limit => format!("{v:.3} {unit} <= {limit} {unit}   ok"),
                Some(v) => format!("{v:.3} {unit} >  {limit} {unit}   MISSED"),
                None => "not measured".to_string(),
            };
            self.report
                .set(&format!("targets.{key}"), json!(value.map(|v| v <= limit)));
            self.report.row(label, verdict);
        }
    }

    /// Stops the agent if a phase failed and removes whatever the run left in the runtime.
    async fn cleanup(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.stop().await;
        }
        let matches = if self.args.floor_only {
            floor_names
        } else {
            ours
        };
        let n = remove_sandboxes(&self.cri, matches).await;
        if n > 0 {
            progress(format!("cleanup: removed {n} sandbox(es)"));
        }
        for cg in &self.floor_cgroups {
            remove_pod_cgroup(cg);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// --rounds: the floor and Deckhand alternately, with CRI calls counted

/// One batch of N pods: to RUNNING (ms), and containerd's CPU time during it.
struct Round {
    running: Dist,
    containerd_cpu_s: Option<f64>,
    /// Deckhand's rounds: CRI calls per pod by method, from the drop until 2 s after the last
    /// pod ran.
    calls: Option<BTreeMap<String, f64>>,
}

fn cpu_of(pid: Option<u32>) -> Option<f64> {
    proc_sample(pid?).map(|s| s.cpu_s)
}

/// Removes the sandboxes whose names `matches`, all at once.
async fn remove_all(cri: &CriClient, matches: impl Fn(&str) -> bool) -> usize {
    let Ok(list) = cri.list_pod_sandbox(None).await else {
        return 0;
    };
    let mut tasks = tokio::task::JoinSet::new();
    for sb in list {
        let name = sb
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        if !matches(&name) {
            continue;
        }
        let cri = cri.clone();
        tasks.spawn(async move {
            let _ = cri.stop_pod_sandbox(sb.id.clone()).await;
            let _ = cri.remove_pod_sandbox(sb.id).await;
        });
    }
    let n = tasks.len();
    while tasks.join_next().await.is_some() {}
    n
}

impl Bench {
    async fn rounds(&mut self, rounds: usize) -> Result<()> {
        let n = self.args.pods;
        self.warm_up().await?;
        let proxy_socket = self.work_dir.join("cri-proxy.sock");
        let upstream = self
            .args
            .endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| anyhow!("--rounds needs a unix:// endpoint"))?
            .to_string();
        let proxy = proxy::CountingProxy::start(Path::new(&upstream), &proxy_socket).await?;
        let mut floors = Vec::new();
        let mut decks = Vec::new();
        for i in 0..rounds {
            progress(format!("round {}/{rounds}: floor, {n} pods", i + 1));
            floors.push(self.floor_round(n, i).await?);
            progress(format!("round {}/{rounds}: deckhand, {n} pods", i + 1));
            decks.push(self.deckhand_round(n, i, &proxy).await?);
        }
        let r = &mut self.report;
        r.section(&format!(
            "R. {rounds} rounds each, alternating, {n} pods at once (drop/first call -> RUNNING, CRI poll 20 ms both)"
        ));
        let mut ratios_p50 = Vec::new();
        let mut ratios_max = Vec::new();
        for (i, (f, d)) in floors.iter().zip(&decks).enumerate() {
            ratios_p50.push(d.running.p50 / f.running.p50);
            ratios_max.push(d.running.max / f.running.max);
            r.row(
                &format!("round {}: floor", i + 1),
                format!(
                    "{}   containerd CPU {}",
                    f.running.text(),
                    f.containerd_cpu_s
                        .map(|c| format!("{c:.2} s"))
                        .unwrap_or("-".into())
                ),
            );
            r.row(
                &format!("round {}: deckhand", i + 1),
                format!(
                    "{}   containerd CPU {}",
                    d.running.text(),
                    d.containerd_cpu_s
                        .map(|c| format!("{c:.2} s"))
                        .unwrap_or("-".into())
                ),
            );
        }
        let med = |v: Vec<f64>| median(&v);
        let floor_p50 = med(floors.iter().map(|f| f.running.p50).collect());
        let floor_max = med(floors.iter().map(|f| f.running.max).collect());
        let deck_p50 = med(decks.iter().map(|d| d.running.p50).collect());
        let deck_max = med(decks.iter().map(|d| d.running.max).collect());
        r.row(
            "median floor p50 / max",
            format!("{floor_p50:.0} / {floor_max:.0} ms"),
        );
        r.row(
            "median deckhand p50 / max",
            format!("{deck_p50:.0} / {deck_max:.0} ms"),
        );
        r.row(
            "median ratio of the rounds (p50 / max)",
            format!("{:.3}x / {:.3}x", median(&ratios_p50), median(&ratios_max)),
        );
        r.set("rounds.n", json!(n));
        r.set("rounds.rounds", json!(rounds));
        r.set("rounds.floor_p50_ms", json!(r1(floor_p50)));
        r.set("rounds.floor_max_ms", json!(r1(floor_max)));
        r.set("rounds.deckhand_p50_ms", json!(r1(deck_p50)));
        r.set("rounds.deckhand_max_ms", json!(r1(deck_max)));
        r.set("rounds.ratio_p50", json!(r3(median(&ratios_p50))));
        r.set("rounds.ratio_max", json!(r3(median(&ratios_max))));
        let cpu = |v: &[Round]| {
            let c: Vec<f64> = v.iter().filter_map(|x| x.containerd_cpu_s).collect();
            (!c.is_empty()).then(|| median(&c))
        };
        if let (Some(f), Some(d)) = (cpu(&floors), cpu(&decks)) {
            r.row(
                "containerd CPU-s per batch, median (floor / deckhand)",
                format!("{f:.2} / {d:.2} s"),
            );
            r.set("rounds.containerd_cpu_s_floor", json!(r3(f)));
            r.set("rounds.containerd_cpu_s_deckhand", json!(r3(d)));
        }
        // CRI calls per pod start, median over the rounds, by method.
        let mut methods: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for d in &decks {
            for (m, v) in d.calls.iter().flatten() {
                methods.entry(m.clone()).or_default().push(*v);
            }
        }
        let mut total = 0.0;
        r.row("CRI calls per pod start (deckhand, median)", "".to_string());
        for (m, v) in &methods {
            let x = median(v);
            total += x;
            r.row(&format!("  {m}"), format!("{x:.2}"));
            r.set(&format!("rounds.calls_per_pod.{m}"), json!(r3(x)));
        }
        r.row("  all methods", format!("{total:.2} (the floor: 3)"));
        r.set("rounds.calls_per_pod_total", json!(r3(total)));
        Ok(())
    }

    async fn floor_round(&mut self, n: usize, round: usize) -> Result<Round> {
        let logs = self.work_dir.join("floor-logs");
        let uids: Vec<String> = (0..n).map(|i| fake_uid(i + 1000 * (round + 1))).collect();
        self.floor_cgroups
            .extend(uids.iter().map(|u| floor_cgroup(u)));
        let observer = {
            let cri = self.cri.clone();
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(CRI_POLL);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticker.tick().await;
                    let _ = cri
                        .list_containers(Some(running_filter(HashMap::new())))
                        .await;
                }
            })
        };
        let cpu0 = cpu_of(self.args.containerd_pid);
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, uid) in uids.iter().enumerate() {
            tasks.spawn(floor_pod(
                self.cri.clone(),
                format!("floor-{i}"),
                uid.clone(),
                logs.clone(),
                self.args.script.clone(),
                t0,
            ));
        }
        let mut running = Vec::new();
        let mut failed = 0;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(p)) => running.push(ms(p.running_at)),
                _ => failed += 1,
            }
        }
        let cpu1 = cpu_of(self.args.containerd_pid);
        observer.abort();
        if failed > 0 {
            self.report
                .note(format!("floor round {}: {failed} pods failed", round + 1));
        }
        remove_all(&self.cri, |name| name.starts_with("floor-")).await;
        for uid in &uids {
            remove_pod_cgroup(&floor_cgroup(uid));
        }
        let _ = std::fs::remove_dir_all(&logs);
        Ok(Round {
            running: dist(&running),
            containerd_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
            calls: None,
        })
    }

    async fn deckhand_round(
        &mut self,
        n: usize,
        round: usize,
        proxy: &proxy::CountingProxy,
    ) -> Result<Round> {
        let dir = self.work_dir.join(format!("agent-round-{}", round + 1));
        let mut opts = agent_opts(&self.args);
        opts.endpoint = proxy.endpoint();
        let agent = self.agent.insert(Agent::start(&opts, NODE, &dir, None)?);
        agent.wait_healthy(Duration::from_secs(60)).await?;
        // Let the first relist and the subscription settle.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let agent = self.agent.as_ref().expect("the agent");
        let names: Vec<String> = (0..n).map(|i| format!("b-{i}")).collect();
        for name in &names {
            agent.stage(&format!("{name}.yaml"), &manifest(name, SCRIPT))?;
        }
        let want: HashSet<String> = names.iter().map(|n| agent.full(n)).collect();
        proxy.reset();
        let cpu0 = cpu_of(self.args.containerd_pid);
        let t0 = Instant::now();
        for name in &names {
            agent.publish(&format!("{name}.yaml"))?;
        }
        let deadline = Duration::from_secs(60 + 2 * n as u64);
        let seen = poll_running(&self.cri, t0, &want, CRI_POLL, deadline).await;
        let cpu1 = cpu_of(self.args.containerd_pid);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let counts = proxy.counts();
        let running: Vec<f64> = seen.values().map(|d| ms(*d)).collect();
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.stop().await;
        }
        remove_all(&self.cri, |name| name.ends_with(&format!("-{NODE}"))).await;
        if seen.len() < n {
            bail!(
                "round {}: only {} of {n} pods were running after {deadline:?}",
                round + 1,
                seen.len()
            );
        }
        let calls = counts
            .into_iter()
            .map(|(path, c)| (proxy::method(&path).to_string(), c as f64 / n as f64))
            .collect();
        Ok(Round {
            running: dist(&running),
            containerd_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
            calls: Some(calls),
        })
    }
}
