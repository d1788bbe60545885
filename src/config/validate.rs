//! Merging flags over the config file over the defaults, and checking the result.
//!
//! Every error names where the offending value came from: the flag (`--sync-frequency`) when
//! it was given on the command line, otherwise the file's camelCase field (`syncFrequency`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::duration::{format_go_duration, parse_go_duration};
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::{CgroupDriver, Config, ConfigError};

// Upstream kubelet (v1beta1) defaults.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
pub const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
pub const DEFAULT_CONTAINER_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
pub const DEFAULT_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The old dockershim default for `--image-pull-progress-deadline`.
pub const DEFAULT_IMAGE_PULL_PROGRESS_DEADLINE: Duration = Duration::from_secs(60);
pub const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
pub const DEFAULT_SYNC_FREQUENCY: Duration = Duration::from_secs(60);
pub const DEFAULT_PORT: u16 = 10250;
pub const DEFAULT_READ_ONLY_PORT: u16 = 0;
pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;
pub const DEFAULT_CGROUP_ROOT: &str = "/";
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
pub const DEFAULT_MAX_PODS: u32 = 110;
pub const DEFAULT_POD_PIDS_LIMIT: i64 = -1;
pub const DEFAULT_CPU_CFS_QUOTA_PERIOD: Duration = Duration::from_millis(100);
/// The `enforceNodeAllocatable` level that limits the kubepods cgroup to allocatable.
pub const ENFORCE_PODS: &str = "pods";
pub const DEFAULT_NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
pub const DEFAULT_CONTAINER_LOG_MAX_SIZE: &str = "10Mi";
pub const DEFAULT_CONTAINER_LOG_MAX_FILES: u32 = 5;
pub const DEFAULT_CRASH_LOOP_MAX_BACKOFF: Duration = Duration::from_secs(300);
/// `volumeStatsAggPeriod` (upstream's default; 0 turns the volume measurement off).
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);

/// Where a merged value came from, for naming it in errors.
#[derive(Clone, Copy)]
struct Origin {
    flag: &'static str,
    file: &'static str,
    from_flag: bool,
}

impl Origin {
    fn name(self) -> &'static str {
        if self.from_flag { self.flag } else { self.file }
    }
}

/// Flag beats file beats default; also reports which one won.
fn pick<T>(
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

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(field, reason)
}

/// A duration field of the file, parsed (or `None` when absent).
fn file_duration(value: Option<&str>, field: &str) -> Result<Option<Duration>, ConfigError> {
    value
        .map(|text| {
            parse_go_duration(text)
                .map_err(|e| invalid(field, format!("invalid duration {text:?}: {e}")))
        })
        .transpose()
}

/// A port field of the file: any integer in 0..=65535.
fn file_port(value: Option<i64>, field: &str) -> Result<Option<u16>, ConfigError> {
    value
        .map(|n| u16::try_from(n).map_err(|_| invalid(field, format!("{n} is not a valid port"))))
        .transpose()
}

fn file_ip(value: Option<&str>, field: &str) -> Result<Option<IpAddr>, ConfigError> {
    value
        .map(|text| {
            text.trim()
                .parse::<IpAddr>()
                .map_err(|_| invalid(field, format!("{text:?} is not an IP address")))
        })
        .transpose()
}

