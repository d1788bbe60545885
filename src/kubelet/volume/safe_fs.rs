//! File-system steps that never follow a symlink.
//!
//! Volumes hold files that containers control: a container sharing a volume can replace any
//! directory in it with a symlink at any moment. Checking a path and then using it by name is
//! therefore a race (the check sees a directory, the use follows a symlink to the host). Here
//! paths are opened one component at a time, each relative to the descriptor of its parent,
//! refusing symlinks (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or `openat` with
//! `O_NOFOLLOW` on kernels without `openat2`), and every later step (chmod, chown, bind mount)
//! works on the descriptor that was opened, never on the name again.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// A path could not be opened, created or changed without following a symlink.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SafeFsError {
    #[error("{path}: {errno}", path = path.display(), errno = errno.desc())]
    Sys { path: PathBuf, errno: Errno },
    #[error("{} is a symlink, which is not followed here", path.display())]
    Symlink { path: PathBuf },
    #[error("{} is not a directory", path.display())]
    NotDir { path: PathBuf },
    #[error("{}: {component:?} is not a plain path component", path.display())]
    Component { path: PathBuf, component: String },
    #[error("{} is outside {}", path.display(), base.display())]
    Outside { path: PathBuf, base: PathBuf },
}

impl SafeFsError {}

impl SafeFsError {
    /// The errno behind the error, if it came from a system call (the fake mounter's answers).
    #[cfg(test)]
    pub(crate) fn errno(&self) -> Option<Errno> {
        match self {
            SafeFsError::Sys { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn sys(path: &Path, errno: Errno) -> SafeFsError {
    SafeFsError::Sys {
        path: path.to_path_buf(),
        errno,
    }
}

/// Set once `openat2` answered ENOSYS (kernels before 5.6): from then on `openat` with
/// `O_NOFOLLOW` is used, which is as safe for a single component.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Opens the single component `name` below `dir` without following a symlink.
///
/// With `O_PATH | O_NOFOLLOW` a symlink is opened as itself rather than refused, so callers
/// check the type with [`fstat`] before trusting the result.
pub(crate) fn open_component(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: OFlag,
) -> Result<OwnedFd, Errno> {
    if name.is_empty() || name == "." || name == ".." || name.as_bytes().contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        match nix::fcntl::openat2(dir, name, how) {
            Err(Errno::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            other => return other,
        }
    }
    nix::fcntl::openat(dir, name, flags, Mode::empty())
}

/// `fstat` on a descriptor (an `O_PATH` one included).
pub(crate) fn fstat(fd: BorrowedFd<'_>, path: &Path) -> Result<FileStat, SafeFsError> {
    nix::sys::stat::fstat(fd).map_err(|e| sys(path, e))
}

/// The file type bits of a stat.
pub(crate) fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

pub(crate) fn is_dir(st: &FileStat) -> bool {
    kind(st) == SFlag::S_IFDIR
}

pub(crate) fn is_symlink(st: &FileStat) -> bool {
    kind(st) == SFlag::S_IFLNK
}

/// Opens an absolute path (normally already canonical) as a directory, refusing a symlink in
/// any component.
pub(crate) fn open_dir_abs(path: &Path) -> Result<OwnedFd, SafeFsError> {
    if !path.is_absolute() {
        return Err(SafeFsError::Component {
            path: path.to_path_buf(),
            component: path.to_string_lossy().into_owned(),
        });
    }
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| sys(Path::new("/"), e))?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let fd = open_beneath(root.as_fd(), Path::new("/"), rel, None)?;
    let st = fstat(fd.as_fd(), path)?;
    if !is_dir(&st) {
        return Err(SafeFsError::NotDir {
            path: path.to_path_buf(),
        });
    }
    Ok(fd)
}

/// Opens `rel` below the directory `base` (shown as `base_path` in errors) one component at a
/// time, never following a symlink and never leaving `base` (`..` and absolute paths are
/// refused). With `create_mode`, missing components are created as directories with exactly
/// that mode (chmod'ed through their descriptor, so the umask does not matter), as upstream's
/// safe mkdir does. The result is an `O_PATH` descriptor, or a directory opened for reading
/// when it was just created.
pub(crate) fn open_beneath(
    base: BorrowedFd<'_>,
    base_path: &Path,
    rel: &Path,
    create_mode: Option<u32>,
) -> Result<OwnedFd, SafeFsError> {
    let names = components(base_path, rel)?;
    let mut current: Option<OwnedFd> = None;
    let mut shown = base_path.to_path_buf();
    for (i, name) in names.iter().enumerate() {
        let parent = current.as_ref().map_or(base, |fd| fd.as_fd());
        shown.push(name);
        let last = i + 1 == names.len();
        let fd = match open_component(parent, name, OFlag::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create_mode.is_some() => {
                let mode = create_mode.unwrap_or(0o755);
                make_dir_at(parent, name, mode, &shown)?
            }
            Err(Errno::ELOOP) => return Err(SafeFsError::Symlink { path: shown }),
            Err(e) => return Err(sys(&shown, e)),
        };
        let st = fstat(fd.as_fd(), &shown)?;
        if is_symlink(&st) {
            return Err(SafeFsError::Symlink { path: shown });
        }
        if !last && !is_dir(&st) {
            return Err(SafeFsError::NotDir { path: shown });
        }
        current = Some(fd);
    }
    match current {
        Some(fd) => Ok(fd),
        // An empty `rel`: the base itself.
        None => base.try_clone_to_owned().map_err(|e| {
            sys(
                base_path,
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)),
            )
        }),
    }
}

/// Creates the directory `name` below `parent` (an existing one is fine) and returns it opened
/// for reading, with its mode set to `mode` when this call created it.
pub(crate) fn make_dir_at(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    mode: u32,
    shown: &Path,
) -> Result<OwnedFd, SafeFsError> {
    let created = match nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(mode)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(sys(shown, e)),
    };
    let fd = match open_component(parent, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(fd) => fd,
        // Either is what the kernel says for a symlink here; tell the two apart for the message.
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            let path = shown.to_path_buf();
            let link = nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| is_symlink(&st));
            return Err(if link {
                SafeFsError::Symlink { path }
            } else {
                SafeFsError::NotDir { path }
            });
        }
        Err(e) => return Err(sys(shown, e)),
    };
    if created {
        set_mode(fd.as_fd(), mode, shown)?;
    }
    Ok(fd)
}

