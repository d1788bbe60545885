//! Manifest bytes as a file or URL source would read them: decoding (YAML or JSON), the
//! static-pod conventions, API defaults and validation must never panic, and whatever they
//! accept must be safe to run (a UID that is one path component, a name, a namespace).
#![no_main]

use std::path::Path;
use std::time::{Duration, SystemTime};

use deckhand::kubelet::source::defaults::ManifestOrigin;
use deckhand::kubelet::source::{NodeSecurity, load_static_pods};
use deckhand::kubelet::source::validate::{dns1123_label_problem, uid_problem};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the origin: the HTTP source also accepts lists.
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let origin = if which & 1 == 0 {
        ManifestOrigin::File(Path::new("/etc/kubernetes/manifests/fuzz.yaml"))
    } else {
        ManifestOrigin::Http("http://manifests.example/pods")
    };
    let seen = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    // The strictest node: it refuses whatever it cannot enforce.
    let security = NodeSecurity::default();
    let Ok(loaded) = load_static_pods(bytes, origin, "node-1", &security, seen) else {
        return;
    };
    for pod in &loaded.pods {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        assert!(uid_problem(uid).is_none(), "accepted an unsafe UID {uid:?}");
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        assert!(dns1123_label_problem(namespace).is_none(), "{namespace:?}");
        assert!(pod.metadata.name.as_deref().is_some_and(|n| !n.is_empty()));
    }
});
