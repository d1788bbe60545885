//! Pod status to the API server: for the pods that came from it, onto the pod; for static
//! pods, onto their mirror pods, under the mirror pod's UID (upstream's status manager
//! translates a static pod's UID the same way). Every status a worker publishes is written at
//! once when it differs from what was last written (workers poke the pod's UID), a mirror pod
//! that appears gets its static pod's status at once, and every status is compared again with
//! the API server's every 10 s. When a pod the API server is deleting has been torn down on
//! the node, the pod is deleted with grace 0 and a UID precondition, as upstream does.
//!
//! Each write is a strategic merge patch computed against the status the API server last
//! returned (the pod as the source last saw it, or the answer to our last write), after the
//! node's status was merged with it so that nothing moves backwards ([`merge_status`]): a
//! terminal phase stays, a condition keeps its transition time while its status holds, and a
//! container that terminated for good stays terminated. Fields and conditions the node does
//! not compute are left as others set them.
//!
//! A pod the node refuses gets phase Failed with the admission reason and message, as
//! upstream writes it.
//!
//! Workers never wait for any of this: they poke a coalescing set and go on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use crate::base::podspec::restart::{any_restart_all_rule, should_restart, spec_container};
use crate::base::resync_queue::Pokes;
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};
use crate::kubelet::mirror_pods::{MirrorPods, is_static};
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::source::SOURCE_API;
use crate::kubelet::source::apiserver::ApiPodsView;
use crate::kubelet::source::defaults::CONFIG_SOURCE_ANNOTATION;

/// How often every pod's status is compared again (upstream's status manager: 10 s).
const RECONCILE: Duration = Duration::from_secs(10);
/// Status writes in flight at once (each pod has at most one).
const IN_FLIGHT: usize = 8;
/// Field manager name in managedFields.
const FIELD_MANAGER: &str = "deckhand";

/// The workers' handle: cheap to clone, never blocks.
#[derive(Clone)]
pub(crate) struct StatusSync {
    changed: Pokes,
    requests: mpsc::UnboundedSender<Request>,
}

/// Work other than status changes, in order.
enum Request {
    /// Delete the pod (it is torn down on the node), after writing its last status, when
    /// there is one (its containers as they ended).
    Delete(Arc<Pod>, Option<Box<PodStatus>>),
    /// Mark the pod Failed: the node refused it.
    Refused {
        pod: Box<Pod>,
        reason: String,
        message: String,
    },
}

impl StatusSync {
    /// The pod's status was published anew.
    pub(crate) fn changed(&self, uid: &str) {
        self.changed.poke(uid);
    }

    /// The pod has been torn down on the node; if the API server is deleting it, finish that.
    pub(crate) fn torn_down(&self, pod: Arc<Pod>) {
        self.torn_down_with(pod, None);
    }

    /// [`StatusSync::torn_down`], with the status the pod ended with (its containers stopped,
    /// before their removal), written before the deletion as upstream's status manager does:
    /// a pod a finalizer holds shows its containers terminated, with their exit and time.
    pub(crate) fn torn_down_with(&self, pod: Arc<Pod>, last: Option<PodStatus>) {
        if from_api(&pod) && pod.metadata.deletion_timestamp.is_some() {
            let _ = self.requests.send(Request::Delete(pod, last.map(Box::new)));
        }
    }

    /// The node refuses the pod (`reason`, `message` as upstream's admission gives them).
    pub(crate) fn refused(&self, pod: &Pod, reason: &str, message: &str) {
        let _ = self.requests.send(Request::Refused {
            pod: Box::new(pod.clone()),
            reason: reason.to_string(),
            message: message.to_string(),
        });
    }
}

/// True for pods that came from the API server (the merge notes the source on each pod).
pub(crate) fn from_api(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == SOURCE_API)
}

/// Makes the writer; returns the workers' handle and the writer's task as a factory: each
/// call makes a fresh run (nothing written remembered, the queue of requests taken over), so a
/// supervisor can start it again after a panic. `view` is the API server source's view of the
/// node's pods; `mirrors` says where static pods' statuses go.
pub(crate) fn start(
    client: kube::Client,
    states: PodStates,
    view: ApiPodsView,
    mirrors: MirrorPods,
    cancel: CancellationToken,
) -> (
    StatusSync,
    impl FnMut() -> BoxFuture<'static, ()> + Send + 'static,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let requests = Arc::new(tokio::sync::Mutex::new(rx));
    let changed = Pokes::default();
    let handle = StatusSync {
        changed: changed.clone(),
        requests: tx,
    };
    let run = move || {
        let writer = Writer {
            client: client.clone(),
            states: states.clone(),
            view: view.clone(),
            mirrors: mirrors.clone(),
            sent: HashMap::new(),
            problems: ProblemLog::default(),
        };
        let (changed, requests, cancel) = (changed.clone(), requests.clone(), cancel.clone());
        async move {
            let mut requests = requests.lock().await;
            writer.run(changed, &mut requests, cancel).await
        }
        .boxed()
    };
    (handle, run)
}

struct Writer {
    client: kube::Client,
    states: PodStates,
    view: ApiPodsView,
    mirrors: MirrorPods,
    /// The UID of the pod written to (the API pod, or a static pod's mirror pod) → the status
    /// last written there, normalized (see [`normalized`]).
    sent: HashMap<String, Value>,
    problems: ProblemLog,
}

