//! Reads what the runtime holds for Deckhand's pods and turns it into [`ObservedPod`]s.
//!
//! Three ways to read, from the widest to the narrowest:
//! - [`observe_all`] (the relist): two list calls see everything of the node;
//! - [`observe_pod`]: the same two lists, filtered by the pod's labels, for a pod whose objects
//!   nobody knows yet;
//! - [`observe_known_pod`]: a pod whose single sandbox is known costs that sandbox's status and
//!   one list of the containers in it; and [`refresh_after_start`] reads only what a step just
//!   made (a status call per new object). containerd walks every container of the node for a
//!   list, whatever the filter, so on a node with many pods the lists are what a worker must
//!   avoid; a status call is a lookup by ID.
//!
//! The per-object status calls (exit code, times, IP) are made only when an object is new or
//! changed state, and remembered in a [`DetailCache`]: an exited container's status never
//! changes, a sandbox's IP neither. That keeps a relist of a busy node to two calls when
//! nothing happens.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::clients::cri::RuntimeService;
use crate::clients::cri::proto::{
    self, ContainerFilter, NamespaceMode, PodSandboxFilter, PodSandboxState,
};
use crate::clients::cri::service::CriResult;

use crate::base::cri_labels;
use crate::base::observed::{
    ContainerState, ObservedContainer, ObservedPod, ObservedSandbox, SandboxState,
};

#[derive(Clone, Debug)]
struct SandboxDetail {
    ip: Option<String>,
    additional_ips: Vec<String>,
    host_network: bool,
    /// What the status call said besides the network, for a view built from it alone (the
    /// state as read then: only trusted right after the read).
    ready: bool,
    created_at: i64,
    attempt: u32,
    /// The pod's UID, namespace and name from the sandbox's labels.
    uid: Option<String>,
    names: Option<(String, String)>,
}

#[derive(Clone, Debug)]
struct ContainerDetail {
    state: i32,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    /// The image reference the status call gives (a repo digest when the image has one), as
    /// upstream reports it for `imageID`; the same whichever way the container was read.
    image_ref: String,
}

/// Remembered per-object status answers, keyed by ID (and, for containers, the state they were
/// read in). Shared by the PLEG and the pod workers.
#[derive(Clone, Default)]
pub struct DetailCache {
    sandboxes: Arc<Mutex<HashMap<String, SandboxDetail>>>,
    containers: Arc<Mutex<HashMap<String, ContainerDetail>>>,
}

impl DetailCache {
    /// Drops entries for objects the runtime no longer lists.
    pub fn retain(&self, sandbox_ids: &[&str], container_ids: &[&str]) {
        let keep_s: std::collections::HashSet<&str> = sandbox_ids.iter().copied().collect();
        let keep_c: std::collections::HashSet<&str> = container_ids.iter().copied().collect();
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep_s.contains(k.as_str()));
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep_c.contains(k.as_str()));
    }

    /// Forgets one container, so its next status is read afresh.
    pub fn forget_container(&self, id: &str) {
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

pub use crate::base::cri_labels::{managed_selector, pod_selector};

/// A sandbox's IP, read once and remembered (the start of a pod's containers needs it, and
/// the observation right after then reads no status again).
pub async fn sandbox_ip<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    sandbox_id: &str,
) -> CriResult<Option<String>> {
    Ok(sandbox_detail(rt, cache, sandbox_id).await?.ip)
}

async fn sandbox_detail<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    sandbox_id: &str,
) -> CriResult<SandboxDetail> {
    if let Some(d) = cache
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(sandbox_id)
    {
        return Ok(d.clone());
    }
    read_sandbox(rt, cache, sandbox_id).await
}

