//! What DRA drivers last said of their devices' health (upstream's `healthInfoCache`), and
//! how a container's claims read in its status (`allocatedResourcesStatus`, upstream's
//! `UpdateAllocatedResourcesStatus`). Pure: the stream that feeds it is `health_watch.rs`.
//!
//! A report holds for the device's `health_check_timeout_seconds` (30 s when the driver gives
//! none); after that the device reads `Unknown` until the driver reports it again. A device
//! the driver stops reporting is dropped once its report times out, so the cache holds what
//! the drivers keep reporting and never more than [`MAX_DEVICES_PER_DRIVER`] per driver.
//! Unlike upstream, the cache is not checkpointed: after a restart every device reads
//! `Unknown` until its driver's stream sends the next report (drivers send one at once).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ResourceHealth, ResourceStatus};
use tokio::time::Instant;

use super::state::ClaimInfo;

/// How long a report holds when the driver gives no timeout (upstream's
/// `DefaultHealthTimeout`).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most devices kept per driver (upstream's `maxDevicesPerDriver`): a driver reporting
/// more cannot make the node hold more.
pub(crate) const MAX_DEVICES_PER_DRIVER: usize = 16_384;
/// The longest message kept for a device, in bytes (the API's `ResourceHealthMessageMaxLength`).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

/// A device's health as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    Healthy,
    Unhealthy,
    Unknown,
}

impl Health {
    /// The protocol's `HealthStatus` number (anything unknown is `Unknown`).
    pub(crate) fn from_wire(value: i32) -> Health {
        match value {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
            Health::Unknown => "Unknown",
        }
    }
}

/// One device in a driver's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    pub pool: String,
    pub device: String,
    pub health: Health,
    /// `None`: the default timeout (the driver gave 0 or less).
    pub timeout: Option<Duration>,
    /// The driver's words on it (empty: none).
    pub message: String,
}

/// A device's last report and when it arrived.
#[derive(Debug, Clone)]
struct Entry {
    health: Health,
    message: String,
    timeout: Duration,
    received: Instant,
}

/// A device's health as read now, and the driver's message while its report holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reading {
    pub health: Health,
    pub message: String,
}

impl Reading {
    const UNKNOWN: Reading = Reading {
        health: Health::Unknown,
        message: String::new(),
    };
}

/// The message cut to [`MAX_MESSAGE_BYTES`] with `...` at the end, as upstream's
/// `truncateHealthMessage`, but never inside a character.
pub(crate) fn truncate_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// The drivers' last reports, by driver and then `pool/device`.
#[derive(Debug, Default)]
pub(crate) struct HealthCache {
    drivers: HashMap<String, BTreeMap<(String, String), Entry>>,
}

/// What one report changed: the devices (pool, device) whose health reads differently now,
/// and how many new devices were left out for the cap.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    pub devices: Vec<(String, String)>,
    pub ignored: usize,
}

impl HealthCache {
    /// Takes a driver's report: known devices are updated, new ones added up to the cap, and
    /// those the report leaves out are dropped once their last report timed out (a change
    /// when they did not read `Unknown` already).
    pub(crate) fn update(&mut self, driver: &str, reports: Vec<Report>, now: Instant) -> Changes {
        let devices = self.drivers.entry(driver.to_string()).or_default();
        let mut changes = Changes::default();
        let mut reported = std::collections::BTreeSet::new();
        for report in reports {
            let key = (report.pool, report.device);
            reported.insert(key.clone());
            let timeout = report.timeout.unwrap_or(DEFAULT_TIMEOUT);
            let message = truncate_message(report.message);
            let before = devices.get(&key);
            if before.is_none() && devices.len() >= MAX_DEVICES_PER_DRIVER {
                changes.ignored += 1;
                continue;
            }
            let same = |e: &Entry| {
                e.health == report.health && e.timeout == timeout && e.message == message
            };
            if !before.is_some_and(same) {
                changes.devices.push(key.clone());
            }
            let entry = Entry {
                health: report.health,
                message,
                timeout,
                received: now,
            };
            devices.insert(key, entry);
        }
        devices.retain(|key, entry| {
            let keep =
                reported.contains(key) || now.duration_since(entry.received) <= entry.timeout;
            if !keep && entry.health != Health::Unknown {
                changes.devices.push(key.clone());
            }
            keep
        });
        changes
    }

    /// The device's health now: its last report while that holds, else `Unknown` without
    /// a message.
    pub(crate) fn get(&self, driver: &str, pool: &str, device: &str, now: Instant) -> Reading {
        self.drivers
            .get(driver)
            .and_then(|d| d.get(&(pool.to_string(), device.to_string())))
            .filter(|e| now.duration_since(e.received) <= e.timeout)
            .map_or(Reading::UNKNOWN, |e| Reading {
                health: e.health,
                message: e.message.clone(),
            })
    }

    /// Forgets a driver (its stream ended, or it went away): its devices read `Unknown`.
    /// Returns the devices that read otherwise before.
    pub(crate) fn clear_driver(&mut self, driver: &str, now: Instant) -> Vec<(String, String)> {
        let Some(devices) = self.drivers.remove(driver) else {
            return Vec::new();
        };
        devices
            .into_iter()
            .filter(|(_, e)| {
                e.health != Health::Unknown && now.duration_since(e.received) <= e.timeout
            })
            .map(|(key, _)| key)
            .collect()
    }
}

/// Whether a device prepared for `device_requests` serves the container's `request` (empty:
/// the whole claim; a device with no request names serves every request): the requests'
/// base names compare, `req/sub` reading as `req`, as upstream's `BaseRequestRef`.
fn serves(device_requests: &[String], request: &str) -> bool {
    let base = |r: &str| r.split('/').next().unwrap_or_default().to_string();
    request.is_empty()
        || device_requests.is_empty()
        || device_requests.iter().any(|d| base(d) == base(request))
}

/// The status entry of one claim a container uses: `claim:<name>` or
/// `claim:<name>/<request>` (the names in the pod's spec), one resource per device the claim's
/// drivers prepared for the request, its ID the device's first CDI ID or else
/// `<driver>/<pool>/<device>`, each ID once, with the driver's message when it gave one.
/// `None` when no device is prepared.
pub(crate) fn claim_status(
    pod_claim: &str,
    request: &str,
    info: &ClaimInfo,
    health: &dyn Fn(&str, &str, &str) -> Reading,
) -> Option<ResourceStatus> {
    let mut resources: Vec<ResourceHealth> = Vec::new();
    for (driver, state) in &info.drivers {
        for device in state
            .devices
            .iter()
            .filter(|d| serves(&d.request_names, request))
        {
            let resource_id =
                device.cdi_device_ids.first().cloned().unwrap_or_else(|| {
                    format!("{driver}/{}/{}", device.pool_name, device.device_name)
                });
            if resources.iter().any(|r| r.resource_id == resource_id) {
                continue;
            }
            let read = health(driver, &device.pool_name, &device.device_name);
            resources.push(ResourceHealth {
                health: Some(read.health.as_str().to_string()),
                message: (!read.message.is_empty()).then_some(read.message),
                resource_id,
            });
        }
    }
    if resources.is_empty() {
        return None;
    }
    let name = if request.is_empty() {
        format!("claim:{pod_claim}")
    } else {
        format!("claim:{pod_claim}/{request}")
    };
    Some(ResourceStatus {
        name,
        resources: Some(resources),
    })
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
