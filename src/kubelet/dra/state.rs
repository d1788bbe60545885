//! The claim-info cache's entries and upstream's checkpoint of them,
//! `<root-dir>/dra_manager_state` (`checkpoint.dra.kubelet.k8s.io/v1` `DRACheckpoint`: the
//! entries as JSON in `Data`, with the CRC-32 (IEEE) of that text in `Checksum`), so that a
//! restart of Deckhand, or a switch to upstream's kubelet, keeps which claims are prepared
//! for which pods and their CDI devices.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file's name under the root dir (upstream's `draManagerStateFileName`).
pub(crate) const FILE_NAME: &str = "dra_manager_state";
const KIND: &str = "DRACheckpoint";
const API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

/// One device a driver prepared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Device {
    pub pool_name: String,
    pub device_name: String,
    pub share_id: Option<String>,
    pub request_names: Vec<String>,
    pub cdi_device_ids: Vec<String>,
}

/// What one driver holds of a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DriverState {
    pub devices: Vec<Device>,
    /// The allocation's `skipNodeOperations` for this driver (`NodePrepareResources`,
    /// `NodeUnprepareResources` or `All`).
    pub skip_node_operations: Vec<String>,
}

impl DriverState {
    pub(crate) fn skips(&self, operation: &str) -> bool {
        self.skip_node_operations
            .iter()
            .any(|s| s == "All" || s == operation)
    }
}

/// One claim the node prepares or has prepared (upstream's `ClaimInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClaimInfo {
    pub claim_uid: String,
    pub claim_name: String,
    pub namespace: String,
    /// The pods using it; the last one gone, it is unprepared.
    pub pod_uids: BTreeSet<String>,
    pub drivers: BTreeMap<String, DriverState>,
    /// Prepared by every driver since this process started (not checkpointed: after a
    /// restart a new pod prepares it again, which drivers answer idempotently, as upstream).
    pub prepared: bool,
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a DRA checkpoint: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
    #[error("checkpoint is corrupted: checksum {found} does not match the data's {computed}")]
    Checksum { found: u32, computed: u32 },
}

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: String,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

#[derive(Serialize, Deserialize)]
struct Data {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    api_version: String,
    #[serde(rename = "ClaimInfoStateList")]
    list: Option<Vec<StateEntry>>,
}

/// Go's `sets.Set[string]` is a map of empty structs.
type GoSet = BTreeMap<String, BTreeMap<String, serde_json::Value>>;

#[derive(Serialize, Deserialize)]
struct StateEntry {
    #[serde(rename = "ClaimUID")]
    claim_uid: String,
    #[serde(rename = "ClaimName")]
    claim_name: String,
    #[serde(rename = "Namespace")]
    namespace: String,
    #[serde(rename = "PodUIDs")]
    pod_uids: Option<GoSet>,
    #[serde(rename = "DriverState")]
    driver_state: Option<BTreeMap<String, DriverEntry>>,
}

#[derive(Serialize, Deserialize)]
struct DriverEntry {
    #[serde(rename = "Devices")]
    devices: Option<Vec<DeviceEntry>>,
    #[serde(
        rename = "skipNodeOperations",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    skip: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct DeviceEntry {
    #[serde(rename = "PoolName")]
    pool_name: String,
    #[serde(rename = "DeviceName")]
    device_name: String,
    #[serde(rename = "ShareID")]
    share_id: Option<String>,
    #[serde(rename = "RequestNames")]
    request_names: Option<Vec<String>>,
    #[serde(rename = "CDIDeviceIDs")]
    cdi_device_ids: Option<Vec<String>>,
}

fn non_empty(list: &[String]) -> Option<Vec<String>> {
    (!list.is_empty()).then(|| list.to_vec())
}

fn to_entry(info: &ClaimInfo) -> StateEntry {
    let drivers = info
        .drivers
        .iter()
        .map(|(name, state)| {
            let devices: Vec<DeviceEntry> = state
                .devices
                .iter()
                .map(|d| DeviceEntry {
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                    share_id: d.share_id.clone(),
                    request_names: non_empty(&d.request_names),
                    cdi_device_ids: non_empty(&d.cdi_device_ids),
                })
                .collect();
            let entry = DriverEntry {
                devices: (!devices.is_empty()).then_some(devices),
                skip: non_empty(&state.skip_node_operations),
            };
            (name.clone(), entry)
        })
        .collect();
    StateEntry {
        claim_uid: info.claim_uid.clone(),
        claim_name: info.claim_name.clone(),
        namespace: info.namespace.clone(),
        pod_uids: Some(
            info.pod_uids
                .iter()
                .map(|u| (u.clone(), BTreeMap::new()))
                .collect(),
        ),
        driver_state: Some(drivers),
    }
}

fn from_entry(entry: StateEntry) -> ClaimInfo {
    let drivers = entry
        .driver_state
        .unwrap_or_default()
        .into_iter()
        .map(|(name, d)| {
            let devices = d
                .devices
                .unwrap_or_default()
                .into_iter()
                .map(|e| Device {
                    pool_name: e.pool_name,
                    device_name: e.device_name,
                    share_id: e.share_id,
                    request_names: e.request_names.unwrap_or_default(),
                    cdi_device_ids: e.cdi_device_ids.unwrap_or_default(),
                })
                .collect();
            let state = DriverState {
                devices,
                skip_node_operations: d.skip.unwrap_or_default(),
            };
            (name, state)
        })
        .collect();
    ClaimInfo {
        claim_uid: entry.claim_uid,
        claim_name: entry.claim_name,
        namespace: entry.namespace,
        pod_uids: entry.pod_uids.unwrap_or_default().into_keys().collect(),
        drivers,
        prepared: false,
    }
}

/// CRC-32 with the IEEE polynomial (Go's `crc32.ChecksumIEEE`).
pub(crate) fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// The file's bytes for the claims.
pub(crate) fn encode(claims: &[ClaimInfo]) -> Vec<u8> {
    let data = Data {
        kind: KIND.to_string(),
        api_version: API_VERSION.to_string(),
        list: Some(claims.iter().map(to_entry).collect()),
    };
    let text = serde_json::to_string(&data).unwrap_or_default();
    let file = File {
        checksum: crc32_ieee(text.as_bytes()),
        data: text,
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// The claims in the file's bytes.
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<ClaimInfo>, StateError> {
    let shown = || path.display().to_string();
    let file: File = serde_json::from_slice(bytes).map_err(|source| StateError::Decode {
        path: shown(),
        source,
    })?;
    let computed = crc32_ieee(file.data.as_bytes());
    if computed != file.checksum {
        return Err(StateError::Checksum {
            found: file.checksum,
            computed,
        });
    }
    let data: Data = serde_json::from_str(&file.data).map_err(|source| StateError::Decode {
        path: shown(),
        source,
    })?;
    Ok(data
        .list
        .unwrap_or_default()
        .into_iter()
        .map(from_entry)
        .collect())
}

/// Reads the checkpoint; `None` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<ClaimInfo>>, StateError> {
    match std::fs::read(path) {
        Ok(bytes) => decode(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Read {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Writes the checkpoint (a temporary file renamed into place).
pub(crate) fn write(path: &Path, claims: &[ClaimInfo]) -> Result<(), StateError> {
    let err = |source| StateError::Write {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, encode(claims)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
