//! Setting up a `persistentVolumeClaim` volume once [`super::persistent`] has resolved it: a
//! `local` volume's path is bind-mounted at `<pod>/volumes/kubernetes.io~local-volume/<pv>`
//! (upstream's local plugin; a mount already there, as after a restart, is kept) and given
//! to the fsGroup unless read-only; a `hostPath` volume is the node's path, checked against
//! its `type`. Teardown is the pod's (`remove_checked`): the bind mount is unmounted before
//! anything is removed, so the volume's own data is never deleted.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolumeClaimVolumeSource, Pod, Volume};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::csi;
use super::mountinfo::{self, MountEntry};
use super::ownership::FsGroup;
use super::persistent::{self, Served, VolumeUse};
use super::{VolumeManager, VolumeProblem, host_path, safe_fs};
use crate::kubelet::api_objects::PodObjects;

/// Whether a persistent volume's required node affinity admits this node. The default (no
/// node known, as in unit tests of other volume types) admits every volume.
#[derive(Clone)]
pub(crate) struct AffinityCheck(Arc<dyn Fn(&NodeSelector) -> bool + Send + Sync>);

impl AffinityCheck {
    pub(crate) fn new(check: impl Fn(&NodeSelector) -> bool + Send + Sync + 'static) -> Self {
        AffinityCheck(Arc::new(check))
    }
}

impl Default for AffinityCheck {
    fn default() -> Self {
        AffinityCheck::new(|_| true)
    }
}

impl std::fmt::Debug for AffinityCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AffinityCheck")
    }
}

/// A local volume's path could not be bind-mounted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocalError {
    #[error("local volume path {}: {errno}", path.display())]
    Source { path: PathBuf, errno: Errno },
    /// Upstream's kubelet check (the scheduler checks it too).
    #[error("volume uses the ReadWriteOncePod access mode and is already in use by another pod")]
    InUse,
    #[error("bind-mounting local volume path {} at {}: {errno}", source_path.display(), target.display())]
    Bind {
        source_path: PathBuf,
        target: PathBuf,
        errno: Errno,
    },
}

/// How the pod's containers use the volume `name`.
fn usage(pod: &Pod, name: &str) -> VolumeUse {
    let mut out = VolumeUse::default();
    let spec = pod.spec.as_ref();
    let containers = spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        out.mounts |= c.volume_mounts.iter().flatten().any(|m| m.name == name);
        out.devices |= c.volume_devices.iter().flatten().any(|d| d.name == name);
    }
    out
}

/// How a claim's volume is set up: with the pod's fsGroup, and, for a CSI volume published
/// before, published again without staging (`requiresRepublish`, see
/// `csi::republish`).
#[derive(Clone, Copy, Debug)]
pub(super) struct ClaimSetUp {
    pub fs_group: Option<FsGroup>,
    pub remount: bool,
}

