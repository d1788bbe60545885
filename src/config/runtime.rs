//! The container runtime's section: where the agent reaches it (`containerRuntimeEndpoint`,
//! `imageServiceEndpoint`), where pods' files go (`--root-dir`, `podLogsDir`) and how images
//! are pulled through it (`serializeImagePulls`, `maxParallelImagePulls`, the pull progress
//! deadline and the pause image).
//!
//! Its two parts are checked at different points of `validate::build`'s order: the locations
//! right after the node name, the image pulls after the pods' resources.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ConfigError;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{InvalidValue, file_count, invalid, pick};

// Upstream kubelet (v1beta1) defaults.
pub(super) const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
pub(super) const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
pub(super) const DEFAULT_CONTAINER_RUNTIME_ENDPOINT: &str =
    "unix:///run/containerd/containerd.sock";
/// The old dockershim default for `--image-pull-progress-deadline`.
pub(super) const DEFAULT_IMAGE_PULL_PROGRESS_DEADLINE: Duration = Duration::from_secs(60);

/// Where pods' files live and where the runtime listens.
pub(super) struct Locations {
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub container_runtime_endpoint: String,
    pub image_service_endpoint: Option<String>,
}

/// The directories and the CRI endpoints: every later part of the agent depends on them, so
/// they are checked right after the node name.
pub(super) fn locations(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<Locations, ConfigError> {
    let root_dir = flags
        .root_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT_DIR));
    if !root_dir.is_absolute() {
        return Err(invalid("--root-dir", "must be an absolute path"));
    }
    let (pod_logs_dir, o) = pick(
        flags.pod_logs_dir.clone(),
        "--pod-logs-dir",
        f.pod_logs_dir.as_ref().map(PathBuf::from),
        "podLogsDir",
        || PathBuf::from(DEFAULT_POD_LOGS_DIR),
    );
    check_pod_logs_dir(&pod_logs_dir).map_err(|why| invalid(o.name(), why))?;

    let (endpoint, o) = pick(
        flags.container_runtime_endpoint.clone(),
        "--container-runtime-endpoint",
        f.container_runtime_endpoint.clone(),
        "containerRuntimeEndpoint",
        || DEFAULT_CONTAINER_RUNTIME_ENDPOINT.to_string(),
    );
    let container_runtime_endpoint =
        normalize_endpoint(&endpoint).map_err(|why| invalid(o.name(), why))?;
    let (image_endpoint, o) = pick(
        flags.image_service_endpoint.clone(),
        "--image-service-endpoint",
        f.image_service_endpoint.clone(),
        "imageServiceEndpoint",
        String::new,
    );
    let image_service_endpoint = if image_endpoint.trim().is_empty() {
        None
    } else {
        Some(normalize_endpoint(&image_endpoint).map_err(|why| invalid(o.name(), why))?)
    };
    Ok(Locations {
        root_dir,
        pod_logs_dir,
        container_runtime_endpoint,
        image_service_endpoint,
    })
}

/// How images are pulled.
pub(super) struct Images {
    pub serialize_pulls: bool,
    pub max_parallel_pulls: Option<u32>,
    /// `None` when disabled (0).
    pub pull_progress_deadline: Option<Duration>,
    pub pod_infra_container_image: Option<String>,
}

/// The image pull settings. `maxParallelImagePulls` above 1 contradicts serialized pulls, and
/// upstream refuses the pair rather than pick one.
pub(super) fn images(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Images, ConfigError> {
    let (serialize_pulls, serialize_origin) = pick(
        flags.serialize_image_pulls,
        "--serialize-image-pulls",
        f.serialize_image_pulls,
        "serializeImagePulls",
        || true,
    );
    let max_parallel_pulls = file_count(f.max_parallel_image_pulls, "maxParallelImagePulls", 1)?;
    if let Some(n) = max_parallel_pulls
        && n > 1
        && serialize_pulls
    {
        return Err(invalid(
            "maxParallelImagePulls",
            format!(
                "{n} requires image pulls not to be serialized; set {} to false",
                serialize_origin.name()
            ),
        ));
    }
    Ok(Images {
        serialize_pulls,
        max_parallel_pulls,
        pull_progress_deadline: Some(
            flags
                .image_pull_progress_deadline
                .unwrap_or(DEFAULT_IMAGE_PULL_PROGRESS_DEADLINE),
        )
        .filter(|d| !d.is_zero()),
        pod_infra_container_image: flags
            .pod_infra_container_image
            .clone()
            .filter(|s| !s.trim().is_empty()),
    })
}

/// Accepts `unix:///abs/path` as is and turns a bare absolute path into `unix:///abs/path`.
fn normalize_endpoint(value: &str) -> Result<String, InvalidValue> {
    let value = value.trim();
    if value.is_empty() {
        return Err(InvalidValue("must not be empty".into()));
    }
    if let Some(path) = value.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(InvalidValue(format!(
                "{value:?} must name an absolute socket path, like unix:///run/containerd/containerd.sock"
            )));
        }
        return Ok(value.to_string());
    }
    if value.starts_with('/') {
        return Ok(format!("unix://{value}"));
    }
    if let Some((scheme, _)) = value.split_once("://") {
        return Err(InvalidValue(format!(
            "{value:?} uses scheme {scheme:?}; Deckhand only speaks CRI over unix sockets (unix:///path)"
        )));
    }
    Err(InvalidValue(format!(
        "{value:?} must be unix:///path/to/socket or an absolute socket path"
    )))
}

/// podLogsDir must be absolute, normalized and ASCII (upstream uses it in metric labels).
fn check_pod_logs_dir(path: &Path) -> Result<(), InvalidValue> {
    let text = path.to_string_lossy();
    if text.is_empty() {
        return Err(InvalidValue("must not be empty".into()));
    }
    if !path.is_absolute() {
        return Err(InvalidValue(format!("{text:?} must be an absolute path")));
    }
    let clean = text == "/"
        || text
            .split('/')
            .skip(1)
            .all(|segment| !matches!(segment, "" | "." | ".."));
    if !clean {
        return Err(InvalidValue(format!(
            "{text:?} must be normalized (no '.', '..', '//' or trailing '/')"
        )));
    }
    if !text.is_ascii() {
        return Err(InvalidValue(format!(
            "{text:?} must contain ASCII characters only"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_normalization() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                "unix:///run/containerd/containerd.sock",
                Ok("unix:///run/containerd/containerd.sock"),
            ),
            ("/run/crio/crio.sock", Ok("unix:///run/crio/crio.sock")),
            (" /run/x.sock ", Ok("unix:///run/x.sock")),
            ("unix://run/x.sock", Err("absolute socket path")),
            ("run/x.sock", Err("absolute socket path")),
            ("tcp://127.0.0.1:1234", Err("\"tcp\"")),
            ("npipe:////./pipe/containerd", Err("\"npipe\"")),
            ("", Err("must not be empty")),
        ];
        for (input, want) in cases {
            match (normalize_endpoint(input), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{input:?}"),
                (Err(got), Err(want)) => assert!(got.0.contains(want), "{input:?}: {got}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn pod_logs_dirs() {
        for ok in ["/var/log/pods", "/", "/logs"] {
            assert_eq!(check_pod_logs_dir(Path::new(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "var/log/pods",
            "/var/log/../pods",
            "/var/./log",
            "/var/log/",
            "/var//log",
            "/var/lög",
            "",
        ] {
            assert!(check_pod_logs_dir(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
