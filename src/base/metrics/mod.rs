//! `/metrics`: the node agent's metrics under upstream's kubelet names, label names and
//! buckets, so dashboards and alerts written for the kubelet work unchanged, plus the process
//! metrics every Prometheus client exports.
//!
//! The families live in one process-wide [`KUBELET`] value, as upstream's do in its metrics
//! package: the CRI client, the PLEG, the pod workers and the executor record into it without
//! being handed a registry. Gauges that describe current state (running pods and containers)
//! are computed when the page is rendered, from the runtime cache.

pub(crate) mod family;
pub(crate) mod process;

use std::sync::LazyLock;
use std::time::Duration;

pub(crate) use family::Family;
use family::{DEFAULT_BUCKETS, exponential_buckets};

/// Upstream's buckets for pod start-up durations, in seconds.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Upstream's buckets for storage operations, in seconds.
const STORAGE_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// The kubelet's metric families that Deckhand records.
pub(crate) struct KubeletMetrics {
    pub runtime_operations: Family,
    pub runtime_operations_duration: Family,
    pub runtime_operations_errors: Family,
    pub pod_worker_duration: Family,
    pub pod_start_duration: Family,
    pub pod_start_sli_duration: Family,
    pub pleg_relist_duration: Family,
    pub pleg_relist_interval: Family,
    pub started_containers: Family,
    pub started_containers_errors: Family,
    pub storage_operation_duration: Family,
    pub evictions: Family,
    pub http_requests: Family,
    pub http_requests_duration: Family,
    pub http_inflight_requests: Family,
    pub image_garbage_collected: Family,
    pub garbage_collected: Family,
    pub log_rotations: Family,
    pub dra_operations_duration: Family,
    pub dra_grpc_operations_duration: Family,
    pub dra_node_prepare_skips: Family,
    pub dra_node_unprepare_skips: Family,
    /// Deckhand's own: panics caught in supervised background tasks.
    pub task_panics: Family,
}

