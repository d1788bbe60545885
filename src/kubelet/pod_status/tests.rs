//! Table tests for `compute_pod_status`: phase, container states and conditions per row, then
//! the exact fields (times, IDs, IPs, transition times, QoS) one test each.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodIP, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

static NO_PROBES: std::sync::LazyLock<HashMap<String, ProbeView>> =
    std::sync::LazyLock::new(HashMap::new);
use crate::base::observed::{
    ContainerState as Rt, ObservedContainer, ObservedPod, ObservedSandbox, SandboxState,
};

// ---- times -------------------------------------------------------------------------------

const BASE: u64 = 1_700_000_000;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(BASE + secs)
}

fn ns(secs: u64) -> i64 {
    ((BASE + secs) * 1_000_000_000) as i64
}

fn at(secs: u64) -> Time {
    time(t(secs))
}

// ---- pods --------------------------------------------------------------------------------

fn spec_container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(format!("img-{name}:1")),
        ..Default::default()
    }
}

fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!inits.is_empty())
                .then(|| inits.iter().map(|n| spec_container(n)).collect()),
            containers: apps.iter().map(|n| spec_container(n)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---- what the runtime shows -------------------------------------------------------------------

fn sandbox(state: SandboxState) -> ObservedSandbox {
    ObservedSandbox {
        id: "s0".into(),
        attempt: 0,
        state,
        created_at: ns(1),
        ip: Some("10.88.0.5".into()),
        additional_ips: vec!["fd00::5".into()],
        host_network: false,
    }
}

pub(super) fn instance(name: &str, attempt: u32, state: Rt) -> ObservedContainer {
    ObservedContainer {
        id: format!("{name}{attempt}"),
        sandbox_id: "s0".into(),
        name: name.into(),
        attempt,
        state,
        created_at: ns(10 + attempt as u64),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        hash: None,
        image: format!("img-{name}:1"),
        image_ref: format!("sha256:{name}"),
        grace_period: Some(30),
        is_init: false,
        pre_stop: None,
        round: None,
    }
}

pub(super) fn running(name: &str, attempt: u32) -> ObservedContainer {
    ObservedContainer {
        started_at: ns(100 + attempt as u64),
        ..instance(name, attempt, Rt::Running)
    }
}

/// Exited with `code`; the reason left empty as some runtimes do.
fn exited(name: &str, attempt: u32, code: i32) -> ObservedContainer {
    ObservedContainer {
        started_at: ns(100 + attempt as u64),
        finished_at: ns(200 + attempt as u64),
        exit_code: code,
        ..instance(name, attempt, Rt::Exited)
    }
}

fn with_reason(mut c: ObservedContainer, reason: &str) -> ObservedContainer {
    c.reason = reason.into();
    c
}

pub(super) fn observed(
    state: Option<SandboxState>,
    containers: Vec<ObservedContainer>,
) -> ObservedPod {
    ObservedPod {
        sandboxes: state.map(sandbox).into_iter().collect(),
        containers,
        names: None,
    }
}

const READY: Option<SandboxState> = Some(SandboxState::Ready);
const DEAD: Option<SandboxState> = Some(SandboxState::NotReady);

// ---- summaries ------------------------------------------------------------------------------

fn state_text(s: Option<&k8s_openapi::api::core::v1::ContainerState>) -> String {
    let Some(s) = s else {
        return "none".into();
    };
    if s.running.is_some() {
        "running".into()
    } else if let Some(w) = &s.waiting {
        format!("waiting:{}", w.reason.as_deref().unwrap_or_default())
    } else if let Some(t) = &s.terminated {
        format!(
            "terminated:{}:{}",
            t.reason.as_deref().unwrap_or_default(),
            t.exit_code
        )
    } else {
        "empty".into()
    }
}

/// `state [last=state] rc=N [ready] [started]`.
fn summary(s: &ContainerStatus) -> String {
    let mut out = state_text(s.state.as_ref());
    if let Some(last) = &s.last_state {
        out += &format!(" last={}", state_text(Some(last)));
    }
    out += &format!(" rc={}", s.restart_count);
    if s.ready {
        out += " ready";
    }
    if s.started == Some(true) {
        out += " started";
    }
    out
}

/// Conditions in order, `Type=Status[/Reason]`.
fn conditions_text(status: &PodStatus) -> String {
    status
        .conditions
        .iter()
        .flatten()
        .map(|c| match &c.reason {
            Some(r) => format!("{}={}/{}", c.type_, c.status, r),
            None => format!("{}={}", c.type_, c.status),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn find<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .expect("condition present")
}

// ---- the phase table ---------------------------------------------------------------------------

struct Row {
    name: String,
    pod: Pod,
    observed: ObservedPod,
    waiting: Vec<(&'static str, &'static str)>,
    terminating: bool,
    previous_phase: Option<&'static str>,
    phase: &'static str,
    inits: Vec<&'static str>,
    apps: Vec<&'static str>,
    conditions: &'static str,
}

fn row(
    name: impl Into<String>,
    pod: Pod,
    observed: ObservedPod,
    phase: &'static str,
    inits: Vec<&'static str>,
    apps: Vec<&'static str>,
    conditions: &'static str,
) -> Row {
    Row {
        name: name.into(),
        pod,
        observed,
        waiting: vec![],
        terminating: false,
        previous_phase: None,
        phase,
        inits,
        apps,
        conditions,
    }
}

impl Row {
    fn noted(mut self, container: &'static str, reason: &'static str) -> Row {
        self.waiting.push((container, reason));
        self
    }

    fn terminating(mut self) -> Row {
        self.terminating = true;
        self
    }

    fn after(mut self, phase: &'static str) -> Row {
        self.previous_phase = Some(phase);
        self
    }
}

fn compute(r: &Row) -> PodStatus {
    let waiting: HashMap<String, WaitingReason> = r
        .waiting
        .iter()
        .map(|(c, reason)| {
            (
                c.to_string(),
                WaitingReason {
                    reason: reason.parse().expect("a known waiting reason"),
                    message: format!("{reason} for {c}"),
                },
            )
        })
        .collect();
    let previous = r.previous_phase.map(|p| PodStatus {
        phase: Some(p.into()),
        ..Default::default()
    });
    let inputs = StatusInputs {
        now: t(1000),
        host_ip: Some("192.168.1.10".into()),
        waiting: &waiting,
        previous: previous.as_ref(),
        terminating: r.terminating,
        probes: &NO_PROBES,
    };
    compute_pod_status(&r.pod, &r.observed, &inputs)
}

fn run(rows: Vec<Row>) -> usize {
    let n = rows.len();
    let mut failures = Vec::new();
    for r in rows {
        let s = compute(&r);
        let phase = s.phase.clone().unwrap_or_default();
        let inits: Vec<String> = s
            .init_container_statuses
            .iter()
            .flatten()
            .map(summary)
            .collect();
        let apps: Vec<String> = s.container_statuses.iter().flatten().map(summary).collect();
        let conditions = conditions_text(&s);
        if phase != r.phase || inits != r.inits || apps != r.apps || conditions != r.conditions {
            failures.push(format!(
                "row {}:\n  got  {phase} inits={inits:?} apps={apps:?}\n       {conditions}\n  \
                 want {} inits={:?} apps={:?}\n       {}",
                r.name, r.phase, r.inits, r.apps, r.conditions
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    n
}

const ALL_TRUE: &str = "PodReadyToStartContainers=True Initialized=True Ready=True \
                        ContainersReady=True PodScheduled=True";
const NOT_READY: &str = "PodReadyToStartContainers=True Initialized=True \
                         Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady \
                         PodScheduled=True";
const NO_SANDBOX: &str = "PodReadyToStartContainers=False Initialized=True \
                          Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady \
                          PodScheduled=True";
const INITIALIZING: &str = "PodReadyToStartContainers=True \
                            Initialized=False/ContainersNotInitialized \
                            Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady \
                            PodScheduled=True";
const COMPLETED: &str = "PodReadyToStartContainers=False Initialized=True/PodCompleted \
                         Ready=False/PodCompleted ContainersReady=False/PodCompleted \
                         PodScheduled=True";
const FAILED: &str = "PodReadyToStartContainers=False Initialized=True Ready=False/PodFailed \
                      ContainersReady=False/PodFailed PodScheduled=True";

#[test]
fn phases_and_container_states() {
    let always = |apps: &[&str]| pod("Always", &[], apps);
    let n = run(vec![
        row(
            "nothing in the runtime yet: Pending, ContainerCreating",
            always(&["a", "b"]),
            observed(None, vec![]),
            "Pending",
            vec![],
            vec![
                "waiting:ContainerCreating rc=0",
                "waiting:ContainerCreating rc=0",
            ],
            NO_SANDBOX,
        ),
        row(
            "sandbox ready, container not created yet: Pending",
            always(&["a"]),
            observed(READY, vec![]),
            "Pending",
            vec![],
            vec!["waiting:ContainerCreating rc=0"],
            NOT_READY,
        ),
        row(
            "one running, one still being created: Pending",
            always(&["a", "b"]),
            observed(READY, vec![running("a", 0)]),
            "Pending",
            vec![],
            vec![
                "running rc=0 ready started",
                "waiting:ContainerCreating rc=0",
            ],
            NOT_READY,
        ),
        row(
            "all running: Running and Ready",
            always(&["a", "b"]),
            observed(READY, vec![running("a", 0), running("b", 0)]),
            "Running",
            vec![],
            vec!["running rc=0 ready started", "running rc=0 ready started"],
            ALL_TRUE,
        ),
        row(
            "running after restarts: lastState is the previous exit",
            always(&["a"]),
            observed(READY, vec![exited("a", 1, 2), running("a", 2)]),
            "Running",
            vec![],
            vec!["running last=terminated:Error:2 rc=2 ready started"],
            ALL_TRUE,
        ),
        row(
            "OnFailure, every container exited 0: Succeeded",
            pod("OnFailure", &[], &["a", "b"]),
            observed(DEAD, vec![exited("a", 0, 0), exited("b", 0, 0)]),
            "Succeeded",
            vec![],
            vec!["terminated:Completed:0 rc=0", "terminated:Completed:0 rc=0"],
            COMPLETED,
        ),
        row(
            "Never, one failed: Failed",
            pod("Never", &[], &["a", "b"]),
            observed(DEAD, vec![exited("a", 0, 0), exited("b", 0, 3)]),
            "Failed",
            vec![],
            vec!["terminated:Completed:0 rc=0", "terminated:Error:3 rc=0"],
            FAILED,
        ),
        row(
            "Never, one failed, one still running: Running",
            pod("Never", &[], &["a", "b"]),
            observed(READY, vec![exited("a", 0, 1), running("b", 0)]),
            "Running",
            vec![],
            vec!["terminated:Error:1 rc=0", "running rc=0 ready started"],
            NOT_READY,
        ),
        row(
            "Always, exited in back-off: Running, CrashLoopBackOff with lastState",
            always(&["a"]),
            observed(READY, vec![exited("a", 0, 1), exited("a", 1, 1)]),
            "Running",
            vec![],
            vec!["waiting:CrashLoopBackOff last=terminated:Error:1 rc=1"],
            NOT_READY,
        )
        .noted("a", "CrashLoopBackOff"),
        row(
            "Always, exited 0, no reason noted yet: stays terminated, Running",
            always(&["a"]),
            observed(READY, vec![exited("a", 0, 0)]),
            "Running",
            vec![],
            vec!["terminated:Completed:0 rc=0"],
            NOT_READY,
        ),
        row(
            "OnFailure, exited 1 and restarting: Running",
            pod("OnFailure", &[], &["a"]),
            observed(READY, vec![exited("a", 0, 1)]),
            "Running",
            vec![],
            vec!["waiting:CrashLoopBackOff last=terminated:Error:1 rc=0"],
            NOT_READY,
        )
        .noted("a", "CrashLoopBackOff"),
        row(
            "OnFailure, exited 0 with a stale note: not restarting, so terminated",
            pod("OnFailure", &[], &["a"]),
            observed(DEAD, vec![exited("a", 0, 0)]),
            "Succeeded",
            vec![],
            vec!["terminated:Completed:0 rc=0"],
            COMPLETED,
        )
        .noted("a", "CrashLoopBackOff"),
        row(
            "runtime reason kept: OOMKilled",
            always(&["a"]),
            observed(READY, vec![with_reason(exited("a", 0, 137), "OOMKilled")]),
            "Running",
            vec![],
            vec!["terminated:OOMKilled:137 rc=0"],
            NOT_READY,
        ),
        row(
            "created, not started: waiting ContainerCreating",
            always(&["a"]),
            observed(READY, vec![instance("a", 0, Rt::Created)]),
            "Pending",
            vec![],
            vec!["waiting:ContainerCreating rc=0"],
            NOT_READY,
        ),
        row(
            "terminating: a running container is not ready",
            always(&["a"]),
            observed(READY, vec![running("a", 0)]),
            "Running",
            vec![],
            vec!["running rc=0 started"],
            NOT_READY,
        )
        .terminating(),
        row(
            "terminating: an exited container does not show its back-off",
            always(&["a"]),
            observed(READY, vec![exited("a", 0, 1)]),
            "Running",
            vec![],
            vec!["terminated:Error:1 rc=0"],
            NOT_READY,
        )
        .noted("a", "CrashLoopBackOff")
        .terminating(),
        row(
            "a terminal phase is never left (runtime state lost)",
            pod("Never", &[], &["a"]),
            observed(None, vec![]),
            "Failed",
            vec![],
            vec!["waiting:ContainerCreating rc=0"],
            FAILED,
        )
        .after("Failed"),
    ]);
    assert_eq!(n, 17);
}

/// `p` with container `name` given its own `restartPolicy` and, when `rule_codes` is not empty,
/// one `Restart` rule on those exit codes (`In`).
fn with_container_policy(mut p: Pod, name: &str, policy: &str, rule_codes: &[i32]) -> Pod {
    let spec = p.spec.as_mut().unwrap();
    let c = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .find(|c| c.name == name)
        .unwrap();
    c.restart_policy = Some(policy.into());
    if !rule_codes.is_empty() {
        c.restart_policy_rules = Some(vec![
            serde_json::from_value(serde_json::json!({
                "action": "Restart",
                "exitCodes": {"operator": "In", "values": rule_codes},
            }))
            .unwrap(),
        ]);
    }
    p
}

#[test]
fn container_restart_policies_decide_the_phase() {
    // Upstream's getPhase with ContainerRestartRules: an exited container counts as restarting
    // by its own policy and rules, not the pod's.
    run(vec![
        row(
            "pod Never, container Always, in back-off: Running, CrashLoopBackOff",
            with_container_policy(pod("Never", &[], &["a"]), "a", "Always", &[]),
            observed(READY, vec![exited("a", 0, 1)]),
            "Running",
            vec![],
            vec!["waiting:CrashLoopBackOff last=terminated:Error:1 rc=0"],
            NOT_READY,
        )
        .noted("a", "CrashLoopBackOff"),
        row(
            "pod Never, container Never with a Restart rule on 42, exited 42: Running",
            with_container_policy(pod("Never", &[], &["a"]), "a", "Never", &[42]),
            observed(READY, vec![exited("a", 0, 42)]),
            "Running",
            vec![],
            vec!["terminated:Error:42 rc=0"],
            NOT_READY,
        ),
        row(
            "pod Always, container Never, exited 1: Failed",
            with_container_policy(pod("Always", &[], &["a"]), "a", "Never", &[]),
            observed(DEAD, vec![exited("a", 0, 1)]),
            "Failed",
            vec![],
            vec!["terminated:Error:1 rc=0"],
            FAILED,
        ),
        row(
            "pod Always, containers OnFailure and Never, both exited 0: Succeeded",
            with_container_policy(
                with_container_policy(pod("Always", &[], &["a", "b"]), "a", "OnFailure", &[]),
                "b",
                "Never",
                &[],
            ),
            observed(DEAD, vec![exited("a", 0, 0), exited("b", 0, 0)]),
            "Succeeded",
            vec![],
            vec!["terminated:Completed:0 rc=0", "terminated:Completed:0 rc=0"],
            COMPLETED,
        ),
        row(
            "pod Never, init container with a Restart rule on 3, exited 3: Pending",
            with_container_policy(pod("Never", &["i"], &["a"]), "i", "Never", &[3]),
            observed(READY, vec![exited("i", 0, 3)]),
            "Pending",
            vec!["terminated:Error:3 rc=0"],
            vec!["waiting:PodInitializing rc=0"],
            INITIALIZING,
        ),
        row(
            "pod Always, init container Never, exited 1: Failed",
            with_container_policy(pod("Always", &["i"], &["a"]), "i", "Never", &[]),
            observed(DEAD, vec![exited("i", 0, 1)]),
            "Failed",
            vec!["terminated:Error:1 rc=0"],
            vec!["waiting:PodInitializing rc=0"],
            "PodReadyToStartContainers=False Initialized=False/ContainersNotInitialized \
             Ready=False/PodFailed ContainersReady=False/PodFailed PodScheduled=True",
        ),
    ]);
}

#[test]
fn waiting_reasons_from_the_worker() {
    let mut rows = Vec::new();
    for (reason, want) in [
        ("ErrImagePull", "waiting:ErrImagePull rc=0"),
        ("ImagePullBackOff", "waiting:ImagePullBackOff rc=0"),
        (
            "CreateContainerConfigError",
            "waiting:CreateContainerConfigError rc=0",
        ),
        ("CreateContainerError", "waiting:CreateContainerError rc=0"),
        ("RunContainerError", "waiting:RunContainerError rc=0"),
    ] {
        rows.push(
            row(
                format!("noted {reason}"),
                pod("Always", &[], &["a"]),
                observed(READY, vec![]),
                "Pending",
                vec![],
                vec![want],
                NOT_READY,
            )
            .noted("a", reason),
        );
    }
    rows.push(
        row(
            "CrashLoopBackOff noted on a container that has never run: no lastState",
            pod("Always", &[], &["a"]),
            observed(READY, vec![]),
            "Pending",
            vec![],
            vec!["waiting:CrashLoopBackOff rc=0"],
            NOT_READY,
        )
        .noted("a", "CrashLoopBackOff"),
    );
    rows.push(
        row(
            "image pull failing for a restart: lastState kept, counts as stopped",
            pod("Always", &[], &["a"]),
            observed(
                READY,
                vec![exited("a", 0, 1), instance("a", 1, Rt::Created)],
            ),
            "Running",
            vec![],
            vec!["waiting:ErrImagePull last=terminated:Error:1 rc=1"],
            NOT_READY,
        )
        .noted("a", "ErrImagePull"),
    );
    assert_eq!(run(rows), 7);
}

#[test]
fn init_containers() {
    let p = |policy| pod(policy, &["i1", "i2"], &["a"]);
    let n = run(vec![
        row(
            "nothing yet: everything PodInitializing",
            p("Always"),
            observed(None, vec![]),
            "Pending",
            vec![
                "waiting:PodInitializing rc=0",
                "waiting:PodInitializing rc=0",
            ],
            vec!["waiting:PodInitializing rc=0"],
            "PodReadyToStartContainers=False Initialized=False/ContainersNotInitialized \
             Ready=False/ContainersNotReady ContainersReady=False/ContainersNotReady \
             PodScheduled=True",
        ),
        row(
            "first init container running: Pending",
            p("Always"),
            observed(READY, vec![running("i1", 0)]),
            "Pending",
            vec!["running rc=0 started", "waiting:PodInitializing rc=0"],
            vec!["waiting:PodInitializing rc=0"],
            INITIALIZING,
        ),
        row(
            "first done, second running: Pending; a done init container is ready",
            p("Always"),
            observed(READY, vec![exited("i1", 0, 0), running("i2", 0)]),
            "Pending",
            vec!["terminated:Completed:0 rc=0 ready", "running rc=0 started"],
            vec!["waiting:PodInitializing rc=0"],
            INITIALIZING,
        ),
        row(
            "init done, app not created yet: Initialized, still PodInitializing",
            p("Always"),
            observed(READY, vec![exited("i1", 0, 0), exited("i2", 0, 0)]),
            "Pending",
            vec![
                "terminated:Completed:0 rc=0 ready",
                "terminated:Completed:0 rc=0 ready",
            ],
            vec!["waiting:PodInitializing rc=0"],
            NOT_READY,
        ),
        row(
            "init done, app running: Running",
            p("Always"),
            observed(
                READY,
                vec![exited("i1", 0, 0), exited("i2", 0, 0), running("a", 0)],
            ),
            "Running",
            vec![
                "terminated:Completed:0 rc=0 ready",
                "terminated:Completed:0 rc=0 ready",
            ],
            vec!["running rc=0 ready started"],
            ALL_TRUE,
        ),
        row(
            "init failed under Always, in back-off: Pending",
            p("Always"),
            observed(READY, vec![exited("i1", 0, 1)]),
            "Pending",
            vec![
                "waiting:CrashLoopBackOff last=terminated:Error:1 rc=0",
                "waiting:PodInitializing rc=0",
            ],
            vec!["waiting:PodInitializing rc=0"],
            INITIALIZING,
        )
        .noted("i1", "CrashLoopBackOff"),
        row(
            "init failed under Never: Failed",
            p("Never"),
            observed(DEAD, vec![exited("i1", 0, 0), exited("i2", 0, 1)]),
            "Failed",
            vec![
                "terminated:Completed:0 rc=0 ready",
                "terminated:Error:1 rc=0",
            ],
            vec!["waiting:PodInitializing rc=0"],
            "PodReadyToStartContainers=False Initialized=False/ContainersNotInitialized \
             Ready=False/PodFailed ContainersReady=False/PodFailed PodScheduled=True",
        ),
        row(
            "init failed under Never with a stale note: still terminated, Failed",
            p("Never"),
            observed(DEAD, vec![exited("i1", 0, 1)]),
            "Failed",
            vec!["terminated:Error:1 rc=0", "waiting:PodInitializing rc=0"],
            vec!["waiting:PodInitializing rc=0"],
            "PodReadyToStartContainers=False Initialized=False/ContainersNotInitialized \
             Ready=False/PodFailed ContainersReady=False/PodFailed PodScheduled=True",
        )
        .noted("i1", "CrashLoopBackOff"),
        row(
            "init and app done under OnFailure: Succeeded",
            p("OnFailure"),
            observed(
                DEAD,
                vec![exited("i1", 0, 0), exited("i2", 0, 0), exited("a", 0, 0)],
            ),
            "Succeeded",
            vec![
                "terminated:Completed:0 rc=0 ready",
                "terminated:Completed:0 rc=0 ready",
            ],
            vec!["terminated:Completed:0 rc=0"],
            COMPLETED,
        ),
    ]);
    assert_eq!(n, 9);
}

// ---- exact fields ------------------------------------------------------------------------------

fn inputs<'a>(
    waiting: &'a HashMap<String, WaitingReason>,
    previous: Option<&'a PodStatus>,
    now: u64,
) -> StatusInputs<'a> {
    StatusInputs {
        now: t(now),
        host_ip: Some("192.168.1.10".into()),
        waiting,
        previous,
        terminating: false,
        probes: &NO_PROBES,
    }
}

#[test]
fn container_status_fields() {
    let mut oom = with_reason(exited("a", 2, 137), "OOMKilled");
    oom.message = "memory limit reached".into();
    let obs = observed(READY, vec![oom, running("a", 3), exited("a", 1, 1)]);
    let none = HashMap::new();
    let s = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &obs,
        &inputs(&none, None, 1000),
    );
    let a = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(a.name, "a");
    assert_eq!(a.image, "img-a:1");
    assert_eq!(a.image_id, "sha256:a");
    assert_eq!(a.container_id.as_deref(), Some("containerd://a3"));
    assert_eq!(a.restart_count, 3);
    assert!(a.ready);
    assert_eq!(a.started, Some(true));
    let run = a.state.as_ref().unwrap().running.as_ref().unwrap();
    assert_eq!(run.started_at, Some(at(103)));
    let last = a.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(last.exit_code, 137);
    assert_eq!(last.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(last.message.as_deref(), Some("memory limit reached"));
    assert_eq!(last.container_id.as_deref(), Some("containerd://a2"));
    assert_eq!(last.started_at, Some(at(102)));
    assert_eq!(last.finished_at, Some(at(202)));

    // Exited under Never: the terminated state itself, no message when the runtime gave none.
    let obs = observed(DEAD, vec![exited("a", 0, 0)]);
    let s = compute_pod_status(&pod("Never", &[], &["a"]), &obs, &inputs(&none, None, 1000));
    let a = &s.container_statuses.as_ref().unwrap()[0];
    let term = a.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(term.reason.as_deref(), Some("Completed"));
    assert_eq!(term.message, None);
    assert_eq!(term.started_at, Some(at(100)));
    assert_eq!(term.finished_at, Some(at(200)));
    assert!(!a.ready);
    assert_eq!(a.started, Some(false));

    // A waiting reason carries the worker's message.
    let noted = HashMap::from([(
        "a".to_string(),
        WaitingReason {
            reason: WaitReason::CrashLoopBackOff,
            message: "back-off 10s restarting failed container=a pod=web_default(uid-1)".into(),
        },
    )]);
    let obs = observed(READY, vec![exited("a", 0, 1)]);
    let s = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &obs,
        &inputs(&noted, None, 1000),
    );
    let w = s.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .waiting
        .clone()
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(
        w.message.as_deref(),
        Some("back-off 10s restarting failed container=a pod=web_default(uid-1)")
    );
}

#[test]
fn condition_messages() {
    let none = HashMap::new();
    let obs = observed(READY, vec![exited("i1", 0, 0), running("i2", 0)]);
    let s = compute_pod_status(
        &pod("Always", &["i1", "i2"], &["a", "b"]),
        &obs,
        &inputs(&none, None, 1000),
    );
    assert_eq!(
        find(&s, "Initialized").message.as_deref(),
        Some("containers with incomplete status: [i2]")
    );
    for type_ in ["Ready", "ContainersReady"] {
        assert_eq!(
            find(&s, type_).message.as_deref(),
            Some("containers with unready status: [a b]"),
            "{type_}"
        );
    }
    let obs = observed(READY, vec![running("a", 0)]);
    let s = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &obs,
        &inputs(&none, None, 1000),
    );
    assert!(s.conditions.iter().flatten().all(|c| c.message.is_none()));
}

#[test]
fn transition_times_kept_while_status_unchanged() {
    let none = HashMap::new();
    let p = pod("Always", &[], &["a"]);
    let first = compute_pod_status(&p, &observed(READY, vec![]), &inputs(&none, None, 1000));
    assert!(
        first
            .conditions
            .iter()
            .flatten()
            .all(|c| c.last_transition_time == Some(at(1000)))
    );

    // The container starts: Ready and ContainersReady flip, the others keep their time.
    let second = compute_pod_status(
        &p,
        &observed(READY, vec![running("a", 0)]),
        &inputs(&none, Some(&first), 1010),
    );
    for (type_, when) in [
        ("PodReadyToStartContainers", 1000),
        ("Initialized", 1000),
        ("Ready", 1010),
        ("ContainersReady", 1010),
        ("PodScheduled", 1000),
    ] {
        assert_eq!(
            find(&second, type_).last_transition_time,
            Some(at(when)),
            "{type_}"
        );
    }

    // Nothing changes: every time is kept.
    let third = compute_pod_status(
        &p,
        &observed(READY, vec![running("a", 0)]),
        &inputs(&none, Some(&second), 1020),
    );
    assert_eq!(third.conditions, second.conditions);

    // The start time is the first one seen.
    assert_eq!(first.start_time, Some(at(1000)));
    assert_eq!(third.start_time, Some(at(1000)));
}

#[test]
fn pod_and_host_ips() {
    let none = HashMap::new();
    let obs = observed(READY, vec![running("a", 0)]);
    let s = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &obs,
        &inputs(&none, None, 1000),
    );
    assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.5"));
    assert_eq!(
        s.pod_ips,
        Some(vec![
            PodIP {
                ip: "10.88.0.5".into()
            },
            PodIP {
                ip: "fd00::5".into()
            }
        ])
    );
    assert_eq!(s.host_ip.as_deref(), Some("192.168.1.10"));
    assert_eq!(
        s.host_ips.as_ref().map(|v| v[0].ip.clone()).as_deref(),
        Some("192.168.1.10")
    );

    let mut p = pod("Always", &[], &["a"]);
    p.spec.as_mut().unwrap().host_network = Some(true);
    let mut obs = obs.clone();
    obs.sandboxes[0].host_network = true;
    obs.sandboxes[0].ip = None;
    let s = compute_pod_status(&p, &obs, &inputs(&none, None, 1000));
    assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.10"));
    assert_eq!(
        s.pod_ips,
        Some(vec![PodIP {
            ip: "192.168.1.10".into()
        }])
    );

    let s = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &observed(None, vec![]),
        &inputs(&none, None, 1000),
    );
    assert_eq!(s.pod_ip, None);
    assert_eq!(s.pod_ips, None);
}

#[test]
fn qos_class() {
    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }
    }
    let none = HashMap::new();
    for (name, res, want) in [
        ("nothing set", None, "BestEffort"),
        (
            "a request only",
            Some(resources(&[("cpu", "100m")], &[])),
            "Burstable",
        ),
        (
            "limits for cpu and memory",
            Some(resources(&[], &[("cpu", "1"), ("memory", "64Mi")])),
            "Guaranteed",
        ),
    ] {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().containers[0].resources = res;
        let s = compute_pod_status(&p, &observed(None, vec![]), &inputs(&none, None, 1000));
        assert_eq!(s.qos_class.as_deref(), Some(want), "{name}");
    }
}

