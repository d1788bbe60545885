//! cgroup v1: the files (per hierarchy) and contents for a [`ResourceConfig`], in the order
//! runc's cgroup library writes them for the kubelet. Pure.

use super::pod_config::ResourceConfig;
use super::{FileWrite, hugepage_unit};

/// The hierarchies a Deckhand cgroup lives in, as upstream's existence check counts them
/// (`hugetlb` only where it is mounted). Others (devices, freezer, …) are runc's business.
pub(crate) const CONTROLLERS: [&str; 7] = [
    "cpu", "cpuacct", "cpuset", "memory", "pids", "systemd", "hugetlb",
];

/// `pids.max` for a limit: the number, `max` for none, and 1 for zero (as systemd has it).
pub(crate) fn pids_value(limit: i64) -> String {
    match limit {
        l if l > 0 => l.to_string(),
        0 => "1".to_string(),
        _ => "max".to_string(),
    }
}

/// The writes for `config`: memory, then cpu (shares, period, quota), pids, hugetlb.
/// `page_sizes` are the huge page sizes the machine has (in bytes); a size the config does
/// not name is limited to 0, as upstream does. Zero or absent values are not written.
/// `unified` entries have no v1 meaning and are left out.
pub(crate) fn files(config: &ResourceConfig, page_sizes: &[u64], hugetlb: bool) -> Vec<FileWrite> {
    let mut out = Vec::new();
    if let Some(memory) = config.memory.filter(|m| *m != 0) {
        out.push(FileWrite::new("memory", "memory.limit_in_bytes", memory));
    }
    if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
        out.push(FileWrite::new("cpu", "cpu.shares", shares));
    }
    if let Some(period) = config.cpu_period.filter(|p| *p != 0) {
        out.push(FileWrite::new("cpu", "cpu.cfs_period_us", period));
    }
    if let Some(quota) = config.cpu_quota.filter(|q| *q != 0) {
        out.push(FileWrite::new("cpu", "cpu.cfs_quota_us", quota));
    }
    if let Some(pids) = config.pids_limit {
        out.push(FileWrite::new("pids", "pids.max", pids_value(pids)));
    }
    if hugetlb {
        for (size, limit) in hugepage_writes(config, page_sizes) {
            out.push(FileWrite::new(
                "hugetlb",
                format!("hugetlb.{size}.limit_in_bytes"),
                limit,
            ));
            out.push(
                FileWrite::new(
                    "hugetlb",
                    format!("hugetlb.{size}.rsvd.limit_in_bytes"),
                    limit,
                )
                .optional(),
            );
        }
    }
    out
}

/// Each huge page size with its limit: the configured ones, then 0 for the machine's others.
pub(super) fn hugepage_writes(config: &ResourceConfig, page_sizes: &[u64]) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = config
        .hugepage_limits
        .iter()
        .filter_map(|(size, limit)| Some((hugepage_unit(*size)?, (*limit).max(0))))
        .collect();
    for size in page_sizes {
        if !config.hugepage_limits.contains_key(size)
            && let Some(unit) = hugepage_unit(*size)
        {
            out.push((unit, 0));
        }
    }
    out
}
