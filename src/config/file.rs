//! The `--config` file: a `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) in YAML or JSON.
//!
//! Only the fields Deckhand understands are modelled. Everything else is kept out of the way:
//! unknown fields are collected (with their dotted path) and reported as warnings rather than
//! failing the load, so a file written for the upstream kubelet still starts Deckhand.
//!
//! Values are kept close to their textual form here (durations as strings, ports as wide
//! integers) so that validation in [`super::validate`] can name the field and say what was
//! wrong, instead of the YAML layer failing with a generic type error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::ConfigError;

/// The only `apiVersion` accepted in a config file.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted in a config file.
pub const KIND: &str = "KubeletConfiguration";
/// Config files larger than this are refused before parsing.
pub const MAX_CONFIG_FILE_BYTES: usize = 1024 * 1024;

/// The subset of upstream's `KubeletConfiguration` (v1beta1) that Deckhand reads.
/// Field names follow upstream exactly; every field is optional ("not set" → the default).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfigurationFile {
    pub api_version: Option<String>,
    pub kind: Option<String>,

    pub enable_server: Option<bool>,
    pub static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    pub sync_frequency: Option<String>,
    pub file_check_frequency: Option<String>,
    pub http_check_frequency: Option<String>,
    pub address: Option<String>,
    pub port: Option<i64>,
    pub read_only_port: Option<i64>,
    pub healthz_port: Option<i64>,
    pub healthz_bind_address: Option<String>,
    pub cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub runtime_request_timeout: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub resolv_conf: Option<String>,
    pub max_pods: Option<i64>,
    pub pod_pids_limit: Option<i64>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<String>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub pod_logs_dir: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    pub node_status_update_frequency: Option<String>,
    pub node_status_report_frequency: Option<String>,
    pub node_lease_duration_seconds: Option<i64>,
    pub serialize_image_pulls: Option<bool>,
    pub max_parallel_image_pulls: Option<i64>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub eviction_soft: Option<BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<String>,
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub kernel_memcg_notification: Option<bool>,
    pub local_storage_capacity_isolation: Option<bool>,
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<i64>,
    pub container_log_max_workers: Option<i64>,
    pub container_log_monitor_interval: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<String>,
    pub shutdown_grace_period: Option<String>,
    pub shutdown_grace_period_critical_pods: Option<String>,
    pub shutdown_grace_period_by_pod_priority:
        Option<Vec<super::shutdown::ShutdownGracePeriodByPodPriorityFile>>,
    pub fail_swap_on: Option<bool>,
    pub crash_loop_back_off: Option<CrashLoopBackOffConfig>,
    pub register_node: Option<bool>,
    pub rotate_certificates: Option<bool>,
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<f64>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i64>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<f64>,
    pub event_burst: Option<i64>,
    pub node_status_max_images: Option<i64>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    pub tls_min_version: Option<String>,
    pub tls_cipher_suites: Option<Vec<String>>,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    pub authentication: Option<super::server::AuthenticationFile>,
    pub authorization: Option<super::server::AuthorizationFile>,
    pub streaming_connection_idle_timeout: Option<String>,
    pub logging: Option<LoggingFile>,
    pub volume_stats_agg_period: Option<String>,
    // The hardening section (`super::hardening`).
    pub seccomp_default: Option<bool>,
    pub enable_debugging_handlers: Option<bool>,
    pub enable_system_log_handler: Option<bool>,
    pub protect_kernel_defaults: Option<bool>,
    /// Read only to be refused when set: the node API cannot narrow its key exchange groups.
    pub tls_curve_preferences: Option<Vec<i64>>,
    /// Read only to be refused unless `NeverVerify`, the only policy Deckhand follows.
    pub image_pull_credentials_verification_policy: Option<String>,
}

/// `logging` (upstream's `LoggingConfiguration`): the format only.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggingFile {
    pub format: Option<String>,
}

/// `crashLoopBackOff` (upstream ≥ 1.32, behind KubeletCrashLoopBackOffMax there).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrashLoopBackOffConfig {
    pub max_container_restart_period: Option<String>,
}

