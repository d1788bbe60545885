//! The Node's status, computed from a snapshot of the node by a pure function, and the test
//! of whether it changed enough to be sent.
//!
//! Conditions, reasons and messages are upstream's, word for word, because dashboards,
//! alerts and `kubectl describe node` readers match on them.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeFeatures,
    NodeRuntimeHandler, NodeRuntimeHandlerFeatures, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::allocatable::Amounts;
use super::facts::MachineFacts;

/// The version the node agent reports as `kubeletVersion`: the Kubernetes API level it is
/// built against, with Deckhand's own version as semver build metadata (the form other
/// distributions use, e.g. `v1.37.0+k3s1`), so version-skew checks read the API level.
pub(crate) fn kubelet_version() -> String {
    format!("v1.37.0+deckhand-{}", env!("CARGO_PKG_VERSION"))
}

/// What the runtime said when last asked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RuntimeState {
    /// It did not answer.
    Down,
    /// Its answer: version (`containerd://1.6.20`) and conditions.
    Up {
        version: String,
        conditions: Vec<RuntimeCondition>,
        /// Its handlers and what each can do (`status.runtimeHandlers`; none on containerd 1.6).
        handlers: Vec<NodeRuntimeHandler>,
        /// What it supports across handlers (`status.features`; absent on containerd 1.6).
        features: Option<NodeFeatures>,
    },
}

/// `status.runtimeHandlers` from CRI `Status`, as upstream writes them: every handler in the
/// runtime's order with both features said (the default handler's name is empty).
pub(crate) fn runtime_handlers(
    handlers: &[crate::clients::cri::proto::RuntimeHandler],
) -> Vec<NodeRuntimeHandler> {
    handlers
        .iter()
        .map(|h| {
            let f = h.features.unwrap_or_default();
            NodeRuntimeHandler {
                name: Some(h.name.clone()),
                features: Some(NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(f.recursive_read_only_mounts),
                    user_namespaces: Some(f.user_namespaces),
                }),
            }
        })
        .collect()
}

/// `status.features` from CRI `Status`'s features: only when the runtime reports them.
pub(crate) fn node_features(
    features: Option<&crate::clients::cri::proto::RuntimeFeatures>,
) -> Option<NodeFeatures> {
    features.map(|f| NodeFeatures {
        supplemental_groups_policy: Some(f.supplemental_groups_policy),
    })
}

/// One condition of the CRI status (RuntimeReady, NetworkReady).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuntimeCondition {
    pub kind: String,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

/// An image the runtime holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageEntry {
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size_bytes: i64,
}

/// Which pressure conditions hold (the eviction manager sets them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// Everything the status is computed from, gathered beforehand.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeSnapshot {
    pub node_name: String,
    pub internal_ip: Option<IpAddr>,
    pub machine: MachineFacts,
    pub capacity: Amounts,
    pub allocatable: Amounts,
    pub runtime: RuntimeState,
    /// Failing health checks of the agent (name, reason), e.g. the PLEG.
    pub unhealthy: Vec<(String, String)>,
    pub images: Vec<ImageEntry>,
    /// `nodeStatusMaxImages`; -1 = all.
    pub max_images: i32,
    pub pressure: Pressure,
    pub kubelet_port: u16,
    /// The node shutdown manager is stopping pods for a shutdown: the node is not ready.
    pub shutting_down: bool,
    /// The attachable volumes pods are to mount, and the CSI volumes mounted on disk
    /// (`volumesInUse`, see `volume::csi::attach`).
    pub volumes: VolumeReport,
}

/// What `volumesInUse` is made from: the unique names of the attachable volumes pods are to
/// mount, and of the persistent CSI volumes mounted or staged on disk (reported only while
/// the controller lists them attached: only an attachable volume ever is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VolumeReport {
    pub desired: std::collections::BTreeSet<String>,
    pub mounted: std::collections::BTreeSet<String>,
}

/// Upstream reports at most this many names per image.
const MAX_NAMES_PER_IMAGE: usize = 5;

/// The features this agent declares on its Node (`status.declaredFeatures`, upstream's
/// NodeDeclaredFeatures, GA in v1.37), sorted as upstream's kubelet writes them. The scheduler
/// places a pod that needs one only on a node that declares it, and the API server lets an
/// update that needs one (a resize of an init container or of pod-level resources) through
/// only then. Upstream's v1.37 kubelet also declares `ExtendWebSocketsToKubelet` (the API
/// server then passes exec, attach and port-forward websockets straight through to the node),
/// which Deckhand does not claim: that path is not tested against it.
pub(crate) const DECLARED_FEATURES: [&str; 3] = [
    "InPlacePodLevelResourcesVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
    "RestartAllContainersOnContainerExits",
];

