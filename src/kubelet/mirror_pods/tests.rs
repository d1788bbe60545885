//! The manager with the real [`KubeMirrorApi`] against the in-memory API server, under a
//! paused clock: the decisions of `decide.rs` carried out, the view standing in for the watch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::base::podspec::origin::CONFIG_SOURCE_ANNOTATION;
use crate::clients::apiserver::fake::{FakeApiServer, Rule, Verb};

/// Waits (in the paused clock's time) until `check` holds.
async fn eventually<F: FnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The manager's requests to the fake API server, one line each: `get node n1`,
/// `create default/web-n1 hash=h1 owner=Node/node-uid`, `delete default/web-n1 <uid>` (the
/// UID of its precondition).
fn calls(fake: &FakeApiServer) -> Vec<String> {
    fake.requests()
        .iter()
        .map(|r| match (r.verb, r.gvr.resource.as_str()) {
            (Verb::Get, "nodes") => format!("get node {}", r.name.as_deref().unwrap_or("")),
            (Verb::Create, "pods") => {
                let pod: Pod = r.body_as().expect("a pod");
                let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
                format!(
                    "create {} hash={} owner={}/{}",
                    full_name(&pod),
                    mirror_hash(&pod).unwrap_or_default(),
                    owner.kind,
                    owner.uid
                )
            }
            (Verb::Delete, "pods") => {
                let body = r.body.clone().unwrap_or_default();
                assert_eq!(body["gracePeriodSeconds"], 0, "deleted at once");
                format!(
                    "delete {}/{} {}",
                    r.namespace.as_deref().unwrap_or(""),
                    r.name.as_deref().unwrap_or(""),
                    body["preconditions"]["uid"].as_str().unwrap_or("")
                )
            }
            _ => r.describe(),
        })
        .collect()
}

