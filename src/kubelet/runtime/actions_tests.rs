//! Table tests for `compute_pod_actions`: each row is a pod, what the runtime shows, a time and
//! a back-off table, and the exact `PodActions` expected.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::base::observed::{
    ContainerState, ObservedContainer, ObservedPod, ObservedSandbox, SandboxState,
};
use crate::kubelet::runtime::backoff::{BackoffEntry, BackoffPolicy, BackoffTable};
use std::collections::HashMap;

// ---- times -------------------------------------------------------------------------------

const BASE: u64 = 1_700_000_000;

/// A wall-clock time `secs` after the test epoch.
fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(BASE + secs)
}

/// The same time as CRI writes it (nanoseconds since the Unix epoch).
fn ns(secs: u64) -> i64 {
    ((BASE + secs) * 1_000_000_000) as i64
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---- pods --------------------------------------------------------------------------------

fn spec_container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(format!("img-{name}:1")),
        ..Default::default()
    }
}

/// A pod with the given restart policy, init containers and app containers.
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

fn always(apps: &[&str]) -> Pod {
    pod("Always", &[], apps)
}

fn host_network(mut p: Pod) -> Pod {
    p.spec.as_mut().unwrap().host_network = Some(true);
    p
}

/// The spec hash used by every row: the image, so changing the image changes the hash.
fn hash_of(c: &Container) -> String {
    format!("h-{}", c.image.as_deref().unwrap_or_default())
}

// ---- what the runtime shows -------------------------------------------------------------------

fn sandbox(id: &str, attempt: u32, state: SandboxState) -> ObservedSandbox {
    ObservedSandbox {
        id: id.into(),
        attempt,
        state,
        created_at: ns(attempt as u64),
        ip: Some("10.88.0.5".into()),
        additional_ips: vec![],
        host_network: false,
    }
}

fn ready(id: &str, attempt: u32) -> ObservedSandbox {
    sandbox(id, attempt, SandboxState::Ready)
}

fn dead(id: &str, attempt: u32) -> ObservedSandbox {
    sandbox(id, attempt, SandboxState::NotReady)
}

fn instance(
    id: &str,
    sb: &str,
    name: &str,
    attempt: u32,
    state: ContainerState,
) -> ObservedContainer {
    ObservedContainer {
        id: id.into(),
        sandbox_id: sb.into(),
        name: name.into(),
        attempt,
        state,
        created_at: ns(10 + attempt as u64),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        hash: Some(hash_of(&spec_container(name))),
        image: format!("img-{name}:1"),
        image_ref: format!("sha256:{name}"),
        grace_period: Some(30),
        is_init: false,
        pre_stop: None,
        round: None,
    }
}

fn running(id: &str, sb: &str, name: &str, attempt: u32) -> ObservedContainer {
    ObservedContainer {
        started_at: ns(20 + attempt as u64),
        ..instance(id, sb, name, attempt, ContainerState::Running)
    }
}

/// An instance that exited with `code` at `finished` seconds.
fn exited(
    id: &str,
    sb: &str,
    name: &str,
    attempt: u32,
    code: i32,
    finished: u64,
) -> ObservedContainer {
    ObservedContainer {
        started_at: ns(finished.saturating_sub(5)),
        finished_at: ns(finished),
        exit_code: code,
        ..instance(id, sb, name, attempt, ContainerState::Exited)
    }
}

fn created(id: &str, sb: &str, name: &str, attempt: u32) -> ObservedContainer {
    instance(id, sb, name, attempt, ContainerState::Created)
}

fn with_hash(mut c: ObservedContainer, hash: &str) -> ObservedContainer {
    c.hash = Some(hash.into());
    c
}

fn observed(sandboxes: Vec<ObservedSandbox>, containers: Vec<ObservedContainer>) -> ObservedPod {
    ObservedPod {
        sandboxes,
        containers,
        names: Some(("default".into(), "web".into())),
    }
}

fn nothing() -> ObservedPod {
    ObservedPod::default()
}

// ---- expected actions ---------------------------------------------------------------------

fn app(index: usize, name: &str, restart_count: u32) -> StartContainer {
    StartContainer {
        kind: ContainerKind::App,
        index,
        name: name.into(),
        restart_count,
        backoff: None,
        round: None,
    }
}

fn init(index: usize, name: &str, restart_count: u32) -> StartContainer {
    StartContainer {
        kind: ContainerKind::Init,
        ..app(index, name, restart_count)
    }
}

/// A start that is a restart after an exit, recording the back-off entry: its delay, and the
/// time of the restart (the row's now), from which the entry ages, as upstream's.
fn backed_off(mut s: StartContainer, delay: u64, last_update: u64) -> StartContainer {
    s.backoff = Some(entry(delay, last_update));
    s
}

fn entry(delay: u64, last_update: u64) -> BackoffEntry {
    BackoffEntry {
        delay: secs(delay),
        last_update: t(last_update),
    }
}

/// Nothing to do but keep running in `sandbox`.
fn keep(sandbox: &str) -> PodActions {
    PodActions {
        sandbox_id: Some(sandbox.into()),
        ..Default::default()
    }
}

fn kill(id: &str, name: &str) -> KillContainer {
    KillContainer {
        id: id.into(),
        name: name.into(),
        reason: format!("Container {name} definition changed, will be restarted"),
        grace_override: None,
    }
}

const NOT_READY: &str = "the pod sandbox is not ready";
const GONE_NEVER: &str = "the pod sandbox is gone and restartPolicy is Never";
const NETWORK: &str = "the pod's network mode changed";
const TWO_READY: &str = "more than one ready sandbox";
const INIT_NEVER: &str = "an init container failed and restartPolicy is Never";
const ALL_DONE: &str = "all containers have exited and none will restart";

