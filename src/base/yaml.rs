//! The one place that knows which YAML crate Deckhand uses (today `serde-saphyr`).
//!
//! Everything else calls [`from_str`] or [`from_str_reporting_unknown`], so the crate can be
//! swapped without touching callers. Input is bounded: documents over [`MAX_INPUT_BYTES`] are
//! refused before parsing, and the parser's budget caps nesting depth, node counts and alias
//! expansion (the "billion laughs" attack).

use std::fmt;

use serde::de::DeserializeOwned;

/// Largest YAML document accepted, in bytes.
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;

/// Deepest nesting of mappings/sequences accepted (a pod spec needs well under 20).
const MAX_DEPTH: usize = 64;
/// Most parser events (scalars, starts and ends of collections) in one document.
const MAX_EVENTS: usize = 200_000;
/// Most nodes in one document.
const MAX_NODES: usize = 100_000;
/// Most alias uses in one document.
const MAX_ALIASES: usize = 1_000;
/// Most events replayed through aliases in total: bounds the expanded size of the document.
const MAX_REPLAYED_EVENTS: usize = 100_000;

/// A YAML document could not be read. `line`/`column` are 1-based when the parser knows them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct YamlError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl YamlError {
    fn plain(message: impl Into<String>) -> Self {
        YamlError {
            line: None,
            column: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "line {line} column {column}: {}", self.message)
            }
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Parse one YAML document into `T`. Unknown fields are silently dropped (as `T` decides).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    check_size(text)?;
    serde_saphyr::from_str_with_options(text, options()).map_err(convert_error)
}

/// Parse one YAML document into `T` and also list the fields `T` ignored, as paths like
/// `spec.containers[0].imagePullPolcy`.
pub fn from_str_reporting_unknown<T: DeserializeOwned>(
    text: &str,
) -> Result<(T, Vec<String>), YamlError> {
    check_size(text)?;
    let mut unknown = Vec::new();
    let value = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_ignored::deserialize(de, |path| unknown.push(format_path(&path)))
    })
    .map_err(convert_error)?;
    Ok((value, unknown))
}

/// Render a `serde_ignored` path in the style Kubernetes uses for field errors:
/// `spec.containers[0].name`.
pub fn format_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", format_path(parent)),
        Path::Map { parent, key } => {
            let parent = format_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => format_path(parent),
    }
}

fn check_size(text: &str) -> Result<(), YamlError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(YamlError::plain(format!(
            "document is {} bytes, larger than the {MAX_INPUT_BYTES}-byte limit",
            text.len()
        )));
    }
    Ok(())
}

fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(MAX_INPUT_BYTES);
    budget.max_depth = MAX_DEPTH;
    budget.max_events = MAX_EVENTS;
    budget.max_nodes = MAX_NODES;
    budget.max_aliases = MAX_ALIASES;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = MAX_INPUT_BYTES;
    budget.enforce_alias_anchor_ratio = true;

    let mut alias_limits = serde_saphyr::options::AliasLimits::default();
    alias_limits.max_total_replayed_events = MAX_REPLAYED_EVENTS;
    alias_limits.max_replay_stack_depth = MAX_DEPTH;

    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.alias_limits = alias_limits;
    options.with_snippet = false;
    // Kubernetes manifests are YAML 1.1 as far as numbers go: `mode: 0644` is octal.
    options.legacy_octal_numbers = true;
    options
}

fn convert_error(err: serde_saphyr::Error) -> YamlError {
    let location = err.location();
    let (line, column) = match location {
        Some(loc) if loc.line() > 0 => (
            Some(loc.line() as usize),
            (loc.column() > 0).then_some(loc.column() as usize),
        ),
        _ => (None, None),
    };
    let mut message = err.to_string();
    // The crate appends its own position; ours is carried in `line`/`column`.
    if let Some(idx) = message.find(" at line ") {
        message.truncate(idx);
    }
    YamlError {
        line,
        column,
        message: message.trim().to_string(),
    }
}

/// One step of a field path such as `spec.containers[0].name`: a mapping key or a list index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    Key(String),
    Index(usize),
}

