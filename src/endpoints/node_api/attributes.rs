//! What a node API request asks for, in the authorizer's terms: upstream's mapping of the
//! request path to subresources of `nodes/<node name>`, and of the HTTP method to a verb.
//!
//! Paths with their own subresource are checked for it first; everything else, and the
//! fallback of the fine-grained ones (`/pods`, `/healthz`, `/configz`, `/runningpods/`), is
//! `proxy`: a user allowed `nodes/proxy` may do everything on the node, as upstream.

use http::Method;

/// The authorizer's view of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttributes {
    /// `get`, `create`, `update`, `patch`, `delete`, or empty for other methods.
    pub verb: &'static str,
    /// Checked in order; the first one allowed lets the request through.
    pub subresources: Vec<&'static str>,
    pub path: String,
}

/// Whether `path` is `base` or lies below it (`base` without its trailing slash).
fn is_subpath(path: &str, base: &str) -> bool {
    let base = base.trim_end_matches('/');
    path == base || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

/// The verb upstream derives from the method.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The attributes of a request for `path` with `method`.
pub fn attributes(method: &Method, path: &str) -> RequestAttributes {
    let mut subresources = Vec::with_capacity(2);
    // Fine-grained subresources first (upstream's KubeletFineGrainedAuthz, always on since
    // 1.36); `proxy` stays the fallback for them.
    if is_subpath(path, "/allocatedPods") || is_subpath(path, "/pods") {
        subresources.push("pods");
    } else if is_subpath(path, "/healthz") {
        subresources.push("healthz");
    } else if is_subpath(path, "/configz") {
        subresources.push("configz");
    } else if is_subpath(path, "/runningpods/") {
        subresources.push("pods");
    }
    let main = if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    };
    subresources.push(main);
    RequestAttributes {
        verb: verb(method),
        subresources,
        path: path.to_string(),
    }
}

/// Upstream's 403 body: `Forbidden (user=…, verb=…, resource=nodes, subresource(s)=[a b])`.
pub fn forbidden_message(user: &str, attrs: &RequestAttributes) -> String {
    format!(
        "Forbidden (user={user}, verb={}, resource=nodes, subresource(s)=[{}])\n",
        attrs.verb,
        attrs.subresources.join(" ")
    )
}

/// Upstream's 500 body when the authorizer could not answer.
pub fn authorization_error_message(user: &str, verb: &str, subresource: &str) -> String {
    format!(
        "Authorization error (user={user}, verb={verb}, resource=nodes, subresource={subresource})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        let cases: &[(&str, &[&str])] = &[
            ("/pods", &["pods", "proxy"]),
            ("/pods/", &["pods", "proxy"]),
            ("/podsx", &["proxy"]),
            ("/allocatedPods/ns/p", &["pods", "proxy"]),
            ("/runningpods/", &["pods", "proxy"]),
            ("/runningpods", &["pods", "proxy"]),
            ("/healthz", &["healthz", "proxy"]),
            ("/healthz/syncloop", &["healthz", "proxy"]),
            ("/configz", &["configz", "proxy"]),
            ("/flagz", &["configz"]),
            ("/stats/summary", &["stats"]),
            ("/stats", &["stats"]),
            ("/metrics", &["metrics"]),
            ("/metrics/probes", &["metrics"]),
            ("/metrics/resource", &["metrics"]),
            ("/metricsx", &["proxy"]),
            ("/logs/", &["log"]),
            ("/logs/syslog", &["log"]),
            ("/checkpoint/ns/p/c", &["checkpoint"]),
            ("/statusz", &["statusz"]),
            ("/containerLogs/ns/p/c", &["proxy"]),
            ("/exec/ns/p/c", &["proxy"]),
            ("/attach/ns/p/c", &["proxy"]),
            ("/portForward/ns/p", &["proxy"]),
            ("/run/ns/p/c", &["proxy"]),
            ("/", &["proxy"]),
            ("", &["proxy"]),
        ];
        for (path, want) in cases {
            let got = attributes(&Method::GET, path);
            assert_eq!(got.subresources, *want, "{path}");
            assert_eq!(got.path, *path);
        }
    }

    #[test]
    fn methods_map_to_verbs() {
        let cases = [
            (Method::GET, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
            (Method::OPTIONS, ""),
        ];
        for (m, want) in cases {
            assert_eq!(attributes(&m, "/exec/a/b/c").verb, want, "{m}");
        }
    }

    #[test]
    fn messages_match_upstream() {
        let a = attributes(&Method::GET, "/pods");
        assert_eq!(
            forbidden_message("system:serviceaccount:default:nobody", &a),
            "Forbidden (user=system:serviceaccount:default:nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
        assert_eq!(
            authorization_error_message("u", "create", "proxy"),
            "Authorization error (user=u, verb=create, resource=nodes, subresource=proxy)"
        );
    }
}