/// A count in the file that must fit in `u32` and be at least `min`.
fn file_count(value: Option<i64>, field: &str, min: u32) -> Result<Option<u32>, ConfigError> {
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

/// The trimmed `--hostname-override`, if one was given and is not blank.
pub(super) fn hostname_override(flags: &Flags) -> Option<&str> {
    flags
        .hostname_override
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

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
    let warnings = Vec::new();

    // Node identity.
    let (node_name, name_source) = match hostname_override(flags) {
        Some(name) => (name.to_lowercase(), "--hostname-override"),
        None => (hostname.trim().to_lowercase(), "hostname"),
    };
    if node_name.is_empty() {
        return Err(invalid(
            name_source,
            "the node name is empty; set --hostname-override",
        ));
    }
    if let Err(why) = check_dns_subdomain(&node_name) {
        return Err(invalid(
            name_source,
            format!("node name {node_name:?} {why}; set --hostname-override to a valid name"),
        ));
    }

    // Directories.
    let root_dir = flags
        .root_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT_DIR));
    if !root_dir.is_absolute() {
        return Err(invalid("--root-dir", "must be an absolute path"));
    }
    let (pod_logs_dir, o) = pick(
        flags.pod_logs_dir.clone(),
        "--pod-logs-dir",
        f.pod_logs_dir.as_ref().map(PathBuf::from),
        "podLogsDir",
        || PathBuf::from(DEFAULT_POD_LOGS_DIR),
    );
    check_pod_logs_dir(&pod_logs_dir).map_err(|why| invalid(o.name(), why))?;

    // Runtime endpoints.
    let (endpoint, o) = pick(
        flags.container_runtime_endpoint.clone(),
        "--container-runtime-endpoint",
        f.container_runtime_endpoint.clone(),
        "containerRuntimeEndpoint",
        || DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_string(),
    );
    let container_runtime_endpoint =
        normalize_endpoint(&endpoint).map_err(|why| invalid(o.name(), why))?;
    let (image_endpoint, o) = pick(
        flags.image_service_endpoint.clone(),
        "--image-service-endpoint",
        f.image_service_endpoint.clone(),
        "imageServiceEndpoint",
        String::new,
    );
    let image_service_endpoint = if image_endpoint.trim().is_empty() {
        None
    } else {
        Some(normalize_endpoint(&image_endpoint).map_err(|why| invalid(o.name(), why))?)
    };

    // Durations that must be positive.
    let positive = |flag: Option<Duration>,
                    flag_name: &'static str,
                    file_value: &Option<String>,
                    file_name: &'static str,
                    default: Duration|
     -> Result<Duration, ConfigError> {
        let from_file = file_duration(file_value.as_deref(), file_name)?;
        let (d, o) = pick(flag, flag_name, from_file, file_name, || default);
        if d.is_zero() {
            return Err(invalid(o.name(), "must be greater than 0"));
        }
        Ok(d)
    };
    let runtime_request_timeout = positive(
        flags.runtime_request_timeout,
        "--runtime-request-timeout",
        &f.runtime_request_timeout,
        "runtimeRequestTimeout",
        DEFAULT_RUNTIME_REQUEST_TIMEOUT,
    )?;
    let file_check_frequency = positive(
        flags.file_check_frequency,
        "--file-check-frequency",
        &f.file_check_frequency,
        "fileCheckFrequency",
        DEFAULT_FILE_CHECK_FREQUENCY,
    )?;
    let http_check_frequency = positive(
        flags.http_check_frequency,
        "--http-check-frequency",
        &f.http_check_frequency,
        "httpCheckFrequency",
        DEFAULT_HTTP_CHECK_FREQUENCY,
    )?;
    let sync_frequency = positive(
        flags.sync_frequency,
        "--sync-frequency",
        &f.sync_frequency,
        "syncFrequency",
        DEFAULT_SYNC_FREQUENCY,
    )?;
    let node_status_update_frequency = positive(
        flags.node_status_update_frequency,
        "--node-status-update-frequency",
        &f.node_status_update_frequency,
        "nodeStatusUpdateFrequency",
        DEFAULT_NODE_STATUS_UPDATE_FREQUENCY,
    )?;

    // Static pod sources.
    let (static_pod_path, _) = pick(
        flags.pod_manifest_path.clone(),
        "--pod-manifest-path",
        f.static_pod_path
            .as_deref()
            .map(|p| resolve_file_path(config_path, p)),
        "staticPodPath",
        PathBuf::new,
    );
    let static_pod_path = (!static_pod_path.as_os_str().is_empty()).then_some(static_pod_path);
    let (static_pod_url, o) = pick(
        flags.manifest_url.clone(),
        "--manifest-url",
        f.static_pod_url.clone(),
        "staticPodURL",
        String::new,
    );
    let static_pod_url = match static_pod_url.trim() {
        "" => None,
        url => {
            check_http_url(url).map_err(|why| invalid(o.name(), why))?;
            Some(url.to_string())
        }
    };
    let (static_pod_url_header, o) = pick(
        flags.manifest_url_header.as_ref().map(|pairs| {
            let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in pairs {
                map.entry(k.clone()).or_default().push(v.clone());
            }
            map
        }),
        "--manifest-url-header",
        f.static_pod_url_header.clone(),
        "staticPodURLHeader",
        BTreeMap::new,
    );
    for (name, values) in &static_pod_url_header {
        if super::flags::parse_header_pair(&format!("{name}:")).is_err() {
            return Err(invalid(
                o.name(),
                format!("{name:?} is not a valid HTTP header name"),
            ));
        }
        if values.iter().any(|v| v.contains(['\r', '\n'])) {
            return Err(invalid(
                o.name(),
                format!("header {name:?} has a value with a line break"),
            ));
        }
    }

    // Server addresses and ports.
    let (address, _) = pick(
        flags.address,
        "--address",
        file_ip(f.address.as_deref(), "address")?,
        "address",
        || IpAddr::from([0, 0, 0, 0]),
    );
    let (port, o) = pick(
        flags.port,
        "--port",
        file_port(f.port, "port")?,
        "port",
        || DEFAULT_PORT,
    );
    if port == 0 {
        return Err(invalid(
            o.name(),
            "0 is not a valid port for the node server (must be 1-65535)",
        ));
    }
    let (read_only_port, _) = pick(
        flags.read_only_port,
        "--read-only-port",
        file_port(f.read_only_port, "readOnlyPort")?,
        "readOnlyPort",
        || DEFAULT_READ_ONLY_PORT,
    );
    let (healthz_port, _) = pick(
        flags.healthz_port,
        "--healthz-port",
        file_port(f.healthz_port, "healthzPort")?,
        "healthzPort",
        || DEFAULT_HEALTHZ_PORT,
    );
    let (healthz_bind_address, _) = pick(
        flags.healthz_bind_address,
        "--healthz-bind-address",
        file_ip(f.healthz_bind_address.as_deref(), "healthzBindAddress")?,
        "healthzBindAddress",
        || IpAddr::from([127, 0, 0, 1]),
    );

    // Cgroups.
    let (driver, o) = pick(
        flags.cgroup_driver.clone(),
        "--cgroup-driver",
        f.cgroup_driver.clone(),
        "cgroupDriver",
        || CgroupDriver::default().as_str().to_string(),
    );
    let cgroup_driver: CgroupDriver = driver.parse().map_err(|why| invalid(o.name(), why))?;
    let (cgroup_root, o) = pick(
        flags.cgroup_root.clone(),
        "--cgroup-root",
        f.cgroup_root.clone(),
        "cgroupRoot",
        || DEFAULT_CGROUP_ROOT.to_string(),
    );
    let cgroup_root = if cgroup_root.is_empty() {
        DEFAULT_CGROUP_ROOT.to_string()
    } else {
        cgroup_root
    };
    if !cgroup_root.starts_with('/') {
        return Err(invalid(
            o.name(),
            format!("{cgroup_root:?} must be an absolute cgroup path (starting with /)"),
        ));
    }
    let (cgroups_per_qos, _) = pick(
        flags.cgroups_per_qos,
        "--cgroups-per-qos",
        f.cgroups_per_qos,
        "cgroupsPerQOS",
        || true,
    );

    // DNS.
    let (cluster_domain, o) = pick(
        flags.cluster_domain.clone(),
        "--cluster-domain",
        f.cluster_domain.clone(),
        "clusterDomain",
        String::new,
    );
    let cluster_domain = match cluster_domain.trim() {
        "" => None,
        domain => {
            let bare = domain.strip_suffix('.').unwrap_or(domain);
            check_dns_subdomain(bare)
                .map_err(|why| invalid(o.name(), format!("{domain:?} {why}")))?;
            Some(domain.to_string())
        }
    };
    let file_dns = match &f.cluster_dns {
        Some(entries) => Some(
            entries
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    text.trim().parse::<IpAddr>().map_err(|_| {
                        invalid(
                            &format!("clusterDNS[{i}]"),
                            format!("{text:?} is not an IP address"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let (cluster_dns, _) = pick(
        flags.cluster_dns.clone(),
        "--cluster-dns",
        file_dns,
        "clusterDNS",
        Vec::new,
    );
    let (allowed_unsafe_sysctls, o) = pick(
        flags.allowed_unsafe_sysctls.clone(),
        "--allowed-unsafe-sysctls",
        f.allowed_unsafe_sysctls.clone(),
        "allowedUnsafeSysctls",
        Vec::new,
    );
    let allowed_unsafe_sysctls: Vec<String> = allowed_unsafe_sysctls
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if let Err(err) = crate::base::podspec::sysctl::SysctlAllowlist::new(&allowed_unsafe_sysctls) {
        return Err(invalid(o.name(), err.to_string()));
    }
    let (resolv_conf, _) = pick(
        flags.resolv_conf.clone(),
        "--resolv-conf",
        f.resolv_conf
            .as_deref()
            .map(|p| resolve_file_path(config_path, p)),
        "resolvConf",
        || PathBuf::from(DEFAULT_RESOLV_CONF),
    );

    // Limits.
    let (max_pods, o) = pick(
        flags.max_pods,
        "--max-pods",
        file_count(f.max_pods, "maxPods", 1)?,
        "maxPods",
        || DEFAULT_MAX_PODS,
    );
    if max_pods < 1 {
        return Err(invalid(o.name(), "must be at least 1"));
    }
    let (pod_pids_limit, o) = pick(
        flags.pod_max_pids,
        "--pod-max-pids",
        f.pod_pids_limit,
        "podPidsLimit",
        || DEFAULT_POD_PIDS_LIMIT,
    );
    if pod_pids_limit < -1 {
        return Err(invalid(
            o.name(),
            format!("{pod_pids_limit} must be -1 (unlimited) or greater"),
        ));
    }

    // CPU limits and node allocatable enforcement.
    let (cpu_cfs_quota, _) = pick(
        flags.cpu_cfs_quota,
        "--cpu-cfs-quota",
        f.cpu_cfs_quota,
        "cpuCFSQuota",
        || true,
    );
    let (cpu_cfs_quota_period, o) = pick(
        flags.cpu_cfs_quota_period,
        "--cpu-cfs-quota-period",
        file_duration(f.cpu_cfs_quota_period.as_deref(), "cpuCFSQuotaPeriod")?,
        "cpuCFSQuotaPeriod",
        || DEFAULT_CPU_CFS_QUOTA_PERIOD,
    );
    if cpu_cfs_quota_period < Duration::from_millis(1)
        || cpu_cfs_quota_period > Duration::from_secs(1)
    {
        return Err(invalid(
            o.name(),
            format!(
                "{} must be between 1ms and 1s, inclusive",
                format_go_duration(cpu_cfs_quota_period)
            ),
        ));
    }
    let (enforce, o) = pick(
        flags.enforce_node_allocatable.clone(),
        "--enforce-node-allocatable",
        f.enforce_node_allocatable.clone(),
        "enforceNodeAllocatable",
        || vec![ENFORCE_PODS.to_string()],
    );
    // Upstream refuses its own default `pods` without the QoS cgroups; here the default
    // quietly means none then, so `--cgroups-per-qos=false` alone still starts.
    let defaulted =
        flags.enforce_node_allocatable.is_none() && f.enforce_node_allocatable.is_none();
    let enforce_node_allocatable = if defaulted && !cgroups_per_qos {
        Vec::new()
    } else {
        check_enforcement(&enforce, cgroups_per_qos, o.name())?
    };

    // Image pulls.
    let (serialize_image_pulls, serialize_origin) = pick(
        flags.serialize_image_pulls,
        "--serialize-image-pulls",
        f.serialize_image_pulls,
        "serializeImagePulls",
        || true,
    );
    let max_parallel_image_pulls =
        file_count(f.max_parallel_image_pulls, "maxParallelImagePulls", 1)?;
    if let Some(n) = max_parallel_image_pulls
        && n > 1
        && serialize_image_pulls
    {
        return Err(invalid(
            "maxParallelImagePulls",
            format!(
                "{n} requires image pulls not to be serialized; set {} to false",
                serialize_origin.name()
            ),
        ));
    }

    // Container logs.
    let container_log_max_size = f
        .container_log_max_size
        .clone()
        .unwrap_or_else(|| DEFAULT_CONTAINER_LOG_MAX_SIZE.to_string());
    check_quantity(&container_log_max_size).map_err(|why| {
        invalid(
            "containerLogMaxSize",
            format!("{container_log_max_size:?} {why}"),
        )
    })?;
    let container_log_max_files = file_count(f.container_log_max_files, "containerLogMaxFiles", 2)?
        .unwrap_or(DEFAULT_CONTAINER_LOG_MAX_FILES);

    // Crash-loop back-off ceiling.
    let crash_loop_max_backoff = file_duration(
        f.crash_loop_back_off
            .as_ref()
            .and_then(|c| c.max_container_restart_period.as_deref()),
        "crashLoopBackOff.maxContainerRestartPeriod",
    )?
    .unwrap_or(DEFAULT_CRASH_LOOP_MAX_BACKOFF);
    if crash_loop_max_backoff < Duration::from_secs(1)
        || crash_loop_max_backoff > Duration::from_secs(300)
    {
        return Err(invalid(
            "crashLoopBackOff.maxContainerRestartPeriod",
            format!(
                "{} must be between 1s and 5m0s",
                format_go_duration(crash_loop_max_backoff)
            ),
        ));
    }

    // TLS bootstrap and certificate rotation.
    let bootstrap_kubeconfig = flags.bootstrap_kubeconfig.clone();
    if bootstrap_kubeconfig.is_some() && flags.kubeconfig.is_none() {
        return Err(invalid(
            "--bootstrap-kubeconfig",
            "needs --kubeconfig (where the bootstrapped kubeconfig is written)",
        ));
    }
    let cert_dir = flags
        .cert_dir
        .clone()
        .unwrap_or_else(|| root_dir.join("pki"));
    if !cert_dir.is_absolute() {
        return Err(invalid("--cert-dir", "must be an absolute path"));
    }
    let (rotate_certificates, _) = pick(
        flags.rotate_certificates,
        "--rotate-certificates",
        f.rotate_certificates,
        "rotateCertificates",
        || bootstrap_kubeconfig.is_some(),
    );

    // Fields parsed and checked for upstream compatibility but not carried into Config.
    check_file_only_fields(f)?;

    // Logging and the stats' volume measurement.
    let logging_format = match (
        flags.logging_format.as_deref(),
        f.logging.as_ref().and_then(|l| l.format.as_deref()),
    ) {
        (Some(flag), _) => flag
            .parse()
            .map_err(|e: InvalidValue| invalid("--logging-format", e))?,
        (None, Some(file)) => file
            .parse()
            .map_err(|e: InvalidValue| invalid("logging.format", e))?,
        (None, None) => super::LoggingFormat::Text,
    };
    let volume_stats_agg_period =
        file_duration(f.volume_stats_agg_period.as_deref(), "volumeStatsAggPeriod")?
            .unwrap_or(DEFAULT_VOLUME_STATS_AGG_PERIOD);

    let gc = super::gc::gc_settings(flags, f, &container_log_max_size, container_log_max_files)?;
    let shutdown = super::shutdown::shutdown_settings(f)?;
    Ok(Config {
        node_name,
        node_ip: flags.node_ip,
        root_dir,
        pod_logs_dir,
        container_runtime_endpoint,
        image_service_endpoint,
        runtime_request_timeout,
        image_pull_progress_deadline: Some(
            flags
                .image_pull_progress_deadline
                .unwrap_or(DEFAULT_IMAGE_PULL_PROGRESS_DEADLINE),
        )
        .filter(|d| !d.is_zero()),
        static_pod_path,
        file_check_frequency,
        static_pod_url,
        static_pod_url_header,
        http_check_frequency,
        sync_frequency,
        address,
        port,
        read_only_port,
        healthz_port,
        healthz_bind_address,
        kubeconfig: flags.kubeconfig.clone(),
        bootstrap_kubeconfig,
        cert_dir,
        rotate_certificates,
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos,
        cluster_domain,
        cluster_dns,
        allowed_unsafe_sysctls,
        resolv_conf,
        max_pods,
        pod_pids_limit,
        cpu_cfs_quota,
        cpu_cfs_quota_period,
        enforce_node_allocatable,
        node_status_update_frequency,
        serialize_image_pulls,
        max_parallel_image_pulls,
        container_log_max_size,
        container_log_max_files,
        crash_loop_max_backoff,
        pod_infra_container_image: flags
            .pod_infra_container_image
            .clone()
            .filter(|s| !s.trim().is_empty()),
        verbosity: flags.verbosity.unwrap_or(0),
        logging_format,
        volume_stats_agg_period,
        cluster: super::node::cluster_settings(flags, f)?,
        reservations: super::node::reservations(flags, f)?,
        server: super::server::server_settings(&flags.server, f, &|p| {
            resolve_file_path(config_path, p)
        })?,
        gc,
        eviction: super::eviction::eviction_settings(flags, f)?,
        shutdown,
        config_file: None,
        warnings,
    })
}

/// `enforceNodeAllocatable` as upstream validates it: known levels, no duplicates, `none`
/// alone, and the QoS cgroups on for any level. The reserved-cgroup levels need
/// `--system-reserved-cgroup`/`--kube-reserved-cgroup`, which Deckhand does not have, so they
/// are refused by name.
fn check_enforcement(
    levels: &[String],
    cgroups_per_qos: bool,
    field: &str,
) -> Result<Vec<String>, ConfigError> {
    let levels: Vec<&str> = levels
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    let mut out: Vec<String> = Vec::new();
    for level in &levels {
        if out.iter().any(|l| l == level) {
            return Err(invalid(field, format!("duplicated enforcement {level:?}")));
        }
        match *level {
            "none" => {
                if levels.len() > 1 {
                    return Err(invalid(
                        field,
                        "may not contain other levels when \"none\" is given",
                    ));
                }
                return Ok(Vec::new());
            }
            ENFORCE_PODS => {}
            "system-reserved"
            | "system-reserved-compressible"
            | "kube-reserved"
            | "kube-reserved-compressible" => {
                return Err(invalid(
                    field,
                    format!(
                        "{level:?} needs a reserved cgroup (--system-reserved-cgroup / \
                         --kube-reserved-cgroup), which Deckhand does not support; only \"pods\" \
                         and \"none\" are"
                    ),
                ));
            }
            other => {
                return Err(invalid(
                    field,
                    format!(
                        "unknown level {other:?} (valid: \"pods\", \"system-reserved\", \
                         \"system-reserved-compressible\", \"kube-reserved\", \
                         \"kube-reserved-compressible\", \"none\")"
                    ),
                ));
            }
        }
        if !cgroups_per_qos {
            return Err(invalid(
                field,
                format!("{level:?} needs cgroupsPerQOS (--cgroups-per-qos) to be true"),
            ));
        }
        out.push(level.to_string());
    }
    Ok(out)
}

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

/// Accepts `unix:///abs/path` as is and turns a bare absolute path into `unix:///abs/path`.
pub(super) fn normalize_endpoint(value: &str) -> Result<String, InvalidValue> {
    let value = value.trim();
    if value.is_empty() {
        return Err(InvalidValue("must not be empty".into()));
    }
    if let Some(path) = value.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(InvalidValue(format!(
                "{value:?} must name an absolute socket path, like unix:///run/containerd/containerd.sock"
            )));
        }
        return Ok(value.to_string());
    }
    if value.starts_with('/') {
        return Ok(format!("unix://{value}"));
    }
    if let Some((scheme, _)) = value.split_once("://") {
        return Err(InvalidValue(format!(
            "{value:?} uses scheme {scheme:?}; Deckhand only speaks CRI over unix sockets (unix:///path)"
        )));
    }
    Err(InvalidValue(format!(
        "{value:?} must be unix:///path/to/socket or an absolute socket path"
    )))
}

/// A minimal check that `url` is an absolute http(s) URL with a host.
pub(super) fn check_http_url(url: &str) -> Result<(), InvalidValue> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidValue(format!(
            "{url:?} is not a valid URL (contains whitespace)"
        )));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(InvalidValue(format!(
            "{url:?} is not an absolute http(s) URL"
        )));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(InvalidValue(format!(
            "{url:?} uses scheme {scheme:?}; only http and https are supported"
        )));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(InvalidValue(format!(
                "{url:?} has an unterminated IPv6 address"
            )));
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(InvalidValue(format!("{url:?} has an invalid IPv6 address")));
        }
        match after {
            "" => (host, None),
            p => match p.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => {
                    return Err(InvalidValue(format!(
                        "{url:?} has junk after the IPv6 address"
                    )));
                }
            },
        }
    } else {
        match host_port.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(InvalidValue(format!("{url:?} has no host")));
    }
    if let Some(port) = port
        && !port.is_empty()
        && port.parse::<u16>().is_err()
    {
        return Err(InvalidValue(format!(
            "{url:?} has an invalid port {port:?}"
        )));
    }
    Ok(())
}

