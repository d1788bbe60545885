//! A pod's cgroup settings, as upstream's `ResourceConfigForPod` computes them: pure, from the
//! pod spec and the node's CFS settings.
//!
//! Requests are summed the way the scheduler sums them (regular containers and sidecars added
//! up, each plain init container counted with the sidecars started before it, the larger of the
//! two kept, pod overhead added), so the pod's cgroup is as large as the pod may ever need.
//! A request left out but with a limit given counts as the limit (API-server defaulting, which
//! pods read from files never went through).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::base::podspec::qos::{QosClass, qos_class};
use crate::base::podspec::quantity;
use crate::base::podspec::resources::{add_amounts, sum_over_containers};
use crate::base::podspec::{init_and_app_containers, pod_level};

/// The kernel's bounds for `cpu.shares`.
pub(crate) const MIN_SHARES: u64 = 2;
pub(crate) const MAX_SHARES: u64 = 262_144;
const SHARES_PER_CPU: i64 = 1024;
/// The default CFS period (100 ms) in microseconds.
pub(crate) const DEFAULT_CPU_PERIOD_US: u64 = 100_000;
/// The kernel's smallest CFS quota (1 ms) in microseconds.
const MIN_QUOTA_US: i64 = 1_000;

/// What one cgroup is given, independent of the cgroup version; `None` leaves the kernel's
/// value (or the one already there) alone. Mirrors upstream's `ResourceConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    pub cpu_shares: Option<u64>,
    /// -1 = no quota.
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    /// Bytes.
    pub memory: Option<i64>,
    /// Over zero: that many tasks; zero or below: no limit (`max`).
    pub pids_limit: Option<i64>,
    /// Huge page size in bytes → limit in bytes.
    pub hugepage_limits: BTreeMap<u64, i64>,
    /// cgroup v2 files written as they are (`memory.min`, `memory.low`, `memory.high`).
    pub unified: BTreeMap<String, String>,
}

/// The node's CFS settings that shape a pod's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfsSettings {
    /// `cpuCFSQuota`: enforce CPU limits with a CFS quota.
    pub enforce_cpu_limits: bool,
    /// `cpuCFSQuotaPeriod` in microseconds.
    pub period_us: u64,
}

impl Default for CfsSettings {
    fn default() -> Self {
        CfsSettings {
            enforce_cpu_limits: true,
            period_us: DEFAULT_CPU_PERIOD_US,
        }
    }
}

/// `cpu.shares` for a CPU amount in millicores (upstream's `MilliCPUToShares`): 1024 per core,
/// within the kernel's bounds, and the minimum for nothing.
pub(crate) fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = milli.saturating_mul(SHARES_PER_CPU) / 1000;
    (shares.max(0) as u64).clamp(MIN_SHARES, MAX_SHARES)
}

