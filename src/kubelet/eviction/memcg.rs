//! Memory threshold notifications from the kernel (upstream's `kernelMemcgNotification`).
//!
//! The eviction manager looks at the node every monitoring period (10 s). Memory can run out
//! well within that, so on cgroup v1 the manager also asks the kernel to tell it when the root
//! memory cgroup's `memory.usage_in_bytes` crosses the usage at which a `memory.available`
//! threshold would be met: an eventfd registered through `cgroup.event_control`. When the
//! eventfd fires, the manager runs a round at once instead of waiting for the next period.
//!
//! The kernel compares *usage*, while the signal is about the *working set* (usage less the
//! inactive file pages). The two differ by the inactive file pages, which move all the time,
//! so the registration is renewed every [`REFRESH_INTERVAL`] with the inactive file pages of
//! the moment: the usage to watch is `capacity − threshold + inactive_file`. It is also renewed
//! after every round a notification started, which upstream does not do: a registration that
//! fired is spent (usage is past it, and it fires again only on the way back), and when page
//! cache growth rather than the working set crossed it, the round finds nothing to do and
//! only a renewal at the new inactive file pages can catch the real crossing. Without it, a
//! long monitoring period leaves the node unwatched until the next round.
//!
//! cgroup v2 has no such interface (upstream leaves it off there too); when the memory
//! controller is not on a v1 hierarchy, or a registration fails, this is said once in the log
//! and the manager keeps its periodic rounds, which stay the ground truth either way.
//!
//! The decisions (which thresholds, which usage, when to renew) are pure and table-tested;
//! the cgroup files and the eventfd are behind [`MemcgControl`], whose real implementation is
//! [`CgroupV1Memcg`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::decide::{Observation, Observations};
use super::signals::{Signal, ThresholdSpec};
use crate::base::clock::{self, Instant};

/// How often the registrations are renewed with the inactive file pages of the moment
/// (upstream's `notifierRefreshInterval`). Renewed at the first round after this has passed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// The file whose value the kernel compares with a registered threshold.
pub const USAGE_FILE: &str = "memory.usage_in_bytes";
/// Where a v1 memory cgroup takes `<eventfd> <fd of the watched file> <threshold>`.
pub const EVENT_CONTROL_FILE: &str = "cgroup.event_control";
/// The memory statistics, for `total_inactive_file`.
pub const STAT_FILE: &str = "memory.stat";

/// Why notifications are not available, or a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum MemcgError {
    #[error(
        "the cgroup mount {0} is the unified (v2) hierarchy, which has no memory threshold notifications"
    )]
    CgroupV2(PathBuf),
    #[error("no cgroup v1 memory controller with {EVENT_CONTROL_FILE} at {0}")]
    NoV1Memory(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("starting the eventfd's reader: {0}")]
    Thread(#[source] std::io::Error),
    #[error("{STAT_FILE} has no total_inactive_file")]
    NoInactiveFile,
}

/// What started an eviction round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trigger {
    /// The first round after the start.
    #[default]
    Start,
    /// The monitoring period passed.
    Period,
    /// The kernel said memory usage crossed a threshold; when the eventfd was read.
    Notification(Instant),
    /// The previous round evicted a pod and it is cleaned up: look again at once.
    AfterEviction,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Period => "period",
            Trigger::Notification(_) => "memcg notification",
            Trigger::AfterEviction => "after eviction",
        }
    }

    /// When the notification behind this round arrived.
    pub fn notified_at(self) -> Option<Instant> {
        match self {
            Trigger::Notification(at) => Some(at),
            _ => None,
        }
    }
}

// ---- the pure part

/// The thresholds that get a notification: every `memory.available` one, hard and soft, as
/// upstream. (`allocatableMemory.available` would watch the pods' cgroup; the manager does not
/// observe that signal, so it is not armed either.)
pub fn watched(thresholds: &[ThresholdSpec]) -> Vec<&ThresholdSpec> {
    thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable)
        .collect()
}

