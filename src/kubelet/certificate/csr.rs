//! The node's key and CertificateSigningRequest, and waiting for the CSR to be approved and
//! signed.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateSigningRequestDer;
use rustls::pki_types::pem::PemObject;
use tokio_util::sync::CancellationToken;
use x509_parser::prelude::FromDer;

use crate::base::clock;

/// The signer of kubelet client certificates.
pub const SIGNER_NAME: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The signer of the node API's serving certificates (never auto-approved upstream).
pub const SERVING_SIGNER_NAME: &str = "kubernetes.io/kubelet-serving";

/// The organisation of every node's certificate.
pub const NODES_GROUP: &str = "system:nodes";

/// The subject a node's client certificate must have (the Node authorizer and the CSR
/// approver check it): `CN=system:node:<name>`, `O=system:nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organization: String,
}

pub fn node_subject(node_name: &str) -> Subject {
    Subject {
        common_name: format!("system:node:{node_name}"),
        organization: NODES_GROUP.into(),
    }
}

/// The kind of key a CSR is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Ecdsa,
    Rsa,
}

/// The usages a kubelet client CSR asks for: key encipherment only for RSA keys (the
/// signer rejects it for others).
pub fn usages(kind: KeyKind) -> Vec<String> {
    let mut u = vec!["digital signature".to_string()];
    if kind == KeyKind::Rsa {
        u.push("key encipherment".into());
    }
    u.push("client auth".into());
    u
}

/// The usages a kubelet serving CSR asks for (key encipherment only for RSA keys).
pub fn serving_usages(kind: KeyKind) -> Vec<String> {
    let mut u = vec!["digital signature".to_string()];
    if kind == KeyKind::Rsa {
        u.push("key encipherment".into());
    }
    u.push("server auth".into());
    u
}

/// A new private key and a CSR signed with it.
pub struct NewRequest {
    pub key_pem: String,
    pub csr_pem: String,
}

/// Why no key or CSR could be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the key or CSR: {0}")]
pub struct GenerateError(String);

/// An ECDSA P-256 key (as upstream) and a CSR for the node's subject.
pub fn generate(node_name: &str) -> Result<NewRequest, GenerateError> {
    generate_with_names(node_name, &[], &[])
}

/// Like [`generate`], with subject alternative names (a serving certificate's).
pub fn generate_with_names(
    node_name: &str,
    dns_names: &[String],
    ips: &[std::net::IpAddr],
) -> Result<NewRequest, GenerateError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| GenerateError(e.to_string()))?;
    let subject = node_subject(node_name);
    let mut params = rcgen::CertificateParams::default();
    for name in dns_names {
        let dns = name
            .as_str()
            .try_into()
            .map_err(|e: rcgen::Error| GenerateError(format!("{name:?}: {e}")))?;
        params.subject_alt_names.push(rcgen::SanType::DnsName(dns));
    }
    for ip in ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, subject.organization);
    dn.push(rcgen::DnType::CommonName, subject.common_name);
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&key)
        .map_err(|e| GenerateError(e.to_string()))?;
    Ok(NewRequest {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem().map_err(|e| GenerateError(e.to_string()))?,
    })
}

/// The common name of a PEM CSR (tests use it to find a node's CSRs).
pub fn csr_common_name(pem: &[u8]) -> Option<String> {
    let der = CertificateSigningRequestDer::from_pem_slice(pem).ok()?;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .ok()?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some(cn)
}

/// The CSR object for `request`.
pub fn csr_object(generate_name: &str, request: &NewRequest) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(generate_name.into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.csr_pem.clone().into_bytes()),
            signer_name: SIGNER_NAME.into(),
            usages: Some(usages(KeyKind::Ecdsa)),
            ..Default::default()
        },
        status: None,
    }
}

/// The serving CSR object for `request` (`kubernetes.io/kubelet-serving`).
pub fn serving_csr_object(generate_name: &str, request: &NewRequest) -> CertificateSigningRequest {
    let mut csr = csr_object(generate_name, request);
    csr.spec.signer_name = SERVING_SIGNER_NAME.into();
    csr.spec.usages = Some(serving_usages(KeyKind::Ecdsa));
    csr
}

