//! Carrying an allocated resize out (upstream's `doPodResizeAction`): the pod cgroup's limits
//! grown first, `UpdateContainerResources` for each container the decision resizes in place,
//! then the pod cgroup's new settings (which shrinks what shrank). What each container was
//! given is kept in the worker's state (upstream's actuated resources), which the next
//! decision and the status read. A pod-level resize (`spec.resources`) resizes the pod's cgroup
//! the same way, and reaches the containers that have no limit of their own; the pod-level
//! resources the cgroup was given are kept beside the containers'.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::{Executor, PodSyncState};
use crate::base::observed::{ContainerState, ObservedPod};
use crate::base::podspec::pod_level::pod_resources;
use crate::clients::cri::proto::ContainerStatsFilter;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::runtime::actions::PodActions;
use crate::kubelet::runtime::resize::{
    PodLevel, below_usage, lowered_memory_limit_under, lowered_pod_memory_limit,
    memory_resize_error, pod_below_usage, pod_level_changed, resize_step_under,
};
use crate::kubelet::runtime::translate::container::linux_resources;

/// The spec's container `name` (app container or init container).
fn spec_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// The resources of the spec's container `name` (app container or sidecar).
fn spec_resources(pod: &Pod, name: &str) -> Option<ResourceRequirements> {
    spec_container(pod, name).map(|c| c.resources.clone().unwrap_or_default())
}

/// The pod-level resources a sync judges resizes under: the allocation's and what the pod's
/// cgroup was last given (the allocation's while nothing is recorded).
pub(super) fn pod_level<'a>(pod: &'a Pod, state: &'a PodSyncState) -> PodLevel<'a> {
    let wanted = pod_resources(pod);
    PodLevel {
        wanted,
        actuated: match &state.actuated_pod {
            Some(given) => given.as_ref(),
            None => wanted,
        },
    }
}

/// Records what the running instances run with: an instance not known yet (just started, or
/// adopted after a restart of the agent) runs with its spec's resources as the pod has them
/// now. Instances no longer running are forgotten. The pod-level resources are recorded at the
/// first sync, as the pod has them then.
pub(super) fn note_actuated(pod: &Pod, observed: &ObservedPod, state: &mut PodSyncState) {
    if state.actuated_pod.is_none() {
        state.actuated_pod = Some(pod_resources(pod).cloned());
    }
    let running: HashMap<&str, &str> = observed
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    state
        .actuated
        .retain(|id, _| running.contains_key(id.as_str()));
    for (id, name) in running {
        if !state.actuated.contains_key(id)
            && let Some(r) = spec_resources(pod, name)
        {
            state.actuated.insert(id.to_string(), r);
        }
    }
}

