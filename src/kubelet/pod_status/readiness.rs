//! A readiness verdict written straight into a published status, as upstream's status
//! manager does it (`SetContainerReadiness`): the container's `ready` flips, the `Ready` and
//! `ContainersReady` conditions are computed again from the statuses as they stand (their
//! transition time kept unless they change). The pod's worker computes the same status on its
//! next sync; this only saves waiting for it (a sync in progress, a hop through the sync loop).

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::{InitStatuses, container_id, gated, ready_verdict};
use crate::base::podspec::is_sidecar;

/// Sets the readiness of the running container instance `id` (a CRI container ID) in
/// `status`, and the pod's readiness conditions with it. False, and `status` untouched, when the
/// status does not show that instance running (its worker already saw it stop or be replaced),
/// or shows it as ready as it is.
pub(crate) fn apply_readiness(
    status: &mut PodStatus,
    pod: &Pod,
    id: &str,
    ready: bool,
    now: SystemTime,
) -> bool {
    let want = container_id(id);
    let found = status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten())
        .find(|c| c.container_id.as_deref() == Some(want.as_str()));
    let Some(container) = found else {
        return false;
    };
    let running = container
        .state
        .as_ref()
        .is_some_and(|s| s.running.is_some());
    if !running || container.ready == ready {
        return false;
    }
    container.ready = ready;

    let phase = match status.phase.as_deref() {
        Some("Succeeded") => "Succeeded",
        Some("Failed") => "Failed",
        Some("Running") => "Running",
        _ => "Pending",
    };
    let init_specs = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref());
    let statuses = status.init_container_statuses.clone().unwrap_or_default();
    let sidecars = statuses
        .iter()
        .map(|s| {
            init_specs
                .and_then(|specs| specs.iter().find(|c| c.name == s.name))
                .is_some_and(is_sidecar)
        })
        .collect();
    let inits = InitStatuses { statuses, sidecars };
    let apps = status.container_statuses.clone().unwrap_or_default();
    let containers_ready = ready_verdict(phase, &inits, &apps);
    let ready = gated(pod, &containers_ready);
    let before = status.clone();
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for (type_, verdict) in [("Ready", &ready), ("ContainersReady", &containers_ready)] {
        let mut fresh = verdict.condition(Some(&before), now, type_);
        fresh.observed_generation = super::observed_generation(pod);
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(slot) => *slot = fresh,
            None => conditions.push(fresh),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Container, ExecAction, PodSpec, Probe};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::base::observed::{ContainerState, ObservedContainer, ObservedPod, SandboxState};
    use crate::kubelet::pod_status::tests::{self, running};
    use crate::kubelet::pod_status::{StatusInputs, compute_pod_status};
    use crate::kubelet::prober::ProbeView;

    fn probed(name: &str) -> Container {
        Container {
            name: name.into(),
            readiness_probe: Some(Probe {
                exec: Some(ExecAction {
                    command: Some(vec!["true".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod() -> Pod {
        let mut sidecar = probed("side");
        sidecar.restart_policy = Some("Always".into());
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![sidecar]),
                containers: vec![probed("a"), probed("b")],
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The sidecar `side` and `a` running, `b` in `b`; ids `side1`, `a1`, `b1` (the status
    /// tests' instances, attempt 1).
    fn observed(b: ContainerState) -> ObservedPod {
        let side = ObservedContainer {
            is_init: true,
            ..running("side", 1)
        };
        let b = ObservedContainer {
            state: b,
            ..running("b", 1)
        };
        tests::observed(Some(SandboxState::Ready), vec![side, running("a", 1), b])
    }

    /// The worker's status for these probe results, at `at` seconds.
    fn computed(
        ready: &[&str],
        b: ContainerState,
        previous: Option<&PodStatus>,
        at: u64,
    ) -> PodStatus {
        let probes: HashMap<String, ProbeView> = ["side", "a", "b"]
            .iter()
            .map(|n| {
                let view = ProbeView {
                    ready: Some(ready.contains(n)),
                    started: None,
                };
                (n.to_string(), view)
            })
            .collect();
        compute_pod_status(
            &pod(),
            &observed(b),
            &StatusInputs {
                now: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
                host_ip: None,
                waiting: &HashMap::new(),
                previous,
                terminating: false,
                probes: &probes,
            },
        )
    }

    fn condition(status: &PodStatus, type_: &str) -> (String, String) {
        let c = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .unwrap();
        (
            c.status.clone(),
            c.last_transition_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
        )
    }

    /// Each patch gives what the worker computes from the same probe results (conditions,
    /// reasons, messages), and keeps a transition time when the condition does not change.
    #[test]
    fn a_patched_status_is_the_one_the_worker_computes() {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let p = pod();
        let running = ContainerState::Running;
        let mut status = computed(&[], running, None, 10);
        // a, then the sidecar, then b: the pod is ready only with the last.
        let steps: [(&str, &[&str], bool); 3] = [
            ("a1", &["a"], false),
            ("side1", &["a", "side"], false),
            ("b1", &["a", "side", "b"], true),
        ];
        let mut previous = status.clone();
        for (i, (id, ready, pod_ready)) in steps.into_iter().enumerate() {
            let now = 20 + i as u64;
            assert!(apply_readiness(&mut status, &p, id, true, at(now)), "{id}");
            let worker = computed(ready, running, Some(&previous), now);
            assert_eq!(status, worker, "after {id}");
            assert_eq!(
                condition(&status, "Ready").0,
                if pod_ready { "True" } else { "False" }
            );
            previous = worker;
        }
        // The last transition was at 22 s; nothing changes it at 30 s.
        let ready_since = condition(&status, "Ready").1;
        assert!(
            !apply_readiness(&mut status, &p, "b1", true, at(30)),
            "no change"
        );
        assert_eq!(condition(&status, "Ready").1, ready_since);
        // Not ready again: both conditions flip, with the new time.
        assert!(apply_readiness(&mut status, &p, "a1", false, at(40)));
        assert_eq!(
            status,
            computed(&["side", "b"], running, Some(&previous), 40)
        );
        assert_eq!(condition(&status, "ContainersReady").0, "False");
    }

    /// A verdict for an instance the status does not show running is left for the worker.
    #[test]
    fn a_verdict_for_an_instance_not_shown_running_changes_nothing() {
        let p = pod();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(50);
        let mut status = computed(&[], ContainerState::Exited, None, 10);
        let before = status.clone();
        assert!(
            !apply_readiness(&mut status, &p, "b1", true, now),
            "b exited"
        );
        assert!(
            !apply_readiness(&mut status, &p, "old", true, now),
            "unknown ID"
        );
        assert_eq!(status, before);
        // A status without conditions (published before any sync) gets them.
        let mut bare = computed(&[], ContainerState::Running, None, 10);
        bare.conditions = None;
        assert!(apply_readiness(&mut bare, &p, "a1", true, now));
        assert_eq!(condition(&bare, "Ready").0, "False");
    }
}