/// The process-wide families.
pub(crate) static KUBELET: LazyLock<KubeletMetrics> = LazyLock::new(|| KubeletMetrics {
    runtime_operations: Family::counter(
        "kubelet_runtime_operations_total",
        "Calls to the container runtime, by operation.",
        &["operation_type"],
    ),
    runtime_operations_duration: Family::histogram(
        "kubelet_runtime_operations_duration_seconds",
        "How long calls to the container runtime took, by operation.",
        &["operation_type"],
        exponential_buckets(0.005, 2.5, 14),
    ),
    runtime_operations_errors: Family::counter(
        "kubelet_runtime_operations_errors_total",
        "Calls to the container runtime that failed, by operation.",
        &["operation_type"],
    ),
    pod_worker_duration: Family::histogram(
        "kubelet_pod_worker_duration_seconds",
        "How long one sync of a pod by its worker took, by kind of sync (create, update, sync, kill).",
        &["operation_type"],
        DEFAULT_BUCKETS.to_vec(),
    ),
    pod_start_duration: Family::histogram(
        "kubelet_pod_start_duration_seconds",
        "From the node agent first seeing a pod to the pod running.",
        &[],
        POD_START_BUCKETS.to_vec(),
    ),
    pod_start_sli_duration: Family::histogram(
        "kubelet_pod_start_sli_duration_seconds",
        "From a pod's creation to all its containers started and seen running, less the time \
         spent pulling images and running init containers (the pod start-up SLI).",
        &[],
        POD_START_BUCKETS.to_vec(),
    ),
    pleg_relist_duration: Family::histogram(
        "kubelet_pleg_relist_duration_seconds",
        "How long one relist of the container runtime took.",
        &[],
        DEFAULT_BUCKETS.to_vec(),
    ),
    pleg_relist_interval: Family::histogram(
        "kubelet_pleg_relist_interval_seconds",
        "Time between the starts of two relists of the container runtime.",
        &[],
        DEFAULT_BUCKETS.to_vec(),
    ),
    started_containers: Family::counter(
        "kubelet_started_containers_total",
        "Containers started, by type (container, init_container).",
        &["container_type"],
    ),
    started_containers_errors: Family::counter(
        "kubelet_started_containers_errors_total",
        "Containers that could not be started, by type and error code.",
        &["container_type", "code"],
    ),
    storage_operation_duration: Family::histogram(
        "storage_operation_duration_seconds",
        "How long each volume operation took, by plugin, operation (volume_mount: one per \
         set-up attempt of a volume), status (success, fail-unknown) and migrated (always \
         false); its _count counts the attempts.",
        &["volume_plugin", "operation_name", "status", "migrated"],
        STORAGE_BUCKETS.to_vec(),
    ),
    evictions: Family::counter(
        "kubelet_evictions",
        "Pods evicted, by the eviction signal that caused it.",
        &["eviction_signal"],
    ),
    http_requests: Family::counter(
        "kubelet_http_requests_total",
        "HTTP requests served, by method, first path segment, server type and whether long-running.",
        HTTP_LABELS,
    ),
    http_requests_duration: Family::histogram(
        "kubelet_http_requests_duration_seconds",
        "How long HTTP requests took to serve.",
        HTTP_LABELS,
        DEFAULT_BUCKETS.to_vec(),
    ),
    http_inflight_requests: Family::gauge(
        "kubelet_http_inflight_requests",
        "HTTP requests being served now.",
        HTTP_LABELS,
    ),
    image_garbage_collected: Family::counter(
        "kubelet_image_garbage_collected_total",
        "Images removed by image GC, by reason (space: the image filesystem was above the high threshold, or under disk pressure the eviction manager reclaimed unused images; age: unused longer than imageMaximumGCAge).",
        &["reason"],
    ),
    garbage_collected: Family::counter(
        "deckhand_garbage_collected_total",
        "What the container GC removed, by kind (container, sandbox, log_file).",
        &["kind"],
    ),
    task_panics: Family::counter(
        "deckhand_task_panics_total",
        "Panics caught in the agent's background tasks (Lease and node status, status writer, event sink, eviction, GC, mirror pods, certificate rotation), by task; each is started again after a back-off.",
        &["task"],
    ),
    log_rotations: Family::counter(
        "deckhand_container_log_rotations_total",
        "Container log rotations, by result (rotated, failed).",
        &["result"],
    ),
    // The DRA families' labels are in the order client_golang prints them (sorted by name).
    dra_operations_duration: Family::histogram(
        "dra_operations_duration_seconds",
        "How long preparing (when its sandbox is made) or unpreparing (when it stops) all the \
         ResourceClaims of one pod took, by operation (PrepareResources, UnprepareResources) \
         and whether it failed; a pod without claims counts too.",
        &["is_error", "operation_name"],
        DRA_BUCKETS.to_vec(),
    ),
    dra_grpc_operations_duration: Family::histogram(
        "dra_grpc_operations_duration_seconds",
        "How long each call to a DRA driver took (connecting included), by driver, full gRPC \
         method name and gRPC status code.",
        &["driver_name", "grpc_status_code", "method_name"],
        DRA_BUCKETS.to_vec(),
    ),
    dra_node_prepare_skips: Family::counter(
        "dra_node_prepare_skips_total",
        "NodePrepareResources calls not made because the allocation's skipNodeOperations said so, by driver.",
        &["driver_name"],
    ),
    dra_node_unprepare_skips: Family::counter(
        "dra_node_unprepare_skips_total",
        "NodeUnprepareResources calls not made because the allocation's skipNodeOperations said so, by driver.",
        &["driver_name"],
    ),
});

/// Upstream's buckets for DRA durations: 0.1 s to 40 s (just under a driver call's 45 s
/// deadline) in 15 equal factors, client_golang's `ExponentialBucketsRange(.1, 40, 15)` as Go
/// computes it. Written out because Go's `math.Pow` and the C library's `pow` differ in the
/// last bit for six of them, which would print other `le` values.
#[rustfmt::skip]
const DRA_BUCKETS: &[f64] = &[
    0.1,
    0.1534127404634391,
    0.23535468936502524,
    0.36106407876409946,
    0.5539182980610752,
    0.849781240983936,
    1.303672689737678,
    1.9999999999999993,
    3.0682548092687805,
    4.7070937873005025,
    7.221281575281985,
    11.078365961221499,
    16.995624819678714,
    26.07345379475354,
    39.99999999999997,
];

