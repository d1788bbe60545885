//! The file source: static-pod manifests in `staticPodPath` (a directory, read
//! non-recursively, or a single file). Reacts to inotify events within a short coalescing
//! window and rescans fully every `fileCheckFrequency`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::ManifestOrigin;
use super::manifest::MAX_MANIFEST_BYTES;
use super::{SOURCE_FILE, SourceProblems, SourceSnapshot, full_name, load_static_pods};

/// Quiet time after the last inotify event before rescanning: editors write a file in
/// several steps, and one rescan should see the end result.
const COALESCE_QUIET: Duration = Duration::from_millis(10);
/// Longest a stream of events can postpone a rescan.
const COALESCE_MAX: Duration = Duration::from_millis(500);

/// What one scan of `staticPodPath` found.
#[derive(Debug, Default)]
pub struct ScanOutcome {
    /// Pods to run, in file-name order; at most one per `namespace/name`.
    pub pods: Vec<Pod>,
    /// File path (or `staticPodPath` itself) → why it yielded no pods.
    pub errors: BTreeMap<String, String>,
    /// File path → unknown fields in it.
    pub unknown_fields: BTreeMap<String, Vec<String>>,
    /// `staticPodPath` does not exist (yet).
    pub missing: bool,
}

/// Hidden files (editor swap files, `..data` symlinks) are skipped, as upstream does.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

fn read_manifest(path: &Path) -> Result<Vec<u8>, String> {
    let file = fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "{}: manifest is larger than the {MAX_MANIFEST_BYTES}-byte limit",
            path.display()
        ));
    }
    Ok(bytes)
}

/// List the manifest files under `path`: the file itself, or the regular, non-hidden files
/// directly in the directory, sorted by name.
fn manifest_files(path: &Path, outcome: &mut ScanOutcome) -> Vec<PathBuf> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            outcome.missing = true;
            return Vec::new();
        }
        Err(e) => {
            outcome.errors.insert(
                path.display().to_string(),
                format!("{}: cannot read: {e}", path.display()),
            );
            return Vec::new();
        }
    };
    if meta.is_file() {
        return vec![path.to_path_buf()];
    }
    if !meta.is_dir() {
        outcome.errors.insert(
            path.display().to_string(),
            format!("{}: neither a regular file nor a directory", path.display()),
        );
        return Vec::new();
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            outcome.errors.insert(
                path.display().to_string(),
                format!("{}: cannot list directory: {e}", path.display()),
            );
            return Vec::new();
        }
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let file = entry.path();
        // Follow symlinks: a link to a regular file is a manifest.
        match fs::metadata(&file) {
            Ok(meta) if meta.is_file() => files.push(file),
            Ok(meta) if meta.is_dir() => {
                tracing::debug!(path = %file.display(), "not recursing into manifest subdirectory");
            }
            Ok(_) => tracing::debug!(path = %file.display(), "skipping non-regular manifest entry"),
            // Vanished between listing and stat, or a dangling link.
            Err(_) => {}
        }
    }
    files.sort();
    files
}

/// Read every manifest under `path` and turn it into pods. Pure apart from reading files.
pub fn scan(path: &Path, node_name: &str, seen: SystemTime) -> ScanOutcome {
    let mut outcome = ScanOutcome::default();
    let files = manifest_files(path, &mut outcome);
    let mut owners: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        let bytes = match read_manifest(&file) {
            Ok(bytes) => bytes,
            Err(e) => {
                outcome.errors.insert(file.display().to_string(), e);
                continue;
            }
        };
        let loaded = match load_static_pods(&bytes, ManifestOrigin::File(&file), node_name, seen) {
            Ok(loaded) => loaded,
            Err(e) => {
                outcome
                    .errors
                    .insert(file.display().to_string(), e.to_string());
                continue;
            }
        };
        if !loaded.unknown_fields.is_empty() {
            outcome
                .unknown_fields
                .insert(file.display().to_string(), loaded.unknown_fields);
        }
        for pod in loaded.pods {
            let name = full_name(&pod);
            if let Some(first) = owners.get(&name) {
                outcome.errors.insert(
                    file.display().to_string(),
                    format!(
                        "{}: pod {name} is already defined by {}; ignoring this file",
                        file.display(),
                        first.display()
                    ),
                );
                continue;
            }
            owners.insert(name, file.clone());
            outcome.pods.push(pod);
        }
    }
    outcome
}

