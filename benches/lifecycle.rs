//! Lifecycle benchmark: how long init containers hold a pod back, how quickly a restarted
//! Deckhand adopts the pods an earlier process left running (and that it touches none of them),
//! and how a graceful stop honours the grace period.
//!
//! Run through `scripts/bench-lifecycle [N]`, which builds, brings up a private testbed and
//! passes the runtime socket here. By hand:
//!
//! ```text
//! target/release/deps/lifecycle-<hash> --endpoint unix://DIR/containerd.sock --pods 50 \
//!     --deckhand target/release/deckhand --work-dir .testbed/bench-lifecycle-run
//! ```
//!
//! The agent reaches containerd through the counting proxy (`common::proxy`), which timestamps
//! its requests as they arrive; the floor's raw CRI calls go through the same proxy, so both
//! pay its local hop.
//!
//! Phases (each bounded by a deadline; the whole run by a budget):
//! 1. init containers: a pod with three `exit 0` init containers and one app container,
//!    `--init-runs` rounds, each a raw-CRI floor run and then a Deckhand run. The floor:
//!    RunPodSandbox (pod network, as Deckhand's pod), then per init container CreateContainer,
//!    StartContainer and the wait for its exit **event** (the same containerd event stream
//!    the agent's PLEG reads, so neither polls), then the app's CreateContainer and
//!    StartContainer. Deckhand: the manifest dropped in, app RUNNING seen over CRI (10 ms
//!    poll). For both, from containerd's timestamps: init-1 started -> app started, and each
//!    gap from one container finishing to the next one starting; reported as medians, the
//!    ratio Deckhand / floor and Deckhand's overhead per step (its gap less the floor's);
//!    then the crash restart: `--crash-pods` pods whose container exits 1 after 2 s, dropped
//!    at once, and the same for `--crash-pods` pods whose liveness probe starts failing after
//!    2 s. For each pod's first exit, from the first instance's finishedAt (containerd's):
//!    - **restart begun**: -> the agent's `CreateContainer` for attempt 1 reaching the proxy,
//!      i.e. the agent's own reaction, before containerd does any work for the restart;
//!    - **restart made in containerd**: -> the new instance's createdAt, which containerd sets
//!      some 50 ms into CreateContainer, so this includes containerd's own work;
//!    - for the liveness kill also -> the agent's `StopContainer` answered (containerd answers
//!      once it has handled the exit) and that answer -> `CreateContainer`;
//! 2. restart adoption: N pods running, every sandbox and container ID recorded, the agent
//!    SIGKILLed and started again with the same flags, directories and ports; new process ->
//!    `/healthz` ok, -> `/pods` shows all N running; then a watch of `--watch-secs` that no ID
//!    changed and no restart count rose; the new process's CPU and RSS;
//! 3. graceful stop: a pod whose container ignores SIGTERM, with a grace period of
//!    `--grace-secs`, deleted; delete -> container exited -> sandbox removed.
//!
//! The report goes to stdout as a table, then one JSON line; progress goes to stderr.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use common::*;
use deckhand::clients::cri::proto::{
    ContainerFilter, ContainerState, PodSandboxFilter, PodSandboxState, RunPodSandboxRequest,
};
use deckhand::clients::cri::{CriClient, ImageService, RuntimeService, parse_endpoint};
use deckhand::kubelet::pleg::feed::{EventFeed, EventStream, Happening, RuntimeFeed};
use futures::StreamExt;
use serde_json::{Value, json};

const NODE: &str = "lifecycle";
/// The app containers: exit at once on SIGTERM.
const SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// The graceful-stop pod's container: SIGTERM is ignored (by the shell and, inherited, by sleep).
const STUBBORN: &str = "trap '' TERM; sleep 3600 & wait";
const INIT_CONTAINERS: usize = 3;
/// How often the init phase lists the pod's containers.
const INIT_POLL: Duration = Duration::from_millis(10);
/// How often `/healthz` is tried after the restart.
const HEALTHZ_POLL: Duration = Duration::from_millis(5);
/// How often `/pods` is read after the restart (and /proc sampled).
const PODS_POLL: Duration = Duration::from_millis(20);
/// How often the watch after the adoption lists the runtime.
const WATCH_POLL: Duration = Duration::from_millis(100);

#[derive(Parser, Debug, Clone)]
#[command(about = "Deckhand lifecycle benchmark (see scripts/bench-lifecycle)")]
struct Args {
    /// The testbed's CRI endpoint (unix://DIR/containerd.sock).
    #[arg(long)]
    endpoint: String,
    /// How many pods the restarted agent must adopt.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// The deckhand binary to measure.
    #[arg(long)]
    deckhand: PathBuf,
    /// A scratch directory (emptied first); the agent's logs stay there afterwards.
    #[arg(long)]
    work_dir: PathBuf,
    /// How many init-container pods, one after the other.
    #[arg(long, default_value_t = 5)]
    init_runs: usize,
    /// Pods whose container crashes once, dropped at once, for exit -> restart begun.
    #[arg(long, default_value_t = 10)]
    crash_pods: usize,
    /// Seconds of watching the adopted pods for changes.
    #[arg(long, default_value_t = 10)]
    watch_secs: u64,
    /// terminationGracePeriodSeconds of the pod that ignores SIGTERM.
    #[arg(long, default_value_t = 3)]
    grace_secs: u32,
    /// The agent's --v.
    #[arg(long, default_value_t = 4)]
    verbosity: u8,
    /// Ignored: `cargo bench` passes it to harness-less benches.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.pods < 1 || args.pods > 240 {
        bail!("--pods must be between 1 and 240 (the testbed's /24 holds 250 pods)");
    }
    if args.init_runs == 0 {
        bail!("--init-runs must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

fn init_manifest(name: &str) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  initContainers:\n"
    );
    for i in 1..=INIT_CONTAINERS {
        text.push_str(&format!(
            "  - name: init-{i}\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"exit 0\"]\n"
        ));
    }
    text.push_str(&format!(
        "  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"{SCRIPT}\"]\n"
    ));
    text
}

/// A pod whose liveness probe passes for 2 s, then fails: the container is killed and
/// restarted once (the next restart waits out the back-off).
fn liveness_manifest(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; touch /tmp/alive; (sleep 2; rm /tmp/alive) & while true; do sleep 1; done"]
    livenessProbe:
      exec:
        command: ["test", "-f", "/tmp/alive"]
      periodSeconds: 1
      failureThreshold: 1
"#
    )
}

fn ours(name: &str) -> bool {
    name.ends_with(&format!("-{NODE}"))
}

fn ms_ns(ns: i64) -> f64 {
    ns as f64 / 1e6
}

fn show(d: Option<f64>) -> String {
    d.map(|v| format!("{v:.0} ms"))
        .unwrap_or_else(|| "not seen".into())
}

fn opt_json(d: Option<f64>) -> Value {
    d.map(|v| json!(r1(v))).unwrap_or(Value::Null)
}

