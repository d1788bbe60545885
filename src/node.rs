//! Facts about the node read once at start: its IP, memory, DNS settings.

use crate::k8s::resources::NodeAllocatable;
use std::net::IpAddr;
use std::path::Path;

/// The node's IP: the configured one, else the first global IPv4 address of the interface that
/// carries the default route, else of any interface that is up.
pub fn detect_host_ip(configured: Option<IpAddr>) -> Option<IpAddr> {
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
pub fn default_route_interface(route_table: &str) -> Option<String> {
    route_table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let iface = fields.next()?;
        let destination = fields.next()?;
        (destination == "00000000").then(|| iface.to_string())
    })
}

/// Total memory from `/proc/meminfo`, in bytes.
pub fn memory_capacity(meminfo: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    parse_mem_total(&text)
}

/// `MemTotal:  24590000 kB` → bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the node can give pods: its CPUs (as this process may use them), the given memory and
/// the size of the root filesystem. No resources are reserved for system daemons yet, so
/// allocatable equals capacity.
pub fn detect_allocatable(memory_bytes: u64) -> NodeAllocatable {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let storage = nix::sys::statvfs::statvfs("/")
        .map(|s| (s.blocks() as u128) * (s.fragment_size() as u128))
        .unwrap_or(0);
    NodeAllocatable {
        cpu_millis: i64::try_from(cpus).unwrap_or(i64::MAX / 1000) * 1000,
        memory_bytes: i64::try_from(memory_bytes).unwrap_or(i64::MAX),
        ephemeral_storage_bytes: i64::try_from(storage).unwrap_or(i64::MAX),
    }
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
}
