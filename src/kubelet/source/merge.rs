//! Upstream's `PodConfig` idea: every source sends full snapshots; the merger remembers the
//! last one per source and turns each new snapshot into Add / Update / Remove by pod UID.
//!
//! A UID belongs to one source at a time: the first source whose snapshot carries it owns it.
//! Another source offering the same UID is reported as a conflict (logged once while it
//! lasts) and its pod ignored, so no source can take over, change or remove a pod another
//! source runs. When the owner drops the UID the pod is removed; the other source's pod is
//! not promoted on the spot but taken on the next snapshot of that source that still offers
//! it (at most one check period later), so every Add comes from a snapshot its source sent
//! as it is.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::{CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
use super::validate::uid_problem;
use super::{PodChange, SourceSnapshot, SourcesReady, full_name};
use crate::base::podspec::readiness_gates;

/// A pod one source offered under a UID another source already owns.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Conflict {
    /// The source whose pod was ignored.
    pub source: &'static str,
    /// The source that owns the UID.
    pub owner: &'static str,
    pub uid: String,
    /// `namespace/name` of the ignored pod.
    pub pod: String,
}

/// The merger's memory: per source, the pods of its last snapshot by UID (only those it
/// owns), and the conflicts in force.
#[derive(Default)]
pub(crate) struct Merger {
    sources: BTreeMap<&'static str, HashMap<String, Arc<Pod>>>,
    conflicts: BTreeSet<Conflict>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn annotations_without_seen(pod: &Pod) -> BTreeMap<&str, &str> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != CONFIG_SEEN_ANNOTATION)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Whether `new` differs from `old` in a way the node acts on: spec, labels, annotations
/// (other than `config.seen`), deletion timestamp and grace period. Status is the node's own,
/// except the conditions of readiness gates, which others set and which decide the pod's
/// Ready condition (upstream's config reconciles the pod when `NeedToReconcilePodReadiness`).
pub(crate) fn differs_meaningfully(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
        || readiness_gates::gate_states(old) != readiness_gates::gate_states(new)
        || old.metadata.labels != new.metadata.labels
        || annotations_without_seen(old) != annotations_without_seen(new)
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.metadata.deletion_grace_period_seconds != new.metadata.deletion_grace_period_seconds
}

