//! The fake through a real kube client: each verb and control as the code under test meets it.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use super::*;
use crate::clients::apiserver::watch::{Config, Event};
use crate::clients::apiserver::{Problem, ProblemKind};

fn cm(name: &str, data: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some("ns".into());
    c.data = Some([("k".to_string(), data.to_string())].into());
    c
}

fn pod(name: &str, node: &str, labels: &[(&str, &str)]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns",
                     "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap()
}

fn kind(err: kube::Error) -> (ProblemKind, String) {
    let p = Problem::from(err);
    (p.kind, p.message)
}

#[tokio::test]
async fn create_get_and_update_keep_upstreams_versions_and_errors() {
    let fake = FakeApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let made = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let meta = &made.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.resource_version.as_deref(), Some("1"));
    assert_eq!(meta.namespace.as_deref(), Some("ns"));

    let again = cms.create(&PostParams::default(), &cm("a", "1")).await;
    let (k, message) = kind(again.unwrap_err());
    assert_eq!(k, ProblemKind::AlreadyExists);
    assert!(
        message.ends_with("configmaps \"a\" already exists"),
        "{message}"
    );
    let (k, message) = kind(cms.get("b").await.unwrap_err());
    assert_eq!(k, ProblemKind::NotFound);
    assert!(message.ends_with("configmaps \"b\" not found"), "{message}");

    let mut newer = made.clone();
    newer.data = Some([("k".to_string(), "2".to_string())].into());
    let replaced = cms
        .replace("a", &PostParams::default(), &newer)
        .await
        .unwrap();
    assert_eq!(replaced.metadata.resource_version.as_deref(), Some("2"));
    assert_eq!(replaced.metadata.uid, made.metadata.uid);
    // The first copy is stale now.
    let (k, message) = kind(
        cms.replace("a", &PostParams::default(), &made)
            .await
            .unwrap_err(),
    );
    assert_eq!(k, ProblemKind::Conflict);
    assert!(
        message.contains("the object has been modified"),
        "{message}"
    );
    // A write that changes nothing keeps the version.
    let same = cms
        .replace("a", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version.as_deref(), Some("2"));
    assert_eq!(fake.resource_version(), 2);
    // Someone else writes it: the copy we had is stale.
    let theirs = fake.modify::<ConfigMap>("ns", "a", |c| c.data = None);
    assert_eq!(theirs.metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(theirs.metadata.uid, made.metadata.uid);
    let err = cms
        .replace("a", &PostParams::default(), &same)
        .await
        .unwrap_err();
    assert_eq!(kind(err).0, ProblemKind::Conflict);

    // generateName.
    let mut generated = cm("", "x");
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("csr-".into());
    let made = cms
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(made.metadata.name.unwrap().starts_with("csr-"));
}

