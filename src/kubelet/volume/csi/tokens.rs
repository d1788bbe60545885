//! A CSIDriver's `tokenRequests`, as upstream's `podServiceAccountTokenAttrs`: for each
//! audience listed, a token of the pod's service account, bound to the pod, is asked of the
//! node's token manager (the one projected volumes use, so a token is cached and refreshed
//! the same way) and handed to `NodePublishVolume` as JSON under
//! `csi.storage.k8s.io/serviceAccount.tokens`: `{"<audience>": {"token": …,
//! "expirationTimestamp": …}}`. An empty audience asks for the API server's own audiences
//! (the request names none) and keeps the key `""`. With `serviceAccountTokenInSecrets` the
//! entry goes into the call's secrets instead of its volume context.
//!
//! What to ask for and what to hand over are pure ([`wants`], [`hand_over`]); [`fetch`] asks.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::CsiError;
use crate::kubelet::api_objects::TokenError;
use crate::kubelet::api_objects::refs::DEFAULT_TOKEN_SECONDS;
use crate::kubelet::api_objects::token::{Issued, TokenWant};

/// The key upstream hands the tokens under.
pub(crate) const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// What the driver's `tokenRequests` ask of the token manager for `pod`, each with its
/// audience as the JSON key (pure). The pod's service account is `default` when unset, and a
/// request without `expirationSeconds` asks for the API server's default (3600 s), as the
/// projected volumes' do.
pub(crate) fn wants(pod: &Pod, object: &CSIDriver) -> Vec<(String, TokenWant)> {
    let requests = object.spec.token_requests.iter().flatten();
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    let namespace = crate::base::podspec::pod::namespace(pod);
    requests
        .map(|r| {
            let want = TokenWant {
                namespace: namespace.to_string(),
                service_account: service_account.to_string(),
                audience: Some(r.audience.clone()).filter(|a| !a.is_empty()),
                expiration_seconds: r.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
            };
            (r.audience.clone(), want)
        })
        .collect()
}

/// Puts the issued tokens where the driver reads them (pure): nothing when the driver asked
/// for none; else the JSON entry into `secrets` with `serviceAccountTokenInSecrets`, into
/// `context` otherwise.
pub(crate) fn hand_over(
    object: &CSIDriver,
    issued: &[(String, Issued)],
    context: &mut HashMap<String, String>,
    secrets: &mut HashMap<String, String>,
) {
    if issued.is_empty() {
        return;
    }
    let by_audience: BTreeMap<&str, TokenRequestStatus> = issued
        .iter()
        .map(|(audience, t)| (audience.as_str(), status(t)))
        .collect();
    let json = serde_json::to_string(&by_audience).unwrap_or_default();
    let into = if object.spec.service_account_token_in_secrets == Some(true) {
        secrets
    } else {
        context
    };
    into.insert(TOKENS_KEY.to_string(), json);
}

/// A token as the TokenRequest's status gave it (the expiry to the second, as the API
/// server writes it).
fn status(issued: &Issued) -> TokenRequestStatus {
    let expires = jiff::Timestamp::try_from(issued.expires).unwrap_or_default();
    TokenRequestStatus {
        token: Some(issued.token.clone()),
        expiration_timestamp: Some(Time(expires)),
    }
}

