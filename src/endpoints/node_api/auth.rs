//! Who is asking, and may they: the node API's authentication and authorization, as
//! upstream's kubelet decides them.
//!
//! * Authentication, in upstream's order: a client certificate verified against
//!   `clientCAFile` (user = CN, groups = O), then a bearer token the API server vouches for
//!   (TokenReview; both answers, yes and no, cached for `cacheTTL` as upstream's delegating
//!   authenticator does), then — only when enabled, and only for a request that presents no
//!   credentials — anonymous (`system:anonymous`, group `system:unauthenticated`). A token
//!   that is refused, or that could not be reviewed, is a 401 even with anonymous on:
//!   upstream's union "fails on error" before it reaches the anonymous authenticator.
//!   Nobody → 401 `Unauthorized`.
//! * Authorization: `AlwaysAllow`, or `Webhook`: one SubjectAccessReview per subresource the
//!   path maps to (see [`super::attributes`]), the first allowed one wins; answers cached
//!   (`cacheAuthorizedTTL` / `cacheUnauthorizedTTL`). Denied → 403 with upstream's body;
//!   no answer → 500 with upstream's body.
//! * Both reviews go through [`BoundedReviewer`]'s queues: a review that cannot be made in
//!   time is answered as a failed one (401, 500) at once, instead of waiting.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use x509_parser::prelude::FromDer;

use super::attributes::{self, RequestAttributes};
use super::cache::TtlCache;
use super::review::{
    AccessQuestion, BoundedReviewer, QueueLimits, ReviewError, Reviewer, UserInfo,
};
use crate::base::clock;
use crate::config::{AuthorizationMode, ServerSettings};

pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The user of a verified client certificate: CN is the name, each O a group (upstream's
/// `CommonNameUserConversion`). `None` for a certificate without a CN.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(UserInfo {
        name,
        groups,
        ..Default::default()
    })
}

/// The token of an `Authorization: Bearer <token>` header, as upstream reads it.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let mut parts = header?.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Adds `system:authenticated` to an authenticated user's groups (upstream's group adder).
fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if !user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        user.groups.push(AUTHENTICATED_GROUP.to_string());
    }
    user
}

/// What the gate decided about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed(UserInfo),
    /// 401, body `Unauthorized`.
    Unauthorized,
    /// 403 with upstream's body.
    Forbidden(String),
    /// 500 with upstream's body: the authorizer could not answer.
    Error(String),
}

/// What the token caches are keyed by: an HMAC-SHA256 of the token under a key made at
/// start (upstream keys its token cache the same way), so no token is kept in memory and
/// every entry has the same small size however long the token.
type TokenKey = [u8; 32];

struct TokenKeys(ring::hmac::Key);

impl TokenKeys {
    fn new() -> TokenKeys {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng).unwrap_or_else(|_| {
            // No system randomness: a key from std's randomly keyed hasher instead.
            use std::hash::{BuildHasher, Hasher};
            let mut seed = Vec::with_capacity(32);
            for i in 0..4u8 {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u8(i);
                seed.extend_from_slice(&h.finish().to_le_bytes());
            }
            ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &seed)
        });
        TokenKeys(key)
    }

    fn of(&self, token: &str) -> TokenKey {
        let tag = ring::hmac::sign(&self.0, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(&tag.as_ref()[..32]);
        key
    }
}

/// Authentication and authorization of node API requests.
pub struct Gate {
    settings: ServerSettings,
    node_name: String,
    /// `None` without a kubeconfig: tokens are refused and `Webhook` authorization denies.
    reviewer: Option<Arc<dyn Reviewer>>,
    token_keys: TokenKeys,
    /// Tokens the API server vouched for, and those it refused, each for `cacheTTL`. Kept
    /// apart, so a flood of made-up tokens pushes out only other refused ones.
    tokens: TtlCache<TokenKey, UserInfo>,
    refused_tokens: TtlCache<TokenKey, ()>,
    access: TtlCache<AccessQuestion, bool>,
}

impl Gate {
    /// A gate whose reviews (if it has a reviewer) go through queues of the default
    /// [`QueueLimits`].
    pub fn new(
        settings: ServerSettings,
        node_name: String,
        reviewer: Option<Arc<dyn Reviewer>>,
    ) -> Gate {
        Gate::with_limits(settings, node_name, reviewer, QueueLimits::default())
    }

