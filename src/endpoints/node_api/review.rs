//! The two questions the node API asks the API server: who holds this bearer token
//! (TokenReview) and may this user do this (SubjectAccessReview), behind a trait that
//! [`BoundedReviewer`] wraps. The tests run [`KubeReviewer`] against the fake API server
//! (`clients::apiserver::fake`), so the decisions are tested without a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::sync::Semaphore;

use crate::base::clock;

/// An authenticated user, as upstream's `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// One authorization question: may `user` do `verb` on `nodes/<name>/<subresource>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessQuestion {
    pub user: UserInfo,
    pub verb: String,
    pub node_name: String,
    pub subresource: String,
}

/// The API server's answer to a SubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessAnswer {
    pub allowed: bool,
    /// The authorizer's reason (for the log).
    pub reason: String,
}

/// A review could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// No answer, or an error status.
    #[error("{0}")]
    Failed(String),
    /// Not sent: too many reviews were waiting already, or this one found no turn in time.
    #[error("not sent: too many reviews in progress")]
    Busy,
    /// Sent, but not answered in time.
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
}

/// TokenReview and SubjectAccessReview.
pub trait Reviewer: Send + Sync + 'static {
    /// `Some(user)` if the API server authenticates the token, `None` if it does not.
    fn review_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, ReviewError>>;
    fn review_access<'a>(
        &'a self,
        question: &'a AccessQuestion,
    ) -> BoxFuture<'a, Result<AccessAnswer, ReviewError>>;
}

/// [`Reviewer`] through the node's own API client (the Node authorizer lets nodes create
/// both kinds of review, as `system:node-proxier`-less kubelets do upstream).
#[derive(Clone)]
pub(crate) struct KubeReviewer(pub kube::Client);

impl KubeReviewer {
    pub(crate) fn shared(client: kube::Client) -> Arc<dyn Reviewer> {
        Arc::new(KubeReviewer(client))
    }
}

/// The TokenReview for `token` (no audiences: the API server's own, as upstream's kubelet).
pub(crate) fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: None,
        },
        ..Default::default()
    }
}

