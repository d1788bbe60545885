//! The servers' section: where the node API, the read-only port and healthz listen, and the
//! node API's settings (port 10250): its TLS certificate, and how requests are
//! authenticated and authorized. Names, meanings and defaults are `KubeletConfiguration`
//! v1beta1's (`address`, `port`, `tlsCertFile`, `serverTLSBootstrap`, `authentication`,
//! `authorization`).
//!
//! Upstream's kubelet, started without a config file, falls back to the old flag defaults
//! (anonymous requests allowed, `AlwaysAllow`); Deckhand keeps the file's safe defaults in
//! both cases: anonymous off, tokens checked by TokenReview, requests authorized by
//! SubjectAccessReview.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::ConfigError;
use super::duration::parse_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{file_ip, file_port, pick};

pub(crate) const DEFAULT_AUTHN_CACHE_TTL: Duration = Duration::from_secs(120);
pub(crate) const DEFAULT_AUTHZ_ALLOWED_TTL: Duration = Duration::from_secs(300);
pub(crate) const DEFAULT_AUTHZ_DENIED_TTL: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_PORT: u16 = 10250;
pub(crate) const DEFAULT_READ_ONLY_PORT: u16 = 0;
pub(crate) const DEFAULT_HEALTHZ_PORT: u16 = 10248;
/// `streamingConnectionIdleTimeout`'s default, upstream's.
pub(crate) const DEFAULT_STREAMING_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// The node API's flags (flattened into [`super::Flags`]).
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct ServerFlags {
    /// Serve the node API on --address:--port (true/false). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = super::flags::parse_go_bool)]
    pub enable_server: Option<bool>,

    /// Serving certificate of the node API (PEM, with intermediates after it). Without it
    /// and --tls-private-key-file, a self-signed certificate is made in --cert-dir.
    #[arg(long, value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key of --tls-cert-file (PEM).
    #[arg(long, value_name = "PATH")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Lowest TLS version of the node API: VersionTLS12 or VersionTLS13. [default: VersionTLS12]
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,

    /// Comma-separated TLS 1.2 cipher suites (Go's names) the node API offers; TLS 1.3's are
    /// not configurable. [default: every ECDHE suite with AES-GCM or ChaCha20-Poly1305]
    #[arg(long, value_name = "SUITE,...", value_delimiter = ',')]
    pub tls_cipher_suites: Option<Vec<String>>,

    /// Request the node API's serving certificate from the cluster by a
    /// kubernetes.io/kubelet-serving CSR, and renew it before it expires (serverTLSBootstrap).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = super::flags::parse_go_bool)]
    pub rotate_server_certificates: Option<bool>,

    /// CA bundle that client certificates of node API requests are verified against
    /// (authentication.x509.clientCAFile).
    #[arg(long, value_name = "PATH")]
    pub client_ca_file: Option<PathBuf>,

    /// Let requests that no authenticator accepts through as system:anonymous (true/false).
    /// [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = super::flags::parse_go_bool)]
    pub anonymous_auth: Option<bool>,

    /// Check bearer tokens with a TokenReview (true/false). [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = super::flags::parse_go_bool)]
    pub authentication_token_webhook: Option<bool>,

    /// How long TokenReview answers are kept. [default: 2m0s]
    #[arg(long, value_name = "DURATION", value_parser = super::flags::parse_duration_arg)]
    pub authentication_token_webhook_cache_ttl: Option<Duration>,

    /// AlwaysAllow or Webhook (SubjectAccessReview). [default: Webhook]
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,

    /// How long an allowing SubjectAccessReview answer is kept. [default: 5m0s]
    #[arg(long, value_name = "DURATION", value_parser = super::flags::parse_duration_arg)]
    pub authorization_webhook_cache_authorized_ttl: Option<Duration>,

    /// How long a denying SubjectAccessReview answer is kept. [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = super::flags::parse_duration_arg)]
    pub authorization_webhook_cache_unauthorized_ttl: Option<Duration>,

    /// Close a logs-follow, exec, attach or port-forward stream of the node API after this
    /// long without traffic (0: never). [default: 4h0m0s]
    #[arg(long, value_name = "DURATION", value_parser = super::flags::parse_duration_arg)]
    pub streaming_connection_idle_timeout: Option<Duration>,
}

