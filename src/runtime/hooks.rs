//! Lifecycle hooks: `postStart` right after a container starts, `preStop` before it is stopped.
//!
//! Handlers run from the node: `exec` through CRI `ExecSync` in the container, `httpGet` to the
//! pod's IP (or `host`), `sleep` on the node. A hook's failure is reported with upstream's
//! wording; what happens next (kill and restart for postStart, carry on stopping for preStop)
//! is the executor's decision.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use crate::cri::RuntimeService;
use crate::prober::ProbeOutcome;
use crate::prober::handlers::http::HttpProbe;
use crate::prober::handlers::resolve_port;

/// Upstream's User-Agent for lifecycle hook requests.
const LIFECYCLE_USER_AGENT: &str = "kube-lifecycle/1.33";

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
            // The same HTTP client as httpGet probes (HTTPS without certificate checks,
            // same-host redirects), with upstream's lifecycle User-Agent unless the hook sets one.
            let host = get
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .or_else(|| pod_ip.map(str::to_string))
                .ok_or_else(|| "the pod has no IP for an httpGet hook".to_string())?;
            let port = resolve_port(&get.port, container)?;
            let path = get.path.clone().unwrap_or_else(|| "/".into());
            let https = get
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
            let mut headers = vec![("User-Agent".to_string(), LIFECYCLE_USER_AGENT.to_string())];
            headers.retain(|(name, _)| {
                !get.http_headers
                    .iter()
                    .flatten()
                    .any(|h| h.name.eq_ignore_ascii_case(name))
            });
            headers.extend(
                get.http_headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone())),
            );
            let request = HttpProbe::new(https, &host, port, &path, headers, timeout)?;
            return match request.run().await {
                ProbeOutcome::Success | ProbeOutcome::Warning(_) => Ok(()),
                ProbeOutcome::Failure(why) | ProbeOutcome::Error(why) => Err(format!(
                    "HTTP lifecycle hook ({path}) for Container {:?} failed - error: {why}",
                    container.name
                )),
            };
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
