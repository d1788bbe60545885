//! `httpGet` probes: a GET from the node through the shared pod HTTP client
//! (`clients::pod_http`: redirects, headers, HTTPS without certificate checks, the body
//! limit), with upstream's probe User-Agent; its verdict is the probe's outcome.

use std::time::Duration;

use crate::clients::pod_http::{HttpError, HttpGet, Verdict};
use crate::kubelet::prober::{PROBE_USER_AGENT, ProbeOutcome};

/// One `httpGet` probe of one container.
pub(crate) struct HttpProbe {
    get: HttpGet,
}

impl HttpProbe {
    /// `headers` are the probe's `httpHeaders` in spec order.
    pub(crate) fn new(
        https: bool,
        host: &str,
        port: u16,
        path: &str,
        headers: Vec<(String, String)>,
        timeout: Duration,
    ) -> Result<HttpProbe, HttpError> {
        let get = HttpGet::new(https, host, port, path, headers, PROBE_USER_AGENT, timeout)?;
        Ok(HttpProbe { get })
    }

    /// The URL of the first request.
    #[cfg(test)]
    pub(crate) fn url(&self) -> String {
        self.get.url()
    }

    pub(crate) async fn run(&self) -> ProbeOutcome {
        outcome(self.get.run().await)
    }
}

/// A GET's verdict as a probe's outcome (an HTTP probe never errors: it fails).
fn outcome(verdict: Verdict) -> ProbeOutcome {
    match verdict {
        Verdict::Success => ProbeOutcome::Success,
        Verdict::Warning(why) => ProbeOutcome::Warning(why),
        Verdict::Failure(why) => ProbeOutcome::Failure(why),
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// A probe's outcomes are the client's verdicts, in the same words, and its requests say
    /// `kube-probe/1.37` unless the probe sets a User-Agent.
    #[tokio::test]
    async fn outcomes_and_user_agent() {
        let (port, seen) = crate::clients::pod_http::user_agent_server::start().await;
        let probe = |path: &str, headers: Vec<(String, String)>| {
            HttpProbe::new(
                false,
                "127.0.0.1",
                port,
                path,
                headers,
                Duration::from_secs(2),
            )
            .unwrap()
        };
        assert_eq!(probe("/ok", vec![]).run().await, ProbeOutcome::Success);
        assert_eq!(
            probe("/moved", vec![]).run().await,
            ProbeOutcome::Warning("Probe terminated redirects, Response body: moved".into())
        );
        assert_eq!(
            probe("/missing", vec![]).run().await,
            ProbeOutcome::Failure("HTTP probe failed with statuscode: 404".into())
        );
        let own = vec![("User-Agent".to_string(), "mine/1".to_string())];
        assert_eq!(probe("/ok", own).run().await, ProbeOutcome::Success);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "kube-probe/1.37",
                "kube-probe/1.37",
                "kube-probe/1.37",
                "mine/1"
            ]
        );
    }
}
