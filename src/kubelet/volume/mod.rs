//! The volume manager: sets up a pod's volumes before its containers run, turns each
//! container's `volumeMounts` into CRI mounts, and tears the volumes down with the pod.
//!
//! Volumes live where upstream puts them, `<root>/pods/<uid>/volumes/<plugin>/<name>`:
//!
//! | volume | plugin directory | what is there |
//! | --- | --- | --- |
//! | `emptyDir` | `kubernetes.io~empty-dir` | a 0777 directory; a tmpfs for `medium: Memory` |
//! | `downwardAPI` | `kubernetes.io~downward-api` | files written by the atomic writer |
//! | `projected` | `kubernetes.io~projected` | the same, on a tmpfs with an API server |
//! | `configMap` | `kubernetes.io~configmap` | the object's keys, by the atomic writer |
//! | `secret` | `kubernetes.io~secret` | the same, on a tmpfs (never on the node's disk) |
//! | `hostPath` | none | the node's path is mounted directly, checked against `type` |
//!
//! The objects (configMaps, secrets, service-account tokens) are read before the volume
//! code runs and handed in as [`PodObjects`] (see `crate::kubelet::api_objects`); the files follow
//! the objects on every sync of a running pod ([`VolumeManager::refresh_with`]), except
//! through a `subPath` mount, which keeps the file it was started with, as upstream.
//! Without an API server (standalone) a configMap or secret volume marked optional is an
//! empty directory, and any other, as a serviceAccountToken source, fails to set up.
//!
//! With `securityContext.fsGroup` the emptyDir, downwardAPI, projected, configMap and secret
//! volumes are given to that group (see [`ownership`]); hostPath volumes never are.
//!
//! A `subPath` is opened without following symlinks and bind-mounted under
//! `<root>/pods/<uid>/volume-subpaths` (see [`subpath`]); the runtime mounts that private path.
//! Everything set up or torn down here is reached from the canonical `<root>/pods` without
//! following a symlink, so neither a hostile UID nor a container's symlink can make it touch
//! anything outside the pod's own directory.
//!
//! A CSI inline ephemeral volume (`csi`) is published by its driver, registered through the
//! plugin watcher, to `kubernetes.io~csi/<name>/mount` (see [`csi`]). A
//! `persistentVolumeClaim` is resolved to its bound volume, and `local`, `hostPath` and `csi`
//! persistent volumes are served (see [`persistent`]); everything else (network filesystems,
//! in-tree cloud disks, …) fails to set up with a message saying so.
//!
//! An image volume (`image`) has nothing on the node to set up: the runtime mounts the image
//! the executor pulled (`crate::kubelet::runtime::image_volumes`), and its mounts are CRI
//! image mounts (see [`VolumeManager::container_mounts`]).

pub(crate) mod atomic_writer;
pub(crate) mod backoff;
pub(crate) mod csi;
pub(crate) mod downward;
pub(crate) mod empty_dir;
pub(crate) mod host_path;
pub(crate) mod mounter;
pub(crate) mod mountinfo;
pub(crate) mod ownership;
pub(crate) mod persistent;
pub(crate) mod persistent_setup;
pub(crate) mod projection;
pub(crate) mod safe_fs;
pub(crate) mod subpath;

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use crate::base::clock;
use crate::base::podspec::resources::NodeAllocatable;
use crate::clients::cri::proto::{ImageSpec, Mount, MountPropagation};
use crate::kubelet::api_objects::{ObjectError, PodObjects, TokenError};
use mounter::Mounter;
use ownership::FsGroup;
use safe_fs::SafeFsError;

pub(crate) const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
pub(crate) const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
pub(crate) const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";
pub(crate) const CONFIG_MAP_PLUGIN: &str = "kubernetes.io~configmap";
pub(crate) const SECRET_PLUGIN: &str = "kubernetes.io~secret";

/// A volume could not be set up or mounted; the message follows upstream's `FailedMount` wording.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VolumeError {
    #[error("MountVolume.SetUp failed for volume {volume:?} : {reason}")]
    SetUp {
        volume: String,
        #[source]
        reason: Box<VolumeProblem>,
    },
    /// Upstream fails these before the set-up proper (a CSI driver's lifecycle modes).
    #[error("MountVolume.NewMounter initialization failed for volume {volume:?} : {reason}")]
    NewMounter {
        volume: String,
        #[source]
        reason: Box<VolumeProblem>,
    },
    #[error("container {container:?}: volumeMount {name:?}: {reason}")]
    Mount {
        container: String,
        name: String,
        #[source]
        reason: Box<VolumeProblem>,
    },
    /// A claim that does not lead to a volume that can be served (upstream's populator
    /// error, as `WaitForAttachAndMount` reports it).
    #[error(
        "unmounted volumes=[{volume}], unattached volumes=[], failed to process volumes=[{volume}]: {reason}"
    )]
    Process {
        volume: String,
        #[source]
        reason: Box<persistent::PersistentError>,
    },
    /// An attachable volume the attach/detach controller has not attached to this node yet
    /// (upstream's `WaitForAttachAndMount` names it unmounted and unattached).
    #[error(
        "unmounted volumes=[{volume}], unattached volumes=[{volume}], failed to process volumes=[]: {reason}"
    )]
    Unattached {
        volume: String,
        #[source]
        reason: Box<VolumeProblem>,
    },
    /// The persistent volume's node affinity leaves this node out.
    #[error(
        "MountVolume.NodeAffinity check failed for volume {pv:?} : no matching NodeSelectorTerms"
    )]
    NodeAffinity { pv: String },
    #[error("tearing down volumes of pod {uid}: {reason}")]
    TearDown {
        uid: String,
        #[source]
        reason: Box<VolumeProblem>,
    },
}

