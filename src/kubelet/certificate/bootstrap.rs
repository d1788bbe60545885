//! TLS bootstrap, as upstream's `LoadClientCert`: when `--kubeconfig` is missing or its
//! client certificate is unusable, get a certificate with the bootstrap kubeconfig's
//! credentials (usually a bootstrap token), store it in the cert dir and write a kubeconfig
//! that names `<certDir>/kubelet-client-current.pem`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use tokio_util::sync::CancellationToken;

use super::csr::{KubeCsrApi, RequestError, request_certificate};
use super::deadline::retry_with_backoff;
use super::{Credentials, FileStore};
use crate::base::clock;
use crate::clients::apiserver::problem::cause_chain;

/// How long one CSR may wait for approval (upstream waits as long before trying again).
const CSR_WAIT: Duration = Duration::from_secs(15 * 60);

/// Why bootstrap could not finish (each stops the agent with its own line).
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("bootstrap kubeconfig {}: {reason}", path.display())]
    BootstrapKubeconfig { path: PathBuf, reason: String },
    #[error("cannot write kubeconfig {}: {reason}", path.display())]
    WriteKubeconfig { path: PathBuf, reason: String },
    #[error("cert dir: {0}")]
    Store(#[from] super::store::StoreError),
    #[error("stopped during TLS bootstrap")]
    Cancelled,
}

/// Why a kubeconfig's client certificate is not usable (for the log line).
pub(crate) fn kubeconfig_problem(path: &Path, now: SystemTime) -> Option<String> {
    let kc = match Kubeconfig::read_from(path) {
        Ok(kc) => kc,
        Err(e) => return Some(cause_chain(&e)),
    };
    let Some(context) = kc
        .current_context
        .as_deref()
        .and_then(|c| kc.contexts.iter().find(|x| x.name == c))
        .and_then(|c| c.context.as_ref())
    else {
        return Some("no usable current-context".into());
    };
    let Some(auth) = context
        .user
        .as_deref()
        .and_then(|u| kc.auth_infos.iter().find(|a| a.name == u))
        .and_then(|a| a.auth_info.as_ref())
    else {
        return Some("the current context names no user".into());
    };
    let pem = if let Some(file) = &auth.client_certificate {
        match std::fs::read(file) {
            Ok(b) => b,
            Err(e) => return Some(format!("client-certificate {file}: {e}")),
        }
    } else if let Some(data) = &auth.client_certificate_data {
        match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
            Ok(b) => b,
            Err(e) => return Some(format!("client-certificate-data: {e}")),
        }
    } else {
        // Another kind of credential (a token): upstream keeps it as it is.
        return None;
    };
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => return Some("the client certificate holds no certificate".into()),
        Err(e) => return Some(format!("the client certificate is not PEM: {e}")),
    };
    for cert in &certs {
        match super::credentials::certificate_validity(cert) {
            Ok((nb, na, subject)) if now < nb || now >= na => {
                return Some(format!(
                    "the client certificate ({subject}) is valid from {} to {}, not now",
                    jiff_time(nb),
                    jiff_time(na)
                ));
            }
            Ok(_) => {}
            Err(e) => return Some(e.to_string()),
        }
    }
    None
}

pub(crate) fn jiff_time(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{t:?}"))
}