#[tokio::test]
async fn patches_merge_and_the_status_subresource_owns_the_status() {
    let fake = FakeApiServer::new();
    let nodes: Api<Node> = Api::all(fake.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"a": "1"}},
        "status": {"phase": "Running", "addresses": [{"type": "Hostname", "address": "old"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let patch = json!({"metadata": {"labels": {"b": "2"}}, "status": {"phase": "Terminated"}});
    let patched = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let labels = patched.metadata.labels.clone().unwrap();
    assert_eq!((labels["a"].as_str(), labels["b"].as_str()), ("1", "2"));
    assert_eq!(
        patched.status.as_ref().unwrap().phase.as_deref(),
        Some("Running"),
        "the main resource leaves the status"
    );
    let patch = json!({
        "metadata": {"labels": {"c": "3"}},
        "status": {"addresses": [{"type": "Hostname", "address": "new"}, {"$patch": "replace"}]},
    });
    let patched = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let status = patched.status.unwrap();
    assert_eq!(status.addresses.unwrap()[0].address, "new");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(!patched.metadata.labels.unwrap().contains_key("c"));
    // A resourceVersion in a patch is a precondition.
    let stale = json!({"metadata": {"resourceVersion": "1", "labels": {"d": "4"}}});
    let err = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .unwrap_err();
    assert_eq!(kind(err).0, ProblemKind::Conflict);
    // What the request looked like.
    let last = fake.requests().pop().unwrap();
    assert_eq!(last.describe(), "patch nodes n1");
    assert_eq!(
        last.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(last.body.unwrap()["metadata"]["labels"]["d"], "4");
}

#[tokio::test]
async fn lists_select_by_label_and_field() {
    let fake = FakeApiServer::new();
    fake.apply(&pod("a", "n1", &[("app", "web")]));
    fake.apply(&pod("b", "n2", &[("app", "web")]));
    fake.apply(&pod("c", "n1", &[("app", "db")]));
    let pods: Api<Pod> = Api::all(fake.client());
    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(names(on_n1), ["a", "c"]);
    let web = pods
        .list(
            &ListParams::default()
                .labels("app=web")
                .fields("metadata.name!=a"),
        )
        .await
        .unwrap();
    assert_eq!(names(web), ["b"]);
    let elsewhere: Api<Pod> = Api::namespaced(fake.client(), "other");
    assert!(
        elsewhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let list = fake.requests().pop().unwrap();
    assert_eq!(list.verb, Verb::List);
    assert_eq!(list.path, "/api/v1/namespaces/other/pods");
}

#[tokio::test]
async fn deletes_check_preconditions_and_bound_pods_go_gracefully() {
    let fake = FakeApiServer::new();
    let stored = fake.apply(&pod("a", "n1", &[]));
    let uid = stored.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(fake.client(), "ns");
    let wrong = crate::clients::apiserver::delete_exactly_now("other-uid");
    let (k, message) = kind(pods.delete("a", &wrong).await.unwrap_err());
    assert_eq!(k, ProblemKind::Conflict);
    assert!(
        message.contains("Precondition failed: UID in precondition: other-uid"),
        "{message}"
    );

    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let marked: Pod = fake
        .get("ns", "a")
        .expect("a bound pod stays while it stops");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));

    pods.delete("a", &crate::clients::apiserver::delete_exactly_now(&uid))
        .await
        .unwrap();
    assert!(fake.get::<Pod>("ns", "a").is_none());
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    fake.apply(&cm("c", "1"));
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(fake.list::<ConfigMap>(Some("ns")).is_empty());
    assert_eq!(
        fake.count(&Rule::new("delete", "pods").named("a").in_namespace("ns")),
        3
    );
}

async fn next_names(
    events: &mut crate::clients::apiserver::watch::Events<ConfigMap>,
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on");
        out.push(match event {
            Ok(Event::Init) => "Init".into(),
            Ok(Event::InitDone) => "InitDone".into(),
            Ok(Event::InitApply(o)) => format!("list {}", o.metadata.name.unwrap()),
            Ok(Event::Apply(o)) => format!(
                "apply {}={}",
                o.metadata.name.unwrap(),
                o.data.unwrap()["k"]
            ),
            Ok(Event::Delete(o)) => format!("delete {}", o.metadata.name.unwrap()),
            Err(p) => format!("error {:?}", p.kind),
        });
    }
    out
}

#[tokio::test]
async fn kubes_watcher_lists_then_follows_the_changes_and_relists_after_a_410() {
    let fake = FakeApiServer::new();
    fake.apply(&cm("a", "1"));
    fake.apply(&cm("other", "1"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let config = Config::default().fields("metadata.name=a");
    let mut events = crate::clients::apiserver::watch::events(api, config);
    assert_eq!(
        next_names(&mut events, 3).await,
        ["Init", "list a", "InitDone"]
    );
    fake.apply(&cm("a", "2"));
    fake.apply(&cm("other", "2"));
    fake.delete::<ConfigMap>("ns", "a");
    assert_eq!(next_names(&mut events, 2).await, ["apply a=2", "delete a"]);
    let watch = fake.open_watches().pop().expect("a watch is open");
    assert_eq!(watch.param("fieldSelector"), Some("metadata.name=a"));
    assert_eq!(watch.param("allowWatchBookmarks"), Some("true"));

    // The history is compacted past the watcher's version (a change it does not see came
    // after), and the watch ends: the next watch gets 410, and the watcher lists again.
    fake.apply(&cm("a", "3"));
    assert_eq!(next_names(&mut events, 1).await, ["apply a=3"]);
    fake.apply(&cm("other", "3"));
    fake.compact();
    fake.end_watches();
    let got = next_names(&mut events, 4).await;
    assert_eq!(got, ["error Expired", "Init", "list a", "InitDone"]);
    let relists = fake.count(&Rule::new("list", "configmaps"));
    assert_eq!(relists, 2);
}

#[tokio::test]
async fn a_watch_streams_selected_changes_and_bookmarks_when_asked() {
    let fake = FakeApiServer::new();
    fake.apply(&pod("a", "n1", &[]));
    let pods: Api<Pod> = Api::all(fake.client());
    let params = kube::api::WatchParams::default().fields("spec.nodeName=n1");
    let mut stream = pods.watch(&params, "1").await.unwrap().boxed();
    fake.apply(&pod("b", "n2", &[]));
    fake.apply(&pod("b", "n1", &[]));
    fake.apply(&pod("a", "n2", &[]));
    fake.bookmark();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match event {
            kube::api::WatchEvent::Added(p) => format!("added {}", p.metadata.name.unwrap()),
            kube::api::WatchEvent::Modified(p) => format!("modified {}", p.metadata.name.unwrap()),
            kube::api::WatchEvent::Deleted(p) => format!("deleted {}", p.metadata.name.unwrap()),
            kube::api::WatchEvent::Bookmark(b) => {
                format!("bookmark {}", b.metadata.resource_version)
            }
            kube::api::WatchEvent::Error(e) => format!("error {}", e.code),
        });
    }
    // b moved onto n1: added; a moved away: deleted (as upstream's watch filter has it).
    assert_eq!(seen, ["added b", "deleted a", "bookmark 4"]);
}

#[tokio::test]
async fn failures_are_answered_n_times_as_the_api_server_would() {
    let fake = FakeApiServer::new();
    let leases: Api<Lease> = Api::namespaced(fake.client(), "kube-node-lease");
    fake.fail(Rule::new("get", "leases"), 403, 1);
    fake.unreachable(Rule::new("get", "leases").named("n1"), 1);
    let (k, message) = kind(leases.get("n1").await.unwrap_err());
    assert_eq!(k, ProblemKind::Forbidden);
    assert!(
        message.starts_with("the API server forbids it (403 Forbidden)"),
        "{message}"
    );
    let (k, message) = kind(leases.get("n1").await.unwrap_err());
    assert_eq!(k, ProblemKind::Unreachable);
    assert!(message.contains("connection refused"), "{message}");
    assert_eq!(
        kind(leases.get("n1").await.unwrap_err()).0,
        ProblemKind::NotFound
    );
    assert_eq!(fake.count(&Rule::new("get", "leases")), 3);
    let request = &fake.requests()[0];
    assert_eq!(
        request.path,
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
    );
    assert_eq!(request.gvr, Gvr::new("coordination.k8s.io", "v1", "leases"));
    assert_eq!(request.method, http::Method::GET);
    assert_eq!(fake.count(&Rule::any()), 3);
    fake.clear_requests();
    assert!(fake.requests().is_empty());
    // Failing until told otherwise, then the API server is back.
    fake.fail(Rule::new("get", "leases"), 500, usize::MAX);
    assert_eq!(
        kind(leases.get("n1").await.unwrap_err()).0,
        ProblemKind::Refused
    );
    assert_eq!(
        kind(leases.get("n1").await.unwrap_err()).0,
        ProblemKind::Refused
    );
    fake.clear_failures();
    assert_eq!(
        kind(leases.get("n1").await.unwrap_err()).0,
        ProblemKind::NotFound
    );
}

#[tokio::test]
async fn the_service_takes_layers_in_front_of_it() {
    let fake = FakeApiServer::new();
    fake.apply(&cm("a", "1"));
    // A layer that marks each request, as a test's layer would do its part.
    let layered = tower::ServiceBuilder::new()
        .map_request(|mut r: http::Request<kube::client::Body>| {
            r.headers_mut()
                .insert("x-layer", http::HeaderValue::from_static("seen"));
            r
        })
        .service(fake.service());
    let api: Api<ConfigMap> = Api::namespaced(kube::Client::new(layered, "ns"), "ns");
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "1");
}

