//! Service-account tokens for projected volumes, as upstream's token manager gets them: one
//! TokenRequest per (service account, audience, lifetime, pod), bound to the pod, reused
//! until 80 % of its lifetime has passed or it is older than 24 hours, and kept (with a
//! warning) while a refresh fails and it has not expired yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::Pod;

use super::api::ObjectApi;
use crate::base::clock;

/// A token is refreshed when it is older than this, whatever its lifetime (upstream's maxTTL).
pub(crate) const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// What one serviceAccountToken source asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TokenWant {
    pub namespace: String,
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

/// Why a token could not be had. The first two are upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("failed to fetch token: {0}")]
    Fetch(String),
    #[error(
        "token for service account {namespace}/{service_account} expired and refresh failed: {reason}"
    )]
    Expired {
        namespace: String,
        service_account: String,
        reason: String,
    },
    #[error("the API server returned no token")]
    Empty,
    #[error("cannot use TokenManager when kubelet is in standalone mode")]
    NoApiServer,
    #[error("the token was not fetched")]
    NotFetched,
}

/// A token as issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issued {
    pub token: String,
    pub expires: SystemTime,
    /// The lifetime the API server granted (it may lengthen what was asked for).
    pub lifetime: Duration,
}

/// Whether a token expiring at `expires`, issued for `lifetime`, should be replaced at `now`:
/// older than 24 hours, or less than 20 % of its lifetime left; both moved earlier by `jitter`.
pub(crate) fn requires_refresh(now: SystemTime, issued: &Issued, jitter: Duration) -> bool {
    let issued_at = issued
        .expires
        .checked_sub(issued.lifetime)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let too_old = (issued_at + MAX_TOKEN_AGE)
        .checked_sub(jitter)
        .is_none_or(|t| now > t);
    let fifth = issued.lifetime / 5;
    let late = issued
        .expires
        .checked_sub(fifth + jitter)
        .is_none_or(|t| now > t);
    too_old || late
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    want: TokenWant,
    pod_name: String,
    pod_uid: String,
}

/// The tokens of the node's pods; cheap to clone, all clones share the cache.
#[derive(Clone)]
pub(crate) struct TokenManager {
    api: Arc<dyn ObjectApi>,
    cache: Arc<Mutex<HashMap<Key, Issued>>>,
}

