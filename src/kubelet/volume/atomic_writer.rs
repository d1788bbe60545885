//! Writes a set of files into a volume directory so that readers always see one complete
//! version, the way upstream's atomic writer lays them out:
//!
//! ```text
//! <dir>/..2024_05_01_12_00_00.123456   the files of one version
//! <dir>/..data -> ..2024_05_01_12_00_00.123456
//! <dir>/labels -> ..data/labels       one symlink per top-level name
//! ```
//!
//! A new version is written into a fresh timestamped directory, a `..data_tmp` symlink to it is
//! renamed over `..data` (the atomic step), then the top-level symlinks are added or removed
//! and every other version directory is deleted. Nothing is written when the content and modes
//! are unchanged.
//!
//! What the writer owns, and so may replace or remove, is only what it makes: a `..data` that
//! links to a `..<timestamp>` directory, `..<timestamp>` directories, and top-level links to
//! `..data/<name>`. Anything else where one of those should be is an error, never replaced
//! (the volume is then left as it is). A write that fails removes the version directory it
//! was writing, so a full disk costs no directories; version directories left by an earlier
//! agent (or a crash between the two steps) go with the next write.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const DATA_DIR_NAME: &str = "..data";
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::base::clock;
pub(crate) use crate::base::podspec::item_path::InvalidPath;
use crate::base::podspec::item_path::check_item_path;

use super::ownership::{self, FsGroup};
use super::safe_fs;

const NEW_DATA_DIR_NAME: &str = "..data_tmp";

/// One file's content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path (may contain `/`) → file.
pub(crate) type Payload = BTreeMap<String, FileProjection>;

/// Writing a volume's files failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error(transparent)]
    Path(#[from] InvalidPath),
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("cannot rename {} to {}: {source}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create a version directory in {}", .0.display())]
    NoVersionDir(PathBuf),
    /// `..data` is not the writer's link to one of its version directories.
    #[error("{} is {found}, not the volume writer's link to a version directory; not replaced", path.display())]
    ForeignDataLink { path: PathBuf, found: String },
    /// A top-level name is taken by something that is not the writer's link into `..data`.
    #[error("{} is {found}, not the volume writer's link to {DATA_DIR_NAME}/; not replaced", path.display())]
    ForeignLink { path: PathBuf, found: String },
    #[error(transparent)]
    Ownership(#[from] ownership::OwnershipError),
    #[error(transparent)]
    Fs(#[from] safe_fs::SafeFsError),
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError::Io {
        action,
        path,
        source,
    }
}

/// Checks a payload path (see [`check_item_path`]): relative, no `..` element, not starting
/// with `..` before or after cleaning, within length limits.
#[cfg(test)]
pub(crate) fn validate_path(path: &str) -> Result<(), InvalidPath> {
    check_item_path(path).map(|_| ())
}

/// True for a name the writer gives its version directories, `..YYYY_MM_DD_HH_MM_SS.<suffix>`
/// (upstream's layout: the suffix is random; Deckhand's is digits).
pub(crate) fn is_version_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("..") else {
        return false;
    };
    let Some((stamp, suffix)) = rest.split_once('.') else {
        return false;
    };
    let stamp_ok = stamp.len() == 19
        && stamp.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 | 10 | 13 | 16 => b == b'_',
            _ => b.is_ascii_digit(),
        });
    stamp_ok && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Writes `payload` into `target` (which must exist). Returns whether a new version was written.
