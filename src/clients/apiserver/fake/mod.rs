//! One in-memory API server for unit tests, served as a `tower` service so that
//! [`FakeApiServer::client`] is a real `kube::Client` with no socket: the code under test runs
//! its real requests (`Api::create`, `patch_status`, kube's watcher) and the test sees them,
//! so the request building is tested too, which a hand-written double of a trait never did.
//!
//! **The store.** Objects are JSON values by resource (group, version, plural), namespace and
//! name. One global counter gives resourceVersions; create sets `uid` and
//! `creationTimestamp` (and makes a name from `generateName`). The verbs:
//! - `get`, `list` and `deletecollection` (`labelSelector`, `fieldSelector` on any dotted path: [`select`]; no paging,
//!   `limit` is ignored), `watch` ([`watch`]: resourceVersion, bookmarks, 410 Gone after
//!   [`FakeApiServer::compact`]);
//! - `create` (409 AlreadyExists), `update` (409 Conflict on a stale resourceVersion),
//!   `patch` (merge patch; **a strategic merge patch is treated as a merge patch**, see
//!   [`patch`]), `delete` (uid and resourceVersion preconditions, `gracePeriodSeconds`: a pod
//!   bound to a node with a grace period is marked deleting and stays, as upstream's);
//! - the `status` subresource (writes to it change only the status; writes to the main
//!   resource leave the status of resources that have the subresource);
//! - `create` on `serviceaccounts/<name>/token` (a token valid for the asked
//!   `expirationSeconds`, default 3600), `tokenreviews` and `subjectaccessreviews` (echoed
//!   with an empty status: not authenticated, not allowed) until a test sets a responder.
//!
//! Errors are `Status` objects with upstream's code, reason and message, so
//! [`super::problem::describe`] classifies them as it does the API server's.
//!
//! **The controls.** Every request is logged ([`FakeApiServer::requests`],
//! [`FakeApiServer::count`]); [`FakeApiServer::fail`] answers matching requests with an error
//! N times ([`FakeApiServer::unreachable`]: no answer at all); [`FakeApiServer::hold`] keeps
//! matching requests unanswered until the [`Hold`] is released; [`FakeApiServer::respond`]
//! computes answers (TokenReview, SubjectAccessReview, TokenRequest, a CSR approved on
//! creation). The test writes objects as another client would with
//! [`FakeApiServer::apply`], [`FakeApiServer::modify`] and [`FakeApiServer::delete`]; open
//! watches see those at once.
//!
//! A request goes: logged, held, failed, responders (newest first), the store.

mod patch;
mod select;
mod store;
mod watch;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use kube::core::Status;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub(crate) use store::{Gvr, status};

use patch::PatchType;
use store::{Key, Part, Store, reason_for};

