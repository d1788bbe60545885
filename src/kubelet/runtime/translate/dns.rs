//! DNS settings of a pod sandbox, from the pod's `dnsPolicy`/`dnsConfig` and the host's
//! resolv.conf.

use k8s_openapi::api::core::v1::Pod;

use crate::clients::cri::proto::DnsConfig;

/// The resolver settings of the host, as parsed from its resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostDns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Parses resolv.conf text.
///
/// `nameserver` lines add a server; the last `search` line wins (like glibc), with `.` dropped
/// and trailing dots trimmed so `a.` and `a` count once; `options` accumulate, a later option
/// replacing an earlier one of the same name. Comments (`#`, `;`) and other keywords are
/// ignored.
pub(crate) fn parse_resolv_conf(content: &str) -> HostDns {
    let mut dns = HostDns::default();
    for line in content.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => {
                if let Some(server) = fields.next() {
                    dns.servers.push(server.to_string());
                }
            }
            Some("search") => {
                dns.searches = fields
                    .filter(|s| *s != ".")
                    .map(|s| s.trim_end_matches('.').to_string())
                    .collect();
            }
            Some("options") => {
                let options = std::mem::take(&mut dns.options);
                dns.options = merge_options(options, fields.map(str::to_string));
            }
            _ => {}
        }
    }
    dns
}

/// Appends `extra` to `base`, an option replacing (in place) one of the same name
/// (`ndots:2` replaces `ndots:5`).
fn merge_options(base: Vec<String>, extra: impl IntoIterator<Item = String>) -> Vec<String> {
    fn name(opt: &str) -> &str {
        opt.split(':').next().unwrap_or(opt)
    }
    let mut out = base;
    for opt in extra {
        match out.iter_mut().find(|o| name(o) == name(&opt)) {
            Some(existing) => *existing = opt,
            None => out.push(opt),
        }
    }
    out
}

fn dedup_keep_order(items: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Which base the pod's resolver configuration starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Host,
    Cluster,
    Empty,
}

/// Resolver configuration for a pod.
///
/// `dnsPolicy` (default `ClusterFirst`): `Default` → the host's; `ClusterFirst` → the cluster
/// DNS servers, or the host's when there are none or the pod uses the host network;
/// `ClusterFirstWithHostNet` → the cluster's (host's when there are none); `None` → nothing.
/// The pod's `dnsConfig` is then merged on top in every case.
pub(crate) fn pod_dns_config(
    pod: &Pod,
    host: &HostDns,
    cluster_dns: &[String],
    cluster_domain: &str,
) -> DnsConfig {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .filter(|p| !p.is_empty())
        .unwrap_or("ClusterFirst");

    let wants_cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let base = match policy {
        "None" => Base::Empty,
        _ if wants_cluster && !cluster_dns.is_empty() => Base::Cluster,
        _ if wants_cluster => {
            // Said once at start-up by the daemon; per pod it would repeat on every sandbox.
            tracing::debug!(
                pod = %crate::base::podspec::full_name(pod),
                "no clusterDNS configured: \"ClusterFirst\" falls back to \"Default\""
            );
            Base::Host
        }
        // Default, ClusterFirst on the host network, or an unknown policy.
        _ => Base::Host,
    };

    let mut config = match base {
        Base::Empty => DnsConfig::default(),
        Base::Host => DnsConfig {
            servers: host.servers.clone(),
            searches: host.searches.clone(),
            options: host.options.clone(),
        },
        Base::Cluster => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let mut searches = Vec::new();
            let domain = cluster_domain.trim_end_matches('.');
            if !domain.is_empty() {
                searches.push(format!("{namespace}.svc.{domain}"));
                searches.push(format!("svc.{domain}"));
                searches.push(domain.to_string());
            }
            searches.extend(host.searches.iter().cloned());
            DnsConfig {
                servers: cluster_dns.to_vec(),
                searches,
                options: vec!["ndots:5".to_string()],
            }
        }
    };

    if let Some(pod_dns) = spec.and_then(|s| s.dns_config.as_ref()) {
        config
            .servers
            .extend(pod_dns.nameservers.iter().flatten().cloned());
        config
            .searches
            .extend(pod_dns.searches.iter().flatten().cloned());
        let pod_options = pod_dns
            .options
            .iter()
            .flatten()
            .filter_map(|o| {
                let name = o.name.as_deref().filter(|n| !n.is_empty())?;
                Some(match o.value.as_deref() {
                    Some(v) if !v.is_empty() => format!("{name}:{v}"),
                    _ => name.to_string(),
                })
            })
            .collect::<Vec<_>>();
        config.options = merge_options(std::mem::take(&mut config.options), pod_options);
    }
    config.servers = dedup_keep_order(config.servers);
    config.servers.truncate(MAX_NAMESERVERS);
    config.searches = searches_within_limits(dedup_keep_order(config.searches));
    config
}

