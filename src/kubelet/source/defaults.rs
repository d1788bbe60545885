//! What a static pod becomes before the node runs it: the API server's defaults (which a
//! manifest never went through) and the static-pod conventions (name suffix, UID from the
//! content, config annotations, node binding).

use std::path::Path;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, LifecycleHandler, Pod, PodSecurityContext, PodStatus, Probe,
    Toleration,
};
use md5::{Digest, Md5};

pub use crate::base::podspec::origin::{
    CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
};

/// Where a static pod's manifest came from.
#[derive(Clone, Copy, Debug)]
pub enum ManifestOrigin<'a> {
    File(&'a Path),
    Http(&'a str),
}

impl ManifestOrigin<'_> {
    /// The value of [`CONFIG_SOURCE_ANNOTATION`].
    pub fn source_name(&self) -> &'static str {
        match self {
            ManifestOrigin::File(_) => super::SOURCE_FILE,
            ManifestOrigin::Http(_) => super::SOURCE_HTTP,
        }
    }
}

/// The UID a static pod gets when its manifest names none: md5 over the decoded pod's JSON,
/// then the node and file path (file source) or the URL (HTTP source), in lowercase hex.
/// The same manifest at the same place gives the same UID after a restart; any change to its
/// content gives a new one.
pub fn static_pod_uid(pod: &Pod, node_name: &str, origin: ManifestOrigin<'_>) -> String {
    let mut hasher = Md5::new();
    // Serializing a k8s-openapi type cannot fail (maps are BTreeMaps, keys are strings).
    let canonical = serde_json::to_vec(pod).unwrap_or_default();
    hasher.update(&canonical);
    match origin {
        ManifestOrigin::File(path) => {
            hasher.update(format!("host:{node_name}").as_bytes());
            hasher.update(format!("file:{}", path.display()).as_bytes());
        }
        ManifestOrigin::Http(url) => {
            hasher.update(format!("url:{url}").as_bytes());
        }
    }
    hex::encode(hasher.finalize())
}

/// The name a static pod runs under: `<name>-<node name in lowercase>`.
pub fn static_pod_name(name: &str, node_name: &str) -> String {
    format!("{name}-{}", node_name.to_lowercase())
}

/// Apply the static-pod conventions. Call on the pod as decoded (before API defaults): the
/// UID is computed from it as it is. `seen` becomes the `config.seen` annotation and does not
/// enter the UID.
pub fn apply_static_pod_conventions(
    pod: &mut Pod,
    node_name: &str,
    origin: ManifestOrigin<'_>,
    seen: SystemTime,
) {
    if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        pod.metadata.uid = Some(static_pod_uid(pod, node_name, origin));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(static_pod_name(&name, node_name));
    if pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        pod.metadata.namespace = Some("default".to_string());
    }
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), uid);
    annotations.insert(
        CONFIG_SOURCE_ANNOTATION.to_string(),
        origin.source_name().to_string(),
    );
    annotations.insert(
        CONFIG_SEEN_ANNOTATION.to_string(),
        format_rfc3339_nano(seen),
    );

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    if matches!(origin, ManifestOrigin::File(_)) {
        // Static pods must survive NoExecute taints (node problems), as upstream arranges.
        let wanted = Toleration {
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            ..Default::default()
        };
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        if !tolerations.contains(&wanted) {
            tolerations.push(wanted);
        }
    }
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase = Some("Pending".to_string());
}

/// `SystemTime` as RFC 3339 UTC with up to nine fractional digits, trailing zeros dropped
/// (Go's `RFC3339Nano`).
pub fn format_rfc3339_nano(t: SystemTime) -> String {
    let since_epoch = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let seconds = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    match k8s_openapi::jiff::Timestamp::new(seconds, since_epoch.subsec_nanos() as i32) {
        Ok(ts) => ts.to_string(),
        Err(_) => "1970-01-01T00:00:00Z".to_string(),
    }
}

