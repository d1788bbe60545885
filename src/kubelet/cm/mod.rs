//! Cgroups of pods, as upstream's container manager keeps them for the cgroupfs driver:
//! `<cgroupRoot>/kubepods` limited to what the node gives pods, the QoS tiers `burstable` and
//! `besteffort` below it, and one `pod<uid>` cgroup per pod with the pod's limits, made before
//! its sandbox and removed after the pod is gone.
//!
//! - [`fs`]: the cgroup filesystem behind a trait (the real one first; tests use a directory).
//! - [`pod_config`]: a pod's settings from its spec (pure).
//! - [`v1`], [`v2`]: the files and contents for settings on each cgroup version (pure).
//! - [`qos`]: the QoS tiers' settings (pure).
//! - [`allocatable`]: what `kubepods` is limited to (pure).
//! - [`systemd`]: slice names, and the check that systemd runs.
//! - [`orphans`]: pod cgroups no pod owns any more, found and removed.
//! - [`kernel`]: the kernel tunables checked at start (`protectKernelDefaults`; pure decision).
//!
//! The runtime (runc) then creates each container's cgroup below the pod's, with the limits
//! translated into the CRI config (`runtime::translate::container`).

pub(crate) mod allocatable;
pub(crate) mod fs;
pub(crate) mod kernel;
mod manager;
pub(crate) mod orphans;
pub(crate) mod pod_config;
pub(crate) mod qos;
pub(crate) mod resize;
pub(crate) mod systemd;
pub(crate) mod v1;
pub(crate) mod v2;

pub use fs::{CgroupFs, HostCgroupFs};
pub use manager::{
    CgroupError, CgroupManager, CgroupVersion, Ensured, ManagerSettings, detect_version,
};
pub use pod_config::{CfsSettings, ResourceConfig};

use std::path::{Path, PathBuf};

use crate::base::podspec::QosClass;
use crate::config::CgroupDriver;

/// Upstream's QoS cgroup names under `kubepods`.
fn qos_dir(qos: QosClass) -> Option<&'static str> {
    match qos {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    }
}

/// The pod's cgroup parent as the runtime expects it for the configured driver, or `None` when
/// `cgroupsPerQOS` is off (the runtime then picks its default).
pub fn pod_cgroup_parent(
    driver: CgroupDriver,
    cgroup_root: &str,
    cgroups_per_qos: bool,
    qos: QosClass,
    uid: &str,
) -> Option<String> {
    // No cgroup path is ever built from a UID that could climb out of the pod's own.
    if !cgroups_per_qos || crate::base::safe_names::component_problem(uid).is_some() {
        return None;
    }
    match driver {
        CgroupDriver::Cgroupfs => {
            let mut path = PathBuf::from(if cgroup_root.is_empty() {
                "/"
            } else {
                cgroup_root
            });
            path.push("kubepods");
            if let Some(q) = qos_dir(qos) {
                path.push(q);
            }
            path.push(format!("pod{uid}"));
            Some(path.to_string_lossy().into_owned())
        }
        CgroupDriver::Systemd => {
            // systemd encodes the hierarchy in the slice name; dashes in the UID become underscores.
            let uid = uid.replace('-', "_");
            Some(match qos_dir(qos) {
                Some(q) => format!("kubepods-{q}-pod{uid}.slice"),
                None => format!("kubepods-pod{uid}.slice"),
            })
        }
    }
}

/// Removes a pod's cgroup directory from every hierarchy under `cgroup_fs` (normally
/// `/sys/fs/cgroup`), deepest first. Busy or missing directories are left alone; what could not
/// be removed is returned for the log.
pub fn remove_pod_cgroup(cgroup_fs: &Path, parent: &str) -> Vec<String> {
    let relative = parent.trim_start_matches('/');
    if relative.is_empty() || relative.ends_with(".slice") {
        return Vec::new();
    }
    let mut candidates = vec![cgroup_fs.join(relative)];
    if let Ok(entries) = std::fs::read_dir(cgroup_fs) {
        for entry in entries.flatten() {
            let p = entry.path().join(relative);
            if p.is_dir() {
                candidates.push(p);
            }
        }
    }
    let mut problems = Vec::new();
    for dir in candidates {
        if !dir.is_dir() {
            continue;
        }
        if let Err(err) = remove_tree(&dir) {
            problems.push(format!("{}: {err}", dir.display()));
        }
    }
    problems
}

/// cgroup directories are removed with rmdir, children first (their files cannot be unlinked).
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path())?;
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// One write of a cgroup file: in which v1 hierarchy (empty on v2), which file, what value.
/// `optional` writes are skipped when the kernel does not have the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    pub controller: &'static str,
    pub file: String,
    pub value: String,
    pub optional: bool,
}

