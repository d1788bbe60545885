//! `subPath` / `subPathExpr`: a path inside a volume, checked so that it cannot leave the
//! volume, created as a directory when missing.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::runtime::translate::env::expand;

/// Expands `$(VAR)` in a `subPathExpr`; a reference to a variable the container does not have
/// (or has empty) is an error naming the missing ones.
pub fn expand_expr(expr: &str, env: &HashMap<String, String>) -> Result<String, String> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let expanded = expand(expr, |name| match env.get(name) {
        Some(v) if !v.is_empty() => Some(v.clone()),
        _ => {
            missing.borrow_mut().insert(name.to_string());
            Some(String::new())
        }
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(expanded)
    } else {
        Err(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

/// Rejects absolute subpaths and subpaths with a `..` element, with upstream's texts.
pub fn validate(sub: &str) -> Result<(), String> {
    if Path::new(sub).is_absolute() {
        return Err(format!(
            "error SubPath `{sub}` must not be an absolute path"
        ));
    }
    if sub.split('/').any(|part| part == "..") {
        return Err(format!(
            "unable to provision SubPath `{sub}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// The host path of `sub` inside the volume at `volume`, created as a directory (with the
/// volume's mode) when missing. The result is fully resolved and inside the volume: a symlink
/// that leads out of it is refused.
pub fn resolve(volume: &Path, sub: &str, mount: &str, container: &str) -> Result<PathBuf, String> {
    validate(sub)?;
    let base = volume.canonicalize().map_err(|_| {
        format!("failed to prepare subPath for volumeMount {mount:?} of container {container:?}")
    })?;
    let target = base.join(sub);
    if std::fs::symlink_metadata(&target).is_err() {
        let mode = std::fs::metadata(&base)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        if let Err(err) = safe_make_dir(&base, sub, mode) {
            tracing::warn!(%mount, %container, error = %err, "cannot create the subPath directory");
            return Err(format!(
                "failed to create subPath directory for volumeMount {mount:?} of container {container:?}"
            ));
        }
    }
    match target.canonicalize() {
        Ok(real) if real.starts_with(&base) => Ok(real),
        other => {
            tracing::warn!(%mount, %container, resolved = ?other, "subPath leaves its volume");
            Err(format!(
                "failed to prepare subPath for volumeMount {mount:?} of container {container:?}"
            ))
        }
    }
}

/// Creates the directories of `sub` below `base` one at a time, never following a symlink out
/// of `base`.
fn safe_make_dir(base: &Path, sub: &str, mode: u32) -> Result<(), String> {
    let mut current = base.to_path_buf();
    for part in Path::new(sub).components() {
        let Component::Normal(part) = part else {
            continue;
        };
        let next = current.join(part);
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.is_dir() => current = next,
            Ok(meta) if meta.file_type().is_symlink() => {
                let real = next
                    .canonicalize()
                    .map_err(|e| format!("{}: {e}", next.display()))?;
                if !real.starts_with(base) || !real.is_dir() {
                    return Err(format!(
                        "{} leads out of the volume or is not a directory",
                        next.display()
                    ));
                }
                current = real;
            }
            Ok(_) => return Err(format!("{} is not a directory", next.display())),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(mode).create(&next) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("{}: {e}", next.display())),
                }
                std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| format!("{}: {e}", next.display()))?;
                current = next;
            }
            Err(e) => return Err(format!("{}: {e}", next.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_table() {
        let cases: &[(&str, Result<(), &str>)] = &[
            ("data", Ok(())),
            ("a/b/c", Ok(())),
            ("a/..b/c..", Ok(())),
            ("./a", Ok(())),
            (
                "/etc",
                Err("error SubPath `/etc` must not be an absolute path"),
            ),
            (
                "..",
                Err("unable to provision SubPath `..`: must not contain '..'"),
            ),
            (
                "a/../../etc",
                Err("unable to provision SubPath `a/../../etc`: must not contain '..'"),
            ),
            (
                "a/..",
                Err("unable to provision SubPath `a/..`: must not contain '..'"),
            ),
        ];
        for (sub, want) in cases {
            assert_eq!(validate(sub), want.map_err(str::to_string), "{sub}");
        }
    }

    #[test]
    fn expansion() {
        let env = HashMap::from([
            ("POD".to_string(), "web-1".to_string()),
            ("EMPTY".to_string(), String::new()),
        ]);
        assert_eq!(expand_expr("logs/$(POD)", &env), Ok("logs/web-1".into()));
        assert_eq!(expand_expr("$$(POD)", &env), Ok("$(POD)".into()));
        assert_eq!(
            expand_expr("$(NOPE)/$(EMPTY)/$(POD)", &env),
            Err("missing value for EMPTY, NOPE".into())
        );
    }

    #[test]
    fn resolves_inside_and_creates_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(vol.join("file"), b"x").unwrap();

        let got = resolve(&vol, "a/b", "m", "c").unwrap();
        assert_eq!(got, vol.canonicalize().unwrap().join("a/b"));
        assert!(got.is_dir());
        assert_eq!(
            std::fs::metadata(&got).unwrap().permissions().mode() & 0o777,
            0o777
        );
        assert_eq!(
            resolve(&vol, "file", "m", "c").unwrap(),
            vol.canonicalize().unwrap().join("file")
        );

        // A symlink inside the volume pointing inside is fine; pointing out is refused.
        std::os::unix::fs::symlink("a", vol.join("inner")).unwrap();
        assert_eq!(resolve(&vol, "inner/b", "m", "c").unwrap(), got);
        std::os::unix::fs::symlink("/etc", vol.join("escape")).unwrap();
        assert_eq!(
            resolve(&vol, "escape", "m", "c"),
            Err("failed to prepare subPath for volumeMount \"m\" of container \"c\"".into())
        );
        assert_eq!(
            resolve(&vol, "escape/newdir", "m", "c"),
            Err(
                "failed to create subPath directory for volumeMount \"m\" of container \"c\""
                    .into()
            )
        );
        assert!(!Path::new("/etc/newdir").exists());
        assert!(
            resolve(&vol, "/abs", "m", "c")
                .unwrap_err()
                .contains("must not be an absolute path")
        );
    }
}
