//! Pod cgroups that no pod owns any more, removed as upstream's `cleanupOrphanedPodCgroups`
//! does: a `pod<uid>` cgroup whose pod has no worker and nothing in the runtime is left over
//! (the agent stopped between a pod's teardown and its cgroup's removal, or a removal failed),
//! and would otherwise keep its processes, its memory charges and its place in the QoS tiers.
//!
//! Only cgroups of pods this agent ran are taken: those whose directory `<root-dir>/pods/<uid>`
//! is still there (a teardown removes the cgroup before the directory, so one that did not
//! finish leaves both). Upstream sweeps every pod cgroup under its root; Deckhand does not,
//! because several agents with their own root directories may share a cgroup root (the test
//! suite runs many on one host), and one must never kill another's pods.
//!
//! As upstream, a cgroup whose pod still has volumes on disk is left until they are gone, so
//! that memory-backed volumes are not charged to the parent when the cgroup goes.
//!
//! The race with a pod being started is closed by the order of the reads: cgroups are listed
//! first, then each UID is checked against the pods the node knows. A pod whose cgroup was in
//! the list had its worker before the list was read; if neither its worker nor the runtime
//! has it afterwards, its teardown is over.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::CgroupManager;

/// How often the sweep runs. Upstream checks at every housekeeping (2 s); orphans are rare
/// and harmless for a while, so listing the tiers less often is enough.
pub(crate) const SWEEP_PERIOD: Duration = Duration::from_secs(30);

/// What the sweep does with one pod cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orphan {
    /// No pod owns it: kill what is left in it and remove it.
    Remove,
    /// No pod owns it, but its volumes are still on disk: wait.
    WaitForVolumes,
}

/// The orphans among `found` (the UIDs of the pod cgroups), given whether this agent ran a
/// UID (its pod directory is there), whether it knows it now (a worker or runtime objects) and
/// whether the pod's volumes are still on disk.
pub(crate) fn orphans(
    found: &BTreeSet<String>,
    ours: impl Fn(&str) -> bool,
    known: impl Fn(&str) -> bool,
    volumes_left: impl Fn(&str) -> bool,
) -> Vec<(String, Orphan)> {
    found
        .iter()
        .filter(|uid| ours(uid) && !known(uid))
        .map(|uid| {
            let action = if volumes_left(uid) {
                Orphan::WaitForVolumes
            } else {
                Orphan::Remove
            };
            (uid.clone(), action)
        })
        .collect()
}

/// What the sweep asks of the rest of the agent.
pub(crate) struct SweepInputs {
    /// True once the runtime has been listed (before that, a running pod is not known yet).
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
    /// True when this agent ran the pod: its pod directory is there.
    pub ours: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// True when the node knows the pod: it has a worker or objects in the runtime.
    pub known: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// True while the pod's volumes directory still holds something.
    pub volumes_left: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

/// One sweep: lists the pod cgroups, then removes those no pod owns. Blocking (cgroup files).
/// Returns the UIDs whose cgroups were removed.
pub(crate) fn sweep_once(cgroups: &CgroupManager, inputs: &SweepInputs) -> Vec<String> {
    let found = cgroups.pod_cgroup_uids();
    let mut removed = Vec::new();
    for (uid, action) in orphans(&found, &*inputs.ours, &*inputs.known, &*inputs.volumes_left) {
        match action {
            Orphan::WaitForVolumes => {
                tracing::debug!(pod_uid = %uid, "an orphaned pod cgroup waits for its volumes to go");
            }
            Orphan::Remove => {
                tracing::info!(pod_uid = %uid, "removing the cgroup of a pod the node no longer has");
                for problem in cgroups.destroy_pod(&uid) {
                    tracing::warn!(pod_uid = %uid, problem = %problem, "cannot remove an orphaned pod cgroup");
                }
                removed.push(uid);
            }
        }
    }
    removed
}

/// Sweeps every [`SWEEP_PERIOD`] (the first time as soon as the runtime has been listed)
/// until `cancel`.
pub(crate) async fn run(
    cgroups: Arc<CgroupManager>,
    inputs: SweepInputs,
    cancel: CancellationToken,
) {
    let inputs = Arc::new(inputs);
    let mut wait = Duration::from_millis(500);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if !(inputs.ready)() {
            continue;
        }
        wait = SWEEP_PERIOD;
        let (cgroups, inputs) = (cgroups.clone(), inputs.clone());
        let _ = tokio::task::spawn_blocking(move || sweep_once(&cgroups, &inputs)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unknown_pods_of_ours_are_orphans_and_volumes_hold_them_back() {
        let found: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        // (UIDs whose pod directory is ours, known UIDs, UIDs with volumes left, the result)
        type Case<'a> = (
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            Vec<(&'a str, Orphan)>,
        );
        let all: &[&str] = &["a", "b", "c"];
        let cases: [Case; 6] = [
            // Every pod known: nothing to do.
            (all, all, &[], vec![]),
            // None known: all go.
            (
                all,
                &[],
                &[],
                vec![
                    ("a", Orphan::Remove),
                    ("b", Orphan::Remove),
                    ("c", Orphan::Remove),
                ],
            ),
            // A known pod's volumes do not matter; an unknown one's hold its cgroup back.
            (
                all,
                &["a"],
                &["a", "c"],
                vec![("b", Orphan::Remove), ("c", Orphan::WaitForVolumes)],
            ),
            (all, &["b", "c"], &["b"], vec![("a", Orphan::Remove)]),
            // Cgroups of pods this agent never ran (another agent's) are never touched.
            (&[], &[], &[], vec![]),
            (&["b"], &[], &[], vec![("b", Orphan::Remove)]),
        ];
        for (ours, known, volumes, want) in cases {
            let got = orphans(
                &found,
                |u| ours.contains(&u),
                |u| known.contains(&u),
                |u| volumes.contains(&u),
            );
            let want: Vec<(String, Orphan)> =
                want.into_iter().map(|(u, o)| (u.to_string(), o)).collect();
            assert_eq!(
                got, want,
                "ours {ours:?}, known {known:?}, volumes {volumes:?}"
            );
        }
    }
}