/// The containers of one pod, by the `io.kubernetes.container.name` label.
async fn pod_containers(
    cri: &CriClient,
    full: &str,
) -> Vec<deckhand::clients::cri::proto::Container> {
    cri.list_containers(Some(ContainerFilter {
        label_selector: name_selector(full),
        ..Default::default()
    }))
    .await
    .unwrap_or_default()
}

/// What one adopted pod looked like before the kill.
#[derive(Clone, Debug, Default)]
struct PodIds {
    sandbox: String,
    containers: HashSet<String>,
    running: String,
    restart_count: i64,
}

/// restartCount of each container of each pod in a `/pods` list: pod name -> the highest.
fn restart_counts(list: &Value) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    for p in list["items"].as_array().into_iter().flatten() {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let max = p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["restartCount"].as_i64())
            .max()
            .unwrap_or(0);
        out.insert(name, max);
    }
    out
}

/// One init pod's run, from containerd's timestamps (ms).
struct InitRun {
    /// Deckhand: drop -> app seen RUNNING; floor: RunPodSandbox sent -> app StartContainer
    /// answered.
    to_running: f64,
    /// The start of the run -> init-1 started.
    first_started: f64,
    /// init-1 started -> app started.
    span: f64,
    /// init-i finished -> the next container started.
    gaps: Vec<f64>,
    /// Each init container's run, started -> finished.
    durations: Vec<f64>,
}

impl InitRun {
    /// From the `(startedAt, finishedAt, exit code, attempt)` of each container by name,
    /// `base` being the run's start (ns since the epoch).
    fn from_times(
        times: &BTreeMap<String, (i64, i64, i32, u32)>,
        base: i64,
        to_running: f64,
    ) -> Result<InitRun> {
        let order: Vec<String> = (1..=INIT_CONTAINERS)
            .map(|i| format!("init-{i}"))
            .chain(std::iter::once("app".to_string()))
            .collect();
        let missing: Vec<&String> = order
            .iter()
            .filter(|c| {
                times
                    .get(*c)
                    .is_none_or(|t| t.0 == 0 || (*c != "app" && t.1 == 0))
            })
            .collect();
        if !missing.is_empty() {
            bail!("no start or finish time for {missing:?} (were init containers removed?)");
        }
        let t = |c: &str| times[c];
        let mut gaps = Vec::new();
        let mut durations = Vec::new();
        for w in order.windows(2) {
            let (prev, next) = (t(&w[0]), t(&w[1]));
            gaps.push(ms_ns(next.0 - prev.1));
            durations.push(ms_ns(prev.1 - prev.0));
        }
        Ok(InitRun {
            to_running,
            first_started: ms_ns(t("init-1").0 - base),
            span: ms_ns(t("app").0 - t("init-1").0),
            gaps,
            durations,
        })
    }

    fn json(&self, pod: &str) -> Value {
        json!({
            "pod": pod,
            "drop_to_app_running_ms": r1(self.to_running),
            "drop_to_init1_started_ms": r1(self.first_started),
            "init1_started_to_app_started_ms": r1(self.span),
            "gaps_ms": self.gaps.iter().map(|g| r1(*g)).collect::<Vec<_>>(),
            "gap_sum_ms": r1(self.gaps.iter().sum()),
            "init_run_ms": self.durations[..INIT_CONTAINERS].iter().map(|d| r1(*d)).collect::<Vec<_>>(),
        })
    }
}