/// One status write to make.
struct Write {
    /// The pod written to, as the API server last returned it.
    target: Arc<Pod>,
    /// The merged status, normalized, to remember once written.
    written: Value,
    /// The patch of the status.
    patch: Map<String, Value>,
}

/// Adds `uids` to the queue of pods to write; `reconcile` sticks until the write is made.
fn queue(
    pending: &mut std::collections::BTreeMap<String, bool>,
    uids: Vec<String>,
    reconcile: bool,
) {
    for uid in uids {
        *pending.entry(uid).or_insert(false) |= reconcile;
    }
}

/// A write on its way: the state UID it is for, the write, and the answer.
type Flight = futures::future::BoxFuture<'static, (String, Write, Result<Pod, Problem>)>;

impl Writer {
    /// The writer's loop. Writes run as a pipeline: a pod poked while others are being written
    /// starts as soon as one of the [`IN_FLIGHT`] slots frees, not after the whole group, so a
    /// burst of pods going Ready at once does not queue behind the slowest write. Each pod has
    /// at most one write on its way; a poke meanwhile is written after it, against its answer.
    async fn run(
        mut self,
        changed: Pokes,
        requests: &mut mpsc::UnboundedReceiver<Request>,
        cancel: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(RECONCILE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut view_changes = self.view.subscribe();
        // State UID → whether its next write compares with the API server's copy (reconcile).
        let mut pending: std::collections::BTreeMap<String, bool> = Default::default();
        let mut in_flight: futures::stream::FuturesUnordered<Flight> = Default::default();
        let mut busy: HashSet<String> = HashSet::new();
        loop {
            self.start_writes(&mut pending, &mut in_flight, &mut busy);
            tokio::select! {
                _ = cancel.cancelled() => return,
                uids = changed.take() => queue(&mut pending, uids, false),
                _ = tick.tick() => {
                    let uids = self.states.uids();
                    self.forget_other_targets(&uids);
                    queue(&mut pending, uids, true);
                }
                // A mirror pod may have appeared: its static pod's status goes there at once.
                Ok(()) = view_changes.changed() => {
                    queue(&mut pending, self.without_mirror_status(), false);
                }
                Some((uid, write, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    busy.remove(&uid);
                    self.written(write, result);
                }
                Some(request) = requests.recv() => match request {
                    Request::Delete(pod, last) => {
                        if let Some(last) = last {
                            self.write_last(&pod, &last).await;
                        }
                        self.delete(&pod).await
                    }
                    Request::Refused { pod, reason, message } => self.refuse(&pod, reason, message).await,
                }
            }
        }
    }

    /// The static pods whose mirror pod has not had their status yet.
    fn without_mirror_status(&self) -> Vec<String> {
        self.states
            .uids()
            .into_iter()
            .filter(|uid| {
                self.mirrors.target(uid).is_some_and(|m| {
                    !self
                        .sent
                        .contains_key(m.metadata.uid.as_deref().unwrap_or_default())
                })
            })
            .collect()
    }

    /// The pod a pod's status is written onto: the API pod itself, or a static pod's mirror.
    fn target(&self, uid: &str, pod: &Arc<Pod>) -> Option<Arc<Pod>> {
        if from_api(pod) {
            Some(self.view.get(uid).unwrap_or_else(|| pod.clone()))
        } else if is_static(pod) {
            self.mirrors.target(uid)
        } else {
            None
        }
    }

    /// Forgets what was written to pods the node no longer writes to (`uids` are all it holds).
    fn forget_other_targets(&mut self, uids: &[String]) {
        let mut targets = HashSet::new();
        for uid in uids {
            if let Some((pod, _)) = self.states.get(uid)
                && let Some(target) = self.target(uid, &pod)
            {
                targets.insert(target.metadata.uid.clone().unwrap_or_default());
            }
        }
        self.sent.retain(|uid, _| targets.contains(uid));
    }

    /// Starts the pending writes that have a free slot and no write of their pod on its way.
    /// A pod whose status is what was last written there (with `reconcile`, what the API server
    /// holds) needs no request and leaves the queue at once.
    fn start_writes(
        &mut self,
        pending: &mut std::collections::BTreeMap<String, bool>,
        in_flight: &mut futures::stream::FuturesUnordered<Flight>,
        busy: &mut HashSet<String>,
    ) {
        if pending.is_empty() || in_flight.len() >= IN_FLIGHT {
            return;
        }
        let now = clock::time();
        let ready: Vec<(String, bool)> = pending
            .iter()
            .filter(|(uid, _)| !busy.contains(*uid))
            .map(|(uid, reconcile)| (uid.clone(), *reconcile))
            .collect();
        for (uid, reconcile) in ready {
            if in_flight.len() >= IN_FLIGHT {
                break;
            }
            pending.remove(&uid);
            let Some(w) = self.prepare(&uid, reconcile, &now) else {
                continue;
            };
            let client = self.client.clone();
            busy.insert(uid.clone());
            in_flight.push(Box::pin(async move {
                let result = patch_status(client, &w.target, Value::Object(w.patch.clone())).await;
                (uid, w, result)
            }));
        }
    }

    /// The write that brings the pod's target up to the pod's status, if one is needed.
    fn prepare(&mut self, uid: &str, reconcile: bool, now: &Time) -> Option<Write> {
        let (pod, status) = self.states.get(uid)?;
        let target = self.target(uid, &pod)?;
        let target_uid = target.metadata.uid.clone().unwrap_or_default();
        let base = target.status.as_ref();
        let merged = merge_status(&pod, base, &status, now);
        let merged = serde_json::to_value(&merged).unwrap_or_default();
        let written = normalized(&merged);
        if !reconcile && self.sent.get(&target_uid) == Some(&written) {
            return None;
        }
        let base = base
            .and_then(|b| serde_json::to_value(b).ok())
            .unwrap_or_default();
        let patch = status_patch(&base, &merged);
        if patch.is_empty() {
            self.sent.insert(target_uid, written);
            return None;
        }
        Some(Write {
            target,
            written,
            patch,
        })
    }

    /// Takes in the answer to one write.
    fn written(&mut self, w: Write, result: Result<Pod, Problem>) {
        let target_uid = w.target.metadata.uid.clone().unwrap_or_default();
        match result {
            Ok(pod) => {
                self.view.note_written(pod);
                self.sent.insert(target_uid, w.written);
                self.problems.succeeded("writing pod status");
            }
            // The pod is gone from the API server, or is another pod by now.
            Err(p) if p.is(ProblemKind::NotFound) || p.is(ProblemKind::Conflict) => {
                self.sent.remove(&target_uid);
            }
            Err(p) => self.problems.failed("writing pod status", &p),
        }
    }

    /// Marks a refused pod Failed with the admission reason and message.
    async fn refuse(&mut self, pod: &Pod, reason: String, message: String) {
        // Upstream's rejectPod: the event carries the bare message, the status this prefix.
        let status = PodStatus {
            phase: Some("Failed".into()),
            reason: Some(reason),
            message: Some(format!("Pod was rejected: {message}")),
            qos_class: Some(crate::base::podspec::qos_class(pod).as_str().to_string()),
            observed_generation: crate::kubelet::pod_status::observed_generation(pod),
            ..Default::default()
        };
        let patch = serde_json::to_value(&status).unwrap_or_default();
        match patch_status(self.client.clone(), pod, patch).await {
            Ok(written) => self.view.note_written(written),
            Err(p) => self.problems.failed("writing a refused pod's status", &p),
        }
    }

    /// Writes the status a deleted pod ended with, merged onto what the API server holds as
    /// every write is.
    async fn write_last(&mut self, pod: &Arc<Pod>, last: &PodStatus) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let target = self.view.get(&uid).unwrap_or_else(|| pod.clone());
        let base = target.status.as_ref();
        let merged = merge_status(pod, base, last, &clock::time());
        let merged = serde_json::to_value(&merged).unwrap_or_default();
        let base = base
            .and_then(|b| serde_json::to_value(b).ok())
            .unwrap_or_default();
        let patch = status_patch(&base, &merged);
        if patch.is_empty() {
            return;
        }
        match patch_status(self.client.clone(), &target, Value::Object(patch)).await {
            Ok(written) => self.view.note_written(written),
            Err(p) if p.is(ProblemKind::NotFound) || p.is(ProblemKind::Conflict) => {}
            Err(p) => self
                .problems
                .failed("writing a deleted pod's last status", &p),
        }
    }

    /// Deletes a pod the node has finished with: grace 0, only this UID.
    async fn delete(&mut self, pod: &Pod) {
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
            pod.metadata.uid.as_deref(),
        ) else {
            return;
        };
        let params = crate::clients::apiserver::delete_exactly_now(uid);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), pod_uid = %uid, "deleted the pod from the API server");
                self.sent.remove(uid);
            }
            Err(e) => {
                let p = Problem::from(e);
                if !(p.is(ProblemKind::NotFound) || p.is(ProblemKind::Conflict)) {
                    self.problems.failed("deleting a terminated pod", &p);
                }
            }
        }
    }
}

