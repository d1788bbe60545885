//! What a configuration asks the agent to be, decided before anything starts: which clients,
//! managers and endpoints exist. [`Plan::for_config`] reads nothing but the [`Config`], so
//! every decision `run` takes from the configuration can be tested as a table; the builders
//! only carry the plan out (what they still decide is a fact of the machine at start: whether
//! a client certificate is there to rotate, whether memory threshold notifications work here).
//!
//! Always started, whatever the configuration: the runtime handshake, the local socket, the
//! heap trim, the PLEG, the pod sources' merge, the pod workers and probes, the disk
//! housekeeping (container GC, image GC, log rotation), the eviction manager and the
//! supervised sync loop.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::{CgroupDriver, Config, ServerSettings};
use crate::endpoints::read_only;
use crate::kubelet::shutdown::plan::PriorityGrace;

/// The parts a configuration asks for, in the order they start.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `cgroupDriver: systemd`: systemd must be running, checked before anything starts.
    pub require_systemd: bool,
    /// With `--kubeconfig`: the API server clients, and with them the API server's pods as a
    /// source, pod status and events written there, mirror pods for static pods, the
    /// configMaps, secrets and tokens pods use, admission that follows the Node's labels and
    /// taints, and the Node's registration, status and Lease. Without: a standalone node.
    pub cluster: Option<ClusterPlan>,
    /// An image service endpoint other than the runtime's: not supported yet, so it is named
    /// in a warning and the runtime endpoint serves images.
    pub ignored_image_endpoint: Option<String>,
    /// Who makes the pod cgroups.
    pub pod_cgroups: PodCgroups,
    /// `healthzPort` (0 = off) on `healthzBindAddress`.
    pub healthz: Option<SocketAddr>,
    /// `readOnlyPort` (0 = off) on `address`.
    pub read_only: Option<SocketAddr>,
    /// The owner-only Unix socket `deckhand pods` reads (always tried; a failure is a warning).
    pub local_socket: PathBuf,
    /// The node API on `address:port` (`enableServer`).
    pub node_api: Option<NodeApiPlan>,
    /// `staticPodPath`: the file source of static pods.
    pub static_pod_path: Option<PathBuf>,
    /// `staticPodURL`: the HTTP source of static pods.
    pub static_pod_url: Option<String>,
    /// No `clusterDNS`: pods with `dnsPolicy: ClusterFirst` get the node's DNS settings, which
    /// is worth a warning at start.
    pub cluster_dns_missing: bool,
    /// `kernelMemcgNotification`: the eviction manager also looks when the kernel says memory
    /// crossed a threshold (where that works; else it says so and polls only).
    pub memcg_notification: bool,
    /// Images the GC and the eviction manager's reclaim never remove (the pause image).
    pub keep_images: Vec<String>,
    /// Graceful node shutdown: the priority buckets, lowest first, when a grace period is
    /// configured (a delay lock from logind, pods stopped in priority order); `None`: off.
    pub graceful_shutdown: Option<Vec<PriorityGrace>>,
}

