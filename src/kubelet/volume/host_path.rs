//! hostPath volumes: the node's own path, checked (or created) according to `type`.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a hostPath does not pass its `type` check; the texts are upstream's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostPathError {
    /// Something is at the path, or nothing, but not what the type asks for.
    #[error("hostPath type check failed: {} is not {what}", path.display())]
    WrongType { path: PathBuf, what: &'static str },
    #[error(transparent)]
    CreateDir(std::io::Error),
    #[error("open {}: {}", path.display(), go_errno_text(source))]
    CreateFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is an invalid volume type")]
    InvalidType(String),
}

/// Checks `path` against the hostPath `type`, creating it for the `…OrCreate` types. The error
/// texts are upstream's.
pub(crate) fn check_type(path: &Path, kind: &str) -> Result<(), HostPathError> {
    let wrong = |what: &'static str| HostPathError::WrongType {
        path: path.to_path_buf(),
        what,
    };
    // `stat`, following symlinks, as upstream does.
    let meta = std::fs::metadata(path).ok();
    let ft = meta.as_ref().map(|m| m.file_type());
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" | "Directory" => {
            if kind == "DirectoryOrCreate" && !exists(path) {
                return std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(HostPathError::CreateDir);
            }
            if ft.is_some_and(|t| t.is_dir()) {
                Ok(())
            } else {
                Err(wrong("a directory"))
            }
        }
        "FileOrCreate" | "File" => {
            if kind == "FileOrCreate" && !exists(path) {
                // Only the file is created: a missing parent directory is an error.
                return match std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(path)
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
                    Err(source) => Err(HostPathError::CreateFile {
                        path: path.to_path_buf(),
                        source,
                    }),
                };
            }
            if ft.is_some_and(|t| t.is_file()) {
                Ok(())
            } else {
                Err(wrong("a file"))
            }
        }
        "Socket" => is(ft, |t| t.is_socket(), || wrong("a socket file")),
        "CharDevice" => is(ft, |t| t.is_char_device(), || wrong("a character device")),
        "BlockDevice" => is(ft, |t| t.is_block_device(), || wrong("a block device")),
        other => Err(HostPathError::InvalidType(other.to_string())),
    }
}

fn is(
    ft: Option<std::fs::FileType>,
    test: impl Fn(&std::fs::FileType) -> bool,
    err: impl Fn() -> HostPathError,
) -> Result<(), HostPathError> {
    if ft.as_ref().is_some_and(test) {
        Ok(())
    } else {
        Err(err())
    }
}

/// Whether anything is at `path` (a dangling symlink counts, as `lstat` sees it).
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// The lower-case errno text Go prints (`no such file or directory`), not Rust's wording.
fn go_errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_lowercase(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn type_checks() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let sock = tmp.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let missing = tmp.path().join("missing");
        let null = Path::new("/dev/null");

        let ok: &[(&Path, &str)] = &[
            (&missing, ""),
            (&dir, "Directory"),
            (&dir, "DirectoryOrCreate"),
            (&file, "File"),
            (&file, "FileOrCreate"),
            (&sock, "Socket"),
            (null, "CharDevice"),
        ];
        for (path, kind) in ok {
            assert!(check_type(path, kind).is_ok(), "{kind} {}", path.display());
        }
        let failing: &[(&Path, &str, &str)] = &[
            (&file, "Directory", "is not a directory"),
            (&missing, "Directory", "is not a directory"),
            (&dir, "File", "is not a file"),
            (&missing, "File", "is not a file"),
            (&file, "Socket", "is not a socket file"),
            (&file, "CharDevice", "is not a character device"),
            (null, "BlockDevice", "is not a block device"),
        ];
        for (path, kind, what) in failing {
            assert_eq!(
                check_type(path, kind).map_err(|e| e.to_string()),
                Err(format!(
                    "hostPath type check failed: {} {what}",
                    path.display()
                )),
                "{kind}"
            );
        }
        assert_eq!(
            check_type(&file, "Weird").map_err(|e| e.to_string()),
            Err("Weird is an invalid volume type".to_string())
        );
    }

    #[test]
    fn or_create_types_create() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/c");
        assert!(check_type(&dir, "DirectoryOrCreate").is_ok());
        assert!(dir.is_dir());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o755 & !umask()
        );

        let file = tmp.path().join("new-file");
        assert!(check_type(&file, "FileOrCreate").is_ok());
        assert!(file.is_file());
        // An existing directory is not a file.
        assert!(
            check_type(&dir, "FileOrCreate")
                .unwrap_err()
                .to_string()
                .ends_with("is not a file")
        );
        // The parent is not created.
        let orphan = tmp.path().join("no-parent/file");
        let err = check_type(&orphan, "FileOrCreate").unwrap_err().to_string();
        assert_eq!(
            err,
            format!("open {}: no such file or directory", orphan.display())
        );
    }

    /// The process umask, read without changing it (tests run in parallel).
    fn umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }
}