/// Where a CSR stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrState {
    Pending,
    /// Approved and signed: the certificate (PEM).
    Issued(Vec<u8>),
    Denied(String),
    Failed(String),
}

/// Reads a CSR's conditions and certificate. Denied and Failed win over Approved; an
/// approved CSR without a certificate yet is still pending.
pub fn csr_state(csr: &CertificateSigningRequest) -> CsrState {
    let Some(status) = &csr.status else {
        return CsrState::Pending;
    };
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let why = |c: &k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition| {
        let reason = c.reason.as_deref().unwrap_or("");
        let message = c.message.as_deref().unwrap_or("");
        match (reason.is_empty(), message.is_empty()) {
            (true, true) => "no reason given".to_string(),
            (false, true) => reason.to_string(),
            (true, false) => message.to_string(),
            (false, false) => format!("{reason}: {message}"),
        }
    };
    for c in conditions {
        if c.type_ == "Denied" && c.status != "False" {
            return CsrState::Denied(why(c));
        }
        if c.type_ == "Failed" && c.status != "False" {
            return CsrState::Failed(why(c));
        }
    }
    let approved = conditions
        .iter()
        .any(|c| c.type_ == "Approved" && c.status != "False");
    match &status.certificate {
        Some(cert) if approved && !cert.0.is_empty() => CsrState::Issued(cert.0.clone()),
        _ => CsrState::Pending,
    }
}

/// The CSR calls (the certificate managers' seam; [`KubeCsrApi`] is the one implementation,
/// unit-tested against the fake API server).
pub trait CsrApi: Send + Sync {
    /// Creates the CSR; returns its name.
    fn create(
        &self,
        csr: &CertificateSigningRequest,
    ) -> impl Future<Output = Result<String, kube::Error>> + Send;
    fn get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<CertificateSigningRequest, kube::Error>> + Send;
}

/// [`CsrApi`] on a kube client.
#[derive(Clone)]
pub struct KubeCsrApi(pub kube::Client);

impl CsrApi for KubeCsrApi {
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, kube::Error> {
        let api: Api<CertificateSigningRequest> = Api::all(self.0.clone());
        let made = api.create(&PostParams::default(), csr).await?;
        Ok(made.metadata.name.unwrap_or_default())
    }

    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, kube::Error> {
        let api: Api<CertificateSigningRequest> = Api::all(self.0.clone());
        api.get(name).await
    }
}

/// Why a CSR brought no certificate.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error("cannot create the CSR: {0}")]
    Create(String),
    #[error("CSR {name} was denied: {reason}")]
    Denied { name: String, reason: String },
    #[error("CSR {name} failed: {reason}")]
    Failed { name: String, reason: String },
    #[error(
        "CSR {name} was not approved and signed within {waited:?} (client CSRs: is the \
         controller-manager's CSR approver running, and may this identity create them? serving \
         CSRs: someone must approve them, e.g. `kubectl certificate approve {name}`)"
    )]
    TimedOut { name: String, waited: Duration },
    #[error("CSR {name} was signed, but the certificate is unusable: {reason}")]
    BadCertificate { name: String, reason: String },
    #[error("stopped while waiting for a certificate")]
    Cancelled,
}

/// A signed certificate with its key.
pub struct Issued {
    /// The certificate(s) followed by the key, PEM: what the store writes.
    pub pem: Vec<u8>,
    pub credentials: super::Credentials,
    pub csr_name: String,
}

impl Issued {
    /// Writes the certificate and key to `store` as its newest and logs `outcome` with the
    /// CSR, file and expiry (the client rotation and the serving request log alike); hands
    /// the credentials back for the caller's slot.
    pub(crate) fn keep(
        self,
        store: &super::FileStore,
        outcome: &'static str,
    ) -> Result<super::Credentials, RequestError> {
        let path = store.store(&self.pem, clock::timestamp()).map_err(|e| {
            RequestError::BadCertificate {
                name: self.csr_name.clone(),
                reason: format!("cannot store it: {e}"),
            }
        })?;
        tracing::info!(
            csr = %self.csr_name,
            cert = %path.display(),
            not_after = %super::bootstrap::jiff_time(self.credentials.not_after),
            "{outcome}"
        );
        Ok(self.credentials)
    }
}

