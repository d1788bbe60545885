//! hostPath volumes: the node's own path, checked (or created) according to `type`.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Checks `path` against the hostPath `type`, creating it for the `…OrCreate` types. The error
/// texts are upstream's.
pub fn check_type(path: &Path, kind: &str) -> Result<(), String> {
    let shown = path.display();
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
                    .map_err(|e| e.to_string());
            }
            if ft.is_some_and(|t| t.is_dir()) {
                Ok(())
            } else {
                Err(format!(
                    "hostPath type check failed: {shown} is not a directory"
                ))
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
                    Err(e) => Err(format!("open {shown}: {}", go_errno_text(&e))),
                };
            }
            if ft.is_some_and(|t| t.is_file()) {
                Ok(())
            } else {
                Err(format!("hostPath type check failed: {shown} is not a file"))
            }
        }
        "Socket" => is(
            ft,
            |t| t.is_socket(),
            || format!("hostPath type check failed: {shown} is not a socket file"),
        ),
        "CharDevice" => is(
            ft,
            |t| t.is_char_device(),
            || format!("hostPath type check failed: {shown} is not a character device"),
        ),
        "BlockDevice" => is(
            ft,
            |t| t.is_block_device(),
            || format!("hostPath type check failed: {shown} is not a block device"),
        ),
        other => Err(format!("{other} is an invalid volume type")),
    }
}

fn is(
    ft: Option<std::fs::FileType>,
    test: impl Fn(&std::fs::FileType) -> bool,
    err: impl Fn() -> String,
) -> Result<(), String> {
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
            assert_eq!(check_type(path, kind), Ok(()), "{kind} {}", path.display());
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
                check_type(path, kind),
                Err(format!(
                    "hostPath type check failed: {} {what}",
                    path.display()
                )),
                "{kind}"
            );
        }
        assert_eq!(
            check_type(&file, "Weird"),
            Err("Weird is an invalid volume type".to_string())
        );
    }

    #[test]
    fn or_create_types_create() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/c");
        assert_eq!(check_type(&dir, "DirectoryOrCreate"), Ok(()));
        assert!(dir.is_dir());
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o755 & !umask()
        );

        let file = tmp.path().join("new-file");
        assert_eq!(check_type(&file, "FileOrCreate"), Ok(()));
        assert!(file.is_file());
        // An existing directory is not a file.
        assert!(
            check_type(&dir, "FileOrCreate")
                .unwrap_err()
                .ends_with("is not a file")
        );
        // The parent is not created.
        let orphan = tmp.path().join("no-parent/file");
        let err = check_type(&orphan, "FileOrCreate").unwrap_err();
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
