//! The volume manager: sets up a pod's volumes before its containers run, turns each
//! container's `volumeMounts` into CRI mounts, and tears the volumes down with the pod.
//!
//! Volumes live where upstream puts them, `<root>/pods/<uid>/volumes/<plugin>/<name>`:
//!
//! | volume | plugin directory | what is there |
//! | --- | --- | --- |
//! | `emptyDir` | `kubernetes.io~empty-dir` | a 0777 directory; a tmpfs for `medium: Memory` |
//! | `downwardAPI` | `kubernetes.io~downward-api` | files written by the atomic writer |
//! | `projected` (downwardAPI sources) | `kubernetes.io~projected` | the same |
//! | `configMap` / `secret` marked optional | `kubernetes.io~configmap` / `~secret` | empty (no API server to read from) |
//! | `hostPath` | none | the node's path is mounted directly, checked against `type` |
//!
//! Everything else (persistent volumes, non-optional configMaps and secrets, service account
//! tokens) needs an API server or a storage plugin and fails to set up with a message saying so.

pub mod atomic_writer;
pub mod downward;
pub mod empty_dir;
pub mod host_path;
pub mod mountinfo;
pub mod subpath;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use crate::cri::proto::{Mount, MountPropagation};
use crate::runtime::translate::env::NodeAllocatable;

pub const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
pub const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
pub const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";
pub const CONFIG_MAP_PLUGIN: &str = "kubernetes.io~configmap";
pub const SECRET_PLUGIN: &str = "kubernetes.io~secret";

/// A volume could not be set up or mounted; the message follows upstream's `FailedMount` wording.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("MountVolume.SetUp failed for volume {volume:?} : {reason}")]
    SetUp { volume: String, reason: String },
    #[error("container {container:?}: volumeMount {name:?}: {reason}")]
    Mount {
        container: String,
        name: String,
        reason: String,
    },
    #[error("tearing down volumes of pod {uid}: {reason}")]
    TearDown { uid: String, reason: String },
}

/// Where each of a pod's volumes lives on the node, by volume name.
#[derive(Clone, Debug, Default)]
pub struct PodVolumes {
    pub paths: HashMap<String, PathBuf>,
    /// Volumes that are always mounted read-only (downwardAPI, projected, configMap, secret).
    pub read_only: HashSet<String>,
}

/// Sets volumes up under `<root>/pods/<uid>/volumes/<plugin>/<name>`.
#[derive(Clone, Debug)]
pub struct VolumeManager {
    pub root_dir: PathBuf,
    /// Node memory, the size of a memory-backed emptyDir when neither a sizeLimit nor a pod
    /// memory limit says otherwise.
    pub node_memory_bytes: u64,
}