/// A parsed config file plus the paths of fields it contained that Deckhand does not know.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedConfigFile {
    pub config: KubeletConfigurationFile,
    /// Dotted paths of ignored fields, in document order, e.g. `staticPodPth`,
    /// `crashLoopBackOff.maxRestart`, `authentication.x509.bogus`.
    pub unknown_fields: Vec<String>,
}

/// Parses the text of a config file named `path` (the path is only used in errors).
///
/// Errors: [`ConfigError::Parse`] for oversized, empty or malformed documents and type
/// mismatches; [`ConfigError::WrongKind`] when `apiVersion`/`kind` are missing or not
/// `kubelet.config.k8s.io/v1beta1` / `KubeletConfiguration`.
pub fn parse_config_file(path: &Path, text: &str) -> Result<ParsedConfigFile, ConfigError> {
    let parse_err = |message: String| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    };
    if text.len() > MAX_CONFIG_FILE_BYTES {
        return Err(parse_err(format!(
            "file is {} bytes, larger than the {MAX_CONFIG_FILE_BYTES}-byte limit",
            text.len()
        )));
    }
    if text.trim().is_empty() {
        return Err(parse_err(format!(
            "file is empty; expected apiVersion: {API_VERSION} and kind: {KIND}"
        )));
    }

    match parse_yaml_document::<KubeletConfigurationFile>(text) {
        Ok((config, unknown_fields)) => {
            check_type_meta(path, config.api_version.as_deref(), config.kind.as_deref())?;
            Ok(ParsedConfigFile {
                config,
                unknown_fields,
            })
        }
        Err(full_error) => {
            // A document of another kind often fails on some field's type before we get to
            // look at apiVersion/kind; report the wrong kind in that case, it is the real cause.
            if let Ok((meta, _)) = parse_yaml_document::<TypeMeta>(text) {
                check_type_meta(path, meta.api_version.as_deref(), meta.kind.as_deref())?;
            }
            // A value of the wrong type is reported at its position; name the field there too,
            // so a mistyped setting is refused by name.
            let message = match full_error.line.and_then(|line| key_on_line(text, line)) {
                Some(key) => format!("{key}: {full_error}"),
                None => full_error.to_string(),
            };
            Err(parse_err(message))
        }
    }
}

/// The mapping key written on 1-based `line` of `text` (`seccompDefault` of
/// `seccompDefault: maybe`, `maxPods` of `"maxPods": "x",`), if that line holds one.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let content = text.lines().nth(line.checked_sub(1)?)?.trim_start();
    let content = content.strip_prefix("- ").unwrap_or(content);
    let (key, _) = content.split_once(':')?;
    let key = key.trim().trim_matches('"').trim_matches('\'');
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    plain.then(|| key.to_string())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    api_version: Option<String>,
    kind: Option<String>,
}

fn check_type_meta(
    path: &Path,
    api_version: Option<&str>,
    kind: Option<&str>,
) -> Result<(), ConfigError> {
    if api_version == Some(API_VERSION) && kind == Some(KIND) {
        return Ok(());
    }
    Err(ConfigError::WrongKind {
        path: PathBuf::from(path),
        api_version: api_version.unwrap_or_default().to_string(),
        kind: kind.unwrap_or_default().to_string(),
    })
}

