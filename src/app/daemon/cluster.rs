//! The agent's side of the cluster, with a kubeconfig: the API server clients (after TLS
//! bootstrap, with client certificate rotation), the event sink, and the Node's registration,
//! status and Lease. None of it touches pods: what the API server does or fails to do never
//! stops one.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio_util::sync::CancellationToken;

use super::plan::ClusterPlan;
use super::{Agent, DaemonError, HEARTBEAT_TIMEOUT, Tuning, WATCH_READ_TIMEOUT};
use crate::base::supervisor::Supervisor;
use crate::clients::apiserver::{self, ClientOptions, ConnectError};
use crate::config::{ClusterSettings, Config};
use crate::endpoints::node_api::review::{KubeReviewer, Reviewer};
use crate::kubelet::certificate::{self, CertSlot, FileStore};
use crate::kubelet::events::{self, Recorder};
use crate::kubelet::node::api::KubeNodeApi;
use crate::kubelet::shutdown::ShutdownStatus;

/// The API server clients, one per kind of request, each with its own time-outs and rate
/// limit (its own token bucket), so one kind never waits behind another: a slow watch, a
/// burst of events or a flood of reviews never holds up a heartbeat.
pub(super) struct ClientSet<T> {
    /// The node's heartbeats: registration, Node status and Lease renewals. Upstream's
    /// kubelet, too, gives them a client of their own ("heartbeat client"); it turns that
    /// client's rate limit off, Deckhand gives it its own `kubeAPIQPS` bucket, which the
    /// heartbeats at rest (a fraction of a request per second) never empty, and which still
    /// stops a loop on an error from flooding the API server.
    pub heartbeat: T,
    /// Pod status, mirror pods, CSRs and the objects pods use (short time-outs).
    pub general: T,
    /// The node API's TokenReviews and SubjectAccessReviews. Anyone who can reach the port
    /// can make the node ask one (a made-up bearer token is enough), so they spend only
    /// their own `kubeAPIQPS` bucket, behind the node API's bounded queues.
    pub reviews: T,
    /// Watches: pods bound to the node, the Node itself, the objects pods use.
    pub watch: T,
    /// Events, at `eventRecordQPS`.
    pub events: T,
}

pub(super) type ApiClients = ClientSet<kube::Client>;

/// Client certificate rotation, started with the other supervised tasks.
pub(super) type Rotation = certificate::manager::Rotation<certificate::csr::KubeCsrApi>;

/// Each client's time-outs and rate limit (pure).
pub(super) fn client_options(
    cluster: &ClusterSettings,
    plan: &ClusterPlan,
) -> ClientSet<ClientOptions> {
    let short = ClientOptions {
        qps: cluster.kube_api_qps,
        burst: cluster.kube_api_burst,
        timeout: HEARTBEAT_TIMEOUT,
        read_timeout: HEARTBEAT_TIMEOUT,
    };
    ClientSet {
        heartbeat: short.clone(),
        general: short.clone(),
        reviews: short.clone(),
        watch: ClientOptions {
            read_timeout: WATCH_READ_TIMEOUT,
            ..short.clone()
        },
        events: ClientOptions {
            qps: plan.events_qps,
            burst: cluster.event_burst,
            ..short
        },
    }
}

impl ApiClients {
    /// The node agent's calls (registration, status, Lease): on the heartbeat client.
    pub(super) fn node_api(&self) -> KubeNodeApi {
        KubeNodeApi::new(self.heartbeat.clone())
    }

    /// The node API's reviews: on the reviews client.
    pub(super) fn reviewer(&self) -> Arc<dyn Reviewer> {
        KubeReviewer::shared(self.reviews.clone())
    }
}

