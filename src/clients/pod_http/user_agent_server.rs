//! A pod's HTTP endpoint for the tests of the two senders of [`super::HttpGet`] (probes and
//! lifecycle hooks): `/ok` answers 200, `/moved` redirects to another host, anything else is
//! 404, and every request's User-Agent is recorded, so each sender's tests check their own
//! verdicts and User-Agent against the same server.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;

/// The User-Agent of each request the server saw, in order (`""` when none was sent).
pub(crate) type SeenAgents = Arc<Mutex<Vec<String>>>;

/// Starts the server on a free loopback port; it runs until the test's runtime ends.
pub(crate) async fn start() -> (u16, SeenAgents) {
    let seen: SeenAgents = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let record = seen.clone();
    let app = Router::new().fallback(get(move |uri: Uri, headers: HeaderMap| {
        let record = record.clone();
        async move {
            let agent = headers.get("user-agent").map(|v| v.to_str().unwrap_or("?"));
            record
                .lock()
                .unwrap()
                .push(agent.unwrap_or_default().to_string());
            match uri.path() {
                "/ok" => StatusCode::OK.into_response(),
                "/moved" => (
                    StatusCode::FOUND,
                    [("location", "http://localhost:1/elsewhere")],
                    "moved",
                )
                    .into_response(),
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}
