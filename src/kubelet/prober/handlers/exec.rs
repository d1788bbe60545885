//! `exec` probes: run a command in the container through CRI `ExecSync`.
//!
//! Exit code 0 is a success; any other exit code, and a command that outlives the probe's
//! timeout, is a failure. A runtime that cannot run the command at all gives an error (the run
//! is ignored), as upstream.

use std::time::Duration;

use crate::clients::cri::{CriError, RuntimeService};
use crate::kubelet::prober::ProbeOutcome;

use super::truncate;

/// Extra time given to the runtime beyond the probe's timeout before Deckhand gives up itself.
const RUNTIME_SLACK: Duration = Duration::from_secs(2);

pub(crate) struct ExecProbe<R> {
    rt: R,
    container_id: String,
    command: Vec<String>,
    timeout: Duration,
}

impl<R: RuntimeService> ExecProbe<R> {
    pub(crate) fn new(
        rt: R,
        container_id: String,
        command: Vec<String>,
        timeout: Duration,
    ) -> Self {
        ExecProbe {
            rt,
            container_id,
            command,
            timeout,
        }
    }

    /// The command, after `$(VAR)` expansion.
    #[cfg(test)]
    pub(crate) fn command(&self) -> &[String] {
        &self.command
    }

    pub(crate) async fn run(&self) -> ProbeOutcome {
        let secs = self.timeout.as_secs().max(1) as i64;
        let call = self
            .rt
            .exec_sync(self.container_id.clone(), self.command.clone(), secs);
        let timed_out = || {
            ProbeOutcome::Failure(format!(
                "command {:?} timed out after {}s",
                self.command, secs
            ))
        };
        match tokio::time::timeout(self.timeout + RUNTIME_SLACK, call).await {
            Err(_) => timed_out(),
            Ok(Ok(resp)) => {
                let mut out = String::from_utf8_lossy(&resp.stdout).into_owned();
                out.push_str(&String::from_utf8_lossy(&resp.stderr));
                let out = truncate(out);
                if resp.exit_code == 0 {
                    ProbeOutcome::Success
                } else {
                    ProbeOutcome::Failure(format!(
                        "command {:?} exited with {}: {}",
                        self.command,
                        resp.exit_code,
                        out.trim_end()
                    ))
                }
            }
            Ok(Err(CriError::Timeout { .. }))
            | Ok(Err(CriError::Rpc {
                code: tonic::Code::DeadlineExceeded,
                ..
            })) => timed_out(),
            Ok(Err(err)) => ProbeOutcome::Error(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::cri::fake::{ExecReply, FakeCri};

    fn probe(rt: &FakeCri) -> ExecProbe<FakeCri> {
        ExecProbe::new(
            rt.clone(),
            "c1".into(),
            vec!["cat".into(), "/tmp/healthy".into()],
            Duration::from_secs(1),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn exit_codes_timeouts_and_runtime_errors() {
        let rt = FakeCri::with_exec(vec![
            ExecReply::Exit(0, "fine"),
            ExecReply::Exit(1, "cat: can't open '/tmp/healthy'\n"),
            ExecReply::Fail(tonic::Code::DeadlineExceeded),
            ExecReply::Slow(Duration::from_secs(30)),
            ExecReply::Fail(tonic::Code::NotFound),
        ]);
        let p = probe(&rt);
        assert_eq!(p.run().await, ProbeOutcome::Success);
        assert_eq!(
            p.run().await,
            ProbeOutcome::Failure(
                "command [\"cat\", \"/tmp/healthy\"] exited with 1: cat: can't open '/tmp/healthy'"
                    .into()
            )
        );
        assert!(matches!(p.run().await, ProbeOutcome::Failure(m) if m.contains("timed out")));
        assert!(
            matches!(p.run().await, ProbeOutcome::Failure(m) if m.contains("timed out")),
            "a hung runtime"
        );
        assert!(matches!(p.run().await, ProbeOutcome::Error(_)));
        let calls = rt.exec_calls();
        assert_eq!(
            calls[0],
            (
                "c1".to_string(),
                vec!["cat".to_string(), "/tmp/healthy".to_string()],
                1
            )
        );
    }
}