/// The condition types the node agent owns; others (NetworkUnavailable, …) belong to others.
pub(crate) const OWN_CONDITIONS: [&str; 4] =
    ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"];

/// Computes the status. `previous` is the status the API server last returned: a condition
/// whose status did not change keeps its transition time.
pub(crate) fn compute_node_status(
    snap: &NodeSnapshot,
    previous: Option<&NodeStatus>,
    now: jiff::Timestamp,
) -> NodeStatus {
    let mut addresses = Vec::new();
    if let Some(ip) = snap.internal_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: snap.node_name.clone(),
    });
    let capacity = snap.capacity.to_quantities();
    let (runtime_version, ready_problems) = ready_problems(snap);
    let pressure = |kind: &str, on: bool, yes: (&str, &str), no: (&str, &str)| {
        let (reason, message) = if on { yes } else { no };
        condition(kind, on, reason, message, previous, now)
    };
    let ready = match ready_problems.len() {
        0 => condition(
            "Ready",
            true,
            "KubeletReady",
            "kubelet is posting ready status",
            previous,
            now,
        ),
        1 => condition(
            "Ready",
            false,
            "KubeletNotReady",
            &ready_problems[0],
            previous,
            now,
        ),
        _ => condition(
            "Ready",
            false,
            "KubeletNotReady",
            &format!("[{}]", ready_problems.join(", ")),
            previous,
            now,
        ),
    };
    let conditions = vec![
        pressure(
            "MemoryPressure",
            snap.pressure.memory,
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        pressure(
            "DiskPressure",
            snap.pressure.disk,
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ),
        pressure(
            "PIDPressure",
            snap.pressure.pid,
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
        // Ready goes last: old API clients read the last condition as readiness.
        ready,
    ];
    let (runtime_handlers, features) = match &snap.runtime {
        RuntimeState::Up {
            handlers, features, ..
        } => (
            (!handlers.is_empty()).then(|| handlers.clone()),
            features.clone(),
        ),
        RuntimeState::Down => (None, None),
    };
    NodeStatus {
        addresses: Some(addresses),
        allocatable: Some(snap.allocatable.to_quantities()),
        capacity: Some(capacity),
        conditions: Some(conditions),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(snap.kubelet_port),
            }),
        }),
        images: Some(images(&snap.images, snap.max_images)),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch().to_string(),
            boot_id: snap.machine.boot_id.clone(),
            container_runtime_version: runtime_version,
            kernel_version: snap.machine.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version(),
            machine_id: snap.machine.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: snap.machine.os_image.clone(),
            running_in_user_namespace: None,
            swap: None,
            system_uuid: snap.machine.system_uuid.clone(),
        }),
        runtime_handlers,
        features,
        declared_features: Some(DECLARED_FEATURES.iter().map(|f| f.to_string()).collect()),
        volumes_in_use: Some(crate::kubelet::volume::csi::attach::volumes_in_use(
            &snap.volumes.desired,
            &snap.volumes.mounted,
            previous
                .and_then(|p| p.volumes_attached.as_deref())
                .unwrap_or_default(),
        )),
        ..Default::default()
    }
}

/// The runtime version string and why the node is not ready (upstream's phrases).
fn ready_problems(snap: &NodeSnapshot) -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let version = match &snap.runtime {
        RuntimeState::Down => {
            problems.push("container runtime is down".into());
            "Unknown".to_string()
        }
        RuntimeState::Up {
            version,
            conditions,
            ..
        } => {
            let mut network = None;
            for (kind, prefix) in [
                ("RuntimeReady", "container runtime not ready"),
                ("NetworkReady", "container runtime network not ready"),
            ] {
                let c = conditions.iter().find(|c| c.kind == kind);
                let problem = match c {
                    Some(c) if c.ok => None,
                    Some(c) => Some(format!(
                        "{prefix}: {kind}=false reason:{} message:{}",
                        c.reason, c.message
                    )),
                    None => Some(format!("{prefix}: {kind} is not reported")),
                };
                if kind == "NetworkReady" {
                    network = problem;
                } else if let Some(p) = problem {
                    problems.push(p);
                }
            }
            problems.extend(network);
            version.clone()
        }
    };
    for (name, reason) in &snap.unhealthy {
        problems.push(format!("{name} is not healthy: {reason}"));
    }
    if snap.shutting_down {
        problems.push(crate::kubelet::shutdown::NOT_READY_MESSAGE.into());
    }
    let mut missing = Vec::new();
    if snap.capacity.cpu_millis == 0 {
        missing.push("cpu");
    }
    if snap.capacity.memory_bytes == 0 {
        missing.push("memory");
    }
    if snap.capacity.ephemeral_storage_bytes == 0 {
        missing.push("ephemeral-storage");
    }
    if !missing.is_empty() {
        problems.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    (version, problems)
}