/// The verbs, as RBAC names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    fn parse(name: &str) -> Option<Verb> {
        Some(match name {
            "get" => Verb::Get,
            "list" => Verb::List,
            "watch" => Verb::Watch,
            "create" => Verb::Create,
            "update" => Verb::Update,
            "patch" => Verb::Patch,
            "delete" => Verb::Delete,
            "deletecollection" => Verb::DeleteCollection,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// A request as the fake received it, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub verb: Verb,
    pub method: http::Method,
    /// The path without the query: `/api/v1/namespaces/ns/pods/web`.
    pub path: String,
    /// The query parameters, decoded.
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body, when there is one and it is JSON.
    pub body: Option<Value>,
    pub gvr: Gvr,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Request {
    /// A query parameter.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    /// The body as a typed object (a `TokenReview`, a `Pod`).
    pub(crate) fn body_as<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.body.clone()?).ok()
    }

    /// `patch nodes/status n1`, for assertions and messages.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("{} {}", self.verb.as_str(), self.gvr.resource);
        if let Some(sub) = &self.subresource {
            s.push('/');
            s.push_str(sub);
        }
        if let Some(name) = &self.name {
            s.push(' ');
            if let Some(ns) = &self.namespace {
                s.push_str(ns);
                s.push('/');
            }
            s.push_str(name);
        }
        s
    }

    fn key(&self) -> Key {
        Key {
            gvr: self.gvr.clone(),
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.clone().unwrap_or_default(),
        }
    }

    fn parse(parts: &http::request::Parts, body: &[u8]) -> Option<Request> {
        let path = parts.uri.path();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, resource, more @ ..]
                if !matches!(*resource, "status" | "finalize") =>
            {
                (
                    Some(ns.to_string()),
                    std::iter::once(resource).chain(more).copied().collect(),
                )
            }
            _ => (None, rest.to_vec()),
        };
        let resource = rest.first()?.to_string();
        let name = rest.get(1).map(|s| s.to_string());
        let subresource = rest.get(2).map(|s| s.to_string());
        let query: BTreeMap<String, String> =
            axum::extract::Query::<BTreeMap<String, String>>::try_from_uri(&parts.uri)
                .map(|q| q.0)
                .unwrap_or_default();
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let verb = match (&parts.method, name.is_some()) {
            (&http::Method::GET, true) => Verb::Get,
            (&http::Method::GET, false) if watch => Verb::Watch,
            (&http::Method::GET, false) => Verb::List,
            (&http::Method::POST, _) => Verb::Create,
            (&http::Method::PUT, _) => Verb::Update,
            (&http::Method::PATCH, _) => Verb::Patch,
            (&http::Method::DELETE, true) => Verb::Delete,
            (&http::Method::DELETE, false) => Verb::DeleteCollection,
            _ => return None,
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Some(Request {
            verb,
            method: parts.method.clone(),
            path: path.to_string(),
            query,
            content_type,
            body: serde_json::from_slice(body).ok(),
            gvr: Gvr::new(group, version, &resource),
            namespace,
            name,
            subresource,
        })
    }
}

/// Which requests a failure, a hold or a responder applies to.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    verb: Option<Verb>,
    /// None: any resource and subresource.
    resource: Option<(String, Option<String>)>,
    namespace: Option<String>,
    name: Option<String>,
}

impl Rule {
    /// `verb` as RBAC names it (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`) or `*`; `resource` as `pods`, `nodes/status`, `serviceaccounts/token`, or
    /// `*` for any. As in RBAC, `nodes` does not cover `nodes/status`.
    pub(crate) fn new(verb: &str, resource: &str) -> Rule {
        let verb = match verb {
            "*" => None,
            v => Some(Verb::parse(v).unwrap_or_else(|| panic!("no verb {v:?}"))),
        };
        let resource = match resource {
            "*" => None,
            r => Some(match r.split_once('/') {
                Some((r, sub)) => (r.to_string(), Some(sub.to_string())),
                None => (r.to_string(), None),
            }),
        };
        Rule {
            verb,
            resource,
            namespace: None,
            name: None,
        }
    }

    /// Every request.
    pub(crate) fn any() -> Rule {
        Rule::new("*", "*")
    }

    /// Only the object of this name (as the path names it: a create's path has no name).
    pub(crate) fn named(mut self, name: &str) -> Rule {
        self.name = Some(name.into());
        self
    }

    /// Only requests in this namespace.
    pub(crate) fn in_namespace(mut self, namespace: &str) -> Rule {
        self.namespace = Some(namespace.into());
        self
    }

    pub(crate) fn matches(&self, r: &Request) -> bool {
        self.verb.is_none_or(|v| v == r.verb)
            && self
                .resource
                .as_ref()
                .is_none_or(|(res, sub)| *res == r.gvr.resource && *sub == r.subresource)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| r.namespace.as_ref() == Some(ns))
            && self
                .name
                .as_ref()
                .is_none_or(|n| r.name.as_ref() == Some(n))
    }
}

/// A responder's answer.
// A `Status` is large, but answers are few and short-lived in tests; kept unboxed so a
// responder writes `Reply::Status(status)`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// 200 (201 for a create) with this object.
    Object(Value),
    /// An error, as the API server answers it.
    Status(Status),
    /// Carry on as if the request's body were this (e.g. a CSR created already approved).
    Store(Value),
    /// No answer: the client sees a transport error (a [`super::ProblemKind::Unreachable`]).
    Unreachable,
}

