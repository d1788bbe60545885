//! Lifecycle hooks: `postStart` right after a container starts, `preStop` before it is stopped.
//!
//! Handlers run from the node: `exec` through CRI `ExecSync` in the container, `httpGet` to the
//! pod's IP (or `host`), `sleep` on the node. A hook's failure is reported with upstream's
//! wording; what happens next (kill and restart for postStart, carry on stopping for preStop)
//! is the executor's decision.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use crate::base::podspec::ports::{PortError, resolve_port};
use crate::clients::cri::{CriError, RuntimeService};
use crate::clients::pod_http::{HttpError, HttpGet, Verdict};

/// Upstream's User-Agent for lifecycle hook requests.
const LIFECYCLE_USER_AGENT: &str = "kube-lifecycle/1.37";

/// Which hook is running, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HookKind {
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

/// Why a hook failed; the text is upstream's, as users see it in events and logs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HookError {
    #[error("Exec lifecycle hook ({cmd:?}) for Container {container:?} failed - error: {source}")]
    Exec {
        cmd: Vec<String>,
        container: String,
        #[source]
        source: CriError,
    },
    #[error(
        "Exec lifecycle hook ({cmd:?}) for Container {container:?} failed - error: command exited with {code}, message: {output:?}"
    )]
    ExecExit {
        cmd: Vec<String>,
        container: String,
        code: i32,
        output: String,
    },
    #[error("the pod has no IP for an httpGet hook")]
    NoPodIp,
    #[error("HTTP lifecycle hook for Container {container:?}: {source}")]
    Port {
        container: String,
        #[source]
        source: PortError,
    },
    #[error("HTTP lifecycle hook for Container {container:?}: {source}")]
    Request {
        container: String,
        #[source]
        source: HttpError,
    },
    #[error("HTTP lifecycle hook ({path}) for Container {container:?} failed - error: {why}")]
    Http {
        path: String,
        container: String,
        why: String,
    },
    #[error("{kind}: the handler has no exec, httpGet or sleep action")]
    NoAction { kind: &'static str },
    #[error("{kind} for Container {container:?} did not finish within {seconds}s")]
    Timeout {
        kind: &'static str,
        container: String,
        seconds: u64,
    },
}

/// Runs one hook handler to completion or until `timeout`.
pub(crate) async fn run_hook<R: RuntimeService>(
    rt: &R,
    kind: HookKind,
    handler: &LifecycleHandler,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), HookError> {
    let name = || container.name.clone();
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
                .map_err(|source| HookError::Exec {
                    cmd: cmd.clone(),
                    container: name(),
                    source,
                })?;
            if resp.exit_code != 0 {
                let stderr = String::from_utf8_lossy(&resp.stderr);
                let stdout = String::from_utf8_lossy(&resp.stdout);
                return Err(HookError::ExecExit {
                    cmd,
                    container: name(),
                    code: resp.exit_code,
                    output: format!("{stdout}{stderr}").trim().to_string(),
                });
            }
            return Ok(());
        }
        if let Some(get) = &handler.http_get {
            // The same HTTP client as httpGet probes (HTTPS without certificate checks,
            // same-host redirects), with upstream's lifecycle User-Agent unless the hook sets one.
            let host = get
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .or_else(|| pod_ip.map(str::to_string))
                .ok_or(HookError::NoPodIp)?;
            let port = resolve_port(&get.port, container).map_err(|source| HookError::Port {
                container: name(),
                source,
            })?;
            let path = get.path.clone().unwrap_or_else(|| "/".into());
            let https = get
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
            let headers = get
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect();
            let request = HttpGet::new(
                https,
                &host,
                port,
                &path,
                headers,
                LIFECYCLE_USER_AGENT,
                timeout,
            )
            .map_err(|source| HookError::Request {
                container: name(),
                source,
            })?;
            return match request.run().await {
                Verdict::Success | Verdict::Warning(_) => Ok(()),
                Verdict::Failure(why) => Err(HookError::Http {
                    path,
                    container: name(),
                    why,
                }),
            };
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        Err(HookError::NoAction {
            kind: kind.as_str(),
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(HookError::Timeout {
            kind: kind.as_str(),
            container: name(),
            seconds: timeout.as_secs(),
        }),
    }
}

#[cfg(test)]
mod tests {

    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, HTTPHeader};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::clients::cri::fake::FakeCri;

    fn http_hook(path: &str, port: IntOrString, headers: Vec<(&str, &str)>) -> LifecycleHandler {
        LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port,
                host: Some("127.0.0.1".into()),
                http_headers: Some(
                    headers
                        .into_iter()
                        .map(|(name, value)| HTTPHeader {
                            name: name.into(),
                            value: value.into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The hook's failure message, or `None` when it succeeded.
    async fn failure(handler: &LifecycleHandler, container: &Container) -> Option<String> {
        let rt = FakeCri::default();
        let timeout = Duration::from_secs(5);
        run_hook(
            &rt,
            HookKind::PostStart,
            handler,
            container,
            "cid",
            None,
            timeout,
        )
        .await
        .err()
        .map(|e| e.to_string())
    }

    /// httpGet hooks: a 2xx or an unfollowed redirect succeeds, an error status fails with
    /// upstream's words; the User-Agent is `kube-lifecycle` unless the hook sets one; a
    /// named port is the container's.
    #[tokio::test]
    async fn http_hooks_succeed_fail_and_name_themselves() {
        let (port, seen) = crate::clients::pod_http::user_agent_server::start().await;
        let container = Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("web".into()),
                container_port: port.into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let by_number = IntOrString::Int(port.into());
        let by_name = IntOrString::String("web".into());
        assert_eq!(
            failure(&http_hook("/ok", by_number.clone(), vec![]), &container).await,
            None
        );
        assert_eq!(
            failure(&http_hook("/moved", by_name.clone(), vec![]), &container).await,
            None
        );
        assert_eq!(
            failure(&http_hook("/missing", by_number.clone(), vec![]), &container).await,
            Some("HTTP lifecycle hook (/missing) for Container \"app\" failed - error: HTTP probe failed with statuscode: 404".into())
        );
        let own = http_hook("/ok", by_number.clone(), vec![("user-agent", "mine/1")]);
        assert_eq!(failure(&own, &container).await, None);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "kube-lifecycle/1.37",
                "kube-lifecycle/1.37",
                "kube-lifecycle/1.37",
                "mine/1"
            ]
        );
        assert_eq!(
            failure(&http_hook("/ok", IntOrString::String("nope".into()), vec![]), &container).await,
            Some("HTTP lifecycle hook for Container \"app\": couldn't find port \"nope\" in the container's ports".into())
        );
        let bad_header = http_hook("/ok", by_number.clone(), vec![("bad name", "x")]);
        assert_eq!(
            failure(&bad_header, &container).await,
            Some(
                "HTTP lifecycle hook for Container \"app\": invalid header name \"bad name\""
                    .into()
            )
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = failure(
            &http_hook("/ok", IntOrString::Int(closed.into()), vec![]),
            &container,
        )
        .await
        .expect("a closed port fails the hook");
        assert!(
            err.starts_with(&format!(
                "HTTP lifecycle hook (/ok) for Container \"app\" failed - error: GET http://127.0.0.1:{closed}/ok: dial tcp: "
            )),
            "{err}"
        );
        let mut no_host = http_hook("/ok", by_number, vec![]);
        no_host.http_get.as_mut().unwrap().host = None;
        assert_eq!(
            failure(&no_host, &container).await,
            Some("the pod has no IP for an httpGet hook".into())
        );
    }
}