/// The pull policy the API server would give an image with none set: `Always` for `:latest`
/// or no tag at all, `IfNotPresent` for any other tag or a digest.
pub fn default_image_pull_policy(image: &str) -> &'static str {
    let (name, has_digest) = match image.split_once('@') {
        Some((name, _)) => (name, true),
        None => (image, false),
    };
    let last_segment = name.rsplit('/').next().unwrap_or(name);
    let tag = last_segment.split_once(':').map(|(_, tag)| tag);
    match tag {
        Some("latest") => "Always",
        Some(_) => "IfNotPresent",
        None if has_digest => "IfNotPresent",
        None => "Always",
    }
}

fn set_if_empty(field: &mut Option<String>, value: &str) {
    if field.as_deref().unwrap_or_default().is_empty() {
        *field = Some(value.to_string());
    }
}

fn set_if_unset_or_zero(field: &mut Option<i32>, value: i32) {
    if field.unwrap_or(0) == 0 {
        *field = Some(value);
    }
}

fn default_http_get(action: &mut HTTPGetAction) {
    set_if_empty(&mut action.path, "/");
    set_if_empty(&mut action.scheme, "HTTP");
}

fn default_probe(probe: &mut Probe) {
    set_if_unset_or_zero(&mut probe.timeout_seconds, 1);
    set_if_unset_or_zero(&mut probe.period_seconds, 10);
    set_if_unset_or_zero(&mut probe.success_threshold, 1);
    set_if_unset_or_zero(&mut probe.failure_threshold, 3);
    if let Some(action) = probe.http_get.as_mut() {
        default_http_get(action);
    }
}

fn default_handler(handler: &mut LifecycleHandler) {
    if let Some(action) = handler.http_get.as_mut() {
        default_http_get(action);
    }
}

fn default_container(c: &mut Container, host_network: bool) {
    if c.image_pull_policy
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        let policy = default_image_pull_policy(c.image.as_deref().unwrap_or_default());
        c.image_pull_policy = Some(policy.to_string());
    }
    set_if_empty(&mut c.termination_message_path, "/dev/termination-log");
    set_if_empty(&mut c.termination_message_policy, "File");
    for port in c.ports.iter_mut().flatten() {
        set_if_empty(&mut port.protocol, "TCP");
        if host_network && port.host_port.unwrap_or(0) == 0 {
            port.host_port = Some(port.container_port);
        }
    }
    for probe in [
        c.liveness_probe.as_mut(),
        c.readiness_probe.as_mut(),
        c.startup_probe.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        default_probe(probe);
    }
    if let Some(lifecycle) = c.lifecycle.as_mut() {
        for handler in [lifecycle.post_start.as_mut(), lifecycle.pre_stop.as_mut()]
            .into_iter()
            .flatten()
        {
            default_handler(handler);
        }
    }
    for env in c.env.iter_mut().flatten() {
        if let Some(field_ref) = env.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
            set_if_empty(&mut field_ref.api_version, "v1");
        }
    }
    // Requests default to limits, resource by resource, when only limits are given.
    if let Some(resources) = c.resources.as_mut()
        && let Some(limits) = resources.limits.as_ref()
    {
        let requests = resources.requests.get_or_insert_with(Default::default);
        for (name, quantity) in limits {
            requests
                .entry(name.clone())
                .or_insert_with(|| quantity.clone());
        }
    }
}