/// Splits a field path in the style of Kubernetes' field errors (`spec.containers[0].name`,
/// `metadata.labels[app]`) into segments. A bracket holding a number is a list index; anything
/// else in brackets is a key.
pub fn parse_field_path(path: &str) -> Vec<PathSegment> {
    let mut out = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                out.push(PathSegment::Key(after.to_string()));
                break;
            };
            let inside = &after[..end];
            out.push(match inside.parse::<usize>() {
                Ok(i) => PathSegment::Index(i),
                Err(_) => PathSegment::Key(inside.to_string()),
            });
            rest = after[end + 1..].trim_start_matches('.');
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        if end > 0 {
            out.push(PathSegment::Key(rest[..end].to_string()));
        }
        rest = rest[end..].strip_prefix('.').unwrap_or(&rest[end..]);
    }
    out
}

/// Where a field path is in a YAML (or JSON) document: the 1-based line and column of the
/// deepest part of `path` that the document has — the key of a mapping entry, or the item of a
/// list. Validation names fields by path only; this turns the path back into a place in the
/// file for people (`deckhand validate`). `None` when the text does not parse or has none of
/// the path.
pub fn locate(text: &str, path: &[PathSegment]) -> Option<(usize, usize)> {
    locate_part(text, path).map(|(at, _)| at)
}

/// [`locate`], and whether the document has the whole path (false: the place is the deepest
/// part of it the document has).
pub fn locate_part(text: &str, path: &[PathSegment]) -> Option<((usize, usize), bool)> {
    use serde_saphyr::granit_parser::{Event, Parser};

    if check_size(text).is_err() {
        return None;
    }
    /// An open collection: the path to it and where its next child goes.
    enum Frame {
        Mapping {
            path: Vec<PathSegment>,
            /// The key just read and where it starts, while its value is awaited.
            key: Option<(String, (usize, usize))>,
        },
        Sequence {
            path: Vec<PathSegment>,
            next: usize,
        },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut best: Option<(usize, (usize, usize))> = None;
    for (n, item) in Parser::new_from_str(text).enumerate() {
        if n > MAX_EVENTS {
            break;
        }
        let Ok((event, span)) = item else {
            break;
        };
        let here = (span.start.line(), span.start.col() + 1);
        let is_node = matches!(
            event,
            Event::Scalar(..)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
                | Event::Alias(..)
        );
        if !is_node {
            if matches!(event, Event::MappingEnd | Event::SequenceEnd) {
                stack.pop();
            }
            continue;
        }
        // The node's own path and the position that stands for it, or None for a mapping key.
        let placed: Option<(Vec<PathSegment>, (usize, usize))> = match stack.last_mut() {
            None => Some((Vec::new(), here)),
            Some(Frame::Mapping { path, key }) => match key.take() {
                None => {
                    let text = match &event {
                        Event::Scalar(value, ..) => value.to_string(),
                        _ => String::new(),
                    };
                    *key = Some((text, here));
                    None
                }
                Some((name, at)) => {
                    let mut p = path.clone();
                    p.push(PathSegment::Key(name));
                    Some((p, at))
                }
            },
            Some(Frame::Sequence { path, next }) => {
                let mut p = path.clone();
                p.push(PathSegment::Index(*next));
                *next += 1;
                Some((p, here))
            }
        };
        let Some((node_path, at)) = placed else {
            continue;
        };
        if node_path.len() <= path.len()
            && path[..node_path.len()] == node_path[..]
            && best.is_none_or(|(len, _)| node_path.len() > len)
        {
            best = Some((node_path.len(), at));
        }
        match event {
            Event::MappingStart(..) => stack.push(Frame::Mapping {
                path: node_path,
                key: None,
            }),
            Event::SequenceStart(..) => stack.push(Frame::Sequence {
                path: node_path,
                next: 0,
            }),
            _ => {}
        }
    }
    best.map(|(len, at)| (at, len == path.len()))
}

#[cfg(test)]
mod locate_tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels:\n    app: x\nspec:\n  containers:\n  - name: app\n    image: busybox\n  - name: side\n    imagePullPolicy: Sometimes\n";

    #[test]
    fn field_paths_split_into_keys_and_indexes() {
        use PathSegment::*;
        assert_eq!(
            parse_field_path("spec.containers[1].imagePullPolicy"),
            vec![
                Key("spec".into()),
                Key("containers".into()),
                Index(1),
                Key("imagePullPolicy".into())
            ]
        );
        assert_eq!(
            parse_field_path("metadata.labels[app.kubernetes.io/name]"),
            vec![
                Key("metadata".into()),
                Key("labels".into()),
                Key("app.kubernetes.io/name".into())
            ]
        );
        assert_eq!(parse_field_path(""), vec![]);
    }

    #[test]
    fn locates_the_deepest_part_of_a_path_the_document_has() {
        let rows = [
            ("spec.containers[1].imagePullPolicy", Some((12, 5))),
            ("spec.containers[1]", Some((11, 5))),
            ("spec.containers[0].name", Some((9, 5))),
            ("metadata.labels[app]", Some((6, 5))),
            // Missing fields point at the nearest parent the file has.
            ("spec.containers[1].image", Some((11, 5))),
            ("spec.volumes[0].name", Some((7, 1))),
            ("metadata.name", Some((4, 3))),
        ];
        for (path, want) in rows {
            assert_eq!(locate(POD, &parse_field_path(path)), want, "{path}");
        }
    }

    #[test]
    fn json_documents_are_located_too() {
        let json = "{\n  \"metadata\": {\"name\": \"a\"},\n  \"spec\": {\n    \"containers\": [{\"name\": \"c\"}]\n  }\n}\n";
        assert_eq!(
            locate(json, &parse_field_path("spec.containers[0].name")),
            Some((4, 21))
        );
    }

    #[test]
    fn text_that_does_not_parse_has_no_location_past_the_error() {
        assert_eq!(locate("a: [\n", &parse_field_path("b")), Some((1, 1)));
    }
}

