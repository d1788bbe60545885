//! The node itself: the container runtime, reached and ready before anything else starts; the
//! machine's facts and the pod cgroups, which a node that cannot hold pods fails on before it
//! answers as healthy; and what the executor knows of the node.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::plan::{Plan, PodCgroups};
use super::{Agent, CGROUP_MOUNT, DaemonError, RUNTIME_READY_TIMEOUT};
use crate::clients::cri::{self, CriClient};
use crate::config::Config;
use crate::kubelet::cm::{CgroupManager, ContainerSettings};
use crate::kubelet::node::allocatable::Amounts;
use crate::kubelet::runtime::executor::NodeContext;
use crate::kubelet::runtime::translate::{HostDns, parse_resolv_conf};
use crate::kubelet::userns::UsernsManager;

/// Connects to the runtime and waits until it reports RuntimeReady and NetworkReady: a
/// runtime that is not there stops the agent with a clear error before it serves anything.
pub(super) async fn connect_runtime(
    config: &Config,
    plan: &Plan,
) -> Result<CriClient, DaemonError> {
    let endpoint = cri::parse_endpoint(&config.container_runtime_endpoint)?;
    if let Some(image_ep) = &plan.ignored_image_endpoint {
        tracing::warn!(%image_ep, "a separate image service endpoint is not supported yet; using the runtime endpoint for images");
    }
    let client = CriClient::connect(&endpoint, config.runtime_request_timeout).await?;
    cri::handshake(&client, &endpoint.original, RUNTIME_READY_TIMEOUT).await?;
    Ok(client)
}

/// What the machine is, read once at start, and the pod cgroups made from it.
pub(super) struct NodeFacts {
    pub host_ip: Option<IpAddr>,
    pub memory_bytes: u64,
    /// Capacity less what the node holds back: for admission and the downward API.
    pub allocatable: Amounts,
    /// With [`PodCgroups::Managed`]: the manager of `kubepods` and the QoS cgroups.
    pub cgroups: Option<Arc<CgroupManager>>,
    /// What translating a container's resources needs of the cgroups.
    pub container_settings: ContainerSettings,
    /// The pods' user namespaces over the node's ID range, with the mappings read back.
    pub userns: Arc<UsernsManager>,
}

impl NodeFacts {
    /// Reads the host IP and the machine, and sets up the pod cgroups as `pod_cgroups` says.
    pub(super) fn read(config: &Config, pod_cgroups: PodCgroups) -> Result<NodeFacts, DaemonError> {
        use crate::kubelet::node::{self, allocatable};
        let host_ip = node::detect_host_ip(config.node_ip);
        let machine = node::MachineFacts::read(&config.root_dir);
        let capacity = allocatable::capacity(&machine, config.max_pods);
        let allocatable = allocatable::allocatable(&capacity, &config.reservations);
        let (cgroups, container_settings) = super::cgroups::setup(config, pod_cgroups, &capacity)?;
        let userns = UsernsManager::for_node(&config.root_dir, config.max_pods)
            .map_err(|e| DaemonError::Userns(Box::new(e)))?;
        let range = userns.range();
        tracing::info!(
            first_id = range.first,
            ids = range.len,
            "user namespace ID range"
        );
        Ok(NodeFacts {
            userns: Arc::new(userns),
            host_ip,
            memory_bytes: machine.memory_bytes,
            allocatable,
            cgroups,
            container_settings,
        })
    }
}

/// What the executor knows of the node: names, directories, DNS, cgroups, allocatable. Says
/// which facts it found, and warns when pods will get no cluster DNS.
pub(super) fn context(agent: &Agent, facts: &NodeFacts) -> Arc<NodeContext> {
    let config = &agent.config;
    let node = Arc::new(NodeContext {
        node_name: config.node_name.clone(),
        host_ip: facts.host_ip.map(|ip| ip.to_string()),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        host_dns: host_dns(config),
        cluster_domain: config.cluster_domain.clone(),
        cluster_dns: config.cluster_dns.iter().map(ToString::to_string).collect(),
        cgroup_driver: config.cgroup_driver,
        cgroup_root: config.cgroup_root.clone(),
        cgroups_per_qos: config.cgroups_per_qos,
        cgroup_fs: PathBuf::from(CGROUP_MOUNT),
        node_memory_bytes: facts.memory_bytes,
        allocatable: facts.allocatable.for_downward_api(),
        runtime_request_timeout: config.runtime_request_timeout,
        image_pull_progress_deadline: config.image_pull_progress_deadline,
        seccomp_default: config.hardening.seccomp_default,
        mounter: Arc::new(crate::kubelet::volume::mounter::KernelMounter),
        node_labels: crate::kubelet::node::registration::node_labels(
            &config.node_name,
            &config.cluster,
        ),
        userns: Some(facts.userns.clone()),
        devices: Some(agent.devices.clone()),
        dra: Some(agent.dra.clone()),
    });
    tracing::info!(host_ip = ?facts.host_ip, node = %config.node_name, "node facts");
    if agent.plan.cluster_dns_missing {
        tracing::warn!(
            "no clusterDNS is configured: pods with dnsPolicy \"ClusterFirst\" get the node's DNS settings (upstream's \"Default\")"
        );
    }
    node
}

/// The node's resolver settings for pods with `dnsPolicy: Default`: from `resolvConf`, or
/// none when it is empty or cannot be read (a warning).
fn host_dns(config: &Config) -> HostDns {
    if config.resolv_conf.as_os_str().is_empty() {
        return HostDns::default();
    }
    match std::fs::read_to_string(&config.resolv_conf) {
        Ok(text) => parse_resolv_conf(&text),
        Err(err) => {
            tracing::warn!(path = %config.resolv_conf.display(), error = %err, "cannot read resolvConf; pods get no DNS servers from the node");
            HostDns::default()
        }
    }
}