impl FileWrite {
    pub fn new(controller: &'static str, file: impl Into<String>, value: impl ToString) -> Self {
        FileWrite {
            controller,
            file: file.into(),
            value: value.to_string(),
            optional: false,
        }
    }

    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
}

/// A huge page size as the kernel names it in hugetlb files (`2MB`, `1GB`), upstream's
/// `HugePageUnitSizeFromByteSize`; `None` for a size that is not a whole power of 1024 unit.
pub fn hugepage_unit(size: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut size = size;
    let mut unit = 0;
    while size >= 1024 && unit < UNITS.len() - 1 {
        if !size.is_multiple_of(1024) {
            return None;
        }
        size /= 1024;
        unit += 1;
    }
    (size > 0).then(|| format!("{size}{}", UNITS[unit]))
}

/// How containers' limits are translated for the runtime (part 2 of the cgroup work): the
/// node's CFS settings, the cgroup version and the machine's huge page sizes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerSettings {
    pub cfs: CfsSettings,
    pub version: Option<CgroupVersion>,
    /// Huge page sizes of the machine in bytes; each is limited to 0 unless the container
    /// asks for it.
    pub page_sizes: Vec<u64>,
}

impl ContainerSettings {
    pub fn is_v2(&self) -> bool {
        self.version == Some(CgroupVersion::V2)
    }
}

/// A cgroup filesystem on a plain directory, for tests here and in the executor.
#[cfg(test)]
pub(crate) mod fixture {
    use std::io;
    use std::path::Path;

    use super::fs::{CgroupFs, HostCgroupFs};

    /// The real filesystem code on a plain directory; only removal differs (a fixture
    /// cgroup's "files" are real files, which rmdir would refuse).
    #[derive(Debug)]
    pub(crate) struct Fixture(pub HostCgroupFs);

    impl CgroupFs for Fixture {
        fn is_dir(&self, dir: &Path) -> bool {
            self.0.is_dir(dir)
        }
        fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
            self.0.create_dir_all(dir)
        }
        fn write(&self, dir: &Path, file: &str, value: &str) -> io::Result<()> {
            self.0.write(dir, file, value)
        }
        fn read(&self, dir: &Path, file: &str) -> io::Result<String> {
            self.0.read(dir, file)
        }
        fn exists(&self, dir: &Path, file: &str) -> bool {
            self.0.exists(dir, file)
        }
        fn remove_dir(&self, dir: &Path) -> io::Result<()> {
            match std::fs::remove_dir_all(self.0.root().join(dir)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
        fn subdirs(&self, dir: &Path) -> Vec<String> {
            self.0.subdirs(dir)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_cgroup_path_from_a_uid_that_climbs_out() {
        for uid in ["../../x", "a/b", "..", ""] {
            for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
                assert_eq!(
                    pod_cgroup_parent(driver, "/", true, QosClass::Burstable, uid),
                    None,
                    "{uid:?}"
                );
            }
        }
    }

    #[test]
    fn cgroup_parent_table() {
        use CgroupDriver::*;
        use QosClass::*;
        let rows = [
            (
                Cgroupfs,
                "/",
                true,
                Burstable,
                Some("/kubepods/burstable/poda-b"),
            ),
            (
                Cgroupfs,
                "/",
                true,
                BestEffort,
                Some("/kubepods/besteffort/poda-b"),
            ),
            (Cgroupfs, "/", true, Guaranteed, Some("/kubepods/poda-b")),
            (
                Cgroupfs,
                "/test",
                true,
                Guaranteed,
                Some("/test/kubepods/poda-b"),
            ),
            (Cgroupfs, "/", false, Guaranteed, None),
            (
                Systemd,
                "/",
                true,
                Burstable,
                Some("kubepods-burstable-poda_b.slice"),
            ),
            (
                Systemd,
                "/",
                true,
                Guaranteed,
                Some("kubepods-poda_b.slice"),
            ),
        ];
        for (driver, root, per_qos, qos, want) in rows {
            assert_eq!(
                pod_cgroup_parent(driver, root, per_qos, qos, "a-b").as_deref(),
                want,
                "{driver:?} {root} {per_qos} {qos:?}"
            );
        }
    }

    #[test]
    fn removes_nested_dirs_in_every_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        for h in ["cpu", "memory"] {
            std::fs::create_dir_all(root.path().join(h).join("kubepods/besteffort/podx/c1"))
                .unwrap();
        }
        let problems = remove_pod_cgroup(root.path(), "/kubepods/besteffort/podx");
        assert!(problems.is_empty(), "{problems:?}");
        for h in ["cpu", "memory"] {
            assert!(
                !root
                    .path()
                    .join(h)
                    .join("kubepods/besteffort/podx")
                    .exists()
            );
            assert!(root.path().join(h).join("kubepods/besteffort").exists());
        }
    }
}
