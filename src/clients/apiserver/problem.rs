//! What went wrong talking to the API server, in one line an operator can act on, logged once
//! per distinct problem rather than once per retry.

use std::sync::{Arc, Mutex};

/// The kind of failure, for deciding what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// 404: the object is not there.
    NotFound,
    /// 409 AlreadyExists on create.
    AlreadyExists,
    /// 409 Conflict: our copy is stale; re-read and retry.
    Conflict,
    /// 401: the credentials are not accepted.
    Unauthorized,
    /// 403: authenticated, but not allowed (the Node authorizer, NodeRestriction, RBAC).
    Forbidden,
    /// 410 Gone: the resource version a watch started from is older than the API server keeps;
    /// kube's watcher lists again, at once: no failure to report or to back off from.
    Expired,
    /// Any other answer from the API server.
    Refused,
    /// No answer: connection refused, TLS failure, time-out.
    Unreachable,
}

/// A failed request, classified and described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Problem {
    pub kind: ProblemKind,
    pub message: String,
}

impl Problem {
    pub fn is(&self, kind: ProblemKind) -> bool {
        self.kind == kind
    }

    /// A watch stream's error event (`what` names the watch): `Expired` for 410 Gone, which
    /// arrives this way once a watch is open, otherwise `Refused`.
    pub fn watch_ended(what: &str, status: &kube::core::Status) -> Problem {
        let kind = if status.code == 410 {
            ProblemKind::Expired
        } else {
            ProblemKind::Refused
        };
        Problem {
            kind,
            message: format!(
                "{what} ended ({} {}): {}",
                status.code, status.reason, status.message
            ),
        }
    }
}

/// A failure kube's watcher reports (it retries after the back-off): a request's error as
/// [`describe`] has it, an error event as [`Problem::watch_ended`]. A 410 Gone arrives as an
/// error event (the API server answers a watch from a version it no longer has that way) and is
/// `Expired`: the watcher lists again by itself, so it is no failure to report.
impl From<kube::runtime::watcher::Error> for Problem {
    fn from(err: kube::runtime::watcher::Error) -> Problem {
        use kube::runtime::watcher::Error as E;
        match &err {
            E::InitialListFailed(e) | E::WatchStartFailed(e) | E::WatchFailed(e) => describe(e),
            E::WatchError(status) => Problem::watch_ended("the watch", status),
            E::NoResourceVersion => Problem {
                kind: ProblemKind::Refused,
                message: err.to_string(),
            },
        }
    }
}

impl From<kube::Error> for Problem {
    fn from(err: kube::Error) -> Problem {
        describe(&err)
    }
}

/// Classifies and describes a client error. The API server's own message is kept whole (it
/// names the object and the reason, e.g. NodeRestriction's); transport errors are given with
/// their whole cause chain, where the useful part (connection refused, an unknown CA) is.
pub(crate) fn describe(err: &kube::Error) -> Problem {
    if let kube::Error::Api(status) = err {
        let code = status.code;
        let kind = match (code, status.reason.as_str()) {
            (404, _) => ProblemKind::NotFound,
            (409, "AlreadyExists") => ProblemKind::AlreadyExists,
            (409, _) => ProblemKind::Conflict,
            (401, _) => ProblemKind::Unauthorized,
            (403, _) => ProblemKind::Forbidden,
            (410, _) => ProblemKind::Expired,
            _ => ProblemKind::Refused,
        };
        let what = match kind {
            ProblemKind::Unauthorized => "the API server does not accept our credentials",
            ProblemKind::Forbidden => "the API server forbids it",
            _ => "the API server refused",
        };
        let reason = if status.reason.is_empty() {
            String::new()
        } else {
            format!(" {}", status.reason)
        };
        return Problem {
            kind,
            message: format!("{what} ({code}{reason}): {}", status.message),
        };
    }
    let chain = cause_chain(err);
    let what = if chain.contains("invalid peer certificate") {
        // rustls' words for a server certificate the configured CA did not sign (or that does
        // not name the server): the usual cause is the kubeconfig's certificate-authority.
        "the API server's certificate is not trusted (check the kubeconfig's certificate-authority)"
    } else {
        "cannot reach the API server"
    };
    Problem {
        kind: ProblemKind::Unreachable,
        message: format!("{what}: {chain}"),
    }
}

