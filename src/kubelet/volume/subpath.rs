//! `subPath` / `subPathExpr`: a path inside a volume, opened without following symlinks,
//! created as a directory when missing, and bind-mounted onto a private path under the pod's
//! directory which is what the runtime mounts (upstream's safe subpath).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;

use super::mounter::Mounter;
use super::mountinfo;
use super::safe_fs::{self, SafeFsError};

use crate::base::podspec::expand::expand;

/// A `subPathExpr` refers to variables the container does not have (or has empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing value for {}", .0.join(", "))]
pub(crate) struct MissingVars(pub Vec<String>);

/// Expands `$(VAR)` in a `subPathExpr`; a reference to a variable the container does not have
/// (or has empty) is an error naming the missing ones.
pub(crate) fn expand_expr(
    expr: &str,
    env: &HashMap<String, String>,
) -> Result<String, MissingVars> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let expanded = expand(expr, |name| match env.get(name) {
        Some(v) if !v.is_empty() => Some(v.clone()),
        _ => {
            missing.borrow_mut().insert(name.to_string());
            Some(String::new())
        }
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(MissingVars(missing.into_iter().collect()))
    }
}

/// A subPath could not be used; the texts are upstream's (the detail goes to the log).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubPathError {
    #[error("error SubPath `{0}` must not be an absolute path")]
    Absolute(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    Backsteps(String),
    #[error(
        "failed to create subPath directory for volumeMount {mount:?} of container {container:?}"
    )]
    Create {
        mount: String,
        container: String,
        #[source]
        source: SafeFsError,
    },
    #[error("failed to prepare subPath for volumeMount {mount:?} of container {container:?}")]
    Prepare {
        mount: String,
        container: String,
        #[source]
        source: SafeFsError,
    },
}

/// Rejects absolute subpaths and subpaths with a `..` element, with upstream's texts.
pub(crate) fn validate(sub: &str) -> Result<(), SubPathError> {
    if Path::new(sub).is_absolute() {
        return Err(SubPathError::Absolute(sub.to_string()));
    }
    if sub.split('/').any(|part| part == "..") {
        return Err(SubPathError::Backsteps(sub.to_string()));
    }
    Ok(())
}

/// Where the subPath of one volumeMount is bind-mounted, as upstream:
/// `<pod dir>/volume-subpaths/<volume>/<container>/<index of the volumeMount>`. `pod_dir` is
/// canonical and was checked by the caller; the names are single path components.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BindTarget<'a> {
    pub pod_dir: &'a Path,
    pub volume: &'a str,
    pub container: &'a str,
    pub index: usize,
}

/// The directory of a pod's subPath bind mounts.
pub(crate) const SUBPATHS_DIR: &str = "volume-subpaths";

impl BindTarget<'_> {
    fn parent_rel(&self) -> PathBuf {
        Path::new(SUBPATHS_DIR)
            .join(self.volume)
            .join(self.container)
    }

    /// The path handed to the runtime.
    pub(crate) fn path(&self) -> PathBuf {
        self.pod_dir
            .join(self.parent_rel())
            .join(self.index.to_string())
    }
}

/// Makes `sub` inside the volume at `volume` available at a private path and returns that
/// path, for the runtime to mount.
///
/// Symlinks inside the volume are evaluated once, as upstream does, and must stay inside it;
/// the result is then opened component by component from the volume's root without following
/// any symlink, missing directories are created the same way (with the mode of the volume's
/// root), and the opened descriptor is bind-mounted onto the private path. A container that
/// swaps a directory for a symlink at any point makes this fail, never leads it outside.
pub(crate) fn prepare(
    mounter: &dyn Mounter,
    volume: &Path,
    sub: &str,
    target: &BindTarget<'_>,
    mount: &str,
) -> Result<PathBuf, SubPathError> {
    validate(sub)?;
    let container = target.container;
    let prepare_err = |source: SafeFsError| {
        tracing::warn!(%mount, %container, error = %source, "cannot prepare the subPath");
        SubPathError::Prepare {
            mount: mount.to_string(),
            container: container.to_string(),
            source,
        }
    };
    let base = volume.canonicalize().map_err(|e| {
        prepare_err(SafeFsError::Sys {
            path: volume.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })
    })?;
    let (existing, missing) = evaluate(&base, sub).map_err(prepare_err)?;
    let base_fd = safe_fs::open_dir_abs(&base).map_err(prepare_err)?;
    let mut fd =
        safe_fs::open_beneath(base_fd.as_fd(), &base, &existing, None).map_err(prepare_err)?;
    if !missing.as_os_str().is_empty() {
        let mode = safe_fs::fstat(base_fd.as_fd(), &base)
            .map(|st| st.st_mode & 0o7777)
            .unwrap_or(0o755);
        let at = base.join(&existing);
        fd = safe_fs::open_beneath(fd.as_fd(), &at, &missing, Some(mode)).map_err(|source| {
            tracing::warn!(%mount, %container, error = %source, "cannot create the subPath directory");
            SubPathError::Create {
                mount: mount.to_string(),
                container: container.to_string(),
                source,
            }
        })?;
    }
    bind(mounter, &fd, target).map_err(prepare_err)
}

