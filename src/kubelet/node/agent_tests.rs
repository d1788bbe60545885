//! The agent's loops run the real [`KubeNodeApi`] against the in-memory API server (retry,
//! conflict and request-count paths, and the requests themselves); the real API server is
//! exercised by the end-to-end tests.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;

use super::*;
use crate::clients::apiserver::fake::{FakeApiServer, Rule};
use crate::kubelet::node::allocatable::Amounts;
use crate::kubelet::node::api::KubeNodeApi;
use crate::kubelet::node::lease::LEASE_NAMESPACE;

/// The fake API server and the agent's view of it.
#[derive(Clone)]
struct Api {
    fake: FakeApiServer,
}

impl Api {
    fn new() -> Self {
        Api {
            fake: FakeApiServer::new(),
        }
    }

    fn kube(&self) -> KubeNodeApi {
        KubeNodeApi::new(self.fake.client())
    }

    /// The requests so far of one kind: `create nodes`, `patch nodes/status`, `update leases`.
    fn calls(&self, what: &str) -> usize {
        let (verb, resource) = what.split_once(' ').expect("verb resource");
        self.fake.count(&Rule::new(verb, resource))
    }

    fn node(&self) -> Node {
        self.fake.get("", "n1").expect("the Node")
    }

    fn lease(&self) -> Option<Lease> {
        self.fake.get(LEASE_NAMESPACE, "n1")
    }

    /// The node controller's hand: the Node's Ready condition set to Unknown.
    fn mark_unknown(&self) {
        self.fake.modify::<Node>("", "n1", |node| {
            for c in node
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
                .into_iter()
                .flatten()
            {
                if c.type_ == "Ready" {
                    c.status = "Unknown".into();
                }
            }
        });
    }
}

/// A snapshot whose runtime readiness and extended resources the test can change; a change
/// of the extended resources is told through `changed`, as a device plugin's is.
#[derive(Clone)]
struct Snapshots(
    Arc<Mutex<RuntimeState>>,
    Arc<Mutex<std::collections::BTreeMap<String, i64>>>,
    Arc<tokio::sync::Notify>,
);

impl Snapshots {
    fn ready() -> Self {
        Snapshots(
            Arc::new(Mutex::new(super::super::status::runtime_up(true))),
            Default::default(),
            Default::default(),
        )
    }

    fn set_extended(&self, name: &str, count: i64) {
        self.1.lock().unwrap().insert(name.into(), count);
        self.2.notify_one();
    }
}

impl SnapshotSource for Snapshots {
    fn changed(&self) -> impl Future<Output = ()> + Send {
        let nudge = self.2.clone();
        async move { nudge.notified().await }
    }

    async fn gather(&self) -> NodeSnapshot {
        let amounts = Amounts {
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 1 << 30,
            pods: 110,
            hugepages: vec![],
            extended: self.1.lock().unwrap().clone(),
        };
        NodeSnapshot {
            node_name: "n1".into(),
            internal_ip: Some("10.0.0.5".parse().unwrap()),
            machine: MachineFacts::default(),
            capacity: amounts.clone(),
            allocatable: amounts,
            runtime: self.0.lock().unwrap().clone(),
            unhealthy: vec![],
            images: vec![],
            max_images: 50,
            pressure: Pressure::default(),
            shutting_down: false,
            kubelet_port: 10250,
            volumes: Default::default(),
        }
    }
}

fn settings() -> AgentSettings {
    AgentSettings {
        node_name: "n1".into(),
        cluster: ClusterSettings::default(),
        status_update_frequency: Duration::from_secs(10),
        published: Default::default(),
    }
}

fn start(api: &Api, snaps: &Snapshots) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        api.kube(),
        snaps.clone(),
        settings(),
        ProblemLog::default(),
        crate::kubelet::events::Recorder::log_only("n1"),
        cancel.clone(),
    ));
    (cancel, task)
}

async fn advance(d: Duration) {
    // Paused clock: sleeping lets every timer up to then fire in order.
    tokio::time::sleep(d).await;
}