/// A readiness gate holds the pod's Ready condition back (not ContainersReady) until others set
/// its condition True in the pod's status, with upstream's reason and message; a pod whose
/// containers are not ready keeps their reason.
#[test]
fn readiness_gates_hold_ready_back() {
    use k8s_openapi::api::core::v1::PodReadinessGate;
    let with_gates = |conditions: &[(&str, &str)]| {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().readiness_gates = Some(vec![
            PodReadinessGate {
                condition_type: "k8s.io/test-condition1".into(),
            },
            PodReadinessGate {
                condition_type: "k8s.io/test-condition2".into(),
            },
        ]);
        p.status = Some(PodStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s)| PodCondition {
                        type_: t.to_string(),
                        status: s.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    };
    let none = HashMap::new();
    let ready = observed(READY, vec![running("a", 1)]);
    let s = compute_pod_status(&with_gates(&[]), &ready, &inputs(&none, None, 10));
    assert_eq!(find(&s, "ContainersReady").status, "True");
    let r = find(&s, "Ready");
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref()),
        ("False", Some("ReadinessGatesNotReady"))
    );
    assert_eq!(
        r.message.as_deref(),
        Some(concat!(
            r#"corresponding condition of pod readiness gate "k8s.io/test-condition1" does not exist., "#,
            r#"corresponding condition of pod readiness gate "k8s.io/test-condition2" does not exist."#
        ))
    );
    let one = with_gates(&[("k8s.io/test-condition1", "True")]);
    let s = compute_pod_status(&one, &ready, &inputs(&none, None, 10));
    assert_eq!(find(&s, "Ready").status, "False");
    let both = with_gates(&[
        ("k8s.io/test-condition1", "True"),
        ("k8s.io/test-condition2", "True"),
    ]);
    let s = compute_pod_status(&both, &ready, &inputs(&none, None, 10));
    assert_eq!(find(&s, "Ready").status, "True");
    // The node's status carries only its own conditions: the gates' stay the API's.
    assert!(!conditions_text(&s).contains("test-condition"));
    // Containers not ready: their reason, whatever the gates say.
    let waiting = observed(READY, vec![exited("a", 1, 1)]);
    let s = compute_pod_status(&both, &waiting, &inputs(&none, None, 10));
    assert_eq!(
        find(&s, "Ready").reason.as_deref(),
        Some("ContainersNotReady")
    );
}

