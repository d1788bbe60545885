//! User namespaces for pods with `hostUsers: false`, as upstream's `pkg/kubelet/userns`: each
//! such pod gets 65536 host IDs of the node's range, its root mapped to the first of them.
//! The allocation is written to the pod's directory (`<root>/pods/<uid>/userns`, upstream's
//! file and format) before the sandbox is made, read back at start-up so a restarted agent
//! gives every pod the IDs it had, and freed when the pod's directory goes.
//!
//! The decisions are pure (`alloc`); this module reads the node's range and the files.

pub(crate) mod alloc;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use thiserror::Error;

use crate::clients::cri::proto::{IdMapping, NamespaceMode, UserNamespace};

use alloc::{AllocError, Allocator, IdRange, MappingsError, MappingsFile, RangeError};

/// The file in the pod's directory that holds its mappings (upstream's name).
const MAPPINGS_FILE: &str = "userns";

/// The user whose subordinate IDs are the node's range (upstream's `kubeletUser`).
const KUBELET_USER: &str = "kubelet";

/// Why user namespaces cannot be set up or a pod's cannot be made.
#[derive(Debug, Error)]
pub(crate) enum UsernsError {
    #[error("kubelet mappings: {0}")]
    Range(#[from] RangeError),
    #[error("error retrieving additional ids for user \"kubelet\": {0}")]
    Getsubids(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("user namespace: {0}")]
    Mappings(#[from] MappingsError),
    #[error("create user namespace: {0}")]
    Alloc(#[from] AllocError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UsernsError + '_ {
    move |source| UsernsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The node's user-namespace IDs and which pod has which.
#[derive(Debug)]
pub(crate) struct UsernsManager {
    pods_dir: PathBuf,
    range: IdRange,
    state: Mutex<Allocator>,
}

impl UsernsManager {
    /// The manager for this node: the `kubelet` user's subordinate IDs (through `getsubids`
    /// when installed, else `/etc/subuid` and `/etc/subgid`), upstream's default range without
    /// that user, and the mappings of the pods whose directories are under `root_dir`.
    pub(crate) fn for_node(root_dir: &Path, max_pods: u32) -> Result<Self, UsernsError> {
        let range = alloc::check_range(node_range()?, max_pods)?;
        Self::with_range(root_dir.join("pods"), range)
    }

    /// The manager over `range`, recording the mappings found in the pods' directories.
    pub(crate) fn with_range(pods_dir: PathBuf, range: IdRange) -> Result<Self, UsernsError> {
        let mut state = Allocator::new(range);
        if let Ok(entries) = std::fs::read_dir(&pods_dir) {
            for entry in entries.flatten() {
                let uid = entry.file_name().to_string_lossy().into_owned();
                let path = entry.path().join(MAPPINGS_FILE);
                let Ok(text) = std::fs::read(&path) else {
                    continue;
                };
                let map = MappingsFile::parse(&text)?;
                state.record(&uid, map.host_id, map.length)?;
                tracing::debug!(pod_uid = %uid, host_id = map.host_id, "user namespace mapping read back");
            }
        }
        Ok(Self {
            pods_dir,
            range,
            state: Mutex::new(state),
        })
    }

    /// The node's range.
    pub(crate) fn range(&self) -> IdRange {
        self.range
    }

    /// The pod's user namespace for CRI: the mapping in its directory, else a new block,
    /// written there before it is used.
    pub(crate) fn pod_mappings(&self, uid: &str) -> Result<UserNamespace, UsernsError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.pods_dir.join(uid);
        let path = dir.join(MAPPINGS_FILE);
        let map = match std::fs::read(&path) {
            Ok(text) => {
                let map = MappingsFile::parse(&text)?;
                state.record(uid, map.host_id, map.length)?;
                map
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let first = state.allocate(uid)?;
                let file = MappingsFile::for_block(first);
                if let Err(err) = write_durably(&dir, &path, &file) {
                    state.release(uid);
                    return Err(err);
                }
                tracing::info!(pod_uid = %uid, host_id = first, "user namespace mapping allocated");
                file.uid_mappings[0]
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let mapping = IdMapping {
            host_id: map.host_id,
            container_id: map.container_id,
            length: map.length,
        };
        Ok(UserNamespace {
            mode: NamespaceMode::Pod as i32,
            uids: vec![mapping],
            gids: vec![mapping],
        })
    }

    /// The pod is gone: its block is free again.
    pub(crate) fn release(&self, uid: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = state.release(uid) {
            let _ = std::fs::remove_file(self.pods_dir.join(uid).join(MAPPINGS_FILE));
            tracing::debug!(pod_uid = %uid, host_id = first, "user namespace mapping released");
        }
    }

    /// The pods that hold a block (for tests and the debug view).
    #[cfg(test)]
    pub(crate) fn pods(&self) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut pods: Vec<String> = state.pods().map(str::to_string).collect();
        pods.sort();
        pods
    }
}

/// What a pod that shares the host's users gets (upstream passes it for every such pod).
pub(crate) fn node_mode() -> UserNamespace {
    UserNamespace {
        mode: NamespaceMode::Node as i32,
        ..Default::default()
    }
}

/// Written to a temporary file, renamed into place and the directory synced: a crash leaves
/// the old state or the new, never half a file (upstream: an atomic write and an fsync).
fn write_durably(dir: &Path, path: &Path, file: &MappingsFile) -> Result<(), UsernsError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(format!(".{MAPPINGS_FILE}.tmp"));
    let text = serde_json::to_vec(file).unwrap_or_default();
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// The `kubelet` user's subordinate ranges, upstream's default without that user.
fn node_range() -> Result<IdRange, UsernsError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let Some(uid) = user_id(&passwd, KUBELET_USER) else {
        return Ok(alloc::DEFAULT_RANGE);
    };
    if let Some(getsubids) = on_path("getsubids") {
        let run = |args: &[&str]| {
            std::process::Command::new(&getsubids)
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .ok_or_else(|| {
                    UsernsError::Getsubids(format!("{} {}", getsubids.display(), args.join(" ")))
                })
        };
        let (uids, gids) = (run(&[KUBELET_USER])?, run(&["-g", KUBELET_USER])?);
        if uids != gids {
            return Err(RangeError::Mismatched.into());
        }
        return Ok(alloc::parse_getsubids(&uids)?);
    }
    let read = |path: &str| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        alloc::subordinate_ranges(&text, KUBELET_USER, Some(uid))
    };
    Ok(alloc::node_range(
        &read("/etc/subuid")?,
        &read("/etc/subgid")?,
    )?)
}

/// The UID of `user` in the text of `/etc/passwd`.
fn user_id(passwd: &str, user: &str) -> Option<u32> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == user).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_users_uid_is_read_from_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nkubelet:x:998:998::/:/usr/sbin/nologin\n";
        assert_eq!(user_id(passwd, "kubelet"), Some(998));
        assert_eq!(user_id(passwd, "nobody"), None);
    }

    #[test]
    fn a_restarted_manager_keeps_each_pods_block_and_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let range = IdRange {
            first: 65536,
            len: 3 * 65536,
        };
        let m = UsernsManager::with_range(pods.clone(), range).unwrap();
        let a = m.pod_mappings("a").unwrap();
        let b = m.pod_mappings("b").unwrap();
        assert_eq!(a.mode, NamespaceMode::Pod as i32);
        assert_eq!((a.uids[0].host_id, b.uids[0].host_id), (65536, 131072));
        assert_eq!(a.uids, a.gids);
        assert!(pods.join("a").join("userns").is_file());
        // A new agent reads the blocks back: the same for "b", and "c" does not get them.
        let m = UsernsManager::with_range(pods.clone(), range).unwrap();
        assert_eq!(m.pods(), ["a", "b"]);
        assert_eq!(m.pod_mappings("b").unwrap(), b);
        assert_eq!(m.pod_mappings("c").unwrap().uids[0].host_id, 196608);
        m.release("a");
        assert!(!pods.join("a").join("userns").exists());
        assert_eq!(m.pod_mappings("d").unwrap().uids[0].host_id, 65536);
        assert!(matches!(
            m.pod_mappings("e"),
            Err(UsernsError::Alloc(AllocError::Full))
        ));
        // A broken file stops the start, as upstream's kubelet.
        std::fs::write(pods.join("b").join("userns"), "{").unwrap();
        assert!(UsernsManager::with_range(pods, range).is_err());
    }
}
