//! Pod + container → `ContainerConfig`.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::base::cri_labels;
use crate::clients::cri::proto::{
    Capability, ContainerConfig, ContainerMetadata, HugepageLimit, ImageSpec, Int64Value,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext, Mount,
};
use crate::kubelet::cm::pod_config::{milli_cpu_to_quota, milli_cpu_to_shares};

use super::{
    ContainerContext, PodMeta, TranslateError, container_namespace_options, effective_seccomp, env,
    namespace_options, security, selinux_option,
};
use crate::base::podspec::qos::{QosClass, qos_class};
use crate::base::podspec::quantity::{self, Quantity};
use crate::base::podspec::spec_hash::{container_hash, format_hash};

/// Where a container writes its termination message unless the spec says otherwise.
pub(crate) const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// Default terminationMessagePolicy.
pub(crate) const DEFAULT_TERMINATION_MESSAGE_POLICY: &str = "File";

/// OOM score adjustments, as upstream.
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
use crate::base::podspec::pod::SYSTEM_CRITICAL_PRIORITY;

/// The log file of one container instance, relative to the sandbox log directory.
pub(crate) fn container_log_path(container_name: &str, restart_count: u32) -> String {
    format!("{container_name}/{restart_count}.log")
}

/// Labels of a runtime container: its pod's identity, its name, Deckhand's marker.
pub(crate) fn container_labels(meta: &PodMeta, container_name: &str) -> HashMap<String, String> {
    let mut out = HashMap::from([
        (cri_labels::POD_NAME_LABEL.to_string(), meta.name.clone()),
        (
            cri_labels::POD_NAMESPACE_LABEL.to_string(),
            meta.namespace.clone(),
        ),
        (cri_labels::POD_UID_LABEL.to_string(), meta.uid.clone()),
        (
            cri_labels::CONTAINER_NAME_LABEL.to_string(),
            container_name.to_string(),
        ),
        (
            cri_labels::MANAGED_LABEL.to_string(),
            cri_labels::MANAGED_VALUE.to_string(),
        ),
    ]);
    if !meta.node.is_empty() {
        out.insert(cri_labels::NODE_LABEL.to_string(), meta.node.clone());
    }
    out
}

fn is_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == name))
}

fn termination_message_path(c: &Container) -> &str {
    c.termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH)
}

fn container_annotations(
    pod: &Pod,
    c: &Container,
    restart_count: u32,
) -> Result<HashMap<String, String>, TranslateError> {
    let mut out = HashMap::from([
        (
            cri_labels::CONTAINER_HASH_ANNOTATION.to_string(),
            format_hash(container_hash(c)),
        ),
        (
            cri_labels::CONTAINER_RESTART_COUNT_ANNOTATION.to_string(),
            restart_count.to_string(),
        ),
        (
            cri_labels::CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION.to_string(),
            termination_message_path(c).to_string(),
        ),
        (
            cri_labels::CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION.to_string(),
            c.termination_message_policy
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_POLICY.to_string()),
        ),
        (
            cri_labels::CONTAINER_TYPE_ANNOTATION.to_string(),
            if is_init_container(pod, &c.name) {
                cri_labels::CONTAINER_TYPE_INIT
            } else if crate::base::podspec::ephemeral::is_ephemeral(pod, &c.name) {
                cri_labels::CONTAINER_TYPE_EPHEMERAL
            } else {
                cri_labels::CONTAINER_TYPE_REGULAR
            }
            .to_string(),
        ),
    ]);
    if let Some(grace) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        out.insert(
            cri_labels::POD_TERMINATION_GRACE_PERIOD_ANNOTATION.to_string(),
            grace.to_string(),
        );
    }
    if let Some(grace) = pod.metadata.deletion_grace_period_seconds {
        out.insert(
            cri_labels::POD_DELETION_GRACE_PERIOD_ANNOTATION.to_string(),
            grace.to_string(),
        );
    }
    let json_err = |what: &'static str| {
        move |e: serde_json::Error| TranslateError::Json {
            container: c.name.clone(),
            what,
            message: e.to_string(),
        }
    };
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        out.insert(
            cri_labels::CONTAINER_PRE_STOP_HANDLER_ANNOTATION.to_string(),
            serde_json::to_string(pre_stop).map_err(json_err("the preStop handler"))?,
        );
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty()) {
        out.insert(
            cri_labels::CONTAINER_PORTS_ANNOTATION.to_string(),
            serde_json::to_string(ports).map_err(json_err("the ports"))?,
        );
    }
    Ok(out)
}

/// The quantity at `resources.<section>[name]`, zero included, or None when absent.
fn resource_any(
    c: &Container,
    section: &'static str,
    name: &str,
) -> Result<Option<Quantity>, TranslateError> {
    let res = c.resources.as_ref();
    let map = match section {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        _ => res.and_then(|r| r.requests.as_ref()),
    };
    let Some(raw) = map.and_then(|m| m.get(name)) else {
        return Ok(None);
    };
    quantity::parse(&raw.0)
        .map(Some)
        .map_err(|e| TranslateError::InvalidQuantity {
            container: c.name.clone(),
            field: format!("resources.{section}.{name}"),
            value: raw.0.clone(),
            reason: Box::new(e.into()),
        })
}