/// Apply the defaults the API server gives every pod (`SetDefaults_Pod`, `_PodSpec`,
/// `_Container`, `_Probe`, `_HTTPGetAction`, `_Volume`, the volume-mode defaults).
pub fn apply_api_defaults(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    set_if_empty(&mut spec.dns_policy, "ClusterFirst");
    set_if_empty(&mut spec.restart_policy, "Always");
    set_if_empty(&mut spec.scheduler_name, "default-scheduler");
    if spec.security_context.is_none() {
        spec.security_context = Some(PodSecurityContext::default());
    }
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(30);
    }
    if spec.enable_service_links.is_none() {
        spec.enable_service_links = Some(true);
    }
    let host_network = spec.host_network.unwrap_or(false);
    for c in spec.containers.iter_mut() {
        default_container(c, host_network);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        default_container(c, host_network);
    }
    for volume in spec.volumes.iter_mut().flatten() {
        let only_name = serde_json::to_value(&*volume)
            .ok()
            .and_then(|v| v.as_object().map(|o| o.keys().all(|k| k == "name")))
            .unwrap_or(false);
        if only_name {
            volume.empty_dir = Some(Default::default());
        }
        if let Some(host_path) = volume.host_path.as_mut()
            && host_path.type_.is_none()
        {
            host_path.type_ = Some(String::new());
        }
        if let Some(secret) = volume.secret.as_mut()
            && secret.default_mode.is_none()
        {
            secret.default_mode = Some(0o644);
        }
        if let Some(config_map) = volume.config_map.as_mut()
            && config_map.default_mode.is_none()
        {
            config_map.default_mode = Some(0o644);
        }
        if let Some(downward) = volume.downward_api.as_mut()
            && downward.default_mode.is_none()
        {
            downward.default_mode = Some(0o644);
        }
        if let Some(projected) = volume.projected.as_mut()
            && projected.default_mode.is_none()
        {
            projected.default_mode = Some(0o644);
        }
        if let Some(image) = volume.image.as_mut() {
            let reference = image.reference.as_deref().unwrap_or_default();
            set_if_empty(&mut image.pull_policy, default_image_pull_policy(reference));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn pod(yaml: &str) -> Pod {
        crate::base::yaml::from_str(yaml).unwrap()
    }

    const BASIC: &str = "
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: nginx:1.27
";

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_400_000)
    }

    #[test]
    fn name_namespace_node_and_annotations() {
        let mut p = pod(BASIC);
        let path = Path::new("/etc/kubernetes/manifests/web.yaml");
        apply_static_pod_conventions(&mut p, "Node-A", ManifestOrigin::File(path), t0());
        assert_eq!(p.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-A"));
        let tol = spec.tolerations.as_ref().unwrap();
        assert_eq!(tol.len(), 1);
        assert_eq!(tol[0].operator.as_deref(), Some("Exists"));
        assert_eq!(tol[0].effect.as_deref(), Some("NoExecute"));
        let ann = p.metadata.annotations.as_ref().unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        assert!(
            uid.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        assert_eq!(ann[CONFIG_SEEN_ANNOTATION], "2023-11-14T22:13:20.1234Z");
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn namespace_kept_and_toleration_not_duplicated() {
        let mut p = pod(&format!(
            "{BASIC}  tolerations:\n  - operator: Exists\n    effect: NoExecute\nstatus: {{}}\n"
        ));
        p.metadata.namespace = Some("kube-system".into());
        apply_static_pod_conventions(&mut p, "n", ManifestOrigin::File(Path::new("/m/a")), t0());
        assert_eq!(p.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(p.spec.unwrap().tolerations.unwrap().len(), 1);
    }

    #[test]
    fn http_pods_have_no_toleration_and_source_http() {
        let mut p = pod(BASIC);
        apply_static_pod_conventions(&mut p, "n", ManifestOrigin::Http("http://x/p"), t0());
        assert!(p.spec.as_ref().unwrap().tolerations.is_none());
        assert_eq!(
            p.metadata.annotations.unwrap()[CONFIG_SOURCE_ANNOTATION],
            "http"
        );
    }

    #[test]
    fn uid_is_deterministic_and_sensitive() {
        let file = ManifestOrigin::File(Path::new("/m/web.yaml"));
        let base = static_pod_uid(&pod(BASIC), "node", file);
        // Same input, same UID (a restart).
        assert_eq!(base, static_pod_uid(&pod(BASIC), "node", file));
        // Seen time does not matter.
        let mut a = pod(BASIC);
        let mut b = pod(BASIC);
        apply_static_pod_conventions(&mut a, "node", file, t0());
        apply_static_pod_conventions(&mut b, "node", file, t0() + Duration::from_secs(9));
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_eq!(a.metadata.uid.as_deref(), Some(base.as_str()));
        // Content, path, node and source all change it.
        let changed = pod(&BASIC.replace("1.27", "1.28"));
        let cases = [
            static_pod_uid(&changed, "node", file),
            static_pod_uid(
                &pod(BASIC),
                "node",
                ManifestOrigin::File(Path::new("/m/b.yaml")),
            ),
            static_pod_uid(&pod(BASIC), "other", file),
            static_pod_uid(&pod(BASIC), "node", ManifestOrigin::Http("http://h/web")),
        ];
        for uid in cases {
            assert_ne!(uid, base);
        }
    }

    #[test]
    fn explicit_uid_is_kept() {
        let mut p = pod(BASIC);
        p.metadata.uid = Some("my-uid".into());
        apply_static_pod_conventions(&mut p, "n", ManifestOrigin::File(Path::new("/m")), t0());
        assert_eq!(p.metadata.uid.as_deref(), Some("my-uid"));
        assert_eq!(
            p.metadata.annotations.unwrap()[CONFIG_HASH_ANNOTATION],
            "my-uid"
        );
    }

    #[test]
    fn image_pull_policy_table() {
        let cases = [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("registry:5000/nginx", "Always"),
            ("registry:5000/team/nginx:v1", "IfNotPresent"),
            ("registry:5000/nginx:latest", "Always"),
            ("nginx@sha256:abcd", "IfNotPresent"),
            ("nginx:latest@sha256:abcd", "Always"),
            ("nginx:1.0@sha256:abcd", "IfNotPresent"),
        ];
        for (image, want) in cases {
            assert_eq!(default_image_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn api_defaults_pod_and_containers() {
        let mut p = pod("
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  hostNetwork: true
  initContainers:
  - name: init
    image: busybox
  containers:
  - name: app
    image: nginx:1.27
    imagePullPolicy: Never
    ports:
    - containerPort: 8080
    - containerPort: 9090
      hostPort: 19090
      protocol: UDP
    resources:
      limits: {cpu: 500m, memory: 128Mi}
      requests: {cpu: 100m}
    livenessProbe:
      httpGet: {port: 8080}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 5
  volumes:
  - name: scratch
  - name: host
    hostPath: {path: /var/log}
");
        apply_api_defaults(&mut p);
        let spec = p.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.enable_service_links, Some(true));
        assert!(spec.security_context.is_some());

        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(
            init.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(init.termination_message_policy.as_deref(), Some("File"));

        let app = &spec.containers[0];
        assert_eq!(app.image_pull_policy.as_deref(), Some("Never"));
        let ports = app.ports.as_ref().unwrap();
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[0].host_port, Some(8080));
        assert_eq!(ports[1].protocol.as_deref(), Some("UDP"));
        assert_eq!(ports[1].host_port, Some(19090));

        let res = app.resources.as_ref().unwrap();
        let req = res.requests.as_ref().unwrap();
        assert_eq!(req["cpu"].0, "100m");
        assert_eq!(req["memory"].0, "128Mi");

        let live = app.liveness_probe.as_ref().unwrap();
        assert_eq!(live.timeout_seconds, Some(1));
        assert_eq!(live.period_seconds, Some(10));
        assert_eq!(live.success_threshold, Some(1));
        assert_eq!(live.failure_threshold, Some(3));
        let get = live.http_get.as_ref().unwrap();
        assert_eq!(get.scheme.as_deref(), Some("HTTP"));
        assert_eq!(get.path.as_deref(), Some("/"));
        let ready = app.readiness_probe.as_ref().unwrap();
        assert_eq!(ready.period_seconds, Some(5));

        let vols = spec.volumes.unwrap();
        assert!(vols[0].empty_dir.is_some());
        assert!(vols[1].empty_dir.is_none());
        assert_eq!(
            vols[1].host_path.as_ref().unwrap().type_.as_deref(),
            Some("")
        );
    }

    #[test]
    fn no_host_port_without_host_network() {
        let mut p = pod(&format!("{BASIC}    ports:\n    - containerPort: 80\n"));
        apply_api_defaults(&mut p);
        let spec = p.spec.unwrap();
        let port = &spec.containers[0].ports.as_ref().unwrap()[0];
        assert_eq!(port.host_port, None);
    }
}