/// One status write: a strategic merge patch of the status subresource of `target` (the pod
/// written to), with its UID in the patch as a precondition. Returns the pod as written.
async fn patch_status(client: kube::Client, target: &Pod, status: Value) -> Result<Pod, Problem> {
    let ns = target.metadata.namespace.as_deref().unwrap_or("default");
    let name = target.metadata.name.as_deref().unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": { "uid": target.metadata.uid },
        "status": status,
    });
    let api: Api<Pod> = Api::namespaced(client, ns);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    Ok(api
        .patch_status(name, &params, &Patch::Strategic(&patch))
        .await?)
}

// ---------------------------------------------------------------------------------------------
// The pure part: merging the node's status with the API server's, and the patch between them.

/// The resize conditions are the node's alone: one it no longer shows is cleared, as
/// upstream's status manager clears them.
fn resize_condition(type_: &str) -> bool {
    use crate::kubelet::admission::resize::{RESIZE_IN_PROGRESS, RESIZE_PENDING};
    type_ == RESIZE_PENDING || type_ == RESIZE_IN_PROGRESS
}

fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The status to write for `pod`: `new` (what the node computed) merged with `base` (what the
/// API server holds) so that nothing moves backwards, as upstream's status manager keeps it:
/// - a terminal phase (Succeeded, Failed) stays, with its reason and message;
/// - a condition whose status did not change keeps its lastTransitionTime; conditions the node
///   does not compute (set by others) stay as they are;
/// - the start time stays, and so does the QoS class (the API server refuses to change it);
/// - a container that terminated stays terminated when it will not run again: restartPolicy
///   Never, or OnFailure and it exited 0 (upstream refuses such a transition as a bug);
/// - once the phase is terminal, Ready and ContainersReady are not true (`now` stamps the
///   change).
pub(crate) fn merge_status(
    pod: &Pod,
    base: Option<&PodStatus>,
    new: &PodStatus,
    now: &Time,
) -> PodStatus {
    let Some(base) = base else {
        return new.clone();
    };
    let mut out = new.clone();
    if is_terminal(base.phase.as_deref()) && out.phase != base.phase {
        out.phase = base.phase.clone();
        out.reason = base.reason.clone();
        out.message = base.message.clone();
    }
    if base.start_time.is_some() {
        out.start_time = base.start_time.clone();
    }
    if base.qos_class.is_some() {
        out.qos_class = base.qos_class.clone();
    }
    // A status computed from an older spec than one already reported does not take the
    // generation back (upstream's status manager keeps the larger one).
    out.observed_generation = out.observed_generation.max(base.observed_generation);

    // Conditions: ours, keeping transition times; then every other one the API server has.
    let base_conditions = base.conditions.as_deref().unwrap_or_default();
    let mut conditions: Vec<PodCondition> = out.conditions.take().unwrap_or_default();
    for c in &mut conditions {
        if let Some(b) = base_conditions.iter().find(|b| b.type_ == c.type_)
            && b.status == c.status
        {
            c.last_transition_time = b.last_transition_time.clone();
        }
    }
    if is_terminal(out.phase.as_deref()) {
        let reason = if out.phase.as_deref() == Some("Succeeded") {
            "PodCompleted"
        } else {
            "PodFailed"
        };
        for c in &mut conditions {
            if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status == "True" {
                c.status = "False".into();
                c.reason = Some(reason.into());
                c.message = None;
                c.last_transition_time = Some(now.clone());
            }
        }
    }
    for b in base_conditions {
        if !conditions.iter().any(|c| c.type_ == b.type_) && !resize_condition(&b.type_) {
            conditions.push(b.clone());
        }
    }
    out.conditions = (!conditions.is_empty()).then_some(conditions);

    // Containers that terminated for good. In a pod with a `RestartAllContainers` rule every
    // container may run again, whatever its own policy (the API server lets them all go).
    let restart_all = any_restart_all_rule(pod);
    let done_for_good = |name: &str, exit: i32| {
        !restart_all && spec_container(pod, name).is_some_and(|c| !should_restart(pod, c, exit))
    };
    keep_terminated(
        base.container_statuses.as_deref(),
        out.container_statuses.as_mut(),
        done_for_good,
    );
    keep_terminated(
        base.init_container_statuses.as_deref(),
        out.init_container_statuses.as_mut(),
        done_for_good,
    );
    // Ephemeral containers never restart.
    keep_terminated(
        base.ephemeral_container_statuses.as_deref(),
        out.ephemeral_container_statuses.as_mut(),
        |_, _| true,
    );
    out
}

fn terminated_exit(s: &ContainerStatus) -> Option<i32> {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code)
}

