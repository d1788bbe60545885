//! Who is asking, and may they: the node API's authentication and authorization, as
//! upstream's kubelet decides them.
//!
//! * Authentication, in upstream's order: a client certificate verified against
//!   `clientCAFile` (user = CN, groups = O), then a bearer token the API server vouches for
//!   (TokenReview, answers cached for `cacheTTL`), then — only when enabled — anonymous
//!   (`system:anonymous`, group `system:unauthenticated`). Nobody → 401 `Unauthorized`.
//! * Authorization: `AlwaysAllow`, or `Webhook`: one SubjectAccessReview per subresource the
//!   path maps to (see [`super::attributes`]), the first allowed one wins; answers cached
//!   (`cacheAuthorizedTTL` / `cacheUnauthorizedTTL`). Denied → 403 with upstream's body;
//!   no answer → 500 with upstream's body.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use x509_parser::prelude::FromDer;

use super::attributes::{self, RequestAttributes};
use super::cache::TtlCache;
use super::review::{AccessQuestion, Reviewer, UserInfo};
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

/// Authentication and authorization of node API requests.
pub struct Gate {
    settings: ServerSettings,
    node_name: String,
    /// `None` without a kubeconfig: tokens are refused and `Webhook` authorization denies.
    reviewer: Option<Arc<dyn Reviewer>>,
    tokens: TtlCache<String, Option<UserInfo>>,
    access: TtlCache<AccessQuestion, bool>,
}

impl Gate {
    pub fn new(
        settings: ServerSettings,
        node_name: String,
        reviewer: Option<Arc<dyn Reviewer>>,
    ) -> Gate {
        if reviewer.is_none() {
            if settings.token_webhook_enabled {
                tracing::warn!(
                    "node API: bearer tokens cannot be checked without --kubeconfig; requests with tokens are refused"
                );
            }
            if settings.authorization_mode == AuthorizationMode::Webhook {
                tracing::warn!(
                    "node API: authorization mode Webhook needs --kubeconfig; every request is refused (set authorization.mode: AlwaysAllow for a standalone node)"
                );
            }
        }
        Gate {
            settings,
            node_name,
            reviewer,
            tokens: TtlCache::default(),
            access: TtlCache::default(),
        }
    }

