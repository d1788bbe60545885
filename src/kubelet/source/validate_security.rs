//! Pod-level checks of the security settings: the `securityContext` values upstream's API server
//! rejects, and the ones upstream's kubelet refuses at admission because this node cannot honour
//! them (forbidden sysctls, AppArmor on a node without it, user namespaces, `Strict`
//! supplemental groups). Such a pod is reported like any other invalid manifest, naming the
//! file and the field, and never started: running it without the setting would be silently
//! weaker than asked.
//!
//! The node's side of the decision ([`NodeSecurity`]) is detected once at start from the
//! configuration (`allowedUnsafeSysctls`), the host (`/sys/module/apparmor`) and the runtime's
//! features ([`detect_node_security`]), and passed to the sources in `SourceConfig`; tests use
//! the strictest facts (`NodeSecurity::default()`).

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext,
    WindowsSecurityContextOptions,
};

use super::Errors;
use crate::base::podspec::apparmor::{
    APPARMOR_ANNOTATION_PREFIX, AppArmor, AppArmorError, apparmor_profile, is_local_descending_path,
};
use crate::base::podspec::sysctl::{SysctlAllowlist, SysctlError};
use crate::kubelet::source::validate::ValidationError;

/// Where the kernel says whether AppArmor is on (`Y`).
pub(crate) const APPARMOR_ENABLED_PATH: &str = "/sys/module/apparmor/parameters/enabled";

/// What this node can enforce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSecurity {
    /// The safe sysctls plus `allowedUnsafeSysctls`.
    pub sysctls: SysctlAllowlist,
    /// The host enforces AppArmor profiles.
    pub apparmor_enabled: bool,
    /// The runtime applies `supplementalGroupsPolicy: Strict` (containerd 1.6 does not; it
    /// would silently merge the image's groups in).
    pub supplemental_groups_policy_strict: bool,
}

impl Default for NodeSecurity {
    /// Safe sysctls only, no AppArmor, no `Strict`: the choice that refuses rather than weakens.
    fn default() -> Self {
        NodeSecurity {
            sysctls: SysctlAllowlist::new::<&str>(&[]).unwrap_or_default(),
            apparmor_enabled: false,
            supplemental_groups_policy_strict: false,
        }
    }
}

impl NodeSecurity {
    /// The node's facts: the operator's unsafe-sysctl list (already validated with the
    /// configuration) and whether AppArmor is enabled on the host.
    pub fn detect(allowed_unsafe_sysctls: &[String]) -> Result<NodeSecurity, SysctlError> {
        Ok(NodeSecurity {
            sysctls: SysctlAllowlist::new(allowed_unsafe_sysctls)?,
            apparmor_enabled: apparmor_enabled(APPARMOR_ENABLED_PATH),
            supplemental_groups_policy_strict: false,
        })
    }
}

/// Whether the file at `path` (the kernel's AppArmor switch) says `Y`.
pub(crate) fn apparmor_enabled(path: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.trim() == "Y")
}

/// Whether the runtime says it applies `supplementalGroupsPolicy: Strict` (CRI
/// `RuntimeFeatures`, which containerd 1.6 does not send).
pub(crate) fn strict_groups_supported(status: &crate::clients::cri::proto::StatusResponse) -> bool {
    status
        .features
        .as_ref()
        .is_some_and(|f| f.supplemental_groups_policy)
}

/// Reads the node's facts: called once at start with the validated `allowedUnsafeSysctls` and
/// the runtime (asked for its features). An entry that is somehow invalid leaves only the safe
/// set; an unanswered status leaves `Strict` refused.
pub(crate) async fn detect_node_security<R: crate::clients::cri::RuntimeService>(
    allowed_unsafe_sysctls: &[String],
    runtime: &R,
) -> NodeSecurity {
    let mut node = NodeSecurity::detect(allowed_unsafe_sysctls).unwrap_or_else(|err| {
        tracing::error!(error = %err, "allowedUnsafeSysctls ignored: only the safe sysctls are allowed");
        NodeSecurity {
            apparmor_enabled: apparmor_enabled(APPARMOR_ENABLED_PATH),
            ..NodeSecurity::default()
        }
    });
    match runtime.status(false).await {
        Ok(status) => node.supplemental_groups_policy_strict = strict_groups_supported(&status),
        Err(err) => tracing::warn!(
            error = %err,
            "cannot read the runtime's features; supplementalGroupsPolicy Strict is refused"
        ),
    }
    tracing::info!(
        apparmor = node.apparmor_enabled,
        supplemental_groups_strict = node.supplemental_groups_policy_strict,
        "pod security checks configured"
    );
    node
}

