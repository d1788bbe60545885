//! The pure part of user namespaces, as upstream's `pkg/kubelet/userns`: the node's ID range
//! and its rules, the per-pod allocation of 65536-ID blocks, the mappings file kept in the
//! pod's directory, and whether the runtime can make user namespaces. No I/O here; the
//! manager (`mod.rs`) reads and writes the files.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::clients::cri::proto::RuntimeHandler;

/// IDs each pod's user namespace gets (upstream's default `userNamespaces.idsPerPod`, and the
/// unit every range must be a multiple of).
pub(crate) const IDS_PER_POD: u32 = 65536;

/// Upstream's default range when the `kubelet` user has no subordinate IDs: everything but
/// the first 65536 IDs, which the host's own users have.
pub(crate) const DEFAULT_RANGE: IdRange = IdRange {
    first: 1 << 16,
    len: u32::MAX - (1 << 16) + 1,
};

/// A range of host IDs: `first .. first + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdRange {
    pub first: u32,
    pub len: u32,
}

/// Why the node's ID range cannot be used; the agent does not start (as upstream's kubelet),
/// with upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum RangeError {
    #[error("kubelet user assigned ID {0} is not a multiple of {IDS_PER_POD}")]
    NotAligned(u32),
    #[error("kubelet user assigned ID {0} must be greater or equal to {IDS_PER_POD}")]
    StartsTooLow(u32),
    #[error("kubelet user assigned IDs length {0} is not a multiple of {IDS_PER_POD}")]
    LengthNotMultiple(u32),
    #[error("kubelet user assigned IDs are not enough to support {0} pods")]
    TooFewForPods(u32),
    #[error("mismatched subuids and subgids for user \"kubelet\"")]
    Mismatched,
    #[error("error parsing line {0:?}: it must contain only one line")]
    NotOneRange(String),
    #[error("invalid line {0:?}")]
    BadLine(String),
}

/// Subordinate ranges of `user` (by name, or by its UID) in the text of `/etc/subuid` or
/// `/etc/subgid` (`owner:first:count` lines), as `getsubids` lists them.
pub(crate) fn subordinate_ranges(
    text: &str,
    user: &str,
    uid: Option<u32>,
) -> Result<Vec<IdRange>, RangeError> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split(':').collect();
        let [owner, first, len] = parts[..] else {
            return Err(RangeError::BadLine(line.to_string()));
        };
        let ours = owner == user || uid.is_some_and(|u| owner == u.to_string());
        if !ours {
            continue;
        }
        let number = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| RangeError::BadLine(line.to_string()))
        };
        out.push(IdRange {
            first: number(first)?,
            len: number(len)?,
        });
    }
    Ok(out)
}

/// `getsubids kubelet` output (`0: kubelet 65536 2147483648`): exactly one range.
pub(crate) fn parse_getsubids(output: &str) -> Result<IdRange, RangeError> {
    let lines: Vec<&str> = output.trim_matches('\n').split('\n').collect();
    let [line] = lines[..] else {
        return Err(RangeError::NotOneRange(output.to_string()));
    };
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [_, _, first, len] = parts[..] else {
        return Err(RangeError::BadLine(output.to_string()));
    };
    let number = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| RangeError::BadLine(output.to_string()))
    };
    Ok(IdRange {
        first: number(first)?,
        len: number(len)?,
    })
}

/// The node's range from the `kubelet` user's subordinate UIDs and GIDs: upstream's default
/// when that user does not exist or has none; else its one range, the same for both.
pub(crate) fn node_range(uids: &[IdRange], gids: &[IdRange]) -> Result<IdRange, RangeError> {
    if uids.is_empty() && gids.is_empty() {
        return Ok(DEFAULT_RANGE);
    }
    if uids != gids {
        return Err(RangeError::Mismatched);
    }
    match uids {
        [one] => Ok(*one),
        _ => Err(RangeError::NotOneRange(format!("{uids:?}"))),
    }
}

/// Upstream's rules for the node's range: aligned to 65536, not starting below 65536 (ID 0
/// would be mapped, which undoes the isolation), a whole number of blocks, and at least one
/// block for each of `max_pods`.
pub(crate) fn check_range(range: IdRange, max_pods: u32) -> Result<IdRange, RangeError> {
    if !range.first.is_multiple_of(IDS_PER_POD) {
        return Err(RangeError::NotAligned(range.first));
    }
    if range.first < IDS_PER_POD {
        return Err(RangeError::StartsTooLow(range.first));
    }
    if !range.len.is_multiple_of(IDS_PER_POD) {
        return Err(RangeError::LengthNotMultiple(range.len));
    }
    if range.len / IDS_PER_POD < max_pods {
        return Err(RangeError::TooFewForPods(max_pods));
    }
    Ok(range)
}

/// Why a pod's mapping cannot be recorded or made, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum AllocError {
    #[error("could not find an empty slot to allocate a user namespace")]
    Full,
    #[error("wrong user namespace length {0}")]
    WrongLength(u32),
    #[error("wrong user namespace offset specified {0}")]
    WrongOffset(u32),
    #[error("different user namespace range already used by pod {0:?}")]
    Different(String),
    #[error("id {0} is out of range")]
    OutOfRange(u32),
    #[error("range picked for pod {0:?} already taken")]
    Taken(String),
}