fn ready_status(node: &Node) -> Option<String> {
    condition_status(node.status.as_ref()?, "Ready").map(str::to_string)
}

#[tokio::test(start_paused = true)]
async fn registers_ready_and_keeps_the_lease_with_one_request_per_renewal() {
    let api = Api::new();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    let node = api.node();
    assert_eq!(
        ready_status(&node).as_deref(),
        Some("True"),
        "Ready on creation"
    );
    let lease = api.lease().expect("a Lease");
    assert_eq!(
        Some(lease.metadata.owner_references.unwrap()[0].uid.clone()),
        node.metadata.uid,
        "owned by the Node"
    );

    // The requests as the API server takes them: the Node created under our field manager,
    // the Lease created in its namespace.
    let requests = api.fake.requests();
    let create = requests
        .iter()
        .find(|r| r.describe() == "create nodes")
        .unwrap();
    assert_eq!(create.param("fieldManager"), Some("deckhand"));
    let lease_creates = Rule::new("create", "leases").in_namespace(LEASE_NAMESPACE);
    assert_eq!(api.fake.count(&lease_creates), 1);

    // One minute at rest: six Lease updates, no status patch (nothing changed).
    let (replaces, patches, gets) = (
        api.calls("update leases"),
        api.calls("patch nodes/status"),
        api.calls("get nodes"),
    );
    advance(Duration::from_secs(60)).await;
    assert_eq!(api.calls("update leases") - replaces, 6);
    assert_eq!(api.calls("patch nodes/status") - patches, 0);
    assert_eq!(api.calls("get nodes") - gets, 0);
    assert_eq!(
        api.calls("get leases"),
        1,
        "the Lease is read once, then updated optimistically"
    );

    // The report period forces a patch even without a change.
    advance(Duration::from_secs(300)).await;
    assert!(api.calls("patch nodes/status") >= 1);
    let patch = api
        .fake
        .requests()
        .into_iter()
        .rfind(|r| r.describe() == "patch nodes/status n1");
    assert_eq!(
        patch.unwrap().content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    cancel.cancel();
    task.await.unwrap();
}

/// The Lease's renewTime is the wall clock read at each renewal: a test clock set far from the
/// machine's shows in it, and a step back of that clock (as NTP makes) shows in the next
/// renewal, which still comes at its monotonic period.
#[tokio::test(start_paused = true)]
async fn the_lease_renew_time_is_the_wall_clock_at_each_renewal_even_after_a_step() {
    let renew_time = |api: &Api| api.lease().and_then(|l| l.spec?.renew_time).map(|t| t.0);
    let at: jiff::Timestamp = "2031-03-04T05:06:07Z".parse().unwrap();
    clock::set_wall(at);
    let api = Api::new();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    let first = renew_time(&api).expect("a renewed Lease");
    assert!(
        at <= first && first <= at + jiff::SignedDuration::from_millis(50),
        "renewTime {first}, the test clock {at}"
    );

    let stepped = at - jiff::SignedDuration::from_hours(1);
    clock::set_wall(stepped);
    let replaces = api.calls("update leases");
    advance(Duration::from_secs(10)).await;
    assert_eq!(api.calls("update leases") - replaces, 1);
    let after = renew_time(&api).unwrap();
    assert!(
        stepped <= after && after <= stepped + jiff::SignedDuration::from_secs(10),
        "renewTime {after} after the clock stepped back to {stepped}"
    );
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn not_ready_is_reported_and_the_change_to_ready_follows_within_the_fast_period() {
    let api = Api::new();
    let snaps = Snapshots::ready();
    *snaps.0.lock().unwrap() = RuntimeState::Down;
    let (cancel, task) = start(&api, &snaps);
    advance(Duration::from_millis(50)).await;
    assert_eq!(ready_status(&api.node()).as_deref(), Some("False"));
    *snaps.0.lock().unwrap() = super::super::status::runtime_up(true);
    advance(Duration::from_millis(150)).await;
    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_existing_node_is_reconciled_and_a_stale_lease_is_reread() {
    let api = Api::new();
    {
        let mut node = initial_node("n1", &ClusterSettings::default(), NodeStatus::default());
        node.metadata.uid = Some("uid-old".into());
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubernetes.io/arch".into(), "mips".into());
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "blue".into());
        api.fake.apply(&node);
        let lease = lease::new_lease(
            &NodeRef {
                name: "n1".into(),
                uid: "uid-old".into(),
            },
            40,
            jiff::Timestamp::now(),
        );
        api.fake.apply(&lease);
    }
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    let node = api.node();
    assert_eq!(
        node.metadata.uid.as_deref(),
        Some("uid-old"),
        "the same Node"
    );
    let labels = node.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels["kubernetes.io/arch"],
        super::super::status::go_arch()
    );
    assert_eq!(labels["team"], "blue", "labels we do not own stay");
    assert_eq!(ready_status(&node).as_deref(), Some("True"));

    // Someone else updates the Lease: our next update conflicts, and we re-read it.
    let gets = api.calls("get leases");
    api.fake.modify::<Lease>(LEASE_NAMESPACE, "n1", |_| {});
    advance(Duration::from_secs(10)).await;
    advance(Duration::from_secs(10)).await;
    assert!(api.calls("get leases") > gets, "re-read after the conflict");
    assert_eq!(
        api.lease()
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("n1")
    );
    assert_eq!(api.calls("create nodes"), 1);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_and_the_node_is_reread_after_an_outage() {
    let api = Api::new();
    // Registration: forbidden (and the Node is not there), then the API server is down.
    api.fake.fail(Rule::new("create", "nodes"), 403, 1);
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    assert_eq!(api.calls("create nodes"), 1);
    advance(Duration::from_secs(2)).await;
    assert_eq!(api.calls("create nodes"), 2, "retried after the back-off");

    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));

    // The API server drops a status patch, and the node controller marks the Node Unknown
    // meanwhile. Our copy still says True; the failure makes the next round re-read it.
    let gets = api.calls("get nodes");
    api.mark_unknown();
    api.fake.unreachable(Rule::new("patch", "nodes/status"), 1);
    // The report period makes the agent patch (and fail); the next round re-reads and fixes.
    advance(Duration::from_secs(300)).await;
    advance(Duration::from_secs(11)).await;
    assert!(api.calls("get nodes") > gets, "the Node was re-read");
    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));

    // A Lease update that fails is retried within the back-off, not a renew interval later.
    api.fake.unreachable(Rule::new("update", "leases"), 1);
    let before = api.calls("update leases");
    advance(Duration::from_secs(10)).await;
    advance(Duration::from_millis(500)).await;
    assert!(
        api.calls("update leases") >= before + 2,
        "failed, then renewed again after 200 ms"
    );
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_marked_unknown_after_a_lease_outage_is_set_right_within_three_rounds() {
    let api = Api::new();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));
    // A Lease renewal fails (the API server is away); no status write fails meanwhile,
    // since the status does not change.
    api.fake.unreachable(Rule::new("update", "leases"), 1);
    advance(Duration::from_secs(11)).await;
    // Back: the controller manager then marks the Node Unknown, seeing an old Lease.
    api.mark_unknown();
    advance(Duration::from_secs(11)).await;
    assert_eq!(
        ready_status(&api.node()).as_deref(),
        Some("True"),
        "the Node is re-read and set right, not left for the 5-minute report"
    );
    // The re-reads stop after three rounds: at rest again, no more reads of the Node.
    advance(Duration::from_secs(30)).await;
    let gets = api.calls("get nodes");
    advance(Duration::from_secs(60)).await;
    assert_eq!(api.calls("get nodes"), gets);
    cancel.cancel();
    task.await.unwrap();
}

