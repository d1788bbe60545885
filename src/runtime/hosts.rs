//! The kubelet-managed `/etc/hosts` of a pod (not used for hostNetwork pods, which see the node's).

use k8s_openapi::api::core::v1::Pod;

/// Renders the hosts file for `pod` with IP `pod_ip`, as upstream lays it out: the localhost
/// block, the pod's own name, then `hostAliases`.
pub fn render_hosts_file(pod: &Pod, pod_ip: Option<&str>, cluster_domain: Option<&str>) -> String {
    let mut text = String::from("# Kubernetes-managed hosts file.\n");
    text.push_str("127.0.0.1\tlocalhost\n");
    text.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    text.push_str("fe00::0\tip6-localnet\n");
    text.push_str("fe00::0\tip6-mcastprefix\n");
    text.push_str("fe00::1\tip6-allnodes\n");
    text.push_str("fe00::2\tip6-allrouters\n");
    let spec = pod.spec.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let hostname = spec.hostname.clone().unwrap_or_else(|| truncate_hostname(&name));
    if let Some(ip) = pod_ip.filter(|ip| !ip.is_empty()) {
        match (&spec.subdomain, cluster_domain) {
            (Some(sub), Some(domain)) if !sub.is_empty() => {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                text.push_str(&format!("{ip}\t{hostname}.{sub}.{ns}.svc.{domain}\t{hostname}\n"));
            }
            _ => text.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    if let Some(aliases) = &spec.host_aliases {
        text.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            text.push_str(&format!("{}\t{}\n", alias.ip, names));
        }
    }
    text
}

/// Hostnames are DNS labels: at most 63 characters, not ending in `-` or `.`.
pub fn truncate_hostname(name: &str) -> String {
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

    #[test]
    fn hosts_file_has_pod_entry_and_aliases() {
        let pod = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("prod".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                host_aliases: Some(vec![HostAlias {
                    ip: "10.1.2.3".into(),
                    hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = render_hosts_file(&pod, Some("10.88.0.5"), None);
        assert!(text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(text.contains("10.88.0.5\tweb-node1\n"), "{text}");
        assert!(text.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{text}");

        let mut sub = pod.clone();
        sub.spec.as_mut().unwrap().subdomain = Some("svc1".into());
        sub.spec.as_mut().unwrap().hostname = Some("h".into());
        let text = render_hosts_file(&sub, Some("10.88.0.5"), Some("cluster.local"));
        assert!(text.contains("10.88.0.5\th.svc1.prod.svc.cluster.local\th\n"), "{text}");
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
