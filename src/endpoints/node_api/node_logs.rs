//! `/logs/`: the node's own log files under `/var/log`, as upstream's kubelet serves them
//! (a file server: a directory gives a listing, a file its contents); `nodes/log` in the
//! authorizer's terms. A path that leaves the log directory, by `..` or through a link, is
//! not found.

use std::path::{Component, Path, PathBuf};

/// Where upstream serves node logs from.
pub const NODE_LOG_DIR: &str = "/var/log";

/// What a `/logs/<rel>` request names.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Dir(PathBuf),
    File(PathBuf),
    NotFound,
}

/// Resolves `rel` (the part after `/logs/`) under `root`, following links only while they
/// stay inside `root`.
pub fn resolve(root: &Path, rel: &str) -> Target {
    let Some(rel) = relative_path(rel) else {
        return Target::NotFound;
    };
    let (Ok(root), Ok(path)) = (root.canonicalize(), root.join(rel).canonicalize()) else {
        return Target::NotFound;
    };
    if !path.starts_with(&root) {
        return Target::NotFound;
    }
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Target::Dir(path),
        Ok(m) if m.is_file() => Target::File(path),
        _ => Target::NotFound,
    }
}

/// The path a `/logs/<rel>` request names below the log directory, before any link is
/// followed: `None` when a part of it is `..` (or it has a NUL byte, which no file name has).
pub fn relative_path(rel: &str) -> Option<&Path> {
    let rel = Path::new(rel.trim_start_matches('/'));
    let below = rel
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    (below && !rel.as_os_str().as_encoded_bytes().contains(&0)).then_some(rel)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn href(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A directory listing in the shape of Go's file server: `<pre>` with one link per entry,
/// sorted by name, directories with a trailing slash.
pub fn listing(dir: &Path) -> std::io::Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| {
            let mut name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() {
                name.push('/');
            }
            name
        })
        .collect();
    names.sort();
    let mut out = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in names {
        let (base, slash) = match name.strip_suffix('/') {
            Some(b) => (b, "/"),
            None => (name.as_str(), ""),
        };
        out.push_str(&format!(
            "<a href=\"{}{slash}\">{}{slash}</a>\n",
            href(base),
            escape(base)
        ));
    }
    out.push_str("</pre>\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_log_dir() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("pods/ns_p_u/c")).unwrap();
        std::fs::write(r.join("pods/ns_p_u/c/0.log"), "log").unwrap();
        std::fs::write(r.join("syslog"), "sys").unwrap();
        std::fs::create_dir_all(r.join("containers")).unwrap();
        std::os::unix::fs::symlink(r.join("pods/ns_p_u/c/0.log"), r.join("containers/p.log"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), r.join("escape")).unwrap();
        let canon = |p: &str| r.join(p).canonicalize().unwrap();
        let cases = [
            ("", Target::Dir(canon("."))),
            ("/", Target::Dir(canon("."))),
            ("syslog", Target::File(canon("syslog"))),
            ("pods/", Target::Dir(canon("pods"))),
            (
                "containers/p.log",
                Target::File(canon("pods/ns_p_u/c/0.log")),
            ),
            ("escape", Target::NotFound),
            ("../secret", Target::NotFound),
            ("pods/../../secret", Target::NotFound),
            ("missing", Target::NotFound),
        ];
        for (rel, want) in cases {
            assert_eq!(resolve(r, rel), want, "{rel:?}");
        }
    }

    #[test]
    fn relative_paths() {
        let cases = [
            ("", Some("")),
            ("//a/./b", Some("a/./b")),
            ("a/../b", None),
            ("..", None),
            ("a\0b", None),
        ];
        for (rel, want) in cases {
            assert_eq!(relative_path(rel), want.map(Path::new), "{rel:?}");
        }
    }

    #[test]
    fn listing_like_gos_file_server() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("pods")).unwrap();
        std::fs::write(root.path().join("a<b>.log"), "").unwrap();
        let text = listing(root.path()).unwrap();
        assert!(
            text.contains("<pre>\n<a href=\"a%3Cb%3E.log\">a&lt;b&gt;.log</a>\n<a href=\"pods/\">pods/</a>\n</pre>\n"),
            "{text}"
        );
    }
}