/// Asks for a sandbox's status (always a call) and remembers what it said.
async fn read_sandbox<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    sandbox_id: &str,
) -> CriResult<SandboxDetail> {
    let resp = rt.pod_sandbox_status(sandbox_id.to_string()).await?;
    let status = resp.status.unwrap_or_default();
    let network = status.network.unwrap_or_default();
    let host_network = status
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .is_some_and(|o| o.network == NamespaceMode::Node as i32);
    let label = |k: &str| status.labels.get(k).cloned();
    let detail = SandboxDetail {
        ip: (!network.ip.is_empty()).then_some(network.ip),
        additional_ips: network.additional_ips.into_iter().map(|p| p.ip).collect(),
        host_network,
        ready: status.state == PodSandboxState::SandboxReady as i32,
        created_at: status.created_at,
        attempt: status.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
        uid: label(cri_labels::POD_UID_LABEL),
        names: label(cri_labels::POD_NAMESPACE_LABEL).zip(label(cri_labels::POD_NAME_LABEL)),
    };
    cache
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(sandbox_id.to_string(), detail.clone());
    Ok(detail)
}

fn observed_sandbox(id: &str, detail: SandboxDetail, ready: bool) -> ObservedSandbox {
    ObservedSandbox {
        id: id.to_string(),
        attempt: detail.attempt,
        state: if ready {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        },
        created_at: detail.created_at,
        ip: detail.ip,
        additional_ips: detail.additional_ips,
        host_network: detail.host_network,
    }
}

async fn container_detail<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    container: &proto::Container,
) -> CriResult<ContainerDetail> {
    if let Some(d) = cache
        .containers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&container.id)
        && d.state == container.state
    {
        return Ok(d.clone());
    }
    let resp = rt.container_status(container.id.clone()).await?;
    let s = resp.status.unwrap_or_default();
    let detail = container_detail_of(&s);
    // Remember only what is settled; a container read while changing is read again.
    if detail.state == container.state {
        cache
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(container.id.clone(), detail.clone());
    }
    Ok(detail)
}

fn container_detail_of(s: &proto::ContainerStatus) -> ContainerDetail {
    ContainerDetail {
        state: s.state,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: s.message.clone(),
        image_ref: s.image_ref.clone(),
    }
}

