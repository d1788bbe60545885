//! The pod's node selector and required node affinity against the node's labels and name, as
//! upstream's `RequiredNodeAffinity.Match` decides it, and NoExecute taints against the pod's
//! tolerations, as `Toleration.ToleratesTaint` decides it.
//!
//! Node affinity: every `nodeSelector` pair must be a label of the node; of the required
//! terms, one must match (terms with no expression and no field are left out, and when none
//! is left nothing matches); in a term every expression and every field requirement must
//! hold. A term with a requirement upstream cannot parse (an unknown operator, `In` without
//! values, `Gt` with a value that is not an integer, a field operator other than `In` or
//! `NotIn`, a field requirement without exactly one value) does not match.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

use crate::base::podspec::labels::{check_label_key, check_label_value};

/// The only node field a term may select on.
const NODE_NAME_FIELD: &str = "metadata.name";

/// True when the pod's `nodeSelector` and required node affinity allow this node.
pub fn node_affinity_matches(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !selector_ok {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let Some(required) = required else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .filter(|t| !is_empty_term(t))
        .any(|t| term_matches(t, labels, node_name))
}

/// True when one of the selector's terms matches the node (upstream's
/// `MatchNodeSelectorTerms`, as a persistent volume's node affinity is checked).
pub fn node_selector_matches(
    selector: &k8s_openapi::api::core::v1::NodeSelector,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    selector
        .node_selector_terms
        .iter()
        .filter(|t| !is_empty_term(t))
        .any(|t| term_matches(t, labels, node_name))
}

fn is_empty_term(t: &NodeSelectorTerm) -> bool {
    t.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && t.match_fields.as_ref().is_none_or(Vec::is_empty)
}

fn term_matches(t: &NodeSelectorTerm, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
    let expressions = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    // Upstream parses the whole term first: a bad requirement anywhere spoils it.
    let parsed: Option<Vec<bool>> = expressions
        .iter()
        .map(|r| label_requirement(r, labels))
        .chain(fields.iter().map(|r| field_requirement(r, node_name)))
        .collect();
    parsed.is_some_and(|results| results.iter().all(|ok| *ok))
}

/// Whether the labels meet one expression; `None` when upstream would not parse it.
fn label_requirement(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    check_label_key(&r.key).ok()?;
    let values = r.values.as_deref().unwrap_or_default();
    if values.iter().any(|v| check_label_value(v).is_err()) {
        return None;
    }
    let have = labels.get(&r.key);
    match r.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                return None;
            }
            let listed = have.is_some_and(|v| values.contains(v));
            Some(if r.operator == "In" { listed } else { !listed })
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                return None;
            }
            Some((r.operator == "Exists") == have.is_some())
        }
        "Gt" | "Lt" => {
            let [bound] = values else {
                return None;
            };
            let bound: i64 = bound.parse().ok()?;
            let Some(have) = have.and_then(|v| v.parse::<i64>().ok()) else {
                return Some(false);
            };
            Some(if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            })
        }
        _ => None,
    }
}

/// Whether the node's fields meet one field requirement; `None` when upstream would not parse
/// it. The node has one field, its name; any other field reads as empty.
fn field_requirement(r: &NodeSelectorRequirement, node_name: &str) -> Option<bool> {
    let [value] = r.values.as_deref().unwrap_or_default() else {
        return None;
    };
    let have = if r.key == NODE_NAME_FIELD {
        node_name
    } else {
        ""
    };
    match r.operator.as_str() {
        "In" => Some(have == value),
        "NotIn" => Some(have != value),
        _ => None,
    }
}

/// Whether `toleration` tolerates `taint`: the effect and key match when set, and the value
/// is equal (operator `Equal` or unset) or anything (`Exists`). `Lt`/`Gt` never match: they
/// belong to an alpha feature upstream leaves off.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// The first NoExecute taint none of the tolerations tolerates (the node agent looks at
/// NoExecute taints only; NoSchedule ones are the scheduler's).
pub fn untolerated_no_execute<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}
