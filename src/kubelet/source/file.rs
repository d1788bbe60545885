//! The file source: static-pod manifests in `staticPodPath` (a directory, read
//! non-recursively, or a single file). Reacts to inotify events within a short coalescing
//! window and rescans fully every `fileCheckFrequency`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::ManifestOrigin;
use super::manifest::MAX_MANIFEST_BYTES;
use super::{
    NodeSecurity, SOURCE_FILE, SourceProblems, SourceSnapshot, full_name, load_static_pods,
};
use crate::base::clock;

/// Quiet time after the last inotify event before rescanning: editors write a file in
/// several steps, and one rescan should see the end result.
const COALESCE_QUIET: Duration = Duration::from_millis(10);
/// Longest a stream of events can postpone a rescan.
const COALESCE_MAX: Duration = Duration::from_millis(500);

/// What one scan of `staticPodPath` found.
#[derive(Clone, Debug, Default)]
pub(crate) struct ScanOutcome {
    /// Pods to run, in file-name order; at most one per `namespace/name`.
    pub pods: Vec<Pod>,
    /// File path (or `staticPodPath` itself) → why it yielded no new pods.
    pub errors: BTreeMap<String, String>,
    /// File path → unknown fields in it.
    pub unknown_fields: BTreeMap<String, Vec<String>>,
    /// `staticPodPath` does not exist (yet).
    pub missing: bool,
    /// Manifest file → the pods it stands for now: read in this scan, or, when the file could
    /// not be read or parsed this time, kept from the last scan that could. The next scan
    /// starts from this.
    pub by_file: BTreeMap<PathBuf, Vec<Pod>>,
    /// Files (or `staticPodPath` itself) whose pods were kept from an earlier scan.
    pub kept: BTreeSet<PathBuf>,
    /// Manifest file → its identity and times when its pods were read from it. A later scan
    /// that finds the same stamp takes the pods from here instead of reading and parsing the
    /// file again (parsing 110 manifests every `fileCheckFrequency` was one of the largest
    /// costs of an agent at rest).
    pub stamps: BTreeMap<PathBuf, FileStamp>,
    /// Nothing was learnt: `staticPodPath` could not be listed, or it is a single file that
    /// could not be read or parsed. Until a scan was conclusive once, such a scan is not sent
    /// (the source stays not ready, so pods left running by an earlier run are not taken for
    /// orphans), as upstream does.
    pub inconclusive: bool,
}

/// What says a manifest file is the one read before: device and inode (a file replaced by a
/// rename is another), size, and the modification and change times in nanoseconds (the change
/// time moves with every write and cannot be set back by a tool that restores `mtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    fn of(meta: &fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// Hidden files (editor swap files, `..data` symlinks) are skipped, as upstream does.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

/// Why one manifest file could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// It no longer exists: a deletion, not a failure.
    #[error("{}: no longer exists", .0.display())]
    Gone(PathBuf),
    #[error("{}: cannot open: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: manifest is larger than the {MAX_MANIFEST_BYTES}-byte limit", .0.display())]
    TooLarge(PathBuf),
}

fn read_manifest(path: &Path) -> Result<Vec<u8>, ReadError> {
    let file = fs::File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ReadError::Gone(path.to_path_buf())
        } else {
            ReadError::Open {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ReadError::TooLarge(path.to_path_buf()));
    }
    Ok(bytes)
}

/// What listing `staticPodPath` gave.
enum Listing {
    /// It does not exist: no pods (as upstream).
    Missing,
    /// It exists but could not be read or listed: nothing is known about its files.
    Failed(String),
    /// Manifest files in name order, each with its stamp, or the reason it could not even be
    /// looked at (other than being gone).
    Files(Vec<(PathBuf, Result<FileStamp, ReadError>)>),
}