#[test]
fn ephemeral_containers_have_statuses_of_their_own() {
    let mut p = pod("Always", &[], &["a"]);
    p.spec.as_mut().unwrap().ephemeral_containers = Some(
        ["dbg", "gone", "new"]
            .iter()
            .map(|n| k8s_openapi::api::core::v1::EphemeralContainer {
                name: n.to_string(),
                image: Some(format!("img-{n}:1")),
                ..Default::default()
            })
            .collect(),
    );
    let seen = observed(
        READY,
        vec![running("a", 0), running("dbg", 0), exited("gone", 0, 1)],
    );
    let waiting = HashMap::new();
    let status = compute_pod_status(&p, &seen, &inputs(&waiting, None, 300));
    let ephemeral = status
        .ephemeral_container_statuses
        .as_ref()
        .expect("ephemeralContainerStatuses");
    let got: Vec<(String, String)> = ephemeral
        .iter()
        .map(|s| (s.name.clone(), summary(s)))
        .collect();
    let want = [
        ("dbg", "running rc=0"),
        ("gone", "terminated:Error:1 rc=0"),
        ("new", "waiting:ContainerCreating rc=0"),
    ];
    assert_eq!(
        got,
        want.map(|(n, s)| (n.to_string(), s.to_string())).to_vec()
    );
    // Never ready, no `started` (upstream's probe manager does not set it for them), and they
    // change neither the phase nor the app containers' readiness.
    assert!(ephemeral.iter().all(|s| s.started.is_none() && !s.ready));
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(find(&status, "Ready").status, "True");
    assert_eq!(
        ephemeral[0].container_id.as_deref(),
        Some("containerd://dbg0")
    );
    let plain = compute_pod_status(
        &pod("Always", &[], &["a"]),
        &seen,
        &inputs(&waiting, None, 300),
    );
    assert_eq!(plain.ephemeral_container_statuses, None);
}

