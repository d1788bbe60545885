//! The node API's request inputs, as an unauthenticated client can send them: the query of
//! `/containerLogs` (at an ordinary time and at the ends of time), of exec/attach and of
//! port-forward, the path after `/exec/`, `/attach/`, `/portForward/` and `/logs/`, the path
//! and method the authorizer sees, and the `Authorization` header. Parsing must never panic
//! (overflow checks are on), and what it accepts must make sense.
#![no_main]

use deckhand::endpoints::node_api::attributes::attributes;
use deckhand::endpoints::node_api::auth::bearer_token;
use deckhand::endpoints::node_api::handlers::{forward_ports, split_target, stream_options};
use deckhand::endpoints::node_api::logs::parse_log_query;
use deckhand::endpoints::node_api::node_logs::relative_path;
use http::Method;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
    for at in [now, jiff::Timestamp::MIN, jiff::Timestamp::MAX] {
        if let Ok(o) = parse_log_query(text, at) {
            assert!(o.limit_bytes.is_none_or(|n| n >= 1), "{text:?}");
            assert!(o.tail_lines.is_none_or(|n| n <= i64::MAX as u64), "{text:?}");
        }
    }

    if let Ok(o) = stream_options(text) {
        assert!(o.stdin || o.stdout || o.stderr, "{text:?}");
        assert!(!(o.tty && o.stderr), "{text:?}");
    }
    assert!(forward_ports(text).iter().all(|p| (1..=65535).contains(p)));

    for with_container in [true, false] {
        if let Some((ns, pod, uid, container)) = split_target(text, with_container) {
            let parts = [Some(ns), Some(pod), uid, container];
            for part in parts.iter().flatten() {
                assert!(!part.is_empty() && !part.contains('/'), "{text:?}");
            }
        }
    }

    if let Some(rel) = relative_path(text) {
        assert!(!rel.is_absolute(), "{text:?}");
        assert!(
            rel.components()
                .all(|c| !matches!(c, std::path::Component::ParentDir)),
            "{text:?}"
        );
    }

    for method in [Method::GET, Method::POST, Method::PUT, Method::OPTIONS] {
        let attrs = attributes(&method, text);
        assert!(!attrs.subresources.is_empty(), "{text:?}");
    }

    if let Some(token) = bearer_token(Some(text)) {
        assert!(!token.is_empty() && !token.contains(' '), "{text:?}");
    }
});
