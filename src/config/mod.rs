//! Deckhand's configuration: kubelet-style flags, a `KubeletConfiguration` file, and the one
//! validated, merged [`Config`] the rest of the agent reads.
//!
//! Precedence is upstream's: a flag given on the command line beats the `--config` file, and
//! the file beats the built-in defaults (which are upstream kubelet's v1beta1 defaults).
//!
//! - [`flags`]: the clap command line ([`Flags`]).
//! - [`file`]: the config file's schema ([`KubeletConfigurationFile`]) and parsing.
//! - [`duration`]: Go duration strings (`1m30s`).
//! - `validate`: merging the three layers and checking the result, one section at a time;
//!   each section's rules live in its module: [`node`] (the node's name, credentials,
//!   registration, reservations), `runtime` (directories, CRI endpoints, image pulls),
//!   `timing` (periods and timeouts), `sources` (static pods), [`server`] (ports, TLS,
//!   authentication, authorization), `cgroups` (layout and pods' resources), `sandbox` (DNS,
//!   sysctls), [`gc`] (image GC, log rotation), `logging`, [`shutdown`], [`eviction`],
//!   [`hardening`] (seccomp default, debugging handlers, kernel defaults).

mod cgroups;
pub mod duration;
pub(crate) mod eviction;
pub(crate) mod file;
pub(crate) mod flags;
pub(crate) mod gc;
pub(crate) mod hardening;
mod logging;
pub(crate) mod node;
mod runtime;
mod sandbox;
pub(crate) mod server;
pub(crate) mod shutdown;
mod sources;
mod timing;
mod validate;

pub use cgroups::ENFORCE_PODS;
pub use validate::InvalidValue;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub use duration::{DurationError, format_go_duration, parse_go_duration};
pub use eviction::EvictionSettings;
pub use file::{
    API_VERSION, CrashLoopBackOffConfig, KIND, KubeletConfigurationFile, LoggingFile,
    MAX_CONFIG_FILE_BYTES, ParsedConfigFile, parse_config_file,
};
pub use flags::Flags;
pub use gc::GcSettings;
pub use hardening::HardeningSettings;
pub use node::{ClusterSettings, Reservations};
pub use server::{AuthorizationMode, ServerSettings};
pub use shutdown::ShutdownSettings;