#[test]
fn the_status_and_its_conditions_carry_the_generation_they_were_computed_from() {
    let mut p = pod("Always", &[], &["a"]);
    p.metadata.generation = Some(7);
    let waiting = HashMap::new();
    let seen = observed(READY, vec![running("a", 0)]);
    let status = compute_pod_status(&p, &seen, &inputs(&waiting, None, 300));
    assert_eq!(status.observed_generation, Some(7));
    let conditions = status.conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 5);
    for c in conditions {
        assert_eq!(c.observed_generation, Some(7), "{}", c.type_);
    }
    // A pod with no generation (from a file) reports none.
    let file = pod("Always", &[], &["a"]);
    let status = compute_pod_status(&file, &seen, &inputs(&waiting, None, 300));
    assert_eq!(status.observed_generation, None);
    assert!(
        status
            .conditions
            .iter()
            .flatten()
            .all(|c| c.observed_generation.is_none())
    );
}

/// `p` with container `name` (policy Never) restarting every container on exit code 42.
fn with_restart_all(mut p: Pod, name: &str) -> Pod {
    p = with_container_policy(p, name, "Never", &[]);
    let spec = p.spec.as_mut().unwrap();
    let c = spec.containers.iter_mut().find(|c| c.name == name).unwrap();
    c.restart_policy_rules = Some(vec![
        serde_json::from_value(serde_json::json!({
            "action": "RestartAllContainers",
            "exitCodes": {"operator": "In", "values": [42]},
        }))
        .unwrap(),
    ]);
    p
}

