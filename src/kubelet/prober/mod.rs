//! Probes: one worker per running container instance and probe kind (startup, liveness,
//! readiness).
//!
//! The pod worker tells the manager after every sync which containers run
//! ([`ProbeManager::sync_pod`]); the manager starts a tokio task per probe of every running
//! instance that has none yet and stops the tasks of instances that stopped running. A task
//! probes on its own schedule (initial delay, period, timeout), counts consecutive outcomes
//! against the thresholds and reports a verdict when one is reached: ready or not, started, or
//! unhealthy. The manager keeps the verdicts, wakes the pod's worker through `wake` when one
//! changes, and reports liveness and startup failures ([`ProbeManager::unhealthy`]) for the
//! decision logic to kill and restart the container.
//!
//! The modules: [`worker`] is the per-probe state machine, independent of how a probe is
//! carried out; [`handlers`] are `exec` (CRI `ExecSync`), `httpGet`, `tcpSocket` and `grpc`;
//! [`manager`] holds the workers of every pod, their verdicts and the wiring to the pod
//! worker; [`metrics`] counts runs in `prober_probe_total`.

pub(crate) mod handlers;
pub(crate) mod manager;
pub(crate) mod metrics;
pub(crate) mod worker;

pub use manager::ProbeManager;

/// The generated gRPC health protocol (`grpc.health.v1`), for `grpc` probes and their tests.
pub mod health_proto {
    tonic::include_proto!("grpc.health.v1");
}

/// The User-Agent of HTTP and gRPC probes, as upstream sends it (`kube-probe/<major>.<minor>`
/// of the Kubernetes version the agent implements).
pub const PROBE_USER_AGENT: &str = "kube-probe/1.37";

/// What the probes say about one container's current instance. `None` = no such probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeView {
    /// Readiness: `Some(false)` until the readiness probe first succeeds.
    pub ready: Option<bool>,
    /// Startup: `Some(false)` until the startup probe succeeds.
    pub started: Option<bool>,
}

/// A container that failed its liveness or startup probe and must be killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub container_name: String,
    /// Why, for the log and the kill reason (`Container x failed liveness probe, will be restarted`).
    pub message: String,
    /// The probe's own `terminationGracePeriodSeconds`, when set.
    pub grace_override: Option<i64>,
}

/// The three kinds of probe a container may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    /// The name upstream uses in metrics and messages (`Liveness`, `Readiness`, `Startup`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }

    /// Lower-case, as in upstream's kill message (`failed liveness probe`).
    pub fn lower(self) -> &'static str {
        match self {
            ProbeKind::Startup => "startup",
            ProbeKind::Liveness => "liveness",
            ProbeKind::Readiness => "readiness",
        }
    }
}

/// The outcome of one probe run, as a handler reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The check passed.
    Success,
    /// The check passed with something worth a warning (an HTTP redirect not followed); it
    /// counts as a success, as upstream.
    Warning(String),
    /// The check failed: wrong status or exit code, refused connection, timeout.
    Failure(String),
    /// The probe could not be carried out (the runtime failed, the port name is unknown): the
    /// run says nothing about the container and is not counted toward a threshold.
    Error(String),
}

impl ProbeOutcome {
    /// The metric label of this outcome.
    pub fn metric_result(&self) -> metrics::ProbeResult {
        match self {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => metrics::ProbeResult::Successful,
            ProbeOutcome::Failure(_) => metrics::ProbeResult::Failed,
            ProbeOutcome::Error(_) => metrics::ProbeResult::Unknown,
        }
    }
}
