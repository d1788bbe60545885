//! The files the agent keeps for a pod under `<root>/pods/<uid>`: the kubelet-managed
//! `/etc/hosts`, each container's termination-message file, and the crash-loop back-off state
//! (`backoff.json`), which lets a restarted agent continue a back-off instead of restarting it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use std::time::SystemTime;

use super::backoff::{BackoffPolicy, BackoffTable, Repair, decode_table};
use super::hosts::{render_host_network_hosts_file, render_hosts_file};

/// The node's hosts file, which a hostNetwork pod's `/etc/hosts` starts from (upstream's
/// `etcHostsPath`).
const NODE_HOSTS: &str = "/etc/hosts";

/// Where a pod's back-off state is kept.
const BACKOFF_FILE: &str = "backoff.json";

/// A pod file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub(crate) struct PodFileError {
    /// What was being done: `write`, or `read` (the node's hosts file).
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The files a container is started with.
pub(crate) struct ContainerFiles {
    /// The managed `/etc/hosts`.
    pub hosts: Option<PathBuf>,
    /// The empty file mounted as the termination-message path.
    pub termination_log: PathBuf,
}

/// Writes `/etc/hosts` and an empty termination-message file for one start of `container`
/// (`restart_count` keeps each instance's message apart).
pub(crate) fn prepare_container_files(
    pod_dir: &Path,
    pod: &Pod,
    container: &str,
    restart_count: u32,
    pod_ip: Option<&str>,
    cluster_domain: Option<&str>,
) -> Result<ContainerFiles, PodFileError> {
    let hosts = write_hosts_file(pod_dir, pod, pod_ip, cluster_domain, Path::new(NODE_HOSTS))?;
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PodFileError {
            action: "write",
            path,
            source,
        }
    };
    let term_dir = pod_dir.join("containers").join(container);
    std::fs::create_dir_all(&term_dir).map_err(err(&term_dir))?;
    let termination_log = term_dir.join(restart_count.to_string());
    std::fs::write(&termination_log, b"").map_err(err(&termination_log))?;
    // Writable by whatever user the container runs as (upstream makes it 0666 whatever the
    // umask): a non-root process must be able to leave its termination message.
    std::fs::set_permissions(&termination_log, std::fs::Permissions::from_mode(0o666))
        .map_err(err(&termination_log))?;
    Ok(ContainerFiles {
        hosts: Some(hosts),
        termination_log,
    })
}

/// Writes the pod's `etc-hosts`: the managed file of a pod with its own network, or for a
/// hostNetwork pod the node's hosts file (read from `node_hosts`, now, so a change on the node
/// reaches the next container start) with the pod's aliases, as upstream's `ensureHostsFile`.
fn write_hosts_file(
    pod_dir: &Path,
    pod: &Pod,
    pod_ip: Option<&str>,
    cluster_domain: Option<&str>,
    node_hosts: &Path,
) -> Result<PathBuf, PodFileError> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let text = if host_network {
        let node = std::fs::read_to_string(node_hosts).map_err(|source| PodFileError {
            action: "read",
            path: node_hosts.to_path_buf(),
            source,
        })?;
        render_host_network_hosts_file(pod, &node)
    } else {
        render_hosts_file(pod, pod_ip, cluster_domain)
    };
    let path = pod_dir.join("etc-hosts");
    write_atomically(&path, text.as_bytes()).map_err(|source| PodFileError {
        action: "write",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The back-off state saved for a pod, or an empty one (nothing saved, or unreadable: a lost
/// back-off only means a restart comes sooner). What is read is checked: a file anyone may have
/// edited never yields a delay beyond the policy's maximum or an entry dated in the future;
/// the repairs made are returned for the log.
pub(crate) fn load_backoff(
    pod_dir: &Path,
    policy: &BackoffPolicy,
    now: SystemTime,
) -> (BackoffTable, Vec<Repair>) {
    match std::fs::read(pod_dir.join(BACKOFF_FILE)) {
        Ok(bytes) => decode_table(&bytes, policy, now),
        Err(_) => (BackoffTable::default(), Vec::new()),
    }
}

/// Saves a pod's back-off state.
pub(crate) fn save_backoff(pod_dir: &Path, table: &BackoffTable) -> Result<(), PodFileError> {
    let path = pod_dir.join(BACKOFF_FILE);
    serde_json::to_vec(table)
        .map_err(std::io::Error::other)
        .and_then(|bytes| write_atomically(&path, &bytes))
        .map_err(|source| PodFileError {
            action: "write",
            path,
            source,
        })
}

/// Writes a file through a temporary name and a rename, so readers never see half of it.
pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::kubelet::runtime::backoff::BackoffEntry;

    /// A hostNetwork pod's hosts file is the node's, under upstream's header, with the
    /// pod's aliases after it.
    #[test]
    fn a_host_network_pod_gets_the_nodes_hosts_file_with_its_aliases() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node-hosts");
        std::fs::write(&node, "127.0.0.1\tlocalhost\n10.0.0.1\tnode1\n").unwrap();
        let pod: Pod = crate::base::yaml::from_str(
            "spec: {hostNetwork: true, containers: [], hostAliases: [{ip: 123.45.67.89, hostnames: [foo, bar]}]}\n",
        )
        .unwrap();
        let path = write_hosts_file(dir.path(), &pod, Some("10.0.0.1"), None, &node).unwrap();
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            "# Kubernetes-managed hosts file (host network).\n\
             127.0.0.1\tlocalhost\n10.0.0.1\tnode1\n\
             \n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"
        );
        let gone = dir.path().join("missing");
        let err = write_hosts_file(dir.path(), &pod, None, None, &gone).unwrap_err();
        assert_eq!(err.action, "read");
    }

    #[test]
    fn container_files_and_back_off_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let pod = Pod {
            spec: Some(PodSpec::default()),
            ..Default::default()
        };
        let files =
            prepare_container_files(dir.path(), &pod, "app", 3, Some("10.0.0.7"), None).unwrap();
        let hosts = std::fs::read_to_string(files.hosts.unwrap()).unwrap();
        assert!(hosts.contains("10.0.0.7"), "{hosts}");
        assert_eq!(files.termination_log, dir.path().join("containers/app/3"));
        assert_eq!(std::fs::read(&files.termination_log).unwrap(), b"");
        let mode = std::fs::metadata(&files.termination_log)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666, "writable by a non-root container user");

        let policy = BackoffPolicy::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        assert!(load_backoff(dir.path(), &policy, now).0.is_empty());
        let table: BackoffTable = [(
            "app".to_string(),
            BackoffEntry {
                delay: Duration::from_secs(20),
                last_update: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            },
        )]
        .into();
        save_backoff(dir.path(), &table).unwrap();
        assert_eq!(load_backoff(dir.path(), &policy, now), (table, vec![]));
        std::fs::write(dir.path().join(BACKOFF_FILE), b"{not json").unwrap();
        assert!(load_backoff(dir.path(), &policy, now).0.is_empty());
    }
}
