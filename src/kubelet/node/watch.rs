//! A watch of the node's own Node (`metadata.name=<node>`), as upstream's kubelet keeps a
//! Node informer: every version the API server has goes to the [`NodePublisher`], so admission
//! sees a `kubectl label node` or `kubectl taint node` within moments instead of at the node
//! agent's next status write. kube's watcher does the listing and watching
//! ([`crate::clients::apiserver::watch`]): one long watch request at a time (the API server
//! ends each within 290 s; bookmarks keep the version current), so at rest it adds about one
//! request every five minutes; a 410 Gone lists again; failures retry with back-off up to 7 s,
//! each reported once. Nothing a pod does waits for it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::agent::NodePublisher;
use crate::clients::apiserver::ProblemLog;
use crate::clients::apiserver::watch::{self as api_watch, Event, Watch};

/// The wait before the first retry of a failed list or watch (then doubling to 7 s).
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// Watches Node `name` until `cancel`, publishing each version.
pub(crate) async fn run(
    client: kube::Client,
    name: String,
    publisher: NodePublisher,
    cancel: CancellationToken,
) {
    let config = api_watch::Config::default().fields(&format!("metadata.name={name}"));
    let mut watch = Watch::new(
        api_watch::events(Api::<Node>::all(client), config),
        FIRST_RETRY,
        "watching the Node",
        ProblemLog::default(),
    );
    while let Some(next) = watch.next(&cancel).await {
        if let Ok(event) = next
            && let Some(node) = to_publish(&event)
        {
            publisher.publish(node);
        }
    }
}

/// The version of the Node an event brings: a listed or a changed Node (a deleted one stays
/// published until the Node is registered again).
fn to_publish(event: &Event<Node>) -> Option<&Node> {
    match event {
        Event::Apply(node) | Event::InitApply(node) => Some(node),
        Event::Delete(_) | Event::Init | Event::InitDone => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_and_changed_nodes_are_published() {
        let node = |v: &str| {
            let mut n = Node::default();
            n.metadata.resource_version = Some(v.into());
            n
        };
        let published =
            |e: Event<Node>| to_publish(&e).and_then(|n| n.metadata.resource_version.clone());
        assert_eq!(published(Event::Init), None);
        assert_eq!(published(Event::InitApply(node("1"))).as_deref(), Some("1"));
        assert_eq!(published(Event::InitDone), None);
        assert_eq!(published(Event::Apply(node("2"))).as_deref(), Some("2"));
        assert_eq!(published(Event::Delete(node("3"))), None);
    }
}
