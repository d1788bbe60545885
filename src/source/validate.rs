//! Checks that protect the node from a malformed static pod. Not the API server's full
//! validation: the parts a node relies on, each reported with the field it concerns.

use std::collections::HashSet;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};

#[path = "validate_security.rs"]
pub mod validate_security;

/// One problem with one field, e.g. `spec.containers[1].name: duplicate name "app"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// Join errors for a one-line message.
pub fn join_errors(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// Why `value` is not a DNS-1123 label, or `None` if it is one.
pub fn dns1123_label_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters (is {})",
            value.len()
        ));
    }
    let ok = value.chars().all(is_label_char) && !value.starts_with('-') && !value.ends_with('-');
    if !ok {
        return Some(format!(
            "{value:?} is not a valid DNS-1123 label: lowercase letters, digits and '-', \
             starting and ending with a letter or digit"
        ));
    }
    None
}

/// Why `value` is not a DNS-1123 subdomain, or `None` if it is one.
pub fn dns1123_subdomain_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters (is {})",
            value.len()
        ));
    }
    let ok = value.split('.').all(|part| {
        !part.is_empty()
            && part.chars().all(is_label_char)
            && !part.starts_with('-')
            && !part.ends_with('-')
    });
    if !ok {
        return Some(format!(
            "{value:?} is not a valid DNS-1123 subdomain: lowercase letters, digits, '-' and \
             '.', each part starting and ending with a letter or digit"
        ));
    }
    None
}

struct Errors(Vec<ValidationError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ValidationError {
            field: field.into(),
            reason: reason.into(),
        });
    }
}

const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];
const DNS_POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

fn validate_container(
    c: &Container,
    field: &str,
    names: &mut HashSet<String>,
    errors: &mut Errors,
) {
    match dns1123_label_problem(&c.name) {
        Some(problem) => errors.push(format!("{field}.name"), problem),
        None => {
            if !names.insert(c.name.clone()) {
                errors.push(
                    format!("{field}.name"),
                    format!("duplicate container name {:?}", c.name),
                );
            }
        }
    }
    if c.image.as_deref().unwrap_or_default().trim().is_empty() {
        errors.push(format!("{field}.image"), "required");
    }
    if let Some(policy) = c.image_pull_policy.as_deref()
        && !PULL_POLICIES.contains(&policy)
    {
        errors.push(
            format!("{field}.imagePullPolicy"),
            format!("{policy:?} is not one of {PULL_POLICIES:?}"),
        );
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let pf = format!("{field}.ports[{j}]");
        if !(1..=65535).contains(&port.container_port) {
            errors.push(
                format!("{pf}.containerPort"),
                format!("{} is not between 1 and 65535", port.container_port),
            );
        }
        if let Some(host_port) = port.host_port
            && !(0..=65535).contains(&host_port)
        {
            errors.push(
                format!("{pf}.hostPort"),
                format!("{host_port} is not between 0 and 65535"),
            );
        }
        if let Some(protocol) = port.protocol.as_deref()
            && !PROTOCOLS.contains(&protocol)
        {
            errors.push(
                format!("{pf}.protocol"),
                format!("{protocol:?} is not one of {PROTOCOLS:?}"),
            );
        }
    }
}