/// Connects the clients; returns them and, with certificate rotation, the rotation loop to
/// start. With `--bootstrap-kubeconfig`, a missing or unusable
/// kubeconfig is first replaced by one naming a certificate requested by CSR; with
/// `rotateCertificates`, the clients share a certificate slot that a rotation loop renews.
pub(super) async fn connect(
    config: &Config,
    plan: &ClusterPlan,
    tuning: &Tuning,
    cancel: &CancellationToken,
) -> Result<(ApiClients, Option<Rotation>), DaemonError> {
    let options = client_options(&config.cluster, plan);
    let store = FileStore::new(&config.cert_dir);
    if let Some(bootstrap) = &plan.bootstrap_kubeconfig {
        certificate::bootstrap::load_client_cert(
            &plan.kubeconfig,
            bootstrap,
            &store,
            &config.node_name,
            cancel,
        )
        .await?;
    }
    let slot = rotation_slot(config, plan, &store);
    let path = plan.kubeconfig.as_path();
    let slot_ref = slot.as_ref();
    let clients = ApiClients {
        heartbeat: connect_one(path, &options.heartbeat, slot_ref).await?,
        general: connect_one(path, &options.general, slot_ref).await?,
        reviews: connect_one(path, &options.reviews, slot_ref).await?,
        watch: connect_one(path, &options.watch, slot_ref).await?,
        events: connect_one(path, &options.events, slot_ref).await?,
    };
    let rotation = slot.map(|slot| certificate::manager::Rotation {
        api: certificate::csr::KubeCsrApi(clients.general.clone()),
        slot,
        store,
        node_name: config.node_name.clone(),
        rotate_after: tuning.cert_rotate_after,
    });
    Ok((clients, rotation))
}

/// With rotation, the slot every client presents the certificate of, holding the current
/// client certificate; none (and a warning) when the cert dir has no current certificate.
fn rotation_slot(config: &Config, plan: &ClusterPlan, store: &FileStore) -> Option<CertSlot> {
    if !plan.rotate_certificates {
        return None;
    }
    let current = certificate::bootstrap::current_credentials(store);
    if current.is_none() {
        tracing::warn!(cert_dir = %config.cert_dir.display(), "rotateCertificates is on, but the cert dir holds no current client certificate (kubelet-client-current.pem); not rotating");
    }
    current.map(CertSlot::new)
}

/// One client: presenting the slot's certificate when rotating, else the kubeconfig's.
async fn connect_one(
    path: &Path,
    options: &ClientOptions,
    slot: Option<&CertSlot>,
) -> Result<kube::Client, ConnectError> {
    match slot {
        Some(slot) => apiserver::connect_rotating(path, options, slot.resolver()).await,
        None => apiserver::connect(path, options).await,
    }
}

/// The event recorder: events are logged always, and with a kubeconfig also written to the
/// API server by a sink task (the first supervised task).
pub(super) fn events(
    node_name: &str,
    api: Option<&ApiClients>,
    tasks: &Supervisor,
    cancel: &CancellationToken,
) -> Recorder {
    match api {
        Some(api) => {
            let (recorder, queue) = Recorder::to_api(node_name);
            let queue = Arc::new(tokio::sync::Mutex::new(queue));
            let (client, stats, cancel) = (api.events.clone(), recorder.stats(), cancel.clone());
            tasks.spawn("event-sink", move || {
                let sink = events::sink::KubeEventSink::new(client.clone());
                let (queue, stats, cancel) = (queue.clone(), stats.clone(), cancel.clone());
                async move {
                    let mut queue = queue.lock().await;
                    events::sink::run(sink, &mut queue, stats, cancel).await
                }
            });
            recorder
        }
        None => Recorder::log_only(node_name),
    }
}

/// Starts client certificate rotation, when there is one to do.
pub(super) fn start_rotation(agent: &Agent, rotation: Option<Rotation>) {
    let Some(rotation) = rotation else {
        return;
    };
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("cert-rotation", move || {
        rotation.clone().run(cancel.clone())
    });
}