// ---- the table ----------------------------------------------------------------------------

struct Row {
    name: String,
    pod: Pod,
    observed: ObservedPod,
    now: u64,
    backoff: Vec<(&'static str, BackoffEntry)>,
    want: PodActions,
}

fn row(name: impl Into<String>, pod: Pod, observed: ObservedPod, want: PodActions) -> Row {
    Row {
        name: name.into(),
        pod,
        observed,
        now: 1000,
        backoff: vec![],
        want,
    }
}

impl Row {
    fn at(mut self, now: u64) -> Row {
        self.now = now;
        self
    }

    fn backoff(mut self, name: &'static str, e: BackoffEntry) -> Row {
        self.backoff.push((name, e));
        self
    }
}

fn run(rows: Vec<Row>) {
    let mut failures = Vec::new();
    for r in rows {
        let table: BackoffTable = r
            .backoff
            .iter()
            .map(|(n, e)| {
                let key = crate::kubelet::runtime::backoff::container_key(
                    n,
                    &hash_of(&spec_container(n)),
                );
                (key, *e)
            })
            .collect();
        let ctx = DecisionContext {
            now: t(r.now),
            backoff: &table,
            policy: BackoffPolicy::default(),
            spec_hash: &hash_of,
            unhealthy: &HashMap::new(),
            probes: &HashMap::new(),
            actuated: &HashMap::new(),
            pod_level: Default::default(),
        };
        let got = compute_pod_actions(&r.pod, &r.observed, &ctx);
        if got != r.want {
            failures.push(format!(
                "row {}:\n  got  {got:?}\n  want {:?}",
                r.name, r.want
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn sandbox_lifecycle() {
    run(vec![
        row(
            "new pod, nothing observed: sandbox attempt 0 and every app container",
            always(&["a", "b"]),
            nothing(),
            PodActions {
                create_sandbox: Some(0),
                start_containers: vec![app(0, "a", 0), app(1, "b", 0)],
                ..Default::default()
            },
        ),
        row(
            "new pod with init containers: only the first init container",
            pod("Always", &["i1", "i2"], &["a"]),
            nothing(),
            PodActions {
                create_sandbox: Some(0),
                start_containers: vec![init(0, "i1", 0)],
                ..Default::default()
            },
        ),
        row(
            "ready sandbox, all running, hashes equal: nothing to do",
            always(&["a", "b"]),
            observed(
                vec![ready("s0", 0)],
                vec![running("a0", "s0", "a", 0), running("b0", "s0", "b", 0)],
            ),
            keep("s0"),
        ),
        row(
            "sandbox not ready with a container still running: kill pod, new sandbox",
            always(&["a"]),
            observed(vec![dead("s0", 0)], vec![running("a0", "s0", "a", 0)]),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(1),
                start_containers: vec![app(0, "a", 1)],
                ..Default::default()
            },
        ),
        row(
            "sandbox not ready, containers exited: the dead sandbox is stopped (network), new \
             sandbox attempt+1, the restart recorded for back-off",
            always(&["a"]),
            observed(
                vec![dead("s3", 3)],
                vec![exited("a2", "s3", "a", 2, 137, 990)],
            ),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(4),
                start_containers: vec![backed_off(app(0, "a", 3), 10, 1000)],
                ..Default::default()
            },
        ),
        row(
            "sandbox not ready while the container is in back-off: new sandbox, the container \
             waits out its back-off there",
            always(&["a"]),
            observed(
                vec![dead("s3", 3)],
                vec![exited("a2", "s3", "a", 2, 1, 990)],
            ),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(4),
                waiting: vec![BackoffWait {
                    name: "a".into(),
                    remaining: secs(10),
                    message: "back-off 20s restarting failed container=a pod=web_default(uid-1)"
                        .into(),
                }],
                ..Default::default()
            },
        )
        .backoff("a", entry(20, 980)),
        row(
            "sandbox not ready under OnFailure: a succeeded container is not run again",
            pod("OnFailure", &[], &["a", "b"]),
            observed(
                vec![dead("s0", 0)],
                vec![
                    exited("a0", "s0", "a", 0, 0, 990),
                    exited("b0", "s0", "b", 0, 1, 990),
                ],
            ),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(1),
                start_containers: vec![backed_off(app(1, "b", 1), 10, 1000)],
                ..Default::default()
            },
        ),
        row(
            "sandbox not ready under Never after containers ran: no new sandbox, terminal",
            pod("Never", &[], &["a", "b"]),
            observed(
                vec![dead("s0", 0)],
                vec![
                    running("a0", "s0", "a", 0),
                    exited("b0", "s0", "b", 0, 0, 990),
                ],
            ),
            PodActions {
                kill_pod: Some(GONE_NEVER.into()),
                terminal: true,
                ..Default::default()
            },
        ),
        row(
            "sandbox not ready under Never before any container ran: retry the sandbox",
            pod("Never", &[], &["a"]),
            observed(vec![dead("s0", 0)], vec![]),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(1),
                start_containers: vec![app(0, "a", 0)],
                ..Default::default()
            },
        ),
        row(
            "hostNetwork changed versus the sandbox: recreate",
            host_network(always(&["a"])),
            observed(vec![ready("s0", 0)], vec![running("a0", "s0", "a", 0)]),
            PodActions {
                kill_pod: Some(NETWORK.into()),
                create_sandbox: Some(1),
                start_containers: vec![app(0, "a", 1)],
                ..Default::default()
            },
        ),
        row(
            "two ready sandboxes: recreate",
            always(&["a"]),
            observed(
                vec![ready("s0", 0), ready("s1", 1)],
                vec![running("a0", "s1", "a", 0)],
            ),
            PodActions {
                kill_pod: Some(TWO_READY.into()),
                create_sandbox: Some(2),
                start_containers: vec![app(0, "a", 1)],
                ..Default::default()
            },
        ),
        row(
            "new sandbox with init containers after a sandbox death: first init container",
            pod("Always", &["i1"], &["a"]),
            observed(
                vec![dead("s0", 0)],
                vec![
                    exited("i0", "s0", "i1", 0, 0, 900),
                    running("a0", "s0", "a", 0),
                ],
            ),
            PodActions {
                kill_pod: Some(NOT_READY.into()),
                create_sandbox: Some(1),
                start_containers: vec![backed_off(init(0, "i1", 1), 10, 1000)],
                ..Default::default()
            },
        ),
        row(
            "an app container in state Unknown: killed, then a new instance",
            always(&["a"]),
            observed(
                vec![ready("s0", 0)],
                vec![instance("a0", "s0", "a", 0, ContainerState::Unknown)],
            ),
            PodActions {
                sandbox_id: Some("s0".into()),
                kill_containers: vec![KillContainer {
                    reason: UNKNOWN_STATE.into(),
                    ..kill("a0", "a")
                }],
                start_containers: vec![app(0, "a", 1)],
                ..Default::default()
            },
        ),
        row(
            "an app container in state Unknown under Never: left alone, as upstream",
            pod("Never", &[], &["a"]),
            observed(
                vec![ready("s0", 0)],
                vec![instance("a0", "s0", "a", 0, ContainerState::Unknown)],
            ),
            keep("s0"),
        ),
    ]);
}

#[test]
fn init_containers() {
    let p = |policy| pod(policy, &["i1", "i2"], &["a"]);
    let s = || ready("s0", 0);
    run(vec![
        row(
            "first init container running: wait",
            p("Always"),
            observed(vec![s()], vec![running("i1-0", "s0", "i1", 0)]),
            keep("s0"),
        ),
        row(
            "first init container exited 0: start the second",
            p("Always"),
            observed(vec![s()], vec![exited("i1-0", "s0", "i1", 0, 0, 990)]),
            PodActions {
                start_containers: vec![init(1, "i2", 0)],
                ..keep("s0")
            },
        ),
        row(
            "all init containers done: start the app containers",
            p("Always"),
            observed(
                vec![s()],
                vec![
                    exited("i1-0", "s0", "i1", 0, 0, 980),
                    exited("i2-0", "s0", "i2", 0, 0, 990),
                ],
            ),
            PodActions {
                start_containers: vec![app(0, "a", 0)],
                ..keep("s0")
            },
        ),
        row(
            "init container failed under Always: restart it with a back-off entry",
            p("Always"),
            observed(vec![s()], vec![exited("i1-0", "s0", "i1", 0, 1, 990)]),
            PodActions {
                start_containers: vec![backed_off(init(0, "i1", 1), 10, 1000)],
                ..keep("s0")
            },
        ),
        row(
            "init container failed under OnFailure: restart it with a back-off entry",
            p("OnFailure"),
            observed(
                vec![s()],
                vec![
                    exited("i1-0", "s0", "i1", 0, 0, 980),
                    exited("i2-0", "s0", "i2", 0, 2, 990),
                ],
            ),
            PodActions {
                start_containers: vec![backed_off(init(1, "i2", 1), 10, 1000)],
                ..keep("s0")
            },
        ),
        row(
            "init container failed under Always inside its back-off: wait",
            p("Always"),
            observed(vec![s()], vec![exited("i1-1", "s0", "i1", 1, 1, 995)]),
            PodActions {
                waiting: vec![BackoffWait {
                    name: "i1".into(),
                    remaining: secs(5),
                    message: "back-off 10s restarting failed container=i1 pod=web_default(uid-1)"
                        .into(),
                }],
                ..keep("s0")
            },
        )
        .backoff("i1", entry(10, 980)),
        row(
            "init container failed under Never: terminal, kill the pod",
            p("Never"),
            observed(vec![s()], vec![exited("i1-0", "s0", "i1", 0, 1, 990)]),
            PodActions {
                kill_pod: Some(INIT_NEVER.into()),
                terminal: true,
                ..Default::default()
            },
        ),
        row(
            "init container created but never started: remove and replace it",
            p("Always"),
            observed(vec![s()], vec![created("i1-0", "s0", "i1", 0)]),
            PodActions {
                start_containers: vec![init(0, "i1", 1)],
                remove_containers: vec!["i1-0".into()],
                ..keep("s0")
            },
        ),
    ]);
}

#[test]
fn restart_policy_by_exit_code() {
    // One app container `a` exited with `code` at 990; now is 1000; no back-off entry yet.
    let cases: [(&str, i32, bool); 6] = [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 1, true),
        ("Never", 0, false),
        ("Never", 1, false),
    ];
    let mut rows = Vec::new();
    for (policy, code, restarts) in cases {
        let name = format!("{policy} × exit {code}");
        let want = if restarts {
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 1), 10, 1000)],
                ..keep("s0")
            }
        } else {
            PodActions {
                kill_pod: Some(ALL_DONE.into()),
                terminal: true,
                ..Default::default()
            }
        };
        rows.push(row(
            name,
            pod(policy, &[], &["a"]),
            observed(
                vec![ready("s0", 0)],
                vec![exited("a0", "s0", "a", 0, code, 990)],
            ),
            want,
        ));
    }
    rows.push(row(
        "Never: one failed, one still running: not terminal yet",
        pod("Never", &[], &["a", "b"]),
        observed(
            vec![ready("s0", 0)],
            vec![
                exited("a0", "s0", "a", 0, 1, 990),
                running("b0", "s0", "b", 0),
            ],
        ),
        keep("s0"),
    ));
    rows.push(row(
        "OnFailure: all done, sandbox already dead: terminal, nothing left to kill",
        pod("OnFailure", &[], &["a", "b"]),
        observed(
            vec![dead("s0", 0)],
            vec![
                exited("a0", "s0", "a", 0, 0, 990),
                exited("b0", "s0", "b", 0, 0, 991),
            ],
        ),
        PodActions {
            terminal: true,
            ..Default::default()
        },
    ));
    rows.push(row(
        "OnFailure: succeeded in an earlier sandbox, new sandbox ready: not run again",
        pod("OnFailure", &[], &["a", "b"]),
        observed(
            vec![dead("s0", 0), ready("s1", 1)],
            vec![
                exited("a0", "s0", "a", 0, 0, 990),
                exited("b0", "s0", "b", 0, 1, 990),
            ],
        ),
        PodActions {
            start_containers: vec![app(1, "b", 1)],
            ..keep("s1")
        },
    ));
    run(rows);
}