/// The file source's state between scans.
pub struct FileSource {
    path: PathBuf,
    node_name: String,
    period: Duration,
    problems: SourceProblems,
    owned_problems: BTreeSet<String>,
    logged_errors: BTreeMap<String, String>,
    logged_unknown: BTreeMap<String, Vec<String>>,
    missing_logged: bool,
}

impl FileSource {
    pub fn new(
        path: PathBuf,
        node_name: String,
        period: Duration,
        problems: SourceProblems,
    ) -> Self {
        FileSource {
            path,
            node_name,
            period: period.max(Duration::from_millis(100)),
            problems,
            owned_problems: BTreeSet::new(),
            logged_errors: BTreeMap::new(),
            logged_unknown: BTreeMap::new(),
            missing_logged: false,
        }
    }

    /// Log what is new in `outcome` (each distinct problem once), update the shared problem
    /// list, and return the lines logged (for tests).
    pub fn report(&mut self, outcome: &ScanOutcome) -> Vec<String> {
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
        self.problems.replace(&mut self.owned_problems, &current);
        logged
    }

    async fn rescan(&mut self, tx: &mpsc::UnboundedSender<SourceSnapshot>) -> bool {
        let path = self.path.clone();
        let node = self.node_name.clone();
        let seen = SystemTime::now();
        let outcome = match tokio::task::spawn_blocking(move || scan(&path, &node, seen)).await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(error = %e, "static pod scan failed");
                return true;
            }
        };
        self.report(&outcome);
        tx.send(SourceSnapshot {
            source: SOURCE_FILE,
            pods: outcome.pods,
        })
        .is_ok()
    }

    /// Scan, then rescan on inotify events (coalesced) and every period, until cancelled.
    pub(crate) async fn run(
        mut self,
        tx: mpsc::UnboundedSender<SourceSnapshot>,
        cancel: CancellationToken,
    ) {
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
            let burst_end = tokio::time::Instant::now() + COALESCE_MAX;
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
    use crate::source::{PodChange, SourceConfig, spawn_sources};
    use std::time::Instant;

    const NODE: &str = "node-1";

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    /// Write atomically (temp file + rename), as careful tools do.
    fn write(dir: &Path, file: &str, text: &str) {
        let tmp = dir.join(format!(".{file}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, dir.join(file)).unwrap();
    }

    use crate::source::describe_changes as describe;

    async fn next(rx: &mut mpsc::UnboundedReceiver<Vec<PodChange>>) -> Vec<PodChange> {
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
            Duration::from_secs(60),
            problems.clone(),
        );
        let first = scan(dir.path(), NODE, SystemTime::now());
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
            let again = scan(dir.path(), NODE, SystemTime::now());
            assert!(source.report(&again).is_empty());
        }

        // A different error in the same file is logged; then the fix is logged once.
        write(dir.path(), "bad.yaml", "apiVersion: v2\nkind: Pod\n");
        let changed = source.report(&scan(dir.path(), NODE, SystemTime::now()));
        assert_eq!(changed.len(), 1, "{changed:?}");
        write(dir.path(), "bad.yaml", &manifest("bad", "x"));
        let fixed = source.report(&scan(dir.path(), NODE, SystemTime::now()));
        assert_eq!(fixed.len(), 1, "{fixed:?}");
        assert!(fixed[0].contains("resolved"));
        assert!(problems.snapshot().is_empty());
    }

    #[test]
    fn two_files_same_pod_first_by_name_wins() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "10-web.yaml", &manifest("web", "nginx:1"));
        write(dir.path(), "20-web.yaml", &manifest("web", "nginx:2"));
        let outcome = scan(dir.path(), NODE, SystemTime::now());
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
        let outcome = scan(dir.path(), NODE, SystemTime::now());
        let names: Vec<_> = outcome
            .pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["json-node-1"]);
        assert!(outcome.errors.is_empty(), "{outcome:?}");

        // A single file as the path.
        let one = scan(&dir.path().join("web.json"), NODE, SystemTime::now());
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
            Duration::from_secs(1),
            problems.clone(),
        );
        let outcome = scan(&missing, NODE, SystemTime::now());
        assert!(outcome.missing && outcome.pods.is_empty());
        assert_eq!(source.report(&outcome).len(), 1);
        assert!(
            source
                .report(&scan(&missing, NODE, SystemTime::now()))
                .is_empty()
        );
        assert_eq!(problems.snapshot().len(), 1);
        fs::create_dir(&missing).unwrap();
        assert_eq!(
            source
                .report(&scan(&missing, NODE, SystemTime::now()))
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
        let (mut rx, ready, _problems) =
            spawn_sources(config(&path, Duration::from_millis(100)), cancel.clone());
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
}
