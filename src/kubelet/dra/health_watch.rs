//! The stream of a DRA driver's device health (upstream's `NodeWatchResources` loop): opened
//! when a driver that lists `v1.DRAResourceHealth` or `v1alpha1.DRAResourceHealth` registers,
//! read into the [`super::health::HealthCache`], and closed when the driver goes. A report
//! that changes how a device reads pokes the pods whose claims hold it, so their status shows
//! it within a sync. The stream is opened again 5 s after it ends or fails (the cache for the
//! driver is cleared meanwhile: its devices read `Unknown`); a driver that answers
//! `Unimplemented` is not asked again until it registers again.
//!
//! Both versions have the same messages, so one generated set (`proto/drahealth/v1alpha1`)
//! serves both and the call names the chosen service's method path.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceStatus};
use tokio_util::sync::CancellationToken;

use super::DraManager;
use super::health::{self, Health, Report};
use crate::base::clock;
use crate::base::resync_queue::Pokes;

/// The generated messages (package `v1alpha1`).
pub(crate) mod proto {
    #![allow(unreachable_pub, clippy::all)]
    tonic::include_proto!("v1alpha1");
}

/// The health services this node reads, newest first (upstream's
/// `healthServicesSupportedByKubelet`).
pub(crate) const HEALTH_SERVICES: &[&str] = &["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];
/// How long after a stream ended or failed it is opened again (upstream's 5 s).
const REOPEN_AFTER: Duration = Duration::from_secs(5);

/// The newest health service both the driver and this node speak (pure); `None`: the driver
/// lists none, and its devices read `Unknown`.
pub(crate) fn pick_health_service(services: &[String]) -> Option<&'static str> {
    HEALTH_SERVICES
        .iter()
        .copied()
        .find(|wanted| services.iter().any(|s| s == wanted))
}

/// How a stream ended.
enum Ended {
    /// Closed by the driver or failed: open it again later.
    Again,
    /// The driver does not implement the service: stop.
    Unimplemented,
}

impl DraManager {
    /// Where health changes are told (the pod pipeline's pokes); set once.
    pub(crate) fn set_status_pokes(&self, pokes: Pokes) {
        let _ = self.inner.status_pokes.set(pokes);
    }

    /// Starts reading the driver's health stream, in place of any earlier one of the driver.
    pub(super) fn start_health_watch(&self, driver: &str, endpoint: &str, service: &'static str) {
        let stop = CancellationToken::new();
        let earlier = self
            .health_watches()
            .insert(driver.to_string(), stop.clone());
        if let Some(earlier) = earlier {
            earlier.cancel();
        }
        let (manager, driver, endpoint) = (self.clone(), driver.to_string(), endpoint.to_string());
        // Cancelled: the driver went (its health is cleared there) or registered again (the
        // new stream goes on from the reports cached).
        tokio::spawn(async move {
            tokio::select! {
                () = manager.watch(&driver, &endpoint, service) => manager.health_cleared(&driver),
                () = stop.cancelled() => {}
            }
        });
    }

    /// Stops the driver's health stream, if one runs; its devices read `Unknown`.
    pub(super) fn stop_health_watch(&self, driver: &str) {
        if let Some(stop) = self.health_watches().remove(driver) {
            stop.cancel();
        }
        self.health_cleared(driver);
    }

    fn health_watches(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, CancellationToken>> {
        self.inner
            .health_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn health_cache(&self) -> std::sync::MutexGuard<'_, health::HealthCache> {
        self.inner.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the stream and reads it, again and again, until the driver says it does not
    /// implement the service.
    async fn watch(&self, driver: &str, endpoint: &str, service: &'static str) {
        loop {
            match self.read_stream(driver, endpoint, service).await {
                Ok(Ended::Unimplemented) => {
                    tracing::info!(
                        driver,
                        service,
                        "the DRA driver does not report device health; not asking again"
                    );
                    return;
                }
                Ok(Ended::Again) => {}
                Err(status) => {
                    tracing::info!(driver, error = %status.message(), "cannot read the DRA driver's device health; trying again");
                }
            }
            self.health_cleared(driver);
            tokio::time::sleep(REOPEN_AFTER).await;
        }
    }

    /// One stream, from its opening to its end.
    async fn read_stream(
        &self,
        driver: &str,
        endpoint: &str,
        service: &'static str,
    ) -> Result<Ended, tonic::Status> {
        let channel = super::channel(endpoint)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = format!("/{service}/NodeWatchResources");
        let path = tonic::codegen::http::uri::PathAndQuery::try_from(path)
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<
            proto::NodeWatchResourcesRequest,
            proto::NodeWatchResourcesResponse,
        >::default();
        let request = tonic::Request::new(proto::NodeWatchResourcesRequest {});
        let opened = grpc.server_streaming(request, path, codec).await;
        let mut stream = match opened {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Ok(Ended::Unimplemented);
            }
            Err(status) => return Err(status),
        };
        tracing::info!(driver, service, "reading the DRA driver's device health");
        loop {
            match stream.message().await {
                Ok(Some(answer)) => self.health_reported(driver, answer),
                Ok(None) => return Ok(Ended::Again),
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    return Ok(Ended::Unimplemented);
                }
                Err(status) => return Err(status),
            }
        }
    }

