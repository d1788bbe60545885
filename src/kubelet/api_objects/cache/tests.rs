use std::time::Duration;

use super::*;
use crate::clients::apiserver::fake::FakeApiServer;
use crate::kubelet::api_objects::Kind;
use crate::kubelet::api_objects::testing::{
    config_map, delete, forbid, lists, object_api, open_watches,
};

fn pod(uid: &str, volumes: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c"}], "volumes": volumes},
    }))
    .unwrap()
}

fn cm_pod(uid: &str, name: &str) -> Pod {
    pod(
        uid,
        serde_json::json!([{"name": "v", "configMap": {"name": name}}]),
    )
}

fn cm_key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::ConfigMap, "ns", name)
}

fn setup() -> (FakeApiServer, ObjectCache, Pokes, CancellationToken) {
    let api = FakeApiServer::new();
    let pokes = Pokes::default();
    let cancel = CancellationToken::new();
    let cache = ObjectCache::new(object_api(&api), pokes.clone(), cancel.clone());
    (api, cache, pokes, cancel)
}

fn data(object: &ApiObject, key: &str) -> String {
    match object {
        ApiObject::ConfigMap(cm) => cm.data.as_ref().unwrap()[key].clone(),
        ApiObject::Secret(_) => panic!("a secret"),
    }
}

async fn poked(pokes: &Pokes) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(5), pokes.take())
        .await
        .expect("a poke")
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

#[tokio::test]
async fn a_change_is_served_and_pokes_the_pods_that_refer_to_it() {
    let (api, cache, pokes, cancel) = setup();
    api.apply(&config_map("ns", "cfg", &[("k", "one")]));
    let keys = cache.register_pod(&cm_pod("a", "cfg"));
    assert_eq!(keys.into_iter().collect::<Vec<_>>(), [cm_key("cfg")]);
    let got = cache.get(&cm_key("cfg")).await.unwrap();
    assert_eq!(data(&got, "k"), "one");
    assert_eq!(poked(&pokes).await, ["a"], "the first list pokes");

    eventually("the watch is open", || !open_watches(&api).is_empty()).await;
    api.apply(&config_map("ns", "cfg", &[("k", "two")]));
    assert_eq!(poked(&pokes).await, ["a"]);
    let got = cache.get(&cm_key("cfg")).await.unwrap();
    assert_eq!(data(&got, "k"), "two");
    assert_eq!(lists(&api), 1, "served from the watch, not listed again");
    cancel.cancel();
}

#[tokio::test]
async fn one_watch_per_object_counted_by_pod_and_stopped_with_the_last() {
    let (api, cache, _pokes, cancel) = setup();
    api.apply(&config_map("ns", "shared", &[("k", "v")]));
    cache.register_pod(&cm_pod("a", "shared"));
    cache.register_pod(&cm_pod("b", "shared"));
    cache.register_pod(&cm_pod("b", "shared"));
    cache.get(&cm_key("shared")).await.unwrap();
    eventually("one watch", || open_watches(&api).len() == 1).await;
    assert_eq!(lists(&api), 1);

    cache.unregister_pod("a");
    assert_eq!(cache.watched(), [cm_key("shared")]);
    cache.unregister_pod("b");
    assert!(cache.watched().is_empty());
    eventually("the watch is closed", || open_watches(&api).is_empty()).await;
    assert!(matches!(
        cache.get(&cm_key("shared")).await,
        Err(ObjectError::NotRegistered { .. })
    ));
    cancel.cancel();
}