/// `p` with app container `name` given its own `restartPolicy` and, when `rule_codes` is not
/// empty, one `Restart` rule on those exit codes (`In`).
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
fn container_restart_policy_and_rules() {
    // App container `a` exited with `code` at 990; now is 1000; no back-off entry yet. The
    // container's own policy and rules override the pod's (ContainerRestartRules).
    let cases: [(&str, &str, &[i32], i32, bool); 8] = [
        ("Never", "Always", &[], 1, true),
        ("Never", "Always", &[], 0, true),
        ("Never", "OnFailure", &[], 1, true),
        ("Never", "OnFailure", &[], 0, false),
        ("Always", "Never", &[], 1, false),
        ("OnFailure", "Never", &[], 1, false),
        ("Never", "Never", &[42], 42, true),
        ("Never", "Never", &[42], 1, false),
    ];
    let mut rows = Vec::new();
    for (pod_policy, policy, rules, code, restarts) in cases {
        let want = if restarts {
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 1), 10, 1000)],
                ..keep("s0")
            }
        } else {
            PodActions {
                kill_pod: Some(ALL_DONE.into()),
                terminal: true,
                ..Default::default()
            }
        };
        rows.push(row(
            format!("pod {pod_policy}, container {policy}, rules {rules:?} × exit {code}"),
            with_container_policy(pod(pod_policy, &[], &["a"]), "a", policy, rules),
            observed(
                vec![ready("s0", 0)],
                vec![exited("a0", "s0", "a", 0, code, 990)],
            ),
            want,
        ));
    }
    rows.push(row(
        "pod Always, `a` Never exited, `b` running: `a` stays down, the pod runs on",
        with_container_policy(pod("Always", &[], &["a", "b"]), "a", "Never", &[]),
        observed(
            vec![ready("s0", 0)],
            vec![
                exited("a0", "s0", "a", 0, 1, 990),
                running("b0", "s0", "b", 0),
            ],
        ),
        keep("s0"),
    ));
    rows.push(row(
        "pod Never, init container Always-by-rule failed: retried, not terminal",
        with_container_policy(pod("Never", &["i"], &["a"]), "i", "Never", &[3]),
        observed(
            vec![ready("s0", 0)],
            vec![exited("i0", "s0", "i", 0, 3, 990)],
        ),
        PodActions {
            start_containers: vec![backed_off(init(0, "i", 1), 10, 1000)],
            ..keep("s0")
        },
    ));
    rows.push(row(
        "pod Always, init container Never failed: the pod is done",
        with_container_policy(pod("Always", &["i"], &["a"]), "i", "Never", &[]),
        observed(
            vec![ready("s0", 0)],
            vec![exited("i0", "s0", "i", 0, 1, 990)],
        ),
        PodActions {
            kill_pod: Some(INIT_NEVER.into()),
            terminal: true,
            ..Default::default()
        },
    ));
    rows.push(row(
        "pod Always, OnFailure container succeeded in an earlier sandbox: not run again",
        with_container_policy(pod("Always", &[], &["a", "b"]), "a", "OnFailure", &[]),
        observed(
            vec![dead("s0", 0)],
            vec![
                exited("a0", "s0", "a", 0, 0, 990),
                exited("b0", "s0", "b", 0, 1, 990),
            ],
        ),
        PodActions {
            kill_pod: Some("the pod sandbox is not ready".into()),
            create_sandbox: Some(1),
            start_containers: vec![backed_off(app(1, "b", 1), 10, 1000)],
            ..Default::default()
        },
    ));
    run(rows);
}

