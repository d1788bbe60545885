//! `fsGroup`: a volume's files are given to the pod's supplementary group, as upstream's
//! volume ownership does for emptyDir, downwardAPI and projected volumes (never hostPath).
//!
//! Every entry gets group `fsGroup` (a symlink its own group, never its target's); every entry
//! but a symlink gets the group read/write bits (read only for read-only volumes), and every
//! directory also the group search bit and setgid, so that files created later inherit the
//! group. With `fsGroupChangePolicy: OnRootMismatch` nothing is done when the volume's root
//! already has that group and those bits.
//!
//! The walk is done with descriptors: directories are opened with `O_NOFOLLOW` relative to their
//! parent, other entries with `O_PATH | O_NOFOLLOW`, and chown/chmod go through those
//! descriptors, so a container that swaps a file for a symlink mid-walk changes nothing outside
//! its volume.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::FileStat;

use super::safe_fs::{self, SafeFsError};

/// Group bits for a writable volume.
const RW_MASK: u32 = 0o660;
/// Group bits for a read-only volume (downwardAPI, projected).
const RO_MASK: u32 = 0o440;
/// Search bits added to directories.
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;
/// Directories deeper than this are left alone (each level holds a descriptor open).
const MAX_DEPTH: usize = 256;

/// `fsGroupChangePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangePolicy {
    /// Always walk the whole volume (upstream's default).
    Always,
    /// Skip the walk when the volume's root already matches.
    OnRootMismatch,
}

/// The pod's `fsGroup` and how to apply it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FsGroup {
    pub gid: u32,
    pub policy: ChangePolicy,
}

/// The pod's `fsGroup` settings could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FsGroupError {
    #[error("invalid securityContext.fsGroup {0}: must be between 0 and 4294967294")]
    Gid(i64),
    #[error(
        "invalid securityContext.fsGroupChangePolicy {0:?}: must be \"OnRootMismatch\" or \"Always\""
    )]
    Policy(String),
}

/// A walk failed to start (errors on single entries are logged and skipped, as upstream).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnershipError {
    #[error(transparent)]
    Fs(#[from] SafeFsError),
}

impl FsGroup {
    /// The pod's `securityContext.fsGroup` and `fsGroupChangePolicy`, if an fsGroup is set.
    pub(crate) fn from_pod(pod: &Pod) -> Result<Option<FsGroup>, FsGroupError> {
        let Some(sc) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) else {
            return Ok(None);
        };
        let Some(gid) = sc.fs_group else {
            return Ok(None);
        };
        let gid = u32::try_from(gid)
            .ok()
            .filter(|g| *g != u32::MAX)
            .ok_or(FsGroupError::Gid(gid))?;
        let policy = match sc.fs_group_change_policy.as_deref() {
            None | Some("") | Some("Always") => ChangePolicy::Always,
            Some("OnRootMismatch") => ChangePolicy::OnRootMismatch,
            Some(other) => return Err(FsGroupError::Policy(other.to_string())),
        };
        Ok(Some(FsGroup { gid, policy }))
    }
}

/// The mode an entry should have: its own bits plus the group mask, plus setgid and the search
/// bits for a directory.
pub(crate) fn wanted_mode(mode: u32, is_dir: bool, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if is_dir {
        mask |= SETGID | EXEC_MASK;
    }
    (mode & 0o7777) | mask
}

/// Whether the root of a volume already looks done: the group is `gid`, it is a directory with
/// setgid and at least the group bits the walk would add.
pub(crate) fn root_matches(st: &FileStat, gid: u32, read_only: bool) -> bool {
    if st.st_gid != gid || !safe_fs::is_dir(st) {
        return false;
    }
    let want = (if read_only { RO_MASK } else { RW_MASK }) | EXEC_MASK;
    let mode = st.st_mode & 0o7777;
    mode & want == want && mode & SETGID != 0
}

/// What a walk did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walked {
    pub entries: u64,
    pub errors: u64,
    /// Skipped by `OnRootMismatch`.
    pub skipped: bool,
}

