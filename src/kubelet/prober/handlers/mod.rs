//! The four ways to check a container, built once per worker from the probe's spec.
//!
//! - `exec`: a command in the container through CRI `ExecSync`;
//! - `httpGet`: a GET from the node to the pod IP (or `host`);
//! - `tcpSocket`: a TCP connect;
//! - `grpc`: `grpc.health.v1.Health/Check`.
//!
//! A spec that cannot be turned into a check (no handler, unknown port name) gives a handler
//! whose every run errors, as upstream, so the probe never changes the container's state.

pub(crate) mod exec;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod tcp;

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe as ProbeSpec};

use super::ProbeOutcome;
use super::worker::Probe;
use crate::base::podspec::expand::expand_all;
use crate::base::podspec::ports::resolve_port;
use crate::clients::cri::RuntimeService;

/// Probe output kept in messages (upstream keeps 10 KiB, as much as of an HTTP answer's body:
/// `clients::pod_http::MAX_BODY`).
pub(crate) const MAX_OUTPUT: usize = 10 * 1024;

/// One configured check.
pub(crate) enum Handler<R> {
    Exec(exec::ExecProbe<R>),
    Http(http::HttpProbe),
    Tcp(tcp::TcpProbe),
    Grpc(grpc::GrpcProbe),
    /// The spec cannot be carried out; every run errors with this reason.
    Invalid(String),
}

impl<R: RuntimeService> Probe for Handler<R> {
    async fn run(&self) -> ProbeOutcome {
        match self {
            Handler::Exec(p) => p.run().await,
            Handler::Http(p) => p.run().await,
            Handler::Tcp(p) => p.run().await,
            Handler::Grpc(p) => p.run().await,
            Handler::Invalid(why) => ProbeOutcome::Error(why.clone()),
        }
    }
}

/// The probe's timeout (`timeoutSeconds`, at least one second).
pub(crate) fn probe_timeout(spec: &ProbeSpec) -> Duration {
    Duration::from_secs(spec.timeout_seconds.unwrap_or(1).max(1) as u64)
}

/// Builds the check for one probe of one container instance. `pod_ip` is where network probes
/// go when the spec names no host (the host IP for hostNetwork pods).
pub(crate) fn build<R: RuntimeService>(
    spec: &ProbeSpec,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
    rt: R,
) -> Handler<R> {
    let timeout = probe_timeout(spec);
    if let Some(action) = &spec.exec {
        // As upstream, only `$(VAR)` references to the container's literal env values expand.
        let statics: HashMap<String, String> = container
            .env
            .iter()
            .flatten()
            .filter(|e| e.value_from.is_none())
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        let command = expand_all(action.command.as_deref().unwrap_or_default(), &statics);
        return Handler::Exec(exec::ExecProbe::new(
            rt,
            container_id.to_string(),
            command,
            timeout,
        ));
    }
    if let Some(action) = &spec.http_get {
        let port = match resolve_port(&action.port, container) {
            Ok(p) => p,
            Err(e) => return Handler::Invalid(e.to_string()),
        };
        let host = match action.host.as_deref().filter(|h| !h.is_empty()).or(pod_ip) {
            Some(h) => h.to_string(),
            None => return Handler::Invalid("the pod has no IP to probe".into()),
        };
        let https = action
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"));
        let headers = action
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let path = action.path.clone().unwrap_or_default();
        return match http::HttpProbe::new(https, &host, port, &path, headers, timeout) {
            Ok(p) => Handler::Http(p),
            Err(e) => Handler::Invalid(e.to_string()),
        };
    }
    if let Some(action) = &spec.tcp_socket {
        let port = match resolve_port(&action.port, container) {
            Ok(p) => p,
            Err(e) => return Handler::Invalid(e.to_string()),
        };
        let host = match action.host.as_deref().filter(|h| !h.is_empty()).or(pod_ip) {
            Some(h) => h.to_string(),
            None => return Handler::Invalid("the pod has no IP to probe".into()),
        };
        return Handler::Tcp(tcp::TcpProbe::new(host, port, timeout));
    }
    if let Some(action) = &spec.grpc {
        let port = match u16::try_from(action.port) {
            Ok(p) if p > 0 => p,
            _ => return Handler::Invalid(format!("invalid port number: {}", action.port)),
        };
        let Some(host) = pod_ip else {
            return Handler::Invalid("the pod has no IP to probe".into());
        };
        let service = action.service.clone().unwrap_or_default();
        return Handler::Grpc(grpc::GrpcProbe::new(
            host.to_string(),
            port,
            service,
            timeout,
        ));
    }
    Handler::Invalid("the probe has no handler (exec, httpGet, tcpSocket or grpc)".into())
}

/// Cuts text to [`MAX_OUTPUT`] bytes at a character boundary.
pub(crate) fn truncate(mut text: String) -> String {
    if text.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, HTTPGetAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn truncation() {
        assert_eq!(truncate("é".repeat(MAX_OUTPUT)).len(), MAX_OUTPUT);
        assert_eq!(truncate("short".into()), "short");
    }

    fn spec_with(f: impl FnOnce(&mut ProbeSpec)) -> ProbeSpec {
        let mut s = ProbeSpec::default();
        f(&mut s);
        s
    }

    #[test]
    fn builds_each_handler_from_the_spec() {
        let c = container();
        let rt = crate::clients::cri::fake::FakeCri::default();
        let exec = spec_with(|s| {
            s.exec = Some(ExecAction {
                command: Some(vec!["cat".into(), "$(F)".into()]),
            })
        });
        let mut c_env = c.clone();
        c_env.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "F".into(),
            value: Some("/tmp/ok".into()),
            ..Default::default()
        }]);
        match build(&exec, &c_env, "cid", Some("10.0.0.2"), rt.clone()) {
            Handler::Exec(p) => assert_eq!(p.command(), ["cat", "/tmp/ok"]),
            _ => panic!("exec"),
        }
        let http = spec_with(|s| {
            s.http_get = Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("/healthz".into()),
                ..Default::default()
            })
        });
        match build(&http, &c, "cid", Some("10.0.0.2"), rt.clone()) {
            Handler::Http(p) => assert_eq!(p.url(), "http://10.0.0.2:8080/healthz"),
            _ => panic!("http"),
        }
        let tcp = spec_with(|s| {
            s.tcp_socket = Some(TCPSocketAction {
                port: IntOrString::Int(9000),
                host: Some("127.0.0.1".into()),
            })
        });
        match build(&tcp, &c, "cid", Some("10.0.0.2"), rt.clone()) {
            Handler::Tcp(p) => assert_eq!(p.address(), "127.0.0.1:9000"),
            _ => panic!("tcp"),
        }
        let bad = spec_with(|s| {
            s.tcp_socket = Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            })
        });
        assert!(matches!(
            build(&bad, &c, "cid", Some("10.0.0.2"), rt.clone()),
            Handler::Invalid(_)
        ));
        assert!(matches!(
            build(&ProbeSpec::default(), &c, "cid", None, rt.clone()),
            Handler::Invalid(_)
        ));
    }
}
