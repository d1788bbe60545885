//! Probes: one worker per running container and probe kind (startup, liveness, readiness).
//!
//! (Interface in place; the workers and handlers are being written.)
//!
//! The pod worker tells the manager after every sync which containers run
//! ([`ProbeManager::sync_pod`]); the manager keeps the results, wakes the pod's worker through
//! `wake` when a result changes, and reports liveness and startup failures
//! ([`ProbeManager::unhealthy`]) for the decision logic to kill and restart the container.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cri::RuntimeService;
use crate::runtime::observed::ObservedPod;

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

/// Runs the probes of every pod on the node.
#[derive(Clone)]
pub struct ProbeManager<R> {
    rt: R,
    wake: mpsc::UnboundedSender<String>,
    cancel: CancellationToken,
    host_ip: Option<String>,
}

impl<R: RuntimeService> ProbeManager<R> {
    /// `wake` receives a pod UID whenever a probe result of that pod changes.
    pub fn new(
        rt: R,
        wake: mpsc::UnboundedSender<String>,
        host_ip: Option<String>,
        cancel: CancellationToken,
    ) -> Self {
        ProbeManager {
            rt,
            wake,
            cancel,
            host_ip,
        }
    }

    /// Starts workers for running containers of `pod` that have probes, and stops the workers
    /// of containers that no longer run.
    pub fn sync_pod(&self, pod: &Arc<Pod>, observed: &ObservedPod) {
        let _ = (pod, observed, &self.rt, &self.wake, &self.cancel, &self.host_ip);
    }

    /// Stops every worker of a pod that is gone.
    pub fn remove_pod(&self, uid: &str) {
        let _ = uid;
    }

    /// Probe results by container name, for the pod's status.
    pub fn results(&self, uid: &str) -> HashMap<String, ProbeView> {
        let _ = uid;
        HashMap::new()
    }

    /// Running container instances (by container ID) that failed liveness or startup.
    pub fn unhealthy(&self, uid: &str) -> HashMap<String, Unhealthy> {
        let _ = uid;
        HashMap::new()
    }

    /// Prometheus text for `/metrics/probes` (`prober_probe_total`).
    pub fn render_metrics(&self) -> String {
        String::new()
    }
}