#[tokio::test]
async fn a_held_request_waits_for_its_release() {
    let fake = FakeApiServer::new();
    fake.apply(&cm("a", "1"));
    let hold = fake.hold(Rule::new("get", "configmaps"));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let get = tokio::spawn(async move { api.get("a").await });
    hold.arrived(1).await;
    assert_eq!(hold.waiting(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!get.is_finished(), "held");
    let other: Api<Pod> = Api::namespaced(fake.client(), "ns");
    assert!(
        other.list(&ListParams::default()).await.is_ok(),
        "others pass"
    );
    hold.release();
    let got = get.await.unwrap().unwrap();
    assert_eq!(got.data.unwrap()["k"], "1");
}

#[tokio::test]
async fn responders_compute_answers_and_creates_of_reviews_and_tokens_have_defaults() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review: TokenReview = serde_json::from_value(json!({"spec": {"token": "good"}})).unwrap();
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert_ne!(
        answer.status.unwrap().authenticated,
        Some(true),
        "by default: not authenticated"
    );
    fake.respond(Rule::new("create", "tokenreviews"), |r| {
        let mut review: TokenReview = r.body_as()?;
        let good = review.spec.token == "good";
        review.status = Some(serde_json::from_value(json!({"authenticated": good})).unwrap());
        Some(Reply::Object(serde_json::to_value(review).unwrap()))
    });
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert_eq!(answer.status.unwrap().authenticated, Some(true));

    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "ns");
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": ["a"], "expirationSeconds": 600}}))
            .unwrap();
    let token = sas
        .create_token_request("default", &PostParams::default(), &request)
        .await
        .unwrap();
    assert_eq!(token.status.unwrap().token.as_deref(), Some("fake-token-1"));
    let last = fake.requests().pop().unwrap();
    assert_eq!(last.describe(), "create serviceaccounts/token ns/default");

    // A responder may rewrite what is stored: a CSR approved as it is created.
    fake.respond(Rule::new("create", "configmaps"), |r| {
        let mut body = r.body.clone()?;
        body["data"]["k"] = "rewritten".into();
        Some(Reply::Store(body))
    });
    let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
    cms.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    assert_eq!(
        fake.get::<ConfigMap>("ns", "a").unwrap().data.unwrap()["k"],
        "rewritten"
    );
}