/// The SubjectAccessReview for `q`: `nodes` in the core group, version v1, no namespace.
pub(crate) fn access_review(q: &AccessQuestion) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(q.user.name.clone()),
            uid: (!q.user.uid.is_empty()).then(|| q.user.uid.clone()),
            groups: Some(q.user.groups.clone()),
            extra: (!q.user.extra.is_empty()).then(|| q.user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(String::new()),
                verb: Some(q.verb.clone()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("nodes".into()),
                subresource: Some(q.subresource.clone()),
                name: Some(q.node_name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

impl Reviewer for KubeReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, ReviewError>> {
        Box::pin(async move {
            let api: Api<TokenReview> = Api::all(self.0.clone());
            let done = api
                .create(&PostParams::default(), &token_review(token))
                .await
                .map_err(|e| {
                    ReviewError::Failed(crate::clients::apiserver::problem::cause_chain(&e))
                })?;
            let Some(status) = done.status else {
                return Ok(None);
            };
            if let Some(err) = status.error.filter(|e| !e.is_empty()) {
                tracing::debug!(error = %err, "TokenReview did not authenticate the token");
            }
            if status.authenticated != Some(true) {
                return Ok(None);
            }
            let Some(user) = status.user else {
                return Ok(None);
            };
            Ok(Some(UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn review_access<'a>(
        &'a self,
        question: &'a AccessQuestion,
    ) -> BoxFuture<'a, Result<AccessAnswer, ReviewError>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.0.clone());
            let done = api
                .create(&PostParams::default(), &access_review(question))
                .await
                .map_err(|e| {
                    ReviewError::Failed(crate::clients::apiserver::problem::cause_chain(&e))
                })?;
            let status = done.status.unwrap_or_default();
            if let Some(err) = status.evaluation_error.filter(|e| !e.is_empty()) {
                tracing::debug!(error = %err, "SubjectAccessReview evaluation error");
            }
            Ok(AccessAnswer {
                allowed: status.allowed && !status.denied.unwrap_or(false),
                reason: status.reason.unwrap_or_default(),
            })
        })
    }
}

/// How many reviews of one kind (TokenReviews, SubjectAccessReviews) may be on their way at
/// once, how many may wait for a turn and for how long, and how long an answer may take.
///
/// Anyone who can open a connection can make the node ask a TokenReview (a made-up bearer
/// token is enough), so the reviews must never pile up: a review beyond these bounds is not
/// sent and the request is answered at once, as upstream answers a review that failed
/// (401 for a token, 500 for an authorization).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub in_flight: usize,
    pub waiting: usize,
    pub wait: Duration,
    pub answer: Duration,
}

impl Default for QueueLimits {
    /// Eight on their way keep a review client at the default 50 QPS busy (an answer takes a
    /// few milliseconds) while owing its rate limiter at most 160 ms; 32 waiting for up to a
    /// second cover a burst of `kubectl` sessions and scrapes; 10 s is the API clients'
    /// own time-out.
    fn default() -> Self {
        QueueLimits {
            in_flight: 8,
            waiting: 32,
            wait: Duration::from_secs(1),
            answer: Duration::from_secs(10),
        }
    }
}

/// A [`Reviewer`] whose TokenReviews and SubjectAccessReviews each go through a bounded
/// queue of their own ([`QueueLimits`]), so a flood of made-up tokens neither queues up
/// without end nor keeps an authenticated user's SubjectAccessReview from being made.
pub(crate) struct BoundedReviewer {
    inner: Arc<dyn Reviewer>,
    tokens: Lane,
    access: Lane,
}

impl BoundedReviewer {
    pub(crate) fn new(inner: Arc<dyn Reviewer>, limits: QueueLimits) -> BoundedReviewer {
        BoundedReviewer {
            inner,
            tokens: Lane::new("TokenReviews", limits),
            access: Lane::new("SubjectAccessReviews", limits),
        }
    }

    /// How many reviews were not sent because their queue was full or slow, since the start.
    #[cfg(test)]
    pub(crate) fn refused(&self) -> u64 {
        self.tokens.refused.load(Ordering::Relaxed) + self.access.refused.load(Ordering::Relaxed)
    }
}

impl Reviewer for BoundedReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, ReviewError>> {
        Box::pin(self.tokens.run(self.inner.review_token(token)))
    }

    fn review_access<'a>(
        &'a self,
        question: &'a AccessQuestion,
    ) -> BoxFuture<'a, Result<AccessAnswer, ReviewError>> {
        Box::pin(self.access.run(self.inner.review_access(question)))
    }
}

/// One kind of review: permits for those on their way, a count of those waiting.
struct Lane {
    what: &'static str,
    limits: QueueLimits,
    permits: Semaphore,
    waiting: AtomicUsize,
    refused: std::sync::atomic::AtomicU64,
    /// When the last warning about refusals was logged, and the count it reported: a flood
    /// is reported once a minute with its count, not once per request.
    reported: std::sync::Mutex<(Option<tokio::time::Instant>, u64)>,
}

/// How often a lane that keeps refusing says so.
const REFUSAL_REPORT_EVERY: Duration = Duration::from_secs(60);

impl Lane {
    fn new(what: &'static str, limits: QueueLimits) -> Lane {
        Lane {
            what,
            limits,
            permits: Semaphore::new(limits.in_flight.max(1)),
            waiting: AtomicUsize::new(0),
            refused: Default::default(),
            reported: Default::default(),
        }
    }

    async fn run<T>(
        &self,
        review: BoxFuture<'_, Result<T, ReviewError>>,
    ) -> Result<T, ReviewError> {
        let Some(_permit) = self.turn().await else {
            self.refuse();
            return Err(ReviewError::Busy);
        };
        match tokio::time::timeout(self.limits.answer, review).await {
            Ok(answer) => answer,
            Err(_) => Err(ReviewError::TimedOut(self.limits.answer)),
        }
    }

