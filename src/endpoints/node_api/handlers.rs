//! The node API's endpoints, behind the authentication and authorization gate.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRef, Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::auth::{Gate, Verdict};
use super::log_read;
use super::logs;
use super::review::UserInfo;
use super::streaming;
use crate::base::clock;
use crate::base::health::Health;
use crate::base::observed::{ContainerState, ObservedPod, SandboxState};
use crate::clients::cri::CriClient;
use crate::clients::cri::CriError;
use crate::clients::cri::proto::{AttachRequest, ExecRequest, PortForwardRequest};
use crate::endpoints::listener::ConnectionHandle;
use crate::endpoints::routes::{self, Healthz, Metrics, Pages};
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_status::published::PodStates;

/// The user of the connection's verified client certificate, put on each request by the
/// listener.
#[derive(Clone, Debug, Default)]
pub struct PeerUser(pub Option<UserInfo>);

/// The runtime's streaming URLs (CRI `Exec`, `Attach`, `PortForward`).
pub trait StreamUrls: Send + Sync + 'static {
    fn exec(&self, req: ExecRequest) -> BoxFuture<'_, Result<String, CriError>>;
    fn attach(&self, req: AttachRequest) -> BoxFuture<'_, Result<String, CriError>>;
    fn port_forward(&self, req: PortForwardRequest) -> BoxFuture<'_, Result<String, CriError>>;
}

impl StreamUrls for CriClient {
    fn exec(&self, req: ExecRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(CriClient::exec(self, req))
    }
    fn attach(&self, req: AttachRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(CriClient::attach(self, req))
    }
    fn port_forward(&self, req: PortForwardRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(CriClient::port_forward(self, req))
    }
}

/// What the endpoints read.
#[derive(Clone)]
pub struct NodeApiState {
    pub gate: Arc<Gate>,
    pub health: Health,
    pub pods: PodStates,
    pub runtime: RuntimeCache,
    pub streams: Arc<dyn StreamUrls>,
    pub metrics: Metrics,
    pub pod_logs_dir: PathBuf,
    /// `/logs/`'s root (`/var/log`).
    pub node_log_dir: PathBuf,
    /// `/configz`'s body, rendered once at start.
    pub configz: Arc<Vec<u8>>,
    /// `/stats/summary` and `/metrics/resource`.
    pub stats: Arc<crate::kubelet::stats::StatsProvider>,
    /// Which optional endpoints are served.
    pub debug: DebugHandlers,
}

