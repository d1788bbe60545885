//! Service environment variables, as upstream's `getServiceEnvVarMap` and `envvars.FromServices`:
//! every container of a pod gets `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (and one per named
//! port) and the Docker-link variables (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>` …) of each
//! Service with a cluster IP in the pod's namespace when `enableServiceLinks` is true (the
//! default), and of the master service `kubernetes` in `default` always.
//!
//! The Services come from one watch of all Services (the Node authorizer lets a node list and
//! watch them), through the one watch machinery [`crate::clients::apiserver::watch`], into a
//! [`ServiceView`]. As upstream, a pod from the API server waits (its container in
//! `CreateContainerConfigError`) until the Services have been listed once; a static pod does not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::reflector::{Store, store::Writer};
use tokio_util::sync::CancellationToken;

use crate::clients::apiserver::ProblemLog;
use crate::clients::apiserver::watch::{self as api_watch, Watch};

/// The names of the master services, in `default`, whose variables every pod gets.
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// The first wait after a failed list or watch.
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// What the node knows of the cluster's Services. Cheap to clone; clones share it.
#[derive(Clone)]
pub(crate) struct ServiceView {
    store: Store<Service>,
    writer: Arc<std::sync::Mutex<Writer<Service>>>,
    listed: Arc<AtomicBool>,
}

impl Default for ServiceView {
    fn default() -> Self {
        let writer = Writer::<Service>::default();
        ServiceView {
            store: writer.as_reader(),
            writer: Arc::new(std::sync::Mutex::new(writer)),
            listed: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl ServiceView {
    /// Applies a batch of the watch's events.
    pub(crate) fn apply(&self, events: &[api_watch::Event<Service>]) {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            writer.apply_watcher_event(event);
            if matches!(event, api_watch::Event::InitDone) {
                self.listed.store(true, Ordering::Release);
            }
        }
    }

    /// The service variables of `pod`, or `None` while the Services have not been listed once
    /// and the pod comes from the API server (upstream refuses to build its environment then).
    pub(crate) fn env_for(&self, pod: &Pod) -> Option<BTreeMap<String, String>> {
        if !crate::base::podspec::origin::is_static(pod) && !self.listed.load(Ordering::Acquire) {
            return None;
        }
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let namespace = crate::base::podspec::pod::namespace(pod);
        let services = self.store.state();
        Some(service_env(services.iter().map(|s| &**s), namespace, links))
    }
}

/// Watches every Service into `view` until `cancel`.
pub(crate) async fn watch(view: ServiceView, client: kube::Client, cancel: CancellationToken) {
    let api: Api<Service> = Api::all(client);
    let mut watch = Watch::new(
        api_watch::events(api, api_watch::Config::default()),
        FIRST_RETRY,
        "watching services",
        ProblemLog::default(),
    );
    while let Some(batch) = watch.next_batch(&cancel).await {
        view.apply(&batch);
    }
}

/// The variables of the Services a pod in `namespace` sees (pure): those of `namespace` when
/// `links`, and the master services of `default` always (the namespace's own Service of the
/// same name wins over a master service). Services without a cluster IP (headless, or
/// `ExternalName`) give none.
pub(crate) fn service_env<'a>(
    services: impl Iterator<Item = &'a Service>,
    namespace: &str,
    links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services {
        let Some(name) = service.metadata.name.as_deref() else {
            continue;
        };
        if cluster_ip(service).is_none() {
            continue;
        }
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(service);
        } else if ns == namespace && links {
            chosen.insert(name, service);
        }
    }
    let mut env = BTreeMap::new();
    for service in chosen.values() {
        add_service_vars(&mut env, service);
    }
    env
}

