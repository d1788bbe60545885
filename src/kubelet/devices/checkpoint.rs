//! Upstream's device manager checkpoint, `device-plugins/kubelet_internal_checkpoint`: which
//! devices each container holds (with the plugin's `Allocate` answer) and each resource's
//! healthy devices, in upstream's JSON (`checkpoint.Data`) with its checksum, so that a restart
//! of Deckhand (or a switch between Deckhand and upstream's kubelet) keeps every running
//! container's devices.
//!
//! The checksum is upstream's `checksum.New(data)`: FNV-32a over the data as go-spew prints
//! it with `%#v` (types on fields, none on elements, map keys sorted). [`spew`] writes that
//! text for this one shape.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::table::Allocation;

/// The file's name under `device-plugins/`.
pub(crate) const FILE_NAME: &str = "kubelet_internal_checkpoint";

/// Why the checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
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
    #[error("{path} is not a device manager checkpoint: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
    #[error("checkpoint is corrupted: checksum {found} does not match the data's {computed}")]
    Checksum { found: u32, computed: u32 },
}

/// `checkpoint.Data`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct File {
    #[serde(rename = "Data")]
    pub data: Data,
    #[serde(rename = "Checksum")]
    pub checksum: u32,
}

/// `checkpoint.checkpointData`. `None` stands for Go's nil slice or map (`null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Data {
    #[serde(rename = "PodDeviceEntries")]
    pub entries: Option<Vec<Entry>>,
    #[serde(rename = "RegisteredDevices")]
    pub registered: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// `checkpoint.PodDevicesEntry`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Entry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container: String,
    #[serde(rename = "ResourceName")]
    pub resource: String,
    /// NUMA node (as a JSON string key) → device IDs.
    #[serde(rename = "DeviceIDs")]
    pub device_ids: Option<BTreeMap<i64, Option<Vec<String>>>>,
    /// The encoded `ContainerAllocateResponse`, base64 in JSON as Go writes `[]byte`.
    #[serde(rename = "AllocResp", with = "go_bytes")]
    pub alloc_resp: Option<Vec<u8>>,
}

mod go_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

impl Data {
    /// The checkpoint of these allocations and healthy devices (IDs sorted).
    pub(crate) fn of(allocations: &[Allocation], healthy: &BTreeMap<String, Vec<String>>) -> Data {
        let entries: Vec<Entry> = allocations
            .iter()
            .map(|a| Entry {
                pod_uid: a.pod_uid.clone(),
                container: a.container.clone(),
                resource: a.resource.clone(),
                device_ids: Some(
                    a.devices
                        .iter()
                        .map(|(numa, ids)| (*numa, Some(ids.clone())))
                        .collect(),
                ),
                alloc_resp: Some(a.response.clone()),
            })
            .collect();
        Data {
            entries: (!entries.is_empty()).then_some(entries),
            registered: Some(
                healthy
                    .iter()
                    .map(|(name, ids)| (name.clone(), Some(ids.clone())))
                    .collect(),
            ),
        }
    }

    /// The allocations it holds.
    pub(crate) fn allocations(&self) -> Vec<Allocation> {
        self.entries
            .iter()
            .flatten()
            .map(|e| Allocation {
                pod_uid: e.pod_uid.clone(),
                container: e.container.clone(),
                resource: e.resource.clone(),
                devices: e
                    .device_ids
                    .iter()
                    .flatten()
                    .map(|(numa, ids)| (*numa, ids.clone().unwrap_or_default()))
                    .collect(),
                response: e.alloc_resp.clone().unwrap_or_default(),
            })
            .collect()
    }
}

/// FNV-32a, as Go's `hash/fnv`.
fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// `data` as go-spew's `%#v` prints a `checkpoint.checkpointData`.
pub(crate) fn spew(data: &Data) -> String {
    let mut out =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &data.entries {
        None => out.push_str("<nil>"),
        Some(entries) => {
            out.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)",
                    e.pod_uid, e.container, e.resource
                );
                match &e.device_ids {
                    None => out.push_str("<nil>"),
                    Some(map) => {
                        out.push_str("map[");
                        let items: Vec<String> = map
                            .iter()
                            .map(|(numa, ids)| format!("{numa}:{}", strings(ids.as_deref())))
                            .collect();
                        out.push_str(&items.join(" "));
                        out.push(']');
                    }
                }
                out.push_str(" AllocResp:([]uint8)");
                match &e.alloc_resp {
                    None => out.push_str("<nil>"),
                    Some(bytes) => {
                        let items: Vec<String> = bytes.iter().map(u8::to_string).collect();
                        let _ = write!(out, "[{}]", items.join(" "));
                    }
                }
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push_str(" RegisteredDevices:(map[string][]string)");
    match &data.registered {
        None => out.push_str("<nil>"),
        Some(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(name, ids)| format!("{name}:{}", strings(ids.as_deref())))
                .collect();
            let _ = write!(out, "map[{}]", items.join(" "));
        }
    }
    out.push('}');
    out
}

