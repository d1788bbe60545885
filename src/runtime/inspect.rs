//! Reads what the runtime holds for Deckhand's pods and turns it into [`ObservedPod`]s.
//!
//! Two list calls see everything; the per-object status calls (exit code, times, IP) are made
//! only when an object is new or changed state, and remembered in a [`DetailCache`]: an exited
//! container's status never changes, a sandbox's IP neither. That keeps a relist of a busy node
//! to two calls when nothing happens.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::cri::RuntimeService;
use crate::cri::proto::{self, ContainerFilter, NamespaceMode, PodSandboxFilter, PodSandboxState};
use crate::cri::service::CriResult;

use super::labels;
use crate::observed::{
    ContainerState, ObservedContainer, ObservedPod, ObservedSandbox, SandboxState,
};

#[derive(Clone, Debug)]
struct SandboxDetail {
    ip: Option<String>,
    additional_ips: Vec<String>,
    host_network: bool,
}

#[derive(Clone, Debug)]
struct ContainerDetail {
    state: i32,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
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

/// A label selector for objects this agent (node `node`) created.
pub fn managed_selector(node: &str) -> HashMap<String, String> {
    HashMap::from([
        (
            labels::MANAGED_LABEL.to_string(),
            labels::MANAGED_VALUE.to_string(),
        ),
        (labels::NODE_LABEL.to_string(), node.to_string()),
    ])
}

/// A label selector for one pod's objects.
pub fn pod_selector(node: &str, uid: &str) -> HashMap<String, String> {
    let mut sel = managed_selector(node);
    sel.insert(labels::POD_UID_LABEL.to_string(), uid.to_string());
    sel
}

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
    let resp = rt.pod_sandbox_status(sandbox_id.to_string()).await?;
    let status = resp.status.unwrap_or_default();
    let network = status.network.unwrap_or_default();
    let host_network = status
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .is_some_and(|o| o.network == NamespaceMode::Node as i32);
    let detail = SandboxDetail {
        ip: (!network.ip.is_empty()).then_some(network.ip),
        additional_ips: network.additional_ips.into_iter().map(|p| p.ip).collect(),
        host_network,
    };
    cache
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(sandbox_id.to_string(), detail.clone());
    Ok(detail)
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
    let detail = ContainerDetail {
        state: s.state,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason,
        message: s.message,
    };
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
        let Some(uid) = sb.labels.get(labels::POD_UID_LABEL) else {
            continue;
        };
        let detail = match sandbox_detail(rt, cache, &sb.id).await {
            Ok(d) => d,
            // Removed between the list and the status call: it is simply gone.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let state = if sb.state == PodSandboxState::SandboxReady as i32 {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        };
        let entry = pods.entry(uid.clone()).or_default();
        if entry.names.is_none()
            && let (Some(ns), Some(name)) = (
                sb.labels.get(labels::POD_NAMESPACE_LABEL),
                sb.labels.get(labels::POD_NAME_LABEL),
            )
        {
            entry.names = Some((ns.clone(), name.clone()));
        }
        entry.sandboxes.push(ObservedSandbox {
            id: sb.id.clone(),
            attempt: sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            state,
            created_at: sb.created_at,
            ip: detail.ip,
            additional_ips: detail.additional_ips,
            host_network: detail.host_network,
        });
    }
    for c in &containers {
        let Some(uid) = c.labels.get(labels::POD_UID_LABEL) else {
            continue;
        };
        let Some(name) = c.labels.get(labels::CONTAINER_NAME_LABEL) else {
            continue;
        };
        let detail = match container_detail(rt, cache, c).await {
            Ok(d) => d,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        pods.entry(uid.clone())
            .or_default()
            .containers
            .push(ObservedContainer {
                id: c.id.clone(),
                sandbox_id: c.pod_sandbox_id.clone(),
                name: name.clone(),
                attempt: c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                state: container_state(detail.state),
                created_at: c.created_at,
                started_at: detail.started_at,
                finished_at: detail.finished_at,
                exit_code: detail.exit_code,
                reason: detail.reason,
                message: detail.message,
                hash: c
                    .annotations
                    .get(labels::CONTAINER_HASH_ANNOTATION)
                    .cloned(),
                grace_period: c
                    .annotations
                    .get(labels::POD_TERMINATION_GRACE_PERIOD_ANNOTATION)
                    .and_then(|g| g.parse().ok()),
                is_init: c
                    .annotations
                    .get(labels::CONTAINER_TYPE_ANNOTATION)
                    .map(String::as_str)
                    == Some(labels::CONTAINER_TYPE_INIT),
                pre_stop: c
                    .annotations
                    .get(labels::CONTAINER_PRE_STOP_HANDLER_ANNOTATION)
                    .cloned(),
                image: c
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                image_ref: c.image_ref.clone(),
            });
    }
    Ok(pods)
}
