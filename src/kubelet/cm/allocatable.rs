//! What `kubepods` is limited to, as upstream's node container manager sets it: the node's
//! capacity less `kubeReserved` and `systemReserved` when `enforceNodeAllocatable` has `pods`
//! (the whole capacity otherwise). Hard eviction thresholds are NOT taken off here: they are
//! part of allocatable as reported to the scheduler, but the eviction manager, not the cgroup,
//! keeps that margin free. Pure.

use std::collections::BTreeMap;

use super::pod_config::{ResourceConfig, hugepage_size, milli_cpu_to_shares};
use crate::config::Reservations;

/// What the machine has, including the process IDs the kernel allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeCapacity {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// min(`kernel.pid_max`, `kernel.threads-max`), when readable.
    pub pids: Option<i64>,
    /// Page size in bytes → bytes of huge pages of that size.
    pub hugepages: Vec<(u64, i64)>,
}

impl NodeCapacity {
    /// The task limit of the machine, as upstream reads it: the smaller of `kernel.pid_max`
    /// and `kernel.threads-max` (either may be missing).
    pub(crate) fn read_pids(proc_sys_kernel: &std::path::Path) -> Option<i64> {
        ["pid_max", "threads-max"]
            .iter()
            .filter_map(|f| {
                std::fs::read_to_string(proc_sys_kernel.join(f))
                    .ok()?
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .min()
    }
}

/// The settings of `kubepods`: memory limit, CPU shares, pids limit and huge page limits.
pub(crate) fn kubepods_config(
    capacity: &NodeCapacity,
    reservations: &Reservations,
    enforce_pods: bool,
) -> ResourceConfig {
    let reserved = |name: &str, milli: bool| -> i64 {
        if !enforce_pods {
            return 0;
        }
        [&reservations.kube_reserved, &reservations.system_reserved]
            .iter()
            .filter_map(|m| m.get(name))
            .map(|q| if milli { q.milli_value() } else { q.value() })
            .fold(0i64, i64::saturating_add)
    };
    let less =
        |have: i64, name: &str, milli: bool| have.saturating_sub(reserved(name, milli)).max(0);

    let mut hugepage_limits = BTreeMap::new();
    for (size, bytes) in &capacity.hugepages {
        // Reservations name huge pages as resources (`hugepages-2Mi`).
        let held: i64 = if enforce_pods {
            [&reservations.kube_reserved, &reservations.system_reserved]
                .iter()
                .flat_map(|m| m.iter())
                .filter(|(name, _)| hugepage_size(name) == Some(*size))
                .map(|(_, q)| q.value())
                .sum()
        } else {
            0
        };
        hugepage_limits.insert(*size, bytes.saturating_sub(held).max(0));
    }
    ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(less(capacity.cpu_millis, "cpu", true))),
        memory: Some(less(capacity.memory_bytes, "memory", false)),
        pids_limit: capacity.pids.map(|p| less(p, "pid", false)),
        hugepage_limits,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::podspec::quantity;

    fn q(s: &str) -> quantity::Quantity {
        quantity::parse(s).unwrap()
    }

    #[test]
    fn kubepods_is_capacity_less_reservations_when_enforced() {
        let capacity = NodeCapacity {
            cpu_millis: 2000,
            memory_bytes: 8 << 30,
            pids: Some(32768),
            hugepages: vec![(2 << 20, 64 << 20)],
        };
        let reservations = Reservations {
            kube_reserved: BTreeMap::from([
                ("cpu".to_string(), q("500m")),
                ("memory".to_string(), q("1Gi")),
                ("pid".to_string(), q("1000")),
            ]),
            system_reserved: BTreeMap::from([
                ("memory".to_string(), q("512Mi")),
                ("hugepages-2Mi".to_string(), q("8Mi")),
            ]),
            eviction_hard: BTreeMap::from([(
                "memory.available".to_string(),
                crate::base::podspec::threshold::parse_signal_value("memory.available", "100Mi")
                    .unwrap(),
            )]),
        };
        let enforced = kubepods_config(&capacity, &reservations, true);
        assert_eq!(enforced.cpu_shares, Some(1536));
        // 8Gi - 1Gi - 512Mi; the eviction threshold is not taken off.
        assert_eq!(enforced.memory, Some((8 << 30) - (1 << 30) - (512 << 20)));
        assert_eq!(enforced.pids_limit, Some(31768));
        assert_eq!(enforced.hugepage_limits[&(2 << 20)], 56 << 20);

        let whole = kubepods_config(&capacity, &reservations, false);
        assert_eq!(whole.cpu_shares, Some(2048));
        assert_eq!(whole.memory, Some(8 << 30));
        assert_eq!(whole.pids_limit, Some(32768));
        assert_eq!(whole.hugepage_limits[&(2 << 20)], 64 << 20);
    }

    #[test]
    fn reservations_above_capacity_give_zero() {
        let capacity = NodeCapacity {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            pids: None,
            hugepages: vec![],
        };
        let reservations = Reservations {
            kube_reserved: BTreeMap::from([("memory".to_string(), q("2Gi"))]),
            system_reserved: BTreeMap::new(),
            eviction_hard: BTreeMap::new(),
        };
        let c = kubepods_config(&capacity, &reservations, true);
        assert_eq!(c.memory, Some(0));
        assert_eq!(c.pids_limit, None);
    }
}
