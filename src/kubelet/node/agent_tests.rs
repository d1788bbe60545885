//! The agent's loops on an in-memory API (retry, conflict and request-count paths); the real
//! API server is exercised by the end-to-end tests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;

use super::*;
use crate::kubelet::node::allocatable::Amounts;

#[derive(Default)]
struct Store {
    node: Option<Node>,
    lease: Option<Lease>,
    version: u64,
    calls: Vec<&'static str>,
    /// Problems to return, in order, from the next calls named.
    failures: VecDeque<(&'static str, Problem)>,
}

#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<Store>>);

fn problem(kind: ProblemKind) -> Problem {
    Problem {
        kind,
        message: format!("{kind:?}"),
    }
}

impl FakeApi {
    fn call(&self, name: &'static str) -> Result<std::sync::MutexGuard<'_, Store>, Problem> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(name);
        if s.failures.front().is_some_and(|(n, _)| *n == name) {
            return Err(s.failures.pop_front().unwrap().1);
        }
        Ok(s)
    }
    fn fail_next(&self, name: &'static str, kind: ProblemKind) {
        self.0
            .lock()
            .unwrap()
            .failures
            .push_back((name, problem(kind)));
    }
    fn calls(&self, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| **c == name)
            .count()
    }
    fn node(&self) -> Node {
        self.0.lock().unwrap().node.clone().unwrap()
    }
    fn lease(&self) -> Option<Lease> {
        self.0.lock().unwrap().lease.clone()
    }
}

fn bump(s: &mut Store) -> String {
    s.version += 1;
    s.version.to_string()
}