/// A non-zero quantity from `resources.<section>[name]`, or None when absent or zero.
fn resource(
    c: &Container,
    section: &'static str,
    name: &str,
) -> Result<Option<Quantity>, TranslateError> {
    Ok(resource_any(c, section, name)?.filter(|q| !q.is_zero()))
}

/// A container's memory request for the OOM score: the request, else the limit (API-server
/// defaulting, which pods from files never went through), else 0.
fn memory_request(c: &Container) -> i128 {
    resource_any(c, "requests", "memory")
        .ok()
        .flatten()
        .or_else(|| resource(c, "limits", "memory").ok().flatten())
        .map(|q| i128::from(q.value().max(0)))
        .unwrap_or(0)
}

/// Upstream's `IsNodeCriticalPod`: a critical pod (static, mirror, or of system-critical
/// priority) of the `system-node-critical` class.
fn is_node_critical(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.priority_class_name.as_deref()) != Some("system-node-critical") {
        return false;
    }
    let annotations = pod.metadata.annotations.as_ref();
    let source = annotations.and_then(|a| a.get("kubernetes.io/config.source"));
    let is_static = source.is_some_and(|s| s != "api");
    let is_mirror = annotations.is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let critical_priority = spec
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    is_static || is_mirror || critical_priority
}

/// What each container adds to its own memory request for the OOM score under a pod-level
/// memory request: the part of the pod's request its containers do not request, shared
/// equally among all of them (upstream's `remainingPodMemReqPerContainer`); 0 without one.
fn pod_memory_request_share(pod: &Pod) -> i128 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    if !crate::base::podspec::pod_level::requests_set(pod) {
        return 0;
    }
    let pod_request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .and_then(|q| quantity::parse(&q.0).ok())
        .map_or(0, |q| i128::from(q.value().max(0)));
    if pod_request == 0 {
        return 0;
    }
    let summed = crate::kubelet::cm::pod_config::container_requests_sum(pod)
        .get("memory")
        .copied()
        .unwrap_or(0);
    let count = spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len);
    (pod_request - summed).max(0) / i128::try_from(count.max(1)).unwrap_or(1)
}

/// OOM score adjustment of a container, by its pod's QoS class (upstream's
/// `GetContainerOOMScoreAdjust`). A Burstable container scores
/// `1000 - 1000 × memory request / node capacity`, kept within 3..=999 so it always ranks
/// between Guaranteed and BestEffort containers; a sidecar never scores above the regular
/// container with the smallest request.
pub(crate) fn oom_score_adj(pod: &Pod, c: &Container, node_memory_capacity: u64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos_class(pod) {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let capacity = i128::from(node_memory_capacity);
            let score = |request: i128| {
                if capacity > 0 {
                    1000 - (1000 * request) / capacity
                } else {
                    // Unknown capacity: treat the request as negligible.
                    1000
                }
            };
            let share = pod_memory_request_share(pod);
            let mut adj = score(memory_request(c) + share);
            let spec = pod.spec.as_ref();
            let is_sidecar = crate::base::podspec::is_sidecar(c)
                && spec
                    .and_then(|s| s.init_containers.as_ref())
                    .is_some_and(|cs| cs.iter().any(|i| i.name == c.name));
            if is_sidecar
                && let Some(min) = spec.and_then(|s| s.containers.iter().map(memory_request).min())
            {
                adj = adj.min(score(min + share));
            }
            let floor = 1000 + i128::from(GUARANTEED_OOM_SCORE_ADJ);
            adj.clamp(floor, i128::from(BEST_EFFORT_OOM_SCORE_ADJ) - 1) as i64
        }
    }
}

/// The huge page limits of a container (upstream's `GetHugepageLimitsFromResources`): every
/// size the machine has is limited to 0 unless the pod-level or the container's limits name it.
fn hugepage_limits(
    pod_level: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
    c: &Container,
    page_sizes: &[u64],
) -> Result<Vec<HugepageLimit>, TranslateError> {
    let mut asked: HashMap<u64, u64> = HashMap::new();
    // The pod's huge page limits first; the container's own, where it sets them, win.
    for (name, q) in pod_level
        .and_then(|r| r.limits.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(size) = crate::kubelet::cm::pod_config::hugepage_size(name)
            && let Ok(v) = quantity::parse(&q.0)
        {
            asked.insert(size, u64::try_from(v.value()).unwrap_or(0));
        }
    }
    if let Some(limits) = c.resources.as_ref().and_then(|r| r.limits.as_ref()) {
        for name in limits.keys() {
            if let Some(size) = crate::kubelet::cm::pod_config::hugepage_size(name)
                && let Some(q) = resource_any(c, "limits", name)?
            {
                asked.insert(size, u64::try_from(q.value()).unwrap_or(0));
            }
        }
    }
    Ok(page_sizes
        .iter()
        .filter_map(|size| {
            Some(HugepageLimit {
                page_size: crate::kubelet::cm::hugepage_unit(*size)?,
                limit: asked.get(size).copied().unwrap_or(0),
            })
        })
        .collect())
}