/// `a: b: c` from an error and its sources, leaving out a source whose text its parent
/// already contains (wrappers often repeat it).
pub(crate) fn cause_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.last().is_some_and(|prev| prev.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// Whether `new` is the problem already reported as `old`: the same text, or both a failure
/// to reach the API server.
fn same_problem(old: &Problem, new: &Problem) -> bool {
    old.message == new.message
        || (old.is(ProblemKind::Unreachable) && new.is(ProblemKind::Unreachable))
}

/// Logs each distinct problem once (at warn), later repeats at debug, and the recovery once.
/// Shared by the tasks that talk to the API server, so one outage is one log line each way.
/// Failures to reach the API server at all count as one problem whatever their wording: during
/// an outage the transport error changes (refused, reset, TLS EOF) without anything new to say.
#[derive(Clone, Default)]
pub struct ProblemLog {
    last: Arc<Mutex<Option<Problem>>>,
}

impl ProblemLog {
    /// Records a failure of `doing` (e.g. "renewing the node Lease").
    pub fn failed(&self, doing: &str, problem: &Problem) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().is_some_and(|l| same_problem(l, problem)) {
            tracing::debug!(problem = %problem.message, "{doing} failed again; retrying");
            return;
        }
        *last = Some(problem.clone());
        tracing::warn!(problem = %problem.message, "{doing} failed; retrying with back-off");
    }

    /// Records a success: if something had failed, says it is over.
    pub fn succeeded(&self, doing: &str) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(problem) = last.take() {
            tracing::info!(after = %problem.message, "{doing} works again");
        }
    }

    /// The problem being reported now, if any.
    pub fn current(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|p| p.message.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        let mut s = Status::failure(message, reason);
        s.code = code;
        kube::Error::Api(Box::new(s))
    }

    #[test]
    fn api_errors_are_classified_and_keep_the_servers_message() {
        let cases = [
            (404, "NotFound", ProblemKind::NotFound),
            (409, "AlreadyExists", ProblemKind::AlreadyExists),
            (409, "Conflict", ProblemKind::Conflict),
            (401, "Unauthorized", ProblemKind::Unauthorized),
            (403, "Forbidden", ProblemKind::Forbidden),
            (410, "Expired", ProblemKind::Expired),
            (500, "InternalError", ProblemKind::Refused),
        ];
        for (code, reason, kind) in cases {
            let p = describe(&api(
                code,
                reason,
                "nodes \"b\" is forbidden: node \"a\" is not allowed",
            ));
            assert_eq!(p.kind, kind, "{code}");
            assert!(
                p.message.contains(&format!("({code} {reason})")),
                "{}",
                p.message
            );
            assert!(
                p.message.ends_with("node \"a\" is not allowed"),
                "{}",
                p.message
            );
        }
    }

    #[test]
    fn a_watch_error_event_is_expired_only_for_410() {
        let mut gone = Status::failure("too old resource version: 5 (9)", "Expired");
        gone.code = 410;
        let p = Problem::watch_ended("the pod watch", &gone);
        assert_eq!(p.kind, ProblemKind::Expired);
        assert_eq!(
            p.message,
            "the pod watch ended (410 Expired): too old resource version: 5 (9)"
        );
        let mut internal = Status::failure("etcd is slow", "InternalError");
        internal.code = 500;
        let p = Problem::watch_ended("the pod watch", &internal);
        assert_eq!(p.kind, ProblemKind::Refused);
    }

    #[test]
    fn the_watchers_errors_are_described_as_the_requests_and_events_they_come_from() {
        use kube::runtime::watcher::Error as E;
        let p = Problem::from(E::InitialListFailed(api(403, "Forbidden", "no")));
        assert_eq!(p.kind, ProblemKind::Forbidden);
        assert_eq!(p.message, "the API server forbids it (403 Forbidden): no");
        let p = Problem::from(E::WatchStartFailed(api(500, "InternalError", "slow")));
        assert_eq!(p.kind, ProblemKind::Refused);
        let mut gone = Status::failure("too old resource version: 5 (9)", "Expired");
        gone.code = 410;
        let p = Problem::from(E::WatchError(Box::new(gone)));
        assert_eq!(p.kind, ProblemKind::Expired);
        assert_eq!(
            p.message,
            "the watch ended (410 Expired): too old resource version: 5 (9)"
        );
        let p = Problem::from(E::NoResourceVersion);
        assert_eq!(p.kind, ProblemKind::Refused);
        assert!(p.message.contains("resourceVersion"), "{}", p.message);
    }

    #[test]
    fn an_outage_is_one_problem_whatever_the_transport_says() {
        let p = |kind, message: &str| Problem {
            kind,
            message: message.to_string(),
        };
        let refused = p(ProblemKind::Unreachable, "connection refused");
        let reset = p(ProblemKind::Unreachable, "connection reset by peer");
        let forbidden = p(ProblemKind::Forbidden, "forbidden");
        let other_403 = p(ProblemKind::Forbidden, "forbidden: another reason");
        assert!(same_problem(&refused, &reset));
        assert!(same_problem(&forbidden, &forbidden));
        assert!(!same_problem(&forbidden, &other_403));
        assert!(!same_problem(&refused, &forbidden));
        let log = ProblemLog::default();
        log.failed("x", &refused);
        log.failed("x", &reset);
        assert_eq!(log.current().as_deref(), Some("connection refused"));
        log.failed("x", &forbidden);
        assert_eq!(log.current().as_deref(), Some("forbidden"));
        log.succeeded("x");
        assert_eq!(log.current(), None);
    }

    #[test]
    fn the_cause_chain_drops_repeats() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E(
            "client error (Connect): connection refused",
            Some(Box::new(E(
                "connection refused",
                Some(Box::new(E("os error 111", None))),
            ))),
        );
        assert_eq!(
            cause_chain(&e),
            "client error (Connect): connection refused: os error 111"
        );
    }

    #[test]
    fn the_log_remembers_the_current_problem_until_success() {
        let log = ProblemLog::default();
        let p = describe(&api(401, "Unauthorized", "Unauthorized"));
        log.failed("renewing the Lease", &p);
        log.failed("renewing the Lease", &p);
        assert_eq!(log.current(), Some(p.message.clone()));
        log.succeeded("renewing the Lease");
        assert_eq!(log.current(), None);
    }
}
