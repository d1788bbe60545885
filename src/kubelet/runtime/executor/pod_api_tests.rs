//! The pod API settings a sync acts on (issue 32's NodeConformance failures): `runAsNonRoot`
//! with an explicit root `runAsUser`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::SecurityContext;

use super::cgroup_tests::{IMAGE, executor, pod};
use super::*;
use crate::clients::cri::fake::FakeCri;

/// `runAsNonRoot: true` with `runAsUser: 0` is refused before the container is created, with
/// upstream's `CreateContainerConfigError` and message, whatever user the image names (the
/// check used to run only when the image's user was needed, so this container started as
/// root).
#[tokio::test]
async fn run_as_non_root_with_an_explicit_root_user_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeCri::with_images(&[IMAGE]);
    let (executor, _events) = executor(dir.path(), rt.clone());
    let mut p = pod("uid-root");
    p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(0),
        ..Default::default()
    });
    let mut state = PodSyncState::default();
    executor
        .sync_pod(&p, &mut state, &HashMap::new(), &HashMap::new())
        .await;
    assert_eq!(rt.count("CreateContainer"), 0, "{:?}", rt.calls());
    let waiting = state.waiting.get("app").expect("the container waits");
    assert_eq!(waiting.reason, WaitReason::CreateContainerConfigError);
    assert_eq!(
        waiting.message,
        "container's runAsUser breaks non-root policy (pod: \"web_default(uid-root)\", container: app)"
    );

    // A non-root explicit user starts.
    let mut q = pod("uid-user");
    q.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(1000),
        ..Default::default()
    });
    let mut state = PodSyncState::default();
    executor
        .sync_pod(&q, &mut state, &HashMap::new(), &HashMap::new())
        .await;
    assert_eq!(rt.count("CreateContainer"), 1, "{:?}", rt.calls());
    assert!(state.waiting.is_empty(), "{:?}", state.waiting);
}