/// Makes sure `kubeconfig` holds a usable client certificate, bootstrapping one if needed.
/// Blocks (retrying with back-off, logging each failure) until it does or `cancel` fires.
pub(crate) async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    store: &FileStore,
    node_name: &str,
    cancel: &CancellationToken,
) -> Result<(), BootstrapError> {
    let now = clock::now();
    let Some(problem) = kubeconfig_problem(kubeconfig, now) else {
        tracing::info!(kubeconfig = %kubeconfig.display(), "the kubeconfig holds a valid client certificate; no TLS bootstrap");
        return Ok(());
    };
    tracing::info!(kubeconfig = %kubeconfig.display(), %problem, "the kubeconfig is not usable; TLS bootstrap with {}", bootstrap.display());
    let boot =
        Kubeconfig::read_from(bootstrap).map_err(|e| BootstrapError::BootstrapKubeconfig {
            path: bootstrap.to_path_buf(),
            reason: cause_chain(&e),
        })?;
    match store.current() {
        Ok(Some((path, creds))) if creds.valid_at(now) => {
            tracing::info!(cert = %path.display(), "the cert dir holds a valid client certificate; writing the kubeconfig for it");
            return write_kubeconfig(kubeconfig, &boot, bootstrap, &store.current_path());
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "the cert dir's current certificate is not usable; requesting a new one")
        }
    }
    let done = retry_with_backoff(
        cancel,
        || bootstrap_once(bootstrap, store, node_name, cancel),
        |e, pause| match e {
            Attempt::Fatal(_) => false,
            Attempt::Retry(why) => {
                tracing::error!(error = %why, retry_in = ?pause, "TLS bootstrap failed; trying again");
                true
            }
        },
    )
    .await;
    match done {
        Ok(()) => {}
        Err(Some(Attempt::Fatal(e))) => return Err(e),
        Err(_) => return Err(BootstrapError::Cancelled),
    }
    write_kubeconfig(kubeconfig, &boot, bootstrap, &store.current_path())
}

enum Attempt {
    Retry(String),
    Fatal(BootstrapError),
}

async fn bootstrap_once(
    bootstrap: &Path,
    store: &FileStore,
    node_name: &str,
    cancel: &CancellationToken,
) -> Result<(), Attempt> {
    let client = crate::clients::apiserver::connect(
        bootstrap,
        &crate::clients::apiserver::ClientOptions {
            qps: -1.0,
            burst: 0,
            timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(30),
        },
    )
    .await
    .map_err(|e| Attempt::Retry(e.to_string()))?;
    let issued = match request_certificate(
        &KubeCsrApi(client),
        node_name,
        "node-csr-",
        CSR_WAIT,
        cancel,
    )
    .await
    {
        Ok(i) => i,
        Err(RequestError::Cancelled) => return Err(Attempt::Fatal(BootstrapError::Cancelled)),
        Err(e) => return Err(Attempt::Retry(e.to_string())),
    };
    let path = store
        .store(&issued.pem, clock::timestamp())
        .map_err(|e| Attempt::Fatal(e.into()))?;
    tracing::info!(
        csr = %issued.csr_name,
        cert = %path.display(),
        subject = %issued.credentials.subject,
        not_after = %jiff_time(issued.credentials.not_after),
        "TLS bootstrap: got a signed client certificate"
    );
    Ok(())
}

/// Writes the node's kubeconfig (0600, atomically): the bootstrap kubeconfig's cluster, and
/// the client certificate and key from `cert` (the current-certificate link).
pub(crate) fn write_kubeconfig(
    path: &Path,
    boot: &Kubeconfig,
    boot_path: &Path,
    cert: &Path,
) -> Result<(), BootstrapError> {
    let bad = |reason: String| BootstrapError::BootstrapKubeconfig {
        path: boot_path.to_path_buf(),
        reason,
    };
    let context = boot
        .current_context
        .as_deref()
        .and_then(|c| boot.contexts.iter().find(|x| x.name == c))
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| bad("no usable current-context".into()))?;
    let cluster = boot
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad(format!("cluster {:?} is not defined", context.cluster)))?;
    let cert = cert.to_string_lossy().into_owned();
    let out = Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(cert.clone()),
                client_key: Some(cert),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some("default-context".into()),
        ..Default::default()
    };
    let werr = |reason: String| BootstrapError::WriteKubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    // JSON is YAML: every kubeconfig reader takes it.
    let mut text = serde_json::to_vec_pretty(&out).map_err(|e| werr(e.to_string()))?;
    text.push(b'\n');
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(|e| werr(e.to_string()))?;
    }
    let tmp = path.with_extension("deckhand-new");
    super::store::write_private(&tmp, path, &text).map_err(|e| werr(e.to_string()))?;
    tracing::info!(kubeconfig = %path.display(), "wrote the node's kubeconfig");
    Ok(())
}