impl Merger {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The source other than `source` that owns `uid`, if any.
    fn owner_of(&self, uid: &str, source: &'static str) -> Option<&'static str> {
        self.sources
            .iter()
            .find(|(name, pods)| **name != source && pods.contains_key(uid))
            .map(|(name, _)| *name)
    }

    /// Replace `source`'s pods with `snapshot` and return what changed: removals first, then
    /// updates, then additions, each sorted by `namespace/name`. Pods without a UID, or with
    /// one that is not a safe path component (the sources validate this already; this is the
    /// second line), are dropped; a UID repeated within the snapshot keeps its first pod; a
    /// UID another source owns is a [`Conflict`] and its pod is ignored.
    pub(crate) fn apply(&mut self, source: &'static str, snapshot: Vec<Pod>) -> Vec<PodChange> {
        let old = self.sources.remove(source).unwrap_or_default();
        let mut new: HashMap<String, Arc<Pod>> = HashMap::with_capacity(snapshot.len());
        let mut removes = Vec::new();
        let mut updates = Vec::new();
        let mut adds = Vec::new();
        let mut conflicts = BTreeSet::new();

        for mut pod in snapshot {
            let uid = uid_of(&pod);
            if uid.is_empty() {
                tracing::warn!(source, pod = %full_name(&pod), "dropping pod without a UID");
                continue;
            }
            if let Some(problem) = uid_problem(&uid) {
                tracing::warn!(source, pod = %full_name(&pod), pod_uid = %uid, %problem, "dropping pod with an unsafe UID");
                continue;
            }
            if new.contains_key(&uid) {
                tracing::warn!(source, pod = %full_name(&pod), pod_uid = %uid, "dropping pod with a duplicate UID");
                continue;
            }
            if let Some(owner) = self.owner_of(&uid, source) {
                conflicts.insert(Conflict {
                    source,
                    owner,
                    uid,
                    pod: full_name(&pod),
                });
                continue;
            }
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string());
            match old.get(&uid) {
                Some(existing) if !differs_meaningfully(existing, &pod) => {
                    new.insert(uid, existing.clone());
                }
                Some(existing) => {
                    // Keep the time the pod was first seen.
                    let seen = existing
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(CONFIG_SEEN_ANNOTATION))
                        .cloned();
                    let annotations = pod
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default);
                    match seen {
                        Some(seen) => {
                            annotations.insert(CONFIG_SEEN_ANNOTATION.to_string(), seen);
                        }
                        None => {
                            annotations.remove(CONFIG_SEEN_ANNOTATION);
                        }
                    }
                    let pod = Arc::new(pod);
                    updates.push(PodChange::Update(pod.clone()));
                    new.insert(uid, pod);
                }
                None => {
                    let pod = Arc::new(pod);
                    adds.push(PodChange::Add(pod.clone()));
                    new.insert(uid, pod);
                }
            }
        }
        for (uid, pod) in &old {
            if !new.contains_key(uid) {
                removes.push(PodChange::Remove(pod.clone()));
            }
        }
        self.sources.insert(source, new);
        self.note_conflicts(source, conflicts);

        let by_name = |a: &PodChange, b: &PodChange| {
            full_name(a.pod())
                .cmp(&full_name(b.pod()))
                .then_with(|| uid_of(a.pod()).cmp(&uid_of(b.pod())))
        };
        removes.sort_by(by_name);
        updates.sort_by(by_name);
        adds.sort_by(by_name);
        removes.extend(updates);
        removes.extend(adds);
        removes
    }

    /// Replace `source`'s conflicts with `current`, logging each new one once and each one
    /// that ended.
    fn note_conflicts(&mut self, source: &'static str, current: BTreeSet<Conflict>) {
        let ended: Vec<Conflict> = self
            .conflicts
            .iter()
            .filter(|c| c.source == source && !current.contains(c))
            .cloned()
            .collect();
        for c in ended {
            tracing::info!(source = c.source, owner = c.owner, pod = %c.pod, pod_uid = %c.uid, "pod UID conflict ended");
            self.conflicts.remove(&c);
        }
        for c in current {
            if !self.conflicts.contains(&c) {
                tracing::warn!(
                    source = c.source,
                    owner = c.owner,
                    pod = %c.pod,
                    pod_uid = %c.uid,
                    "ignoring pod: source {} offers UID {} that source {} already runs",
                    c.source,
                    c.uid,
                    c.owner
                );
                self.conflicts.insert(c);
            }
        }
    }

    /// The conflicts in force: pods ignored because another source owns their UID.
    #[cfg(test)]
    pub(crate) fn conflicts(&self) -> Vec<Conflict> {
        self.conflicts.iter().cloned().collect()
    }

    /// All pods currently known, across sources.
    #[cfg(test)]
    pub(crate) fn pods(&self) -> Vec<Arc<Pod>> {
        self.sources
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }
}