/// Puts back the API server's entry of every container that terminated and may not run again
/// after that exit (`should_restart`, by its own policy and rules or the pod's) where the new
/// status has it running or waiting: the API server refuses that transition.
fn keep_terminated(
    base: Option<&[ContainerStatus]>,
    new: Option<&mut Vec<ContainerStatus>>,
    stays_after: impl Fn(&str, i32) -> bool,
) {
    let (Some(base), Some(new)) = (base, new) else {
        return;
    };
    for n in new.iter_mut() {
        let Some(b) = base.iter().find(|b| b.name == n.name) else {
            continue;
        };
        let Some(exit) = terminated_exit(b) else {
            continue;
        };
        if terminated_exit(n).is_some() {
            continue;
        }
        if stays_after(&n.name, exit) {
            *n = b.clone();
        }
    }
}

/// Status lists the API server merges element by element (its strategic merge keys); every
/// other list is replaced whole.
const MERGE_KEYS: [(&str, &str); 3] = [("conditions", "type"), ("podIPs", "ip"), ("hostIPs", "ip")];
/// Status fields the node sets and may clear. Any other field the API server holds (set by
/// the API server, the scheduler, a resize) is never cleared by a node's patch.
const NODE_OWNED: [&str; 10] = [
    "phase",
    "reason",
    "message",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
];

/// A JSON value with what the API server does not keep taken out: nulls, empty strings, lists
/// and objects (but `running: {}` and its siblings, which mean something), so that a status
/// compares equal to the API server's copy of it. Times are already whole seconds in JSON.
pub(crate) fn normalized(v: &Value) -> Value {
    norm(None, v).unwrap_or(Value::Null)
}