/// A computed answer: `None` passes the request on to older responders and the store.
pub(crate) type Responder = Arc<dyn Fn(&Request) -> Option<Reply> + Send + Sync>;

/// The transport error of an [`Reply::Unreachable`] answer.
#[derive(Debug, thiserror::Error)]
#[error("connection refused (the fake API server was told not to answer)")]
pub(crate) struct Refused;

type Body = UnsyncBoxBody<Bytes, Infallible>;
type Response = http::Response<Body>;

struct Failure {
    rule: Rule,
    reply: Reply,
    left: usize,
}

struct HoldEntry {
    id: u64,
    rule: Rule,
    released: tokio::sync::watch::Receiver<bool>,
    arrived: Arc<tokio::sync::watch::Sender<usize>>,
    waiting: Arc<AtomicUsize>,
}

#[derive(Default)]
struct State {
    store: Store,
    log: Vec<Request>,
    failures: Vec<Failure>,
    holds: Vec<HoldEntry>,
    responders: Vec<(Rule, Responder)>,
    /// The open watches' requests, by id.
    watches: BTreeMap<u64, Request>,
    next_id: u64,
    /// Bookmarks asked for, and ends of the open watches asked for, so far.
    bookmarks: u64,
    ends: u64,
    /// Tokens the built-in TokenRequest answer has issued.
    tokens: usize,
}

struct Inner {
    state: Mutex<State>,
    /// Bumped on every change a watch has to look at (a write, a bookmark, an end).
    tick: tokio::sync::watch::Sender<u64>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake_watches(&self) {
        self.tick.send_modify(|t| *t += 1);
    }
}

/// The fake API server; clones share it.
#[derive(Clone)]
pub(crate) struct FakeApiServer {
    inner: Arc<Inner>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        FakeApiServer::new()
    }
}

/// What the typed helpers take: a k8s-openapi type.
pub(crate) trait Object:
    kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone
{
}
impl<K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone> Object for K {}

fn gvr_of<K: Object>() -> Gvr {
    Gvr::new(&K::group(&()), &K::version(&()), &K::plural(&()))
}