    /// A permit at once, or after waiting in line (if there is room in it) for at most
    /// `limits.wait`; `None` when neither.
    async fn turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        if let Ok(permit) = self.permits.try_acquire() {
            return Some(permit);
        }
        let _place = WaitingPlace::take(&self.waiting, self.limits.waiting)?;
        tokio::time::timeout(self.limits.wait, self.permits.acquire())
            .await
            .ok()?
            .ok()
    }

    fn refuse(&self) {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = clock::instant();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let due = reported
            .0
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_REPORT_EVERY);
        if due {
            tracing::warn!(
                reviews = self.what,
                refused = total - reported.1,
                in_flight = self.limits.in_flight,
                waiting = self.limits.waiting,
                "node API: too many reviews in progress; requests that need one more are refused (401 for a token, 500 for an authorization)"
            );
            *reported = (Some(now), total);
        }
    }
}

/// A place in a lane's waiting line, given back when dropped (also when the request that
/// waits goes away).
struct WaitingPlace<'a>(&'a AtomicUsize);

impl<'a> WaitingPlace<'a> {
    fn take(count: &'a AtomicUsize, max: usize) -> Option<WaitingPlace<'a>> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitingPlace(count))
    }
}

impl Drop for WaitingPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Hold, Reply, Rule};

    #[test]
    fn access_review_asks_about_the_nodes_subresource() {
        let q = AccessQuestion {
            user: UserInfo {
                name: "alice".into(),
                uid: "u1".into(),
                groups: vec!["g".into(), "system:authenticated".into()],
                extra: BTreeMap::new(),
            },
            verb: "get".into(),
            node_name: "n1".into(),
            subresource: "log".into(),
        };
        let r = access_review(&q);
        assert_eq!(r.spec.user.as_deref(), Some("alice"));
        assert_eq!(r.spec.uid.as_deref(), Some("u1"));
        assert_eq!(r.spec.extra, None);
        let a = r.spec.resource_attributes.unwrap();
        assert_eq!(a.resource.as_deref(), Some("nodes"));
        assert_eq!(a.subresource.as_deref(), Some("log"));
        assert_eq!(a.name.as_deref(), Some("n1"));
        assert_eq!(a.version.as_deref(), Some("v1"));
        assert_eq!(a.group.as_deref(), Some(""));
        assert_eq!(token_review("t").spec.token, "t");
    }

    /// The real reviewer on a fake API server that allows every SubjectAccessReview and
    /// keeps every TokenReview unanswered until the returned hold is released (then it is
    /// answered "not authenticated").
    fn held_token_reviews() -> (FakeApiServer, Hold, Arc<dyn Reviewer>) {
        let fake = FakeApiServer::new();
        fake.respond(Rule::new("create", "subjectaccessreviews"), |req| {
            let mut review = req.body.clone()?;
            review["status"] = serde_json::json!({"allowed": true});
            Some(Reply::Object(review))
        });
        let hold = fake.hold(token_reviews());
        let reviewer = KubeReviewer::shared(fake.client());
        (fake, hold, reviewer)
    }

    fn token_reviews() -> Rule {
        Rule::new("create", "tokenreviews")
    }

    fn question() -> AccessQuestion {
        AccessQuestion {
            user: UserInfo::default(),
            verb: "get".into(),
            node_name: "n1".into(),
            subresource: "proxy".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_a_slow_turn_after_the_wait() {
        let (fake, hold, reviewer) = held_token_reviews();
        let limits = QueueLimits {
            in_flight: 2,
            waiting: 3,
            wait: Duration::from_secs(1),
            answer: Duration::from_secs(10),
        };
        let bounded = Arc::new(BoundedReviewer::new(reviewer, limits));
        let start = tokio::time::Instant::now();
        let mut reviews = Vec::new();
        for i in 0..20 {
            let b = bounded.clone();
            reviews.push(tokio::spawn(async move {
                let r = b.review_token(&format!("t{i}")).await;
                (r, start.elapsed())
            }));
        }
        hold.arrived(2).await;
        // The API server answers the token reviews after 5 s.
        tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs(5)).await;
            hold.release();
        });
        // The token lane is full; an access review still goes through, at once.
        let answer = bounded.review_access(&question()).await.unwrap();
        assert!(answer.allowed);
        assert_eq!(start.elapsed(), Duration::ZERO);
        let mut outcomes = Vec::new();
        for r in reviews {
            let (result, took) = r.await.unwrap();
            let kind = match result {
                Ok(_) => "answered",
                Err(ReviewError::Busy) => "busy",
                Err(e) => panic!("unexpected {e}"),
            };
            outcomes.push((kind, took.as_secs()));
        }
        let count = |k: &str, secs: u64| outcomes.iter().filter(|o| **o == (k, secs)).count();
        assert_eq!(count("answered", 5), 2, "{outcomes:?}");
        assert_eq!(
            count("busy", 1),
            3,
            "waited their second in line: {outcomes:?}"
        );
        assert_eq!(count("busy", 0), 15, "no room in line: {outcomes:?}");
        assert_eq!(fake.count(&token_reviews()), 2, "only two were sent");
        assert_eq!(bounded.refused(), 18);
        assert_eq!(bounded.tokens.waiting.load(Ordering::SeqCst), 0);
        // Drained: the next one is made.
        assert!(bounded.review_token("later").await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_takes_too_long_is_a_failure() {
        let (fake, _hold, reviewer) = held_token_reviews();
        let bounded = BoundedReviewer::new(reviewer, QueueLimits::default());
        let start = tokio::time::Instant::now();
        assert!(matches!(
            bounded.review_token("t").await,
            Err(ReviewError::TimedOut(_))
        ));
        assert_eq!(start.elapsed(), QueueLimits::default().answer);
        assert_eq!(fake.count(&token_reviews()), 1);
        // Its permit came back.
        assert_eq!(
            bounded.tokens.permits.available_permits(),
            QueueLimits::default().in_flight
        );
    }

    /// The reviews sent are the API server's types with upstream's fields, and its answers
    /// are read: a TokenReview's user, a SubjectAccessReview's verdict (denied wins), and an
    /// error status is a failure.
    #[tokio::test]
    async fn the_reviews_sent_and_the_answers_read() {
        let fake = FakeApiServer::new();
        fake.respond(token_reviews(), |req| {
            let mut review = req.body.clone()?;
            if review["spec"]["token"] == "good" {
                review["status"] = serde_json::json!({"authenticated": true, "user": {
                    "username": "alice", "uid": "u1", "groups": ["g"],
                    "extra": {"scopes": ["a"]}}});
            }
            Some(Reply::Object(review))
        });
        fake.respond(Rule::new("create", "subjectaccessreviews"), |req| {
            let mut review = req.body.clone()?;
            let sub = review["spec"]["resourceAttributes"]["subresource"].clone();
            review["status"] = match sub.as_str() {
                Some("log") => serde_json::json!({"allowed": true, "reason": "RBAC"}),
                Some("proxy") => serde_json::json!({"allowed": true, "denied": true}),
                _ => serde_json::json!({"allowed": false}),
            };
            Some(Reply::Object(review))
        });
        let reviewer = KubeReviewer(fake.client());
        let alice = reviewer.review_token("good").await.unwrap().unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.uid, "u1");
        assert_eq!(alice.groups, ["g"]);
        assert_eq!(alice.extra["scopes"], ["a"]);
        assert_eq!(reviewer.review_token("bad").await.unwrap(), None);
        let sent: Vec<TokenReview> = fake.requests().iter().filter_map(|r| r.body_as()).collect();
        assert_eq!(sent[0].spec.token, "good");
        assert_eq!(sent[0].spec.audiences, None);
        let ask = |subresource: &str| AccessQuestion {
            subresource: subresource.into(),
            ..question()
        };
        let answer = reviewer.review_access(&ask("log")).await.unwrap();
        assert_eq!((answer.allowed, answer.reason.as_str()), (true, "RBAC"));
        assert!(!reviewer.review_access(&ask("proxy")).await.unwrap().allowed);
        assert!(!reviewer.review_access(&ask("stats")).await.unwrap().allowed);
        let last = fake.requests().pop().unwrap();
        assert_eq!(last.describe(), "create subjectaccessreviews");
        let sar: SubjectAccessReview = last.body_as().unwrap();
        assert_eq!(sar, access_review(&ask("stats")));
        fake.fail(Rule::any(), 500, 2);
        assert!(matches!(
            reviewer.review_token("good").await,
            Err(ReviewError::Failed(_))
        ));
        assert!(matches!(
            reviewer.review_access(&ask("log")).await,
            Err(ReviewError::Failed(_))
        ));
    }
}
