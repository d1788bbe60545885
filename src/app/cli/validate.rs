//! `deckhand validate FILE…`: what the static-pod loader would say about manifests, with file,
//! line and column, without running anything. Pure apart from the caller reading the files.

use std::path::Path;

use serde::Serialize;

use crate::base::clock;
use crate::base::yaml;
use crate::kubelet::source::defaults::ManifestOrigin;
use crate::kubelet::source::{LoadError, NodeSecurity, load_static_pods, validate};

/// How bad one finding is: errors stop a manifest from running, warnings do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    Error,
    Warning,
}

/// One finding in one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Diagnostic {
    pub severity: Severity,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    pub message: String,
}

/// What `validate` found in one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct FileReport {
    pub file: String,
    /// The file would run: no errors (warnings allowed).
    pub ok: bool,
    /// The pods it stands for, as the node would name them (`<name>-<node>`).
    pub pods: Vec<String>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Checks one manifest's bytes as the file source would load it on a node named `node_name`
/// (static-pod names get the node's name as a suffix) with `security` as what the node can
/// enforce.
pub(crate) fn check(
    file: &Path,
    bytes: &[u8],
    node_name: &str,
    security: &NodeSecurity,
) -> FileReport {
    let text = String::from_utf8_lossy(bytes);
    let place = |field: &str| yaml::locate(&text, &yaml::parse_field_path(field));
    // Fields the file does not have came from defaulting (a request copied from its limit):
    // their findings repeat one about a field the file has, and are dropped below.
    let written = |field: &str| {
        yaml::locate_part(&text, &yaml::parse_field_path(field)).is_some_and(|(_, whole)| whole)
    };
    let mut diagnostics = Vec::new();
    let mut pods = Vec::new();
    match load_static_pods(
        bytes,
        ManifestOrigin::File(file),
        node_name,
        security,
        clock::now(),
    ) {
        Ok(loaded) => {
            for field in &loaded.unknown_fields {
                let at = place(field);
                diagnostics.push(Diagnostic {
                    severity: Severity::Warning,
                    line: at.map(|a| a.0),
                    column: at.map(|a| a.1),
                    field: Some(field.clone()),
                    message: "unknown field; it is ignored".into(),
                });
            }
            for pod in &loaded.pods {
                let name = pod.metadata.name.clone().unwrap_or_default();
                // The sync loop refuses these at admission; say so here rather than there.
                if let Some(refusal) = validate::static_pod_api_refusal(pod) {
                    let at = place("spec");
                    diagnostics.push(Diagnostic {
                        severity: Severity::Error,
                        line: at.map(|a| a.0),
                        column: at.map(|a| a.1),
                        field: Some("spec".into()),
                        message: refusal,
                    });
                }
                pods.push(name);
            }
        }
        Err(LoadError::Decode(e)) => {
            // The decoder knows the place of a syntax error; a wrong `kind` or `apiVersion`
            // only names its field.
            let at = match (e.line, &e.field) {
                (None, Some(field)) => place(field),
                _ => e.line.map(|l| (l, e.column.unwrap_or(0))),
            };
            diagnostics.push(Diagnostic {
                severity: Severity::Error,
                line: at.map(|a| a.0),
                column: at.map(|a| a.1).filter(|c| *c > 0),
                field: e.field.clone(),
                message: e.reason.clone(),
            })
        }
        Err(LoadError::Invalid { errors, .. }) => {
            // The loader stops at the first invalid pod; the decoder still knows which fields
            // it did not understand, and a misspelt field often explains the error.
            let origin = file.display().to_string();
            if let Ok(decoded) = crate::kubelet::source::manifest::decode(bytes, &origin, false) {
                for field in decoded.unknown_fields {
                    let at = place(&field);
                    diagnostics.push(Diagnostic {
                        severity: Severity::Warning,
                        line: at.map(|a| a.0),
                        column: at.map(|a| a.1),
                        field: Some(field),
                        message: "unknown field; it is ignored".into(),
                    });
                }
            }
            let repeated = |e: &crate::kubelet::source::validate::ValidationError| {
                !written(&e.field)
                    && errors
                        .iter()
                        .any(|other| other.reason == e.reason && written(&other.field))
            };
            for e in errors.iter().filter(|e| !repeated(e)) {
                let at = place(&e.field);
                diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    line: at.map(|a| a.0),
                    column: at.map(|a| a.1),
                    field: Some(e.field.clone()),
                    message: e.reason.clone(),
                });
            }
        }
    }
    // In file order, as an editor would walk them; findings without a place come last.
    diagnostics.sort_by_key(|d| (d.line.is_none(), d.line, d.column));
    FileReport {
        file: file.display().to_string(),
        ok: !diagnostics.iter().any(|d| d.severity == Severity::Error),
        pods,
        diagnostics,
    }
}

