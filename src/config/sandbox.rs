//! The pod sandbox section: what goes into every pod sandbox's configuration besides the pod's
//! own spec. Its DNS (`clusterDomain`, `clusterDNS`, `resolvConf`) and the unsafe sysctls pods
//! may set (`allowedUnsafeSysctls`); CRI carries both in `PodSandboxConfig`.

use std::net::IpAddr;
use std::path::PathBuf;

use super::ConfigError;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{check_dns_subdomain, invalid, pick};

pub(super) const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// The merged sandbox settings.
pub(super) struct Sandbox {
    pub cluster_domain: Option<String>,
    pub cluster_dns: Vec<IpAddr>,
    pub allowed_unsafe_sysctls: Vec<String>,
    pub resolv_conf: PathBuf,
}

/// The sandbox settings. Each is checked here, at start, because a bad one would otherwise
/// fail every pod's sandbox rather than the agent once. `resolve` makes a path of the file
/// absolute (relative to the file's directory).
pub(super) fn sandbox(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<Sandbox, ConfigError> {
    let cluster_domain = cluster_domain(flags, f)?;
    let cluster_dns = cluster_dns(flags, f)?;
    let (allowed_unsafe_sysctls, o) = pick(
        flags.allowed_unsafe_sysctls.clone(),
        "--allowed-unsafe-sysctls",
        f.allowed_unsafe_sysctls.clone(),
        "allowedUnsafeSysctls",
        Vec::new,
    );
    let allowed_unsafe_sysctls: Vec<String> = allowed_unsafe_sysctls
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if let Err(err) = crate::base::podspec::sysctl::SysctlAllowlist::new(&allowed_unsafe_sysctls) {
        return Err(invalid(o.name(), err.to_string()));
    }
    let (resolv_conf, _) = pick(
        flags.resolv_conf.clone(),
        "--resolv-conf",
        f.resolv_conf.as_deref().map(resolve),
        "resolvConf",
        || PathBuf::from(DEFAULT_RESOLV_CONF),
    );
    Ok(Sandbox {
        cluster_domain,
        cluster_dns,
        allowed_unsafe_sysctls,
        resolv_conf,
    })
}

/// `clusterDomain`: `None` when blank, else a DNS subdomain (a trailing dot allowed).
fn cluster_domain(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<Option<String>, ConfigError> {
    let (cluster_domain, o) = pick(
        flags.cluster_domain.clone(),
        "--cluster-domain",
        f.cluster_domain.clone(),
        "clusterDomain",
        String::new,
    );
    match cluster_domain.trim() {
        "" => Ok(None),
        domain => {
            let bare = domain.strip_suffix('.').unwrap_or(domain);
            check_dns_subdomain(bare)
                .map_err(|why| invalid(o.name(), format!("{domain:?} {why}")))?;
            Ok(Some(domain.to_string()))
        }
    }
}

/// `clusterDNS`: IP addresses. The file's entries are checked even when the flag wins, and
/// an error names the entry (`clusterDNS[1]`).
fn cluster_dns(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Vec<IpAddr>, ConfigError> {
    let file_dns = match &f.cluster_dns {
        Some(entries) => Some(
            entries
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    text.trim().parse::<IpAddr>().map_err(|_| {
                        invalid(
                            &format!("clusterDNS[{i}]"),
                            format!("{text:?} is not an IP address"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let (cluster_dns, _) = pick(
        flags.cluster_dns.clone(),
        "--cluster-dns",
        file_dns,
        "clusterDNS",
        Vec::new,
    );
    Ok(cluster_dns)
}
