//! The mount system calls of the volume code behind one narrow trait, so that what is mounted
//! where, and what is unmounted when, is decided in code that unit tests run without root.
//!
//! [`Mounter`] is upstream's `mount.Interface` cut to what Deckhand does: a tmpfs for memory
//! volumes, a bind mount for a subPath, an unmount (never following a symlink at the mount
//! point), and the mount table with which the volume code decides whether a mount is there.
//! [`KernelMounter`] makes the system calls; the daemon hands it to the volume manager through
//! the executor's `NodeContext`. Unit tests hand in the recording fake (`fake::FakeMounter`).

#[cfg(test)]
pub(crate) mod fake;

use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::FileStat;

use super::mountinfo::{self, MountEntry};
use super::safe_fs::proc_fd_path;

/// Mounting and unmounting for the volume code. Mount targets and sources are descriptors
/// opened without following symlinks, so what is mounted is exactly what was checked.
pub(crate) trait Mounter: Send + Sync + std::fmt::Debug {
    /// Mounts a new tmpfs on the directory `dir` holds (at `path`, its canonical path), with
    /// the `size=` option when `size_bytes` is given (else the kernel's default, half of RAM).
    fn mount_tmpfs(
        &self,
        dir: BorrowedFd<'_>,
        path: &Path,
        size_bytes: Option<u64>,
    ) -> Result<(), Errno>;

    /// Bind-mounts the file or directory `source` holds onto the entry `target` holds (at
    /// `path`).
    fn bind(
        &self,
        source: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        path: &Path,
    ) -> Result<(), Errno>;

    /// Unmounts the mount at `path` without following a symlink there (`UMOUNT_NOFOLLOW`);
    /// `detach`: lazily, even while it is busy (`MNT_DETACH`).
    fn unmount(&self, path: &Path, detach: bool) -> Result<(), Errno>;

    /// This process's mount table.
    fn mount_table(&self) -> std::io::Result<Vec<MountEntry>>;

    /// What the entry `name` of the directory `parent` is now, mounts included, without
    /// following a symlink: how a bind mount is checked to show what was bound.
    fn stat_at(&self, parent: BorrowedFd<'_>, name: &str) -> Result<FileStat, Errno>;
}

/// The system calls.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KernelMounter;

impl Mounter for KernelMounter {
    fn mount_tmpfs(
        &self,
        dir: BorrowedFd<'_>,
        _path: &Path,
        size_bytes: Option<u64>,
    ) -> Result<(), Errno> {
        let options = size_bytes.map(|size| format!("size={size}"));
        nix::mount::mount(
            Some("tmpfs"),
            &proc_fd_path(dir),
            Some("tmpfs"),
            MsFlags::empty(),
            options.as_deref(),
        )
    }

    fn bind(
        &self,
        source: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        _path: &Path,
    ) -> Result<(), Errno> {
        nix::mount::mount(
            Some(&proc_fd_path(source)),
            &proc_fd_path(target),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    }

    fn unmount(&self, path: &Path, detach: bool) -> Result<(), Errno> {
        let mut flags = MntFlags::UMOUNT_NOFOLLOW;
        if detach {
            flags |= MntFlags::MNT_DETACH;
        }
        nix::mount::umount2(path, flags)
    }

    fn mount_table(&self) -> std::io::Result<Vec<MountEntry>> {
        mountinfo::read()
    }

    fn stat_at(&self, parent: BorrowedFd<'_>, name: &str) -> Result<FileStat, Errno> {
        nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
    }
}

/// Fails the test at once, with a message that says why, when it does not run as root: the
/// few tests that need the kernel's mounts (CI runs as root; see `docs/dev/tests.md`).
#[cfg(test)]
pub(crate) fn require_root(what: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root ({what}); CI runs the unit tests as root, \
         run it with sudo or leave it out with `--skip`"
    );
}
