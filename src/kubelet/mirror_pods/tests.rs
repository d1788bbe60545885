//! The manager against a fake API server, under a paused clock: the decisions of `decide.rs`
//! carried out, the view standing in for the watch.

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::base::podspec::origin::CONFIG_SOURCE_ANNOTATION;

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

#[derive(Clone, Default)]
struct FakeApi {
    calls: Arc<Mutex<Vec<String>>>,
    /// Failures the next create requests get, in order.
    create_failures: Arc<Mutex<VecDeque<Problem>>>,
    next_uid: Arc<Mutex<u32>>,
}

impl FakeApi {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl MirrorApi for FakeApi {
    async fn get_node(&self, name: &str) -> Result<Node, Problem> {
        self.calls.lock().unwrap().push(format!("get node {name}"));
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.uid = Some("node-uid".into());
        Ok(node)
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Pod, Problem> {
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        self.calls.lock().unwrap().push(format!(
            "create {} hash={} owner={}/{}",
            full_name(pod),
            mirror_hash(pod).unwrap_or_default(),
            owner.kind,
            owner.uid
        ));
        if let Some(p) = self.create_failures.lock().unwrap().pop_front() {
            return Err(p);
        }
        let mut created = pod.clone();
        let mut n = self.next_uid.lock().unwrap();
        *n += 1;
        created.metadata.uid = Some(format!("c{n}"));
        Ok(created)
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), Problem> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("delete {namespace}/{name} {uid}"));
        Ok(())
    }
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
fn mirror(uid: &str, hash: &str, deleting: bool) -> Arc<Pod> {
    let mut p = mirror_pod(&static_pod(hash), "n1", "node-uid");
    p.metadata.uid = Some(uid.into());
    if deleting {
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    }
    Arc::new(p)
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
    api: FakeApi,
    ready: SourcesReady,
    cancel: CancellationToken,
}

fn setup() -> Setup {
    let view = ApiPodsView::default();
    let mirrors = MirrorPods::new(view.clone());
    let api = FakeApi::default();
    let ready = SourcesReady::new(["file", "api"]);
    let cancel = CancellationToken::new();
    tokio::spawn(
        mirrors
            .clone()
            .run(api.clone(), "n1".into(), ready.clone(), cancel.clone()),
    );
    Setup {
        view,
        mirrors,
        api,
        ready,
        cancel,
    }
}

async fn calls_become(api: &FakeApi, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while api.calls() != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "calls {:?}, not {want:?}",
            api.calls()
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
    assert!(s.api.calls().is_empty(), "not run yet: no mirror pod");
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
    assert_eq!(s.api.calls().len(), 2);
    // The watch shows it: it is the status target.
    show(&s.view, &[mirror("c1", "h1", false)]);
    eventually("the mirror is the status target", || {
        s.mirrors.target("h1").and_then(|m| m.metadata.uid.clone()) == Some("c1".into())
    })
    .await;
    // A user deletes it: it is deleted at once and created anew.
    show(&s.view, &[mirror("c1", "h1", true)]);
    calls_become(
        &s.api,
        &[
            "get node n1",
            "create default/web-n1 hash=h1 owner=Node/node-uid",
            "delete default/web-n1 c1",
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
    show(&s.view, &[mirror("m1", "h1", false)]);
    s.mirrors.desired(&old);
    s.mirrors.synced(&old);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(s.api.calls().is_empty(), "its mirror is there already");
    // The manifest changed: the old UID is torn down, the new one runs.
    let new = static_pod("h2");
    s.mirrors.terminating("h1");
    s.mirrors.desired(&new);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        s.api.calls().is_empty(),
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
    show(&s.view, &[mirror("m2", "h2", false)]);
    // The manifest is removed: once torn down, the mirror pod goes.
    s.mirrors.terminating("h2");
    s.mirrors.torn_down("h2");
    eventually("the orphan deleted", || {
        s.api.calls().last().map(String::as_str) == Some("delete default/web-n1 m2")
    })
    .await;
    s.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn orphans_wait_for_every_source_and_a_grace_after() {
    let s = setup();
    show(&s.view, &[mirror("m9", "h9", false)]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(s.api.calls().is_empty(), "the sources have not all spoken");
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
    let down = Problem {
        kind: ProblemKind::Unreachable,
        message: "cannot reach the API server: connection refused".into(),
    };
    s.api
        .create_failures
        .lock()
        .unwrap()
        .extend([down.clone(), down.clone(), down]);
    show(&s.view, &[]);
    let p = static_pod("h1");
    s.mirrors.synced(&p);
    let start = tokio::time::Instant::now();
    eventually("four creates", || {
        s.api
            .calls()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count()
            == 4
    })
    .await;
    // 200 + 400 + 800 ms of back-off.
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        s.api
            .calls()
            .iter()
            .filter(|c| c.starts_with("create"))
            .count(),
        4,
        "nothing more once it worked"
    );
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
