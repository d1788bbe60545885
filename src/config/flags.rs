//! Command-line flags, named and interpreted like the upstream kubelet's.
//!
//! Every flag is optional so that "not given" can be told apart from "given with the default
//! value": a flag on the command line overrides the `--config` file, and the file overrides
//! the built-in defaults, which is upstream's precedence.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::duration::{DurationError, parse_go_duration};

/// Deckhand's command line.
#[derive(Debug, Clone, Default, PartialEq, Parser)]
#[command(
    name = "deckhand",
    version,
    about = "Deckhand: a kubelet-compatible node agent that runs pods on containerd over CRI v1",
    long_about = None,
    after_help = "Commands for people on the node (each has --help):\n  \
                  deckhand pods [-o json]          this node's pods, and why one is not running\n  \
                  deckhand validate FILE... [-o json]  check static-pod manifests, run nothing\n  \
                  deckhand version [-o json]"
)]
pub struct Flags {
    /// Path to a KubeletConfiguration file (apiVersion kubelet.config.k8s.io/v1beta1, YAML or
    /// JSON). Flags given on the command line take precedence over values in this file.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// CRI runtime endpoint: unix:///path/to/socket or an absolute socket path.
    /// [default: unix:///run/containerd/containerd.sock]
    #[arg(long, value_name = "ENDPOINT")]
    pub container_runtime_endpoint: Option<String>,

    /// CRI image service endpoint; defaults to the runtime endpoint.
    #[arg(long, value_name = "ENDPOINT")]
    pub image_service_endpoint: Option<String>,

    /// Directory (or single file) of static pod manifests to run (staticPodPath); "" for none.
    #[arg(long, value_name = "PATH", value_parser = parse_path_or_empty)]
    pub pod_manifest_path: Option<PathBuf>,

    /// http(s) URL to fetch static pod manifests from (staticPodURL).
    #[arg(long, value_name = "URL")]
    pub manifest_url: Option<String>,

    /// HTTP headers for --manifest-url requests, as comma-separated key:value pairs. May be
    /// repeated; repeated keys add values in order. Example: --manifest-url-header 'a:hello,b:again'
    /// --manifest-url-header 'b:beautiful'. Replaces staticPodURLHeader from the config file.
    #[arg(long, value_name = "KEY:VALUE", value_delimiter = ',', value_parser = parse_header_pair)]
    pub manifest_url_header: Option<Vec<(String, String)>>,

    /// Use this name as the node name instead of the machine's hostname.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,

    /// IP address of the node (a single address).
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<IpAddr>,

    /// Directory for Deckhand's state (pods, volumes, plugins). [default: /var/lib/kubelet]
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,

    /// Path to a kubeconfig file for talking to an API server. With --bootstrap-kubeconfig it
    /// is written after TLS bootstrap when it is missing or holds no usable certificate.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// A kubeconfig (usually with a bootstrap token) to request the node's client
    /// certificate with when --kubeconfig is missing or unusable (TLS bootstrap).
    #[arg(long, value_name = "PATH")]
    pub bootstrap_kubeconfig: Option<PathBuf>,

    /// Directory of the node's client certificates (kubelet-client-*.pem).
    /// [default: <root-dir>/pki]
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// Renew the client certificate before it expires (true/false).
    /// [default: true with --bootstrap-kubeconfig, else false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub rotate_certificates: Option<bool>,

