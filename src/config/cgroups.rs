//! The cgroups and resources section: how pods' cgroups are laid out (`cgroupDriver`,
//! `cgroupRoot`, `cgroupsPerQOS`) and what pods may use (`maxPods`, `podPidsLimit`,
//! `cpuCFSQuota`, `cpuCFSQuotaPeriod`, `enforceNodeAllocatable`).
//!
//! The layout is checked before the sandbox section and the resources after it (the order in
//! which errors are reported); the resources need the layout's `cgroupsPerQOS`.

use std::time::Duration;

use super::duration::format_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{file_count, file_duration, invalid, pick};
use super::{CgroupDriver, ConfigError};

// Upstream kubelet (v1beta1) defaults.
pub(super) const DEFAULT_CGROUP_ROOT: &str = "/";
pub(super) const DEFAULT_MAX_PODS: u32 = 110;
pub(super) const DEFAULT_POD_PIDS_LIMIT: i64 = -1;
pub(super) const DEFAULT_CPU_CFS_QUOTA_PERIOD: Duration = Duration::from_millis(100);
/// The `enforceNodeAllocatable` level that limits the kubepods cgroup to allocatable.
pub const ENFORCE_PODS: &str = "pods";

/// How pods' cgroups are laid out.
pub(super) struct Cgroups {
    pub driver: CgroupDriver,
    pub root: String,
    pub per_qos: bool,
}

