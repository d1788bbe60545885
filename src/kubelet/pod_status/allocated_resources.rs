//! Each app container's `allocatedResourcesStatus`: the health of the devices it holds, from
//! device plugins and DRA drivers (upstream's `UpdateAllocatedResourcesStatus` of both
//! managers; init containers get none, as upstream's). Pure: the worker passes what the
//! managers say of each container.

use k8s_openapi::api::core::v1::{Container, PodStatus, ResourceStatus};

/// The status with each app container's entries set from `of` (none: the field is left out).
pub(crate) fn with_allocated_resources(
    mut status: PodStatus,
    containers: &[Container],
    of: &dyn Fn(&Container) -> Vec<ResourceStatus>,
) -> PodStatus {
    for cs in status.container_statuses.iter_mut().flatten() {
        let Some(container) = containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let entries = of(container);
        cs.allocated_resources_status = (!entries.is_empty()).then_some(entries);
    }
    status
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerStatus, ResourceHealth};

    use super::*;

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            ..Default::default()
        }
    }

    fn status(names: &[&str]) -> PodStatus {
        let statuses = names
            .iter()
            .map(|n| ContainerStatus {
                name: n.to_string(),
                ..Default::default()
            })
            .collect();
        PodStatus {
            container_statuses: Some(statuses),
            init_container_statuses: Some(vec![ContainerStatus {
                name: "init".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn app_containers_get_their_entries_and_those_without_devices_none() {
        let of = |c: &Container| {
            if c.name != "gpu" {
                return Vec::new();
            }
            vec![ResourceStatus {
                name: "example.com/gpu".into(),
                resources: Some(vec![ResourceHealth {
                    health: Some("Healthy".into()),
                    message: None,
                    resource_id: "dev-0".into(),
                }]),
            }]
        };
        let containers = [container("gpu"), container("plain"), container("init")];
        let out = with_allocated_resources(status(&["gpu", "plain"]), &containers, &of);
        let apps = out.container_statuses.unwrap();
        assert_eq!(
            apps[0].allocated_resources_status.as_ref().unwrap()[0].name,
            "example.com/gpu"
        );
        assert!(apps[1].allocated_resources_status.is_none());
        let inits = out.init_container_statuses.unwrap();
        assert!(
            inits[0].allocated_resources_status.is_none(),
            "init containers get none"
        );
    }
}
