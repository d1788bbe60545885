//! Label keys and values as the API server validates them (qualified names, 63-character
//! values), so a bad `--node-labels` or taint is refused at start with the reason.

const NAME_MAX: usize = 63;
const PREFIX_MAX: usize = 253;

/// Why a label key or value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LabelError {
    #[error("{what} must be no more than {NAME_MAX} characters")]
    TooLong { what: &'static str },
    #[error(
        "{what} {name:?} must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit"
    )]
    BadName { what: &'static str, name: String },
    #[error("prefix {prefix:?} must be a DNS subdomain")]
    BadPrefix { prefix: String },
    #[error("name part must not be empty")]
    EmptyName,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters; `what` names the part.
fn check_name(name: &str, what: &'static str) -> Result<(), LabelError> {
    if name.len() > NAME_MAX {
        return Err(LabelError::TooLong { what });
    }
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !name.chars().all(is_name_char)
        || !ends_ok(name.chars().next())
        || !ends_ok(name.chars().last())
    {
        return Err(LabelError::BadName {
            what,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
pub(crate) fn check_label_key(key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        };
        if prefix.len() > PREFIX_MAX || !prefix.split('.').all(part_ok) {
            return Err(LabelError::BadPrefix {
                prefix: prefix.to_string(),
            });
        }
    }
    if name.is_empty() {
        return Err(LabelError::EmptyName);
    }
    check_name(name, "name part")
}

/// A label value: empty, or a name of at most 63 characters.
pub(crate) fn check_label_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value, "value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        for ok in [
            "a",
            "tier",
            "node.kubernetes.io/pool",
            "example.com/x_y.z",
            "A-1",
        ] {
            assert!(check_label_key(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "/x",
            "Example.com/x",
            "x/",
            "-a",
            "a/b/c",
            &"x".repeat(64),
        ] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        for ok in ["", "v1", "a.b-c_d"] {
            assert!(check_label_value(ok).is_ok(), "{ok}");
        }
        for bad in ["a b", "-v", "v.", &"v".repeat(64)] {
            assert!(check_label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_name_the_part_at_fault() {
        let text = |r: Result<(), LabelError>| r.unwrap_err().to_string();
        assert_eq!(
            text(check_label_key("Example.com/x")),
            "prefix \"Example.com\" must be a DNS subdomain"
        );
        assert_eq!(text(check_label_key("x/")), "name part must not be empty");
        assert_eq!(
            text(check_label_key(&"x".repeat(64))),
            "name part must be no more than 63 characters"
        );
        assert_eq!(
            text(check_label_value("-v")),
            "value \"-v\" must consist of letters, digits, '-', '_' or '.', and start and end with a letter or digit"
        );
    }
}