fn key_of<K: Object>(namespace: &str, name: &str) -> Key {
    Key {
        gvr: gvr_of::<K>(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn typed<K: Object>(value: Value) -> K {
    serde_json::from_value(value).expect("the fake's object reads as its type")
}

impl FakeApiServer {
    pub(crate) fn new() -> Self {
        let (tick, _) = tokio::sync::watch::channel(0);
        FakeApiServer {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                tick,
            }),
        }
    }

    /// A kube client whose requests this fake answers (default namespace `default`).
    pub(crate) fn client(&self) -> kube::Client {
        kube::Client::new(Service(self.inner.clone()), "default")
    }

    /// The tower service behind [`Self::client`], for a test that puts layers in front of
    /// it (a rate limit, as `connect` does) before making its own `kube::Client::new`.
    pub(crate) fn service(
        &self,
    ) -> impl tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<UnsyncBoxBody<Bytes, Infallible>>,
        Error = Refused,
        Future = BoxFuture<'static, Result<Response, Refused>>,
    > + Clone
    + Send
    + 'static {
        Service(self.inner.clone())
    }

    /// Creates or replaces `object` as another client would (no precondition); open
    /// watches see it. Returns it as stored (uid, resourceVersion).
    pub(crate) fn apply<K: Object>(&self, object: &K) -> K {
        let meta = object.meta();
        let key = key_of::<K>(
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().expect("a name"),
        );
        let value = serde_json::to_value(object).expect("serializable");
        let stored = self.inner.state().store.apply(&key, value);
        self.inner.wake_watches();
        typed(stored)
    }

    /// The object `name` (`namespace` "" for a cluster-scoped one), as stored.
    pub(crate) fn get<K: Object>(&self, namespace: &str, name: &str) -> Option<K> {
        let state = self.inner.state();
        state
            .store
            .get(&key_of::<K>(namespace, name))
            .cloned()
            .map(typed)
    }

    /// The objects of a type, in `namespace` or in all.
    pub(crate) fn list<K: Object>(&self, namespace: Option<&str>) -> Vec<K> {
        let gvr = gvr_of::<K>();
        let state = self.inner.state();
        state
            .store
            .list(&gvr, namespace)
            .cloned()
            .map(typed)
            .collect()
    }

    /// Changes the stored object as another client would (a new resourceVersion, so the
    /// code under test's copy is stale). Panics if it is not there.
    pub(crate) fn modify<K: Object>(
        &self,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut K),
    ) -> K {
        let mut object: K = self
            .get(namespace, name)
            .unwrap_or_else(|| panic!("no {name:?} in {namespace:?} to modify"));
        f(&mut object);
        self.apply(&object)
    }

    /// Removes the object at once (no grace, no finalizers); open watches see it deleted.
    pub(crate) fn delete<K: Object>(&self, namespace: &str, name: &str) -> Option<K> {
        let removed = self
            .inner
            .state()
            .store
            .remove(&key_of::<K>(namespace, name));
        self.inner.wake_watches();
        removed.map(typed)
    }

    /// The newest resourceVersion given out.
    pub(crate) fn resource_version(&self) -> u64 {
        self.inner.state().store.rv
    }

    /// Every request so far, oldest first.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.inner.state().log.clone()
    }

    /// The requests so far that `rule` matches.
    pub(crate) fn count(&self, rule: &Rule) -> usize {
        self.inner
            .state()
            .log
            .iter()
            .filter(|r| rule.matches(r))
            .count()
    }

    /// Forgets the requests so far.
    pub(crate) fn clear_requests(&self) {
        self.inner.state().log.clear();
    }

    /// The next `times` requests `rule` matches are answered with `code` and upstream's
    /// reason for it (403 Forbidden, 409 Conflict, 500 InternalError, …).
    pub(crate) fn fail(&self, rule: Rule, code: u16, times: usize) {
        let reason = reason_for(code);
        let message = format!("the fake API server answers {code} {reason}");
        self.fail_with(rule, status(code, reason, message), times);
    }

    /// As [`Self::fail`], with this `Status` (a message of upstream's words).
    pub(crate) fn fail_with(&self, rule: Rule, status: Status, times: usize) {
        self.add_failure(rule, Reply::Status(status), times);
    }

    /// The next `times` requests `rule` matches get no answer (a transport error).
    pub(crate) fn unreachable(&self, rule: Rule, times: usize) {
        self.add_failure(rule, Reply::Unreachable, times);
    }

    /// Drops the failures not yet used up: the API server works again.
    pub(crate) fn clear_failures(&self) {
        self.inner.state().failures.clear();
    }

    fn add_failure(&self, rule: Rule, reply: Reply, times: usize) {
        self.inner.state().failures.push(Failure {
            rule,
            reply,
            left: times,
        });
    }

    /// Keeps every request `rule` matches unanswered (logged, not yet served) until the
    /// returned [`Hold`] is released or dropped.
    pub(crate) fn hold(&self, rule: Rule) -> Hold {
        let (released, rx) = tokio::sync::watch::channel(false);
        let arrived = Arc::new(tokio::sync::watch::channel(0).0);
        let waiting = Arc::new(AtomicUsize::new(0));
        let mut state = self.inner.state();
        state.next_id += 1;
        let id = state.next_id;
        state.holds.push(HoldEntry {
            id,
            rule,
            released: rx,
            arrived: arrived.clone(),
            waiting: waiting.clone(),
        });
        Hold {
            id,
            inner: self.inner.clone(),
            released,
            arrived,
            waiting,
        }
    }

    /// Answers the requests `rule` matches with `responder` (newer responders first; `None`
    /// passes the request on).
    pub(crate) fn respond(
        &self,
        rule: Rule,
        responder: impl Fn(&Request) -> Option<Reply> + Send + Sync + 'static,
    ) {
        self.inner
            .state()
            .responders
            .push((rule, Arc::new(responder)));
    }

    /// Forgets the history: a watch from an older resourceVersion (one open now that falls
    /// behind, or the next one a watcher starts) gets 410 Expired, and a watcher lists again.
    pub(crate) fn compact(&self) {
        self.inner.state().store.compact();
        self.inner.wake_watches();
    }

    /// Sends a `BOOKMARK` with the newest resourceVersion on the open watches that allow them.
    pub(crate) fn bookmark(&self) {
        self.inner.state().bookmarks += 1;
        self.inner.wake_watches();
    }

    /// Ends the open watch streams, as an API server does at a watch's time-out.
    pub(crate) fn end_watches(&self) {
        self.inner.state().ends += 1;
        self.inner.wake_watches();
    }

    /// The requests of the watches open now.
    pub(crate) fn open_watches(&self) -> Vec<Request> {
        self.inner.state().watches.values().cloned().collect()
    }
}