/// Asks the token manager for every token the driver's `tokenRequests` name, in order; the
/// first that cannot be had fails the set-up, as upstream's.
pub(crate) async fn fetch(pod: Pod, object: CSIDriver) -> Result<Vec<(String, Issued)>, CsiError> {
    let wants = wants(&pod, &object);
    if wants.is_empty() {
        return Ok(Vec::new());
    }
    let manager = super::host()
        .and_then(|h| h.tokens.clone())
        .ok_or(CsiError::Tokens(TokenError::NoApiServer))?;
    let mut out = Vec::with_capacity(wants.len());
    for (audience, want) in wants {
        let issued = manager.issue(&pod, &want).await.map_err(CsiError::Tokens)?;
        out.push((audience, issued));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn driver(spec: serde_json::Value) -> CSIDriver {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "d"}, "spec": spec}))
            .unwrap()
    }

    fn pod(service_account: Option<&str>) -> Pod {
        let mut spec = serde_json::json!({"containers": []});
        if let Some(sa) = service_account {
            spec["serviceAccountName"] = sa.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec
        }))
        .unwrap()
    }

    fn issued(token: &str, unix: u64) -> Issued {
        Issued {
            token: token.into(),
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(unix),
            lifetime: Duration::from_secs(3600),
        }
    }

    #[test]
    fn what_is_asked_for() {
        let object = driver(serde_json::json!({"tokenRequests": [
            {"audience": "vault", "expirationSeconds": 600}, {"audience": ""}]}));
        let asked = |sa: &str| {
            vec![
                (
                    "vault".to_string(),
                    Some("vault".to_string()),
                    sa.to_string(),
                    600,
                ),
                (String::new(), None, sa.to_string(), 3600),
            ]
        };
        // (the pod's serviceAccountName, what is asked: key, audience, account, seconds)
        let rows = [
            (Some("builder"), asked("builder")),
            (None, asked("default")),
            (Some(""), asked("default")),
        ];
        for (sa, want) in rows {
            let got: Vec<_> = wants(&pod(sa), &object)
                .into_iter()
                .map(|(key, w)| {
                    assert_eq!(w.namespace, "ns");
                    (key, w.audience, w.service_account, w.expiration_seconds)
                })
                .collect();
            assert_eq!(got, want, "service account {sa:?}");
        }
        assert!(wants(&pod(None), &driver(serde_json::json!({}))).is_empty());
    }

    #[test]
    fn where_the_tokens_go_and_their_shape() {
        let two = [
            ("vault".to_string(), issued("t1", 1_800_000_000)),
            (String::new(), issued("t2", 1_800_000_600)),
        ];
        let json = r#"{"":{"expirationTimestamp":"2027-01-15T08:10:00Z","token":"t2"},"vault":{"expirationTimestamp":"2027-01-15T08:00:00Z","token":"t1"}}"#;
        // (CSIDriver spec, tokens issued, the entry in the context, the entry in the secrets)
        type Row<'a> = (
            serde_json::Value,
            &'a [(String, Issued)],
            Option<&'a str>,
            Option<&'a str>,
        );
        let rows: Vec<Row> = vec![
            (serde_json::json!({}), &[], None, None),
            (serde_json::json!({"tokenRequests": []}), &[], None, None),
            (
                serde_json::json!({"tokenRequests": [{"audience": "vault"}, {"audience": ""}]}),
                &two,
                Some(json),
                None,
            ),
            (
                serde_json::json!({"tokenRequests": [{"audience": "vault"}, {"audience": ""}],
                                   "serviceAccountTokenInSecrets": false}),
                &two,
                Some(json),
                None,
            ),
            (
                serde_json::json!({"tokenRequests": [{"audience": "vault"}, {"audience": ""}],
                                   "serviceAccountTokenInSecrets": true}),
                &two,
                None,
                Some(json),
            ),
        ];
        for (spec, tokens, in_context, in_secrets) in rows {
            let mut context = HashMap::from([("size".to_string(), "1Mi".to_string())]);
            let mut secrets = HashMap::new();
            hand_over(&driver(spec.clone()), tokens, &mut context, &mut secrets);
            assert_eq!(
                context.get(TOKENS_KEY).map(String::as_str),
                in_context,
                "{spec}"
            );
            assert_eq!(
                secrets.get(TOKENS_KEY).map(String::as_str),
                in_secrets,
                "{spec}"
            );
            assert_eq!(context["size"], "1Mi", "the driver's own attributes stay");
        }
    }
}
