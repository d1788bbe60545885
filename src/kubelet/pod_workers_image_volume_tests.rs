//! A pod's image volumes through a worker and the fake runtime: the image is pulled as a
//! container's is (pod events, the pull back-off, the waiting reasons), a container mounting a
//! volume whose image could not be had waits while the pod's other containers run, and the
//! runtime is handed CRI image mounts of the pulled image's ID.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, ImageVolumeSource, Volume, VolumeMount};

use super::test_support::{IMAGE, drain_events, eventually, harness, pod};
use super::*;
use crate::clients::cri::fake::{FakeCri, Script};

/// `web` with `uses` mounting the image volume `img` of `reference` (whole, and `etc` of it
/// through `subPath`) and `plain` mounting nothing.
fn with_image_volume(uid: &str, reference: &str) -> Arc<Pod> {
    let mut p = (*pod(uid)).clone();
    p.metadata.name = Some(uid.into());
    let spec = p.spec.as_mut().unwrap();
    let mount = |path: &str, sub: Option<&str>| VolumeMount {
        name: "img".into(),
        mount_path: path.into(),
        sub_path: sub.map(str::to_string),
        ..Default::default()
    };
    spec.containers = vec![
        Container {
            name: "uses".into(),
            volume_mounts: Some(vec![mount("/img", None), mount("/etc-img", Some("etc"))]),
            ..spec.containers[0].clone()
        },
        Container {
            name: "plain".into(),
            ..spec.containers[0].clone()
        },
    ];
    spec.volumes = Some(vec![Volume {
        name: "img".into(),
        image: Some(ImageVolumeSource {
            reference: Some(reference.into()),
            pull_policy: Some("IfNotPresent".into()),
        }),
        ..Default::default()
    }]);
    Arc::new(p)
}

fn waiting_of(h: &test_support::Harness, uid: &str, container: &str) -> Option<(String, String)> {
    let status = h.states.status(uid)?;
    let c = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == container)?;
    let w = c.state?.waiting?;
    Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}

#[tokio::test(start_paused = true)]
async fn an_image_volume_is_pulled_and_handed_to_the_runtime_as_an_image_mount() {
    let rt = FakeCri::with_images(&[IMAGE]);
    let mut h = harness(rt);
    h.workers.dispatch(
        "ok",
        Work::Sync(with_image_volume("ok", "example.test/data:1")),
    );
    eventually("both containers started", || async {
        h.rt.count("StartContainer") == 2
    })
    .await;
    assert_eq!(h.rt.pull_auths().len(), 1, "the volume's image pulled once");
    let created = h.rt.created_mounts();
    let (_, mounts) = created.iter().find(|(n, _)| n == "uses").unwrap();
    let images: Vec<(&str, bool, &str, &str)> = mounts
        .iter()
        .filter_map(|m| {
            let image = m.image.as_ref()?;
            Some((
                m.container_path.as_str(),
                m.readonly,
                image.image.as_str(),
                m.image_sub_path.as_str(),
            ))
        })
        .collect();
    assert_eq!(
        images,
        [
            ("/img", true, "sha256:example.test/data:1", ""),
            ("/etc-img", true, "sha256:example.test/data:1", "etc"),
        ]
    );
    let (_, plain) = created.iter().find(|(n, _)| n == "plain").unwrap();
    assert!(plain.iter().all(|m| m.image.is_none()));
    let events = drain_events(&mut h);
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Pulling" && m == "Pulling image \"example.test/data:1\""),
        "{events:?}"
    );
    h.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_image_volume_pull_keeps_only_its_containers_waiting() {
    let rt = FakeCri::with_images(&[IMAGE]);
    for _ in 0..3 {
        rt.script("PullImage", Script::Fail(tonic::Code::NotFound));
    }
    let mut h = harness(rt);
    h.workers.dispatch(
        "bad",
        Work::Sync(with_image_volume("bad", "example.test/missing:1")),
    );
    eventually("uses waits with ErrImagePull", || async {
        waiting_of(&h, "bad", "uses").is_some_and(|(r, _)| r == "ErrImagePull")
    })
    .await;
    let (_, message) = waiting_of(&h, "bad", "uses").unwrap();
    assert!(
        message.starts_with("failed to pull image \"example.test/missing:1\": "),
        "{message}"
    );
    assert_eq!(h.rt.count("StartContainer"), 1, "plain runs");
    assert!(h.rt.created_mounts().iter().all(|(n, _)| n == "plain"));
    let events = drain_events(&mut h);
    assert!(
        events.iter().any(|(r, m)| r == "Failed"
            && m.starts_with("Failed to pull image \"example.test/missing:1\": ")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Failed" && m == "Error: ErrImagePull"),
        "{events:?}"
    );
    // The next try backs off, as a container's image does, and says why the last pull failed.
    eventually("uses backs off", || async {
        waiting_of(&h, "bad", "uses").is_some_and(|(r, m)| {
            r == "ImagePullBackOff"
                && m.starts_with(
                    "Back-off pulling image \"example.test/missing:1\": ErrImagePull: failed to pull image",
                )
        })
    })
    .await;
    h.cancel.cancel();
}