/// What went wrong with one volume or volume mount.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VolumeProblem {
    #[error(transparent)]
    Component(#[from] InvalidComponent),
    #[error(transparent)]
    FsGroup(#[from] ownership::FsGroupError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Dir(#[from] VolumeSetupError),
    #[error("cannot read the mount table: {0}")]
    MountTable(#[source] std::io::Error),
    #[error(transparent)]
    EmptyDir(#[from] empty_dir::EmptyDirError),
    #[error(transparent)]
    Ownership(#[from] ownership::OwnershipError),
    #[error("hostPath {0:?} is not an absolute path")]
    RelativeHostPath(String),
    #[error(transparent)]
    HostPath(#[from] host_path::HostPathError),
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    NoVolume { volume: String, container: String },
    #[error(transparent)]
    SubPathExpr(#[from] subpath::MissingVars),
    #[error(transparent)]
    SubPath(#[from] subpath::SubPathError),
    #[error("Bidirectional mount propagation is available only to privileged containers")]
    BidirectionalUnprivileged,
    #[error("invalid MountPropagation mode: {0:?}")]
    Propagation(String),
    #[error(transparent)]
    PodDir(#[from] PodDirError),
    #[error(transparent)]
    Fs(#[from] SafeFsError),
    #[error(transparent)]
    Csi(#[from] csi::CsiError),
    #[error(transparent)]
    Persistent(#[from] persistent::PersistentError),
    #[error(transparent)]
    Local(#[from] persistent_setup::LocalError),
    /// The executor had no pulled image for the volume (its pull is what the container waits
    /// for; this is reached only if that step was skipped).
    #[error("image volume {0:?} has no pulled image")]
    ImageNotPulled(String),
    /// Upstream's validation refuses `subPathExpr` into an image volume.
    #[error("subPathExpr: Invalid value: {0:?}: not allowed in image volume sources")]
    ImageSubPathExpr(String),
}

/// The files of a downwardAPI, projected, configMap or secret volume could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilesError {
    /// One error per source or item that has no value, shown as upstream aggregates them.
    #[error("{}", show_items(.0))]
    Sources(Vec<SourceError>),
    #[error(transparent)]
    Write(#[from] atomic_writer::WriteError),
}

/// Why one item or source of a volume has no value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error(transparent)]
    Item(#[from] downward::ItemError),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Key(#[from] projection::ProjectionError),
    #[error(transparent)]
    Token(#[from] TokenError),
}

fn show_items<T: std::fmt::Display>(errors: &[T]) -> String {
    match errors {
        [one] => one.to_string(),
        many => {
            let all: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        }
    }
}

/// Why no plugin serves a volume on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    #[error("projected source {0} is not supported without an apiserver")]
    ProjectedSource(String),
    #[error("configmap {0:?} not found: configMap volumes are not supported without an apiserver")]
    ConfigMap(String),
    #[error("secret {0:?} not found: secret volumes are not supported without an apiserver")]
    Secret(String),
    #[error("volume type {0} is not supported on this node")]
    Unsupported(String),
}

/// A name that is not one harmless path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name:?}")]
pub(crate) struct InvalidComponent {
    pub what: &'static str,
    pub name: String,
}

/// The pod directory could not be looked at.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PodDirError {
    #[error(transparent)]
    Invalid(#[from] InvalidComponent),
    #[error("cannot resolve {}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Fs(#[from] SafeFsError),
}

/// Where each of a pod's volumes lives on the node, by volume name.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodVolumes {
    pub paths: HashMap<String, PathBuf>,
    /// Volumes that are always mounted read-only (downwardAPI, projected, configMap, secret).
    pub read_only: HashSet<String>,
    /// Image volumes: mounted by the runtime from the pulled image, not from a node path.
    pub images: HashSet<String>,
}

impl PodVolumes {
    /// Adds a volume that was set up.
    pub(crate) fn add(&mut self, name: String, volume: SetUpVolume) {
        if volume.read_only {
            self.read_only.insert(name.clone());
        }
        if volume.image {
            self.images.insert(name.clone());
        }
        self.paths.insert(name, volume.path);
    }
}

/// One volume, set up.
#[derive(Clone, Debug)]
pub(crate) struct SetUpVolume {
    pub path: PathBuf,
    /// Always mounted read-only (downwardAPI, projected, configMap, secret).
    pub read_only: bool,
    /// An image volume: no node path (`path` is empty), the runtime mounts the image.
    pub image: bool,
}

/// What one try at setting up a volume came to.
#[derive(Debug)]
pub(crate) struct VolumeAttempt {
    pub name: String,
    pub result: Result<SetUpVolume, VolumeError>,
}

/// Upstream's name of the plugin that serves a volume (`storage_operation_duration_seconds`'
/// `volume_plugin`), from its source; `unsupported` for a source no plugin here serves.
pub(crate) fn plugin_name(volume: &Volume) -> &'static str {
    if volume.empty_dir.is_some() {
        "kubernetes.io/empty-dir"
    } else if volume.host_path.is_some() {
        "kubernetes.io/host-path"
    } else if volume.downward_api.is_some() {
        "kubernetes.io/downward-api"
    } else if volume.projected.is_some() {
        "kubernetes.io/projected"
    } else if volume.config_map.is_some() {
        "kubernetes.io/configmap"
    } else if volume.secret.is_some() {
        "kubernetes.io/secret"
    } else if volume.csi.is_some() {
        csi::CSI_PLUGIN_NAME
    } else if volume.image.is_some() {
        "kubernetes.io/image"
    } else {
        "unsupported"
    }
}

/// A fingerprint of what can change while a volume waits to be set up again: the configMaps,
/// secrets and tokens it is made from, as last read (each object's resource version, or why
/// it could not be had). The same reads give the same value; an object that appears or
/// changes gives another (see [`backoff`]).
pub(crate) fn volume_inputs(pod: &Pod, volume: &Volume, objects: &PodObjects) -> u64 {
    use std::hash::{Hash, Hasher};
    let namespace = crate::base::podspec::pod::namespace(pod);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let config_map = |name: &str, h: &mut std::collections::hash_map::DefaultHasher| {
        ("configMap", name).hash(h);
        match objects.config_map(namespace, name) {
            Ok(cm) => cm.metadata.resource_version.hash(h),
            Err(e) => e.to_string().hash(h),
        }
    };
    let secret = |name: &str, h: &mut std::collections::hash_map::DefaultHasher| {
        ("secret", name).hash(h);
        match objects.secret(namespace, name) {
            Ok(s) => s.metadata.resource_version.hash(h),
            Err(e) => e.to_string().hash(h),
        }
    };
    if let Some(cm) = &volume.config_map {
        config_map(&cm.name, &mut hasher);
    }
    if let Some(c) = &volume.persistent_volume_claim {
        // The claim and its volume as read: a claim that binds changes this.
        let claim = objects.claim(&c.claim_name);
        "claim".hash(&mut hasher);
        hash_read(&claim, &mut hasher);
        let pv = claim
            .as_ref()
            .ok()
            .and_then(|c| crate::kubelet::api_objects::claims::bound_volume(c))
            .map(|name| objects.persistent_volume(name));
        "pv".hash(&mut hasher);
        if let Some(pv) = &pv {
            hash_read(pv, &mut hasher);
        }
    }
    if let Some(s) = &volume.secret {
        secret(s.secret_name.as_deref().unwrap_or(""), &mut hasher);
    }
    let sources = volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten());
    for (index, source) in sources.enumerate() {
        if let Some(cm) = &source.config_map {
            config_map(&cm.name, &mut hasher);
        }
        if let Some(s) = &source.secret {
            secret(&s.name, &mut hasher);
        }
        if source.service_account_token.is_some() {
            // Whether there is a token, not its value (a refreshed token changes nothing).
            let token = objects.token(&volume.name, index);
            ("token", index, token.err().map(|e| e.to_string())).hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// Hashes what a read of an object gave: its resource version, or why it could not be read.
fn hash_read<
    T: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
>(
    read: &Result<Arc<T>, crate::kubelet::api_objects::claims::FetchError>,
    hasher: &mut impl std::hash::Hasher,
) {
    use std::hash::Hash;
    match read {
        Ok(o) => ("version", &o.metadata().resource_version).hash(hasher),
        Err(e) => ("error", e.to_string()).hash(hasher),
    }
}

/// Sets volumes up under `<root>/pods/<uid>/volumes/<plugin>/<name>`.
#[derive(Clone, Debug)]
pub(crate) struct VolumeManager {
    pub root_dir: PathBuf,
    /// Node memory, the size of a memory-backed emptyDir when neither a sizeLimit nor a pod
    /// memory limit says otherwise.
    pub node_memory_bytes: u64,
    /// What a container that sets no limit may use (downward API `resourceFieldRef`).
    pub allocatable: NodeAllocatable,
    /// Every mount and unmount goes through it (the kernel's, or a test's fake).
    pub mounter: Arc<dyn Mounter>,
    /// Whether a persistent volume's required node affinity admits this node.
    pub pv_affinity: persistent_setup::AffinityCheck,
}

/// How one volume is provided.
enum Plan<'a> {
    EmptyDir(&'a k8s_openapi::api::core::v1::EmptyDirVolumeSource),
    HostPath(&'a k8s_openapi::api::core::v1::HostPathVolumeSource),
    /// A claim, resolved to its bound persistent volume.
    Claim(&'a k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource),
    /// Files written by the atomic writer (downwardAPI, projected, configMap).
    Files(&'static str),
    /// The same on a tmpfs (secret, and projected with an API server: never on disk).
    MemoryFiles(&'static str),
    /// An empty read-only directory (an optional configMap or secret we cannot read).
    Empty(&'static str),
    /// Published by a registered CSI driver (an inline ephemeral volume).
    Csi(&'a k8s_openapi::api::core::v1::CSIVolumeSource),
    /// An image the runtime mounts: nothing to do on the node.
    Image,
}

impl VolumeManager {
    pub(crate) fn new(
        root_dir: PathBuf,
        node_memory_bytes: u64,
        allocatable: NodeAllocatable,
        mounter: Arc<dyn Mounter>,
    ) -> Self {
        VolumeManager {
            root_dir,
            node_memory_bytes,
            allocatable,
            mounter,
            pv_affinity: persistent_setup::AffinityCheck::default(),
        }
    }

    /// Checks persistent volumes' node affinity with `check` (this node's labels and name).
    pub(crate) fn with_pv_affinity(mut self, check: persistent_setup::AffinityCheck) -> Self {
        self.pv_affinity = check;
        self
    }

    /// `<root>/pods/<uid>/volumes`.
    pub(crate) fn pod_volumes_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid).join("volumes")
    }

    /// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
    pub(crate) fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.pod_volumes_dir(uid).join(plugin).join(name)
    }

    /// Sets up (idempotently) every volume of the pod, with no API server to read from.
    #[cfg(test)]
    pub(crate) fn setup(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        self.setup_with(pod, &PodObjects::standalone())
    }

    /// Sets up (idempotently) every volume of the pod, with the objects read for it; the
    /// first error in the spec's order.
    #[cfg(test)]
    pub(crate) fn setup_with(
        &self,
        pod: &Pod,
        objects: &PodObjects,
    ) -> Result<PodVolumes, VolumeError> {
        let mut out = PodVolumes::default();
        for attempt in self.setup_each(pod, objects, &|_| true) {
            out.add(attempt.name, attempt.result?);
        }
        Ok(out)
    }

    /// Sets up (idempotently) each volume of the pod that `due` names, on its own: one that
    /// fails does not keep the others from being set up. Each try is timed into upstream's
    /// `storage_operation_duration_seconds` (`volume_mount`).
    pub(crate) fn setup_each(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        due: &dyn Fn(&str) -> bool,
    ) -> Vec<VolumeAttempt> {
        self.attempt_each(pod, objects, due, false)
    }

    /// Publishes again the CSI volumes `due` names, published before (`requiresRepublish`,
    /// see [`csi::republish`]): `NodePublishVolume` with fresh tokens, no stage; timed as
    /// upstream times its remounts, as `volume_mount`.
    pub(crate) fn republish_each(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        due: &dyn Fn(&str) -> bool,
    ) -> Vec<VolumeAttempt> {
        self.attempt_each(pod, objects, due, true)
    }

    /// The pod's published CSI volumes, each with whether its driver asks for a republish.
    pub(crate) fn csi_published(&self, uid: &str) -> Vec<csi::republish::Published> {
        match self.existing_pod_dir(uid) {
            Ok(Some(dir)) => csi::mount::published(&dir),
            _ => Vec::new(),
        }
    }

    fn attempt_each(
        &self,
        pod: &Pod,
        objects: &PodObjects,
        due: &dyn Fn(&str) -> bool,
        remount: bool,
    ) -> Vec<VolumeAttempt> {
        let mut mounts: Option<Vec<mountinfo::MountEntry>> = None;
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        let mut out = Vec::new();
        for volume in volumes.filter(|v| due(&v.name)) {
            let started = clock::instant();
            let result = self
                .setup_one(pod, volume, objects, &mut mounts, remount)
                .map_err(|reason| setup_error(&volume.name, reason));
            let plugin = plugin_name(volume);
            let status = if result.is_ok() {
                "success"
            } else {
                "fail-unknown"
            };
            crate::base::metrics::KUBELET
                .storage_operation_duration
                .observe(
                    &[plugin, "volume_mount", status, "false"],
                    started.elapsed().as_secs_f64(),
                );
            out.push(VolumeAttempt {
                name: volume.name.clone(),
                result,
            });
        }
        out
    }

    /// Makes the pod's directory `<root>/pods/<uid>` (mode 0750, as upstream's
    /// `makePodDataDirs`), whether or not the pod has volumes; returns its path.
    pub(crate) fn ensure_pod_dir(&self, uid: &str) -> Result<PathBuf, VolumeSetupError> {
        self.make_pod_dir(uid)
    }

    /// Sets up one volume. `mounts`: the mount table, read once for all volumes that need it;
    /// `remount`: a CSI volume published before is published again.
    fn setup_one(
        &self,
        pod: &Pod,
        volume: &Volume,
        objects: &PodObjects,
        mounts: &mut Option<Vec<mountinfo::MountEntry>>,
        remount: bool,
    ) -> Result<SetUpVolume, VolumeProblem> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        check_component("pod UID", uid)?;
        check_component("volume name", &volume.name)?;
        let fs_group = FsGroup::from_pod(pod)?;
        let mut mount_table = || -> Result<Vec<mountinfo::MountEntry>, VolumeProblem> {
            if mounts.is_none() {
                *mounts = Some(
                    self.mounter
                        .mount_table()
                        .map_err(VolumeProblem::MountTable)?,
                );
            }
            Ok(mounts.clone().unwrap_or_default())
        };
        let (path, read_only) = match plan(volume, objects.from_api)? {
            Plan::EmptyDir(source) => {
                let mode = root_mode(fs_group, false);
                let dir = self.make_volume_dir(uid, EMPTY_DIR_PLUGIN, &volume.name, mode)?;
                let mut size = 0;
                let mut table = Vec::new();
                if source.medium.as_deref() == Some("Memory") {
                    size = empty_dir::memory_size(source, pod, self.node_memory_bytes);
                    table = mount_table()?;
                }
                empty_dir::set_up(&*self.mounter, &dir, source, size, mode, &table)?;
                if let Some(group) = fs_group {
                    set_ownership(pod, &volume.name, &dir, group, false, true)?;
                }
                (dir, false)
            }
            Plan::HostPath(source) => {
                let path = PathBuf::from(&source.path);
                if !path.is_absolute() {
                    return Err(VolumeProblem::RelativeHostPath(source.path.clone()));
                }
                host_path::check_type(&path, source.type_.as_deref().unwrap_or(""))?;
                (path, false)
            }
            Plan::Claim(source) => {
                let table = mount_table()?;
                let how = persistent_setup::ClaimSetUp { fs_group, remount };
                self.set_up_claim(pod, volume, source, objects, how, &table)?
            }
            Plan::Files(plugin) => {
                // The content first: a missing object leaves nothing behind, as upstream.
                let payload = self.payload(pod, volume, objects, fs_group)?;
                let mode = root_mode(fs_group, true);
                let dir = self.make_volume_dir(uid, plugin, &volume.name, mode)?;
                write_payload(&dir, &payload, fs_group)?;
                (dir, true)
            }
            Plan::MemoryFiles(plugin) => {
                let payload = self.payload(pod, volume, objects, fs_group)?;
                let mode = root_mode(fs_group, true);
                let dir = self.make_volume_dir(uid, plugin, &volume.name, mode)?;
                let memory = k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: None,
                    mode: None,
                };
                let size = empty_dir::memory_size(&memory, pod, self.node_memory_bytes);
                let table = mount_table()?;
                empty_dir::set_up(&*self.mounter, &dir, &memory, size, mode, &table)?;
                write_payload(&dir, &payload, fs_group)?;
                (dir, true)
            }
            Plan::Csi(source) => {
                let dir = self.make_volume_dir(uid, csi::CSI_PLUGIN_DIR, &volume.name, 0o750)?;
                let target = csi::mount::PodTarget {
                    pod,
                    dir: &dir,
                    fs_group,
                    remount,
                };
                let path = csi::mount::set_up_inline(&target, &volume.name, source)?;
                (path, source.read_only == Some(true))
            }
            Plan::Empty(plugin) => {
                let dir =
                    self.make_volume_dir(uid, plugin, &volume.name, root_mode(fs_group, true))?;
                if let Some(group) = fs_group {
                    set_ownership(pod, &volume.name, &dir, group, true, true)?;
                }
                (dir, true)
            }
            Plan::Image => {
                return Ok(SetUpVolume {
                    path: PathBuf::new(),
                    read_only: true,
                    image: true,
                });
            }
        };
        Ok(SetUpVolume {
            path,
            read_only,
            image: false,
        })
    }

    /// The files of a downwardAPI, projected, configMap or secret volume. Errors are
    /// collected per source and item, as upstream aggregates them.
    fn payload(
        &self,
        pod: &Pod,
        volume: &Volume,
        objects: &PodObjects,
        fs_group: Option<FsGroup>,
    ) -> Result<atomic_writer::Payload, FilesError> {
        let node = self.allocatable;
        let namespace = crate::base::podspec::pod::namespace(pod);
        let mut payload = atomic_writer::Payload::new();
        let mut errors: Vec<SourceError> = Vec::new();
        let mut item_errors = Vec::new();
        if let Some(source) = &volume.downward_api {
            downward::collect_items(
                pod,
                source.items.as_deref().unwrap_or(&[]),
                source.default_mode,
                &node,
                &mut payload,
                &mut item_errors,
            );
        } else if let Some(source) = &volume.config_map {
            let mode = source.default_mode.unwrap_or(downward::DEFAULT_MODE);
            let optional = source.optional == Some(true);
            let items = source.items.as_deref().unwrap_or(&[]);
            match objects.config_map(namespace, &source.name) {
                Ok(cm) => {
                    projection::config_map_payload(cm, items, mode, optional, &mut payload)
                        .map_err(|e| errors.push(e.into()))
                        .ok();
                }
                Err(e) if e.is_not_found() && optional => {}
                Err(e) => errors.push(e.into()),
            }
        } else if let Some(source) = &volume.secret {
            let mode = source.default_mode.unwrap_or(downward::DEFAULT_MODE);
            let optional = source.optional == Some(true);
            let items = source.items.as_deref().unwrap_or(&[]);
            let name = source.secret_name.as_deref().unwrap_or("");
            match objects.secret(namespace, name) {
                Ok(secret) => {
                    projection::secret_payload(secret, items, mode, optional, &mut payload)
                        .map_err(|e| errors.push(e.into()))
                        .ok();
                }
                Err(e) if e.is_not_found() && optional => {}
                Err(e) => errors.push(e.into()),
            }
        } else if let Some(source) = &volume.projected {
            let mode = source.default_mode.unwrap_or(downward::DEFAULT_MODE);
            let sources = source.sources.iter().flatten();
            for (index, projection) in sources.enumerate() {
                if let Some(d) = &projection.downward_api {
                    downward::collect_items(
                        pod,
                        d.items.as_deref().unwrap_or(&[]),
                        Some(mode),
                        &node,
                        &mut payload,
                        &mut item_errors,
                    );
                } else if let Some(c) = &projection.config_map {
                    let optional = c.optional == Some(true);
                    let items = c.items.as_deref().unwrap_or(&[]);
                    match objects.config_map(namespace, &c.name) {
                        Ok(cm) => {
                            projection::config_map_payload(cm, items, mode, optional, &mut payload)
                                .map_err(|e| errors.push(e.into()))
                                .ok();
                        }
                        // Only an API server says "not found": standalone, an optional
                        // source is left out as before.
                        Err(e) if optional && (e.is_not_found() || !objects.from_api) => {}
                        Err(e) => errors.push(e.into()),
                    }
                } else if let Some(sec) = &projection.secret {
                    let optional = sec.optional == Some(true);
                    let items = sec.items.as_deref().unwrap_or(&[]);
                    match objects.secret(namespace, &sec.name) {
                        Ok(secret) => {
                            projection::secret_payload(secret, items, mode, optional, &mut payload)
                                .map_err(|e| errors.push(e.into()))
                                .ok();
                        }
                        Err(e) if optional && (e.is_not_found() || !objects.from_api) => {}
                        Err(e) => errors.push(e.into()),
                    }
                } else if let Some(token) = &projection.service_account_token {
                    match objects.token(&volume.name, index) {
                        Ok(t) => {
                            // With an fsGroup the ownership walk adds the group's read bit.
                            let mode = if fs_group.is_some() { 0o600 } else { mode };
                            payload.insert(
                                token.path.clone(),
                                atomic_writer::FileProjection {
                                    data: t.as_bytes().to_vec(),
                                    mode: mode as u32 & 0o7777,
                                },
                            );
                        }
                        Err(e) => errors.push(e.into()),
                    }
                }
            }
        }
        errors.extend(item_errors.into_iter().map(SourceError::from));
        if !errors.is_empty() {
            return Err(FilesError::Sources(errors));
        }
        Ok(payload)
    }

    /// The CRI mounts for one container's `volumeMounts`; `env` is the container's resolved
    /// environment, for `subPathExpr`; `images` the pulled image of each image volume.
    pub(crate) fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        volumes: &PodVolumes,
        env: &HashMap<String, String>,
        images: &HashMap<String, ImageSpec>,
    ) -> Result<Vec<Mount>, VolumeError> {
        let mut out = Vec::new();
        let mut pod_dir: Option<PathBuf> = None;
        for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
            let fail = |reason: VolumeProblem| VolumeError::Mount {
                container: container.name.clone(),
                name: vm.name.clone(),
                reason: Box::new(reason),
            };
            let Some(volume_path) = volumes.paths.get(&vm.name) else {
                return Err(fail(VolumeProblem::NoVolume {
                    volume: vm.name.clone(),
                    container: container.name.clone(),
                }));
            };
            if volumes.images.contains(&vm.name) {
                out.push(image_mount(vm, images.get(&vm.name)).map_err(fail)?);
                continue;
            }
            let mut sub = vm.sub_path.clone().unwrap_or_default();
            if let Some(expr) = vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                sub = subpath::expand_expr(expr, env).map_err(|e| fail(e.into()))?;
            }
            let host_path = if sub.is_empty() {
                volume_path.clone()
            } else {
                check_component("container name", &container.name).map_err(|e| fail(e.into()))?;
                check_component("volume name", &vm.name).map_err(|e| fail(e.into()))?;
                if pod_dir.is_none() {
                    let uid = pod.metadata.uid.as_deref().unwrap_or("");
                    pod_dir = Some(self.make_pod_dir(uid).map_err(|e| fail(e.into()))?);
                }
                let target = subpath::BindTarget {
                    pod_dir: pod_dir.as_deref().unwrap_or(Path::new("/nonexistent")),
                    volume: &vm.name,
                    container: &container.name,
                    index,
                };
                subpath::prepare(&*self.mounter, volume_path, &sub, &target, &vm.name)
                    .map_err(|e| fail(e.into()))?
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
                        return Err(fail(VolumeProblem::BidirectionalUnprivileged));
                    }
                    MountPropagation::PropagationBidirectional
                }
                Some(other) => {
                    return Err(fail(VolumeProblem::Propagation(other.to_string())));
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

    /// [`Self::refresh_with`] with no API server to read from.
    #[cfg(test)]
    pub(crate) fn refresh(&self, pod: &Pod) -> Result<(), VolumeError> {
        self.refresh_with(pod, &PodObjects::standalone())
    }

    /// Brings volumes whose content follows the pod or the API objects it refers to
    /// (downwardAPI, projected, configMap, secret) up to date; called on every sync of a
    /// running pod, cheap when nothing changed. A volume whose content cannot be had now
    /// keeps what it has; the others are still brought up to date, and the first error is
    /// returned.
    pub(crate) fn refresh_with(&self, pod: &Pod, objects: &PodObjects) -> Result<(), VolumeError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        if check_component("pod UID", uid).is_err() {
            return Ok(());
        }
        let mut first_error = None;
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let plugin = match plan(volume, objects.from_api) {
                Ok(Plan::Files(plugin) | Plan::MemoryFiles(plugin)) => plugin,
                _ => continue,
            };
            if check_component("volume name", &volume.name).is_err() {
                continue;
            }
            let dir = self.volume_dir(uid, plugin, &volume.name);
            // Not set up yet (or not a plain directory of ours): setup will see to it.
            if !safe_fs::lstat(&dir).is_ok_and(|m| m.is_some_and(|m| m.is_dir())) {
                continue;
            }
            let fail = |reason: VolumeProblem| VolumeError::SetUp {
                volume: volume.name.clone(),
                reason: Box::new(reason),
            };
            let written = FsGroup::from_pod(pod)
                .map_err(|e| fail(e.into()))
                .and_then(|fs_group| {
                    let payload = self
                        .payload(pod, volume, objects, fs_group)
                        .map_err(|e| fail(e.into()))?;
                    write_payload(&dir, &payload, fs_group).map_err(|e| fail(e.into()))
                });
            match written {
                Ok(true) => tracing::info!(volume = %volume.name, "volume content updated"),
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Unmounts and removes the pod's subPath bind mounts and every volume of the pod. Mounts
    /// are unmounted first (lazily if busy); nothing is deleted while a mount is left, and the
    /// deletion never follows a symlink, so a hostPath or anything outside the pod directory is
    /// never touched. A UID that is not a single path component is refused.
    pub(crate) fn teardown(&self, uid: &str) -> Result<(), VolumeError> {
        let fail = |reason: VolumeProblem| VolumeError::TearDown {
            uid: uid.to_string(),
            reason: Box::new(reason),
        };
        let Some(pod_dir) = self.existing_pod_dir(uid).map_err(|e| fail(e.into()))? else {
            csi::attach::forget_pod(uid);
            return Ok(());
        };
        let mounter = &*self.mounter;
        subpath::clean(mounter, &pod_dir).map_err(|e| fail(e.into()))?;
        csi::mount::tear_down_pod(&self.root_dir, &pod_dir).map_err(|e| fail(e.into()))?;
        // Unpublished: no longer reported in use for this pod (what another pod uses, or is
        // still staged, stays reported).
        csi::attach::forget_pod(uid);
        remove_checked(mounter, &pod_dir.join("volumes"), &pod_dir).map_err(|e| fail(e.into()))
    }

    /// The canonical `<root>/pods`, created when missing (the root is the operator's).
    fn pods_dir(&self) -> Result<PathBuf, SafeFsError> {
        let pods = self.root_dir.join("pods");
        std::fs::create_dir_all(&pods).map_err(|e| io_error(&pods, &e))?;
        pods.canonicalize().map_err(|e| io_error(&pods, &e))
    }

    /// The canonical `<root>/pods/<uid>`, created (not through a symlink) when missing.
    fn make_pod_dir(&self, uid: &str) -> Result<PathBuf, VolumeSetupError> {
        check_component("pod UID", uid)?;
        let pods = self.pods_dir()?;
        let pods_fd = safe_fs::open_dir_abs(&pods)?;
        safe_fs::open_beneath(pods_fd.as_fd(), &pods, Path::new(uid), Some(0o750))?;
        Ok(pods.join(uid))
    }

    /// Creates `<root>/pods/<uid>/volumes/<plugin>/<name>` component by component without
    /// following a symlink, gives it `mode` when it differs, and returns its path.
    fn make_volume_dir(
        &self,
        uid: &str,
        plugin: &str,
        name: &str,
        mode: u32,
    ) -> Result<PathBuf, VolumeSetupError> {
        check_component("volume name", name)?;
        let pod_dir = self.make_pod_dir(uid)?;
        let pod_fd = safe_fs::open_dir_abs(&pod_dir)?;
        let plugin_rel = Path::new("volumes").join(plugin);
        let plugin_fd = safe_fs::open_beneath(pod_fd.as_fd(), &pod_dir, &plugin_rel, Some(0o750))?;
        let shown = pod_dir.join(&plugin_rel).join(name);
        let dir = safe_fs::make_dir_at(plugin_fd.as_fd(), name.as_ref(), mode, &shown)?;
        let st = safe_fs::fstat(dir.as_fd(), &shown)?;
        if st.st_mode & 0o7777 != mode {
            safe_fs::set_mode(dir.as_fd(), mode, &shown)?;
        }
        Ok(self.volume_dir(uid, plugin, name))
    }

    /// The canonical `<root>/pods/<uid>` when it exists as a real directory. A symlink there
    /// was not made by us and is not followed: there is nothing of ours to tear down.
    fn existing_pod_dir(&self, uid: &str) -> Result<Option<PathBuf>, PodDirError> {
        check_component("pod UID", uid)?;
        let pods = self.root_dir.join("pods");
        let pods = match pods.canonicalize() {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(PodDirError::Resolve { path: pods, source }),
        };
        let pod = pods.join(uid);
        match safe_fs::lstat(&pod)? {
            None => Ok(None),
            Some(m) if m.is_dir() => Ok(Some(pod)),
            Some(_) => {
                tracing::warn!(pod_uid = %uid, path = %pod.display(), "the pod directory is not a directory; not followed");
                Ok(None)
            }
        }
    }
}

/// The error of a volume's set-up: a claim that leads to no volume is told as upstream's
/// populator tells it, a node-affinity mismatch as its mount operation does.
fn setup_error(volume: &str, reason: VolumeProblem) -> VolumeError {
    match reason {
        VolumeProblem::Persistent(persistent::PersistentError::NodeAffinity { pv }) => {
            VolumeError::NodeAffinity { pv }
        }
        VolumeProblem::Persistent(p) => VolumeError::Process {
            volume: volume.to_string(),
            reason: Box::new(p),
        },
        VolumeProblem::Csi(csi::CsiError::NotAttached(_)) => VolumeError::Unattached {
            volume: volume.to_string(),
            reason: Box::new(reason),
        },
        VolumeProblem::Csi(ref e) if e.is_new_mounter() => VolumeError::NewMounter {
            volume: volume.to_string(),
            reason: Box::new(reason),
        },
        reason => VolumeError::SetUp {
            volume: volume.to_string(),
            reason: Box::new(reason),
        },
    }
}

/// Writes a payload with the atomic writer; with an fsGroup, upstream gives the whole volume
/// to the group on every write, whatever the policy.
fn write_payload(
    dir: &Path,
    payload: &atomic_writer::Payload,
    fs_group: Option<FsGroup>,
) -> Result<bool, FilesError> {
    let group = fs_group.map(|g| FsGroup {
        policy: ownership::ChangePolicy::Always,
        ..g
    });
    Ok(atomic_writer::write(dir, payload, group)?)
}

/// A volume directory could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VolumeSetupError {
    #[error(transparent)]
    Invalid(#[from] InvalidComponent),
    #[error(transparent)]
    Fs(#[from] SafeFsError),
}

fn io_error(path: &Path, e: &std::io::Error) -> SafeFsError {
    SafeFsError::Sys {
        path: path.to_path_buf(),
        errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// The mode of a volume's root: 0777, plus setgid when an fsGroup owns the volume (so that a
/// later set-up does not take away what the ownership walk added).
fn root_mode(fs_group: Option<FsGroup>, read_only: bool) -> u32 {
    match fs_group {
        Some(_) => ownership::wanted_mode(empty_dir::EMPTY_DIR_MODE, true, read_only),
        None => empty_dir::EMPTY_DIR_MODE,
    }
}

/// Gives a volume to the pod's fsGroup. `once`: only when its root does not carry the group
/// yet (upstream walks an emptyDir once, when it is set up; the root is changed last, so an
/// interrupted walk is done again).
fn set_ownership(
    pod: &Pod,
    volume: &str,
    dir: &Path,
    group: FsGroup,
    read_only: bool,
    once: bool,
) -> Result<(), ownership::OwnershipError> {
    let group = if once {
        FsGroup {
            policy: ownership::ChangePolicy::OnRootMismatch,
            ..group
        }
    } else {
        group
    };
    let walked = ownership::apply(dir, group, read_only)?;
    if !walked.skipped {
        tracing::info!(
            pod = %crate::base::podspec::full_name(pod),
            %volume,
            gid = group.gid,
            entries = walked.entries,
            errors = walked.errors,
            "volume given to fsGroup"
        );
    }
    Ok(())
}

/// Unmounts everything at or below `dir` and removes it, where `dir` must be a direct child of
/// the canonical directory `parent`. A symlink (or any non-directory) at `dir` is removed
/// itself, never followed; a `dir` whose canonical form is not `parent/<name>` is refused.
/// Each mount is unmounted, deepest first, and detached when that fails (busy); nothing is
/// removed while the table still shows a mount below `dir`.
pub(crate) fn remove_checked(
    mounter: &dyn Mounter,
    dir: &Path,
    parent: &Path,
) -> Result<(), SafeFsError> {
    let outside = || SafeFsError::Outside {
        path: dir.to_path_buf(),
        base: parent.to_path_buf(),
    };
    if dir.parent() != Some(parent) || !parent.is_absolute() {
        return Err(outside());
    }
    match safe_fs::lstat(dir)? {
        None => return Ok(()),
        Some(m) if !m.is_dir() => {
            return std::fs::remove_file(dir).map_err(|e| io_error(dir, &e));
        }
        Some(_) => {}
    }
    let real = safe_fs::canonical_within(dir, parent)?;
    if real != dir {
        return Err(outside());
    }
    let table_error = |e: std::io::Error| io_error(Path::new("/proc/self/mountinfo"), &e);
    let table = mounter.mount_table().map_err(table_error)?;
    for point in mountinfo::mounts_under(&table, &real) {
        if let Err(err) = mounter.unmount(&point, false) {
            tracing::warn!(path = %point.display(), error = %err, "unmount failed; detaching");
            mounter
                .unmount(&point, true)
                .map_err(|errno| SafeFsError::Sys {
                    path: point.clone(),
                    errno,
                })?;
        }
    }
    let table = mounter.mount_table().map_err(table_error)?;
    if let Some(left) = mountinfo::mounts_under(&table, &real).first() {
        return Err(SafeFsError::Sys {
            path: left.clone(),
            errno: nix::errno::Errno::EBUSY,
        });
    }
    match std::fs::remove_dir_all(&real) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(&real, &e)),
    }
}

/// The CRI mount of an image volume, as upstream's `makeMounts`: the pulled image, always
/// read-only, the volume mount's `subPath` (a path inside the image) as `image_sub_path`, which
/// the runtime refuses when the image has no such path.
fn image_mount(
    vm: &k8s_openapi::api::core::v1::VolumeMount,
    image: Option<&ImageSpec>,
) -> Result<Mount, VolumeProblem> {
    if let Some(expr) = vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
        return Err(VolumeProblem::ImageSubPathExpr(expr.to_string()));
    }
    let Some(image) = image else {
        return Err(VolumeProblem::ImageNotPulled(vm.name.clone()));
    };
    let container_path = if vm.mount_path.starts_with('/') {
        vm.mount_path.clone()
    } else {
        format!("/{}", vm.mount_path)
    };
    Ok(Mount {
        container_path,
        readonly: true,
        propagation: MountPropagation::PropagationPrivate as i32,
        image: Some(image.clone()),
        image_sub_path: vm.sub_path.clone().unwrap_or_default(),
        ..Default::default()
    })
}

/// Which plugin serves a volume, or why none can. `api`: objects can be read from an API
/// server (else configMap, secret and token sources cannot be served, as before there was
/// one).
fn plan(volume: &Volume, api: bool) -> Result<Plan<'_>, PlanError> {
    if let Some(s) = &volume.empty_dir {
        return Ok(Plan::EmptyDir(s));
    }
    if let Some(s) = &volume.host_path {
        return Ok(Plan::HostPath(s));
    }
    if let Some(s) = &volume.csi {
        return Ok(Plan::Csi(s));
    }
    if let Some(s) = &volume.persistent_volume_claim {
        return Ok(Plan::Claim(s));
    }
    if volume.image.is_some() {
        return Ok(Plan::Image);
    }
    if volume.downward_api.is_some() {
        return Ok(Plan::Files(DOWNWARD_API_PLUGIN));
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            let unsupported = if let Some(cm) = &source.config_map {
                (!api && cm.optional != Some(true)).then(|| format!("configMap {:?}", cm.name))
            } else if let Some(secret) = &source.secret {
                (!api && secret.optional != Some(true)).then(|| format!("secret {:?}", secret.name))
            } else if source.service_account_token.is_some() {
                (!api).then(|| "serviceAccountToken".to_string())
            } else if let Some(bundle) = &source.cluster_trust_bundle {
                (bundle.optional != Some(true)).then(|| "clusterTrustBundle".to_string())
            } else {
                None
            };
            if let Some(what) = unsupported {
                return Err(PlanError::ProjectedSource(what));
            }
        }
        if api {
            return Ok(Plan::MemoryFiles(PROJECTED_PLUGIN));
        }
        return Ok(Plan::Files(PROJECTED_PLUGIN));
    }
    if let Some(cm) = &volume.config_map {
        if api {
            return Ok(Plan::Files(CONFIG_MAP_PLUGIN));
        }
        if cm.optional == Some(true) {
            return Ok(Plan::Empty(CONFIG_MAP_PLUGIN));
        }
        return Err(PlanError::ConfigMap(cm.name.clone()));
    }
    if let Some(secret) = &volume.secret {
        if api {
            return Ok(Plan::MemoryFiles(SECRET_PLUGIN));
        }
        if secret.optional == Some(true) {
            return Ok(Plan::Empty(SECRET_PLUGIN));
        }
        return Err(PlanError::Secret(
            secret.secret_name.clone().unwrap_or_default(),
        ));
    }
    let kind = serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "with no source".to_string());
    Err(PlanError::Unsupported(kind))
}

/// A single, harmless path component (a UID, a volume or container name becomes a directory
/// name): not empty, not `.` or `..`, no `/` or NUL, at most 255 bytes.
pub(crate) fn check_component(what: &'static str, name: &str) -> Result<(), InvalidComponent> {
    if crate::base::safe_names::component_problem(name).is_some() {
        return Err(InvalidComponent {
            what,
            name: name.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
