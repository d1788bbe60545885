//! emptyDir volumes: a directory on the node's disk, or a tmpfs for `medium: Memory`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod};

use super::mounter::Mounter;
use super::{mountinfo, safe_fs};
use crate::base::podspec::quantity;

/// Permission bits of an emptyDir (everyone may write, as upstream).
pub(crate) const EMPTY_DIR_MODE: u32 = 0o777;

/// The sticky bit, which a memory-backed emptyDir's root keeps from its tmpfs.
const STICKY: u32 = 0o1000;

/// Why an emptyDir could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EmptyDirError {
    #[error("cannot resolve {}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is already a mount point of type {fs_type}", path.display())]
    OtherMount { path: PathBuf, fs_type: String },
    #[error("mount failed: {source}: mounting tmpfs on {}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error(transparent)]
    Fs(#[from] safe_fs::SafeFsError),
    #[error("emptyDir medium {0:?} is not supported on this node")]
    UnsupportedMedium(String),
    #[error("unknown storage medium {0:?}")]
    UnknownMedium(String),
}

/// For `medium: Memory`, mounts a tmpfs of `size_bytes` on the directory `dir` (which the
/// volume manager created safely) unless one is already there, and gives its root `mode`.
/// `mounts` is the current mount table.
pub(crate) fn set_up(
    mounter: &dyn Mounter,
    dir: &Path,
    source: &EmptyDirVolumeSource,
    size_bytes: u64,
    mode: u32,
    mounts: &[mountinfo::MountEntry],
) -> Result<(), EmptyDirError> {
    match source.medium.as_deref().unwrap_or("") {
        "" => Ok(()),
        "Memory" => {
            let canonical = dir
                .canonicalize()
                .map_err(|source| EmptyDirError::Resolve {
                    path: dir.to_path_buf(),
                    source,
                })?;
            if let Some(existing) = mountinfo::mount_at(mounts, &canonical) {
                if existing.fs_type == "tmpfs" {
                    return Ok(());
                }
                return Err(EmptyDirError::OtherMount {
                    path: dir.to_path_buf(),
                    fs_type: existing.fs_type.clone(),
                });
            }
            // Mounted through a descriptor of the directory opened without following symlinks.
            let fd = safe_fs::open_dir_abs(&canonical)?;
            mounter
                .mount_tmpfs(
                    fd.as_fd(),
                    &canonical,
                    (size_bytes > 0).then_some(size_bytes),
                )
                .map_err(|source| EmptyDirError::Mount {
                    path: dir.to_path_buf(),
                    source,
                })?;
            // A new tmpfs root is 1777: give it the volume's mode, through a descriptor, and
            // keep the sticky bit, as upstream does (it leaves the tmpfs root alone when the
            // permission bits already match; its e2e specs expect `dtrwxrwxrwx`).
            let root = safe_fs::open_dir_abs(&canonical)?;
            let root = nix::fcntl::openat(
                root.as_fd(),
                ".",
                nix::fcntl::OFlag::O_RDONLY
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|source| EmptyDirError::Open {
                path: dir.to_path_buf(),
                source,
            })?;
            Ok(safe_fs::set_mode(root.as_fd(), mode | STICKY, dir)?)
        }
        other if other.starts_with("HugePages") => {
            Err(EmptyDirError::UnsupportedMedium(other.to_string()))
        }
        other => Err(EmptyDirError::UnknownMedium(other.to_string())),
    }
}

/// Size of a memory-backed emptyDir: the smallest of the node's memory, the pod's memory limit
/// (when every container has one) and the volume's `sizeLimit`.
pub(crate) fn memory_size(source: &EmptyDirVolumeSource, pod: &Pod, node_memory_bytes: u64) -> u64 {
    let mut size = node_memory_bytes;
    let mut tighten = |candidate: u64| {
        if candidate > 0 && (size == 0 || candidate < size) {
            size = candidate;
        }
    };
    if let Some(limit) = pod_memory_limit(pod) {
        tighten(limit);
    }
    if let Some(q) = &source.size_limit
        && let Ok(q) = quantity::parse(&q.0)
        && !q.is_zero()
    {
        tighten(u64::try_from(q.value()).unwrap_or(0));
    }
    size
}

/// The pod's memory limit: the sum over its containers, or the largest init container's if
/// that is more; None when a container has no memory limit.
fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| -> Option<u64> {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        let v = quantity::parse(&q.0).ok()?.value();
        u64::try_from(v).ok().filter(|v| *v > 0)
    };
    let mut sum = 0u64;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    let mut init_max = 0u64;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(limit(c)?);
    }
    (spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len) > 0)
        .then_some(sum.max(init_max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn container(memory: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            resources: memory.map(|m| ResourceRequirements {
                limits: Some(BTreeMap::from([("memory".to_string(), Quantity(m.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: Some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn source(size: Option<&str>) -> EmptyDirVolumeSource {
        EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: size.map(|s| Quantity(s.into())),
            ..Default::default()
        }
    }

    #[test]
    fn memory_size_table() {
        const MI: u64 = 1024 * 1024;
        let node = 4096 * MI;
        let limited = pod(
            vec![container(Some("64Mi")), container(Some("32Mi"))],
            vec![],
        );
        let partly = pod(vec![container(Some("64Mi")), container(None)], vec![]);
        let big_init = pod(
            vec![container(Some("64Mi"))],
            vec![container(Some("200Mi"))],
        );
        let cases: &[(&str, &EmptyDirVolumeSource, &Pod, u64)] = &[
            (
                "sizeLimit wins when smallest",
                &source(Some("16Mi")),
                &limited,
                16 * MI,
            ),
            ("pod limit sum", &source(None), &limited, 96 * MI),
            (
                "sizeLimit above pod limit",
                &source(Some("1Gi")),
                &limited,
                96 * MI,
            ),
            (
                "a container without limit: node",
                &source(None),
                &partly,
                node,
            ),
            (
                "sizeLimit without pod limit",
                &source(Some("8Mi")),
                &partly,
                8 * MI,
            ),
            ("init container larger", &source(None), &big_init, 200 * MI),
            ("zero sizeLimit ignored", &source(Some("0")), &partly, node),
        ];
        for (what, src, pod, want) in cases {
            assert_eq!(memory_size(src, pod, node), *want, "{what}");
        }
    }
}
