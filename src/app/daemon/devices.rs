//! The device plugin manager's servers: the Registration service on
//! `<root-dir>/device-plugins/kubelet.sock` and the pod-resources API on
//! `<root-dir>/pod-resources/kubelet.sock`, both as supervised tasks; and the active pods the
//! manager drops finished pods' devices by (known once every pod source has reported).

use std::collections::HashSet;
use std::sync::Arc;

use super::Agent;
use crate::kubelet::devices::api::podresources::{CdiDevice, ClaimResource, DynamicResource};
use crate::kubelet::devices::podresources::{self, Providers};
use crate::kubelet::dra::DraManager;
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::source::SourcesReady;

/// A pod the node still runs or will run: published and not in a terminal phase.
fn is_active(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// The node's pods with whether each is active.
fn pods(states: &PodStates) -> Vec<(Arc<k8s_openapi::api::core::v1::Pod>, bool)> {
    states
        .uids()
        .into_iter()
        .filter_map(|uid| states.get(&uid))
        .map(|(pod, status)| (pod, is_active(&status)))
        .collect()
}

/// The DRA claims a container uses as pod-resources lists them (upstream's
/// `getDynamicResources`): every device each driver prepared for the claim.
fn dynamic_resources(
    dra: &DraManager,
    pod: &k8s_openapi::api::core::v1::Pod,
    container: &k8s_openapi::api::core::v1::Container,
) -> Vec<DynamicResource> {
    dra.container_claim_infos(pod, container)
        .into_iter()
        .map(|info| DynamicResource {
            claim_name: info.claim_name,
            claim_namespace: info.namespace,
            claim_resources: info
                .drivers
                .iter()
                .flat_map(|(driver, state)| {
                    state.devices.iter().map(move |d| ClaimResource {
                        cdi_devices: d
                            .cdi_device_ids
                            .iter()
                            .map(|name| CdiDevice { name: name.clone() })
                            .collect(),
                        driver_name: driver.clone(),
                        pool_name: d.pool_name.clone(),
                        device_name: d.device_name.clone(),
                        share_id: d.share_id.clone(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// Starts both servers and gives the manager the active pods.
pub(super) fn start(agent: &Agent, sources_ready: &SourcesReady) {
    let (states, ready) = (agent.states.clone(), sources_ready.clone());
    agent.devices.set_active_pods(Arc::new(move || {
        ready.all_ready().then(|| {
            pods(&states)
                .into_iter()
                .filter(|(_, active)| *active)
                .filter_map(|(pod, _)| pod.metadata.uid.clone())
                .collect::<HashSet<String>>()
        })
    }));
    let (devices, cancel) = (agent.devices.clone(), agent.cancel.clone());
    agent.tasks.spawn("device-plugin-registration", move || {
        devices.clone().serve_registration(cancel.clone())
    });
    let states = agent.states.clone();
    let dra = agent.dra.clone();
    let providers = Providers {
        pods: Arc::new(move || pods(&states)),
        devices: agent.devices.clone(),
        dynamic: Some(Arc::new(move |pod, container| {
            dynamic_resources(&dra, pod, container)
        })),
    };
    let (root, cancel) = (agent.config.root_dir.clone(), agent.cancel.clone());
    agent.tasks.spawn("pod-resources", move || {
        podresources::serve(root.clone(), providers.clone(), cancel.clone())
    });
}