const HTTP_LABELS: &[&str] = &["method", "path", "server_type", "long_running"];

/// Paths the node agent serves, by their first segment; anything else is `other`.
const KNOWN_PATHS: &[&str] = &[
    "pods",
    "runningpods",
    "healthz",
    "metrics",
    "stats",
    "spec",
    "configz",
    "containerLogs",
    "logs",
    "exec",
    "attach",
    "portForward",
    "run",
    "debug",
];

/// Upstream's `path` label: the first segment of the path, or two for `/metrics/…`, and
/// `other` for paths the agent does not serve, so a client asking for random paths cannot
/// grow the label's values.
pub(crate) fn http_path_bucket(path: &str) -> String {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or_default();
    if !KNOWN_PATHS.contains(&first) {
        return "other".into();
    }
    match (first, parts.next()) {
        ("metrics", Some(second @ ("cadvisor" | "probes" | "resource" | "events"))) => {
            format!("metrics/{second}")
        }
        _ => first.to_string(),
    }
}

/// Upstream's `method` label: the usual methods as they are, anything else `other`.
pub(crate) fn http_method_bucket(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        _ => "other",
    }
}

/// Upstream's `operation_type` for a CRI method (`RunPodSandbox` → `run_podsandbox`).
pub(crate) fn operation_type(method: &str) -> &str {
    match method {
        "Version" => "version",
        "Status" => "status",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "UpdateContainerResources" => "update_container",
        "ReopenContainerLog" => "reopen_container_log",
        "ExecSync" => "exec_sync",
        "Exec" => "exec",
        "Attach" => "attach",
        "PortForward" => "port_forward",
        "ContainerStats" => "container_stats",
        "ListContainerStats" => "list_container_stats",
        "PodSandboxStats" => "podsandbox_stats",
        "ListPodSandboxStats" => "list_podsandbox_stats",
        "UpdateRuntimeConfig" => "update_runtime_config",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        "GetContainerEvents" => "get_container_events",
        other => other,
    }
}

/// Records one CRI call: upstream counts every call, times it, and counts failures.
pub(crate) fn record_runtime_call(method: &str, took: Duration, ok: bool) {
    let op = [operation_type(method)];
    KUBELET.runtime_operations.inc(&op);
    KUBELET
        .runtime_operations_duration
        .observe(&op, took.as_secs_f64());
    if !ok {
        KUBELET.runtime_operations_errors.inc(&op);
    }
}

