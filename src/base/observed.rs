//! What the runtime reports about one pod, reduced to what decisions need.
//!
//! Built from CRI answers by the inspector (`runtime::inspect`); consumed by the pure
//! `compute_pod_actions` and by the status computation. Plain data: easy to write in tables.

use std::time::SystemTime;

/// State of a sandbox, as CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// One pod sandbox of the pod.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedSandbox {
    pub id: String,
    pub attempt: u32,
    pub state: SandboxState,
    /// Nanoseconds since the epoch, as CRI reports creation times.
    pub created_at: i64,
    /// The pod's IP in this sandbox, when it has its own network.
    pub ip: Option<String>,
    pub additional_ips: Vec<String>,
    /// True when the sandbox shares the node's network namespace.
    pub host_network: bool,
}

/// State of a container, as CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One container instance of the pod (every restart is a new instance).
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedContainer {
    pub id: String,
    pub sandbox_id: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// CRI metadata attempt; Deckhand sets it to the restart count.
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// Runtime's reason for the exit (`OOMKilled`, `Error`, `Completed`).
    pub reason: String,
    pub message: String,
    /// The spec hash Deckhand recorded when it created the instance.
    pub hash: Option<String>,
    /// The image as written in the spec, and the image ID the runtime resolved.
    pub image: String,
    pub image_ref: String,
    /// The pod's grace period recorded on the instance, for stopping orphans.
    pub grace_period: Option<i64>,
    /// An init container (regular or sidecar), from the container-type annotation.
    pub is_init: bool,
    /// The preStop handler recorded on the instance (JSON), for stopping orphans.
    pub pre_stop: Option<String>,
    /// The `RestartAllContainers` round the instance was made for: the ID of the exited
    /// instance that started it (`base::restart_round`); None outside of any.
    pub round: Option<String>,
}

impl ObservedContainer {
    /// When the instance finished, as a wall-clock time (for back-off and status).
    pub fn finished_time(&self) -> Option<SystemTime> {
        nanos_to_time(self.finished_at)
    }

    /// When the instance started running.
    pub fn started_time(&self) -> Option<SystemTime> {
        nanos_to_time(self.started_at)
    }
}

/// Converts CRI's nanoseconds-since-epoch (0 = unset) into a time.
pub(crate) fn nanos_to_time(nanos: i64) -> Option<SystemTime> {
    (nanos > 0).then(|| SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(nanos as u64))
}

/// Everything the runtime shows of one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedPod {
    pub sandboxes: Vec<ObservedSandbox>,
    pub containers: Vec<ObservedContainer>,
    /// Namespace and name from the sandbox labels (for orphans, whose spec is gone).
    pub names: Option<(String, String)>,
}

impl ObservedPod {
    /// The newest sandbox (highest attempt, then newest creation), which the pod runs in.
    pub fn newest_sandbox(&self) -> Option<&ObservedSandbox> {
        self.sandboxes
            .iter()
            .max_by_key(|s| (s.attempt, s.created_at))
    }

    /// Where the pod's containers are reached (probes, hooks): the IP of the given sandbox, or
    /// of the newest one, or the node's own IP when that sandbox uses the host's network.
    pub fn reachable_ip(&self, sandbox_id: Option<&str>, host_ip: Option<&str>) -> Option<String> {
        let sandbox = sandbox_id
            .and_then(|id| self.sandboxes.iter().find(|s| s.id == id))
            .or_else(|| self.newest_sandbox())?;
        if sandbox.host_network {
            host_ip.map(str::to_string)
        } else {
            sandbox.ip.clone()
        }
    }

    /// Instances of the named container, newest first.
    pub fn instances(&self, name: &str) -> Vec<&ObservedContainer> {
        let mut found: Vec<_> = self.containers.iter().filter(|c| c.name == name).collect();
        found.sort_by_key(|c| std::cmp::Reverse((c.attempt, c.created_at)));
        found
    }

    /// The newest instance of the named container.
    pub fn latest(&self, name: &str) -> Option<&ObservedContainer> {
        self.instances(name).into_iter().next()
    }

    /// True when nothing of the pod is left in the runtime.
    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }

    /// True when some container runs or some sandbox is ready.
    pub fn is_running(&self) -> bool {
        self.sandboxes
            .iter()
            .any(|s| s.state == SandboxState::Ready)
            || self
                .containers
                .iter()
                .any(|c| matches!(c.state, ContainerState::Running | ContainerState::Unknown))
    }
}
