//! What the plugins' `Allocate` answers put into a container's CRI config, as upstream's
//! `deviceRunContainerOptions` and `generateContainerConfig` do: environment variables first
//! (the pod's own come after, so they win), mounts and device nodes before the volumes', the
//! plugin's annotations where the kubelet sets none of its own, and CDI device names. When two
//! answers disagree on one key or path, the first is kept and the conflict logged, as upstream.

use std::collections::BTreeSet;

use crate::clients::cri::proto::{CdiDevice, ContainerConfig, Device, KeyValue, Mount};

use super::api::v1beta1::ContainerAllocateResponse;

/// The merged answers for one container.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ContainerOptions {
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub devices: Vec<Device>,
    pub annotations: Vec<(String, String)>,
    pub cdi_devices: Vec<String>,
}

impl ContainerOptions {
    /// Merges the answers in order.
    pub(crate) fn merge<'a>(
        answers: impl IntoIterator<Item = &'a ContainerAllocateResponse>,
    ) -> ContainerOptions {
        let mut out = ContainerOptions::default();
        let mut mount_paths = BTreeSet::new();
        let mut device_paths = BTreeSet::new();
        let mut cdi = BTreeSet::new();
        for answer in answers {
            let mut envs: Vec<_> = answer.envs.iter().collect();
            envs.sort();
            for (k, v) in envs {
                add_keyed(&mut out.envs, k, v, "environment variable");
            }
            for m in &answer.mounts {
                if mount_paths.insert(m.container_path.clone()) {
                    out.mounts.push(Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        readonly: m.read_only,
                        ..Default::default()
                    });
                } else {
                    tracing::warn!(path = %m.container_path, "device plugin mount conflicts with an earlier one; the first is kept");
                }
            }
            for d in &answer.devices {
                if device_paths.insert(d.container_path.clone()) {
                    out.devices.push(Device {
                        container_path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone(),
                    });
                } else {
                    tracing::warn!(path = %d.container_path, "device plugin device node conflicts with an earlier one; the first is kept");
                }
            }
            let mut annotations: Vec<_> = answer.annotations.iter().collect();
            annotations.sort();
            for (k, v) in annotations {
                add_keyed(&mut out.annotations, k, v, "annotation");
            }
            for d in &answer.cdi_devices {
                if cdi.insert(d.name.clone()) {
                    out.cdi_devices.push(d.name.clone());
                }
            }
        }
        out
    }

    /// Puts the options into the container's CRI config.
    pub(crate) fn apply(&self, config: &mut ContainerConfig) {
        let mut envs: Vec<KeyValue> = self
            .envs
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        envs.append(&mut config.envs);
        config.envs = envs;
        let mut mounts = self.mounts.clone();
        mounts.retain(|m| {
            !config
                .mounts
                .iter()
                .any(|c| c.container_path == m.container_path)
        });
        mounts.append(&mut config.mounts);
        config.mounts = mounts;
        config.devices.extend(self.devices.iter().cloned());
        for (k, v) in &self.annotations {
            config
                .annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        config.cdi_devices.extend(
            self.cdi_devices
                .iter()
                .map(|name| CdiDevice { name: name.clone() }),
        );
    }
}

fn add_keyed(list: &mut Vec<(String, String)>, key: &str, value: &str, what: &str) {
    match list.iter().find(|(k, _)| k == key) {
        Some((_, old)) if old != value => {
            tracing::warn!(
                key,
                what,
                "device plugins set conflicting values; the first is kept"
            );
        }
        Some(_) => {}
        None => list.push((key.to_string(), value.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::kubelet::devices::api::v1beta1 as api;

    fn answer(env: &[(&str, &str)], mount: &str, cdi: &str) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mounts: vec![api::Mount {
                container_path: mount.into(),
                host_path: format!("/host{mount}"),
                read_only: true,
            }],
            devices: vec![api::DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/x".into(),
                permissions: "rw".into(),
            }],
            annotations: HashMap::from([("a".to_string(), "1".to_string())]),
            cdi_devices: vec![api::CdiDevice { name: cdi.into() }],
        }
    }

    #[test]
    fn answers_merge_first_wins_and_apply_puts_device_settings_before_the_pods() {
        let merged = ContainerOptions::merge(&[
            answer(&[("K", "1"), ("L", "x")], "/m1", "v.com/c=1"),
            answer(&[("K", "2")], "/m1", "v.com/c=2"),
        ]);
        assert_eq!(
            merged.envs,
            vec![("K".into(), "1".into()), ("L".into(), "x".into())]
        );
        assert_eq!(merged.mounts.len(), 1, "the same container path once");
        assert!(merged.mounts[0].readonly);
        assert_eq!(merged.devices.len(), 1);
        assert_eq!(merged.cdi_devices, vec!["v.com/c=1", "v.com/c=2"]);

        let mut config = ContainerConfig {
            envs: vec![KeyValue {
                key: "K".into(),
                value: "pod".into(),
            }],
            mounts: vec![Mount {
                container_path: "/vol".into(),
                ..Default::default()
            }],
            annotations: HashMap::from([("a".to_string(), "kubelet".to_string())]),
            ..Default::default()
        };
        merged.apply(&mut config);
        let keys: Vec<_> = config
            .envs
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            keys,
            vec![("K", "1"), ("L", "x"), ("K", "pod")],
            "the pod's own value comes last and wins"
        );
        let paths: Vec<_> = config
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(paths, vec!["/m1", "/vol"]);
        assert_eq!(
            config.annotations["a"], "kubelet",
            "the kubelet's own annotation is kept"
        );
        assert_eq!(config.cdi_devices.len(), 2);
        assert_eq!(config.devices[0].permissions, "rw");
    }
}