/// How the agent reaches the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterPlan {
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`: TLS bootstrap replaces a missing or unusable kubeconfig
    /// with one naming a certificate requested by CSR.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `rotateCertificates`: the clients present the certificate of a shared slot that a
    /// rotation loop renews (when the cert dir holds a current client certificate).
    pub rotate_certificates: bool,
    /// The events client's own rate limit: `eventRecordQPS`, or none (-1) when it is 0, so a
    /// burst of events never holds up a status write.
    pub events_qps: f32,
}

/// Who makes the pod cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodCgroups {
    /// `cgroupsPerQOS: false`: the runtime's defaults, no pod-level cgroups.
    Unmanaged,
    /// The systemd driver: the runtime has systemd make the pod slices; pod-level limits and
    /// kubepods enforcement are not applied (a warning at start).
    BySystemd,
    /// The cgroupfs driver with `cgroupsPerQOS`: Deckhand makes `kubepods` and the QoS
    /// cgroups, keeps the QoS cgroups current and removes the cgroups of pods that are gone.
    Managed {
        /// `enforceNodeAllocatable` has `pods`: `kubepods` is limited to allocatable.
        enforce_pods: bool,
    },
}

impl PodCgroups {
    /// Whether Deckhand holds a cgroup manager (and so the QoS loop and the orphan sweep).
    pub fn managed(self) -> bool {
        matches!(self, PodCgroups::Managed { .. })
    }
}

/// The node API (port 10250 by default).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeApiPlan {
    pub addr: SocketAddr,
    pub serving: ServingCert,
    /// `serverTLSBootstrap` without a kubeconfig: no CSR can be sent, which is worth a
    /// warning; `serving` is then the files' or the self-signed certificate.
    pub tls_bootstrap_unavailable: bool,
}

/// Where the node API's serving certificate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ServingCert {
    /// `serverTLSBootstrap` with a kubeconfig: requested by CSR; handshakes fail until the CSR
    /// is approved and signed.
    Csr,
    /// `tlsCertFile` and `tlsPrivateKeyFile`.
    Files { cert: PathBuf, key: PathBuf },
    /// A self-signed certificate kept in the cert dir (made when missing).
    SelfSigned { cert: PathBuf, key: PathBuf },
}

impl Plan {
    /// The plan `config` asks for. Pure: reads no file and no environment.
    pub fn for_config(config: &Config) -> Plan {
        let buckets = config.shutdown.buckets();
        Plan {
            require_systemd: config.cgroup_driver == CgroupDriver::Systemd,
            cluster: ClusterPlan::for_config(config),
            ignored_image_endpoint: config
                .image_service_endpoint
                .clone()
                .filter(|ep| ep != &config.container_runtime_endpoint),
            pod_cgroups: PodCgroups::for_config(config),
            healthz: (config.healthz_port != 0)
                .then(|| SocketAddr::new(config.healthz_bind_address, config.healthz_port)),
            read_only: (config.read_only_port != 0)
                .then(|| SocketAddr::new(config.address, config.read_only_port)),
            local_socket: read_only::local_socket_path(&config.root_dir),
            node_api: config
                .server
                .enable_server
                .then(|| NodeApiPlan::for_config(config)),
            static_pod_path: config.static_pod_path.clone(),
            static_pod_url: config.static_pod_url.clone(),
            cluster_dns_missing: config.cluster_dns.is_empty(),
            memcg_notification: config.eviction.kernel_memcg_notification,
            keep_images: config.pod_infra_container_image.iter().cloned().collect(),
            graceful_shutdown: (!buckets.is_empty()).then_some(buckets),
        }
    }
}

impl ClusterPlan {
    fn for_config(config: &Config) -> Option<ClusterPlan> {
        let kubeconfig = config.kubeconfig.clone()?;
        Some(ClusterPlan {
            kubeconfig,
            bootstrap_kubeconfig: config.bootstrap_kubeconfig.clone(),
            rotate_certificates: config.rotate_certificates,
            events_qps: if config.cluster.event_record_qps > 0.0 {
                config.cluster.event_record_qps
            } else {
                -1.0
            },
        })
    }
}

impl PodCgroups {
    fn for_config(config: &Config) -> PodCgroups {
        if !config.cgroups_per_qos {
            PodCgroups::Unmanaged
        } else if config.cgroup_driver == CgroupDriver::Systemd {
            PodCgroups::BySystemd
        } else {
            PodCgroups::Managed {
                enforce_pods: config
                    .enforce_node_allocatable
                    .iter()
                    .any(|l| l == crate::config::ENFORCE_PODS),
            }
        }
    }
}

impl NodeApiPlan {
    fn for_config(config: &Config) -> NodeApiPlan {
        let tls_bootstrap = config.server.server_tls_bootstrap;
        let serving = match &config.server.tls_files {
            _ if tls_bootstrap && config.kubeconfig.is_some() => ServingCert::Csr,
            Some((cert, key)) => ServingCert::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            None => {
                let (cert, key) = ServerSettings::self_signed_paths(&config.cert_dir);
                ServingCert::SelfSigned { cert, key }
            }
        };
        NodeApiPlan {
            addr: SocketAddr::new(config.address, config.port),
            serving,
            tls_bootstrap_unavailable: tls_bootstrap && config.kubeconfig.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::config::{Flags, load_from};

    const HOST: &str = "worker-1";
    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    /// A configuration as `deckhand ARGS` with a config file of `body` (when given) loads it.
    fn config(args: &[&str], body: Option<&str>) -> Config {
        let flags = Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("flags {args:?}: {e}"));
        let text = body.map(|b| format!("{HEADER}{b}"));
        let file = text
            .as_deref()
            .map(|t| (Path::new("/etc/deckhand/config.yaml"), t));
        load_from(&flags, file, HOST).unwrap_or_else(|e| panic!("config {args:?}: {e}"))
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The plan of upstream's defaults: a standalone node with healthz on localhost, no
    /// read-only port, the node API with a self-signed certificate, managed pod cgroups.
    fn defaults() -> Plan {
        Plan {
            require_systemd: false,
            cluster: None,
            ignored_image_endpoint: None,
            pod_cgroups: PodCgroups::Managed { enforce_pods: true },
            healthz: Some(addr("127.0.0.1:10248")),
            read_only: None,
            local_socket: "/var/lib/kubelet/deckhand.sock".into(),
            node_api: Some(NodeApiPlan {
                addr: addr("0.0.0.0:10250"),
                serving: ServingCert::SelfSigned {
                    cert: "/var/lib/kubelet/pki/kubelet.crt".into(),
                    key: "/var/lib/kubelet/pki/kubelet.key".into(),
                },
                tls_bootstrap_unavailable: false,
            }),
            static_pod_path: None,
            static_pod_url: None,
            cluster_dns_missing: true,
            memcg_notification: false,
            keep_images: vec![],
            graceful_shutdown: None,
        }
    }

    fn cluster(kubeconfig: &str) -> ClusterPlan {
        ClusterPlan {
            kubeconfig: kubeconfig.into(),
            bootstrap_kubeconfig: None,
            rotate_certificates: false,
            events_qps: 50.0,
        }
    }

    fn node_api(plan: &mut Plan) -> &mut NodeApiPlan {
        plan.node_api
            .as_mut()
            .expect("the default plan has a node API")
    }

    struct Case {
        name: &'static str,
        args: &'static [&'static str],
        file: Option<&'static str>,
        /// What differs from [`defaults`].
        expect: fn(&mut Plan),
    }

    const CASES: &[Case] = &[
        Case {
            name: "upstream's defaults",
            args: &[],
            file: None,
            expect: |_| {},
        },
        Case {
            name: "a kubeconfig: the cluster's parts, events at eventRecordQPS",
            args: &["--kubeconfig", "/etc/kubernetes/kubelet.conf"],
            file: None,
            expect: |p| p.cluster = Some(cluster("/etc/kubernetes/kubelet.conf")),
        },
        Case {
            name: "TLS bootstrap and client certificate rotation",
            args: &[
                "--kubeconfig",
                "/etc/kubernetes/kubelet.conf",
                "--bootstrap-kubeconfig",
                "/etc/kubernetes/bootstrap.conf",
                "--rotate-certificates",
            ],
            file: None,
            expect: |p| {
                p.cluster = Some(ClusterPlan {
                    bootstrap_kubeconfig: Some("/etc/kubernetes/bootstrap.conf".into()),
                    rotate_certificates: true,
                    ..cluster("/etc/kubernetes/kubelet.conf")
                })
            },
        },
        Case {
            name: "eventRecordQPS 0: events are not rate-limited",
            args: &["--kubeconfig", "/k.conf", "--event-qps", "0"],
            file: None,
            expect: |p| {
                p.cluster = Some(ClusterPlan {
                    events_qps: -1.0,
                    ..cluster("/k.conf")
                })
            },
        },
        Case {
            name: "eventRecordQPS given",
            args: &["--kubeconfig", "/k.conf", "--event-qps", "5"],
            file: None,
            expect: |p| {
                p.cluster = Some(ClusterPlan {
                    events_qps: 5.0,
                    ..cluster("/k.conf")
                })
            },
        },
        Case {
            name: "healthz off, read-only port on at address",
            args: &[
                "--healthz-port",
                "0",
                "--read-only-port",
                "10255",
                "--address",
                "10.0.0.5",
            ],
            file: None,
            expect: |p| {
                p.healthz = None;
                p.read_only = Some(addr("10.0.0.5:10255"));
                node_api(p).addr = addr("10.0.0.5:10250");
            },
        },
        Case {
            name: "healthz on its own bind address and port",
            args: &[
                "--healthz-bind-address",
                "0.0.0.0",
                "--healthz-port",
                "9248",
            ],
            file: None,
            expect: |p| p.healthz = Some(addr("0.0.0.0:9248")),
        },
        Case {
            name: "the local socket follows the root dir, and so the cert dir",
            args: &["--root-dir", "/data/kubelet"],
            file: None,
            expect: |p| {
                p.local_socket = "/data/kubelet/deckhand.sock".into();
                node_api(p).serving = ServingCert::SelfSigned {
                    cert: "/data/kubelet/pki/kubelet.crt".into(),
                    key: "/data/kubelet/pki/kubelet.key".into(),
                };
            },
        },
        Case {
            name: "no node API (enableServer: false)",
            args: &[],
            file: Some("enableServer: false\n"),
            expect: |p| p.node_api = None,
        },
        Case {
            name: "node API on another port with the given certificate",
            args: &[
                "--port",
                "11250",
                "--tls-cert-file",
                "/etc/tls/node.crt",
                "--tls-private-key-file",
                "/etc/tls/node.key",
            ],
            file: None,
            expect: |p| {
                let api = node_api(p);
                api.addr = addr("0.0.0.0:11250");
                api.serving = ServingCert::Files {
                    cert: "/etc/tls/node.crt".into(),
                    key: "/etc/tls/node.key".into(),
                };
            },
        },
        Case {
            name: "serverTLSBootstrap with a kubeconfig: the serving certificate by CSR",
            args: &[
                "--kubeconfig",
                "/k.conf",
                "--rotate-server-certificates",
                "--tls-cert-file",
                "/etc/tls/node.crt",
                "--tls-private-key-file",
                "/etc/tls/node.key",
            ],
            file: None,
            expect: |p| {
                p.cluster = Some(cluster("/k.conf"));
                node_api(p).serving = ServingCert::Csr;
            },
        },
        Case {
            name: "serverTLSBootstrap without a kubeconfig: self-signed, with a warning",
            args: &["--rotate-server-certificates"],
            file: None,
            expect: |p| node_api(p).tls_bootstrap_unavailable = true,
        },
        Case {
            name: "serverTLSBootstrap without a kubeconfig, certificate files given",
            args: &[
                "--rotate-server-certificates",
                "--tls-cert-file",
                "/etc/tls/node.crt",
                "--tls-private-key-file",
                "/etc/tls/node.key",
            ],
            file: None,
            expect: |p| {
                let api = node_api(p);
                api.tls_bootstrap_unavailable = true;
                api.serving = ServingCert::Files {
                    cert: "/etc/tls/node.crt".into(),
                    key: "/etc/tls/node.key".into(),
                };
            },
        },
        Case {
            name: "the systemd driver: systemd required, slices by systemd",
            args: &["--cgroup-driver", "systemd"],
            file: None,
            expect: |p| {
                p.require_systemd = true;
                p.pod_cgroups = PodCgroups::BySystemd;
            },
        },
        Case {
            name: "the systemd driver without cgroupsPerQOS",
            args: &["--cgroup-driver", "systemd", "--cgroups-per-qos=false"],
            file: None,
            expect: |p| {
                p.require_systemd = true;
                p.pod_cgroups = PodCgroups::Unmanaged;
            },
        },
        Case {
            name: "no cgroupsPerQOS",
            args: &["--cgroups-per-qos=false"],
            file: None,
            expect: |p| p.pod_cgroups = PodCgroups::Unmanaged,
        },
        Case {
            name: "kubepods not limited to allocatable",
            args: &["--enforce-node-allocatable="],
            file: None,
            expect: |p| {
                p.pod_cgroups = PodCgroups::Managed {
                    enforce_pods: false,
                }
            },
        },
        Case {
            name: "static pods from a directory and a URL",
            args: &[
                "--pod-manifest-path",
                "/etc/kubernetes/manifests",
                "--manifest-url",
                "https://pods.example.com/node",
            ],
            file: None,
            expect: |p| {
                p.static_pod_path = Some("/etc/kubernetes/manifests".into());
                p.static_pod_url = Some("https://pods.example.com/node".into());
            },
        },
        Case {
            name: "clusterDNS given: no warning",
            args: &["--cluster-dns", "10.96.0.10"],
            file: None,
            expect: |p| p.cluster_dns_missing = false,
        },
        Case {
            name: "a separate image endpoint is named and ignored",
            args: &["--image-service-endpoint", "unix:///run/images.sock"],
            file: None,
            expect: |p| p.ignored_image_endpoint = Some("unix:///run/images.sock".into()),
        },
        Case {
            name: "the image endpoint equal to the runtime's is no warning",
            args: &[
                "--image-service-endpoint",
                "unix:///run/containerd/containerd.sock",
            ],
            file: None,
            expect: |_| {},
        },
        Case {
            name: "kernel memcg notification",
            args: &["--kernel-memcg-notification"],
            file: None,
            expect: |p| p.memcg_notification = true,
        },
        Case {
            name: "the pause image is kept from GC and reclaim",
            args: &["--pod-infra-container-image", "registry.k8s.io/pause:3.10"],
            file: None,
            expect: |p| p.keep_images = vec!["registry.k8s.io/pause:3.10".into()],
        },
        Case {
            name: "graceful shutdown with a grace period",
            args: &[],
            file: Some("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n"),
            expect: |p| {
                p.graceful_shutdown = Some(crate::config::shutdown::buckets(
                    Duration::from_secs(30),
                    Duration::from_secs(10),
                    &[],
                ))
            },
        },
    ];

    #[test]
    fn each_configuration_gives_its_plan() {
        let wrong: Vec<String> = CASES
            .iter()
            .filter_map(|case| {
                let mut want = defaults();
                (case.expect)(&mut want);
                let got = Plan::for_config(&config(case.args, case.file));
                (got != want).then(|| format!("{}:\n got {got:?}\nwant {want:?}", case.name))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn graceful_shutdown_stops_critical_pods_last() {
        let plan = Plan::for_config(&config(
            &[],
            Some("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n"),
        ));
        let buckets = plan.graceful_shutdown.expect("on with a grace period");
        assert_eq!(buckets.len(), 2, "{buckets:?}");
        assert!(buckets[0].priority < buckets[1].priority, "{buckets:?}");
    }

    #[test]
    fn only_managed_pod_cgroups_have_a_manager() {
        assert!(
            PodCgroups::Managed {
                enforce_pods: false
            }
            .managed()
        );
        assert!(!PodCgroups::BySystemd.managed());
        assert!(!PodCgroups::Unmanaged.managed());
    }
}
