//! The file work of the GC and of log rotation: blocking calls, run on blocking threads.
//!
//! Paths come from the runtime (a container's log path) or are built from names that were
//! checked to be single path components; nothing here follows a link out of a log directory
//! (removals unlink the entry itself).

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::images::FsUsage;
use super::rotation::{COMPRESS_SUFFIX, TMP_SUFFIX};

/// A file operation of the GC failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct FileError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn file_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    move |source| FileError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The names of the entries of `dir` (empty when it does not exist).
pub fn dir_names(dir: &Path) -> Result<Vec<String>, FileError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(file_error("listing", dir)(err)),
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}

/// Removes one file; one that is already gone is fine.
pub fn remove_file(path: &Path) -> Result<(), FileError> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(file_error("removing", path)(err)),
        _ => Ok(()),
    }
}

/// Removes a container's log file and its rotations (`<log>.*`), as upstream's log manager
/// does when its container is removed. Returns how many files went.
pub fn remove_container_logs(log_path: &Path) -> Result<usize, FileError> {
    let (Some(dir), Some(name)) = (
        log_path.parent(),
        log_path.file_name().and_then(|n| n.to_str()),
    ) else {
        return Ok(0);
    };
    let prefix = format!("{name}.");
    let mut removed = 0;
    for entry in dir_names(dir)? {
        if entry == name || entry.starts_with(&prefix) {
            remove_file(&dir.join(&entry))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Compresses `dir/name` to `dir/name.gz` through `name.tmp` (renamed only once complete, so
/// a reader never sees half a `.gz`), then removes the original.
pub fn compress(dir: &Path, name: &str) -> Result<(), FileError> {
    let source = dir.join(name);
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let target = dir.join(format!("{name}{COMPRESS_SUFFIX}"));
    let result = (|| {
        let mut input = fs::File::open(&source).map_err(file_error("opening", &source))?;
        let output = fs::File::create(&tmp).map_err(file_error("creating", &tmp))?;
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        io::copy(&mut input, &mut encoder).map_err(file_error("compressing", &source))?;
        let mut output = encoder
            .finish()
            .map_err(file_error("compressing", &source))?;
        output.flush().map_err(file_error("writing", &tmp))?;
        fs::rename(&tmp, &target).map_err(file_error("renaming", &tmp))?;
        remove_file(&source)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Size and free space of the filesystem holding `path` (statvfs, as `df` shows them: free
/// space is what unprivileged users may still use).
pub fn fs_usage(path: &Path) -> Result<FsUsage, FileError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|errno| FileError {
        what: "measuring the filesystem of",
        path: path.to_path_buf(),
        source: io::Error::from(errno),
    })?;
    let frsize = st.fragment_size() as u64;
    Ok(FsUsage {
        capacity: (st.blocks() as u64).saturating_mul(frsize),
        available: (st.blocks_available() as u64).saturating_mul(frsize),
    })
}

/// Removes the log files in a pod's log directory that belong to no container instance the
/// runtime still has: `<container>/<attempt>.log` and its rotations, when
/// `(container, attempt)` is not in `live` and the file was last written before `listed`
/// (the time the runtime was listed, so a container created since is never mistaken for
/// gone). The executor removes replaced instances without their logs; this catches those.
pub fn sweep_stale_logs(
    pod_log_dir: &Path,
    live: &HashSet<(String, u32)>,
    listed: SystemTime,
) -> Result<Vec<PathBuf>, FileError> {
    let mut removed = Vec::new();
    for container in dir_names(pod_log_dir)? {
        let dir = pod_log_dir.join(&container);
        // Only plain directories: a link here is not ours to follow.
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            _ => continue,
        }
        for name in dir_names(&dir)? {
            let Some(attempt) = name
                .split_once(".log")
                .and_then(|(n, _)| n.parse::<u32>().ok())
            else {
                continue;
            };
            if live.contains(&(container.clone(), attempt)) {
                continue;
            }
            let path = dir.join(&name);
            let modified = fs::symlink_metadata(&path).and_then(|m| m.modified());
            if matches!(modified, Ok(t) if t < listed) {
                remove_file(&path)?;
                removed.push(path);
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("deckhand-gc-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn compress_round_trips_and_removes_the_original() {
        let dir = tempdir("compress");
        let text = "2026-12-01T15:30:00Z stdout F hello\n".repeat(100);
        fs::write(dir.join("0.log.20261201-153000"), &text).unwrap();
        compress(&dir, "0.log.20261201-153000").unwrap();
        let mut names = dir_names(&dir).unwrap();
        names.sort();
        assert_eq!(names, vec!["0.log.20261201-153000.gz"]);
        let mut out = String::new();
        flate2::read::GzDecoder::new(fs::File::open(dir.join(&names[0])).unwrap())
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, text);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn container_logs_and_stale_logs_go() {
        let dir = tempdir("sweep");
        let app = dir.join("app");
        fs::create_dir_all(&app).unwrap();
        for name in [
            "0.log",
            "0.log.20261201-153000.gz",
            "1.log",
            "2.log",
            "10.log",
            "notes",
        ] {
            fs::write(app.join(name), "x").unwrap();
        }
        assert_eq!(remove_container_logs(&app.join("0.log")).unwrap(), 2);
        let live: HashSet<(String, u32)> = [("app".to_string(), 2)].into_iter().collect();
        // Files written after the listing stay.
        let before = SystemTime::now() - Duration::from_secs(60);
        assert!(sweep_stale_logs(&dir, &live, before).unwrap().is_empty());
        let after = SystemTime::now() + Duration::from_secs(1);
        let mut gone: Vec<String> = sweep_stale_logs(&dir, &live, after)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        gone.sort();
        assert_eq!(gone, vec!["1.log", "10.log"]);
        let mut left = dir_names(&app).unwrap();
        left.sort();
        assert_eq!(left, vec!["2.log", "notes"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