/// Which block of the node's range each pod has. The lowest free block is given (upstream
/// picks a random free one; the lowest keeps the choice reproducible in tests).
#[derive(Debug, Clone)]
pub(crate) struct Allocator {
    /// First block (ID / 65536) and number of blocks of the node's range.
    first_block: u32,
    blocks: u32,
    used: BTreeSet<u32>,
    by_pod: HashMap<String, u32>,
}

impl Allocator {
    pub(crate) fn new(range: IdRange) -> Self {
        Self {
            first_block: range.first / IDS_PER_POD,
            blocks: range.len / IDS_PER_POD,
            used: BTreeSet::new(),
            by_pod: HashMap::new(),
        }
    }

    /// The pod's first host ID: the one it has, else a new block.
    pub(crate) fn allocate(&mut self, uid: &str) -> Result<u32, AllocError> {
        if let Some(first) = self.by_pod.get(uid) {
            return Ok(*first);
        }
        let free = (0..self.blocks)
            .find(|i| !self.used.contains(i))
            .ok_or(AllocError::Full)?;
        self.used.insert(free);
        let first = (self.first_block + free) * IDS_PER_POD;
        self.by_pod.insert(uid.to_string(), first);
        Ok(first)
    }

    /// Takes the block a pod's mappings file names (read back after a restart).
    pub(crate) fn record(&mut self, uid: &str, from: u32, len: u32) -> Result<(), AllocError> {
        if len != IDS_PER_POD {
            return Err(AllocError::WrongLength(len));
        }
        if !from.is_multiple_of(IDS_PER_POD) {
            return Err(AllocError::WrongOffset(from));
        }
        match self.by_pod.get(uid) {
            Some(prev) if *prev == from => return Ok(()),
            Some(_) => return Err(AllocError::Different(uid.to_string())),
            None => {}
        }
        let index = (from / IDS_PER_POD)
            .checked_sub(self.first_block)
            .filter(|i| *i < self.blocks)
            .ok_or(AllocError::OutOfRange(from))?;
        if !self.used.insert(index) {
            return Err(AllocError::Taken(uid.to_string()));
        }
        self.by_pod.insert(uid.to_string(), from);
        Ok(())
    }

    /// Frees the pod's block; the first ID it had, if any.
    pub(crate) fn release(&mut self, uid: &str) -> Option<u32> {
        let first = self.by_pod.remove(uid)?;
        self.used.remove(&(first / IDS_PER_POD - self.first_block));
        Some(first)
    }

    /// The pods holding a block.
    #[cfg(test)]
    pub(crate) fn pods(&self) -> impl Iterator<Item = &str> {
        self.by_pod.keys().map(String::as_str)
    }
}

/// One range of the mappings file, under upstream's JSON keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IdMap {
    pub host_id: u32,
    pub container_id: u32,
    pub length: u32,
}

/// The `userns` file in the pod's directory, as upstream writes it: what the pod's user
/// namespace maps, so a restarted agent gives the pod the same IDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MappingsFile {
    pub uid_mappings: Vec<IdMap>,
    pub gid_mappings: Vec<IdMap>,
}

impl MappingsFile {
    /// Root and the next 65535 IDs of the pod mapped from `first` on, for users and groups.
    pub(crate) fn for_block(first: u32) -> Self {
        let map = IdMap {
            host_id: first,
            container_id: 0,
            length: IDS_PER_POD,
        };
        Self {
            uid_mappings: vec![map],
            gid_mappings: vec![map],
        }
    }

    /// The one range of a file this agent wrote, checked as upstream checks it.
    pub(crate) fn parse(text: &[u8]) -> Result<IdMap, MappingsError> {
        let file: MappingsFile =
            serde_json::from_slice(text).map_err(|e| MappingsError::Json(e.to_string()))?;
        let ([uid], [gid]) = (&file.uid_mappings[..], &file.gid_mappings[..]) else {
            return Err(MappingsError::NotOne);
        };
        if uid != gid {
            return Err(MappingsError::NotIdentical);
        }
        if uid.container_id != 0 {
            return Err(MappingsError::RootNotMapped);
        }
        Ok(*uid)
    }
}

/// Why a pod's mappings file cannot be used, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum MappingsError {
    #[error("invalid user namespace mappings file: {0}")]
    Json(String),
    #[error("invalid user namespace configuration: no more than one mapping allowed.")]
    NotOne,
    #[error("invalid user namespace configuration: GID and UID mapping should be identical")]
    NotIdentical,
    #[error("invalid user namespace configuration: UID 0 must be mapped")]
    RootNotMapped,
}

/// Upstream's refusal of `hostUsers: false` when the runtime's handler does not make user
/// namespaces (containerd 1.6 reports no handlers at all).
pub(crate) fn runtime_refusal(handlers: &[RuntimeHandler], handler: &str) -> Option<String> {
    let base = if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_string()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    };
    if handlers.is_empty() {
        return Some(format!("{base}: runtime handlers are not set"));
    }
    match handlers.iter().find(|h| h.name == handler) {
        None => Some(format!("{base}: the handler {handler:?} is not known")),
        Some(h) if !h.features.as_ref().is_some_and(|f| f.user_namespaces) => Some(base),
        Some(_) => None,
    }
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
