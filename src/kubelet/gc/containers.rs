//! Which dead containers and sandboxes the container GC removes (pure; upstream's
//! `kuberuntime_gc.go` rules).
//!
//! The executor already removes the instances it replaces as it syncs a pod; this is the
//! catch-all that runs every minute over the whole runtime: pods whose worker is busy
//! elsewhere, instances left by an earlier run, sandboxes of pods that are gone.

use std::collections::{BTreeMap, HashSet};

/// What the pod workers say about a pod UID, read after the runtime was listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodActivity {
    /// A worker syncs the pod: keep its newest dead instances and newest sandbox.
    Active,
    /// The pod has finished (upstream: its worker is "terminated", the pod not yet deleted):
    /// nothing of it runs, and its exited containers, their logs and its newest sandbox are
    /// kept as for an active pod, so `kubectl logs` answers, until the pod is deleted; under
    /// disk pressure ([`ContainerGcPolicy::evict_finished_pods`]) all of it may go.
    Finished,
    /// A worker is tearing the pod down: the GC keeps its hands off.
    Terminating,
    /// No worker has the pod: everything dead of it may go.
    Gone,
}

/// One runtime container, reduced to what the decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct GcContainer {
    pub id: String,
    pub sandbox_id: String,
    pub pod_uid: String,
    pub name: String,
    /// Exited: the only state the GC removes (a created one may be about to start).
    pub dead: bool,
    pub created_at: i64,
}

/// One runtime sandbox, reduced to what the decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct GcSandbox {
    pub id: String,
    pub pod_uid: String,
    pub ready: bool,
    pub created_at: i64,
}

/// Upstream's `GCPolicy` (its minimum age is 0 there, so it is left out), and whether the
/// pass reclaims space for the eviction manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// `maxPerPodContainer`: dead instances kept per (pod, container name); below 0 = all.
    pub max_per_pod_container: i32,
    /// `maxContainers`: dead instances kept on the node; below 0 = no limit.
    pub max_containers: i32,
    /// Everything dead of a finished pod goes too, as with a deleted one: upstream's
    /// `evictNonDeletedPods`, set when the eviction manager reclaims space under disk
    /// pressure (`DeleteAllUnusedContainers`), never by the periodic pass.
    pub evict_finished_pods: bool,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        ContainerGcPolicy {
            max_per_pod_container: 1,
            max_containers: -1,
            evict_finished_pods: false,
        }
    }
}

impl ContainerGcPolicy {
    /// The policy of a reclaim under disk pressure: the defaults, and finished pods' dead
    /// containers and sandboxes go as well.
    pub fn reclaiming() -> Self {
        ContainerGcPolicy {
            evict_finished_pods: true,
            ..Self::default()
        }
    }

    /// What the pass does with a pod's dead objects: keep them alone (`None`: being torn
    /// down), or keep the newest per container and the newest sandbox (`Some(true)`), or
    /// let every one go (`Some(false)`).
    fn keeps_newest(&self, activity: PodActivity) -> Option<bool> {
        match activity {
            PodActivity::Terminating => None,
            PodActivity::Gone => Some(false),
            PodActivity::Finished if self.evict_finished_pods => Some(false),
            PodActivity::Finished | PodActivity::Active => Some(true),
        }
    }
}

/// What one GC pass removes, containers first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerGcPlan {
    pub containers: Vec<String>,
    pub sandboxes: Vec<String>,
}