/// The root cgroup's usage at which `threshold` is met: the working set is then
/// `capacity − threshold`, and usage is the working set plus the inactive file pages.
/// `None` when the threshold is at or above the capacity (it is always met; nothing to watch).
pub fn usage_threshold(
    threshold: &ThresholdSpec,
    capacity: i64,
    inactive_file: u64,
) -> Option<u64> {
    let working_set = capacity.checked_sub(threshold.quantity(capacity))?;
    if working_set <= 0 {
        return None;
    }
    Some((working_set as u64).saturating_add(inactive_file))
}

/// Whether the registrations are due for renewal: never made, made [`REFRESH_INTERVAL`] ago,
/// or spent by the notification that started this round.
pub fn refresh_due(last: Option<Instant>, now: Instant, notified: bool) -> bool {
    notified || last.is_none_or(|at| now.saturating_duration_since(at) >= REFRESH_INTERVAL)
}

/// Whether memory crossed a threshold between the round's observation and the registration
/// made after it. The kernel reports crossings from the registration on, so such a crossing
/// would go unseen until the next periodic round (the round itself saw memory on the safe
/// side). Not when the observation already had the threshold met: that round acts on it,
/// and firing again would only repeat rounds while the node stays under pressure.
pub fn crossed_while_arming(
    observed_available: i64,
    threshold_quantity: i64,
    usage_now: u64,
    usage_bytes: u64,
) -> bool {
    threshold_quantity <= observed_available && usage_now >= usage_bytes
}

/// `total_inactive_file` from a v1 `memory.stat` (the hierarchy's inactive file pages, as the
/// stats code reckons the working set).
pub fn parse_inactive_file(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == "total_inactive_file")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// Whether the mount offers v1 notifications, from what is there: the unified hierarchy at
/// the mount root (`cgroup.controllers`) rules them out, as upstream's `IsCgroup2UnifiedMode`;
/// otherwise the v1 memory controller needs its `cgroup.event_control`. A hybrid machine
/// (v1 controllers, v2 only under `unified/`) is v1.
pub fn support(
    mount: &Path,
    unified_at_root: bool,
    memory_event_control: bool,
) -> Result<PathBuf, MemcgError> {
    if unified_at_root {
        return Err(MemcgError::CgroupV2(mount.to_path_buf()));
    }
    let memory = mount.join("memory");
    if !memory_event_control {
        return Err(MemcgError::NoV1Memory(memory));
    }
    Ok(memory)
}

// ---- the I/O

/// Dropping it withdraws the registration (the eventfd is closed, which the kernel notices).
pub type Armed = Box<dyn Send + Sync>;

/// Where notifications arrive: counts them, remembers the last, and wakes the manager.
#[derive(Debug, Default)]
pub struct Fired {
    notify: Notify,
    count: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl Fired {
    /// One notification: noted, and the manager woken (at its next wait if it is busy).
    pub fn fire(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(clock::instant());
        self.count.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Waits for a notification; answers when it arrived.
    pub async fn wait(&self) -> Instant {
        self.notify.notified().await;
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(clock::instant)
    }
}

/// The memory cgroup the notifications come from.
pub trait MemcgControl: Send + Sync + 'static {
    /// The cgroup's inactive file pages now.
    fn inactive_file(&self) -> Result<u64, MemcgError>;
    /// The cgroup's usage now (the value the kernel compares).
    fn usage(&self) -> Result<u64, MemcgError>;
    /// Registers for `usage_bytes` crossed (either way); each crossing calls
    /// [`Fired::fire`] until the returned guard is dropped.
    fn arm(&self, usage_bytes: u64, fired: Arc<Fired>) -> Result<Armed, MemcgError>;
    /// Where it watches, for the log.
    fn describe(&self) -> String;
}

/// The real control: the root of the v1 memory hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupV1Memcg {
    pub dir: PathBuf,
}