/// cgroup settings of a container from its requests and limits, as upstream's
/// `generateLinuxContainerResources` (without the in-place resize and swap parts):
/// - shares from the CPU request (the limit when no request is given; the minimum for none);
/// - with `cpuCFSQuota`, the configured period always and the quota of the CPU limit
///   (0, no quota, without one);
/// - the memory limit; the OOM score; huge page limits;
/// - under pod-level resources, the pod's cpu and memory limits (and huge page limits) for
///   those the container does not set, and its cpu shares from the pod's cpu limit when it
///   requests no cpu (upstream's `getCPULimit`, `getMemoryLimit`);
/// - on cgroup v2 the unified map upstream sends at its defaults: `memory.oom.group` 1
///   (the whole container is killed on OOM) and no memory protection (`memory.min`,
///   `memory.low` 0).
pub(crate) fn linux_resources(
    pod: &Pod,
    c: &Container,
    node_memory_capacity: u64,
    settings: &crate::kubelet::cm::ContainerSettings,
) -> Result<LinuxContainerResources, TranslateError> {
    // Under pod-level resources the pod's limits stand in for those the container lacks.
    let pod_level = crate::base::podspec::pod_level::pod_resources(pod);
    let limited = Container {
        resources: Some(crate::base::podspec::pod_level::effective_resources(
            pod_level,
            &c.resources.clone().unwrap_or_default(),
        )),
        ..c.clone()
    };
    let cpu_limit = resource(&limited, "limits", "cpu")?;
    // A request given (zero included) wins; a missing one defaults to the limit.
    let cpu_request = match resource_any(c, "requests", "cpu")? {
        Some(q) => Some(q),
        None => cpu_limit,
    };
    let memory_limit = resource(&limited, "limits", "memory")?;
    resource(c, "requests", "memory")?; // validate it even though only the OOM score uses it

    let mut out = LinuxContainerResources {
        cpu_shares: cpu_request.map_or(2, |q| milli_cpu_to_shares(q.milli_value()) as i64),
        memory_limit_in_bytes: memory_limit.map_or(0, |q| q.value()),
        oom_score_adj: oom_score_adj(pod, c, node_memory_capacity),
        hugepage_limits: hugepage_limits(pod_level, c, &settings.page_sizes)?,
        ..Default::default()
    };
    if settings.cfs.enforce_cpu_limits {
        let period = settings.cfs.period_us;
        out.cpu_period = i64::try_from(period).unwrap_or(i64::MAX);
        out.cpu_quota = milli_cpu_to_quota(cpu_limit.map_or(0, |q| q.milli_value()), period);
    }
    if settings.is_v2() {
        out.unified = HashMap::from([
            ("memory.oom.group".to_string(), "1".to_string()),
            ("memory.min".to_string(), "0".to_string()),
            ("memory.low".to_string(), "0".to_string()),
        ]);
    }
    Ok(out)
}

/// The container's security settings: its own securityContext over the pod's, as upstream's
/// kubelet passes them to the runtime. Settings the node cannot honour never get here: they
/// are refused when the pod is loaded (`source::validate_security`).
// The deprecated `apparmor_profile` string is still what containerd 1.6 reads; upstream sets
// both forms for that reason.
#[allow(deprecated)]
pub(crate) fn linux_security_context(
    pod: &Pod,
    c: &Container,
    seccomp_root: &Path,
    seccomp_default: bool,
) -> Result<LinuxContainerSecurityContext, TranslateError> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();

    let capabilities = sc
        .and_then(|s| s.capabilities.as_ref())
        .map(|caps| Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        });

    let seccomp = effective_seccomp(
        sc.and_then(|s| s.seccomp_profile.as_ref())
            .or_else(|| pod_sc.and_then(|p| p.seccomp_profile.as_ref())),
        seccomp_root,
        seccomp_default,
        Some(&c.name),
    )?;

    let apparmor =
        security::apparmor_profile(pod, c).map_err(|source| TranslateError::AppArmor {
            container: c.name.clone(),
            source,
        })?;
    let (masked_paths, readonly_paths) = security::proc_mount_paths(c);

    Ok(LinuxContainerSecurityContext {
        capabilities,
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        namespace_options: Some(namespace_options(pod, None)),
        selinux_options: sc
            .and_then(|s| s.se_linux_options.as_ref())
            .or_else(|| pod_sc.and_then(|p| p.se_linux_options.as_ref()))
            .map(selinux_option),
        run_as_user: security::effective_run_as_user(pod, c).map(|value| Int64Value { value }),
        run_as_group: security::effective_run_as_group(pod, c).map(|value| Int64Value { value }),
        readonly_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: security::supplemental_groups(pod),
        supplemental_groups_policy: security::supplemental_groups_policy(pod),
        // Only an explicit `allowPrivilegeEscalation: false` sets no_new_privs.
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths,
        readonly_paths,
        seccomp,
        apparmor_profile: apparmor
            .as_ref()
            .map(|a| a.deprecated.clone())
            .unwrap_or_default(),
        apparmor: apparmor.map(|a| a.profile),
        ..Default::default()
    })
}