/// `authentication` in the file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationFile {
    pub x509: Option<X509File>,
    pub webhook: Option<AuthnWebhookFile>,
    pub anonymous: Option<AnonymousFile>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct X509File {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthnWebhookFile {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnonymousFile {
    pub enabled: Option<bool>,
}

/// `authorization` in the file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationFile {
    pub mode: Option<String>,
    pub webhook: Option<AuthzWebhookFile>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthzWebhookFile {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}

/// The lowest TLS version the node API accepts (rustls has nothing older than 1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMinVersion {
    #[default]
    Tls12,
    Tls13,
}

/// The TLS 1.2 cipher suites Deckhand can offer, by Go's names (and Go's short aliases of
/// the ChaCha20 ones): ECDHE key exchange with an AEAD cipher only. Go's CBC, RC4, 3DES and
/// plain-RSA suites are refused.
pub(crate) const TLS12_SUITES: &[(&str, &str)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// How the node API decides who may do what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    /// Ask the API server with a SubjectAccessReview.
    Webhook,
}

/// The node API's merged settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// `enableServer`: serve the node API at all (default true).
    pub enable_server: bool,
    /// `tlsCertFile` and `tlsPrivateKeyFile`, given together or not at all.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// `serverTLSBootstrap` / `--rotate-server-certificates`.
    pub server_tls_bootstrap: bool,
    /// `tlsMinVersion` / `--tls-min-version`.
    pub tls_min_version: TlsMinVersion,
    /// `tlsCipherSuites` / `--tls-cipher-suites`: the TLS 1.2 suites offered (rustls' names);
    /// empty for all of [`TLS12_SUITES`].
    pub tls_cipher_suites: Vec<String>,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    pub anonymous_enabled: bool,
    /// `authentication.webhook.enabled`.
    pub token_webhook_enabled: bool,
    /// `authentication.webhook.cacheTTL`.
    pub token_cache_ttl: Duration,
    pub authorization_mode: AuthorizationMode,
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    /// `streamingConnectionIdleTimeout`: a node API stream without traffic this long is
    /// closed (zero: never).
    pub streaming_idle_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            enable_server: true,
            tls_files: None,
            server_tls_bootstrap: false,
            tls_min_version: TlsMinVersion::Tls12,
            tls_cipher_suites: Vec::new(),
            client_ca_file: None,
            anonymous_enabled: false,
            token_webhook_enabled: true,
            token_cache_ttl: DEFAULT_AUTHN_CACHE_TTL,
            authorization_mode: AuthorizationMode::Webhook,
            authorized_ttl: DEFAULT_AUTHZ_ALLOWED_TTL,
            unauthorized_ttl: DEFAULT_AUTHZ_DENIED_TTL,
            streaming_idle_timeout: DEFAULT_STREAMING_IDLE_TIMEOUT,
        }
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(field, reason)
}

fn duration(
    flag: Option<Duration>,
    file: Option<&str>,
    field: &str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    if let Some(d) = flag {
        return Ok(d);
    }
    match file {
        Some(text) => parse_go_duration(text)
            .map_err(|e| invalid(field, format!("invalid duration {text:?}: {e}"))),
        None => Ok(default),
    }
}

/// Where the three servers listen.
pub(super) struct Ports {
    pub address: IpAddr,
    pub port: u16,
    /// 0 = off.
    pub read_only_port: u16,
    /// 0 = off.
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
}