impl CgroupV1Memcg {
    /// The v1 memory controller under the cgroup mount (`/sys/fs/cgroup`), if notifications
    /// can work there.
    pub fn detect(mount: &Path) -> Result<CgroupV1Memcg, MemcgError> {
        let dir = support(
            mount,
            mount.join("cgroup.controllers").exists(),
            mount.join("memory").join(EVENT_CONTROL_FILE).exists(),
        )?;
        Ok(CgroupV1Memcg { dir })
    }

    fn io(&self, file: &str) -> impl FnOnce(std::io::Error) -> MemcgError {
        let path = self.dir.join(file);
        move |source| MemcgError::Io { path, source }
    }
}

/// How often an eventfd's reader looks whether its registration was withdrawn.
const READER_POLL: u16 = 500;

/// Withdraws a registration when dropped: its reader thread stops within [`READER_POLL`] ms
/// and closes the eventfd, which the kernel notices.
struct Reader(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Reads `efd` until `stop`, firing once per wake-up. A thread of its own with a timed
/// `poll`, as upstream's goroutine with its timed `epoll_wait`: tokio would need an unsafe
/// registration of the descriptor, and the thread costs nothing while it waits.
fn read_events(
    efd: nix::sys::eventfd::EventFd,
    fired: Arc<Fired>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use nix::errno::Errno;
    use nix::poll::{PollFd, PollFlags, poll};
    use std::os::fd::AsFd;
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(efd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, READER_POLL) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "memcg notifier: cannot wait on the eventfd");
                return;
            }
        }
        match efd.read() {
            Ok(_) => fired.fire(),
            Err(Errno::EAGAIN) => {}
            Err(err) => {
                tracing::warn!(error = %err, "memcg notifier: cannot read the eventfd");
                return;
            }
        }
    }
}

impl MemcgControl for CgroupV1Memcg {
    fn inactive_file(&self) -> Result<u64, MemcgError> {
        let text = std::fs::read_to_string(self.dir.join(STAT_FILE)).map_err(self.io(STAT_FILE))?;
        parse_inactive_file(&text).ok_or(MemcgError::NoInactiveFile)
    }

    fn usage(&self) -> Result<u64, MemcgError> {
        let text =
            std::fs::read_to_string(self.dir.join(USAGE_FILE)).map_err(self.io(USAGE_FILE))?;
        text.trim().parse().map_err(|_| MemcgError::Io {
            path: self.dir.join(USAGE_FILE),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a number"),
        })
    }

    fn arm(&self, usage_bytes: u64, fired: Arc<Fired>) -> Result<Armed, MemcgError> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        use std::io::Write;
        use std::os::fd::AsRawFd;

        // std opens with O_CLOEXEC. The watched file only has to be open while registering:
        // the kernel keeps what it needs.
        let usage = std::fs::File::open(self.dir.join(USAGE_FILE)).map_err(self.io(USAGE_FILE))?;
        let mut control = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join(EVENT_CONTROL_FILE))
            .map_err(self.io(EVENT_CONTROL_FILE))?;
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| MemcgError::EventFd(e.into()))?;
        let line = format!("{} {} {usage_bytes}", efd.as_raw_fd(), usage.as_raw_fd());
        control
            .write_all(line.as_bytes())
            .map_err(self.io(EVENT_CONTROL_FILE))?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("memcg-notify".into())
            .spawn(move || read_events(efd, fired, flag))
            .map_err(MemcgError::Thread)?;
        Ok(Box::new(Reader(stop)))
    }

    fn describe(&self) -> String {
        self.dir.join(USAGE_FILE).display().to_string()
    }
}

// ---- the notifier the manager holds

/// One armed threshold, for `/debug/eviction`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArmedThreshold {
    pub signal: String,
    pub hard: bool,
    /// The root cgroup's `memory.usage_in_bytes` the kernel watches for.
    pub usage_bytes: u64,
}

