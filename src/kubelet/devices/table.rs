//! The device manager's bookkeeping as pure decisions: the devices each registered resource
//! has (from the plugin's `ListAndWatch`), which devices each container holds, what the node
//! reports as capacity and allocatable, whether a pod's device requests fit, and which devices
//! a container gets. No I/O: the gRPC side (`plugin.rs`) and the checkpoint file
//! (`checkpoint.rs`) feed it and read it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ResourceHealth, ResourceStatus};
use tokio::time::Instant;

/// How long a resource whose plugin went away stays in the Node's capacity (with allocatable
/// 0) before it is removed: upstream's `endpointStopGracePeriod`.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// The NUMA node key of a device without topology (upstream's `nodeWithoutTopology`).
pub(crate) const NO_TOPOLOGY: i64 = -1;

/// One device as its plugin reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Device {
    pub id: String,
    pub healthy: bool,
    /// The NUMA nodes the device is attached to (empty: no topology).
    pub numa: Vec<i64>,
}

/// A registered resource: its devices, and whether its plugin is connected.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resource {
    pub devices: BTreeMap<String, Device>,
    /// When the plugin went away (`None` while it is connected).
    pub stopped_at: Option<Instant>,
}

impl Resource {
    fn healthy(&self) -> impl Iterator<Item = &str> {
        self.devices
            .values()
            .filter(|d| d.healthy)
            .map(|d| d.id.as_str())
    }
}

/// The devices one container holds of one resource, and the plugin's answer to `Allocate`
/// for them (encoded `ContainerAllocateResponse`), as the checkpoint keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    /// NUMA node (or [`NO_TOPOLOGY`]) → device IDs.
    pub devices: BTreeMap<i64, Vec<String>>,
    pub response: Vec<u8>,
}

impl Allocation {
    pub(crate) fn ids(&self) -> impl Iterator<Item = &str> {
        self.devices.values().flatten().map(String::as_str)
    }
}

/// Upstream's refusal when a pod asks for more devices than are free.
pub(crate) const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// Everything the manager knows, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub resources: BTreeMap<String, Resource>,
    pub allocations: Vec<Allocation>,
    /// Resources removed after their grace: reported once more with 0, so that the Node's
    /// capacity drops them (upstream sets them to zero the same way).
    pub removed: BTreeSet<String>,
    /// Pods that were active once since this process started: an allocation is dropped only
    /// when its pod was seen active and no longer is, or came from the checkpoint.
    pub seen_active: HashSet<String>,
    /// Pods whose allocations came from the checkpoint.
    pub restored: HashSet<String>,
}

impl Table {
    /// A plugin's `ListAndWatch` answer replaces the resource's devices; the resource counts as
    /// connected again.
    pub(crate) fn update_devices(&mut self, resource: &str, devices: Vec<Device>) {
        let entry = self.resources.entry(resource.to_string()).or_default();
        entry.devices = devices.into_iter().map(|d| (d.id.clone(), d)).collect();
        entry.stopped_at = None;
        self.removed.remove(resource);
    }

    /// A plugin registered: its resource is known (with no devices until `ListAndWatch`
    /// answers) and connected.
    pub(crate) fn connected(&mut self, resource: &str) {
        self.resources
            .entry(resource.to_string())
            .or_default()
            .stopped_at = None;
        self.removed.remove(resource);
    }

    /// The plugin went away: every device turns unhealthy (allocatable 0, capacity kept) and
    /// the grace begins, as upstream's `markResourceUnhealthy`. Returns the devices that were
    /// healthy until now.
    pub(crate) fn disconnected(&mut self, resource: &str, now: Instant) -> BTreeSet<String> {
        let mut turned = BTreeSet::new();
        if let Some(entry) = self.resources.get_mut(resource) {
            for device in entry.devices.values_mut() {
                if device.healthy {
                    turned.insert(device.id.clone());
                }
                device.healthy = false;
            }
            entry.stopped_at = Some(now);
        }
        turned
    }

    /// What the resource adds to the Node's capacity and allocatable as it stands (`None`:
    /// not known), to tell whether a change is worth an early status report.
    pub(crate) fn counts(&self, resource: &str) -> Option<(usize, usize)> {
        let r = self.resources.get(resource)?;
        Some((r.devices.len(), r.healthy().count()))
    }

