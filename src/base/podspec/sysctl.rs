//! Which pod sysctls a node accepts, as upstream's kubelet decides it: the safe set (namespaced
//! and isolated from other pods) always, anything else only when the operator lists it in
//! `allowedUnsafeSysctls`, and never a sysctl of a namespace the pod shares with the host.
//!
//! Pure: the checks take the names and the pod's host-namespace flags and return why not.

use std::collections::BTreeMap;

use thiserror::Error;

/// Sysctls every pod may set (upstream's list as of 1.33). All are namespaced in the network or
/// IPC namespace and affect only the pod that sets them. Upstream drops a few from the list on
/// kernels older than 4.x where they were not yet namespaced; Deckhand needs a newer kernel for
/// cgroup v2 anyway, so the list is fixed.
pub(crate) const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// Upstream's longest accepted sysctl name.
const MAX_NAME_LEN: usize = 253;

/// The kernel namespace a sysctl belongs to; a sysctl of no known namespace would change the
/// whole node and is never allowed in a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SysctlNamespace {
    Ipc,
    Net,
}

impl SysctlNamespace {
    fn host_flag(self) -> &'static str {
        match self {
            SysctlNamespace::Ipc => "hostIPC",
            SysctlNamespace::Net => "hostNetwork",
        }
    }
}

/// Why a sysctl or an allow-list entry was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SysctlError {
    #[error(
        "{0:?} is not a valid sysctl name (at most 253 characters of lowercase letters, digits, '-' and '_', in parts separated by '.' or '/')"
    )]
    InvalidName(String),
    #[error("{0:?} is not known to be namespaced: it would change the whole node")]
    NotNamespaced(String),
    #[error(
        "{name:?} is not allowed with {flag}: true (the pod shares that namespace with the node)"
    )]
    HostNamespace { name: String, flag: &'static str },
    #[error(
        "{0:?} is not in the safe set and not listed in the node's allowedUnsafeSysctls (--allowed-unsafe-sysctls)"
    )]
    NotAllowed(String),
}

/// `net/ipv4/conf/eth0.100/rp_filter` → `net.ipv4.conf.eth0/100.rp_filter`: names may use `/`
/// as the separator, in which case dots inside a part are written as `/` in the dotted form.
pub(crate) fn to_dotted(name: &str) -> String {
    let first_sep = name.find(['.', '/']);
    match first_sep.map(|i| name.as_bytes()[i]) {
        Some(b'/') => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

fn is_part(part: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !part.is_empty()
        && part.chars().all(ok_char)
        && edge(part.chars().next())
        && edge(part.chars().last())
}

/// Whether `name` is syntactically a sysctl name (either separator style).
pub(crate) fn is_valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN && name.split(['.', '/']).all(is_part)
}

/// The namespace of a dotted sysctl name, as the kernel scopes it.
pub(crate) fn namespace_of(dotted: &str) -> Option<SysctlNamespace> {
    if dotted == "kernel.sem" {
        return Some(SysctlNamespace::Ipc);
    }
    const PREFIXES: [(&str, SysctlNamespace); 4] = [
        ("kernel.shm", SysctlNamespace::Ipc),
        ("kernel.msg", SysctlNamespace::Ipc),
        ("fs.mqueue.", SysctlNamespace::Ipc),
        ("net.", SysctlNamespace::Net),
    ];
    PREFIXES
        .iter()
        .find(|(p, _)| dotted.starts_with(p))
        .map(|(_, ns)| *ns)
}

/// The sysctls a node accepts: exact names and `prefix*` patterns, each with its namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SysctlAllowlist {
    exact: BTreeMap<String, SysctlNamespace>,
    prefixes: BTreeMap<String, SysctlNamespace>,
}

impl SysctlAllowlist {
    /// The safe set plus the operator's `allowedUnsafeSysctls` entries (names or `prefix*`).
    /// An entry that is malformed or not namespaced is an error: allowing it could only
    /// change the node.
    pub fn new<S: AsRef<str>>(unsafe_allowed: &[S]) -> Result<SysctlAllowlist, SysctlError> {
        let mut list = SysctlAllowlist::default();
        for name in SAFE_SYSCTLS {
            list.add(name)?;
        }
        for entry in unsafe_allowed {
            list.add(entry.as_ref())?;
        }
        Ok(list)
    }

    fn add(&mut self, entry: &str) -> Result<(), SysctlError> {
        let (body, pattern) = match entry.strip_suffix('*') {
            Some(body) => (body, true),
            None => (entry, false),
        };
        // A pattern's body may end with a separator (`net.ipv4.*`) or a partial part (`kernel.shm*`).
        let trimmed = body.trim_end_matches(['.', '/']);
        if !(is_valid_name(trimmed) || (pattern && body.is_empty())) {
            return Err(SysctlError::InvalidName(entry.to_string()));
        }
        let dotted = to_dotted(body);
        let ns = namespace_of(&dotted).ok_or_else(|| SysctlError::NotNamespaced(entry.into()))?;
        if pattern {
            self.prefixes.insert(dotted, ns);
        } else {
            self.exact.insert(dotted, ns);
        }
        Ok(())
    }