/// The plain components of `rel`; `.` is skipped, anything else that is not a name is refused.
fn components<'a>(base_path: &Path, rel: &'a Path) -> Result<Vec<&'a OsStr>, SafeFsError> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            other => {
                return Err(SafeFsError::Component {
                    path: base_path.join(rel),
                    component: other.as_os_str().to_string_lossy().into_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// Sets the permission bits of the file a descriptor holds. A descriptor opened for reading
/// is changed with `fchmod`; an `O_PATH` one cannot be (`EBADF`), so its `/proc/self/fd/N`
/// link is changed instead: that link names the very inode the descriptor holds, so no path
/// is looked up again (glibc's `fchmodat(AT_SYMLINK_NOFOLLOW)` does the same). Never call this
/// on a descriptor of a symlink: callers check the type first.
pub(crate) fn set_mode(fd: BorrowedFd<'_>, mode: u32, shown: &Path) -> Result<(), SafeFsError> {
    let mode = Mode::from_bits_truncate(mode & 0o7777);
    match nix::sys::stat::fchmod(fd, mode) {
        Ok(()) => Ok(()),
        Err(Errno::EBADF) => {
            let link = proc_fd_path(fd);
            nix::sys::stat::fchmodat(
                nix::fcntl::AT_FDCWD,
                &link,
                mode,
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| sys(shown, e))
        }
        Err(e) => Err(sys(shown, e)),
    }
}

/// Changes the group of the file a descriptor holds (`O_PATH` ones included; a symlink's own
/// group when the descriptor is of a symlink).
pub(crate) fn set_group(fd: BorrowedFd<'_>, gid: u32, shown: &Path) -> Result<(), SafeFsError> {
    nix::unistd::fchownat(
        fd,
        "",
        None,
        Some(nix::unistd::Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| sys(shown, e))
}

/// `/proc/self/fd/N` for a descriptor: a source for a bind mount that cannot be redirected.
pub(crate) fn proc_fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The canonical form of `path`, which must lie within the canonical `base` (or be it).
pub(crate) fn canonical_within(path: &Path, base: &Path) -> Result<PathBuf, SafeFsError> {
    let real = path.canonicalize().map_err(|e| {
        sys(
            path,
            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EINVAL)),
        )
    })?;
    if real.starts_with(base) {
        Ok(real)
    } else {
        Err(SafeFsError::Outside {
            path: real,
            base: base.to_path_buf(),
        })
    }
}

/// What is at `path`, without following a final symlink: `None` when nothing is.
pub(crate) fn lstat(path: &Path) -> Result<Option<std::fs::Metadata>, SafeFsError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(sys(
            path,
            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn dir_fd(p: &Path) -> OwnedFd {
        open_dir_abs(&p.canonicalize().unwrap()).unwrap()
    }

    #[test]
    fn opens_plain_paths_and_refuses_symlinks_anywhere() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        std::fs::write(base.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink("a", base.join("link")).unwrap();
        std::os::unix::fs::symlink("b", base.join("a/inner")).unwrap();
        let fd = dir_fd(&base);

        let f = open_beneath(fd.as_fd(), &base, Path::new("a/b/f"), None).unwrap();
        let st = fstat(f.as_fd(), &base).unwrap();
        assert_eq!(
            st.st_ino,
            std::fs::metadata(base.join("a/b/f")).unwrap().ino()
        );
        for bad in ["link", "link/b", "a/inner", "a/inner/f"] {
            let err = open_beneath(fd.as_fd(), &base, Path::new(bad), None).unwrap_err();
            assert!(matches!(err, SafeFsError::Symlink { .. }), "{bad}: {err}");
        }
        for bad in ["../x", "a/../a", "/etc"] {
            let err = open_beneath(fd.as_fd(), &base, Path::new(bad), None).unwrap_err();
            assert!(matches!(err, SafeFsError::Component { .. }), "{bad}: {err}");
        }
        let err = open_beneath(fd.as_fd(), &base, Path::new("a/b/f/g"), None).unwrap_err();
        assert!(matches!(err, SafeFsError::NotDir { .. }), "{err}");
        // A symlink in the base's own path is refused too.
        assert!(matches!(
            open_dir_abs(&base.join("link")),
            Err(SafeFsError::Symlink { .. })
        ));
    }

    #[test]
    fn creates_missing_dirs_with_exact_mode_and_not_through_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), base.join("out")).unwrap();
        let fd = dir_fd(&base);

        open_beneath(fd.as_fd(), &base, Path::new("x/y/z"), Some(0o2775)).unwrap();
        for p in ["x", "x/y", "x/y/z"] {
            let mode = std::fs::metadata(base.join(p))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o2775, "{p}");
        }
        let err = open_beneath(fd.as_fd(), &base, Path::new("out/new"), Some(0o755)).unwrap_err();
        assert!(matches!(err, SafeFsError::Symlink { .. }), "{err}");
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[test]
    fn mode_and_group_through_descriptors() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::write(base.join("f"), b"x").unwrap();
        let fd = dir_fd(&base);
        let f = open_beneath(fd.as_fd(), &base, Path::new("f"), None).unwrap();
        // An O_PATH descriptor: fchmod alone would fail with EBADF.
        set_mode(f.as_fd(), 0o604, &base).unwrap();
        set_group(f.as_fd(), 4321, &base).unwrap();
        let meta = std::fs::metadata(base.join("f")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o604);
        assert_eq!(meta.gid(), 4321);
    }

    #[test]
    fn canonical_within_table() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("in")).unwrap();
        std::os::unix::fs::symlink("/", base.join("up")).unwrap();
        assert_eq!(
            canonical_within(&base.join("in"), &base).unwrap(),
            base.join("in")
        );
        assert!(matches!(
            canonical_within(&base.join("up"), &base),
            Err(SafeFsError::Outside { .. })
        ));
    }
}