    /// Capacity and allocatable of every device resource, as upstream's `GetCapacity`:
    /// capacity counts every device, allocatable the healthy ones; a resource whose plugin
    /// has been gone longer than [`STOP_GRACE`] is removed and reported as 0 from then on.
    pub(crate) fn capacity(
        &mut self,
        now: Instant,
    ) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
        let expired: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, r)| {
                r.stopped_at
                    .is_some_and(|at| now.duration_since(at) >= STOP_GRACE)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            self.resources.remove(&name);
            self.removed.insert(name);
        }
        let mut capacity = BTreeMap::new();
        let mut allocatable = BTreeMap::new();
        for name in &self.removed {
            capacity.insert(name.clone(), 0);
            allocatable.insert(name.clone(), 0);
        }
        for (name, resource) in &self.resources {
            capacity.insert(name.clone(), count(resource.devices.len()));
            allocatable.insert(name.clone(), count(resource.healthy().count()));
        }
        (capacity, allocatable)
    }

    /// Whether the pod's device requests fit, as upstream's device manager admits (it runs
    /// before the resource fit): `wanted` is the pod's effective request per resource (init
    /// containers counted as upstream), `used` what the pods admitted before it request. Only
    /// resources a plugin registered are checked; others are left to the resource fit. What
    /// the pod already holds (a running pod admitted again after a restart, before its plugin
    /// has registered again) is not asked for again, as upstream's `devicesToAllocate`.
    pub(crate) fn admit(
        &self,
        pod_uid: &str,
        wanted: &BTreeMap<String, i64>,
        used: &dyn Fn(&str) -> i64,
    ) -> Result<(), DevicesUnavailable> {
        for (name, want) in wanted {
            let Some(resource) = self.resources.get(name) else {
                continue;
            };
            let held = self
                .allocations
                .iter()
                .filter(|a| a.pod_uid == pod_uid && a.resource == *name)
                .flat_map(Allocation::ids)
                .collect::<BTreeSet<_>>()
                .len();
            let want = &want.saturating_sub(count(held));
            if *want <= 0 {
                continue;
            }
            let healthy = count(resource.healthy().count());
            let available = healthy.saturating_sub(used(name)).max(0);
            if *want > available {
                return Err(DevicesUnavailable {
                    resource: name.clone(),
                    requested: *want,
                    available,
                });
            }
        }
        Ok(())
    }

    /// Whether `resource` is one a plugin registered (or the checkpoint names).
    pub(crate) fn is_device_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
            || self.allocations.iter().any(|a| a.resource == resource)
    }

    /// The allocation a container already holds of a resource.
    pub(crate) fn held(
        &self,
        pod_uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<&Allocation> {
        self.allocations
            .iter()
            .find(|a| a.pod_uid == pod_uid && a.container == container && a.resource == resource)
    }

    /// Drops the allocations of pods no longer active (upstream's `UpdateAllocatedDevices`),
    /// given the active pods once the pod sources are ready. A pod allocated by this process
    /// but not yet seen active keeps its devices. True when something was dropped.
    pub(crate) fn retain_active(&mut self, active: &HashSet<String>) -> bool {
        self.seen_active.extend(active.iter().cloned());
        let before = self.allocations.len();
        let (seen, restored) = (&self.seen_active, &self.restored);
        self.allocations.retain(|a| {
            active.contains(&a.pod_uid)
                || !(seen.contains(&a.pod_uid) || restored.contains(&a.pod_uid))
        });
        self.allocations.len() != before
    }

    /// The devices free for a new allocation to `container` of pod `pod_uid`: healthy, held by
    /// no other pod and by none of this pod's containers that keep theirs (`keeps`: app
    /// containers and sidecars). Devices this pod's init containers held come first: upstream
    /// reuses them for the containers after.
    pub(crate) fn free_for(
        &self,
        resource: &str,
        pod_uid: &str,
        keeps: &dyn Fn(&str) -> bool,
    ) -> (Vec<String>, Vec<String>) {
        let Some(entry) = self.resources.get(resource) else {
            return (Vec::new(), Vec::new());
        };
        let mut taken = BTreeSet::new();
        let mut reusable = BTreeSet::new();
        for a in self.allocations.iter().filter(|a| a.resource == resource) {
            let ids = a.ids().map(str::to_string);
            if a.pod_uid == pod_uid && !keeps(&a.container) {
                reusable.extend(ids);
            } else {
                taken.extend(ids);
            }
        }
        let healthy: Vec<&str> = entry.healthy().collect();
        let reuse = healthy
            .iter()
            .filter(|id| reusable.contains(**id) && !taken.contains(**id))
            .map(|id| id.to_string())
            .collect();
        let free = healthy
            .iter()
            .filter(|id| !reusable.contains(**id) && !taken.contains(**id))
            .map(|id| id.to_string())
            .collect();
        (reuse, free)
    }

    /// The NUMA grouping of chosen devices, as the checkpoint keeps it.
    pub(crate) fn by_numa(&self, resource: &str, ids: &[String]) -> BTreeMap<i64, Vec<String>> {
        let mut out: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for id in ids {
            let numa = self
                .resources
                .get(resource)
                .and_then(|r| r.devices.get(id))
                .map(|d| d.numa.clone())
                .unwrap_or_default();
            if numa.is_empty() {
                out.entry(NO_TOPOLOGY).or_default().push(id.clone());
            }
            for node in numa {
                out.entry(node).or_default().push(id.clone());
            }
        }
        out
    }

    /// The container's `allocatedResourcesStatus` (upstream's `UpdateAllocatedResourcesStatus`):
    /// one entry per resource it holds devices of, each device `Healthy` unless its plugin
    /// reports it unhealthy or went away (a device the plugin no longer lists reads `Healthy`,
    /// as upstream's), in ID order.
    pub(crate) fn resources_status(&self, pod_uid: &str, container: &str) -> Vec<ResourceStatus> {
        let mut out: Vec<ResourceStatus> = Vec::new();
        for a in self
            .allocations
            .iter()
            .filter(|a| a.pod_uid == pod_uid && a.container == container)
        {
            let known = self.resources.get(&a.resource);
            let ids: BTreeSet<&str> = a.ids().collect();
            let resources = ids
                .into_iter()
                .map(|id| {
                    let healthy = known
                        .and_then(|r| r.devices.get(id))
                        .is_none_or(|d| d.healthy);
                    ResourceHealth {
                        health: Some(if healthy { "Healthy" } else { "Unhealthy" }.to_string()),
                        message: None,
                        resource_id: id.to_string(),
                    }
                })
                .collect();
            out.push(ResourceStatus {
                name: a.resource.clone(),
                resources: Some(resources),
            });
        }
        out
    }

    /// The resource's devices whose health reads differently in `after` than now (a device
    /// that appears or leaves counts: it reads `Healthy` when not listed).
    pub(crate) fn health_changes(&self, resource: &str, after: &[Device]) -> BTreeSet<String> {
        let reads = |d: Option<&Device>| d.is_none_or(|d| d.healthy);
        let before = self.resources.get(resource).map(|r| &r.devices);
        let ids = before
            .into_iter()
            .flat_map(|d| d.keys().cloned())
            .chain(after.iter().map(|d| d.id.clone()));
        ids.filter(|id| {
            let was = reads(before.and_then(|d| d.get(id)));
            was != reads(after.iter().find(|d| &d.id == id))
        })
        .collect()
    }

    /// The pods holding one of the resource's `devices`.
    pub(crate) fn pods_holding(
        &self,
        resource: &str,
        devices: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        self.allocations
            .iter()
            .filter(|a| a.resource == resource && a.ids().any(|id| devices.contains(id)))
            .map(|a| a.pod_uid.clone())
            .collect()
    }

    /// Records a container's devices (replacing what it held of the resource).
    pub(crate) fn record(&mut self, allocation: Allocation) {
        self.allocations.retain(|a| {
            !(a.pod_uid == allocation.pod_uid
                && a.container == allocation.container
                && a.resource == allocation.resource)
        });
        self.allocations.push(allocation);
    }
}

