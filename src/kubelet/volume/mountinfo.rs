//! Reading `/proc/self/mountinfo`: which paths are mount points, and with what filesystem.

use std::path::{Path, PathBuf};

/// One line of mountinfo, the parts we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub super_options: String,
}

/// Parses mountinfo text. Lines look like
/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
/// the fifth field is the mount point (octal-escaped), and after the lone `-` come the
/// filesystem type, the source and the super-block options.
pub(crate) fn parse(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 7 {
            continue;
        }
        let Some(dash) = fields.iter().skip(6).position(|f| *f == "-").map(|i| i + 6) else {
            continue;
        };
        out.push(MountEntry {
            mount_point: PathBuf::from(unescape(fields[4])),
            fs_type: fields.get(dash + 1).unwrap_or(&"").to_string(),
            super_options: fields.get(dash + 3).unwrap_or(&"").to_string(),
        });
    }
    out
}

/// Undoes the kernel's `\ooo` escaping of space, tab, newline and backslash.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mount table of this process.
pub(crate) fn read() -> std::io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Mount points at or below `dir`, deepest first (the order to unmount them in).
pub(crate) fn mounts_under(entries: &[MountEntry], dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = entries
        .iter()
        .filter(|e| e.mount_point.starts_with(dir))
        .map(|e| e.mount_point.clone())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// The most recent mount at exactly `path`, if any.
pub(crate) fn mount_at<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 22 0:30 / /var/lib/x/pods/u1/volumes/kubernetes.io~empty-dir/cache rw,relatime shared:20 - tmpfs tmpfs rw,size=65536k
37 22 0:31 / /tmp/with\\040space rw shared:21 - tmpfs tmpfs rw
38 22 0:32 / /var/lib/x/pods/u1/volumes/kubernetes.io~empty-dir/cache/inner rw - tmpfs tmpfs rw,size=4k
39 22 0:33 / /opt/tagged rw shared:5 master:2 - nfs server:/x rw,vers=4
bad line
";

    #[test]
    fn parses_mount_points_types_and_options() {
        let entries = parse(SAMPLE);
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[1].fs_type, "tmpfs");
        assert_eq!(entries[1].super_options, "rw,size=65536k");
        assert_eq!(entries[2].mount_point, PathBuf::from("/tmp/with space"));
        assert_eq!(entries[4].fs_type, "nfs");
        assert_eq!(entries[4].super_options, "rw,vers=4");
    }

    #[test]
    fn mounts_under_deepest_first() {
        let entries = parse(SAMPLE);
        let found = mounts_under(&entries, Path::new("/var/lib/x/pods/u1/volumes"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/var/lib/x/pods/u1/volumes/kubernetes.io~empty-dir/cache/inner"),
                PathBuf::from("/var/lib/x/pods/u1/volumes/kubernetes.io~empty-dir/cache"),
            ]
        );
        assert!(mounts_under(&entries, Path::new("/var/lib/x/pods/u2")).is_empty());
        // A sibling with a common string prefix is not "under".
        assert!(mounts_under(&entries, Path::new("/tmp/with")).is_empty());
        assert_eq!(
            mount_at(&entries, Path::new("/tmp/with space")).map(|e| e.fs_type.as_str()),
            Some("tmpfs")
        );
    }
}