/// How one volume is provided.
enum Plan<'a> {
    EmptyDir(&'a k8s_openapi::api::core::v1::EmptyDirVolumeSource),
    HostPath(&'a k8s_openapi::api::core::v1::HostPathVolumeSource),
    /// Files written by the atomic writer (downwardAPI, projected).
    Files(&'static str),
    /// An empty read-only directory (an optional configMap or secret we cannot read).
    Empty(&'static str),
}

impl VolumeManager {
    pub fn new(root_dir: PathBuf, node_memory_bytes: u64) -> Self {
        VolumeManager {
            root_dir,
            node_memory_bytes,
        }
    }

    /// `<root>/pods/<uid>/volumes`.
    pub fn pod_volumes_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid).join("volumes")
    }

    /// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.pod_volumes_dir(uid).join(plugin).join(name)
    }

    /// Sets up (idempotently) every volume of the pod.
    pub fn setup(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let mut out = PodVolumes::default();
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(out);
        };
        let mut mounts: Option<Vec<mountinfo::MountEntry>> = None;
        for volume in spec.volumes.iter().flatten() {
            let fail = |reason: String| VolumeError::SetUp {
                volume: volume.name.clone(),
                reason,
            };
            check_component("pod UID", uid).map_err(fail)?;
            check_component("volume name", &volume.name).map_err(fail)?;
            match plan(volume).map_err(fail)? {
                Plan::EmptyDir(source) => {
                    let dir = self.volume_dir(uid, EMPTY_DIR_PLUGIN, &volume.name);
                    let mut size = 0;
                    if source.medium.as_deref() == Some("Memory") {
                        size = empty_dir::memory_size(source, pod, self.node_memory_bytes);
                        if mounts.is_none() {
                            mounts =
                                Some(mountinfo::read().map_err(|e| {
                                    fail(format!("cannot read the mount table: {e}"))
                                })?);
                        }
                    }
                    empty_dir::set_up(&dir, source, size, mounts.as_deref().unwrap_or(&[]))
                        .map_err(fail)?;
                    out.paths.insert(volume.name.clone(), dir);
                }
                Plan::HostPath(source) => {
                    let path = PathBuf::from(&source.path);
                    if !path.is_absolute() {
                        return Err(fail(format!(
                            "hostPath {:?} is not an absolute path",
                            source.path
                        )));
                    }
                    host_path::check_type(&path, source.type_.as_deref().unwrap_or(""))
                        .map_err(fail)?;
                    out.paths.insert(volume.name.clone(), path);
                }
                Plan::Files(plugin) => {
                    let dir = self.volume_dir(uid, plugin, &volume.name);
                    self.write_files(pod, volume, &dir).map_err(fail)?;
                    out.paths.insert(volume.name.clone(), dir);
                    out.read_only.insert(volume.name.clone());
                }
                Plan::Empty(plugin) => {
                    let dir = self.volume_dir(uid, plugin, &volume.name);
                    empty_dir::ensure_dir(&dir, empty_dir::EMPTY_DIR_MODE).map_err(fail)?;
                    out.paths.insert(volume.name.clone(), dir);
                    out.read_only.insert(volume.name.clone());
                }
            }
        }
        Ok(out)
    }

    /// Writes the files of a downwardAPI or projected volume into `dir` (created when missing).
    fn write_files(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<bool, String> {
        let node = NodeAllocatable::detect(self.node_memory_bytes);
        let mut payload = atomic_writer::Payload::new();
        let mut errors = Vec::new();
        if let Some(source) = &volume.downward_api {
            downward::collect_items(
                pod,
                source.items.as_deref().unwrap_or(&[]),
                source.default_mode,
                &node,
                &mut payload,
                &mut errors,
            );
        } else if let Some(source) = &volume.projected {
            for projection in source.sources.iter().flatten() {
                if let Some(d) = &projection.downward_api {
                    downward::collect_items(
                        pod,
                        d.items.as_deref().unwrap_or(&[]),
                        source.default_mode,
                        &node,
                        &mut payload,
                        &mut errors,
                    );
                }
            }
        }
        match errors.len() {
            0 => {}
            1 => return Err(errors.remove(0)),
            _ => return Err(format!("[{}]", errors.join(", "))),
        }
        empty_dir::ensure_dir(dir, empty_dir::EMPTY_DIR_MODE)?;
        atomic_writer::write(dir, &payload)
    }

    /// The CRI mounts for one container's `volumeMounts`; `env` is the container's resolved
    /// environment, for `subPathExpr`.
    pub fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        volumes: &PodVolumes,
        env: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, VolumeError> {
        let _ = pod;
        let mut out = Vec::new();
        for vm in container.volume_mounts.iter().flatten() {
            let fail = |reason: String| VolumeError::Mount {
                container: container.name.clone(),
                name: vm.name.clone(),
                reason,
            };
            let Some(volume_path) = volumes.paths.get(&vm.name) else {
                return Err(fail(format!(
                    "cannot find volume {:?} to mount into container {:?}",
                    vm.name, container.name
                )));
            };
            let mut sub = vm.sub_path.clone().unwrap_or_default();
            if let Some(expr) = vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                sub = subpath::expand_expr(expr, env).map_err(fail)?;
            }
            let host_path = if sub.is_empty() {
                volume_path.clone()
            } else {
                subpath::resolve(volume_path, &sub, &vm.name, &container.name).map_err(fail)?
            };
            let propagation = match vm.mount_propagation.as_deref() {
                None | Some("") | Some("None") => MountPropagation::PropagationPrivate,
                Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => {
                    let privileged = container
                        .security_context
                        .as_ref()
                        .and_then(|s| s.privileged)
                        .unwrap_or(false);
                    if !privileged {
                        return Err(fail(
                            "Bidirectional mount propagation is available only to privileged containers"
                                .into(),
                        ));
                    }
                    MountPropagation::PropagationBidirectional
                }
                Some(other) => {
                    return Err(fail(format!("invalid MountPropagation mode: {other:?}")));
                }
            };
            let container_path = if vm.mount_path.starts_with('/') {
                vm.mount_path.clone()
            } else {
                format!("/{}", vm.mount_path)
            };
            out.push(Mount {
                container_path,
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: vm.read_only.unwrap_or(false) || volumes.read_only.contains(&vm.name),
                selinux_relabel: false,
                propagation: propagation as i32,
                ..Default::default()
            });
        }
        Ok(out)
    }

    /// Brings volumes whose content follows the pod (downwardAPI, projected) up to date; called
    /// on every sync of a running pod, cheap when nothing changed.
    pub fn refresh(&self, pod: &Pod) -> Result<(), VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        if check_component("pod UID", uid).is_err() {
            return Ok(());
        }
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let plugin = match plan(volume) {
                Ok(Plan::Files(plugin)) => plugin,
                _ => continue,
            };
            if check_component("volume name", &volume.name).is_err() {
                continue;
            }
            let dir = self.volume_dir(uid, plugin, &volume.name);
            // Not set up yet: setup will write it.
            if !dir.is_dir() {
                continue;
            }
            match self.write_files(pod, volume, &dir) {
                Ok(true) => tracing::info!(volume = %volume.name, "volume content updated"),
                Ok(false) => {}
                Err(reason) => {
                    return Err(VolumeError::SetUp {
                        volume: volume.name.clone(),
                        reason,
                    });
                }
            }
        }
        Ok(())
    }

    /// Unmounts and removes every volume of the pod. Mounts below the pod's volume directory
    /// are unmounted first (lazily if busy); nothing is deleted while a mount is left, and the
    /// deletion never follows a symlink, so a hostPath or anything outside the pod directory is
    /// never touched.
    pub fn teardown(&self, uid: &str) -> Result<(), VolumeError> {
        let fail = |reason: String| VolumeError::TearDown {
            uid: uid.to_string(),
            reason,
        };
        check_component("pod UID", uid).map_err(fail)?;
        let dir = self.pod_volumes_dir(uid);
        match std::fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(fail(format!("cannot stat {}: {e}", dir.display()))),
            // Not ours to follow: only the link goes.
            Ok(m) if !m.is_dir() => {
                return std::fs::remove_file(&dir)
                    .map_err(|e| fail(format!("cannot remove {}: {e}", dir.display())));
            }
            Ok(_) => {}
        }
        let real = dir
            .canonicalize()
            .map_err(|e| fail(format!("cannot resolve {}: {e}", dir.display())))?;
        let table =
            mountinfo::read().map_err(|e| fail(format!("cannot read the mount table: {e}")))?;
        for point in mountinfo::mounts_under(&table, &real) {
            if let Err(err) = nix::mount::umount2(&point, nix::mount::MntFlags::empty()) {
                tracing::warn!(path = %point.display(), error = %err, "unmount failed; detaching");
                nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH)
                    .map_err(|e| fail(format!("cannot unmount {}: {e}", point.display())))?;
            }
        }
        let table =
            mountinfo::read().map_err(|e| fail(format!("cannot read the mount table: {e}")))?;
        if let Some(left) = mountinfo::mounts_under(&table, &real).first() {
            return Err(fail(format!("{} is still mounted", left.display())));
        }
        match std::fs::remove_dir_all(&real) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(fail(format!("cannot remove {}: {e}", real.display()))),
        }
    }
}

