//! The timing section: how often the agent's loops run (`syncFrequency`, the static-pod
//! sources' check frequencies, `nodeStatusUpdateFrequency`, `volumeStatsAggPeriod`), how long
//! a runtime call may take (`runtimeRequestTimeout`) and the crash-loop back-off's ceiling.
//!
//! The periods are merged alike (flag, file, default) and each has a bound; they are kept
//! together so that the bounds are in one place.

use std::time::Duration;

use super::ConfigError;
use super::duration::format_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{file_duration, invalid, pick};

// Upstream kubelet (v1beta1) defaults.
pub(super) const DEFAULT_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
pub(super) const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub(super) const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub(super) const DEFAULT_SYNC_FREQUENCY: Duration = Duration::from_secs(60);
pub(super) const DEFAULT_NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_CRASH_LOOP_MAX_BACKOFF: Duration = Duration::from_secs(300);
/// `volumeStatsAggPeriod` (upstream's default; 0 turns the volume measurement off).
pub(super) const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);

/// The periods and the timeout that must be positive.
pub(super) struct Timing {
    pub runtime_request_timeout: Duration,
    pub file_check_frequency: Duration,
    pub http_check_frequency: Duration,
    pub sync_frequency: Duration,
    pub node_status_update_frequency: Duration,
}

/// The periods and the timeout: zero would make a loop spin or every runtime call fail at
/// once, so each must be greater than 0.
pub(super) fn timing(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Timing, ConfigError> {
    Ok(Timing {
        runtime_request_timeout: positive(
            flags.runtime_request_timeout,
            "--runtime-request-timeout",
            f.runtime_request_timeout.as_deref(),
            "runtimeRequestTimeout",
            DEFAULT_RUNTIME_REQUEST_TIMEOUT,
        )?,
        file_check_frequency: positive(
            flags.file_check_frequency,
            "--file-check-frequency",
            f.file_check_frequency.as_deref(),
            "fileCheckFrequency",
            DEFAULT_FILE_CHECK_FREQUENCY,
        )?,
        http_check_frequency: positive(
            flags.http_check_frequency,
            "--http-check-frequency",
            f.http_check_frequency.as_deref(),
            "httpCheckFrequency",
            DEFAULT_HTTP_CHECK_FREQUENCY,
        )?,
        sync_frequency: positive(
            flags.sync_frequency,
            "--sync-frequency",
            f.sync_frequency.as_deref(),
            "syncFrequency",
            DEFAULT_SYNC_FREQUENCY,
        )?,
        node_status_update_frequency: positive(
            flags.node_status_update_frequency,
            "--node-status-update-frequency",
            f.node_status_update_frequency.as_deref(),
            "nodeStatusUpdateFrequency",
            DEFAULT_NODE_STATUS_UPDATE_FREQUENCY,
        )?,
    })
}

/// A duration merged from flag, file and default that must be greater than 0.
fn positive(
    flag: Option<Duration>,
    flag_name: &'static str,
    file_value: Option<&str>,
    file_name: &'static str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let from_file = file_duration(file_value, file_name)?;
    let (d, o) = pick(flag, flag_name, from_file, file_name, || default);
    if d.is_zero() {
        return Err(invalid(o.name(), "must be greater than 0"));
    }
    Ok(d)
}

/// `crashLoopBackOff.maxContainerRestartPeriod`: the ceiling the restart back-off doubles up
/// to, within upstream's bounds (1s to 5m0s, the default).
pub(super) fn crash_loop_max_backoff(
    f: &KubeletConfigurationFile,
) -> Result<Duration, ConfigError> {
    let max = file_duration(
        f.crash_loop_back_off
            .as_ref()
            .and_then(|c| c.max_container_restart_period.as_deref()),
        "crashLoopBackOff.maxContainerRestartPeriod",
    )?
    .unwrap_or(DEFAULT_CRASH_LOOP_MAX_BACKOFF);
    if max < Duration::from_secs(1) || max > Duration::from_secs(300) {
        return Err(invalid(
            "crashLoopBackOff.maxContainerRestartPeriod",
            format!("{} must be between 1s and 5m0s", format_go_duration(max)),
        ));
    }
    Ok(max)
}

/// `volumeStatsAggPeriod`: any duration, zero included (zero turns the measurement off).
pub(super) fn volume_stats_agg_period(
    f: &KubeletConfigurationFile,
) -> Result<Duration, ConfigError> {
    Ok(
        file_duration(f.volume_stats_agg_period.as_deref(), "volumeStatsAggPeriod")?
            .unwrap_or(DEFAULT_VOLUME_STATS_AGG_PERIOD),
    )
}