/// Security checks add to the validator's error list.
impl Errors {
    fn id(&mut self, field: String, value: Option<i64>) {
        if let Some(v) = value
            && !(0..=i64::from(i32::MAX)).contains(&v)
        {
            self.push(
                field,
                format!("{v} must be between 0 and 2147483647, inclusive"),
            );
        }
    }

    fn one_of(&mut self, field: String, value: Option<&str>, allowed: &[&str]) {
        if let Some(v) = value
            && !allowed.contains(&v)
        {
            self.push(field, format!("{v:?} is not one of {allowed:?}"));
        }
    }
}

fn seccomp(errors: &mut Errors, field: String, p: Option<&SeccompProfile>) {
    let Some(p) = p else { return };
    match p.type_.as_str() {
        "RuntimeDefault" | "Unconfined" => {
            if p.localhost_profile.is_some() {
                errors.push(
                    format!("{field}.localhostProfile"),
                    "may only be set when type is Localhost",
                );
            }
        }
        "Localhost" => match p.localhost_profile.as_deref() {
            None | Some("") => errors.push(
                format!("{field}.localhostProfile"),
                "required when type is Localhost",
            ),
            Some(path) if !is_local_descending_path(path) => errors.push(
                format!("{field}.localhostProfile"),
                format!(
                    "{path:?} must be a relative path below the seccomp profile root \
                     (<root-dir>/seccomp), without '..'"
                ),
            ),
            Some(_) => {}
        },
        other => errors.push(
            format!("{field}.type"),
            format!("{other:?} is not one of [\"RuntimeDefault\", \"Unconfined\", \"Localhost\"]"),
        ),
    }
}

fn apparmor_field(errors: &mut Errors, field: String, p: Option<&AppArmorProfile>) {
    let Some(p) = p else { return };
    match (p.type_.as_str(), p.localhost_profile.as_deref()) {
        ("Localhost", None | Some("")) => errors.push(
            format!("{field}.localhostProfile"),
            "required when type is Localhost",
        ),
        ("Localhost", Some(_)) => {}
        ("RuntimeDefault" | "Unconfined", Some(_)) => errors.push(
            format!("{field}.localhostProfile"),
            "may only be set when type is Localhost",
        ),
        ("RuntimeDefault" | "Unconfined", None) => {}
        (other, _) => errors.push(
            format!("{field}.type"),
            format!("{other:?} is not one of [\"RuntimeDefault\", \"Unconfined\", \"Localhost\"]"),
        ),
    }
}

/// Windows settings mean nothing on a Linux node. Upstream ignores them unless the pod says it
/// is a Linux pod (then they are invalid); a HostProcess container cannot run here at all.
fn windows(
    errors: &mut Errors,
    field: String,
    o: Option<&WindowsSecurityContextOptions>,
    linux: bool,
) {
    let Some(o) = o else { return };
    if linux {
        errors.push(field, "forbidden for a pod with spec.os.name \"linux\"");
    } else if o.host_process == Some(true) {
        errors.push(
            format!("{field}.hostProcess"),
            "Windows HostProcess containers cannot run on a Linux node",
        );
    }
}

/// The checks the pod and each container share: seccomp, AppArmor and Windows options under
/// the security context at path `f`.
fn profiles(
    errors: &mut Errors,
    f: &str,
    (seccomp_profile, app_armor, windows_options): (
        Option<&SeccompProfile>,
        Option<&AppArmorProfile>,
        Option<&WindowsSecurityContextOptions>,
    ),
    linux: bool,
) {
    seccomp(errors, format!("{f}.seccompProfile"), seccomp_profile);
    apparmor_field(errors, format!("{f}.appArmorProfile"), app_armor);
    windows(
        errors,
        format!("{f}.windowsOptions"),
        windows_options,
        linux,
    );
}

