//! Decoding manifest bytes (YAML or JSON) into [`Pod`]s, with unknown fields reported.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::base::yaml;

/// Largest manifest accepted, in bytes (the YAML module enforces the same bound).
pub(crate) const MAX_MANIFEST_BYTES: usize = yaml::MAX_INPUT_BYTES;

/// Pods decoded from one manifest, plus the paths of fields nothing understood.
#[derive(Clone, Debug, Default)]
pub(crate) struct Decoded {
    pub pods: Vec<Pod>,
    /// Field paths such as `spec.hostNetwrk` (for lists: `items[2].spec.hostNetwrk`).
    pub unknown_fields: Vec<String>,
    /// True when the manifest was a `PodList` / `List`.
    pub from_list: bool,
}

/// Why a manifest could not be decoded. Displays as
/// `<origin>: line L column C: <field>: <reason>` with the parts that are known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The file path or URL the bytes came from.
    pub origin: String,
    /// The offending field when known (`kind`, `apiVersion`).
    pub field: Option<String>,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub reason: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.origin)?;
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l} column {c}: ")?,
            (Some(l), None) => write!(f, "line {l}: ")?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.reason)
    }
}

impl ManifestError {
    fn new(origin: &str, field: Option<&str>, reason: impl Into<String>) -> Self {
        ManifestError {
            origin: origin.to_string(),
            field: field.map(str::to_string),
            line: None,
            column: None,
            reason: reason.into(),
        }
    }
}

/// Just enough of an object to know what it is.
#[derive(Deserialize)]
struct TypeMeta {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// Decode a manifest. `allow_list` accepts a `PodList` / `List` of pods (the HTTP source).
pub(crate) fn decode(
    bytes: &[u8],
    origin: &str,
    allow_list: bool,
) -> Result<Decoded, ManifestError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::new(
            origin,
            None,
            format!(
                "manifest is {} bytes, larger than the {MAX_MANIFEST_BYTES}-byte limit",
                bytes.len()
            ),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ManifestError::new(origin, None, format!("not UTF-8 text: {e}")))?;
    let trimmed = text.trim_start_matches('\u{feff}');
    if trimmed.trim().is_empty() {
        return Err(ManifestError::new(origin, None, "manifest is empty"));
    }
    let json = trimmed.trim_start().starts_with('{');

    let meta: TypeMeta = parse_plain(trimmed, json, origin)?;
    let kind = meta.kind.unwrap_or_default();
    let api_version = meta.api_version.unwrap_or_default();
    if kind.is_empty() {
        return Err(ManifestError::new(
            origin,
            Some("kind"),
            "missing; expected Pod",
        ));
    }
    let expected_kinds = if allow_list {
        "Pod, PodList or List"
    } else {
        "Pod"
    };
    let is_list = kind == "PodList" || kind == "List";
    if kind != "Pod" && !(allow_list && is_list) {
        return Err(ManifestError::new(
            origin,
            Some("kind"),
            format!("{kind:?} is not supported here; expected {expected_kinds}"),
        ));
    }
    if api_version.is_empty() {
        return Err(ManifestError::new(
            origin,
            Some("apiVersion"),
            "missing; expected v1",
        ));
    }
    if api_version != "v1" {
        return Err(ManifestError::new(
            origin,
            Some("apiVersion"),
            format!("{api_version:?} is not supported; expected v1"),
        ));
    }

    if kind == "Pod" {
        let (pod, unknown_fields) = parse_reporting::<Pod>(trimmed, json, origin)?;
        return Ok(Decoded {
            pods: vec![pod],
            unknown_fields,
            from_list: false,
        });
    }
    let (list, unknown_fields) = parse_reporting::<PodListRaw>(trimmed, json, origin)?;
    for (i, item) in list.items.iter().enumerate() {
        if item
            .get("kind")
            .and_then(|k| k.as_str())
            .is_some_and(|k| k != "Pod")
        {
            return Err(ManifestError::new(
                origin,
                Some(&format!("items[{i}].kind")),
                "expected Pod",
            ));
        }
    }
    let mut pods = Vec::with_capacity(list.items.len());
    let mut unknown = unknown_fields;
    for (i, item) in list.items.into_iter().enumerate() {
        let mut item_unknown = Vec::new();
        let pod: Pod =
            serde_ignored::deserialize(item, |path| item_unknown.push(yaml::format_path(&path)))
                .map_err(|e| {
                    ManifestError::new(origin, Some(&format!("items[{i}]")), e.to_string())
                })?;
        unknown.extend(item_unknown.into_iter().map(|p| format!("items[{i}].{p}")));
        pods.push(pod);
    }
    Ok(Decoded {
        pods,
        unknown_fields: unknown,
        from_list: true,
    })
}