impl TokenManager {
    pub(crate) fn new(api: Arc<dyn ObjectApi>) -> Self {
        TokenManager {
            api,
            cache: Arc::default(),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Issued>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token for `pod`'s source `want`: the cached one while it is fresh, else a new one
    /// from the API server (bound to the pod). A failed refresh keeps a token that has not
    /// expired yet.
    pub(crate) async fn get(&self, pod: &Pod, want: &TokenWant) -> Result<String, TokenError> {
        self.issue(pod, want).await.map(|issued| issued.token)
    }

    /// [`Self::get`] with the token's expiry: CSI drivers are handed both (a CSIDriver's
    /// `tokenRequests`), from the same cache as projected volumes, as upstream's kubelet has
    /// one token manager for both.
    pub(crate) async fn issue(&self, pod: &Pod, want: &TokenWant) -> Result<Issued, TokenError> {
        let key = Key {
            want: want.clone(),
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        };
        let now = clock::now();
        let cached = self.cache().get(&key).cloned();
        if let Some(issued) = &cached
            && !requires_refresh(now, issued, jitter())
        {
            return Ok(issued.clone());
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(want.audience.iter().cloned().collect()),
                expiration_seconds: Some(want.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(key.pod_name.clone()),
                    uid: Some(key.pod_uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = self
            .api
            .create_token(&want.namespace, &want.service_account, request)
            .await;
        let fresh = answer
            .map_err(|p| p.message)
            .and_then(|tr| issued_from(&tr, want).ok_or_else(|| TokenError::Empty.to_string()));
        match (fresh, cached) {
            (Ok(issued), _) => {
                tracing::debug!(
                    service_account = %want.service_account,
                    pod_uid = %key.pod_uid,
                    lifetime_s = issued.lifetime.as_secs(),
                    "service account token issued"
                );
                self.cache().insert(key, issued.clone());
                Ok(issued)
            }
            (Err(reason), None) => Err(TokenError::Fetch(reason)),
            (Err(reason), Some(old)) if now > old.expires => {
                self.cache().remove(&key);
                Err(TokenError::Expired {
                    namespace: want.namespace.clone(),
                    service_account: want.service_account.clone(),
                    reason,
                })
            }
            (Err(reason), Some(old)) => {
                tracing::warn!(service_account = %want.service_account, pod_uid = %key.pod_uid, %reason, "couldn't update token; the current one is kept");
                Ok(old)
            }
        }
    }

    /// Forgets the tokens bound to the pod.
    pub(crate) fn forget_pod(&self, uid: &str) {
        self.cache().retain(|k, _| k.pod_uid != uid);
    }

    /// How many tokens are cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.cache().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The token, its expiry and the lifetime granted, from the API server's answer.
fn issued_from(tr: &TokenRequest, want: &TokenWant) -> Option<Issued> {
    let status = tr.status.as_ref()?;
    let token = status.token.as_ref().filter(|t| !t.is_empty())?;
    let expires_unix = status.expiration_timestamp.as_ref()?.0.as_second();
    let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(expires_unix).ok()?);
    let seconds = tr
        .spec
        .as_ref()
        .and_then(|spec| spec.expiration_seconds)
        .unwrap_or(want.expiration_seconds);
    Some(Issued {
        token: token.clone(),
        expires,
        lifetime: Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
    })
}

/// Up to [`MAX_JITTER`], from the clock's nanoseconds (no random source needed for this).
fn jitter() -> Duration {
    let nanos = clock::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    Duration::from_secs(u64::from(nanos % 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3600;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn refresh_timing_table() {
        // (lifetime, seconds since issue, jitter, refresh?)
        let rows: &[(u64, u64, u64, bool)] = &[
            (H, 0, 0, false),
            (H, 2879, 0, false),
            (H, 2880, 0, false), // exactly 80 %: not yet
            (H, 2881, 0, true),
            (H, 2871, 10, true), // jitter moves it earlier
            (H, 2869, 10, false),
            (600, 479, 0, false),
            (600, 481, 0, true),
            (H, 4000, 0, true), // expired
            // A year-long token (the API server extends kube-api-access tokens): 24 h rule.
            (365 * 24 * H, 24 * H, 0, false),
            (365 * 24 * H, 24 * H + 1, 0, true),
            (365 * 24 * H, 24 * H - 9, 10, true),
        ];
        for &(lifetime, age, jitter, want) in rows {
            let issued = Issued {
                token: "t".into(),
                expires: at(lifetime),
                lifetime: Duration::from_secs(lifetime),
            };
            assert_eq!(
                requires_refresh(at(age), &issued, Duration::from_secs(jitter)),
                want,
                "lifetime {lifetime}, age {age}, jitter {jitter}"
            );
        }
    }

    #[test]
    fn issued_uses_the_granted_lifetime() {
        let tr: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {"audiences": [], "expirationSeconds": 31536000},
            "status": {"token": "abc", "expirationTimestamp": "2030-01-01T00:00:00Z"}
        }))
        .unwrap();
        let want = TokenWant {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: None,
            expiration_seconds: 3607,
        };
        let issued = issued_from(&tr, &want).unwrap();
        assert_eq!(issued.token, "abc");
        assert_eq!(issued.lifetime, Duration::from_secs(31_536_000));
        let empty: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {"audiences": []},
            "status": {"token": "", "expirationTimestamp": "2030-01-01T00:00:00Z"}
        }))
        .unwrap();
        assert_eq!(issued_from(&empty, &want), None);
    }
}

#[cfg(test)]
mod manager_tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Reply, Rule};
    use crate::kubelet::api_objects::testing::{forbid, object_api, token_requests};

    /// The API server's TokenRequest answers: `token-<n>`, valid for the lifetime asked
    /// for, or for the seconds the returned cell holds once the test sets it.
    fn issue_tokens(fake: &FakeApiServer) -> Arc<Mutex<Option<i64>>> {
        let expires_in = Arc::new(Mutex::new(None::<i64>));
        let issued = AtomicUsize::new(0);
        let lifetime = expires_in.clone();
        fake.respond(Rule::new("create", "serviceaccounts/token"), move |r| {
            let mut request: TokenRequest = r.body_as()?;
            let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
            let asked = request
                .spec
                .as_ref()
                .and_then(|spec| spec.expiration_seconds)
                .unwrap_or(3600);
            let seconds = lifetime.lock().unwrap().unwrap_or(asked);
            let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
            request.status = Some(TokenRequestStatus {
                token: Some(format!("token-{n}")),
                expiration_timestamp: Some(Time(expires)),
            });
            Some(Reply::Object(serde_json::to_value(request).ok()?))
        });
        expires_in
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": []}
        }))
        .unwrap()
    }

    fn want(seconds: i64) -> TokenWant {
        TokenWant {
            namespace: "shop".into(),
            service_account: "default".into(),
            audience: Some("vault".into()),
            expiration_seconds: seconds,
        }
    }

    #[tokio::test]
    async fn tokens_are_bound_to_the_pod_reused_and_kept_when_a_refresh_fails() {
        let api = FakeApiServer::new();
        let expire_in = issue_tokens(&api);
        let tokens = TokenManager::new(object_api(&api));
        assert_eq!(tokens.get(&pod(), &want(3600)).await.unwrap(), "token-1");
        assert_eq!(tokens.get(&pod(), &want(3600)).await.unwrap(), "token-1");
        let sent = token_requests(&api);
        assert_eq!(sent.len(), 1);
        let spec = sent[0].spec.as_ref().unwrap();
        assert_eq!(spec.audiences.as_deref(), Some(&["vault".to_string()][..]));
        assert_eq!(spec.expiration_seconds, Some(3600));
        let bound = spec.bound_object_ref.as_ref().unwrap();
        assert_eq!(
            (
                bound.kind.as_deref(),
                bound.name.as_deref(),
                bound.uid.as_deref()
            ),
            (Some("Pod"), Some("web"), Some("u-1"))
        );

        // A token with a minute left of its hour is refreshed each time it is asked for.
        *expire_in.lock().unwrap() = Some(60);
        let other_audience = TokenWant {
            audience: None,
            ..want(3600)
        };
        assert_eq!(
            tokens.get(&pod(), &other_audience).await.unwrap(),
            "token-2"
        );
        assert_eq!(
            tokens.get(&pod(), &other_audience).await.unwrap(),
            "token-3"
        );
        // A failing refresh keeps the token while it has not expired…
        forbid(&api);
        assert_eq!(
            tokens.get(&pod(), &other_audience).await.unwrap(),
            "token-3"
        );
        // …and says so once it has.
        api.clear_failures();
        *expire_in.lock().unwrap() = Some(-5);
        assert_eq!(
            tokens.get(&pod(), &other_audience).await.unwrap(),
            "token-4"
        );
        forbid(&api);
        let err = tokens.get(&pod(), &other_audience).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("token for service account shop/default expired and refresh failed: "),
            "{err}"
        );
        // With nothing cached, the failure is told.
        let other = TokenWant {
            service_account: "builder".into(),
            ..want(3600)
        };
        let err = tokens.get(&pod(), &other).await.unwrap_err();
        assert!(
            err.to_string().starts_with("failed to fetch token: "),
            "{err}"
        );

        assert_eq!(tokens.len(), 1, "the expired one is dropped");
        tokens.forget_pod("u-1");
        assert!(tokens.is_empty());
    }
}