/// List the manifest files under `path`: the file itself, or the regular, non-hidden files
/// directly in the directory, sorted by name.
fn manifest_files(path: &Path) -> Listing {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Listing::Missing,
        Err(e) => return Listing::Failed(format!("{}: cannot read: {e}", path.display())),
    };
    if meta.is_file() {
        return Listing::Files(vec![(path.to_path_buf(), Ok(FileStamp::of(&meta)))]);
    }
    if !meta.is_dir() {
        return Listing::Failed(format!(
            "{}: neither a regular file nor a directory",
            path.display()
        ));
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            return Listing::Failed(format!("{}: cannot list directory: {e}", path.display()));
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        // A listing that breaks off half-way says nothing about the files not yet seen.
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                return Listing::Failed(format!("{}: cannot list directory: {e}", path.display()));
            }
        };
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let file = entry.path();
        // Follow symlinks: a link to a regular file is a manifest.
        match fs::metadata(&file) {
            Ok(meta) if meta.is_file() => files.push((file, Ok(FileStamp::of(&meta)))),
            Ok(meta) if meta.is_dir() => {
                tracing::debug!(path = %file.display(), "not recursing into manifest subdirectory");
            }
            Ok(_) => tracing::debug!(path = %file.display(), "skipping non-regular manifest entry"),
            // Vanished between listing and stat, or a dangling link: gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A link loop, EIO, EACCES...: the file is there but unreadable now.
            Err(source) => {
                let problem = ReadError::Read {
                    path: file.clone(),
                    source,
                };
                files.push((file, Err(problem)));
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Listing::Files(files)
}

/// Read every manifest under `path` and turn it into pods. Pure apart from reading files.
///
/// A read error never removes pods: a manifest that cannot be opened, read, parsed or
/// validated keeps the pods `previous` had for it, and a `staticPodPath` that cannot be listed
/// keeps all of them. Only a file that is gone (or a `staticPodPath` that does not exist)
/// removes its pods, as upstream. A file that never read well contributes nothing.
pub(crate) fn scan(
    path: &Path,
    node_name: &str,
    security: &NodeSecurity,
    seen: SystemTime,
    previous: &ScanOutcome,
) -> ScanOutcome {
    let mut outcome = ScanOutcome::default();
    let files = match manifest_files(path) {
        Listing::Missing => {
            outcome.missing = true;
            return outcome;
        }
        Listing::Failed(message) => {
            outcome.errors = previous.errors.clone();
            outcome.errors.insert(path.display().to_string(), message);
            outcome.unknown_fields = previous.unknown_fields.clone();
            outcome.by_file = previous.by_file.clone();
            outcome.stamps = previous.stamps.clone();
            outcome.kept = BTreeSet::from([path.to_path_buf()]);
            outcome.pods = previous.pods.clone();
            outcome.inconclusive = true;
            return outcome;
        }
        Listing::Files(files) => files,
    };
    let single_file = files.len() == 1 && files[0].0 == path;
    for (file, stamp) in files {
        let key = file.display().to_string();
        // Unchanged since its pods were read: they stand as they are.
        if let Ok(stamp) = &stamp
            && previous.stamps.get(&file) == Some(stamp)
            && let Some(pods) = previous.by_file.get(&file)
        {
            if let Some(fields) = previous.unknown_fields.get(&key) {
                outcome.unknown_fields.insert(key, fields.clone());
            }
            outcome.by_file.insert(file.clone(), pods.clone());
            outcome.stamps.insert(file, *stamp);
            continue;
        }
        let failure = match stamp {
            Err(problem) => problem.to_string(),
            Ok(stamp) => match read_manifest(&file) {
                Err(ReadError::Gone(_)) => continue,
                Err(e) => e.to_string(),
                Ok(bytes) => {
                    match load_static_pods(
                        &bytes,
                        ManifestOrigin::File(&file),
                        node_name,
                        security,
                        seen,
                    ) {
                        Ok(loaded) => {
                            if !loaded.unknown_fields.is_empty() {
                                outcome
                                    .unknown_fields
                                    .insert(key.clone(), loaded.unknown_fields);
                            }
                            outcome.by_file.insert(file.clone(), loaded.pods);
                            outcome.stamps.insert(file, stamp);
                            continue;
                        }
                        Err(e) => e.to_string(),
                    }
                }
            },
        };
        outcome.errors.insert(key.clone(), failure);
        outcome.inconclusive |= single_file;
        if let Some(pods) = previous.by_file.get(&file) {
            outcome.by_file.insert(file.clone(), pods.clone());
            outcome.kept.insert(file.clone());
            if let Some(fields) = previous.unknown_fields.get(&key) {
                outcome.unknown_fields.insert(key, fields.clone());
            }
        }
    }
    let mut owners: HashMap<String, &Path> = HashMap::new();
    for (file, pods) in &outcome.by_file {
        for pod in pods {
            let name = full_name(pod);
            if let Some(first) = owners.get(&name) {
                outcome
                    .errors
                    .entry(file.display().to_string())
                    .or_insert_with(|| {
                        format!(
                            "{}: pod {name} is already defined by {}; ignoring this file",
                            file.display(),
                            first.display()
                        )
                    });
                continue;
            }
            owners.insert(name, file);
            outcome.pods.push(pod.clone());
        }
    }
    outcome
}

/// The file source's state between scans.
pub(crate) struct FileSource {
    path: PathBuf,
    node_name: String,
    security: Arc<NodeSecurity>,
    period: Duration,
    problems: SourceProblems,
    owned_problems: BTreeSet<String>,
    logged_errors: BTreeMap<String, String>,
    logged_unknown: BTreeMap<String, Vec<String>>,
    logged_kept: BTreeSet<PathBuf>,
    missing_logged: bool,
    /// The last scan: where the next one starts from (last good pods per file).
    last: ScanOutcome,
    /// A conclusive scan was sent once (see [`ScanOutcome::inconclusive`]).
    sent_conclusive: bool,
}

impl FileSource {
    pub(crate) fn new(
        path: PathBuf,
        node_name: String,
        security: Arc<NodeSecurity>,
        period: Duration,
        problems: SourceProblems,
    ) -> Self {
        FileSource {
            path,
            node_name,
            security,
            period: period.max(Duration::from_millis(100)),
            problems,
            owned_problems: BTreeSet::new(),
            logged_errors: BTreeMap::new(),
            logged_unknown: BTreeMap::new(),
            logged_kept: BTreeSet::new(),
            missing_logged: false,
            last: ScanOutcome::default(),
            sent_conclusive: false,
        }
    }

    /// Log what is new in `outcome` (each distinct problem once), update the shared problem
    /// list, and return the lines logged (for tests).
    pub(crate) fn report(&mut self, outcome: &ScanOutcome) -> Vec<String> {
        let mut logged = Vec::new();
        let path_key = self.path.display().to_string();
        let mut current = outcome.errors.clone();
        if outcome.missing {
            if !self.missing_logged {
                let line =
                    format!("{path_key}: static pod path does not exist yet; will keep checking");
                tracing::warn!(path = %path_key, "static pod path does not exist yet; will keep checking");
                logged.push(line);
                self.missing_logged = true;
            }
            current.insert(path_key.clone(), format!("{path_key}: does not exist"));
        } else if self.missing_logged {
            tracing::info!(path = %path_key, "static pod path exists now");
            logged.push(format!("{path_key}: exists now"));
            self.missing_logged = false;
        }
        for (key, message) in &outcome.errors {
            if self.logged_errors.get(key) != Some(message) {
                tracing::warn!(path = %key, error = %message, "ignoring static pod manifest");
                logged.push(message.clone());
            }
        }
        for key in self.logged_errors.keys() {
            if !outcome.errors.contains_key(key) {
                tracing::info!(path = %key, "static pod manifest problem resolved");
                logged.push(format!("{key}: problem resolved"));
            }
        }
        self.logged_errors = outcome.errors.clone();
        for (key, fields) in &outcome.unknown_fields {
            if self.logged_unknown.get(key) != Some(fields) {
                let list = fields.join(", ");
                tracing::warn!(path = %key, fields = %list, "static pod manifest has unknown fields (ignored)");
                logged.push(format!("{key}: unknown fields: {list}"));
            }
        }
        self.logged_unknown = outcome.unknown_fields.clone();
        for kept in &outcome.kept {
            if !self.logged_kept.contains(kept) {
                let count = outcome
                    .by_file
                    .get(kept)
                    .map_or(outcome.pods.len(), Vec::len);
                tracing::warn!(path = %kept.display(), pods = count, "cannot read static pod manifests; their pods keep running as last read");
                logged.push(format!(
                    "{}: keeping {count} pod(s) as last read",
                    kept.display()
                ));
            }
        }
        self.logged_kept = outcome.kept.clone();
        self.problems.replace(&mut self.owned_problems, &current);
        logged
    }

    async fn rescan(&mut self, tx: &mpsc::Sender<SourceSnapshot>) -> bool {
        let path = self.path.clone();
        let node = self.node_name.clone();
        let security = self.security.clone();
        let seen = clock::now();
        let previous = self.last.clone();
        let outcome = match tokio::task::spawn_blocking(move || {
            scan(&path, &node, &security, seen, &previous)
        })
        .await
        {
            Ok(outcome) => outcome,
            Err(e) => {
                // Nothing was learnt: send nothing, keep the last scan as the base.
                tracing::error!(error = %e, "static pod scan failed");
                return true;
            }
        };
        self.report(&outcome);
        let pods = outcome.pods.clone();
        let inconclusive = outcome.inconclusive;
        self.last = outcome;
        if inconclusive && !self.sent_conclusive {
            return true;
        }
        self.sent_conclusive = true;
        tx.send(SourceSnapshot {
            source: SOURCE_FILE,
            pods,
        })
        .await
        .is_ok()
    }

    /// Scan, then rescan on inotify events (coalesced) and every period, until cancelled.
    pub(crate) async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
        let mut watcher = Watcher::new();
        loop {
            // Watch before scanning, so a change made during the scan is not missed.
            watcher.ensure(&self.path);
            if !self.rescan(&tx).await {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.period) => continue,
                _ = watcher.changed() => {}
            }
            // Coalesce a burst of events into one rescan.
            let burst_end = clock::instant() + COALESCE_MAX;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(COALESCE_QUIET) => break,
                    _ = tokio::time::sleep_until(burst_end) => break,
                    _ = watcher.changed() => {}
                }
            }
        }
    }
}