#[test]
fn backoff_windows() {
    let p = || always(&["a"]);
    let crashed = |finished| {
        observed(
            vec![ready("s0", 0)],
            vec![exited("a3", "s0", "a", 3, 1, finished)],
        )
    };
    run(vec![
        row(
            "inside the window: wait the exact remainder, start nothing",
            p(),
            crashed(995),
            PodActions {
                waiting: vec![BackoffWait {
                    name: "a".into(),
                    remaining: secs(15),
                    message: "back-off 20s restarting failed container=a pod=web_default(uid-1)"
                        .into(),
                }],
                ..keep("s0")
            },
        )
        .backoff("a", entry(20, 980)),
        row(
            "inside the window, but the container's image changed: start now, back off afresh",
            {
                let mut p = p();
                p.spec.as_mut().unwrap().containers[0].image = Some("img-a:2".into());
                p
            },
            crashed(995),
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 4), 10, 1000)],
                ..keep("s0")
            },
        )
        .backoff("a", entry(20, 980)),
        row(
            "window just ended: start with the doubled delay",
            p(),
            crashed(995),
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 4), 40, 1015)],
                ..keep("s0")
            },
        )
        .at(1015)
        .backoff("a", entry(20, 980)),
        row(
            "doubling stops at the maximum",
            p(),
            crashed(995),
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 4), 300, 1400)],
                ..keep("s0")
            },
        )
        .at(1400)
        .backoff("a", entry(160, 900)),
        row(
            "delay in minutes is written like Go",
            p(),
            crashed(995),
            PodActions {
                waiting: vec![BackoffWait {
                    name: "a".into(),
                    remaining: secs(155),
                    message: "back-off 2m40s restarting failed container=a pod=web_default(uid-1)"
                        .into(),
                }],
                ..keep("s0")
            },
        )
        .backoff("a", entry(160, 900)),
        row(
            "entry not updated for over ten minutes: start at once with the initial delay",
            p(),
            crashed(995),
            PodActions {
                start_containers: vec![backed_off(app(0, "a", 4), 10, 1000)],
                ..keep("s0")
            },
        )
        .backoff("a", entry(300, 394)),
        row(
            "entry updated exactly ten minutes ago is still in force",
            p(),
            crashed(995),
            PodActions {
                waiting: vec![BackoffWait {
                    name: "a".into(),
                    remaining: secs(295),
                    message: "back-off 5m0s restarting failed container=a pod=web_default(uid-1)"
                        .into(),
                }],
                ..keep("s0")
            },
        )
        .backoff("a", entry(300, 395)),
    ]);
}

