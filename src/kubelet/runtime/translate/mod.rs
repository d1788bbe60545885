//! Pure translation of a Pod into CRI requests: `PodSandboxConfig`, `ContainerConfig`, plus the
//! pieces they need (QoS class, spec hash, quantities, DNS, environment, security settings,
//! the sysctl allow-list).
//!
//! Nothing here does I/O: every node fact (log root, resolv.conf contents, cgroup parent, IPs,
//! mount sources) comes in through [`SandboxContext`] / [`ContainerContext`], so each function
//! is covered by golden tests.

pub(crate) mod container;
pub(crate) mod dns;
pub(crate) mod env;
pub(crate) mod sandbox;
pub(crate) mod security;

use k8s_openapi::api::core::v1::{Pod, SELinuxOptions, SeccompProfile};
use thiserror::Error;

use crate::clients::cri::proto::security_profile::ProfileType;
use crate::clients::cri::proto::{NamespaceMode, NamespaceOption, SeLinuxOption, SecurityProfile};

pub(crate) use container::container_config_with_env;
pub(crate) use dns::{HostDns, parse_resolv_conf};
pub(crate) use sandbox::{SandboxContext, pod_sandbox_config};

/// Per-container facts the translation needs. Everything is passed in; nothing is read here.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContainerContext {
    /// Restarts so far; becomes the CRI attempt number and the log file name.
    pub restart_count: u32,
    /// The sandbox's IP (for `status.podIP` env vars).
    pub pod_ip: Option<String>,
    /// The node's IP (for `status.hostIP` env vars).
    pub host_ip: Option<String>,
    /// This node's name (for `spec.nodeName` when the pod does not carry it).
    pub node_name: String,
    /// Node memory capacity in bytes, for the Burstable OOM score. 0 means unknown.
    pub node_memory_capacity: u64,
    /// What the node gives a container that sets no limit (for `resourceFieldRef`).
    pub node_allocatable: crate::base::podspec::resources::NodeAllocatable,
    /// The kubelet-managed hosts file, mounted at `/etc/hosts` (ignored on the host network).
    pub etc_hosts_path: Option<std::path::PathBuf>,
    /// Host file mounted at the container's terminationMessagePath.
    pub termination_log_path: Option<std::path::PathBuf>,
    /// Volume mounts prepared by the volume manager.
    pub extra_mounts: Vec<crate::clients::cri::proto::Mount>,
    /// Where `Localhost` seccomp profiles live (`<root-dir>/seccomp`); empty refuses them.
    pub seccomp_profile_root: std::path::PathBuf,
    /// `seccompDefault`: a container whose pod and own security context set no seccomp
    /// profile runs with the runtime's default profile instead of unconfined.
    pub seccomp_default: bool,
    /// The node's CFS settings, cgroup version and huge page sizes.
    pub resources: crate::kubelet::cm::ContainerSettings,
    /// The pod's user namespace (`kubelet::userns`), the same as its sandbox's.
    pub userns: Option<crate::clients::cri::proto::UserNamespace>,
    /// An ephemeral container's target: the runtime ID of the container whose PID namespace
    /// it joins (`targetContainerName`).
    pub pid_target: Option<String>,
}

/// Why a quantity a container refers to has no usable value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum QuantityProblem {
    #[error(transparent)]
    Parse(#[from] crate::base::podspec::quantity::QuantityError),
    #[error(transparent)]
    ResourceField(#[from] crate::base::podspec::resources::ResourceFieldError),
}

/// Why a pod or container could not be turned into a CRI config. Every variant about a
/// container names it; the pod worker reports these as `CreateContainerConfigError`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum TranslateError {
    #[error("pod has no {0}")]
    MissingPodField(&'static str),

    #[error("container {container:?} has no image")]
    MissingImage { container: String },

    #[error(
        "container {container:?}: env var {var:?} uses {kind}, which this node cannot resolve (no API server access)"
    )]
    UnsupportedEnvSource {
        container: String,
        var: String,
        kind: &'static str,
    },

    #[error(
        "container {container:?}: envFrom {kind} {name:?} cannot be resolved on this node (no API server access)"
    )]
    UnsupportedEnvFrom {
        container: String,
        kind: &'static str,
        name: String,
    },

    /// A configMap or secret the environment needs cannot be had (upstream's message).
    #[error(transparent)]
    Object(#[from] crate::kubelet::api_objects::ObjectError),

    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },

    #[error("container {container:?}: env var {var:?}: unsupported fieldRef path {path:?}")]
    UnsupportedFieldPath {
        container: String,
        var: String,
        path: String,
    },

    #[error("container {container:?}: invalid quantity {value:?} for {field}: {reason}")]
    InvalidQuantity {
        container: String,
        field: String,
        value: String,
        #[source]
        reason: Box<QuantityProblem>,
    },

    #[error("container {container:?}: unsupported port protocol {protocol:?}")]
    InvalidProtocol { container: String, protocol: String },

    #[error("{}: unsupported seccomp profile type {kind:?}", who(.container))]
    UnsupportedSeccomp {
        container: Option<String>,
        kind: String,
    },

    #[error("container {container:?}: {source}")]
    AppArmor {
        container: String,
        #[source]
        source: security::AppArmorError,
    },

    /// `setHostnameAsFQDN` asks for a hostname the kernel cannot hold (upstream's message).
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {len} characters requested)"
    )]
    FqdnTooLong { fqdn: String, len: usize },

    #[error("container {container:?}: cannot encode {what} as JSON: {message}")]
    Json {
        container: String,
        what: &'static str,
        message: String,
    },
}

