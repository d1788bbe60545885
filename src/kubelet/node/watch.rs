//! A watch of the node's own Node (`metadata.name=<node>`), as upstream's kubelet keeps a
//! Node informer: every version the API server has goes to the [`NodePublisher`], so admission
//! sees a `kubectl label node` or `kubectl taint node` within moments instead of at the node
//! agent's next status write. One list, then one long watch request at a time (the API server
//! ends each within 290 s; bookmarks keep the version current), so at rest it adds about one
//! request every five minutes. A 410 Gone lists again; other failures retry with back-off up
//! to 7 s. Nothing a pod does waits for it.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio_util::sync::CancellationToken;

use super::agent::NodePublisher;
use crate::clients::apiserver::retry::{Backoff, pause};
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};

/// How long one watch request lasts before the API server ends it.
const WATCH_SECONDS: u32 = 290;

/// Watches Node `name` until `cancel`, publishing each version.
pub async fn run(
    client: kube::Client,
    name: String,
    publisher: NodePublisher,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let fields = format!("metadata.name={name}");
    let problems = ProblemLog::default();
    let mut backoff = Backoff::new(Duration::from_millis(100));
    let mut version: Option<String> = None;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        let result = match version.clone() {
            // Neither a slow list nor a slow watch request holds up a stop.
            None => match tokio::select! {
                _ = cancel.cancelled() => return,
                r = list(&nodes, &fields, &publisher) => r,
            } {
                Ok(v) => {
                    version = Some(v);
                    Ok(())
                }
                Err(p) => Err(p),
            },
            Some(from) => watch(&nodes, &fields, &from, &publisher, &cancel)
                .await
                .map(|newest| version = Some(newest)),
        };
        match result {
            Ok(()) => {
                backoff.reset();
                problems.succeeded("watching the Node");
            }
            Err(p) if p.is(ProblemKind::Expired) => {
                tracing::debug!(node = %name, "the Node watch's version expired; listing again");
                version = None;
            }
            Err(p) => {
                problems.failed("watching the Node", &p);
                if !pause(backoff.next_wait(), &cancel).await {
                    return;
                }
            }
        }
    }
}

/// Lists the Node and publishes it; the list's version.
async fn list(
    nodes: &Api<Node>,
    fields: &str,
    publisher: &NodePublisher,
) -> Result<String, Problem> {
    let list = nodes.list(&ListParams::default().fields(fields)).await?;
    if let Some(node) = list.items.first() {
        publisher.publish(node);
    }
    Ok(list.metadata.resource_version.unwrap_or_default())
}

/// One watch request from `from`, publishing every version until it ends; the newest version
/// seen.
async fn watch(
    nodes: &Api<Node>,
    fields: &str,
    from: &str,
    publisher: &NodePublisher,
    cancel: &CancellationToken,
) -> Result<String, Problem> {
    let params = WatchParams::default().fields(fields).timeout(WATCH_SECONDS);
    let stream = tokio::select! {
        _ = cancel.cancelled() => return Ok(from.to_string()),
        r = nodes.watch(&params, from) => r?,
    };
    let mut stream = std::pin::pin!(stream);
    let mut newest = from.to_string();
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return Ok(newest),
            e = stream.next() => e,
        };
        let Some(event) = event else {
            return Ok(newest);
        };
        match event? {
            WatchEvent::Added(node) | WatchEvent::Modified(node) => {
                if let Some(v) = &node.metadata.resource_version {
                    newest = v.clone();
                }
                publisher.publish(&node);
            }
            WatchEvent::Deleted(node) => {
                if let Some(v) = &node.metadata.resource_version {
                    newest = v.clone();
                }
            }
            WatchEvent::Bookmark(b) => newest = b.metadata.resource_version,
            WatchEvent::Error(status) => {
                return Err(Problem::watch_ended("the Node watch", &status));
            }
        }
    }
}
