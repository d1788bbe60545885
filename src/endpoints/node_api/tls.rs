//! The node API's TLS: which serving certificate it presents (files, a self-signed one made
//! once in the cert dir, or one requested by CSR and swapped in when renewed), and which
//! client certificates it accepts (those signed by `clientCAFile`; none is required, since
//! tokens authenticate too).
//!
//! rustls speaks TLS 1.2 and 1.3 only, with ECDHE key exchange and AEAD ciphers only: the
//! set upstream's secure defaults aim at, without the legacy suites Go still allows.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::base::clock;
use crate::config::ServerSettings;
use crate::config::server::TlsMinVersion;
use crate::kubelet::certificate::Credentials;

/// Why the node API's TLS could not be set up (each names the file).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("cannot make a self-signed serving certificate: {0}")]
    SelfSigned(String),
    #[error("client CA file {}: {reason}", path.display())]
    ClientCa { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

pub use crate::kubelet::certificate::serving::ServingSlot;

#[derive(Debug)]
struct SlotResolver(ServingSlot);

impl ResolvesServerCert for SlotResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.0.get();
        if current.is_none() {
            tracing::debug!("node API: no serving certificate yet; refusing the handshake");
        }
        current.map(|c| c.key.clone())
    }
}

/// Reads a certificate chain and its key from two PEM files.
pub(crate) fn load_pair(cert: &Path, key: &Path) -> Result<Credentials, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| TlsError::File {
            path: p.to_path_buf(),
            reason: e.to_string(),
        })
    };
    let mut pem = read(cert)?;
    if !pem.ends_with(b"\n") {
        pem.push(b'\n');
    }
    pem.extend_from_slice(&read(key)?);
    Credentials::from_pem(&pem).map_err(|reason| TlsError::File {
        path: cert.to_path_buf(),
        reason: reason.to_string(),
    })
}

/// A self-signed serving certificate for the node, as upstream makes when no
/// `tlsCertFile` is given: `kubelet.crt`/`kubelet.key` in the cert dir, reused while
/// readable and valid, otherwise made anew (valid one year, for the node name and IPs).
pub(crate) fn self_signed(
    cert_path: &Path,
    key_path: &Path,
    node_name: &str,
    ips: &[IpAddr],
) -> Result<Credentials, TlsError> {
    if cert_path.exists() && key_path.exists() {
        match load_pair(cert_path, key_path) {
            Ok(c) if c.valid_at(clock::now()) => return Ok(c),
            Ok(_) => {
                tracing::info!(cert = %cert_path.display(), "the self-signed serving certificate expired; making a new one")
            }
            Err(e) => {
                tracing::warn!(error = %e, "the self-signed serving certificate is unusable; making a new one")
            }
        }
    }
    let (cert_pem, key_pem) = make_self_signed(node_name, ips)?;
    if let Some(dir) = cert_path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| TlsError::File {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    let write = |path: &Path, bytes: &str| {
        crate::kubelet::certificate::store::write_private(
            &path.with_extension("new"),
            path,
            bytes.as_bytes(),
        )
        .map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    };
    write(key_path, &key_pem)?;
    write(cert_path, &cert_pem)?;
    tracing::info!(cert = %cert_path.display(), "made a self-signed serving certificate for the node API");
    load_pair(cert_path, key_path)
}

/// (certificate PEM, key PEM): a self-signed server certificate for `node_name` and `ips`.
pub(crate) fn make_self_signed(
    node_name: &str,
    ips: &[IpAddr],
) -> Result<(String, String), TlsError> {
    let err = |e: rcgen::Error| TlsError::SelfSigned(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(err)?;
    let mut params = rcgen::CertificateParams::new(vec![node_name.to_string()]).map_err(err)?;
    for ip in ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{node_name}@{}", clock::timestamp().as_second()),
    );
    // From the start of yesterday (UTC) to a year later: no clock skew trips it.
    let start = clock::timestamp()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .yesterday()
        .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    let day = |d: jiff::civil::Date| {
        rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8)
    };
    params.not_before = day(start);
    params.not_after = day(start.saturating_add(jiff::Span::new().years(1)));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.self_signed(&key).map_err(err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The rustls server configuration: the slot's certificate; client certificates verified
/// against `settings.client_ca_file` when one is configured (optional, so token clients
/// still connect); `tlsMinVersion` and the TLS 1.2 suites of `tlsCipherSuites`.
pub(crate) fn server_config(
    slot: ServingSlot,
    settings: &ServerSettings,
) -> Result<rustls::ServerConfig, TlsError> {
    let client_ca = settings.client_ca_file.as_deref();
    let mut provider = rustls::crypto::ring::default_provider();
    if !settings.tls_cipher_suites.is_empty() {
        provider.cipher_suites.retain(|s| {
            s.version().version == rustls::ProtocolVersion::TLSv1_3
                || settings
                    .tls_cipher_suites
                    .iter()
                    .any(|name| *name == format!("{:?}", s.suite()))
        });
    }
    let provider = Arc::new(provider);
    let versions: &[&'static rustls::SupportedProtocolVersion] = match settings.tls_min_version {
        TlsMinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(path) => {
            let ca_err = |reason: String| TlsError::ClientCa {
                path: path.to_path_buf(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| ca_err(format!("bad PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| ca_err(format!("not a usable CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(ca_err("holds no certificate".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| ca_err(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SlotResolver(slot)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn self_signed_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (
            dir.path().join("pki/kubelet.crt"),
            dir.path().join("pki/kubelet.key"),
        );
        let ips = ["127.0.0.1".parse().unwrap()];
        let first = self_signed(&crt, &key, "node-a", &ips).unwrap();
        assert!(first.subject.contains("node-a@"), "{}", first.subject);
        assert!(first.valid_at(SystemTime::now()));
        let second = self_signed(&crt, &key, "node-a", &ips).unwrap();
        assert_eq!(first.pem, second.pem, "reused, not made again");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A broken pair is replaced.
        std::fs::write(&crt, "junk").unwrap();
        let third = self_signed(&crt, &key, "node-a", &ips).unwrap();
        assert_ne!(third.pem, first.pem);
    }

    #[test]
    fn a_bad_client_ca_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, "not pem").unwrap();
        let with_ca = ServerSettings {
            client_ca_file: Some(ca.clone()),
            ..Default::default()
        };
        let err = server_config(ServingSlot::default(), &with_ca).unwrap_err();
        assert!(err.to_string().contains("ca.crt"), "{err}");
        assert!(server_config(ServingSlot::default(), &ServerSettings::default()).is_ok());
    }
}