/// The servers' addresses and ports. The read-only port and healthz may be 0 (off); the node
/// API's port may not, as upstream (`enableServer` is what turns that server off).
pub(super) fn ports(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Ports, ConfigError> {
    let (address, _) = pick(
        flags.address,
        "--address",
        file_ip(f.address.as_deref(), "address")?,
        "address",
        || IpAddr::from([0, 0, 0, 0]),
    );
    let (port, o) = pick(
        flags.port,
        "--port",
        file_port(f.port, "port")?,
        "port",
        || DEFAULT_PORT,
    );
    if port == 0 {
        return Err(invalid(
            o.name(),
            "0 is not a valid port for the node server (must be 1-65535)",
        ));
    }
    let (read_only_port, _) = pick(
        flags.read_only_port,
        "--read-only-port",
        file_port(f.read_only_port, "readOnlyPort")?,
        "readOnlyPort",
        || DEFAULT_READ_ONLY_PORT,
    );
    let (healthz_port, _) = pick(
        flags.healthz_port,
        "--healthz-port",
        file_port(f.healthz_port, "healthzPort")?,
        "healthzPort",
        || DEFAULT_HEALTHZ_PORT,
    );
    let (healthz_bind_address, _) = pick(
        flags.healthz_bind_address,
        "--healthz-bind-address",
        file_ip(f.healthz_bind_address.as_deref(), "healthzBindAddress")?,
        "healthzBindAddress",
        || IpAddr::from([127, 0, 0, 1]),
    );
    Ok(Ports {
        address,
        port,
        read_only_port,
        healthz_port,
        healthz_bind_address,
    })
}

/// Merges the node API's flags over the file over the defaults. `resolve` makes a path of
/// the file absolute (relative to the file's directory).
pub(super) fn server_settings(
    flags: &ServerFlags,
    f: &KubeletConfigurationFile,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<ServerSettings, ConfigError> {
    let d = ServerSettings::default();
    let tls_files = tls_files(flags, f, resolve)?;
    let authn = f.authentication.clone().unwrap_or_default();
    let authz = f.authorization.clone().unwrap_or_default();
    let x509 = authn.x509.unwrap_or_default();
    let webhook = authn.webhook.unwrap_or_default();
    let anonymous = authn.anonymous.unwrap_or_default();
    let authz_webhook = authz.webhook.unwrap_or_default();
    let authorization_mode = authorization_mode(flags, authz.mode)?;
    let tls_min_version = tls_min_version(flags, f)?;
    let tls_cipher_suites = tls_cipher_suites(flags, f)?;
    let settings = ServerSettings {
        tls_min_version,
        tls_cipher_suites,
        enable_server: flags.enable_server.or(f.enable_server).unwrap_or(true),
        tls_files,
        server_tls_bootstrap: flags
            .rotate_server_certificates
            .or(f.server_tls_bootstrap)
            .unwrap_or(false),
        client_ca_file: path(&flags.client_ca_file, &x509.client_ca_file, resolve),
        anonymous_enabled: flags
            .anonymous_auth
            .or(anonymous.enabled)
            .unwrap_or(d.anonymous_enabled),
        token_webhook_enabled: flags
            .authentication_token_webhook
            .or(webhook.enabled)
            .unwrap_or(d.token_webhook_enabled),
        token_cache_ttl: duration(
            flags.authentication_token_webhook_cache_ttl,
            webhook.cache_ttl.as_deref(),
            "authentication.webhook.cacheTTL",
            d.token_cache_ttl,
        )?,
        authorization_mode,
        authorized_ttl: duration(
            flags.authorization_webhook_cache_authorized_ttl,
            authz_webhook.cache_authorized_ttl.as_deref(),
            "authorization.webhook.cacheAuthorizedTTL",
            d.authorized_ttl,
        )?,
        unauthorized_ttl: duration(
            flags.authorization_webhook_cache_unauthorized_ttl,
            authz_webhook.cache_unauthorized_ttl.as_deref(),
            "authorization.webhook.cacheUnauthorizedTTL",
            d.unauthorized_ttl,
        )?,
        streaming_idle_timeout: duration(
            flags.streaming_connection_idle_timeout,
            f.streaming_connection_idle_timeout.as_deref(),
            "streamingConnectionIdleTimeout",
            d.streaming_idle_timeout,
        )?,
    };
    Ok(settings)
}

/// A path from the flag, else from the file (made absolute by `resolve`; empty means none).
fn path(
    flag: &Option<PathBuf>,
    file: &Option<String>,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Option<PathBuf> {
    flag.clone()
        .or_else(|| file.as_deref().filter(|s| !s.is_empty()).map(resolve))
}

/// The name of the flag when it was given, else the file's field.
fn from_flag(given: bool, flag: &'static str, file: &'static str) -> &'static str {
    if given { flag } else { file }
}

/// `tlsCertFile` and `tlsPrivateKeyFile`: both or neither (neither: a self-signed pair).
fn tls_files(
    flags: &ServerFlags,
    f: &KubeletConfigurationFile,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    let cert = path(&flags.tls_cert_file, &f.tls_cert_file, resolve);
    let key = path(
        &flags.tls_private_key_file,
        &f.tls_private_key_file,
        resolve,
    );
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(invalid(
            "tlsPrivateKeyFile",
            "must be given together with tlsCertFile",
        )),
        (None, Some(_)) => Err(invalid(
            "tlsCertFile",
            "must be given together with tlsPrivateKeyFile",
        )),
    }
}

/// `--authorization-mode` or `authorization.mode`: upstream's two, AlwaysAllow and Webhook.
fn authorization_mode(
    flags: &ServerFlags,
    file_mode: Option<String>,
) -> Result<AuthorizationMode, ConfigError> {
    let mode_text = flags.authorization_mode.clone().or(file_mode);
    match mode_text.as_deref() {
        None => Ok(ServerSettings::default().authorization_mode),
        Some("AlwaysAllow") => Ok(AuthorizationMode::AlwaysAllow),
        Some("Webhook") => Ok(AuthorizationMode::Webhook),
        Some(other) => Err(invalid(
            from_flag(
                flags.authorization_mode.is_some(),
                "--authorization-mode",
                "authorization.mode",
            ),
            format!("{other:?} is not an authorization mode (use AlwaysAllow or Webhook)"),
        )),
    }
}

/// `tlsMinVersion`: 1.2 or 1.3, the versions rustls has.
fn tls_min_version(
    flags: &ServerFlags,
    f: &KubeletConfigurationFile,
) -> Result<TlsMinVersion, ConfigError> {
    match flags
        .tls_min_version
        .clone()
        .or_else(|| f.tls_min_version.clone())
        .as_deref()
    {
        None | Some("") | Some("VersionTLS12") => Ok(TlsMinVersion::Tls12),
        Some("VersionTLS13") => Ok(TlsMinVersion::Tls13),
        Some(other) => Err(invalid(
            from_flag(
                flags.tls_min_version.is_some(),
                "--tls-min-version",
                "tlsMinVersion",
            ),
            format!(
                "{other:?} is not supported (use VersionTLS12 or VersionTLS13; older versions are not offered)"
            ),
        )),
    }
}

/// `tlsCipherSuites`: Go's names mapped to rustls' (each once, in the order given); a suite
/// Deckhand does not offer is refused, not dropped.
fn tls_cipher_suites(
    flags: &ServerFlags,
    f: &KubeletConfigurationFile,
) -> Result<Vec<String>, ConfigError> {
    let suites_field = from_flag(
        flags.tls_cipher_suites.is_some(),
        "--tls-cipher-suites",
        "tlsCipherSuites",
    );
    let mut tls_cipher_suites = Vec::new();
    for name in flags
        .tls_cipher_suites
        .clone()
        .or_else(|| f.tls_cipher_suites.clone())
        .unwrap_or_default()
    {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        match TLS12_SUITES.iter().find(|(go, _)| *go == name) {
            Some((_, ours)) => {
                if !tls_cipher_suites.iter().any(|s| s == ours) {
                    tls_cipher_suites.push(ours.to_string());
                }
            }
            None => {
                return Err(invalid(
                    suites_field,
                    format!(
                        "{name:?} is not offered: only ECDHE suites with AES-GCM or ChaCha20-Poly1305 are (TLS 1.3's are always on)"
                    ),
                ));
            }
        }
    }
    Ok(tls_cipher_suites)
}

impl ServerSettings {
    /// Where the self-signed certificate and key live: `kubelet.crt` and `kubelet.key` in
    /// the cert dir, as upstream.
    pub fn self_signed_paths(cert_dir: &Path) -> (PathBuf, PathBuf) {
        (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn file(yaml: &str) -> KubeletConfigurationFile {
        crate::config::parse_config_file(
            Path::new("/etc/deckhand/config.yaml"),
            &format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}"
            ),
        )
        .unwrap()
        .config
    }

    fn flags(args: &[&str]) -> ServerFlags {
        crate::config::Flags::try_parse_from(
            std::iter::once("deckhand").chain(args.iter().copied()),
        )
        .unwrap()
        .server
    }

    fn resolve(s: &str) -> PathBuf {
        Path::new("/etc/deckhand").join(s)
    }

    #[test]
    fn defaults_are_the_files_safe_ones() {
        let s = server_settings(&flags(&[]), &file(""), &resolve).unwrap();
        assert_eq!(s, ServerSettings::default());
        assert!(!s.anonymous_enabled);
        assert!(s.token_webhook_enabled);
        assert_eq!(s.authorization_mode, AuthorizationMode::Webhook);
        assert_eq!(s.token_cache_ttl, Duration::from_secs(120));
        assert_eq!(s.authorized_ttl, Duration::from_secs(300));
        assert_eq!(s.unauthorized_ttl, Duration::from_secs(30));
    }

    #[test]
    fn file_fields_and_flags_over_them() {
        let f = file(
            "tlsCertFile: tls.crt\ntlsPrivateKeyFile: /abs/tls.key\nserverTLSBootstrap: true\n\
             authentication:\n  x509:\n    clientCAFile: ca.crt\n  webhook:\n    enabled: false\n    cacheTTL: 10s\n  anonymous:\n    enabled: true\n\
             authorization:\n  mode: AlwaysAllow\n  webhook:\n    cacheAuthorizedTTL: 1m\n    cacheUnauthorizedTTL: 5s\n",
        );
        let s = server_settings(&flags(&[]), &f, &resolve).unwrap();
        assert_eq!(
            s.tls_files,
            Some(("/etc/deckhand/tls.crt".into(), "/abs/tls.key".into()))
        );
        assert!(s.server_tls_bootstrap);
        assert_eq!(s.client_ca_file, Some("/etc/deckhand/ca.crt".into()));
        assert!(!s.token_webhook_enabled);
        assert_eq!(s.token_cache_ttl, Duration::from_secs(10));
        assert!(s.anonymous_enabled);
        assert_eq!(s.authorization_mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(s.authorized_ttl, Duration::from_secs(60));
        assert_eq!(s.unauthorized_ttl, Duration::from_secs(5));

        let over = flags(&[
            "--client-ca-file=/x/ca.pem",
            "--anonymous-auth=false",
            "--authorization-mode=Webhook",
            "--authentication-token-webhook",
            "--rotate-server-certificates=false",
            "--enable-server=false",
        ]);
        let s = server_settings(&over, &f, &resolve).unwrap();
        assert_eq!(s.client_ca_file, Some("/x/ca.pem".into()));
        assert!(!s.anonymous_enabled);
        assert!(s.token_webhook_enabled);
        assert!(!s.server_tls_bootstrap);
        assert!(!s.enable_server);
        assert_eq!(s.authorization_mode, AuthorizationMode::Webhook);
    }

    #[test]
    fn the_streaming_idle_timeout_is_a_go_duration_in_the_file_and_the_flag() {
        let s = server_settings(&flags(&[]), &file(""), &resolve).unwrap();
        assert_eq!(s.streaming_idle_timeout, Duration::from_secs(4 * 3600));
        let f = file("streamingConnectionIdleTimeout: 1h30m\n");
        let s = server_settings(&flags(&[]), &f, &resolve).unwrap();
        assert_eq!(s.streaming_idle_timeout, Duration::from_secs(5400));
        let over = flags(&["--streaming-connection-idle-timeout=45s"]);
        let s = server_settings(&over, &f, &resolve).unwrap();
        assert_eq!(s.streaming_idle_timeout, Duration::from_secs(45));
        let never = file("streamingConnectionIdleTimeout: 0s\n");
        let s = server_settings(&flags(&[]), &never, &resolve).unwrap();
        assert_eq!(s.streaming_idle_timeout, Duration::ZERO);
    }

    #[test]
    fn tls_version_and_suites() {
        let f = file(
            "tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n",
        );
        let s = server_settings(&flags(&[]), &f, &resolve).unwrap();
        assert_eq!(s.tls_min_version, TlsMinVersion::Tls13);
        assert_eq!(
            s.tls_cipher_suites,
            [
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
            ]
        );
        let over = flags(&[
            "--tls-min-version=VersionTLS12",
            "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        ]);
        let s = server_settings(&over, &f, &resolve).unwrap();
        assert_eq!(s.tls_min_version, TlsMinVersion::Tls12);
        assert_eq!(
            s.tls_cipher_suites,
            ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]
        );
        // Every name we accept is one rustls offers.
        let offered: Vec<String> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        for (_, ours) in TLS12_SUITES {
            assert!(
                offered.iter().any(|o| o == ours),
                "{ours} not in {offered:?}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            ("tlsCertFile: a.crt\n", "tlsPrivateKeyFile"),
            ("tlsPrivateKeyFile: a.key\n", "tlsCertFile"),
            ("authorization:\n  mode: RBAC\n", "authorization.mode"),
            ("tlsMinVersion: VersionTLS10\n", "tlsMinVersion"),
            (
                "tlsCipherSuites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n",
                "tlsCipherSuites",
            ),
            (
                "authentication:\n  webhook:\n    cacheTTL: soon\n",
                "authentication.webhook.cacheTTL",
            ),
            (
                "streamingConnectionIdleTimeout: 4 hours\n",
                "streamingConnectionIdleTimeout",
            ),
        ];
        for (yaml, field) in cases {
            match server_settings(&flags(&[]), &file(yaml), &resolve) {
                Err(ConfigError::Invalid { field: got, .. }) => assert_eq!(got, field, "{yaml}"),
                other => panic!("{yaml}: {other:?}"),
            }
        }
    }
}