/// The validated, merged configuration. Built by [`load`] (or [`load_from`] in tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `--hostname-override`, else the machine's hostname; trimmed and lowercased.
    pub node_name: String,
    pub node_ip: Option<IpAddr>,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    /// Always `unix:///absolute/path` (a bare absolute path is normalized to that form).
    pub container_runtime_endpoint: String,
    /// Normalized like the runtime endpoint; `None` means "use the runtime endpoint".
    pub image_service_endpoint: Option<String>,
    pub runtime_request_timeout: Duration,
    /// `--image-pull-progress-deadline`; `None` when disabled (0).
    pub image_pull_progress_deadline: Option<Duration>,
    pub static_pod_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub static_pod_url: Option<String>,
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    pub http_check_frequency: Duration,
    pub sync_frequency: Duration,
    pub address: IpAddr,
    pub port: u16,
    /// 0 = off.
    pub read_only_port: u16,
    /// 0 = off.
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: TLS bootstrap when `kubeconfig` is missing or unusable.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--cert-dir` (`<root-dir>/pki` by default).
    pub cert_dir: PathBuf,
    /// `rotateCertificates` / `--rotate-certificates`.
    pub rotate_certificates: bool,
    pub cgroup_driver: CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    pub cluster_domain: Option<String>,
    pub cluster_dns: Vec<IpAddr>,
    /// `allowedUnsafeSysctls`: sysctls (or `prefix*` patterns) pods may set beyond the safe set;
    /// each is known to be namespaced (checked at load).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Empty path = no resolver file (containers get no host DNS configuration).
    pub resolv_conf: PathBuf,
    pub max_pods: u32,
    /// -1 = unlimited.
    pub pod_pids_limit: i64,
    /// `cpuCFSQuota`: CPU limits are enforced with a CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` (1ms to 1s).
    pub cpu_cfs_quota_period: Duration,
    /// `enforceNodeAllocatable`: `pods` when the kubepods cgroup is limited to allocatable
    /// (the only level Deckhand enforces); empty for none.
    pub enforce_node_allocatable: Vec<String>,
    pub node_status_update_frequency: Duration,
    pub serialize_image_pulls: bool,
    pub max_parallel_image_pulls: Option<u32>,
    /// A Kubernetes quantity such as `10Mi`.
    pub container_log_max_size: String,
    pub container_log_max_files: u32,
    /// `crashLoopBackOff.maxContainerRestartPeriod`.
    pub crash_loop_max_backoff: Duration,
    /// Pause image hint (informational).
    pub pod_infra_container_image: Option<String>,
    pub verbosity: u8,
    /// `--logging-format` / `logging.format`.
    pub logging_format: LoggingFormat,
    /// `volumeStatsAggPeriod`: how long a volume's measured disk use is kept for
    /// `/stats/summary` before it is walked again; zero: volumes are not measured.
    pub volume_stats_agg_period: Duration,
    /// Registration, Lease and node status settings (used with `kubeconfig`).
    pub cluster: ClusterSettings,
    /// What the node holds back from pods.
    pub reservations: Reservations,
    /// The node API on `port`: TLS, authentication, authorization.
    pub server: ServerSettings,
    /// Image GC and container log rotation.
    pub gc: GcSettings,
    /// The eviction manager: soft thresholds, minimum reclaim, transition period.
    pub eviction: EvictionSettings,
    /// Graceful node shutdown (file-only fields, as upstream).
    pub shutdown: ShutdownSettings,
    /// `seccompDefault`, the node API's debugging and system log handlers,
    /// `protectKernelDefaults`.
    pub hardening: HardeningSettings,
    pub config_file: Option<PathBuf>,
    /// Things worth logging at start-up (unknown config fields, ...). Never fatal.
    pub warnings: Vec<String>,
}

/// The cgroup driver; must match the container runtime's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CgroupDriver {
    type Err = InvalidValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            _ => Err(InvalidValue(format!(
                "{s:?} is not a cgroup driver (use cgroupfs or systemd)"
            ))),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoggingFormat {
    /// For people: one line per event, fields as `key=value`.
    #[default]
    Text,
    /// Upstream's JSON format: one object per line (`ts`, `caller`, `msg`, `v`, the fields).
    Json,
}