/// The shared pages read the node API's health, pods, metrics and stats.
impl FromRef<NodeApiState> for Pages {
    fn from_ref(state: &NodeApiState) -> Pages {
        Pages {
            health: state.health.clone(),
            pods: state.pods.clone(),
            metrics: state.metrics.clone(),
            stats: Some(state.stats.clone()),
        }
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn json(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// The answer when the listener's streams are at their cap.
pub(crate) const TOO_MANY_STREAMS: &str = "too many open streams on this node; try again later";

/// Every request passes the gate first: 401, 403 or 500 with upstream's bodies.
async fn gate(State(state): State<NodeApiState>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<PeerUser>()
        .cloned()
        .unwrap_or_default();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let verdict = state
        .gate
        .check(
            peer.0.as_ref(),
            authorization,
            req.method(),
            req.uri().path(),
        )
        .await;
    match verdict {
        Verdict::Allowed(user) => {
            tracing::debug!(user = %user.name, method = %req.method(), path = %req.uri().path(), "node API request");
            // The connection has authenticated: it leaves the unauthenticated class's limits.
            if user.name != super::auth::ANONYMOUS_USER
                && let Some(connection) = req.extensions().get::<ConnectionHandle>()
            {
                connection.mark_authenticated();
            }
            next.run(req).await
        }
        Verdict::Unauthorized => text(StatusCode::UNAUTHORIZED, "Unauthorized"),
        Verdict::Forbidden(body) => text(StatusCode::FORBIDDEN, body),
        Verdict::Error(body) => text(StatusCode::INTERNAL_SERVER_ERROR, body),
    }
}

/// Which of the node API's optional endpoints are served, as upstream's server decides at
/// start: `enableDebuggingHandlers` (exec, attach, port-forward, run, container logs,
/// `/runningpods/`, `/configz`, `/logs/`) and, among those, `enableSystemLogHandler`
/// (`/logs/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugHandlers {
    pub debugging: bool,
    pub system_log: bool,
}

impl Default for DebugHandlers {
    /// Upstream's defaults: both served.
    fn default() -> Self {
        DebugHandlers {
            debugging: true,
            system_log: true,
        }
    }
}

impl DebugHandlers {
    pub fn from_config(hardening: &crate::config::HardeningSettings) -> Self {
        DebugHandlers {
            debugging: hardening.debugging_handlers,
            system_log: hardening.system_log_handler,
        }
    }
}

/// Upstream's answer on a debugging path with `enableDebuggingHandlers: false`.
pub(crate) const DEBUG_DISABLED: &str = "Debug endpoints are disabled.\n";
/// Upstream's answer on `/logs/` with `enableSystemLogHandler: false`.
pub(crate) const LOGS_DISABLED: &str = "logs endpoint is disabled.\n";

/// The router of the node API: the shared pages and its own. Every path passes the gate
/// first, the refused ones too, as upstream's authentication filter runs before its handlers.
pub fn router(state: NodeApiState) -> Router {
    let always = routes::common(Healthz::Short);
    let debug = state.debug;
    let routes = if debug.debugging {
        always.merge(debugging_routes(debug.system_log))
    } else {
        // As upstream: these paths answer 405 with one message; `/configz` is not there.
        ["/run", "/exec", "/attach", "/portForward", "/containerLogs"]
            .into_iter()
            .chain(["/runningpods", "/debug/pprof", "/logs"])
            .fold(always, |r, path| disabled(r, path, DEBUG_DISABLED))
    };
    routes
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        // Outermost, so refused requests are counted too (upstream counts before auth).
        .layer(middleware::from_fn(|req, next| {
            routes::count_request("readwrite", req, next)
        }))
        .with_state(state)
}

/// The endpoints `enableDebuggingHandlers` turns on; `/logs/` only with `system_log`.
fn debugging_routes(system_log: bool) -> Router<NodeApiState> {
    let routes = Router::new()
        .route("/runningpods/", get(running_pods))
        .route("/configz", get(configz))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{*rest}", any(exec))
        .route("/attach/{*rest}", any(attach))
        .route("/portForward/{*rest}", any(port_forward));
    if system_log {
        routes
            .route("/logs", get(node_logs_root))
            .route("/logs/", get(node_logs_root))
            .route("/logs/{*path}", get(node_logs))
    } else {
        disabled(routes, "/logs", LOGS_DISABLED)
    }
}

/// `path`, `path/` and everything under it answer 405 with `message`, for any method (Go's
/// subtree pattern `path/`, as upstream registers them).
fn disabled(
    routes: Router<NodeApiState>,
    path: &str,
    message: &'static str,
) -> Router<NodeApiState> {
    let answer = move || async move { text(StatusCode::METHOD_NOT_ALLOWED, message) };
    routes
        .route(path, any(answer))
        .route(&format!("{path}/"), any(answer))
        .route(&format!("{path}/{{*rest}}"), any(answer))
}

/// A pod as the runtime has it: name, namespace, UID and its running containers (name and
/// image), as upstream's `/runningpods/`.
pub fn running_pod(uid: &str, observed: &ObservedPod) -> Option<Pod> {
    let (namespace, name) = observed.names.clone()?;
    let containers: Vec<Container> = observed
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| Container {
            name: c.name.clone(),
            image: Some(c.image.clone()),
            ..Default::default()
        })
        .collect();
    let sandbox_ready = observed
        .sandboxes
        .iter()
        .any(|s| s.state == SandboxState::Ready);
    if containers.is_empty() && !sandbox_ready {
        return None;
    }
    Some(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            ..Default::default()
        }),
        status: None,
    })
}