    pub fn with_limits(
        settings: ServerSettings,
        node_name: String,
        reviewer: Option<Arc<dyn Reviewer>>,
        limits: QueueLimits,
    ) -> Gate {
        if reviewer.is_none() {
            if settings.token_webhook_enabled {
                tracing::warn!(
                    "node API: bearer tokens cannot be checked without --kubeconfig; a request with a bearer token gets 401, also with anonymous auth on"
                );
            }
            if settings.authorization_mode == AuthorizationMode::Webhook {
                tracing::warn!(
                    "node API: authorization mode Webhook needs --kubeconfig; every request is refused (set authorization.mode: AlwaysAllow for a standalone node)"
                );
            }
        }
        let reviewer =
            reviewer.map(|r| Arc::new(BoundedReviewer::new(r, limits)) as Arc<dyn Reviewer>);
        Gate {
            settings,
            node_name,
            reviewer,
            token_keys: TokenKeys::new(),
            tokens: TtlCache::default(),
            refused_tokens: TtlCache::default(),
            access: TtlCache::default(),
        }
    }

    /// Who sent the request: the verified client certificate's user, a reviewed bearer
    /// token's user, anonymous if allowed and the request presents no credentials, or
    /// nobody.
    pub async fn authenticate(
        &self,
        peer: Option<&UserInfo>,
        authorization: Option<&str>,
    ) -> Option<UserInfo> {
        if let Some(user) = peer {
            return Some(with_authenticated_group(user.clone()));
        }
        if self.settings.token_webhook_enabled
            && let Some(token) = bearer_token(authorization)
        {
            // Credentials that fail are a failure, never anonymous.
            return self.review_token(token).await.map(with_authenticated_group);
        }
        if self.settings.anonymous_enabled {
            return Some(UserInfo {
                name: ANONYMOUS_USER.into(),
                groups: vec![UNAUTHENTICATED_GROUP.into()],
                ..Default::default()
            });
        }
        None
    }

    async fn review_token(&self, token: &str) -> Option<UserInfo> {
        let key = self.token_keys.of(token);
        let now = clock::instant();
        if let Some(user) = self.tokens.get(&key, now) {
            return Some(user);
        }
        if self.refused_tokens.get(&key, now).is_some() {
            return None;
        }
        let reviewer = self.reviewer.as_ref()?;
        let ttl = self.settings.token_cache_ttl;
        match reviewer.review_token(token).await {
            Ok(Some(user)) => {
                self.tokens.put(key, user.clone(), ttl, now);
                Some(user)
            }
            Ok(None) => {
                self.refused_tokens.put(key, (), ttl, now);
                None
            }
            // The queue reports its refusals once a minute; one line per request would
            // be the flood's own echo.
            Err(ReviewError::Busy) => None,
            Err(e) => {
                tracing::warn!(error = %e, "node API: TokenReview failed; the request is not authenticated");
                None
            }
        }
    }

    /// May `user` make this request? `Ok(())`, or the 403/500 verdict.
    pub async fn authorize(&self, user: &UserInfo, attrs: &RequestAttributes) -> Verdict {
        if self.settings.authorization_mode == AuthorizationMode::AlwaysAllow {
            return Verdict::Allowed(user.clone());
        }
        let Some(reviewer) = self.reviewer.as_ref() else {
            return Verdict::Forbidden(attributes::forbidden_message(&user.name, attrs));
        };
        for subresource in &attrs.subresources {
            let question = AccessQuestion {
                user: user.clone(),
                verb: attrs.verb.to_string(),
                node_name: self.node_name.clone(),
                subresource: subresource.to_string(),
            };
            let now = clock::instant();
            let allowed = match self.access.get(&question, now) {
                Some(a) => a,
                None => match reviewer.review_access(&question).await {
                    Ok(answer) => {
                        let ttl: Duration = if answer.allowed {
                            self.settings.authorized_ttl
                        } else {
                            self.settings.unauthorized_ttl
                        };
                        self.access.put(question.clone(), answer.allowed, ttl, now);
                        if !answer.allowed {
                            tracing::debug!(user = %user.name, verb = attrs.verb, subresource, reason = %answer.reason, "node API: not allowed");
                        }
                        answer.allowed
                    }
                    Err(e) => {
                        if !matches!(e, ReviewError::Busy) {
                            tracing::error!(error = %e, user = %user.name, verb = attrs.verb, subresource, "node API: SubjectAccessReview failed");
                        }
                        return Verdict::Error(attributes::authorization_error_message(
                            &user.name,
                            attrs.verb,
                            subresource,
                        ));
                    }
                },
            };
            if allowed {
                return Verdict::Allowed(user.clone());
            }
        }
        tracing::info!(user = %user.name, verb = attrs.verb, subresources = ?attrs.subresources, path = %attrs.path, "node API: forbidden");
        Verdict::Forbidden(attributes::forbidden_message(&user.name, attrs))
    }

