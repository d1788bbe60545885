//! The systemd cgroup driver's names, and the check that systemd runs at all.
//!
//! With the systemd driver every cgroup is a slice whose name spells its whole path, joined
//! by `-` (so `-` in a UID becomes `_`): `kubepods-burstable-pod<uid>.slice` lives in
//! `/kubepods.slice/kubepods-burstable.slice/`. Slices are made by systemd on request, so the
//! driver is useless without a running systemd; as runc does, that is known by
//! `/run/systemd/system` being a directory.

use std::path::Path;

/// Where systemd marks that it runs as the init system.
pub(crate) const SYSTEMD_RUNNING_MARKER: &str = "/run/systemd/system";

/// The slice unit name of a cgroup given by its components (`["kubepods", "burstable",
/// "pod1-2"]` → `kubepods-burstable-pod1_2.slice`); no components is the root slice.
#[cfg(test)]
pub(crate) fn slice_name(components: &[&str]) -> String {
    if components.is_empty() {
        return "-.slice".to_string();
    }
    let escaped: Vec<String> = components.iter().map(|c| c.replace('-', "_")).collect();
    format!("{}.slice", escaped.join("-"))
}

/// The cgroupfs path systemd gives that slice: every prefix of it is a parent slice
/// (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice`).
#[cfg(test)]
pub(crate) fn slice_path(components: &[&str]) -> String {
    if components.is_empty() {
        return "/".to_string();
    }
    let mut out = String::new();
    for n in 1..=components.len() {
        out.push('/');
        out.push_str(&slice_name(&components[..n]));
    }
    out
}

/// The systemd driver was asked for, and systemd does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cgroupDriver is \"systemd\", but systemd is not running on this machine ({marker} is missing); \
     use --cgroup-driver=cgroupfs (and the cgroupfs driver in the container runtime too)"
)]
pub struct SystemdNotRunning {
    pub marker: String,
}

/// Succeeds when `marker` (normally [`SYSTEMD_RUNNING_MARKER`]) is a directory.
pub(crate) fn check_running(marker: &Path) -> Result<(), SystemdNotRunning> {
    if marker.is_dir() {
        Ok(())
    } else {
        Err(SystemdNotRunning {
            marker: marker.display().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_table() {
        let rows: [(&[&str], &str, &str); 5] = [
            (&[], "-.slice", "/"),
            (&["kubepods"], "kubepods.slice", "/kubepods.slice"),
            (
                &["kubepods", "besteffort"],
                "kubepods-besteffort.slice",
                "/kubepods.slice/kubepods-besteffort.slice",
            ),
            (
                &["kubepods", "burstable", "pod12ab-34cd"],
                "kubepods-burstable-pod12ab_34cd.slice",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12ab_34cd.slice",
            ),
            (
                &["kubepods", "pod0b7e4c2a-1111"],
                "kubepods-pod0b7e4c2a_1111.slice",
                "/kubepods.slice/kubepods-pod0b7e4c2a_1111.slice",
            ),
        ];
        for (parts, name, path) in rows {
            assert_eq!(slice_name(parts), name, "{parts:?}");
            assert_eq!(slice_path(parts), path, "{parts:?}");
        }
    }

    #[test]
    fn systemd_not_running_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("run/systemd/system");
        let err = check_running(&marker).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("systemd is not running"), "{text}");
        assert!(text.contains(&marker.display().to_string()), "{text}");
        assert!(text.contains("--cgroup-driver=cgroupfs"), "{text}");
        std::fs::create_dir_all(&marker).unwrap();
        assert_eq!(check_running(&marker), Ok(()));
    }
}
