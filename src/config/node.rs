//! The node section: the node's name, and the settings that only matter when Deckhand is a
//! node of a cluster (`--kubeconfig`): its credentials (TLS bootstrap, certificates),
//! registration, the apiserver client's rate limit, node status and Lease timing, and what
//! the node holds back from pods (`kubeReserved`, `systemReserved`, `evictionHard`).
//!
//! Kept apart from the general merge in `validate` because these values have their own
//! formats (label maps, taints, `signal<threshold` lists) and their own defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use thiserror::Error;

use super::ConfigError;
use super::duration::parse_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{check_dns_subdomain, pick};
use crate::base::podspec::labels::LabelError;
use crate::base::podspec::quantity::{self, Quantity};
use crate::base::podspec::threshold::{self, Threshold};

pub(crate) const DEFAULT_KUBE_API_QPS: f32 = 50.0;
pub(crate) const DEFAULT_KUBE_API_BURST: u32 = 100;
pub(crate) const DEFAULT_EVENT_RECORD_QPS: f32 = 50.0;
pub(crate) const DEFAULT_EVENT_BURST: u32 = 100;
pub(crate) const DEFAULT_NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
pub(crate) const DEFAULT_NODE_LEASE_DURATION_SECONDS: u32 = 40;
pub(crate) const DEFAULT_NODE_STATUS_MAX_IMAGES: i32 = 50;

/// How Deckhand joins a cluster and keeps its Node and Lease current.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// `--register-node` / `registerNode`: create the Node when it does not exist.
    pub register_node: bool,
    /// `--node-labels`: set on the Node when Deckhand creates it (as upstream, not forced on
    /// an existing Node).
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints` / `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `kubeAPIQPS`; below zero means no limit (client-go's meaning).
    pub kube_api_qps: f32,
    pub kube_api_burst: u32,
    /// `eventRecordQPS`: event writes per second, on a client of their own so they never
    /// hold up status writes; 0 means no limit (upstream's meaning).
    pub event_record_qps: f32,
    /// `eventBurst`.
    pub event_burst: u32,
    /// `nodeStatusReportFrequency`: the status is sent at least this often even unchanged.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`; the Lease is renewed every quarter of it.
    pub node_lease_duration_seconds: u32,
    /// `nodeStatusMaxImages`; -1 = all.
    pub node_status_max_images: i32,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            register_node: true,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            kube_api_qps: DEFAULT_KUBE_API_QPS,
            kube_api_burst: DEFAULT_KUBE_API_BURST,
            event_record_qps: DEFAULT_EVENT_RECORD_QPS,
            event_burst: DEFAULT_EVENT_BURST,
            node_status_report_frequency: DEFAULT_NODE_STATUS_REPORT_FREQUENCY,
            node_lease_duration_seconds: DEFAULT_NODE_LEASE_DURATION_SECONDS,
            node_status_max_images: DEFAULT_NODE_STATUS_MAX_IMAGES,
        }
    }
}

/// What the node holds back from pods: allocatable = capacity − kube − system − hard eviction
/// thresholds (memory and ephemeral storage).
#[derive(Debug, Clone, PartialEq)]
pub struct Reservations {
    /// Resource name (`cpu`, `memory`, `ephemeral-storage`, `pid`) → amount.
    pub kube_reserved: BTreeMap<String, Quantity>,
    pub system_reserved: BTreeMap<String, Quantity>,
    /// Signal (`memory.available`, `nodefs.available`, …) → threshold.
    pub eviction_hard: BTreeMap<String, Threshold>,
}

impl Default for Reservations {
    fn default() -> Self {
        Reservations {
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            eviction_hard: threshold::default_eviction_hard(),
        }
    }
}

/// The resources `kubeReserved` and `systemReserved` may name (upstream's set).
const RESERVABLE: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];

