//! Label and field selectors as the API server reads them from `labelSelector` and
//! `fieldSelector`, evaluated on JSON objects.
//!
//! Labels: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined by commas.
//! Fields: `path=v`, `path==v`, `path!=v` on any dotted path (`metadata.name`,
//! `spec.nodeName`, `status.phase`); a missing field reads as the empty string, as upstream's
//! field sets have it (`spec.nodeName=` selects unscheduled pods). Upstream accepts only a few
//! paths per resource; the fake accepts any, so a request the API server would refuse (400)
//! is answered here: the end-to-end tests catch those.

use serde_json::Value;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector: every requirement must hold. The empty selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

/// A selector the fake cannot read (upstream answers 400 BadRequest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0:?}")]
pub(crate) struct BadSelector(pub String);

impl Selector {
    /// From the `labelSelector` and `fieldSelector` query parameters.
    pub(crate) fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, BadSelector> {
        Ok(Selector {
            labels: split_terms(labels.unwrap_or(""))
                .iter()
                .map(|t| label_term(t))
                .collect::<Result<_, _>>()?,
            fields: split_terms(fields.unwrap_or(""))
                .iter()
                .map(|t| field_term(t))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `object` is selected.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_string);
        let field = |path: &str| Some(field_value(object, path));
        self.labels.iter().all(|r| holds(r, &label)) && self.fields.iter().all(|r| holds(r, &field))
    }
}

fn holds(r: &Requirement, value: &dyn Fn(&str) -> Option<String>) -> bool {
    match r {
        Requirement::Equals(k, v) => value(k).as_deref() == Some(v),
        Requirement::NotEquals(k, v) => value(k).as_deref() != Some(v),
        Requirement::In(k, vs) => value(k).is_some_and(|x| vs.contains(&x)),
        Requirement::NotIn(k, vs) => !value(k).is_some_and(|x| vs.contains(&x)),
        Requirement::Exists(k) => value(k).is_some(),
        Requirement::NotExists(k) => value(k).is_none(),
    }
}

/// A field of `object` by dotted path, as a string ("" when missing).
fn field_value(object: &Value, path: &str) -> String {
    let mut v = object;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The terms of a selector: split at commas outside parentheses, blanks dropped.
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    terms.push(current);
    terms
        .into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn label_term(term: &str) -> Result<Requirement, BadSelector> {
    let bad = || BadSelector(term.to_string());
    for (word, set) in [(" notin ", false), (" in ", true)] {
        if let Some((key, values)) = term.split_once(word) {
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(bad)?;
            let values = values.split(',').map(|v| v.trim().to_string()).collect();
            let key = key.trim().to_string();
            return Ok(if set {
                Requirement::In(key, values)
            } else {
                Requirement::NotIn(key, values)
            });
        }
    }
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(key.trim().to_string()));
    }
    match equality(term) {
        Some(r) => Ok(r),
        None if term
            .chars()
            .all(|c| c.is_alphanumeric() || "-_./".contains(c)) =>
        {
            Ok(Requirement::Exists(term.to_string()))
        }
        None => Err(bad()),
    }
}

fn field_term(term: &str) -> Result<Requirement, BadSelector> {
    equality(term).ok_or_else(|| BadSelector(term.to_string()))
}

/// `k!=v`, `k==v` or `k=v`.
fn equality(term: &str) -> Option<Requirement> {
    let pair = |(k, v): (&str, &str)| (k.trim().to_string(), v.trim().to_string());
    if let Some((k, v)) = term.split_once("!=").map(pair) {
        return Some(Requirement::NotEquals(k, v));
    }
    if let Some((k, v)) = term.split_once("==").map(pair) {
        return Some(Requirement::Equals(k, v));
    }
    let (k, v) = term.split_once('=').map(pair)?;
    Some(Requirement::Equals(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_select_as_upstreams_do() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "ns", "labels": {"app": "web", "tier": "front"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"},
        });
        let unscheduled = json!({"metadata": {"name": "queued"}, "spec": {}});
        let rows: &[(Option<&str>, Option<&str>, bool, bool)] = &[
            (None, None, true, true),
            (Some("app=web"), None, true, false),
            (Some("app==web,tier=front"), None, true, false),
            (Some("app!=web"), None, false, true),
            (Some("app"), None, true, false),
            (Some("!app"), None, false, true),
            (Some("tier in (back, front)"), None, true, false),
            (Some("tier notin (front)"), None, false, true),
            (None, Some("metadata.name=web"), true, false),
            (None, Some("spec.nodeName=n1"), true, false),
            (None, Some("spec.nodeName="), false, true),
            (
                None,
                Some("spec.nodeName!=n1,metadata.name=queued"),
                false,
                true,
            ),
            (Some("app=web"), Some("status.phase==Running"), true, false),
        ];
        for (labels, fields, want_pod, want_unscheduled) in rows {
            let s = Selector::parse(*labels, *fields).unwrap();
            assert_eq!(s.matches(&pod), *want_pod, "{labels:?} {fields:?} on web");
            assert_eq!(
                s.matches(&unscheduled),
                *want_unscheduled,
                "{labels:?} {fields:?} on queued"
            );
        }
        assert!(Selector::parse(Some("a in b"), None).is_err());
        assert!(Selector::parse(None, Some("spec.nodeName")).is_err());
    }
}
