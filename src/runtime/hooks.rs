//! Lifecycle hooks: `postStart` right after a container starts, `preStop` before it is stopped.
//!
//! Handlers run from the node: `exec` through CRI `ExecSync` in the container, `httpGet` to the
//! pod's IP (or `host`), `sleep` on the node. A hook's failure is reported with upstream's
//! wording; what happens next (kill and restart for postStart, carry on stopping for preStop)
//! is the executor's decision.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cri::RuntimeService;

/// Which hook is running, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    PostStart,
    PreStop,
}

impl HookKind {
    fn as_str(self) -> &'static str {
        match self {
            HookKind::PostStart => "PostStartHook",
            HookKind::PreStop => "PreStopHook",
        }
    }
}

/// Resolves a hook's port: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| {
                    format!(
                        "couldn't find port {name:?} in container {:?}",
                        container.name
                    )
                })
        }
    }
}

/// Runs one hook handler to completion or until `timeout`.
pub async fn run_hook<R: RuntimeService>(
    rt: &R,
    kind: HookKind,
    handler: &LifecycleHandler,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), String> {
    let work = async {
        if let Some(exec) = &handler.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let resp = rt
                .exec_sync(
                    container_id.to_string(),
                    cmd.clone(),
                    timeout.as_secs() as i64,
                )
                .await
                .map_err(|e| {
                    format!(
                        "Exec lifecycle hook ({cmd:?}) for Container {:?} failed - error: {e}",
                        container.name
                    )
                })?;
            if resp.exit_code != 0 {
                let stderr = String::from_utf8_lossy(&resp.stderr);
                let stdout = String::from_utf8_lossy(&resp.stdout);
                return Err(format!(
                    "Exec lifecycle hook ({cmd:?}) for Container {:?} failed - error: command exited with {}, message: {:?}",
                    container.name,
                    resp.exit_code,
                    format!("{stdout}{stderr}").trim()
                ));
            }
            return Ok(());
        }
        if let Some(get) = &handler.http_get {
            let host = get
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .or_else(|| pod_ip.map(str::to_string))
                .ok_or_else(|| "the pod has no IP for an httpGet hook".to_string())?;
            let port = resolve_port(&get.port, container)?;
            let path = get.path.clone().unwrap_or_else(|| "/".into());
            let scheme = get.scheme.as_deref().unwrap_or("HTTP");
            if !scheme.eq_ignore_ascii_case("HTTP") {
                return Err(format!(
                    "httpGet hooks with scheme {scheme} are not supported"
                ));
            }
            let path = if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            };
            let url = format!("http://{host}:{port}{path}");
            let mut req = http::Request::get(&url).header("User-Agent", "kube-lifecycle/1.33");
            for h in get.http_headers.iter().flatten() {
                req = req.header(h.name.as_str(), h.value.as_str());
            }
            let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
            let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
            let resp = client.request(req).await.map_err(|e| {
                format!(
                    "HTTP lifecycle hook ({path}) for Container {:?} failed - error: {e}",
                    container.name
                )
            })?;
            let code = resp.status().as_u16();
            if !(200..400).contains(&code) {
                return Err(format!(
                    "HTTP lifecycle hook ({url}) for Container {:?} failed - status {code}",
                    container.name
                ));
            }
            return Ok(());
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        Err(format!(
            "{}: the handler has no exec, httpGet or sleep action",
            kind.as_str()
        ))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{} for Container {:?} did not finish within {}s",
            kind.as_str(),
            container.name,
            timeout.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn port_resolution() {
        let c = Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(70000), &c).is_err());
    }
}
