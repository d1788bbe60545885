//! After each step of a shutdown, upstream waits (within the step's grace) until the stopped
//! pods' volumes are unmounted, so that a storage driver running in a later, more critical
//! step is still there to unmount them. Deckhand's own volumes (secrets, config maps,
//! projected tokens, memory-backed emptyDirs) are mounts under
//! `<root-dir>/pods/<uid>/volumes`; a pod is done once none is left there.
//!
//! The mount table is behind [`PodVolumes`] ([`MountTable`] reads this process's, through
//! the reader the daemon hands it: the volume code's, which the shutdown code does not
//! depend on); which mounts belong to which pods is the pure [`volume_mounts`].

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

/// How often the mounts are looked at while waiting (upstream's retry interval for mounts).
pub(crate) const POLL_PERIOD: std::time::Duration = std::time::Duration::from_millis(300);

/// The mount points still under the pods' volume directories.
pub(crate) trait PodVolumes: Send + Sync + 'static {
    fn still_mounted<'a>(&'a self, uids: &'a [String]) -> BoxFuture<'a, Vec<PathBuf>>;
}

/// Reads the mount points of this process's mount table (`/proc/self/mountinfo`).
pub(crate) type MountReader = fn() -> std::io::Result<Vec<PathBuf>>;

/// The real one: the mount table, for pods under `<root-dir>/pods`.
pub(crate) struct MountTable {
    pub pods_dir: PathBuf,
    pub read: MountReader,
}

impl PodVolumes for MountTable {
    fn still_mounted<'a>(&'a self, uids: &'a [String]) -> BoxFuture<'a, Vec<PathBuf>> {
        let pods_dir = self.pods_dir.clone();
        let read = self.read;
        let uids = uids.to_vec();
        Box::pin(async move {
            let read = tokio::task::spawn_blocking(move || {
                // The table shows resolved paths; the root dir may be given through a symlink.
                let pods_dir = pods_dir.canonicalize().unwrap_or(pods_dir);
                read().map(|points| volume_mounts(&points, &pods_dir, &uids))
            })
            .await;
            match read {
                Ok(Ok(left)) => left,
                Ok(Err(err)) => {
                    // Nothing to wait for that can be seen: the shutdown goes on.
                    tracing::warn!(error = %err, "cannot read the mount table; not waiting for volumes");
                    Vec::new()
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reading the mount table failed; not waiting for volumes");
                    Vec::new()
                }
            }
        })
    }
}

/// The mount points (from `points`) under `<pods_dir>/<uid>/volumes` of each pod, pod by
/// pod in the table's order. A UID that is not one path component has no directory of its
/// own and is skipped.
pub(crate) fn volume_mounts(points: &[PathBuf], pods_dir: &Path, uids: &[String]) -> Vec<PathBuf> {
    uids.iter()
        .filter(|uid| crate::base::safe_names::component_problem(uid).is_none())
        .flat_map(|uid| {
            let dir = pods_dir.join(uid).join("volumes");
            points.iter().filter(move |p| p.starts_with(&dir)).cloned()
        })
        .collect()
}

/// Waits until none of `uids` has a volume mounted. The caller bounds the wait with the
/// step's grace period, as upstream does.
pub(crate) async fn wait_unmounted(volumes: &dyn PodVolumes, uids: &[String]) {
    if uids.is_empty() {
        return;
    }
    loop {
        let left = volumes.still_mounted(uids).await;
        if left.is_empty() {
            return;
        }
        tracing::debug!(mounts = ?left, "waiting for the stopped pods' volumes to be unmounted");
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(point: &str) -> PathBuf {
        PathBuf::from(point)
    }

    #[test]
    fn only_the_volumes_of_the_pods_asked_about_count() {
        let table = vec![
            entry("/"),
            entry("/var/lib/deckhand"),
            entry("/var/lib/deckhand/pods/a/volumes/kubernetes.io~secret/creds"),
            entry("/var/lib/deckhand/pods/a/volumes/kubernetes.io~projected/token"),
            entry("/var/lib/deckhand/pods/a/volume-subpaths/app/0"),
            entry("/var/lib/deckhand/pods/b/volumes/kubernetes.io~empty-dir/cache"),
            entry("/var/lib/deckhand/pods/ab/volumes/kubernetes.io~secret/x"),
            entry("/elsewhere/pods/a/volumes/kubernetes.io~secret/creds"),
        ];
        let pods = Path::new("/var/lib/deckhand/pods");
        let cases: &[(&[&str], &[&str])] = &[
            (&[], &[]),
            (&["c"], &[]),
            (
                &["a"],
                &[
                    "/var/lib/deckhand/pods/a/volumes/kubernetes.io~secret/creds",
                    "/var/lib/deckhand/pods/a/volumes/kubernetes.io~projected/token",
                ],
            ),
            (
                &["b", "c"],
                &["/var/lib/deckhand/pods/b/volumes/kubernetes.io~empty-dir/cache"],
            ),
            // Not a prefix match on the UID: "a" is not "ab".
            (
                &["ab"],
                &["/var/lib/deckhand/pods/ab/volumes/kubernetes.io~secret/x"],
            ),
            // A UID that would climb out of the pods directory is never looked under.
            (&["..", "a/../b", ""], &[]),
        ];
        for (uids, want) in cases {
            let uids: Vec<String> = uids.iter().map(|u| u.to_string()).collect();
            let got = volume_mounts(&table, pods, &uids);
            let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
            assert_eq!(got, want, "uids {uids:?}");
        }
    }
}
