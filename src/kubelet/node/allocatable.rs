//! Node capacity and allocatable, computed as upstream does:
//! allocatable = capacity − `kubeReserved` − `systemReserved` − hard eviction thresholds
//! (memory.available for memory, nodefs.available for ephemeral storage), never below zero,
//! and memory less the huge pages that are set aside.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::facts::MachineFacts;
use crate::base::podspec::resources::NodeAllocatable;
use crate::config::Reservations;

/// Amounts of each resource the node reports, in base units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Amounts {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pods: i64,
    /// Page size in bytes → bytes of that size set aside.
    pub hugepages: Vec<(u64, i64)>,
    /// Extended resources the node's device plugins offer, by name, in whole units.
    pub extended: BTreeMap<String, i64>,
}

impl Amounts {
    /// The API's resource list, each quantity in the canonical form the API server keeps.
    pub(crate) fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        let mut out = BTreeMap::from([
            ("cpu".to_string(), Quantity(format_millis(self.cpu_millis))),
            (
                "memory".to_string(),
                Quantity(format_bytes(self.memory_bytes)),
            ),
            (
                "ephemeral-storage".to_string(),
                Quantity(format_bytes(self.ephemeral_storage_bytes)),
            ),
            ("pods".to_string(), Quantity(self.pods.to_string())),
        ]);
        for (size, bytes) in &self.hugepages {
            let name = format!(
                "hugepages-{}",
                format_bytes(i64::try_from(*size).unwrap_or(i64::MAX))
            );
            out.insert(name, Quantity(format_bytes(*bytes)));
        }
        for (name, count) in &self.extended {
            out.insert(name.clone(), Quantity(count.to_string()));
        }
        out
    }

    /// What the downward API uses for limits a container does not set.
    pub(crate) fn for_downward_api(&self) -> NodeAllocatable {
        NodeAllocatable {
            cpu_millis: self.cpu_millis,
            memory_bytes: self.memory_bytes,
            ephemeral_storage_bytes: self.ephemeral_storage_bytes,
        }
    }
}

/// The node's capacity from its facts and `maxPods`.
pub(crate) fn capacity(machine: &MachineFacts, max_pods: u32) -> Amounts {
    Amounts {
        cpu_millis: i64::from(machine.cpus) * 1000,
        memory_bytes: i64::try_from(machine.memory_bytes).unwrap_or(i64::MAX),
        ephemeral_storage_bytes: i64::try_from(machine.root_fs_bytes).unwrap_or(i64::MAX),
        pods: i64::from(max_pods),
        hugepages: machine
            .hugepages
            .iter()
            .map(|(size, bytes)| (*size, i64::try_from(*bytes).unwrap_or(i64::MAX)))
            .collect(),
        extended: BTreeMap::new(),
    }
}

/// Allocatable: capacity less what is reserved.
pub(crate) fn allocatable(capacity: &Amounts, reserved: &Reservations) -> Amounts {
    let held = |name: &str, capacity: i64, milli: bool| -> i64 {
        let amount = |m: &BTreeMap<String, crate::base::podspec::quantity::Quantity>| {
            m.get(name)
                .map(|q| if milli { q.milli_value() } else { q.value() })
                .unwrap_or(0)
        };
        let eviction = match name {
            "memory" => reserved.eviction_hard.get("memory.available"),
            "ephemeral-storage" => reserved.eviction_hard.get("nodefs.available"),
            _ => None,
        }
        .map(|t| t.amount(capacity))
        .unwrap_or(0);
        amount(&reserved.kube_reserved)
            .saturating_add(amount(&reserved.system_reserved))
            .saturating_add(eviction)
    };
    let less = |capacity: i64, held: i64| capacity.saturating_sub(held).max(0);
    let hugepage_bytes: i64 = capacity.hugepages.iter().map(|(_, b)| *b).sum();
    let memory = less(
        capacity.memory_bytes,
        held("memory", capacity.memory_bytes, false),
    );
    Amounts {
        cpu_millis: less(capacity.cpu_millis, held("cpu", capacity.cpu_millis, true)),
        memory_bytes: less(memory, hugepage_bytes),
        ephemeral_storage_bytes: less(
            capacity.ephemeral_storage_bytes,
            held("ephemeral-storage", capacity.ephemeral_storage_bytes, false),
        ),
        pods: capacity.pods,
        hugepages: capacity.hugepages.clone(),
        // Device plugins give their own allocatable (the healthy devices).
        extended: BTreeMap::new(),
    }
}