#[test]
fn backoff_remaining_is_exact_below_a_second() {
    let mut inst = exited("a0", "s0", "a", 0, 1, 995);
    inst.finished_at += 250_000_000;
    let key = crate::kubelet::runtime::backoff::container_key("a", &hash_of(&spec_container("a")));
    let table: BackoffTable = [(key, entry(10, 990))].into();
    let ctx = DecisionContext {
        now: t(1004),
        backoff: &table,
        policy: BackoffPolicy::default(),
        spec_hash: &hash_of,
        unhealthy: &HashMap::new(),
        probes: &HashMap::new(),
        actuated: &HashMap::new(),
        pod_level: Default::default(),
    };
    let got = compute_pod_actions(
        &always(&["a"]),
        &observed(vec![ready("s0", 0)], vec![inst]),
        &ctx,
    );
    assert_eq!(got.waiting.len(), 1);
    assert_eq!(got.waiting[0].remaining, Duration::from_millis(1250));
    assert_eq!(got.retry_after(), Some(Duration::from_millis(1250)));
    assert!(got.start_containers.is_empty());
}

#[test]
fn replacing_and_garbage() {
    run(vec![
        row(
            "spec hash changed on a running container: kill it and start restart_count+1",
            always(&["a", "b"]),
            observed(
                vec![ready("s0", 0)],
                vec![
                    with_hash(running("a2", "s0", "a", 2), "h-old"),
                    running("b0", "s0", "b", 0),
                ],
            ),
            PodActions {
                kill_containers: vec![kill("a2", "a")],
                start_containers: vec![app(0, "a", 3)],
                ..keep("s0")
            },
        ),
        row(
            "no hash recorded on the instance: left alone",
            always(&["a"]),
            observed(
                vec![ready("s0", 0)],
                vec![ObservedContainer {
                    hash: None,
                    ..running("a0", "s0", "a", 0)
                }],
            ),
            keep("s0"),
        ),
        row(
            "created but never started: removed and replaced",
            always(&["a"]),
            observed(
                vec![ready("s0", 0)],
                vec![
                    exited("a0", "s0", "a", 0, 1, 900),
                    created("a1", "s0", "a", 1),
                ],
            ),
            PodActions {
                start_containers: vec![app(0, "a", 2)],
                remove_containers: vec!["a1".into()],
                ..keep("s0")
            },
        ),
        row(
            "keeps the newest two instances per name, removes older exited ones",
            always(&["a", "b"]),
            observed(
                vec![ready("s0", 0)],
                vec![
                    exited("a0", "s0", "a", 0, 1, 700),
                    exited("a1", "s0", "a", 1, 1, 800),
                    exited("a2", "s0", "a", 2, 1, 900),
                    running("a3", "s0", "a", 3),
                    exited("b0", "s0", "b", 0, 1, 800),
                    running("b1", "s0", "b", 1),
                ],
            ),
            PodActions {
                remove_containers: vec!["a0".into(), "a1".into()],
                ..keep("s0")
            },
        ),
        row(
            "dead sandboxes other than the newest are removed with their old instances",
            always(&["a"]),
            observed(
                vec![dead("s0", 0), dead("s1", 1), ready("s2", 2)],
                vec![
                    exited("a0", "s0", "a", 0, 1, 700),
                    exited("a1", "s1", "a", 1, 1, 800),
                    running("a2", "s2", "a", 2),
                ],
            ),
            PodActions {
                remove_sandboxes: vec!["s0".into()],
                remove_containers: vec!["a0".into()],
                ..keep("s2")
            },
        ),
        row(
            "a dead sandbox holding the instance that carries the restart count is kept",
            pod("Always", &["i1"], &["a"]),
            observed(
                vec![dead("s0", 0), ready("s1", 1)],
                vec![
                    exited("i0", "s0", "i1", 0, 0, 700),
                    exited("a0", "s0", "a", 0, 137, 800),
                    running("i1", "s1", "i1", 1),
                ],
            ),
            keep("s1"),
        ),
        row(
            "restart counts continue from the highest attempt seen, across sandboxes",
            pod("Always", &["i1"], &["a"]),
            observed(
                vec![dead("s0", 0), ready("s1", 1)],
                vec![
                    exited("i0", "s0", "i1", 0, 0, 700),
                    exited("a4", "s0", "a", 4, 137, 800),
                    exited("a3", "s0", "a", 3, 1, 600),
                    exited("i1", "s1", "i1", 1, 0, 990),
                ],
            ),
            PodActions {
                start_containers: vec![app(0, "a", 5)],
                ..keep("s1")
            },
        ),
        row(
            "terminal pod: old dead sandboxes still go",
            pod("Never", &[], &["a"]),
            observed(
                vec![dead("s0", 0), dead("s1", 1)],
                vec![exited("a0", "s1", "a", 0, 0, 990)],
            ),
            PodActions {
                remove_sandboxes: vec!["s0".into()],
                terminal: true,
                ..Default::default()
            },
        ),
    ]);
}

