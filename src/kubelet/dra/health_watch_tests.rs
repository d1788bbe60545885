use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::proto::dra_resource_health_server::{DraResourceHealth, DraResourceHealthServer};
use super::*;
use crate::kubelet::dra::tests::{DRIVER, by_name, claim, pod, setup, wait_for};

type Sent = Result<proto::NodeWatchResourcesResponse, tonic::Status>;

/// A driver's health service (`v1alpha1` only): each stream opened is a channel the test
/// sends reports into.
#[derive(Clone, Default)]
struct FakeHealth {
    streams: Arc<Mutex<Vec<mpsc::Sender<Sent>>>>,
}

impl FakeHealth {
    fn opened(&self) -> usize {
        self.streams.lock().unwrap().len()
    }

    async fn send(&self, device: &str, health: i32) {
        let sender = self
            .streams
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a stream is open");
        let report = proto::DeviceHealth {
            device: Some(proto::DeviceIdentifier {
                pool_name: "node".into(),
                device_name: device.into(),
            }),
            health,
            last_updated_time: 0,
            health_check_timeout_seconds: 600,
            message: String::new(),
        };
        let answer = proto::NodeWatchResourcesResponse {
            devices: vec![report],
        };
        sender.send(Ok(answer)).await.expect("the stream is read");
    }

    /// Ends every open stream.
    fn close(&self) {
        self.streams.lock().unwrap().clear();
    }
}

#[tonic::async_trait]
impl DraResourceHealth for FakeHealth {
    type NodeWatchResourcesStream = tokio_stream::wrappers::ReceiverStream<Sent>;

    async fn node_watch_resources(
        &self,
        _request: tonic::Request<proto::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        self.streams.lock().unwrap().push(tx);
        Ok(tonic::Response::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }
}

fn serve_health(health: &FakeHealth, socket: &std::path::Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let service = DraResourceHealthServer::new(health.clone());
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

/// The health of each resource in the container's status entries.
fn healths(manager: &DraManager, pod: &Pod) -> Vec<(String, String, String)> {
    let container = &pod.spec.as_ref().unwrap().containers[0];
    manager
        .resources_status(pod, container)
        .into_iter()
        .flat_map(|s| {
            let name = s.name.clone();
            s.resources
                .into_iter()
                .flatten()
                .map(move |r| (name.clone(), r.resource_id, r.health.unwrap_or_default()))
        })
        .collect()
}

fn entry(health: &str) -> Vec<(String, String, String)> {
    vec![(
        "claim:gpu".to_string(),
        format!("{DRIVER}/test=cu1"),
        health.to_string(),
    )]
}

#[tokio::test]
async fn a_drivers_device_health_reaches_the_status_of_the_pods_holding_the_device() {
    let s = setup();
    let pokes = Pokes::default();
    s.manager.set_status_pokes(pokes.clone());
    s.api.apply(&claim("c1", "cu1", &["p1"]));
    let p = pod("a", "p1", by_name("c1"));
    assert!(
        healths(&s.manager, &p).is_empty(),
        "nothing before the claim is prepared"
    );
    s.manager.prepare(&p).await.unwrap();
    assert_eq!(healths(&s.manager, &p), entry("Unknown"), "no report yet");

    let health = FakeHealth::default();
    let socket = s.root.join("health.sock");
    let _server = serve_health(&health, &socket);
    s.manager.start_health_watch(
        DRIVER,
        socket.to_str().unwrap(),
        "v1alpha1.DRAResourceHealth",
    );
    wait_for("the stream to open", || health.opened() == 1).await;
    health.send("device-00", 1).await;
    wait_for("the pod to be poked", || pokes.pending() == 1).await;
    assert_eq!(pokes.take().await, vec!["p1".to_string()]);
    assert_eq!(healths(&s.manager, &p), entry("Healthy"));

    // A device no claim holds pokes nobody.
    health.send("device-99", 2).await;
    health.send("device-00", 2).await;
    wait_for("the unhealthy report", || {
        healths(&s.manager, &p) == entry("Unhealthy")
    })
    .await;
    assert_eq!(pokes.take().await, vec!["p1".to_string()]);

    // The stream ends: the devices read Unknown until the driver's next report.
    health.close();
    wait_for("the cleared health", || {
        healths(&s.manager, &p) == entry("Unknown")
    })
    .await;
    s.manager.stop_health_watch(DRIVER);
}

#[tokio::test]
async fn a_driver_that_does_not_implement_the_service_is_not_asked_again() {
    let s = setup();
    let health = FakeHealth::default();
    let socket = s.root.join("health.sock");
    let _server = serve_health(&health, &socket);
    // The fake serves v1alpha1 only: v1 is Unimplemented, and the watch ends by itself.
    let watch = s
        .manager
        .watch(DRIVER, socket.to_str().unwrap(), "v1.DRAResourceHealth");
    tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("the watch stops at Unimplemented");
    assert_eq!(health.opened(), 0);
}

#[test]
fn the_newest_health_service_both_speak_is_chosen() {
    let table: [(&[&str], Option<&str>); 4] = [
        (&["v1.DRAPlugin"], None),
        (
            &["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
            Some("v1alpha1.DRAResourceHealth"),
        ),
        (
            &["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"],
            Some("v1.DRAResourceHealth"),
        ),
        (&["v2.DRAResourceHealth"], None),
    ];
    for (services, want) in table {
        let services: Vec<String> = services.iter().map(|s| s.to_string()).collect();
        assert_eq!(pick_health_service(&services), want, "{services:?}");
    }
}
