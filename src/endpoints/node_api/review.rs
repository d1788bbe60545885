//! The two questions the node API asks the API server: who holds this bearer token
//! (TokenReview) and may this user do this (SubjectAccessReview). Behind a trait so the
//! authentication and authorization decisions are tested without a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

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

/// A review could not be made (no answer, an error status).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(pub String);

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
pub struct KubeReviewer(pub kube::Client);

impl KubeReviewer {
    pub fn shared(client: kube::Client) -> Arc<dyn Reviewer> {
        Arc::new(KubeReviewer(client))
    }
}

/// The TokenReview for `token` (no audiences: the API server's own, as upstream's kubelet).
pub fn token_review(token: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    }
}

/// The SubjectAccessReview for `q`: `nodes` in the core group, version v1, no namespace.
pub fn access_review(q: &AccessQuestion) -> SubjectAccessReview {
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
                .map_err(|e| ReviewError(crate::clients::apiserver::problem::cause_chain(&e)))?;
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
                .map_err(|e| ReviewError(crate::clients::apiserver::problem::cause_chain(&e)))?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(token_review("t").spec.token.as_deref(), Some("t"));
    }
}