fn static_pod(uid: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.name = Some("web-n1".into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p.metadata.annotations = Some(BTreeMap::from([
        (CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string()),
        (
            crate::kubelet::source::defaults::CONFIG_HASH_ANNOTATION.to_string(),
            uid.to_string(),
        ),
    ]));
    Arc::new(p)
}

/// A mirror pod as the API server shows it.
fn mirror(uid: &str, hash: &str) -> Pod {
    let mut p = mirror_pod(&static_pod(hash), "n1", "node-uid");
    p.metadata.uid = Some(uid.into());
    p
}

fn show(view: &ApiPodsView, pods: &[Arc<Pod>]) {
    view.replace(
        pods.iter()
            .map(|p| (p.metadata.uid.clone().unwrap(), p.clone()))
            .collect(),
    );
}

struct Setup {
    view: ApiPodsView,
    mirrors: MirrorPods,
    api: FakeApiServer,
    ready: SourcesReady,
    cancel: CancellationToken,
}

fn setup() -> Setup {
    let view = ApiPodsView::default();
    let mirrors = MirrorPods::new(view.clone());
    let api = FakeApiServer::new();
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    node.metadata.uid = Some("node-uid".into());
    api.apply(&node);
    let ready = SourcesReady::new(["file", "api"]);
    let cancel = CancellationToken::new();
    tokio::spawn(mirrors.clone().run(
        KubeMirrorApi::new(api.client()),
        "n1".into(),
        ready.clone(),
        cancel.clone(),
    ));
    Setup {
        view,
        mirrors,
        api,
        ready,
        cancel,
    }
}

/// A mirror pod that is in the API server already (as the fake stores it).
fn existing_mirror(api: &FakeApiServer, uid: &str, hash: &str) -> Arc<Pod> {
    Arc::new(api.apply(&mirror(uid, hash)))
}

/// The mirror pod the manager created, as the API server stores it (its UID the fake's).
fn created_mirror(api: &FakeApiServer) -> Arc<Pod> {
    Arc::new(api.get("default", "web-n1").expect("the mirror pod"))
}

async fn calls_become(api: &FakeApiServer, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while calls(api) != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "calls {:?}, not {want:?}",
            calls(api)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_running_static_pod_gets_its_mirror_and_keeps_it() {
    let s = setup();
    let p = static_pod("h1");
    show(&s.view, &[]);
    s.mirrors.desired(&p);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(calls(&s.api).is_empty(), "not run yet: no mirror pod");
    s.mirrors.synced(&p);
    calls_become(
        &s.api,
        &[
            "get node n1",
            "create default/web-n1 hash=h1 owner=Node/node-uid",
        ],
    )
    .await;
    // Other changes before the watch shows the new mirror pod create nothing twice.
    s.mirrors.synced(&p);
    show(&s.view, &[]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls(&s.api).len(), 2);
    // The watch shows it: it is the status target.
    let made = created_mirror(&s.api);
    let c1 = made.metadata.uid.clone().unwrap();
    show(&s.view, &[made]);
    eventually("the mirror is the status target", || {
        s.mirrors.target("h1").and_then(|m| m.metadata.uid.clone()) == Some(c1.clone())
    })
    .await;
    // A user deletes it: it is deleted at once and created anew.
    let deleting = s.api.modify::<Pod>("default", "web-n1", |p| {
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    });
    show(&s.view, &[Arc::new(deleting)]);
    calls_become(
        &s.api,
        &[
            "get node n1",
            "create default/web-n1 hash=h1 owner=Node/node-uid",
            &format!("delete default/web-n1 {c1}"),
            "create default/web-n1 hash=h1 owner=Node/node-uid",
        ],
    )
    .await;
    assert!(
        s.mirrors.target("h1").is_none(),
        "not onto a mirror being deleted"
    );
    s.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_edited_static_pod_replaces_its_mirror_and_a_removed_one_deletes_it() {
    let s = setup();
    s.ready.mark_seen("file");
    s.ready.mark_seen("api");
    let old = static_pod("h1");
    show(&s.view, &[existing_mirror(&s.api, "m1", "h1")]);
    s.mirrors.desired(&old);
    s.mirrors.synced(&old);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(calls(&s.api).is_empty(), "its mirror is there already");
    // The manifest changed: the old UID is torn down, the new one runs.
    let new = static_pod("h2");
    s.mirrors.terminating("h1");
    s.mirrors.desired(&new);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        calls(&s.api).is_empty(),
        "nothing while the old one is torn down"
    );
    s.mirrors.torn_down("h1");
    s.mirrors.synced(&new);
    calls_become(
        &s.api,
        &[
            "delete default/web-n1 m1",
            "get node n1",
            "create default/web-n1 hash=h2 owner=Node/node-uid",
        ],
    )
    .await;
    let m2 = created_mirror(&s.api);
    let delete_m2 = format!("delete default/web-n1 {}", m2.metadata.uid.clone().unwrap());
    show(&s.view, &[m2]);
    // The manifest is removed: once torn down, the mirror pod goes.
    s.mirrors.terminating("h2");
    s.mirrors.torn_down("h2");
    eventually("the orphan deleted", || {
        calls(&s.api).last() == Some(&delete_m2)
    })
    .await;
    s.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn orphans_wait_for_every_source_and_a_grace_after() {
    let s = setup();
    show(&s.view, &[existing_mirror(&s.api, "m9", "h9")]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(calls(&s.api).is_empty(), "the sources have not all spoken");
    s.ready.mark_seen("file");
    s.ready.mark_seen("api");
    let marked = tokio::time::Instant::now();
    calls_become(&s.api, &["delete default/web-n1 m9"]).await;
    assert!(marked.elapsed() >= ORPHAN_GRACE, "{:?}", marked.elapsed());
    s.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_create_is_retried_with_back_off() {
    let s = setup();
    let creates = Rule::new("create", "pods").in_namespace("default");
    s.api.unreachable(creates.clone(), 3);
    show(&s.view, &[]);
    let p = static_pod("h1");
    s.mirrors.synced(&p);
    let start = tokio::time::Instant::now();
    eventually("four creates", || s.api.count(&creates) == 4).await;
    // 200 + 400 + 800 ms of back-off.
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(s.api.count(&creates), 4, "nothing more once it worked");
    assert!(s.api.get::<Pod>("default", "web-n1").is_some(), "created");
    s.cancel.cancel();
}

#[test]
fn only_static_pods_count() {
    let mirrors = MirrorPods::new(ApiPodsView::default());
    let mut api_pod = (*static_pod("a1")).clone();
    api_pod.metadata.annotations = Some(BTreeMap::from([(
        CONFIG_SOURCE_ANNOTATION.to_string(),
        "api".to_string(),
    )]));
    mirrors.synced(&Arc::new(api_pod));
    assert!(mirrors.statics().is_empty());
    mirrors.synced(&static_pod("s1"));
    assert_eq!(mirrors.statics().len(), 1);
}
