//! Watch requests (`?watch=true`): newline-delimited JSON events as the API server streams
//! them, read from the store's history.
//!
//! - `resourceVersion` absent or `0`: an `ADDED` event for each object selected now, then the
//!   changes; `N`: the changes after `N`; older than the last [`super::FakeApiServer::compact`]:
//!   one `ERROR` event with 410 Expired (as the watch cache answers), and the stream ends.
//! - `sendInitialEvents=true` (a streaming list): the `ADDED` events, then a `BOOKMARK`
//!   annotated `k8s.io/initial-events-end`.
//! - A selector applies to the object before and after each change, as upstream's watch
//!   filter does: an object that starts to match is `ADDED`, one that stops is `DELETED`.
//! - `allowWatchBookmarks=true`: a `BOOKMARK` with the newest resourceVersion whenever the
//!   test asks ([`super::FakeApiServer::bookmark`]).
//! - The stream ends after `timeoutSeconds` (tokio's clock, so a paused clock moves it), when
//!   the test ends the open watches, or when the client drops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use hyper::body::Bytes;
use kube::core::Status;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::select::Selector;
use super::store::{Change, Gvr, status};
use super::{Inner, Request};

/// What one watch request asks for.
struct Spec {
    gvr: Gvr,
    namespace: Option<String>,
    selector: Selector,
    bookmarks: bool,
    deadline: Option<tokio::time::Instant>,
}

/// Where a watch stream is.
struct Cursor {
    inner: Arc<Inner>,
    spec: Spec,
    id: u64,
    /// The newest resourceVersion the stream has sent events up to.
    sent: u64,
    bookmarks_seen: u64,
    ends_seen: u64,
    pending: VecDeque<Bytes>,
    done: bool,
    ticks: watch::Receiver<u64>,
}

impl Drop for Cursor {
    fn drop(&mut self) {
        self.inner.state().watches.remove(&self.id);
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(gvr: &Gvr, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object =
        json!({"apiVersion": gvr.api_version(), "kind": super::kind_of(gvr), "metadata": meta});
    line("BOOKMARK", &object)
}

fn expired(asked: u64, oldest: u64) -> Bytes {
    let gone = status(
        410,
        "Expired",
        format!("too old resource version: {asked} ({oldest})"),
    );
    let mut object = serde_json::to_value(&gone).unwrap_or_default();
    object["kind"] = "Status".into();
    object["apiVersion"] = "v1".into();
    line("ERROR", &object)
}

impl Spec {
    fn selects(&self, namespace: &str, object: Option<&Value>) -> bool {
        object.is_some_and(|o| {
            self.namespace.as_deref().is_none_or(|ns| ns == namespace) && self.selector.matches(o)
        })
    }

    /// The event a change is to this watch, if any.
    fn event(&self, change: &Change) -> Option<Bytes> {
        if change.key.gvr != self.gvr {
            return None;
        }
        let ns = &change.key.namespace;
        let was = self.selects(ns, change.before.as_ref());
        let is = self.selects(ns, change.after.as_ref());
        let kind = match (was, is) {
            (false, true) => "ADDED",
            (true, true) => "MODIFIED",
            (true, false) => "DELETED",
            (false, false) => return None,
        };
        Some(line(kind, &change.object))
    }
}

/// Opens a watch for `request`: its stream of event lines, or the error to answer with.
pub(crate) fn open(
    inner: Arc<Inner>,
    request: &Request,
) -> Result<BoxStream<'static, Bytes>, Box<Status>> {
    let selector = Selector::parse(
        request.param("labelSelector"),
        request.param("fieldSelector"),
    )
    .map_err(|e| Box::new(status(400, "BadRequest", e.to_string())))?;
    let from = match request.param("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| status(400, "BadRequest", format!("invalid resource version: {v}")))?,
        ),
    };
    let initial_events = request.param("sendInitialEvents") == Some("true");
    let timeout = request
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok());
    let spec = Spec {
        gvr: request.gvr.clone(),
        namespace: request.namespace.clone(),
        selector,
        bookmarks: request.param("allowWatchBookmarks") == Some("true"),
        deadline: timeout.map(|t| crate::base::clock::instant() + Duration::from_secs(t)),
    };
    let ticks = inner.tick.subscribe();
    let mut state = inner.state();
    state.next_id += 1;
    let id = state.next_id;
    state.watches.insert(id, request.clone());
    let store = &state.store;
    let mut pending = VecDeque::new();
    let mut done = false;
    let sent = match from {
        Some(rv) if rv < store.compacted => {
            pending.push_back(expired(rv, store.compacted));
            done = true;
            rv
        }
        Some(rv) if !initial_events => rv,
        _ => {
            for object in store.list(&spec.gvr, spec.namespace.as_deref()) {
                if spec.selector.matches(object) {
                    pending.push_back(line("ADDED", object));
                }
            }
            if initial_events {
                pending.push_back(bookmark(&spec.gvr, store.rv, true));
            }
            store.rv
        }
    };
    let cursor = Cursor {
        spec,
        id,
        sent,
        bookmarks_seen: state.bookmarks,
        ends_seen: state.ends,
        pending,
        done,
        ticks,
        inner: inner.clone(),
    };
    drop(state);
    Ok(futures::stream::unfold(cursor, next).boxed())
}

/// The stream's next line.
async fn next(mut c: Cursor) -> Option<(Bytes, Cursor)> {
    loop {
        if let Some(line) = c.pending.pop_front() {
            return Some((line, c));
        }
        if c.done {
            return None;
        }
        c.ticks.borrow_and_update();
        if !c.look() {
            return None;
        }
        if !c.pending.is_empty() {
            continue;
        }
        let deadline = c.spec.deadline;
        tokio::select! {
            changed = c.ticks.changed() => if changed.is_err() { return None },
            _ = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => return None,
        }
    }
}

impl Cursor {
    /// Queues what happened since the last look. False when the watch is to end.
    fn look(&mut self) -> bool {
        let inner = self.inner.clone();
        let state = inner.state();
        if state.ends != self.ends_seen {
            return false;
        }
        let store = &state.store;
        if self.sent < store.compacted {
            self.pending.push_back(expired(self.sent, store.compacted));
            self.done = true;
            return true;
        }
        let start = store.history.partition_point(|c| c.rv <= self.sent);
        for change in &store.history[start..] {
            self.pending.extend(self.spec.event(change));
            self.sent = change.rv;
        }
        if state.bookmarks != self.bookmarks_seen {
            self.bookmarks_seen = state.bookmarks;
            if self.spec.bookmarks {
                self.sent = store.rv;
                self.pending
                    .push_back(bookmark(&self.spec.gvr, store.rv, false));
            }
        }
        true
    }
}