/// Splits `sub` into the part that exists, with symlinks evaluated (each must resolve inside
/// `base`), relative to `base`, and the part that does not exist yet.
fn evaluate(base: &Path, sub: &str) -> Result<(PathBuf, PathBuf), SafeFsError> {
    let parts: Vec<_> = Path::new(sub)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut current = base.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        let next = current.join(part);
        match safe_fs::lstat(&next)? {
            None => {
                let missing: PathBuf = parts[i..].iter().collect();
                return Ok((strip(&current, base), missing));
            }
            Some(meta) if meta.file_type().is_symlink() => {
                current = safe_fs::canonical_within(&next, base)?;
            }
            Some(_) => current = next,
        }
    }
    Ok((strip(&current, base), PathBuf::new()))
}

fn strip(path: &Path, base: &Path) -> PathBuf {
    path.strip_prefix(base)
        .unwrap_or(Path::new(""))
        .to_path_buf()
}

/// Bind-mounts the file or directory `fd` holds onto the target (reusing a mount that is
/// already there when it shows the same inode) and returns the target's path.
fn bind(
    mounter: &dyn Mounter,
    fd: &OwnedFd,
    target: &BindTarget<'_>,
) -> Result<PathBuf, SafeFsError> {
    let pod_dir = target.pod_dir;
    let st = safe_fs::fstat(fd.as_fd(), pod_dir)?;
    let want_dir = safe_fs::is_dir(&st);
    let pod_fd = safe_fs::open_dir_abs(pod_dir)?;
    let parent_rel = target.parent_rel();
    let parent = safe_fs::open_beneath(pod_fd.as_fd(), pod_dir, &parent_rel, Some(0o750))?;
    let path = target.path();
    let name = target.index.to_string();
    let sys = |errno: Errno| SafeFsError::Sys {
        path: path.clone(),
        errno,
    };

    let table = mounter.mount_table().map_err(|e| sys(io_errno(&e)))?;
    if mountinfo::mount_at(&table, &path).is_some() {
        let current = mounter.stat_at(parent.as_fd(), &name).map_err(sys)?;
        if current.st_dev == st.st_dev && current.st_ino == st.st_ino {
            tracing::debug!(path = %path.display(), "subPath already bind-mounted");
            return Ok(path);
        }
        // Another file than the one wanted now (the subPath was replaced): mount afresh.
        mounter.unmount(&path, true).map_err(sys)?;
    }
    match fstatat_nofollow(parent.as_fd(), &name) {
        Ok(existing) if safe_fs::is_dir(&existing) == want_dir => {}
        Ok(existing) => {
            let flag = if safe_fs::is_dir(&existing) {
                UnlinkatFlags::RemoveDir
            } else {
                UnlinkatFlags::NoRemoveDir
            };
            nix::unistd::unlinkat(parent.as_fd(), name.as_str(), flag).map_err(sys)?;
            create_target(parent.as_fd(), &name, want_dir).map_err(sys)?;
        }
        Err(Errno::ENOENT) => create_target(parent.as_fd(), &name, want_dir).map_err(sys)?,
        Err(e) => return Err(sys(e)),
    }
    let target_fd =
        safe_fs::open_component(parent.as_fd(), name.as_ref(), OFlag::O_PATH).map_err(sys)?;
    let target_st = safe_fs::fstat(target_fd.as_fd(), &path)?;
    if safe_fs::is_symlink(&target_st) || safe_fs::is_dir(&target_st) != want_dir {
        return Err(SafeFsError::Symlink { path });
    }
    // Both ends by descriptor: the source is exactly what was opened, the target exactly the
    // entry just checked.
    mounter
        .bind(fd.as_fd(), target_fd.as_fd(), &path)
        .map_err(sys)?;
    let mounted = mounter.stat_at(parent.as_fd(), &name).map_err(sys)?;
    if mounted.st_dev != st.st_dev || mounted.st_ino != st.st_ino {
        let _ = mounter.unmount(&path, true);
        return Err(sys(Errno::EXDEV));
    }
    tracing::debug!(path = %path.display(), "subPath bind-mounted");
    Ok(path)
}