#[test]
fn format_delay_matches_go() {
    for (d, want) in [
        (secs(10), "10s"),
        (secs(59), "59s"),
        (secs(60), "1m0s"),
        (secs(80), "1m20s"),
        (secs(300), "5m0s"),
        (Duration::from_millis(200), "200ms"),
    ] {
        assert_eq!(format_delay(d), want, "{d:?}");
    }
}

/// A pod whose first init container is a sidecar (`restartPolicy: Always`), then a regular
/// init container, then the app.
fn with_sidecar(policy: &str) -> Pod {
    let mut p = pod(policy, &["side", "i1"], &["a"]);
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
        Some("Always".into());
    p
}

#[test]
fn sidecars() {
    let s = || ready("s0", 0);
    let mut with_startup = with_sidecar("Always");
    with_startup
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .startup_probe = Some(Default::default());
    run(vec![
        row(
            "a new sandbox starts the sidecar first",
            with_sidecar("Always"),
            observed(vec![s()], vec![]),
            PodActions {
                start_containers: vec![init(0, "side", 0)],
                ..keep("s0")
            },
        ),
        row(
            "the next init container starts once the sidecar runs",
            with_sidecar("Always"),
            observed(vec![s()], vec![running("side-0", "s0", "side", 0)]),
            PodActions {
                start_containers: vec![init(1, "i1", 0)],
                ..keep("s0")
            },
        ),
        row(
            "a sidecar with a startup probe holds the next init container until it has started",
            with_startup,
            observed(vec![s()], vec![running("side-0", "s0", "side", 0)]),
            keep("s0"),
        ),
        row(
            "the app starts beside the running sidecar after the init container",
            with_sidecar("Always"),
            observed(
                vec![s()],
                vec![
                    running("side-0", "s0", "side", 0),
                    exited("i1-0", "s0", "i1", 0, 0, 990),
                ],
            ),
            PodActions {
                start_containers: vec![app(0, "a", 0)],
                ..keep("s0")
            },
        ),
        row(
            "an exited sidecar is restarted even under restartPolicy Never",
            with_sidecar("Never"),
            observed(
                vec![s()],
                vec![
                    exited("side-0", "s0", "side", 0, 0, 990),
                    exited("i1-0", "s0", "i1", 0, 0, 980),
                    running("a-0", "s0", "a", 0),
                ],
            ),
            PodActions {
                start_containers: vec![backed_off(init(0, "side", 1), 10, 1000)],
                ..keep("s0")
            },
        ),
        row(
            "a sidecar's failure never fails the pod under Never",
            with_sidecar("Never"),
            observed(
                vec![s()],
                vec![
                    exited("side-0", "s0", "side", 0, 1, 990),
                    exited("i1-0", "s0", "i1", 0, 0, 980),
                    running("a-0", "s0", "a", 0),
                ],
            ),
            PodActions {
                start_containers: vec![backed_off(init(0, "side", 1), 10, 1000)],
                ..keep("s0")
            },
        ),
        row(
            "the app finished under Never: the pod is done and the running sidecar is stopped",
            with_sidecar("Never"),
            observed(
                vec![s()],
                vec![
                    running("side-0", "s0", "side", 0),
                    exited("i1-0", "s0", "i1", 0, 0, 980),
                    exited("a-0", "s0", "a", 0, 0, 990),
                ],
            ),
            PodActions {
                kill_pod: Some(ALL_DONE.into()),
                terminal: true,
                ..Default::default()
            },
        ),
    ]);
}

#[test]
fn liveness_failures_kill_the_instance() {
    let unhealthy = HashMap::from([(
        "a-0".to_string(),
        crate::kubelet::prober::Unhealthy {
            container_name: "a".into(),
            message: "Container a failed liveness probe, will be restarted".into(),
            grace_override: Some(5),
        },
    )]);
    let table = BackoffTable::new();
    let ctx = DecisionContext {
        now: t(1000),
        backoff: &table,
        policy: BackoffPolicy::default(),
        spec_hash: &hash_of,
        unhealthy: &unhealthy,
        probes: &HashMap::new(),
        actuated: &HashMap::new(),
        pod_level: Default::default(),
    };
    let got = compute_pod_actions(
        &always(&["a"]),
        &observed(vec![ready("s0", 0)], vec![running("a-0", "s0", "a", 0)]),
        &ctx,
    );
    assert_eq!(
        got,
        PodActions {
            kill_containers: vec![KillContainer {
                id: "a-0".into(),
                name: "a".into(),
                reason: "Container a failed liveness probe, will be restarted".into(),
                grace_override: Some(5),
            }],
            ..keep("s0")
        }
    );
}

// ---- ephemeral containers -------------------------------------------------------------------

fn with_ephemeral(mut p: Pod, names: &[&str]) -> Pod {
    p.spec.as_mut().unwrap().ephemeral_containers = Some(
        names
            .iter()
            .map(|n| k8s_openapi::api::core::v1::EphemeralContainer {
                name: n.to_string(),
                image: Some(format!("img-{n}:1")),
                ..Default::default()
            })
            .collect(),
    );
    p
}

fn debug(index: usize, name: &str) -> StartContainer {
    StartContainer {
        kind: ContainerKind::Ephemeral,
        ..app(index, name, 0)
    }
}

