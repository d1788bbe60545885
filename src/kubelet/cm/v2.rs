//! cgroup v2: the files and contents for a [`ResourceConfig`], in the order runc's cgroup
//! library writes them for the kubelet. Pure.

use super::pod_config::{DEFAULT_CPU_PERIOD_US, MAX_SHARES, ResourceConfig};
use super::{FileWrite, v1};

/// The controllers upstream needs enabled on a v2 cgroup (those the machine has).
pub(crate) const CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "pids", "hugetlb"];

/// `cpu.weight` for `cpu.shares` (upstream's conversion from [2, 262144] to [1, 10000]).
pub(crate) fn cpu_weight(shares: u64) -> u64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.saturating_sub(2) * 9_999) / 262_142
}

/// `cpu.max`: the quota (or `max` for none) and the period (100 ms when only a quota is set).
pub(crate) fn cpu_max(quota: Option<i64>, period: Option<u64>) -> Option<String> {
    let quota = quota.unwrap_or(0);
    let period = period.unwrap_or(0);
    if quota == 0 && period == 0 {
        return None;
    }
    let limit = if quota > 0 {
        quota.to_string()
    } else {
        "max".to_string()
    };
    let period = if period == 0 {
        DEFAULT_CPU_PERIOD_US
    } else {
        period
    };
    Some(format!("{limit} {period}"))
}

/// The writes for `config`: pids, memory, cpu (weight, max), hugetlb, then the unified map.
/// The controller field is empty: v2 has one hierarchy.
pub(crate) fn files(config: &ResourceConfig, page_sizes: &[u64], hugetlb: bool) -> Vec<FileWrite> {
    let mut out = Vec::new();
    if let Some(pids) = config.pids_limit {
        out.push(FileWrite::new("", "pids.max", v1::pids_value(pids)));
    }
    if let Some(memory) = config.memory.filter(|m| *m != 0) {
        let value = if memory == -1 {
            "max".to_string()
        } else {
            memory.to_string()
        };
        out.push(FileWrite::new("", "memory.max", value));
    }
    if let Some(shares) = config.cpu_shares.filter(|s| *s != 0) {
        out.push(FileWrite::new("", "cpu.weight", cpu_weight(shares)));
    }
    if let Some(max) = cpu_max(config.cpu_quota, config.cpu_period) {
        out.push(FileWrite::new("", "cpu.max", max));
    }
    if hugetlb {
        for (size, limit) in v1::hugepage_writes(config, page_sizes) {
            out.push(FileWrite::new("", format!("hugetlb.{size}.max"), limit));
            out.push(FileWrite::new("", format!("hugetlb.{size}.rsvd.max"), limit).optional());
        }
    }
    for (file, value) in &config.unified {
        out.push(FileWrite::new("", file.clone(), value.clone()));
    }
    out
}
