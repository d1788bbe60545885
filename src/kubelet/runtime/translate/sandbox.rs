//! Pod → `PodSandboxConfig`.

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

use crate::base::cri_labels;
use crate::clients::cri::proto::{
    Int64Value, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, PodSandboxConfig,
    PodSandboxMetadata, PortMapping, Protocol,
};

use super::dns::{self, HostDns};
use super::{
    PodMeta, TranslateError, effective_seccomp, namespace_options, security, selinux_option,
};

/// Node facts a sandbox config depends on. Everything is passed in; nothing is read here.
#[derive(Debug, Clone, Default)]
pub(crate) struct SandboxContext {
    /// Root of the per-pod log directories, e.g. `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
    /// The host's resolver settings (see [`dns::parse_resolv_conf`]).
    pub host_dns: HostDns,
    /// Cluster DNS servers (`--cluster-dns`); empty means ClusterFirst falls back to the host's.
    pub cluster_dns: Vec<String>,
    /// Cluster domain (`--cluster-domain`), e.g. `cluster.local`; empty adds no search domains.
    pub cluster_domain: String,
    /// cgroupfs path of the pod cgroup, e.g. `/kubepods/besteffort/pod<uid>`.
    pub cgroup_parent: Option<String>,
    /// Where `Localhost` seccomp profiles live (`<root-dir>/seccomp`); empty refuses them.
    pub seccomp_profile_root: PathBuf,
    /// `seccompDefault`: a sandbox whose pod sets no seccomp profile gets `RuntimeDefault`.
    pub seccomp_default: bool,
    /// The pod's user namespace (`kubelet::userns`): its mappings with `hostUsers: false`.
    pub userns: Option<crate::clients::cri::proto::UserNamespace>,
}

/// Maximum hostname length (a DNS label).
const MAX_HOSTNAME_LEN: usize = 63;

/// The hostname a pod sees: `spec.hostnameOverride`, else `spec.hostname`, else the pod name, cut to 63 characters with
/// trailing `-`/`.` removed so it stays a valid DNS label.
pub(crate) fn pod_hostname(pod: &Pod) -> String {
    let raw = crate::kubelet::runtime::hosts::hostname_override(pod)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.hostname.as_deref())
                .filter(|h| !h.is_empty())
        })
        .or(pod.metadata.name.as_deref())
        .unwrap_or("");
    let mut cut: &str = raw;
    if cut.len() > MAX_HOSTNAME_LEN {
        // Hostnames are ASCII once validated; stay on a char boundary regardless.
        let mut end = MAX_HOSTNAME_LEN;
        while !cut.is_char_boundary(end) {
            end -= 1;
        }
        cut = &cut[..end];
    }
    cut.trim_end_matches(['-', '.']).to_string()
}

/// The longest FQDN a sandbox's hostname may be: the kernel's nodename field holds 64
/// characters (upstream's `fqdnMaxLen`).
const MAX_FQDN_LEN: usize = 64;

/// The hostname the sandbox is given (the kernel's nodename, which `hostname` prints): the
/// pod's hostname, or with `setHostnameAsFQDN` its FQDN when it has a domain (a `subdomain`),
/// refused when longer than the kernel holds (upstream's `GetNodenameForKernel`).
pub(crate) fn kernel_hostname(pod: &Pod, cluster_domain: &str) -> Result<String, TranslateError> {
    let hostname = pod_hostname(pod);
    let as_fqdn = pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn) == Some(true);
    if !as_fqdn {
        return Ok(hostname);
    }
    let (_, domain) =
        crate::kubelet::runtime::hosts::pod_hostname_and_domain(pod, Some(cluster_domain));
    let Some(domain) = domain.filter(|d| !d.is_empty()) else {
        return Ok(hostname);
    };
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > MAX_FQDN_LEN {
        return Err(TranslateError::FqdnTooLong {
            len: fqdn.len(),
            fqdn,
        });
    }
    Ok(fqdn)
}

pub(crate) use crate::base::safe_names::pod_log_directory;

/// True when the pod uses the node's network namespace.
pub(crate) fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// CRI protocol for a Kubernetes port protocol name (empty means TCP).
pub(crate) fn protocol(name: Option<&str>) -> Option<Protocol> {
    match name.unwrap_or("TCP") {
        "TCP" | "" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        _ => None,
    }
}

