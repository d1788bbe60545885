//! The start-up handshake: the runtime must speak CRI v1 and report itself ready.

use std::time::Duration;

use tokio::time::Instant;

use super::CriError;
use super::proto::StatusResponse;
use super::service::RuntimeService;
use crate::base::clock;

/// Condition names from the CRI protocol.
pub const RUNTIME_READY: &str = "RuntimeReady";
pub const NETWORK_READY: &str = "NetworkReady";

/// What the runtime said about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

/// Why the runtime is not ready yet, from its `Status` answer; `None` when it is.
///
/// A condition that is missing counts as not ready, as upstream's node status does.
pub fn readiness_problem(status: &StatusResponse) -> Option<String> {
    let conditions = status
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut problems = Vec::new();
    for wanted in [RUNTIME_READY, NETWORK_READY] {
        match conditions.iter().find(|c| c.r#type == wanted) {
            Some(c) if c.status => {}
            Some(c) => problems.push(format!(
                "{wanted}=false (reason {:?}, message {:?})",
                c.reason, c.message
            )),
            None => problems.push(format!("{wanted} not reported")),
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Asks for the runtime's version, insists on `v1`, then waits until it reports RuntimeReady and
/// NetworkReady, logging what is missing every few seconds, for at most `ready_timeout`.
pub async fn handshake<R: RuntimeService>(
    runtime: &R,
    endpoint: &str,
    ready_timeout: Duration,
) -> Result<RuntimeInfo, CriError> {
    let version = runtime.version().await?;
    if version.runtime_api_version != "v1" {
        return Err(CriError::Version {
            endpoint: endpoint.to_string(),
            version: version.runtime_api_version,
        });
    }
    let info = RuntimeInfo {
        runtime_name: version.runtime_name,
        runtime_version: version.runtime_version,
        runtime_api_version: version.runtime_api_version,
    };
    tracing::info!(
        runtime = %info.runtime_name,
        version = %info.runtime_version,
        api = %info.runtime_api_version,
        "container runtime answered"
    );

    let started = clock::instant();
    let mut last_logged: Option<Instant> = None;
    loop {
        let problem = match runtime.status(false).await {
            Ok(status) => readiness_problem(&status),
            Err(err) => Some(err.to_string()),
        };
        let Some(problem) = problem else {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "container runtime is ready"
            );
            return Ok(info);
        };
        if started.elapsed() >= ready_timeout {
            return Err(CriError::NotReady {
                endpoint: endpoint.to_string(),
                waited: ready_timeout,
                reason: problem,
            });
        }
        if last_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            tracing::warn!(%problem, "waiting for the container runtime to become ready");
            last_logged = Some(clock::instant());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::cri::proto::{RuntimeCondition, RuntimeStatus};

    fn status(conds: &[(&str, bool)]) -> StatusResponse {
        StatusResponse {
            status: Some(RuntimeStatus {
                conditions: conds
                    .iter()
                    .map(|(t, s)| RuntimeCondition {
                        r#type: t.to_string(),
                        status: *s,
                        reason: if *s {
                            String::new()
                        } else {
                            "NetworkPluginNotReady".into()
                        },
                        message: String::new(),
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }

    /// Conditions the runtime reports, and a fragment of the problem expected (`None`: ready).
    type Row<'a> = (&'a [(&'a str, bool)], Option<&'a str>);

    #[test]
    fn readiness_table() {
        let table: [Row; 5] = [
            (&[(RUNTIME_READY, true), (NETWORK_READY, true)], None),
            (
                &[(RUNTIME_READY, true), (NETWORK_READY, false)],
                Some("NetworkReady=false"),
            ),
            (
                &[(RUNTIME_READY, false), (NETWORK_READY, true)],
                Some("RuntimeReady=false"),
            ),
            (&[(RUNTIME_READY, true)], Some("NetworkReady not reported")),
            (&[], Some("RuntimeReady not reported")),
        ];
        for (conds, want) in table {
            let got = readiness_problem(&status(conds));
            match want {
                None => assert_eq!(got, None, "{conds:?}"),
                Some(fragment) => {
                    let got = got.unwrap_or_default();
                    assert!(got.contains(fragment), "{conds:?}: {got}");
                }
            }
        }
    }
}
