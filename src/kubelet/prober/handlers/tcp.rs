//! `tcpSocket` probes: a connection that opens within the timeout is a success.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::kubelet::prober::ProbeOutcome;

use crate::clients::pod_http::join_host_port;

pub(crate) struct TcpProbe {
    address: String,
    timeout: Duration,
}

impl TcpProbe {
    pub(crate) fn new(host: String, port: u16, timeout: Duration) -> Self {
        TcpProbe {
            address: join_host_port(&host, port),
            timeout,
        }
    }

    /// `host:port` the probe connects to.
    #[cfg(test)]
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    pub(crate) async fn run(&self) -> ProbeOutcome {
        match tokio::time::timeout(self.timeout, TcpStream::connect(self.address.as_str())).await {
            Ok(Ok(stream)) => {
                drop(stream);
                ProbeOutcome::Success
            }
            Ok(Err(err)) => ProbeOutcome::Failure(format!("dial tcp {}: {err}", self.address)),
            Err(_) => ProbeOutcome::Failure(format!(
                "dial tcp {}: i/o timeout after {:?}",
                self.address, self.timeout
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_port_succeeds_and_closed_port_fails() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = TcpProbe::new("127.0.0.1".into(), port, Duration::from_secs(1));
        assert_eq!(open.run().await, ProbeOutcome::Success);

        drop(listener);
        let closed = TcpProbe::new("127.0.0.1".into(), port, Duration::from_secs(1));
        match closed.run().await {
            ProbeOutcome::Failure(msg) => assert!(
                msg.starts_with(&format!("dial tcp 127.0.0.1:{port}: ")),
                "{msg}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