    /// Log verbosity, 0 (quiet) to 10 (everything). [default: 0]
    #[arg(long = "v", short = 'v', value_name = "LEVEL",
          value_parser = clap::value_parser!(u8).range(0..=10))]
    pub verbosity: Option<u8>,

    /// Log format: text (one line per event for people) or json (one JSON object per line,
    /// upstream's JSON format). [default: text]
    #[arg(long, value_name = "FORMAT")]
    pub logging_format: Option<String>,

    /// Port of the localhost healthz endpoint; 0 disables it. [default: 10248]
    #[arg(long, value_name = "PORT")]
    pub healthz_port: Option<u16>,

    /// Address for the healthz server to listen on. [default: 127.0.0.1]
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<IpAddr>,

    /// Read-only port without authentication; 0 disables it. [default: 0]
    #[arg(long, value_name = "PORT")]
    pub read_only_port: Option<u16>,

    /// IP address for the node server to listen on. [default: 0.0.0.0]
    #[arg(long, value_name = "IP")]
    pub address: Option<IpAddr>,

    /// Port of the node API (HTTPS). [default: 10250]
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,

    #[command(flatten)]
    pub server: super::server::ServerFlags,

    #[command(flatten)]
    pub hardening: super::hardening::HardeningFlags,

    /// Maximum period between syncs of running containers and config. [default: 1m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub sync_frequency: Option<Duration>,

    /// How often to check the static pod path for new manifests. [default: 20s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub file_check_frequency: Option<Duration>,

    /// How often to poll the manifest URL. [default: 20s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub http_check_frequency: Option<Duration>,

    /// Timeout for CRI requests other than long-running ones. [default: 2m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub runtime_request_timeout: Option<Duration>,

    /// An image pull that receives nothing for this long is abandoned and reported as
    /// ErrImagePull (the old dockershim flag, applied through containerd's content service);
    /// 0 disables it. [default: 1m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub image_pull_progress_deadline: Option<Duration>,

    /// Cgroup driver: cgroupfs or systemd; must match the runtime's. [default: cgroupfs]
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,

    /// Root cgroup for pods. [default: /]
    #[arg(long, value_name = "CGROUP")]
    pub cgroup_root: Option<String>,

    /// Create the QoS cgroup hierarchy (true/false). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub cgroups_per_qos: Option<bool>,

    /// Enforce CPU limits with a CFS quota (true/false). [default: true]
    #[arg(long = "cpu-cfs-quota", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub cpu_cfs_quota: Option<bool>,

    /// The CFS period (cpu.cfs_period_us) of every CPU limit, 1ms to 1s. [default: 100ms]
    #[arg(long = "cpu-cfs-quota-period", value_name = "DURATION", value_parser = parse_duration_arg)]
    pub cpu_cfs_quota_period: Option<Duration>,

    /// Maximum number of processes in a pod; -1 for no limit. [default: -1]
    #[arg(long = "pod-max-pids", value_name = "N", allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,

    /// Comma-separated node allocatable enforcement: `pods` limits the kubepods cgroup to
    /// allocatable; `none` (or empty) limits it to capacity only. [default: pods]
    #[arg(long, value_name = "LEVEL,...", value_delimiter = ',', num_args = 0..=1,
          default_missing_value = "")]
    pub enforce_node_allocatable: Option<Vec<String>>,

    /// Cluster DNS domain; containers search it in addition to the host's domains.
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,

    /// Comma-separated list of DNS server IPs for containers.
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    pub cluster_dns: Option<Vec<IpAddr>>,

    /// Comma-separated unsafe sysctls or patterns (ending in `*`) pods may set beyond the safe
    /// set, e.g. `kernel.msg*,net.core.somaxconn`. Only namespaced sysctls can be listed.
    #[arg(long, value_name = "SYSCTL,...", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,

    /// Resolver configuration file used as the basis for container DNS; "" for none.
    /// [default: /etc/resolv.conf]
    #[arg(long, value_name = "PATH", value_parser = parse_path_or_empty)]
    pub resolv_conf: Option<PathBuf>,

    /// Maximum number of pods on this node. [default: 110]
    #[arg(long, value_name = "N")]
    pub max_pods: Option<u32>,

    /// Directory for container logs (podLogsDir). Upstream kubelet only has this in the config
    /// file; Deckhand accepts it as a flag too. [default: /var/log/pods]
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,

    /// How often to post node status. [default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub node_status_update_frequency: Option<Duration>,

    /// Pause (sandbox) image hint. Deprecated upstream; informational only in Deckhand, the
    /// runtime's own sandbox image setting wins.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,

    /// Pull images one at a time (true/false). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub serialize_image_pulls: Option<bool>,

    /// Register the node with the API server (with --kubeconfig). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub register_node: Option<bool>,

    /// Labels to add when registering the node, as key=value pairs separated by commas.
    /// Labels in the kubernetes.io and k8s.io namespaces must be ones a node may set.
    #[arg(long, value_name = "KEY=VALUE,...", value_delimiter = ',',
          value_parser = super::node::parse_key_value)]
    pub node_labels: Option<Vec<(String, String)>>,

    /// Taints to register the node with, as key=value:Effect separated by commas.
    #[arg(long, value_name = "KEY=VALUE:EFFECT,...", value_delimiter = ',',
          value_parser = super::node::parse_taint)]
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,

    /// Queries per second to the API server (kubeAPIQPS); below 0 means no limit. [default: 50]
    #[arg(long, value_name = "QPS")]
    pub kube_api_qps: Option<f32>,

    /// Burst of queries to the API server (kubeAPIBurst). [default: 100]
    #[arg(long, value_name = "N")]
    pub kube_api_burst: Option<u32>,

    /// Events written per second (eventRecordQPS); 0 means no limit. [default: 50]
    #[arg(long, value_name = "QPS")]
    pub event_qps: Option<f32>,

    /// Burst of event writes (eventBurst). [default: 100]
    #[arg(long, value_name = "N")]
    pub event_burst: Option<u32>,

    /// Resources reserved for Kubernetes system daemons, e.g. cpu=200m,memory=500Mi.
    #[arg(long, value_name = "NAME=QUANTITY,...", value_delimiter = ',',
          value_parser = super::node::parse_key_value)]
    pub kube_reserved: Option<Vec<(String, String)>>,

    /// Resources reserved for non-Kubernetes system daemons, e.g. cpu=200m,memory=500Mi.
    #[arg(long, value_name = "NAME=QUANTITY,...", value_delimiter = ',',
          value_parser = super::node::parse_key_value)]
    pub system_reserved: Option<Vec<(String, String)>>,

    /// Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%.
    /// [default: memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%]
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_hard: Option<String>,

    /// Soft eviction thresholds, e.g. memory.available<1.5Gi; each needs a grace period.
    #[arg(long, value_name = "SIGNAL<VALUE,...")]
    pub eviction_soft: Option<String>,

    /// How long each soft threshold must hold before a pod is evicted, e.g.
    /// memory.available=1m30s (evictionSoftGracePeriod).
    #[arg(long, value_name = "SIGNAL=DURATION,...", value_delimiter = ',',
          value_parser = super::node::parse_key_value)]
    pub eviction_soft_grace_period: Option<Vec<(String, String)>>,

    /// How much more than a met threshold must be free again before the pressure ends, e.g.
    /// memory.available=0Mi,nodefs.available=500Mi (evictionMinimumReclaim).
    #[arg(long, value_name = "SIGNAL=QUANTITY,...", value_delimiter = ',',
          value_parser = super::node::parse_key_value)]
    pub eviction_minimum_reclaim: Option<Vec<(String, String)>>,

    /// How long a pressure condition stays true after its threshold was last met
    /// (evictionPressureTransitionPeriod). [default: 5m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub eviction_pressure_transition_period: Option<Duration>,

    /// The longest grace period (seconds) a pod evicted for a soft threshold gets; negative
    /// means the pod's own (evictionMaxPodGracePeriod). [default: 0]
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub eviction_max_pod_grace_period: Option<i32>,

    /// Also run an eviction round when the kernel says memory crossed a memory.available
    /// threshold (cgroup v1 only), not just every monitoring period (kernelMemcgNotification).
    /// [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub kernel_memcg_notification: Option<bool>,

    /// Image use (percent of the image filesystem) above which image GC runs
    /// (imageGCHighThresholdPercent); 100 turns it off. [default: 85]
    #[arg(long, value_name = "PERCENT")]
    pub image_gc_high_threshold: Option<i32>,

    /// Image use (percent) image GC frees down to (imageGCLowThresholdPercent). [default: 80]
    #[arg(long, value_name = "PERCENT")]
    pub image_gc_low_threshold: Option<i32>,

    /// Minimum age of an unused image before image GC may remove it (imageMinimumGCAge).
    /// [default: 2m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub minimum_image_ttl_duration: Option<Duration>,
}