/// hostPort mappings of the pod's (regular) containers.
fn port_mappings(pod: &Pod) -> Result<Vec<PortMapping>, TranslateError> {
    let mut out = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(out);
    };
    for c in &spec.containers {
        for port in c.ports.iter().flatten() {
            let host_port = port.host_port.unwrap_or(0);
            if host_port <= 0 {
                continue;
            }
            let proto = protocol(port.protocol.as_deref()).ok_or_else(|| {
                TranslateError::InvalidProtocol {
                    container: c.name.clone(),
                    protocol: port.protocol.clone().unwrap_or_default(),
                }
            })?;
            out.push(PortMapping {
                protocol: proto as i32,
                container_port: port.container_port,
                host_port,
                host_ip: port.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// Labels of a sandbox: the pod's labels, its identity, and Deckhand's marker.
pub(crate) fn sandbox_labels(pod: &Pod, meta: &PodMeta) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(cri_labels::POD_NAME_LABEL.into(), meta.name.clone());
    out.insert(
        cri_labels::POD_NAMESPACE_LABEL.into(),
        meta.namespace.clone(),
    );
    out.insert(cri_labels::POD_UID_LABEL.into(), meta.uid.clone());
    out.insert(
        cri_labels::MANAGED_LABEL.into(),
        cri_labels::MANAGED_VALUE.into(),
    );
    if !meta.node.is_empty() {
        out.insert(cri_labels::NODE_LABEL.into(), meta.node.clone());
    }
    out
}

/// Builds the sandbox config for `pod`. `attempt` counts sandboxes created for this pod UID.
pub(crate) fn pod_sandbox_config(
    pod: &Pod,
    ctx: &SandboxContext,
    attempt: u32,
) -> Result<PodSandboxConfig, TranslateError> {
    let meta = PodMeta::of(pod)?;
    let spec = pod.spec.as_ref();
    let host_network = is_host_network(pod);
    let pod_sc = spec.and_then(|s| s.security_context.as_ref());

    // A sandbox must allow privilege when any container (init included) asks for it.
    let privileged = spec.is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.privileged)
                    .unwrap_or(false)
            })
    });

    let seccomp = effective_seccomp(
        pod_sc.and_then(|sc| sc.seccomp_profile.as_ref()),
        &ctx.seccomp_profile_root,
        ctx.seccomp_default,
        None,
    )?;

    let security_context = LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod, ctx.userns.as_ref())),
        selinux_options: pod_sc
            .and_then(|sc| sc.se_linux_options.as_ref())
            .map(selinux_option),
        run_as_user: pod_sc
            .and_then(|sc| sc.run_as_user)
            .map(|value| Int64Value { value }),
        run_as_group: pod_sc
            .and_then(|sc| sc.run_as_group)
            .map(|value| Int64Value { value }),
        supplemental_groups: security::supplemental_groups(pod),
        supplemental_groups_policy: security::supplemental_groups_policy(pod),
        privileged,
        seccomp,
        ..Default::default()
    };

    let sysctls: HashMap<String, String> = pod_sc
        .and_then(|sc| sc.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();

    let annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    Ok(PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            attempt,
        }),
        // A NODE network namespace has no UTS namespace of its own: the hostname must stay
        // empty or the runtime refuses the sandbox.
        hostname: if host_network {
            String::new()
        } else {
            kernel_hostname(pod, &ctx.cluster_domain)?
        },
        log_directory: pod_log_directory(&ctx.pod_logs_dir, &meta.namespace, &meta.name, &meta.uid)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(dns::pod_dns_config(
            pod,
            &ctx.host_dns,
            &ctx.cluster_dns,
            &ctx.cluster_domain,
        )),
        port_mappings: port_mappings(pod)?,
        labels: sandbox_labels(pod, &meta),
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: ctx.cgroup_parent.clone().unwrap_or_default(),
            security_context: Some(security_context),
            sysctls,
            overhead: None,
            resources: None,
        }),
        windows: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::cri::proto::{DnsConfig, NamespaceMode, NamespaceOption};
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodSecurityContext, PodSpec, SecurityContext, Sysctl,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ctx() -> SandboxContext {
        SandboxContext {
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            host_dns: HostDns {
                servers: vec!["192.168.1.1".into()],
                searches: vec!["lan".into()],
                options: vec![],
            },
            cluster_dns: vec![],
            cluster_domain: "cluster.local".into(),
            cgroup_parent: Some("/kubepods/besteffort/pod0b7e4c2a".into()),
            seccomp_profile_root: PathBuf::from("/var/lib/deckhand/seccomp"),
            seccomp_default: false,
            userns: None,
        }
    }

    #[test]
    fn the_pods_user_namespace_goes_to_the_sandbox_and_its_containers() {
        use crate::clients::cri::proto::{IdMapping, UserNamespace};
        let map = IdMapping {
            host_id: 131072,
            container_id: 0,
            length: 65536,
        };
        let userns = UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: vec![map],
            gids: vec![map],
        };
        let pod: Pod = crate::base::yaml::from_str(
            "metadata: {name: p, namespace: d, uid: u}\nspec:\n  hostUsers: false\n  containers: [{name: c, image: x}]\n",
        )
        .unwrap();
        let with_userns = SandboxContext {
            userns: Some(userns.clone()),
            ..ctx()
        };
        let config = pod_sandbox_config(&pod, &with_userns, 0).unwrap();
        let ns = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.userns_options, Some(userns.clone()));
        let cctx = crate::kubelet::runtime::translate::ContainerContext {
            userns: Some(userns.clone()),
            ..Default::default()
        };
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let config =
            super::super::container::container_config_with_env(&pod, c, &cctx, vec![]).unwrap();
        let ns = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.userns_options, Some(userns));
        // Without one (unit tests, no manager), nothing is said.
        let config = pod_sandbox_config(&pod, &ctx(), 0).unwrap();
        let ns = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.userns_options, None);
    }

    fn web_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("0b7e4c2a".into()),
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                annotations: Some(BTreeMap::from([(
                    "kubernetes.io/config.source".to_string(),
                    "file".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "nginx".into(),
                        image: Some("nginx:1.25".into()),
                        ports: Some(vec![
                            ContainerPort {
                                container_port: 80,
                                host_port: Some(8080),
                                name: Some("http".into()),
                                ..Default::default()
                            },
                            ContainerPort {
                                container_port: 9090,
                                name: Some("metrics".into()),
                                ..Default::default()
                            },
                        ]),
                        ..Default::default()
                    },
                    Container {
                        name: "dns".into(),
                        image: Some("coredns:1.11".into()),
                        ports: Some(vec![ContainerPort {
                            container_port: 53,
                            host_port: Some(5353),
                            protocol: Some("UDP".into()),
                            host_ip: Some("127.0.0.1".into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn golden_web_pod() {
        let cfg = pod_sandbox_config(&web_pod(), &ctx(), 2).unwrap();
        assert_eq!(
            cfg.metadata,
            Some(PodSandboxMetadata {
                name: "web".into(),
                uid: "0b7e4c2a".into(),
                namespace: "shop".into(),
                attempt: 2,
            })
        );
        assert_eq!(cfg.hostname, "web");
        assert_eq!(cfg.log_directory, "/var/log/pods/shop_web_0b7e4c2a");
        assert_eq!(
            cfg.labels,
            map(&[
                ("app", "web"),
                ("io.kubernetes.pod.name", "web"),
                ("io.kubernetes.pod.namespace", "shop"),
                ("io.kubernetes.pod.uid", "0b7e4c2a"),
                ("deckhand.io/managed", "true"),
            ])
        );
        assert_eq!(
            cfg.annotations,
            map(&[("kubernetes.io/config.source", "file")])
        );
        // No cluster DNS configured: ClusterFirst falls back to the host's resolver.
        assert_eq!(
            cfg.dns_config,
            Some(DnsConfig {
                servers: vec!["192.168.1.1".into()],
                searches: vec!["lan".into()],
                options: vec![],
            })
        );
        assert_eq!(
            cfg.port_mappings,
            vec![
                PortMapping {
                    protocol: Protocol::Tcp as i32,
                    container_port: 80,
                    host_port: 8080,
                    host_ip: String::new(),
                },
                PortMapping {
                    protocol: Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into(),
                },
            ]
        );
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/pod0b7e4c2a");
        assert!(linux.sysctls.is_empty());
        let sc = linux.security_context.unwrap();
        assert_eq!(
            sc.namespace_options,
            Some(NamespaceOption {
                network: NamespaceMode::Pod as i32,
                pid: NamespaceMode::Container as i32,
                ipc: NamespaceMode::Pod as i32,
                ..Default::default()
            })
        );
        assert!(!sc.privileged);
        assert_eq!(sc.run_as_user, None);
        assert_eq!(sc.seccomp, None);
    }

    /// `seccompDefault` gives a sandbox whose pod sets no profile `RuntimeDefault`.
    #[test]
    fn seccomp_default_reaches_the_sandbox() {
        let ctx = SandboxContext {
            seccomp_default: true,
            ..ctx()
        };
        let cfg = pod_sandbox_config(&web_pod(), &ctx, 0).unwrap();
        let seccomp = cfg.linux.unwrap().security_context.unwrap().seccomp;
        assert_eq!(
            seccomp.map(|p| p.profile_type),
            Some(crate::clients::cri::proto::security_profile::ProfileType::RuntimeDefault as i32)
        );
    }

    #[test]
    fn host_network_pod_has_no_hostname_and_node_namespaces() {
        let mut pod = web_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.host_network = Some(true);
        spec.host_pid = Some(true);
        spec.host_ipc = Some(true);
        let cfg = pod_sandbox_config(&pod, &ctx(), 0).unwrap();
        assert_eq!(cfg.hostname, "");
        let ns = cfg
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, NamespaceMode::Node as i32);
        assert_eq!(ns.pid, NamespaceMode::Node as i32);
        assert_eq!(ns.ipc, NamespaceMode::Node as i32);
    }

    #[test]
    fn shared_process_namespace_security_and_sysctls() {
        let mut pod = web_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.share_process_namespace = Some(true);
        spec.security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![4000]),
            sysctls: Some(vec![Sysctl {
                name: "net.ipv4.ip_unprivileged_port_start".into(),
                value: "0".into(),
            }]),
            ..Default::default()
        });
        spec.init_containers = Some(vec![Container {
            name: "setup".into(),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let linux = pod_sandbox_config(&pod, &ctx(), 0).unwrap().linux.unwrap();
        assert_eq!(
            linux.sysctls,
            map(&[("net.ipv4.ip_unprivileged_port_start", "0")])
        );
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.namespace_options.unwrap().pid, NamespaceMode::Pod as i32);
        assert_eq!(sc.run_as_user, Some(Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(Int64Value { value: 3000 }));
        assert_eq!(sc.supplemental_groups, vec![2000, 4000]);
        assert!(sc.privileged);
    }

    #[test]
    fn hostname_rules() {
        let mut pod = web_pod();
        pod.spec.as_mut().unwrap().hostname = Some("custom".into());
        assert_eq!(pod_hostname(&pod), "custom");
        pod.spec.as_mut().unwrap().hostname_override = Some("override.example.host".into());
        assert_eq!(pod_hostname(&pod), "override.example.host");
        assert_eq!(
            pod_sandbox_config(&pod, &ctx(), 0).unwrap().hostname,
            "override.example.host"
        );

        let mut long = web_pod();
        long.metadata.name = Some(format!("{}-.x", "a".repeat(61)));
        // 61 a's + "-." is 63 characters; the trailing "-." is trimmed.
        assert_eq!(pod_hostname(&long), "a".repeat(61));

        let mut longer = web_pod();
        longer.metadata.name = Some("b".repeat(80));
        assert_eq!(pod_hostname(&longer), "b".repeat(63));
    }

    #[test]
    fn set_hostname_as_fqdn_gives_the_sandbox_the_fqdn_when_the_pod_has_one() {
        let with = |name: &str, subdomain: Option<&str>, fqdn: Option<bool>| {
            let mut pod = web_pod();
            pod.metadata.name = Some(name.into());
            let spec = pod.spec.as_mut().unwrap();
            spec.subdomain = subdomain.map(str::to_string);
            spec.set_hostname_as_fqdn = fqdn;
            pod_sandbox_config(&pod, &ctx(), 0).map(|c| c.hostname)
        };
        let ns = web_pod().metadata.namespace.unwrap();
        assert_eq!(
            with("web", Some("t"), Some(true)).unwrap(),
            format!("web.t.{ns}.svc.cluster.local")
        );
        // Without a subdomain there is no FQDN: the field changes nothing.
        assert_eq!(with("web", None, Some(true)).unwrap(), "web");
        // Without the field the hostname stays short (`hostname -f` reads /etc/hosts).
        assert_eq!(with("web", Some("t"), None).unwrap(), "web");
        assert_eq!(with("web", Some("t"), Some(false)).unwrap(), "web");
        // Longer than the kernel holds: refused with upstream's message.
        let long = "hostfqdnveryveryveryverylongforfqdntobemorethan64bytes-1";
        let err = with(long, Some("t"), Some(true)).unwrap_err();
        let fqdn = format!("{long}.t.{ns}.svc.cluster.local");
        assert_eq!(
            err.to_string(),
            format!(
                "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is \
                 too long (64 characters is the max, {} characters requested)",
                fqdn.len()
            )
        );
    }

    #[test]
    fn missing_identity_and_bad_protocol_are_errors() {
        let mut pod = web_pod();
        pod.metadata.uid = None;
        assert_eq!(
            pod_sandbox_config(&pod, &ctx(), 0).unwrap_err(),
            TranslateError::MissingPodField("metadata.uid")
        );

        let mut pod = web_pod();
        pod.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()[0]
            .protocol = Some("ICMP".into());
        let err = pod_sandbox_config(&pod, &ctx(), 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"nginx\": unsupported port protocol \"ICMP\""
        );
    }

    #[test]
    fn default_namespace_when_unset() {
        let mut pod = web_pod();
        pod.metadata.namespace = None;
        let cfg = pod_sandbox_config(&pod, &ctx(), 0).unwrap();
        assert_eq!(cfg.metadata.unwrap().namespace, "default");
        assert_eq!(cfg.log_directory, "/var/log/pods/default_web_0b7e4c2a");
    }
}