    /// Whether a pod with these host-namespace settings may set `name`.
    pub fn check(&self, name: &str, host_network: bool, host_ipc: bool) -> Result<(), SysctlError> {
        if !is_valid_name(name) {
            return Err(SysctlError::InvalidName(name.to_string()));
        }
        let dotted = to_dotted(name);
        let ns = self.exact.get(&dotted).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| dotted.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        let Some(ns) = ns else {
            return Err(match namespace_of(&dotted) {
                Some(_) => SysctlError::NotAllowed(name.to_string()),
                None => SysctlError::NotNamespaced(name.to_string()),
            });
        };
        let shared = match ns {
            SysctlNamespace::Ipc => host_ipc,
            SysctlNamespace::Net => host_network,
        };
        if shared {
            return Err(SysctlError::HostNamespace {
                name: name.to_string(),
                flag: ns.host_flag(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_form() {
        assert_eq!(to_dotted("net.ipv4.tcp_rmem"), "net.ipv4.tcp_rmem");
        assert_eq!(
            to_dotted("net/ipv4/conf/eth0.100/rp_filter"),
            "net.ipv4.conf.eth0/100.rp_filter"
        );
    }

    #[test]
    fn names() {
        for ok in [
            "kernel.shm_rmid_forced",
            "net/ipv4/tcp_rmem",
            "a",
            "net.ipv4.conf.eth-0.x",
        ] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Net.ipv4",
            "net..x",
            "net.-x",
            "net.x_",
            "net ipv4",
            &"a".repeat(254),
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn check_table() {
        let list = SysctlAllowlist::new(&["kernel.msgmax", "net.core.*", "fs.mqueue.*"]).unwrap();
        // (name, hostNetwork, hostIPC, expected)
        type Row = (&'static str, bool, bool, Result<(), &'static str>);
        let rows: &[Row] = &[
            ("net.ipv4.ip_unprivileged_port_start", false, false, Ok(())),
            ("net/ipv4/tcp_rmem", false, false, Ok(())),
            ("kernel.shm_rmid_forced", false, false, Ok(())),
            ("kernel.msgmax", false, false, Ok(())),
            ("net.core.somaxconn", false, false, Ok(())),
            ("fs.mqueue.msg_max", false, false, Ok(())),
            ("net.ipv4.tcp_syncookies", true, false, Err("hostNetwork")),
            ("net.core.somaxconn", true, false, Err("hostNetwork")),
            ("kernel.shm_rmid_forced", false, true, Err("hostIPC")),
            ("kernel.shm_rmid_forced", true, false, Ok(())),
            (
                "net.ipv4.ip_forward",
                false,
                false,
                Err("allowedUnsafeSysctls"),
            ),
            ("kernel.sem", false, false, Err("allowedUnsafeSysctls")),
            (
                "vm.overcommit_memory",
                false,
                false,
                Err("not known to be namespaced"),
            ),
            (
                "kernel.panic",
                false,
                false,
                Err("not known to be namespaced"),
            ),
            ("Kernel.Panic", false, false, Err("not a valid sysctl name")),
        ];
        for (name, net, ipc, want) in rows {
            let got = list.check(name, *net, *ipc);
            match (want, &got) {
                (Ok(()), Ok(())) => {}
                (Err(needle), Err(e)) => {
                    assert!(e.to_string().contains(needle), "{name}: {e}")
                }
                _ => panic!("{name} (hostNetwork {net}, hostIPC {ipc}): got {got:?}"),
            }
        }
    }

    #[test]
    fn only_safe_without_an_allowlist() {
        let list = SysctlAllowlist::new::<&str>(&[]).unwrap();
        for name in SAFE_SYSCTLS {
            assert_eq!(list.check(name, false, false), Ok(()), "{name}");
        }
        assert!(list.check("kernel.msgmax", false, false).is_err());
    }

    #[test]
    fn bad_allowlist_entries() {
        assert_eq!(
            SysctlAllowlist::new(&["vm.swappiness"]),
            Err(SysctlError::NotNamespaced("vm.swappiness".into()))
        );
        assert_eq!(
            SysctlAllowlist::new(&["kernel.*"]),
            Err(SysctlError::NotNamespaced("kernel.*".into()))
        );
        assert_eq!(
            SysctlAllowlist::new(&["net..x"]),
            Err(SysctlError::InvalidName("net..x".into()))
        );
        assert!(SysctlAllowlist::new(&["kernel.shm*", "net.ipv4.*"]).is_ok());
    }
}