/// The notifier's state, for `/debug/eviction`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub watching: String,
    pub armed: Vec<ArmedThreshold>,
    /// Notifications received since the start.
    pub notifications: u64,
    /// Why the last renewal failed, if it did (the manager keeps polling).
    pub error: Option<String>,
}

/// Keeps one registration per `memory.available` threshold, renewed with the eviction rounds.
pub struct MemcgNotifier {
    control: Box<dyn MemcgControl>,
    fired: Arc<Fired>,
    guards: Vec<Armed>,
    armed: Vec<ArmedThreshold>,
    last_refresh: Option<Instant>,
    error: Option<String>,
    warned: bool,
}

impl MemcgNotifier {
    pub fn new(control: Box<dyn MemcgControl>) -> Self {
        tracing::info!(watching = %control.describe(), "eviction manager: memory threshold notifications on");
        MemcgNotifier {
            control,
            fired: Arc::default(),
            guards: Vec::new(),
            armed: Vec::new(),
            last_refresh: None,
            error: None,
            warned: false,
        }
    }

    /// Renews the registrations when due (`notified`: a notification started this round),
    /// from this round's observation of `memory.available` (its capacity) and the inactive
    /// file pages now. A failure is logged once as a warning (later ones at debug) and leaves
    /// the manager to its periodic rounds.
    pub fn update(
        &mut self,
        thresholds: &[ThresholdSpec],
        observations: &Observations,
        now: Instant,
        notified: bool,
    ) {
        if !refresh_due(self.last_refresh, now, notified) {
            return;
        }
        let Some(obs) = observations.get(&Signal::MemoryAvailable) else {
            return;
        };
        self.last_refresh = Some(now);
        match self.arm_all(thresholds, *obs) {
            Ok(()) => {
                self.error = None;
                tracing::debug!(armed = ?self.armed, "eviction manager: memory threshold notifications renewed");
            }
            Err(err) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(error = %err, "eviction manager: cannot register memory threshold notifications; polling every monitoring period only");
                } else {
                    tracing::debug!(error = %err, "eviction manager: memory threshold notifications not renewed");
                }
                self.error = Some(err.to_string());
            }
        }
    }

    fn arm_all(
        &mut self,
        thresholds: &[ThresholdSpec],
        obs: Observation,
    ) -> Result<(), MemcgError> {
        let capacity = obs.capacity;
        let inactive = self.control.inactive_file()?;
        // The old registrations go first: the kernel would otherwise briefly hold both.
        self.guards.clear();
        self.armed.clear();
        for t in watched(thresholds) {
            let Some(usage_bytes) = usage_threshold(t, capacity, inactive) else {
                continue;
            };
            self.guards
                .push(self.control.arm(usage_bytes, self.fired.clone())?);
            self.armed.push(ArmedThreshold {
                signal: t.signal.as_str().to_string(),
                hard: t.is_hard(),
                usage_bytes,
            });
        }
        let usage = self.control.usage()?;
        let missed = watched(thresholds).into_iter().any(|t| {
            usage_threshold(t, capacity, inactive).is_some_and(|at| {
                crossed_while_arming(obs.available, t.quantity(capacity), usage, at)
            })
        });
        if missed {
            tracing::info!(
                usage,
                "eviction manager: memory crossed a threshold while it was being registered; looking again"
            );
            self.fired.fire();
        }
        Ok(())
    }

    /// Waits for the next notification; answers when it arrived.
    pub async fn notified(&self) -> Instant {
        self.fired.wait().await
    }

    pub fn status(&self) -> Status {
        Status {
            watching: self.control.describe(),
            armed: self.armed.clone(),
            notifications: self.fired.count(),
            error: self.error.clone(),
        }
    }
}