fn condition(
    kind: &str,
    on: bool,
    reason: &str,
    message: &str,
    previous: Option<&NodeStatus>,
    now: jiff::Timestamp,
) -> NodeCondition {
    let status = if on { "True" } else { "False" };
    let transition = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    NodeCondition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(transition),
    }
}

/// Largest images first, at most `max` (-1: all), each with up to five names (digests
/// first, as upstream).
fn images(list: &[ImageEntry], max: i32) -> Vec<ContainerImage> {
    let mut sorted: Vec<&ImageEntry> = list.iter().collect();
    sorted.sort_by_key(|i| std::cmp::Reverse(i.size_bytes));
    if max >= 0 {
        sorted.truncate(max as usize);
    }
    sorted
        .into_iter()
        .map(|i| ContainerImage {
            names: Some(
                i.repo_digests
                    .iter()
                    .chain(&i.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect(),
            ),
            size_bytes: Some(i.size_bytes),
        })
        .collect()
}

/// The architecture in Go's words (what `kubernetes.io/arch` and nodeInfo use).
pub(crate) fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// True when `ours` differs from what the API server holds (`known`) in anything the node
/// agent owns. Heartbeat times are ignored; quantities are compared by value (the API server
/// may write them in another form).
pub(crate) fn status_changed(known: &NodeStatus, ours: &NodeStatus) -> bool {
    // Type, status, reason, message and transition time of the conditions we own.
    type Owned = (String, String, Option<String>, Option<String>, Option<Time>);
    let own_conditions = |s: &NodeStatus| -> Vec<Owned> {
        let mut v: Vec<Owned> = s
            .conditions
            .iter()
            .flatten()
            .filter(|c| OWN_CONDITIONS.contains(&c.type_.as_str()))
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                    c.last_transition_time.clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let quantities = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.iter()
            .flatten()
            .map(|(k, q)| {
                let v = crate::base::podspec::quantity::parse(&q.0)
                    .map(|q| q.milli_value())
                    .ok();
                (k.clone(), v)
            })
            .collect::<Vec<_>>()
    };
    own_conditions(known) != own_conditions(ours)
        || known.addresses != ours.addresses
        || quantities(&known.capacity) != quantities(&ours.capacity)
        || quantities(&known.allocatable) != quantities(&ours.allocatable)
        || known.node_info != ours.node_info
        || known.images.as_deref().unwrap_or_default() != ours.images.as_deref().unwrap_or_default()
        || known.daemon_endpoints != ours.daemon_endpoints
        || known.volumes_in_use.as_deref().unwrap_or_default()
            != ours.volumes_in_use.as_deref().unwrap_or_default()
        // A runtime that did not answer says nothing of its handlers: the known ones stand.
        || (ours.runtime_handlers.is_some() && known.runtime_handlers != ours.runtime_handlers)
        || (ours.features.is_some() && known.features != ours.features)
        || known.declared_features != ours.declared_features
}

/// The status of condition `kind`, if present.
pub(crate) fn condition_status<'a>(status: &'a NodeStatus, kind: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.as_str())
}