/// Requests held by [`FakeApiServer::hold`] until this is released or dropped.
#[must_use = "dropping a Hold releases it"]
pub(crate) struct Hold {
    id: u64,
    inner: Arc<Inner>,
    released: tokio::sync::watch::Sender<bool>,
    arrived: Arc<tokio::sync::watch::Sender<usize>>,
    waiting: Arc<AtomicUsize>,
}

impl Hold {
    /// Lets the held requests (and later ones) through.
    pub(crate) fn release(self) {}

    /// How many requests are held now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests in all have been caught.
    pub(crate) async fn arrived(&self, n: usize) {
        let mut rx = self.arrived.subscribe();
        let _ = rx.wait_for(|count| *count >= n).await;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.inner.state().holds.retain(|h| h.id != self.id);
        self.released.send_replace(true);
    }
}

/// Counts a held request while it waits.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The tower service the kube client sends its requests to.
#[derive(Clone)]
struct Service(Arc<Inner>);

impl tower::Service<http::Request<kube::client::Body>> for Service {
    type Response = Response;
    type Error = Refused;
    type Future = BoxFuture<'static, Result<Response, Refused>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refused>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        Box::pin(serve(self.0.clone(), request))
    }
}

async fn serve(
    inner: Arc<Inner>,
    request: http::Request<kube::client::Body>,
) -> Result<Response, Refused> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let Some(mut request) = Request::parse(&parts, &body) else {
        let path = parts.uri.path();
        return Ok(status_response(&status(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )));
    };
    inner.state().log.push(request.clone());
    wait_for_holds(&inner, &request).await;
    if let Some(reply) = take_failure(&inner, &request) {
        return reply_response(reply, &request);
    }
    match respond(&inner, &request) {
        Some(Reply::Store(body)) => request.body = Some(body),
        Some(reply) => return reply_response(reply, &request),
        None => {}
    }
    Ok(dispatch(&inner, &request))
}

async fn wait_for_holds(inner: &Inner, request: &Request) {
    let holds: Vec<_> = inner
        .state()
        .holds
        .iter()
        .filter(|h| h.rule.matches(request))
        .map(|h| {
            h.waiting.fetch_add(1, Ordering::SeqCst);
            h.arrived.send_modify(|n| *n += 1);
            (h.released.clone(), Waiting(h.waiting.clone()))
        })
        .collect();
    for (mut released, _waiting) in holds {
        let _ = released.wait_for(|r| *r).await;
    }
}

fn take_failure(inner: &Inner, request: &Request) -> Option<Reply> {
    let mut state = inner.state();
    let i = state
        .failures
        .iter()
        .position(|f| f.left > 0 && f.rule.matches(request))?;
    let failure = &mut state.failures[i];
    failure.left -= 1;
    let reply = failure.reply.clone();
    if failure.left == 0 {
        state.failures.remove(i);
    }
    Some(reply)
}