/// A file that could not be read at all.
pub(crate) fn unreadable(file: &Path, err: &std::io::Error) -> FileReport {
    FileReport {
        file: file.display().to_string(),
        ok: false,
        pods: Vec::new(),
        diagnostics: vec![Diagnostic {
            severity: Severity::Error,
            line: None,
            column: None,
            field: None,
            message: format!("cannot read the file: {err}"),
        }],
    }
}

/// Reports in the style compilers use, one line per finding
/// (`pod.yaml:12:5: error: spec.containers[0].image: required`), and one `ok` line per good file.
pub(crate) fn render_text(reports: &[FileReport]) -> String {
    let mut out = String::new();
    for r in reports {
        for d in &r.diagnostics {
            out.push_str(&r.file);
            if let Some(line) = d.line {
                out.push_str(&format!(":{line}"));
                if let Some(col) = d.column {
                    out.push_str(&format!(":{col}"));
                }
            }
            let severity = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            out.push_str(&format!(": {severity}: "));
            if let Some(field) = &d.field {
                out.push_str(&format!("{field}: "));
            }
            out.push_str(&d.message);
            out.push('\n');
        }
        if r.ok {
            out.push_str(&format!("{}: ok ({})\n", r.file, r.pods.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(text: &str) -> FileReport {
        check(
            Path::new("pod.yaml"),
            text.as_bytes(),
            "node-a",
            &NodeSecurity::default(),
        )
    }

    #[test]
    fn a_good_manifest_names_its_pod() {
        let r = report(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: busybox\n",
        );
        assert!(r.ok, "{r:?}");
        assert_eq!(r.pods, vec!["web-node-a"]);
        assert_eq!(render_text(&[r]), "pod.yaml: ok (web-node-a)\n");
    }

    #[test]
    fn findings_carry_file_line_and_column() {
        let rows = [
            (
                "validation error at the field",
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: busybox\n    imagePullPolicy: Sometimes\n",
                "pod.yaml:9:5: error: spec.containers[0].imagePullPolicy: ",
            ),
            (
                "a missing field points at its parent",
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n",
                "pod.yaml:7:5: error: spec.containers[0].image: ",
            ),
            (
                "a decode error has the parser's place",
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [web\n",
                "pod.yaml:",
            ),
            (
                "unknown fields are warnings",
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: busybox\n    imagePullPolcy: Always\n",
                "pod.yaml:9:5: warning: spec.containers[0].imagePullPolcy: unknown field",
            ),
            (
                "static pods may not use API objects",
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  serviceAccountName: builder\n  containers:\n  - name: app\n    image: busybox\n",
                "pod.yaml:5:1: error: spec: static pods may not reference",
            ),
        ];
        for (what, text, want) in rows {
            let r = report(text);
            let out = render_text(std::slice::from_ref(&r));
            assert!(out.contains(want), "{what}: {out}");
            let warning_only = what.starts_with("unknown");
            assert_eq!(r.ok, warning_only, "{what}: {out}");
        }
    }
}