/// Decides a pass. `activity` is asked once per pod UID.
pub fn plan_container_gc(
    containers: &[GcContainer],
    sandboxes: &[GcSandbox],
    policy: ContainerGcPolicy,
    activity: impl Fn(&str) -> PodActivity,
) -> ContainerGcPlan {
    let mut activities = BTreeMap::new();
    let mut activity_of = |uid: &str| {
        *activities
            .entry(uid.to_string())
            .or_insert_with(|| activity(uid))
    };

    // Dead instances by (pod, container name), newest first.
    let mut units: BTreeMap<(&str, &str), Vec<&GcContainer>> = BTreeMap::new();
    for c in containers.iter().filter(|c| c.dead) {
        units.entry((&c.pod_uid, &c.name)).or_default().push(c);
    }
    for unit in units.values_mut() {
        unit.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    }
    let mut remove: Vec<&GcContainer> = Vec::new();
    let mut kept: BTreeMap<(&str, &str), Vec<&GcContainer>> = BTreeMap::new();
    for (key, unit) in units {
        match policy.keeps_newest(activity_of(key.0)) {
            None => {}
            Some(false) => remove.extend(unit),
            Some(true) => {
                let keep = if policy.max_per_pod_container < 0 {
                    unit.len()
                } else {
                    (policy.max_per_pod_container as usize).min(unit.len())
                };
                let (stay, go) = unit.split_at(keep);
                remove.extend(go);
                kept.insert(key, stay.to_vec());
            }
        }
    }
    // The node-wide limit, as upstream: first even out per unit, then the oldest go.
    if policy.max_containers >= 0 {
        let limit = policy.max_containers as usize;
        let total: usize = kept.values().map(Vec::len).sum();
        if total > limit && !kept.is_empty() {
            let per_unit = (limit / kept.len()).max(1);
            for unit in kept.values_mut() {
                if unit.len() > per_unit {
                    remove.extend(unit.drain(per_unit..));
                }
            }
            let mut rest: Vec<&GcContainer> = kept.values().flatten().copied().collect();
            if rest.len() > limit {
                rest.sort_by_key(|c| c.created_at);
                let excess = rest.len() - limit;
                remove.extend(rest.into_iter().take(excess));
            }
        }
    }
    let removed: HashSet<&str> = remove.iter().map(|c| c.id.as_str()).collect();

    // Sandboxes: one is active while ready or while a container that stays refers to it.
    let in_use: HashSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(c.id.as_str()))
        .map(|c| c.sandbox_id.as_str())
        .collect();
    let mut by_pod: BTreeMap<&str, Vec<&GcSandbox>> = BTreeMap::new();
    for s in sandboxes {
        by_pod.entry(&s.pod_uid).or_default().push(s);
    }
    let mut plan = ContainerGcPlan {
        containers: remove.iter().map(|c| c.id.clone()).collect(),
        sandboxes: Vec::new(),
    };
    for (uid, mut list) in by_pod {
        list.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        // A pod that still exists keeps its newest sandbox, whatever its state.
        let skip = match policy.keeps_newest(activity_of(uid)) {
            None => continue,
            Some(false) => 0,
            Some(true) => 1,
        };
        for s in list.into_iter().skip(skip) {
            if !s.ready && !in_use.contains(s.id.as_str()) {
                plan.sandboxes.push(s.id.clone());
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(id: &str, uid: &str, name: &str, at: i64) -> GcContainer {
        GcContainer {
            id: id.into(),
            sandbox_id: format!("sb-{uid}"),
            pod_uid: uid.into(),
            name: name.into(),
            dead: true,
            created_at: at,
        }
    }

    fn running(id: &str, uid: &str, name: &str, at: i64) -> GcContainer {
        GcContainer {
            dead: false,
            ..dead(id, uid, name, at)
        }
    }

    fn sandbox(id: &str, uid: &str, ready: bool, at: i64) -> GcSandbox {
        GcSandbox {
            id: id.into(),
            pod_uid: uid.into(),
            ready,
            created_at: at,
        }
    }

    fn activity(uid: &str) -> PodActivity {
        match uid {
            "gone" => PodActivity::Gone,
            "ending" => PodActivity::Terminating,
            "done" => PodActivity::Finished,
            _ => PodActivity::Active,
        }
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn containers_to_remove() {
        let policy = ContainerGcPolicy::default();
        type Case<'a> = (&'a str, Vec<GcContainer>, ContainerGcPolicy, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "a crash loop keeps the running one and the newest dead one",
                vec![
                    running("r", "p", "app", 10),
                    dead("d3", "p", "app", 9),
                    dead("d2", "p", "app", 8),
                    dead("d1", "p", "app", 7),
                ],
                policy,
                vec!["d1", "d2"],
            ),
            (
                "each container name counts apart",
                vec![
                    dead("a2", "p", "a", 2),
                    dead("a1", "p", "a", 1),
                    dead("b1", "p", "b", 1),
                ],
                policy,
                vec!["a1"],
            ),
            (
                "a pod that is gone loses every dead one, never a running one",
                vec![running("r", "gone", "app", 2), dead("d", "gone", "app", 1)],
                policy,
                vec!["d"],
            ),
            (
                "a pod being torn down is left alone",
                vec![
                    dead("d2", "ending", "app", 2),
                    dead("d1", "ending", "app", 1),
                ],
                policy,
                vec![],
            ),
            (
                "a finished pod keeps the newest dead instance of each container (its logs)",
                vec![
                    dead("d2", "done", "app", 2),
                    dead("d1", "done", "app", 1),
                    dead("i1", "done", "init", 1),
                ],
                policy,
                vec!["d1"],
            ),
            (
                "reclaiming under disk pressure, a finished pod loses every dead one",
                vec![
                    dead("d2", "done", "app", 2),
                    dead("d1", "done", "app", 1),
                    dead("i1", "done", "init", 1),
                ],
                ContainerGcPolicy::reclaiming(),
                vec!["d2", "d1", "i1"],
            ),
            (
                "reclaiming, a live pod still keeps its newest dead one",
                vec![
                    running("r", "p", "app", 3),
                    dead("d2", "p", "app", 2),
                    dead("d1", "p", "app", 1),
                ],
                ContainerGcPolicy::reclaiming(),
                vec!["d1"],
            ),
            (
                "a negative per-container limit keeps all",
                vec![dead("d2", "p", "app", 2), dead("d1", "p", "app", 1)],
                ContainerGcPolicy {
                    max_per_pod_container: -1,
                    ..policy
                },
                vec![],
            ),
            (
                "the node-wide limit removes the oldest",
                vec![
                    dead("x2", "p", "x", 5),
                    dead("x1", "p", "x", 1),
                    dead("y1", "q", "y", 3),
                    dead("z1", "r", "z", 4),
                ],
                ContainerGcPolicy {
                    max_per_pod_container: 2,
                    max_containers: 2,
                    ..policy
                },
                vec!["x1", "y1"],
            ),
        ];
        for (name, containers, policy, want) in cases {
            let plan = plan_container_gc(&containers, &[], policy, activity);
            let want: Vec<String> = want.into_iter().map(String::from).collect();
            assert_eq!(sorted(plan.containers), sorted(want), "{name}");
        }
    }

    #[test]
    fn sandboxes_to_remove() {
        let policy = ContainerGcPolicy::default();
        type Case<'a> = (&'a str, Vec<GcSandbox>, Vec<GcContainer>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "an old dead sandbox of a live pod goes, the newest stays",
                vec![sandbox("new", "p", true, 2), sandbox("old", "p", false, 1)],
                vec![],
                vec!["old"],
            ),
            (
                "the newest sandbox stays even when not ready",
                vec![sandbox("new", "p", false, 2), sandbox("old", "p", false, 1)],
                vec![],
                vec!["old"],
            ),
            (
                "a sandbox a kept container refers to stays",
                vec![sandbox("new", "p", true, 2), sandbox("sb-p", "p", false, 1)],
                vec![dead("d", "p", "app", 1)],
                vec![],
            ),
            (
                "a sandbox whose containers are all removed goes with them",
                vec![sandbox("sb-gone", "gone", false, 1)],
                vec![dead("d", "gone", "app", 1)],
                vec!["sb-gone"],
            ),
            (
                "a finished pod keeps its newest sandbox, not ready, with its containers",
                vec![
                    sandbox("sb-done", "done", false, 2),
                    sandbox("older", "done", false, 1),
                ],
                vec![dead("d", "done", "app", 2)],
                vec!["older"],
            ),
            (
                "a ready sandbox of a gone pod stays (its teardown stops it)",
                vec![sandbox("s", "gone", true, 1)],
                vec![],
                vec![],
            ),
            (
                "a pod being torn down keeps its sandboxes",
                vec![
                    sandbox("a", "ending", false, 2),
                    sandbox("b", "ending", false, 1),
                ],
                vec![],
                vec![],
            ),
        ];
        for (name, sandboxes, containers, want) in cases {
            let plan = plan_container_gc(&containers, &sandboxes, policy, activity);
            let want: Vec<String> = want.into_iter().map(String::from).collect();
            assert_eq!(sorted(plan.sandboxes), sorted(want), "{name}");
        }
    }

    #[test]
    fn reclaiming_removes_a_finished_pods_sandboxes_with_its_containers() {
        let sandboxes = vec![
            sandbox("sb-done", "done", false, 2),
            sandbox("sb-p", "p", false, 1),
        ];
        let containers = vec![dead("d", "done", "app", 2), dead("e", "p", "app", 1)];
        let plan = plan_container_gc(
            &containers,
            &sandboxes,
            ContainerGcPolicy::reclaiming(),
            activity,
        );
        assert_eq!(plan.containers, ["d"]);
        assert_eq!(plan.sandboxes, ["sb-done"], "a live pod keeps its newest");
        let plan = plan_container_gc(
            &containers,
            &sandboxes,
            ContainerGcPolicy::default(),
            activity,
        );
        assert_eq!(
            plan,
            ContainerGcPlan::default(),
            "the periodic pass keeps both"
        );
    }
}