/// Makes a key and a CSR, creates it and polls it (200 ms, doubling up to 2 s) until it is
/// signed, denied, failed, or `wait` has passed. A failed GET is retried until then.
pub async fn request_certificate<A: CsrApi>(
    api: &A,
    node_name: &str,
    generate_name: &str,
    wait: Duration,
    cancel: &CancellationToken,
) -> Result<Issued, RequestError> {
    let request = generate(node_name)?;
    let object = csr_object(generate_name, &request);
    submit_and_wait(api, request, &object, wait, cancel).await
}

/// Creates `object` (made from `request`) and polls it (200 ms, doubling up to 2 s) until
/// it is signed, denied, failed, or `wait` has passed.
pub async fn submit_and_wait<A: CsrApi>(
    api: &A,
    request: NewRequest,
    object: &CertificateSigningRequest,
    wait: Duration,
    cancel: &CancellationToken,
) -> Result<Issued, RequestError> {
    let name = api
        .create(object)
        .await
        .map_err(|e| RequestError::Create(crate::clients::apiserver::problem::cause_chain(&e)))?;
    tracing::info!(csr = %name, "created a certificate signing request; waiting for it to be approved and signed");
    let started = clock::instant();
    let mut pause = Duration::from_millis(200);
    loop {
        match api.get(&name).await {
            Ok(csr) => match csr_state(&csr) {
                CsrState::Pending => {}
                CsrState::Denied(reason) => return Err(RequestError::Denied { name, reason }),
                CsrState::Failed(reason) => return Err(RequestError::Failed { name, reason }),
                CsrState::Issued(cert) => {
                    let mut pem = cert;
                    if !pem.ends_with(b"\n") {
                        pem.push(b'\n');
                    }
                    pem.extend_from_slice(request.key_pem.as_bytes());
                    let credentials = super::Credentials::from_pem(&pem).map_err(|reason| {
                        RequestError::BadCertificate {
                            name: name.clone(),
                            reason: reason.to_string(),
                        }
                    })?;
                    return Ok(Issued {
                        pem,
                        credentials,
                        csr_name: name,
                    });
                }
            },
            Err(e) => tracing::debug!(csr = %name, error = %e, "cannot read the CSR; trying again"),
        }
        if started.elapsed() >= wait {
            return Err(RequestError::TimedOut {
                name,
                waited: started.elapsed(),
            });
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(RequestError::Cancelled),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Rule};
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn subject_and_usages() {
        assert_eq!(
            node_subject("n1"),
            Subject {
                common_name: "system:node:n1".into(),
                organization: "system:nodes".into()
            }
        );
        assert_eq!(usages(KeyKind::Ecdsa), ["digital signature", "client auth"]);
        assert_eq!(
            usages(KeyKind::Rsa),
            ["digital signature", "key encipherment", "client auth"]
        );
    }

    #[test]
    fn generated_csr_names_the_node() {
        let r = generate("node-a.example").unwrap();
        assert_eq!(
            csr_common_name(r.csr_pem.as_bytes()).as_deref(),
            Some("system:node:node-a.example")
        );
        assert!(r.key_pem.contains("PRIVATE KEY"));
        let obj = csr_object("node-csr-", &r);
        assert_eq!(obj.spec.signer_name, SIGNER_NAME);
        assert_eq!(csr_common_name(b"garbage"), None);
    }

    fn cond(t: &str, status: &str, reason: &str) -> CertificateSigningRequestCondition {
        CertificateSigningRequestCondition {
            type_: t.into(),
            status: status.into(),
            reason: (!reason.is_empty()).then(|| reason.into()),
            ..Default::default()
        }
    }

    fn with(
        conds: Vec<CertificateSigningRequestCondition>,
        cert: Option<&str>,
    ) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(conds),
                certificate: cert.map(|c| ByteString(c.as_bytes().to_vec())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn state_table() {
        let cases: Vec<(CertificateSigningRequest, CsrState)> = vec![
            (CertificateSigningRequest::default(), CsrState::Pending),
            (with(vec![], None), CsrState::Pending),
            (
                with(vec![cond("Approved", "True", "")], None),
                CsrState::Pending,
            ),
            (
                with(vec![cond("Approved", "True", "")], Some("")),
                CsrState::Pending,
            ),
            (
                with(vec![cond("Approved", "True", "")], Some("CERT")),
                CsrState::Issued(b"CERT".to_vec()),
            ),
            // A certificate without approval is not taken.
            (with(vec![], Some("CERT")), CsrState::Pending),
            (
                with(vec![cond("Denied", "True", "NotMine")], None),
                CsrState::Denied("NotMine".into()),
            ),
            (
                with(
                    vec![cond("Approved", "True", ""), cond("Failed", "True", "")],
                    Some("C"),
                ),
                CsrState::Failed("no reason given".into()),
            ),
            (
                with(vec![cond("Approved", "False", "")], Some("C")),
                CsrState::Pending,
            ),
        ];
        for (i, (csr, want)) in cases.into_iter().enumerate() {
            assert_eq!(csr_state(&csr), want, "case {i}");
        }
    }

    /// The CSR calls of the code under test, on the fake API server.
    fn fake_api() -> (FakeApiServer, KubeCsrApi) {
        let fake = FakeApiServer::new();
        let api = KubeCsrApi(fake.client());
        (fake, api)
    }

    fn gets() -> Rule {
        Rule::new("get", "certificatesigningrequests")
    }

    /// The one CSR the code under test created.
    fn the_csr(fake: &FakeApiServer) -> CertificateSigningRequest {
        let mut all = fake.list::<CertificateSigningRequest>(None);
        assert_eq!(all.len(), 1, "one CSR created");
        all.remove(0)
    }

    /// The signer's side: the `polls + 1`-th GET of a CSR finds `status` set on it in the
    /// store (the earlier ones find it pending, as created).
    fn settle_after(fake: &FakeApiServer, polls: usize, status: CertificateSigningRequestStatus) {
        let (store, seen) = (fake.clone(), AtomicUsize::new(0));
        fake.respond(gets(), move |req| {
            if seen.fetch_add(1, Ordering::SeqCst) == polls {
                let name = req.name.as_deref().unwrap_or_default();
                store.modify::<CertificateSigningRequest>("", name, |csr| {
                    csr.status = Some(status.clone())
                });
            }
            None
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_denied_csr_is_a_clear_error() {
        let (fake, api) = fake_api();
        let denied = with(vec![cond("Denied", "True", "NoWay")], None);
        settle_after(&fake, 3, denied.status.unwrap());
        let err = request_certificate(
            &api,
            "n",
            "csr-",
            Duration::from_secs(60),
            &CancellationToken::new(),
        )
        .await
        .err()
        .unwrap();
        let csr = the_csr(&fake);
        let name = csr.metadata.name.unwrap();
        assert!(name.starts_with("csr-"), "named from generateName: {name}");
        assert_eq!(err.to_string(), format!("CSR {name} was denied: NoWay"));
        assert_eq!(fake.count(&gets()), 4);
        // What was asked for: the node's subject, the client signer and usages.
        assert_eq!(
            csr_common_name(&csr.spec.request.0).as_deref(),
            Some("system:node:n")
        );
        assert_eq!(csr.spec.signer_name, SIGNER_NAME);
        assert_eq!(csr.spec.usages, Some(usages(KeyKind::Ecdsa)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_never_approved_csr_times_out() {
        let (fake, api) = fake_api();
        let err = request_certificate(
            &api,
            "n",
            "csr-",
            Duration::from_secs(30),
            &CancellationToken::new(),
        )
        .await
        .err()
        .unwrap();
        assert!(matches!(err, RequestError::TimedOut { .. }), "{err}");
        assert_eq!(csr_state(&the_csr(&fake)), CsrState::Pending);
    }

    #[tokio::test(start_paused = true)]
    async fn garbage_from_the_signer_is_rejected() {
        let (fake, api) = fake_api();
        let garbage = with(vec![cond("Approved", "True", "")], Some("not a cert"));
        settle_after(&fake, 0, garbage.status.unwrap());
        let err = request_certificate(
            &api,
            "n",
            "csr-",
            Duration::from_secs(30),
            &CancellationToken::new(),
        )
        .await
        .err()
        .unwrap();
        assert!(matches!(err, RequestError::BadCertificate { .. }), "{err}");
        assert_eq!(fake.count(&gets()), 1);
    }
}