fn respond(inner: &Inner, request: &Request) -> Option<Reply> {
    let responders: Vec<Responder> = inner
        .state()
        .responders
        .iter()
        .rev()
        .filter(|(rule, _)| rule.matches(request))
        .map(|(_, r)| r.clone())
        .collect();
    responders.iter().find_map(|r| r(request))
}

fn reply_response(reply: Reply, request: &Request) -> Result<Response, Refused> {
    match reply {
        Reply::Object(v) => Ok(json_response(success_code(request), &v)),
        Reply::Status(s) => Ok(status_response(&s)),
        Reply::Store(v) => Ok(json_response(success_code(request), &v)),
        Reply::Unreachable => Err(Refused),
    }
}

fn success_code(request: &Request) -> u16 {
    if request.verb == Verb::Create {
        201
    } else {
        200
    }
}

fn full(code: u16, bytes: Vec<u8>) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn json_response(code: u16, value: &Value) -> Response {
    full(code, serde_json::to_vec(value).unwrap_or_default())
}

fn status_response(s: &Status) -> Response {
    let mut value = serde_json::to_value(s).unwrap_or_default();
    value["kind"] = "Status".into();
    value["apiVersion"] = "v1".into();
    value["metadata"] = json!({});
    value["status"] = "Failure".into();
    json_response(s.code, &value)
}

fn result_response(result: Result<Value, Box<Status>>, code: u16) -> Response {
    match result {
        Ok(v) => json_response(code, &v),
        Err(s) => status_response(&s),
    }
}