/// Which plugin serves a volume, or why none can.
fn plan(volume: &Volume) -> Result<Plan<'_>, String> {
    if let Some(s) = &volume.empty_dir {
        return Ok(Plan::EmptyDir(s));
    }
    if let Some(s) = &volume.host_path {
        return Ok(Plan::HostPath(s));
    }
    if volume.downward_api.is_some() {
        return Ok(Plan::Files(DOWNWARD_API_PLUGIN));
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            let unsupported = if let Some(cm) = &source.config_map {
                (cm.optional != Some(true)).then(|| format!("configMap {:?}", cm.name))
            } else if let Some(secret) = &source.secret {
                (secret.optional != Some(true)).then(|| format!("secret {:?}", secret.name))
            } else if source.service_account_token.is_some() {
                Some("serviceAccountToken".to_string())
            } else if let Some(bundle) = &source.cluster_trust_bundle {
                (bundle.optional != Some(true)).then(|| "clusterTrustBundle".to_string())
            } else {
                None
            };
            if let Some(what) = unsupported {
                return Err(format!(
                    "projected source {what} is not supported without an apiserver"
                ));
            }
        }
        return Ok(Plan::Files(PROJECTED_PLUGIN));
    }
    if let Some(cm) = &volume.config_map {
        if cm.optional == Some(true) {
            return Ok(Plan::Empty(CONFIG_MAP_PLUGIN));
        }
        return Err(format!(
            "configmap {:?} not found: configMap volumes are not supported without an apiserver",
            cm.name
        ));
    }
    if let Some(secret) = &volume.secret {
        if secret.optional == Some(true) {
            return Ok(Plan::Empty(SECRET_PLUGIN));
        }
        return Err(format!(
            "secret {:?} not found: secret volumes are not supported without an apiserver",
            secret.secret_name.as_deref().unwrap_or("")
        ));
    }
    let kind = serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "with no source".to_string());
    Err(format!("volume type {kind} is not supported on this node"))
}

/// A single, harmless path component (a UID or a volume name becomes a directory name).
fn check_component(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("invalid {what} {name:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