///
/// With `fs_group`, the whole volume is given to that group (read-only masks) after the new
/// version is written and before it becomes visible, as upstream's writer calls its
/// `setPerms` hook.
pub(crate) fn write(
    target: &Path,
    payload: &Payload,
    fs_group: Option<FsGroup>,
) -> Result<bool, WriteError> {
    let mut clean: BTreeMap<PathBuf, &FileProjection> = BTreeMap::new();
    for (path, file) in payload {
        clean.insert(PathBuf::from(check_item_path(path)?), file);
    }
    let visible: BTreeSet<String> = clean
        .keys()
        .filter_map(|p| p.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();

    let old_version = current_version(target)?;
    let changed = match &old_version {
        None => true,
        Some(old) => differs(&target.join(old), &clean, fs_group.is_some()),
    };
    let current = if changed {
        let version = write_version(target, &clean, fs_group)?;
        if let Err(e) = swap_data_link(target, &version) {
            discard(&version);
            return Err(e);
        }
        version
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    } else {
        old_version
    };
    update_visible_links(target, &visible)?;
    remove_other_versions(target, current.as_deref())?;
    Ok(changed)
}

/// The version `..data` links to: `None` when there is no `..data` or its version directory
/// is gone. A `..data` that is not the writer's (not a link, or a link to anything but a
/// `..<timestamp>` name) is an error.
fn current_version(target: &Path) -> Result<Option<String>, WriteError> {
    let data_link = target.join(DATA_DIR_NAME);
    let foreign = |found: String| WriteError::ForeignDataLink {
        path: data_link.clone(),
        found,
    };
    let name = match std::fs::read_link(&data_link) {
        Ok(name) => name,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            return Err(foreign("not a symlink".into()));
        }
        Err(e) => return Err(io_error("read", &data_link)(e)),
    };
    let Some(name) = name.to_str().filter(|n| is_version_name(n)) else {
        return Err(foreign(format!("a link to {:?}", name)));
    };
    // Our link, to a version that is no longer there: written anew.
    let is_dir = safe_fs::lstat(&target.join(name))?.is_some_and(|m| m.is_dir());
    Ok(is_dir.then(|| name.to_string()))
}

/// Makes a version directory and writes the payload into it (and gives the volume to the
/// fsGroup). On any error the directory is removed again.
fn write_version(
    target: &Path,
    clean: &BTreeMap<PathBuf, &FileProjection>,
    fs_group: Option<FsGroup>,
) -> Result<PathBuf, WriteError> {
    let version = make_version_dir(target)?;
    let written = clean
        .iter()
        .try_for_each(|(path, file)| write_file(&version.join(path), file))
        .and_then(|()| match fs_group {
            Some(group) => ownership::apply(target, group, true)
                .map(|_| ())
                .map_err(WriteError::from),
            None => Ok(()),
        });
    match written {
        Ok(()) => Ok(version),
        Err(e) => {
            discard(&version);
            Err(e)
        }
    }
}