/// DNS-1123 subdomain: at most 253 characters of dot-separated labels, each 1-63 characters of
/// `a-z`, `0-9` and `-`, starting and ending with a letter or digit.
fn check_dns_subdomain(name: &str) -> Result<(), InvalidValue> {
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

/// podLogsDir must be absolute, normalized and ASCII (upstream uses it in metric labels).
fn check_pod_logs_dir(path: &Path) -> Result<(), InvalidValue> {
    let text = path.to_string_lossy();
    if text.is_empty() {
        return Err(InvalidValue("must not be empty".into()));
    }
    if !path.is_absolute() {
        return Err(InvalidValue(format!("{text:?} must be an absolute path")));
    }
    let clean = text == "/"
        || text
            .split('/')
            .skip(1)
            .all(|segment| !matches!(segment, "" | "." | ".."));
    if !clean {
        return Err(InvalidValue(format!(
            "{text:?} must be normalized (no '.', '..', '//' or trailing '/')"
        )));
    }
    if !text.is_ascii() {
        return Err(InvalidValue(format!(
            "{text:?} must contain ASCII characters only"
        )));
    }
    Ok(())
}

/// A positive Kubernetes quantity with an optional binary or decimal suffix, e.g. `10Mi`,
/// `500k`, `1G`, `1048576`, `1.5Gi`.
fn check_quantity(text: &str) -> Result<(), InvalidValue> {
    const SUFFIXES: [&str; 13] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    let number_len = text
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = text.split_at(number_len);
    let valid_number = !number.is_empty()
        && number.matches('.').count() <= 1
        && number != "."
        && !number.starts_with('.');
    if !valid_number || !SUFFIXES.contains(&suffix) {
        return Err(InvalidValue(
            "is not a size quantity (e.g. 10Mi, 500Ki, 1G)".into(),
        ));
    }
    if number.bytes().all(|b| b == b'0' || b == b'.') {
        return Err(InvalidValue("must be greater than 0".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_normalization() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                "unix:///run/containerd/containerd.sock",
                Ok("unix:///run/containerd/containerd.sock"),
            ),
            ("/run/crio/crio.sock", Ok("unix:///run/crio/crio.sock")),
            (" /run/x.sock ", Ok("unix:///run/x.sock")),
            ("unix://run/x.sock", Err("absolute socket path")),
            ("run/x.sock", Err("absolute socket path")),
            ("tcp://127.0.0.1:1234", Err("\"tcp\"")),
            ("npipe:////./pipe/containerd", Err("\"npipe\"")),
            ("", Err("must not be empty")),
        ];
        for (input, want) in cases {
            match (normalize_endpoint(input), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{input:?}"),
                (Err(got), Err(want)) => assert!(got.0.contains(want), "{input:?}: {got}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn http_urls() {
        for ok in [
            "http://example.com",
            "https://example.com/pods?x=1",
            "http://user:pw@10.0.0.1:8080/p",
            "http://[fd00::1]:80/x",
            "HTTPS://Example.com/",
        ] {
            assert_eq!(check_http_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "example.com/pods",
            "ftp://example.com/pods",
            "http://",
            "http:///pods",
            "http://host:port/",
            "http://host:70000/",
            "http://exa mple.com/",
            "http://[fd00::1/",
            "file:///etc/pods",
        ] {
            assert!(check_http_url(bad).is_err(), "{bad}");
        }
    }

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

    #[test]
    fn pod_logs_dirs() {
        for ok in ["/var/log/pods", "/", "/logs"] {
            assert_eq!(check_pod_logs_dir(Path::new(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "var/log/pods",
            "/var/log/../pods",
            "/var/./log",
            "/var/log/",
            "/var//log",
            "/var/lög",
            "",
        ] {
            assert!(check_pod_logs_dir(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities() {
        for ok in ["10Mi", "1", "1.5Gi", "500k", "100M", "2Ei"] {
            assert_eq!(check_quantity(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "Mi", "10MB", "10mi", "1.2.3Mi", ".5Mi", "0", "0Mi", "-1Mi", "ten",
        ] {
            assert!(check_quantity(bad).is_err(), "{bad}");
        }
    }
}