#[test]
fn ephemeral_containers_start_once_in_the_running_sandbox() {
    run(vec![
        row(
            "added to a running pod: started in its sandbox",
            with_ephemeral(always(&["a"]), &["dbg"]),
            observed(vec![ready("s0", 0)], vec![running("a0", "s0", "a", 0)]),
            PodActions {
                sandbox_id: Some("s0".into()),
                start_containers: vec![debug(0, "dbg")],
                ..Default::default()
            },
        ),
        row(
            "a second one added: only the new one starts, by its index",
            with_ephemeral(always(&["a"]), &["dbg", "dbg2"]),
            observed(
                vec![ready("s0", 0)],
                vec![running("a0", "s0", "a", 0), running("d0", "s0", "dbg", 0)],
            ),
            PodActions {
                sandbox_id: Some("s0".into()),
                start_containers: vec![debug(1, "dbg2")],
                ..Default::default()
            },
        ),
        row(
            "one that exited, even with a failure, is never started again",
            with_ephemeral(always(&["a"]), &["dbg"]),
            observed(
                vec![ready("s0", 0)],
                vec![
                    running("a0", "s0", "a", 0),
                    exited("d0", "s0", "dbg", 0, 1, 900),
                ],
            ),
            keep("s0"),
        ),
        row(
            "while an init container still runs: started before it is done, as upstream",
            with_ephemeral(pod("Always", &["i1"], &["a"]), &["dbg"]),
            observed(vec![ready("s0", 0)], vec![running("i0", "s0", "i1", 0)]),
            PodActions {
                sandbox_id: Some("s0".into()),
                start_containers: vec![debug(0, "dbg")],
                ..Default::default()
            },
        ),
        row(
            "a new sandbox: only the pod's own containers start in it",
            with_ephemeral(always(&["a"]), &["dbg"]),
            nothing(),
            PodActions {
                create_sandbox: Some(0),
                start_containers: vec![app(0, "a", 0)],
                ..Default::default()
            },
        ),
        row(
            "a running ephemeral container does not keep a finished pod going",
            with_ephemeral(pod("Never", &[], &["a"]), &["dbg"]),
            observed(
                vec![ready("s0", 0)],
                vec![
                    exited("a0", "s0", "a", 0, 0, 900),
                    running("d0", "s0", "dbg", 0),
                ],
            ),
            PodActions {
                kill_pod: Some(ALL_DONE.into()),
                terminal: true,
                ..Default::default()
            },
        ),
    ]);
}

/// A running container whose allocation changed: resized in place under the default policy,
/// restarted (with upstream's message) when its `resizePolicy` asks for that; an instance with
/// no record of what it runs with is left alone.
fn cpu_request(v: &str) -> k8s_openapi::api::core::v1::ResourceRequirements {
    serde_json::from_value(serde_json::json!({"requests": {"cpu": v}})).expect("resources")
}

/// The decision for `pod` whose container `name` runs as instance `<name>-0`, given what the
/// running instances were given.
fn decide_running(
    pod: &Pod,
    name: &str,
    actuated: &HashMap<String, k8s_openapi::api::core::v1::ResourceRequirements>,
) -> PodActions {
    let table = BackoffTable::new();
    let ctx = DecisionContext {
        now: t(1000),
        backoff: &table,
        policy: BackoffPolicy::default(),
        spec_hash: &hash_of,
        unhealthy: &HashMap::new(),
        probes: &HashMap::new(),
        actuated,
        pod_level: Default::default(),
    };
    let id = format!("{name}-0");
    compute_pod_actions(
        pod,
        &observed(vec![ready("s0", 0)], vec![running(&id, "s0", name, 0)]),
        &ctx,
    )
}

fn restart_on_cpu_resize(c: &mut Container) {
    c.resize_policy = Some(vec![k8s_openapi::api::core::v1::ContainerResizePolicy {
        resource_name: "cpu".into(),
        restart_policy: "RestartContainer".into(),
    }]);
}

fn first_init(p: &mut Pod) -> &mut Container {
    &mut p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0]
}

fn kill_reasons(actions: &PodActions) -> Vec<&str> {
    actions
        .kill_containers
        .iter()
        .map(|k| k.reason.as_str())
        .collect()
}

#[test]
fn an_allocated_resize_goes_in_place_or_restarts_by_policy() {
    let actuated = HashMap::from([("a-0".to_string(), cpu_request("100m"))]);
    let mut resized = always(&["a"]);
    resized.spec.as_mut().unwrap().containers[0].resources = Some(cpu_request("200m"));
    assert_eq!(
        decide_running(&resized, "a", &actuated),
        PodActions {
            resize_containers: vec![ResizeContainer {
                id: "a-0".into(),
                name: "a".into(),
            }],
            ..keep("s0")
        }
    );
    assert_eq!(
        decide_running(&resized, "a", &HashMap::new()),
        keep("s0"),
        "nothing known"
    );
    restart_on_cpu_resize(&mut resized.spec.as_mut().unwrap().containers[0]);
    let got = decide_running(&resized, "a", &actuated);
    assert_eq!(got.resize_containers, vec![]);
    assert_eq!(
        kill_reasons(&got),
        vec!["Container a resize requires restart"]
    );
    assert_eq!(got.start_containers.len(), 1);
}