/// Volume mounts first, then the managed /etc/hosts, then the termination-message file; a
/// managed file is skipped when a volume already covers its path.
fn container_mounts(c: &Container, ctx: &ContainerContext) -> Vec<Mount> {
    let mut mounts = ctx.extra_mounts.clone();
    let taken = |mounts: &[Mount], path: &str| mounts.iter().any(|m| m.container_path == path);

    if let Some(hosts) = &ctx.etc_hosts_path
        && !taken(&mounts, "/etc/hosts")
    {
        mounts.push(Mount {
            container_path: "/etc/hosts".into(),
            host_path: hosts.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    if let Some(log) = &ctx.termination_log_path {
        let path = termination_message_path(c);
        if !taken(&mounts, path) {
            mounts.push(Mount {
                container_path: path.to_string(),
                host_path: log.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
    }
    mounts
}

/// Builds the CRI config that creates `container` of `pod`.
#[cfg(test)]
pub(crate) fn container_config(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
) -> Result<ContainerConfig, TranslateError> {
    let envs = env::container_env(pod, container, ctx)?;
    container_config_with_env(pod, container, ctx, envs)
}

/// [`container_config`] with the environment already resolved by [`env::container_env`] (the
/// executor needs it first for `subPathExpr`, and resolves it once).
pub(crate) fn container_config_with_env(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
    envs: Vec<(String, String)>,
) -> Result<ContainerConfig, TranslateError> {
    let meta = PodMeta::of(pod)?;
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| TranslateError::MissingImage {
            container: container.name.clone(),
        })?;

    let env_map: HashMap<String, String> = envs.iter().cloned().collect();
    let command = env::expand_all(container.command.as_deref().unwrap_or_default(), &env_map);
    let args = env::expand_all(container.args.as_deref().unwrap_or_default(), &env_map);

    Ok(ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: container.name.clone(),
            attempt: ctx.restart_count,
        }),
        image: Some(ImageSpec {
            image: image.clone(),
            user_specified_image: image,
            ..Default::default()
        }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: envs
            .into_iter()
            .map(|(key, value)| crate::clients::cri::proto::KeyValue { key, value })
            .collect(),
        mounts: container_mounts(container, ctx),
        devices: Vec::new(),
        labels: container_labels(&meta, &container.name),
        annotations: container_annotations(pod, container, ctx.restart_count)?,
        log_path: container_log_path(&container.name, ctx.restart_count),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(LinuxContainerConfig {
            resources: Some(linux_resources(
                pod,
                container,
                ctx.node_memory_capacity,
                &ctx.resources,
            )?),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(container_namespace_options(
                    pod,
                    ctx.userns.as_ref(),
                    ctx.pid_target.as_deref(),
                )),
                ..linux_security_context(
                    pod,
                    container,
                    &ctx.seccomp_profile_root,
                    ctx.seccomp_default,
                )?
            }),
        }),
        windows: None,
        cdi_devices: Vec::new(),
        stop_signal: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::cri::proto::{KeyValue, NamespaceMode, SecurityProfile};
    use k8s_openapi::api::core::v1::AppArmorProfile;
    use k8s_openapi::api::core::v1::{
        Capabilities, ContainerPort, EnvVar, EnvVarSource, ExecAction, Lifecycle, LifecycleHandler,
        ObjectFieldSelector, PodSecurityContext, PodSpec, ResourceRequirements, SELinuxOptions,
        SeccompProfile, SecurityContext,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    const GI: u64 = 1 << 30;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Q>> {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Q(v.to_string())))
                .collect()
        })
    }

    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        ResourceRequirements {
            requests: quantities(requests),
            limits: quantities(limits),
            ..Default::default()
        }
    }

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn nginx() -> Container {
        Container {
            name: "nginx".into(),
            image: Some("nginx:1.25".into()),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "echo $(GREETING) $$(HOME) $(NOPE)".into(),
            ]),
            args: Some(vec!["--port=$(PORT)".into(), "--ip=$(MY_IP)".into()]),
            working_dir: Some("/srv".into()),
            env: Some(vec![
                env("GREETING", "hello"),
                env("PORT", "8080"),
                EnvVar {
                    name: "MY_IP".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            api_version: None,
                            field_path: "status.podIP".into(),
                        }),
                        ..Default::default()
                    }),
                },
            ]),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            resources: Some(resources(
                &[("cpu", "250m"), ("memory", "64Mi")],
                &[("cpu", "500m"), ("memory", "64Mi")],
            )),
            lifecycle: Some(Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    exec: Some(ExecAction {
                        command: Some(vec!["nginx".into(), "-s".into(), "quit".into()]),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            security_context: Some(SecurityContext {
                run_as_group: Some(101),
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_BIND_SERVICE".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn web_pod(containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("0b7e4c2a".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                termination_grace_period_seconds: Some(30),
                security_context: Some(PodSecurityContext {
                    run_as_user: Some(1000),
                    run_as_group: Some(1000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctx() -> ContainerContext {
        ContainerContext {
            restart_count: 3,
            pod_ip: Some("10.88.0.7".into()),
            host_ip: Some("192.168.1.10".into()),
            node_name: "node-a".into(),
            node_memory_capacity: 4 * GI,
            node_allocatable: crate::base::podspec::resources::NodeAllocatable {
                cpu_millis: 4000,
                memory_bytes: 4 * GI as i64,
                ephemeral_storage_bytes: 100 * GI as i64,
            },
            etc_hosts_path: Some("/var/lib/deckhand/pods/0b7e4c2a/etc-hosts".into()),
            termination_log_path: Some("/var/lib/deckhand/pods/0b7e4c2a/containers/nginx/3".into()),
            extra_mounts: vec![Mount {
                container_path: "/usr/share/nginx/html".into(),
                host_path: "/srv/www".into(),
                readonly: true,
                ..Default::default()
            }],
            seccomp_profile_root: std::path::PathBuf::from("/var/lib/deckhand/seccomp"),
            seccomp_default: false,
            resources: Default::default(),
            userns: None,
            pid_target: None,
        }
    }

    #[test]
    fn an_ephemeral_container_joins_its_targets_pid_namespace() {
        let c = nginx();
        let mut pod = web_pod(vec![c.clone()]);
        let debugger = Container {
            name: "debugger".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        pod.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                image: Some("busybox".into()),
                target_container_name: Some(c.name.clone()),
                ..Default::default()
            }]);
        let targeted = ContainerContext {
            pid_target: Some("abc123".into()),
            ..ctx()
        };
        let cfg = container_config(&pod, &debugger, &targeted).unwrap();
        assert_eq!(cfg.annotations["io.kubernetes.container.type"], "ephemeral");
        let ns = |cfg: &ContainerConfig| {
            cfg.linux
                .clone()
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options
                .unwrap()
        };
        let got = ns(&cfg);
        assert_eq!(got.pid, NamespaceMode::Target as i32);
        assert_eq!(got.target_id, "abc123");
        assert_eq!(got.network, NamespaceMode::Pod as i32);
        // Without a target it has a PID namespace of its own, as any container.
        let cfg = container_config(&pod, &debugger, &ctx()).unwrap();
        assert_eq!(ns(&cfg).pid, NamespaceMode::Container as i32);
        assert_eq!(ns(&cfg).target_id, "");
        // A pod that shares one PID namespace keeps sharing it: no target then.
        pod.spec.as_mut().unwrap().share_process_namespace = Some(true);
        let cfg = container_config(&pod, &debugger, &targeted).unwrap();
        assert_eq!(ns(&cfg).pid, NamespaceMode::Pod as i32);
        assert_eq!(ns(&cfg).target_id, "");
    }

    #[test]
    fn golden_nginx_container() {
        let c = nginx();
        let pod = web_pod(vec![c.clone()]);
        let cfg = container_config(&pod, &c, &ctx()).unwrap();

        assert_eq!(
            cfg.metadata,
            Some(ContainerMetadata {
                name: "nginx".into(),
                attempt: 3
            })
        );
        assert_eq!(cfg.image.as_ref().unwrap().image, "nginx:1.25");
        assert_eq!(cfg.command, vec!["sh", "-c", "echo hello $(HOME) $(NOPE)"]);
        assert_eq!(cfg.args, vec!["--port=8080", "--ip=10.88.0.7"]);
        assert_eq!(cfg.working_dir, "/srv");
        assert_eq!(
            cfg.envs,
            vec![
                KeyValue {
                    key: "GREETING".into(),
                    value: "hello".into()
                },
                KeyValue {
                    key: "PORT".into(),
                    value: "8080".into()
                },
                KeyValue {
                    key: "MY_IP".into(),
                    value: "10.88.0.7".into()
                },
            ]
        );
        assert_eq!(cfg.log_path, "nginx/3.log");
        assert_eq!(
            cfg.labels,
            map(&[
                ("io.kubernetes.pod.name", "web"),
                ("io.kubernetes.pod.namespace", "shop"),
                ("io.kubernetes.pod.uid", "0b7e4c2a"),
                ("io.kubernetes.container.name", "nginx"),
                ("deckhand.io/managed", "true"),
            ])
        );
        let hash = format!("{:x}", container_hash(&c));
        assert_eq!(
            cfg.annotations,
            map(&[
                ("io.kubernetes.container.hash", hash.as_str()),
                ("io.kubernetes.container.restartCount", "3"),
                (
                    "io.kubernetes.container.terminationMessagePath",
                    "/dev/termination-log"
                ),
                ("io.kubernetes.container.terminationMessagePolicy", "File"),
                ("io.kubernetes.container.type", "container"),
                ("io.kubernetes.pod.terminationGracePeriod", "30"),
                (
                    "io.kubernetes.container.preStopHandler",
                    r#"{"exec":{"command":["nginx","-s","quit"]}}"#
                ),
                (
                    "io.kubernetes.container.ports",
                    r#"[{"containerPort":80,"name":"http","protocol":"TCP"}]"#
                ),
            ])
        );
        assert_eq!(
            cfg.mounts,
            vec![
                Mount {
                    container_path: "/usr/share/nginx/html".into(),
                    host_path: "/srv/www".into(),
                    readonly: true,
                    ..Default::default()
                },
                Mount {
                    container_path: "/etc/hosts".into(),
                    host_path: "/var/lib/deckhand/pods/0b7e4c2a/etc-hosts".into(),
                    ..Default::default()
                },
                Mount {
                    container_path: "/dev/termination-log".into(),
                    host_path: "/var/lib/deckhand/pods/0b7e4c2a/containers/nginx/3".into(),
                    ..Default::default()
                },
            ]
        );

        let linux = cfg.linux.unwrap();
        // Burstable (cpu request below limit): 1000 - 1000 * 64Mi / 4Gi = 1000 - 15.
        assert_eq!(
            linux.resources,
            Some(LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 256,
                memory_limit_in_bytes: 67_108_864,
                oom_score_adj: 985,
                ..Default::default()
            })
        );
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(Int64Value { value: 101 }));
        assert!(sc.no_new_privs);
        assert!(sc.readonly_rootfs);
        assert!(!sc.privileged);
        assert_eq!(
            sc.capabilities,
            Some(Capability {
                add_capabilities: vec!["NET_BIND_SERVICE".into()],
                drop_capabilities: vec!["ALL".into()],
                add_ambient_capabilities: vec![],
            })
        );
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network, NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, NamespaceMode::Container as i32);
        assert_eq!(sc.seccomp, None);
    }

    #[test]
    fn host_network_mounts_etc_hosts_too_and_a_volume_wins_over_managed_files() {
        let c = nginx();
        let mut pod = web_pod(vec![c.clone()]);
        pod.spec.as_mut().unwrap().host_network = Some(true);
        let cfg = container_config(&pod, &c, &ctx()).unwrap();
        // Upstream mounts the node's hosts file with the pod's aliases (hostAliases).
        assert!(cfg.mounts.iter().any(|m| m.container_path == "/etc/hosts"));

        let pod = web_pod(vec![c.clone()]);
        let mut context = ctx();
        context.extra_mounts.push(Mount {
            container_path: "/etc/hosts".into(),
            host_path: "/custom/hosts".into(),
            ..Default::default()
        });
        let cfg = container_config(&pod, &c, &context).unwrap();
        let hosts: Vec<_> = cfg
            .mounts
            .iter()
            .filter(|m| m.container_path == "/etc/hosts")
            .collect();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].host_path, "/custom/hosts");
    }

    #[test]
    fn custom_termination_message_path_and_init_type() {
        let mut c = nginx();
        c.termination_message_path = Some("/tmp/why".into());
        c.termination_message_policy = Some("FallbackToLogsOnError".into());
        let mut pod = web_pod(vec![nginx()]);
        pod.spec.as_mut().unwrap().init_containers = Some(vec![c.clone()]);
        let cfg = container_config(&pod, &c, &ctx()).unwrap();
        assert_eq!(
            cfg.annotations["io.kubernetes.container.terminationMessagePath"],
            "/tmp/why"
        );
        assert_eq!(
            cfg.annotations["io.kubernetes.container.terminationMessagePolicy"],
            "FallbackToLogsOnError"
        );
        assert_eq!(cfg.annotations["io.kubernetes.container.type"], "init");
        assert!(cfg.mounts.iter().any(|m| m.container_path == "/tmp/why"));
    }

    fn with_resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: "app".into(),
            image: Some("busybox".into()),
            resources: Some(resources(requests, limits)),
            ..Default::default()
        }
    }

    #[test]
    fn resources_table() {
        // (requests, limits, shares, quota, period, memory, oom)
        type Row = (
            &'static [(&'static str, &'static str)],
            &'static [(&'static str, &'static str)],
            i64,
            i64,
            i64,
            i64,
            i64,
        );
        let rows: &[Row] = &[
            // BestEffort: minimum shares, no quota (the period is always sent, as upstream).
            (&[], &[], 2, 0, 100_000, 0, 1000),
            // Guaranteed through limits only (requests default to them).
            (
                &[],
                &[("cpu", "1"), ("memory", "128Mi")],
                1024,
                100_000,
                100_000,
                134_217_728,
                -997,
            ),
            // Guaranteed, fractional CPU.
            (
                &[("cpu", "1500m"), ("memory", "1Gi")],
                &[("cpu", "1.5"), ("memory", "1Gi")],
                1536,
                150_000,
                100_000,
                1 << 30,
                -997,
            ),
            // Tiny CPU: shares floor 2, quota floor 1000.
            (&[("cpu", "1m")], &[("cpu", "1m")], 2, 1000, 100_000, 0, 999),
            // A request of zero is a request: minimum shares, whatever the limit.
            (
                &[("cpu", "0")],
                &[("cpu", "1")],
                2,
                100_000,
                100_000,
                0,
                999,
            ),
            // Burstable, request only: a quarter of the node's memory.
            (&[("memory", "1Gi")], &[], 2, 0, 100_000, 0, 750),
            // Burstable requesting all memory: floor 3.
            (
                &[("cpu", "100m"), ("memory", "4Gi")],
                &[],
                102,
                0,
                100_000,
                0,
                3,
            ),
        ];
        for (i, (req, lim, shares, quota, period, memory, oom)) in rows.iter().enumerate() {
            let c = with_resources(req, lim);
            let pod = web_pod(vec![c.clone()]);
            let got = linux_resources(&pod, &c, 4 * GI, &Default::default()).unwrap();
            assert_eq!(
                (
                    got.cpu_shares,
                    got.cpu_quota,
                    got.cpu_period,
                    got.memory_limit_in_bytes,
                    got.oom_score_adj
                ),
                (*shares, *quota, *period, *memory, *oom),
                "row {i}: requests {req:?} limits {lim:?}"
            );
        }
    }

    #[test]
    fn pod_level_limits_stand_in_for_the_containers_own() {
        // (container requests, container limits, pod requests, pod limits) →
        // (shares, quota, memory limit, oom score adj)
        type Row<'a> = (
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            (i64, i64, i64, i64),
        );
        let rows: [Row; 4] = [
            // No resources of its own: the pod's limits, shares from the pod's cpu limit.
            (
                &[],
                &[],
                &[("cpu", "100m"), ("memory", "1Gi")],
                &[("cpu", "100m"), ("memory", "1Gi")],
                (102, 10_000, 1 << 30, -997),
            ),
            // Its own limits win.
            (
                &[("cpu", "20m"), ("memory", "20Mi")],
                &[("cpu", "20m"), ("memory", "20Mi")],
                &[("cpu", "100m"), ("memory", "1Gi")],
                &[("cpu", "100m"), ("memory", "1Gi")],
                (20, 2_000, 20 << 20, -997),
            ),
            // Burstable: a request of its own keeps its shares; the pod's memory request
            // beyond the containers' counts for the OOM score (1Gi of 4Gi).
            (
                &[("cpu", "50m")],
                &[],
                &[("cpu", "100m"), ("memory", "1Gi")],
                &[("cpu", "200m")],
                (51, 20_000, 0, 750),
            ),
            // Requests only at pod level: nothing limits the container.
            (
                &[],
                &[],
                &[("cpu", "4m"), ("memory", "10Mi")],
                &[],
                (2, 0, 0, 998),
            ),
        ];
        for (i, (req, lim, pod_req, pod_lim, want)) in rows.iter().enumerate() {
            let c = with_resources(req, lim);
            let mut pod = web_pod(vec![c.clone()]);
            let level = with_resources(pod_req, pod_lim).resources;
            pod.spec.as_mut().unwrap().resources = level;
            let got = linux_resources(&pod, &c, 4 * GI, &Default::default()).unwrap();
            assert_eq!(
                (
                    got.cpu_shares,
                    got.cpu_quota,
                    got.memory_limit_in_bytes,
                    got.oom_score_adj
                ),
                *want,
                "row {i}"
            );
        }
    }

    #[test]
    fn node_critical_pods_get_the_guaranteed_score() {
        let c = with_resources(&[], &[]);
        let mut pod = web_pod(vec![c.clone()]);
        pod.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        // Only a critical pod (here: of critical priority) counts as node-critical.
        assert_eq!(oom_score_adj(&pod, &c, 4 * GI), 1000);
        pod.spec.as_mut().unwrap().priority = Some(2_000_001_000);
        assert_eq!(oom_score_adj(&pod, &c, 4 * GI), -997);
        pod.spec.as_mut().unwrap().priority = None;
        pod.metadata.annotations = Some(
            [(
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        assert_eq!(oom_score_adj(&pod, &c, 4 * GI), -997);
    }

    #[test]
    fn bad_quantity_names_container_and_field() {
        let c = with_resources(&[("memory", "lots")], &[]);
        let pod = web_pod(vec![c.clone()]);
        let err = container_config(&pod, &c, &ctx()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"app\": invalid quantity \"lots\" for resources.requests.memory: no digits in quantity"
        );
    }

    #[test]
    fn missing_image_is_an_error() {
        let mut c = with_resources(&[], &[]);
        c.image = None;
        let pod = web_pod(vec![c.clone()]);
        assert_eq!(
            container_config(&pod, &c, &ctx()).unwrap_err(),
            TranslateError::MissingImage {
                container: "app".into()
            }
        );
    }

    #[test]
    fn seccomp_and_privileged() {
        let mut c = with_resources(&[], &[]);
        c.security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let mut pod = web_pod(vec![c.clone()]);
        pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        });
        let root = Path::new("/var/lib/deckhand/seccomp");
        let sc = linux_security_context(&pod, &c, root, false).unwrap();
        assert!(sc.privileged);
        assert!(!sc.no_new_privs);
        assert_eq!(
            sc.seccomp,
            Some(SecurityProfile {
                profile_type: 0,
                localhost_ref: String::new()
            })
        );

        // Localhost profiles are files under the node's seccomp root.
        c.security_context.as_mut().unwrap().seccomp_profile = Some(SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some("profiles/audit.json".into()),
        });
        let sc = linux_security_context(&pod, &c, root, false).unwrap();
        assert_eq!(
            sc.seccomp,
            Some(SecurityProfile {
                profile_type: 2,
                localhost_ref: "/var/lib/deckhand/seccomp/profiles/audit.json".into()
            })
        );
        // Without a root, or escaping it, it cannot be served.
        let err = linux_security_context(&pod, &c, Path::new(""), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"app\": unsupported seccomp profile type \"Localhost\""
        );
        c.security_context.as_mut().unwrap().seccomp_profile = Some(SeccompProfile {
            type_: "Localhost".into(),
            localhost_profile: Some("../escape.json".into()),
        });
        assert!(linux_security_context(&pod, &c, root, false).is_err());
    }

    /// `seccompDefault`: a container whose pod and own context set no profile gets
    /// `RuntimeDefault` in its CRI config; a profile asked for still wins (`Unconfined`
    /// included), and without the setting nothing is sent (the runtime's unconfined).
    #[test]
    fn seccomp_default_fills_in_runtime_default() {
        let runtime_default = Some(SecurityProfile {
            profile_type: 0,
            localhost_ref: String::new(),
        });
        let unconfined = Some(SecurityProfile {
            profile_type: 1,
            localhost_ref: String::new(),
        });
        let bare = with_resources(&[], &[]);
        let pod = web_pod(vec![bare.clone()]);
        let config = |pod: &Pod, seccomp_default: bool| {
            let ctx = ContainerContext {
                seccomp_default,
                ..ctx()
            };
            container_config(pod, &pod.spec.as_ref().unwrap().containers[0], &ctx)
                .unwrap()
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .seccomp
        };
        assert_eq!(config(&pod, true), runtime_default);
        assert_eq!(config(&pod, false), None);

        let mut own = bare.clone();
        own.security_context = Some(SecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "Unconfined".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        });
        assert_eq!(config(&web_pod(vec![own]), true), unconfined);

        let mut pod_level = web_pod(vec![bare]);
        pod_level.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "Unconfined".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        });
        assert_eq!(config(&pod_level, true), unconfined);
    }

    #[test]
    fn every_container_field_reaches_the_runtime() {
        let mut c = with_resources(&[], &[]);
        c.security_context = Some(SecurityContext {
            run_as_user: Some(1001),
            run_as_non_root: Some(true),
            proc_mount: Some("Default".into()),
            app_armor_profile: Some(AppArmorProfile {
                type_: "Localhost".into(),
                localhost_profile: Some("k8s-app".into()),
            }),
            se_linux_options: Some(SELinuxOptions {
                level: Some("s0:c1,c2".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut pod = web_pod(vec![c.clone()]);
        pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(2000),
            fs_group: Some(3000),
            supplemental_groups: Some(vec![4000]),
            supplemental_groups_policy: Some("Strict".into()),
            se_linux_options: Some(SELinuxOptions {
                level: Some("s0:c9".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let sc = linux_security_context(&pod, &c, Path::new(""), false).unwrap();
        assert_eq!(sc.run_as_user, Some(Int64Value { value: 1001 }));
        assert_eq!(sc.run_as_group, Some(Int64Value { value: 2000 }));
        assert_eq!(sc.supplemental_groups, vec![3000, 4000]);
        assert_eq!(sc.supplemental_groups_policy, 1);
        assert_eq!(sc.selinux_options.unwrap().level, "s0:c1,c2");
        assert_eq!(
            sc.apparmor,
            Some(SecurityProfile {
                profile_type: 2,
                localhost_ref: "k8s-app".into()
            })
        );
        #[allow(deprecated)]
        let deprecated = sc.apparmor_profile.clone();
        assert_eq!(deprecated, "localhost/k8s-app");
        assert_eq!(sc.masked_paths.len(), 11);
        assert_eq!(sc.readonly_paths.len(), 5);
    }

    #[test]
    fn cfs_settings_hugepages_and_the_v2_unified_map() {
        use crate::kubelet::cm::{CfsSettings, CgroupVersion, ContainerSettings};
        let c = with_resources(
            &[],
            &[
                ("cpu", "500m"),
                ("memory", "64Mi"),
                ("hugepages-2Mi", "4Mi"),
            ],
        );
        let pod = web_pod(vec![c.clone()]);
        // cpuCFSQuota off: neither quota nor period.
        let off = ContainerSettings {
            cfs: CfsSettings {
                enforce_cpu_limits: false,
                period_us: 100_000,
            },
            ..Default::default()
        };
        let got = linux_resources(&pod, &c, 4 * GI, &off).unwrap();
        assert_eq!((got.cpu_quota, got.cpu_period, got.cpu_shares), (0, 0, 512));
        // A 50ms period scales the quota; every machine page size gets a limit, 0 unless
        // asked for; v2 gets upstream's unified map.
        let v2 = ContainerSettings {
            cfs: CfsSettings {
                enforce_cpu_limits: true,
                period_us: 50_000,
            },
            version: Some(CgroupVersion::V2),
            page_sizes: vec![2 << 20, 1 << 30],
        };
        let got = linux_resources(&pod, &c, 4 * GI, &v2).unwrap();
        assert_eq!((got.cpu_quota, got.cpu_period), (25_000, 50_000));
        assert_eq!(
            got.hugepage_limits,
            vec![
                HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20
                },
                HugepageLimit {
                    page_size: "1GB".into(),
                    limit: 0
                },
            ]
        );
        assert_eq!(
            got.unified,
            map(&[
                ("memory.oom.group", "1"),
                ("memory.min", "0"),
                ("memory.low", "0")
            ])
        );
        // v1 sends no unified map.
        let v1 = ContainerSettings {
            version: Some(CgroupVersion::V1),
            ..v2
        };
        assert!(
            linux_resources(&pod, &c, 4 * GI, &v1)
                .unwrap()
                .unified
                .is_empty()
        );
    }

    #[test]
    fn a_sidecar_scores_no_higher_than_the_smallest_regular_container() {
        let mut sidecar = with_resources(&[("memory", "16Mi")], &[]);
        sidecar.name = "log".into();
        sidecar.restart_policy = Some("Always".into());
        let app = with_resources(&[("memory", "1Gi")], &[]);
        let mut pod = web_pod(vec![app.clone()]);
        pod.spec.as_mut().unwrap().init_containers = Some(vec![sidecar.clone()]);
        // Alone the sidecar would score 1000 - 1000 × 16Mi / 4Gi = 997; the app scores 750.
        assert_eq!(oom_score_adj(&pod, &sidecar, 4 * GI), 750);
        assert_eq!(oom_score_adj(&pod, &app, 4 * GI), 750);
    }
}