fn validate_pod_sc(
    errors: &mut Errors,
    pod: &Pod,
    sc: &PodSecurityContext,
    node: &NodeSecurity,
    linux: bool,
) {
    let f = "spec.securityContext";
    errors.id(format!("{f}.runAsUser"), sc.run_as_user);
    errors.id(format!("{f}.runAsGroup"), sc.run_as_group);
    errors.id(format!("{f}.fsGroup"), sc.fs_group);
    for (i, g) in sc.supplemental_groups.iter().flatten().enumerate() {
        errors.id(format!("{f}.supplementalGroups[{i}]"), Some(*g));
    }
    errors.one_of(
        format!("{f}.supplementalGroupsPolicy"),
        sc.supplemental_groups_policy.as_deref(),
        &["Merge", "Strict"],
    );
    if sc.supplemental_groups_policy.as_deref() == Some("Strict")
        && !node.supplemental_groups_policy_strict
    {
        errors.push(
            format!("{f}.supplementalGroupsPolicy"),
            "SupplementalGroupsPolicyNotSupported: Strict is not supported by this node's \
             container runtime (it would merge the image's groups in regardless)",
        );
    }
    errors.one_of(
        format!("{f}.fsGroupChangePolicy"),
        sc.fs_group_change_policy.as_deref(),
        &["OnRootMismatch", "Always"],
    );
    errors.one_of(
        format!("{f}.seLinuxChangePolicy"),
        sc.se_linux_change_policy.as_deref(),
        &["MountOption", "Recursive"],
    );
    profiles(
        errors,
        f,
        (
            sc.seccomp_profile.as_ref(),
            sc.app_armor_profile.as_ref(),
            sc.windows_options.as_ref(),
        ),
        linux,
    );

    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let host_ipc = spec.and_then(|s| s.host_ipc).unwrap_or(false);
    let mut seen = std::collections::HashSet::new();
    for (i, s) in sc.sysctls.iter().flatten().enumerate() {
        let field = format!("{f}.sysctls[{i}].name");
        if !seen.insert(crate::base::podspec::sysctl::to_dotted(&s.name)) {
            errors.push(field, format!("duplicate sysctl {:?}", s.name));
            continue;
        }
        if let Err(e) = node.sysctls.check(&s.name, host_network, host_ipc) {
            errors.push(field, format!("SysctlForbidden: forbidden sysctl: {e}"));
        }
    }
}

