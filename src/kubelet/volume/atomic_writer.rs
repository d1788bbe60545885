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
//! and the old version is deleted. Nothing is written when the content and modes are unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub const DATA_DIR_NAME: &str = "..data";
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::ownership::{self, FsGroup};
use super::safe_fs;

const NEW_DATA_DIR_NAME: &str = "..data_tmp";
const MAX_PATH_LEN: usize = 4096;
const MAX_NAME_LEN: usize = 255;

/// One file's content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path (may contain `/`) → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// A payload path that may not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    #[error("invalid path: must not be empty")]
    Empty,
    #[error("invalid path: must be less than or equal to {MAX_PATH_LEN} characters")]
    TooLong,
    #[error("invalid path: must be relative path: {0}")]
    Absolute(String),
    #[error("invalid path: must not contain path items longer than {MAX_NAME_LEN} characters")]
    ItemTooLong,
    #[error("invalid path: must not contain '..': {0}")]
    DotDot(String),
    #[error("invalid path: must not start with '..': {0}")]
    LeadingDots(String),
    #[error("invalid path: {0}")]
    NoName(String),
}

/// Writing a volume's files failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
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

/// Checks a payload path: relative, no `..` element, not starting with `..`, within length
/// limits.
pub fn validate_path(path: &str) -> Result<(), InvalidPath> {
    if path.is_empty() {
        return Err(InvalidPath::Empty);
    }
    if path.len() > MAX_PATH_LEN {
        return Err(InvalidPath::TooLong);
    }
    if Path::new(path).is_absolute() {
        return Err(InvalidPath::Absolute(path.to_string()));
    }
    for item in path.split('/') {
        if item.len() > MAX_NAME_LEN {
            return Err(InvalidPath::ItemTooLong);
        }
        if item == ".." {
            return Err(InvalidPath::DotDot(path.to_string()));
        }
    }
    if path.starts_with("..") {
        return Err(InvalidPath::LeadingDots(path.to_string()));
    }
    Ok(())
}

/// Writes `payload` into `target` (which must exist). Returns whether a new version was written.
///
/// With `fs_group`, the whole volume is given to that group (read-only masks) after the new
/// version is written and before it becomes visible, as upstream's writer calls its
/// `setPerms` hook.
pub fn write(
    target: &Path,
    payload: &Payload,
    fs_group: Option<FsGroup>,
) -> Result<bool, WriteError> {
    let mut clean: BTreeMap<PathBuf, &FileProjection> = BTreeMap::new();
    for (path, file) in payload {
        validate_path(path)?;
        let normal: PathBuf = Path::new(path)
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        if normal.as_os_str().is_empty() {
            return Err(InvalidPath::NoName(path.to_string()).into());
        }
        clean.insert(normal, file);
    }
    let visible: BTreeSet<String> = clean
        .keys()
        .filter_map(|p| p.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();

    let data_link = target.join(DATA_DIR_NAME);
    let old_version = match std::fs::read_link(&data_link) {
        // Only a version directory of ours (`..<stamp>`, one component) is ever compared with
        // or removed later; a link that points anywhere else is treated as no version.
        Ok(name)
            if name.to_str().is_some_and(|n| {
                n.starts_with("..") && super::check_component("version", n).is_ok()
            }) =>
        {
            Some(target.join(name))
        }
        Ok(name) => {
            tracing::warn!(link = %data_link.display(), target = %name.display(), "ignoring a ..data link that is not ours");
            None
        }
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("read", &data_link)(e)),
    };

    let changed = match &old_version {
        None => true,
        Some(old) => differs(old, &clean, fs_group.is_some()),
    };
    if changed {
        let version = make_version_dir(target)?;
        for (path, file) in &clean {
            write_file(&version.join(path), file)?;
        }
        if let Some(group) = fs_group {
            ownership::apply(target, group, true)?;
        }
        let tmp_link = target.join(NEW_DATA_DIR_NAME);
        let _ = std::fs::remove_file(&tmp_link);
        let version_name = version.file_name().expect("a version directory has a name");
        std::os::unix::fs::symlink(version_name, &tmp_link)
            .map_err(io_error("create", &tmp_link))?;
        std::fs::rename(&tmp_link, &data_link).map_err(|source| WriteError::Rename {
            from: tmp_link.clone(),
            to: data_link.clone(),
            source,
        })?;
    }

    // The user-visible names: add what is missing, remove what is no longer in the payload.
    for name in &visible {
        let link = target.join(name);
        let want = Path::new(DATA_DIR_NAME).join(name);
        match std::fs::read_link(&link) {
            Ok(current) if current == want => {}
            Ok(_) => {
                let _ = std::fs::remove_file(&link);
                symlink(&want, &link)?;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => symlink(&want, &link)?,
            Err(e) => return Err(io_error("read", &link)(e)),
        }
    }
    let entries = std::fs::read_dir(target).map_err(io_error("list", target))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || visible.contains(&name) {
            continue;
        }
        // Only our own symlinks are removed; anything else was not put there by us.
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }

    if changed && let Some(old) = old_version {
        std::fs::remove_dir_all(&old).map_err(io_error("remove", &old))?;
    }
    Ok(changed)
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

/// Creates `..<UTC time>.<number>`, mode 0755.
fn make_version_dir(target: &Path) -> Result<PathBuf, WriteError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = jiff::Timestamp::now();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S").to_string();
    for _ in 0..100 {
        let n = u64::from(now.subsec_nanosecond().unsigned_abs())
            .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed))
            .wrapping_add(u64::from(std::process::id()) << 32);
        let dir = target.join(format!("..{stamp}.{}", n % 10_000_000_000));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                // Through a descriptor opened without following symlinks, not by name.
                let fd = nix::fcntl::open(
                    &dir,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|source| WriteError::Open {
                    path: dir.clone(),
                    source,
                })?;
                safe_fs::set_mode(fd.as_fd(), 0o755, &dir)?;
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

    #[test]
    fn a_foreign_data_link_is_never_removed_through() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        let dir = tmp.path().join("vol");
        std::fs::create_dir_all(outside.join("keep")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink("../outside", dir.join("..data")).unwrap();
        assert!(write(&dir, &payload(&[("f", "x", 0o644)]), None).unwrap());
        assert!(outside.join("keep").is_dir());
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "x");
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
