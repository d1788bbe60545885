//! Table-driven tests of loading: defaults, file, flags, precedence, warnings and errors.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use super::*;

const HOST: &str = "Worker-1";
const CONFIG_PATH: &str = "/etc/deckhand/config.yaml";
const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("flags {args:?}: {e}"))
}

/// Why a section's test helper could not load its settings; the tests match its text.
#[derive(Debug, thiserror::Error)]
pub(super) enum SectionError {
    #[error("flags: {0}")]
    Flags(#[from] clap::Error),
    #[error("file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("parse: {0}")]
    Yaml(#[from] crate::base::yaml::YamlError),
    #[error("{0}")]
    Config(#[from] ConfigError),
}

/// Flags parsed from `args` and a configuration file from JSON `file` (empty: no fields), for
/// the tests of one group of settings (`gc`, `eviction`).
pub(super) fn flags_and_file(
    args: &[&str],
    file: &str,
) -> Result<(Flags, KubeletConfigurationFile), SectionError> {
    let flags = Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))?;
    let f = if file.is_empty() {
        KubeletConfigurationFile::default()
    } else {
        serde_json::from_str(file)?
    };
    Ok((flags, f))
}

/// Loads with the given flags and (when `body` is `Some`) a config file of `HEADER` + body.
fn load_with(args: &[&str], body: Option<&str>) -> Result<Config, ConfigError> {
    let text = body.map(|b| format!("{HEADER}{b}"));
    load_from(
        &flags(args),
        text.as_deref().map(|t| (Path::new(CONFIG_PATH), t)),
        HOST,
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn defaults() -> Config {
    Config {
        node_name: "worker-1".into(),
        node_ip: None,
        root_dir: "/var/lib/kubelet".into(),
        pod_logs_dir: "/var/log/pods".into(),
        container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
        image_service_endpoint: None,
        runtime_request_timeout: secs(120),
        image_pull_progress_deadline: Some(secs(60)),
        static_pod_path: None,
        file_check_frequency: secs(20),
        static_pod_url: None,
        static_pod_url_header: BTreeMap::new(),
        http_check_frequency: secs(20),
        sync_frequency: secs(60),
        address: ip("0.0.0.0"),
        port: 10250,
        read_only_port: 0,
        healthz_port: 10248,
        healthz_bind_address: ip("127.0.0.1"),
        kubeconfig: None,
        bootstrap_kubeconfig: None,
        cert_dir: "/var/lib/kubelet/pki".into(),
        rotate_certificates: false,
        cgroup_driver: CgroupDriver::Cgroupfs,
        cgroup_root: "/".into(),
        cgroups_per_qos: true,
        cluster_domain: None,
        cluster_dns: vec![],
        allowed_unsafe_sysctls: vec![],
        resolv_conf: "/etc/resolv.conf".into(),
        max_pods: 110,
        pod_pids_limit: -1,
        cpu_cfs_quota: true,
        cpu_cfs_quota_period: Duration::from_millis(100),
        enforce_node_allocatable: vec!["pods".into()],
        node_status_update_frequency: secs(10),
        serialize_image_pulls: true,
        max_parallel_image_pulls: None,
        container_log_max_size: "10Mi".into(),
        container_log_max_files: 5,
        crash_loop_max_backoff: secs(300),
        pod_infra_container_image: None,
        verbosity: 0,
        logging_format: super::LoggingFormat::Text,
        volume_stats_agg_period: secs(60),
        cluster: super::ClusterSettings::default(),
        reservations: super::Reservations::default(),
        server: super::ServerSettings::default(),
        gc: super::GcSettings::default(),
        eviction: super::EvictionSettings::default(),
        shutdown: super::ShutdownSettings::default(),
        hardening: super::HardeningSettings::default(),
        config_file: None,
        warnings: vec![],
    }
}

#[test]
fn defaults_with_nothing_given() {
    assert_eq!(load_with(&[], None).unwrap(), defaults());
}

#[test]
fn empty_config_file_body_gives_defaults() {
    let config = load_with(&[], Some("")).unwrap();
    assert_eq!(
        config,
        Config {
            config_file: Some(CONFIG_PATH.into()),
            ..defaults()
        }
    );
}

#[test]
fn file_only() {
    let body = "\
staticPodPath: /etc/kubernetes/manifests
staticPodURL: https://pods.example.com/node
staticPodURLHeader:
  X-Token: [abc]
syncFrequency: 30s
fileCheckFrequency: 5s
httpCheckFrequency: 1m
address: 10.1.2.3
port: 11250
readOnlyPort: 10255
healthzPort: 0
healthzBindAddress: \"::1\"
clusterDomain: cluster.local
clusterDNS: [10.96.0.10, \"fd00::10\"]
runtimeRequestTimeout: 4m
cgroupDriver: systemd
cgroupRoot: /kube
cgroupsPerQOS: false
resolvConf: \"\"
maxPods: 32
podPidsLimit: 1024
podLogsDir: /srv/pod-logs
containerRuntimeEndpoint: /run/crio/crio.sock
imageServiceEndpoint: unix:///run/images.sock
nodeStatusUpdateFrequency: 20s
nodeStatusReportFrequency: 5m
nodeLeaseDurationSeconds: 40
serializeImagePulls: false
maxParallelImagePulls: 4
evictionHard: {memory.available: 100Mi}
evictionPressureTransitionPeriod: 5m
containerLogMaxSize: 50Mi
containerLogMaxFiles: 3
shutdownGracePeriod: 30s
shutdownGracePeriodCriticalPods: 10s
failSwapOn: false
enableServer: true
crashLoopBackOff:
  maxContainerRestartPeriod: 1m
";
    let got = load_with(&[], Some(body)).unwrap();
    let want = Config {
        static_pod_path: Some("/etc/kubernetes/manifests".into()),
        static_pod_url: Some("https://pods.example.com/node".into()),
        static_pod_url_header: BTreeMap::from([("X-Token".to_string(), vec!["abc".to_string()])]),
        sync_frequency: secs(30),
        file_check_frequency: secs(5),
        http_check_frequency: secs(60),
        address: ip("10.1.2.3"),
        port: 11250,
        read_only_port: 10255,
        healthz_port: 0,
        healthz_bind_address: ip("::1"),
        cluster_domain: Some("cluster.local".into()),
        cluster_dns: vec![ip("10.96.0.10"), ip("fd00::10")],
        runtime_request_timeout: secs(240),
        cgroup_driver: CgroupDriver::Systemd,
        cgroup_root: "/kube".into(),
        cgroups_per_qos: false,
        resolv_conf: PathBuf::new(),
        max_pods: 32,
        pod_pids_limit: 1024,
        cpu_cfs_quota: true,
        cpu_cfs_quota_period: Duration::from_millis(100),
        enforce_node_allocatable: vec![],
        pod_logs_dir: "/srv/pod-logs".into(),
        container_runtime_endpoint: "unix:///run/crio/crio.sock".into(),
        image_service_endpoint: Some("unix:///run/images.sock".into()),
        node_status_update_frequency: secs(20),
        serialize_image_pulls: false,
        max_parallel_image_pulls: Some(4),
        container_log_max_size: "50Mi".into(),
        container_log_max_files: 3,
        crash_loop_max_backoff: secs(60),
        config_file: Some(CONFIG_PATH.into()),
        // A configured evictionHard replaces upstream's defaults whole.
        reservations: super::Reservations {
            eviction_hard: crate::base::podspec::threshold::parse_flag("memory.available<100Mi")
                .unwrap(),
            ..Default::default()
        },
        gc: super::GcSettings {
            container_log_max_size_bytes: 50 * 1024 * 1024,
            container_log_max_files: 3,
            ..Default::default()
        },
        shutdown: super::ShutdownSettings {
            grace_period: secs(30),
            grace_period_critical_pods: secs(10),
            by_pod_priority: vec![],
        },
        ..defaults()
    };
    assert_eq!(got, want);
}

#[test]
fn flags_only() {
    let got = load_with(
        &[
            "--container-runtime-endpoint=/run/containerd/other.sock",
            "--image-service-endpoint=/run/img.sock",
            "--pod-manifest-path=/etc/manifests",
            "--manifest-url=http://10.0.0.1:8080/pods",
            "--manifest-url-header=a:1,b:2",
            "--manifest-url-header=a:3",
            "--hostname-override= Node-7.Example.COM ",
            "--node-ip=10.0.0.7",
            "--root-dir=/srv/deckhand",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "-v",
            "5",
            "--healthz-port=0",
            "--healthz-bind-address=0.0.0.0",
            "--read-only-port=10255",
            "--address=127.0.0.1",
            "--port=12250",
            "--sync-frequency=2m",
            "--file-check-frequency=1s",
            "--http-check-frequency=45s",
            "--runtime-request-timeout=30s",
            "--cgroup-driver=systemd",
            "--cgroup-root=/deckhand",
            "--cgroups-per-qos=false",
            "--cluster-domain=corp.local",
            "--cluster-dns=10.0.0.10,10.0.0.11",
            "--resolv-conf=/run/resolv.conf",
            "--max-pods=20",
            "--pod-logs-dir=/srv/logs",
            "--node-status-update-frequency=7s",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
            "--serialize-image-pulls=false",
        ],
        None,
    )
    .unwrap();
    let want = Config {
        node_name: "node-7.example.com".into(),
        node_ip: Some(ip("10.0.0.7")),
        root_dir: "/srv/deckhand".into(),
        pod_logs_dir: "/srv/logs".into(),
        container_runtime_endpoint: "unix:///run/containerd/other.sock".into(),
        image_service_endpoint: Some("unix:///run/img.sock".into()),
        runtime_request_timeout: secs(30),
        static_pod_path: Some("/etc/manifests".into()),
        file_check_frequency: secs(1),
        static_pod_url: Some("http://10.0.0.1:8080/pods".into()),
        static_pod_url_header: BTreeMap::from([
            ("a".to_string(), vec!["1".to_string(), "3".to_string()]),
            ("b".to_string(), vec!["2".to_string()]),
        ]),
        http_check_frequency: secs(45),
        sync_frequency: secs(120),
        address: ip("127.0.0.1"),
        port: 12250,
        read_only_port: 10255,
        healthz_port: 0,
        healthz_bind_address: ip("0.0.0.0"),
        kubeconfig: Some("/etc/kubernetes/kubelet.conf".into()),
        bootstrap_kubeconfig: None,
        cert_dir: "/srv/deckhand/pki".into(),
        rotate_certificates: false,
        cgroup_driver: CgroupDriver::Systemd,
        cgroup_root: "/deckhand".into(),
        cgroups_per_qos: false,
        cluster_domain: Some("corp.local".into()),
        cluster_dns: vec![ip("10.0.0.10"), ip("10.0.0.11")],
        resolv_conf: "/run/resolv.conf".into(),
        max_pods: 20,
        enforce_node_allocatable: vec![],
        node_status_update_frequency: secs(7),
        serialize_image_pulls: false,
        pod_infra_container_image: Some("registry.k8s.io/pause:3.10".into()),
        verbosity: 5,
        ..defaults()
    };
    assert_eq!(got, want);
}

/// One row of the precedence table: a file body, flag args, and a check of the result.
struct Row {
    name: &'static str,
    file: Option<&'static str>,
    args: &'static [&'static str],
    check: fn(&Config),
}

#[test]
fn flags_beat_file_beats_defaults() {
    let rows = [
        Row {
            name: "sync: default",
            file: Some(""),
            args: &[],
            check: |c| assert_eq!(c.sync_frequency, secs(60)),
        },
        Row {
            name: "sync: file",
            file: Some("syncFrequency: 15s\n"),
            args: &[],
            check: |c| assert_eq!(c.sync_frequency, secs(15)),
        },
        Row {
            name: "sync: flag over file",
            file: Some("syncFrequency: 15s\n"),
            args: &["--sync-frequency=1m30s"],
            check: |c| assert_eq!(c.sync_frequency, secs(90)),
        },
        Row {
            name: "port: flag over file",
            file: Some("port: 11000\n"),
            args: &["--port", "12000"],
            check: |c| assert_eq!(c.port, 12000),
        },
        Row {
            name: "readOnlyPort: flag 0 beats file",
            file: Some("readOnlyPort: 10255\n"),
            args: &["--read-only-port=0"],
            check: |c| assert_eq!(c.read_only_port, 0),
        },
        Row {
            name: "cgroupsPerQOS: flag false beats file true",
            file: Some("cgroupsPerQOS: true\n"),
            args: &["--cgroups-per-qos=false"],
            check: |c| assert!(!c.cgroups_per_qos),
        },
        Row {
            name: "cgroupsPerQOS: bare flag is true and beats file false",
            file: Some("cgroupsPerQOS: false\n"),
            args: &["--cgroups-per-qos"],
            check: |c| assert!(c.cgroups_per_qos),
        },
        Row {
            name: "cpuCFSQuota: flag false beats file true, period from the file",
            file: Some("cpuCFSQuota: true\ncpuCFSQuotaPeriod: 50ms\n"),
            args: &["--cpu-cfs-quota=false"],
            check: |c| {
                assert!(!c.cpu_cfs_quota);
                assert_eq!(c.cpu_cfs_quota_period, Duration::from_millis(50));
            },
        },
        Row {
            name: "podPidsLimit: flag beats file",
            file: Some("podPidsLimit: 100\n"),
            args: &["--pod-max-pids=4096"],
            check: |c| assert_eq!(c.pod_pids_limit, 4096),
        },
        Row {
            name: "enforceNodeAllocatable: none and empty mean nothing",
            file: Some("enforceNodeAllocatable: [none]\n"),
            args: &[],
            check: |c| assert!(c.enforce_node_allocatable.is_empty()),
        },
        Row {
            name: "enforceNodeAllocatable: an empty flag beats the file",
            file: Some("enforceNodeAllocatable: [pods]\n"),
            args: &["--enforce-node-allocatable="],
            check: |c| assert!(c.enforce_node_allocatable.is_empty()),
        },
        Row {
            name: "serializeImagePulls: file false kept without flag",
            file: Some("serializeImagePulls: false\n"),
            args: &[],
            check: |c| assert!(!c.serialize_image_pulls),
        },
        Row {
            name: "endpoint: flag over file, both normalized",
            file: Some("containerRuntimeEndpoint: /run/a.sock\n"),
            args: &["--container-runtime-endpoint=/run/b.sock"],
            check: |c| assert_eq!(c.container_runtime_endpoint, "unix:///run/b.sock"),
        },
        Row {
            name: "staticPodPath: flag over file",
            file: Some("staticPodPath: /from/file\n"),
            args: &["--pod-manifest-path=/from/flag"],
            check: |c| assert_eq!(c.static_pod_path, Some("/from/flag".into())),
        },
        Row {
            name: "staticPodPath: empty flag disables the file's",
            file: Some("staticPodPath: /from/file\n"),
            args: &["--pod-manifest-path="],
            check: |c| assert_eq!(c.static_pod_path, None),
        },
        Row {
            name: "staticPodPath: relative in file resolves against the file's directory",
            file: Some("staticPodPath: manifests\n"),
            args: &[],
            check: |c| assert_eq!(c.static_pod_path, Some("/etc/deckhand/manifests".into())),
        },
        Row {
            name: "headers: flag replaces file map",
            file: Some("staticPodURLHeader: {a: [x], b: [y]}\n"),
            args: &["--manifest-url-header=c:z"],
            check: |c| {
                assert_eq!(
                    c.static_pod_url_header,
                    BTreeMap::from([("c".to_string(), vec!["z".to_string()])])
                )
            },
        },
        Row {
            name: "clusterDNS: flag replaces file list",
            file: Some("clusterDNS: [10.0.0.1, 10.0.0.2]\n"),
            args: &["--cluster-dns=10.9.9.9"],
            check: |c| assert_eq!(c.cluster_dns, vec![ip("10.9.9.9")]),
        },
        Row {
            name: "allowedUnsafeSysctls: file list, trimmed",
            file: Some("allowedUnsafeSysctls: [kernel.msg*, ' net.core.somaxconn']\n"),
            args: &[],
            check: |c| {
                assert_eq!(
                    c.allowed_unsafe_sysctls,
                    vec!["kernel.msg*".to_string(), "net.core.somaxconn".to_string()]
                )
            },
        },
        Row {
            name: "allowedUnsafeSysctls: flag replaces file list",
            file: Some("allowedUnsafeSysctls: [kernel.msg*]\n"),
            args: &["--allowed-unsafe-sysctls=net.core.*,fs.mqueue.msg_max"],
            check: |c| {
                assert_eq!(
                    c.allowed_unsafe_sysctls,
                    vec!["net.core.*".to_string(), "fs.mqueue.msg_max".to_string()]
                )
            },
        },
        Row {
            name: "resolvConf: file empty means none",
            file: Some("resolvConf: \"\"\n"),
            args: &[],
            check: |c| assert_eq!(c.resolv_conf, PathBuf::new()),
        },
        Row {
            name: "resolvConf: flag over file",
            file: Some("resolvConf: \"\"\n"),
            args: &["--resolv-conf=/etc/alt-resolv.conf"],
            check: |c| assert_eq!(c.resolv_conf, PathBuf::from("/etc/alt-resolv.conf")),
        },
        Row {
            name: "maxPods: flag over file",
            file: Some("maxPods: 10\n"),
            args: &["--max-pods=11"],
            check: |c| assert_eq!(c.max_pods, 11),
        },
        Row {
            name: "podLogsDir: flag over file",
            file: Some("podLogsDir: /file/logs\n"),
            args: &["--pod-logs-dir=/flag/logs"],
            check: |c| assert_eq!(c.pod_logs_dir, PathBuf::from("/flag/logs")),
        },
        Row {
            name: "cgroupDriver: flag over file",
            file: Some("cgroupDriver: systemd\n"),
            args: &["--cgroup-driver=cgroupfs"],
            check: |c| assert_eq!(c.cgroup_driver, CgroupDriver::Cgroupfs),
        },
        Row {
            name: "cgroupRoot: empty in file means /",
            file: Some("cgroupRoot: \"\"\n"),
            args: &[],
            check: |c| assert_eq!(c.cgroup_root, "/"),
        },
        Row {
            name: "clusterDomain: flag over file",
            file: Some("clusterDomain: file.local\n"),
            args: &["--cluster-domain=flag.local"],
            check: |c| assert_eq!(c.cluster_domain.as_deref(), Some("flag.local")),
        },
        Row {
            name: "healthz: flag over file",
            file: Some("healthzPort: 1\nhealthzBindAddress: 0.0.0.0\n"),
            args: &["--healthz-port=2", "--healthz-bind-address=::"],
            check: |c| {
                assert_eq!(c.healthz_port, 2);
                assert_eq!(c.healthz_bind_address, ip("::"));
            },
        },
        Row {
            name: "manifest url: flag over file",
            file: Some("staticPodURL: http://file/\n"),
            args: &["--manifest-url=https://flag/"],
            check: |c| assert_eq!(c.static_pod_url.as_deref(), Some("https://flag/")),
        },
        Row {
            name: "image endpoint: empty flag clears the file's",
            file: Some("imageServiceEndpoint: /run/img.sock\n"),
            args: &["--image-service-endpoint="],
            check: |c| assert_eq!(c.image_service_endpoint, None),
        },
        Row {
            name: "hostname override: blank falls back to the machine's hostname",
            file: None,
            args: &["--hostname-override=  "],
            check: |c| assert_eq!(c.node_name, "worker-1"),
        },
        Row {
            name: "config path comes from the file text given",
            file: Some(""),
            args: &["--config=/ignored/by/load_from.yaml"],
            check: |c| assert_eq!(c.config_file, Some(PathBuf::from(CONFIG_PATH))),
        },
        Row {
            name: "config path from the flag when no file text is passed",
            file: None,
            args: &["--config=/etc/x.yaml"],
            check: |c| assert_eq!(c.config_file, Some(PathBuf::from("/etc/x.yaml"))),
        },
    ];
    for row in &rows {
        let config = load_with(row.args, row.file)
            .unwrap_or_else(|e| panic!("{}: unexpected error: {e}", row.name));
        // Report the row name if its check panics.
        let result = std::panic::catch_unwind(|| (row.check)(&config));
        assert!(result.is_ok(), "row failed: {}", row.name);
    }
}

#[test]
fn unknown_fields_become_warnings() {
    let config = load_with(
        &[],
        Some("staticPodPth: /etc/kubernetes/manifests\ncrashLoopBackOff:\n  maxRestart: 3\n"),
    )
    .unwrap();
    assert_eq!(
        config.warnings,
        vec![
            format!("config file {CONFIG_PATH}: unknown field \"staticPodPth\" ignored"),
            format!(
                "config file {CONFIG_PATH}: unknown field \"crashLoopBackOff.maxRestart\" ignored"
            ),
        ]
    );
    assert_eq!(config.static_pod_path, None);
}

#[test]
fn validation_errors_name_the_field() {
    // (flags, file body or None, expected full error message)
    let cases: &[(&[&str], Option<&str>, &str)] = &[
        (
            &[],
            Some("readOnlyPort: 70000\n"),
            "readOnlyPort: 70000 is not a valid port",
        ),
        (
            &[],
            Some("healthzPort: -1\n"),
            "healthzPort: -1 is not a valid port",
        ),
        (
            &[],
            Some("port: 65536\n"),
            "port: 65536 is not a valid port",
        ),
        (
            &[],
            Some("port: 0\n"),
            "port: 0 is not a valid port for the node server (must be 1-65535)",
        ),
        (
            &["--port=0"],
            None,
            "--port: 0 is not a valid port for the node server (must be 1-65535)",
        ),
        (
            &[],
            Some("syncFrequency: \"1 minute\"\n"),
            "syncFrequency: invalid duration \"1 minute\": unknown unit \" minute\" (use one of ns, us, µs, ms, s, m, h)",
        ),
        (
            &[],
            Some("fileCheckFrequency: \"10\"\n"),
            "fileCheckFrequency: invalid duration \"10\": missing unit after \"10\" (use one of ns, us, µs, ms, s, m, h)",
        ),
        (
            &[],
            Some("syncFrequency: 0s\n"),
            "syncFrequency: must be greater than 0",
        ),
        (
            &["--sync-frequency=0"],
            None,
            "--sync-frequency: must be greater than 0",
        ),
        (
            &[],
            Some("fileCheckFrequency: 0s\n"),
            "fileCheckFrequency: must be greater than 0",
        ),
        (
            &[],
            Some("httpCheckFrequency: 0s\n"),
            "httpCheckFrequency: must be greater than 0",
        ),
        (
            &["--runtime-request-timeout=0s"],
            Some("runtimeRequestTimeout: 1m\n"),
            "--runtime-request-timeout: must be greater than 0",
        ),
        (
            &[],
            Some("nodeStatusUpdateFrequency: 0ms\n"),
            "nodeStatusUpdateFrequency: must be greater than 0",
        ),
        (&[], Some("maxPods: 0\n"), "maxPods: 0 must be at least 1"),
        (&[], Some("maxPods: -5\n"), "maxPods: -5 must be at least 1"),
        (&["--max-pods=0"], None, "--max-pods: must be at least 1"),
        (
            &[],
            Some("cgroupDriver: cgroupv2\n"),
            "cgroupDriver: \"cgroupv2\" is not a cgroup driver (use cgroupfs or systemd)",
        ),
        (
            &["--cgroup-driver=Systemd"],
            None,
            "--cgroup-driver: \"Systemd\" is not a cgroup driver (use cgroupfs or systemd)",
        ),
        (
            &[],
            Some("containerRuntimeEndpoint: tcp://10.0.0.1:3735\n"),
            "containerRuntimeEndpoint: \"tcp://10.0.0.1:3735\" uses scheme \"tcp\"; Deckhand only speaks CRI over unix sockets (unix:///path)",
        ),
        (
            &["--container-runtime-endpoint=containerd.sock"],
            None,
            "--container-runtime-endpoint: \"containerd.sock\" must be unix:///path/to/socket or an absolute socket path",
        ),
        (
            &[],
            Some("containerRuntimeEndpoint: \"\"\n"),
            "containerRuntimeEndpoint: must not be empty",
        ),
        (
            &[],
            Some("staticPodURL: ftp://example.com/pods\n"),
            "staticPodURL: \"ftp://example.com/pods\" uses scheme \"ftp\"; only http and https are supported",
        ),
        (
            &["--manifest-url=example.com/pods"],
            None,
            "--manifest-url: \"example.com/pods\" is not an absolute http(s) URL",
        ),
        (
            &[],
            Some("clusterDNS: [10.0.0.10, dns.local]\n"),
            "clusterDNS[1]: \"dns.local\" is not an IP address",
        ),
        (
            &[],
            Some("allowedUnsafeSysctls: [kernel.msg*, vm.swappiness]\n"),
            "allowedUnsafeSysctls: \"vm.swappiness\" is not known to be namespaced: it would change the whole node",
        ),
        (
            &["--allowed-unsafe-sysctls=net..x"],
            None,
            "--allowed-unsafe-sysctls: \"net..x\" is not a valid sysctl name (at most 253 characters of lowercase letters, digits, '-' and '_', in parts separated by '.' or '/')",
        ),
        (
            &[],
            Some("address: localhost\n"),
            "address: \"localhost\" is not an IP address",
        ),
        (
            &[],
            Some("podLogsDir: logs\n"),
            "podLogsDir: \"logs\" must be an absolute path",
        ),
        (
            &["--root-dir=state"],
            None,
            "--root-dir: must be an absolute path",
        ),
        (
            &[],
            Some("containerLogMaxFiles: 1\n"),
            "containerLogMaxFiles: 1 must be at least 2",
        ),
        (
            &[],
            Some("containerLogMaxSize: 10MB\n"),
            "containerLogMaxSize: \"10MB\" is not a size quantity (e.g. 10Mi, 500Ki, 1G)",
        ),
        (
            &[],
            Some("maxParallelImagePulls: 0\nserializeImagePulls: false\n"),
            "maxParallelImagePulls: 0 must be at least 1",
        ),
        (
            &[],
            Some("maxParallelImagePulls: 5\n"),
            "maxParallelImagePulls: 5 requires image pulls not to be serialized; set serializeImagePulls to false",
        ),
        (
            &["--serialize-image-pulls=true"],
            Some("maxParallelImagePulls: 5\nserializeImagePulls: false\n"),
            "maxParallelImagePulls: 5 requires image pulls not to be serialized; set --serialize-image-pulls to false",
        ),
        (
            &[],
            Some("crashLoopBackOff:\n  maxContainerRestartPeriod: 10m\n"),
            "crashLoopBackOff.maxContainerRestartPeriod: 10m0s must be between 1s and 5m0s",
        ),
        (
            &[],
            Some("crashLoopBackOff:\n  maxContainerRestartPeriod: 1x\n"),
            "crashLoopBackOff.maxContainerRestartPeriod: invalid duration \"1x\": unknown unit \"x\" (use one of ns, us, µs, ms, s, m, h)",
        ),
        (
            &[],
            Some("podPidsLimit: -2\n"),
            "podPidsLimit: -2 must be -1 (unlimited) or greater",
        ),
        (
            &["--pod-max-pids=-5"],
            None,
            "--pod-max-pids: -5 must be -1 (unlimited) or greater",
        ),
        (
            &["--cpu-cfs-quota-period=2s"],
            None,
            "--cpu-cfs-quota-period: 2s must be between 1ms and 1s, inclusive",
        ),
        (
            &[],
            Some("cpuCFSQuotaPeriod: 500us\n"),
            "cpuCFSQuotaPeriod: 500µs must be between 1ms and 1s, inclusive",
        ),
        (
            &["--enforce-node-allocatable=pods,none"],
            None,
            "--enforce-node-allocatable: may not contain other levels when \"none\" is given",
        ),
        (
            &["--enforce-node-allocatable=pods,pods"],
            None,
            "--enforce-node-allocatable: duplicated enforcement \"pods\"",
        ),
        (
            &[],
            Some("enforceNodeAllocatable: [pods]\ncgroupsPerQOS: false\n"),
            "enforceNodeAllocatable: \"pods\" needs cgroupsPerQOS (--cgroups-per-qos) to be true",
        ),
        (
            &["--enforce-node-allocatable=system-reserved"],
            None,
            "--enforce-node-allocatable: \"system-reserved\" needs a reserved cgroup (--system-reserved-cgroup / --kube-reserved-cgroup), which Deckhand does not support; only \"pods\" and \"none\" are",
        ),
        (
            &[],
            Some("nodeLeaseDurationSeconds: 0\n"),
            "nodeLeaseDurationSeconds: 0 must be greater than 0",
        ),
        (
            &[],
            Some("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n"),
            "shutdownGracePeriodCriticalPods: 20s must not exceed shutdownGracePeriod (10s)",
        ),
        (
            &[],
            Some("evictionPressureTransitionPeriod: soon\n"),
            "evictionPressureTransitionPeriod: invalid duration \"soon\": expected a number at byte 0 (durations look like 10s, 1m30s, 1.5h)",
        ),
        (
            &[],
            Some("cgroupRoot: kubepods\n"),
            "cgroupRoot: \"kubepods\" must be an absolute cgroup path (starting with /)",
        ),
        (
            &[],
            Some("clusterDomain: Cluster_Local\n"),
            "clusterDomain: \"Cluster_Local\" is not a valid DNS subdomain (lowercase letters, digits, '-' and '.')",
        ),
        (
            &["--hostname-override=bad_name"],
            None,
            "--hostname-override: node name \"bad_name\" is not a valid DNS subdomain (lowercase letters, digits, '-' and '.'); set --hostname-override to a valid name",
        ),
        (
            &[],
            Some("staticPodURLHeader: {\"bad header\": [x]}\n"),
            "staticPodURLHeader: \"bad header\" is not a valid HTTP header name",
        ),
    ];
    for (args, body, want) in cases {
        match load_with(args, *body) {
            Err(err @ ConfigError::Invalid { .. }) => {
                assert_eq!(err.to_string(), *want, "args {args:?} body {body:?}")
            }
            other => panic!("args {args:?} body {body:?}: expected Invalid, got {other:?}"),
        }
    }
}

#[test]
fn machine_hostname_is_validated_too() {
    let err = load_from(&Flags::default(), None, "").unwrap_err();
    assert_eq!(
        err.to_string(),
        "hostname: the node name is empty; set --hostname-override"
    );
    let err = load_from(&Flags::default(), None, "my_host").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("hostname: node name \"my_host\""),
        "{err}"
    );
    let config = load_from(&Flags::default(), None, " MyHost.Local \n").unwrap();
    assert_eq!(config.node_name, "myhost.local");
}

#[test]
fn file_level_errors() {
    let path = Path::new(CONFIG_PATH);
    let err = load_from(
        &Flags::default(),
        Some((path, "apiVersion: v1\nkind: Pod\n")),
        HOST,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::WrongKind { .. }), "{err:?}");

    let err = load_from(
        &Flags::default(),
        Some((path, &format!("{HEADER}maxPods: [\n"))),
        HOST,
    )
    .unwrap_err();
    match err {
        ConfigError::Parse { path: p, message } => {
            assert_eq!(p, path);
            assert!(message.contains("line"), "{message}");
        }
        other => panic!("expected Parse, got {other:?}"),
    }

    // A type error names the position too.
    let err = load_from(
        &Flags::default(),
        Some((path, &format!("{HEADER}readOnlyPort: many\n"))),
        HOST,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn load_reads_the_file_and_reports_missing_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    std::fs::write(
        &path,
        format!("{HEADER}maxPods: 7\nstaticPodPath: manifests\nbogus: 1\n"),
    )
    .unwrap();
    let flags = flags(&[
        &format!("--config={}", path.display()),
        "--hostname-override=n1",
    ]);
    let config = load(&flags).unwrap();
    assert_eq!(config.max_pods, 7);
    assert_eq!(config.node_name, "n1");
    assert_eq!(config.config_file, Some(path.clone()));
    assert_eq!(config.static_pod_path, Some(dir.path().join("manifests")));
    assert_eq!(config.warnings.len(), 1);
    assert!(
        config.warnings[0].contains("\"bogus\""),
        "{:?}",
        config.warnings
    );

    let missing = dir.path().join("missing.yaml");
    let flags = Flags {
        config: Some(missing.clone()),
        hostname_override: Some("n1".into()),
        ..Flags::default()
    };
    match load(&flags) {
        Err(ConfigError::Read { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Read, got {other:?}"),
    }

    let big = dir.path().join("big.yaml");
    std::fs::write(&big, vec![b'#'; MAX_CONFIG_FILE_BYTES + 10]).unwrap();
    let flags = Flags {
        config: Some(big),
        hostname_override: Some("n1".into()),
        ..Flags::default()
    };
    assert!(matches!(load(&flags), Err(ConfigError::Parse { .. })));
}

#[test]
fn load_without_override_uses_the_machine_hostname() {
    // Whatever the machine is called, the result is lowercased and trimmed, or an error that
    // points at --hostname-override.
    match load(&Flags::default()) {
        Ok(config) => {
            assert!(!config.node_name.is_empty());
            assert_eq!(config.node_name, config.node_name.to_lowercase());
        }
        Err(err) => assert!(err.to_string().contains("--hostname-override"), "{err}"),
    }
}

#[test]
fn bare_socket_paths_are_normalized() {
    // (flags, file body, runtime endpoint, image endpoint)
    type Case<'a> = (&'a [&'a str], Option<&'a str>, &'a str, Option<&'a str>);
    let cases: &[Case] = &[
        (&[], None, "unix:///run/containerd/containerd.sock", None),
        (
            &["--container-runtime-endpoint=/run/k3s/containerd/containerd.sock"],
            None,
            "unix:///run/k3s/containerd/containerd.sock",
            None,
        ),
        (
            &[],
            Some(
                "containerRuntimeEndpoint: /var/run/crio/crio.sock\nimageServiceEndpoint: /var/run/img.sock\n",
            ),
            "unix:///var/run/crio/crio.sock",
            Some("unix:///var/run/img.sock"),
        ),
        (
            &["--image-service-endpoint=unix:///run/i.sock"],
            None,
            "unix:///run/containerd/containerd.sock",
            Some("unix:///run/i.sock"),
        ),
    ];
    for (args, body, runtime, image) in cases {
        let config = load_with(args, *body).unwrap();
        assert_eq!(
            config.container_runtime_endpoint, *runtime,
            "{args:?} {body:?}"
        );
        assert_eq!(
            config.image_service_endpoint.as_deref(),
            *image,
            "{args:?} {body:?}"
        );
    }
}

#[test]
fn manifest_url_header_flag_builds_the_header_map() {
    type Headers<'a> = &'a [(&'a str, &'a [&'a str])];
    let cases: &[(&[&str], Headers)] = &[
        (&[], &[]),
        (&["--manifest-url-header=a:1"], &[("a", &["1"])]),
        (
            &[
                "--manifest-url-header",
                "a:hello,b:again,c:world",
                "--manifest-url-header",
                "b:beautiful",
            ],
            &[
                ("a", &["hello"]),
                ("b", &["again", "beautiful"]),
                ("c", &["world"]),
            ],
        ),
        (
            &["--manifest-url-header=Authorization:Bearer abc:def"],
            &[("Authorization", &["Bearer abc:def"])],
        ),
    ];
    for (args, want) in cases {
        let config = load_with(args, None).unwrap();
        let want: BTreeMap<String, Vec<String>> = want
            .iter()
            .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_string()).collect()))
            .collect();
        assert_eq!(config.static_pod_url_header, want, "{args:?}");
    }
    for bad in ["--manifest-url-header=novalue", "--manifest-url-header=:x"] {
        assert!(
            Flags::try_parse_from(["deckhand", bad]).is_err(),
            "{bad} accepted"
        );
    }
}

#[test]
fn summary_is_one_line_with_the_essentials() {
    let config = load_with(
        &[
            "--pod-manifest-path=/etc/kubernetes/manifests",
            "--read-only-port=10255",
        ],
        Some("staticPodURL: http://pods.local/x\naddress: \"::\"\n"),
    )
    .unwrap();
    let s = config.summary();
    assert!(!s.contains('\n'), "{s}");
    for part in [
        "node=worker-1",
        "runtime=unix:///run/containerd/containerd.sock",
        "root-dir=/var/lib/kubelet",
        "static-pod-path=/etc/kubernetes/manifests",
        "manifest-url=http://pods.local/x",
        "server=[::]:10250",
        "read-only-port=10255",
        "healthz=127.0.0.1:10248",
        "config=/etc/deckhand/config.yaml",
    ] {
        assert!(s.contains(part), "{part:?} missing from {s}");
    }
    let s = load_with(&["--healthz-port=0"], None).unwrap().summary();
    assert!(
        s.contains("healthz=off") && s.contains("read-only-port=off"),
        "{s}"
    );
    assert!(
        s.contains("manifest-url=none") && s.contains("static-pod-path=none"),
        "{s}"
    );
}

#[test]
fn cgroup_driver_round_trips() {
    for d in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
        assert_eq!(d.to_string().parse::<CgroupDriver>(), Ok(d));
    }
    assert_eq!(CgroupDriver::default(), CgroupDriver::Cgroupfs);
}

#[test]
fn bootstrap_cert_dir_and_rotation() {
    // (args, file body, cert dir, rotate) — or the error's start.
    let with_file = "rotateCertificates: false\n";
    type Case<'a> = (
        &'a [&'a str],
        Option<&'a str>,
        Result<(&'a str, bool), &'a str>,
    );
    let cases: &[Case] = &[
        (&[], None, Ok(("/var/lib/kubelet/pki", false))),
        (&["--root-dir=/srv/d"], None, Ok(("/srv/d/pki", false))),
        (
            &["--cert-dir=/etc/pki/dh"],
            None,
            Ok(("/etc/pki/dh", false)),
        ),
        (
            &["--kubeconfig=/k", "--bootstrap-kubeconfig=/b"],
            None,
            Ok(("/var/lib/kubelet/pki", true)),
        ),
        (
            &["--kubeconfig=/k", "--bootstrap-kubeconfig=/b"],
            Some(with_file),
            Ok(("/var/lib/kubelet/pki", false)),
        ),
        (
            &[
                "--kubeconfig=/k",
                "--bootstrap-kubeconfig=/b",
                "--rotate-certificates",
            ],
            Some(with_file),
            Ok(("/var/lib/kubelet/pki", true)),
        ),
        (
            &["--rotate-certificates=true"],
            None,
            Ok(("/var/lib/kubelet/pki", true)),
        ),
        (
            &["--bootstrap-kubeconfig=/b"],
            None,
            Err("--bootstrap-kubeconfig"),
        ),
        (&["--cert-dir=pki"], None, Err("--cert-dir")),
    ];
    for (args, body, want) in cases {
        let got = load_with(args, *body);
        match (got, want) {
            (Ok(c), Ok((dir, rotate))) => {
                assert_eq!(c.cert_dir, PathBuf::from(dir), "{args:?}");
                assert_eq!(c.rotate_certificates, *rotate, "{args:?}");
            }
            (Err(e), Err(start)) => assert!(e.to_string().contains(start), "{args:?}: {e}"),
            (got, want) => panic!("{args:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn logging_format_and_volume_stats_period() {
    // (args, file body, format and period) — or the start of the error.
    type Case<'a> = (
        &'a [&'a str],
        Option<&'a str>,
        Result<(LoggingFormat, u64), &'a str>,
    );
    let cases: &[Case] = &[
        (&[], None, Ok((LoggingFormat::Text, 60))),
        (
            &["--logging-format=json"],
            None,
            Ok((LoggingFormat::Json, 60)),
        ),
        (
            &[],
            Some("logging:\n  format: json\nvolumeStatsAggPeriod: 5s\n"),
            Ok((LoggingFormat::Json, 5)),
        ),
        (
            &["--logging-format", "text"],
            Some("logging: {format: json}\n"),
            Ok((LoggingFormat::Text, 60)),
        ),
        (
            &[],
            Some("volumeStatsAggPeriod: 0s\n"),
            Ok((LoggingFormat::Text, 0)),
        ),
        (
            &["--logging-format=yaml"],
            None,
            Err("--logging-format: unsupported log format \"yaml\""),
        ),
        (
            &[],
            Some("logging: {format: xml}\n"),
            Err("logging.format: unsupported"),
        ),
        (
            &[],
            Some("volumeStatsAggPeriod: soon\n"),
            Err("volumeStatsAggPeriod: invalid"),
        ),
    ];
    for (args, body, want) in cases {
        match (load_with(args, *body), want) {
            (Ok(c), Ok((format, period))) => {
                assert_eq!(c.logging_format, *format, "{args:?} {body:?}");
                assert_eq!(
                    c.volume_stats_agg_period,
                    secs(*period),
                    "{args:?} {body:?}"
                );
            }
            (Err(e), Err(start)) => {
                assert!(e.to_string().starts_with(start), "{args:?} {body:?}: {e}")
            }
            (got, want) => panic!("{args:?} {body:?}: got {got:?}, want {want:?}"),
        }
    }
}