/// The driver (which must match the runtime's), the root (an absolute cgroup path; empty
/// means `/`, as upstream) and whether pods are grouped by QoS class.
pub(super) fn cgroups(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Cgroups, ConfigError> {
    let (driver, o) = pick(
        flags.cgroup_driver.clone(),
        "--cgroup-driver",
        f.cgroup_driver.clone(),
        "cgroupDriver",
        || CgroupDriver::default().as_str().to_string(),
    );
    let driver: CgroupDriver = driver.parse().map_err(|why| invalid(o.name(), why))?;
    let (root, o) = pick(
        flags.cgroup_root.clone(),
        "--cgroup-root",
        f.cgroup_root.clone(),
        "cgroupRoot",
        || DEFAULT_CGROUP_ROOT.to_string(),
    );
    let root = if root.is_empty() {
        DEFAULT_CGROUP_ROOT.to_string()
    } else {
        root
    };
    if !root.starts_with('/') {
        return Err(invalid(
            o.name(),
            format!("{root:?} must be an absolute cgroup path (starting with /)"),
        ));
    }
    let (per_qos, _) = pick(
        flags.cgroups_per_qos,
        "--cgroups-per-qos",
        f.cgroups_per_qos,
        "cgroupsPerQOS",
        || true,
    );
    Ok(Cgroups {
        driver,
        root,
        per_qos,
    })
}

/// What pods may use of the node.
pub(super) struct Resources {
    pub max_pods: u32,
    /// -1 = unlimited.
    pub pod_pids_limit: i64,
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period: Duration,
    pub enforce_node_allocatable: Vec<String>,
}

/// The pod limits, the CPU quota and the allocatable enforcement, in that order.
pub(super) fn resources(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    cgroups_per_qos: bool,
) -> Result<Resources, ConfigError> {
    let (max_pods, pod_pids_limit) = pod_limits(flags, f)?;
    let (cpu_cfs_quota, cpu_cfs_quota_period) = cpu_quota(flags, f)?;
    Ok(Resources {
        max_pods,
        pod_pids_limit,
        cpu_cfs_quota,
        cpu_cfs_quota_period,
        enforce_node_allocatable: enforcement(flags, f, cgroups_per_qos)?,
    })
}

/// `maxPods` (at least 1) and `podPidsLimit` (-1 for no limit).
fn pod_limits(flags: &Flags, f: &KubeletConfigurationFile) -> Result<(u32, i64), ConfigError> {
    let (max_pods, o) = pick(
        flags.max_pods,
        "--max-pods",
        file_count(f.max_pods, "maxPods", 1)?,
        "maxPods",
        || DEFAULT_MAX_PODS,
    );
    if max_pods < 1 {
        return Err(invalid(o.name(), "must be at least 1"));
    }
    let (pod_pids_limit, o) = pick(
        flags.pod_max_pids,
        "--pod-max-pids",
        f.pod_pids_limit,
        "podPidsLimit",
        || DEFAULT_POD_PIDS_LIMIT,
    );
    if pod_pids_limit < -1 {
        return Err(invalid(
            o.name(),
            format!("{pod_pids_limit} must be -1 (unlimited) or greater"),
        ));
    }
    Ok((max_pods, pod_pids_limit))
}

/// `cpuCFSQuota` and `cpuCFSQuotaPeriod`; the period within the kernel's bounds (1ms to 1s).
fn cpu_quota(flags: &Flags, f: &KubeletConfigurationFile) -> Result<(bool, Duration), ConfigError> {
    let (cpu_cfs_quota, _) = pick(
        flags.cpu_cfs_quota,
        "--cpu-cfs-quota",
        f.cpu_cfs_quota,
        "cpuCFSQuota",
        || true,
    );
    let (period, o) = pick(
        flags.cpu_cfs_quota_period,
        "--cpu-cfs-quota-period",
        file_duration(f.cpu_cfs_quota_period.as_deref(), "cpuCFSQuotaPeriod")?,
        "cpuCFSQuotaPeriod",
        || DEFAULT_CPU_CFS_QUOTA_PERIOD,
    );
    if period < Duration::from_millis(1) || period > Duration::from_secs(1) {
        return Err(invalid(
            o.name(),
            format!(
                "{} must be between 1ms and 1s, inclusive",
                format_go_duration(period)
            ),
        ));
    }
    Ok((cpu_cfs_quota, period))
}

/// `enforceNodeAllocatable`, defaulting to `pods`.
fn enforcement(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    cgroups_per_qos: bool,
) -> Result<Vec<String>, ConfigError> {
    let (enforce, o) = pick(
        flags.enforce_node_allocatable.clone(),
        "--enforce-node-allocatable",
        f.enforce_node_allocatable.clone(),
        "enforceNodeAllocatable",
        || vec![ENFORCE_PODS.to_string()],
    );
    // Upstream refuses its own default `pods` without the QoS cgroups; here the default
    // quietly means none then, so `--cgroups-per-qos=false` alone still starts.
    let defaulted =
        flags.enforce_node_allocatable.is_none() && f.enforce_node_allocatable.is_none();
    if defaulted && !cgroups_per_qos {
        Ok(Vec::new())
    } else {
        check_enforcement(&enforce, cgroups_per_qos, o.name())
    }
}

/// `enforceNodeAllocatable` as upstream validates it: known levels, no duplicates, `none`
/// alone, and the QoS cgroups on for any level. The reserved-cgroup levels need
/// `--system-reserved-cgroup`/`--kube-reserved-cgroup`, which Deckhand does not have, so they
/// are refused by name.
fn check_enforcement(
    levels: &[String],
    cgroups_per_qos: bool,
    field: &str,
) -> Result<Vec<String>, ConfigError> {
    let levels: Vec<&str> = levels
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    let mut out: Vec<String> = Vec::new();
    for level in &levels {
        if out.iter().any(|l| l == level) {
            return Err(invalid(field, format!("duplicated enforcement {level:?}")));
        }
        match *level {
            "none" => {
                if levels.len() > 1 {
                    return Err(invalid(
                        field,
                        "may not contain other levels when \"none\" is given",
                    ));
                }
                return Ok(Vec::new());
            }
            ENFORCE_PODS => {}
            "system-reserved"
            | "system-reserved-compressible"
            | "kube-reserved"
            | "kube-reserved-compressible" => {
                return Err(invalid(
                    field,
                    format!(
                        "{level:?} needs a reserved cgroup (--system-reserved-cgroup / \
                         --kube-reserved-cgroup), which Deckhand does not support; only \"pods\" \
                         and \"none\" are"
                    ),
                ));
            }
            other => {
                return Err(invalid(
                    field,
                    format!(
                        "unknown level {other:?} (valid: \"pods\", \"system-reserved\", \
                         \"system-reserved-compressible\", \"kube-reserved\", \
                         \"kube-reserved-compressible\", \"none\")"
                    ),
                ));
            }
        }
        if !cgroups_per_qos {
            return Err(invalid(
                field,
                format!("{level:?} needs cgroupsPerQOS (--cgroups-per-qos) to be true"),
            ));
        }
        out.push(level.to_string());
    }
    Ok(out)
}
