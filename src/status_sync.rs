//! Pod status to the API server, for the pods that came from it: every status a worker
//! publishes is patched onto the pod's status subresource when it differs from what was last
//! written, at once (workers poke the pod's UID), and all of them are compared again every
//! 10 s. When a pod the API server is deleting has been torn down on the node, the pod is
//! deleted with grace 0 and a UID precondition, as upstream's status manager does.
//!
//! A pod the node refuses gets phase Failed with the admission reason and message, as
//! upstream writes it.
//!
//! Workers never wait for any of this: they poke a coalescing set and go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::apiserver::{Problem, ProblemKind, ProblemLog};
use crate::pod_state::PodStates;
use crate::pokes::Pokes;
use crate::source::SOURCE_API;
use crate::source::defaults::CONFIG_SOURCE_ANNOTATION;

/// How often every pod's status is compared again (upstream's status manager: 10 s).
const RECONCILE: Duration = Duration::from_secs(10);
/// Status writes in flight at once (each pod has at most one).
const IN_FLIGHT: usize = 8;

/// The workers' handle: cheap to clone, never blocks.
#[derive(Clone)]
pub struct StatusSync {
    changed: Pokes,
    requests: mpsc::UnboundedSender<Request>,
}

/// Work other than status changes, in order.
enum Request {
    /// Delete the pod (it is torn down on the node).
    Delete(Arc<Pod>),
    /// Mark the pod Failed: the node refused it.
    Refused {
        pod: Box<Pod>,
        reason: String,
        message: String,
    },
}

impl StatusSync {
    /// The pod's status was published anew.
    pub fn changed(&self, uid: &str) {
        self.changed.poke(uid);
    }

    /// The pod has been torn down on the node; if the API server is deleting it, finish that.
    pub fn torn_down(&self, pod: Arc<Pod>) {
        if from_api(&pod) && pod.metadata.deletion_timestamp.is_some() {
            let _ = self.requests.send(Request::Delete(pod));
        }
    }

    /// The node refuses the pod (`reason`, `message` as upstream's admission gives them).
    pub fn refused(&self, pod: &Pod, reason: &str, message: &str) {
        let _ = self.requests.send(Request::Refused {
            pod: Box::new(pod.clone()),
            reason: reason.to_string(),
            message: message.to_string(),
        });
    }
}

/// True for pods that came from the API server (the merge notes the source on each pod).
pub fn from_api(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == SOURCE_API)
}

/// Starts the writer; returns the workers' handle and the task.
pub fn start(
    client: kube::Client,
    states: PodStates,
    cancel: CancellationToken,
) -> (StatusSync, impl std::future::Future<Output = ()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let changed = Pokes::default();
    let handle = StatusSync {
        changed: changed.clone(),
        requests: tx,
    };
    let writer = Writer {
        client,
        states,
        sent: HashMap::new(),
        problems: ProblemLog::default(),
    };
    (handle, writer.run(changed, rx, cancel))
}

struct Writer {
    client: kube::Client,
    states: PodStates,
    /// UID → the status last written (what the API server holds, as far as we know).
    sent: HashMap<String, PodStatus>,
    problems: ProblemLog,
}

impl Writer {
    async fn run(
        mut self,
        changed: Pokes,
        mut requests: mpsc::UnboundedReceiver<Request>,
        cancel: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(RECONCILE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let uids = tokio::select! {
                _ = cancel.cancelled() => return,
                uids = changed.take() => uids,
                _ = tick.tick() => {
                    // Forget what was written for pods the node no longer has.
                    let uids = self.states.uids();
                    let known: std::collections::HashSet<&String> = uids.iter().collect();
                    self.sent.retain(|uid, _| known.contains(uid));
                    uids
                }
                Some(request) = requests.recv() => {
                    match request {
                        Request::Delete(pod) => self.delete(&pod).await,
                        Request::Refused { pod, reason, message } => {
                            let status = PodStatus {
                                phase: Some("Failed".into()),
                                reason: Some(reason),
                                message: Some(message),
                                ..Default::default()
                            };
                            if let Err(p) = patch_status(self.client.clone(), &pod, &status).await {
                                self.problems.failed("writing a refused pod's status", &p);
                            }
                        }
                    }
                    continue;
                }
            };
            self.write(uids).await;
        }
    }

    /// Writes the statuses of `uids` that changed, a few at a time, one request per pod.
    async fn write(&mut self, uids: Vec<String>) {
        let mut todo = Vec::new();
        for uid in uids {
            let Some((pod, status)) = self.states.get(&uid) else {
                self.sent.remove(&uid);
                continue;
            };
            if !from_api(&pod) || self.sent.get(&uid) == Some(&status) {
                continue;
            }
            todo.push((uid, pod, status));
        }
        let client = self.client.clone();
        let results: Vec<(String, PodStatus, Result<(), Problem>)> = futures::stream::iter(todo)
            .map(|(uid, pod, status)| {
                let client = client.clone();
                async move {
                    let result = patch_status(client, &pod, &status).await;
                    (uid, status, result)
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for (uid, status, result) in results {
            match result {
                Ok(()) => {
                    self.sent.insert(uid, status);
                    self.problems.succeeded("writing pod status");
                }
                // The pod is gone from the API server, or is another pod by now.
                Err(p) if p.is(ProblemKind::NotFound) || p.is(ProblemKind::Conflict) => {
                    self.sent.remove(&uid);
                }
                Err(p) => self.problems.failed("writing pod status", &p),
            }
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
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
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

/// One status write: a strategic merge patch of the status subresource (conditions merge by
/// type, so conditions others own stay), with the pod's UID in the patch as a precondition.
async fn patch_status(client: kube::Client, pod: &Pod, status: &PodStatus) -> Result<(), Problem> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": { "uid": pod.metadata.uid },
        "status": status,
    });
    let api: Api<Pod> = Api::namespaced(client, ns);
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}
