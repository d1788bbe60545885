//! systemd-logind over D-Bus, behind a small trait: what the shutdown manager asks of it (the
//! longest delay an inhibitor may hold shutdown back, a delay lock, the `PrepareForShutdown`
//! signal). The real implementation uses `zbus` on the tokio runtime; nothing else in the crate
//! touches `zbus`.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

const LOGIND_SERVICE: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// Who takes the lock, as `systemd-inhibit --list` shows it.
pub(crate) const INHIBITOR_WHO: &str = "deckhand";
/// Why, in the same list.
pub(crate) const INHIBITOR_WHY: &str = "Deckhand needs time to stop the node's pods gracefully";

/// What went wrong talking to logind; the step is part of the message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogindError {
    #[error("cannot connect to the system bus: {0}")]
    Connect(#[source] zbus::Error),
    #[error("cannot read logind's InhibitDelayMaxUSec: {0}")]
    InhibitDelay(#[source] zbus::Error),
    #[error("cannot take a shutdown delay lock from logind: {0}")]
    Inhibit(#[source] zbus::Error),
    #[error("cannot subscribe to logind's PrepareForShutdown signal: {0}")]
    Subscribe(#[source] zbus::Error),
}

/// The shutdown delay lock: logind waits for it (at most `InhibitDelayMaxUSec`) before the
/// system goes down. Dropping it closes the file descriptor, which releases the lock.
#[derive(Debug)]
pub(crate) struct InhibitLock(#[allow(dead_code)] OwnedFd);

impl InhibitLock {
    #[cfg(test)]
    pub(crate) fn new(fd: OwnedFd) -> InhibitLock {
        InhibitLock(fd)
    }
}

/// `PrepareForShutdown` signals, in order: `true` when a shutdown begins, `false` when it was
/// cancelled. The stream ends when the bus connection is lost.
pub(crate) type ShutdownSignals = BoxStream<'static, bool>;

/// One connection to logind.
pub(crate) trait Logind: Send + Sync + 'static {
    /// `InhibitDelayMaxUSec`: how long logind waits for delay locks.
    fn inhibit_delay_max(&self) -> impl Future<Output = Result<Duration, LogindError>> + Send;
    /// Takes a `shutdown` delay lock.
    fn inhibit(&self) -> impl Future<Output = Result<InhibitLock, LogindError>> + Send;
    /// Subscribes to `PrepareForShutdown`.
    fn shutdown_signals(&self)
    -> impl Future<Output = Result<ShutdownSignals, LogindError>> + Send;
}

/// Makes connections to logind (again, after one is lost).
pub(crate) trait LogindConnector: Send + Sync + 'static {
    type Bus: Logind;
    fn connect(&self) -> impl Future<Output = Result<Self::Bus, LogindError>> + Send;
}

/// The system bus, found as every D-Bus client finds it: `DBUS_SYSTEM_BUS_ADDRESS`, else
/// `unix:path=/var/run/dbus/system_bus_socket`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemBus;

impl LogindConnector for SystemBus {
    type Bus = ZbusLogind;
    async fn connect(&self) -> Result<ZbusLogind, LogindError> {
        let conn = zbus::Connection::system()
            .await
            .map_err(LogindError::Connect)?;
        Ok(ZbusLogind { conn })
    }
}

/// logind through a `zbus` connection.
pub(crate) struct ZbusLogind {
    conn: zbus::Connection,
}

impl Logind for ZbusLogind {
    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        let reply = self
            .conn
            .call_method(
                Some(LOGIND_SERVICE),
                LOGIND_PATH,
                Some(PROPERTIES),
                "Get",
                &(LOGIND_MANAGER, "InhibitDelayMaxUSec"),
            )
            .await
            .map_err(LogindError::InhibitDelay)?;
        let value: zbus::OwnedVariant = reply
            .body()
            .deserialize()
            .map_err(LogindError::InhibitDelay)?;
        let micros = u64::try_from(value).map_err(LogindError::InhibitDelay)?;
        Ok(Duration::from_micros(micros))
    }

    async fn inhibit(&self) -> Result<InhibitLock, LogindError> {
        let reply = self
            .conn
            .call_method(
                Some(LOGIND_SERVICE),
                LOGIND_PATH,
                Some(LOGIND_MANAGER),
                "Inhibit",
                &("shutdown", INHIBITOR_WHO, INHIBITOR_WHY, "delay"),
            )
            .await
            .map_err(LogindError::Inhibit)?;
        let fd: zbus::OwnedFd = reply.body().deserialize().map_err(LogindError::Inhibit)?;
        Ok(InhibitLock(fd.into()))
    }

    async fn shutdown_signals(&self) -> Result<ShutdownSignals, LogindError> {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(LOGIND_MANAGER)
            .member("PrepareForShutdown")
            .path(LOGIND_PATH)
            .build()
            .map_err(LogindError::Subscribe)?;
        let stream = zbus::MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(LogindError::Subscribe)?;
        Ok(stream
            .filter_map(|msg| async move {
                let msg = match msg {
                    Ok(m) => m,
                    Err(err) => {
                        tracing::warn!(error = %err, "a bad message on the logind signal subscription");
                        return None;
                    }
                };
                match msg.body().deserialize::<bool>() {
                    Ok(active) => Some(active),
                    Err(err) => {
                        tracing::warn!(error = %err, "a PrepareForShutdown signal without its boolean; ignored");
                        None
                    }
                }
            })
            .boxed())
    }
}
