//! A recording [`Mounter`] for unit tests: no system call is made and no root is needed.
//!
//! Every mount, bind and unmount is recorded in order ([`FakeMounter::calls`]), with the
//! paths the descriptors it was given really name. It keeps a mount table of its own, so the
//! volume code sees its earlier mounts (set-up is idempotent, teardown unmounts exactly what
//! is there): a mount adds an entry, an unmount removes the newest at that path or fails with
//! `EINVAL` when there is none, as the kernel does. A tmpfs leaves the directory in place so
//! that files are still written to it, and gives its root a fresh tmpfs's mode (1777), so the
//! code that sets the volume's mode afterwards is seen to. A bound entry, asked about through
//! [`Mounter::stat_at`], shows what was bound. Any call can be told to fail ([`FakeMounter::fail`]),
//! and mounts made by someone else can be put in the table beforehand
//! ([`FakeMounter::preset`]).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::stat::FileStat;

use super::Mounter;
use crate::kubelet::volume::mountinfo::MountEntry;
use crate::kubelet::volume::safe_fs;

/// One call made through the fake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MountCall {
    Tmpfs {
        target: PathBuf,
        size_bytes: Option<u64>,
    },
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    Unmount {
        target: PathBuf,
        detach: bool,
    },
}

/// Which kind of call a failure is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Tmpfs,
    Bind,
    Unmount,
    Table,
}

#[derive(Debug)]
struct Failure {
    op: Op,
    /// Only a call at this path, or any.
    path: Option<PathBuf>,
    errno: Errno,
}

#[derive(Debug)]
struct Mounted {
    entry: MountEntry,
    /// For a bind mount: what the target shows, held open as the kernel holds it (so its
    /// inode number is not reused while it is mounted).
    shows: Option<OwnedFd>,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<MountCall>,
    table: Vec<Mounted>,
    failures: Vec<Failure>,
    table_reads: usize,
}

#[derive(Debug, Default)]
pub(crate) struct FakeMounter {
    state: Mutex<State>,
}

/// The path a descriptor names (through `/proc/self/fd`), or `shown` if it cannot be read.
fn fd_path(fd: BorrowedFd<'_>, shown: &Path) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap_or_else(|_| shown.to_path_buf())
}

impl FakeMounter {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every mount, bind and unmount so far, in order (failed ones too).
    pub(crate) fn calls(&self) -> Vec<MountCall> {
        self.state().calls.clone()
    }

    /// The calls so far, forgotten.
    pub(crate) fn take_calls(&self) -> Vec<MountCall> {
        std::mem::take(&mut self.state().calls)
    }

    /// The mount points in the fake's table, oldest first.
    pub(crate) fn mounted(&self) -> Vec<PathBuf> {
        let state = self.state();
        state
            .table
            .iter()
            .map(|m| m.entry.mount_point.clone())
            .collect()
    }

    /// How often the mount table was read.
    pub(crate) fn table_reads(&self) -> usize {
        self.state().table_reads
    }

    /// The next call of kind `op` (at `path`, when given) fails with `errno`; each call to
    /// this adds one failure.
    pub(crate) fn fail(&self, op: Op, path: Option<&Path>, errno: Errno) {
        self.state().failures.push(Failure {
            op,
            path: path.map(Path::to_path_buf),
            errno,
        });
    }

    /// Puts a mount of `fs_type` at `path` in the table, as if someone else had mounted it.
    pub(crate) fn preset(&self, path: &Path, fs_type: &str) {
        self.state().table.push(Mounted {
            entry: MountEntry {
                mount_point: path.to_path_buf(),
                fs_type: fs_type.to_string(),
                super_options: "rw".to_string(),
            },
            shows: None,
        });
    }

    /// Takes the first failure planned for `op` at `path`.
    fn planned(state: &mut State, op: Op, path: &Path) -> Option<Errno> {
        let index = state
            .failures
            .iter()
            .position(|f| f.op == op && f.path.as_deref().is_none_or(|p| p == path))?;
        Some(state.failures.remove(index).errno)
    }

    fn mount(
        &self,
        call: MountCall,
        op: Op,
        entry: MountEntry,
        shows: Option<OwnedFd>,
    ) -> Result<(), Errno> {
        let mut state = self.state();
        state.calls.push(call);
        if let Some(errno) = Self::planned(&mut state, op, &entry.mount_point) {
            return Err(errno);
        }
        state.table.push(Mounted { entry, shows });
        Ok(())
    }
}

impl Mounter for FakeMounter {
    fn mount_tmpfs(
        &self,
        dir: BorrowedFd<'_>,
        path: &Path,
        size_bytes: Option<u64>,
    ) -> Result<(), Errno> {
        let target = fd_path(dir, path);
        let options = match size_bytes {
            Some(size) => format!("rw,size={}k", size / 1024),
            None => "rw".to_string(),
        };
        let entry = MountEntry {
            mount_point: target.clone(),
            fs_type: "tmpfs".to_string(),
            super_options: options,
        };
        let call = MountCall::Tmpfs { target, size_bytes };
        self.mount(call, Op::Tmpfs, entry, None)?;
        // A new tmpfs's root is 1777, whatever the directory under it had.
        safe_fs::set_mode(dir, 0o1777, path).map_err(|e| e.errno().unwrap_or(Errno::EIO))
    }

    fn bind(
        &self,
        source: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        path: &Path,
    ) -> Result<(), Errno> {
        let shows = source
            .try_clone_to_owned()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let source = fd_path(source, Path::new("?"));
        let target = fd_path(target, path);
        let entry = MountEntry {
            mount_point: target.clone(),
            fs_type: "bind".to_string(),
            super_options: "rw".to_string(),
        };
        let call = MountCall::Bind { source, target };
        self.mount(call, Op::Bind, entry, Some(shows))
    }

    fn unmount(&self, path: &Path, detach: bool) -> Result<(), Errno> {
        let mut state = self.state();
        state.calls.push(MountCall::Unmount {
            target: path.to_path_buf(),
            detach,
        });
        if let Some(errno) = Self::planned(&mut state, Op::Unmount, path) {
            return Err(errno);
        }
        let newest = state
            .table
            .iter()
            .rposition(|m| m.entry.mount_point == path)
            .ok_or(Errno::EINVAL)?;
        state.table.remove(newest);
        Ok(())
    }

    fn mount_table(&self) -> std::io::Result<Vec<MountEntry>> {
        let mut state = self.state();
        state.table_reads += 1;
        if let Some(errno) = Self::planned(&mut state, Op::Table, Path::new("/proc/self/mountinfo"))
        {
            return Err(std::io::Error::from_raw_os_error(errno as i32));
        }
        Ok(state.table.iter().map(|m| m.entry.clone()).collect())
    }

    fn stat_at(&self, parent: BorrowedFd<'_>, name: &str) -> Result<FileStat, Errno> {
        let path = fd_path(parent, Path::new("?")).join(name);
        let state = self.state();
        let top = state
            .table
            .iter()
            .rev()
            .find(|m| m.entry.mount_point == path);
        match top.and_then(|m| m.shows.as_ref()) {
            Some(shows) => nix::sys::stat::fstat(shows.as_fd()),
            None => nix::sys::stat::fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW),
        }
    }
}