fn norm(key: Option<&str>, v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .iter()
                .map(|x| norm(None, x).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(m) => {
            let out: Map<String, Value> = m
                .iter()
                .filter_map(|(k, x)| norm(Some(k), x).map(|x| (k.clone(), x)))
                .collect();
            let meaningful = matches!(key, Some("running" | "waiting" | "terminated"));
            (!out.is_empty() || meaningful).then_some(Value::Object(out))
        }
        other => Some(other.clone()),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    normalized(a) == normalized(b)
}

/// The strategic merge patch (of `status`) that turns the API server's `old` status into
/// `new`: changed and new fields; `null` for node-owned fields `new` no longer has; the lists
/// in [`MERGE_KEYS`] element by element (changed fields of changed elements, `$patch: delete`
/// for elements gone, `$setElementOrder` when the order changed); other lists whole. Empty
/// when the API server holds `new` already.
pub(crate) fn status_patch(old: &Value, new: &Value) -> Map<String, Value> {
    let empty = Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut patch = Map::new();
    for (k, nv) in new {
        let ov = old.get(k).unwrap_or(&Value::Null);
        if same(ov, nv) {
            continue;
        }
        let merge_key = MERGE_KEYS
            .iter()
            .find(|(list, _)| list == k)
            .map(|(_, key)| *key);
        match (merge_key, nv.as_array()) {
            (Some(key), Some(new_items)) => {
                let old_items = ov.as_array().map(Vec::as_slice).unwrap_or_default();
                list_patch(k, key, old_items, new_items, &mut patch);
            }
            _ => {
                patch.insert(k.clone(), value_patch(ov, nv));
            }
        }
    }
    for (k, ov) in old {
        if !new.contains_key(k) && NODE_OWNED.contains(&k.as_str()) && !same(ov, &Value::Null) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    patch
}

/// The patch of one value: objects field by field (fields gone become `null`), anything else
/// replaced.
fn value_patch(old: &Value, new: &Value) -> Value {
    match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => {
            let mut out = Map::new();
            for (k, nv) in n {
                let ov = o.get(k).unwrap_or(&Value::Null);
                if !same(ov, nv) {
                    out.insert(k.clone(), value_patch(ov, nv));
                }
            }
            for (k, ov) in o {
                if !n.contains_key(k) && !same(ov, &Value::Null) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

fn list_patch(list: &str, key: &str, old: &[Value], new: &[Value], patch: &mut Map<String, Value>) {
    let key_of = |v: &Value| v.get(key).cloned();
    let old_keys: Vec<Value> = old.iter().filter_map(key_of).collect();
    let new_keys: Vec<Value> = new.iter().filter_map(key_of).collect();
    let mut items = Vec::new();
    for n in new {
        let Some(k) = key_of(n) else { continue };
        match old.iter().find(|o| key_of(o).as_ref() == Some(&k)) {
            None => items.push(n.clone()),
            Some(o) if same(o, n) => {}
            Some(o) => {
                let mut element = match value_patch(o, n) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                element.insert(key.to_string(), k);
                items.push(Value::Object(element));
            }
        }
    }
    for k in &old_keys {
        if !new_keys.contains(k) {
            let mut gone = Map::new();
            gone.insert("$patch".into(), Value::String("delete".into()));
            gone.insert(key.to_string(), k.clone());
            items.push(Value::Object(gone));
        }
    }
    if !items.is_empty() {
        patch.insert(list.to_string(), Value::Array(items));
    }
    if old_keys != new_keys && !new_keys.is_empty() {
        let order = new_keys
            .into_iter()
            .map(|k| {
                let mut m = Map::new();
                m.insert(key.to_string(), k);
                Value::Object(m)
            })
            .collect();
        patch.insert(format!("$setElementOrder/{list}"), Value::Array(order));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(v: Value) -> PodStatus {
        serde_json::from_value(v).unwrap()
    }

    fn pod(restart_policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "restartPolicy": restart_policy,
                "initContainers": [
                    {"name": "init", "image": "i"},
                    {"name": "side", "image": "i", "restartPolicy": "Always"},
                ],
                "containers": [{"name": "app", "image": "i"}],
            },
        }))
        .unwrap()
    }

    const NOW: &str = "2025-06-01T12:00:00Z";

    fn now() -> Time {
        Time(NOW.parse().unwrap())
    }

    fn running(name: &str) -> Value {
        json!({"name": name, "ready": true, "restartCount": 0, "image": "i", "imageID": "",
               "state": {"running": {"startedAt": "2025-06-01T11:00:00Z"}}})
    }

    fn terminated(name: &str, code: i32) -> Value {
        json!({"name": name, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
               "state": {"terminated": {"exitCode": code, "startedAt": "2025-06-01T11:00:00Z",
                                        "finishedAt": "2025-06-01T11:30:00Z"}}})
    }

    fn cond(type_: &str, status: &str, at: &str) -> Value {
        json!({"type": type_, "status": status, "lastTransitionTime": at})
    }

    /// (what, restart policy, API server's status, node's status, expected merged status)
    #[test]
    fn the_merge_never_moves_a_pod_backwards() {
        let t0 = "2025-06-01T10:00:00Z";
        let t1 = "2025-06-01T11:59:00Z";
        let rows: Vec<(&str, &str, Option<Value>, Value, Value)> = vec![
            (
                "nothing in the API server yet: the node's status as it is",
                "Always",
                None,
                json!({"phase": "Running", "conditions": [cond("Ready", "True", t1)]}),
                json!({"phase": "Running", "conditions": [cond("Ready", "True", t1)]}),
            ),
            (
                "a terminal phase stays, with its reason and message",
                "Always",
                Some(json!({"phase": "Failed", "reason": "Evicted", "message": "gone"})),
                json!({"phase": "Running"}),
                json!({"phase": "Failed", "reason": "Evicted", "message": "gone"}),
            ),
            (
                "Succeeded stays Succeeded",
                "Never",
                Some(json!({"phase": "Succeeded"})),
                json!({"phase": "Failed", "reason": "X"}),
                json!({"phase": "Succeeded"}),
            ),
            (
                "a non-terminal phase moves on",
                "Always",
                Some(json!({"phase": "Pending", "reason": "R"})),
                json!({"phase": "Running"}),
                json!({"phase": "Running"}),
            ),
            (
                "an unchanged condition keeps its transition time; a changed one takes the new",
                "Always",
                Some(
                    json!({"conditions": [cond("Initialized", "True", t0), cond("Ready", "False", t0)]}),
                ),
                json!({"conditions": [cond("Initialized", "True", t1), cond("Ready", "True", t1)]}),
                json!({"conditions": [cond("Initialized", "True", t0), cond("Ready", "True", t1)]}),
            ),
            (
                "conditions the node does not compute stay",
                "Always",
                Some(
                    json!({"conditions": [cond("DisruptionTarget", "True", t0), cond("example.com/gate", "False", t0)]}),
                ),
                json!({"conditions": [cond("Ready", "True", t1)]}),
                json!({"conditions": [cond("Ready", "True", t1), cond("DisruptionTarget", "True", t0), cond("example.com/gate", "False", t0)]}),
            ),
            (
                "a resize condition the node no longer shows is cleared",
                "Always",
                Some(
                    json!({"conditions": [cond("PodResizePending", "True", t0), cond("PodResizeInProgress", "True", t0)]}),
                ),
                json!({"conditions": [cond("Ready", "True", t1)]}),
                json!({"conditions": [cond("Ready", "True", t1)]}),
            ),
            (
                "terminal from the API server: Ready is not true any more",
                "Always",
                Some(json!({"phase": "Failed", "conditions": [cond("Ready", "True", t0)]})),
                json!({"phase": "Running", "conditions": [cond("Ready", "True", t1)]}),
                json!({"phase": "Failed", "conditions": [
                    {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": NOW}]}),
            ),
            (
                "start time and QoS class stay",
                "Always",
                Some(json!({"startTime": t0, "qosClass": "Burstable"})),
                json!({"startTime": t1, "qosClass": "BestEffort"}),
                json!({"startTime": t0, "qosClass": "Burstable"}),
            ),
            (
                "Never: a terminated container does not run again",
                "Never",
                Some(json!({"containerStatuses": [terminated("app", 0)]})),
                json!({"containerStatuses": [running("app")]}),
                json!({"containerStatuses": [terminated("app", 0)]}),
            ),
            (
                "Never: a failed one neither",
                "Never",
                Some(json!({"containerStatuses": [terminated("app", 2)]})),
                json!({"containerStatuses": [running("app")]}),
                json!({"containerStatuses": [terminated("app", 2)]}),
            ),
            (
                "OnFailure: a failed container restarts",
                "OnFailure",
                Some(json!({"containerStatuses": [terminated("app", 2)]})),
                json!({"containerStatuses": [running("app")]}),
                json!({"containerStatuses": [running("app")]}),
            ),
            (
                "OnFailure: one that succeeded stays terminated",
                "OnFailure",
                Some(json!({"containerStatuses": [terminated("app", 0)]})),
                json!({"containerStatuses": [running("app")]}),
                json!({"containerStatuses": [terminated("app", 0)]}),
            ),
            (
                "Always: containers restart",
                "Always",
                Some(json!({"containerStatuses": [terminated("app", 0)]})),
                json!({"containerStatuses": [running("app")]}),
                json!({"containerStatuses": [running("app")]}),
            ),
            (
                "init containers: a finished one stays finished, a sidecar restarts",
                "Always",
                Some(
                    json!({"initContainerStatuses": [terminated("init", 0), terminated("side", 0)]}),
                ),
                json!({"initContainerStatuses": [running("init"), running("side")]}),
                json!({"initContainerStatuses": [terminated("init", 0), running("side")]}),
            ),
            (
                "ephemeral containers never restart, whatever the pod's policy",
                "Always",
                Some(json!({"ephemeralContainerStatuses": [terminated("dbg", 0)]})),
                json!({"ephemeralContainerStatuses": [running("dbg")]}),
                json!({"ephemeralContainerStatuses": [terminated("dbg", 0)]}),
            ),
            (
                "the observed generation never goes back",
                "Always",
                Some(json!({"observedGeneration": 3})),
                json!({"observedGeneration": 2}),
                json!({"observedGeneration": 3}),
            ),
            (
                "a newer generation is taken",
                "Always",
                Some(json!({"observedGeneration": 3})),
                json!({"observedGeneration": 4}),
                json!({"observedGeneration": 4}),
            ),
        ];
        for (what, policy, base, new, want) in rows {
            let base = base.map(status);
            let merged = merge_status(&pod(policy), base.as_ref(), &status(new), &now());
            assert_eq!(
                serde_json::to_value(&merged).unwrap(),
                serde_json::to_value(status(want)).unwrap(),
                "{what}"
            );
        }
    }

    /// A terminated container stays terminated when its own policy and rules say it does not
    /// run again (ContainerRestartRules), whatever the pod's policy says.
    #[test]
    fn a_container_s_own_policy_decides_whether_it_stays_terminated() {
        let pod = |pod_policy: &str, app: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"restartPolicy": pod_policy, "containers": [app]},
            }))
            .unwrap()
        };
        let rule_42 =
            json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
        // (what, pod, API server's exit code, stays terminated)
        let rows: Vec<(&str, Pod, i32, bool)> = vec![
            (
                "pod Never, container Always: restarts",
                pod("Never", json!({"name": "app", "restartPolicy": "Always"})),
                0,
                false,
            ),
            (
                "pod Always, container Never: stays",
                pod("Always", json!({"name": "app", "restartPolicy": "Never"})),
                1,
                true,
            ),
            (
                "pod Never, container Never, Restart rule matched: restarts",
                pod(
                    "Never",
                    json!({"name": "app", "restartPolicy": "Never", "restartPolicyRules": rule_42}),
                ),
                42,
                false,
            ),
            (
                "pod Never, container Never, Restart rule not matched: stays",
                pod(
                    "Never",
                    json!({"name": "app", "restartPolicy": "Never", "restartPolicyRules": rule_42}),
                ),
                1,
                true,
            ),
            (
                "pod Never, container Never, another container restarts them all: restarts",
                serde_json::from_value(json!({
                    "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                    "spec": {"restartPolicy": "Never", "containers": [
                        {"name": "app"},
                        {"name": "src", "restartPolicy": "Never", "restartPolicyRules": [
                            {"action": "RestartAllContainers",
                             "exitCodes": {"operator": "In", "values": [42]}}]},
                    ]},
                }))
                .unwrap(),
                137,
                false,
            ),
        ];
        for (what, pod, code, stays) in rows {
            let base = status(json!({"containerStatuses": [terminated("app", code)]}));
            let new = status(json!({"containerStatuses": [running("app")]}));
            let merged = merge_status(&pod, Some(&base), &new, &now());
            let want = if stays { &base } else { &new };
            assert_eq!(
                serde_json::to_value(&merged.container_statuses).unwrap(),
                serde_json::to_value(&want.container_statuses).unwrap(),
                "{what}"
            );
        }
    }

    /// (what, API server's status, status to write, expected patch)
    #[test]
    fn the_patch_holds_only_what_differs() {
        let t0 = "2025-06-01T10:00:00Z";
        let rows: Vec<(&str, Value, Value, Value)> = vec![
            (
                "nothing differs",
                json!({"phase": "Running", "podIP": "10.0.0.1", "imageless": []}),
                json!({"phase": "Running", "podIP": "10.0.0.1"}),
                json!({}),
            ),
            (
                "empty values are as good as none",
                json!({"phase": "Running", "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                     "state": {"running": {"startedAt": null}}, "lastState": {}}]}),
                json!({"phase": "Running", "message": "", "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                     "state": {"running": {}}}]}),
                json!({}),
            ),
            (
                "running and waiting differ even when both are empty",
                json!({"containerStatuses": [{"name": "a", "state": {"waiting": {}}}]}),
                json!({"containerStatuses": [{"name": "a", "state": {"running": {}}}]}),
                json!({"containerStatuses": [{"name": "a", "state": {"running": {}}}]}),
            ),
            (
                "changed fields; node-owned fields gone become null; others' fields stay",
                json!({"phase": "Pending", "reason": "R", "nominatedNodeName": "n", "qosClass": "BestEffort"}),
                json!({"phase": "Running"}),
                json!({"phase": "Running", "reason": null}),
            ),
            (
                "conditions by type: only the changed ones, with their changed fields",
                json!({"conditions": [
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": t0},
                    cond("PodScheduled", "True", t0)]}),
                json!({"conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": NOW},
                    cond("PodScheduled", "True", t0)]}),
                json!({"conditions": [
                    {"type": "Ready", "status": "True", "reason": null, "lastTransitionTime": NOW}]}),
            ),
            (
                "a new condition is added, in the order given",
                json!({"conditions": [cond("PodScheduled", "True", t0)]}),
                json!({"conditions": [cond("Ready", "True", NOW), cond("PodScheduled", "True", t0)]}),
                json!({"conditions": [cond("Ready", "True", NOW)],
                       "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}]}),
            ),
            (
                "pod IPs by ip: one gone, one new",
                json!({"podIPs": [{"ip": "10.0.0.1"}]}),
                json!({"podIPs": [{"ip": "10.0.0.2"}]}),
                json!({"podIPs": [{"ip": "10.0.0.2"}, {"$patch": "delete", "ip": "10.0.0.1"}],
                       "$setElementOrder/podIPs": [{"ip": "10.0.0.2"}]}),
            ),
            (
                "container statuses are replaced whole",
                json!({"containerStatuses": [running("a"), running("b")]}),
                json!({"containerStatuses": [running("a"), terminated("b", 1)]}),
                json!({"containerStatuses": [running("a"), terminated("b", 1)]}),
            ),
        ];
        for (what, old, new, want) in rows {
            assert_eq!(Value::Object(status_patch(&old, &new)), want, "{what}");
        }
    }

    #[test]
    fn a_status_compares_equal_to_the_api_servers_copy_of_it() {
        // What the node computes, with sub-second times and empty lists…
        let computed = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(Time("2025-06-01T12:00:00.123456789Z".parse().unwrap())),
                ..Default::default()
            }]),
            ephemeral_container_statuses: Some(vec![]),
            ..Default::default()
        };
        // …and the API server's answer for it.
        let echoed = json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": null,
             "lastTransitionTime": "2025-06-01T12:00:00Z"}]});
        let ours = serde_json::to_value(&computed).unwrap();
        assert!(status_patch(&echoed, &ours).is_empty());
        assert_eq!(normalized(&ours), normalized(&echoed));
    }

    /// An API pod, as the source hands it on.
    fn api_pod(name: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                             "annotations": {CONFIG_SOURCE_ANNOTATION: SOURCE_API}},
                "spec": {"containers": [{"name": "app", "image": "i"}]},
            }))
            .unwrap(),
        )
    }

    /// A pod poked while another pod's write is still unanswered is written meanwhile: the
    /// writer is a pipeline, not a batch that waits for its slowest write.
    #[tokio::test]
    async fn a_slow_write_does_not_hold_up_the_next_pod() {
        use crate::clients::apiserver::fake::{FakeApiServer, Rule};
        let fake = FakeApiServer::new();
        for name in ["slow", "fast"] {
            fake.apply(&*api_pod(name));
        }
        let status_write = |name: &str| Rule::new("patch", "pods/status").named(name);
        let slow = fake.hold(status_write("slow"));
        let client = fake.client();
        let states = PodStates::default();
        let view = ApiPodsView::default();
        let cancel = CancellationToken::new();
        let (sync, mut writer) = start(
            client,
            states.clone(),
            view.clone(),
            MirrorPods::new(view),
            cancel.clone(),
        );
        let writer = tokio::spawn(writer());
        let phase = |p: &str| PodStatus {
            phase: Some(p.into()),
            ..Default::default()
        };
        let wait_for = |name: &'static str| {
            let fake = fake.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while fake.count(&status_write(name)) == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("no status write of {name} reached the API server"));
            }
        };
        states.publish(api_pod("slow"), phase("Running"));
        sync.changed("uid-slow");
        wait_for("slow").await;
        states.publish(api_pod("fast"), phase("Running"));
        sync.changed("uid-fast");
        wait_for("fast").await;
        assert_eq!(slow.waiting(), 1, "the slow write is still unanswered");
        let phase_of = |name| {
            let pod: Option<Pod> = fake.get("ns", name);
            pod.and_then(|p| p.status?.phase)
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while phase_of("fast").as_deref() != Some("Running") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the fast pod's status was written");
        slow.release();
        cancel.cancel();
        writer.await.unwrap();
    }

    /// A pod the API server deletes is written its last status (its container terminated)
    /// before the deletion, so a pod a finalizer holds shows how its containers ended
    /// (upstream's `Lifecycle Sleep Hook` specs read `finishedAt` there). It used to be deleted
    /// with the running status it had.
    #[tokio::test]
    async fn a_deleted_pod_gets_its_last_status_before_the_deletion() {
        use crate::clients::apiserver::fake::{FakeApiServer, Rule};
        use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
        let fake = FakeApiServer::new();
        let mut pod = (*api_pod("gone")).clone();
        pod.metadata.deletion_timestamp = Some(clock::time());
        pod.metadata.deletion_grace_period_seconds = Some(30);
        let pod = Arc::new(pod);
        fake.apply(&*api_pod("gone"));
        let view = ApiPodsView::default();
        let cancel = CancellationToken::new();
        let (sync, mut writer) = start(
            fake.client(),
            PodStates::default(),
            view.clone(),
            MirrorPods::new(view),
            cancel.clone(),
        );
        let writer = tokio::spawn(writer());
        let finished = Time("2026-01-02T03:04:05Z".parse().unwrap());
        let last = PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 0,
                        reason: Some("Completed".into()),
                        finished_at: Some(finished.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        sync.torn_down_with(pod, Some(last));
        let delete = Rule::new("delete", "pods").named("gone");
        tokio::time::timeout(Duration::from_secs(10), async {
            while fake.count(&delete) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the pod was deleted");
        let verbs: Vec<String> = fake
            .requests()
            .iter()
            .filter(|r| r.name.as_deref() == Some("gone"))
            .map(|r| format!("{:?} {}", r.verb, r.path))
            .collect();
        assert_eq!(verbs.len(), 2, "{verbs:?}");
        assert!(
            verbs[0].ends_with("/pods/gone/status"),
            "the status first: {verbs:?}"
        );
        assert!(
            verbs[1].ends_with("/pods/gone"),
            "then the deletion: {verbs:?}"
        );
        cancel.cancel();
        writer.await.unwrap();
    }
}
