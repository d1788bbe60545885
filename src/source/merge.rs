//! Upstream's `PodConfig` idea: every source sends full snapshots; the merger remembers the
//! last one per source and turns each new snapshot into Add / Update / Remove by pod UID.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::{CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
use super::{PodChange, SourceSnapshot, SourcesReady, full_name};

/// The merger's memory: per source, the pods of its last snapshot by UID.
#[derive(Default)]
pub struct Merger {
    sources: BTreeMap<&'static str, HashMap<String, Arc<Pod>>>,
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
/// (other than `config.seen`), deletion timestamp and grace period. Status is the node's own.
pub fn differs_meaningfully(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
        || old.metadata.labels != new.metadata.labels
        || annotations_without_seen(old) != annotations_without_seen(new)
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.metadata.deletion_grace_period_seconds != new.metadata.deletion_grace_period_seconds
}

impl Merger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replace `source`'s pods with `snapshot` and return what changed: removals first, then
    /// updates, then additions, each sorted by `namespace/name`. Pods without a UID are
    /// dropped; a UID repeated within the snapshot keeps its first pod.
    pub fn apply(&mut self, source: &'static str, snapshot: Vec<Pod>) -> Vec<PodChange> {
        let old = self.sources.remove(source).unwrap_or_default();
        let mut new: HashMap<String, Arc<Pod>> = HashMap::with_capacity(snapshot.len());
        let mut removes = Vec::new();
        let mut updates = Vec::new();
        let mut adds = Vec::new();

        for mut pod in snapshot {
            let uid = uid_of(&pod);
            if uid.is_empty() {
                tracing::warn!(source, pod = %full_name(&pod), "dropping pod without a UID");
                continue;
            }
            if new.contains_key(&uid) {
                tracing::warn!(source, pod = %full_name(&pod), %uid, "dropping pod with a duplicate UID");
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

    /// All pods currently known, across sources.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.sources
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }
}

/// The merge task: apply snapshots as they arrive, forward non-empty change sets, and mark a
/// source ready once its first snapshot was merged and forwarded.
pub(crate) async fn run(
    mut snapshots: mpsc::UnboundedReceiver<SourceSnapshot>,
    out: mpsc::UnboundedSender<Vec<PodChange>>,
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
                tracing::info!(source = snapshot.source, op, pod = %full_name(pod), uid = %uid_of(pod), "pod config change");
            }
            if out.send(changes).is_err() {
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
        let mut p: Pod = crate::yaml::from_str(&format!(
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
        let (snap_tx, snap_rx) = mpsc::unbounded_channel();
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let ready = SourcesReady::new(["file"]);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(snap_rx, out_tx, ready.clone(), cancel.clone()));
        assert!(!ready.all_ready());
        snap_tx
            .send(SourceSnapshot {
                source: "file",
                pods: vec![pod("a", "1", "x")],
            })
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
}