/// An inotify watch on the manifest directory (or on the directory holding the manifest
/// file). Missing or failing inotify degrades to polling only.
struct Watcher {
    stream: Option<EventStream<Vec<u8>>>,
    watch: Option<(PathBuf, WatchDescriptor)>,
    /// When `staticPodPath` is a file: only events for this name matter.
    only_name: Option<OsString>,
    init_failed: bool,
}

impl Watcher {
    fn new() -> Self {
        Watcher {
            stream: None,
            watch: None,
            only_name: None,
            init_failed: false,
        }
    }

    /// Make sure the right directory is watched; quietly retry on the next call otherwise.
    fn ensure(&mut self, path: &Path) {
        let (dir, only_name) = match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => (path.to_path_buf(), None),
            Ok(_) => match (path.parent(), path.file_name()) {
                (Some(parent), Some(name)) => {
                    let parent = if parent.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        parent
                    };
                    (parent.to_path_buf(), Some(name.to_os_string()))
                }
                _ => return,
            },
            Err(_) => return,
        };
        if self.watch.as_ref().is_some_and(|(d, _)| *d == dir) && self.only_name == only_name {
            return;
        }
        if self.stream.is_none() && !self.init_failed {
            let stream = Inotify::init().and_then(|i| i.into_event_stream(vec![0u8; 4096]));
            match stream {
                Ok(stream) => self.stream = Some(stream),
                Err(e) => {
                    tracing::warn!(error = %e, "inotify unavailable; static pod path is only polled");
                    self.init_failed = true;
                    return;
                }
            }
        }
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        let mut watches = stream.watches();
        if let Some((_, old)) = self.watch.take() {
            let _ = watches.remove(old);
        }
        let mask = WatchMask::CREATE
            | WatchMask::CLOSE_WRITE
            | WatchMask::MODIFY
            | WatchMask::ATTRIB
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR;
        match watches.add(&dir, mask) {
            Ok(wd) => {
                tracing::debug!(dir = %dir.display(), "watching static pod directory");
                self.watch = Some((dir, wd));
                self.only_name = only_name;
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch static pod directory yet");
            }
        }
    }

    /// Resolves when something relevant changed. Never resolves without a watch.
    async fn changed(&mut self) {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return std::future::pending().await;
            };
            if self.watch.is_none() {
                // Drain nothing; wait for `ensure` to set a watch up again.
                return std::future::pending().await;
            }
            match stream.next().await {
                Some(Ok(event)) => {
                    // Events from a watch replaced earlier are stale.
                    if self.watch.as_ref().is_some_and(|(_, wd)| *wd != event.wd) {
                        continue;
                    }
                    if event.mask.intersects(
                        EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF,
                    ) {
                        // The directory itself went away; re-watch on the next round.
                        self.watch = None;
                        return;
                    }
                    if event.mask.contains(EventMask::Q_OVERFLOW) {
                        return;
                    }
                    match (&self.only_name, &event.name) {
                        (Some(only), Some(name)) if only != name => continue,
                        _ => return,
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "inotify read failed; static pod path is only polled");
                    self.stream = None;
                    self.watch = None;
                    self.init_failed = true;
                    return;
                }
                None => {
                    self.stream = None;
                    self.watch = None;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::source::{PodChange, SourceConfig, spawn_sources};
    use std::time::Instant;

    const NODE: &str = "node-1";

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    /// Write atomically (temp file + rename), as careful tools do.
    /// A first scan of `dir` on this node.
    fn scan_fresh(dir: &Path) -> ScanOutcome {
        scan_again(dir, &ScanOutcome::default())
    }

    /// A scan of `dir` that follows `previous`.
    fn scan_again(dir: &Path, previous: &ScanOutcome) -> ScanOutcome {
        scan(
            dir,
            NODE,
            &NodeSecurity::default(),
            SystemTime::now(),
            previous,
        )
    }

    #[test]
    fn an_unchanged_manifest_is_not_read_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let seen = |o: &ScanOutcome| -> Vec<String> {
            o.pods
                .iter()
                .map(|p| {
                    p.metadata.annotations.as_ref().unwrap()
                        [crate::kubelet::source::defaults::CONFIG_SEEN_ANNOTATION]
                        .clone()
                })
                .collect()
        };
        let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let scan_at = |secs, previous: &ScanOutcome| {
            scan(&dir, NODE, &NodeSecurity::default(), at(secs), previous)
        };
        write(&dir, "a.yaml", &manifest("a", "img:1"));
        write(&dir, "b.yaml", &manifest("b", "img:1"));
        let first = scan_at(1_000, &ScanOutcome::default());
        let first_seen = seen(&first);

        // Nothing changed: the pods are the first scan's (read at its time).
        let second = scan_at(2_000, &first);
        assert_eq!(seen(&second), first_seen);
        assert_eq!(second.pods, first.pods);

        // One file rewritten in place with the same size and its old modification time put
        // back: the change time still tells, and only that file is read.
        let path = dir.join("b.yaml");
        let before = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, manifest("b", "img:2")).unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(before)
            .unwrap();
        let third = scan_at(3_000, &second);
        let images: Vec<_> = third
            .pods
            .iter()
            .map(|p| {
                p.spec.as_ref().unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap()
            })
            .collect();
        assert_eq!(images, ["img:1", "img:2"]);
        let third_seen = seen(&third);
        assert_eq!(third_seen[0], first_seen[0]);
        assert_ne!(third_seen[1], first_seen[1]);
    }

    fn write(dir: &Path, file: &str, text: &str) {
        let tmp = dir.join(format!(".{file}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, dir.join(file)).unwrap();
    }

    use crate::kubelet::source::describe_changes as describe;

    async fn next(rx: &mut mpsc::Receiver<Vec<PodChange>>) -> Vec<PodChange> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no pod change within 10s")
            .expect("channel closed")
    }

    fn config(path: &Path, period: Duration) -> SourceConfig {
        SourceConfig {
            node_name: NODE.into(),
            static_pod_path: Some(path.to_path_buf()),
            file_check_frequency: period,
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: Duration::from_secs(20),
            security: Default::default(),
            api: None,
        }
    }

    fn uid(p: &Pod) -> String {
        p.metadata.uid.clone().unwrap()
    }

    #[tokio::test]
    async fn add_edit_delete_through_inotify() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        // A long period: every reaction below must come from inotify.
        let (mut rx, ready, problems) = spawn_sources(
            config(dir.path(), Duration::from_secs(3600)),
            &tokio_util::task::TaskTracker::new(),
            cancel.clone(),
        );

        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.all_ready() {
            assert!(Instant::now() < deadline, "file source never became ready");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        write(dir.path(), "web.yaml", &manifest("web", "nginx:1"));
        let added = next(&mut rx).await;
        assert_eq!(describe(&added), ["add web-node-1"]);
        let first_uid = uid(added[0].pod());

        // A dotfile is ignored (the next change seen is the edit below, not this).
        fs::write(dir.path().join(".hidden.yaml"), manifest("hidden", "x")).unwrap();

        write(dir.path(), "web.yaml", &manifest("web", "nginx:2"));
        let edited = next(&mut rx).await;
        assert_eq!(describe(&edited), ["remove web-node-1", "add web-node-1"]);
        assert_eq!(uid(edited[0].pod()), first_uid);
        let second_uid = uid(edited[1].pod());
        assert_ne!(second_uid, first_uid);

        fs::remove_file(dir.path().join("web.yaml")).unwrap();
        let removed = next(&mut rx).await;
        assert_eq!(describe(&removed), ["remove web-node-1"]);
        assert_eq!(uid(removed[0].pod()), second_uid);
        assert!(problems.snapshot().is_empty());

        cancel.cancel();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn bad_file_beside_good_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a-good.yaml", &manifest("good", "nginx:1"));
        write(
            dir.path(),
            "b-bad.yaml",
            "apiVersion: v1\nkind: Pod\nspec: [oops\n",
        );
        let cancel = CancellationToken::new();
        let (mut rx, _ready, problems) = spawn_sources(
            config(dir.path(), Duration::from_secs(3600)),
            &tokio_util::task::TaskTracker::new(),
            cancel.clone(),
        );
        let first = next(&mut rx).await;
        assert_eq!(describe(&first), ["add good-node-1"]);
        let snapshot = problems.snapshot();
        let bad_key = dir.path().join("b-bad.yaml").display().to_string();
        assert!(snapshot[&bad_key].contains("line"), "{snapshot:?}");

        // Fixing the file clears the problem and adds its pod.
        write(dir.path(), "b-bad.yaml", &manifest("fixed", "nginx:1"));
        let fixed = next(&mut rx).await;
        assert_eq!(describe(&fixed), ["add fixed-node-1"]);
        assert!(problems.snapshot().is_empty());
        cancel.cancel();
    }

    #[test]
    fn errors_logged_once_across_rescans() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "good.yaml", &manifest("good", "nginx:1"));
        write(dir.path(), "bad.yaml", "kind: Pod\n");
        write(
            dir.path(),
            "typo.yaml",
            &manifest("typo", "x").replace("spec:\n", "spec:\n  hostNetwrk: true\n"),
        );
        let problems = SourceProblems::default();
        let mut source = FileSource::new(
            dir.path().to_path_buf(),
            NODE.into(),
            Default::default(),
            Duration::from_secs(60),
            problems.clone(),
        );
        let first = scan_fresh(dir.path());
        assert_eq!(first.pods.len(), 2);
        let logged = source.report(&first);
        assert_eq!(logged.len(), 2, "{logged:?}");
        assert!(
            logged.iter().any(|l| l.contains("apiVersion")),
            "{logged:?}"
        );
        assert!(
            logged.iter().any(|l| l.contains("spec.hostNetwrk")),
            "{logged:?}"
        );
        assert_eq!(problems.snapshot().len(), 1);

        // The same problems on the next rescans: silence.
        for _ in 0..2 {
            let again = scan_fresh(dir.path());
            assert!(source.report(&again).is_empty());
        }

        // A different error in the same file is logged; then the fix is logged once.
        write(dir.path(), "bad.yaml", "apiVersion: v2\nkind: Pod\n");
        let changed = source.report(&scan_fresh(dir.path()));
        assert_eq!(changed.len(), 1, "{changed:?}");
        write(dir.path(), "bad.yaml", &manifest("bad", "x"));
        let fixed = source.report(&scan_fresh(dir.path()));
        assert_eq!(fixed.len(), 1, "{fixed:?}");
        assert!(fixed[0].contains("resolved"));
        assert!(problems.snapshot().is_empty());
    }

    #[test]
    fn two_files_same_pod_first_by_name_wins() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10-web.yaml", &manifest("web", "nginx:1"));
        write(dir.path(), "20-web.yaml", &manifest("web", "nginx:2"));
        let outcome = scan_fresh(dir.path());
        assert_eq!(outcome.pods.len(), 1);
        let image = outcome.pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .clone();
        assert_eq!(image.as_deref(), Some("nginx:1"));
        let later = dir.path().join("20-web.yaml").display().to_string();
        assert!(
            outcome.errors[&later].contains("already defined"),
            "{outcome:?}"
        );
    }

    #[test]
    fn directory_scan_rules() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "web.json",
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"json"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#,
        );
        fs::write(dir.path().join(".swp"), "garbage").unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/inner.yaml"), manifest("inner", "x")).unwrap();
        let outcome = scan_fresh(dir.path());
        let names: Vec<_> = outcome
            .pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["json-node-1"]);
        assert!(outcome.errors.is_empty(), "{outcome:?}");

        // A single file as the path.
        let one = scan_fresh(&dir.path().join("web.json"));
        assert_eq!(one.pods.len(), 1);
    }

    #[test]
    fn missing_path_warns_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-yet");
        let problems = SourceProblems::default();
        let mut source = FileSource::new(
            missing.clone(),
            NODE.into(),
            Default::default(),
            Duration::from_secs(1),
            problems.clone(),
        );
        let outcome = scan_fresh(&missing);
        assert!(outcome.missing && outcome.pods.is_empty());
        assert_eq!(source.report(&outcome).len(), 1);
        assert!(
            source
                .report(&scan(
                    &missing,
                    NODE,
                    &NodeSecurity::default(),
                    SystemTime::now(),
                    &ScanOutcome::default()
                ))
                .is_empty()
        );
        assert_eq!(problems.snapshot().len(), 1);
        fs::create_dir(&missing).unwrap();
        assert_eq!(
            source
                .report(&scan(
                    &missing,
                    NODE,
                    &NodeSecurity::default(),
                    SystemTime::now(),
                    &ScanOutcome::default()
                ))
                .len(),
            1
        );
        assert!(problems.snapshot().is_empty());
    }

    #[tokio::test]
    async fn missing_directory_then_created_is_picked_up_by_polling() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifests");
        let cancel = CancellationToken::new();
        let (mut rx, ready, _problems) = spawn_sources(
            config(&path, Duration::from_millis(100)),
            &tokio_util::task::TaskTracker::new(),
            cancel.clone(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.all_ready() {
            assert!(Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fs::create_dir(&path).unwrap();
        write(&path, "web.yaml", &manifest("web", "nginx:1"));
        assert_eq!(describe(&next(&mut rx).await), ["add web-node-1"]);
        cancel.cancel();
    }

    fn names_and_uids(outcome: &ScanOutcome) -> Vec<(String, String)> {
        outcome
            .pods
            .iter()
            .map(|p| (p.metadata.name.clone().unwrap(), uid(p)))
            .collect()
    }

    /// A manifest that is half-written, invalid or unreadable keeps the pods it had; a
    /// deleted one loses them.
    #[test]
    fn a_file_that_fails_keeps_its_last_good_pods() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.yaml", &manifest("a", "nginx:1"));
        write(dir.path(), "b.yaml", &manifest("b", "nginx:1"));
        let good = scan_fresh(dir.path());
        assert_eq!(good.pods.len(), 2);
        let before = names_and_uids(&good);

        let full = manifest("b", "nginx:2");
        let broken: &[(&str, String)] = &[
            ("half-written", full[..full.len() - 12].to_string()),
            (
                "cut inside a token",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: b".to_string(),
            ),
            ("empty", String::new()),
            ("invalid", full.replace("name: c", "name: C_")),
        ];
        for (what, text) in broken {
            fs::write(dir.path().join("b.yaml"), text).unwrap();
            let again = scan_again(dir.path(), &good);
            assert_eq!(names_and_uids(&again), before, "{what}");
            let key = dir.path().join("b.yaml").display().to_string();
            assert!(again.errors.contains_key(&key), "{what}: {again:?}");
            assert_eq!(
                again.kept,
                BTreeSet::from([dir.path().join("b.yaml")]),
                "{what}"
            );
            // Kept again on the scan after (the base is the kept state).
            let third = scan_again(dir.path(), &again);
            assert_eq!(
                names_and_uids(&third),
                before,
                "{what}, second failing scan"
            );
        }

        // Unreadable even for root: a symlink loop.
        fs::remove_file(dir.path().join("b.yaml")).unwrap();
        std::os::unix::fs::symlink("b.yaml", dir.path().join("b.yaml")).unwrap();
        let looped = scan_again(dir.path(), &good);
        assert_eq!(names_and_uids(&looped), before);

        // Gone for good (ENOENT, also as a dangling link): a deletion.
        fs::remove_file(dir.path().join("b.yaml")).unwrap();
        std::os::unix::fs::symlink("nowhere.yaml", dir.path().join("b.yaml")).unwrap();
        let gone = scan_again(dir.path(), &looped);
        assert_eq!(names_and_uids(&gone), before[..1]);
        assert!(gone.errors.is_empty() && gone.kept.is_empty(), "{gone:?}");

        // A file that never read well has nothing to keep.
        write(
            dir.path(),
            "c.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: c",
        );
        let fresh = scan_again(dir.path(), &gone);
        assert_eq!(names_and_uids(&fresh), before[..1]);
        assert!(fresh.kept.is_empty());
    }

    /// A `staticPodPath` that cannot be listed (a link loop, or something that is neither a
    /// file nor a directory) keeps every pod and every known problem.
    #[test]
    fn a_directory_that_cannot_be_listed_keeps_everything() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("manifests");
        fs::create_dir(&dir).unwrap();
        write(&dir, "a.yaml", &manifest("a", "nginx:1"));
        write(&dir, "b.yaml", &manifest("b", "nginx:1"));
        write(&dir, "bad.yaml", "kind: Pod\n");
        let good = scan_fresh(&dir);
        assert_eq!(good.pods.len(), 2);
        assert!(!good.inconclusive);
        let before = names_and_uids(&good);

        fs::rename(&dir, top.path().join("away")).unwrap();
        std::os::unix::fs::symlink("manifests", &dir).unwrap();
        let looped = scan_again(&dir, &good);
        assert_eq!(names_and_uids(&looped), before);
        assert!(looped.inconclusive);
        let key = dir.display().to_string();
        assert!(looped.errors[&key].contains("cannot read"), "{looped:?}");
        assert!(
            looped
                .errors
                .contains_key(&dir.join("bad.yaml").display().to_string()),
            "the per-file problem is still known: {looped:?}"
        );
        fs::remove_file(&dir).unwrap();

        // A socket where the directory was.
        let _socket = std::os::unix::net::UnixListener::bind(&dir).unwrap();
        let odd = scan_again(&dir, &looped);
        assert_eq!(names_and_uids(&odd), before);
        assert!(odd.errors[&key].contains("neither"), "{odd:?}");
        fs::remove_file(&dir).unwrap();

        // Gone: the pods go (as upstream).
        let missing = scan_again(&dir, &odd);
        assert!(missing.missing && missing.pods.is_empty());
    }

    /// A single-file `staticPodPath` that stops parsing keeps its pod.
    #[test]
    fn a_single_file_path_that_fails_keeps_its_pod() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        write(dir.path(), "web.yaml", &manifest("web", "nginx:1"));
        let good = scan_fresh(&file);
        assert_eq!(good.pods.len(), 1);
        fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata:\n  na").unwrap();
        let broken = scan_again(&file, &good);
        assert_eq!(names_and_uids(&broken), names_and_uids(&good));
        assert!(broken.inconclusive);
        fs::remove_file(&file).unwrap();
        assert!(
            scan(
                &file,
                NODE,
                &NodeSecurity::default(),
                SystemTime::now(),
                &broken
            )
            .pods
            .is_empty()
        );
    }

    /// Until one scan was conclusive, an inconclusive one is not sent: the source is not
    /// ready, so housekeeping does not take the pods of an earlier run for orphans.
    #[tokio::test]
    async fn inconclusive_first_scan_is_not_sent() {
        let top = tempfile::tempdir().unwrap();
        let path = top.path().join("manifests");
        std::os::unix::fs::symlink("manifests", &path).unwrap();
        let mut source = FileSource::new(
            path.clone(),
            NODE.into(),
            Default::default(),
            Duration::from_secs(60),
            SourceProblems::default(),
        );
        let (tx, mut rx) = mpsc::channel(16);
        assert!(source.rescan(&tx).await);
        assert!(
            rx.try_recv().is_err(),
            "an inconclusive first scan was sent"
        );

        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        write(&path, "a.yaml", &manifest("a", "nginx:1"));
        assert!(source.rescan(&tx).await);
        assert_eq!(rx.try_recv().unwrap().pods.len(), 1);

        // After that, an inconclusive scan is sent with the kept pods.
        fs::rename(&path, top.path().join("away")).unwrap();
        std::os::unix::fs::symlink("manifests", &path).unwrap();
        assert!(source.rescan(&tx).await);
        assert_eq!(rx.try_recv().unwrap().pods.len(), 1);
    }

    /// Through the running source and the merger: breaking a manifest changes nothing,
    /// fixing it updates, deleting it removes.
    #[tokio::test]
    async fn running_source_keeps_pods_of_a_broken_manifest() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "web.yaml", &manifest("web", "nginx:1"));
        let cancel = CancellationToken::new();
        let (mut rx, _ready, problems) = spawn_sources(
            config(dir.path(), Duration::from_secs(3600)),
            &tokio_util::task::TaskTracker::new(),
            cancel.clone(),
        );
        assert_eq!(describe(&next(&mut rx).await), ["add web-node-1"]);
        // Half-written in place (no rename), then a second file as a marker: its add proves the
        // scan that saw the broken file was merged, with no remove before it.
        fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {na",
        )
        .unwrap();
        write(dir.path(), "zz-marker.yaml", &manifest("marker", "nginx:1"));
        let key = dir.path().join("web.yaml").display().to_string();
        loop {
            let changes = next(&mut rx).await;
            assert!(
                !describe(&changes).iter().any(|c| c.starts_with("remove")),
                "{:?}",
                describe(&changes)
            );
            if describe(&changes).contains(&"add marker-node-1".to_string()) {
                break;
            }
        }
        assert!(
            problems.snapshot().contains_key(&key),
            "{:?}",
            problems.snapshot()
        );
        fs::remove_file(dir.path().join("web.yaml")).unwrap();
        assert_eq!(describe(&next(&mut rx).await), ["remove web-node-1"]);
        cancel.cancel();
    }
}
