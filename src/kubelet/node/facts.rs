//! Facts about the node: its IP, memory, CPUs, huge pages, disk and identity, read from the
//! kernel and the OS.

use std::net::IpAddr;
use std::path::Path;

/// The node's IP: the configured one, else the first global IPv4 address of the interface that
/// carries the default route, else of any interface that is up.
pub(crate) fn detect_host_ip(configured: Option<IpAddr>) -> Option<IpAddr> {
    if configured.is_some() {
        return configured;
    }
    let default_iface = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|text| default_route_interface(&text));
    let addrs: Vec<(String, IpAddr)> = nix::ifaddrs::getifaddrs()
        .ok()?
        .filter_map(|ifa| {
            let addr = ifa.address?;
            let v4 = addr.as_sockaddr_in()?;
            Some((ifa.interface_name, IpAddr::V4(v4.ip())))
        })
        .filter(|(_, ip)| !ip.is_loopback())
        .collect();
    if let Some(iface) = default_iface
        && let Some((_, ip)) = addrs.iter().find(|(name, _)| *name == iface)
    {
        return Some(*ip);
    }
    addrs.first().map(|(_, ip)| *ip)
}

/// The interface of the default route in `/proc/net/route` (destination 00000000).
pub(crate) fn default_route_interface(route_table: &str) -> Option<String> {
    route_table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let iface = fields.next()?;
        let destination = fields.next()?;
        (destination == "00000000").then(|| iface.to_string())
    })
}

/// Total memory from `/proc/meminfo`, in bytes.
pub(crate) fn memory_capacity(meminfo: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    parse_mem_total(&text)
}

/// `MemTotal:  24590000 kB` → bytes.
pub(crate) fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the node is made of, read from the kernel and the OS once per status computation
/// (cheap: a handful of small files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MachineFacts {
    /// Online CPUs (upstream's cAdvisor `NumCores`).
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Page size in bytes → total bytes of pre-allocated huge pages of that size.
    pub hugepages: Vec<(u64, u64)>,
    /// Size of the filesystem that holds the root dir (ephemeral storage capacity).
    pub root_fs_bytes: u64,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
}

impl MachineFacts {
    /// Reads the facts; a fact that cannot be read is left empty or zero (the node status
    /// then says a capacity is missing rather than inventing one).
    pub(crate) fn read(root_dir: &Path) -> MachineFacts {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let cpus = nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
            .ok()
            .flatten()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let root_fs_bytes = nix::sys::statvfs::statvfs(root_dir)
            .or_else(|_| nix::sys::statvfs::statvfs("/"))
            .map(|s| s.blocks().saturating_mul(s.fragment_size()))
            .unwrap_or(0);
        MachineFacts {
            cpus,
            memory_bytes: memory_capacity(Path::new("/proc/meminfo")).unwrap_or(0),
            hugepages: read_hugepages(Path::new("/sys/kernel/mm/hugepages")),
            root_fs_bytes,
            machine_id: read("/etc/machine-id"),
            system_uuid: read("/sys/class/dmi/id/product_uuid"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            kernel_version: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            os_image: parse_os_release(
                &std::fs::read_to_string("/etc/os-release")
                    .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
                    .unwrap_or_default(),
            ),
        }
    }
}

/// `PRETTY_NAME` of os-release (upstream's OS image), or "Linux" when there is none.
pub(crate) fn parse_os_release(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').trim_matches('\'').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "Linux".to_string())
}

/// `hugepages-2048kB` → 2 MiB, with `nr_hugepages` pages of it.
fn read_hugepages(dir: &Path) -> Vec<(u64, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let size = hugepage_size(&e.file_name().to_string_lossy())?;
            let pages: u64 = std::fs::read_to_string(e.path().join("nr_hugepages"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((size, size.saturating_mul(pages)))
        })
        .collect();
    out.sort();
    out
}

/// The page size a `/sys/kernel/mm/hugepages` entry names, in bytes.
pub(crate) fn hugepage_size(dir_name: &str) -> Option<u64> {
    let kib: u64 = dir_name
        .strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_table() {
        let table = "Iface\tDestination\tGateway\tFlags\n\
                     dh0\t00285A0A\t00000000\t0001\n\
                     eth0\t00000000\t0102A8C0\t0003\n";
        assert_eq!(default_route_interface(table).as_deref(), Some("eth0"));
        assert_eq!(default_route_interface("Iface\tDestination\n"), None);
    }

    #[test]
    fn mem_total() {
        assert_eq!(
            parse_mem_total("MemTotal:       1024 kB\nMemFree: 1 kB\n"),
            Some(1024 * 1024)
        );
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn os_release_and_hugepage_names() {
        assert_eq!(
            parse_os_release("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(parse_os_release(""), "Linux");
        assert_eq!(hugepage_size("hugepages-2048kB"), Some(2 << 20));
        assert_eq!(hugepage_size("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(hugepage_size("other"), None);
    }

    #[test]
    fn the_machine_is_read() {
        let m = MachineFacts::read(Path::new("/"));
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 0);
        assert!(m.root_fs_bytes > 0);
        assert_eq!(m.boot_id.len(), 36, "{m:?}");
        assert!(!m.kernel_version.is_empty());
    }
}
