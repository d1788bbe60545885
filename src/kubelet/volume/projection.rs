//! The files of configMap and secret volumes (and of those sources of a projected volume):
//! every key as a file named after it, or only the listed `items` at their paths, each with
//! the item's `mode` or the volume's `defaultMode` (pure; upstream's `MakePayload`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Secret};

use super::atomic_writer::{FileProjection, Payload};

/// A listed key that the object does not have (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProjectionError {
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    SecretKey(String),
}

fn file(data: &[u8], mode: i32) -> FileProjection {
    FileProjection {
        data: data.to_vec(),
        mode: mode as u32 & 0o7777,
    }
}

/// Projects `entries` (key → bytes) with `items` into `payload`. With no items every key
/// becomes a file; with items only those, a missing key being an error unless `optional`.
fn project<'a>(
    entries: &BTreeMap<&'a str, &'a [u8]>,
    items: &[KeyToPath],
    default_mode: i32,
    optional: bool,
    missing: fn(String) -> ProjectionError,
    payload: &mut Payload,
) -> Result<(), ProjectionError> {
    if items.is_empty() {
        for (key, data) in entries {
            payload.insert(key.to_string(), file(data, default_mode));
        }
        return Ok(());
    }
    for item in items {
        match entries.get(item.key.as_str()) {
            Some(data) => {
                payload.insert(
                    item.path.clone(),
                    file(data, item.mode.unwrap_or(default_mode)),
                );
            }
            None if optional => {}
            None => return Err(missing(item.key.clone())),
        }
    }
    Ok(())
}

/// A configMap's `data` and `binaryData` (a key in both: `data` wins, as upstream looks
/// there first).
pub(crate) fn config_map_payload(
    cm: &ConfigMap,
    items: &[KeyToPath],
    default_mode: i32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), ProjectionError> {
    let mut entries: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (k, v) in cm.binary_data.iter().flatten() {
        entries.insert(k, &v.0);
    }
    for (k, v) in cm.data.iter().flatten() {
        entries.insert(k, v.as_bytes());
    }
    project(
        &entries,
        items,
        default_mode,
        optional,
        ProjectionError::ConfigMapKey,
        payload,
    )
}

/// A secret's `data`.
pub(crate) fn secret_payload(
    secret: &Secret,
    items: &[KeyToPath],
    default_mode: i32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), ProjectionError> {
    let entries: BTreeMap<&str, &[u8]> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.0.as_slice()))
        .collect();
    project(
        &entries,
        items,
        default_mode,
        optional,
        ProjectionError::SecretKey,
        payload,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("app.conf".to_string(), "port=80".to_string()),
                ("both".to_string(), "text".to_string()),
            ])),
            binary_data: Some(BTreeMap::from([
                ("logo.bin".to_string(), ByteString(vec![0, 159, 146])),
                ("both".to_string(), ByteString(b"bytes".to_vec())),
            ])),
            ..Default::default()
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
            user: None,
        }
    }

    fn show(payload: &Payload) -> Vec<(String, String, u32)> {
        payload
            .iter()
            .map(|(p, f)| {
                (
                    p.clone(),
                    String::from_utf8_lossy(&f.data).into_owned(),
                    f.mode,
                )
            })
            .collect()
    }

    #[test]
    fn config_map_projection_table() {
        type Row = (
            &'static str,
            Vec<KeyToPath>,
            i32,
            bool,
            Result<Vec<(&'static str, &'static str, u32)>, &'static str>,
        );
        let rows: Vec<Row> = vec![
            (
                "every key, default mode, data over binaryData",
                vec![],
                0o644,
                false,
                Ok(vec![
                    ("app.conf", "port=80", 0o644),
                    ("both", "text", 0o644),
                    ("logo.bin", "\0\u{fffd}\u{fffd}", 0o644),
                ]),
            ),
            (
                "items at their paths, item mode over defaultMode",
                vec![
                    item("app.conf", "etc/app/app.conf", Some(0o400)),
                    item("both", "b", None),
                ],
                0o640,
                false,
                Ok(vec![
                    ("b", "text", 0o640),
                    ("etc/app/app.conf", "port=80", 0o400),
                ]),
            ),
            (
                "a missing key",
                vec![item("nope", "x", None)],
                0o644,
                false,
                Err("configmap references non-existent config key: nope"),
            ),
            (
                "a missing key of an optional volume is left out",
                vec![item("nope", "x", None), item("app.conf", "a", None)],
                0o644,
                true,
                Ok(vec![("a", "port=80", 0o644)]),
            ),
            (
                "setuid and other high bits are kept to 0o7777",
                vec![item("both", "b", Some(0o104755))],
                0o644,
                false,
                Ok(vec![("b", "text", 0o4755)]),
            ),
        ];
        for (what, items, mode, optional, want) in rows {
            let mut payload = Payload::new();
            let got = config_map_payload(&cm(), &items, mode, optional, &mut payload)
                .map(|()| show(&payload))
                .map_err(|e| e.to_string());
            let want = want
                .map(|v| {
                    v.into_iter()
                        .map(|(p, d, m)| (p.to_string(), d.to_string(), m))
                        .collect::<Vec<_>>()
                })
                .map_err(str::to_string);
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn secret_projection() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                ("password".to_string(), ByteString(b"hunter2".to_vec())),
                ("user".to_string(), ByteString(b"admin".to_vec())),
            ])),
            ..Default::default()
        };
        let mut payload = Payload::new();
        secret_payload(&secret, &[], 0o400, false, &mut payload).unwrap();
        assert_eq!(
            show(&payload),
            [
                ("password".to_string(), "hunter2".to_string(), 0o400),
                ("user".to_string(), "admin".to_string(), 0o400)
            ]
        );
        let err = secret_payload(
            &secret,
            &[item("token", "t", None)],
            0o644,
            false,
            &mut payload,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "references non-existent secret key: token");
        let mut empty = Payload::new();
        secret_payload(&Secret::default(), &[], 0o644, true, &mut empty).unwrap();
        assert!(empty.is_empty());
    }
}
