//! The node API's state for unit tests: empty pods and runtime, no streams, a stats provider on
//! the fake runtime, `/configz` as `{}`, every optional endpoint on.

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::auth::Gate;
use super::handlers::{NodeApiState, StreamUrls};
use crate::clients::cri::CriError;
use crate::clients::cri::proto::{AttachRequest, ExecRequest, PortForwardRequest};

/// A runtime whose streaming URLs lead nowhere (port 1 on loopback).
struct NoStreams;

impl StreamUrls for NoStreams {
    fn exec(&self, _: ExecRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
    fn attach(&self, _: AttachRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
    fn port_forward(&self, _: PortForwardRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
}

/// The state of a node API behind `gate`, its pod logs and `/logs/` both under `dir`.
pub(crate) fn test_state(gate: Gate, dir: &Path) -> NodeApiState {
    NodeApiState {
        gate: Arc::new(gate),
        health: Default::default(),
        pods: Default::default(),
        runtime: Default::default(),
        streams: Arc::new(NoStreams),
        metrics: Default::default(),
        pod_logs_dir: dir.to_path_buf(),
        node_log_dir: dir.to_path_buf(),
        configz: Arc::new(b"{}".to_vec()),
        stats: Arc::new(crate::kubelet::stats::StatsProvider::new(
            Arc::new(crate::clients::cri::fake::FakeCri::default()),
            Arc::new(crate::kubelet::stats::HostFiles::default()),
            "n1".into(),
        )),
        debug: Default::default(),
    }
}