async fn running_pods(State(state): State<NodeApiState>) -> Response {
    let items: Vec<Pod> = state
        .runtime
        .pod_uids()
        .iter()
        .filter_map(|uid| running_pod(uid, &state.runtime.pod(uid)?))
        .collect();
    let list = k8s_openapi::List::<Pod> {
        items,
        metadata: Default::default(),
    };
    match serde_json::to_vec(&list) {
        Ok(b) => json(b),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn configz(State(state): State<NodeApiState>) -> Response {
    json(state.configz.as_ref().clone())
}

async fn node_logs_root(state: State<NodeApiState>) -> Response {
    node_logs(state, UrlPath(String::new())).await
}

async fn node_logs(State(state): State<NodeApiState>, UrlPath(rel): UrlPath<String>) -> Response {
    use super::node_logs::{Target, listing, resolve};
    let root = state.node_log_dir.clone();
    let target = tokio::task::spawn_blocking(move || resolve(&root, &rel))
        .await
        .unwrap_or(Target::NotFound);
    match target {
        Target::Dir(dir) => match tokio::task::spawn_blocking(move || listing(&dir)).await {
            Ok(Ok(html)) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                html,
            )
                .into_response(),
            _ => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot list the directory",
            ),
        },
        Target::File(path) => match tokio::fs::File::open(&path).await {
            Ok(file) => {
                let stream = tokio_util::io::ReaderStream::new(file);
                let mut r = Response::new(Body::from_stream(stream));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                r
            }
            Err(e) => text(StatusCode::NOT_FOUND, format!("404 page not found: {e}")),
        },
        Target::NotFound => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

/// The pod named `namespace/name` on this node.
fn find_pod(state: &NodeApiState, namespace: &str, name: &str) -> Option<(Arc<Pod>, String)> {
    state.pods.uids().into_iter().find_map(|uid| {
        let (pod, _) = state.pods.get(&uid)?;
        (pod.metadata.namespace.as_deref().unwrap_or("default") == namespace
            && pod.metadata.name.as_deref() == Some(name))
        .then_some((pod, uid))
    })
}

fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.name == name)
            || s.init_containers.iter().flatten().any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    })
}

/// Why a container has no log yet, from the pod's status (upstream's "is waiting to start").
fn waiting_reason(state: &NodeApiState, uid: &str, container: &str) -> String {
    let status = state.pods.status(uid).unwrap_or_default();
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|s| s.name == container)
        .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .unwrap_or_else(|| "ContainerCreating".into())
}

