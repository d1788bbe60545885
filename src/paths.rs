//! Paths built from names that come from outside (pod UIDs, names, namespaces, runtime labels).
//!
//! The sources refuse a manifest whose UID is not one safe path component, but UIDs also come
//! back from the runtime's labels (orphans), and a mistake in one place must not let Deckhand
//! delete or write outside its own directories. So every directory that is joined from such a
//! name, and every tree that is removed, goes through these checks: a second line of defence.
//! (Upstream joins them unchecked.)

use std::path::{Component, Path, PathBuf};

/// A name cannot be used as one path component, or a path lies outside where it belongs.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{what} {value:?} is not a single safe path component")]
    NotOneComponent { what: &'static str, value: String },
    #[error("{path} is not inside {base}")]
    Outside { path: PathBuf, base: PathBuf },
    #[error("{path} is a symbolic link; it is not followed")]
    Symlink { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why `value` cannot be one path component, or `None` when it can: not empty, not `.` or
/// `..`, no `/`, no NUL.
pub fn component_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("it is empty")
    } else if value == "." || value == ".." {
        Some("it names the current or the parent directory")
    } else if value.contains('/') {
        Some("it contains '/'")
    } else if value.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        None
    }
}

/// `base/name`, when `name` is one safe component.
pub fn join_component(base: &Path, what: &'static str, name: &str) -> Result<PathBuf, PathError> {
    if component_problem(name).is_some() {
        return Err(PathError::NotOneComponent {
            what,
            value: name.to_string(),
        });
    }
    Ok(base.join(name))
}

/// True when `path`, taken lexically (no `..`, no `.`), lies strictly under `base`.
fn lexically_under(base: &Path, path: &Path) -> bool {
    let Ok(rest) = path.strip_prefix(base) else {
        return false;
    };
    let mut parts = rest.components().peekable();
    parts.peek().is_some() && parts.all(|c| matches!(c, Component::Normal(_)))
}

/// Removes the tree at `path`, if it exists, only when it lies under `base` both as written and
/// after resolving its parent's symbolic links, and is not itself a symbolic link. The walk
/// below it does not follow links (the standard library's `remove_dir_all` guarantees that).
pub fn remove_tree_within(base: &Path, path: &Path) -> Result<(), PathError> {
    if !lexically_under(base, path) {
        return Err(PathError::Outside {
            path: path.to_path_buf(),
            base: base.to_path_buf(),
        });
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(PathError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if meta.file_type().is_symlink() {
        return Err(PathError::Symlink {
            path: path.to_path_buf(),
        });
    }
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| PathError::Io { path: p, source }
    };
    let real_base = std::fs::canonicalize(base).map_err(io(base))?;
    let parent = path.parent().unwrap_or(path);
    let real_parent = std::fs::canonicalize(parent).map_err(io(parent))?;
    if !(real_parent == real_base || real_parent.starts_with(&real_base)) {
        return Err(PathError::Outside {
            path: path.to_path_buf(),
            base: base.to_path_buf(),
        });
    }
    let result = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PathError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        for bad in ["", ".", "..", "a/b", "x/../../tmp", "/abs", "a\0b"] {
            assert!(component_problem(bad).is_some(), "{bad:?} accepted");
        }
        for good in ["uid-1", "3f2a", "a.b", "..a", "a..", "_x_"] {
            assert_eq!(component_problem(good), None, "{good:?} refused");
        }
        let base = Path::new("/var/lib/deckhand/pods");
        assert!(join_component(base, "pod UID", "x/../../../../tmp/victim").is_err());
        assert_eq!(
            join_component(base, "pod UID", "u1").unwrap(),
            base.join("u1")
        );
    }

    #[test]
    fn removal_stays_inside_its_base() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("pods");
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(base.join("u1/sub")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("keep"), b"x").unwrap();

        // Lexical escapes are refused.
        let escape = base.join("..").join("victim");
        assert!(matches!(
            remove_tree_within(&base, &escape),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            remove_tree_within(&base, &base),
            Err(PathError::Outside { .. })
        ));
        // A symbolic link planted where a pod dir should be is not followed.
        std::os::unix::fs::symlink(&victim, base.join("u2")).unwrap();
        assert!(matches!(
            remove_tree_within(&base, &base.join("u2")),
            Err(PathError::Symlink { .. })
        ));
        // A link in a parent that leads outside is caught after resolving.
        std::os::unix::fs::symlink(dir.path(), base.join("up")).unwrap();
        assert!(matches!(
            remove_tree_within(&base, &base.join("up").join("victim")),
            Err(PathError::Outside { .. })
        ));
        assert!(victim.join("keep").exists());

        // The real thing goes; a missing one is fine.
        remove_tree_within(&base, &base.join("u1")).unwrap();
        assert!(!base.join("u1").exists());
        remove_tree_within(&base, &base.join("u1")).unwrap();
    }
}
