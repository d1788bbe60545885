//! The kubelet-managed `/etc/hosts` of a pod: its own for a pod with its own network, the
//! node's with the pod's `hostAliases` appended for a hostNetwork pod (upstream mounts one in
//! both cases).

use k8s_openapi::api::core::v1::Pod;

/// Renders the hosts file for `pod` with IP `pod_ip`, laid out as upstream's
/// `managedHostsFileContent`: a header, the localhost block, the pod's own line (`IP\thostname`,
/// or `IP\tFQDN\thostname` when the pod has a `subdomain`), then a `hostAliases` section when
/// there are aliases.
pub(crate) fn render_hosts_file(
    pod: &Pod,
    pod_ip: Option<&str>,
    cluster_domain: Option<&str>,
) -> String {
    let mut text = String::from("# Kubernetes-managed hosts file.\n");
    text.push_str("127.0.0.1\tlocalhost\n");
    text.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    text.push_str("fe00::0\tip6-localnet\n");
    text.push_str("fe00::0\tip6-mcastprefix\n");
    text.push_str("fe00::1\tip6-allnodes\n");
    text.push_str("fe00::2\tip6-allrouters\n");
    let (hostname, domain) = pod_hostname_and_domain(pod, cluster_domain);
    if let Some(ip) = pod_ip.filter(|ip| !ip.is_empty()) {
        match domain {
            Some(domain) => text.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n")),
            None => text.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    text.push_str(&aliases_block(pod));
    text
}

/// The hosts file of a hostNetwork pod, as upstream's `nodeHostsFileContent`: its own header,
/// the node's hosts file as it is (`node_hosts`), then the `hostAliases` section. The pod sees
/// the node's names and its aliases, not a pod line.
pub(crate) fn render_host_network_hosts_file(pod: &Pod, node_hosts: &str) -> String {
    let mut text = String::from("# Kubernetes-managed hosts file (host network).\n");
    text.push_str(node_hosts);
    text.push_str(&aliases_block(pod));
    text
}

/// The `hostAliases` section, after a blank line: one line per alias, its IP then its
/// hostnames, tab-separated; empty when the pod has none.
fn aliases_block(pod: &Pod) -> String {
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or(&[]);
    if aliases.is_empty() {
        return String::new();
    }
    let mut text = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.as_deref().unwrap_or(&[]).join("\t");
        text.push_str(&format!("{}\t{}\n", alias.ip, names));
    }
    text
}

/// The pod's short hostname (`spec.hostname`, else its name, cut to 63 characters) and, when it
/// has a `subdomain`, its domain `<subdomain>.<namespace>.svc.<clusterDomain>` (upstream builds
/// it even when the cluster domain is empty).
pub(crate) fn pod_hostname_and_domain(
    pod: &Pod,
    cluster_domain: Option<&str>,
) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    if let Some(hostname) = hostname_override(pod) {
        return (truncate_hostname(hostname), None);
    }
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .unwrap_or(name);
    let hostname = truncate_hostname(hostname);
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            format!("{sub}.{ns}.svc.{}", cluster_domain.unwrap_or(""))
        });
    (hostname, domain)
}

/// `spec.hostnameOverride` when set: the pod's whole hostname, with no domain, whatever its
/// `hostname` and `subdomain` say (upstream's `GeneratePodHostNameAndDomain`; the
/// `HostnameOverride` gate is on by default since 1.35, and the API server refuses it together
/// with `setHostnameAsFQDN` or `hostNetwork`, and when it is not a DNS subdomain).
pub(crate) fn hostname_override(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.hostname_override.as_deref())
        .filter(|h| !h.is_empty())
}

/// Hostnames are DNS labels: at most 63 characters, not ending in `-` or `.`.
pub(crate) fn truncate_hostname(name: &str) -> String {
    let mut h: String = name.chars().take(63).collect();
    while h.ends_with('-') || h.ends_with('.') {
        h.pop();
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostAlias, PodSpec};

    fn pod(
        hostname: Option<&str>,
        subdomain: Option<&str>,
        aliases: Option<Vec<HostAlias>>,
    ) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("prod".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                hostname: hostname.map(str::to_string),
                subdomain: subdomain.map(str::to_string),
                host_aliases: aliases,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const HEADER: &str = "# Kubernetes-managed hosts file.\n\
        127.0.0.1\tlocalhost\n\
        ::1\tlocalhost ip6-localhost ip6-loopback\n\
        fe00::0\tip6-localnet\n\
        fe00::0\tip6-mcastprefix\n\
        fe00::1\tip6-allnodes\n\
        fe00::2\tip6-allrouters\n";

    #[test]
    fn hosts_file_table() {
        let aliases = vec![
            HostAlias {
                ip: "10.1.2.3".into(),
                hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
            },
            HostAlias {
                ip: "10.1.2.4".into(),
                hostnames: Some(vec!["baz".into()]),
            },
        ];
        let long = "x".repeat(62) + "-y";
        // (what, pod, pod IP, cluster domain, expected file)
        type Case<'a> = (&'a str, Pod, Option<&'a str>, Option<&'a str>, String);
        let cases: Vec<Case> = vec![
            (
                "plain",
                pod(None, None, None),
                Some("10.88.0.5"),
                Some("cluster.local"),
                format!("{HEADER}10.88.0.5\tweb-node1\n"),
            ),
            (
                "no IP yet: no pod line",
                pod(None, None, None),
                None,
                None,
                HEADER.to_string(),
            ),
            (
                "hostname and subdomain",
                pod(Some("h"), Some("svc1"), None),
                Some("10.88.0.5"),
                Some("cluster.local"),
                format!("{HEADER}10.88.0.5\th.svc1.prod.svc.cluster.local\th\n"),
            ),
            (
                "subdomain without a cluster domain",
                pod(None, Some("svc1"), None),
                Some("10.88.0.5"),
                None,
                format!("{HEADER}10.88.0.5\tweb-node1.svc1.prod.svc.\tweb-node1\n"),
            ),
            (
                "long hostname is truncated",
                pod(Some(&long), None, None),
                Some("10.88.0.5"),
                None,
                format!("{HEADER}10.88.0.5\t{}\n", "x".repeat(62)),
            ),
            (
                "hostnameOverride: the whole name, no domain, over hostname and subdomain",
                {
                    let mut p = pod(Some("h"), Some("svc1"), None);
                    p.spec.as_mut().unwrap().hostname_override =
                        Some("override.example.host".into());
                    p
                },
                Some("10.88.0.5"),
                Some("cluster.local"),
                format!("{HEADER}10.88.0.5\toverride.example.host\n"),
            ),
            (
                "aliases",
                pod(None, None, Some(aliases)),
                Some("10.88.0.5"),
                None,
                format!(
                    "{HEADER}10.88.0.5\tweb-node1\n\n# Entries added by HostAliases.\n\
                     10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n"
                ),
            ),
            (
                "empty alias list: no section",
                pod(None, None, Some(vec![])),
                Some("10.88.0.5"),
                None,
                format!("{HEADER}10.88.0.5\tweb-node1\n"),
            ),
        ];
        for (what, pod, ip, domain, want) in cases {
            assert_eq!(render_hosts_file(&pod, ip, domain), want, "{what}");
        }
    }

    #[test]
    fn hostname_truncation() {
        assert_eq!(truncate_hostname(&"a".repeat(70)), "a".repeat(63));
        let mut s = "b".repeat(62);
        s.push('-');
        s.push('c');
        assert_eq!(truncate_hostname(&s), "b".repeat(62));
    }
}