fn find_condition<'a>(s: &'a PodStatus, type_: &str) -> Option<&'a PodCondition> {
    s.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

#[test]
fn a_round_of_restart_all_containers_shows_in_the_conditions() {
    let none = HashMap::new();
    let p = with_restart_all(pod("Never", &["i"], &["src", "reg"]), "src");
    let mut init_done = exited("i", 0, 0);
    init_done.finished_at = ns(15);
    // `src` exited 42 at 200; `reg` (made at 10) still runs: the round is starting.
    let starting = observed(
        READY,
        vec![init_done.clone(), exited("src", 0, 42), running("reg", 0)],
    );
    let s = compute_pod_status(&p, &starting, &inputs(&none, None, 1000));
    let c = find_condition(&s, "AllContainersRestarting").expect("the condition");
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("RestartAllContainersStarted"));
    assert_eq!(
        c.message.as_deref(),
        Some("container exited with restart policy rule")
    );
    assert_eq!(s.phase.as_deref(), Some("Running"), "src will run again");

    // Everything stopped and the round's init container runs: false again; the pod, once
    // initialized, stays so; the pod is pending while its init container runs.
    let mut reg_stopped = exited("reg", 0, 137);
    reg_stopped.finished_at = ns(201);
    let mut init_again = running("i", 1);
    init_again.round = Some("src0".into());
    let round = observed(
        READY,
        vec![init_done, exited("src", 0, 42), reg_stopped, init_again],
    );
    let s2 = compute_pod_status(&p, &round, &inputs(&none, Some(&s), 1010));
    let c = find_condition(&s2, "AllContainersRestarting").expect("the condition");
    assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", None));
    assert_eq!(find_condition(&s2, "Initialized").unwrap().status, "True");
    assert_eq!(s2.phase.as_deref(), Some("Pending"));

    // A pod without such a rule has no such condition.
    let plain = compute_pod_status(
        &pod("Never", &[], &["a"]),
        &starting,
        &inputs(&none, None, 1000),
    );
    assert!(find_condition(&plain, "AllContainersRestarting").is_none());
}
