//! Eviction signals, the resources and node conditions they stand for, thresholds as the
//! manager uses them, and how quantities are written in messages.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::base::podspec::threshold::Threshold;
use crate::config::EvictionSettings;

/// An eviction signal (upstream's `evictionapi.Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

/// A resource the node can run short of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    /// The name upstream's messages use.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }

    /// Bytes are written as binary quantities (`100Mi`), counts as decimal ones (`5k`).
    fn binary(self) -> bool {
        matches!(self, Resource::Memory | Resource::EphemeralStorage)
    }

    /// `amount` as upstream writes a quantity of this resource.
    pub fn format(self, amount: i64) -> String {
        if self.binary() {
            format_binary(amount)
        } else {
            format_decimal(amount)
        }
    }
}

pub use crate::base::node_pressure::Condition;

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The resource the signal measures.
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition a met threshold of this signal sets.
    pub fn condition(self) -> Condition {
        match self.resource() {
            Resource::Memory => Condition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => Condition::DiskPressure,
            Resource::Pids => Condition::PidPressure,
        }
    }

    /// Memory first, as upstream's `byEvictionPriority`: the node can die of it fastest.
    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

/// One configured threshold: hard when its grace period is zero.
#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdSpec {
    pub signal: Signal,
    pub value: Threshold,
    pub grace_period: Duration,
    pub min_reclaim: Option<Threshold>,
}

impl ThresholdSpec {
    /// Upstream's `isHardEvictionThreshold`.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// The threshold's amount on a resource of `capacity`.
    pub fn quantity(&self, capacity: i64) -> i64 {
        self.value.amount(capacity)
    }
}

/// The thresholds the manager watches: the hard ones, then the soft ones with their grace
/// periods, each with its minimum reclaim. As upstream, `0%` and `100%` mean "no threshold";
/// signals unknown here were refused by the configuration already.
pub fn thresholds(
    hard: &BTreeMap<String, Threshold>,
    settings: &EvictionSettings,
) -> Vec<ThresholdSpec> {
    let mut out = Vec::new();
    let ignored = |t: &Threshold| matches!(t, Threshold::Percent(p) if *p <= 0.0 || *p >= 100.0);
    for (name, value) in hard {
        if let Some(signal) = Signal::parse(name)
            && !ignored(value)
        {
            out.push(ThresholdSpec {
                signal,
                value: *value,
                grace_period: Duration::ZERO,
                min_reclaim: settings.minimum_reclaim.get(name).copied(),
            });
        }
    }
    for (name, value) in &settings.soft {
        if let Some(signal) = Signal::parse(name)
            && !ignored(value)
        {
            out.push(ThresholdSpec {
                signal,
                value: *value,
                grace_period: settings
                    .soft_grace_period
                    .get(name)
                    .copied()
                    .unwrap_or_default(),
                min_reclaim: settings.minimum_reclaim.get(name).copied(),
            });
        }
    }
    out
}

/// A binary quantity as Kubernetes writes it canonically: the largest of Ki, Mi, Gi, … that
/// divides it exactly, else plain digits (`104857600` → `100Mi`, `1000` → `1000`).
pub fn format_binary(amount: i64) -> String {
    format_with(amount, 1024, &["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}

/// A decimal quantity written canonically (`5000` → `5k`).
pub fn format_decimal(amount: i64) -> String {
    format_with(amount, 1000, &["k", "M", "G", "T", "P", "E"])
}

fn format_with(amount: i64, base: i64, suffixes: &[&str]) -> String {
    if amount == 0 {
        return "0".into();
    }
    let mut value = amount;
    let mut used = None;
    for suffix in suffixes {
        if value % base != 0 {
            break;
        }
        value /= base;
        used = Some(*suffix);
    }
    match used {
        Some(s) => format!("{value}{s}"),
        None => amount.to_string(),
    }
}