/// CPU as the API server writes it: whole cores as `2`, otherwise millicores as `1900m`.
pub(crate) fn format_millis(millis: i64) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// Bytes as the API server writes a binary quantity: the largest power-of-1024 suffix that
/// divides the amount exactly (`24590000Ki`, `2Mi`), else the plain number.
pub(crate) fn format_bytes(bytes: i64) -> String {
    if bytes == 0 {
        return "0".to_string();
    }
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut suffix = None;
    for s in SUFFIXES {
        if value % 1024 != 0 {
            break;
        }
        value /= 1024;
        suffix = Some(s);
    }
    match suffix {
        Some(s) => format!("{value}{s}"),
        None => bytes.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::podspec::quantity::parse;
    use crate::base::podspec::threshold::Threshold;

    fn machine() -> MachineFacts {
        MachineFacts {
            cpus: 2,
            memory_bytes: 8 << 30,
            hugepages: vec![(2 << 20, 512 << 20)],
            root_fs_bytes: 100 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn formats_like_the_api_server() {
        assert_eq!(format_millis(2000), "2");
        assert_eq!(format_millis(1900), "1900m");
        assert_eq!(format_bytes(25_180_160_000), "24590000Ki");
        assert_eq!(format_bytes(2 << 20), "2Mi");
        assert_eq!(format_bytes(1500), "1500");
        assert_eq!(format_bytes(0), "0");
    }

    #[test]
    fn allocatable_table() {
        let reservations =
            |kube: &[(&str, &str)], system: &[(&str, &str)], hard: &[(&str, Threshold)]| {
                Reservations {
                    kube_reserved: kube
                        .iter()
                        .map(|(k, v)| (k.to_string(), parse(v).unwrap()))
                        .collect(),
                    system_reserved: system
                        .iter()
                        .map(|(k, v)| (k.to_string(), parse(v).unwrap()))
                        .collect(),
                    eviction_hard: hard.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                }
            };
        let cap = capacity(&machine(), 110);
        struct Case {
            name: &'static str,
            reserved: Reservations,
            cpu_millis: i64,
            memory_bytes: i64,
            ephemeral: i64,
        }
        let cases = [
            Case {
                name: "upstream defaults: 100Mi memory and 10% of the disk, less huge pages",
                reserved: Reservations::default(),
                cpu_millis: 2000,
                memory_bytes: (8 << 30) - (100 << 20) - (512 << 20),
                ephemeral: (100 << 30) - (10 << 30),
            },
            Case {
                name: "kube and system reserved add up",
                reserved: reservations(
                    &[("cpu", "100m"), ("memory", "1Gi")],
                    &[("cpu", "200m"), ("ephemeral-storage", "1Gi")],
                    &[("memory.available", Threshold::Percent(1.0))],
                ),
                cpu_millis: 1700,
                memory_bytes: (8 << 30) - (1 << 30) - (8 << 30) / 100 - (512 << 20),
                ephemeral: (100 << 30) - (1 << 30),
            },
            Case {
                name: "never below zero",
                reserved: reservations(&[("cpu", "3"), ("memory", "9Gi")], &[], &[]),
                cpu_millis: 0,
                memory_bytes: 0,
                ephemeral: 100 << 30,
            },
        ];
        for c in cases {
            let a = allocatable(&cap, &c.reserved);
            assert_eq!(a.cpu_millis, c.cpu_millis, "{}", c.name);
            assert_eq!(a.memory_bytes, c.memory_bytes, "{}", c.name);
            assert_eq!(a.ephemeral_storage_bytes, c.ephemeral, "{}", c.name);
            assert_eq!(a.pods, 110, "{}", c.name);
        }
    }

    #[test]
    fn the_resource_list_names_huge_pages_by_size() {
        let q = capacity(&machine(), 110).to_quantities();
        assert_eq!(q["cpu"].0, "2");
        assert_eq!(q["memory"].0, "8Gi");
        assert_eq!(q["pods"].0, "110");
        assert_eq!(q["hugepages-2Mi"].0, "512Mi");
        assert_eq!(q["ephemeral-storage"].0, "100Gi");
    }
}