/// The trimmed `--hostname-override`, if one was given and is not blank.
pub(super) fn hostname_override(flags: &Flags) -> Option<&str> {
    flags
        .hostname_override
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The node name: `--hostname-override`, else `hostname` (the machine's), trimmed and
/// lowercased. It must be a DNS subdomain because the Node, its Lease and the mirror pods'
/// names are made from it.
pub(super) fn node_name(flags: &Flags, hostname: &str) -> Result<String, ConfigError> {
    let (node_name, name_source) = match hostname_override(flags) {
        Some(name) => (name.to_lowercase(), "--hostname-override"),
        None => (hostname.trim().to_lowercase(), "hostname"),
    };
    if node_name.is_empty() {
        return Err(ConfigError::invalid(
            name_source,
            "the node name is empty; set --hostname-override",
        ));
    }
    if let Err(why) = check_dns_subdomain(&node_name) {
        return Err(ConfigError::invalid(
            name_source,
            format!("node name {node_name:?} {why}; set --hostname-override to a valid name"),
        ));
    }
    Ok(node_name)
}

/// How the agent authenticates to the API server.
pub(super) struct Credentials {
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    pub rotate_certificates: bool,
}

/// The kubeconfig, TLS bootstrap and the certificates' directory (`<root_dir>/pki` by
/// default). A bootstrap kubeconfig needs `--kubeconfig`, where the bootstrapped one is
/// written; certificate rotation defaults to on when a bootstrap kubeconfig is given.
pub(super) fn credentials(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    root_dir: &Path,
) -> Result<Credentials, ConfigError> {
    let bootstrap_kubeconfig = flags.bootstrap_kubeconfig.clone();
    if bootstrap_kubeconfig.is_some() && flags.kubeconfig.is_none() {
        return Err(ConfigError::invalid(
            "--bootstrap-kubeconfig",
            "needs --kubeconfig (where the bootstrapped kubeconfig is written)",
        ));
    }
    let cert_dir = flags
        .cert_dir
        .clone()
        .unwrap_or_else(|| root_dir.join("pki"));
    if !cert_dir.is_absolute() {
        return Err(ConfigError::invalid(
            "--cert-dir",
            "must be an absolute path",
        ));
    }
    let (rotate_certificates, _) = pick(
        flags.rotate_certificates,
        "--rotate-certificates",
        f.rotate_certificates,
        "rotateCertificates",
        || bootstrap_kubeconfig.is_some(),
    );
    Ok(Credentials {
        kubeconfig: flags.kubeconfig.clone(),
        bootstrap_kubeconfig,
        cert_dir,
        rotate_certificates,
    })
}

/// Merges the cluster settings: flag, then file, then upstream's default.
pub(super) fn cluster_settings(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<ClusterSettings, ConfigError> {
    let d = ClusterSettings::default();
    let node_labels = node_labels(flags)?;
    let register_with_taints = register_with_taints(flags, f)?;
    let (kube_api_qps, kube_api_burst) = api_rate_limit(flags, f, &d)?;
    let (event_record_qps, event_burst) = event_rate_limit(flags, f, &d)?;
    let node_status_report_frequency = match f.node_status_report_frequency.as_deref() {
        Some(text) => {
            let d = parse_go_duration(text).map_err(|e| {
                ConfigError::invalid(
                    "nodeStatusReportFrequency",
                    format!("invalid duration {text:?}: {e}"),
                )
            })?;
            if d.is_zero() {
                return Err(ConfigError::invalid(
                    "nodeStatusReportFrequency",
                    "must be more than zero",
                ));
            }
            d
        }
        None => d.node_status_report_frequency,
    };
    let node_lease_duration_seconds = match f.node_lease_duration_seconds {
        Some(n) => u32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
            ConfigError::invalid(
                "nodeLeaseDurationSeconds",
                format!("{n} must be greater than 0"),
            )
        })?,
        None => d.node_lease_duration_seconds,
    };
    let node_status_max_images = match f.node_status_max_images {
        Some(n) if n >= -1 => i32::try_from(n).unwrap_or(i32::MAX),
        Some(n) => {
            return Err(ConfigError::invalid(
                "nodeStatusMaxImages",
                format!("{n} must be -1 (all) or more"),
            ));
        }
        None => d.node_status_max_images,
    };
    Ok(ClusterSettings {
        register_node: flags.register_node.or(f.register_node).unwrap_or(true),
        node_labels,
        register_with_taints,
        kube_api_qps,
        kube_api_burst,
        event_record_qps,
        event_burst,
        node_status_report_frequency,
        node_lease_duration_seconds,
        node_status_max_images,
    })
}

/// `--node-labels` (a flag only, as upstream), checked against what a node may set on itself.
fn node_labels(flags: &Flags) -> Result<BTreeMap<String, String>, ConfigError> {
    let Some(pairs) = &flags.node_labels else {
        return Ok(BTreeMap::new());
    };
    let mut labels = BTreeMap::new();
    for (k, v) in pairs {
        labels.insert(k.clone(), v.clone());
    }
    check_node_labels(&labels)
        .map_err(|why| ConfigError::invalid("--node-labels", why.to_string()))?;
    Ok(labels)
}

/// `--register-with-taints` (checked as it was parsed) or `registerWithTaints`, each entry
/// checked and named by its index.
fn register_with_taints(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<Vec<Taint>, ConfigError> {
    match (&flags.register_with_taints, &f.register_with_taints) {
        (Some(taints), _) => Ok(taints.clone()),
        (None, Some(taints)) => {
            for (i, t) in taints.iter().enumerate() {
                check_taint(t).map_err(|why| {
                    ConfigError::invalid(format!("registerWithTaints[{i}]"), why.to_string())
                })?;
            }
            Ok(taints.clone())
        }
        (None, None) => Ok(Vec::new()),
    }
}

/// `kubeAPIQPS` (any number; below zero, no limit) and `kubeAPIBurst`.
fn api_rate_limit(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    d: &ClusterSettings,
) -> Result<(f32, u32), ConfigError> {
    let kube_api_qps = flags
        .kube_api_qps
        .map(Ok)
        .or(f.kube_api_qps.map(|q| {
            if q.is_finite() {
                Ok(q as f32)
            } else {
                Err(ConfigError::invalid("kubeAPIQPS", "must be a number"))
            }
        }))
        .transpose()?
        .unwrap_or(d.kube_api_qps);
    let kube_api_burst = match (flags.kube_api_burst, f.kube_api_burst) {
        (Some(b), _) => b,
        (None, Some(b)) => u32::try_from(b).map_err(|_| {
            ConfigError::invalid("kubeAPIBurst", format!("{b} must be between 0 and 2^32-1"))
        })?,
        (None, None) => d.kube_api_burst,
    };
    Ok((kube_api_qps, kube_api_burst))
}

/// `eventRecordQPS` (0 or more; 0, no limit) and `eventBurst`.
fn event_rate_limit(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    d: &ClusterSettings,
) -> Result<(f32, u32), ConfigError> {
    let event_record_qps = match (flags.event_qps, f.event_record_qps) {
        (Some(q), _) if q.is_finite() && q >= 0.0 => q,
        (Some(q), _) => {
            return Err(ConfigError::invalid(
                "--event-qps",
                format!("{q} must be 0 (no limit) or more"),
            ));
        }
        (None, Some(q)) if q.is_finite() && q >= 0.0 => q as f32,
        (None, Some(q)) => {
            return Err(ConfigError::invalid(
                "eventRecordQPS",
                format!("{q} must be 0 (no limit) or more"),
            ));
        }
        (None, None) => d.event_record_qps,
    };
    let event_burst = match (flags.event_burst, f.event_burst) {
        (Some(b), _) => b,
        (None, Some(b)) => u32::try_from(b).map_err(|_| {
            ConfigError::invalid("eventBurst", format!("{b} must be between 0 and 2^32-1"))
        })?,
        (None, None) => d.event_burst,
    };
    Ok((event_record_qps, event_burst))
}

/// Merges `kubeReserved`, `systemReserved` and `evictionHard`.
pub(super) fn reservations(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<Reservations, ConfigError> {
    let kube_reserved = reserved(
        flags.kube_reserved.as_deref(),
        "--kube-reserved",
        f.kube_reserved.as_ref(),
        "kubeReserved",
    )?;
    let system_reserved = reserved(
        flags.system_reserved.as_deref(),
        "--system-reserved",
        f.system_reserved.as_ref(),
        "systemReserved",
    )?;
    let eviction_hard = match (&flags.eviction_hard, &f.eviction_hard) {
        (Some(text), _) => threshold::parse_flag(text)
            .map_err(|why| ConfigError::invalid("--eviction-hard", why.to_string()))?,
        (None, Some(map)) => {
            let mut out = BTreeMap::new();
            for (signal, value) in map {
                let t = threshold::parse_signal_value(signal, value).map_err(|why| {
                    ConfigError::invalid(format!("evictionHard.{signal}"), why.to_string())
                })?;
                out.insert(signal.clone(), t);
            }
            out
        }
        (None, None) => threshold::default_eviction_hard(),
    };
    Ok(Reservations {
        kube_reserved,
        system_reserved,
        eviction_hard,
    })
}

fn reserved(
    flag: Option<&[(String, String)]>,
    flag_name: &str,
    file: Option<&BTreeMap<String, String>>,
    file_name: &str,
) -> Result<BTreeMap<String, Quantity>, ConfigError> {
    let (pairs, origin): (Vec<(String, String)>, &str) = match (flag, file) {
        (Some(pairs), _) => (pairs.to_vec(), flag_name),
        (None, Some(map)) => (
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            file_name,
        ),
        (None, None) => return Ok(BTreeMap::new()),
    };
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        if !RESERVABLE.contains(&name.as_str()) {
            return Err(ConfigError::invalid(
                origin,
                format!(
                    "{name:?} cannot be reserved (use {})",
                    RESERVABLE.join(", ")
                ),
            ));
        }
        let q = quantity::parse(value.trim())
            .map_err(|e| ConfigError::invalid(origin, format!("{name}={value}: {e}")))?;
        if q.is_negative() {
            return Err(ConfigError::invalid(
                origin,
                format!("{name}={value}: must not be negative"),
            ));
        }
        out.insert(name, q);
    }
    Ok(out)
}

/// Label keys a node agent may set on its own Node in the `kubernetes.io` and `k8s.io`
/// namespaces (upstream's list; the NodeRestriction admission plugin refuses the others).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Upstream refuses `--node-labels` in the `kubernetes.io`/`k8s.io` namespaces that a node may
/// not set on itself, at start, rather than letting registration fail later.
fn check_node_labels(labels: &BTreeMap<String, String>) -> Result<(), NodeFlagError> {
    let mut refused = Vec::new();
    for (key, value) in labels {
        crate::base::podspec::labels::check_label_key(key).map_err(|why| {
            NodeFlagError::LabelKey {
                key: key.clone(),
                why,
            }
        })?;
        crate::base::podspec::labels::check_label_value(value).map_err(|why| {
            NodeFlagError::LabelValue {
                key: key.clone(),
                value: value.clone(),
                why,
            }
        })?;
        let namespace = key.split_once('/').map(|(ns, _)| ns).unwrap_or("");
        let in_reserved = namespace == "kubernetes.io"
            || namespace.ends_with(".kubernetes.io")
            || namespace == "k8s.io"
            || namespace.ends_with(".k8s.io");
        let allowed = KUBELET_LABELS.contains(&key.as_str())
            || KUBELET_LABEL_NAMESPACES
                .iter()
                .any(|ns| namespace == *ns || namespace.ends_with(&format!(".{ns}")));
        if in_reserved && !allowed {
            refused.push(key.clone());
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(NodeFlagError::ReservedLabels(refused))
}

/// Why a node flag (`--node-labels`, `--register-with-taints`, `key=value` lists) is refused.
/// The texts are what an operator sees at start.
#[derive(Debug, Error)]
pub(crate) enum NodeFlagError {
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    #[error("{0:?} has an empty key")]
    EmptyKey(String),
    #[error("{0:?} is not key=value:Effect")]
    NotTaint(String),
    #[error("{text:?}: {why}")]
    BadTaint { text: String, why: TaintError },
    #[error("label {key:?}: {why}")]
    LabelKey { key: String, why: LabelError },
    #[error("label {key}={value:?}: {why}")]
    LabelValue {
        key: String,
        value: String,
        why: LabelError,
    },
    #[error(
        "unknown 'kubernetes.io' or 'k8s.io' labels: {}; labels in those namespaces must begin with an allowed prefix ({}) or be one of: {}",
        .0.join(", "),
        KUBELET_LABEL_NAMESPACES.join(", "),
        KUBELET_LABELS.join(", ")
    )]
    ReservedLabels(Vec<String>),
}

/// Which part of a taint is wrong.
#[derive(Debug, Error)]
pub(crate) enum TaintError {
    #[error("key: {0}")]
    Key(LabelError),
    #[error("value: {0}")]
    Value(LabelError),
    #[error("effect {0:?} is not NoSchedule, PreferNoSchedule or NoExecute")]
    Effect(String),
}

/// A taint as `--register-with-taints` writes it: `key=value:Effect` or `key:Effect`.
pub(crate) fn parse_taint(text: &str) -> Result<Taint, NodeFlagError> {
    let (key_value, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| NodeFlagError::NotTaint(text.to_string()))?;
    let (key, value) = match key_value.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (key_value, None),
    };
    let taint = Taint {
        key: key.to_string(),
        value: value.filter(|v| !v.is_empty()),
        effect: effect.to_string(),
        time_added: None,
    };
    check_taint(&taint).map_err(|why| NodeFlagError::BadTaint {
        text: text.to_string(),
        why,
    })?;
    Ok(taint)
}

fn check_taint(t: &Taint) -> Result<(), TaintError> {
    crate::base::podspec::labels::check_label_key(&t.key).map_err(TaintError::Key)?;
    if let Some(v) = &t.value {
        crate::base::podspec::labels::check_label_value(v).map_err(TaintError::Value)?;
    }
    match t.effect.as_str() {
        "NoSchedule" | "PreferNoSchedule" | "NoExecute" => Ok(()),
        other => Err(TaintError::Effect(other.to_string())),
    }
}

/// `key=value` for `--node-labels`, `--kube-reserved` and `--system-reserved`.
pub(crate) fn parse_key_value(item: &str) -> Result<(String, String), NodeFlagError> {
    let (k, v) = item
        .split_once('=')
        .ok_or_else(|| NodeFlagError::NotKeyValue(item.to_string()))?;
    if k.trim().is_empty() {
        return Err(NodeFlagError::EmptyKey(item.to_string()));
    }
    Ok((k.trim().to_string(), v.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn merged(
        args: &[&str],
        file: KubeletConfigurationFile,
    ) -> Result<ClusterSettings, ConfigError> {
        let mut argv = vec!["deckhand"];
        argv.extend_from_slice(args);
        cluster_settings(&Flags::try_parse_from(argv).unwrap(), &file)
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = merged(&[], KubeletConfigurationFile::default()).unwrap();
        assert_eq!(s, ClusterSettings::default());
        assert!(s.register_node);
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (50.0, 100));
        assert_eq!((s.event_record_qps, s.event_burst), (50.0, 100));
        assert_eq!(s.node_lease_duration_seconds, 40);
        assert_eq!(s.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(s.node_status_max_images, 50);
    }

    #[test]
    fn flags_beat_the_file() {
        let file = KubeletConfigurationFile {
            register_node: Some(true),
            kube_api_qps: Some(10.0),
            kube_api_burst: Some(20),
            event_record_qps: Some(3.0),
            event_burst: Some(4),
            register_with_taints: Some(vec![parse_taint("a=b:NoSchedule").unwrap()]),
            node_lease_duration_seconds: Some(8),
            node_status_report_frequency: Some("1m".into()),
            node_status_max_images: Some(-1),
            ..Default::default()
        };
        let s = merged(
            &[
                "--register-node=false",
                "--kube-api-qps=5",
                "--kube-api-burst=7",
                "--event-qps=0",
                "--register-with-taints=dedicated=infra:NoExecute,spot:PreferNoSchedule",
                "--node-labels=tier=edge,node.kubernetes.io/pool=blue",
            ],
            file,
        )
        .unwrap();
        assert!(!s.register_node);
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (5.0, 7));
        assert_eq!((s.event_record_qps, s.event_burst), (0.0, 4));
        assert_eq!(s.register_with_taints.len(), 2);
        assert_eq!(s.register_with_taints[0].key, "dedicated");
        assert_eq!(s.register_with_taints[0].value.as_deref(), Some("infra"));
        assert_eq!(s.register_with_taints[1].value, None);
        assert_eq!(s.register_with_taints[1].effect, "PreferNoSchedule");
        assert_eq!(s.node_labels["tier"], "edge");
        assert_eq!(s.node_lease_duration_seconds, 8);
        assert_eq!(s.node_status_report_frequency, Duration::from_secs(60));
        assert_eq!(s.node_status_max_images, -1);
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: Vec<(Vec<&str>, KubeletConfigurationFile, &str)> = vec![
            (
                vec!["--node-labels=kubernetes.io/role=master"],
                Default::default(),
                "--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels: kubernetes.io/role",
            ),
            (
                vec!["--node-labels=bad key=x"],
                Default::default(),
                "--node-labels: label \"bad key\"",
            ),
            (
                vec![],
                KubeletConfigurationFile {
                    register_with_taints: Some(vec![Taint {
                        key: "k".into(),
                        effect: "Sometimes".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                "registerWithTaints[0]: effect \"Sometimes\"",
            ),
            (
                vec![],
                KubeletConfigurationFile {
                    kube_api_burst: Some(-1),
                    ..Default::default()
                },
                "kubeAPIBurst: -1",
            ),
            (
                vec![],
                KubeletConfigurationFile {
                    node_lease_duration_seconds: Some(0),
                    ..Default::default()
                },
                "nodeLeaseDurationSeconds: 0 must be greater than 0",
            ),
            (
                vec![],
                KubeletConfigurationFile {
                    node_status_max_images: Some(-2),
                    ..Default::default()
                },
                "nodeStatusMaxImages: -2",
            ),
        ];
        for (args, file, want) in cases {
            let err = merged(&args, file).unwrap_err().to_string();
            assert!(
                err.starts_with(want),
                "{args:?}: got {err:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn taints_from_the_flag_are_checked() {
        assert!(parse_taint("k=v:NoSchedule").is_ok());
        assert!(parse_taint("k:NoExecute").is_ok());
        assert!(parse_taint("k=v").is_err());
        assert!(parse_taint("k=v:Never").is_err());
        assert!(parse_taint("=v:NoSchedule").is_err());
    }

    #[test]
    fn reservations_merge_and_validate() {
        let flags = Flags::try_parse_from([
            "deckhand",
            "--kube-reserved=cpu=100m,memory=256Mi",
            "--eviction-hard=memory.available<200Mi",
        ])
        .unwrap();
        let file = KubeletConfigurationFile {
            kube_reserved: Some([("cpu".to_string(), "1".to_string())].into()),
            system_reserved: Some([("ephemeral-storage".to_string(), "1Gi".to_string())].into()),
            ..Default::default()
        };
        let r = reservations(&flags, &file).unwrap();
        assert_eq!(r.kube_reserved["cpu"].milli_value(), 100);
        assert_eq!(r.kube_reserved["memory"].value(), 256 << 20);
        assert_eq!(r.system_reserved["ephemeral-storage"].value(), 1 << 30);
        assert_eq!(
            r.eviction_hard["memory.available"],
            Threshold::Quantity(quantity::parse("200Mi").unwrap())
        );
        // A configured map replaces the defaults whole, as upstream.
        assert_eq!(r.eviction_hard.len(), 1);

        let bad = Flags::try_parse_from(["deckhand", "--system-reserved=gpu=1"]).unwrap();
        let err = reservations(&bad, &KubeletConfigurationFile::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--system-reserved: \"gpu\" cannot be reserved"),
            "{err}"
        );
        let bad = KubeletConfigurationFile {
            eviction_hard: Some([("memory.available".to_string(), "lots".to_string())].into()),
            ..Default::default()
        };
        let err = reservations(&Flags::default(), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("evictionHard.memory.available:"), "{err}");
    }
}