#[tokio::test]
async fn a_missing_object_is_not_found_until_it_is_created() {
    let (api, cache, pokes, cancel) = setup();
    cache.register_pod(&cm_pod("a", "later"));
    let err = cache.get(&cm_key("later")).await.unwrap_err();
    assert_eq!(err.to_string(), "configmap \"later\" not found");
    assert!(err.is_not_found());
    poked(&pokes).await;
    eventually("the watch is open", || !open_watches(&api).is_empty()).await;
    api.apply(&config_map("ns", "later", &[("k", "v")]));
    assert_eq!(poked(&pokes).await, ["a"]);
    assert!(cache.get(&cm_key("later")).await.is_ok());
    delete(&api, &cm_key("later"));
    assert_eq!(poked(&pokes).await, ["a"]);
    assert!(
        cache
            .get(&cm_key("later"))
            .await
            .unwrap_err()
            .is_not_found()
    );
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_object_the_node_may_not_read_is_not_synced_and_says_why() {
    let (api, cache, _pokes, cancel) = setup();
    forbid(&api);
    cache.register_pod(&cm_pod("a", "secret-ish"));
    let err = cache.get(&cm_key("secret-ish")).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("failed to sync configmap cache: timed out waiting for the condition"),
        "{text}"
    );
    assert!(text.contains("403"), "{text}");
    api.clear_failures();
    api.apply(&config_map("ns", "secret-ish", &[("k", "v")]));
    // The back-off is at most 7 s.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(cache.get(&cm_key("secret-ish")).await.is_ok());
    cancel.cancel();
}

#[tokio::test]
async fn an_immutable_object_is_not_watched_once_read() {
    let (api, cache, _pokes, cancel) = setup();
    let mut frozen = config_map("ns", "frozen", &[("k", "v")]);
    frozen.immutable = Some(true);
    api.apply(&frozen);
    cache.register_pod(&cm_pod("a", "frozen"));
    assert!(cache.get(&cm_key("frozen")).await.is_ok());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(open_watches(&api).is_empty());
    assert_eq!(cache.watched(), [cm_key("frozen")], "still served");
    assert!(cache.get(&cm_key("frozen")).await.is_ok());
    cancel.cancel();
}

#[tokio::test]
async fn a_pod_that_refers_to_nothing_registers_nothing() {
    let (api, cache, _pokes, cancel) = setup();
    assert!(
        cache
            .register_pod(&pod("a", serde_json::json!([])))
            .is_empty()
    );
    assert!(cache.watched().is_empty());
    assert_eq!(lists(&api), 0);
    cache.unregister_pod("a");
    cancel.cancel();
}

/// What each of the watcher's events says the object is: `Some(None)` none, `None` nothing
/// to say yet (a list is under way).
#[test]
fn the_watchers_events_say_what_the_object_is() {
    let object = |v: &str| {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.resource_version = Some(v.into());
        ApiObject::ConfigMap(Arc::new(cm))
    };
    let said = |step: Option<Option<ApiObject>>| {
        step.map(|o| o.map(|o| o.resource_version().unwrap().to_string()))
    };
    let mut listing = Listing::default();
    type Row = (&'static str, Event<ApiObject>, Option<Option<&'static str>>);
    let table: Vec<Row> = vec![
        ("a list starts", Event::Init, None),
        ("the object is listed", Event::InitApply(object("1")), None),
        ("the list is complete", Event::InitDone, Some(Some("1"))),
        ("it changes", Event::Apply(object("2")), Some(Some("2"))),
        ("it goes", Event::Delete(object("3")), Some(None)),
        ("a relist (after a 410)", Event::Init, None),
        ("finds none", Event::InitDone, Some(None)),
        ("it is created", Event::Apply(object("4")), Some(Some("4"))),
        ("another relist", Event::Init, None),
        ("lists it", Event::InitApply(object("5")), None),
        ("and completes", Event::InitDone, Some(Some("5"))),
    ];
    for (what, event, expected) in table {
        assert_eq!(
            said(listing.step(event)),
            expected.map(|o| o.map(str::to_string)),
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_failed_list_is_retried_and_the_object_served() {
    let (api, cache, pokes, cancel) = setup();
    api.apply(&config_map("ns", "cfg", &[("k", "v")]));
    forbid(&api);
    cache.register_pod(&cm_pod("a", "cfg"));
    eventually("a failed list", || lists(&api) >= 1).await;
    api.clear_failures();
    assert_eq!(
        poked(&pokes).await,
        ["a"],
        "the list after the back-off pokes"
    );
    assert_eq!(data(&cache.get(&cm_key("cfg")).await.unwrap(), "k"), "v");
    cancel.cancel();
}