fn who(container: &Option<String>) -> String {
    match container {
        Some(c) => format!("container {c:?}"),
        None => "pod".to_string(),
    }
}

impl TranslateError {}

pub(crate) use security::{image_user, needs_image_user, verify_run_as_non_root};

/// A pod's identity, checked present once so the rest can use plain strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodMeta {
    pub name: String,
    /// `default` when unset.
    pub namespace: String,
    pub uid: String,
    /// `spec.nodeName`: the node the pod was given to (empty when unset).
    pub node: String,
}

impl PodMeta {
    pub(crate) fn of(pod: &Pod) -> Result<PodMeta, TranslateError> {
        let name = pod
            .metadata
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(TranslateError::MissingPodField("metadata.name"))?;
        let uid = pod
            .metadata
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(TranslateError::MissingPodField("metadata.uid"))?;
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        Ok(PodMeta {
            name,
            namespace,
            uid,
            node,
        })
    }
}

/// Namespace sharing for the pod's sandbox and containers: network and IPC are per pod unless
/// the host's are asked for; PID is per container unless shared in the pod or the host's.
/// The user namespace is the one the pod was given (`kubelet::userns`), for the sandbox and
/// every container alike, as upstream passes it.
pub(crate) fn namespace_options(
    pod: &Pod,
    userns: Option<&crate::clients::cri::proto::UserNamespace>,
) -> NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        spec.and_then(f).unwrap_or(false)
    };
    let mode = |host: bool, otherwise: NamespaceMode| {
        let m = if host { NamespaceMode::Node } else { otherwise };
        m as i32
    };
    let pid_default = if flag(|s| s.share_process_namespace) {
        NamespaceMode::Pod
    } else {
        NamespaceMode::Container
    };
    NamespaceOption {
        network: mode(flag(|s| s.host_network), NamespaceMode::Pod),
        pid: mode(flag(|s| s.host_pid), pid_default),
        ipc: mode(flag(|s| s.host_ipc), NamespaceMode::Pod),
        userns_options: userns.cloned(),
        ..Default::default()
    }
}

/// A container's namespaces: the pod's ([`namespace_options`]), and for an ephemeral container
/// with a target the target's PID namespace, as upstream: only where the container would have
/// a PID namespace of its own (not with `shareProcessNamespace` or `hostPID`, which it shares
/// already).
pub(crate) fn container_namespace_options(
    pod: &Pod,
    userns: Option<&crate::clients::cri::proto::UserNamespace>,
    pid_target: Option<&str>,
) -> NamespaceOption {
    let mut options = namespace_options(pod, userns);
    if let Some(target) = pid_target
        && options.pid == NamespaceMode::Container as i32
    {
        options.pid = NamespaceMode::Target as i32;
        options.target_id = target.to_string();
    }
    options
}

/// CRI form of a seccomp profile. A `Localhost` profile is a file under the node's seccomp
/// profile root (`<root-dir>/seccomp`, as upstream); None for an unknown type, a Localhost
/// profile without a name or one that would leave the root, or no root configured.
pub(crate) fn seccomp_profile(
    p: &SeccompProfile,
    root: &std::path::Path,
) -> Option<SecurityProfile> {
    let (profile_type, localhost_ref) = match p.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Unconfined" => (ProfileType::Unconfined, String::new()),
        "Localhost" => {
            let name = p.localhost_profile.as_deref().unwrap_or_default();
            if root.as_os_str().is_empty() || !is_local_descending_path(name) {
                return None;
            }
            (
                ProfileType::Localhost,
                root.join(name).to_string_lossy().into_owned(),
            )
        }
        _ => return None,
    };
    Some(SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// The seccomp profile a container (`container`: its name) or a sandbox (`None`) gets, as
/// upstream's runtime manager chooses it: the profile asked for (the container's own over the
/// pod's), else `RuntimeDefault` with `seccompDefault` on. Without either, nothing is sent,
/// which the runtime takes as unconfined (upstream sends `Unconfined`: the same).
pub(crate) fn effective_seccomp(
    asked: Option<&SeccompProfile>,
    root: &std::path::Path,
    seccomp_default: bool,
    container: Option<&str>,
) -> Result<Option<SecurityProfile>, TranslateError> {
    match asked {
        Some(p) => {
            seccomp_profile(p, root)
                .map(Some)
                .ok_or_else(|| TranslateError::UnsupportedSeccomp {
                    container: container.map(str::to_string),
                    kind: p.type_.clone(),
                })
        }
        None if seccomp_default => Ok(Some(SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        })),
        None => Ok(None),
    }
}

pub(crate) use crate::base::podspec::apparmor::is_local_descending_path;

pub(crate) fn selinux_option(o: &SELinuxOptions) -> SeLinuxOption {
    SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}