/// At most this many nameservers reach the pod (glibc's limit; the rest are dropped).
const MAX_NAMESERVERS: usize = 3;
/// At most this many search domains, and this many characters on the search line.
const MAX_SEARCH_PATHS: usize = 32;
const MAX_SEARCH_LINE_CHARS: usize = 2048;
/// A search domain longer than a DNS name makes some resolvers abort: dropped.
const MAX_SEARCH_DOMAIN_CHARS: usize = 253;

/// Cuts the search list to the limits upstream enforces: the first 32 domains, without
/// over-long ones, then whole domains off the end until the line fits 2048 characters.
fn searches_within_limits(mut searches: Vec<String>) -> Vec<String> {
    searches.truncate(MAX_SEARCH_PATHS);
    searches.retain(|s| s.len() <= MAX_SEARCH_DOMAIN_CHARS);
    let line_len = |s: &[String]| {
        s.iter()
            .map(|d| d.len() + 1)
            .sum::<usize>()
            .saturating_sub(1)
    };
    while line_len(&searches) > MAX_SEARCH_LINE_CHARS {
        searches.pop();
    }
    searches
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resolv_conf_table() {
        let cases: &[(&str, HostDns)] = &[
            ("", HostDns::default()),
            (
                "nameserver 1.1.1.1\nnameserver 8.8.8.8\n",
                HostDns {
                    servers: strings(&["1.1.1.1", "8.8.8.8"]),
                    ..Default::default()
                },
            ),
            (
                "# generated\nsearch corp.example. lab.example\nnameserver 10.0.0.2 # local\n",
                HostDns {
                    servers: strings(&["10.0.0.2"]),
                    searches: strings(&["corp.example", "lab.example"]),
                    options: vec![],
                },
            ),
            (
                "search old.example\nsearch new.example .\n",
                HostDns {
                    searches: strings(&["new.example"]),
                    ..Default::default()
                },
            ),
            (
                "options ndots:2 edns0\noptions ndots:3 rotate\n",
                HostDns {
                    options: strings(&["ndots:3", "edns0", "rotate"]),
                    ..Default::default()
                },
            ),
            (
                "  nameserver\t9.9.9.9  \n; comment\ndomain example.org\nsortlist 10.0.0.0\nnameserver\n",
                HostDns {
                    servers: strings(&["9.9.9.9"]),
                    ..Default::default()
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&parse_resolv_conf(text), want, "input {text:?}");
        }
    }

    fn host() -> HostDns {
        HostDns {
            servers: strings(&["192.168.1.1"]),
            searches: strings(&["lan"]),
            options: strings(&["edns0"]),
        }
    }

    fn pod(policy: Option<&str>, host_network: bool, dns: Option<PodDNSConfig>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                dns_policy: policy.map(str::to_string),
                host_network: Some(host_network),
                dns_config: dns,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cfg(servers: &[&str], searches: &[&str], options: &[&str]) -> DnsConfig {
        DnsConfig {
            servers: strings(servers),
            searches: strings(searches),
            options: strings(options),
        }
    }

    #[test]
    fn policy_table() {
        let cluster = strings(&["10.96.0.10"]);
        let none: Vec<String> = vec![];
        let host_cfg = cfg(&["192.168.1.1"], &["lan"], &["edns0"]);
        let cluster_cfg = cfg(
            &["10.96.0.10"],
            &[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "lan",
            ],
            &["ndots:5"],
        );
        let cases: Vec<(&str, Pod, &Vec<String>, DnsConfig)> = vec![
            (
                "Default",
                pod(Some("Default"), false, None),
                &cluster,
                host_cfg.clone(),
            ),
            (
                "unset = ClusterFirst",
                pod(None, false, None),
                &cluster,
                cluster_cfg.clone(),
            ),
            (
                "ClusterFirst",
                pod(Some("ClusterFirst"), false, None),
                &cluster,
                cluster_cfg.clone(),
            ),
            (
                "ClusterFirst without cluster DNS",
                pod(Some("ClusterFirst"), false, None),
                &none,
                host_cfg.clone(),
            ),
            (
                "ClusterFirst on host network",
                pod(Some("ClusterFirst"), true, None),
                &cluster,
                host_cfg.clone(),
            ),
            (
                "ClusterFirstWithHostNet on host network",
                pod(Some("ClusterFirstWithHostNet"), true, None),
                &cluster,
                cluster_cfg.clone(),
            ),
            (
                "None without dnsConfig",
                pod(Some("None"), false, None),
                &cluster,
                cfg(&[], &[], &[]),
            ),
        ];
        for (what, pod, cluster_dns, want) in cases {
            assert_eq!(
                pod_dns_config(&pod, &host(), cluster_dns, "cluster.local"),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn dns_config_merges_on_top() {
        let dns = PodDNSConfig {
            nameservers: Some(strings(&["1.1.1.1", "192.168.1.1"])),
            searches: Some(strings(&["my.example", "lan"])),
            options: Some(vec![
                PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("2".into()),
                },
                PodDNSConfigOption {
                    name: Some("single-request".into()),
                    value: None,
                },
            ]),
        };
        assert_eq!(
            pod_dns_config(
                &pod(Some("None"), false, Some(dns.clone())),
                &host(),
                &[],
                ""
            ),
            cfg(
                &["1.1.1.1", "192.168.1.1"],
                &["my.example", "lan"],
                &["ndots:2", "single-request"]
            )
        );
        assert_eq!(
            pod_dns_config(&pod(Some("Default"), false, Some(dns)), &host(), &[], ""),
            cfg(
                &["192.168.1.1", "1.1.1.1"],
                &["lan", "my.example"],
                &["edns0", "ndots:2", "single-request"]
            )
        );
    }

    #[test]
    fn more_policies() {
        let cluster = strings(&["10.96.0.10", "10.96.0.11"]);
        // ClusterFirstWithHostNet off the host network is ClusterFirst.
        assert_eq!(
            pod_dns_config(
                &pod(Some("ClusterFirstWithHostNet"), false, None),
                &host(),
                &cluster,
                "cluster.local"
            )
            .servers,
            cluster
        );
        // ClusterFirstWithHostNet without cluster DNS falls back to the host's.
        assert_eq!(
            pod_dns_config(
                &pod(Some("ClusterFirstWithHostNet"), true, None),
                &host(),
                &[],
                "cluster.local"
            ),
            cfg(&["192.168.1.1"], &["lan"], &["edns0"])
        );
        // No cluster domain: only the host's searches.
        assert_eq!(
            pod_dns_config(&pod(None, false, None), &host(), &cluster, ""),
            cfg(&["10.96.0.10", "10.96.0.11"], &["lan"], &["ndots:5"])
        );
        // A host search equal to a cluster one appears once.
        let mut h = host();
        h.searches = strings(&["cluster.local", "lan"]);
        assert_eq!(
            pod_dns_config(&pod(None, false, None), &h, &cluster, "cluster.local").searches,
            strings(&[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "lan"
            ])
        );
    }

    #[test]
    fn limits_are_enforced() {
        let dns = PodDNSConfig {
            nameservers: Some(strings(&["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"])),
            searches: Some((0..40).map(|i| format!("d{i}.example")).collect()),
            options: None,
        };
        let got = pod_dns_config(&pod(Some("None"), false, Some(dns)), &host(), &[], "");
        assert_eq!(got.servers, strings(&["1.1.1.1", "2.2.2.2", "3.3.3.3"]));
        assert_eq!(got.searches.len(), 32);
        assert_eq!(got.searches[31], "d31.example");

        let long: Vec<String> = (0..20)
            .map(|i| format!("{i:02}{}", "a".repeat(150)))
            .collect();
        let got = searches_within_limits(long.clone());
        assert_eq!(got, long[..13].to_vec());
        let too_long = vec!["ok".to_string(), "b".repeat(300)];
        assert_eq!(searches_within_limits(too_long), strings(&["ok"]));
    }
}