/// The cluster IP, unless the Service has none (`None` or empty).
fn cluster_ip(service: &Service) -> Option<&str> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// A Service name as a variable name: upper case, `-` as `_`.
fn var_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// One Service's variables: host, first port, named ports, and the Docker-link set.
fn add_service_vars(env: &mut BTreeMap<String, String>, service: &Service) {
    let (Some(ip), Some(name)) = (cluster_ip(service), service.metadata.name.as_deref()) else {
        return;
    };
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let prefix = var_name(name);
    env.insert(format!("{prefix}_SERVICE_HOST"), ip.to_string());
    let Some(first) = ports.first() else {
        return;
    };
    env.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for port in ports {
        if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            env.insert(
                format!("{prefix}_SERVICE_PORT_{}", var_name(port_name)),
                port.port.to_string(),
            );
        }
    }
    let host = |port: i32| match ip.contains(':') {
        true => format!("[{ip}]:{port}"),
        false => format!("{ip}:{port}"),
    };
    for (i, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        let (lower, upper) = (protocol.to_lowercase(), protocol.to_uppercase());
        let url = format!("{lower}://{}", host(port.port));
        if i == 0 {
            env.insert(format!("{prefix}_PORT"), url.clone());
        }
        let p = format!("{prefix}_PORT_{}_{upper}", port.port);
        env.insert(format!("{p}_PROTO"), lower);
        env.insert(format!("{p}_PORT"), port.port.to_string());
        env.insert(format!("{p}_ADDR"), ip.to_string());
        env.insert(p, url);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service(
        ns: &str,
        name: &str,
        ip: &str,
        ports: &[(Option<&str>, i32, Option<&str>)],
    ) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(name, port, protocol)| ServicePort {
                            name: name.map(str::to_string),
                            port: *port,
                            protocol: protocol.map(str::to_string),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_variables_of_one_service_are_upstreams() {
        let s = service(
            "shop",
            "fooservice",
            "10.0.0.11",
            &[
                (Some("http"), 8765, Some("TCP")),
                (Some("dns-udp"), 53, Some("UDP")),
            ],
        );
        assert_eq!(
            service_env([&s].into_iter(), "shop", true),
            vars(&[
                ("FOOSERVICE_SERVICE_HOST", "10.0.0.11"),
                ("FOOSERVICE_SERVICE_PORT", "8765"),
                ("FOOSERVICE_SERVICE_PORT_HTTP", "8765"),
                ("FOOSERVICE_SERVICE_PORT_DNS_UDP", "53"),
                ("FOOSERVICE_PORT", "tcp://10.0.0.11:8765"),
                ("FOOSERVICE_PORT_8765_TCP", "tcp://10.0.0.11:8765"),
                ("FOOSERVICE_PORT_8765_TCP_PROTO", "tcp"),
                ("FOOSERVICE_PORT_8765_TCP_PORT", "8765"),
                ("FOOSERVICE_PORT_8765_TCP_ADDR", "10.0.0.11"),
                ("FOOSERVICE_PORT_53_UDP", "udp://10.0.0.11:53"),
                ("FOOSERVICE_PORT_53_UDP_PROTO", "udp"),
                ("FOOSERVICE_PORT_53_UDP_PORT", "53"),
                ("FOOSERVICE_PORT_53_UDP_ADDR", "10.0.0.11"),
            ])
        );
    }

    #[test]
    fn which_services_a_pod_sees() {
        let all = [
            service(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, None)],
            ),
            service("default", "other", "10.0.0.2", &[(None, 80, None)]),
            service("shop", "my-svc", "10.0.0.3", &[(None, 8080, None)]),
            service("shop", "headless", "None", &[(None, 80, None)]),
            service("shop", "external", "", &[(None, 80, None)]),
            service("elsewhere", "far", "10.0.0.4", &[(None, 80, None)]),
        ];
        let names = |links: bool, ns: &str| -> Vec<String> {
            service_env(all.iter(), ns, links)
                .into_keys()
                .filter(|k| k.ends_with("_SERVICE_HOST"))
                .collect()
        };
        assert_eq!(
            names(true, "shop"),
            ["KUBERNETES_SERVICE_HOST", "MY_SVC_SERVICE_HOST"]
        );
        assert_eq!(names(false, "shop"), ["KUBERNETES_SERVICE_HOST"]);
        assert_eq!(
            names(true, "default"),
            ["KUBERNETES_SERVICE_HOST", "OTHER_SERVICE_HOST"]
        );
        let ipv6 = service("shop", "v6", "fd00::5", &[(None, 80, None)]);
        assert_eq!(
            service_env([&ipv6].into_iter(), "shop", true)["V6_PORT"],
            "tcp://[fd00::5]:80"
        );
    }

    #[test]
    fn a_pod_from_the_api_server_waits_for_the_first_list() {
        let view = ServiceView::default();
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.annotations = Some(
            [(
                crate::base::podspec::origin::CONFIG_SOURCE_ANNOTATION.to_string(),
                "api".to_string(),
            )]
            .into(),
        );
        assert_eq!(view.env_for(&pod), None);
        let k = service(
            "default",
            "kubernetes",
            "10.0.0.1",
            &[(Some("https"), 443, None)],
        );
        view.apply(&[
            api_watch::Event::Init,
            api_watch::Event::InitApply(k),
            api_watch::Event::InitDone,
        ]);
        let env = view.env_for(&pod).expect("listed");
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.0.0.1");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://10.0.0.1:443");
    }
}