/// A `--manifest-url-header` item that is not a usable `key:value` pair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderPairError {
    #[error("{0:?} is not a key:value pair")]
    NoColon(String),
    #[error("{0:?} has an empty header name")]
    EmptyName(String),
    #[error("{0:?} is not a valid HTTP header name")]
    BadName(String),
}

/// A flag value that Go's `strconv.ParseBool` would not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a boolean (use true or false)")]
pub(crate) struct NotABool(pub String);

/// A duration flag that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {source}")]
pub(crate) struct DurationArgError {
    value: String,
    #[source]
    source: DurationError,
}

/// Parses one `key:value` item of `--manifest-url-header`. The key is trimmed and must be
/// non-empty; the value is everything after the first colon, trimmed, and may be empty.
pub(crate) fn parse_header_pair(item: &str) -> Result<(String, String), HeaderPairError> {
    let Some((key, value)) = item.split_once(':') else {
        return Err(HeaderPairError::NoColon(item.to_string()));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(HeaderPairError::EmptyName(item.to_string()));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
    {
        return Err(HeaderPairError::BadName(key.to_string()));
    }
    Ok((key.to_string(), value.trim().to_string()))
}

/// Booleans as Go's `strconv.ParseBool` reads them (what `--flag=value` accepts upstream).
pub(crate) fn parse_go_bool(value: &str) -> Result<bool, NotABool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(NotABool(value.to_string())),
    }
}

