//! The path of one file in a configMap, secret, downwardAPI or projected volume (`items[].path`,
//! a token's `path`): where the atomic writer puts it, relative to the volume.
//!
//! The writer keeps its own entries in the volume under names that start with `..` (`..data`,
//! `..data_tmp`, the `..<timestamp>` version directories). A path may therefore not leave the
//! volume (absolute, a `..` element) nor start with `..` — and that must hold of the path as
//! the writer uses it, cleaned: the API server accepts `./..data/x`, which cleans to
//! `..data/x` and, written, would replace the writer's `..data` link with a loop. Upstream's
//! writer checks the raw path only; Deckhand checks both, in the writer and when a pod is
//! validated (static pods, pods from the API server, `deckhand validate`), so a pod that would
//! fail at mount time is refused up front with the volume and item named.

/// Longest path accepted (upstream's writer: 4096).
pub(crate) const MAX_PATH_LEN: usize = 4096;
/// Longest element of a path (upstream's writer: 255, NAME_MAX).
pub(crate) const MAX_NAME_LEN: usize = 255;

/// An item path that may not be written; the texts follow upstream's writer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidPath {
    #[error("invalid path: must not be empty")]
    Empty,
    #[error("invalid path: must be less than or equal to {MAX_PATH_LEN} characters")]
    TooLong,
    #[error("invalid path: must be relative path: {0}")]
    Absolute(String),
    #[error("invalid path: must not contain path items longer than {MAX_NAME_LEN} characters")]
    ItemTooLong,
    #[error("invalid path: must not contain '..': {0}")]
    DotDot(String),
    #[error("invalid path: must not start with '..': {0}")]
    LeadingDots(String),
    /// Only the cleaned path starts with `..` (`./..data/x`).
    #[error(
        "invalid path: must not start with '..' once cleaned ({cleaned}): {path}; names \
         starting with '..' belong to the volume's writer"
    )]
    CleanedLeadingDots { path: String, cleaned: String },
    #[error("invalid path: names no file: {0}")]
    NoName(String),
}

/// Go's `filepath.Clean` for a relative path without `..` elements: empty and `.` elements
/// dropped, one `/` between the rest. Empty when nothing is left.
fn clean(path: &str) -> String {
    path.split('/')
        .filter(|e| !e.is_empty() && *e != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// Checks an item path as upstream's atomic writer does (not empty, relative, no `..`
/// element, not starting with `..`, within the length limits), and then the same of the
/// cleaned path; returns the cleaned path, the one to write.
pub(crate) fn check_item_path(path: &str) -> Result<String, InvalidPath> {
    if path.is_empty() {
        return Err(InvalidPath::Empty);
    }
    if path.starts_with('/') {
        return Err(InvalidPath::Absolute(path.to_string()));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(InvalidPath::TooLong);
    }
    for item in path.split('/') {
        if item == ".." {
            return Err(InvalidPath::DotDot(path.to_string()));
        }
        if item.len() > MAX_NAME_LEN {
            return Err(InvalidPath::ItemTooLong);
        }
    }
    if path.starts_with("..") {
        return Err(InvalidPath::LeadingDots(path.to_string()));
    }
    let cleaned = clean(path);
    if cleaned.is_empty() {
        return Err(InvalidPath::NoName(path.to_string()));
    }
    if cleaned.starts_with("..") {
        return Err(InvalidPath::CleanedLeadingDots {
            path: path.to_string(),
            cleaned,
        });
    }
    Ok(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_path_table() {
        let long_name = "a".repeat(256);
        let long_path = format!("{}/b", ["a"; 2048].join("/"));
        let rows: Vec<(&str, &str, Result<&str, InvalidPath>)> = vec![
            ("a plain name", "labels", Ok("labels")),
            ("a nested path", "etc/app/app.conf", Ok("etc/app/app.conf")),
            ("a dot inside a name", "a/b.c/d", Ok("a/b.c/d")),
            ("dots are cleaned away", "./x/./y", Ok("x/y")),
            ("double and trailing slashes", "x//y/", Ok("x/y")),
            (
                "a name with dots that is not ..",
                "...x",
                Err(InvalidPath::LeadingDots("...x".into())),
            ),
            ("a hidden name is fine", ".hidden", Ok(".hidden")),
            ("a name ending in ..", "x..", Ok("x..")),
            ("empty", "", Err(InvalidPath::Empty)),
            (
                "absolute",
                "/etc/passwd",
                Err(InvalidPath::Absolute("/etc/passwd".into())),
            ),
            (
                "a .. element",
                "a/../../x",
                Err(InvalidPath::DotDot("a/../../x".into())),
            ),
            (
                "a leading .. element",
                "../x",
                Err(InvalidPath::DotDot("../x".into())),
            ),
            (
                "a trailing .. element",
                "a/..",
                Err(InvalidPath::DotDot("a/..".into())),
            ),
            (
                "the writer's own link",
                "..data",
                Err(InvalidPath::LeadingDots("..data".into())),
            ),
            (
                "a leading ..name",
                "..hidden/x",
                Err(InvalidPath::LeadingDots("..hidden/x".into())),
            ),
            (
                "..data once cleaned (the issue's path)",
                "./..data/x",
                Err(InvalidPath::CleanedLeadingDots {
                    path: "./..data/x".into(),
                    cleaned: "..data/x".into(),
                }),
            ),
            (
                "..data_tmp behind slashes",
                ".//..data_tmp",
                Err(InvalidPath::CleanedLeadingDots {
                    path: ".//..data_tmp".into(),
                    cleaned: "..data_tmp".into(),
                }),
            ),
            ("a later ..name is fine", "x/..data", Ok("x/..data")),
            ("only dots", "./.", Err(InvalidPath::NoName("./.".into()))),
            (
                "a name of 256 characters",
                &long_name,
                Err(InvalidPath::ItemTooLong),
            ),
            ("longer than 4096", &long_path, Err(InvalidPath::TooLong)),
        ];
        for (what, path, want) in rows {
            let got = check_item_path(path);
            assert_eq!(got, want.map(str::to_string), "{what}: {path:?}");
        }
    }

    #[test]
    fn the_message_says_what_the_path_reads_as() {
        let err = check_item_path("./..data/x").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid path: must not start with '..' once cleaned (..data/x): ./..data/x; names \
             starting with '..' belong to the volume's writer"
        );
    }
}
