//! Merging flags over the config file over the defaults, and checking the result.
//!
//! Every error names where the offending value came from: the flag (`--sync-frequency`) when
//! it was given on the command line, otherwise the file's camelCase field (`syncFrequency`).
//!
//! [`build`] calls one function per section of the configuration, each in the section's
//! module (`node`, `runtime`, `timing`, `sources`, `server`, `cgroups`, `sandbox`, `gc`,
//! `logging`, `shutdown`, `eviction`, `hardening`), and assembles the [`Config`]. This module holds what
//! the sections share: [`pick`] for the precedence, the readers of the file's typed fields
//! and [`InvalidValue`].

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::duration::parse_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::{
    Config, ConfigError, cgroups, eviction, gc, hardening, logging, node, runtime, sandbox, server,
    shutdown, sources, timing,
};

/// Where a merged value came from, for naming it in errors.
#[derive(Clone, Copy)]
pub(super) struct Origin {
    flag: &'static str,
    file: &'static str,
    from_flag: bool,
}

impl Origin {
    pub(super) fn name(self) -> &'static str {
        if self.from_flag { self.flag } else { self.file }
    }
}

/// Flag beats file beats default; also reports which one won.
pub(super) fn pick<T>(
    flag: Option<T>,
    flag_name: &'static str,
    file: Option<T>,
    file_name: &'static str,
    default: impl FnOnce() -> T,
) -> (T, Origin) {
    let mut origin = Origin {
        flag: flag_name,
        file: file_name,
        from_flag: false,
    };
    let value = match (flag, file) {
        (Some(v), _) => {
            origin.from_flag = true;
            v
        }
        (None, Some(v)) => v,
        (None, None) => default(),
    };
    (value, origin)
}

/// [`ConfigError::invalid`] for a field named by a `&str` (as [`Origin::name`] gives it).
pub(super) fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(field, reason)
}

/// A duration field of the file, parsed (or `None` when absent).
pub(super) fn file_duration(
    value: Option<&str>,
    field: &str,
) -> Result<Option<Duration>, ConfigError> {
    value
        .map(|text| {
            parse_go_duration(text)
                .map_err(|e| invalid(field, format!("invalid duration {text:?}: {e}")))
        })
        .transpose()
}

/// A port field of the file: any integer in 0..=65535.
pub(super) fn file_port(value: Option<i64>, field: &str) -> Result<Option<u16>, ConfigError> {
    value
        .map(|n| u16::try_from(n).map_err(|_| invalid(field, format!("{n} is not a valid port"))))
        .transpose()
}

/// An IP address field of the file (surrounding spaces ignored).
pub(super) fn file_ip(value: Option<&str>, field: &str) -> Result<Option<IpAddr>, ConfigError> {
    value
        .map(|text| {
            text.trim()
                .parse::<IpAddr>()
                .map_err(|_| invalid(field, format!("{text:?} is not an IP address")))
        })
        .transpose()
}

/// A count in the file that must fit in `u32` and be at least `min`.
pub(super) fn file_count(
    value: Option<i64>,
    field: &str,
    min: u32,
) -> Result<Option<u32>, ConfigError> {
    value
        .map(|n| match u32::try_from(n) {
            Ok(v) if v >= min => Ok(v),
            Ok(_) => Err(invalid(field, format!("{n} must be at least {min}"))),
            Err(_) if n < 0 => Err(invalid(field, format!("{n} must be at least {min}"))),
            Err(_) => Err(invalid(field, format!("{n} is too large"))),
        })
        .transpose()
}

/// Relative paths in the config file are relative to the file's directory, as upstream.
fn resolve_file_path(config_path: Option<&Path>, value: &str) -> PathBuf {
    let path = PathBuf::from(value);
    match config_path.and_then(Path::parent) {
        Some(dir) if path.is_relative() && !value.is_empty() => dir.join(path),
        _ => path,
    }
}

