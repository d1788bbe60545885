//! The allocations of the admitted pods, checkpointed (upstream's `allocated_pods_state` in
//! the root dir): after a restart the agent admits the pods it already runs at what it had
//! allocated them, not at what their specs ask now, so a resize that was pending stays pending
//! and one that was allocated stays allocated.
//!
//! The one part of admission that does I/O: a small JSON file, rewritten (to a temporary file,
//! then renamed over) when an allocation changes. Upstream's file carries a checksum in its
//! checkpoint format; this one is Deckhand's own JSON (`{"pods": {UID: allocation}}`), and a
//! file that does not parse is logged and started over, as upstream does with a corrupt
//! checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::resize::Allocation;

/// The file's name in the root dir, as upstream's.
pub(crate) const FILE_NAME: &str = "allocated_pods_state";

#[derive(Debug, thiserror::Error)]
enum SaveError {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding the allocations: {0}")]
    Encode(#[from] serde_json::Error),
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct FileForm {
    pods: BTreeMap<String, Allocation>,
}

/// The allocations by pod UID, and where they are kept (nowhere in unit tests).
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    path: Option<PathBuf>,
    pods: BTreeMap<String, Allocation>,
}

impl Allocations {
    /// Reads the checkpoint at `path`; a missing file is an empty one.
    pub(crate) fn load(path: PathBuf) -> Allocations {
        let pods = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<FileForm>(&bytes) {
                Ok(form) => form.pods,
                Err(error) => {
                    tracing::warn!(path = %path.display(), error = %error, "the allocation checkpoint does not parse; starting over");
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => {
                tracing::warn!(path = %path.display(), error = %error, "cannot read the allocation checkpoint; starting over");
                BTreeMap::new()
            }
        };
        Allocations {
            path: Some(path),
            pods,
        }
    }

    pub(crate) fn get(&self, uid: &str) -> Option<&Allocation> {
        self.pods.get(uid)
    }

    /// Records a pod's allocation; the file is rewritten only when it changed.
    pub(crate) fn set(&mut self, uid: &str, allocation: Allocation) {
        if self.pods.get(uid) == Some(&allocation) {
            return;
        }
        self.pods.insert(uid.to_string(), allocation);
        self.save();
    }

    /// Forgets the allocations of pods `keep` does not name.
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.pods.len();
        self.pods.retain(|uid, _| keep(uid));
        if self.pods.len() != before {
            self.save();
        }
    }

    fn save(&self) {
        let Some(path) = &self.path else { return };
        if let Err(error) = self.write(path) {
            // The allocation in memory still holds; a restart would fall back to the specs.
            tracing::warn!(error = %error, "cannot write the allocation checkpoint");
        }
    }

    fn write(&self, path: &Path) -> Result<(), SaveError> {
        let form = FileForm {
            pods: self.pods.clone(),
        };
        let bytes = serde_json::to_vec(&form)?;
        let tmp = path.with_extension("tmp");
        let wrap = |source| SaveError::Write {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&tmp, bytes).map_err(wrap)?;
        std::fs::rename(&tmp, path).map_err(wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn alloc(cpu: &str) -> Allocation {
        Allocation {
            containers: BTreeMap::from([(
                "app".to_string(),
                ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                    ..Default::default()
                },
            )]),
            pod: None,
        }
    }

    #[test]
    fn a_restart_reads_back_what_was_allocated_and_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        let mut a = Allocations::load(path.clone());
        assert_eq!(a.get("u1"), None);
        a.set("u1", alloc("100m"));
        a.set("u2", alloc("200m"));
        a.set("u1", alloc("300m"));
        a.retain(|uid| uid != "u2");
        let b = Allocations::load(path.clone());
        assert_eq!(b.get("u1"), Some(&alloc("300m")));
        assert_eq!(b.get("u2"), None);
        std::fs::write(&path, b"{not json").expect("write");
        assert_eq!(
            Allocations::load(path).get("u1"),
            None,
            "a corrupt file starts over"
        );
    }
}