#[test]
fn a_running_init_container_is_resized_in_place_or_restarted_in_the_same_step() {
    let actuated = HashMap::from([("i-0".to_string(), cpu_request("100m"))]);
    let mut resized = pod("Never", &["i"], &["a"]);
    first_init(&mut resized).resources = Some(cpu_request("200m"));
    assert_eq!(
        decide_running(&resized, "i", &actuated),
        PodActions {
            resize_containers: vec![ResizeContainer {
                id: "i-0".into(),
                name: "i".into(),
            }],
            ..keep("s0")
        },
        "in place, and the app containers still wait"
    );
    restart_on_cpu_resize(first_init(&mut resized));
    let got = decide_running(&resized, "i", &actuated);
    assert_eq!(got.resize_containers, vec![]);
    assert_eq!(
        kill_reasons(&got),
        vec!["Container i resize requires restart"]
    );
    assert_eq!(got.start_containers, vec![init(0, "i", 1)]);
    assert!(
        !got.terminal,
        "a restart for a resize is no failure under Never"
    );
}

/// `p` with container `name` given its own `restartPolicy` and one `RestartAllContainers` rule
/// on exit code 42.
fn with_restart_all(mut p: Pod, name: &str, policy: &str) -> Pod {
    p = with_container_policy(p, name, policy, &[]);
    let spec = p.spec.as_mut().unwrap();
    let c = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .find(|c| c.name == name)
        .unwrap();
    c.restart_policy_rules = Some(vec![
        serde_json::from_value(serde_json::json!({
            "action": "RestartAllContainers",
            "exitCodes": {"operator": "In", "values": [42]},
        }))
        .unwrap(),
    ]);
    p
}

/// An instance made at `made` seconds.
fn made_at(mut c: ObservedContainer, made: u64) -> ObservedContainer {
    c.created_at = ns(made);
    c
}

#[test]
fn restart_all_containers_runs_a_new_round_in_the_same_sandbox() {
    // Pod Never: init `i`, sidecar `sc`, apps `src` (Never, RestartAllContainers on 42) and
    // `reg`. The first round ran at 10-15; `src` exited 42 at 100; now is 1000.
    let p = || {
        let p = pod("Never", &["i", "sc"], &["src", "reg"]);
        with_restart_all(
            with_container_policy(p, "sc", "Always", &[]),
            "src",
            "Never",
        )
    };
    let first_round = || {
        vec![
            made_at(exited("i0", "s0", "i", 0, 0, 12), 10),
            made_at(running("sc0", "s0", "sc", 0), 13),
            made_at(exited("src0", "s0", "src", 0, 42, 100), 14),
            made_at(running("reg0", "s0", "reg", 0), 15),
        ]
    };
    let stop = |id: &str, name: &str, trigger: &str| KillContainer {
        id: id.into(),
        name: name.into(),
        reason: format!(
            "Container {trigger} exited with code 42, which its restart rule maps to \
             RestartAllContainers: every container of the pod runs again"
        ),
        grace_override: Some(0),
    };
    let of_round = |mut c: ObservedContainer, round: &str| {
        c.round = Some(round.into());
        c
    };
    let for_round = |mut s: StartContainer, round: &str| {
        s.round = Some(round.into());
        s
    };
    let stopped = || {
        let mut v = first_round();
        v[1] = made_at(exited("sc0", "s0", "sc", 0, 137, 101), 13);
        v[3] = made_at(exited("reg0", "s0", "reg", 0, 137, 101), 15);
        v
    };
    let mut late = first_round();
    // Made after the exit by a sync that had not seen it yet: an earlier round's.
    late[3] = made_at(running("reg0", "s0", "reg", 0), 105);
    let mut initialized = stopped();
    initialized.push(of_round(
        made_at(exited("i1", "s0", "i", 1, 0, 112), 110),
        "src0",
    ));
    initialized.push(of_round(
        made_at(running("sc1", "s0", "sc", 1), 113),
        "src0",
    ));
    let mut never_started = first_round();
    never_started[1] = made_at(exited("sc0", "s0", "sc", 0, 137, 101), 13);
    never_started[3] = made_at(created("reg0", "s0", "reg", 0), 15);
    let mut again = initialized.clone();
    again.push(of_round(
        made_at(exited("src1", "s0", "src", 1, 42, 200), 120),
        "src0",
    ));
    again.push(of_round(
        made_at(running("reg1", "s0", "reg", 1), 121),
        "src0",
    ));
    run(vec![
        row(
            "the exit stops what still runs at once, apps first, and nothing starts yet",
            p(),
            observed(vec![ready("s0", 0)], first_round()),
            PodActions {
                kill_containers: vec![stop("reg0", "reg", "src"), stop("sc0", "sc", "src")],
                ..keep("s0")
            },
        ),
        row(
            "a container started after the exit, before the agent saw it, is stopped too",
            p(),
            observed(vec![ready("s0", 0)], late),
            PodActions {
                kill_containers: vec![stop("reg0", "reg", "src"), stop("sc0", "sc", "src")],
                ..keep("s0")
            },
        ),
        row(
            "all stopped: the round starts at the first init container, counting on",
            p(),
            observed(vec![ready("s0", 0)], stopped()),
            PodActions {
                start_containers: vec![for_round(init(0, "i", 1), "src0")],
                ..keep("s0")
            },
        ),
        row(
            "the round's init containers done: every app container starts, none backed off",
            p(),
            observed(vec![ready("s0", 0)], initialized),
            PodActions {
                start_containers: vec![
                    for_round(app(0, "src", 1), "src0"),
                    for_round(app(1, "reg", 1), "src0"),
                ],
                ..keep("s0")
            },
        ),
        row(
            "a container made and never started in the earlier round is removed",
            p(),
            observed(vec![ready("s0", 0)], never_started),
            PodActions {
                remove_containers: vec!["reg0".into()],
                start_containers: vec![for_round(init(0, "i", 1), "src0")],
                ..keep("s0")
            },
        ),
        row(
            "another matching exit starts another round",
            p(),
            observed(vec![ready("s0", 0)], again),
            PodActions {
                kill_containers: vec![stop("reg1", "reg", "src"), stop("sc1", "sc", "src")],
                ..keep("s0")
            },
        ),
    ]);
}