    /// Takes one report into the cache and pokes the pods holding a device that reads
    /// differently now.
    fn health_reported(&self, driver: &str, answer: proto::NodeWatchResourcesResponse) {
        let reports = answer.devices.into_iter().map(report_of).collect();
        let changes = self
            .health_cache()
            .update(driver, reports, clock::instant());
        if changes.ignored > 0 {
            tracing::warn!(
                driver,
                ignored = changes.ignored,
                limit = health::MAX_DEVICES_PER_DRIVER,
                "the DRA driver reports more devices than the node keeps; the rest read Unknown"
            );
        }
        self.poke_holders(driver, &changes.devices);
    }

    /// The driver's stream ended: its devices read `Unknown` now.
    fn health_cleared(&self, driver: &str) {
        let changed = self.health_cache().clear_driver(driver, clock::instant());
        self.poke_holders(driver, &changed);
    }

    /// Pokes the pods whose claims hold one of the driver's `devices` (pool, device).
    fn poke_holders(&self, driver: &str, devices: &[(String, String)]) {
        let (Some(pokes), false) = (self.inner.status_pokes.get(), devices.is_empty()) else {
            return;
        };
        let pods: std::collections::BTreeSet<String> = {
            let cache = self.claims();
            cache
                .values()
                .filter(|info| {
                    info.drivers.get(driver).is_some_and(|state| {
                        state.devices.iter().any(|d| {
                            devices
                                .iter()
                                .any(|(p, n)| *p == d.pool_name && *n == d.device_name)
                        })
                    })
                })
                .flat_map(|info| info.pod_uids.iter().cloned())
                .collect()
        };
        if !pods.is_empty() {
            tracing::info!(
                driver,
                pods = pods.len(),
                "device health changed; updating the status of the pods holding them"
            );
        }
        for uid in pods {
            pokes.poke(&uid);
        }
    }

    /// The container's `allocatedResourcesStatus` entries for the claims its
    /// `resources.claims` names (upstream's `UpdateAllocatedResourcesStatus`): one per claim
    /// and request, with the health of each prepared device.
    pub(crate) fn resources_status(&self, pod: &Pod, container: &Container) -> Vec<ResourceStatus> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let used = container.resources.as_ref().and_then(|r| r.claims.as_ref());
        let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
        let now = clock::instant();
        let cache = self.claims();
        let health = self.health_cache();
        let read = |driver: &str, pool: &str, device: &str| health.get(driver, pool, device, now);
        let mut out = Vec::new();
        for used in used.into_iter().flatten() {
            let named = pod_claims
                .into_iter()
                .flatten()
                .find(|c| c.name == used.name)
                .and_then(|c| super::claims::claim_name(pod, c).ok().flatten());
            let Some(info) = named.and_then(|(name, _)| cache.get(&(namespace.clone(), name)))
            else {
                continue;
            };
            let request = used.request.as_deref().unwrap_or_default();
            out.extend(health::claim_status(&used.name, request, info, &read));
        }
        out
    }
}

fn report_of(device: proto::DeviceHealth) -> Report {
    let id = device.device.unwrap_or_default();
    Report {
        pool: id.pool_name,
        device: id.device_name,
        health: Health::from_wire(device.health),
        timeout: u64::try_from(device.health_check_timeout_seconds)
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
        message: device.message,
    }
}

#[cfg(test)]
#[path = "health_watch_tests.rs"]
mod tests;