    /// The whole decision for one request.
    pub async fn check(
        &self,
        peer: Option<&UserInfo>,
        authorization: Option<&str>,
        method: &Method,
        path: &str,
    ) -> Verdict {
        let Some(user) = self.authenticate(peer, authorization).await else {
            return Verdict::Unauthorized;
        };
        self.authorize(&user, &attributes::attributes(method, path))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Reply, Rule};
    use crate::endpoints::node_api::review::KubeReviewer;
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;

    /// Tokens the fake API server's TokenReviews vouch for, as (token, user name); each user
    /// has uid `uid-1` and the group `system:serviceaccounts`.
    const TOKENS: [(&str, &str); 2] = [("good", "sa-logs"), ("nobody", "sa-nobody")];

    /// (user, subresource) pairs its SubjectAccessReviews allow.
    const ALLOWED: [(&str, &str); 4] = [
        ("sa-logs", "proxy"),
        ("kube-apiserver-kubelet-client", "proxy"),
        ("stats-reader", "stats"),
        ("pod-lister", "pods"),
    ];

    /// A fake API server that answers TokenReviews and SubjectAccessReviews as the tables
    /// above say (anything else: not authenticated, not allowed).
    fn fake() -> FakeApiServer {
        let fake = FakeApiServer::new();
        fake.respond(token_reviews(), |req| {
            let mut review = req.body.clone()?;
            let token = review["spec"]["token"].as_str()?;
            let (_, name) = TOKENS.iter().find(|(t, _)| *t == token)?;
            review["status"] = serde_json::json!({"authenticated": true, "user": {
                "username": name, "uid": "uid-1", "groups": ["system:serviceaccounts"]}});
            Some(Reply::Object(review))
        });
        fake.respond(access_reviews(), |req| {
            let mut review = req.body.clone()?;
            let user = review["spec"]["user"].as_str()?;
            let sub = review["spec"]["resourceAttributes"]["subresource"].as_str()?;
            let allowed = ALLOWED.contains(&(user, sub));
            review["status"] = serde_json::json!({ "allowed": allowed });
            Some(Reply::Object(review))
        });
        fake
    }

    /// A fake API server that never answers.
    fn broken() -> FakeApiServer {
        let fake = fake();
        fake.unreachable(Rule::any(), usize::MAX);
        fake
    }

    fn token_reviews() -> Rule {
        Rule::new("create", "tokenreviews")
    }

    fn access_reviews() -> Rule {
        Rule::new("create", "subjectaccessreviews")
    }

    /// A gate whose reviews (if any) the real reviewer makes on `fake`.
    fn gate(settings: ServerSettings, fake: Option<&FakeApiServer>) -> Gate {
        Gate::new(
            settings,
            "n1".into(),
            fake.map(|f| KubeReviewer::shared(f.client())),
        )
    }