/// What the page needs besides the recorded families: current state, counted at render time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CurrentState {
    pub node_name: String,
    /// Pods with a ready sandbox.
    pub running_pods: u64,
    /// Containers by state: `created`, `running`, `exited`, `unknown`.
    pub containers: [(&'static str, u64); 4],
}

/// The whole `/metrics` page: the kubelet families, the current-state gauges, the process
/// metrics, then `extra` (Deckhand's own counters), in Prometheus' text format.
pub(crate) fn render(state: &CurrentState, extra: &str) -> String {
    let mut out = String::new();
    let node_name = Family::gauge(
        "kubelet_node_name",
        "The node's name; the value is always 1.",
        &["node"],
    );
    node_name.set(&[&state.node_name], 1.0);
    node_name.render(&mut out);
    let running_pods = Family::gauge(
        "kubelet_running_pods",
        "Pods that have a ready sandbox.",
        &[],
    );
    running_pods.set(&[], state.running_pods as f64);
    running_pods.render(&mut out);
    let running_containers = Family::gauge(
        "kubelet_running_containers",
        "Containers known to the runtime, by state.",
        &["container_state"],
    );
    for (s, n) in state.containers {
        running_containers.set(&[s], n as f64);
    }
    running_containers.render(&mut out);
    let k = &*KUBELET;
    for f in [
        &k.runtime_operations,
        &k.runtime_operations_duration,
        &k.runtime_operations_errors,
        &k.pod_worker_duration,
        &k.pod_start_duration,
        &k.pod_start_sli_duration,
        &k.pleg_relist_duration,
        &k.pleg_relist_interval,
        &k.started_containers,
        &k.started_containers_errors,
        &k.storage_operation_duration,
        &k.evictions,
        &k.http_requests,
        &k.http_requests_duration,
        &k.http_inflight_requests,
        &k.image_garbage_collected,
        &k.garbage_collected,
        &k.log_rotations,
        &k.dra_operations_duration,
        &k.dra_grpc_operations_duration,
        &k.dra_node_prepare_skips,
        &k.dra_node_unprepare_skips,
        &k.task_panics,
    ] {
        f.render(&mut out);
    }
    SHUTDOWN_TIMES.render(&mut out);
    process::render(&mut out);
    out.push_str(extra);
    out
}

/// The last graceful shutdown's start and end (seconds since the epoch; 0 = none), for
/// upstream's `kubelet_graceful_shutdown_{start,end}_time_seconds`. The node shutdown manager
/// sets them; they are here, with the other families, so that the page needs no manager.
pub(crate) struct ShutdownTimes {
    pub start: std::sync::atomic::AtomicU64,
    pub end: std::sync::atomic::AtomicU64,
}

pub(crate) static SHUTDOWN_TIMES: ShutdownTimes = ShutdownTimes {
    start: std::sync::atomic::AtomicU64::new(0),
    end: std::sync::atomic::AtomicU64::new(0),
};

impl ShutdownTimes {
    /// Upstream's two gauges in the text format.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let get = |a: &std::sync::atomic::AtomicU64| {
            f64::from_bits(a.load(std::sync::atomic::Ordering::Relaxed))
        };
        for (name, help, value) in [
            (
                "kubelet_graceful_shutdown_start_time_seconds",
                "Last graceful shutdown start time since unix epoch in seconds",
                get(&self.start),
            ),
            (
                "kubelet_graceful_shutdown_end_time_seconds",
                "Last graceful shutdown end time since unix epoch in seconds",
                get(&self.end),
            ),
        ] {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_methods_get_upstreams_operation_types() {
        for (method, want) in [
            ("RunPodSandbox", "run_podsandbox"),
            ("PodSandboxStatus", "podsandbox_status"),
            ("ListContainers", "list_containers"),
            ("UpdateContainerResources", "update_container"),
            ("PullImage", "pull_image"),
        ] {
            assert_eq!(operation_type(method), want);
        }
    }

    #[test]
    fn http_labels_stay_few() {
        for (path, want) in [
            ("/pods", "pods"),
            ("/pods/", "pods"),
            ("/metrics", "metrics"),
            ("/metrics/probes", "metrics/probes"),
            ("/containerLogs/ns/pod/c", "containerLogs"),
            ("/", "other"),
            ("/metrics/anything", "metrics"),
            ("/random-123", "other"),
        ] {
            assert_eq!(http_path_bucket(path), want, "{path}");
        }
        assert_eq!(http_method_bucket("BREW"), "other");
    }

    #[test]
    fn the_page_has_upstreams_names_and_current_state() {
        record_runtime_call("Version", Duration::from_millis(3), true);
        record_runtime_call("ContainerStatus", Duration::from_millis(3), false);
        let page = render(
            &CurrentState {
                node_name: "n1".into(),
                running_pods: 2,
                containers: [
                    ("created", 0),
                    ("running", 3),
                    ("exited", 1),
                    ("unknown", 0),
                ],
            },
            "# HELP deckhand_x X.\n# TYPE deckhand_x counter\ndeckhand_x 1\n",
        );
        for want in [
            "kubelet_node_name{node=\"n1\"} 1\n",
            "kubelet_running_pods 2\n",
            "kubelet_running_containers{container_state=\"running\"} 3\n",
            "kubelet_runtime_operations_total{operation_type=\"version\"}",
            "kubelet_runtime_operations_errors_total{operation_type=\"container_status\"}",
            "# TYPE kubelet_runtime_operations_duration_seconds histogram\n",
            "# TYPE kubelet_evictions counter\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "deckhand_x 1\n",
        ] {
            assert!(page.contains(want), "{want:?} missing from:\n{page}");
        }
    }
}