fn gap_text(gaps: &[f64]) -> String {
    gaps.iter()
        .map(|g| format!("{g:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// `(startedAt, finishedAt, exit code, attempt)` of each container (name -> (attempt, ID)).
/// containerd's CRI records an exit only once it has handled the exit event, a moment after
/// publishing it: an init container (not `app`) without its finishedAt yet is read again,
/// every 10 ms for at most 10 s.
async fn container_times(
    cri: &CriClient,
    by_name: &BTreeMap<String, (u32, String)>,
) -> Result<BTreeMap<String, (i64, i64, i32, u32)>> {
    let mut times = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    for (cname, (attempt, id)) in by_name {
        let st = loop {
            let st = cri
                .container_status(id.clone())
                .await
                .with_context(|| format!("status of {cname}"))?
                .status
                .unwrap_or_default();
            if cname == "app" || st.finished_at > 0 || Instant::now() > deadline {
                break st;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        times.insert(
            cname.clone(),
            (st.started_at, st.finished_at, st.exit_code, *attempt),
        );
    }
    Ok(times)
}

/// Waits for the exit event of container `id` on the stream (events of other objects are
/// passed over; an exit that came before the call is still in the stream).
async fn wait_exit(events: &mut EventStream, id: &str, timeout: Duration) -> Result<()> {
    let wait = async {
        while let Some(item) = events.next().await {
            let event = item.map_err(|e| anyhow!("the event stream broke: {e}"))?;
            if event.id == id && event.happening == Happening::Exited {
                return Ok(());
            }
        }
        bail!("the event stream ended")
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| anyhow!("no exit event within {timeout:?}"))?
}

struct Bench {
    args: Args,
    opts: AgentOpts,
    cri: CriClient,
    /// The counting proxy the agent reaches containerd through (see [`run`]).
    proxy: proxy::CountingProxy,
    agent: Option<Agent>,
    report: Report,
}

async fn run(args: Args) -> Result<()> {
    let endpoint = parse_endpoint(&args.endpoint)?;
    let cri = CriClient::connect(&endpoint, Duration::from_secs(120))
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    if cri.image_status(BUSYBOX.to_string()).await?.is_none() {
        bail!("{BUSYBOX} is not in the testbed (scripts/testbed up imports it)");
    }
    if args.work_dir.exists() {
        std::fs::remove_dir_all(&args.work_dir)
            .with_context(|| format!("emptying {}", args.work_dir.display()))?;
    }
    std::fs::create_dir_all(&args.work_dir)?;
    let stale = remove_sandboxes(&cri, ours).await;
    if stale > 0 {
        progress(format!(
            "removed {stale} sandbox(es) left by an earlier run"
        ));
    }
    // The agent talks to containerd through the counting proxy, which timestamps its requests:
    // the restart phases read when a restart's CreateContainer reached the runtime's socket.
    // Every agent call pays one more local hop for it (well under a millisecond).
    let proxy =
        proxy::CountingProxy::start(&endpoint.socket, &args.work_dir.join("cri-proxy.sock"))
            .await?;
    let opts = AgentOpts {
        deckhand: args.deckhand.clone(),
        endpoint: proxy.endpoint(),
        verbosity: args.verbosity,
    };
    let mut bench = Bench {
        args: args.clone(),
        opts,
        cri,
        proxy,
        agent: None,
        report: Report::default(),
    };
    bench.header().await;
    let budget = Duration::from_secs(
        600 + 6 * args.pods as u64 + 30 * args.init_runs as u64 + args.watch_secs,
    );
    let outcome = tokio::time::timeout(budget, bench.phases()).await;
    bench.cleanup().await;
    conclude(&mut bench.report, outcome, budget)
}

impl Bench {
    async fn header(&mut self) {
        report_header(
            &mut self.report,
            &self.cri,
            format!(
                "Deckhand lifecycle bench: N = {} pods to adopt",
                self.args.pods
            ),
            self.args.pods,
            &self.args.deckhand,
            self.args.verbosity,
        )
        .await;
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("the agent is running")
    }

    async fn phases(&mut self) -> Result<()> {
        let dir = self.args.work_dir.join("agent");
        progress(format!(
            "deckhand: starting (log in {})",
            dir.join("deckhand.log").display()
        ));
        let agent = self
            .agent
            .insert(Agent::start(&self.opts, NODE, &dir, None)?);
        agent
            .wait_healthy_every(Duration::from_secs(60), HEALTHZ_POLL)
            .await?;
        let healthy = agent.spawned.elapsed();
        self.report.row(
            "first start: process start -> /healthz ok",
            format!("{:.0} ms", ms(healthy)),
        );
        self.report
            .set("first_start.healthz_ms", json!(r1(ms(healthy))));

        self.init_phase().await?;
        self.crash_phase().await?;
        self.adoption_phase().await?;
        self.graceful_phase().await?;
        self.teardown_phase().await?;
        self.targets();
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 1. Init containers

    async fn init_phase(&mut self) -> Result<()> {
        let runs = self.args.init_runs;
        self.report.section(&format!(
            "1. Init containers: {INIT_CONTAINERS} x `sh -c \"exit 0\"`, then the app; {runs} rounds of the raw-CRI floor and Deckhand, alternately"
        ));
        // The floor's own client and event stream, through the same proxy as the agent (so both
        // pay its hop), on the same source the agent's PLEG uses.
        let floor_cri = CriClient::connect(
            &parse_endpoint(&self.proxy.endpoint())?,
            Duration::from_secs(60),
        )
        .await
        .context("connecting the floor's client through the proxy")?;
        let (source, mut events) = RuntimeFeed::new(floor_cri.channel())
            .subscribe()
            .await
            .context("subscribing the floor to the runtime's events")?;
        // One floor run first, not counted: the first pod-network sandbox of a fresh testbed
        // is slower than the rest (Deckhand's first start warmed containerd up already).
        self.floor_init_run(&floor_cri, &mut events, runs)
            .await
            .context("the floor's warm-up run")?;
        let mut deckhand: Vec<InitRun> = Vec::new();
        let mut floor: Vec<InitRun> = Vec::new();
        let mut runs_json = Vec::new();
        let mut floor_json = Vec::new();
        for run in 0..runs {
            let f = self
                .floor_init_run(&floor_cri, &mut events, run)
                .await
                .with_context(|| format!("floor round {run}"))?;
            self.report.row(
                &format!("round {run}: floor"),
                format!(
                    "{:>5.0} ms sandbox -> app started;  init-1 started -> app started {:>4.0} ms;  gaps {} ms",
                    f.to_running,
                    f.span,
                    gap_text(&f.gaps)
                ),
            );
            floor_json.push(f.json(&format!("finit-{run}-{NODE}")));
            floor.push(f);
            let (full, d) = self.deckhand_init_run(run).await?;
            self.report.row(
                &format!("round {run}: Deckhand"),
                format!(
                    "{:>5.0} ms drop -> app RUNNING;  init-1 started -> app started {:>4.0} ms;  gaps {} ms",
                    d.to_running,
                    d.span,
                    gap_text(&d.gaps)
                ),
            );
            runs_json.push(d.json(&full));
            deckhand.push(d);
        }
        let load = loadavg();
        let col =
            |v: &[InitRun], f: fn(&InitRun) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        let gap_col =
            |v: &[InitRun], i: usize| median(&v.iter().map(|r| r.gaps[i]).collect::<Vec<_>>());
        let (d_span, f_span) = (col(&deckhand, |r| r.span), col(&floor, |r| r.span));
        let r = &mut self.report;
        r.row(
            "median: drop -> app RUNNING (Deckhand; CRI poll 10 ms)",
            format!("{:.0} ms", col(&deckhand, |r| r.to_running)),
        );
        r.row(
            "median: RunPodSandbox sent -> app StartContainer answered (floor)",
            format!("{:.0} ms", col(&floor, |r| r.to_running)),
        );
        r.row(
            "median: init-1 started -> app started: Deckhand / floor / ratio",
            format!(
                "{d_span:.0} ms / {f_span:.0} ms / {:.2}x   (Deckhand's overhead {:.0} ms)",
                d_span / f_span,
                d_span - f_span
            ),
        );
        let mut overheads = Vec::new();
        for i in 0..INIT_CONTAINERS {
            let label = if i + 1 < INIT_CONTAINERS {
                format!(
                    "median gap: init-{} finished -> init-{} started",
                    i + 1,
                    i + 2
                )
            } else {
                format!("median gap: init-{} finished -> app started", i + 1)
            };
            let (dg, fg) = (gap_col(&deckhand, i), gap_col(&floor, i));
            let dmax = max_of(&deckhand.iter().map(|r| r.gaps[i]).collect::<Vec<_>>());
            overheads.push(r1(dg - fg));
            r.row(
                &label,
                format!(
                    "Deckhand {dg:.0} ms (max {dmax:.0}) / floor {fg:.0} ms / overhead {:.0} ms",
                    dg - fg
                ),
            );
        }
        r.row(
            "median: sum of the gaps, Deckhand / floor",
            format!(
                "{:.0} ms / {:.0} ms",
                col(&deckhand, |r| r.gaps.iter().sum()),
                col(&floor, |r| r.gaps.iter().sum())
            ),
        );
        r.row(
            "floor waits for each exit on",
            format!("{} events (the agent's PLEG source)", source.as_str()),
        );
        r.row("load average after the phase", load.clone());
        r.set("init.runs", json!(runs_json));
        r.set("init.floor_runs", json!(floor_json));
        r.set("init.loadavg", json!(load));
        r.set("init.floor_event_source", json!(source.as_str()));
        r.set(
            "init.median_drop_to_app_running_ms",
            json!(r1(col(&deckhand, |r| r.to_running))),
        );
        r.set(
            "init.median_init1_started_to_app_started_ms",
            json!(r1(d_span)),
        );
        r.set(
            "init.floor_median_init1_started_to_app_started_ms",
            json!(r1(f_span)),
        );
        r.set("init.ratio", json!(r3(d_span / f_span)));
        r.set(
            "init.median_gaps_ms",
            json!(
                (0..INIT_CONTAINERS)
                    .map(|i| r1(gap_col(&deckhand, i)))
                    .collect::<Vec<_>>()
            ),
        );
        r.set(
            "init.floor_median_gaps_ms",
            json!(
                (0..INIT_CONTAINERS)
                    .map(|i| r1(gap_col(&floor, i)))
                    .collect::<Vec<_>>()
            ),
        );
        r.set("init.overhead_per_step_ms", json!(overheads));
        Ok(())
    }

    /// One Deckhand round: the init pod dropped in, app RUNNING over CRI, containerd's
    /// timestamps read, and the pod deleted again (not timed).
    async fn deckhand_init_run(&mut self, run: usize) -> Result<(String, InitRun)> {
        let name = format!("init-{run}");
        let file = format!("{name}.yaml");
        let agent = self.agent();
        let full = agent.full(&name);
        agent.stage(&file, &init_manifest(&name))?;
        progress(format!("init: pod {full}"));
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        agent.publish(&file)?;
        let deadline = Duration::from_secs(60);
        let mut running = None;
        let mut ticker = tokio::time::interval(INIT_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while running.is_none() && t0.elapsed() < deadline {
            ticker.tick().await;
            let list = pod_containers(&self.cri, &full).await;
            let now = t0.elapsed();
            if list.iter().any(|c| {
                c.state == ContainerState::ContainerRunning as i32
                    && c.labels.get(CONTAINER_NAME).map(String::as_str) == Some("app")
            }) {
                running = Some(now);
            }
        }
        let Some(running) = running else {
            bail!("{full}: the app container was not running within {deadline:?}");
        };
        // The newest attempt of each container by name.
        let mut by_name: BTreeMap<String, (u32, String)> = BTreeMap::new();
        for c in pod_containers(&self.cri, &full).await {
            let Some(cname) = c.labels.get(CONTAINER_NAME).cloned() else {
                continue;
            };
            let attempt = c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
            if by_name.get(&cname).is_none_or(|(a, _)| attempt >= *a) {
                by_name.insert(cname, (attempt, c.id.clone()));
            }
        }
        let times = container_times(&self.cri, &by_name)
            .await
            .with_context(|| format!("statuses of {full}"))?;
        let retried: Vec<String> = times
            .iter()
            .filter(|(_, v)| v.3 > 0 || (v.2 != 0 && v.1 > 0))
            .map(|(k, v)| format!("{k} (attempt {}, exit {})", v.3, v.2))
            .collect();
        if !retried.is_empty() {
            self.report.note(format!(
                "{full}: init containers retried or failed: {}",
                retried.join(", ")
            ));
        }
        let result = InitRun::from_times(&times, unix_ns(t0_wall), ms(running))
            .with_context(|| full.clone())?;
        // Gone again before the next run (not timed as part of the phase).
        let agent = self.agent();
        let t1 = Instant::now();
        agent.remove(&file)?;
        let want = HashSet::from([full.clone()]);
        let gone = poll_sandboxes_gone(&self.cri, t1, &want, Duration::from_secs(30)).await;
        if gone.is_empty() {
            bail!("{full}: sandbox still there 30 s after its manifest was deleted");
        }
        Ok((full, result))
    }

    /// One floor round by raw CRI calls: RunPodSandbox (pod network, as Deckhand's init pods),
    /// then for each init container CreateContainer, StartContainer and the wait for its exit
    /// event, then the app's CreateContainer and StartContainer; containerd's timestamps read
    /// as for Deckhand's pod, and everything removed again (not timed).
    async fn floor_init_run(
        &mut self,
        cri: &CriClient,
        events: &mut EventStream,
        run: usize,
    ) -> Result<InitRun> {
        let name = format!("finit-{run}-{NODE}");
        let uid = format!(
            "{:032x}",
            unix_ns(SystemTime::now()) as u128 ^ 0xf1_0000 ^ run as u128
        );
        let logs = self.args.work_dir.join("floor-logs").join(&uid);
        std::fs::create_dir_all(&logs)?;
        let cgroup = format!("/kubepods/besteffort/pod{uid}");
        let config = floor_sandbox(&name, &uid, &logs, &cgroup);
        progress(format!("init: floor {name}"));
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        let sandbox = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .pod_sandbox_id;
        let mut by_name: BTreeMap<String, (u32, String)> = BTreeMap::new();
        let names: Vec<String> = (1..=INIT_CONTAINERS)
            .map(|i| format!("init-{i}"))
            .chain(std::iter::once("app".to_string()))
            .collect();
        let mut outcome = Ok(());
        for cname in &names {
            let script = if cname == "app" { SCRIPT } else { "exit 0" };
            let labels = HashMap::from([
                (POD_NAME.to_string(), name.clone()),
                (POD_NAMESPACE.to_string(), "default".to_string()),
                (POD_UID.to_string(), uid.clone()),
                (CONTAINER_NAME.to_string(), cname.clone()),
            ]);
            std::fs::create_dir_all(logs.join(cname))?;
            let request = busybox_container(
                &sandbox,
                &config,
                cname,
                vec!["sh".into(), "-c".into(), script.into()],
                labels,
            );
            let id = cri.create_container(request).await?;
            by_name.insert(cname.clone(), (0, id.clone()));
            cri.start_container(id.clone()).await?;
            if cname != "app"
                && let Err(e) = wait_exit(events, &id, Duration::from_secs(30)).await
            {
                outcome = Err(e.context(format!("{name}/{cname}")));
                break;
            }
        }
        let running = ms(t0.elapsed());
        let result = match outcome {
            Ok(()) => match container_times(cri, &by_name).await {
                Ok(times) => InitRun::from_times(&times, unix_ns(t0_wall), running),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        for (_, id) in by_name.values() {
            let _ = cri.stop_container(id.clone(), 0).await;
            let _ = cri.remove_container(id.clone()).await;
        }
        let _ = cri.stop_pod_sandbox(sandbox.clone()).await;
        let _ = cri.remove_pod_sandbox(sandbox).await;
        remove_pod_cgroup(&cgroup);
        result
    }

    // -----------------------------------------------------------------------------------------
    // 1b. Crash restart

    async fn crash_phase(&mut self) -> Result<()> {
        let k = self.args.crash_pods;
        if k == 0 {
            return Ok(());
        }
        self.report.section(&format!(
            "1b. Crash restart: {k} pods whose container exits 1 after 2 s, dropped at once"
        ));
        self.restart_phase("crash", |name| manifest(name, "sleep 2; exit 1"))
            .await?;
        self.report.section(&format!(
            "1c. Liveness kill: {k} pods whose liveness probe fails from 2 s on (period 1 s, threshold 1), dropped at once"
        ));
        self.restart_phase("liveness", liveness_manifest).await
    }

    /// `k` pods from `manifest`, dropped at once. For each pod's first exit: containerd's
    /// finishedAt of the first instance -> the restart's `CreateContainer` reaching the proxy
    /// (restart begun: the agent's reaction) and -> the second instance's createdAt (restart
    /// made: that plus containerd's own ~50 ms inside CreateContainer). For a liveness kill also
    /// when the agent's `StopContainer` was answered (containerd answers once it has handled
    /// the exit), which splits the agent's part from containerd's.
    async fn restart_phase(&mut self, what: &str, manifest: fn(&str) -> String) -> Result<()> {
        let k = self.args.crash_pods;
        progress(format!("{what}: {k} pods"));
        self.proxy.clear_calls();
        self.proxy.record(true);
        let names: Vec<String> = (0..k).map(|i| format!("{what}-{i}")).collect();
        let agent = self.agent();
        for name in &names {
            agent.stage(&format!("{name}.yaml"), &manifest(name))?;
        }
        let fulls: Vec<String> = names.iter().map(|n| agent.full(n)).collect();
        for name in &names {
            agent.publish(&format!("{name}.yaml"))?;
        }
        /// One pod's first exit and the attempt that follows it (ns since the epoch).
        struct Restart {
            first_id: String,
            finished: i64,
            created: i64,
        }
        let deadline = Instant::now() + Duration::from_secs(60 + k as u64);
        let mut seen: BTreeMap<String, Restart> = BTreeMap::new();
        while seen.len() < k && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            for full in &fulls {
                if seen.contains_key(full) {
                    continue;
                }
                let list = pod_containers(&self.cri, full).await;
                let attempt = |a: u32| {
                    list.iter()
                        .find(|c| c.metadata.as_ref().is_some_and(|m| m.attempt == a))
                };
                let (Some(first), Some(second)) = (attempt(0), attempt(1)) else {
                    continue;
                };
                let Ok(st) = self.cri.container_status(first.id.clone()).await else {
                    continue;
                };
                let finished = st.status.map(|s| s.finished_at).unwrap_or(0);
                if finished > 0 {
                    seen.insert(
                        full.clone(),
                        Restart {
                            first_id: first.id.clone(),
                            finished,
                            created: second.created_at,
                        },
                    );
                }
            }
        }
        self.proxy.record(false);
        let calls = self.proxy.calls();
        let (mut begun, mut created, mut stop_answered, mut after_stop) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (full, r) in &seen {
            created.push(ms_ns(r.created - r.finished));
            let create = calls.iter().find(|c| {
                c.method == "CreateContainer"
                    && c.pod.as_deref() == Some(full.as_str())
                    && c.attempt == Some(1)
            });
            if let Some(create) = create {
                begun.push(ms_ns(create.at_ns - r.finished));
            }
            let stop = calls.iter().find(|c| {
                c.method == "StopContainer"
                    && c.container_id.as_deref() == Some(r.first_id.as_str())
                    && c.answered_ns > 0
            });
            if let Some(stop) = stop {
                stop_answered.push(ms_ns(stop.answered_ns - r.finished));
                if let Some(create) = create {
                    after_stop.push(ms_ns(create.at_ns - stop.answered_ns));
                }
            }
        }
        let load = loadavg();
        let r = &mut self.report;
        let (d_begun, d_created) = (dist(&begun), dist(&created));
        r.row(
            "exit (finishedAt) -> CreateContainer reached containerd = restart begun",
            d_begun.text(),
        );
        r.row(
            "exit (finishedAt) -> createdAt = restart made in containerd",
            d_created.text(),
        );
        r.set(&format!("{what}.exit_to_restart_begun"), d_begun.json());
        r.set(&format!("{what}.exit_to_created"), d_created.json());
        if !stop_answered.is_empty() {
            let (d_stop, d_after) = (dist(&stop_answered), dist(&after_stop));
            r.row(
                "  exit -> the agent's StopContainer answered (containerd)",
                d_stop.text(),
            );
            r.row(
                "  StopContainer answered -> CreateContainer (the agent)",
                d_after.text(),
            );
            r.set(&format!("{what}.exit_to_stop_answered"), d_stop.json());
            r.set(&format!("{what}.stop_answered_to_create"), d_after.json());
        }
        r.row("  load average after the phase", load.clone());
        r.set(&format!("{what}.loadavg"), json!(load));
        r.set(&format!("{what}.seen"), json!(seen.len()));
        for name in &names {
            self.agent().remove(&format!("{name}.yaml"))?;
        }
        let want: HashSet<String> = fulls.iter().cloned().collect();
        poll_sandboxes_gone(&self.cri, Instant::now(), &want, Duration::from_secs(60)).await;
        if seen.len() < k {
            bail!("{what}: only {} of {k} pods restarted in time", seen.len());
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 2. Restart adoption

    /// Sandbox and container IDs of our running pods `names` (full names).
    async fn snapshot(&self, names: &HashSet<String>) -> Result<HashMap<String, PodIds>> {
        let sandboxes = self.cri.list_pod_sandbox(None).await?;
        let containers = self.cri.list_containers(None).await?;
        let mut out: HashMap<String, PodIds> = HashMap::new();
        for sb in sandboxes {
            let Some(name) = sb.metadata.as_ref().map(|m| m.name.clone()) else {
                continue;
            };
            if !names.contains(&name) {
                continue;
            }
            if sb.state != PodSandboxState::SandboxReady as i32 {
                continue;
            }
            let e = out.entry(name.clone()).or_default();
            if !e.sandbox.is_empty() {
                bail!("{name} has two ready sandboxes");
            }
            e.sandbox = sb.id;
        }
        for c in containers {
            let Some(name) = c.labels.get(POD_NAME) else {
                continue;
            };
            let Some(e) = out.get_mut(name) else { continue };
            if c.pod_sandbox_id != e.sandbox {
                continue;
            }
            e.containers.insert(c.id.clone());
            if c.state == ContainerState::ContainerRunning as i32 {
                e.running = c.id;
            }
        }
        Ok(out)
    }

    async fn adoption_phase(&mut self) -> Result<()> {
        let n = self.args.pods;
        progress(format!("adoption: dropping {n} manifests at once"));
        let agent = self.agent();
        let names: Vec<String> = (0..n).map(|i| format!("a-{i}")).collect();
        for name in &names {
            agent.stage(&format!("{name}.yaml"), &manifest(name, SCRIPT))?;
        }
        let want: HashSet<String> = names.iter().map(|n| agent.full(n)).collect();
        let t0 = Instant::now();
        for name in &names {
            agent.publish(&format!("{name}.yaml"))?;
        }
        let deadline = Duration::from_secs(60 + 2 * n as u64);
        let seen = poll_running(&self.cri, t0, &want, CRI_POLL, deadline).await;
        if seen.len() < n {
            bail!(
                "only {} of {n} pods were running after {deadline:?}",
                seen.len()
            );
        }
        let all_running = max_of(&seen.values().map(|d| ms(*d)).collect::<Vec<_>>());
        // The first agent must know them all as running before it is killed.
        let t1 = Instant::now();
        loop {
            if let Some(list) = agent.pods().await
                && want.iter().all(|f| pod_running_in(&list, f).is_some())
            {
                break;
            }
            if t1.elapsed() > Duration::from_secs(60) {
                bail!("the first agent's /pods did not show all {n} pods running within 60 s");
            }
            tokio::time::sleep(PODS_POLL).await;
        }
        // Let it settle: a relist or two, no work in flight.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = self.snapshot(&want).await?;
        let incomplete: Vec<&String> = want
            .iter()
            .filter(|f| before.get(*f).is_none_or(|p| p.running.is_empty()))
            .collect();
        if !incomplete.is_empty() {
            bail!(
                "{} pod(s) without a ready sandbox and a running container before the kill",
                incomplete.len()
            );
        }
        let counts_before = agent
            .pods()
            .await
            .map(|l| restart_counts(&l))
            .unwrap_or_default();
        let mut before = before;
        for (name, p) in before.iter_mut() {
            p.restart_count = counts_before.get(name).copied().unwrap_or(0);
        }
        let first_sample = proc_sample(agent.pid);

        progress("adoption: SIGKILL deckhand, start it again with the same flags");
        let mut old = self.agent.take().expect("the agent");
        let ports = (old.healthz_port, old.read_only_port);
        let dir = old.dir.clone();
        let old_pid = old.pid;
        old.kill();
        drop(old);
        let agent = self.agent.insert(Agent::spawn(
            &self.opts,
            NODE,
            &dir,
            ports,
            "deckhand-restart.log",
            None,
        )?);
        let spawned = agent.spawned;
        let pid = agent.pid;
        let healthz_url = format!("127.0.0.1:{}", agent.healthz_port);
        let deadline = Duration::from_secs(60);
        let mut healthy_at: Option<Duration> = None;
        let mut adopted_at: Option<(Duration, Option<ProcSample>)> = None;
        let mut rss_max_kib = 0u64;
        let mut last_pods_poll: Option<Instant> = None;
        let mut pods_polls = 0usize;
        let mut partial_best = 0usize;
        while (healthy_at.is_none() || adopted_at.is_none()) && spawned.elapsed() < deadline {
            if healthy_at.is_none()
                && let Some((200, body)) = http_get(&healthz_url, "/healthz").await
                && body.trim() == "ok"
            {
                healthy_at = Some(spawned.elapsed());
            }
            if adopted_at.is_none() && last_pods_poll.is_none_or(|t| t.elapsed() >= PODS_POLL) {
                last_pods_poll = Some(Instant::now());
                pods_polls += 1;
                if let Some(list) = agent.pods().await {
                    let now = spawned.elapsed();
                    let k = want
                        .iter()
                        .filter(|f| pod_running_in(&list, f).is_some())
                        .count();
                    partial_best = partial_best.max(k);
                    if k == want.len() {
                        adopted_at = Some((now, proc_sample(pid)));
                    }
                }
            }
            if let Some(s) = proc_sample(pid) {
                rss_max_kib = rss_max_kib.max(s.rss_kib);
            }
            if let Ok(Some(status)) = agent.child.try_wait() {
                bail!(
                    "the restarted deckhand exited with {status}; log:\n{}",
                    agent.log_text()
                );
            }
            tokio::time::sleep(HEALTHZ_POLL).await;
        }
        let Some(healthy_at) = healthy_at else {
            bail!("the restarted deckhand was not healthy within {deadline:?}");
        };
        let Some((adopted_at, adopted_sample)) = adopted_at else {
            bail!(
                "the restarted deckhand's /pods showed {partial_best} of {n} pods running after {deadline:?}"
            );
        };

        // Watch: IDs and restart counts against the snapshot before the kill.
        let watch = Duration::from_secs(self.args.watch_secs);
        progress(format!("adoption: watching {n} pods for {watch:?}"));
        let w0 = Instant::now();
        let mut new_sandboxes: HashSet<String> = HashSet::new();
        let mut new_containers: HashSet<String> = HashSet::new();
        let mut not_running: HashSet<String> = HashSet::new();
        let mut sandboxes_gone: HashSet<String> = HashSet::new();
        let mut count_rises: HashMap<String, i64> = HashMap::new();
        let mut list_errors = 0usize;
        let mut last_counts = Instant::now() - Duration::from_secs(1);
        let mut ticker = tokio::time::interval(WATCH_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let all_sandboxes: HashSet<&String> = before.values().map(|p| &p.sandbox).collect();
        let all_containers: HashSet<&String> =
            before.values().flat_map(|p| p.containers.iter()).collect();
        while w0.elapsed() < watch {
            ticker.tick().await;
            let (Ok(sandboxes), Ok(containers)) = (
                self.cri.list_pod_sandbox(None).await,
                self.cri.list_containers(None).await,
            ) else {
                list_errors += 1;
                continue;
            };
            let mut ready: HashSet<String> = HashSet::new();
            for sb in &sandboxes {
                let Some(name) = sb.metadata.as_ref().map(|m| m.name.as_str()) else {
                    continue;
                };
                if !want.contains(name) {
                    continue;
                }
                if !all_sandboxes.contains(&sb.id) {
                    new_sandboxes.insert(sb.id.clone());
                }
                if sb.state == PodSandboxState::SandboxReady as i32 {
                    ready.insert(sb.id.clone());
                }
            }
            for p in before.values() {
                if !ready.contains(&p.sandbox) {
                    sandboxes_gone.insert(p.sandbox.clone());
                }
            }
            let mut running: HashSet<&String> = HashSet::new();
            for c in &containers {
                if !c.labels.get(POD_NAME).is_some_and(|n| want.contains(n)) {
                    continue;
                }
                if !all_containers.contains(&c.id) {
                    new_containers.insert(c.id.clone());
                }
                if c.state == ContainerState::ContainerRunning as i32 {
                    running.insert(&c.id);
                }
            }
            for p in before.values() {
                if !running.contains(&p.running) {
                    not_running.insert(p.running.clone());
                }
            }
            if last_counts.elapsed() >= Duration::from_millis(500) {
                last_counts = Instant::now();
                if let Some(list) = self.agent().pods().await {
                    let counts = restart_counts(&list);
                    for (name, p) in &before {
                        if let Some(c) = counts.get(name)
                            && *c > p.restart_count
                        {
                            count_rises.insert(name.clone(), *c - p.restart_count);
                        }
                    }
                }
            }
        }
        let after_watch = proc_sample(pid);
        // One last look with a fresh snapshot: every pod still has its old IDs.
        let after = self.snapshot(&want).await?;
        let mut changed_pods: HashSet<String> = HashSet::new();
        for (name, p) in &before {
            match after.get(name) {
                Some(a) if a.sandbox == p.sandbox && a.running == p.running => {}
                _ => {
                    changed_pods.insert(name.clone());
                }
            }
        }
        let pods_with =
            |ids: &HashSet<String>, pick: &dyn Fn(&PodIds) -> Vec<String>| -> HashSet<String> {
                before
                    .iter()
                    .filter(|(_, p)| pick(p).iter().any(|id| ids.contains(id)))
                    .map(|(n, _)| n.clone())
                    .collect()
            };
        let restarted = pods_with(&not_running, &|p| vec![p.running.clone()]);
        let mut restart_pods: HashSet<String> = restarted;
        restart_pods.extend(count_rises.keys().cloned());
        restart_pods.extend(changed_pods.iter().cloned());
        // New containers belong to which pods?
        let containers_now = self.cri.list_containers(None).await.unwrap_or_default();
        for c in &containers_now {
            if new_containers.contains(&c.id)
                && let Some(n) = c.labels.get(POD_NAME)
            {
                restart_pods.insert(n.clone());
            }
        }
        let restarts_caused = restart_pods.len();

        let r = &mut self.report;
        r.section(&format!(
            "2. Restart adoption: {n} pods running, deckhand SIGKILLed and started again"
        ));
        r.row(
            &format!("setup: drop of {n} manifests -> all RUNNING"),
            format!("{all_running:.0} ms (first agent, pid {old_pid})"),
        );
        if let Some(s) = first_sample {
            r.row(
                "first agent before the kill",
                format!(
                    "RSS {:.1} MiB, peak {:.1} MiB, CPU {:.2} s",
                    mib(s.rss_kib),
                    mib(s.hwm_kib),
                    s.cpu_s
                ),
            );
            r.set("adoption.first_agent_rss_mib", json!(r1(mib(s.rss_kib))));
            r.set("adoption.first_agent_cpu_s", json!(r3(s.cpu_s)));
        }
        r.row(
            "new process start -> /healthz ok (poll 5 ms)",
            format!("{:.0} ms", ms(healthy_at)),
        );
        r.row(
            &format!("new process start -> /pods shows all {n} running"),
            format!(
                "{:.0} ms   (/pods read every 20 ms, {pods_polls} reads)",
                ms(adopted_at)
            ),
        );
        if let Some(s) = adopted_sample {
            r.row(
                "at adoption: CPU (utime+stime) / RSS / peak",
                format!(
                    "{:.3} s / {:.1} MiB / {:.1} MiB",
                    s.cpu_s,
                    mib(s.rss_kib),
                    mib(s.hwm_kib)
                ),
            );
            r.set("adoption.cpu_s", json!(r3(s.cpu_s)));
            r.set("adoption.rss_mib", json!(r1(mib(s.rss_kib))));
            r.set("adoption.peak_rss_mib", json!(r1(mib(s.hwm_kib))));
        }
        r.row(
            "RSS max sampled until adoption",
            format!("{:.1} MiB", mib(rss_max_kib)),
        );
        if let (Some(a), Some(b)) = (adopted_sample, after_watch) {
            r.row(
                &format!(
                    "during the {}-s watch: CPU / RSS at the end",
                    self.args.watch_secs
                ),
                format!("{:.3} s / {:.1} MiB", b.cpu_s - a.cpu_s, mib(b.rss_kib)),
            );
            r.set("adoption.watch_cpu_s", json!(r3(b.cpu_s - a.cpu_s)));
            r.set("adoption.watch_end_rss_mib", json!(r1(mib(b.rss_kib))));
        }
        r.row(
            &format!(
                "watch ({} s, CRI every 100 ms, /pods every 500 ms)",
                self.args.watch_secs
            ),
            format!("{} CRI list rounds failed", list_errors),
        );
        r.row("  restarts caused (pods)", format!("{restarts_caused}"));
        r.row("  new sandboxes", format!("{}", new_sandboxes.len()));
        r.row("  new containers", format!("{}", new_containers.len()));
        r.row(
            "  recorded containers seen not running",
            format!("{}", not_running.len()),
        );
        r.row(
            "  recorded sandboxes seen not ready / gone",
            format!("{}", sandboxes_gone.len()),
        );
        r.row(
            "  restartCount rose in /pods (pods)",
            format!("{}", count_rises.len()),
        );
        r.set("adoption.pods", json!(n));
        r.set("adoption.setup_all_running_ms", json!(r1(all_running)));
        r.set("adoption.healthz_ms", json!(r1(ms(healthy_at))));
        r.set("adoption.all_running_in_pods_ms", json!(r1(ms(adopted_at))));
        r.set("adoption.rss_max_sampled_mib", json!(r1(mib(rss_max_kib))));
        r.set("adoption.watch_secs", json!(self.args.watch_secs));
        r.set("adoption.restarts_caused", json!(restarts_caused));
        r.set("adoption.new_sandboxes", json!(new_sandboxes.len()));
        r.set("adoption.new_containers", json!(new_containers.len()));
        r.set("adoption.containers_not_running", json!(not_running.len()));
        r.set("adoption.sandboxes_not_ready", json!(sandboxes_gone.len()));
        r.set("adoption.restart_count_rises", json!(count_rises.len()));
        r.set("adoption.list_errors", json!(list_errors));
        if !restart_pods.is_empty() {
            let mut v: Vec<&String> = restart_pods.iter().collect();
            v.sort();
            r.note(format!("pods touched by the restarted agent: {v:?}"));
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 3. Graceful stop

    async fn graceful_phase(&mut self) -> Result<()> {
        let grace = self.args.grace_secs;
        let agent = self.agent();
        let name = "g-0";
        let file = "g-0.yaml";
        let full = agent.full(name);
        progress(format!("graceful: {full} ignores SIGTERM, grace {grace} s"));
        agent.stage(file, &manifest_with_grace(name, STUBBORN, grace))?;
        let t0 = Instant::now();
        agent.publish(file)?;
        let want = HashSet::from([full.clone()]);
        let seen = poll_running(&self.cri, t0, &want, CRI_POLL, Duration::from_secs(60)).await;
        if seen.is_empty() {
            bail!("{full} was not running within 60 s");
        }
        let t1 = Instant::now();
        loop {
            if let Some(list) = agent.pods().await
                && pod_running_in(&list, &full).is_some()
            {
                break;
            }
            if t1.elapsed() > Duration::from_secs(30) {
                bail!("{full} not running in /pods within 30 s");
            }
            tokio::time::sleep(PODS_POLL).await;
        }
        // A moment for the shell to set its trap.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let container = pod_containers(&self.cri, &full)
            .await
            .into_iter()
            .find(|c| c.state == ContainerState::ContainerRunning as i32)
            .ok_or_else(|| anyhow!("{full} has no running container"))?;

        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        agent.remove(file)?;
        let deadline = Duration::from_secs(30 + grace as u64);
        let (mut exited_seen, mut finished_at, mut exit_code) = (None, None, None);
        let (mut not_ready, mut removed) = (None, None);
        let mut ticker = tokio::time::interval(CRI_POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while removed.is_none() && t0.elapsed() < deadline {
            ticker.tick().await;
            if exited_seen.is_none() {
                match self.cri.container_status(container.id.clone()).await {
                    Ok(resp) => {
                        if let Some(st) = resp.status
                            && st.state == ContainerState::ContainerExited as i32
                        {
                            exited_seen = Some(ms(t0.elapsed()));
                            finished_at = Some(ms_ns(st.finished_at - unix_ns(t0_wall)));
                            exit_code = Some(st.exit_code);
                        }
                    }
                    Err(e) if e.is_not_found() => exited_seen = Some(ms(t0.elapsed())),
                    Err(_) => {}
                }
            }
            if let Ok(list) = self
                .cri
                .list_pod_sandbox(Some(PodSandboxFilter {
                    label_selector: name_selector(&full),
                    ..Default::default()
                }))
                .await
            {
                let now = ms(t0.elapsed());
                if not_ready.is_none()
                    && list
                        .iter()
                        .all(|s| s.state != PodSandboxState::SandboxReady as i32)
                {
                    not_ready = Some(now);
                }
                if list.is_empty() {
                    removed = Some(now);
                }
            }
        }
        let grace_ms = grace as f64 * 1000.0;
        let r = &mut self.report;
        r.section(&format!(
            "3. Graceful stop: one pod ignoring SIGTERM, terminationGracePeriodSeconds: {grace}"
        ));
        r.row(
            "delete -> container finished_at (containerd)",
            show(finished_at),
        );
        r.row(
            "delete -> container seen exited (CRI poll 20 ms)",
            show(exited_seen),
        );
        r.row(
            "container exit code",
            exit_code.map(|c| c.to_string()).unwrap_or("unknown".into()),
        );
        r.row("delete -> sandbox not ready", show(not_ready));
        r.row("delete -> sandbox removed", show(removed));
        r.row(
            &format!("sandbox removed - {grace} s of grace"),
            show(removed.map(|v| v - grace_ms)),
        );
        r.set("graceful.grace_s", json!(grace));
        r.set("graceful.container_finished_ms", opt_json(finished_at));
        r.set("graceful.container_exited_seen_ms", opt_json(exited_seen));
        r.set("graceful.exit_code", json!(exit_code));
        r.set("graceful.sandbox_not_ready_ms", opt_json(not_ready));
        r.set("graceful.sandbox_removed_ms", opt_json(removed));
        r.set(
            "graceful.removal_after_grace_ms",
            opt_json(removed.map(|v| v - grace_ms)),
        );
        if removed.is_none() {
            bail!("{full}'s sandbox was still there {deadline:?} after the delete");
        }
        Ok(())
    }

    /// Every manifest deleted, the agent stopped with SIGTERM, what was left counted.
    async fn teardown_phase(&mut self) -> Result<()> {
        let n = self.args.pods;
        progress(format!("teardown: deleting the {n} adopted pods"));
        let agent = self.agent();
        let want: HashSet<String> = (0..n).map(|i| agent.full(&format!("a-{i}"))).collect();
        let t0 = Instant::now();
        for i in 0..n {
            agent.remove(&format!("a-{i}.yaml"))?;
        }
        let deadline = Duration::from_secs(60 + n as u64);
        let gone = poll_sandboxes_gone(&self.cri, t0, &want, deadline).await;
        let gone_ms: Vec<f64> = gone.values().map(|d| ms(*d)).collect();
        let agent = self.agent.as_mut().expect("the agent");
        let last =
            proc_sample(agent.pid).ok_or_else(|| anyhow!("deckhand exited before the end"))?;
        let (stop_took, status) = agent.stop().await;
        self.agent = None;
        let left = remove_sandboxes(&self.cri, ours).await;
        let r = &mut self.report;
        r.section("Teardown (restarted agent)");
        r.row(
            &format!("{n} adopted pods deleted at once -> removed"),
            dist(&gone_ms).text(),
        );
        r.row(
            "restarted agent: peak RSS / total CPU",
            format!("{:.1} MiB / {:.2} s", mib(last.hwm_kib), last.cpu_s),
        );
        r.row(
            "SIGTERM -> exit",
            format!(
                "{:.0} ms ({})",
                ms(stop_took),
                status.map(|s| s.to_string()).unwrap_or("killed".into())
            ),
        );
        r.row("sandboxes left after the run", format!("{left}"));
        r.set("teardown.removed", dist(&gone_ms).json());
        r.set(
            "teardown.restarted_peak_rss_mib",
            json!(r1(mib(last.hwm_kib))),
        );
        r.set("teardown.restarted_cpu_total_s", json!(r3(last.cpu_s)));
        r.set("teardown.stop_ms", json!(r1(ms(stop_took))));
        r.set("teardown.left_sandboxes", json!(left));
        if gone.len() < want.len() {
            bail!(
                "{} of {n} sandboxes still there after {deadline:?}",
                want.len() - gone.len()
            );
        }
        Ok(())
    }

    fn targets(&mut self) {
        let j = Value::Object(self.report.json.clone());
        let num = |path: &str| -> Option<f64> {
            let mut v = &j;
            for p in path.split('.') {
                v = v.get(p)?;
            }
            v.as_f64()
        };
        let grace_ms = self.args.grace_secs as f64 * 1000.0;
        // (key, label, value, ok when <= limit (or >= when `at_least`), unit)
        type Check<'a> = (&'a str, &'a str, Option<f64>, f64, bool, &'a str);
        let checks: Vec<Check> = vec![
            (
                "init_all_three",
                "init-1 started -> app started (median; issue 16)",
                num("init.median_init1_started_to_app_started_ms"),
                150.0,
                false,
                "ms",
            ),
            (
                "crash_restart",
                "crash: exit -> restart begun (p50; issue 16)",
                num("crash.exit_to_restart_begun.p50_ms"),
                50.0,
                false,
                "ms",
            ),
            (
                "liveness_restart",
                "liveness kill: exit -> restart begun (p50; issue 16)",
                num("liveness.exit_to_restart_begun.p50_ms"),
                50.0,
                false,
                "ms",
            ),
            (
                "restart_healthz",
                "restart -> /healthz ok",
                num("adoption.healthz_ms"),
                300.0,
                false,
                "ms",
            ),
            (
                "adoption",
                "restart -> all pods running in /pods",
                num("adoption.all_running_in_pods_ms"),
                1000.0,
                false,
                "ms",
            ),
            (
                "restarts_caused",
                "restarts caused",
                num("adoption.restarts_caused"),
                0.0,
                false,
                "",
            ),
            (
                "new_sandboxes",
                "new sandboxes",
                num("adoption.new_sandboxes"),
                0.0,
                false,
                "",
            ),
            (
                "grace_honoured",
                "delete -> container finished (grace honoured)",
                num("graceful.container_finished_ms"),
                grace_ms,
                true,
                "ms",
            ),
            (
                "graceful_removal",
                "delete -> sandbox removed (grace + 1 s)",
                num("graceful.sandbox_removed_ms"),
                grace_ms + 1000.0,
                false,
                "ms",
            ),
        ];
        let n = self.args.pods;
        self.report.section(&format!(
            "Targets (adoption stated for 50 pods; this run has {n})"
        ));
        for (key, label, value, limit, at_least, unit) in checks {
            let ok = value.map(|v| if at_least { v >= limit } else { v <= limit });
            let (op_ok, op_bad) = if at_least { (">=", "< ") } else { ("<=", "> ") };
            let verdict = match (value, ok) {
                (Some(v), Some(true)) => format!("{v:.0} {unit} {op_ok} {limit} {unit}   ok"),
                (Some(v), _) => format!("{v:.0} {unit} {op_bad} {limit} {unit}   MISSED"),
                (None, _) => "not measured".to_string(),
            };
            self.report.set(&format!("targets.{key}"), json!(ok));
            self.report.row(label, verdict);
        }
    }

    /// Stops the agent if a phase failed and removes whatever the run left in the runtime.
    async fn cleanup(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.stop().await;
        }
        let n = remove_sandboxes(&self.cri, ours).await;
        if n > 0 {
            progress(format!("cleanup: removed {n} sandbox(es)"));
        }
    }
}

/// The 1-, 5- and 15-minute load averages, as /proc/loadavg gives them.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
