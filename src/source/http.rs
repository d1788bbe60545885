//! The HTTP source: `GET staticPodURL` at start and every `httpCheckFrequency`. The body is a
//! Pod or a PodList / List (YAML or JSON). A failed fetch keeps the last good set.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::ManifestOrigin;
use super::manifest::MAX_MANIFEST_BYTES;
use super::{SOURCE_HTTP, SourceProblems, SourceSnapshot, full_name, load_static_pods};

/// Longest one fetch may take (shorter when the period is shorter).
const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What one fetch produced.
#[derive(Debug)]
pub enum FetchOutcome {
    /// A new set of pods (possibly with a non-fatal problem, e.g. a duplicate pod dropped).
    Pods {
        pods: Vec<Pod>,
        unknown_fields: Vec<String>,
        problem: Option<String>,
    },
    /// Nothing usable; the previous set stays.
    Failed(String),
    /// The URL can never work as configured (e.g. `https://`): report it and run no pods.
    Unsupported(String),
}

/// The HTTP source's state between fetches.
pub struct HttpSource {
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node_name: String,
    period: Duration,
    problems: SourceProblems,
    client: Client<HttpConnector, Empty<Bytes>>,
    last_problem: Option<String>,
    last_unknown: Vec<String>,
}

impl HttpSource {
    pub fn new(
        url: String,
        headers: BTreeMap<String, Vec<String>>,
        node_name: String,
        period: Duration,
        problems: SourceProblems,
    ) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        HttpSource {
            url,
            headers,
            node_name,
            period: period.max(Duration::from_millis(100)),
            problems,
            client,
            last_problem: None,
            last_unknown: Vec::new(),
        }
    }

    fn timeout(&self) -> Duration {
        self.period.min(MAX_FETCH_TIMEOUT)
    }

    async fn get(&self) -> Result<Vec<u8>, String> {
        let url = &self.url;
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| format!("GET {url}: invalid URL: {e}"))?;
        let mut request = hyper::Request::get(uri);
        for (name, values) in &self.headers {
            for value in values {
                request = request.header(name.as_str(), value.as_str());
            }
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("GET {url}: invalid request: {e}"))?;
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("GET {url}: HTTP {status}"));
            }
            let body = Limited::new(response.into_body(), MAX_MANIFEST_BYTES)
                .collect()
                .await
                .map_err(|e| format!("GET {url}: reading body: {e}"))?;
            Ok(body.to_bytes().to_vec())
        };
        match tokio::time::timeout(self.timeout(), fetch).await {
            Ok(result) => result,
            Err(_) => Err(format!("GET {url}: timed out after {:?}", self.timeout())),
        }
    }

    /// Fetch once and decode.
    pub async fn fetch(&self) -> FetchOutcome {
        if self.url.starts_with("https://") {
            return FetchOutcome::Unsupported(format!(
                "{}: https manifest URLs are not supported yet",
                self.url
            ));
        }
        if !self.url.starts_with("http://") {
            return FetchOutcome::Unsupported(format!(
                "{}: only http:// manifest URLs are supported",
                self.url
            ));
        }
        let bytes = match self.get().await {
            Ok(bytes) => bytes,
            Err(e) => return FetchOutcome::Failed(e),
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            // Upstream treats an empty body as "no pods" (and still reports it).
            return FetchOutcome::Pods {
                pods: Vec::new(),
                unknown_fields: Vec::new(),
                problem: Some(format!(
                    "GET {}: empty body; running no pods from it",
                    self.url
                )),
            };
        }
        let loaded = match load_static_pods(
            &bytes,
            ManifestOrigin::Http(&self.url),
            &self.node_name,
            SystemTime::now(),
        ) {
            Ok(loaded) => loaded,
            Err(e) => return FetchOutcome::Failed(e.to_string()),
        };
        let mut names = HashSet::new();
        let mut pods = Vec::with_capacity(loaded.pods.len());
        let mut duplicates = Vec::new();
        for pod in loaded.pods {
            let name = full_name(&pod);
            if names.insert(name.clone()) {
                pods.push(pod);
            } else {
                duplicates.push(name);
            }
        }
        let problem = (!duplicates.is_empty()).then(|| {
            format!(
                "{}: duplicate pods ignored (first kept): {}",
                self.url,
                duplicates.join(", ")
            )
        });
        FetchOutcome::Pods {
            pods,
            unknown_fields: loaded.unknown_fields,
            problem,
        }
    }

    /// Record and log (once per distinct message) the problem of this round, if any.
    fn note_problem(&mut self, problem: Option<String>) {
        match &problem {
            Some(message) if self.last_problem.as_ref() != Some(message) => {
                tracing::warn!(url = %self.url, error = %message, "static pod URL problem");
                self.problems.set(&self.url, message);
            }
            Some(_) => {}
            None if self.last_problem.is_some() => {
                tracing::info!(url = %self.url, "static pod URL is good again");
                self.problems.clear(&self.url);
            }
            None => {}
        }
        self.last_problem = problem;
    }

    /// Fetch at start and every period until cancelled; send a snapshot after each fetch that
    /// produced pods.
    pub(crate) async fn run(
        mut self,
        tx: mpsc::UnboundedSender<SourceSnapshot>,
        cancel: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                outcome = self.fetch() => outcome,
            };
            match outcome {
                FetchOutcome::Pods {
                    pods,
                    unknown_fields,
                    problem,
                } => {
                    if unknown_fields != self.last_unknown && !unknown_fields.is_empty() {
                        tracing::warn!(url = %self.url, fields = %unknown_fields.join(", "), "static pod URL manifest has unknown fields (ignored)");
                    }
                    self.last_unknown = unknown_fields;
                    self.note_problem(problem);
                    if tx
                        .send(SourceSnapshot {
                            source: SOURCE_HTTP,
                            pods,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                FetchOutcome::Failed(message) => self.note_problem(Some(message)),
                FetchOutcome::Unsupported(message) => {
                    self.note_problem(Some(message));
                    // Nothing will change until the configuration does: deliver an empty set
                    // so the node does not wait for this source, then idle.
                    let _ = tx.send(SourceSnapshot {
                        source: SOURCE_HTTP,
                        pods: Vec::new(),
                    });
                    cancel.cancelled().await;
                    return;
                }
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{PodChange, SourceConfig, spawn_sources};
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    /// What the test server answers: status, body.
    type Reply = Arc<Mutex<(u16, String)>>;

    /// A tiny HTTP/1 responder on 127.0.0.1:0 serving whatever `reply` holds (one request
    /// per connection), recording the `x-test` header it saw.
    async fn serve(reply: Reply, seen_header: Arc<Mutex<Option<String>>>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let reply = reply.clone();
                let seen_header = seen_header.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request).to_string();
                    for line in text.lines() {
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("x-test")
                        {
                            *seen_header.lock().unwrap() = Some(value.trim().to_string());
                        }
                    }
                    let (status, body) = reply.lock().unwrap().clone();
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        format!("http://{addr}/pods")
    }

    fn pod_yaml(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    fn pod_list_json(names: &[&str]) -> String {
        let items: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata":{{"name":"{n}"}},"spec":{{"containers":[{{"name":"c","image":"x"}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
            items.join(",")
        )
    }

    use crate::source::describe_changes as describe;

    async fn recv(rx: &mut mpsc::UnboundedReceiver<Vec<PodChange>>) -> Vec<PodChange> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no change within 10s")
            .expect("channel closed")
    }

    fn source(url: &str) -> HttpSource {
        HttpSource::new(
            url.to_string(),
            BTreeMap::from([("x-test".to_string(), vec!["yes".to_string()])]),
            "node-1".into(),
            Duration::from_secs(1),
            SourceProblems::default(),
        )
    }

    fn pod_names(outcome: &FetchOutcome) -> Vec<String> {
        match outcome {
            FetchOutcome::Pods { pods, .. } => pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect(),
            other => panic!("expected pods, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn fetch_pod_and_list() {
        let reply: Reply = Arc::new(Mutex::new((200, pod_yaml("web", "nginx:1"))));
        let header = Arc::new(Mutex::new(None));
        let url = serve(reply.clone(), header.clone()).await;
        let src = source(&url);

        let outcome = src.fetch().await;
        assert_eq!(pod_names(&outcome), ["web-node-1"]);
        assert_eq!(header.lock().unwrap().as_deref(), Some("yes"));
        if let FetchOutcome::Pods { pods, .. } = &outcome {
            let ann = pods[0].metadata.annotations.as_ref().unwrap();
            assert_eq!(ann["kubernetes.io/config.source"], "http");
            assert!(pods[0].spec.as_ref().unwrap().tolerations.is_none());
        }

        *reply.lock().unwrap() = (200, pod_list_json(&["a", "b", "a"]));
        let outcome = src.fetch().await;
        assert_eq!(pod_names(&outcome), ["a-node-1", "b-node-1"]);
        if let FetchOutcome::Pods { problem, .. } = &outcome {
            assert!(problem.as_deref().unwrap().contains("duplicate"));
        }

        *reply.lock().unwrap() = (500, "boom".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("500")));
        *reply.lock().unwrap() = (200, "{not json".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(_)));
        *reply.lock().unwrap() = (200, "apiVersion: v1\nkind: Service\n".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("kind")));
    }

    #[tokio::test]
    async fn https_and_unreachable() {
        let src = source("https://example.invalid/pods");
        assert!(
            matches!(src.fetch().await, FetchOutcome::Unsupported(m) if m.contains("https manifest URLs are not supported yet"))
        );
        // A port nobody listens on (bound, then released).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let src = source(&format!("http://{addr}/"));
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(_)));
    }

    #[tokio::test]
    async fn slow_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and never answer.
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let mut src = source(&format!("http://{addr}/"));
        src.period = Duration::from_millis(200);
        let started = std::time::Instant::now();
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("timed out")));
        assert!(started.elapsed() < Duration::from_secs(5));
        holder.abort();
    }

    #[tokio::test]
    async fn source_keeps_last_good_set() {
        let reply: Reply = Arc::new(Mutex::new((200, pod_list_json(&["a", "b"]))));
        let url = serve(reply.clone(), Arc::new(Mutex::new(None))).await;
        let cancel = CancellationToken::new();
        let cfg = SourceConfig {
            node_name: "node-1".into(),
            static_pod_path: None,
            file_check_frequency: Duration::from_secs(20),
            static_pod_url: Some(url.clone()),
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: Duration::from_millis(100),
        };
        let (mut rx, ready, problems) = spawn_sources(cfg, cancel.clone());
        assert_eq!(
            describe(&recv(&mut rx).await),
            ["add a-node-1", "add b-node-1"]
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ready.all_ready() {
            assert!(std::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }

        // Server error, then garbage: the set stays and the problem is visible.
        *reply.lock().unwrap() = (500, "down".into());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !problems
            .snapshot()
            .get(&url)
            .is_some_and(|m| m.contains("500"))
        {
            assert!(std::time::Instant::now() < deadline, "500 never reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *reply.lock().unwrap() = (200, "::: not yaml [".into());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while problems
            .snapshot()
            .get(&url)
            .is_none_or(|m| m.contains("500"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "garbage never reported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(rx.try_recv().is_err(), "a failed fetch changed the pod set");

        // A change: b goes, c comes.
        *reply.lock().unwrap() = (200, pod_list_json(&["a", "c"]));
        assert_eq!(
            describe(&recv(&mut rx).await),
            ["remove b-node-1", "add c-node-1"]
        );
        assert!(problems.snapshot().is_empty());
        cancel.cancel();
    }
}
