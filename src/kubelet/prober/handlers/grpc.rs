//! `grpc` probes: `grpc.health.v1.Health/Check` over plain HTTP/2, one connection per run.
//! Only `SERVING` is a success; every other answer, a failed connection and a timeout are
//! failures.

use std::time::Duration;

use tonic::transport::Endpoint;

use crate::base::clock;
use crate::kubelet::prober::health_proto::HealthCheckRequest;
use crate::kubelet::prober::health_proto::health_check_response::ServingStatus;
use crate::kubelet::prober::health_proto::health_client::HealthClient;
use crate::kubelet::prober::{PROBE_USER_AGENT, ProbeOutcome};

use crate::clients::pod_http::join_host_port;

pub(crate) struct GrpcProbe {
    address: String,
    service: String,
    timeout: Duration,
}

impl GrpcProbe {
    pub(crate) fn new(host: String, port: u16, service: String, timeout: Duration) -> Self {
        GrpcProbe {
            address: join_host_port(&host, port),
            service,
            timeout,
        }
    }

    pub(crate) async fn run(&self) -> ProbeOutcome {
        let deadline = clock::instant() + self.timeout;
        let endpoint = match Endpoint::from_shared(format!("http://{}", self.address))
            .and_then(|e| e.user_agent(PROBE_USER_AGENT))
        {
            Ok(e) => e.connect_timeout(self.timeout).timeout(self.timeout),
            Err(err) => {
                return ProbeOutcome::Error(format!("bad gRPC address {}: {err}", self.address));
            }
        };
        let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(err)) => {
                return ProbeOutcome::Failure(format!(
                    "failed to connect to {} within {:?}: {}",
                    self.address,
                    self.timeout,
                    error_chain(&err)
                ));
            }
            Err(_) => {
                return ProbeOutcome::Failure(format!(
                    "failed to connect to {} within {:?}",
                    self.address, self.timeout
                ));
            }
        };
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: self.service.clone(),
        };
        let answer = match tokio::time::timeout_at(deadline, client.check(request)).await {
            Ok(Ok(resp)) => resp.into_inner(),
            Ok(Err(status)) => {
                return ProbeOutcome::Failure(match status.code() {
                    tonic::Code::Unimplemented => format!(
                        "{} does not implement the gRPC health protocol (grpc.health.v1.Health): {}",
                        self.address,
                        status.message()
                    ),
                    tonic::Code::DeadlineExceeded => {
                        format!(
                            "the health check did not complete within {:?}",
                            self.timeout
                        )
                    }
                    code => format!("the health check failed: {code:?}: {}", status.message()),
                });
            }
            Err(_) => {
                return ProbeOutcome::Failure(format!(
                    "the health check did not complete within {:?}",
                    self.timeout
                ));
            }
        };
        match ServingStatus::try_from(answer.status) {
            Ok(ServingStatus::Serving) => ProbeOutcome::Success,
            Ok(other) => ProbeOutcome::Failure(format!(
                "service unhealthy (responded with {:?})",
                other.as_str_name()
            )),
            Err(_) => ProbeOutcome::Failure(format!(
                "service unhealthy (responded with {})",
                answer.status
            )),
        }
    }
}

/// An error with its causes, for the message.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use tonic::{Request, Response, Status};

    use super::*;
    use crate::kubelet::prober::health_proto::HealthCheckResponse;
    use crate::kubelet::prober::health_proto::health_server::{Health, HealthServer};

    /// A health service with a fixed status per service name.
    #[derive(Clone, Default)]
    struct Statuses {
        by_service: HashMap<String, ServingStatus>,
        agents: Arc<Mutex<Vec<String>>>,
    }

    #[tonic::async_trait]
    impl Health for Statuses {
        async fn check(
            &self,
            req: Request<HealthCheckRequest>,
        ) -> Result<Response<HealthCheckResponse>, Status> {
            let agent = req
                .metadata()
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            self.agents.lock().unwrap().push(agent);
            match self.by_service.get(&req.get_ref().service) {
                Some(s) => Ok(Response::new(HealthCheckResponse { status: *s as i32 })),
                None => Err(Status::not_found("unknown service")),
            }
        }
    }

    async fn serve(svc: Statuses) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(HealthServer::new(svc))
                .serve_with_incoming(incoming),
        );
        port
    }

    fn probe(port: u16, service: &str) -> GrpcProbe {
        GrpcProbe::new(
            "127.0.0.1".into(),
            port,
            service.into(),
            Duration::from_secs(1),
        )
    }

    #[tokio::test]
    async fn serving_not_serving_unknown_service_and_closed_port() {
        let svc = Statuses {
            by_service: HashMap::from([
                (String::new(), ServingStatus::Serving),
                ("db".to_string(), ServingStatus::NotServing),
            ]),
            agents: Arc::default(),
        };
        let agents = svc.agents.clone();
        let port = serve(svc).await;
        assert_eq!(probe(port, "").run().await, ProbeOutcome::Success);
        assert_eq!(
            probe(port, "db").run().await,
            ProbeOutcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        match probe(port, "cache").run().await {
            ProbeOutcome::Failure(msg) => assert!(msg.contains("NotFound"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert!(
            agents.lock().unwrap()[0].starts_with("kube-probe/1.37"),
            "{:?}",
            agents.lock().unwrap()
        );

        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        match probe(closed, "").run().await {
            ProbeOutcome::Failure(msg) => assert!(msg.contains("failed to connect"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_without_the_health_service_fails() {
        // A gRPC server with no service at all: it answers Unimplemented.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_optional_service::<HealthServer<Statuses>>(None)
                .serve_with_incoming(incoming),
        );
        match probe(port, "").run().await {
            ProbeOutcome::Failure(msg) => assert!(
                msg.contains("does not implement the gRPC health protocol"),
                "{msg}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