/// Validate a pod after defaults and static-pod conventions were applied. Returns every
/// problem found, not just the first.
pub fn validate_pod(pod: &Pod) -> Result<(), Vec<ValidationError>> {
    let mut errors = Errors(Vec::new());
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_subdomain_problem(name) {
        errors.push("metadata.name", problem);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_label_problem(namespace) {
        errors.push("metadata.namespace", problem);
    }
    let Some(spec) = pod.spec.as_ref() else {
        errors.push("spec", "required");
        return Err(errors.0);
    };
    if spec.containers.is_empty() {
        errors.push("spec.containers", "must have at least one container");
    }
    let mut names = HashSet::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        validate_container(
            c,
            &format!("spec.initContainers[{i}]"),
            &mut names,
            &mut errors,
        );
    }
    for (i, c) in spec.containers.iter().enumerate() {
        validate_container(c, &format!("spec.containers[{i}]"), &mut names, &mut errors);
    }
    if let Some(policy) = spec.restart_policy.as_deref()
        && !RESTART_POLICIES.contains(&policy)
    {
        errors.push(
            "spec.restartPolicy",
            format!("{policy:?} is not one of {RESTART_POLICIES:?}"),
        );
    }
    if let Some(policy) = spec.dns_policy.as_deref()
        && !DNS_POLICIES.contains(&policy)
    {
        errors.push(
            "spec.dnsPolicy",
            format!("{policy:?} is not one of {DNS_POLICIES:?}"),
        );
    }
    if let Some(grace) = spec.termination_grace_period_seconds
        && grace < 0
    {
        errors.push(
            "spec.terminationGracePeriodSeconds",
            format!("{grace} must not be negative"),
        );
    }
    errors.0.extend(validate_security::check(pod));
    if errors.0.is_empty() {
        Ok(())
    } else {
        Err(errors.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        crate::yaml::from_str(yaml).unwrap()
    }

    fn fields(result: Result<(), Vec<ValidationError>>) -> Vec<String> {
        result
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    const OK: &str = "
metadata: {name: web-node, namespace: default}
spec:
  restartPolicy: Always
  initContainers: [{name: init, image: busybox}]
  containers:
  - name: app
    image: nginx
    ports: [{containerPort: 80, hostPort: 8080, protocol: TCP}]
";

    #[test]
    fn good_pod_passes() {
        assert_eq!(validate_pod(&pod(OK)), Ok(()));
    }

    #[test]
    fn table() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "missing containers",
                "metadata: {name: a, namespace: default}\nspec: {containers: []}\n",
                &["spec.containers"],
            ),
            (
                "no spec",
                "metadata: {name: a, namespace: default}\n",
                &["spec"],
            ),
            (
                "duplicate across init and app",
                "metadata: {name: a, namespace: default}\nspec:\n  initContainers: [{name: app, image: x}]\n  containers: [{name: app, image: x}]\n",
                &["spec.containers[0].name"],
            ),
            (
                "duplicate app names",
                "metadata: {name: a, namespace: default}\nspec:\n  containers: [{name: app, image: x}, {name: app, image: y}]\n",
                &["spec.containers[1].name"],
            ),
            (
                "invalid pod name",
                "metadata: {name: Web_1, namespace: default}\nspec: {containers: [{name: a, image: x}]}\n",
                &["metadata.name"],
            ),
            (
                "invalid namespace",
                "metadata: {name: a, namespace: kube.system}\nspec: {containers: [{name: a, image: x}]}\n",
                &["metadata.namespace"],
            ),
            (
                "invalid container name and missing image",
                "metadata: {name: a, namespace: default}\nspec: {containers: [{name: App}]}\n",
                &["spec.containers[0].name", "spec.containers[0].image"],
            ),
            (
                "bad ports",
                "metadata: {name: a, namespace: default}\nspec: {containers: [{name: a, image: x, ports: [{containerPort: 0}, {containerPort: 70000, hostPort: 70000, protocol: ICMP}]}]}\n",
                &[
                    "spec.containers[0].ports[0].containerPort",
                    "spec.containers[0].ports[1].containerPort",
                    "spec.containers[0].ports[1].hostPort",
                    "spec.containers[0].ports[1].protocol",
                ],
            ),
            (
                "bad restart and dns policy",
                "metadata: {name: a, namespace: default}\nspec: {restartPolicy: Sometimes, dnsPolicy: Magic, containers: [{name: a, image: x}]}\n",
                &["spec.restartPolicy", "spec.dnsPolicy"],
            ),
        ];
        for (what, yaml, want) in cases {
            assert_eq!(fields(validate_pod(&pod(yaml))), *want, "{what}");
        }
    }

    #[test]
    fn name_length_limits() {
        let long = "a".repeat(254);
        assert!(dns1123_subdomain_problem(&long).is_some());
        assert!(dns1123_subdomain_problem(&"a".repeat(253)).is_none());
        assert!(dns1123_label_problem(&"a".repeat(64)).is_some());
        assert!(dns1123_label_problem(&"a".repeat(63)).is_none());
        assert!(dns1123_subdomain_problem("a..b").is_some());
        assert!(dns1123_subdomain_problem("kube-apiserver.node-1").is_none());
    }
}
