//! Client certificate rotation: at the rotation deadline, a new key and CSR are made with
//! the current certificate's credentials (the node renews its own certificate), the signed
//! certificate is stored, and the shared [`CertSlot`] is updated so that new connections of
//! every API client present it. Open connections and their watches are left alone.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::bootstrap::jiff_time;
use super::csr::{CsrApi, RequestError, request_certificate};
use super::deadline::{jitter, retry_with_backoff, rotation_deadline, wait_for};
use super::{CertSlot, FileStore};
use crate::base::clock;

/// How long one renewal CSR may wait for approval.
const CSR_WAIT: Duration = Duration::from_secs(5 * 60);

/// What the rotation loop needs.
#[derive(Clone)]
pub(crate) struct Rotation<A> {
    pub api: A,
    pub slot: CertSlot,
    pub store: FileStore,
    pub node_name: String,
    /// `DECKHAND_TEST_CERT_ROTATE_AFTER`: rotate this long after each certificate is taken
    /// into use instead of at 70-90 % of its life (tests only).
    pub rotate_after: Option<Duration>,
}

impl<A: CsrApi> Rotation<A> {
    /// Runs until `cancel` fires.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        loop {
            let current = self.slot.get();
            let now = clock::now();
            let deadline = match self.rotate_after {
                Some(d) => now + d,
                None => rotation_deadline(current.not_before, current.not_after, jitter()),
            };
            tracing::info!(
                subject = %current.subject,
                not_after = %jiff_time(current.not_after),
                deadline = %jiff_time(deadline),
                "client certificate rotation deadline"
            );
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait_for(deadline, now)) => {}
            }
            let renewed = retry_with_backoff(
                &cancel,
                || self.rotate_once(&cancel),
                |e, pause| {
                    if matches!(e, RequestError::Cancelled) {
                        return false;
                    }
                    let expired = !self.slot.get().valid_at(clock::now());
                    tracing::error!(error = %e, retry_in = ?pause, current_expired = expired, "client certificate rotation failed; trying again");
                    true
                },
            )
            .await;
            if renewed.is_err() {
                return;
            }
        }
    }

    async fn rotate_once(&self, cancel: &CancellationToken) -> Result<(), RequestError> {
        let issued =
            request_certificate(&self.api, &self.node_name, "csr-", CSR_WAIT, cancel).await?;
        let credentials = issued.keep(
            &self.store,
            "rotated the client certificate; new connections use it",
        )?;
        self.slot.set(credentials);
        Ok(())
    }
}