impl NodeApi for FakeApi {
    async fn create_node(&self, node: &Node) -> Result<Node, Problem> {
        let mut s = self.call("create_node")?;
        if s.node.is_some() {
            return Err(problem(ProblemKind::AlreadyExists));
        }
        let mut node = node.clone();
        node.metadata.uid = Some("uid-1".into());
        node.metadata.resource_version = Some(bump(&mut s));
        s.node = Some(node.clone());
        Ok(node)
    }
    async fn get_node(&self, _: &str) -> Result<Node, Problem> {
        let s = self.call("get_node")?;
        s.node.clone().ok_or(problem(ProblemKind::NotFound))
    }
    async fn patch_node(&self, _: &str, patch: &serde_json::Value) -> Result<Node, Problem> {
        let mut s = self.call("patch_node")?;
        let node = s.node.as_mut().ok_or(problem(ProblemKind::NotFound))?;
        let labels = node.metadata.labels.get_or_insert_with(Default::default);
        for (k, v) in patch["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
        {
            labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
        Ok(node.clone())
    }
    async fn patch_node_status(&self, _: &str, patch: &serde_json::Value) -> Result<Node, Problem> {
        let mut s = self.call("patch_node_status")?;
        let mut status = patch["status"].clone();
        status["addresses"].as_array_mut().unwrap().pop(); // the $patch directive
        let node = s.node.as_mut().ok_or(problem(ProblemKind::NotFound))?;
        node.status = Some(serde_json::from_value(status).unwrap());
        Ok(node.clone())
    }
    async fn get_lease(&self, _: &str) -> Result<Lease, Problem> {
        let s = self.call("get_lease")?;
        s.lease.clone().ok_or(problem(ProblemKind::NotFound))
    }
    async fn create_lease(&self, lease: &Lease) -> Result<Lease, Problem> {
        let mut s = self.call("create_lease")?;
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(bump(&mut s));
        s.lease = Some(lease.clone());
        Ok(lease)
    }
    async fn replace_lease(&self, lease: &Lease) -> Result<Lease, Problem> {
        let mut s = self.call("replace_lease")?;
        let current = s.lease.as_ref().ok_or(problem(ProblemKind::NotFound))?;
        if current.metadata.resource_version != lease.metadata.resource_version {
            return Err(problem(ProblemKind::Conflict));
        }
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(bump(&mut s));
        s.lease = Some(lease.clone());
        Ok(lease)
    }
}

/// A snapshot whose runtime readiness the test can flip.
#[derive(Clone)]
struct Snapshots(Arc<Mutex<RuntimeState>>);

impl Snapshots {
    fn ready() -> Self {
        Snapshots(Arc::new(Mutex::new(super::super::status::runtime_up(true))))
    }
}

impl SnapshotSource for Snapshots {
    async fn gather(&self) -> NodeSnapshot {
        let amounts = Amounts {
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 1 << 30,
            pods: 110,
            hugepages: vec![],
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

fn start(api: &FakeApi, snaps: &Snapshots) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        api.clone(),
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
    let api = FakeApi::default();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    let node = api.node();
    assert_eq!(
        ready_status(&node).as_deref(),
        Some("True"),
        "Ready on creation"
    );
    let lease = api.lease().expect("a Lease");
    assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, "uid-1");

    // One minute at rest: six Lease updates, no status patch (nothing changed).
    let (replaces, patches, gets) = (
        api.calls("replace_lease"),
        api.calls("patch_node_status"),
        api.calls("get_node"),
    );
    advance(Duration::from_secs(60)).await;
    assert_eq!(api.calls("replace_lease") - replaces, 6);
    assert_eq!(api.calls("patch_node_status") - patches, 0);
    assert_eq!(api.calls("get_node") - gets, 0);
    assert_eq!(
        api.calls("get_lease"),
        1,
        "the Lease is read once, then updated optimistically"
    );

    // The report period forces a patch even without a change.
    advance(Duration::from_secs(300)).await;
    assert!(api.calls("patch_node_status") >= 1);
    cancel.cancel();
    task.await.unwrap();
}

/// The Lease's renewTime is the wall clock read at each renewal: a test clock set far from the
/// machine's shows in it, and a step back of that clock (as NTP makes) shows in the next
/// renewal, which still comes at its monotonic period.
#[tokio::test(start_paused = true)]
async fn the_lease_renew_time_is_the_wall_clock_at_each_renewal_even_after_a_step() {
    let renew_time = |api: &FakeApi| api.lease().and_then(|l| l.spec?.renew_time).map(|t| t.0);
    let at: jiff::Timestamp = "2031-03-04T05:06:07Z".parse().unwrap();
    clock::set_wall(at);
    let api = FakeApi::default();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    let first = renew_time(&api).expect("a renewed Lease");
    assert!(
        at <= first && first <= at + jiff::SignedDuration::from_millis(50),
        "renewTime {first}, the test clock {at}"
    );

    let stepped = at - jiff::SignedDuration::from_hours(1);
    clock::set_wall(stepped);
    let replaces = api.calls("replace_lease");
    advance(Duration::from_secs(10)).await;
    assert_eq!(api.calls("replace_lease") - replaces, 1);
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
    let api = FakeApi::default();
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
    let api = FakeApi::default();
    {
        let mut s = api.0.lock().unwrap();
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
        s.node = Some(node);
        let mut lease = lease::new_lease(
            &NodeRef {
                name: "n1".into(),
                uid: "uid-old".into(),
            },
            40,
            jiff::Timestamp::now(),
        );
        lease.metadata.resource_version = Some("100".into());
        s.lease = Some(lease);
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
    {
        let mut s = api.0.lock().unwrap();
        s.lease.as_mut().unwrap().metadata.resource_version = Some("999".into());
    }
    advance(Duration::from_secs(10)).await;
    assert!(api.calls("get_lease") >= 1);
    advance(Duration::from_secs(10)).await;
    assert_eq!(
        api.lease()
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("n1")
    );
    assert_eq!(api.calls("create_node"), 1);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_and_the_node_is_reread_after_an_outage() {
    let api = FakeApi::default();
    // Registration: forbidden (and the Node is not there), then the API server is down.
    api.fail_next("create_node", ProblemKind::Forbidden);
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    assert_eq!(api.calls("create_node"), 1);
    advance(Duration::from_secs(2)).await;
    assert_eq!(api.calls("create_node"), 2, "retried after the back-off");

    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));

    // The API server drops a status patch, and the node controller marks the Node Unknown
    // meanwhile. Our copy still says True; the failure makes the next round re-read it.
    let gets = api.calls("get_node");
    {
        let mut s = api.0.lock().unwrap();
        for c in s
            .node
            .as_mut()
            .unwrap()
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
        {
            if c.type_ == "Ready" {
                c.status = "Unknown".into();
            }
        }
        s.failures
            .push_back(("patch_node_status", problem(ProblemKind::Unreachable)));
    }
    // The report period makes the agent patch (and fail); the next round re-reads and fixes.
    advance(Duration::from_secs(300)).await;
    advance(Duration::from_secs(11)).await;
    assert!(api.calls("get_node") > gets, "the Node was re-read");
    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));

    // A Lease update that fails is retried within the back-off, not a renew interval later.
    api.fail_next("replace_lease", ProblemKind::Unreachable);
    let before = api.calls("replace_lease");
    advance(Duration::from_secs(10)).await;
    advance(Duration::from_millis(500)).await;
    assert!(
        api.calls("replace_lease") >= before + 2,
        "failed, then renewed again after 200 ms"
    );
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_marked_unknown_after_a_lease_outage_is_set_right_within_three_rounds() {
    let api = FakeApi::default();
    let (cancel, task) = start(&api, &Snapshots::ready());
    advance(Duration::from_millis(50)).await;
    assert_eq!(ready_status(&api.node()).as_deref(), Some("True"));
    // A Lease renewal fails (the API server is away); no status write fails meanwhile,
    // since the status does not change.
    api.fail_next("replace_lease", ProblemKind::Unreachable);
    advance(Duration::from_secs(11)).await;
    // Back: the controller manager then marks the Node Unknown, seeing an old Lease.
    {
        let mut s = api.0.lock().unwrap();
        for c in s
            .node
            .as_mut()
            .unwrap()
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
        {
            if c.type_ == "Ready" {
                c.status = "Unknown".into();
            }
        }
    }
    advance(Duration::from_secs(11)).await;
    assert_eq!(
        ready_status(&api.node()).as_deref(),
        Some("True"),
        "the Node is re-read and set right, not left for the 5-minute report"
    );
    // The re-reads stop after three rounds: at rest again, no more reads of the Node.
    advance(Duration::from_secs(30)).await;
    let gets = api.calls("get_node");
    advance(Duration::from_secs(60)).await;
    assert_eq!(api.calls("get_node"), gets);
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
    let api = FakeApi::default();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        api.clone(),
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
    assert_eq!(published.metadata.uid.as_deref(), Some("uid-1"));
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
