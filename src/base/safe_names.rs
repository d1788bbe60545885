//! Names that come from outside (pod UIDs, names, namespaces, runtime labels) and become path
//! components.
//!
//! The sources refuse a manifest whose UID is not one safe path component, but UIDs also come
//! back from the runtime's labels (orphans), and a mistake in one place must not let Deckhand
//! build a path that leaves its own directories: workers, cgroup paths, volume directories and
//! teardown all check here first, a second line of defence. (Upstream joins them unchecked.)
//! Removing a tree safely is `volume::remove_checked`'s job, which teardown uses too.

/// The longest name a Linux file system takes for one component.
const NAME_MAX: usize = 255;

/// Why `value` cannot be one path component, or `None` when it can: not empty, not `.` or
/// `..`, no `/`, no NUL, at most 255 bytes.
pub(crate) fn component_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("it is empty")
    } else if value == "." || value == ".." {
        Some("it names the current or the parent directory")
    } else if value.contains('/') {
        Some("it contains '/'")
    } else if value.contains('\0') {
        Some("it contains a NUL byte")
    } else if value.len() > NAME_MAX {
        Some("it is longer than 255 bytes")
    } else {
        None
    }
}

/// `<pod_logs_dir>/<namespace>_<name>_<uid>`: where the pod's container logs live (upstream's
/// layout, which log shippers expect). The runtime manager makes it, the stats and the node
/// API's log endpoints read it.
pub(crate) fn pod_log_directory(
    pod_logs_dir: &std::path::Path,
    namespace: &str,
    name: &str,
    uid: &str,
) -> std::path::PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        let long = "x".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "x/../../tmp",
            "/abs",
            "a\0b",
            long.as_str(),
        ] {
            assert!(component_problem(bad).is_some(), "{bad:?} accepted");
        }
        for good in ["uid-1", "3f2a", "a.b", "..a", "a..", "_x_"] {
            assert_eq!(component_problem(good), None, "{good:?} refused");
        }
    }
}
