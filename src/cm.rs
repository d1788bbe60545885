//! Cgroups of pods: where a pod's cgroup lives, and removing it once the pod is gone.
//!
//! With the cgroupfs driver runc creates the pod's cgroup (the sandbox's `cgroup_parent`) in every
//! hierarchy, and nobody removes it afterwards: the kubelet must. Paths are rooted in config so
//! tests and several agents can share a machine.

use std::path::{Path, PathBuf};

use crate::config::CgroupDriver;
use crate::k8s::QosClass;

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
    if !cgroups_per_qos || crate::paths::component_problem(uid).is_some() {
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
