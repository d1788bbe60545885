//! The cert dir's certificates, as upstream's file store keeps them:
//! `<pair>-<YYYY-MM-DD-HH-MM-SS>.pem` (certificate chain then key, 0600) per certificate,
//! and `<pair>-current.pem`, a symlink to the one in use; the pair is `kubelet-client` for
//! the client certificate and `kubelet-server` for the node API's serving certificate.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Credentials;

/// The link to the certificate in use.
pub const CURRENT: &str = "kubelet-client-current.pem";
const SUFFIX: &str = ".pem";

/// The serving certificate's pair name.
pub const SERVER_PAIR: &str = "kubelet-server";
const CLIENT_PAIR: &str = "kubelet-client";

/// The file name of a client certificate stored at `at` (UTC).
pub fn file_name_for(at: jiff::Timestamp) -> String {
    pair_file_name(CLIENT_PAIR, at)
}

fn pair_file_name(pair: &str, at: jiff::Timestamp) -> String {
    format!("{pair}-{}{SUFFIX}", at.strftime("%Y-%m-%d-%H-%M-%S"))
}

/// Whether `name` is a stored client certificate's name (not the link).
pub fn is_stored_name(name: &str) -> bool {
    is_pair_name(CLIENT_PAIR, name)
}

fn is_pair_name(pair: &str, name: &str) -> bool {
    name.strip_prefix(pair)
        .and_then(|r| r.strip_prefix('-'))
        .and_then(|r| r.strip_suffix(SUFFIX))
        .is_some_and(|ts| ts.len() == 19 && ts.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
}

/// Which stored client certificate is current: the link's target when it names an existing
/// stored file, otherwise (no link, a dangling one) the newest stored file; the timestamped
/// names sort by time.
pub fn pick_current<'a>(link_target: Option<&str>, names: &'a [String]) -> Option<&'a str> {
    pick_pair_current(CLIENT_PAIR, link_target, names)
}

fn pick_pair_current<'a>(
    pair: &str,
    link_target: Option<&str>,
    names: &'a [String],
) -> Option<&'a str> {
    if let Some(t) = link_target
        && let Some(n) = names.iter().find(|n| n.as_str() == t)
    {
        return Some(n);
    }
    names
        .iter()
        .filter(|n| is_pair_name(pair, n))
        .max()
        .map(String::as_str)
}

/// What went wrong with the store, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The certificates of one pair in a cert dir.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    pair: &'static str,
}

impl FileStore {
    /// The client certificates (`kubelet-client-*`).
    pub fn new(dir: impl Into<PathBuf>) -> FileStore {
        FileStore {
            dir: dir.into(),
            pair: CLIENT_PAIR,
        }
    }

    /// The node API's serving certificates (`kubelet-server-*`).
    pub fn serving(dir: impl Into<PathBuf>) -> FileStore {
        FileStore {
            dir: dir.into(),
            pair: SERVER_PAIR,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/kubelet-client-current.pem`: what kubeconfigs name.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current{SUFFIX}", self.pair))
    }

    /// The current credentials, if there are any: the link's target, or (the link missing
    /// or dangling) the newest stored file, which the link is then pointed at.
    pub fn current(&self) -> Result<Option<(PathBuf, Credentials)>, StoreError> {
        let link = self.current_path();
        let target = std::fs::read_link(&link).ok();
        let target_name = target
            .as_ref()
            .and_then(|t| t.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        let names: Vec<String> = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&self.dir)(e)),
        };
        let Some(name) = pick_pair_current(self.pair, target_name.as_deref(), &names) else {
            return Ok(None);
        };
        let path = self.dir.join(name);
        let pem = std::fs::read(&path).map_err(io(&path))?;
        let creds = Credentials::from_pem(&pem).map_err(|reason| StoreError::Unusable {
            path: path.clone(),
            reason: reason.to_string(),
        })?;
        if target_name.as_deref() != Some(name) {
            tracing::warn!(link = %link.display(), file = %path.display(), "the current-certificate link is missing or dangling; pointing it at the newest stored certificate");
            self.link(&path)?;
        }
        Ok(Some((path, creds)))
    }

    /// Writes `pem` as a new timestamped file (0600) and moves the link to it.
    pub fn store(&self, pem: &[u8], at: jiff::Timestamp) -> Result<PathBuf, StoreError> {
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let _ = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700));
        let mut path = self.dir.join(pair_file_name(self.pair, at));
        // Two certificates within a second: the later one waits for the next name.
        let mut bump = at;
        while path.exists() {
            bump += jiff::SignedDuration::from_secs(1);
            path = self.dir.join(pair_file_name(self.pair, bump));
        }
        let tmp = self.dir.join(format!(".{}-current.pem.new", self.pair));
        write_private(&tmp, &path, pem).map_err(io(&path))?;
        self.link(&path)?;
        Ok(path)
    }

    /// Points the link at `target`, atomically (a new link renamed over the old).
    fn link(&self, target: &Path) -> Result<(), StoreError> {
        let link = self.current_path();
        let tmp = self.dir.join(format!(".{}-current.pem.link", self.pair));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &link).map_err(io(&link))
    }
}

/// Writes `bytes` to `dest` readable by root only (0600), never half-written: to `tmp` first
/// (made fresh, synced), then renamed over `dest`.
pub(crate) fn write_private(tmp: &Path, dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _ = std::fs::remove_file(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let at: jiff::Timestamp = "2026-12-01T12:30:05Z".parse().unwrap();
        assert_eq!(file_name_for(at), "kubelet-client-2026-12-01-12-30-05.pem");
        let cases = [
            ("kubelet-client-2026-12-01-12-30-05.pem", true),
            ("kubelet-client-current.pem", false),
            ("kubelet-client-2026-12-01.pem", false),
            ("kubelet-client-2026-12-01-12-30-0x.pem", false),
            ("kubelet-server-2026-12-01-12-30-05.pem", false),
            (".kubelet-client-current.pem.new", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_stored_name(name), want, "{name}");
        }
    }

    #[test]
    fn current_table() {
        let a = "kubelet-client-2026-01-01-00-00-00.pem".to_string();
        let b = "kubelet-client-2026-06-01-00-00-00.pem".to_string();
        let other = "kubelet.key".to_string();
        let all = vec![b.clone(), other.clone(), a.clone()];
        let cases: Vec<(Option<&str>, Vec<String>, Option<&str>)> = vec![
            // The link wins, even when it names an older file.
            (Some(a.as_str()), all.clone(), Some(a.as_str())),
            (Some(b.as_str()), all.clone(), Some(b.as_str())),
            // Dangling or missing: the newest.
            (
                Some("kubelet-client-2020-01-01-00-00-00.pem"),
                all.clone(),
                Some(b.as_str()),
            ),
            (None, all.clone(), Some(b.as_str())),
            (None, vec![other.clone()], None),
            (None, vec![], None),
        ];
        for (i, (link, names, want)) in cases.into_iter().enumerate() {
            assert_eq!(pick_current(link, &names), want, "case {i}");
        }
    }
}