fn strings(ids: Option<&[String]>) -> String {
    match ids {
        None => "<nil>".to_string(),
        Some(ids) => format!("[{}]", ids.join(" ")),
    }
}

/// Upstream's checksum of the data.
pub(crate) fn checksum(data: &Data) -> u32 {
    fnv32a(spew(data).as_bytes())
}

/// The file's bytes: the data with its checksum.
pub(crate) fn encode(data: Data) -> Vec<u8> {
    let checksum = checksum(&data);
    serde_json::to_vec(&File { data, checksum }).unwrap_or_default()
}

/// Reads the file; `Ok(None)` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<Data>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Read {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Decode {
        path: path.display().to_string(),
        source,
    })?;
    let computed = checksum(&file.data);
    if computed != file.checksum {
        return Err(CheckpointError::Checksum {
            found: file.checksum,
            computed,
        });
    }
    Ok(Some(file.data))
}

/// Writes the file atomically (a temporary file renamed over it).
pub(crate) fn write(path: &Path, data: Data) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    let err = |source| CheckpointError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&tmp, encode(data)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Base64 of the bytes, as Go writes `[]byte` (for tests and logs).
#[cfg(test)]
fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::devices::table::NO_TOPOLOGY;

    fn sample() -> Data {
        let allocations = vec![Allocation {
            pod_uid: "uid-1".into(),
            container: "c".into(),
            resource: "example.com/resource".into(),
            devices: BTreeMap::from([(NO_TOPOLOGY, vec!["Dev-1".to_string()])]),
            response: vec![18, 3, 1, 2],
        }];
        let healthy = BTreeMap::from([(
            "example.com/resource".to_string(),
            vec!["Dev-1".to_string(), "Dev-2".to_string()],
        )]);
        Data::of(&allocations, &healthy)
    }

    #[test]
    fn spew_text_is_go_spews_for_the_checkpoint_shape() {
        assert_eq!(
            spew(&sample()),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)uid-1 ContainerName:(string)c ResourceName:(string)example.com/resource DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[Dev-1]] AllocResp:([]uint8)[18 3 1 2]}] RegisteredDevices:(map[string][]string)map[example.com/resource:[Dev-1 Dev-2]]}"
        );
        assert_eq!(
            spew(&Data::default()),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> RegisteredDevices:(map[string][]string)<nil>}"
        );
    }

    #[test]
    fn json_is_upstreams_and_round_trips_with_its_checksum() {
        let bytes = encode(sample());
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(r#"{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"c","ResourceName":"example.com/resource","DeviceIDs":{"-1":["Dev-1"]},"AllocResp":""#), "{text}");
        assert!(text.contains(&b64(&[18, 3, 1, 2])));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write(&path, sample()).unwrap();
        let back = read(&path).unwrap().unwrap();
        assert_eq!(back, sample());
        assert_eq!(back.allocations()[0].response, vec![18, 3, 1, 2]);
        // A changed byte is caught by the checksum.
        let tampered = text.replace("Dev-2", "Dev-9");
        std::fs::write(&path, tampered).unwrap();
        assert!(matches!(read(&path), Err(CheckpointError::Checksum { .. })));
        assert!(read(&dir.path().join("none")).unwrap().is_none());
    }

    #[test]
    fn checksums_are_upstreams() {
        // The values upstream's checkpoint.New(...).MarshalCheckpoint() wrote for the same
        // data (k8s.io/kubernetes v1.37.2, pkg/kubelet/cm/devicemanager/checkpoint).
        assert_eq!(checksum(&sample()), 2_346_640_708);
        let empty = Data {
            entries: None,
            registered: Some(BTreeMap::new()),
        };
        assert_eq!(checksum(&empty), 3_467_439_661);
        assert!(String::from_utf8(encode(sample())).unwrap().ends_with(r#""AllocResp":"EgMBAg=="}],"RegisteredDevices":{"example.com/resource":["Dev-1","Dev-2"]}},"Checksum":2346640708}"#));
    }

    #[test]
    fn fnv32a_matches_gos() {
        // hash/fnv New32a: "" → 0x811c9dc5, "a" → 0xe40c292c.
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
    }
}