/// A `PodList` / `List` as read from the wire: items stay generic so that each can be decoded (and its
/// unknown fields reported) on its own.
#[derive(Deserialize)]
struct PodListRaw {
    #[serde(rename = "apiVersion", default)]
    #[allow(dead_code)]
    api_version: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    kind: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

fn parse_plain<T: DeserializeOwned>(
    text: &str,
    json: bool,
    origin: &str,
) -> Result<T, ManifestError> {
    parse_reporting(text, json, origin).map(|(v, _)| v)
}

fn parse_reporting<T: DeserializeOwned>(
    text: &str,
    json: bool,
    origin: &str,
) -> Result<(T, Vec<String>), ManifestError> {
    if json {
        let mut unknown = Vec::new();
        let mut de = serde_json::Deserializer::from_str(text);
        let value =
            serde_ignored::deserialize(&mut de, |path| unknown.push(yaml::format_path(&path)))
                .and_then(|v| de.end().map(|()| v))
                .map_err(|e| json_error(origin, &e))?;
        Ok((value, unknown))
    } else {
        yaml::from_str_reporting_unknown(text).map_err(|e| ManifestError {
            origin: origin.to_string(),
            field: None,
            line: e.line,
            column: e.column,
            reason: e.message,
        })
    }
}

fn json_error(origin: &str, e: &serde_json::Error) -> ManifestError {
    let mut reason = e.to_string();
    if let Some(idx) = reason.find(" at line ") {
        reason.truncate(idx);
    }
    ManifestError {
        origin: origin.to_string(),
        field: None,
        line: (e.line() > 0).then_some(e.line()),
        column: (e.column() > 0).then_some(e.column()),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD_YAML: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: nginx\n";
    const GOOD_JSON: &str = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]}}"#;

    #[test]
    fn good_documents() {
        for (what, text) in [("yaml", GOOD_YAML), ("json", GOOD_JSON)] {
            let d = decode(text.as_bytes(), "m", false).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(d.pods.len(), 1, "{what}");
            assert_eq!(d.pods[0].metadata.name.as_deref(), Some("web"), "{what}");
            assert!(d.unknown_fields.is_empty(), "{what}");
            assert!(!d.from_list);
        }
    }

    /// (input, allow_list, expected field, expected line, text the reason contains)
    type ErrorCase = (
        &'static str,
        bool,
        Option<&'static str>,
        Option<usize>,
        &'static str,
    );

    #[test]
    fn error_table() {
        let cases: &[ErrorCase] = &[
            (
                "apiVersion: v1\nkind: Pod\nspec: [oops\n",
                false,
                None,
                Some(3),
                "bracket",
            ),
            (
                "apiVersion: v1\nkind: Pod\nspec:\n  containers: 3\n",
                false,
                None,
                Some(4),
                "",
            ),
            (
                "{\"apiVersion\": \"v1\",\n \"kind\": \"Pod\",\n \"spec\": }",
                true,
                None,
                Some(3),
                "",
            ),
            (
                "apiVersion: v1\nkind: Service\n",
                false,
                Some("kind"),
                None,
                "Service",
            ),
            (
                "apiVersion: v1\nkind: PodList\nitems: []\n",
                false,
                Some("kind"),
                None,
                "PodList",
            ),
            (
                "apiVersion: v1\nmetadata: {name: a}\n",
                false,
                Some("kind"),
                None,
                "missing",
            ),
            ("kind: Pod\n", false, Some("apiVersion"), None, "missing"),
            (
                "apiVersion: apps/v1\nkind: Pod\n",
                false,
                Some("apiVersion"),
                None,
                "apps/v1",
            ),
            ("- a\n- b\n", false, None, None, ""),
            ("", false, None, None, "empty"),
            (
                "apiVersion: v1\nkind: PodList\nitems: [{kind: Service}]\n",
                true,
                Some("items[0].kind"),
                None,
                "Pod",
            ),
        ];
        for (text, allow_list, field, line, reason) in cases {
            let err = decode(text.as_bytes(), "/m/p.yaml", *allow_list)
                .expect_err(&format!("accepted {text:?}"));
            assert_eq!(err.origin, "/m/p.yaml");
            assert_eq!(err.field.as_deref(), *field, "{text:?}: {err}");
            if line.is_some() {
                assert_eq!(err.line, *line, "{text:?}: {err}");
                assert!(err.column.is_some(), "{text:?}: {err}");
                assert!(err.to_string().starts_with("/m/p.yaml: line "), "{err}");
            }
            assert!(err.reason.contains(reason), "{text:?}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_warnings() {
        let text = GOOD_YAML.replace("spec:\n", "spec:\n  hostNetwrk: true\n") + "extra: 1\n";
        let d = decode(text.as_bytes(), "m", false).unwrap();
        assert_eq!(d.unknown_fields, ["spec.hostNetwrk", "extra"]);

        let json = GOOD_JSON.replace(
            r#""image": "nginx""#,
            r#""image": "nginx", "imagePullPolcy": "Always""#,
        );
        let d = decode(json.as_bytes(), "m", false).unwrap();
        assert_eq!(d.unknown_fields, ["spec.containers[0].imagePullPolcy"]);
    }

    #[test]
    fn lists_only_when_allowed() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a}\n  spec: {containers: [{name: c, image: x}], hostNetwrk: true}\n- metadata: {name: b}\n  spec: {containers: [{name: c, image: x}]}\n";
        let d = decode(list.as_bytes(), "u", true).unwrap();
        assert!(d.from_list);
        assert_eq!(d.pods.len(), 2);
        assert_eq!(d.unknown_fields, ["items[0].spec.hostNetwrk"]);
        assert!(decode(list.as_bytes(), "u", false).is_err());
    }

    #[test]
    fn oversized_rejected() {
        let big = vec![b' '; MAX_MANIFEST_BYTES + 1];
        let err = decode(&big, "m", false).unwrap_err();
        assert!(err.reason.contains("limit"));
    }
}