/// The pod as its cgroup was last sized, when a running instance (in `observed`, the view the
/// step was decided on) was given other resources than its container is allocated now: those
/// instances at what they were given, and the pod-level resources at what the cgroup was given.
/// `None` when every running instance and the pod's cgroup have their allocation, so the pod's
/// cgroup has nothing to follow. Instances the step stops for a resize count as
/// well: their restart runs with the new resources, which the pod's cgroup must hold first
/// (upstream's `UpdatePodResources`: on cgroup v1 a container's CFS quota above its pod's is
/// refused).
fn before_resize(
    pod: &Pod,
    observed: &ObservedPod,
    actuated: &HashMap<String, ResourceRequirements>,
    level: PodLevel,
) -> Option<Pod> {
    let mut before = pod.clone();
    let spec = before.spec.as_mut()?;
    let mut differs = pod_level_changed(level);
    if differs {
        spec.resources = level.actuated.cloned();
    }
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let given = observed
            .containers
            .iter()
            .filter(|i| i.name == c.name && i.state == ContainerState::Running)
            .find_map(|i| actuated.get(&i.id));
        let Some(given) = given else {
            continue;
        };
        if resize_step_under(c, given, level).is_some() {
            c.resources = Some(given.clone());
            differs = true;
        }
    }
    differs.then_some(before)
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Resizes the decision's containers in place, the pod cgroup around them (also when the
    /// resize only restarts containers: before they start again).
    pub(super) async fn resize_in_place(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        decision: &PodActions,
        state: &mut PodSyncState,
    ) -> Result<(), CriError> {
        let level = pod_level(pod, state);
        let Some(before) = before_resize(pod, observed, &state.actuated, level) else {
            state.resize_error = None;
            return Ok(());
        };
        if let Some(error) = self.memory_limits_too_low(pod, decision, state).await {
            // Nothing is changed; the status says why until the resize goes through or
            // another replaces it (upstream goes on with the rest of the sync as well).
            tracing::warn!(error = %error, "the allocated resize cannot be carried out now");
            state.resize_error = Some(error);
            return Ok(());
        }
        self.set_pod_cgroup(&before, pod, true).await;
        for r in &decision.resize_containers {
            let Some(c) = spec_container(pod, &r.name) else {
                continue;
            };
            let linux = match linux_resources(pod, c, self.node.node_memory_bytes, &self.resources)
            {
                Ok(linux) => linux,
                Err(error) => {
                    tracing::warn!(container = %r.name, error = %error, "cannot translate the container's new resources");
                    continue;
                }
            };
            tracing::info!(container = %r.name, container_id = %r.id, "resizing the container in place");
            if let Err(error) = self
                .rt
                .update_container_resources(r.id.clone(), linux)
                .await
            {
                state.resize_error = Some(error.to_string());
                return Err(error);
            }
            state
                .actuated
                .insert(r.id.clone(), c.resources.clone().unwrap_or_default());
        }
        self.set_pod_cgroup(&before, pod, false).await;
        state.actuated_pod = Some(pod_resources(pod).cloned());
        state.resize_error = None;
        Ok(())
    }

    /// Why the decision's in-place resizes cannot go through: a memory limit lowered to what
    /// its container (or, for the pod-level limit, the pod) already uses or less (upstream's
    /// `validateMemoryResizeAction`, which checks them all before anything changes, so no
    /// resize is left half done).
    async fn memory_limits_too_low(
        &self,
        pod: &Pod,
        decision: &PodActions,
        state: &PodSyncState,
    ) -> Option<String> {
        let level = pod_level(pod, state);
        let mut errors = Vec::new();
        if let Some(limit) = lowered_pod_memory_limit(level)
            && let Some(cgroups) = self.cgroups.clone()
        {
            let owned = pod.clone();
            let usage = tokio::task::spawn_blocking(move || cgroups.pod_memory_usage(&owned))
                .await
                .ok()
                .flatten();
            match usage {
                Some(usage) => errors.extend(pod_below_usage(limit, usage)),
                None => errors.push("missing pod memory usage".to_string()),
            }
        }
        for r in &decision.resize_containers {
            let lowered = spec_container(pod, &r.name)
                .zip(state.actuated.get(&r.id))
                .and_then(|(c, actuated)| lowered_memory_limit_under(c, actuated, level));
            let Some(limit) = lowered else {
                continue;
            };
            match self.memory_usage(&r.id).await {
                Some(usage) => errors.extend(below_usage(&r.name, limit, usage)),
                None => errors.push(format!("missing container {:?} memory usage", r.name)),
            }
        }
        (!errors.is_empty()).then(|| memory_resize_error(&errors))
    }

    /// What the container `id` uses of memory now, as the runtime's stats say.
    async fn memory_usage(&self, id: &str) -> Option<u64> {
        let filter = ContainerStatsFilter {
            id: id.to_string(),
            ..Default::default()
        };
        let stats = self.rt.list_container_stats(Some(filter)).await.ok()?;
        let own = stats
            .into_iter()
            .find(|s| s.attributes.as_ref().is_some_and(|a| a.id == id))?;
        own.memory?.usage_bytes.map(|v| v.value)
    }

    /// Writes the pod cgroup's settings for a resize from `before` to `after`: during it
    /// (`during`) each limit at the larger of the two, else `after`'s. A refusal is logged, as
    /// upstream logs it; the containers' own limits still hold.
    async fn set_pod_cgroup(&self, before: &Pod, after: &Pod, during: bool) {
        let Some(cgroups) = self.cgroups.clone() else {
            return;
        };
        let (before, after) = (before.clone(), after.clone());
        let written = tokio::task::spawn_blocking(move || {
            let new = cgroups.pod_config(&after);
            let config = if during {
                crate::kubelet::cm::resize::grown(&cgroups.pod_config(&before), &new)
            } else {
                new
            };
            cgroups.set_pod_resources(&after, &config)
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %error, "cannot resize the pod's cgroup");
            }
            Err(error) => tracing::warn!(error = %error, "the pod cgroup task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::{Value, json};

    use super::super::cgroup_tests::{IMAGE, executor, manager};
    use super::*;
    use crate::base::observed::ObservedContainer;
    use crate::clients::cri::fake::FakeCri;

    fn res(v: Value) -> ResourceRequirements {
        serde_json::from_value(v).expect("resources")
    }

    /// A Burstable pod `uid` on the fixture node whose container `app` asks for `cpu`
    /// (request) and `limit`, its cpu resized by a restart.
    fn pod(uid: &str, cpu: &str, limit: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": uid},
            "spec": {"nodeName": "node-a", "containers": [{
                "name": "app", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": {"cpu": cpu, "memory": "32Mi"},
                              "limits": {"cpu": limit, "memory": "64Mi"}},
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
            }]},
        }))
        .expect("pod")
    }

    fn instance(id: &str, state: ContainerState) -> ObservedContainer {
        ObservedContainer {
            id: id.into(),
            sandbox_id: "s".into(),
            name: "app".into(),
            attempt: 0,
            state,
            created_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            hash: None,
            image: IMAGE.into(),
            image_ref: String::new(),
            grace_period: None,
            is_init: false,
            pre_stop: None,
            round: None,
        }
    }

    #[test]
    fn the_pod_before_a_resize_has_each_running_instance_at_what_it_was_given() {
        let now = pod("u", "25m", "35m");
        let was = res(json!({"requests": {"cpu": "20m", "memory": "32Mi"},
                             "limits": {"cpu": "30m", "memory": "64Mi"}}));
        let same = now.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        let running = ObservedPod {
            containers: vec![instance("c1", ContainerState::Running)],
            ..Default::default()
        };
        let exited = ObservedPod {
            containers: vec![instance("c1", ContainerState::Exited)],
            ..Default::default()
        };
        let given = |r: &ResourceRequirements| HashMap::from([("c1".to_string(), r.clone())]);
        let cases = [
            // The instance the step stops for its restart counts: its pod cgroup is the old one.
            (
                "running at the old size",
                &running,
                given(&was),
                Some(was.clone()),
            ),
            ("running at its allocation", &running, given(&same), None),
            (
                "no record of what it was given",
                &running,
                HashMap::new(),
                None,
            ),
            ("exited", &exited, given(&was), None),
        ];
        for (what, observed, actuated, want) in cases {
            let before = before_resize(&now, observed, &actuated, PodLevel::default());
            let got = before.map(|p| p.spec.unwrap().containers[0].resources.clone().unwrap());
            assert_eq!(got, want, "{what}");
        }
    }

    #[tokio::test]
    async fn a_resize_by_restart_resizes_the_pod_cgroup_too() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = dir.path().join("cgroup");
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, _events) = executor(dir.path(), rt.clone());
        let executor = executor.with_cgroups(manager(&cgroups));
        let mut state = PodSyncState::default();
        executor
            .sync_pod(
                &pod("uid-r", "20m", "30m"),
                &mut state,
                &HashMap::new(),
                &HashMap::new(),
            )
            .await;
        let quota = cgroups.join("cpu/kubepods/burstable/poduid-r/cpu.cfs_quota_us");
        assert_eq!(std::fs::read_to_string(&quota).unwrap(), "3000");
        let first = rt.containers()[0].id.clone();

        executor
            .sync_pod(
                &pod("uid-r", "25m", "35m"),
                &mut state,
                &HashMap::new(),
                &HashMap::new(),
            )
            .await;
        assert_eq!(
            rt.stopped(),
            vec![first],
            "restarted, as its resizePolicy says"
        );
        assert_eq!(rt.count("CreateContainer"), 2);
        assert!(rt.resource_updates().is_empty(), "nothing resized in place");
        // A v1 kernel refuses a container quota above its pod's: 35m must be there first.
        assert_eq!(std::fs::read_to_string(&quota).unwrap(), "3500");
    }

    /// A Guaranteed pod on the fixture node whose one container has `memory` as request and
    /// limit, resized in place.
    fn memory_pod(memory: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-m"},
            "spec": {"nodeName": "node-a", "containers": [{
                "name": "c1", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": {"cpu": "20m", "memory": memory},
                              "limits": {"cpu": "20m", "memory": memory}},
            }]},
        }))
        .expect("pod")
    }

    #[tokio::test]
    async fn a_memory_limit_below_what_the_container_uses_is_refused_and_told() {
        use crate::clients::cri::proto::{ContainerStats, MemoryUsage, UInt64Value};
        let dir = tempfile::tempdir().unwrap();
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, _events) = executor(dir.path(), rt.clone());
        let mut state = PodSyncState::default();
        let sync = async |executor: &Executor<FakeCri>, p: &Pod, state: &mut PodSyncState| {
            executor
                .sync_pod(p, state, &HashMap::new(), &HashMap::new())
                .await;
        };
        sync(&executor, &memory_pod("30Mi"), &mut state).await;
        let id = rt.containers()[0].id.clone();
        let usage = 2 << 20;
        rt.set_container_stats(
            &id,
            ContainerStats {
                memory: Some(MemoryUsage {
                    usage_bytes: Some(UInt64Value { value: usage }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );

        sync(&executor, &memory_pod("10Ki"), &mut state).await;
        assert!(rt.resource_updates().is_empty(), "nothing changed");
        assert_eq!(
            state.resize_error.as_deref(),
            Some(
                "cannot decrease memory limits: attempting to set container \"c1\" memory limit \
                 (10240) below current usage (2097152)"
            )
        );
        let was = state.actuated[&id].limits.as_ref().unwrap()["memory"].clone();
        assert_eq!(was.0, "30Mi", "still runs with what it was given");

        // Above what it uses, the resize goes through and the error is gone.
        sync(&executor, &memory_pod("20Mi"), &mut state).await;
        assert_eq!(rt.resource_updates().len(), 1);
        assert_eq!(rt.resource_updates()[0].1.memory_limit_in_bytes, 20 << 20);
        assert_eq!(state.resize_error, None);
    }

    /// A Guaranteed pod by its pod-level resources (`cpu`, `memory` as requests and limits)
    /// whose one container sets none of its own.
    fn pod_level_pod(cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-p"},
            "spec": {"nodeName": "node-a",
                "resources": {"requests": {"cpu": cpu, "memory": memory},
                              "limits": {"cpu": cpu, "memory": memory}},
                "containers": [{"name": "c1", "image": IMAGE, "imagePullPolicy": "IfNotPresent"}]},
        }))
        .expect("pod")
    }

    #[tokio::test]
    async fn a_pod_level_resize_resizes_the_pod_cgroup_and_the_containers_without_limits() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = dir.path().join("cgroup");
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, _events) = executor(dir.path(), rt.clone());
        let executor = executor.with_cgroups(manager(&cgroups));
        let mut state = PodSyncState::default();
        let sync = async |executor: &Executor<FakeCri>, p: &Pod, state: &mut PodSyncState| {
            executor
                .sync_pod(p, state, &HashMap::new(), &HashMap::new())
                .await;
        };
        sync(&executor, &pod_level_pod("40m", "64Mi"), &mut state).await;
        // Guaranteed by its pod-level resources: the pod cgroup sits under kubepods.
        let pod_cgroup = cgroups.join("cpu/kubepods/poduid-p");
        let read = |file: &str| std::fs::read_to_string(pod_cgroup.join(file)).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "4000");
        let memory = cgroups.join("memory/kubepods/poduid-p/memory.limit_in_bytes");
        assert_eq!(
            std::fs::read_to_string(&memory).unwrap(),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            state.actuated_pod,
            Some(pod_resources(&pod_level_pod("40m", "64Mi")).cloned())
        );

        sync(&executor, &pod_level_pod("80m", "96Mi"), &mut state).await;
        assert_eq!(read("cpu.cfs_quota_us"), "8000");
        assert_eq!(
            std::fs::read_to_string(&memory).unwrap(),
            (96u64 << 20).to_string()
        );
        let updates = rt.resource_updates();
        assert_eq!(
            updates.len(),
            1,
            "the container without limits follows in place"
        );
        assert_eq!(updates[0].1.cpu_quota, 8000);
        assert_eq!(updates[0].1.memory_limit_in_bytes, 96 << 20);
        assert_eq!(
            state.actuated_pod,
            Some(pod_resources(&pod_level_pod("80m", "96Mi")).cloned())
        );
        assert_eq!(state.resize_error, None);
    }
}