/// Checks the sections in a fixed order and assembles the [`Config`]. The order is part of
/// the behaviour: when several values are wrong, the error reported is the first section's
/// (and, within a section, the first field's).
pub(super) fn build(
    flags: &Flags,
    file: Option<(&Path, &KubeletConfigurationFile)>,
    hostname: &str,
) -> Result<Config, ConfigError> {
    let empty = KubeletConfigurationFile::default();
    let (config_path, f) = match file {
        Some((path, f)) => (Some(path), f),
        None => (None, &empty),
    };
    let resolve = |p: &str| resolve_file_path(config_path, p);

    let node_name = node::node_name(flags, hostname)?;
    let locations = runtime::locations(flags, f)?;
    let timing = timing::timing(flags, f)?;
    let sources = sources::static_pod_sources(flags, f, &resolve)?;
    let ports = server::ports(flags, f)?;
    let cgroups = cgroups::cgroups(flags, f)?;
    let sandbox = sandbox::sandbox(flags, f, &resolve)?;
    let resources = cgroups::resources(flags, f, cgroups.per_qos)?;
    let images = runtime::images(flags, f)?;
    let logs = gc::container_log_limits(f)?;
    let crash_loop_max_backoff = timing::crash_loop_max_backoff(f)?;
    let credentials = node::credentials(flags, f, &locations.root_dir)?;
    check_file_only_fields(f)?;
    let logging = logging::logging(flags, f)?;
    let volume_stats_agg_period = timing::volume_stats_agg_period(f)?;
    let gc = gc::gc_settings(flags, f, &logs.max_size, logs.max_files)?;
    let shutdown = shutdown::shutdown_settings(f)?;
    let cluster = node::cluster_settings(flags, f)?;
    let reservations = node::reservations(flags, f)?;
    let server = server::server_settings(&flags.server, f, &resolve)?;
    let eviction = eviction::eviction_settings(flags, f)?;
    let hardening = hardening::hardening_settings(&flags.hardening, f)?;

    Ok(Config {
        node_name,
        node_ip: flags.node_ip,
        root_dir: locations.root_dir,
        pod_logs_dir: locations.pod_logs_dir,
        container_runtime_endpoint: locations.container_runtime_endpoint,
        image_service_endpoint: locations.image_service_endpoint,
        runtime_request_timeout: timing.runtime_request_timeout,
        image_pull_progress_deadline: images.pull_progress_deadline,
        static_pod_path: sources.static_pod_path,
        file_check_frequency: timing.file_check_frequency,
        static_pod_url: sources.static_pod_url,
        static_pod_url_header: sources.static_pod_url_header,
        http_check_frequency: timing.http_check_frequency,
        sync_frequency: timing.sync_frequency,
        address: ports.address,
        port: ports.port,
        read_only_port: ports.read_only_port,
        healthz_port: ports.healthz_port,
        healthz_bind_address: ports.healthz_bind_address,
        kubeconfig: credentials.kubeconfig,
        bootstrap_kubeconfig: credentials.bootstrap_kubeconfig,
        cert_dir: credentials.cert_dir,
        rotate_certificates: credentials.rotate_certificates,
        cgroup_driver: cgroups.driver,
        cgroup_root: cgroups.root,
        cgroups_per_qos: cgroups.per_qos,
        cluster_domain: sandbox.cluster_domain,
        cluster_dns: sandbox.cluster_dns,
        allowed_unsafe_sysctls: sandbox.allowed_unsafe_sysctls,
        resolv_conf: sandbox.resolv_conf,
        max_pods: resources.max_pods,
        pod_pids_limit: resources.pod_pids_limit,
        cpu_cfs_quota: resources.cpu_cfs_quota,
        cpu_cfs_quota_period: resources.cpu_cfs_quota_period,
        enforce_node_allocatable: resources.enforce_node_allocatable,
        node_status_update_frequency: timing.node_status_update_frequency,
        serialize_image_pulls: images.serialize_pulls,
        max_parallel_image_pulls: images.max_parallel_pulls,
        container_log_max_size: logs.max_size,
        container_log_max_files: logs.max_files,
        crash_loop_max_backoff,
        pod_infra_container_image: images.pod_infra_container_image,
        verbosity: logging.verbosity,
        logging_format: logging.format,
        volume_stats_agg_period,
        cluster,
        reservations,
        server,
        gc,
        eviction,
        shutdown,
        hardening,
        config_file: None,
        warnings: Vec::new(),
    })
}

/// The file fields the cluster and eviction settings read again at the end
/// (`nodeStatusReportFrequency`, `evictionPressureTransitionPeriod`,
/// `nodeLeaseDurationSeconds`), checked here at their place in the order; the file's value is
/// checked even where a flag wins.
fn check_file_only_fields(f: &KubeletConfigurationFile) -> Result<(), ConfigError> {
    file_duration(
        f.node_status_report_frequency.as_deref(),
        "nodeStatusReportFrequency",
    )?;
    file_duration(
        f.eviction_pressure_transition_period.as_deref(),
        "evictionPressureTransitionPeriod",
    )?;
    if let Some(n) = f.node_lease_duration_seconds
        && n <= 0
    {
        return Err(invalid(
            "nodeLeaseDurationSeconds",
            format!("{n} must be greater than 0"),
        ));
    }
    Ok(())
}

/// Why a value is not acceptable, for the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

impl From<InvalidValue> for String {
    fn from(value: InvalidValue) -> Self {
        value.0
    }
}

/// DNS-1123 subdomain: at most 253 characters of dot-separated labels, each 1-63 characters of
/// `a-z`, `0-9` and `-`, starting and ending with a letter or digit.
pub(super) fn check_dns_subdomain(name: &str) -> Result<(), InvalidValue> {
    if name.len() > 253 {
        return Err(InvalidValue("is longer than 253 characters".into()));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(InvalidValue(
                "is not a valid DNS subdomain (lowercase letters, digits, '-' and '.')".to_string(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_subdomains() {
        for ok in ["node-1", "a", "node.example.com", "0abc"] {
            assert_eq!(check_dns_subdomain(ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in ["Node", "-a", "a-", "a..b", "a_b", long.as_str(), ""] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad}");
        }
    }
}
