//! A certificate chain with its private key, parsed once: the rustls signing key and the
//! validity the rotation deadline is computed from.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_parser::prelude::FromDer;

/// A client certificate (chain) and its key.
#[derive(Clone)]
pub struct Credentials {
    /// The certificates and the key, PEM, as stored.
    pub pem: Vec<u8>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The leaf's subject, as `CN=...,O=...`.
    pub subject: String,
    pub key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("subject", &self.subject)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Seconds since the epoch (may be negative) as a `SystemTime`.
pub(crate) fn unix_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// Why a certificate, or a certificate chain with its key, is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("not an X.509 certificate: {0}")]
    NotX509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("bad PEM: {0}")]
    BadPem(#[source] rustls::pki_types::pem::Error),
    #[error("holds no certificate")]
    NoCertificate,
    #[error("holds no usable private key: {0}")]
    NoPrivateKey(#[source] rustls::pki_types::pem::Error),
    #[error("unsupported private key: {0}")]
    UnsupportedKey(#[source] rustls::Error),
    #[error("the key does not belong to the certificate: {0}")]
    KeyMismatch(#[source] rustls::Error),
}

/// Validity and subject of a DER certificate.
pub(crate) fn certificate_validity(
    der: &[u8],
) -> Result<(SystemTime, SystemTime, String), CredentialsError> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(CredentialsError::NotX509)?;
    let validity = cert.validity();
    Ok((
        unix_time(validity.not_before.timestamp()),
        unix_time(validity.not_after.timestamp()),
        cert.subject().to_string(),
    ))
}

impl Credentials {
    /// Parses PEM holding one or more certificates (the leaf first) and a private key.
    pub fn from_pem(pem: &[u8]) -> Result<Credentials, CredentialsError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(CredentialsError::BadPem)?;
        let leaf = certs.first().ok_or(CredentialsError::NoCertificate)?;
        let (not_before, not_after, subject) = certificate_validity(leaf)?;
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(CredentialsError::NoPrivateKey)?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(CredentialsError::UnsupportedKey)?;
        let certified = CertifiedKey::new(certs, signing);
        certified
            .keys_match()
            .map_err(CredentialsError::KeyMismatch)?;
        Ok(Credentials {
            pem: pem.to_vec(),
            not_before,
            not_after,
            subject,
            key: Arc::new(certified),
        })
    }

    /// Whether `now` lies within the certificate's validity.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}