fn create_target(parent: BorrowedFd<'_>, name: &str, dir: bool) -> Result<(), Errno> {
    if dir {
        match nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(0o750)) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e),
        }
    } else {
        // An empty file is a mount point for any kind of non-directory.
        nix::fcntl::openat(
            parent,
            name,
            OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o640),
        )
        .map(drop)
    }
}

fn fstatat_nofollow(dir: BorrowedFd<'_>, name: &str) -> Result<FileStat, Errno> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Unmounts and removes `<pod dir>/volume-subpaths` (`pod_dir` canonical and checked). Nothing
/// is deleted while a mount is left below it, so the deletion cannot reach into a volume.
pub(crate) fn clean(mounter: &dyn Mounter, pod_dir: &Path) -> Result<(), SafeFsError> {
    let dir = pod_dir.join(SUBPATHS_DIR);
    super::remove_checked(mounter, &dir, pod_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::volume::mounter::fake::{FakeMounter, MountCall, Op};
    use crate::kubelet::volume::mounter::{KernelMounter, require_root};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn validation_table() {
        let cases: &[(&str, Result<(), &str>)] = &[
            ("data", Ok(())),
            ("a/b/c", Ok(())),
            ("a/..b/c..", Ok(())),
            ("./a", Ok(())),
            (
                "/etc",
                Err("error SubPath `/etc` must not be an absolute path"),
            ),
            (
                "..",
                Err("unable to provision SubPath `..`: must not contain '..'"),
            ),
            (
                "a/../../etc",
                Err("unable to provision SubPath `a/../../etc`: must not contain '..'"),
            ),
            (
                "a/..",
                Err("unable to provision SubPath `a/..`: must not contain '..'"),
            ),
        ];
        for (sub, want) in cases {
            assert_eq!(
                validate(sub).map_err(|e| e.to_string()),
                want.map_err(str::to_string),
                "{sub}"
            );
        }
    }

    #[test]
    fn expansion() {
        let env = HashMap::from([
            ("POD".to_string(), "web-1".to_string()),
            ("EMPTY".to_string(), String::new()),
        ]);
        assert_eq!(expand_expr("logs/$(POD)", &env), Ok("logs/web-1".into()));
        assert_eq!(expand_expr("$$(POD)", &env), Ok("$(POD)".into()));
        assert_eq!(
            expand_expr("$(NOPE)/$(EMPTY)/$(POD)", &env)
                .unwrap_err()
                .to_string(),
            "missing value for EMPTY, NOPE"
        );
        assert_eq!(
            expand_expr("$(NOPE)/$(EMPTY)/$(POD)", &env),
            Err(MissingVars(vec!["EMPTY".into(), "NOPE".into()]))
        );
    }

    /// A volume dir, a pod dir and a host dir with a sentinel, all canonical, and the mounter
    /// the subPaths are bound with.
    struct Fixture {
        _tmp: tempfile::TempDir,
        vol: PathBuf,
        pod: PathBuf,
        host: PathBuf,
        mounter: Arc<dyn Mounter>,
    }

    impl Fixture {
        /// On a recording fake mounter, returned too.
        fn new() -> (Fixture, Arc<FakeMounter>) {
            let fake = Arc::new(FakeMounter::default());
            (Fixture::on(fake.clone()), fake)
        }

        fn on(mounter: Arc<dyn Mounter>) -> Fixture {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().canonicalize().unwrap();
            let vol = root.join("vol");
            let pod = root.join("pod");
            let host = root.join("host");
            for d in [&vol, &pod, &host] {
                std::fs::create_dir(d).unwrap();
            }
            std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::fs::write(host.join("sentinel"), b"host").unwrap();
            Fixture {
                _tmp: tmp,
                vol,
                pod,
                host,
                mounter,
            }
        }

        fn target(&self, index: usize) -> BindTarget<'_> {
            BindTarget {
                pod_dir: &self.pod,
                volume: "v",
                container: "c",
                index,
            }
        }

        fn prepare(&self, sub: &str, index: usize) -> Result<PathBuf, SubPathError> {
            prepare(&*self.mounter, &self.vol, sub, &self.target(index), "m")
        }

        fn clean(&self) -> Result<(), SafeFsError> {
            clean(&*self.mounter, &self.pod)
        }

        fn mounts(&self) -> Vec<PathBuf> {
            mountinfo::mounts_under(&self.mounter.mount_table().unwrap(), &self.pod)
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = self.clean();
        }
    }

    fn ino(p: &Path) -> (u64, u64) {
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    fn bind_call(source: PathBuf, target: PathBuf) -> MountCall {
        MountCall::Bind { source, target }
    }

    fn unmount_call(target: PathBuf, detach: bool) -> MountCall {
        MountCall::Unmount { target, detach }
    }

    const PREPARE_ERR: &str = "failed to prepare subPath for volumeMount \"m\" of container \"c\"";
    const CREATE_ERR: &str =
        "failed to create subPath directory for volumeMount \"m\" of container \"c\"";

    #[test]
    fn binds_inside_paths_and_creates_missing_dirs() {
        let (f, fake) = Fixture::new();
        std::fs::write(f.vol.join("file"), b"in-volume").unwrap();
        let at = |index: usize| f.pod.join("volume-subpaths/v/c").join(index.to_string());

        let got = f.prepare("a/b", 0).unwrap();
        assert_eq!(got, at(0));
        for d in ["a", "a/b"] {
            let mode = std::fs::metadata(f.vol.join(d))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o777, "{d} has the volume's mode");
        }
        assert!(got.is_dir(), "a directory is bound on a directory");
        assert_eq!(fake.calls(), [bind_call(f.vol.join("a/b"), at(0))]);
        assert_eq!(f.mounts(), vec![got.clone()]);

        let file = f.prepare("file", 1).unwrap();
        assert!(file.is_file(), "a file is bound on a file");
        assert_eq!(fake.calls()[1], bind_call(f.vol.join("file"), at(1)));

        // Symlinks inside the volume that stay inside are evaluated, as upstream does.
        std::os::unix::fs::symlink("a", f.vol.join("inner")).unwrap();
        assert_eq!(f.prepare("inner/b", 2).unwrap(), at(2));
        assert_eq!(fake.calls()[2], bind_call(f.vol.join("a/b"), at(2)));

        // Idempotent: the same mount is reused, not stacked.
        fake.take_calls();
        assert_eq!(f.prepare("a/b", 0).unwrap(), got);
        assert_eq!(fake.calls(), []);
        assert_eq!(f.mounts().len(), 3);

        // The directory was replaced: the old mount goes (detached), the new one is bound.
        std::fs::rename(f.vol.join("a/b"), f.vol.join("a/old")).unwrap();
        std::fs::create_dir(f.vol.join("a/b")).unwrap();
        assert_eq!(f.prepare("a/b", 0).unwrap(), got);
        assert_eq!(
            fake.take_calls(),
            [
                unmount_call(at(0), true),
                bind_call(f.vol.join("a/b"), at(0))
            ]
        );
        assert_eq!(f.mounts().len(), 3);

        // A file where a directory was: the target changes kind.
        std::fs::remove_dir(f.vol.join("a/b")).unwrap();
        std::fs::write(f.vol.join("a/b"), b"now a file").unwrap();
        assert_eq!(f.prepare("a/b", 0).unwrap(), got);
        assert!(got.is_file());
        assert_eq!(
            fake.take_calls(),
            [
                unmount_call(at(0), true),
                bind_call(f.vol.join("a/b"), at(0))
            ]
        );

        // A bind the kernel refuses fails the subPath and leaves no mount.
        fake.fail(Op::Bind, None, Errno::EPERM);
        assert_eq!(f.prepare("file", 3).unwrap_err().to_string(), PREPARE_ERR);
        assert_eq!(f.mounts().len(), 3);

        // Cleaning unmounts every mount, once, and removes the directory.
        fake.take_calls();
        f.clean().unwrap();
        let mut unmounted = fake.calls();
        unmounted.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(
            unmounted,
            [0, 1, 2].map(|i| unmount_call(at(i), false)),
            "each mount, without detaching"
        );
        assert!(f.mounts().is_empty());
        assert!(!f.pod.join("volume-subpaths").exists());
        assert_eq!(
            std::fs::read_to_string(f.vol.join("file")).unwrap(),
            "in-volume"
        );
    }

    #[test]
    fn symlinks_out_of_the_volume_and_backsteps_are_refused_anywhere() {
        let (f, fake) = Fixture::new();
        std::fs::create_dir_all(f.vol.join("d/e")).unwrap();
        std::os::unix::fs::symlink(&f.host, f.vol.join("abs")).unwrap();
        std::os::unix::fs::symlink("../host", f.vol.join("rel")).unwrap();
        std::os::unix::fs::symlink("../../../host", f.vol.join("d/e/up")).unwrap();
        std::os::unix::fs::symlink("/", f.vol.join("d/root")).unwrap();
        for sub in [
            "abs",
            "rel",
            "d/e/up",
            "d/root",
            "abs/sentinel",
            "d/root/etc",
        ] {
            assert_eq!(
                f.prepare(sub, 0).unwrap_err().to_string(),
                PREPARE_ERR,
                "{sub}"
            );
        }
        for sub in ["abs/new", "d/e/up/new/deeper"] {
            let err = f.prepare(sub, 0).unwrap_err().to_string();
            assert!(err == PREPARE_ERR || err == CREATE_ERR, "{sub}: {err}");
        }
        assert!(!f.host.join("new").exists());
        assert_eq!(
            f.prepare("d/../../host", 0).unwrap_err().to_string(),
            "unable to provision SubPath `d/../../host`: must not contain '..'"
        );
        assert_eq!(
            f.prepare("/etc", 0).unwrap_err().to_string(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(fake.calls(), [], "nothing is ever bound");
    }

    /// A thread swaps `sub` between the real directory and a symlink to the host directory as
    /// fast as it can while `sub` is prepared many times: every preparation either fails or
    /// binds the directory inside the volume, never the host's. Against the kernel: what a
    /// real bind mount shows is the point.
    #[test]
    fn a_swap_race_never_redirects_the_mount() {
        require_root("it makes real bind mounts");
        let f = Fixture::on(Arc::new(KernelMounter));
        let sub = f.vol.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("inside"), b"in").unwrap();
        let inside = ino(&sub);
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let vol = f.vol.clone();
            let host = f.host.clone();
            std::thread::spawn(move || {
                let (sub, parked) = (vol.join("sub"), vol.join("sub.parked"));
                let mut swaps = 0u64;
                // Errors are ignored: a preparation may create `sub` while it is parked.
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::rename(&sub, &parked);
                    let _ = std::os::unix::fs::symlink(&host, &sub);
                    let _ = std::fs::remove_file(&sub);
                    let _ = std::fs::rename(&parked, &sub);
                    swaps += 1;
                }
                swaps
            })
        };
        let (mut bound, mut refused) = (0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut i = 0;
        // Until both outcomes were seen often enough (the machine may be busy).
        while (bound < 50 || refused < 50 || i < 400) && std::time::Instant::now() < deadline {
            i += 1;
            match f.prepare("sub", i % 4) {
                Ok(path) => {
                    bound += 1;
                    // The inside directory, or (if `sub` was parked just then) a new empty
                    // one made inside the volume; never the host's.
                    let got = ino(&path);
                    let empty = std::fs::read_dir(&path).unwrap().next().is_none();
                    assert!(got == inside || empty, "round {i}: the mount is not inside");
                    assert_ne!(got, ino(&f.host), "round {i}: the host dir is mounted");
                    assert!(!path.join("sentinel").exists(), "round {i}: host visible");
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(e == PREPARE_ERR || e == CREATE_ERR, "{e}");
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        eprintln!("{bound} bound, {refused} refused, {swaps} swaps");
        assert!(
            swaps > 0 && bound > 0 && refused > 0,
            "the race was not exercised"
        );
        assert!(!f.host.join("inside").exists());
        f.clean().unwrap();
        assert!(f.mounts().is_empty());
    }
}