fn container_state(state: i32) -> ContainerState {
    match proto::ContainerState::try_from(state) {
        Ok(proto::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(proto::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(proto::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// Reads every managed sandbox and container, grouped by pod UID.
pub async fn observe_all<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    node: &str,
) -> CriResult<BTreeMap<String, ObservedPod>> {
    observe(rt, cache, managed_selector(node), true).await
}

/// Reads one pod's sandboxes and containers.
pub async fn observe_pod<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    node: &str,
    uid: &str,
) -> CriResult<ObservedPod> {
    let mut all = observe(rt, cache, pod_selector(node, uid), false).await?;
    Ok(all.remove(uid).unwrap_or_default())
}

async fn observe<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    selector: HashMap<String, String>,
    prune: bool,
) -> CriResult<BTreeMap<String, ObservedPod>> {
    let sandboxes = rt
        .list_pod_sandbox(Some(PodSandboxFilter {
            label_selector: selector.clone(),
            ..Default::default()
        }))
        .await?;
    let containers = rt
        .list_containers(Some(ContainerFilter {
            label_selector: selector,
            ..Default::default()
        }))
        .await?;
    if prune {
        let s: Vec<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        let c: Vec<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        cache.retain(&s, &c);
    }

    let mut pods: BTreeMap<String, ObservedPod> = BTreeMap::new();
    for sb in &sandboxes {
        let Some(uid) = sb.labels.get(cri_labels::POD_UID_LABEL) else {
            continue;
        };
        let detail = match sandbox_detail(rt, cache, &sb.id).await {
            Ok(d) => d,
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let entry = pods.entry(uid.clone()).or_default();
        if entry.names.is_none()
            && let (Some(ns), Some(name)) = (
                sb.labels.get(cri_labels::POD_NAMESPACE_LABEL),
                sb.labels.get(cri_labels::POD_NAME_LABEL),
            )
        {
            entry.names = Some((ns.clone(), name.clone()));
        }
        let mut seen = observed_sandbox(
            &sb.id,
            detail,
            sb.state == PodSandboxState::SandboxReady as i32,
        );
        // The list's own answers win over what the status call said when it was made.
        seen.attempt = sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        seen.created_at = sb.created_at;
        entry.sandboxes.push(seen);
    }
    for c in &containers {
        let Some(uid) = c.labels.get(cri_labels::POD_UID_LABEL) else {
            continue;
        };
        let detail = match container_detail(rt, cache, c).await {
            Ok(d) => d,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        if let Some(seen) = observed_container(listed(c), detail) {
            pods.entry(uid.clone()).or_default().containers.push(seen);
        }
    }
    Ok(pods)
}

/// The parts of a container that both a list entry and a status answer carry.
struct ContainerFacts<'a> {
    id: &'a str,
    sandbox_id: &'a str,
    metadata: Option<&'a proto::ContainerMetadata>,
    created_at: i64,
    labels: &'a HashMap<String, String>,
    annotations: &'a HashMap<String, String>,
    image: Option<&'a proto::ImageSpec>,
    image_ref: &'a str,
}

fn listed(c: &proto::Container) -> ContainerFacts<'_> {
    ContainerFacts {
        id: &c.id,
        sandbox_id: &c.pod_sandbox_id,
        metadata: c.metadata.as_ref(),
        created_at: c.created_at,
        labels: &c.labels,
        annotations: &c.annotations,
        image: c.image.as_ref(),
        image_ref: &c.image_ref,
    }
}

/// One container as decisions see it; `None` for a container without Deckhand's name label.
fn observed_container(c: ContainerFacts<'_>, detail: ContainerDetail) -> Option<ObservedContainer> {
    let name = c.labels.get(cri_labels::CONTAINER_NAME_LABEL)?;
    Some(ObservedContainer {
        id: c.id.to_string(),
        sandbox_id: c.sandbox_id.to_string(),
        name: name.clone(),
        attempt: c.metadata.map(|m| m.attempt).unwrap_or(0),
        state: container_state(detail.state),
        created_at: c.created_at,
        started_at: detail.started_at,
        finished_at: detail.finished_at,
        exit_code: detail.exit_code,
        reason: detail.reason,
        message: detail.message,
        hash: c
            .annotations
            .get(cri_labels::CONTAINER_HASH_ANNOTATION)
            .cloned(),
        grace_period: c
            .annotations
            .get(cri_labels::POD_TERMINATION_GRACE_PERIOD_ANNOTATION)
            .and_then(|g| g.parse().ok()),
        is_init: c
            .annotations
            .get(cri_labels::CONTAINER_TYPE_ANNOTATION)
            .map(String::as_str)
            == Some(cri_labels::CONTAINER_TYPE_INIT),
        pre_stop: c
            .annotations
            .get(cri_labels::CONTAINER_PRE_STOP_HANDLER_ANNOTATION)
            .cloned(),
        round: c
            .annotations
            .get(cri_labels::RESTART_ROUND_ANNOTATION)
            .cloned(),
        image: c.image.map(|i| i.image.clone()).unwrap_or_default(),
        image_ref: if detail.image_ref.is_empty() {
            c.image_ref.to_string()
        } else {
            detail.image_ref
        },
    })
}

/// Reads a pod from what its last view knows: with one sandbox, that sandbox's status and the
/// containers listed in it (two calls, plus a status call per container that changed state).
/// Anything else (no sandbox or several, the sandbox gone, or not the pod's) falls back to
/// [`observe_pod`]. Only the pod's worker creates its objects, so a single known sandbox is
/// the only one there is.
pub async fn observe_known_pod<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    node: &str,
    uid: &str,
    known: &ObservedPod,
) -> CriResult<ObservedPod> {
    let [sandbox] = known.sandboxes.as_slice() else {
        return observe_pod(rt, cache, node, uid).await;
    };
    let detail = match read_sandbox(rt, cache, &sandbox.id).await {
        Ok(d) if d.uid.as_deref() == Some(uid) => d,
        Ok(_) => return observe_pod(rt, cache, node, uid).await,
        Err(e) if e.is_not_found() => return observe_pod(rt, cache, node, uid).await,
        Err(e) => return Err(e),
    };
    let containers = rt
        .list_containers(Some(ContainerFilter {
            pod_sandbox_id: sandbox.id.clone(),
            label_selector: pod_selector(node, uid),
            ..Default::default()
        }))
        .await?;
    let mut pod = ObservedPod {
        names: detail.names.clone().or_else(|| known.names.clone()),
        ..Default::default()
    };
    let ready = detail.ready;
    pod.sandboxes
        .push(observed_sandbox(&sandbox.id, detail, ready));
    for c in &containers {
        let detail = match container_detail(rt, cache, c).await {
            Ok(d) => d,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        pod.containers.extend(observed_container(listed(c), detail));
    }
    Ok(pod)
}

/// What one step made: the sandbox it created, and each container it created, with the
/// sandbox it went into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Made {
    pub sandbox: Option<String>,
    pub containers: Vec<(String, String)>,
}

/// The view after a step that only made things (no stop, no removal): `before`, plus the
/// sandbox and containers the step made, each read by its own status call (the new sandbox's
/// was usually read for its IP already and costs nothing more). Everything else of the pod is
/// as `before` showed it a moment ago: the worker is the only one who changes it, and an exit
/// meanwhile arrives as an event.
pub async fn refresh_after_start<R: RuntimeService>(
    rt: &R,
    cache: &DetailCache,
    before: &ObservedPod,
    made: &Made,
) -> CriResult<ObservedPod> {
    let mut pod = before.clone();
    if let Some(id) = &made.sandbox {
        match sandbox_detail(rt, cache, id).await {
            Ok(detail) => {
                if pod.names.is_none() {
                    pod.names = detail.names.clone();
                }
                let ready = detail.ready;
                pod.sandboxes.retain(|s| &s.id != id);
                pod.sandboxes.push(observed_sandbox(id, detail, ready));
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    for (id, sandbox_id) in &made.containers {
        let status = match rt.container_status(id.clone()).await {
            Ok(resp) => resp.status.unwrap_or_default(),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let detail = container_detail_of(&status);
        cache
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), detail.clone());
        let facts = ContainerFacts {
            id,
            sandbox_id,
            metadata: status.metadata.as_ref(),
            created_at: status.created_at,
            labels: &status.labels,
            annotations: &status.annotations,
            image: status.image.as_ref(),
            image_ref: &status.image_ref,
        };
        if let Some(seen) = observed_container(facts, detail) {
            pod.containers.retain(|c| &c.id != id);
            pod.containers.push(seen);
        }
    }
    Ok(pod)
}

/// An exit the runtime's event stream told of, for an object a view still shows running (a
/// container) or ready (a sandbox).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeardExit {
    pub id: String,
    /// The exit code, when the event carried it.
    pub exit_code: Option<i32>,
    /// When it exited (nanoseconds since the epoch; 0: not told).
    pub finished_at: i64,
    /// The OOM killer hit it first.
    pub oom: bool,
}

/// The reasons containerd's CRI plugin gives an exited container.
const REASON_OOM: &str = "OOMKilled";
const REASON_COMPLETED: &str = "Completed";
const REASON_ERROR: &str = "Error";

/// Writes exits heard from the event stream into a view that does not show them yet, exactly
/// as the runtime will show them once it catches up (containerd records the event's code and
/// time, and a reason from the code): the worker then acts on the exit at once. A sandbox
/// whose pause process exited is not ready. `now_ns` stands in for an exit time the event did
/// not give. Returns true when some exit came without its code, so the view is still behind
/// and must be read again soon.
pub fn apply_heard_exits(pod: &mut ObservedPod, heard: &[HeardExit], now_ns: i64) -> bool {
    let mut behind = false;
    for h in heard {
        if let Some(c) = pod
            .containers
            .iter_mut()
            .find(|c| c.id == h.id && c.state == ContainerState::Running)
        {
            let Some(code) = h.exit_code else {
                behind = true;
                continue;
            };
            c.state = ContainerState::Exited;
            c.exit_code = code;
            c.finished_at = if h.finished_at > 0 {
                h.finished_at
            } else {
                now_ns
            };
            c.reason = if h.oom {
                REASON_OOM
            } else if code == 0 {
                REASON_COMPLETED
            } else {
                REASON_ERROR
            }
            .to_string();
            c.message.clear();
        } else if let Some(s) = pod
            .sandboxes
            .iter_mut()
            .find(|s| s.id == h.id && s.state == SandboxState::Ready)
        {
            s.state = SandboxState::NotReady;
        }
    }
    behind
}

/// Gives `OOMKilled` to a container the runtime shows killed (137) for another reason when the
/// stream told of its OOM kill: containerd 1.6 may record the exit before it handles the OOM
/// event, and its view then says `Error` for good.
pub fn name_heard_ooms(pod: &mut ObservedPod, oom_heard: impl Fn(&str) -> bool) {
    for c in pod.containers.iter_mut().filter(|c| {
        c.state == ContainerState::Exited && c.exit_code == 137 && c.reason != REASON_OOM
    }) {
        if oom_heard(&c.id) {
            c.reason = REASON_OOM.to_string();
        }
    }
}

/// Shared by the tests of the modules that read pods (this one and the PLEG).
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::clients::cri::fake::FakeCri;
    use crate::clients::cri::proto::{
        ContainerConfig, ContainerMetadata, CreateContainerRequest, PodSandboxConfig,
        PodSandboxMetadata, RunPodSandboxRequest,
    };

    /// A fake runtime holding pod `default/web` (UID `u1`) of node `node` with one running
    /// container `app`: the runtime, the sandbox ID and the container ID.
    pub(crate) async fn one_pod(node: &str) -> (FakeCri, String, String) {
        let rt = FakeCri::default();
        let mut labels = pod_selector(node, "u1");
        labels.insert(cri_labels::POD_NAMESPACE_LABEL.into(), "default".into());
        labels.insert(cri_labels::POD_NAME_LABEL.into(), "web".into());
        let sandbox = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(PodSandboxConfig {
                    metadata: Some(PodSandboxMetadata {
                        name: "web".into(),
                        uid: "u1".into(),
                        namespace: "default".into(),
                        attempt: 0,
                    }),
                    labels: labels.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .pod_sandbox_id;
        labels.insert(cri_labels::CONTAINER_NAME_LABEL.into(), "app".into());
        let container = rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    labels,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap();
        rt.start_container(container.clone()).await.unwrap();
        (rt, sandbox, container)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, state: ContainerState) -> ObservedContainer {
        ObservedContainer {
            id: id.into(),
            sandbox_id: "s1".into(),
            name: id.into(),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 2,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            hash: None,
            image: String::new(),
            image_ref: String::new(),
            grace_period: None,
            is_init: false,
            pre_stop: None,
            round: None,
        }
    }

    fn heard(id: &str, code: Option<i32>, at: i64, oom: bool) -> HeardExit {
        HeardExit {
            id: id.into(),
            exit_code: code,
            finished_at: at,
            oom,
        }
    }

    #[test]
    fn heard_exits_are_written_as_the_runtime_will_show_them() {
        use ContainerState::*;
        // (what was heard, state after, code, finished_at, reason, behind)
        let rows: Vec<(HeardExit, ContainerState, i32, i64, &str, bool)> = vec![
            (
                heard("c", Some(1), 50, false),
                Exited,
                1,
                50,
                "Error",
                false,
            ),
            (
                heard("c", Some(0), 50, false),
                Exited,
                0,
                50,
                "Completed",
                false,
            ),
            (
                heard("c", Some(137), 50, true),
                Exited,
                137,
                50,
                "OOMKilled",
                false,
            ),
            (heard("c", Some(2), 0, false), Exited, 2, 99, "Error", false),
            (heard("c", None, 0, true), Running, 0, 0, "", true),
            (heard("other", Some(1), 50, false), Running, 0, 0, "", false),
        ];
        for (i, (h, state, code, at, reason, behind)) in rows.into_iter().enumerate() {
            let mut pod = ObservedPod {
                containers: vec![container("c", Running)],
                ..Default::default()
            };
            assert_eq!(apply_heard_exits(&mut pod, &[h], 99), behind, "row {i}");
            let c = &pod.containers[0];
            assert_eq!(
                (c.state, c.exit_code, c.finished_at, c.reason.as_str()),
                (state, code, at, reason),
                "row {i}"
            );
        }
    }

    #[test]
    fn a_heard_exit_leaves_what_already_exited_alone_and_unreadies_a_sandbox() {
        let mut done = container("c", ContainerState::Exited);
        done.exit_code = 3;
        done.finished_at = 7;
        let mut pod = ObservedPod {
            containers: vec![done.clone()],
            sandboxes: vec![ObservedSandbox {
                id: "s1".into(),
                attempt: 0,
                state: SandboxState::Ready,
                created_at: 1,
                ip: None,
                additional_ips: vec![],
                host_network: false,
            }],
            names: None,
        };
        let heard = [
            heard("c", Some(1), 50, false),
            heard("s1", Some(0), 50, false),
        ];
        assert!(!apply_heard_exits(&mut pod, &heard, 99));
        assert_eq!(pod.containers[0], done);
        assert_eq!(pod.sandboxes[0].state, SandboxState::NotReady);
    }

    #[test]
    fn an_oom_kill_heard_names_a_container_the_runtime_shows_killed_for_another_reason() {
        let killed = |id: &str, code: i32, reason: &str| {
            let mut c = container(id, ContainerState::Exited);
            c.exit_code = code;
            c.reason = reason.into();
            c
        };
        let mut pod = ObservedPod {
            containers: vec![
                killed("oom", 137, "Error"),
                killed("sigkill", 137, "Error"),
                killed("other-code", 1, "Error"),
            ],
            ..Default::default()
        };
        let mut running = container("running", ContainerState::Running);
        running.reason = String::new();
        pod.containers.push(running.clone());
        // The stream told of an OOM kill for every one of them.
        name_heard_ooms(&mut pod, |id| id != "sigkill");
        let reasons: Vec<&str> = pod.containers.iter().map(|c| c.reason.as_str()).collect();
        assert_eq!(reasons, ["OOMKilled", "Error", "Error", ""]);
    }

    #[tokio::test]
    async fn a_known_pod_costs_its_sandbox_status_and_one_list_of_its_containers() {
        let (rt, sandbox, container) = test_support::one_pod("n").await;
        let cache = DetailCache::default();
        let full = observe_pod(&rt, &cache, "n", "u1").await.unwrap();
        assert_eq!(full.sandboxes.len(), 1);
        assert_eq!(full.containers.len(), 1);
        let before = rt.calls().len();
        let known = observe_known_pod(&rt, &cache, "n", "u1", &full)
            .await
            .unwrap();
        assert_eq!(known, full);
        assert_eq!(
            rt.calls()[before..],
            ["PodSandboxStatus", "ListContainers"],
            "no list of sandboxes, no status call for an unchanged container"
        );
        // The container exits: its status is read once more.
        rt.exit_container(&container);
        let before = rt.calls().len();
        let after = observe_known_pod(&rt, &cache, "n", "u1", &full)
            .await
            .unwrap();
        assert_eq!(after.containers[0].state, ContainerState::Exited);
        assert_eq!(
            rt.calls()[before..],
            ["PodSandboxStatus", "ListContainers", "ContainerStatus"]
        );
        // The sandbox gone: the pod is read by its labels.
        rt.remove_pod_sandbox(sandbox).await.unwrap();
        let before = rt.calls().len();
        let gone = observe_known_pod(&rt, &cache, "n", "u1", &full)
            .await
            .unwrap();
        assert!(gone.is_empty());
        assert_eq!(
            rt.calls()[before..],
            ["PodSandboxStatus", "ListPodSandbox", "ListContainers"]
        );
    }

    #[tokio::test]
    async fn after_a_start_only_what_was_made_is_read() {
        let (rt, sandbox, container) = test_support::one_pod("n").await;
        let cache = DetailCache::default();
        let before = rt.calls().len();
        let made = Made {
            sandbox: Some(sandbox.clone()),
            containers: vec![(container.clone(), sandbox.clone())],
        };
        let view = refresh_after_start(&rt, &cache, &ObservedPod::default(), &made)
            .await
            .unwrap();
        assert_eq!(
            rt.calls()[before..],
            ["PodSandboxStatus", "ContainerStatus"]
        );
        // The same as a full read shows.
        let full = observe_pod(&rt, &cache, "n", "u1").await.unwrap();
        assert_eq!(view, full);
        // The sandbox's status, once read (for the pod's IP), is not asked again.
        let before = rt.calls().len();
        refresh_after_start(&rt, &cache, &ObservedPod::default(), &made)
            .await
            .unwrap();
        assert_eq!(rt.calls()[before..], ["ContainerStatus"]);
    }
}