/// The kind of a resource's objects, for list and bookmark type fields.
fn kind_of(gvr: &Gvr) -> String {
    let known = [
        ("pods", "Pod"),
        ("nodes", "Node"),
        ("leases", "Lease"),
        ("configmaps", "ConfigMap"),
        ("secrets", "Secret"),
        ("events", "Event"),
        ("serviceaccounts", "ServiceAccount"),
        ("certificatesigningrequests", "CertificateSigningRequest"),
        ("namespaces", "Namespace"),
        ("services", "Service"),
        ("endpoints", "Endpoints"),
    ];
    if let Some((_, kind)) = known.iter().find(|(r, _)| *r == gvr.resource) {
        return kind.to_string();
    }
    let singular = gvr.resource.strip_suffix('s').unwrap_or(&gvr.resource);
    let mut chars = singular.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The answer of the store (or of a built-in responder) to `request`.
fn dispatch(inner: &Arc<Inner>, request: &Request) -> Response {
    let key = request.key();
    let part = Part::of(request.subresource.as_deref());
    let body = request.body.clone().unwrap_or(Value::Null);
    let written = |result: Result<Value, Box<Status>>, code| {
        inner.wake_watches();
        result_response(result, code)
    };
    match request.verb {
        Verb::Get => {
            let state = inner.state();
            let found = state.store.get(&key).cloned();
            result_response(found.ok_or_else(|| Box::new(store::not_found(&key))), 200)
        }
        Verb::List => list(inner, request),
        Verb::Watch => match watch::open(inner.clone(), request) {
            Ok(lines) => {
                let frames = lines.map(|b| Ok::<_, Infallible>(Frame::data(b)));
                let mut response = http::Response::new(StreamBody::new(frames).boxed_unsync());
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(s) => status_response(&s),
        },
        Verb::Create => {
            let tokens = {
                let mut state = inner.state();
                if (
                    request.gvr.resource.as_str(),
                    request.subresource.as_deref(),
                ) == ("serviceaccounts", Some("token"))
                {
                    state.tokens += 1;
                }
                state.tokens
            };
            if let Some(answer) = builtin(request, tokens) {
                return json_response(201, &answer);
            }
            if request.subresource.is_some() {
                return status_response(&status(
                    404,
                    "NotFound",
                    format!(
                        "the fake API server has no responder for {}",
                        request.describe()
                    ),
                ));
            }
            let result =
                inner
                    .state()
                    .store
                    .create(&request.gvr, request.namespace.as_deref(), body);
            written(result, 201)
        }
        Verb::Update => written(inner.state().store.update(&key, part, body), 200),
        Verb::Patch => {
            let kind = request
                .content_type
                .as_deref()
                .and_then(PatchType::from_content_type);
            if kind.is_none_or(|k| k == PatchType::Json) {
                let message = format!(
                    "the fake API server does not take {:?} patches",
                    request.content_type
                );
                return status_response(&status(415, "UnsupportedMediaType", message));
            }
            written(inner.state().store.patch(&key, part, &body), 200)
        }
        Verb::Delete => {
            let mut options = if body.is_object() { body } else { json!({}) };
            if let Some(grace) = request
                .param("gracePeriodSeconds")
                .and_then(|g| g.parse::<i64>().ok())
            {
                options["gracePeriodSeconds"] = grace.into();
            }
            written(inner.state().store.delete(&key, &options), 200)
        }
        Verb::DeleteCollection => delete_collection(inner, request),
    }
}

/// The request's label and field selectors, or the 400 answer to a bad one (boxed: an
/// answer is far larger than a selector).
fn selector_of(request: &Request) -> Result<select::Selector, Box<Response>> {
    select::Selector::parse(
        request.param("labelSelector"),
        request.param("fieldSelector"),
    )
    .map_err(|e| Box::new(status_response(&status(400, "BadRequest", e.to_string()))))
}

/// A list answer of `items` at the store's version `rv`.
fn list_response(request: &Request, rv: u64, items: Vec<Value>) -> Response {
    json_response(
        200,
        &json!({
            "apiVersion": request.gvr.api_version(),
            "kind": format!("{}List", kind_of(&request.gvr)),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    )
}

/// DELETE on a collection: every object the selectors match goes as a DELETE of it would
/// (finalizers and graces kept); the answer lists what was matched.
fn delete_collection(inner: &Inner, request: &Request) -> Response {
    let selector = match selector_of(request) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    let mut state = inner.state();
    let keys: Vec<store::Key> = state
        .store
        .list(&request.gvr, request.namespace.as_deref())
        .filter(|o| selector.matches(o))
        .map(|o| store::Key {
            gvr: request.gvr.clone(),
            namespace: o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            name: o["metadata"]["name"].as_str().unwrap_or("").to_string(),
        })
        .collect();
    let items = keys
        .iter()
        .filter_map(|key| state.store.delete(key, &json!({})).ok())
        .collect();
    list_response(request, state.store.rv, items)
}

fn list(inner: &Inner, request: &Request) -> Response {
    let selector = match selector_of(request) {
        Ok(s) => s,
        Err(answer) => return *answer,
    };
    let state = inner.state();
    let items: Vec<Value> = state
        .store
        .list(&request.gvr, request.namespace.as_deref())
        .filter(|o| selector.matches(o))
        .cloned()
        .collect();
    list_response(request, state.store.rv, items)
}

/// The answers of the creates nothing is stored for, until a test sets a responder:
/// a TokenRequest gets a token (`fake-token-<n>`, the n-th token issued) for its
/// `expirationSeconds` (default 3600); a TokenReview or
/// a SubjectAccessReview is echoed with an empty status (not authenticated, not allowed).
fn builtin(request: &Request, tokens: usize) -> Option<Value> {
    let mut body = request.body.clone().unwrap_or_else(|| json!({}));
    match (
        request.gvr.resource.as_str(),
        request.subresource.as_deref(),
    ) {
        ("serviceaccounts", Some("token")) => {
            let seconds = body["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
            body["spec"]["expirationSeconds"] = seconds.into();
            let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
            body["status"] = json!({
                "token": format!("fake-token-{tokens}"),
                "expirationTimestamp": store::timestamp(expires),
            });
            Some(body)
        }
        ("tokenreviews", None) => {
            body["status"] = json!({});
            Some(body)
        }
        (
            "subjectaccessreviews" | "selfsubjectaccessreviews" | "localsubjectaccessreviews",
            None,
        ) => {
            body["status"] = json!({"allowed": false});
            Some(body)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