/// Waits for a notification from `notifier`, or forever without one.
pub async fn notified(notifier: Option<&MemcgNotifier>) -> Instant {
    match notifier {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::podspec::threshold::Threshold;

    const MI: u64 = 1 << 20;
    const GI: i64 = 1 << 30;

    fn bytes(n: i64) -> Threshold {
        Threshold::Quantity(crate::base::podspec::quantity::parse(&n.to_string()).unwrap())
    }

    fn spec(signal: Signal, value: Threshold, grace: u64) -> ThresholdSpec {
        ThresholdSpec {
            signal,
            value,
            grace_period: Duration::from_secs(grace),
            min_reclaim: None,
        }
    }

    #[test]
    fn usage_threshold_adds_the_inactive_file_pages_to_capacity_less_threshold() {
        let hard = |v| spec(Signal::MemoryAvailable, v, 0);
        for (what, t, capacity, inactive, want) in [
            (
                "100Mi of 8Gi, nothing inactive",
                hard(bytes(100 * MI as i64)),
                8 * GI,
                0,
                Some(8 * GI as u64 - 100 * MI),
            ),
            (
                "inactive file pages raise the usage to watch",
                hard(bytes(100 * MI as i64)),
                8 * GI,
                3 * GI as u64,
                Some(11 * GI as u64 - 100 * MI),
            ),
            (
                "a percentage of the capacity",
                hard(Threshold::Percent(10.0)),
                10 * GI,
                MI,
                Some(9 * GI as u64 + MI),
            ),
            (
                "a threshold as large as the capacity is always met",
                hard(bytes(8 * GI)),
                8 * GI,
                MI,
                None,
            ),
            (
                "larger than the capacity",
                hard(bytes(9 * GI)),
                8 * GI,
                0,
                None,
            ),
            ("no capacity read", hard(bytes(1)), 0, 0, None),
        ] {
            assert_eq!(usage_threshold(&t, capacity, inactive), want, "{what}");
        }
    }

    #[test]
    fn only_memory_available_thresholds_are_watched_hard_and_soft() {
        let q = bytes(100);
        let all = vec![
            spec(Signal::MemoryAvailable, q, 0),
            spec(Signal::NodeFsAvailable, q, 0),
            spec(Signal::AllocatableMemoryAvailable, q, 0),
            spec(Signal::MemoryAvailable, q, 60),
            spec(Signal::PidAvailable, q, 0),
        ];
        let w = watched(&all);
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|t| t.signal == Signal::MemoryAvailable));
        assert!(w[0].is_hard() && !w[1].is_hard());
        assert!(watched(&[]).is_empty());
    }

    #[test]
    fn renewal_is_due_first_and_then_every_refresh_interval() {
        let t0 = Instant::now();
        let later = |s| t0 + Duration::from_secs(s);
        for (what, last, now, notified, want) in [
            ("never armed", None, t0, false, true),
            ("just armed", Some(t0), t0, false, false),
            ("9 s later", Some(t0), later(9), false, false),
            ("10 s later", Some(t0), t0 + REFRESH_INTERVAL, false, true),
            ("a clock that went back", Some(later(5)), t0, false, false),
            ("a notification spent them", Some(t0), later(1), true, true),
            ("notified at once", Some(t0), t0, true, true),
        ] {
            assert_eq!(refresh_due(last, now, notified), want, "{what}");
        }
    }

    #[test]
    fn a_crossing_between_observation_and_registration_is_caught() {
        for (what, available, threshold, usage, at, want) in [
            ("safe then, below now", 500, 100, 10, 20, false),
            ("safe then, past now", 500, 100, 30, 20, true),
            ("safe then, exactly at it now", 500, 100, 20, 20, true),
            ("met then: the round acts itself", 50, 100, 30, 20, false),
            ("met then and below now", 50, 100, 10, 20, false),
            (
                "exactly at the threshold then is not met",
                100,
                100,
                30,
                20,
                true,
            ),
        ] {
            assert_eq!(
                crossed_while_arming(available, threshold, usage, at),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn inactive_file_comes_from_the_hierarchys_total() {
        for (text, want) in [
            ("inactive_file 5\ntotal_inactive_file 300\n", Some(300)),
            ("total_inactive_file 7", Some(7)),
            ("inactive_file 5\n", None),
            ("total_inactive_file lots\n", None),
            ("", None),
        ] {
            assert_eq!(parse_inactive_file(text), want, "{text:?}");
        }
    }

    #[test]
    fn support_needs_a_v1_memory_controller() {
        let mount = Path::new("/sys/fs/cgroup");
        assert_eq!(
            support(mount, false, true).unwrap(),
            PathBuf::from("/sys/fs/cgroup/memory")
        );
        assert!(matches!(
            support(mount, true, true),
            Err(MemcgError::CgroupV2(_))
        ));
        assert!(matches!(
            support(mount, false, false),
            Err(MemcgError::NoV1Memory(_))
        ));
    }

    /// Records registrations; a guard's drop marks its registration withdrawn.
    #[derive(Clone, Default)]
    struct FakeControl {
        inactive: Arc<Mutex<Option<u64>>>,
        usage: Arc<Mutex<u64>>,
        /// (usage_bytes, still armed)
        armed: Arc<Mutex<Vec<(u64, Live)>>>,
        fired: Arc<Mutex<Option<Arc<Fired>>>>,
    }

    /// Whether a registration is still armed.
    type Live = Arc<std::sync::atomic::AtomicBool>;

    struct Guard(Live);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }

    impl MemcgControl for FakeControl {
        fn inactive_file(&self) -> Result<u64, MemcgError> {
            self.inactive
                .lock()
                .unwrap()
                .ok_or(MemcgError::NoInactiveFile)
        }
        fn usage(&self) -> Result<u64, MemcgError> {
            Ok(*self.usage.lock().unwrap())
        }
        fn arm(&self, usage_bytes: u64, fired: Arc<Fired>) -> Result<Armed, MemcgError> {
            let live = Arc::new(std::sync::atomic::AtomicBool::new(true));
            self.armed.lock().unwrap().push((usage_bytes, live.clone()));
            *self.fired.lock().unwrap() = Some(fired);
            Ok(Box::new(Guard(live)))
        }
        fn describe(&self) -> String {
            "fake".into()
        }
    }

    impl FakeControl {
        fn live(&self) -> Vec<u64> {
            self.armed
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, l)| l.load(Ordering::SeqCst))
                .map(|(u, _)| *u)
                .collect()
        }
    }

    fn memory(capacity: i64) -> Observations {
        let mut o = Observations::new();
        o.insert(
            Signal::MemoryAvailable,
            Observation {
                available: capacity / 2,
                capacity,
            },
        );
        o
    }

    #[test]
    fn the_notifier_arms_each_memory_threshold_and_renews_every_interval() {
        let fake = FakeControl::default();
        *fake.inactive.lock().unwrap() = Some(MI);
        let mut n = MemcgNotifier::new(Box::new(fake.clone()));
        let thresholds = vec![
            spec(Signal::MemoryAvailable, bytes(GI), 0),
            spec(Signal::NodeFsAvailable, Threshold::Percent(10.0), 0),
            spec(Signal::MemoryAvailable, bytes(2 * GI), 30),
        ];
        let t0 = Instant::now();
        // No memory reading: nothing armed, and the renewal stays due.
        n.update(&thresholds, &Observations::new(), t0, false);
        assert!(fake.live().is_empty());
        n.update(&thresholds, &memory(8 * GI), t0, false);
        let first = vec![7 * GI as u64 + MI, 6 * GI as u64 + MI];
        assert_eq!(fake.live(), first);
        assert_eq!(n.status().armed.len(), 2);
        assert!(n.status().armed[0].hard && !n.status().armed[1].hard);
        // Within the interval: untouched, whatever moved.
        *fake.inactive.lock().unwrap() = Some(2 * MI);
        n.update(
            &thresholds,
            &memory(8 * GI),
            t0 + Duration::from_secs(5),
            false,
        );
        assert_eq!(fake.live(), first);
        // After it: the old ones withdrawn, new ones at the new inactive file pages.
        n.update(&thresholds, &memory(8 * GI), t0 + REFRESH_INTERVAL, false);
        assert_eq!(
            fake.live(),
            vec![7 * GI as u64 + 2 * MI, 6 * GI as u64 + 2 * MI]
        );
        assert_eq!(fake.armed.lock().unwrap().len(), 4);
        // A failed renewal is reported in the status; what it could not replace stays.
        *fake.inactive.lock().unwrap() = None;
        n.update(
            &thresholds,
            &memory(8 * GI),
            t0 + 2 * REFRESH_INTERVAL,
            false,
        );
        assert!(n.status().error.is_some());
        assert_eq!(fake.live().len(), 2, "the last good registrations stay");
        *fake.inactive.lock().unwrap() = Some(0);
        n.update(
            &thresholds,
            &memory(8 * GI),
            t0 + 3 * REFRESH_INTERVAL,
            false,
        );
        assert_eq!(n.status().error, None);
        assert_eq!(fake.live(), vec![7 * GI as u64, 6 * GI as u64]);
        // A notification's round renews at once.
        *fake.inactive.lock().unwrap() = Some(MI);
        let soon = t0 + 3 * REFRESH_INTERVAL + Duration::from_secs(1);
        n.update(&thresholds, &memory(8 * GI), soon, true);
        assert_eq!(fake.live(), first);
        assert_eq!(n.status().notifications, 0);
        // Usage already past the hard one when registering, the observation 4 GiB free:
        // crossed in between, so it fires itself.
        *fake.usage.lock().unwrap() = 7 * GI as u64 + 2 * MI;
        n.update(&thresholds, &memory(8 * GI), soon + REFRESH_INTERVAL, false);
        assert_eq!(n.status().notifications, 1);
    }

    #[tokio::test]
    async fn a_notification_wakes_the_waiter_even_if_it_came_first() {
        let fake = FakeControl::default();
        *fake.inactive.lock().unwrap() = Some(0);
        let mut n = MemcgNotifier::new(Box::new(fake.clone()));
        n.update(
            &[spec(Signal::MemoryAvailable, bytes(GI), 0)],
            &memory(4 * GI),
            Instant::now(),
            false,
        );
        let fired = fake.fired.lock().unwrap().clone().unwrap();
        let before = Instant::now();
        // Fired while the manager is busy with a round: the next wait returns at once.
        fired.fire();
        let at = tokio::time::timeout(Duration::from_secs(5), notified(Some(&n)))
            .await
            .expect("woken");
        assert!(at >= before);
        assert_eq!(n.status().notifications, 1);
        // Without a notifier, the wait never ends.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), notified(None))
                .await
                .is_err()
        );
    }

    // ---- the manager's loop, woken by a notification

    use crate::kubelet::eviction::decide::Reclaim;
    use crate::kubelet::eviction::manager::{Manager, ManagerSettings};
    use crate::kubelet::eviction::observe::{
        ActivePods, EvictionError, Evictor, Measure, Observer, Reading, Reclaimer,
    };
    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::Pod;

    /// Readings in turn (the last repeats), one pod, evictions sent on a channel.
    #[derive(Clone)]
    struct Node {
        readings: Arc<Mutex<Vec<Observations>>>,
        evicted: tokio::sync::mpsc::UnboundedSender<String>,
    }

    impl Observer for Node {
        fn observe(&self, _measure: Measure) -> BoxFuture<'_, Result<Reading, EvictionError>> {
            let mut r = self.readings.lock().unwrap();
            let observations = if r.len() > 1 {
                r.remove(0)
            } else {
                r[0].clone()
            };
            Box::pin(async move {
                Ok(Reading {
                    observations,
                    pods: Default::default(),
                    dedicated_imagefs: false,
                })
            })
        }
    }

    impl Reclaimer for Node {
        fn reclaim(&self, _: Reclaim) -> BoxFuture<'_, Result<usize, EvictionError>> {
            Box::pin(async { Ok(0) })
        }
    }

    impl Evictor for Node {
        fn evict(
            &self,
            uid: &str,
            _: i64,
            _: String,
        ) -> BoxFuture<'_, Result<tokio::sync::oneshot::Receiver<()>, EvictionError>> {
            let _ = self.evicted.send(uid.to_string());
            let (done, rx) = tokio::sync::oneshot::channel();
            let _ = done.send(());
            Box::pin(async move { Ok(rx) })
        }
    }

    impl ActivePods for Node {
        fn active(&self) -> Vec<Arc<Pod>> {
            let pod = serde_json::json!({
                "metadata": {"name": "hog", "namespace": "default", "uid": "uid-hog",
                             "annotations": {"kubernetes.io/config.source": "api"}},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            });
            vec![Arc::new(serde_json::from_value(pod).unwrap())]
        }
    }

    #[tokio::test]
    async fn a_notification_starts_a_round_at_once_and_the_eviction_says_so() {
        let (tx, mut evicted) = tokio::sync::mpsc::unbounded_channel();
        let low = |available| {
            let mut o = memory(4 * GI);
            o.get_mut(&Signal::MemoryAvailable).unwrap().available = available;
            o
        };
        // Plenty at the start, short once notified, plenty again after the eviction.
        let node = Node {
            readings: Arc::new(Mutex::new(vec![low(2 * GI), low(MI as i64), low(2 * GI)])),
            evicted: tx,
        };
        let fake = FakeControl::default();
        *fake.inactive.lock().unwrap() = Some(0);
        let manager = Manager::new(
            ManagerSettings {
                thresholds: vec![spec(Signal::MemoryAvailable, bytes(100 * MI as i64), 0)],
                pressure_transition_period: Duration::from_secs(5),
                max_pod_grace_period_seconds: 0,
                // No periodic round within the test.
                monitoring_period: Duration::from_secs(3600),
                node_name: "node-a".into(),
                local_storage_capacity_isolation: true,
            },
            node.clone(),
            node.clone(),
            node.clone(),
            node,
            crate::kubelet::eviction::PressureView::default(),
            crate::kubelet::events::Recorder::log_only("node-a"),
        )
        .with_memcg(MemcgNotifier::new(Box::new(fake.clone())));
        let last = manager.last.clone();
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut manager = manager;
        let stop = cancel.clone();
        let run = tokio::spawn(async move { manager.run(stop).await });
        let deadline = Duration::from_secs(5);
        let armed = async {
            loop {
                let fired = fake.fired.lock().unwrap().clone();
                if let Some(f) = fired {
                    return f;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let fired = tokio::time::timeout(deadline, armed)
            .await
            .expect("armed by the first round");
        assert_eq!(fake.live(), vec![4 * GI as u64 - 100 * MI]);
        fired.fire();
        let uid = tokio::time::timeout(deadline, evicted.recv()).await;
        assert_eq!(uid.ok().flatten().as_deref(), Some("uid-hog"));
        cancel.cancel();
        run.await.unwrap();
        let last = last.lock().unwrap().clone();
        let note = last.last_eviction.expect("an eviction noted");
        assert_eq!(note.trigger, "memcg notification");
        assert_eq!(note.pod, "default/hog");
        assert!(note.notification_to_handoff_ms.is_some());
        assert_eq!(last.memcg.map(|m| m.notifications), Some(1));
        // The notification's round renewed the registration it spent.
        assert_eq!(fake.armed.lock().unwrap().len(), 2);
    }
}