async fn container_logs(
    State(state): State<NodeApiState>,
    UrlPath((namespace, pod_name, container)): UrlPath<(String, String, String)>,
    connection: Option<axum::Extension<ConnectionHandle>>,
    uri: axum::http::Uri,
) -> Response {
    let options = match logs::parse_log_query(uri.query().unwrap_or(""), clock::timestamp()) {
        Ok(o) => o,
        Err(e @ logs::LogQueryError::Decode) => {
            return text(StatusCode::BAD_REQUEST, e.to_string());
        }
        Err(e @ logs::LogQueryError::Invalid) => {
            return text(StatusCode::UNPROCESSABLE_ENTITY, e.to_string());
        }
    };
    let Some((pod, uid)) = find_pod(&state, &namespace, &pod_name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    if !has_container(&pod, &container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let dir = crate::base::safe_names::pod_log_directory(
        &state.pod_logs_dir,
        &namespace,
        &pod_name,
        &uid,
    )
    .join(&container);
    let Some(file) = logs::pick_log_file(&dir, options.previous) else {
        return if options.previous {
            text(
                StatusCode::BAD_REQUEST,
                format!(
                    "previous terminated container {container:?} in pod {pod_name:?} not found"
                ),
            )
        } else {
            text(
                StatusCode::BAD_REQUEST,
                format!(
                    "container {container:?} in pod {pod_name:?} is waiting to start: {}",
                    waiting_reason(&state, &uid, &container)
                ),
            )
        };
    };
    // Following ends once the instance that writes this file no longer runs.
    let attempt: Option<u32> = file
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok());
    let runtime = state.runtime.clone();
    let (uid_c, name_c) = (uid.clone(), container.clone());
    let still_running: log_read::StillRunning = Box::new(move || {
        runtime.pod(&uid_c).is_some_and(|p| {
            p.containers.iter().any(|c| {
                c.name == name_c && Some(c.attempt) == attempt && c.state == ContainerState::Running
            })
        })
    });
    // A follow is a stream: counted apart, ended after streamingConnectionIdleTimeout quiet.
    let place = match (options.follow, connection) {
        (true, Some(axum::Extension(connection))) => match connection.open_stream() {
            Some(place) => Some(place),
            None => return text(StatusCode::SERVICE_UNAVAILABLE, TOO_MANY_STREAMS),
        },
        _ => None,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(log_read::CHANNEL_CHUNKS);
    tracing::debug!(pod = %format!("{namespace}/{pod_name}"), container = %container, file = %file.display(), follow = options.follow, "serving container logs");
    tokio::spawn(log_read::stream_file(file, options, still_running, tx));
    // Each chunk on the wire before the next and before the end, as upstream's flushing
    // writer does (see `flush_each` for the API server's websocket relay that needs it).
    let lines = super::flush_each::FlushEach::new(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    let body = match place {
        Some(place) => Body::from_stream(crate::endpoints::listener::idle_limited(lines, place)),
        None => Body::from_stream(lines),
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `<ns>/<pod>/<container>` or `<ns>/<pod>/<uid>/<container>` (exec and attach);
/// `<ns>/<pod>` or `<ns>/<pod>/<uid>` (port forward).
pub fn split_target(
    rest: &str,
    with_container: bool,
) -> Option<(String, String, Option<String>, Option<String>)> {
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let s = |x: &str| x.to_string();
    match (with_container, parts.as_slice()) {
        (true, [ns, pod, c]) => Some((s(ns), s(pod), None, Some(s(c)))),
        (true, [ns, pod, uid, c]) => Some((s(ns), s(pod), Some(s(uid)), Some(s(c)))),
        (false, [ns, pod]) => Some((s(ns), s(pod), None, None)),
        (false, [ns, pod, uid]) => Some((s(ns), s(pod), Some(s(uid)), None)),
        _ => None,
    }
}

/// Stream options of an exec or attach request (upstream compares each with "1").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// An exec or attach request that asks for no stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("you must specify at least 1 of stdin, stdout, stderr")]
pub struct NoStreamError;

/// Reads exec/attach options from the query; at least one stream must be asked for.
pub fn stream_options(query: &str) -> Result<StreamOptions, NoStreamError> {
    let mut o = StreamOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = logs::parse_form_value(v);
        match k {
            "command" => o.command.push(v),
            "input" | "stdin" => o.stdin = v == "1",
            "output" | "stdout" => o.stdout = v == "1",
            "error" | "stderr" => o.stderr = v == "1",
            "tty" => o.tty = v == "1",
            _ => {}
        }
    }
    if o.tty && o.stderr {
        // A terminal merges stderr into stdout.
        o.stderr = false;
    }
    if !(o.stdin || o.stdout || o.stderr) {
        return Err(NoStreamError);
    }
    Ok(o)
}

/// The `port` values of a port-forward query that name a port (1 to 65535; others are
/// left out). kubectl's SPDY requests carry none: their ports come in the streams' headers.
pub fn forward_ports(query: &str) -> Vec<i32> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .filter(|(k, _)| *k == "port")
        .filter_map(|(_, v)| logs::parse_form_value(v).parse::<u16>().ok())
        .filter(|&p| p > 0)
        .map(i32::from)
        .collect()
}

/// The running instance of `container` in pod `uid`.
fn running_container(state: &NodeApiState, uid: &str, container: &str) -> Option<String> {
    let observed = state.runtime.pod(uid)?;
    observed
        .containers
        .iter()
        .filter(|c| c.name == container && c.state == ContainerState::Running)
        .max_by_key(|c| c.attempt)
        .map(|c| c.id.clone())
}

enum Kind {
    Exec,
    Attach,
}

async fn exec_or_attach(state: NodeApiState, rest: String, req: Request, kind: Kind) -> Response {
    let Some((namespace, pod_name, uid_in_path, Some(container))) = split_target(&rest, true)
    else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    let options = match stream_options(req.uri().query().unwrap_or("")) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let Some((_, uid)) = find_pod(&state, &namespace, &pod_name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    if uid_in_path.as_ref().is_some_and(|u| *u != uid) {
        return text(StatusCode::NOT_FOUND, "pod not found");
    }
    let Some(container_id) = running_container(&state, &uid, &container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container not found ({container:?})"),
        );
    };
    let url = match kind {
        Kind::Exec => {
            state
                .streams
                .exec(ExecRequest {
                    container_id,
                    cmd: options.command.clone(),
                    tty: options.tty,
                    stdin: options.stdin,
                    stdout: options.stdout,
                    stderr: options.stderr,
                    ..Default::default()
                })
                .await
        }
        Kind::Attach => {
            state
                .streams
                .attach(AttachRequest {
                    container_id,
                    stdin: options.stdin,
                    tty: options.tty,
                    stdout: options.stdout,
                    stderr: options.stderr,
                    ..Default::default()
                })
                .await
        }
    };
    match url {
        Ok(url) => {
            tracing::debug!(pod = %format!("{namespace}/{pod_name}"), container = %container, "proxying a stream to the runtime");
            streaming::proxy_upgrade(req, &url).await
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn exec(
    State(state): State<NodeApiState>,
    UrlPath(rest): UrlPath<String>,
    req: Request,
) -> Response {
    exec_or_attach(state, rest, req, Kind::Exec).await
}

async fn attach(
    State(state): State<NodeApiState>,
    UrlPath(rest): UrlPath<String>,
    req: Request,
) -> Response {
    exec_or_attach(state, rest, req, Kind::Attach).await
}

async fn port_forward(
    State(state): State<NodeApiState>,
    UrlPath(rest): UrlPath<String>,
    req: Request,
) -> Response {
    let Some((namespace, pod_name, uid_in_path, _)) = split_target(&rest, false) else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    let Some((_, uid)) = find_pod(&state, &namespace, &pod_name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    if uid_in_path.as_ref().is_some_and(|u| *u != uid) {
        return text(StatusCode::NOT_FOUND, "pod not found");
    }
    let sandbox = state.runtime.pod(&uid).and_then(|p| {
        p.sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .max_by_key(|s| (s.attempt, s.created_at))
            .map(|s| s.id.clone())
    });
    let Some(pod_sandbox_id) = sandbox else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} has no running sandbox"),
        );
    };
    let ports = forward_ports(req.uri().query().unwrap_or(""));
    match state
        .streams
        .port_forward(PortForwardRequest {
            pod_sandbox_id,
            port: ports,
        })
        .await
    {
        Ok(url) => streaming::proxy_upgrade(req, &url).await,
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_options() {
        let o = stream_options("command=sh&command=-c&command=echo%20hi&output=1&error=1").unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo hi"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        let t = stream_options("command=sh&input=1&output=1&error=1&tty=1").unwrap();
        assert!(
            t.tty && t.stdin && t.stdout && !t.stderr,
            "a tty has no stderr"
        );
        assert!(
            stream_options("command=ls&output=true").is_err(),
            "upstream wants \"1\""
        );
        assert!(stream_options("command=ls").is_err());
    }

    #[test]
    fn port_forward_ports() {
        let cases: [(&str, &[i32]); 5] = [
            ("port=8080&port=53", &[8080, 53]),
            ("", &[]),
            ("port=0&port=65536&port=-1&port=x&port=", &[]),
            ("porto=1&xport=2&port=%33", &[3]),
            ("port=65535", &[65535]),
        ];
        for (q, want) in cases {
            assert_eq!(forward_ports(q), want, "{q}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            split_target("ns/p/c", true),
            Some(("ns".into(), "p".into(), None, Some("c".into())))
        );
        assert_eq!(
            split_target("ns/p/u1/c", true),
            Some(("ns".into(), "p".into(), Some("u1".into()), Some("c".into())))
        );
        assert_eq!(split_target("ns/p", true), None);
        assert_eq!(
            split_target("ns/p", false),
            Some(("ns".into(), "p".into(), None, None))
        );
        assert_eq!(split_target("ns/p/u/x", false), None);
    }

    /// A router that lets anonymous requests through, serving what `debug` says.
    fn open_router(debug: DebugHandlers, dir: &std::path::Path) -> Router {
        let settings = crate::config::ServerSettings {
            anonymous_enabled: true,
            authorization_mode: crate::config::AuthorizationMode::AlwaysAllow,
            ..Default::default()
        };
        let gate = Gate::new(settings, "n1".into(), None);
        router(NodeApiState {
            debug,
            ..super::super::test_state::test_state(gate, dir)
        })
    }

    async fn answer(router: &Router, method: &str, path: &str) -> (StatusCode, String) {
        let (status, _, body) = super::super::test_state::ask(router, method, path).await;
        (status, body)
    }

    /// `enableDebuggingHandlers: false` answers upstream's 405 on every debugging path and
    /// drops `/configz`, while `/pods`, `/healthz`, `/metrics` and `/stats` stay;
    /// `enableSystemLogHandler: false` alone answers 405 on `/logs/` only.
    #[tokio::test]
    async fn debugging_and_system_log_handlers_can_be_turned_off() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("syslog"), "hello").unwrap();
        let off = open_router(
            DebugHandlers {
                debugging: false,
                system_log: true,
            },
            dir.path(),
        );
        let debug_off = (StatusCode::METHOD_NOT_ALLOWED, DEBUG_DISABLED.to_string());
        for (method, path) in [
            ("POST", "/exec/default/web/app?command=id&output=1"),
            ("GET", "/exec/default/web/app?command=id&output=1"),
            ("POST", "/attach/default/web/app?output=1"),
            ("POST", "/portForward/default/web"),
            ("POST", "/run/default/web/app?cmd=id"),
            ("GET", "/containerLogs/default/web/app"),
            ("GET", "/runningpods/"),
            ("GET", "/logs/"),
            ("GET", "/logs/syslog"),
            ("GET", "/debug/pprof/"),
        ] {
            assert_eq!(
                answer(&off, method, path).await,
                debug_off,
                "{method} {path}"
            );
        }
        assert_eq!(
            answer(&off, "GET", "/configz").await.0,
            StatusCode::NOT_FOUND
        );
        for path in ["/pods", "/healthz", "/stats/summary"] {
            assert_eq!(answer(&off, "GET", path).await.0, StatusCode::OK, "{path}");
        }

        let no_logs = open_router(
            DebugHandlers {
                debugging: true,
                system_log: false,
            },
            dir.path(),
        );
        let logs_off = (StatusCode::METHOD_NOT_ALLOWED, LOGS_DISABLED.to_string());
        assert_eq!(answer(&no_logs, "GET", "/logs/").await, logs_off);
        assert_eq!(answer(&no_logs, "GET", "/logs/syslog").await, logs_off);
        assert_eq!(answer(&no_logs, "GET", "/configz").await.0, StatusCode::OK);
        assert_eq!(
            answer(&no_logs, "GET", "/runningpods/").await.0,
            StatusCode::OK
        );

        let on = open_router(DebugHandlers::default(), dir.path());
        assert_eq!(
            answer(&on, "GET", "/logs/syslog").await,
            (StatusCode::OK, "hello".to_string())
        );
        assert_eq!(answer(&on, "GET", "/configz").await.0, StatusCode::OK);
    }
}
