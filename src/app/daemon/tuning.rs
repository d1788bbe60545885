//! Knobs that are not part of the upstream configuration: the crash-loop back-off, the PLEG
//! period and the end-to-end tests' shorter periods and fault injection, read from the
//! environment once at start.

use std::time::Duration;

use crate::config::Config;
use crate::kubelet::pleg::PlegConfig;
use crate::kubelet::runtime::backoff::BackoffPolicy;

/// Knobs that are not part of the upstream configuration; tests shorten them.
#[derive(Clone, Debug, Default)]
pub struct Tuning {
    pub backoff: BackoffPolicy,
    pub pleg: PlegConfig,
    /// `DECKHAND_TEST_PANIC_POD`: a pod name whose first sync panics (fault injection for the
    /// end-to-end tests of worker supervision; never set in production).
    pub panic_pod: Option<String>,
    /// `DECKHAND_TEST_PANIC_TASK`: a background task (`node-status`, `event-sink`, ...) whose
    /// first run panics (fault injection for the end-to-end test of task supervision; never
    /// set in production).
    pub panic_task: Option<String>,
    /// `DECKHAND_TEST_CERT_ROTATE_AFTER`: rotate the client certificate this long after each
    /// one is taken into use instead of at 70-90 % of its life (end-to-end tests of rotation,
    /// whose certificates live for a year; never set in production).
    pub cert_rotate_after: Option<Duration>,
    /// `DECKHAND_CONTAINER_GC_PERIOD`, `DECKHAND_IMAGE_GC_PERIOD`,
    /// `DECKHAND_CONTAINER_LOG_MONITOR_INTERVAL`: shorter housekeeping periods for the
    /// end-to-end tests (upstream's 1m, 5m and `containerLogMonitorInterval`).
    pub container_gc_period: Option<Duration>,
    pub image_gc_period: Option<Duration>,
    pub log_monitor_interval: Option<Duration>,
    /// `DECKHAND_EVICTION_MONITORING_PERIOD`: how often the eviction manager looks (upstream's
    /// `evictionMonitoringPeriod`, 10 s), shorter for the end-to-end tests.
    pub eviction_monitoring_period: Option<Duration>,
    /// `DECKHAND_TEST_PROC_SYS`: where the kernel tunables `protectKernelDefaults` checks are
    /// read (instead of `/proc/sys`), so the end-to-end tests can show a refusal without
    /// touching the host's settings; never set in production.
    pub proc_sys: Option<std::path::PathBuf>,
}

/// A test knob given in the environment is malformed.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {name}: {reason}")]
pub struct TuningError {
    pub name: &'static str,
    pub reason: String,
}

fn env_duration(name: &'static str) -> Result<Option<Duration>, TuningError> {
    match std::env::var(name) {
        Ok(v) => crate::config::duration::parse_go_duration(&v)
            .map(Some)
            .map_err(|e| TuningError {
                name,
                reason: e.to_string(),
            }),
        Err(_) => Ok(None),
    }
}

impl Tuning {
    /// Upstream's values, with `crashLoopBackOff.maxContainerRestartPeriod` from the config and
    /// three knobs for tests that upstream does not expose: `DECKHAND_BACKOFF_INITIAL`,
    /// `DECKHAND_BACKOFF_MAX` and `DECKHAND_RELIST_PERIOD` (Go durations).
    pub fn from_config_and_env(config: &Config) -> Result<Tuning, TuningError> {
        let mut t = Tuning::default();
        t.backoff.max = config.crash_loop_max_backoff;
        if let Some(d) = env_duration("DECKHAND_BACKOFF_INITIAL")? {
            t.backoff.initial = d;
        }
        if let Some(d) = env_duration("DECKHAND_BACKOFF_MAX")? {
            t.backoff.max = d;
        }
        if let Some(d) = env_duration("DECKHAND_RELIST_PERIOD")? {
            if d.is_zero() {
                return Err(TuningError {
                    name: "DECKHAND_RELIST_PERIOD",
                    reason: "must be more than zero".into(),
                });
            }
            t.pleg.period = d;
        }
        t.cert_rotate_after = env_duration("DECKHAND_TEST_CERT_ROTATE_AFTER")?;
        for (name, slot) in [
            ("DECKHAND_CONTAINER_GC_PERIOD", &mut t.container_gc_period),
            ("DECKHAND_IMAGE_GC_PERIOD", &mut t.image_gc_period),
            (
                "DECKHAND_CONTAINER_LOG_MONITOR_INTERVAL",
                &mut t.log_monitor_interval,
            ),
            (
                "DECKHAND_EVICTION_MONITORING_PERIOD",
                &mut t.eviction_monitoring_period,
            ),
        ] {
            *slot = env_duration(name)?;
            if slot.is_some_and(|d| d.is_zero()) {
                return Err(TuningError {
                    name,
                    reason: "must be more than zero".into(),
                });
            }
        }
        t.proc_sys = std::env::var_os("DECKHAND_TEST_PROC_SYS")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from);
        t.panic_pod = std::env::var("DECKHAND_TEST_PANIC_POD")
            .ok()
            .filter(|v| !v.is_empty());
        t.panic_task = std::env::var("DECKHAND_TEST_PANIC_TASK")
            .ok()
            .filter(|v| !v.is_empty());
        Ok(t)
    }
}