/// Chooses `needed` devices: the plugin's preferred ones when it gave a valid answer, else the
/// reusable ones first, then free ones in ID order. `None` when there are not enough.
pub(crate) fn choose(
    needed: usize,
    reuse: &[String],
    free: &[String],
    preferred: Option<&[String]>,
) -> Option<Vec<String>> {
    if let Some(preferred) = preferred {
        let valid = preferred.len() == needed
            && preferred
                .iter()
                .all(|id| reuse.contains(id) || free.contains(id))
            && preferred.iter().collect::<BTreeSet<_>>().len() == needed;
        if valid {
            return Some(preferred.to_vec());
        }
    }
    let chosen: Vec<String> = reuse.iter().chain(free).take(needed).cloned().collect();
    (chosen.len() == needed).then_some(chosen)
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A pod asks for more devices of a resource than are free (upstream's admission message).
#[derive(Debug, thiserror::Error)]
#[error(
    "Allocate failed due to requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}, which is unexpected"
)]
pub(crate) struct DevicesUnavailable {
    pub resource: String,
    pub requested: i64,
    pub available: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, healthy: bool) -> Device {
        Device {
            id: id.into(),
            healthy,
            numa: Vec::new(),
        }
    }

    fn alloc(pod: &str, container: &str, ids: &[&str]) -> Allocation {
        Allocation {
            pod_uid: pod.into(),
            container: container.into(),
            resource: "example.com/resource".into(),
            devices: BTreeMap::from([(NO_TOPOLOGY, ids.iter().map(|s| s.to_string()).collect())]),
            response: Vec::new(),
        }
    }

    const R: &str = "example.com/resource";

    fn table(devices: &[(&str, bool)]) -> Table {
        let mut t = Table::default();
        t.update_devices(R, devices.iter().map(|(id, h)| dev(id, *h)).collect());
        t
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_counts_all_devices_allocatable_the_healthy_and_a_gone_plugin_keeps_capacity_through_the_grace()
     {
        let mut t = table(&[("a", true), ("b", false), ("c", true)]);
        let now = Instant::now();
        let (cap, alloc) = t.capacity(now);
        assert_eq!((cap[R], alloc[R]), (3, 2));
        assert_eq!(t.counts(R), Some((3, 2)));
        assert_eq!(t.counts("example.com/other"), None);
        t.disconnected(R, now);
        assert_eq!(
            t.counts(R),
            Some((3, 0)),
            "what an early report is told about"
        );
        let (cap, alloc) = t.capacity(now + Duration::from_secs(60));
        assert_eq!((cap[R], alloc[R]), (3, 0), "within the grace");
        let (cap, alloc) = t.capacity(now + STOP_GRACE);
        assert_eq!(
            (cap[R], alloc[R]),
            (0, 0),
            "removed after the grace, reported as 0"
        );
        assert!(!t.resources.contains_key(R));
        t.update_devices(R, vec![dev("a", true)]);
        let (cap, alloc) = t.capacity(now + STOP_GRACE);
        assert_eq!((cap[R], alloc[R]), (1, 1), "back after a new registration");
    }

    #[test]
    fn admission_table() {
        let t = table(&[("a", true), ("b", true), ("c", false)]);
        let want = |n: i64| BTreeMap::from([(R.to_string(), n)]);
        let cases: &[(i64, i64, Option<&str>)] = &[
            (1, 0, None),
            (2, 0, None),
            (2, 1, Some("Requested: 2, Available: 1")),
            (3, 0, Some("Requested: 3, Available: 2")),
            (1, 5, Some("Requested: 1, Available: 0")),
            (0, 5, None),
        ];
        for (wanted, used, refused) in cases {
            let got = t.admit("new", &want(*wanted), &|_| *used);
            match refused {
                None => assert!(got.is_ok(), "{wanted} with {used} used: {got:?}"),
                Some(part) => {
                    let msg = got.expect_err("refused").to_string();
                    assert!(msg.contains(part), "{msg}");
                    assert!(msg.starts_with("Allocate failed due to requested number of devices unavailable for example.com/resource."), "{msg}");
                    assert!(msg.ends_with(", which is unexpected"), "{msg}");
                }
            }
        }
        // A resource no plugin registered is not the device manager's to check.
        let other = BTreeMap::from([("other.com/x".to_string(), 9)]);
        assert!(t.admit("new", &other, &|_| 0).is_ok());
        // A pod that already holds its devices (admitted again after a restart, its plugin
        // not back yet) is not refused.
        let mut restarted = Table::default();
        restarted.connected(R);
        restarted.record(alloc("running", "c", &["a"]));
        assert!(restarted.admit("running", &want(1), &|_| 0).is_ok());
        assert!(restarted.admit("new", &want(1), &|_| 0).is_err());
    }

    #[test]
    fn free_devices_skip_other_pods_and_app_containers_and_reuse_init_containers() {
        let mut t = table(&[("a", true), ("b", true), ("c", true), ("d", false)]);
        t.record(alloc("p1", "main", &["a"]));
        t.record(alloc("p2", "init", &["b"]));
        t.record(alloc("p2", "app", &["c"]));
        let keeps = |c: &str| c != "init";
        let (reuse, free) = t.free_for(R, "p2", &keeps);
        assert_eq!(reuse, vec!["b".to_string()]);
        assert!(
            free.is_empty(),
            "a is p1's, c is p2's app's, d unhealthy: {free:?}"
        );
        let (reuse, free) = t.free_for(R, "p3", &keeps);
        assert!(reuse.is_empty());
        assert!(free.is_empty());
    }

    #[test]
    fn choosing_prefers_a_valid_preferred_answer_then_reuse_then_id_order() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (needed, reusable, free, preferred answer, chosen)
        type Case<'a> = (
            usize,
            &'a [&'a str],
            &'a [&'a str],
            Option<&'a [&'a str]>,
            Option<&'a [&'a str]>,
        );
        let cases: &[Case<'_>] = &[
            (1, &[], &["a", "b"], None, Some(&["a"])),
            (2, &["z"], &["a", "b"], None, Some(&["z", "a"])),
            (1, &[], &["a", "b"], Some(&["b"]), Some(&["b"])),
            (1, &[], &["a", "b"], Some(&["x"]), Some(&["a"])),
            (2, &[], &["a", "b"], Some(&["a", "a"]), Some(&["a", "b"])),
            (3, &[], &["a", "b"], None, None),
        ];
        for (needed, reuse, free, preferred, want) in cases {
            let preferred = preferred.map(s);
            let got = choose(*needed, &s(reuse), &s(free), preferred.as_deref());
            assert_eq!(
                got,
                want.map(s),
                "{needed} {reuse:?} {free:?} {preferred:?}"
            );
        }
    }

    #[test]
    fn inactive_pods_lose_their_devices_only_once_seen_or_restored() {
        let mut t = table(&[("a", true), ("b", true), ("c", true)]);
        t.record(alloc("seen", "c", &["a"]));
        t.record(alloc("new", "c", &["b"]));
        t.record(alloc("restored", "c", &["c"]));
        t.restored.insert("restored".into());
        t.retain_active(&HashSet::from(["seen".to_string()]));
        assert_eq!(t.allocations.len(), 2, "the restored pod is gone");
        t.retain_active(&HashSet::new());
        let left: Vec<_> = t.allocations.iter().map(|a| a.pod_uid.as_str()).collect();
        assert_eq!(
            left,
            vec!["new"],
            "a pod never seen active keeps its devices"
        );
    }

    #[test]
    fn a_reregistration_keeps_allocations() {
        let mut t = table(&[("a", true)]);
        t.record(alloc("p", "c", &["a"]));
        t.disconnected(R, Instant::now());
        t.update_devices(R, vec![dev("a", true)]);
        assert!(t.held("p", "c", R).is_some());
        assert_eq!(t.free_for(R, "q", &|_| true).1, Vec::<String>::new());
    }

    #[test]
    fn a_containers_devices_show_their_health_and_a_change_names_their_holders() {
        let mut t = table(&[("a", true), ("b", false), ("c", true)]);
        t.record(alloc("p1", "app", &["b", "a"]));
        t.record(alloc("p2", "app", &["c"]));
        let status = t.resources_status("p1", "app");
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].name, R);
        let read: Vec<(String, String)> = status[0]
            .resources
            .iter()
            .flatten()
            .map(|r| (r.resource_id.clone(), r.health.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            read,
            vec![
                ("a".into(), "Healthy".into()),
                ("b".into(), "Unhealthy".into())
            ]
        );
        assert!(t.resources_status("p1", "other").is_empty());
        // a turns unhealthy, b healthy, c unchanged; d new and healthy reads as before.
        let after = vec![
            dev("a", false),
            dev("b", true),
            dev("c", true),
            dev("d", true),
        ];
        let changed = t.health_changes(R, &after);
        assert_eq!(changed, BTreeSet::from(["a".to_string(), "b".to_string()]));
        assert_eq!(
            t.pods_holding(R, &changed),
            BTreeSet::from(["p1".to_string()])
        );
        // The plugin goes: every device it listed turns unhealthy.
        t.update_devices(R, after);
        let turned = t.disconnected(R, Instant::now());
        assert_eq!(
            turned,
            BTreeSet::from(["b".to_string(), "c".to_string(), "d".to_string()]),
            "the devices that were healthy (a was not)"
        );
        let unhealthy = t.resources_status("p2", "app");
        assert_eq!(
            unhealthy[0].resources.as_ref().unwrap()[0]
                .health
                .as_deref(),
            Some("Unhealthy")
        );
    }
}
