//! The QoS cgroups under `kubepods`: `burstable` and `besteffort` (Guaranteed pods sit in
//! `kubepods` itself), with the settings upstream's QoS container manager gives them. Pure.
//!
//! - BestEffort always has the minimum weight (`cpu.shares` 2).
//! - Burstable gets the shares of the summed CPU requests of the active Burstable pods, so a
//!   busy node divides CPU between the tiers by what was asked; recomputed as pods come and go.
//! - Both tiers leave huge pages unbounded (the pods' own cgroups limit them).
//! - Memory: upstream only limits the tiers with the alpha `QOSReserved` gate and a
//!   `qosReserved` percentage; off by default, and then nothing is set. With a percentage the
//!   burstable tier is capped at allocatable less that share of the Guaranteed requests, and
//!   besteffort additionally less that share of the Burstable requests.
//! - On cgroup v2 the memory protection left by an older memory-QoS setting is reset at start
//!   (`memory.low` 0 on burstable, `memory.min`/`memory.low` 0 on kubepods).

use std::collections::BTreeMap;

use super::pod_config::{MIN_SHARES, ResourceConfig, milli_cpu_to_shares};
use crate::base::podspec::QosClass;

/// Upstream sets huge pages "unbounded" to this (2^62 bytes).
pub(crate) const UNBOUNDED_HUGEPAGES: i64 = 1 << 62;

/// What the QoS tiers need to know of one active pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub qos: QosClass,
    /// Summed CPU request in millicores.
    pub cpu_request_milli: i64,
    /// Summed memory request in bytes.
    pub memory_request: i64,
}

/// The settings of `kubepods`, `burstable` and `besteffort`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QosConfigs {
    pub kubepods: ResourceConfig,
    pub burstable: ResourceConfig,
    pub besteffort: ResourceConfig,
}

fn unbounded(page_sizes: &[u64]) -> BTreeMap<u64, i64> {
    page_sizes
        .iter()
        .map(|s| (*s, UNBOUNDED_HUGEPAGES))
        .collect()
}

/// What the tiers are created with at start.
pub(crate) fn startup(page_sizes: &[u64], v2: bool) -> QosConfigs {
    let mut out = QosConfigs::default();
    out.besteffort.cpu_shares = Some(MIN_SHARES);
    out.burstable.hugepage_limits = unbounded(page_sizes);
    out.besteffort.hugepage_limits = unbounded(page_sizes);
    if v2 {
        out.burstable
            .unified
            .insert("memory.low".into(), "0".into());
        out.kubepods.unified = BTreeMap::from([
            ("memory.min".to_string(), "0".to_string()),
            ("memory.low".to_string(), "0".to_string()),
        ]);
    }
    out
}

/// The tiers' settings for the pods active now. `memory_reserve_percent` is `qosReserved`'s
/// memory percentage (`None`: the default, no tier memory limits); `allocatable_memory` is the
/// node's allocatable memory in bytes (0 when unknown: no limits either).
pub(crate) fn update(
    pods: &[PodFacts],
    page_sizes: &[u64],
    memory_reserve_percent: Option<i64>,
    allocatable_memory: i64,
) -> QosConfigs {
    let burstable_cpu: i64 = pods
        .iter()
        .filter(|p| p.qos == QosClass::Burstable)
        .map(|p| p.cpu_request_milli)
        .sum();
    let mut out = QosConfigs {
        kubepods: ResourceConfig {
            hugepage_limits: unbounded(page_sizes),
            ..Default::default()
        },
        burstable: ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(burstable_cpu)),
            hugepage_limits: unbounded(page_sizes),
            ..Default::default()
        },
        besteffort: ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            hugepage_limits: unbounded(page_sizes),
            ..Default::default()
        },
    };
    if let Some(percent) = memory_reserve_percent
        && allocatable_memory > 0
    {
        let requested = |qos| -> i64 {
            pods.iter()
                .filter(|p| p.qos == qos)
                .map(|p| p.memory_request)
                .sum()
        };
        let burstable_limit = allocatable_memory - requested(QosClass::Guaranteed) * percent / 100;
        let besteffort_limit = burstable_limit - requested(QosClass::Burstable) * percent / 100;
        out.burstable.memory = Some(burstable_limit);
        out.besteffort.memory = Some(besteffort_limit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(qos: QosClass, cpu: i64, mem: i64) -> PodFacts {
        PodFacts {
            qos,
            cpu_request_milli: cpu,
            memory_request: mem,
        }
    }

    #[test]
    fn burstable_shares_follow_the_burstable_pods() {
        use QosClass::*;
        let rows: Vec<(&str, Vec<PodFacts>, u64)> = vec![
            ("no pods", vec![], 2),
            ("one burstable pod", vec![p(Burstable, 250, 0)], 256),
            (
                "two burstable pods add up",
                vec![p(Burstable, 250, 0), p(Burstable, 750, 0)],
                1024,
            ),
            (
                "other classes do not count",
                vec![
                    p(Guaranteed, 2000, 0),
                    p(BestEffort, 0, 0),
                    p(Burstable, 100, 0),
                ],
                102,
            ),
            (
                "a burstable pod with no cpu request",
                vec![p(Burstable, 0, 64 << 20)],
                2,
            ),
        ];
        for (what, pods, shares) in rows {
            let got = update(&pods, &[], None, 1 << 30);
            assert_eq!(got.burstable.cpu_shares, Some(shares), "{what}");
            assert_eq!(got.besteffort.cpu_shares, Some(2), "{what}");
            assert_eq!(got.burstable.memory, None, "{what}: QOSReserved is off");
            assert_eq!(got.kubepods.cpu_shares, None, "{what}");
        }
    }

    #[test]
    fn memory_reserve_as_upstream_when_asked_for() {
        use QosClass::*;
        let pods = [
            p(Guaranteed, 0, 1000),
            p(Burstable, 0, 400),
            p(BestEffort, 0, 0),
        ];
        let got = update(&pods, &[], Some(50), 10_000);
        assert_eq!(got.burstable.memory, Some(10_000 - 500));
        assert_eq!(got.besteffort.memory, Some(10_000 - 500 - 200));
        // Unknown allocatable: nothing.
        assert_eq!(update(&pods, &[], Some(50), 0).burstable.memory, None);
    }

    #[test]
    fn startup_and_hugepages() {
        let sizes = [2 << 20];
        let v1 = startup(&sizes, false);
        assert_eq!(v1.besteffort.cpu_shares, Some(2));
        assert_eq!(v1.burstable.cpu_shares, None);
        assert_eq!(v1.burstable.hugepage_limits[&(2 << 20)], 1 << 62);
        assert!(v1.burstable.unified.is_empty() && v1.kubepods.unified.is_empty());
        let v2 = startup(&sizes, true);
        assert_eq!(v2.burstable.unified["memory.low"], "0");
        assert_eq!(v2.kubepods.unified["memory.min"], "0");
        assert_eq!(v2.kubepods.unified["memory.low"], "0");
        assert!(v2.besteffort.unified.is_empty());
    }
}
