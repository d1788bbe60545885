//! `$(VAR)` expansion in commands, arguments, env values and `subPathExpr`, by Kubernetes'
//! rules.

use std::collections::HashMap;

/// Expands `$(NAME)` references in `input` with `lookup`.
///
/// Rules, as in Kubernetes: `$$` stands for a literal `$`; a reference whose name `lookup` does
/// not know stays as written; a `$` followed by anything else, or a `$(` with no closing `)`,
/// is copied unchanged.
pub(crate) fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            // Escaped dollar.
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    // Unterminated reference: keep the text as is.
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            // A lone `$` (possibly the last character).
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Expands every string of a command or argument list against the resolved environment.
pub(crate) fn expand_all(items: &[String], env: &HashMap<String, String>) -> Vec<String> {
    items
        .iter()
        .map(|s| expand(s, |name| env.get(name).cloned()))
        .collect()
}