/// Registers the Node and keeps its status and Lease current; watches the Node, so admission
/// sees label and taint changes at once (`published` feeds admission's view of the Node).
/// This talks to the API server only; pods are untouched by anything it does or fails to do.
pub(super) fn start_membership(
    agent: &Agent,
    api: &ApiClients,
    published: tokio::sync::watch::Sender<Option<Arc<Node>>>,
    pressure: &crate::kubelet::eviction::PressureView,
    shutdown: &ShutdownStatus,
) {
    use crate::kubelet::node::{agent as node_agent, watch as node_watch};
    let config = &agent.config;
    let (client, name, publisher) = (
        api.watch.clone(),
        config.node_name.clone(),
        node_agent::NodePublisher::to(published.clone()),
    );
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("node-watch", move || {
        node_watch::run(
            client.clone(),
            name.clone(),
            publisher.clone(),
            cancel.clone(),
        )
    });
    let snapshots = node_agent::LiveSnapshots {
        cri: agent.cri.clone(),
        health: agent.health.clone(),
        node_name: config.node_name.clone(),
        node_ip: config.node_ip,
        root_dir: config.root_dir.clone(),
        max_pods: config.max_pods,
        max_images: config.cluster.node_status_max_images,
        reservations: config.reservations.clone(),
        kubelet_port: config.port,
        pressure: pressure.clone(),
        shutdown: shutdown.clone(),
        devices: Some(agent.devices.clone()),
        devices_seen: Default::default(),
    };
    let settings = node_agent::AgentSettings {
        node_name: config.node_name.clone(),
        cluster: config.cluster.clone(),
        status_update_frequency: config.node_status_update_frequency,
        published: node_agent::NodePublisher::to(published),
    };
    let (client, events, cancel) = (api.node_api(), agent.events.clone(), agent.cancel.clone());
    // Registration, node status and the Lease: one task, restarted as a whole.
    agent.tasks.spawn("node-status", move || {
        node_agent::run(
            client.clone(),
            snapshots.clone(),
            settings.clone(),
            apiserver::ProblemLog::default(),
            events.clone(),
            cancel.clone(),
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Rule};
    use crate::clients::apiserver::rate_limit::{RateLimitLayer, TokenBucket};
    use crate::config::ServerSettings;
    use crate::endpoints::node_api::auth::Gate;
    use crate::kubelet::node::api::NodeApi;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;
    use tokio::time::Instant;

    /// A kube client on the fake API server, behind the rate limit `options` asks for (the
    /// layer `connect` puts in front of a real one); TokenReviews take 20 ms to answer
    /// (the fake's answer: not authenticated).
    fn fake_client(fake: &FakeApiServer, options: &ClientOptions) -> kube::Client {
        let to_fake = fake.client();
        let server = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let to_fake = to_fake.clone();
            async move {
                if req.uri().path().ends_with("/tokenreviews") {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                to_fake.send(req).await
            }
        });
        let bucket = TokenBucket::new(options.qps, options.burst);
        let limited = tower::Layer::layer(&RateLimitLayer::new(bucket), server);
        kube::Client::new(limited, "default")
    }

    /// The five clients, each with its own rate limit, on one fake API server.
    fn fake_clients(fake: &FakeApiServer, options: &ClientSet<ClientOptions>) -> ApiClients {
        ApiClients {
            heartbeat: fake_client(fake, &options.heartbeat),
            general: fake_client(fake, &options.general),
            reviews: fake_client(fake, &options.reviews),
            watch: fake_client(fake, &options.watch),
            events: fake_client(fake, &options.events),
        }
    }

    /// Two thousand made-up bearer tokens at the node API at once (each would be a
    /// TokenReview): the Lease renewals that follow are sent at once, every one, and the
    /// flood's requests are all answered (401).
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_reviews_never_delays_the_lease() {
        let plan = ClusterPlan {
            kubeconfig: "/etc/kubernetes/kubelet.conf".into(),
            bootstrap_kubeconfig: None,
            rotate_certificates: false,
            events_qps: -1.0,
        };
        let fake = FakeApiServer::new();
        let api = fake_clients(&fake, &client_options(&ClusterSettings::default(), &plan));
        let gate = Arc::new(Gate::new(
            ServerSettings::default(),
            "n1".into(),
            Some(api.reviewer()),
        ));
        let mut flood = tokio::task::JoinSet::new();
        for i in 0..2000 {
            let gate = gate.clone();
            flood.spawn(async move {
                let header = format!("Bearer made-up-{i}");
                gate.authenticate(None, Some(&header)).await
            });
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let leases = api.node_api();
        let mut lease = fake.apply(&Lease {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("kube-node-lease".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        for renewal in 0..5 {
            let start = Instant::now();
            lease = leases.replace_lease(&lease).await.unwrap();
            assert_eq!(
                start.elapsed(),
                Duration::ZERO,
                "renewal {renewal} waited behind the reviews"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        while let Some(answer) = flood.join_next().await {
            assert_eq!(answer.unwrap(), None);
        }
        let renewals = Rule::new("update", "leases").named("n1");
        assert_eq!(fake.count(&renewals), 5);
    }
}