    /// Who sent the request: the verified client certificate's user, a reviewed bearer
    /// token's user, anonymous if allowed, or nobody.
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
            && let Some(user) = self.review_token(token).await
        {
            return Some(with_authenticated_group(user));
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
        let now = Instant::now();
        if let Some(known) = self.tokens.get(&token.to_string(), now) {
            return known;
        }
        let reviewer = self.reviewer.as_ref()?;
        match reviewer.review_token(token).await {
            Ok(answer) => {
                self.tokens.put(
                    token.to_string(),
                    answer.clone(),
                    self.settings.token_cache_ttl,
                    now,
                );
                answer
            }
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
            let now = Instant::now();
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
                        tracing::error!(error = %e, user = %user.name, verb = attrs.verb, subresource, "node API: SubjectAccessReview failed");
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
    use crate::endpoints::node_api::review::{AccessAnswer, ReviewError};
    use futures::future::BoxFuture;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Tokens it knows, and (user, subresource) pairs it allows; counts its calls.
    #[derive(Default)]
    struct FakeReviewer {
        tokens: BTreeMap<String, String>,
        allowed: Vec<(String, String)>,
        broken: bool,
        token_calls: AtomicUsize,
        access_calls: AtomicUsize,
        asked: Mutex<Vec<AccessQuestion>>,
    }

    impl Reviewer for FakeReviewer {
        fn review_token<'a>(
            &'a self,
            token: &'a str,
        ) -> BoxFuture<'a, Result<Option<UserInfo>, ReviewError>> {
            self.token_calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if self.broken {
                    return Err(ReviewError("no answer".into()));
                }
                Ok(self.tokens.get(token).map(|name| UserInfo {
                    name: name.clone(),
                    uid: "uid-1".into(),
                    groups: vec!["system:serviceaccounts".into()],
                    ..Default::default()
                }))
            })
        }
        fn review_access<'a>(
            &'a self,
            q: &'a AccessQuestion,
        ) -> BoxFuture<'a, Result<AccessAnswer, ReviewError>> {
            self.access_calls.fetch_add(1, Ordering::SeqCst);
            self.asked.lock().unwrap().push(q.clone());
            Box::pin(async move {
                if self.broken {
                    return Err(ReviewError("no answer".into()));
                }
                Ok(AccessAnswer {
                    allowed: self
                        .allowed
                        .contains(&(q.user.name.clone(), q.subresource.clone())),
                    reason: String::new(),
                })
            })
        }
    }

    fn fake() -> FakeReviewer {
        FakeReviewer {
            tokens: [
                ("good".to_string(), "sa-logs".to_string()),
                ("nobody".to_string(), "sa-nobody".to_string()),
            ]
            .into(),
            allowed: vec![
                ("sa-logs".into(), "proxy".into()),
                ("kube-apiserver-kubelet-client".into(), "proxy".into()),
                ("stats-reader".into(), "stats".into()),
                ("pod-lister".into(), "pods".into()),
            ],
            ..Default::default()
        }
    }

    fn gate(settings: ServerSettings, reviewer: Option<Arc<FakeReviewer>>) -> Gate {
        Gate::new(
            settings,
            "n1".into(),
            reviewer.map(|r| r as Arc<dyn Reviewer>),
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
        let r = Arc::new(fake());
        let g = gate(ServerSettings::default(), Some(r.clone()));
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
        // The SAR asked about this node, with the user's groups.
        let asked = r.asked.lock().unwrap();
        assert!(asked.iter().all(|q| q.node_name == "n1"));
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled() {
        let r = Arc::new(fake());
        let on = gate(
            ServerSettings {
                anonymous_enabled: true,
                ..Default::default()
            },
            Some(r.clone()),
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
        let off = gate(ServerSettings::default(), Some(r));
        assert_eq!(off.authenticate(None, None).await, None);
    }

    #[tokio::test]
    async fn token_webhook_off_ignores_tokens() {
        let r = Arc::new(fake());
        let g = gate(
            ServerSettings {
                token_webhook_enabled: false,
                ..Default::default()
            },
            Some(r.clone()),
        );
        assert_eq!(g.authenticate(None, Some("Bearer good")).await, None);
        assert_eq!(r.token_calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn always_allow_asks_nobody() {
        let r = Arc::new(fake());
        let g = gate(
            ServerSettings {
                authorization_mode: AuthorizationMode::AlwaysAllow,
                ..Default::default()
            },
            Some(r.clone()),
        );
        assert!(matches!(
            g.check(None, Some("Bearer nobody"), &Method::POST, "/exec/a/b/c")
                .await,
            Verdict::Allowed(_)
        ));
        assert_eq!(r.access_calls.load(Ordering::SeqCst), 0);
        // Still 401 without credentials.
        assert_eq!(
            g.check(None, None, &Method::GET, "/pods").await,
            Verdict::Unauthorized
        );
    }

    #[tokio::test]
    async fn answers_are_cached() {
        let r = Arc::new(fake());
        let g = gate(ServerSettings::default(), Some(r.clone()));
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
        assert_eq!(r.token_calls.load(Ordering::SeqCst), 2);
        assert_eq!(r.access_calls.load(Ordering::SeqCst), 2);
        // Unknown tokens are remembered too.
        g.authenticate(None, Some("Bearer unknown")).await;
        g.authenticate(None, Some("Bearer unknown")).await;
        assert_eq!(r.token_calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn no_answer_is_a_500_and_no_reviewer_forbids() {
        let broken = Arc::new(FakeReviewer {
            broken: true,
            ..fake()
        });
        let g = gate(ServerSettings::default(), Some(broken));
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
