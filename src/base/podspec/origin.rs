//! Where a pod came from, as the annotations the sources put on it say: a static pod (from the
//! manifest directory or URL), a pod of the API server, or a mirror pod (the API server's copy
//! of a static pod). Admission, eviction, status and the mirror-pod manager all ask; the
//! answer lives here so none of them has to reach into the sources for it.

use k8s_openapi::api::core::v1::Pod;

/// Source name of static pods read from `staticPodPath`.
pub const SOURCE_FILE: &str = "file";
/// Source name of static pods fetched from `staticPodURL`.
pub const SOURCE_HTTP: &str = "http";
/// Source name of pods bound to this node through the API server.
pub const SOURCE_API: &str = "api";

/// Annotation naming the source a pod came from (`file`, `http`, `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation holding the pod's content hash (for static pods, the UID).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation holding when the node first saw the pod (RFC 3339 with nanoseconds).
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Annotation upstream sets on mirror pods; listed here so callers share one spelling.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key))
}

/// True for a static pod: one from the manifest directory or the manifest URL.
pub(crate) fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s == SOURCE_FILE || s == SOURCE_HTTP)
}

/// True for a pod that names a source other than the API server (upstream's `IsStaticPod`,
/// which admission asks): a static pod, or one of a source this node does not know.
pub(crate) fn is_not_from_api(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != SOURCE_API)
}

/// True for a mirror pod (it carries [`CONFIG_MIRROR_ANNOTATION`]).
pub(crate) fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(annotations: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        pod
    }

    #[test]
    fn the_source_annotation_tells_static_api_and_mirror_pods_apart() {
        let cases = [
            (vec![(CONFIG_SOURCE_ANNOTATION, "file")], true, true, false),
            (vec![(CONFIG_SOURCE_ANNOTATION, "http")], true, true, false),
            (vec![(CONFIG_SOURCE_ANNOTATION, "api")], false, false, false),
            (
                vec![(CONFIG_SOURCE_ANNOTATION, "other")],
                false,
                true,
                false,
            ),
            (vec![], false, false, false),
            (vec![(CONFIG_MIRROR_ANNOTATION, "x")], false, false, true),
        ];
        for (annotations, is_static_, not_api, mirror) in cases {
            let pod = with(&annotations);
            assert_eq!(is_static(&pod), is_static_, "{annotations:?}");
            assert_eq!(is_not_from_api(&pod), not_api, "{annotations:?}");
            assert_eq!(is_mirror(&pod), mirror, "{annotations:?}");
        }
    }
}