/// Paths where an empty value is meaningful ("none"); clap's own path parser refuses "".
fn parse_path_or_empty(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

pub(super) fn parse_duration_arg(value: &str) -> Result<Duration, DurationArgError> {
    parse_go_duration(value).map_err(|source| DurationArgError {
        value: value.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Flags::command().debug_assert();
    }

    #[test]
    fn no_arguments_means_nothing_given() {
        let flags = Flags::try_parse_from(["deckhand"]).unwrap();
        assert_eq!(flags, Flags::default());
    }

    #[test]
    fn parses_every_flag() {
        let flags = Flags::try_parse_from([
            "deckhand",
            "--config=/etc/deckhand/config.yaml",
            "--container-runtime-endpoint",
            "unix:///run/crio/crio.sock",
            "--image-service-endpoint=unix:///run/img.sock",
            "--pod-manifest-path=/etc/kubernetes/manifests",
            "--manifest-url=http://example.com/pods",
            "--manifest-url-header=a:1,b:2",
            "--hostname-override=Node-A",
            "--node-ip=10.0.0.5",
            "--root-dir=/srv/kubelet",
            "--kubeconfig=/etc/kubeconfig",
            "--v=4",
            "--healthz-port=0",
            "--healthz-bind-address=0.0.0.0",
            "--read-only-port=10255",
            "--address=::",
            "--port=11250",
            "--sync-frequency=30s",
            "--file-check-frequency=5s",
            "--http-check-frequency=1m",
            "--runtime-request-timeout=1m30s",
            "--cgroup-driver=systemd",
            "--cgroup-root=/kubepods",
            "--cgroups-per-qos=false",
            "--cluster-domain=cluster.local",
            "--cluster-dns=10.96.0.10,fd00::a",
            "--resolv-conf=",
            "--max-pods=50",
            "--pod-logs-dir=/logs",
            "--node-status-update-frequency=4s",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
            "--serialize-image-pulls=false",
            "--image-pull-progress-deadline=30s",
            "--allowed-unsafe-sysctls=kernel.msg*,net.core.somaxconn",
            "--register-node=false",
            "--node-labels=a=b,c=",
            "--register-with-taints=k=v:NoSchedule",
            "--kube-api-qps=5",
            "--kube-api-burst=10",
            "--event-qps=0",
            "--event-burst=7",
            "--kube-reserved=cpu=100m",
            "--system-reserved=memory=1Gi",
            "--eviction-hard=memory.available<1Gi",
            "--eviction-soft=memory.available<2Gi",
            "--eviction-soft-grace-period=memory.available=1m",
            "--eviction-minimum-reclaim=memory.available=100Mi",
            "--eviction-pressure-transition-period=30s",
            "--eviction-max-pod-grace-period=-1",
            "--image-gc-high-threshold=90",
            "--image-gc-low-threshold=70",
            "--minimum-image-ttl-duration=5m",
        ])
        .unwrap();
        assert_eq!(
            flags,
            Flags {
                config: Some("/etc/deckhand/config.yaml".into()),
                container_runtime_endpoint: Some("unix:///run/crio/crio.sock".into()),
                image_service_endpoint: Some("unix:///run/img.sock".into()),
                pod_manifest_path: Some("/etc/kubernetes/manifests".into()),
                manifest_url: Some("http://example.com/pods".into()),
                manifest_url_header: Some(vec![("a".into(), "1".into()), ("b".into(), "2".into())]),
                hostname_override: Some("Node-A".into()),
                node_ip: Some("10.0.0.5".parse().unwrap()),
                root_dir: Some("/srv/kubelet".into()),
                kubeconfig: Some("/etc/kubeconfig".into()),
                bootstrap_kubeconfig: None,
                cert_dir: None,
                rotate_certificates: None,
                verbosity: Some(4),
                logging_format: None,
                healthz_port: Some(0),
                healthz_bind_address: Some("0.0.0.0".parse().unwrap()),
                read_only_port: Some(10255),
                address: Some("::".parse().unwrap()),
                port: Some(11250),
                server: Default::default(),
                hardening: Default::default(),
                sync_frequency: Some(Duration::from_secs(30)),
                file_check_frequency: Some(Duration::from_secs(5)),
                http_check_frequency: Some(Duration::from_secs(60)),
                runtime_request_timeout: Some(Duration::from_secs(90)),
                image_pull_progress_deadline: Some(Duration::from_secs(30)),
                cgroup_driver: Some("systemd".into()),
                cgroup_root: Some("/kubepods".into()),
                cgroups_per_qos: Some(false),
                cluster_domain: Some("cluster.local".into()),
                cluster_dns: Some(vec![
                    "10.96.0.10".parse().unwrap(),
                    "fd00::a".parse().unwrap()
                ]),
                resolv_conf: Some("".into()),
                max_pods: Some(50),
                pod_logs_dir: Some("/logs".into()),
                node_status_update_frequency: Some(Duration::from_secs(4)),
                pod_infra_container_image: Some("registry.k8s.io/pause:3.10".into()),
                serialize_image_pulls: Some(false),
                register_node: Some(false),
                node_labels: Some(vec![("a".into(), "b".into()), ("c".into(), "".into())]),
                register_with_taints: Some(vec![
                    super::super::node::parse_taint("k=v:NoSchedule").unwrap()
                ]),
                kube_api_qps: Some(5.0),
                kube_api_burst: Some(10),
                event_qps: Some(0.0),
                event_burst: Some(7),
                kube_reserved: Some(vec![("cpu".into(), "100m".into())]),
                system_reserved: Some(vec![("memory".into(), "1Gi".into())]),
                eviction_hard: Some("memory.available<1Gi".into()),
                eviction_soft: Some("memory.available<2Gi".into()),
                eviction_soft_grace_period: Some(vec![("memory.available".into(), "1m".into())]),
                eviction_minimum_reclaim: Some(vec![("memory.available".into(), "100Mi".into())]),
                eviction_pressure_transition_period: Some(Duration::from_secs(30)),
                eviction_max_pod_grace_period: Some(-1),
                kernel_memcg_notification: None,
                image_gc_high_threshold: Some(90),
                image_gc_low_threshold: Some(70),
                minimum_image_ttl_duration: Some(Duration::from_secs(300)),
                allowed_unsafe_sysctls: Some(vec![
                    "kernel.msg*".into(),
                    "net.core.somaxconn".into()
                ]),
                cpu_cfs_quota: None,
                cpu_cfs_quota_period: None,
                pod_max_pids: None,
                enforce_node_allocatable: None,
            }
        );
    }

    #[test]
    fn boolean_flags() {
        let cases: &[(&[&str], Option<bool>)] = &[
            (&[], None),
            (&["--cgroups-per-qos"], Some(true)),
            (&["--cgroups-per-qos=true"], Some(true)),
            (&["--cgroups-per-qos=false"], Some(false)),
            (&["--cgroups-per-qos=0"], Some(false)),
            (&["--cgroups-per-qos=T"], Some(true)),
            (&["--cgroups-per-qos", "false"], Some(false)),
            (&["--cgroups-per-qos", "--max-pods=3"], Some(true)),
        ];
        for (args, want) in cases {
            let flags =
                Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))
                    .unwrap();
            assert_eq!(flags.cgroups_per_qos, *want, "args {args:?}");
        }
        assert!(Flags::try_parse_from(["deckhand", "--serialize-image-pulls=maybe"]).is_err());
    }

    #[test]
    fn verbosity_short_and_long() {
        for args in [&["-v", "3"][..], &["-v3"], &["--v=3"], &["--v", "3"]] {
            let flags =
                Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))
                    .unwrap();
            assert_eq!(flags.verbosity, Some(3), "args {args:?}");
        }
        assert!(Flags::try_parse_from(["deckhand", "--v=11"]).is_err());
    }

    #[test]
    fn manifest_url_header_items() {
        let flags = Flags::try_parse_from([
            "deckhand",
            "--manifest-url-header",
            "a:hello,b:again,c:world",
            "--manifest-url-header",
            "b:beautiful",
            "--manifest-url-header=Authorization: Bearer x:y",
        ])
        .unwrap();
        let want: Vec<(String, String)> = [
            ("a", "hello"),
            ("b", "again"),
            ("c", "world"),
            ("b", "beautiful"),
            ("Authorization", "Bearer x:y"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(flags.manifest_url_header, Some(want));

        type Expected<'a> = Result<(&'a str, &'a str), ()>;
        let cases: &[(&str, Expected)] = &[
            ("a:b", Ok(("a", "b"))),
            (" X-Token : abc ", Ok(("X-Token", "abc"))),
            ("empty:", Ok(("empty", ""))),
            ("no-colon", Err(())),
            (":value", Err(())),
            ("bad name:v", Err(())),
        ];
        for (item, want) in cases {
            let got = parse_header_pair(item);
            match want {
                Ok((k, v)) => assert_eq!(got, Ok((k.to_string(), v.to_string())), "{item:?}"),
                Err(()) => assert!(got.is_err(), "{item:?} accepted: {got:?}"),
            }
        }
        assert!(Flags::try_parse_from(["deckhand", "--manifest-url-header=oops"]).is_err());
    }

    #[test]
    fn bad_flag_values_name_the_flag() {
        let cases: &[(&str, &str)] = &[
            ("--sync-frequency=1 minute", "--sync-frequency"),
            ("--port=70000", "--port"),
            ("--node-ip=not-an-ip", "--node-ip"),
            ("--cluster-dns=10.0.0.1,bogus", "--cluster-dns"),
        ];
        for (arg, flag) in cases {
            let err = Flags::try_parse_from(["deckhand", arg]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(flag), "{arg}: {msg}");
        }
        let err = Flags::try_parse_from(["deckhand", "--sync-frequency=10"]).unwrap_err();
        assert!(err.to_string().contains("missing unit"), "{err}");
    }
}