/// Applies `group` to the volume at `dir` (a directory path that must not be, or pass
/// through, a symlink).
pub(crate) fn apply(dir: &Path, group: FsGroup, read_only: bool) -> Result<Walked, OwnershipError> {
    let real = dir.canonicalize().map_err(|e| SafeFsError::Sys {
        path: dir.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let root = safe_fs::open_dir_abs(&real)?;
    let root = nix::fcntl::openat(
        root.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| SafeFsError::Sys {
        path: real.clone(),
        errno,
    })?;
    let st = safe_fs::fstat(root.as_fd(), &real)?;
    let mut walked = Walked::default();
    if group.policy == ChangePolicy::OnRootMismatch && root_matches(&st, group.gid, read_only) {
        walked.skipped = true;
        return Ok(walked);
    }
    walk_dir(root, &real, &st, group.gid, read_only, 0, &mut walked);
    Ok(walked)
}

/// Changes everything below the open directory `dir`, then `dir` itself (last, as upstream, so
/// an interrupted walk leaves the root unmatched and `OnRootMismatch` walks again).
fn walk_dir(
    dir: OwnedFd,
    path: &Path,
    st: &FileStat,
    gid: u32,
    read_only: bool,
    depth: usize,
    walked: &mut Walked,
) {
    match entry_names(&dir) {
        Ok(names) => {
            for name in names {
                let child = path.join(&name);
                visit(dir.as_fd(), &name, &child, gid, read_only, depth, walked);
            }
        }
        Err(errno) => {
            walked.errors += 1;
            tracing::warn!(path = %path.display(), error = %errno, "cannot list a directory for fsGroup");
        }
    }
    change(dir.as_fd(), path, st, gid, read_only, walked);
}

fn visit(
    parent: BorrowedFd<'_>,
    name: &OsString,
    path: &Path,
    gid: u32,
    read_only: bool,
    depth: usize,
    walked: &mut Walked,
) {
    let fd = match safe_fs::open_component(parent, name, OFlag::O_PATH) {
        Ok(fd) => fd,
        // Removed meanwhile: nothing to do.
        Err(Errno::ENOENT) => return,
        Err(errno) => {
            walked.errors += 1;
            tracing::warn!(path = %path.display(), error = %errno, "cannot open for fsGroup");
            return;
        }
    };
    let st = match safe_fs::fstat(fd.as_fd(), path) {
        Ok(st) => st,
        Err(err) => {
            walked.errors += 1;
            tracing::warn!(error = %err, "cannot stat for fsGroup");
            return;
        }
    };
    if !safe_fs::is_dir(&st) {
        change(fd.as_fd(), path, &st, gid, read_only, walked);
        return;
    }
    if depth + 1 >= MAX_DEPTH {
        walked.errors += 1;
        tracing::warn!(path = %path.display(), "directory too deep for fsGroup; left alone");
        return;
    }
    // Reopened for reading, relative to the parent and without following: if it was swapped
    // for a symlink in between, this fails and the entry is skipped.
    match safe_fs::open_component(parent, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(dir) => {
            let same = safe_fs::fstat(dir.as_fd(), path)
                .is_ok_and(|s| s.st_ino == st.st_ino && s.st_dev == st.st_dev);
            if same {
                walk_dir(dir, path, &st, gid, read_only, depth + 1, walked);
            }
        }
        Err(Errno::ENOENT) => {}
        Err(errno) => {
            walked.errors += 1;
            tracing::warn!(path = %path.display(), error = %errno, "cannot open a directory for fsGroup");
        }
    }
}

/// The group of one entry, and its mode unless it is a symlink (a symlink's mode means
/// nothing, and changing "its" mode would change its target's).
fn change(
    fd: BorrowedFd<'_>,
    path: &Path,
    st: &FileStat,
    gid: u32,
    read_only: bool,
    walked: &mut Walked,
) {
    walked.entries += 1;
    if let Err(err) = safe_fs::set_group(fd, gid, path) {
        walked.errors += 1;
        tracing::warn!(error = %err, "fsGroup: cannot change the group");
    }
    if safe_fs::is_symlink(st) {
        return;
    }
    let mode = wanted_mode(st.st_mode, safe_fs::is_dir(st), read_only);
    if mode != st.st_mode & 0o7777
        && let Err(err) = safe_fs::set_mode(fd, mode, path)
    {
        walked.errors += 1;
        tracing::warn!(error = %err, "fsGroup: cannot change the mode");
    }
}

/// The names in a directory (without `.` and `..`), listed through its `/proc/self/fd` link,
/// which opens exactly the directory the descriptor holds.
fn entry_names(dir: &OwnedFd) -> Result<Vec<OsString>, Errno> {
    let io = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    let mut names = Vec::new();
    for entry in std::fs::read_dir(safe_fs::proc_fd_path(dir.as_fd())).map_err(io)? {
        names.push(entry.map_err(io)?.file_name());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn pod(fs_group: Option<i64>, policy: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                security_context: Some(PodSecurityContext {
                    fs_group,
                    fs_group_change_policy: policy.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn settings_table() {
        type Case<'a> = (
            Option<i64>,
            Option<&'a str>,
            Result<Option<FsGroup>, &'a str>,
        );
        let cases: &[Case] = &[
            (None, Some("Always"), Ok(None)),
            (
                Some(2000),
                None,
                Ok(Some(FsGroup {
                    gid: 2000,
                    policy: ChangePolicy::Always,
                })),
            ),
            (
                Some(0),
                Some("OnRootMismatch"),
                Ok(Some(FsGroup {
                    gid: 0,
                    policy: ChangePolicy::OnRootMismatch,
                })),
            ),
            (Some(-1), None, Err("invalid securityContext.fsGroup -1")),
            (
                Some(4294967295),
                None,
                Err("invalid securityContext.fsGroup 4294967295"),
            ),
            (
                Some(5),
                Some("Sometimes"),
                Err("invalid securityContext.fsGroupChangePolicy \"Sometimes\""),
            ),
        ];
        for (gid, policy, want) in cases {
            let got = FsGroup::from_pod(&pod(*gid, *policy)).map_err(|e| e.to_string());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{gid:?} {policy:?}"),
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{e}"),
                (g, w) => panic!("{gid:?} {policy:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn wanted_modes() {
        let cases = [
            (0o644, false, false, 0o664),
            (0o600, false, false, 0o660),
            (0o400, false, true, 0o440),
            (0o777, true, false, 0o2777),
            (0o700, true, true, 0o2750),
            (0o4755, false, false, 0o4775),
        ];
        for (mode, dir, ro, want) in cases {
            assert_eq!(wanted_mode(mode, dir, ro), want, "{mode:o} {dir} {ro}");
        }
    }

    fn meta(p: &Path) -> std::fs::Metadata {
        std::fs::symlink_metadata(p).unwrap()
    }

    #[test]
    fn walks_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("host"), b"h").unwrap();
        std::fs::set_permissions(outside.join("host"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::write(vol.join("a/b/f"), b"x").unwrap();
        std::fs::set_permissions(vol.join("a/b/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("to-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("host"), vol.join("to-file")).unwrap();
        let host_gid = meta(&outside.join("host")).gid();

        let g = FsGroup {
            gid: 3456,
            policy: ChangePolicy::Always,
        };
        let walked = apply(&vol, g, false).unwrap();
        assert_eq!(walked.errors, 0);
        assert_eq!(walked.entries, 6);
        for p in ["", "a", "a/b"] {
            let m = meta(&vol.join(p));
            assert_eq!(m.gid(), 3456, "{p}");
            assert_eq!(m.mode() & 0o7777, 0o2775, "{p}");
        }
        assert_eq!(meta(&vol.join("a/b/f")).gid(), 3456);
        assert_eq!(meta(&vol.join("a/b/f")).mode() & 0o7777, 0o660);
        // The links themselves changed group; their targets did not change at all.
        assert_eq!(meta(&vol.join("to-file")).gid(), 3456);
        assert_eq!(meta(&outside.join("host")).gid(), host_gid);
        assert_eq!(meta(&outside.join("host")).mode() & 0o7777, 0o600);
        assert_eq!(meta(&outside).mode() & 0o2000, 0);

        // OnRootMismatch: the root matches now, nothing is walked.
        std::fs::write(vol.join("late"), b"y").unwrap();
        std::os::unix::fs::chown(vol.join("late"), None, Some(0)).unwrap();
        let lazy = FsGroup {
            gid: 3456,
            policy: ChangePolicy::OnRootMismatch,
        };
        assert!(apply(&vol, lazy, false).unwrap().skipped);
        assert_eq!(meta(&vol.join("late")).gid(), 0);
        // Another group: the root mismatches, everything is walked.
        let other = FsGroup {
            gid: 3457,
            policy: ChangePolicy::OnRootMismatch,
        };
        assert!(!apply(&vol, other, false).unwrap().skipped);
        assert_eq!(meta(&vol.join("late")).gid(), 3457);
    }

    #[test]
    fn root_match_table() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let stat = |mode: u32, gid: u32| {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&d, None, Some(gid)).unwrap();
            nix::sys::stat::stat(&d).unwrap()
        };
        assert!(root_matches(&stat(0o2770, 7), 7, false));
        assert!(root_matches(&stat(0o2777, 7), 7, false));
        assert!(!root_matches(&stat(0o770, 7), 7, false), "no setgid");
        assert!(!root_matches(&stat(0o2750, 7), 7, false), "no group write");
        assert!(root_matches(&stat(0o2750, 7), 7, true));
        assert!(!root_matches(&stat(0o2770, 8), 7, false), "other group");
    }
}
