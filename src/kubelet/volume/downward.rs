//! The files of downwardAPI volumes and of projected volumes (downwardAPI sources only: the
//! other sources need objects from an API server).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod};

use super::atomic_writer::{FileProjection, Payload};
use crate::base::podspec::resources::{NodeAllocatable, ResourceFieldError, resource_field_value};

/// Mode of a file when neither the item nor the volume says otherwise.
pub(crate) const DEFAULT_MODE: i32 = 0o644;

/// `key="value"` lines, sorted by key, the value quoted as Go's `%q` does, no final newline.
pub(crate) fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let Some(map) = map else { return String::new() };
    let lines: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    lines.join("\n")
}

/// A string in Go's `strconv.Quote` form: double quotes; `\"` and `\\`; `\a \b \f \n \r \t \v`;
/// other control bytes as `\xNN`; other non-printable characters as `\uNNNN` / `\UNNNNNNNN`;
/// printable characters (including non-ASCII) as they are.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint`: everything but control characters, spaces other
/// than U+0020, format characters and unassigned/private-use planes we know of.
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let n = c as u32;
    !matches!(n,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x202a..=0x202e | 0x2060..=0x206f | 0xd800..=0xdfff | 0xe000..=0xf8ff
        | 0xfeff | 0xfff9..=0xfffb | 0xfffe | 0xffff | 0xe0001..=0xe007f
        | 0xf0000..=0x10ffff)
}

/// Why one item of a downwardAPI volume has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ItemError {
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    #[error("item {0:?} has neither fieldRef nor resourceFieldRef")]
    NoSource(String),
    #[error(transparent)]
    Resource(#[from] ResourceFieldError),
}

/// The value of a downward-API field path in a volume file.
pub(crate) fn field_value(pod: &Pod, path: &str) -> Result<String, ItemError> {
    let meta = &pod.metadata;
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        _ => {
            let pick = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
                path.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix("['"))
                    .and_then(|rest| rest.strip_suffix("']"))
                    .map(|key| map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
            };
            pick("metadata.labels", meta.labels.as_ref())
                .or_else(|| pick("metadata.annotations", meta.annotations.as_ref()))
                .ok_or_else(|| ItemError::UnsupportedFieldPath(path.to_string()))?
        }
    })
}

/// The files of a list of downwardAPI items, added to `payload`. Errors are collected, one per
/// item, as upstream aggregates them.
pub(crate) fn collect_items(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    node: &NodeAllocatable,
    payload: &mut Payload,
    errors: &mut Vec<ItemError>,
) {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    for item in items {
        let mode = item.mode.unwrap_or(default_mode);
        let value = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)
        } else if let Some(resource) = &item.resource_field_ref {
            resource_field_value(pod, None, resource, node).map_err(ItemError::from)
        } else {
            Err(ItemError::NoSource(item.path.clone()))
        };
        match value {
            Ok(v) => {
                payload.insert(
                    item.path.clone(),
                    FileProjection {
                        data: v.into_bytes(),
                        mode: mode as u32 & 0o7777,
                    },
                );
            }
            Err(e) => errors.push(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectFieldSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn quoting_matches_go() {
        let cases = [
            ("plain", "\"plain\""),
            ("", "\"\""),
            ("a \"b\" c", "\"a \\\"b\\\" c\""),
            ("back\\slash", "\"back\\\\slash\""),
            ("line1\nline2\ttab\r", "\"line1\\nline2\\ttab\\r\""),
            ("\u{7}\u{8}\u{b}\u{c}", "\"\\a\\b\\v\\f\""),
            ("\u{1}\u{7f}", "\"\\x01\\x7f\""),
            ("héllo wörld ✓ 日本", "\"héllo wörld ✓ 日本\""),
            ("nb\u{a0}sp", "\"nb\\u00a0sp\""),
            ("zw\u{200b}", "\"zw\\u200b\""),
            ("bom\u{feff}", "\"bom\\ufeff\""),
            ("\u{85}", "\"\\u0085\""),
            ("emoji 😀", "\"emoji 😀\""),
            ("priv\u{f0000}", "\"priv\\U000f0000\""),
            ("'single'", "\"'single'\""),
        ];
        for (input, want) in cases {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
    }

    #[test]
    fn map_format_is_sorted_quoted_and_has_no_final_newline() {
        let map = BTreeMap::from([
            ("zeta".to_string(), "last".to_string()),
            ("app".to_string(), "web".to_string()),
            ("kubernetes.io/config.hash".to_string(), "abc".to_string()),
            ("multi".to_string(), "a\nb".to_string()),
        ]);
        assert_eq!(
            format_map(Some(&map)),
            "app=\"web\"\nkubernetes.io/config.hash=\"abc\"\nmulti=\"a\\nb\"\nzeta=\"last\""
        );
        assert_eq!(format_map(None), "");
        assert_eq!(format_map(Some(&BTreeMap::new())), "");
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-n1".into()),
                namespace: Some("default".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                annotations: Some(BTreeMap::from([(
                    "note".to_string(),
                    "hi \"x\"".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            ..Default::default()
        }
    }

    #[test]
    fn field_values() {
        let p = pod();
        let cases = [
            ("metadata.name", "web-n1"),
            ("metadata.namespace", "default"),
            ("metadata.uid", "u-1"),
            ("metadata.labels", "app=\"web\""),
            ("metadata.annotations", "note=\"hi \\\"x\\\"\""),
            ("metadata.labels['app']", "web"),
            ("metadata.labels['missing']", ""),
            ("metadata.annotations['note']", "hi \"x\""),
        ];
        for (path, want) in cases {
            assert_eq!(field_value(&p, path).as_deref(), Ok(want), "{path}");
        }
        assert_eq!(
            field_value(&p, "spec.nodeName"),
            Err(ItemError::UnsupportedFieldPath("spec.nodeName".to_string()))
        );
    }

    #[test]
    fn items_with_modes_and_errors() {
        let item = |path: &str, field: &str, mode: Option<i32>| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: field.into(),
            }),
            mode,
            resource_field_ref: None,
            user: None,
        };
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        collect_items(
            &pod(),
            &[
                item("labels", "metadata.labels", None),
                item("name", "metadata.name", Some(0o400)),
                item("bad", "status.podIP", None),
            ],
            Some(0o640),
            &NodeAllocatable::default(),
            &mut payload,
            &mut errors,
        );
        assert_eq!(payload["labels"].mode, 0o640);
        assert_eq!(payload["name"].mode, 0o400);
        assert_eq!(payload["name"].data, b"web-n1");
        assert!(!payload.contains_key("bad"));
        assert_eq!(
            errors,
            vec![ItemError::UnsupportedFieldPath("status.podIP".to_string())]
        );
    }
}