/// The merge task: apply snapshots as they arrive, forward non-empty change sets, and mark a
/// source ready once its first snapshot was merged and forwarded.
pub(crate) async fn run(
    mut snapshots: mpsc::Receiver<SourceSnapshot>,
    out: mpsc::Sender<Vec<PodChange>>,
    ready: SourcesReady,
    cancel: CancellationToken,
) {
    let mut merger = Merger::new();
    loop {
        let snapshot = tokio::select! {
            _ = cancel.cancelled() => break,
            s = snapshots.recv() => match s {
                Some(s) => s,
                None => {
                    // Every source stopped; wait for shutdown so the receiver stays open.
                    cancel.cancelled().await;
                    break;
                }
            },
        };
        let changes = merger.apply(snapshot.source, snapshot.pods);
        if !changes.is_empty() {
            for change in &changes {
                let (op, pod) = match change {
                    PodChange::Add(p) => ("add", p),
                    PodChange::Update(p) => ("update", p),
                    PodChange::Remove(p) => ("remove", p),
                };
                tracing::info!(source = snapshot.source, op, pod = %full_name(pod), pod_uid = %uid_of(pod), "pod config change");
            }
            if out.send(changes).await.is_err() {
                break;
            }
        }
        ready.mark_seen(snapshot.source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        let mut p: Pod = crate::base::yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: default, uid: {uid}, annotations: {{kubernetes.io/config.seen: t1}}}}\nspec: {{containers: [{{name: c, image: {image}}}]}}\n"
        ))
        .unwrap();
        p.metadata.labels = None;
        p
    }

    fn summary(changes: &[PodChange]) -> Vec<String> {
        changes
            .iter()
            .map(|c| {
                let (op, p) = match c {
                    PodChange::Add(p) => ("add", p),
                    PodChange::Update(p) => ("update", p),
                    PodChange::Remove(p) => ("remove", p),
                };
                format!("{op} {} {}", p.metadata.name.as_deref().unwrap(), uid_of(p))
            })
            .collect()
    }

    #[test]
    fn snapshot_diffing() {
        let mut m = Merger::new();
        let c = m.apply("file", vec![pod("a", "1", "x"), pod("b", "2", "x")]);
        assert_eq!(summary(&c), ["add a 1", "add b 2"]);
        let src = &c[0].pod().metadata.annotations.as_ref().unwrap()[CONFIG_SOURCE_ANNOTATION];
        assert_eq!(src, "file");

        // Same snapshot again: nothing.
        assert!(
            m.apply("file", vec![pod("a", "1", "x"), pod("b", "2", "x")])
                .is_empty()
        );

        // A new seen time alone is not a change.
        let mut later = pod("a", "1", "x");
        later
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(CONFIG_SEEN_ANNOTATION.into(), "t2".into());
        assert!(m.apply("file", vec![later, pod("b", "2", "x")]).is_empty());

        // Same UID, changed spec: update, keeping the first seen time.
        let mut changed = pod("a", "1", "y");
        changed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(CONFIG_SEEN_ANNOTATION.into(), "t3".into());
        let c = m.apply("file", vec![changed, pod("b", "2", "x")]);
        assert_eq!(summary(&c), ["update a 1"]);
        assert_eq!(
            c[0].pod().metadata.annotations.as_ref().unwrap()[CONFIG_SEEN_ANNOTATION],
            "t1"
        );

        // New UID for b (its file changed): remove old, add new.
        let c = m.apply("file", vec![pod("a", "1", "y"), pod("b", "3", "z")]);
        assert_eq!(summary(&c), ["remove b 2", "add b 3"]);

        // Label change is an update.
        let mut labelled = pod("a", "1", "y");
        labelled.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
        let c = m.apply("file", vec![labelled, pod("b", "3", "z")]);
        assert_eq!(summary(&c), ["update a 1"]);

        // Empty snapshot removes everything.
        let c = m.apply("file", vec![]);
        assert_eq!(summary(&c), ["remove a 1", "remove b 3"]);
        assert!(m.pods().is_empty());
    }

    /// Status is the node's own, but a readiness gate's condition set by others is an update
    /// (the pod's Ready condition depends on it); other conditions are not.
    #[test]
    fn a_readiness_gates_condition_is_an_update() {
        let gated = |conditions: &str| {
            let mut p: Pod = crate::base::yaml::from_str(&format!(
                "metadata: {{name: a, namespace: default, uid: '1'}}\nspec: {{containers: [{{name: c, image: x}}], readinessGates: [{{conditionType: example.com/gate}}]}}\nstatus: {{conditions: [{conditions}]}}\n"
            ))
            .unwrap();
            p.metadata.labels = None;
            p
        };
        let mut m = Merger::new();
        assert_eq!(summary(&m.apply("api", vec![gated("")])), ["add a 1"]);
        let other = "{type: Ready, status: 'True'}";
        assert!(m.apply("api", vec![gated(other)]).is_empty(), "not a gate");
        let gate_false = "{type: example.com/gate, status: 'False'}";
        let c = m.apply("api", vec![gated(gate_false)]);
        assert_eq!(summary(&c), ["update a 1"], "the gate's condition appears");
        let gate_true = "{type: example.com/gate, status: 'True'}";
        let c = m.apply("api", vec![gated(gate_true)]);
        assert_eq!(summary(&c), ["update a 1"], "the gate's condition flips");
        assert!(m.apply("api", vec![gated(gate_true)]).is_empty());
    }

    #[test]
    fn sources_are_independent() {
        let mut m = Merger::new();
        m.apply("file", vec![pod("a", "1", "x")]);
        let c = m.apply("http", vec![pod("h", "9", "x")]);
        assert_eq!(summary(&c), ["add h 9"]);
        let c = m.apply("http", vec![]);
        assert_eq!(summary(&c), ["remove h 9"]);
        assert_eq!(m.pods().len(), 1);
    }

    #[test]
    fn duplicate_and_missing_uids_dropped() {
        let mut m = Merger::new();
        let mut no_uid = pod("n", "1", "x");
        no_uid.metadata.uid = None;
        let c = m.apply("file", vec![pod("a", "1", "x"), pod("b", "1", "x"), no_uid]);
        assert_eq!(summary(&c), ["add a 1"]);
    }

    #[tokio::test]
    async fn task_marks_ready_and_forwards() {
        let (snap_tx, snap_rx) = mpsc::channel(16);
        let (out_tx, mut out_rx) = mpsc::channel(16);
        let ready = SourcesReady::new(["file"]);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(snap_rx, out_tx, ready.clone(), cancel.clone()));
        assert!(!ready.all_ready());
        snap_tx
            .send(SourceSnapshot {
                source: "file",
                pods: vec![pod("a", "1", "x")],
            })
            .await
            .unwrap();
        let changes = out_rx.recv().await.unwrap();
        assert_eq!(summary(&changes), ["add a 1"]);
        // Ready is set right after the send; the same task does both.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !ready.all_ready() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        cancel.cancel();
        task.await.unwrap();
        assert!(out_rx.recv().await.is_none());
    }

    #[test]
    fn no_sources_ready_at_once() {
        assert!(SourcesReady::new([]).all_ready());
    }

    fn conflict_summary(m: &Merger) -> Vec<String> {
        m.conflicts()
            .iter()
            .map(|c| format!("{} {} owned by {}", c.source, c.uid, c.owner))
            .collect()
    }

    /// Two sources offering one UID: (step source, its snapshot as (name, uid, image),
    /// expected changes, expected conflicts after the step).
    #[test]
    fn a_uid_belongs_to_the_first_source_that_offers_it() {
        type Step = (
            &'static str,
            &'static [(&'static str, &'static str, &'static str)],
            &'static [&'static str],
            &'static [&'static str],
        );
        let steps: &[Step] = &[
            ("file", &[("a", "1", "x")], &["add a 1"], &[]),
            // http offers the same UID with another spec: ignored, no takeover, no update.
            (
                "http",
                &[("evil", "1", "y"), ("h", "2", "x")],
                &["add h 2"],
                &["http 1 owned by file"],
            ),
            // Re-offering it changes nothing and stays one conflict.
            (
                "http",
                &[("evil", "1", "z"), ("h", "2", "x")],
                &[],
                &["http 1 owned by file"],
            ),
            // The owner's own update still applies.
            (
                "file",
                &[("a", "1", "x2")],
                &["update a 1"],
                &["http 1 owned by file"],
            ),
            // http stops offering it: the conflict ends, the file pod is untouched.
            ("http", &[("h", "2", "x")], &[], &[]),
            (
                "http",
                &[("evil", "1", "y"), ("h", "2", "x")],
                &[],
                &["http 1 owned by file"],
            ),
            // The owner drops it: removed, and not handed to http on the spot...
            ("file", &[], &["remove a 1"], &["http 1 owned by file"]),
            // ...but on http's next snapshot that still offers it.
            (
                "http",
                &[("evil", "1", "y"), ("h", "2", "x")],
                &["add evil 1"],
                &[],
            ),
            // Now file is the second: its pod is the ignored one.
            ("file", &[("a", "1", "x")], &[], &["file 1 owned by http"]),
            // A source's empty snapshot cannot remove a pod another source owns.
            ("file", &[], &[], &[]),
        ];
        let mut m = Merger::new();
        for (i, (source, pods, want, want_conflicts)) in steps.iter().enumerate() {
            let snapshot = pods.iter().map(|(n, u, img)| pod(n, u, img)).collect();
            let changes = m.apply(source, snapshot);
            assert_eq!(summary(&changes), *want, "step {i}");
            assert_eq!(conflict_summary(&m), *want_conflicts, "step {i}");
        }
        // Exactly one pod per UID across sources.
        let mut uids: Vec<String> = m.pods().iter().map(|p| uid_of(p)).collect();
        uids.sort();
        assert_eq!(uids, ["1", "2"]);
    }

    #[test]
    fn unsafe_uids_dropped_even_without_validation() {
        let mut m = Merger::new();
        let c = m.apply(
            "api",
            vec![
                pod("a", "ok", "x"),
                pod("b", "\"../../x\"", "x"),
                pod("c", "\".\"", "x"),
            ],
        );
        assert_eq!(summary(&c), ["add a ok"]);
    }
}
