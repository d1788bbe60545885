//! The pod cgroup's side of an in-place resize, in upstream's order (`doPodResizeAction`): a
//! limit that grows is raised on the pod's cgroup before its containers get theirs, one that
//! shrinks is lowered after, so a container's limit never exceeds its pod's. The executor
//! writes [`grown`] (each limit at the larger of before and after), updates the containers,
//! then writes the pod's new settings.

use k8s_openapi::api::core::v1::Pod;

use super::{CgroupError, CgroupManager, ResourceConfig};
use crate::base::podspec::qos_class;

/// The settings during a resize: each cpu and memory limit at the larger of `before` and
/// `after` (no quota and no memory limit count as the largest); the rest as `after`.
pub(crate) fn grown(before: &ResourceConfig, after: &ResourceConfig) -> ResourceConfig {
    let quota = match (before.cpu_quota, after.cpu_quota) {
        (Some(a), Some(b)) if a >= 0 && b >= 0 => Some(a.max(b)),
        (Some(_), Some(_)) => Some(-1),
        (_, b) => b,
    };
    let memory = match (before.memory, after.memory) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (_, b) => b,
    };
    let shares = match (before.cpu_shares, after.cpu_shares) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (_, b) => b,
    };
    ResourceConfig {
        cpu_shares: shares,
        cpu_quota: quota,
        memory,
        ..after.clone()
    }
}

impl CgroupManager {
    /// Writes `config` into the pod's cgroup, when it has one.
    pub(crate) fn set_pod_resources(
        &self,
        pod: &Pod,
        config: &ResourceConfig,
    ) -> Result<(), CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if crate::base::safe_names::component_problem(uid).is_some() {
            return Ok(());
        }
        let cgroup = self.pod_cgroup(qos_class(pod), uid);
        if !self.exists(&cgroup) {
            return Ok(());
        }
        self.apply(&cgroup, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(shares: u64, quota: i64, memory: Option<i64>) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period: Some(100_000),
            memory,
            ..Default::default()
        }
    }

    #[test]
    fn the_larger_of_each_limit_holds_during_a_resize() {
        let cases = [
            (
                "both grow",
                config(102, 10_000, Some(100)),
                config(204, 20_000, Some(200)),
                config(204, 20_000, Some(200)),
            ),
            (
                "both shrink",
                config(204, 20_000, Some(200)),
                config(102, 10_000, Some(100)),
                config(204, 20_000, Some(200)),
            ),
            (
                "cpu grows, memory shrinks",
                config(102, 10_000, Some(200)),
                config(204, 20_000, Some(100)),
                config(204, 20_000, Some(200)),
            ),
            (
                "no quota before",
                config(102, -1, Some(100)),
                config(204, 20_000, Some(100)),
                config(204, -1, Some(100)),
            ),
            (
                "no memory limit after",
                config(102, 10_000, Some(100)),
                config(102, 10_000, None),
                config(102, 10_000, None),
            ),
        ];
        for (what, before, after, want) in cases {
            assert_eq!(grown(&before, &after), want, "{what}");
        }
    }
}