#[test]
fn condition_events_name_each_condition_the_node_moved() {
    use k8s_openapi::api::core::v1::NodeCondition;
    let status = |pairs: &[(&str, &str)]| NodeStatus {
        conditions: Some(
            pairs
                .iter()
                .map(|(t, s)| NodeCondition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    };
    let healthy = [
        ("Ready", "True"),
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
    ];
    type Row<'a> = (&'a str, NodeStatus, NodeStatus, Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            "first registration sets them all",
            NodeStatus::default(),
            status(&healthy),
            vec![
                "NodeReady",
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID",
            ],
        ),
        ("nothing moved", status(&healthy), status(&healthy), vec![]),
        (
            "back from Unknown after an outage",
            status(&[("Ready", "Unknown"), ("MemoryPressure", "Unknown")]),
            status(&[("Ready", "True"), ("MemoryPressure", "False")]),
            vec!["NodeReady", "NodeHasSufficientMemory"],
        ),
        (
            "the runtime went away",
            status(&[("Ready", "True")]),
            status(&[("Ready", "False")]),
            vec!["NodeNotReady"],
        ),
        (
            "pressure",
            status(&[("DiskPressure", "False"), ("PIDPressure", "False")]),
            status(&[("DiskPressure", "True"), ("PIDPressure", "True")]),
            vec!["NodeHasDiskPressure", "NodeHasInsufficientPID"],
        ),
    ];
    for (name, before, after, want) in rows {
        assert_eq!(condition_events(&before, &after), want, "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_node_returned_by_the_api_server_is_published_for_admission() {
    let api = Api::new();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        api.kube(),
        Snapshots::ready(),
        AgentSettings {
            published: super::NodePublisher::to(tx),
            ..settings()
        },
        ProblemLog::default(),
        crate::kubelet::events::Recorder::log_only("n1"),
        cancel.clone(),
    ));
    advance(Duration::from_millis(50)).await;
    let published = rx.borrow().clone().expect("the registered Node");
    assert_eq!(published.metadata.uid, api.node().metadata.uid);
    assert_eq!(
        published.metadata.labels.as_ref().unwrap()["kubernetes.io/hostname"],
        "n1"
    );
    cancel.cancel();
    task.await.unwrap();
}