    fn cert_user(name: &str) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn decisions_table() {
        let r = fake();
        let g = gate(ServerSettings::default(), Some(&r));
        let apiserver = cert_user("kube-apiserver-kubelet-client");
        let stats = cert_user("stats-reader");
        let lister = cert_user("pod-lister");
        let get = Method::GET;
        let post = Method::POST;
        type Case<'a> = (
            Option<&'a UserInfo>,
            Option<&'a str>,
            &'a Method,
            &'a str,
            Verdict,
        );
        let cases: Vec<Case> = vec![
            (None, None, &get, "/pods", Verdict::Unauthorized),
            (None, Some("Bearer unknown"), &get, "/pods", Verdict::Unauthorized),
            (None, Some("Basic abc"), &get, "/pods", Verdict::Unauthorized),
            (None, Some("Bearer "), &get, "/pods", Verdict::Unauthorized),
            (
                None,
                Some("Bearer nobody"),
                &get,
                "/pods",
                Verdict::Forbidden(
                    "Forbidden (user=sa-nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n".into(),
                ),
            ),
            (
                None,
                Some("bearer nobody"),
                &post,
                "/exec/ns/p/c",
                Verdict::Forbidden(
                    "Forbidden (user=sa-nobody, verb=create, resource=nodes, subresource(s)=[proxy])\n".into(),
                ),
            ),
            (Some(&apiserver), None, &post, "/exec/ns/p/c", Verdict::Allowed(with_authenticated_group(apiserver.clone()))),
            // A certificate wins over a token.
            (Some(&apiserver), Some("Bearer nobody"), &get, "/containerLogs/a/b/c", Verdict::Allowed(with_authenticated_group(apiserver.clone()))),
            (Some(&stats), None, &get, "/stats/summary", Verdict::Allowed(with_authenticated_group(stats.clone()))),
            (
                Some(&stats),
                None,
                &get,
                "/pods",
                Verdict::Forbidden(
                    "Forbidden (user=stats-reader, verb=get, resource=nodes, subresource(s)=[pods proxy])\n".into(),
                ),
            ),
            // The fine-grained subresource is enough on its own.
            (Some(&lister), None, &get, "/pods", Verdict::Allowed(with_authenticated_group(lister.clone()))),
            (Some(&lister), None, &get, "/runningpods/", Verdict::Allowed(with_authenticated_group(lister.clone()))),
        ];
        for (i, (peer, header, method, path, want)) in cases.into_iter().enumerate() {
            let got = g.check(peer, header, method, path).await;
            match (&want, &got) {
                (Verdict::Allowed(w), Verdict::Allowed(u)) => {
                    assert_eq!(w.name, u.name, "case {i}")
                }
                _ => assert_eq!(got, want, "case {i} {path}"),
            }
        }
        let token_user = g.authenticate(None, Some("Bearer good")).await.unwrap();
        assert_eq!(token_user.name, "sa-logs");
        assert_eq!(token_user.uid, "uid-1");
        assert_eq!(
            token_user.groups,
            ["system:serviceaccounts", "system:authenticated"]
        );
        // The SARs asked about this node, with the user's groups.
        let asked: Vec<SubjectAccessReview> = r
            .requests()
            .iter()
            .filter(|q| access_reviews().matches(q))
            .filter_map(|q| q.body_as())
            .collect();
        assert!(!asked.is_empty());
        for sar in &asked {
            let attrs = sar.spec.resource_attributes.as_ref().unwrap();
            assert_eq!(attrs.name.as_deref(), Some("n1"), "{sar:?}");
            let groups = sar.spec.groups.as_deref().unwrap_or_default();
            assert!(groups.iter().any(|g| g == AUTHENTICATED_GROUP), "{sar:?}");
        }
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let r = fake();
        let on = gate(
            ServerSettings {
                anonymous_enabled: true,
                ..Default::default()
            },
            Some(&r),
        );
        let anon = on.authenticate(None, None).await.unwrap();
        assert_eq!(anon.name, "system:anonymous");
        assert_eq!(anon.groups, ["system:unauthenticated"]);
        assert_eq!(
            on.check(None, None, &Method::GET, "/healthz").await,
            Verdict::Forbidden(
                "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[healthz proxy])\n".into()
            )
        );
        let off = gate(ServerSettings::default(), Some(&r));
        assert_eq!(off.authenticate(None, None).await, None);
    }

    /// Upstream: anonymous is for requests that present no credentials; a bearer token that
    /// is refused, or that could not be reviewed, is a 401 even with anonymous auth on.
    #[tokio::test]
    async fn with_anonymous_on_a_token_that_fails_is_a_401() {
        let anonymous_on = ServerSettings {
            anonymous_enabled: true,
            ..Default::default()
        };
        let webhook_off = ServerSettings {
            token_webhook_enabled: false,
            ..anonymous_on.clone()
        };
        let known = || Some(fake());
        let broken = || Some(broken());
        let anon = Some(ANONYMOUS_USER);
        type Case = (
            ServerSettings,
            Option<FakeApiServer>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (anonymous_on.clone(), known(), None, anon),
            (anonymous_on.clone(), known(), Some("Bearer unknown"), None),
            (
                anonymous_on.clone(),
                known(),
                Some("Bearer good"),
                Some("sa-logs"),
            ),
            // No answer from the API server: a failure, not anonymous.
            (anonymous_on.clone(), broken(), Some("Bearer good"), None),
            // No reviewer at all (no kubeconfig): tokens are refused, as the warning says.
            (anonymous_on.clone(), None, Some("Bearer good"), None),
            // Not a bearer token: no credentials upstream reads, so anonymous.
            (anonymous_on.clone(), known(), Some("Basic abc"), anon),
            (anonymous_on.clone(), known(), Some("Bearer "), anon),
            // No token authenticator configured: the header is not looked at.
            (webhook_off, known(), Some("Bearer unknown"), anon),
        ];
        for (i, (settings, reviewer, header, want)) in cases.into_iter().enumerate() {
            let g = gate(settings, reviewer.as_ref());
            let got = g.authenticate(None, header).await;
            assert_eq!(got.map(|u| u.name).as_deref(), want, "case {i}: {header:?}");
            // Asked twice, the cached answer is the same.
            let again = g.authenticate(None, header).await;
            assert_eq!(again.map(|u| u.name).as_deref(), want, "case {i} again");
        }
        let g = gate(anonymous_on, known().as_ref());
        assert_eq!(
            g.check(None, Some("Bearer unknown"), &Method::GET, "/healthz")
                .await,
            Verdict::Unauthorized
        );
    }

    #[tokio::test]
    async fn a_flood_of_refused_tokens_keeps_the_vouched_ones_and_stays_bounded() {
        let r = fake();
        let g = gate(ServerSettings::default(), Some(&r));
        let token_calls = || r.count(&token_reviews());
        assert!(g.authenticate(None, Some("Bearer good")).await.is_some());
        let n = super::super::cache::DEFAULT_CAPACITY * 2;
        for i in 0..n {
            let header = format!("Bearer made-up-{i}-{}", "x".repeat(1000));
            assert_eq!(g.authenticate(None, Some(&header)).await, None);
        }
        assert_eq!(token_calls(), 1 + n);
        assert!(g.authenticate(None, Some("Bearer good")).await.is_some());
        assert_eq!(token_calls(), 1 + n, "the vouched token was still cached");
        assert_eq!(g.tokens.len(), 1);
        assert_eq!(
            g.refused_tokens.len(),
            super::super::cache::DEFAULT_CAPACITY
        );
        // A recent refusal is still remembered; the oldest ones were pushed out.
        let last = format!("Bearer made-up-{}-{}", n - 1, "x".repeat(1000));
        g.authenticate(None, Some(&last)).await;
        assert_eq!(token_calls(), 1 + n);
        g.authenticate(
            None,
            Some(&format!("Bearer made-up-0-{}", "x".repeat(1000))),
        )
        .await;
        assert_eq!(token_calls(), 2 + n);
    }

    /// A review that finds no room in its queue is answered at once, as upstream answers a
    /// review that failed: 401 for a token (authentication failed), 500 for an
    /// authorization (the authorizer had no answer).
    #[tokio::test(start_paused = true)]
    async fn reviews_beyond_the_queue_are_a_401_or_a_500_at_once() {
        // An API server that never answers.
        let stuck = FakeApiServer::new();
        let hold = stuck.hold(Rule::any());
        let limits = QueueLimits {
            in_flight: 1,
            waiting: 0,
            wait: Duration::from_secs(1),
            answer: Duration::from_secs(3600),
        };
        let g = Arc::new(Gate::with_limits(
            ServerSettings::default(),
            "n1".into(),
            Some(KubeReviewer::shared(stuck.client())),
            limits,
        ));
        let apiserver = cert_user("kube-apiserver-kubelet-client");
        let (g1, g2, a) = (g.clone(), g.clone(), apiserver.clone());
        tokio::spawn(async move {
            g1.check(None, Some("Bearer t1"), &Method::GET, "/pods")
                .await
        });
        tokio::spawn(async move { g2.check(Some(&a), None, &Method::GET, "/pods").await });
        // Both lanes' one review is on its way.
        hold.arrived(2).await;
        let start = tokio::time::Instant::now();
        assert_eq!(
            g.check(None, Some("Bearer t2"), &Method::GET, "/pods")
                .await,
            Verdict::Unauthorized
        );
        assert_eq!(
            g.check(Some(&apiserver), None, &Method::GET, "/healthz").await,
            Verdict::Error(
                "Authorization error (user=kube-apiserver-kubelet-client, verb=get, resource=nodes, subresource=healthz)".into()
            )
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "answered without waiting");
        assert_eq!(
            stuck.count(&Rule::any()),
            2,
            "the refused reviews were not sent"
        );
    }

    #[tokio::test]
    async fn token_webhook_off_ignores_tokens() {
        let r = fake();
        let g = gate(
            ServerSettings {
                token_webhook_enabled: false,
                ..Default::default()
            },
            Some(&r),
        );
        assert_eq!(g.authenticate(None, Some("Bearer good")).await, None);
        assert_eq!(r.count(&token_reviews()), 0);
    }

    #[tokio::test]
    async fn always_allow_asks_nobody() {
        let r = fake();
        let g = gate(
            ServerSettings {
                authorization_mode: AuthorizationMode::AlwaysAllow,
                ..Default::default()
            },
            Some(&r),
        );
        assert!(matches!(
            g.check(None, Some("Bearer nobody"), &Method::POST, "/exec/a/b/c")
                .await,
            Verdict::Allowed(_)
        ));
        assert_eq!(r.count(&access_reviews()), 0);
        // Still 401 without credentials.
        assert_eq!(
            g.check(None, None, &Method::GET, "/pods").await,
            Verdict::Unauthorized
        );
    }

    #[tokio::test]
    async fn answers_are_cached() {
        let r = fake();
        let g = gate(ServerSettings::default(), Some(&r));
        for _ in 0..3 {
            g.check(
                None,
                Some("Bearer good"),
                &Method::GET,
                "/containerLogs/a/b/c",
            )
            .await;
            g.check(
                None,
                Some("Bearer nobody"),
                &Method::GET,
                "/containerLogs/a/b/c",
            )
            .await;
        }
        assert_eq!(r.count(&token_reviews()), 2);
        assert_eq!(r.count(&access_reviews()), 2);
        // Unknown tokens are remembered too.
        g.authenticate(None, Some("Bearer unknown")).await;
        g.authenticate(None, Some("Bearer unknown")).await;
        assert_eq!(r.count(&token_reviews()), 3);
    }

    #[tokio::test]
    async fn no_answer_is_a_500_and_no_reviewer_forbids() {
        let g = gate(ServerSettings::default(), Some(&broken()));
        let apiserver = cert_user("kube-apiserver-kubelet-client");
        assert_eq!(
            g.check(Some(&apiserver), None, &Method::GET, "/pods").await,
            Verdict::Error(
                "Authorization error (user=kube-apiserver-kubelet-client, verb=get, resource=nodes, subresource=pods)".into()
            )
        );
        // A failed TokenReview is not a user.
        assert_eq!(
            g.check(None, Some("Bearer good"), &Method::GET, "/pods")
                .await,
            Verdict::Unauthorized
        );
        let standalone = gate(ServerSettings::default(), None);
        assert!(matches!(
            standalone
                .check(Some(&apiserver), None, &Method::GET, "/pods")
                .await,
            Verdict::Forbidden(_)
        ));
    }

    #[test]
    fn bearer_header_parsing() {
        let cases = [
            (None, None),
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer abc"), Some("abc")),
            (Some("BEARER abc extra"), Some("abc")),
            (Some("Bearer"), None),
            (Some("Bearer  abc"), None),
            (Some("Token abc"), None),
        ];
        for (h, want) in cases {
            assert_eq!(bearer_token(h), want, "{h:?}");
        }
    }

    #[test]
    fn certificate_user() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        let cert = params.self_signed(&key).unwrap();
        let u = user_from_certificate(cert.der()).unwrap();
        assert_eq!(u.name, "kube-apiserver-kubelet-client");
        assert_eq!(u.groups, ["system:masters"]);
        assert_eq!(user_from_certificate(b"junk"), None);
    }
}
