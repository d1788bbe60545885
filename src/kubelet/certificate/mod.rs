//! The node's client certificate: TLS bootstrap (`--bootstrap-kubeconfig`) and rotation
//! (`rotateCertificates`), as upstream's kubelet does them.
//!
//! * [`bootstrap`]: with a bootstrap kubeconfig and a `--kubeconfig` that is missing or holds
//!   no usable certificate, a new key and a CertificateSigningRequest are made, the signed
//!   certificate is stored in the cert dir and a kubeconfig pointing at it is written.
//! * [`store`]: `<certDir>/kubelet-client-<timestamp>.pem` (certificate and key) and the
//!   `kubelet-client-current.pem` link to the newest.
//! * [`csr`]: the key, the CSR, and waiting for it to be approved and signed.
//! * [`deadline`]: when to rotate (70-90 % of the certificate's life, jittered).
//! * [`slot`]: the current key pair, shared by the API clients' TLS configuration, so a
//!   rotated certificate is used by every new connection without a restart.
//! * [`manager`]: the rotation loop.
//! * [`serving`]: the node API's serving certificate by CSR (`serverTLSBootstrap`).

pub(crate) mod bootstrap;
pub(crate) mod credentials;
pub mod csr;
pub(crate) mod deadline;
pub(crate) mod manager;
pub(crate) mod serving;
pub(crate) mod slot;
pub mod store;

pub use credentials::Credentials;
pub use slot::CertSlot;
pub use store::FileStore;