/// Reads the current credentials for the API clients (after bootstrap).
pub(crate) fn current_credentials(store: &FileStore) -> Option<Credentials> {
    match store.current() {
        Ok(Some((_, c))) => Some(c),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the cert dir's current certificate");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed client certificate with its key, valid from the start of one year to
    /// the start of another.
    fn cert_pem(from_year: i32, to_year: i32) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:t");
        params.not_before = rcgen::date_time_ymd(from_year, 1, 1);
        params.not_after = rcgen::date_time_ymd(to_year, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    fn kubeconfig_with_user(dir: &Path, name: &str, user: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: Zm9v\n\
                 contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n\
                 users:\n- name: u\n  user:\n{user}"
            ),
        )
        .unwrap();
        path
    }

    #[test]
    fn which_kubeconfigs_need_bootstrap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("valid.pem"), cert_pem(2000, 4000)).unwrap();
        std::fs::write(d.join("expired.pem"), cert_pem(2000, 2001)).unwrap();
        std::fs::write(d.join("future.pem"), cert_pem(3000, 4000)).unwrap();
        std::fs::write(d.join("garbage.pem"), "nothing").unwrap();
        std::fs::write(d.join("yaml"), "clusters: [").unwrap();
        let valid_data = base64::engine::general_purpose::STANDARD.encode(cert_pem(2000, 4000));
        let p = |f: &str| d.join(f).display().to_string();
        // (kubeconfig, needs bootstrap, a word the reason holds)
        let cases: Vec<(PathBuf, Option<&str>)> = vec![
            (d.join("missing"), Some("missing")),
            (d.join("yaml"), Some("")),
            (
                kubeconfig_with_user(
                    d,
                    "a",
                    &format!(
                        "    client-certificate: {}\n    client-key: {}\n",
                        p("valid.pem"),
                        p("valid.pem")
                    ),
                ),
                None,
            ),
            (
                kubeconfig_with_user(
                    d,
                    "b",
                    &format!("    client-certificate: {}\n", p("expired.pem")),
                ),
                Some("not now"),
            ),
            (
                kubeconfig_with_user(
                    d,
                    "c",
                    &format!("    client-certificate: {}\n", p("future.pem")),
                ),
                Some("not now"),
            ),
            (
                kubeconfig_with_user(
                    d,
                    "d",
                    &format!("    client-certificate: {}\n", p("garbage.pem")),
                ),
                Some("no certificate"),
            ),
            (
                kubeconfig_with_user(
                    d,
                    "e",
                    &format!("    client-certificate: {}\n", p("nope.pem")),
                ),
                Some("nope.pem"),
            ),
            (
                kubeconfig_with_user(
                    d,
                    "f",
                    &format!("    client-certificate-data: {valid_data}\n"),
                ),
                None,
            ),
            (
                kubeconfig_with_user(d, "g", "    client-certificate-data: '%%%'\n"),
                Some("client-certificate-data"),
            ),
            // A token: kept as it is, as upstream.
            (kubeconfig_with_user(d, "h", "    token: abc\n"), None),
        ];
        for (path, want) in cases {
            let got = kubeconfig_problem(&path, SystemTime::now());
            match (got, want) {
                (None, None) => {}
                (Some(reason), Some(word)) => {
                    assert!(reason.contains(word), "{}: {reason}", path.display())
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", path.display()),
            }
        }
    }

    #[test]
    fn the_written_kubeconfig_names_the_current_link() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let store = FileStore::new(d.join("pki"));
        store
            .store(cert_pem(2000, 4000).as_bytes(), jiff::Timestamp::now())
            .unwrap();
        let boot_path = kubeconfig_with_user(d, "boot", "    token: abc.def\n");
        let boot = Kubeconfig::read_from(&boot_path).unwrap();
        let out = d.join("sub/kubelet.kubeconfig");
        assert!(kubeconfig_problem(&out, SystemTime::now()).is_some());
        write_kubeconfig(&out, &boot, &boot_path, &store.current_path()).unwrap();
        assert_eq!(kubeconfig_problem(&out, SystemTime::now()), None);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains("kubelet-client-current.pem"), "{text}");
        assert!(text.contains("https://127.0.0.1:1"), "{text}");
        assert!(!text.contains("abc.def"), "the token is not copied: {text}");
    }
}
