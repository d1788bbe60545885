//! The order in which a pod's running containers are stopped, as upstream's kubelet orders them
//! once a pod has sidecars (restartable init containers).
//!
//! Every container starts its termination at once: the Killing event and the preStop hook run
//! for all of them together. Only the stop itself waits: app containers and plain init
//! containers stop at once, and each sidecar stops after every app container and every sidecar
//! declared after it has exited. So a sidecar that serves the others (a proxy, a log shipper)
//! is still there while their preStop hooks and their last requests run, and sidecars go down
//! in the reverse of the order they came up.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodSpec;

use crate::base::podspec::is_sidecar;

/// For each running container, the running containers whose exit it waits for before it is
/// stopped. A container that is not running waits for nothing and is waited for by nobody.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TerminationOrder {
    waits_for: BTreeMap<String, BTreeSet<String>>,
}

impl TerminationOrder {
    /// The order for `spec`'s containers named in `running`.
    pub(crate) fn new<'a>(spec: &PodSpec, running: impl IntoIterator<Item = &'a str>) -> Self {
        let running: BTreeSet<&str> = running.into_iter().collect();
        let apps: BTreeSet<String> = spec
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .filter(|name| running.contains(name))
            .map(str::to_string)
            .collect();
        let mut waits_for: BTreeMap<String, BTreeSet<String>> = running
            .iter()
            .map(|n| (n.to_string(), BTreeSet::new()))
            .collect();
        // Sidecars declared later, walking the list backwards.
        let mut later_sidecars: BTreeSet<String> = BTreeSet::new();
        for init in spec.init_containers.iter().flatten().rev() {
            if !is_sidecar(init) {
                continue;
            }
            if let Some(waits) = waits_for.get_mut(&init.name) {
                waits.extend(apps.iter().cloned());
                waits.extend(later_sidecars.iter().cloned());
            }
            if running.contains(init.name.as_str()) {
                later_sidecars.insert(init.name.clone());
            }
        }
        TerminationOrder { waits_for }
    }

    /// The running containers `name` waits for (none for an unknown name).
    pub(crate) fn waits_for(&self, name: &str) -> impl Iterator<Item = &str> {
        self.waits_for
            .get(name)
            .into_iter()
            .flat_map(|set| set.iter().map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    fn spec(inits: Vec<Container>, apps: Vec<Container>) -> PodSpec {
        PodSpec {
            init_containers: Some(inits),
            containers: apps,
            ..Default::default()
        }
    }

    fn waits(order: &TerminationOrder, name: &str) -> Vec<String> {
        order.waits_for(name).map(str::to_string).collect()
    }

    #[test]
    fn sidecars_wait_for_the_apps_and_the_sidecars_declared_after_them() {
        let s = spec(
            vec![sidecar("proxy"), container("setup"), sidecar("logs")],
            vec![container("main"), container("helper")],
        );
        let all = ["proxy", "setup", "logs", "main", "helper"];
        // (running, container, what it waits for)
        let cases: &[(&[&str], &str, &[&str])] = &[
            (&all, "main", &[]),
            (&all, "helper", &[]),
            (&all, "setup", &[]),
            (&all, "logs", &["helper", "main"]),
            (&all, "proxy", &["helper", "logs", "main"]),
            // What is not running is waited for by nobody.
            (&["proxy", "main"], "proxy", &["main"]),
            (&["proxy", "logs"], "proxy", &["logs"]),
            (&["proxy"], "proxy", &[]),
            // What is not running waits for nothing.
            (&["main"], "proxy", &[]),
        ];
        for (running, name, want) in cases {
            let order = TerminationOrder::new(&s, running.iter().copied());
            assert_eq!(
                waits(&order, name),
                *want,
                "{name} with {running:?} running"
            );
        }
    }

    #[test]
    fn without_sidecars_nothing_waits() {
        let s = spec(
            vec![container("init")],
            vec![container("a"), container("b")],
        );
        let order = TerminationOrder::new(&s, ["init", "a", "b"]);
        for name in ["init", "a", "b"] {
            assert_eq!(waits(&order, name), Vec::<String>::new(), "{name}");
        }
    }
}