#[cfg(test)]
mod octal_tests {
    #[test]
    fn leading_zero_numbers_are_octal_like_kubernetes_reads_them() {
        #[derive(serde::Deserialize)]
        struct M {
            mode: i32,
            plain: i32,
        }
        let m: M = super::from_str("mode: 0644\nplain: 420\n").unwrap();
        assert_eq!(m.mode, 0o644);
        assert_eq!(m.plain, 420);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Doc {
        name: String,
        #[serde(default)]
        items: Vec<u32>,
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        value: u32,
    }

    #[test]
    fn good_document() {
        let doc: Doc = from_str("name: web\nitems: [1, 2, 3]\n").unwrap();
        assert_eq!(doc.name, "web");
        assert_eq!(doc.items, vec![1, 2, 3]);
    }

    #[test]
    fn json_is_yaml() {
        let doc: Doc = from_str(r#"{"name": "web", "items": [4]}"#).unwrap();
        assert_eq!(doc.items, vec![4]);
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let err = from_str::<Doc>("name: web\nitems: [1, 2\n  bad: : :\n").unwrap_err();
        assert!(err.line.is_some(), "{err:?}");
        assert!(err.column.is_some(), "{err:?}");
        let shown = err.to_string();
        assert!(shown.starts_with("line "), "{shown}");
        assert!(shown.contains(" column "), "{shown}");
    }

    #[test]
    fn type_error_has_line() {
        let err = from_str::<Doc>("name: web\nitems:\n  - one\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err:?}");
    }

    #[test]
    fn too_large_rejected() {
        let text = format!("name: \"{}\"\n", "x".repeat(MAX_INPUT_BYTES));
        let err = from_str::<Doc>(&text).unwrap_err();
        assert!(err.message.contains("limit"), "{err}");
        assert_eq!(err.line, None);
    }

    #[test]
    fn alias_bomb_rejected() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let prev = format!("*a{}", i - 1);
            let list = [prev.as_str(); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{list}]\n"));
        }
        text.push_str("name: boom\n");
        let result = from_str::<serde_json::Value>(&text);
        let err = result.expect_err("alias bomb accepted");
        assert!(err.message.contains("alias"), "{err}");
    }

    #[test]
    fn deep_nesting_rejected() {
        let text = format!("{}1{}", "[".repeat(500), "]".repeat(500));
        assert!(from_str::<serde_json::Value>(&text).is_err());
    }

    #[test]
    fn unknown_fields_reported() {
        let (doc, unknown) = from_str_reporting_unknown::<Doc>(
            "name: web\nnmae: typo\ninner:\n  value: 1\n  extra: true\n",
        )
        .unwrap();
        assert_eq!(doc.name, "web");
        assert_eq!(unknown, vec!["nmae".to_string(), "inner.extra".to_string()]);
    }

    #[test]
    fn multiple_documents_rejected() {
        assert!(from_str::<Doc>("name: a\n---\nname: b\n").is_err());
    }
}
