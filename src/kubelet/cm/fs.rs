//! The cgroup filesystem behind a small trait, so the manager's I/O can run against a plain
//! directory in tests. Paths are relative to the mount root (`/sys/fs/cgroup`): on cgroup v1
//! they start with the hierarchy (`cpu/kubepods/…`), on v2 they are the cgroup itself.

use std::io;
use std::path::{Path, PathBuf};

/// The few operations the cgroup manager needs.
pub trait CgroupFs: Send + Sync + std::fmt::Debug {
    fn is_dir(&self, dir: &Path) -> bool;
    /// Creates `dir` and any missing parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Writes `value` to `dir/file` in one write, as the kernel wants cgroup files written.
    fn write(&self, dir: &Path, file: &str, value: &str) -> io::Result<()>;
    fn read(&self, dir: &Path, file: &str) -> io::Result<String>;
    fn exists(&self, dir: &Path, file: &str) -> bool;
    /// Removes an empty cgroup directory; one that is already gone is fine.
    fn remove_dir(&self, dir: &Path) -> io::Result<()>;
    /// The names of the directories directly below `dir` (nothing when it does not exist).
    fn subdirs(&self, dir: &Path) -> Vec<String>;
}

/// The real cgroup filesystem, mounted at `root` (normally `/sys/fs/cgroup`).
#[derive(Debug, Clone)]
pub struct HostCgroupFs {
    root: PathBuf,
}

impl HostCgroupFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostCgroupFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, dir: &Path) -> PathBuf {
        // Relative paths only: a leading `/` would otherwise replace the root.
        self.root.join(dir.strip_prefix("/").unwrap_or(dir))
    }
}

impl CgroupFs for HostCgroupFs {
    fn is_dir(&self, dir: &Path) -> bool {
        self.full(dir).is_dir()
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(self.full(dir))
    }

    fn write(&self, dir: &Path, file: &str, value: &str) -> io::Result<()> {
        use std::io::Write;
        // Create is for plain directories (tests); cgroupfs files always exist already.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.full(dir).join(file))?;
        f.write_all(value.as_bytes())
    }

    fn read(&self, dir: &Path, file: &str) -> io::Result<String> {
        std::fs::read_to_string(self.full(dir).join(file))
    }

    fn exists(&self, dir: &Path, file: &str) -> bool {
        self.full(dir).join(file).exists()
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        match std::fs::remove_dir(self.full(dir)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn subdirs(&self, dir: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.full(dir)) else {
            return Vec::new();
        };
        let mut out: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }
}