/// The CFS quota for a CPU limit in millicores over `period_us` (upstream's
/// `MilliCPUToQuota`): 0 for no limit, at least 1 ms otherwise.
pub(crate) fn milli_cpu_to_quota(milli: i64, period_us: u64) -> i64 {
    if milli == 0 {
        return 0;
    }
    let period = i64::try_from(period_us).unwrap_or(i64::MAX);
    (milli.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// How a resource is counted: CPU in millicores, everything else in whole units (bytes).
fn amount_of(name: &str, q: &quantity::Quantity) -> i128 {
    if name == "cpu" {
        i128::from(q.milli_value())
    } else {
        i128::from(q.value())
    }
}

fn parse_list(list: Option<&BTreeMap<String, ApiQuantity>>) -> BTreeMap<String, i128> {
    list.into_iter()
        .flatten()
        .filter_map(|(name, q)| {
            let q = quantity::parse(&q.0).ok()?;
            Some((name.clone(), amount_of(name, &q)))
        })
        .collect()
}

/// A container's requests after defaulting: a resource with a limit but no request requests
/// its limit.
fn container_requests(c: &Container) -> BTreeMap<String, i128> {
    let res = c.resources.as_ref();
    let mut out = parse_list(res.and_then(|r| r.limits.as_ref()));
    out.extend(parse_list(res.and_then(|r| r.requests.as_ref())));
    out
}

fn container_limits(c: &Container) -> BTreeMap<String, i128> {
    parse_list(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

/// The containers' summed requests, without pod-level requests or overhead (upstream's
/// `AggregateContainerRequests`).
pub(crate) fn container_requests_sum(pod: &Pod) -> BTreeMap<String, i128> {
    sum_over_containers(pod, container_requests)
}

/// The pod-level amounts of `list` (requests or limits) that stand for the containers' sum:
/// cpu, memory and huge pages (upstream's `applyPodLevelResources`).
fn pod_level_list(list: Option<&BTreeMap<String, ApiQuantity>>) -> BTreeMap<String, i128> {
    let mut out = parse_list(list);
    out.retain(|name, _| pod_level::is_supported(name));
    out
}

/// The pod's summed requests (pod overhead included), by resource name; CPU in millicores,
/// the rest in bytes. Pod-level requests replace the containers' sum of what they name
/// (upstream's `PodRequests`).
pub(crate) fn pod_requests(pod: &Pod) -> BTreeMap<String, i128> {
    let mut reqs = sum_over_containers(pod, container_requests);
    if pod_level::requests_set(pod)
        && let Some(r) = pod_level::pod_resources(pod)
    {
        reqs.extend(pod_level_list(r.requests.as_ref()));
    }
    if let Some(overhead) = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()) {
        add_amounts(&mut reqs, &parse_list(Some(overhead)));
    }
    reqs
}

/// The pod's summed limits, pod-level limits replacing the sum of what they name (upstream's
/// `PodLimits`); overhead is added to limits that are set.
pub(crate) fn pod_limits(pod: &Pod) -> BTreeMap<String, i128> {
    let mut limits = sum_over_containers(pod, container_limits);
    if let Some(r) = pod_level::pod_resources(pod) {
        limits.extend(pod_level_list(r.limits.as_ref()));
    }
    if let Some(overhead) = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()) {
        for (k, v) in parse_list(Some(overhead)) {
            if let Some(l) = limits.get_mut(&k).filter(|l| **l != 0) {
                *l += v;
            }
        }
    }
    limits
}

/// `hugepages-2Mi` → 2 MiB.
pub(crate) fn hugepage_size(resource: &str) -> Option<u64> {
    let size = quantity::parse(resource.strip_prefix("hugepages-")?).ok()?;
    u64::try_from(size.value()).ok().filter(|s| *s > 0)
}

/// The huge page amounts of a resource list, by page size in bytes.
pub(crate) fn hugepage_limits(list: &BTreeMap<String, i128>) -> BTreeMap<u64, i64> {
    let mut out: BTreeMap<u64, i64> = BTreeMap::new();
    for (name, amount) in list {
        if let Some(size) = hugepage_size(name) {
            *out.entry(size).or_default() += clamp_i64(*amount);
        }
    }
    out
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Whether `resource` is limited for the whole pod: by a non-zero pod-level limit, or by every
/// container (init ones included) setting a non-zero limit (upstream's `cpuLimitsDeclared`,
/// `memoryLimitsDeclared`).
fn limits_declared(pod: &Pod, resource: &str) -> bool {
    if pod.spec.is_none() {
        return false;
    }
    let pod_level = pod_level::pod_resources(pod)
        .map(|r| pod_level_list(r.limits.as_ref()))
        .and_then(|l| l.get(resource).copied())
        .is_some_and(|v| v != 0);
    pod_level
        || init_and_app_containers(pod)
            .all(|c| container_limits(c).get(resource).is_some_and(|v| *v != 0))
}

/// The pod cgroup's settings (without the pids limit, which is the node's `podPidsLimit`):
/// - Guaranteed: shares from the requests, quota and period, memory limit;
/// - Burstable: shares; quota and period only when every container limits CPU, the memory
///   limit only when every container limits memory;
/// - BestEffort: the minimum shares.
///
/// With `cpuCFSQuota` off the quota is -1 (none). Huge pages are limited to what is requested.
/// Pod-level resources take the place of the containers' sums for what they name, and a
/// pod-level limit limits the pod whatever its containers set.
pub(crate) fn resource_config_for_pod(pod: &Pod, cfs: CfsSettings) -> ResourceConfig {
    let reqs = pod_requests(pod);
    let limits = pod_limits(pod);
    let cpu_request = clamp_i64(reqs.get("cpu").copied().unwrap_or(0));
    let cpu_limit = clamp_i64(limits.get("cpu").copied().unwrap_or(0));
    let memory_limit = clamp_i64(limits.get("memory").copied().unwrap_or(0));

    let shares = milli_cpu_to_shares(cpu_request);
    let quota = if cfs.enforce_cpu_limits {
        milli_cpu_to_quota(cpu_limit, cfs.period_us)
    } else {
        -1
    };
    let mut out = ResourceConfig {
        hugepage_limits: hugepage_limits(&reqs),
        ..Default::default()
    };
    match qos_class(pod) {
        QosClass::Guaranteed => {
            out.cpu_shares = Some(shares);
            out.cpu_quota = Some(quota);
            out.cpu_period = Some(cfs.period_us);
            out.memory = Some(memory_limit);
        }
        QosClass::Burstable => {
            out.cpu_shares = Some(shares);
            if limits_declared(pod, "cpu") {
                out.cpu_quota = Some(quota);
                out.cpu_period = Some(cfs.period_us);
            }
            if limits_declared(pod, "memory") {
                out.memory = Some(memory_limit);
            }
        }
        QosClass::BestEffort => out.cpu_shares = Some(MIN_SHARES),
    }
    out
}

/// Upstream's cgroup v2 `memory.high` for a container or pod with memory QoS and a
/// throttling factor: request + factor × (limit − request), rounded down to whole pages;
/// `None` when it would not lie above the request (or request equals limit).
#[cfg(test)]
pub(crate) fn memory_high(request: i64, limit: i64, factor: f64, page_size: i64) -> Option<i64> {
    if limit == 0 || (request == limit && request != 0) || page_size <= 0 {
        return None;
    }
    let raw = request as f64 + (limit as f64 - request as f64) * factor;
    let high = (raw / page_size as f64).floor() as i64 * page_size;
    (high > 0 && high > request).then_some(high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, ApiQuantity>> {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string())))
                .collect()
        })
    }

    pub(crate) fn c(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(mut c: Container) -> Container {
        c.restart_policy = Some("Always".into());
        c
    }

    pub(crate) fn pod(init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: (!init.is_empty()).then_some(init),
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn pod_config_table() {
        let on = CfsSettings::default();
        let off = CfsSettings {
            enforce_cpu_limits: false,
            period_us: 100_000,
        };
        let short = CfsSettings {
            enforce_cpu_limits: true,
            period_us: 50_000,
        };
        let g = [("cpu", "500m"), ("memory", "64Mi")];
        let rows: Vec<(&str, Pod, CfsSettings, ResourceConfig)> = vec![
            (
                "guaranteed",
                pod(vec![], vec![c("a", &g, &g)]),
                on,
                ResourceConfig {
                    cpu_shares: Some(512),
                    cpu_quota: Some(50_000),
                    cpu_period: Some(100_000),
                    memory: Some(64 * MI),
                    ..Default::default()
                },
            ),
            (
                "guaranteed, two containers, limits only",
                pod(
                    vec![],
                    vec![
                        c("a", &[], &g),
                        c("b", &[], &[("cpu", "1"), ("memory", "1Gi")]),
                    ],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(1536),
                    cpu_quota: Some(150_000),
                    cpu_period: Some(100_000),
                    memory: Some(64 * MI + 1024 * MI),
                    ..Default::default()
                },
            ),
            (
                "guaranteed without cpuCFSQuota: no quota",
                pod(vec![], vec![c("a", &g, &g)]),
                off,
                ResourceConfig {
                    cpu_shares: Some(512),
                    cpu_quota: Some(-1),
                    cpu_period: Some(100_000),
                    memory: Some(64 * MI),
                    ..Default::default()
                },
            ),
            (
                "guaranteed with a 50ms period",
                pod(vec![], vec![c("a", &g, &g)]),
                short,
                ResourceConfig {
                    cpu_shares: Some(512),
                    cpu_quota: Some(25_000),
                    cpu_period: Some(50_000),
                    memory: Some(64 * MI),
                    ..Default::default()
                },
            ),
            (
                "burstable, every container limited",
                pod(
                    vec![],
                    vec![c("a", &[("cpu", "100m"), ("memory", "32Mi")], &g)],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(102),
                    cpu_quota: Some(50_000),
                    cpu_period: Some(100_000),
                    memory: Some(64 * MI),
                    ..Default::default()
                },
            ),
            (
                "burstable, one container without limits: shares only",
                pod(
                    vec![],
                    vec![c("a", &g, &g), c("b", &[("cpu", "250m")], &[])],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(768),
                    ..Default::default()
                },
            ),
            (
                "burstable, cpu limited everywhere but memory not",
                pod(
                    vec![],
                    vec![c("a", &[("memory", "10Mi")], &[("cpu", "200m")])],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(204),
                    cpu_quota: Some(20_000),
                    cpu_period: Some(100_000),
                    ..Default::default()
                },
            ),
            (
                "burstable without cpuCFSQuota",
                pod(vec![], vec![c("a", &[("cpu", "100m")], &[("cpu", "200m")])]),
                off,
                ResourceConfig {
                    cpu_shares: Some(102),
                    cpu_quota: Some(-1),
                    cpu_period: Some(100_000),
                    ..Default::default()
                },
            ),
            (
                "best effort",
                pod(vec![], vec![c("a", &[], &[])]),
                on,
                ResourceConfig {
                    cpu_shares: Some(2),
                    ..Default::default()
                },
            ),
            (
                // The init container asks more than the app: the pod's request is its maximum.
                "init maximum wins over the sum",
                pod(
                    vec![c(
                        "init",
                        &[("cpu", "2"), ("memory", "1Gi")],
                        &[("cpu", "2"), ("memory", "1Gi")],
                    )],
                    vec![c("a", &g, &g)],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(2048),
                    cpu_quota: Some(200_000),
                    cpu_period: Some(100_000),
                    memory: Some(1024 * MI),
                    ..Default::default()
                },
            ),
            (
                // A sidecar adds up with the app; the plain init container after it runs
                // beside it (500m + 1 = 1.5 CPU) and is still below 500m + 500m + ...
                "sidecar adds up, init runs beside earlier sidecars",
                pod(
                    vec![
                        sidecar(c("log", &[("cpu", "500m")], &[])),
                        c("migrate", &[("cpu", "1")], &[]),
                    ],
                    vec![c("a", &[("cpu", "250m")], &[])],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(1536),
                    ..Default::default()
                },
            ),
            (
                "huge pages are limited to the request",
                pod(
                    vec![],
                    vec![c(
                        "a",
                        &[],
                        &[("cpu", "1"), ("memory", "64Mi"), ("hugepages-2Mi", "4Mi")],
                    )],
                ),
                on,
                ResourceConfig {
                    cpu_shares: Some(1024),
                    cpu_quota: Some(100_000),
                    cpu_period: Some(100_000),
                    memory: Some(64 * MI),
                    hugepage_limits: BTreeMap::from([(2 << 20, 4 * MI)]),
                    ..Default::default()
                },
            ),
        ];
        for (what, pod, cfs, want) in rows {
            assert_eq!(resource_config_for_pod(&pod, cfs), want, "{what}");
        }
    }

    /// The pod `containers` with pod-level `requests` and `limits`.
    fn with_pod_level(
        containers: Vec<Container>,
        requests: &[(&str, &str)],
        limits: &[(&str, &str)],
    ) -> Pod {
        let mut p = pod(vec![], containers);
        p.spec.as_mut().expect("spec").resources = Some(ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pod_level_resources_size_the_pod_cgroup() {
        let on = CfsSettings::default();
        let rows: Vec<(&str, Pod, ResourceConfig)> = vec![
            (
                // The e2e specs' guaranteed case: the containers' sum is smaller.
                "guaranteed at pod level, containers below",
                with_pod_level(
                    vec![c(
                        "a",
                        &[("cpu", "20m"), ("memory", "20Mi")],
                        &[("cpu", "20m"), ("memory", "20Mi")],
                    )],
                    &[("cpu", "80m"), ("memory", "95Mi")],
                    &[("cpu", "80m"), ("memory", "95Mi")],
                ),
                ResourceConfig {
                    cpu_shares: Some(81),
                    cpu_quota: Some(8_000),
                    cpu_period: Some(100_000),
                    memory: Some(95 * MI),
                    ..Default::default()
                },
            ),
            (
                "containers without resources, pod-level limits",
                with_pod_level(
                    vec![c("a", &[], &[]), c("b", &[], &[])],
                    &[("cpu", "100m"), ("memory", "64Mi")],
                    &[("cpu", "200m"), ("memory", "128Mi")],
                ),
                ResourceConfig {
                    cpu_shares: Some(102),
                    cpu_quota: Some(20_000),
                    cpu_period: Some(100_000),
                    memory: Some(128 * MI),
                    ..Default::default()
                },
            ),
            (
                // Nothing limits the pod: no quota, no memory limit.
                "pod-level requests only",
                with_pod_level(
                    vec![c("a", &[], &[])],
                    &[("cpu", "4m"), ("memory", "10Mi")],
                    &[],
                ),
                ResourceConfig {
                    cpu_shares: Some(4),
                    ..Default::default()
                },
            ),
            (
                "a pod-level cpu limit over containers without one",
                with_pod_level(
                    vec![c("a", &[("cpu", "50m")], &[("memory", "32Mi")])],
                    &[("cpu", "100m")],
                    &[("cpu", "300m")],
                ),
                ResourceConfig {
                    cpu_shares: Some(102),
                    cpu_quota: Some(30_000),
                    cpu_period: Some(100_000),
                    memory: Some(32 * MI),
                    ..Default::default()
                },
            ),
        ];
        for (what, p, want) in rows {
            assert_eq!(resource_config_for_pod(&p, on), want, "{what}");
        }
    }

    #[test]
    fn overhead_adds_to_requests_and_to_set_limits() {
        let mut p = pod(vec![], vec![c("a", &[("cpu", "100m")], &[("cpu", "200m")])]);
        p.spec.as_mut().unwrap().overhead = list(&[("cpu", "50m"), ("memory", "10Mi")]);
        let reqs = pod_requests(&p);
        assert_eq!(reqs["cpu"], 150);
        assert_eq!(reqs["memory"], i128::from(10 * MI));
        let limits = pod_limits(&p);
        assert_eq!(limits["cpu"], 250);
        assert!(!limits.contains_key("memory"));
    }

    #[test]
    fn shares_and_quota_conversions() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(250), 256);
        assert_eq!(milli_cpu_to_shares(10_000_000), 262_144);
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(1500, 100_000), 150_000);
        assert_eq!(milli_cpu_to_quota(500, 10_000), 5_000);
    }

    #[test]
    fn memory_high_formula() {
        let page = 4096;
        // request 100Mi, limit 200Mi, factor 0.9 → 190Mi (already whole pages).
        assert_eq!(memory_high(100 * MI, 200 * MI, 0.9, page), Some(190 * MI));
        assert_eq!(memory_high(100 * MI, 100 * MI, 0.9, page), None);
        assert_eq!(memory_high(0, 0, 0.9, page), None);
        assert_eq!(memory_high(0, 10_000, 0.9, page), Some(8192));
    }
}