#[test]
fn the_published_node_never_goes_back_to_an_older_version() {
    let (tx, rx) = tokio::sync::watch::channel(None);
    let publisher = super::NodePublisher::to(tx);
    let version = |v: &str, label: &str| {
        let mut n = initial_node("n1", &ClusterSettings::default(), NodeStatus::default());
        n.metadata.resource_version = Some(v.into());
        n.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), label.into());
        n
    };
    let tier = || {
        rx.borrow()
            .as_ref()
            .unwrap()
            .metadata
            .labels
            .as_ref()
            .unwrap()["tier"]
            .clone()
    };
    publisher.publish(&version("10", "gold"));
    publisher.publish(&version("9", "stale"));
    assert_eq!(tier(), "gold");
    publisher.publish(&version("11", "silver"));
    assert_eq!(tier(), "silver");
}

fn allocatable_of(node: &Node, name: &str) -> Option<String> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(name)?;
    Some(q.0.clone())
}

#[tokio::test(start_paused = true)]
async fn a_capacity_change_is_reported_at_once_but_a_flapping_one_at_most_once_a_second() {
    const FLIP: &str = "example.com/flip";
    let api = Api::new();
    let snaps = Snapshots::ready();
    let (cancel, task) = start(&api, &snaps);
    advance(Duration::from_secs(3)).await;
    let patches = api.calls("patch nodes/status");
    snaps.set_extended(FLIP, 1);
    advance(Duration::from_millis(50)).await;
    assert_eq!(
        allocatable_of(&api.node(), FLIP).as_deref(),
        Some("1"),
        "the change is reported at once, not at the 10 s period"
    );
    assert_eq!(api.calls("patch nodes/status"), patches + 1);
    for n in 0..50 {
        snaps.set_extended(FLIP, 2 + n % 2);
        advance(Duration::from_millis(10)).await;
    }
    assert_eq!(
        api.calls("patch nodes/status"),
        patches + 1,
        "no second early round within a second of the first"
    );
    advance(Duration::from_millis(500)).await;
    assert_eq!(api.calls("patch nodes/status"), patches + 2);
    assert_eq!(
        allocatable_of(&api.node(), FLIP).as_deref(),
        Some("3"),
        "the round a second later reports the latest count"
    );
    cancel.cancel();
    task.await.unwrap();
}