impl VolumeManager {
    /// Resolves the claim and sets its volume up; the volume's path and whether it is mounted
    /// read-only.
    pub(super) fn set_up_claim(
        &self,
        pod: &Pod,
        volume: &Volume,
        source: &PersistentVolumeClaimVolumeSource,
        objects: &PodObjects,
        how: ClaimSetUp,
        table: &[MountEntry],
    ) -> Result<(PathBuf, bool), VolumeProblem> {
        let ClaimSetUp { fs_group, remount } = how;
        let namespace = crate::base::podspec::pod::namespace(pod);
        let claim = objects.claim(&source.claim_name);
        let pv = claim
            .as_ref()
            .ok()
            .and_then(|c| crate::kubelet::api_objects::claims::bound_volume(c))
            .map(|name| objects.persistent_volume(name));
        let check = &self.pv_affinity.0;
        let resolved = persistent::resolve(
            &volume.name,
            namespace,
            source,
            &claim,
            pv.as_ref(),
            usage(pod, &volume.name),
            &|selector| check(selector),
        )?;
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let claim_name = &source.claim_name;
        let path = match &resolved.served {
            Served::HostPath { path, kind } => {
                let path = PathBuf::from(path);
                if !path.is_absolute() {
                    return Err(VolumeProblem::RelativeHostPath(path.display().to_string()));
                }
                host_path::check_type(&path, kind)?;
                path
            }
            Served::Local { path } => {
                super::check_component("volume name", &resolved.pv)?;
                let dir = self.bind_local(uid, &resolved, path, table)?;
                if let (Some(group), false) = (fs_group, resolved.read_only) {
                    super::set_ownership(pod, &volume.name, &dir, group, false, false)?;
                }
                dir
            }
            Served::Csi {
                source,
                access_modes,
                mount_options,
            } => {
                let pv = csi::mount::PersistentCsi {
                    pv_name: &resolved.pv,
                    source,
                    access_modes,
                    mount_options,
                    read_only: resolved.read_only,
                    pod_volume: &volume.name,
                    claim: claim_name,
                    remount,
                };
                let set_up = self.set_up_csi_persistent(pod, &pv)?;
                return Ok((set_up.path, set_up.read_only));
            }
        };
        tracing::debug!(
            pod = %crate::base::podspec::full_name(pod),
            volume = %volume.name,
            unique_name = %persistent::unique_name(&resolved, uid),
            path = %path.display(),
            "persistent volume set up"
        );
        Ok((path, resolved.read_only))
    }

    /// Bind-mounts `source` at the pod's local-volume directory for the volume, unless a
    /// mount is already there (set up before, or before a restart: kept as it is).
    fn bind_local(
        &self,
        uid: &str,
        resolved: &persistent::Resolved,
        source: &Path,
        table: &[MountEntry],
    ) -> Result<PathBuf, VolumeProblem> {
        let pv = resolved.pv.as_str();
        let dir = self.volume_dir(uid, persistent::LOCAL_PLUGIN, pv);
        // Checked before the directory is made: making it gives it a mode, which must never
        // reach the root of the volume mounted there.
        if let Ok(real) = dir.canonicalize()
            && mountinfo::mount_at(table, &real).is_some()
        {
            return Ok(dir);
        }
        if resolved.once_per_pod && self.mounted_by_another_pod(uid, pv, table) {
            return Err(LocalError::InUse.into());
        }
        let dir = self.make_volume_dir(uid, persistent::LOCAL_PLUGIN, pv, 0o750)?;
        let source_error = |errno| LocalError::Source {
            path: source.to_path_buf(),
            errno,
        };
        // The administrator's path, followed as upstream's `mount --bind` follows it.
        let src = nix::fcntl::open(
            source,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(source_error)?;
        let target = safe_fs::open_dir_abs(&dir)?;
        self.mounter
            .bind(src.as_fd(), target.as_fd(), &dir)
            .map_err(|errno| LocalError::Bind {
                source_path: source.to_path_buf(),
                target: dir.clone(),
                errno,
            })?;
        tracing::info!(pod_uid = %uid, pv, path = %dir.display(), "local volume bind-mounted");
        Ok(dir)
    }

    /// Whether another pod on this node has the local volume `pv` mounted.
    fn mounted_by_another_pod(&self, uid: &str, pv: &str, table: &[MountEntry]) -> bool {
        let Ok(pods) = self.root_dir.join("pods").canonicalize() else {
            return false;
        };
        let tail = Path::new("volumes").join(persistent::LOCAL_PLUGIN).join(pv);
        table.iter().any(|m| {
            m.mount_point
                .strip_prefix(&pods)
                .ok()
                .and_then(|rest| {
                    let mut parts = rest.components();
                    let owner = parts.next()?.as_os_str().to_str()?.to_string();
                    (parts.as_path() == tail && owner != uid).then_some(())
                })
                .is_some()
        })
    }
}
