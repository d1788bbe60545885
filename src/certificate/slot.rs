//! The current client key pair, shared between the rotation loop (which replaces it) and
//! the TLS configuration of every API client (which presents it on each new connection).

use std::sync::{Arc, RwLock};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

use super::Credentials;

/// A shared, replaceable [`Credentials`].
#[derive(Debug, Clone)]
pub struct CertSlot(Arc<RwLock<Arc<Credentials>>>);

impl CertSlot {
    pub fn new(credentials: Credentials) -> CertSlot {
        CertSlot(Arc::new(RwLock::new(Arc::new(credentials))))
    }

    /// The current credentials.
    pub fn get(&self) -> Arc<Credentials> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the credentials: connections made from now on present the new certificate;
    /// open connections (and the watches on them) stay as they are.
    pub fn set(&self, credentials: Credentials) {
        let new = Arc::new(credentials);
        match self.0.write() {
            Ok(mut g) => *g = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// A rustls client-certificate resolver reading this slot.
    pub fn resolver(&self) -> Arc<dyn ResolvesClientCert> {
        Arc::new(SlotResolver(self.clone()))
    }
}

#[derive(Debug)]
struct SlotResolver(CertSlot);

impl ResolvesClientCert for SlotResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let current = self.0.get();
        // Offer the certificate only if the server accepts a scheme our key can sign with.
        current.key.key.choose_scheme(sigschemes)?;
        Some(current.key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
