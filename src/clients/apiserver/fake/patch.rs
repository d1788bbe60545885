//! Patches as the fake applies them.
//!
//! A JSON merge patch (RFC 7386, `application/merge-patch+json`) is applied as written.
//! **A strategic merge patch (`application/strategic-merge-patch+json`) is treated as a
//! merge patch**, and so is a server-side apply patch: lists are replaced whole, not merged
//! by their merge key, and the directives are dropped (`$patch` elements of lists, keys
//! starting with `$` such as `$setElementOrder/conditions` and `$retainKeys`). A patch that
//! sends a whole list (the node's status patch does) gives upstream's result; one that relies
//! on merging list elements by key (the pod status writer's) does not, and its tests should
//! assert on the request (the fake's log) rather than on the stored object.

use serde_json::Value;

/// The patch types the API server takes, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Strategic,
    Apply,
    Json,
}

impl PatchType {
    pub(crate) fn from_content_type(content_type: &str) -> Option<PatchType> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        match essence {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            "application/json-patch+json" => Some(PatchType::Json),
            _ => None,
        }
    }
}

/// Applies a merge patch to `target`: objects merge key by key, `null` removes a key,
/// anything else replaces. Strategic-merge directives in `patch` are dropped first.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let patch = without_directives(patch);
    merge_value(target, &patch);
}

fn merge_value(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let object = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            object.remove(key);
        } else {
            merge_value(object.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// `patch` without strategic-merge directives: keys starting with `$` and list elements
/// that carry a `$patch`.
fn without_directives(patch: &Value) -> Value {
    match patch {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), without_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|item| item.get("$patch").is_none())
                .map(without_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patches_merge_objects_replace_lists_and_drop_directives() {
        let rows = [
            (
                "keys merge, null removes",
                json!({"a": {"b": 1, "c": 2}, "d": 3}),
                json!({"a": {"b": 9, "c": null}}),
                json!({"a": {"b": 9}, "d": 3}),
            ),
            (
                "lists are replaced whole",
                json!({"l": [1, 2, 3]}),
                json!({"l": [4]}),
                json!({"l": [4]}),
            ),
            (
                "a strategic $patch element and $ keys are dropped",
                json!({"status": {"addresses": [{"type": "A"}], "phase": "x"}}),
                json!({"status": {"addresses": [{"type": "B"}, {"$patch": "replace"}],
                                  "$setElementOrder/addresses": [{"type": "B"}]}}),
                json!({"status": {"addresses": [{"type": "B"}], "phase": "x"}}),
            ),
        ];
        for (name, mut target, patch, want) in rows {
            merge(&mut target, &patch);
            assert_eq!(target, want, "{name}");
        }
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json"),
            Some(PatchType::Strategic)
        );
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }
}