/// Points `..data` at `version`: a `..data_tmp` link renamed over it.
fn swap_data_link(target: &Path, version: &Path) -> Result<(), WriteError> {
    let data_link = target.join(DATA_DIR_NAME);
    let tmp_link = target.join(NEW_DATA_DIR_NAME);
    let _ = std::fs::remove_file(&tmp_link);
    let version_name = version.file_name().unwrap_or_default();
    std::os::unix::fs::symlink(version_name, &tmp_link).map_err(io_error("create", &tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(|source| {
        let _ = std::fs::remove_file(&tmp_link);
        WriteError::Rename {
            from: tmp_link.clone(),
            to: data_link.clone(),
            source,
        }
    })
}

/// Removes a version directory a failed write left (it is the writer's own, just made).
fn discard(version: &Path) {
    if let Err(e) = std::fs::remove_dir_all(version)
        && e.kind() != ErrorKind::NotFound
    {
        tracing::warn!(path = %version.display(), error = %e, "cannot remove the version directory of a failed write");
    }
}

/// The user-visible names: each a link to `..data/<name>`; added when missing, the writer's
/// links to names no longer in the payload removed. A name taken by anything else is an
/// error.
fn update_visible_links(target: &Path, visible: &BTreeSet<String>) -> Result<(), WriteError> {
    let ours = |name: &str| Path::new(DATA_DIR_NAME).join(name);
    for name in visible {
        let link = target.join(name);
        let want = ours(name);
        match std::fs::read_link(&link) {
            Ok(current) if current == want => {}
            Ok(current) => {
                return Err(WriteError::ForeignLink {
                    path: link,
                    found: format!("a link to {current:?}"),
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => symlink(&want, &link)?,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(WriteError::ForeignLink {
                    path: link,
                    found: "not a symlink".into(),
                });
            }
            Err(e) => return Err(io_error("read", &link)(e)),
        }
    }
    let entries = std::fs::read_dir(target).map_err(io_error("list", target))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || visible.contains(&name) {
            continue;
        }
        if std::fs::read_link(entry.path()).is_ok_and(|to| to == ours(&name)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Removes every version directory but `keep`: the one replaced, and any an earlier agent
/// left. Only real directories with the writer's names are touched (never through a link).
fn remove_other_versions(target: &Path, keep: Option<&str>) -> Result<(), WriteError> {
    let entries = std::fs::read_dir(target).map_err(io_error("list", target))?;
    let mut first_error = None;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if Some(name.as_str()) == keep || !is_version_name(&name) {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            first_error.get_or_insert_with(|| io_error("remove", &entry.path())(e));
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn symlink(to: &Path, at: &Path) -> Result<(), WriteError> {
    std::os::unix::fs::symlink(to, at).map_err(io_error("create", at))
}

/// Whether the version in `old` differs from the payload (a file's content or mode, or the set
/// of files).
fn differs(old: &Path, payload: &BTreeMap<PathBuf, &FileProjection>, grouped: bool) -> bool {
    let mut existing = BTreeSet::new();
    if list_files(old, Path::new(""), &mut existing).is_err() {
        return true;
    }
    if existing.len() != payload.len() || payload.keys().any(|p| !existing.contains(p)) {
        return true;
    }
    payload.iter().any(|(path, file)| {
        let full = old.join(path);
        // An fsGroup walk added the group read bits: expected, not a change.
        let want = if grouped {
            ownership::wanted_mode(file.mode, false, true)
        } else {
            file.mode & 0o7777
        };
        let same_mode =
            std::fs::symlink_metadata(&full).is_ok_and(|m| m.permissions().mode() & 0o7777 == want);
        !same_mode || std::fs::read(&full).map_or(true, |data| data != file.data)
    })
}

fn list_files(dir: &Path, rel: &Path, out: &mut BTreeSet<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let rel_path = rel.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            list_files(&entry.path(), &rel_path, out)?;
        } else {
            out.insert(rel_path);
        }
    }
    Ok(())
}

/// Creates `..<UTC time>.<number>`, mode 0755 (removed again if its mode cannot be set).
fn make_version_dir(target: &Path) -> Result<PathBuf, WriteError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = clock::timestamp();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S").to_string();
    for _ in 0..100 {
        let n = u64::from(now.subsec_nanosecond().unsigned_abs())
            .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed))
            .wrapping_add(u64::from(std::process::id()) << 32);
        let dir = target.join(format!("..{stamp}.{}", n % 10_000_000_000));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                // Through a descriptor opened without following symlinks, not by name.
                let moded = nix::fcntl::open(
                    &dir,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|source| WriteError::Open {
                    path: dir.clone(),
                    source,
                })
                .and_then(|fd| Ok(safe_fs::set_mode(fd.as_fd(), 0o755, &dir)?));
                if let Err(e) = moded {
                    discard(&dir);
                    return Err(e);
                }
                return Ok(dir);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("create", &dir)(e)),
        }
    }
    Err(WriteError::NoVersionDir(target.to_path_buf()))
}

fn write_file(path: &Path, file: &FileProjection) -> Result<(), WriteError> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io_error("create", parent))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(file.mode & 0o7777)
        .open(path)
        .map_err(io_error("create", path))?;
    f.write_all(&file.data).map_err(io_error("write", path))?;
    // The umask may have taken bits away.
    f.set_permissions(std::fs::Permissions::from_mode(file.mode & 0o7777))
        .map_err(io_error("chmod", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn version_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR_NAME)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_versions_and_swaps_data_link() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let first = payload(&[("labels", "a=\"1\"", 0o644), ("sub/name", "web", 0o600)]);
        assert!(write(dir, &first, None).unwrap());

        let data = std::fs::read_link(dir.join("..data")).unwrap();
        let data_name = data.to_string_lossy().into_owned();
        assert!(
            data_name.starts_with("..") && data_name.len() > "..2024_01_01_00_00_00.".len(),
            "{data_name}"
        );
        assert_eq!(version_dirs(dir), vec![data_name.clone()]);
        assert_eq!(
            std::fs::metadata(dir.join(&data_name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        assert_eq!(
            std::fs::read_link(dir.join("labels")).unwrap(),
            Path::new("..data/labels")
        );
        assert_eq!(
            std::fs::read_link(dir.join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("labels")).unwrap(),
            "a=\"1\""
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/name")).unwrap(),
            "web"
        );
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("labels"), 0o644);
        assert_eq!(mode("sub/name"), 0o600);

        // Same payload: nothing written, same version.
        assert!(!write(dir, &first, None).unwrap());
        assert_eq!(std::fs::read_link(dir.join("..data")).unwrap(), data);

        // A mode change alone is a change.
        let chmod = payload(&[("labels", "a=\"1\"", 0o400), ("sub/name", "web", 0o600)]);
        assert!(write(dir, &chmod, None).unwrap());
        assert_eq!(mode("labels"), 0o400);

        // New content and a removed file: new version, old one gone, stale link removed.
        let second = payload(&[("labels", "a=\"2\"", 0o644)]);
        assert!(write(dir, &second, None).unwrap());
        let new_data = std::fs::read_link(dir.join("..data")).unwrap();
        assert_ne!(new_data, data);
        assert_eq!(
            version_dirs(dir),
            vec![new_data.to_string_lossy().into_owned()]
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("labels")).unwrap(),
            "a=\"2\""
        );
        assert!(std::fs::symlink_metadata(dir.join("sub")).is_err());
        assert!(std::fs::symlink_metadata(dir.join("..data_tmp")).is_err());
    }

    fn data_link(dir: &Path) -> PathBuf {
        std::fs::read_link(dir.join(DATA_DIR_NAME)).unwrap()
    }

    #[test]
    fn a_foreign_data_link_is_an_error_and_never_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        let dir = tmp.path().join("vol");
        std::fs::create_dir_all(outside.join("keep")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink("../outside", dir.join("..data")).unwrap();
        let err = write(&dir, &payload(&[("f", "x", 0o644)]), None).unwrap_err();
        assert!(matches!(err, WriteError::ForeignDataLink { .. }), "{err}");
        assert_eq!(data_link(&dir), Path::new("../outside"), "not replaced");
        assert!(outside.join("keep").is_dir());
        assert!(version_dirs(&dir).is_empty(), "{:?}", version_dirs(&dir));
        assert!(std::fs::symlink_metadata(dir.join("f")).is_err());

        // Not a link at all: the same.
        let other = tmp.path().join("vol2");
        std::fs::create_dir_all(other.join("..data")).unwrap();
        let err = write(&other, &payload(&[("f", "x", 0o644)]), None).unwrap_err();
        assert!(err.to_string().contains("not a symlink"), "{err}");
        assert!(other.join("..data").is_dir());
        assert!(version_dirs(&other).is_empty());
    }

    #[test]
    fn a_foreign_visible_name_is_an_error_and_never_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::os::unix::fs::symlink("/etc", dir.join("f")).unwrap();
        std::fs::write(dir.join("g"), "mine").unwrap();
        assert!(write(dir, &payload(&[("f", "x", 0o644)]), None).is_err());
        assert_eq!(
            std::fs::read_link(dir.join("f")).unwrap(),
            Path::new("/etc")
        );
        assert!(write(dir, &payload(&[("g", "x", 0o644)]), None).is_err());
        assert_eq!(std::fs::read_to_string(dir.join("g")).unwrap(), "mine");
        // A link that is not ours is never removed as a stale name either.
        assert!(write(dir, &payload(&[("h", "x", 0o644)]), None).unwrap());
        assert_eq!(
            std::fs::read_link(dir.join("f")).unwrap(),
            Path::new("/etc")
        );
    }

    #[test]
    fn the_issues_path_is_refused_and_the_volume_stays_readable() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(write(dir, &payload(&[("a", "1", 0o644)]), None).unwrap());
        let before = data_link(dir);
        for bad in ["./..data/x", ".//..data", "./..2024_01_01_00_00_00.1/x"] {
            let err =
                write(dir, &payload(&[("a", "2", 0o644), (bad, "x", 0o644)]), None).unwrap_err();
            assert!(matches!(err, WriteError::Path(_)), "{bad}: {err}");
            assert_eq!(data_link(dir), before, "{bad}");
            assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
            assert_eq!(version_dirs(dir), [before.to_string_lossy()], "{bad}");
        }
    }

    #[test]
    fn a_failed_write_leaves_no_version_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // "a" as a file and as a directory: the second file cannot be written.
        let clash = payload(&[("a", "1", 0o644), ("a/b", "2", 0o644)]);
        for _ in 0..3 {
            assert!(write(dir, &clash, None).is_err());
        }
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "{left:?}");

        assert!(write(dir, &payload(&[("a", "1", 0o644)]), None).unwrap());
        let good = data_link(dir);
        for _ in 0..3 {
            assert!(write(dir, &clash, None).is_err());
        }
        assert_eq!(version_dirs(dir), [good.to_string_lossy()]);
        assert_eq!(data_link(dir), good);
        assert!(std::fs::symlink_metadata(dir.join("..data_tmp")).is_err());
    }

    #[test]
    fn versions_left_behind_are_removed_by_the_next_write() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p = payload(&[("a", "1", 0o644)]);
        assert!(write(dir, &p, None).unwrap());
        let leaked = dir.join("..2024_01_01_00_00_00.42");
        std::fs::create_dir_all(leaked.join("sub")).unwrap();
        std::fs::create_dir(dir.join("..keep")).unwrap();
        // Nothing to write, but the leak goes.
        assert!(!write(dir, &p, None).unwrap());
        assert!(!leaked.exists());
        assert!(dir.join("..keep").is_dir(), "not a name of the writer's");
        assert_eq!(version_dirs(dir).len(), 2, "{:?}", version_dirs(dir));
    }

    #[test]
    fn version_names_table() {
        for (name, want) in [
            ("..2024_05_01_12_00_00.123456", true),
            ("..2016_02_01_15_04_05.abc123XY", true),
            ("..2024_05_01_12_00_00.", false),
            ("..2024_05_01_12_00_00", false),
            ("..data", false),
            ("..data_tmp", false),
            ("2024_05_01_12_00_00.1", false),
            ("..2024-05-01_12_00_00.1", false),
            ("..2024_05_01_12_00_00.1/..", false),
            ("../outside", false),
        ] {
            assert_eq!(is_version_name(name), want, "{name}");
        }
    }

    /// A full disk: every write fails, and none leaves a directory. This needs a real tmpfs
    /// of 16 KiB (and so root): a fake mount fills nothing.
    #[test]
    fn a_full_disk_leaks_no_version_directory() {
        use crate::kubelet::volume::mounter::{KernelMounter, Mounter, require_root};
        use std::os::fd::AsFd;
        require_root("it fills a real 16 KiB tmpfs");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap().join("vol");
        std::fs::create_dir(&dir).unwrap();
        let fd = crate::kubelet::volume::safe_fs::open_dir_abs(&dir).unwrap();
        KernelMounter
            .mount_tmpfs(fd.as_fd(), &dir, Some(16 * 1024))
            .unwrap();
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = KernelMounter.unmount(self.0, true);
            }
        }
        let _unmount = Unmount(&dir);
        let small = payload(&[("a", "1", 0o644)]);
        assert!(write(&dir, &small, None).unwrap());
        let good = data_link(&dir);
        let big = "x".repeat(64 * 1024);
        let too_big = payload(&[("a", "1", 0o644), ("big", &big, 0o644)]);
        for _ in 0..50 {
            assert!(write(&dir, &too_big, None).is_err());
        }
        assert_eq!(version_dirs(&dir), [good.to_string_lossy()]);
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
    }

    #[test]
    fn rejects_bad_paths() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "..hidden", "a/.."] {
            assert!(
                write(tmp.path(), &payload(&[(bad, "x", 0o644)]), None).is_err(),
                "{bad:?}"
            );
        }
        assert!(validate_path(&"a".repeat(256)).is_err());
        assert!(validate_path("a/b.c/d").is_ok());
        assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
    }
}
