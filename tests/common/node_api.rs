//! The node API from the tests' side, for tests that run an agent without a control plane:
//! an agent that lets anyone in (or trusts a CA of the test's own, see [`super::test_ca`]),
//! `curl` against its node API, and a config file of a few fields.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use super::Agent;

impl Agent {
    /// Lets anyone in on the node API: anonymous requests on, every request authorized
    /// (`--anonymous-auth=true --authorization-mode=AlwaysAllow`), so no API server is asked.
    pub fn let_anyone_in(&mut self) {
        self.extra_args.extend([
            "--anonymous-auth=true".to_string(),
            "--authorization-mode=AlwaysAllow".to_string(),
        ]);
    }

    /// Serves the node API with the certificate and key files `cert` and `key`, authenticates
    /// client certificates signed by `ca` and authorizes every request (`AlwaysAllow`), so no
    /// API server is asked.
    pub fn trust_client_ca(&mut self, ca: &Path, cert: &Path, key: &Path) {
        self.extra_args.extend([
            format!("--client-ca-file={}", ca.display()),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            "--authorization-mode=AlwaysAllow".to_string(),
        ]);
    }

    /// Writes a `KubeletConfiguration` of `fields` (YAML lines) as `config.yaml` in the
    /// agent's directory and points the agent at it (`--config`).
    pub fn with_config(&mut self, fields: &str) {
        let path = self.dir.path().join("config.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{fields}"
            ),
        )
        .unwrap();
        self.extra_args.push(format!("--config={}", path.display()));
    }
}

/// `curl` against the node API on `port` (`https://127.0.0.1:<port><path>`), waiting up to
/// 10 s: (HTTP status, body), or curl's complaint. `args` go before the URL: `-k` to skip
/// verifying the serving certificate, `-X POST`, client certificates, a bearer token, or
/// another `--max-time` (curl takes the last one given).
pub fn curl_node_api<I, A>(port: u16, path: &str, args: I) -> Result<(u16, String), CurlError>
where
    I: IntoIterator<Item = A>,
    A: AsRef<OsStr>,
{
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("run curl (scripts/install-deps installs it)");
    if !out.status.success() {
        return Err(CurlError::Failed(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').ok_or(CurlError::NoStatusLine)?;
    let code = code
        .trim()
        .parse()
        .map_err(|_| CurlError::BadStatus(code.to_string()))?;
    Ok((code, body.to_string()))
}

/// Why [`curl_node_api`] has no answer to give.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum CurlError {
    /// curl itself failed (no connection, a TLS refusal, its time limit): its stderr.
    #[error("{0}")]
    Failed(String),
    /// The output lacks the status line `-w` appends.
    #[error("no status line")]
    NoStatusLine,
    #[error("status {0:?}")]
    BadStatus(String),
}