/// Deserializes exactly one YAML (or JSON) document into `T` through the project's one YAML
/// module (input limits live there), returning the dotted paths of fields `T` did not know.
fn parse_yaml_document<T: DeserializeOwned>(
    text: &str,
) -> Result<(T, Vec<String>), crate::base::yaml::YamlError> {
    crate::base::yaml::from_str_reporting_unknown::<T>(text).map(|(value, unknown)| {
        (
            value,
            unknown
                .iter()
                .map(|p| p.replace('[', ".").replace(']', ""))
                .collect(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ParsedConfigFile, ConfigError> {
        parse_config_file(Path::new("/etc/deckhand/config.yaml"), text)
    }

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    #[test]
    fn parses_every_field() {
        let text = format!(
            "{HEADER}\
enableServer: false
staticPodPath: /etc/kubernetes/manifests
staticPodURL: https://example.com/pods
staticPodURLHeader:
  Authorization: [\"Bearer abc\"]
  X-Multi: [a, b]
syncFrequency: 30s
fileCheckFrequency: 10s
httpCheckFrequency: 15s
address: 10.0.0.1
port: 10250
readOnlyPort: 10255
healthzPort: 10248
healthzBindAddress: 127.0.0.1
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
runtimeRequestTimeout: 2m
cgroupDriver: systemd
cgroupRoot: /
cgroupsPerQOS: true
resolvConf: /run/systemd/resolve/resolv.conf
maxPods: 64
podPidsLimit: 4096
podLogsDir: /var/log/pods
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/containerd/containerd.sock
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 5m
nodeLeaseDurationSeconds: 40
serializeImagePulls: false
maxParallelImagePulls: 3
evictionHard:
  memory.available: 100Mi
  nodefs.available: \"10%\"
evictionSoft:
  memory.available: 200Mi
evictionPressureTransitionPeriod: 5m
containerLogMaxSize: 20Mi
containerLogMaxFiles: 3
shutdownGracePeriod: 30s
shutdownGracePeriodCriticalPods: 10s
failSwapOn: false
crashLoopBackOff:
  maxContainerRestartPeriod: 60s
"
        );
        let parsed = parse(&text).unwrap();
        assert_eq!(parsed.unknown_fields, Vec::<String>::new());
        let c = parsed.config;
        assert_eq!(c.enable_server, Some(false));
        assert_eq!(
            c.static_pod_path.as_deref(),
            Some("/etc/kubernetes/manifests")
        );
        assert_eq!(
            c.static_pod_url.as_deref(),
            Some("https://example.com/pods")
        );
        let headers = c.static_pod_url_header.unwrap();
        assert_eq!(headers["Authorization"], vec!["Bearer abc".to_string()]);
        assert_eq!(headers["X-Multi"], vec!["a".to_string(), "b".to_string()]);
        assert_eq!(c.sync_frequency.as_deref(), Some("30s"));
        assert_eq!(c.address.as_deref(), Some("10.0.0.1"));
        assert_eq!(c.read_only_port, Some(10255));
        assert_eq!(c.cluster_dns, Some(vec!["10.96.0.10".to_string()]));
        assert_eq!(c.runtime_request_timeout.as_deref(), Some("2m"));
        assert_eq!(c.cgroups_per_qos, Some(true));
        assert_eq!(c.max_pods, Some(64));
        assert_eq!(c.pod_pids_limit, Some(4096));
        assert_eq!(c.node_lease_duration_seconds, Some(40));
        assert_eq!(c.max_parallel_image_pulls, Some(3));
        assert_eq!(
            c.eviction_hard.unwrap()["nodefs.available"],
            "10%".to_string()
        );
        assert_eq!(c.container_log_max_files, Some(3));
        assert_eq!(c.fail_swap_on, Some(false));
        assert_eq!(
            c.crash_loop_back_off
                .unwrap()
                .max_container_restart_period
                .as_deref(),
            Some("60s")
        );
    }

    #[test]
    fn json_is_accepted() {
        let text = r#"{
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "kind": "KubeletConfiguration",
  "maxPods": 12,
  "clusterDNS": ["10.0.0.10"],
  "runtimeRequestTimeout": "3m",
  "bogus": {"x": 1}
}"#;
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.config.max_pods, Some(12));
        assert_eq!(parsed.config.runtime_request_timeout.as_deref(), Some("3m"));
        assert_eq!(parsed.unknown_fields, vec!["bogus".to_string()]);
    }

    #[test]
    fn unknown_fields_are_reported_with_dotted_paths() {
        let text = format!(
            "{HEADER}\
staticPodPth: /etc/kubernetes/manifests
authentication:
  anonymous:
    enabled: false
    extra: 1
crashLoopBackOff:
  maxContainerRestartPeriod: 10s
  maxRestart: 1
maxPods: 5
"
        );
        let parsed = parse(&text).unwrap();
        assert_eq!(
            parsed.unknown_fields,
            vec![
                "staticPodPth".to_string(),
                "authentication.anonymous.extra".to_string(),
                "crashLoopBackOff.maxRestart".to_string()
            ]
        );
        assert_eq!(parsed.config.max_pods, Some(5));
        assert_eq!(parsed.config.static_pod_path, None);
    }

    #[test]
    fn wrong_or_missing_type_meta() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
                "kubelet.config.k8s.io/v1alpha1",
                "KubeletConfiguration",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
                "kubelet.config.k8s.io/v1beta1",
                "KubeProxyConfiguration",
            ),
            ("maxPods: 10\n", "", ""),
            // A Pod manifest: fails on field types, still reported as the wrong kind.
            (
                "apiVersion: v1\nkind: Pod\nport: [1, 2]\nspec: {}\n",
                "v1",
                "Pod",
            ),
        ];
        for (text, want_version, want_kind) in cases {
            match parse(text) {
                Err(ConfigError::WrongKind {
                    api_version, kind, ..
                }) => {
                    assert_eq!(api_version, *want_version, "{text}");
                    assert_eq!(kind, *want_kind, "{text}");
                }
                other => panic!("{text}: expected WrongKind, got {other:?}"),
            }
        }
        let err = parse("apiVersion: v1\nkind: Pod\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"v1\"") && err.contains("\"Pod\""), "{err}");
        assert!(err.contains(API_VERSION) && err.contains(KIND), "{err}");
    }

    #[test]
    fn parse_errors_carry_a_position() {
        let cases = [
            format!("{HEADER}maxPods: [1, 2\n"),
            format!("{HEADER}maxPods: lots\n"),
            format!("{HEADER}clusterDNS:\n  - a\n bad-indent: 1\n"),
        ];
        for text in &cases {
            match parse(text) {
                Err(ConfigError::Parse { path, message }) => {
                    assert_eq!(path, Path::new("/etc/deckhand/config.yaml"));
                    assert!(message.contains("line"), "{text:?}: {message}");
                    assert!(!message.contains('\n'), "{message:?}");
                }
                other => panic!("{text:?}: expected Parse, got {other:?}"),
            }
        }
    }

    #[test]
    fn type_errors_name_the_field() {
        let cases = [
            (format!("{HEADER}seccompDefault: maybe\n"), "seccompDefault: line 3"),
            (format!("{HEADER}maxPods: lots\n"), "maxPods: line 3"),
            (
                format!("{HEADER}authentication:\n  anonymous:\n    enabled: 7.5\n"),
                "enabled: line 5",
            ),
            (
                "{\"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n\"kind\": \"KubeletConfiguration\",\n\"protectKernelDefaults\": \"maybe\"}".to_string(),
                "protectKernelDefaults: line 3",
            ),
        ];
        for (text, want) in &cases {
            match parse(text) {
                Err(ConfigError::Parse { message, .. }) => {
                    assert!(message.starts_with(want), "{text:?}: {message}")
                }
                other => panic!("{text:?}: expected Parse, got {other:?}"),
            }
        }
    }

    #[test]
    fn empty_oversized_and_multi_document_files_are_refused() {
        for text in ["", "  \n# just a comment\n"] {
            // A comment-only file is not caught by the emptiness check but by the type meta.
            let err = parse(text).unwrap_err();
            assert!(
                matches!(
                    err,
                    ConfigError::Parse { .. } | ConfigError::WrongKind { .. }
                ),
                "{err:?}"
            );
        }
        let big = format!("{HEADER}# {}\n", "x".repeat(MAX_CONFIG_FILE_BYTES));
        assert!(matches!(parse(&big), Err(ConfigError::Parse { .. })));
        let two = format!("{HEADER}---\n{HEADER}");
        assert!(matches!(parse(&two), Err(ConfigError::Parse { .. })));
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let mut text = String::from(HEADER);
        text.push_str("evictionHard: &a0 {k: v}\n");
        text.push_str("x0: &b0 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\n");
        for i in 1..9 {
            let prev = i - 1;
            text.push_str(&format!(
                "x{i}: &b{i} [*b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}, *b{prev}]\n"
            ));
        }
        assert!(matches!(parse(&text), Err(ConfigError::Parse { .. })));
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let text = format!("{HEADER}deep: {}{}\n", "[".repeat(200), "]".repeat(200));
        assert!(matches!(parse(&text), Err(ConfigError::Parse { .. })));
    }
}