/// A runtime that answered, ready or with its network not ready (for the agent's tests too).
#[cfg(test)]
pub(crate) fn runtime_up(network_ok: bool) -> RuntimeState {
    RuntimeState::Up {
        version: "containerd://1.6.20".into(),
        conditions: vec![
            RuntimeCondition {
                kind: "RuntimeReady".into(),
                ok: true,
                reason: String::new(),
                message: String::new(),
            },
            RuntimeCondition {
                kind: "NetworkReady".into(),
                ok: network_ok,
                reason: if network_ok {
                    ""
                } else {
                    "NetworkPluginNotReady"
                }
                .into(),
                message: if network_ok {
                    ""
                } else {
                    "cni plugin not initialized"
                }
                .into(),
            },
        ],
        handlers: Vec::new(),
        features: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Reservations;
    use crate::kubelet::node::allocatable::{allocatable, capacity};

    fn t(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn snapshot(runtime: RuntimeState) -> NodeSnapshot {
        let machine = MachineFacts {
            cpus: 2,
            memory_bytes: 8 << 30,
            root_fs_bytes: 100 << 30,
            machine_id: "m1".into(),
            system_uuid: "u1".into(),
            boot_id: "b1".into(),
            kernel_version: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            hugepages: vec![],
        };
        let cap = capacity(&machine, 110);
        NodeSnapshot {
            node_name: "n1".into(),
            internal_ip: Some("10.0.0.5".parse().unwrap()),
            allocatable: allocatable(&cap, &Reservations::default()),
            capacity: cap,
            machine,
            runtime,
            unhealthy: vec![],
            images: vec![],
            max_images: 50,
            pressure: Pressure::default(),
            shutting_down: false,
            kubelet_port: 10250,
            volumes: VolumeReport::default(),
        }
    }

    fn ready(s: &NodeStatus) -> &NodeCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
    }

    #[test]
    fn ready_condition_table() {
        let mut pleg = snapshot(runtime_up(true));
        pleg.unhealthy = vec![("PLEG".into(), "relist has not completed for 200s".into())];
        let mut no_cpu = snapshot(runtime_up(true));
        no_cpu.capacity.cpu_millis = 0;
        let mut shutting_down = snapshot(runtime_up(true));
        shutting_down.shutting_down = true;
        let cases: Vec<(&str, NodeSnapshot, &str, &str, &str)> = vec![
            (
                "all well",
                snapshot(runtime_up(true)),
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            ),
            (
                "runtime down",
                snapshot(RuntimeState::Down),
                "False",
                "KubeletNotReady",
                "container runtime is down",
            ),
            (
                "network not ready",
                snapshot(runtime_up(false)),
                "False",
                "KubeletNotReady",
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni plugin not initialized",
            ),
            (
                "PLEG",
                pleg,
                "False",
                "KubeletNotReady",
                "PLEG is not healthy: relist has not completed for 200s",
            ),
            (
                "missing capacity",
                no_cpu,
                "False",
                "KubeletNotReady",
                "missing node capacity for resources: cpu",
            ),
            (
                "shutting down",
                shutting_down,
                "False",
                "KubeletNotReady",
                "node is shutting down",
            ),
        ];
        for (name, snap, status, reason, message) in cases {
            let s = compute_node_status(&snap, None, t(0));
            let r = ready(&s);
            assert_eq!(r.status, status, "{name}");
            assert_eq!(r.reason.as_deref(), Some(reason), "{name}");
            assert_eq!(r.message.as_deref(), Some(message), "{name}");
            // Ready is always last, after the three pressure conditions.
            let kinds: Vec<_> = s
                .conditions
                .as_ref()
                .unwrap()
                .iter()
                .map(|c| c.type_.as_str())
                .collect();
            assert_eq!(kinds, OWN_CONDITIONS, "{name}");
        }
        let mut two = snapshot(runtime_up(false));
        two.unhealthy = vec![("PLEG".into(), "stuck".into())];
        let s = compute_node_status(&two, None, t(0));
        assert!(
            ready(&s)
                .message
                .as_deref()
                .unwrap()
                .starts_with("[container runtime network not ready")
        );
        assert!(
            ready(&s)
                .message
                .as_deref()
                .unwrap()
                .ends_with(", PLEG is not healthy: stuck]")
        );
    }

    #[test]
    fn transition_times_move_only_on_a_change() {
        let first = compute_node_status(&snapshot(runtime_up(false)), None, t(0));
        let same = compute_node_status(&snapshot(runtime_up(false)), Some(&first), t(10));
        assert_eq!(ready(&same).last_transition_time, Some(Time(t(0))));
        assert_eq!(ready(&same).last_heartbeat_time, Some(Time(t(10))));
        assert!(!status_changed(&first, &same), "only the heartbeat moved");
        let flipped = compute_node_status(&snapshot(runtime_up(true)), Some(&same), t(20));
        assert_eq!(ready(&flipped).last_transition_time, Some(Time(t(20))));
        assert!(status_changed(&same, &flipped));
    }

    #[test]
    fn the_rest_of_the_status() {
        let mut snap = snapshot(runtime_up(true));
        snap.images = (0..4)
            .map(|i| ImageEntry {
                repo_tags: (0..4).map(|n| format!("img{i}:t{n}")).collect(),
                repo_digests: vec![format!("img{i}@sha256:{i}")],
                size_bytes: i * 100,
            })
            .collect();
        snap.max_images = 2;
        let s = compute_node_status(&snap, None, t(0));
        let addrs: Vec<_> = s
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(addrs, [("InternalIP", "10.0.0.5"), ("Hostname", "n1")]);
        let images = s.images.as_ref().unwrap();
        assert_eq!(images.len(), 2);
        assert_eq!(images[0].size_bytes, Some(300));
        let names = images[0].names.as_ref().unwrap();
        assert_eq!(names.len(), 5);
        assert_eq!(names[0], "img3@sha256:3");
        let info = s.node_info.as_ref().unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.boot_id, "b1");
        assert!(info.kubelet_version.starts_with("v1.37.0+deckhand-"));
        assert_eq!(
            s.daemon_endpoints
                .as_ref()
                .unwrap()
                .kubelet_endpoint
                .as_ref()
                .unwrap()
                .port,
            10250
        );
        assert_eq!(s.capacity.as_ref().unwrap()["memory"].0, "8Gi");
        assert_eq!(s.allocatable.as_ref().unwrap()["memory"].0, "8092Mi");
        // containerd 1.6 reports neither handlers nor features.
        assert_eq!((s.runtime_handlers, s.features), (None, None));
    }

    /// `volumesInUse`: the volumes pods are to mount, and those mounted that the controller
    /// lists attached (from the Node as last read), sorted; a change is sent.
    #[test]
    fn volumes_in_use_are_reported_and_a_change_is_sent() {
        let mut snap = snapshot(runtime_up(true));
        let (a, b) = ("kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b");
        snap.volumes.desired.insert(b.to_string());
        snap.volumes.mounted.insert(a.to_string());
        let known = compute_node_status(&snap, None, t(0));
        assert_eq!(known.volumes_in_use, Some(vec![b.to_string()]));
        let attached = NodeStatus {
            volumes_attached: Some(vec![k8s_openapi::api::core::v1::AttachedVolume {
                name: a.to_string(),
                device_path: String::new(),
            }]),
            ..known.clone()
        };
        let ours = compute_node_status(&snap, Some(&attached), t(1));
        assert_eq!(
            ours.volumes_in_use,
            Some(vec![a.to_string(), b.to_string()])
        );
        assert!(
            status_changed(&known, &ours),
            "a volume newly in use is sent"
        );
        snap.volumes = VolumeReport::default();
        let none = compute_node_status(&snap, Some(&attached), t(2));
        assert_eq!(none.volumes_in_use, Some(vec![]));
        assert!(
            status_changed(&ours, &none),
            "a volume no longer in use is sent"
        );
        let patch = super::super::registration::status_patch(&none);
        assert_eq!(patch["status"]["volumesInUse"], serde_json::json!([]));
    }

    #[test]
    fn the_runtimes_handlers_and_features_as_upstream_writes_them() {
        use crate::clients::cri::proto::{RuntimeFeatures, RuntimeHandler, RuntimeHandlerFeatures};
        let cri = [
            RuntimeHandler {
                name: String::new(),
                features: Some(RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            },
            RuntimeHandler {
                name: "runc".into(),
                features: None,
            },
        ];
        let RuntimeState::Up {
            version,
            conditions,
            ..
        } = runtime_up(true)
        else {
            unreachable!()
        };
        let snap = snapshot(RuntimeState::Up {
            version,
            conditions,
            handlers: runtime_handlers(&cri),
            features: node_features(Some(&RuntimeFeatures {
                supplemental_groups_policy: true,
                user_namespaces_host_network: false,
            })),
        });
        let s = compute_node_status(&snap, None, t(0));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["runtimeHandlers"],
            serde_json::json!([
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": false}},
            ])
        );
        assert_eq!(
            json["features"],
            serde_json::json!({"supplementalGroupsPolicy": true})
        );
        // The features the agent declares, whatever the runtime says; a Node without them (an
        // agent before this one) is sent them.
        assert_eq!(
            json["declaredFeatures"],
            serde_json::json!([
                "InPlacePodLevelResourcesVerticalScaling",
                "InPlacePodVerticalScalingInitContainers",
                "RestartAllContainersOnContainerExits"
            ])
        );
        let mut undeclared = s.clone();
        undeclared.declared_features = None;
        assert!(status_changed(&undeclared, &s));
        // A change of them is sent; a runtime that does not answer leaves the known ones.
        let old = compute_node_status(&snapshot(runtime_up(true)), None, t(0));
        assert!(status_changed(&old, &s));
        let down = compute_node_status(&snapshot(RuntimeState::Down), None, t(0));
        assert_eq!(down.runtime_handlers, None);
    }

    #[test]
    fn quantities_compare_by_value_and_foreign_conditions_are_ignored() {
        let ours = compute_node_status(&snapshot(runtime_up(true)), None, t(0));
        let mut known = ours.clone();
        known.capacity.as_mut().unwrap().insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8589934592".into()),
        );
        known.conditions.as_mut().unwrap().insert(
            0,
            NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                ..Default::default()
            },
        );
        assert!(!status_changed(&known, &ours));
        known.addresses.as_mut().unwrap().pop();
        assert!(status_changed(&known, &ours));
    }
}
