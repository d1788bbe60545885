//! The node API's serving certificate by CSR (`serverTLSBootstrap`,
//! `--rotate-server-certificates`): a `kubernetes.io/kubelet-serving` CSR for
//! `CN=system:node:<name>`, `O=system:nodes`, with the node's host name and IP as subject
//! alternative names. Upstream's controller-manager never approves these by itself: an
//! operator (or an approver they run) does, with `kubectl certificate approve`. Until then
//! the slot stays empty and the node API accepts no TLS handshake, as upstream's.
//!
//! Signed certificates are stored as `kubelet-server-<timestamp>.pem` with a
//! `kubelet-server-current.pem` link, and renewed at 70–90 % of their life; new
//! handshakes present the new one at once (open connections keep theirs).

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use super::bootstrap::jiff_time;
use super::csr::{CsrApi, RequestError, generate_with_names, serving_csr_object, submit_and_wait};
use super::deadline::{jitter, retry_with_backoff, rotation_deadline, wait_for};
use super::{Credentials, FileStore};
use crate::base::clock;

/// How long one serving CSR waits for someone to approve it before a new one is made.
const CSR_WAIT: Duration = Duration::from_secs(15 * 60);

/// The serving certificate of the moment, shared with the node API's TLS configuration;
/// empty until the first CSR is signed.
#[derive(Clone, Default, Debug)]
pub struct ServingSlot(Arc<RwLock<Option<Arc<Credentials>>>>);

impl ServingSlot {
    pub fn with(credentials: Credentials) -> ServingSlot {
        let slot = ServingSlot::default();
        slot.set(credentials);
        slot
    }

    pub fn get(&self) -> Option<Arc<Credentials>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// New handshakes present `credentials`; open connections keep theirs.
    pub fn set(&self, credentials: Credentials) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(credentials));
    }
}

/// The names a serving certificate is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeAddresses {
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

/// The node's addresses as its Node reports them: the host name (the node name) and the
/// InternalIP.
pub(crate) fn node_addresses(node_name: &str, host_ip: Option<IpAddr>) -> NodeAddresses {
    NodeAddresses {
        dns_names: vec![node_name.to_string()],
        ips: host_ip.into_iter().collect(),
    }
}

/// The DNS names and IPs a certificate (DER) is valid for.
pub(crate) fn certificate_names(der: &[u8]) -> NodeAddresses {
    let mut out = NodeAddresses::default();
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(der) else {
        return out;
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => out.dns_names.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => out
                        .ips
                        .push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or([0; 4]))),
                    16 => out
                        .ips
                        .push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or([0; 16]))),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    out
}

/// Whether a certificate with names `have` serves every name in `want` (a changed address
/// calls for a new certificate, as upstream's manager notices a changed template).
pub(crate) fn covers(have: &NodeAddresses, want: &NodeAddresses) -> bool {
    want.dns_names.iter().all(|d| have.dns_names.contains(d))
        && want.ips.iter().all(|i| have.ips.contains(i))
}

/// Requests, stores and renews the serving certificate.
pub(crate) struct ServingRotation<A> {
    pub api: A,
    pub slot: ServingSlot,
    pub store: FileStore,
    pub node_name: String,
    pub addresses: NodeAddresses,
}

impl<A: CsrApi> ServingRotation<A> {
    /// Runs until `cancel` fires.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        match self.store.current() {
            Ok(Some((path, creds))) => {
                let names = creds
                    .key
                    .cert
                    .first()
                    .map(|c| certificate_names(c.as_ref()))
                    .unwrap_or_default();
                if !creds.valid_at(clock::now()) {
                    tracing::info!(cert = %path.display(), "the stored serving certificate is not valid now; requesting a new one");
                } else if !covers(&names, &self.addresses) {
                    tracing::info!(cert = %path.display(), have = ?names, want = ?self.addresses, "the stored serving certificate does not name the node's addresses; requesting a new one");
                } else {
                    tracing::info!(cert = %path.display(), "using the stored serving certificate");
                    self.slot.set(creds);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the stored serving certificate is unusable; requesting a new one")
            }
        }
        loop {
            let now = clock::now();
            let deadline = match self.slot.get() {
                Some(c) => rotation_deadline(c.not_before, c.not_after, jitter()),
                None => now,
            };
            if deadline > now {
                tracing::info!(deadline = %jiff_time(deadline), "serving certificate rotation deadline");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait_for(deadline, now)) => {}
            }
            let got = retry_with_backoff(
                &cancel,
                || self.request_once(&cancel),
                |e, pause| {
                    if matches!(e, RequestError::Cancelled) {
                        return false;
                    }
                    tracing::error!(error = %e, retry_in = ?pause, "could not get a serving certificate; trying again");
                    true
                },
            )
            .await;
            if got.is_err() {
                return;
            }
        }
    }

    async fn request_once(&self, cancel: &CancellationToken) -> Result<(), RequestError> {
        let request = generate_with_names(
            &self.node_name,
            &self.addresses.dns_names,
            &self.addresses.ips,
        )?;
        let object = serving_csr_object("csr-", &request);
        tracing::info!(node = %self.node_name, names = ?self.addresses, "requesting a serving certificate (kubernetes.io/kubelet-serving); it must be approved, e.g. with `kubectl certificate approve`");
        let issued = submit_and_wait(&self.api, request, &object, CSR_WAIT, cancel).await?;
        let credentials = issued.keep(
            &self.store,
            "got a serving certificate; the node API presents it from now on",
        )?;
        self.slot.set(credentials);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_csr_names_the_node_and_its_addresses() {
        let addrs = node_addresses("node-a", Some("127.0.0.1".parse().unwrap()));
        let r = generate_with_names("node-a", &addrs.dns_names, &addrs.ips).unwrap();
        let obj = serving_csr_object("csr-", &r);
        assert_eq!(obj.spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(
            obj.spec.usages.as_deref().unwrap(),
            ["digital signature", "server auth"]
        );
        assert_eq!(
            super::super::csr::csr_common_name(r.csr_pem.as_bytes()).as_deref(),
            Some("system:node:node-a")
        );
    }

    #[test]
    fn covering_names() {
        let want = node_addresses("n", Some("10.0.0.1".parse().unwrap()));
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["n".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("10.0.0.1".parse().unwrap()));
        let cert = params.self_signed(&key).unwrap();
        let have = certificate_names(cert.der());
        assert_eq!(have, want);
        assert!(covers(&have, &want));
        let moved = node_addresses("n", Some("10.0.0.2".parse().unwrap()));
        assert!(!covers(&have, &moved));
    }
}