fn validate_container_sc(
    errors: &mut Errors,
    sc: &SecurityContext,
    field: &str,
    host_users: bool,
    linux: bool,
) {
    let f = format!("{field}.securityContext");
    errors.id(format!("{f}.runAsUser"), sc.run_as_user);
    errors.id(format!("{f}.runAsGroup"), sc.run_as_group);
    if sc.allow_privilege_escalation == Some(false) {
        if sc.privileged == Some(true) {
            errors.push(
                f.clone(),
                "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
            );
        }
        let adds_sys_admin = sc
            .capabilities
            .as_ref()
            .and_then(|c| c.add.as_ref())
            .is_some_and(|add| add.iter().any(|c| c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN"));
        if adds_sys_admin {
            errors.push(
                f.clone(),
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
            );
        }
    }
    errors.one_of(
        format!("{f}.procMount"),
        sc.proc_mount.as_deref(),
        &["Default", "Unmasked"],
    );
    if sc.proc_mount.as_deref() == Some("Unmasked") && host_users {
        errors.push(
            format!("{f}.procMount"),
            "`hostUsers` must be false to use `Unmasked`",
        );
    }
    profiles(
        errors,
        &f,
        (
            sc.seccomp_profile.as_ref(),
            sc.app_armor_profile.as_ref(),
            sc.windows_options.as_ref(),
        ),
        linux,
    );
}

/// Where a container's AppArmor profile was asked for, to name it in a refusal.
fn apparmor_source(pod: &Pod, c: &Container, field: &str) -> String {
    if c.security_context
        .as_ref()
        .is_some_and(|s| s.app_armor_profile.is_some())
    {
        format!("{field}.securityContext.appArmorProfile")
    } else if pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .is_some_and(|s| s.app_armor_profile.is_some())
    {
        "spec.securityContext.appArmorProfile".to_string()
    } else {
        format!(
            "metadata.annotations[{APPARMOR_ANNOTATION_PREFIX}{}]",
            c.name
        )
    }
}

/// Every security problem of `pod` on a node with `node`'s facts, each naming its field.
pub(crate) fn validate_pod_security(pod: &Pod, node: &NodeSecurity) -> Vec<ValidationError> {
    let mut errors = Errors(Vec::new());
    let Some(spec) = pod.spec.as_ref() else {
        return errors.0;
    };
    let os = spec.os.as_ref().map(|o| o.name.as_str());
    if os.is_some_and(|name| name != "linux") {
        // A pod for another OS is refused by admission with upstream's reason and message
        // (`PodOSNotSupported`, which `PodOSRejection` waits for); its settings for that OS
        // are not this node's to judge.
        return errors.0;
    }
    let linux = os == Some("linux");
    let host_users = spec.host_users.unwrap_or(true);
    if !host_users {
        // Upstream's validation: a user namespace with the host's network, PID or IPC
        // namespace gives surprising permissions and has no known use.
        let host = |f: Option<bool>| f.unwrap_or(false);
        for (field, on) in [
            ("spec.securityContext.hostNetwork", host(spec.host_network)),
            ("spec.securityContext.HostPID", host(spec.host_pid)),
            ("spec.securityContext.HostIPC", host(spec.host_ipc)),
        ] {
            if on {
                errors.push(field, "Forbidden: when `pod.Spec.HostUsers` is false");
            }
        }
    }
    if let Some(sc) = spec.security_context.as_ref() {
        validate_pod_sc(&mut errors, pod, sc, node, linux);
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (field, c) in containers {
        if let Some(sc) = c.security_context.as_ref() {
            validate_container_sc(&mut errors, sc, &field, host_users, linux);
        }
        match apparmor_profile(pod, c) {
            Err(e) => {
                // Field errors are already reported above; only the annotation is new here.
                if matches!(e, AppArmorError::BadAnnotation { .. }) {
                    errors.push(apparmor_source(pod, c, &field), e.to_string());
                }
            }
            Ok(Some(a)) if !node.apparmor_enabled && a != AppArmor::Unconfined => {
                errors.push(
                    apparmor_source(pod, c, &field),
                    "AppArmor: Cannot enforce AppArmor: AppArmor is not enabled on the host",
                );
            }
            Ok(_) => {}
        }
    }
    errors.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        crate::base::yaml::from_str(yaml).unwrap()
    }

    fn node(unsafe_sysctls: &[&str], apparmor: bool) -> NodeSecurity {
        NodeSecurity {
            sysctls: SysctlAllowlist::new(unsafe_sysctls).unwrap(),
            apparmor_enabled: apparmor,
            supplemental_groups_policy_strict: false,
        }
    }

    /// (what, spec YAML under `spec:`, expected (field, part of the reason) pairs)
    type Row = (
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
    );

    const ROWS: &[Row] = &[
        (
            "everything allowed",
            "securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true, fsGroup: 2000, supplementalGroups: [3000], supplementalGroupsPolicy: Merge, fsGroupChangePolicy: OnRootMismatch, seLinuxChangePolicy: Recursive, seLinuxOptions: {level: 's0:c1'}, seccompProfile: {type: RuntimeDefault}, appArmorProfile: {type: Unconfined}, sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: '0'}, {name: kernel/shm_rmid_forced, value: '1'}], windowsOptions: {runAsUserName: x}}\n  containers: [{name: a, image: x, securityContext: {privileged: true, allowPrivilegeEscalation: true, readOnlyRootFilesystem: true, procMount: Default, capabilities: {add: [NET_ADMIN], drop: [ALL]}}}]",
            &[],
        ),
        (
            "ids out of range",
            "securityContext: {runAsUser: -1, fsGroup: 2147483648, supplementalGroups: [1, -5]}\n  containers: [{name: a, image: x, securityContext: {runAsGroup: -2}}]",
            &[
                ("spec.securityContext.runAsUser", "between 0 and 2147483647"),
                ("spec.securityContext.fsGroup", "between"),
                ("spec.securityContext.supplementalGroups[1]", "between"),
                ("spec.containers[0].securityContext.runAsGroup", "between"),
            ],
        ),
        (
            "unknown enum values",
            "securityContext: {supplementalGroupsPolicy: Loose, fsGroupChangePolicy: Never, seLinuxChangePolicy: Off, seccompProfile: {type: Tight}}\n  containers: [{name: a, image: x, securityContext: {procMount: Half}}]",
            &[
                (
                    "spec.securityContext.supplementalGroupsPolicy",
                    "not one of",
                ),
                ("spec.securityContext.fsGroupChangePolicy", "not one of"),
                ("spec.securityContext.seLinuxChangePolicy", "not one of"),
                ("spec.securityContext.seccompProfile.type", "not one of"),
                ("spec.containers[0].securityContext.procMount", "not one of"),
            ],
        ),
        (
            "strict supplemental groups",
            "securityContext: {supplementalGroupsPolicy: Strict}\n  containers: [{name: a, image: x}]",
            &[(
                "spec.securityContext.supplementalGroupsPolicy",
                "SupplementalGroupsPolicyNotSupported",
            )],
        ),
        (
            "unsafe and host-namespace sysctls",
            "hostNetwork: true\n  securityContext: {sysctls: [{name: kernel.msgmax, value: '1'}, {name: net.ipv4.tcp_syncookies, value: '1'}, {name: vm.swappiness, value: '1'}, {name: net.ipv4.ip_forward, value: '1'}, {name: kernel.msgmax, value: '2'}]}\n  containers: [{name: a, image: x}]",
            &[
                (
                    "spec.securityContext.sysctls[0].name",
                    "\"kernel.msgmax\" is not in the safe set",
                ),
                (
                    "spec.securityContext.sysctls[1].name",
                    "SysctlForbidden: forbidden sysctl: \"net.ipv4.tcp_syncookies\" is not allowed with hostNetwork: true",
                ),
                (
                    "spec.securityContext.sysctls[2].name",
                    "not known to be namespaced",
                ),
                (
                    "spec.securityContext.sysctls[3].name",
                    "allowedUnsafeSysctls",
                ),
                ("spec.securityContext.sysctls[4].name", "duplicate"),
            ],
        ),
        (
            "privilege escalation rules",
            "containers:\n  - {name: a, image: x, securityContext: {allowPrivilegeEscalation: false, privileged: true}}\n  - {name: b, image: x, securityContext: {allowPrivilegeEscalation: false, capabilities: {add: [SYS_ADMIN]}}}",
            &[
                ("spec.containers[0].securityContext", "`privileged` to true"),
                ("spec.containers[1].securityContext", "CAP_SYS_ADMIN"),
            ],
        ),
        (
            "user namespaces and unmasked proc are served",
            "hostUsers: false\n  containers: [{name: a, image: x}]\n  initContainers: [{name: i, image: x, securityContext: {procMount: Unmasked}}]",
            &[],
        ),
        (
            "user namespaces without the host's namespaces",
            "hostUsers: false\n  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n  containers: [{name: a, image: x}]",
            &[
                (
                    "spec.securityContext.hostNetwork",
                    "when `pod.Spec.HostUsers` is false",
                ),
                (
                    "spec.securityContext.HostPID",
                    "when `pod.Spec.HostUsers` is false",
                ),
                (
                    "spec.securityContext.HostIPC",
                    "when `pod.Spec.HostUsers` is false",
                ),
            ],
        ),
        (
            "unmasked proc needs a user namespace",
            "containers: [{name: a, image: x, securityContext: {procMount: Unmasked}}]",
            &[(
                "spec.containers[0].securityContext.procMount",
                "`hostUsers` must be false",
            )],
        ),
        (
            "apparmor without apparmor on the node",
            "securityContext: {appArmorProfile: {type: RuntimeDefault}}\n  containers: [{name: a, image: x}, {name: b, image: x, securityContext: {appArmorProfile: {type: Unconfined}}}, {name: c, image: x, securityContext: {appArmorProfile: {type: Localhost, localhostProfile: p}}}]",
            &[
                (
                    "spec.securityContext.appArmorProfile",
                    "AppArmor is not enabled on the host",
                ),
                (
                    "spec.containers[2].securityContext.appArmorProfile",
                    "AppArmor is not enabled on the host",
                ),
            ],
        ),
        (
            "malformed apparmor and seccomp",
            "securityContext: {seccompProfile: {type: Localhost, localhostProfile: ../../etc/evil.json}}\n  containers: [{name: a, image: x, securityContext: {appArmorProfile: {type: Localhost}, seccompProfile: {type: Localhost}}}, {name: b, image: x, securityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/audit.json}}}]",
            &[
                (
                    "spec.securityContext.seccompProfile.localhostProfile",
                    "without '..'",
                ),
                (
                    "spec.containers[0].securityContext.seccompProfile.localhostProfile",
                    "required",
                ),
                (
                    "spec.containers[0].securityContext.appArmorProfile.localhostProfile",
                    "required",
                ),
            ],
        ),
        (
            "windows settings",
            "os: {name: linux}\n  securityContext: {windowsOptions: {runAsUserName: x}}\n  containers: [{name: a, image: x, securityContext: {windowsOptions: {hostProcess: true}}}]",
            &[
                ("spec.securityContext.windowsOptions", "forbidden"),
                (
                    "spec.containers[0].securityContext.windowsOptions",
                    "forbidden",
                ),
            ],
        ),
        (
            "windows pods are left to admission",
            "os: {name: windows}\n  containers: [{name: a, image: x, securityContext: {windowsOptions: {hostProcess: true}}}]",
            &[],
        ),
        (
            "host process without an OS",
            "containers: [{name: a, image: x, securityContext: {windowsOptions: {hostProcess: true}}}]",
            &[(
                "spec.containers[0].securityContext.windowsOptions.hostProcess",
                "cannot run",
            )],
        ),
    ];

    #[test]
    fn table() {
        for (what, spec, want) in ROWS {
            let p = pod(&format!("metadata: {{name: p}}\nspec:\n  {spec}\n"));
            let got = validate_pod_security(&p, &node(&[], false));
            let fields: Vec<&str> = got.iter().map(|e| e.field.as_str()).collect();
            let want_fields: Vec<&str> = want.iter().map(|(f, _)| *f).collect();
            assert_eq!(fields, want_fields, "{what}: {got:?}");
            for (e, (_, needle)) in got.iter().zip(want.iter()) {
                assert!(
                    e.reason.contains(needle),
                    "{what}: {} lacks {needle:?}",
                    e.reason
                );
            }
        }
    }

    #[test]
    fn node_facts_change_the_answer() {
        let p = pod(
            "metadata:\n  name: p\n  annotations: {container.apparmor.security.beta.kubernetes.io/a: runtime/default}\nspec:\n  securityContext: {sysctls: [{name: kernel.msgmax, value: '1'}]}\n  containers: [{name: a, image: x}]\n",
        );
        let strict = validate_pod_security(&p, &node(&[], false));
        assert_eq!(
            strict.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            [
                "spec.securityContext.sysctls[0].name",
                "metadata.annotations[container.apparmor.security.beta.kubernetes.io/a]"
            ]
        );
        assert_eq!(
            validate_pod_security(&p, &node(&["kernel.msg*"], true)),
            vec![]
        );

        let bad = pod(
            "metadata:\n  name: p\n  annotations: {container.apparmor.security.beta.kubernetes.io/a: docker-default}\nspec:\n  containers: [{name: a, image: x}]\n",
        );
        let errs = validate_pod_security(&bad, &node(&[], true));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].reason.contains("unsupported value"), "{errs:?}");
    }

    #[test]
    fn strict_groups_follow_the_runtime_features() {
        use crate::clients::cri::proto::{RuntimeFeatures, StatusResponse};
        assert!(!strict_groups_supported(&StatusResponse::default()));
        let with = |on| StatusResponse {
            features: Some(RuntimeFeatures {
                supplemental_groups_policy: on,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!strict_groups_supported(&with(false)));
        assert!(strict_groups_supported(&with(true)));

        let p = pod(
            "metadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Strict}\n  containers: [{name: a, image: x}]\n",
        );
        let mut n = node(&[], false);
        assert_eq!(validate_pod_security(&p, &n).len(), 1);
        n.supplemental_groups_policy_strict = true;
        assert_eq!(validate_pod_security(&p, &n), vec![]);
    }

    #[test]
    fn apparmor_switch_file() {
        let dir = tempfile::tempdir().unwrap();
        let on = dir.path().join("on");
        std::fs::write(&on, "Y\n").unwrap();
        let off = dir.path().join("off");
        std::fs::write(&off, "N\n").unwrap();
        assert!(apparmor_enabled(on.to_str().unwrap()));
        assert!(!apparmor_enabled(off.to_str().unwrap()));
        assert!(!apparmor_enabled(
            dir.path().join("missing").to_str().unwrap()
        ));
    }
}
