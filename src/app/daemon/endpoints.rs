//! The HTTP endpoints: healthz and the read-only port, the local socket `deckhand pods` reads,
//! and the node API with its serving certificate. They start before the pods' parts, so the
//! node answers (as not yet synced) while it adopts its pods.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::cluster::ApiClients;
use super::plan::{NodeApiPlan, ServingCert};
use super::{Agent, CGROUP_MOUNT, DaemonError};
use crate::config::Config;
use crate::endpoints::node_api::{self, NodeApiError, ServingSlot};
use crate::endpoints::read_only;
use crate::kubelet::cm::CgroupManager;
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::stats::{self, StatsProvider};

/// One stats provider for both ports, so both see the same rates and kept volume figures.
pub(super) fn stats_provider(
    agent: &Agent,
    cgroups: Option<&Arc<CgroupManager>>,
) -> Arc<StatsProvider> {
    let config = &agent.config;
    let pod_cgroups = cgroups.map(|m| stats::host::PodCgroups {
        mount: PathBuf::from(CGROUP_MOUNT),
        kubepods: m.kubepods(),
        v2: m.version() == crate::kubelet::cm::CgroupVersion::V2,
    });
    let host = stats::HostFiles::new(
        config.root_dir.clone(),
        config.pod_logs_dir.clone(),
        pod_cgroups,
        config.volume_stats_agg_period,
    );
    // The CSI volumes' NodeGetVolumeStats, on the same period; scrapes read what it kept.
    let (root, period, cancel) = (
        config.root_dir.clone(),
        config.volume_stats_agg_period,
        agent.cancel.clone(),
    );
    agent.tasks.spawn("csi-volume-stats", move || {
        let (root, cancel) = (root.clone(), cancel.clone());
        crate::kubelet::volume::csi::stats::run(root, period, cancel)
    });
    Arc::new(
        StatsProvider::new(
            Arc::new(agent.cri.clone()),
            Arc::new(host),
            config.node_name.clone(),
        )
        .with_sandboxes(Arc::new(stats::CriSandboxInspector::new(
            agent.cri.channel(),
            config.runtime_request_timeout,
        ))),
    )
}

/// Healthz and the read-only port when the plan has them, then the local socket, whose
/// failure is only a warning: `deckhand pods` needs it, the node runs its pods without it.
pub(super) async fn serve_local(
    agent: &Agent,
    stats: &Arc<StatsProvider>,
) -> Result<Vec<JoinHandle<()>>, DaemonError> {
    let (health, states, metrics, cancel) =
        (&agent.health, &agent.states, &agent.metrics, &agent.cancel);
    let mut servers = Vec::new();
    if let Some(addr) = agent.plan.healthz {
        servers.push(
            read_only::serve_healthz(addr, health.clone(), states.clone(), cancel.clone()).await?,
        );
    }
    if let Some(addr) = agent.plan.read_only {
        servers.push(
            read_only::serve_read_only(
                addr,
                health.clone(),
                states.clone(),
                metrics.clone(),
                Some(stats.clone()),
                read_only::ListenerLimits::default(),
                cancel.clone(),
            )
            .await?,
        );
    }
    match read_only::serve_local_socket(
        &agent.plan.local_socket,
        health.clone(),
        states.clone(),
        metrics.clone(),
        Some(stats.clone()),
        cancel.clone(),
    )
    .await
    {
        Ok(handle) => servers.push(handle),
        Err(err) => tracing::warn!("{err}; `deckhand pods` will not reach this agent"),
    }
    Ok(servers)
}

/// The node API: authentication and authorization (reviews by the API server when there is
/// one), pods, logs, exec and attach, stats, metrics and configz, on TLS.
pub(super) async fn serve_node_api(
    agent: &Agent,
    plan: &NodeApiPlan,
    host_ip: Option<IpAddr>,
    runtime_cache: &RuntimeCache,
    stats: &Arc<StatsProvider>,
) -> Result<JoinHandle<()>, DaemonError> {
    let config = &agent.config;
    let reviewer = agent.api.as_ref().map(ApiClients::reviewer);
    let state = node_api::NodeApiState {
        gate: Arc::new(node_api::auth::Gate::new(
            config.server.clone(),
            config.node_name.clone(),
            reviewer,
        )),
        health: agent.health.clone(),
        pods: agent.states.clone(),
        runtime: runtime_cache.clone(),
        streams: Arc::new(agent.cri.clone()),
        metrics: agent.metrics.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        node_log_dir: PathBuf::from(node_api::node_logs::NODE_LOG_DIR),
        configz: Arc::new(
            serde_json::to_vec(&node_api::configz::configz(config)).unwrap_or_default(),
        ),
        stats: stats.clone(),
        debug: node_api::handlers::DebugHandlers::from_config(&config.hardening),
    };
    let slot = serving_certificate(config, plan, host_ip, agent.api.as_ref(), &agent.cancel)?;
    let server = node_api::serve(
        plan.addr,
        state,
        slot,
        &config.server,
        read_only::ListenerLimits {
            streaming_idle_timeout: config.server.streaming_idle_timeout,
            ..Default::default()
        },
        agent.cancel.clone(),
    )
    .await?;
    Ok(server)
}

/// The node API's serving certificate, as the plan says: requested by CSR (the slot stays
/// empty, and handshakes fail, until the CSR is approved and signed), else the configured
/// files, else a self-signed one in the cert dir.
fn serving_certificate(
    config: &Config,
    plan: &NodeApiPlan,
    host_ip: Option<IpAddr>,
    api: Option<&ApiClients>,
    cancel: &CancellationToken,
) -> Result<ServingSlot, NodeApiError> {
    use node_api::tls;
    if plan.tls_bootstrap_unavailable {
        tracing::warn!(
            "serverTLSBootstrap needs --kubeconfig; using a self-signed serving certificate"
        );
    }
    let credentials = match (&plan.serving, api) {
        (ServingCert::Csr, Some(api)) => {
            return Ok(start_serving_rotation(config, host_ip, api, cancel));
        }
        (ServingCert::Files { cert, key }, _) => tls::load_pair(cert, key)?,
        (ServingCert::SelfSigned { cert, key }, _) => {
            tls::self_signed(cert, key, &config.node_name, &host_addrs(host_ip))?
        }
        // The plan asks for a CSR only with a kubeconfig, and so with clients.
        (ServingCert::Csr, None) => {
            let (cert, key) = crate::config::ServerSettings::self_signed_paths(&config.cert_dir);
            tls::self_signed(&cert, &key, &config.node_name, &host_addrs(host_ip))?
        }
    };
    Ok(ServingSlot::with(credentials))
}

fn host_addrs(host_ip: Option<IpAddr>) -> Vec<IpAddr> {
    host_ip.into_iter().collect()
}

/// Starts the loop that requests the serving certificate by CSR and renews it; its slot is
/// empty until the first certificate is signed.
fn start_serving_rotation(
    config: &Config,
    host_ip: Option<IpAddr>,
    api: &ApiClients,
    cancel: &CancellationToken,
) -> ServingSlot {
    use crate::kubelet::certificate::{self, serving};
    let slot = ServingSlot::default();
    let manager = serving::ServingRotation {
        api: certificate::csr::KubeCsrApi(api.general.clone()),
        slot: slot.clone(),
        store: certificate::FileStore::serving(&config.cert_dir),
        node_name: config.node_name.clone(),
        addresses: serving::node_addresses(&config.node_name, host_ip),
    };
    tokio::spawn(manager.run(cancel.clone()));
    slot
}