impl FromStr for LoggingFormat {
    type Err = InvalidValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LoggingFormat::Text),
            "json" => Ok(LoggingFormat::Json),
            _ => Err(InvalidValue(format!(
                "unsupported log format {s:?} (use \"text\" or \"json\")"
            ))),
        }
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed YAML/JSON, a value of the wrong type, or an oversized/empty file. The message
    /// includes `line L, column C` when the parser knows the position.
    #[error("config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A value that parsed but is not acceptable. `field` is the file's camelCase name (e.g.
    /// `readOnlyPort`, `clusterDNS[1]`) or the flag (e.g. `--sync-frequency`).
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error(
        "config file {}: expected apiVersion {:?} and kind {:?}, got apiVersion {api_version:?} and kind {kind:?}",
        path.display(), file::API_VERSION, file::KIND
    )]
    WrongKind {
        path: PathBuf,
        api_version: String,
        kind: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Loads the configuration: reads the `--config` file (if any), merges it under the flags and
/// over the defaults, and validates the result. The node name falls back to the machine's
/// hostname when `--hostname-override` is absent.
pub fn load(flags: &Flags) -> Result<Config, ConfigError> {
    let file = match &flags.config {
        Some(path) => {
            let text = read_config_file(path)?;
            // Relative paths inside the file resolve against the file's directory, so the
            // file's own path must be absolute for that to mean anything.
            let abs = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            Some((abs, text))
        }
        None => None,
    };
    let hostname = if node::hostname_override(flags).is_some() {
        String::new()
    } else {
        machine_hostname()?
    };
    let mut config = load_from(
        flags,
        file.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
        &hostname,
    )?;
    config.config_file = flags.config.clone();
    Ok(config)
}

/// The pure core of [`load`]: no I/O. `file_text` is the config file's path (used in messages
/// and to resolve relative paths in it) and contents; `hostname` stands in for the machine's
/// hostname.
pub fn load_from(
    flags: &Flags,
    file_text: Option<(&Path, &str)>,
    hostname: &str,
) -> Result<Config, ConfigError> {
    let parsed = match file_text {
        Some((path, text)) => Some((path, parse_config_file(path, text)?)),
        None => None,
    };
    let mut config = validate::build(
        flags,
        parsed.as_ref().map(|(path, p)| (*path, &p.config)),
        hostname,
    )?;
    if let Some((path, parsed)) = &parsed {
        config.config_file = Some(path.to_path_buf());
        // Unknown fields first, in document order, then whatever the merge noticed.
        let mut warnings: Vec<String> = parsed
            .unknown_fields
            .iter()
            .map(|field| {
                format!(
                    "config file {}: unknown field {field:?} ignored",
                    path.display()
                )
            })
            .collect();
        warnings.append(&mut config.warnings);
        config.warnings = warnings;
    } else {
        config.config_file = flags.config.clone();
    }
    Ok(config)
}

fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() > MAX_CONFIG_FILE_BYTES {
        return Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("file is larger than the {MAX_CONFIG_FILE_BYTES}-byte limit"),
        });
    }
    String::from_utf8(bytes).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: format!("file is not valid UTF-8: {e}"),
    })
}

/// The node name without `--hostname-override`: the machine's hostname, lowercased.
pub fn default_node_name() -> Result<String, ConfigError> {
    Ok(machine_hostname()?.trim().to_lowercase())
}

fn machine_hostname() -> Result<String, ConfigError> {
    let name = nix::unistd::gethostname().map_err(|e| {
        ConfigError::invalid(
            "hostname",
            format!("cannot read the machine's hostname ({e}); set --hostname-override"),
        )
    })?;
    Ok(name.to_string_lossy().into_owned())
}

impl Config {
    /// One line for the start-up log.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "node={} runtime={}",
            self.node_name, self.container_runtime_endpoint
        );
        if let Some(image) = &self.image_service_endpoint {
            out.push_str(&format!(" image-service={image}"));
        }
        out.push_str(&format!(" root-dir={}", self.root_dir.display()));
        match &self.static_pod_path {
            Some(path) => out.push_str(&format!(" static-pod-path={}", path.display())),
            None => out.push_str(" static-pod-path=none"),
        }
        match &self.static_pod_url {
            Some(url) => out.push_str(&format!(" manifest-url={url}")),
            None => out.push_str(" manifest-url=none"),
        }
        if self.server.enable_server {
            out.push_str(&format!(
                " server={}",
                SocketAddr::new(self.address, self.port)
            ));
        } else {
            out.push_str(" server=off");
        }
        out.push_str(&format!(
            " read-only-port={}",
            port_or_off(self.read_only_port)
        ));
        if self.healthz_port == 0 {
            out.push_str(" healthz=off");
        } else {
            out.push_str(&format!(
                " healthz={}",
                SocketAddr::new(self.healthz_bind_address, self.healthz_port)
            ));
        }
        out.push_str(&format!(
            " cgroup-driver={} max-pods={}",
            self.cgroup_driver, self.max_pods
        ));
        if let Some(path) = &self.config_file {
            out.push_str(&format!(" config={}", path.display()));
        }
        out
    }
}

fn port_or_off(port: u16) -> String {
    if port == 0 {
        "off".to_string()
    } else {
        port.to_string()
    }
}
