//! The volume manager: sets up a pod's volumes before its containers run, turns each
//! container's `volumeMounts` into CRI mounts, and tears the volumes down with the pod.
//!
//! (Interface in place; the volume plugins are being written.)

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cri::proto::Mount;

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
}

/// Sets volumes up under `<root>/pods/<uid>/volumes/<plugin>/<name>`.
#[derive(Clone, Debug)]
pub struct VolumeManager {
    pub root_dir: PathBuf,
    /// Node memory, the size of a memory-backed emptyDir when neither a sizeLimit nor a pod
    /// memory limit says otherwise.
    pub node_memory_bytes: u64,
}

impl VolumeManager {
    pub fn new(root_dir: PathBuf, node_memory_bytes: u64) -> Self {
        VolumeManager {
            root_dir,
            node_memory_bytes,
        }
    }

    /// Sets up (idempotently) every volume of the pod.
    pub fn setup(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let _ = pod;
        Ok(PodVolumes::default())
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
        let _ = (pod, container, volumes, env);
        Ok(Vec::new())
    }

    /// Brings volumes whose content follows the pod (downwardAPI, projected) up to date; called
    /// on every sync of a running pod, cheap when nothing changed.
    pub fn refresh(&self, pod: &Pod) -> Result<(), VolumeError> {
        let _ = pod;
        Ok(())
    }

    /// Unmounts and removes every volume of the pod.
    pub fn teardown(&self, uid: &str) -> Result<(), VolumeError> {
        let _ = uid;
        Ok(())
    }
}
