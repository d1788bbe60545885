//! The pod lifecycle event generator: hear of runtime changes, tell the sync loop whose pod
//! changed.
//!
//! Two ways in. An event stream from the runtime ([`feed`]: CRI `GetContainerEvents` where the
//! runtime has it, else containerd's own event service, which 1.6 has) pokes the owning pod's
//! worker the moment a container exits. A relist (two list calls when nothing changed, see
//! `runtime::inspect`) diffs the runtime against the last view: every second while no stream
//! flows (upstream's period), every `events_period` (300 s, upstream's evented-PLEG value) as a
//! consistency check while one does. A stream that breaks (containerd restarted) puts the PLEG
//! back on the one-second relist at once, and it subscribes again with a back-off; each new
//! subscription is followed by a relist, which catches what happened while none stood. While
//! the runtime does not answer at all, both the relist and the subscription wait for its return
//! instead ([`reconnect`]: asked every 10 ms), so a containerd restart costs no period.
//!
//! The newest view is kept in a [`RuntimeCache`] (which also maps object IDs to pods for the
//! events), and `/healthz` turns unhealthy when no relist has completed for three minutes (or
//! twice the period in effect). A runtime that does not answer is named on `/healthz?verbose`'s
//! `runtime` line without failing it (the Node's Ready condition carries the outage, as
//! upstream's does). `/healthz?verbose` and `/metrics` say which mode is on.

pub mod feed;
pub(crate) mod reconnect;
pub(crate) mod route;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use crate::base::health::Health;
use crate::base::observed::{ContainerState, ObservedPod, SandboxState};
use crate::base::resync_queue::Pokes;
use crate::clients::cri::RuntimeService;
use crate::kubelet::runtime::inspect::{self, DetailCache, HeardExit};

use feed::{EventFeed, FeedError, RuntimeEvent};
use route::{Mode, Route};

/// What changed for one pod between two relists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlegEventKind {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
    SandboxChanged,
}

/// One change, naming the pod and the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlegEvent {
    pub pod_uid: String,
    pub kind: PlegEventKind,
    pub id: String,
}

/// The newest relist, for housekeeping and status.
#[derive(Clone, Default)]
pub struct RuntimeCache {
    inner: Arc<RwLock<Snapshot>>,
}

#[derive(Default)]
struct Snapshot {
    pods: BTreeMap<String, ObservedPod>,
    /// Container and sandbox IDs to the pod UID they belong to, for events.
    owners: HashMap<String, String>,
    /// IDs an event named that a relist since showed are not this node's (another agent's
    /// pods on a shared containerd): their events are ignored without relisting again.
    foreign: HashSet<String>,
    relisted: bool,
}

/// At most this many foreign IDs are remembered; the set starts afresh beyond it.
const MAX_FOREIGN: usize = 4096;

impl Snapshot {
    fn index(&mut self, uid: &str) {
        if let Some(pod) = self.pods.get(uid) {
            for id in pod
                .containers
                .iter()
                .map(|c| &c.id)
                .chain(pod.sandboxes.iter().map(|s| &s.id))
            {
                self.owners.insert(id.clone(), uid.to_string());
            }
        }
    }

    fn unindex(&mut self, uid: &str) {
        if let Some(pod) = self.pods.get(uid) {
            for id in pod
                .containers
                .iter()
                .map(|c| &c.id)
                .chain(pod.sandboxes.iter().map(|s| &s.id))
            {
                self.owners.remove(id);
            }
        }
    }
}

impl RuntimeCache {
    /// Pod UIDs with anything in the runtime, from the last relist.
    pub fn pod_uids(&self) -> Vec<String> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.pods.keys().cloned().collect()
    }

    /// True when the last relist saw `uid` among this agent's pods.
    pub(crate) fn has_pod(&self, uid: &str) -> bool {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.pods.contains_key(uid)
    }

    /// One pod as the last relist saw it.
    pub fn pod(&self, uid: &str) -> Option<ObservedPod> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.pods.get(uid).cloned()
    }

    /// True once a relist has completed.
    pub fn has_relisted(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .relisted
    }

    /// Takes a full relist in place of what was known, and returns what changed.
    pub fn store_relist(&self, current: BTreeMap<String, ObservedPod>) -> Vec<PlegEvent> {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let changes = diff(&s.pods, &current);
        s.pods = current;
        s.owners.clear();
        let uids: Vec<String> = s.pods.keys().cloned().collect();
        for uid in uids {
            s.index(&uid);
        }
        s.relisted = true;
        changes
    }

    /// Replaces one pod's entry with a fresher view (a worker just inspected it).
    pub fn update_pod(&self, uid: &str, pod: ObservedPod) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        s.unindex(uid);
        if pod.is_empty() {
            s.pods.remove(uid);
        } else {
            s.pods.insert(uid.to_string(), pod);
            s.index(uid);
        }
    }

    /// The pod a container or sandbox belongs to, as far as the newest view knows.
    pub fn owner_of(&self, id: &str) -> Option<String> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.owners.get(id).cloned()
    }

    /// True when a relist showed the object is not this node's.
    pub fn is_foreign(&self, id: &str) -> bool {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.foreign.contains(id)
    }

    /// Remembers the IDs among `ids` that the newest view does not know as not this node's.
    fn mark_foreign(&self, ids: impl IntoIterator<Item = String>) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if !s.owners.contains_key(&id) {
                if s.foreign.len() >= MAX_FOREIGN {
                    s.foreign.clear();
                }
                s.foreign.insert(id);
            }
        }
    }
}

/// Compares two relists and lists the changes, pod by pod.
pub fn diff(
    old: &BTreeMap<String, ObservedPod>,
    new: &BTreeMap<String, ObservedPod>,
) -> Vec<PlegEvent> {
    let empty = ObservedPod::default();
    let mut events = Vec::new();
    let uids: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for uid in uids {
        let before = old.get(uid).unwrap_or(&empty);
        let after = new.get(uid).unwrap_or(&empty);
        let old_c: HashMap<&str, ContainerState> = before
            .containers
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect();
        let new_c: HashMap<&str, ContainerState> = after
            .containers
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect();
        for c in &after.containers {
            let kind = match (old_c.get(c.id.as_str()), c.state) {
                (Some(prev), now) if *prev == now => continue,
                (_, ContainerState::Running) => PlegEventKind::ContainerStarted,
                (_, ContainerState::Exited) => PlegEventKind::ContainerDied,
                _ => PlegEventKind::ContainerChanged,
            };
            events.push(PlegEvent {
                pod_uid: uid.clone(),
                kind,
                id: c.id.clone(),
            });
        }
        for c in &before.containers {
            if !new_c.contains_key(c.id.as_str()) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::ContainerRemoved,
                    id: c.id.clone(),
                });
            }
        }
        let old_s: HashMap<&str, SandboxState> = before
            .sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.state))
            .collect();
        let new_s: HashMap<&str, SandboxState> = after
            .sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.state))
            .collect();
        for (id, state) in &new_s {
            if old_s.get(id) != Some(state) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::SandboxChanged,
                    id: id.to_string(),
                });
            }
        }
        for id in old_s.keys() {
            if !new_s.contains_key(id) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::SandboxChanged,
                    id: id.to_string(),
                });
            }
        }
    }
    events
}

/// Timing of the relist loop.
#[derive(Clone, Debug)]
pub struct PlegConfig {
    /// The node whose pods are relisted (objects carry it as a label).
    pub node_name: String,
    /// The relist period while no event stream flows (upstream's 1 s; `DECKHAND_RELIST_PERIOD`).
    pub period: Duration,
    /// The relist period while events flow: only a consistency check then. Upstream's evented
    /// PLEG uses 300 s, and so does Deckhand: every worker also re-observes its own pod each
    /// `syncFrequency` (1 min), so a lost event costs a pod at most that; the relist is left
    /// to find what has no worker (objects someone else made with this node's labels) and to
    /// refresh the runtime cache, and each relist costs containerd two list calls.
    pub events_period: Duration,
    /// `/healthz` fails when no relist completed for this long (upstream: 3 minutes), or for
    /// twice the period in effect, whichever is longer.
    pub unhealthy_after: Duration,
    /// The runtime's socket being made again (inotify on its directory), so a runtime that
    /// comes back is asked at once; silent by default.
    pub(crate) runtime_socket: reconnect::SocketSignal,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            node_name: String::new(),
            period: Duration::from_secs(1),
            events_period: Duration::from_secs(300),
            unhealthy_after: Duration::from_secs(180),
            runtime_socket: reconnect::SocketSignal::default(),
        }
    }
}

impl PlegConfig {
    fn period_in(&self, mode: Mode) -> Duration {
        route::relist_period(mode, self.period, self.events_period)
    }
}

/// How long an exit heard from the event stream is remembered while the runtime's own view
/// has not caught up with it (containerd's CRI plugin updates a container's status a moment
/// after it publishes the exit, once it has deleted the task, which on a busy node takes up to
/// a second or more). Workers act on the exit's own facts meanwhile, so the note must outlive
/// the lag: a view that showed the old container running again would confuse them.
pub const EXIT_NOTE_TTL: Duration = Duration::from_secs(10);

/// How long the PLEG remembers which pod an object a worker just made belongs to. The worker
/// publishes its view, which names the object, when its sync ends: seconds at most.
pub const MADE_TTL: Duration = Duration::from_secs(60);

/// One exit heard from the stream.
#[derive(Clone, Copy, Debug)]
struct ExitNote {
    at: Instant,
    /// The exit's code and time, when the event told them.
    facts: Option<feed::ExitFacts>,
    /// The OOM killer hit the object before it exited.
    oom: bool,
}

/// The exit code of a SIGKILL (128 + 9).
const SIGKILLED: i32 = 137;

impl ExitNote {
    /// The code a worker may act on without reading the runtime. A SIGKILL with no OOM event
    /// heard for the same ID is left to the runtime's own view: the OOM killer's event may have
    /// named another object (containerd 1.6 can report it under the pod's sandbox), and only
    /// the runtime then says whether the reason is `OOMKilled` or `Error`.
    fn code(&self) -> Option<i32> {
        self.facts
            .map(|f| f.code)
            .filter(|&code| self.oom || code != SIGKILLED)
    }

    /// The exit of `id` as a worker sees it, while the note is fresh (within
    /// [`EXIT_NOTE_TTL`]).
    fn heard(&self, id: &str) -> Option<HeardExit> {
        (self.at.elapsed() < EXIT_NOTE_TTL).then(|| HeardExit {
            id: id.to_string(),
            exit_code: self.code(),
            finished_at: self.facts.map(|f| f.at_ns).unwrap_or(0),
            oom: self.oom,
        })
    }
}

/// What the PLEG shares with the workers and the endpoints: the mode, the exits heard of, and
/// the counters for `/metrics`. Cheap to clone.
#[derive(Clone)]
pub struct PlegState {
    inner: Arc<StateInner>,
}

struct StateInner {
    mode: watch::Sender<Mode>,
    /// Exits heard from the stream, by object ID.
    exits: Mutex<HashMap<String, ExitNote>>,
    /// Counts the exits heard, so that a worker waiting for one (a container it is stopping)
    /// wakes when one arrives.
    heard: watch::Sender<u64>,
    /// IDs an event named that no view knew, for the relist to settle.
    unknown: Mutex<HashSet<String>>,
    /// Objects workers made lately, to the pod UID, until their views name them.
    made: Mutex<HashMap<String, (String, Instant)>>,
    /// Pods whose worker was poked (by an event or a relist's change) since it last read the
    /// pod from the runtime: only these need a read while the stream flows.
    stale: Mutex<HashSet<String>>,
    relist_now: Notify,
    events: AtomicU64,
    pokes: AtomicU64,
    relists: AtomicU64,
    subscriptions: AtomicU64,
    breaks: AtomicU64,
}

impl Default for PlegState {
    fn default() -> Self {
        PlegState {
            inner: Arc::new(StateInner {
                mode: watch::Sender::new(Mode::Relist),
                exits: Mutex::default(),
                heard: watch::Sender::new(0),
                unknown: Mutex::default(),
                made: Mutex::default(),
                stale: Mutex::default(),
                relist_now: Notify::new(),
                events: AtomicU64::new(0),
                pokes: AtomicU64::new(0),
                relists: AtomicU64::new(0),
                subscriptions: AtomicU64::new(0),
                breaks: AtomicU64::new(0),
            }),
        }
    }
}

impl crate::kubelet::runtime::executor::RuntimeEvents for PlegState {
    fn events_live(&self) -> bool {
        PlegState::events_live(self)
    }

    fn heard_exits(&self, observed: &ObservedPod) -> Vec<HeardExit> {
        PlegState::heard_exits(self, observed)
    }

    fn confirmed(&self, read: &ObservedPod) {
        PlegState::confirmed(self, read)
    }

    fn exits_heard(&self) -> watch::Receiver<u64> {
        self.inner.heard.subscribe()
    }

    fn exit_of(&self, id: &str) -> Option<HeardExit> {
        PlegState::exit_of(self, id)
    }

    fn made(&self, pod_uid: &str, id: &str) {
        PlegState::note_made(self, pod_uid, id)
    }

    fn take_stale(&self, pod_uid: &str) -> bool {
        PlegState::take_stale(self, pod_uid)
    }

    fn oom_heard(&self, id: &str) -> bool {
        PlegState::oom_heard(self, id)
    }
}

impl PlegState {
    /// The mode in effect.
    pub fn mode(&self) -> Mode {
        *self.inner.mode.borrow()
    }

    /// Pokes the worker of `pod_uid` about a change in the runtime, marking the pod as needing
    /// a read.
    fn poke_changed(&self, pokes: &Pokes, pod_uid: &str) {
        self.mark_stale(pod_uid);
        pokes.poke(pod_uid);
    }

    /// Marks `pod_uid` as changed in the runtime since its worker's last read.
    pub(crate) fn mark_stale(&self, pod_uid: &str) {
        self.inner
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pod_uid.to_string());
    }

    /// True when the runtime changed for `pod_uid` since the last call (an event or a relist
    /// poked its worker); clears the mark, so call it right before reading the pod.
    pub fn take_stale(&self, pod_uid: &str) -> bool {
        self.inner
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(pod_uid)
    }

    /// True while an event stream flows: workers then wait for events instead of polling.
    pub fn events_live(&self) -> bool {
        matches!(self.mode(), Mode::Events(_))
    }

    pub(crate) fn set_mode(&self, mode: Mode) {
        self.inner.mode.send_if_modified(|m| {
            let changed = *m != mode;
            *m = mode;
            changed
        });
    }

    /// Remembers an exit (or an OOM kill, which its exit follows) heard from the stream.
    pub(crate) fn note_exit(&self, id: &str, facts: Option<feed::ExitFacts>, oom: bool) {
        let now = clock::instant();
        let mut exits = self.inner.exits.lock().unwrap_or_else(|e| e.into_inner());
        exits.retain(|_, n| now.duration_since(n.at) < EXIT_NOTE_TTL);
        let note = exits.entry(id.to_string()).or_insert(ExitNote {
            at: now,
            facts: None,
            oom: false,
        });
        note.at = now;
        note.facts = facts.or(note.facts);
        note.oom |= oom;
        drop(exits);
        self.inner.heard.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Remembers that pod `pod_uid`'s worker made object `id` (see
    /// [`crate::kubelet::runtime::executor::RuntimeEvents::made`]), for [`MADE_TTL`]: by then the
    /// worker's view names it.
    pub fn note_made(&self, pod_uid: &str, id: &str) {
        let now = clock::instant();
        let mut made = self.inner.made.lock().unwrap_or_else(|e| e.into_inner());
        made.retain(|_, (_, at)| now.duration_since(*at) < MADE_TTL);
        made.insert(id.to_string(), (pod_uid.to_string(), now));
    }

    /// The pod whose worker made `id` lately.
    pub fn made_by(&self, id: &str) -> Option<String> {
        let made = self.inner.made.lock().unwrap_or_else(|e| e.into_inner());
        made.get(id)
            .filter(|(_, at)| at.elapsed() < MADE_TTL)
            .map(|(uid, _)| uid.clone())
    }

    /// The exit of `id` heard within [`EXIT_NOTE_TTL`], whatever the views show.
    pub fn exit_of(&self, id: &str) -> Option<HeardExit> {
        let exits = self.inner.exits.lock().unwrap_or_else(|e| e.into_inner());
        exits.get(id)?.heard(id)
    }

    /// True when an exit of `id` was heard without its facts and no worker has seen it in the
    /// view since: only then does the task's deletion, after which the view shows it, need
    /// to wake the worker.
    fn exit_awaited(&self, id: &str) -> bool {
        let exits = self.inner.exits.lock().unwrap_or_else(|e| e.into_inner());
        exits
            .get(id)
            .is_some_and(|n| n.code().is_none() && n.at.elapsed() < EXIT_NOTE_TTL)
    }

    /// The exits heard (within [`EXIT_NOTE_TTL`]) of objects that `observed` still shows
    /// running or ready. Reads only: a view built partly from earlier views must not drop
    /// notes (see [`PlegState::confirmed`]).
    pub fn heard_exits(&self, observed: &ObservedPod) -> Vec<HeardExit> {
        let exits = self.inner.exits.lock().unwrap_or_else(|e| e.into_inner());
        if exits.is_empty() {
            return Vec::new();
        }
        let running = observed
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.id.as_str());
        let ready = observed
            .sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.id.as_str());
        running
            .chain(ready)
            .filter_map(|id| exits.get(id)?.heard(id))
            .collect()
    }

    /// True when the stream told of an OOM kill of `id` within [`EXIT_NOTE_TTL`].
    pub fn oom_heard(&self, id: &str) -> bool {
        self.inner
            .exits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .is_some_and(|n| n.oom && n.at.elapsed() < EXIT_NOTE_TTL)
    }

    /// `read` came straight from the runtime: the exits it shows need no note any more.
    pub fn confirmed(&self, read: &ObservedPod) {
        let mut exits = self.inner.exits.lock().unwrap_or_else(|e| e.into_inner());
        if exits.is_empty() {
            return;
        }
        for c in &read.containers {
            // An OOM kill's note stays until it expires: containerd 1.6 may record the exit
            // before it handles the OOM event, and its view then says `Error`.
            if c.state != ContainerState::Running && !exits.get(&c.id).is_some_and(|n| n.oom) {
                exits.remove(&c.id);
            }
        }
        for s in &read.sandboxes {
            if s.state != SandboxState::Ready {
                exits.remove(&s.id);
            }
        }
    }

    /// One line for `/healthz?verbose`.
    pub fn describe(&self, config_period: Duration, events_period: Duration) -> String {
        match self.mode() {
            Mode::Events(source) => format!(
                "events from {} (relist every {}s as a check)",
                source.as_str(),
                route::relist_period(self.mode(), config_period, events_period).as_secs()
            ),
            Mode::Relist => format!(
                "relisting every {}ms (no event stream)",
                config_period.as_millis()
            ),
        }
    }

    /// The PLEG's counters in Prometheus' text format.
    pub fn render_metrics(&self) -> String {
        let mode = self.mode();
        let source = match mode {
            Mode::Events(s) => s.as_str(),
            Mode::Relist => "none",
        };
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let i = &self.inner;
        format!(
            "# HELP deckhand_pleg_mode Where the PLEG learns of changes: 1 for the mode in effect (events: an event stream with a slow relist as a check; relist: relisting every second).\n\
             # TYPE deckhand_pleg_mode gauge\n\
             deckhand_pleg_mode{{mode=\"events\",source=\"{source}\"}} {}\n\
             deckhand_pleg_mode{{mode=\"relist\",source=\"none\"}} {}\n\
             # HELP deckhand_pleg_events_total Runtime events received.\n\
             # TYPE deckhand_pleg_events_total counter\n\
             deckhand_pleg_events_total {}\n\
             # HELP deckhand_pleg_event_pokes_total Pod workers woken by a runtime event.\n\
             # TYPE deckhand_pleg_event_pokes_total counter\n\
             deckhand_pleg_event_pokes_total {}\n\
             # HELP deckhand_pleg_relists_total Relists completed.\n\
             # TYPE deckhand_pleg_relists_total counter\n\
             deckhand_pleg_relists_total {}\n\
             # HELP deckhand_pleg_subscriptions_total Event subscriptions that stood.\n\
             # TYPE deckhand_pleg_subscriptions_total counter\n\
             deckhand_pleg_subscriptions_total {}\n\
             # HELP deckhand_pleg_stream_breaks_total Event streams that broke.\n\
             # TYPE deckhand_pleg_stream_breaks_total counter\n\
             deckhand_pleg_stream_breaks_total {}\n",
            u8::from(matches!(mode, Mode::Events(_))),
            u8::from(mode == Mode::Relist),
            n(&i.events),
            n(&i.pokes),
            n(&i.relists),
            n(&i.subscriptions),
            n(&i.breaks),
        )
    }
}

#[derive(Default)]
struct Progress {
    last_ok: Option<Instant>,
    last_error: Option<String>,
}

/// Runs the PLEG until `cancel` fires: the relist loop, and with `feed` the event stream.
#[allow(clippy::too_many_arguments)]
pub async fn run<R: RuntimeService, F: EventFeed>(
    rt: R,
    feed: Option<F>,
    details: DetailCache,
    cache: RuntimeCache,
    pokes: Pokes,
    health: Health,
    state: PlegState,
    config: PlegConfig,
    cancel: CancellationToken,
) {
    let started = clock::instant();
    let progress = Arc::new(RwLock::new(Progress::default()));
    {
        let progress = progress.clone();
        let state = state.clone();
        let config = config.clone();
        health.register_noted("pleg", move || {
            let p = progress.read().unwrap_or_else(|e| e.into_inner());
            let since = p.last_ok.unwrap_or(started).elapsed();
            let limit = config
                .unhealthy_after
                .max(config.period_in(state.mode()) * 2);
            if since > limit {
                Err(format!(
                    "PLEG has not completed a relist for {}s (limit {}s)",
                    since.as_secs(),
                    limit.as_secs()
                )
                .into())
            } else {
                Ok(Some(state.describe(config.period, config.events_period)))
            }
        });
    }
    {
        // A note, never a failure: `/healthz` is about the agent, as upstream's is, so a
        // watchdog or a liveness check on it never restarts the agent for containerd's outage
        // (which a restart cannot mend). The outage shows here in the verbose report, on the
        // Node's Ready condition ("container runtime is down") and in the log; the PLEG check
        // above fails once the outage outlasts its threshold, as upstream's sync loop check
        // does after five minutes.
        let progress = progress.clone();
        health.register_noted("runtime", move || {
            let p = progress.read().unwrap_or_else(|e| e.into_inner());
            Ok(runtime_note(p.last_error.as_deref()))
        });
    }
    if let Some(feed) = feed {
        let own_thread = feed.own_thread();
        let follow = follow_events(
            feed,
            (rt.clone(), config.runtime_socket.clone()),
            cache.clone(),
            pokes.clone(),
            state.clone(),
            cancel.clone(),
        );
        if own_thread {
            follow_on_own_thread(follow);
        } else {
            tokio::spawn(follow);
        }
    }
    relist_loop(rt, details, cache, pokes, state, progress, config, cancel).await;
}

#[allow(clippy::too_many_arguments)]
async fn relist_loop<R: RuntimeService>(
    rt: R,
    details: DetailCache,
    cache: RuntimeCache,
    pokes: Pokes,
    state: PlegState,
    progress: Arc<RwLock<Progress>>,
    config: PlegConfig,
    cancel: CancellationToken,
) {
    let mut mode_rx = state.inner.mode.subscribe();
    // The first relist at once (it adopts what the runtime holds).
    let mut due = clock::instant();
    let mut last = clock::instant();
    let mut last_relist_start: Option<Instant> = None;
    // The last relist could not reach the runtime: the next one runs as soon as it answers.
    let mut down = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(due), if !down => {}
            _ = reconnect::until_answering(&rt, &config.runtime_socket), if down => {}
            _ = state.inner.relist_now.notified() => {
                // Asked for by the stream (a new subscription, an unknown object): soon, but
                // never two such relists closer than the gap.
                let at = last + route::RELIST_SOON_GAP;
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            changed = mode_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let mode = *mode_rx.borrow_and_update();
                due = last + config.period_in(mode);
                continue;
            }
        }
        let relist_started = clock::instant();
        if let Some(previous) = last_relist_start.replace(relist_started) {
            crate::base::metrics::KUBELET
                .pleg_relist_interval
                .observe(&[], (relist_started - previous).as_secs_f64());
        }
        let unknown: Vec<String> = std::mem::take(
            &mut *state
                .inner
                .unknown
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
        .into_iter()
        .collect();
        let result = inspect::observe_all(&rt, &details, &config.node_name).await;
        let took = relist_started.elapsed();
        last = clock::instant();
        due = last + config.period_in(state.mode());
        crate::base::metrics::KUBELET
            .pleg_relist_duration
            .observe(&[], took.as_secs_f64());
        if took > config.period * 5 {
            tracing::warn!(
                elapsed_ms = took.as_secs_f64() * 1000.0,
                "a relist was slow"
            );
        }
        match result {
            Ok(current) => {
                tracing::trace!(
                    pods = current.len(),
                    elapsed_ms = took.as_secs_f64() * 1000.0,
                    "relisted"
                );
                state.inner.relists.fetch_add(1, Ordering::Relaxed);
                down = false;
                // Compare with the freshest known state, which includes what workers saw since
                // the last relist: a container created and removed between two relists still
                // shows up as a change.
                let changes = cache.store_relist(current);
                cache.mark_foreign(unknown);
                {
                    let mut p = progress.write().unwrap_or_else(|e| e.into_inner());
                    if p.last_error.take().is_some() {
                        tracing::info!("the container runtime answers again");
                    }
                    p.last_ok = Some(clock::instant());
                }
                for event in changes {
                    tracing::debug!(pod_uid = %event.pod_uid, kind = ?event.kind, id = %event.id, "PLEG event");
                    state.poke_changed(&pokes, &event.pod_uid);
                }
            }
            Err(err) => {
                // The unknown IDs stay unsettled: the next relist looks for them again.
                state
                    .inner
                    .unknown
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(unknown);
                down = true;
                let mut p = progress.write().unwrap_or_else(|e| e.into_inner());
                let text = err.to_string();
                if p.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "relist failed");
                }
                p.last_error = Some(text);
            }
        }
    }
}

/// What `/healthz?verbose` says on its `runtime` line: nothing while the runtime answers.
fn runtime_note(last_error: Option<&str>) -> Option<String> {
    last_error
        .map(|err| format!("the container runtime is not answering (the node is NotReady): {err}"))
}

/// Handles one event: pokes the owner, or asks for a relist to find it.
fn handle_event(event: &RuntimeEvent, cache: &RuntimeCache, pokes: &Pokes, state: &PlegState) {
    state.inner.events.fetch_add(1, Ordering::Relaxed);
    let known = cache
        .owner_of(&event.id)
        .or_else(|| state.made_by(&event.id));
    let owner = route::event_owner(known, event.pod_uid.as_deref(), |uid| cache.has_pod(uid));
    let foreign = owner.is_none() && cache.is_foreign(&event.id);
    let decision = route::route(
        event,
        owner.as_deref(),
        foreign,
        state.exit_awaited(&event.id),
    );
    tracing::trace!(id = %event.id, happening = ?event.happening, ?decision, "runtime event");
    if matches!(
        event.happening,
        feed::Happening::Exited | feed::Happening::OomKilled
    ) && !foreign
    {
        state.note_exit(
            &event.id,
            event.exit,
            event.happening == feed::Happening::OomKilled,
        );
    }
    match decision {
        Route::Poke(uid) => {
            tracing::debug!(pod_uid = %uid, id = %event.id, happening = ?event.happening, "PLEG event from the runtime");
            state.inner.pokes.fetch_add(1, Ordering::Relaxed);
            state.poke_changed(pokes, &uid);
        }
        Route::RelistSoon => {
            state
                .inner
                .unknown
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(event.id.clone());
            state.inner.relist_now.notify_one();
        }
        Route::Ignore => {}
    }
}

/// Runs the event follower on a thread of its own with a single-threaded async runtime: the
/// event is read from the socket, routed and its pod poked there, so an exit is heard as soon
/// as the runtime sends it even while the agent's worker threads (as many as cores) are busy
/// with pod syncs. On the shared runtime that wait was most of the 20–40 ms between
/// containerd's exit and the PLEG's event at a load of 14 on two cores (issue 28).
fn follow_on_own_thread(follow: impl std::future::Future<Output = ()> + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("pleg-events".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(follow),
                Err(err) => {
                    tracing::error!(error = %err, "cannot start the PLEG's event runtime; relisting only");
                }
            }
        });
    if let Err(err) = spawned {
        tracing::error!(error = %err, "cannot start the PLEG's event thread; relisting only");
    }
}

/// Subscribes, follows the stream while it stands, and subscribes again with a back-off when
/// it breaks, or as soon as the runtime answers again when it broke because the runtime went
/// away; the mode says meanwhile whether events flow.
async fn follow_events<F: EventFeed, R: RuntimeService>(
    feed: F,
    (rt, socket): (R, reconnect::SocketSignal),
    cache: RuntimeCache,
    pokes: Pokes,
    state: PlegState,
    cancel: CancellationToken,
) {
    let mut failures = 0u32;
    let mut said_failure = false;
    loop {
        let subscribed = tokio::select! {
            _ = cancel.cancelled() => return,
            s = feed.subscribe() => s,
        };
        let unsupported = match subscribed {
            Ok((source, mut stream)) => {
                state.inner.subscriptions.fetch_add(1, Ordering::Relaxed);
                state.set_mode(Mode::Events(source));
                // Whatever happened while no stream stood is found by a relist now.
                state.inner.relist_now.notify_one();
                tracing::info!(
                    source = source.as_str(),
                    "following the runtime's events; relisting only as a check"
                );
                said_failure = false;
                let since = clock::instant();
                let why = loop {
                    let item = tokio::select! {
                        _ = cancel.cancelled() => return,
                        item = stream.next() => item,
                    };
                    match item {
                        Some(Ok(event)) => handle_event(&event, &cache, &pokes, &state),
                        Some(Err(err)) => break err,
                        None => break FeedError::Ended { what: "event" },
                    }
                };
                state.inner.breaks.fetch_add(1, Ordering::Relaxed);
                state.set_mode(Mode::Relist);
                state.inner.relist_now.notify_one();
                tracing::warn!(error = %why, "the runtime's event stream broke; relisting every period until it is back");
                failures = route::failures_after_break(failures, since.elapsed());
                false
            }
            Err(err) => {
                state.set_mode(Mode::Relist);
                failures = failures.saturating_add(1);
                let unsupported = matches!(err, FeedError::Unsupported);
                if !said_failure {
                    tracing::warn!(error = %err, "no event stream from the runtime; relisting meanwhile");
                    said_failure = true;
                } else {
                    tracing::debug!(error = %err, "subscribing failed again");
                }
                unsupported
            }
        };
        let wait = route::resubscribe_delay(failures.saturating_sub(1), unsupported);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = reconnect::back_after_outage(&rt, &socket), if !unsupported => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::observed::{ObservedContainer, ObservedSandbox};

    fn container(id: &str, state: ContainerState) -> ObservedContainer {
        ObservedContainer {
            id: id.into(),
            sandbox_id: "s1".into(),
            name: "c".into(),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            hash: None,
            image: String::new(),
            image_ref: String::new(),
            grace_period: None,
            is_init: false,
            pre_stop: None,
            round: None,
        }
    }

    fn pod(containers: Vec<ObservedContainer>, sandbox: Option<SandboxState>) -> ObservedPod {
        ObservedPod {
            sandboxes: sandbox
                .map(|state| ObservedSandbox {
                    id: "s1".into(),
                    attempt: 0,
                    state,
                    created_at: 1,
                    ip: None,
                    additional_ips: vec![],
                    host_network: false,
                })
                .into_iter()
                .collect(),
            containers,
            names: None,
        }
    }

    fn kinds(old: ObservedPod, new: ObservedPod) -> Vec<PlegEventKind> {
        let o = BTreeMap::from([("u".to_string(), old)]);
        let n = BTreeMap::from([("u".to_string(), new)]);
        diff(&o, &n).into_iter().map(|e| e.kind).collect()
    }

    #[test]
    fn diff_table() {
        use ContainerState::*;
        use PlegEventKind::*;
        let ready = Some(SandboxState::Ready);
        let rows: Vec<(ObservedPod, ObservedPod, Vec<PlegEventKind>)> = vec![
            (pod(vec![], ready), pod(vec![], ready), vec![]),
            (
                pod(vec![], ready),
                pod(vec![container("a", Running)], ready),
                vec![ContainerStarted],
            ),
            (
                pod(vec![container("a", Running)], ready),
                pod(vec![container("a", Exited)], ready),
                vec![ContainerDied],
            ),
            (
                pod(vec![container("a", Exited)], ready),
                pod(vec![], ready),
                vec![ContainerRemoved],
            ),
            (
                pod(vec![], ready),
                pod(vec![container("a", Created)], ready),
                vec![ContainerChanged],
            ),
            (
                pod(vec![container("a", Running)], ready),
                pod(vec![container("a", Running)], ready),
                vec![],
            ),
            (
                pod(vec![], ready),
                pod(vec![], Some(SandboxState::NotReady)),
                vec![SandboxChanged],
            ),
            (pod(vec![], None), pod(vec![], ready), vec![SandboxChanged]),
            (pod(vec![], ready), pod(vec![], None), vec![SandboxChanged]),
        ];
        for (i, (old, new, want)) in rows.into_iter().enumerate() {
            assert_eq!(kinds(old, new), want, "row {i}");
        }
    }

    mod stream {
        use std::collections::VecDeque;

        use tokio::sync::mpsc;
        use tokio_stream::wrappers::ReceiverStream;

        use super::super::feed::{EventStream, FeedSource, Happening};
        use super::super::*;
        use crate::clients::cri::fake::FakeCri;

        type Sender = mpsc::Sender<Result<RuntimeEvent, FeedError>>;

        /// Hands out scripted subscriptions, one per attempt.
        #[derive(Clone, Default)]
        struct FakeFeed {
            script: Arc<Mutex<VecDeque<Result<EventStream, FeedError>>>>,
        }

        impl FakeFeed {
            fn stream(&self) -> Sender {
                let (tx, rx) = mpsc::channel(16);
                self.script
                    .lock()
                    .unwrap()
                    .push_back(Ok(Box::pin(ReceiverStream::new(rx))));
                tx
            }

            fn fail(&self) {
                self.script
                    .lock()
                    .unwrap()
                    .push_back(Err(FeedError::Ended { what: "fake" }));
            }
        }

        impl EventFeed for FakeFeed {
            async fn subscribe(&self) -> Result<(FeedSource, EventStream), FeedError> {
                let next = self.script.lock().unwrap().pop_front();
                match next {
                    Some(Ok(s)) => Ok((FeedSource::Containerd, s)),
                    Some(Err(e)) => Err(e),
                    None => Err(FeedError::Unsupported),
                }
            }
        }

        struct Running {
            rt: FakeCri,
            cache: RuntimeCache,
            pokes: Pokes,
            health: Health,
            state: PlegState,
            cancel: CancellationToken,
        }

        /// A [`FakeFeed`] the PLEG follows on a thread of its own, as the runtime's.
        #[derive(Clone, Default)]
        struct ThreadFeed(FakeFeed);

        impl EventFeed for ThreadFeed {
            async fn subscribe(&self) -> Result<(FeedSource, EventStream), FeedError> {
                self.0.subscribe().await
            }

            fn own_thread(&self) -> bool {
                true
            }
        }

        fn start<F: EventFeed>(rt: &FakeCri, feed: F) -> Running {
            let r = Running {
                rt: rt.clone(),
                cache: RuntimeCache::default(),
                pokes: Pokes::default(),
                health: Health::default(),
                state: PlegState::default(),
                cancel: CancellationToken::new(),
            };
            tokio::spawn(run(
                rt.clone(),
                Some(feed),
                DetailCache::default(),
                r.cache.clone(),
                r.pokes.clone(),
                r.health.clone(),
                r.state.clone(),
                PlegConfig {
                    node_name: "node-a".into(),
                    ..Default::default()
                },
                r.cancel.clone(),
            ));
            r
        }

        async fn until(what: &str, mut check: impl FnMut() -> bool) {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !check() {
                assert!(Instant::now() < deadline, "timed out waiting for {what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        fn event(id: &str, happening: Happening) -> Result<RuntimeEvent, FeedError> {
            Ok(RuntimeEvent {
                id: id.into(),
                happening,
                pod_uid: None,
                exit: None,
            })
        }

        async fn drain(pokes: &Pokes) -> Vec<String> {
            if pokes.pending() == 0 {
                return vec![];
            }
            pokes.take().await
        }

        #[tokio::test(start_paused = true)]
        async fn an_exit_pokes_its_pod_at_once_and_unknown_ids_are_settled_by_a_relist() {
            let (rt, sandbox, container) =
                crate::kubelet::runtime::inspect::test_support::one_pod("node-a").await;
            let feed = FakeFeed::default();
            let tx = feed.stream();
            let r = start(&rt, feed);
            until("events and a relist", || {
                r.state.events_live() && r.cache.owner_of(&container).is_some()
            })
            .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(drain(&r.pokes).await, ["u1"], "the first relist's news");

            // A crash: the owner is poked at once, with no relist.
            let relists = r.rt.count("ListPodSandbox");
            tx.send(event(&container, Happening::Exited)).await.unwrap();
            until("the poke", || r.pokes.pending() == 1).await;
            assert_eq!(drain(&r.pokes).await, ["u1"]);
            // The pause process dying is the sandbox's exit.
            tx.send(event(&sandbox, Happening::Exited)).await.unwrap();
            until("the poke", || r.pokes.pending() == 1).await;
            assert_eq!(drain(&r.pokes).await, ["u1"]);
            // A start is the worker's own doing.
            tx.send(event(&container, Happening::Started))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(r.pokes.pending(), 0);
            assert_eq!(
                r.rt.count("ListPodSandbox"),
                relists,
                "no relist for known IDs"
            );

            // Another node's container exits: one relist looks for it, then it is foreign.
            tx.send(event("elsewhere", Happening::Exited))
                .await
                .unwrap();
            until("a relist", || r.rt.count("ListPodSandbox") == relists + 1).await;
            until("the ID marked foreign", || r.cache.is_foreign("elsewhere")).await;
            tx.send(event("elsewhere", Happening::Removed))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert_eq!(r.rt.count("ListPodSandbox"), relists + 1);
            assert_eq!(r.pokes.pending(), 0);
            assert!(
                r.state
                    .render_metrics()
                    .contains("deckhand_pleg_event_pokes_total 2\n")
            );

            // An event naming another agent's pod (CRI events carry the pod UID) wakes no
            // worker and leaves nothing in the stale set; one relist looks for the ID.
            let mut theirs = event("elsewhere-2", Happening::Exited).unwrap();
            theirs.pod_uid = Some("theirs".into());
            tx.send(Ok(theirs)).await.unwrap();
            until("a relist", || r.rt.count("ListPodSandbox") == relists + 2).await;
            assert_eq!(r.pokes.pending(), 0, "another agent's pod is not poked");
            assert!(!r.state.take_stale("theirs"), "nor left in the stale set");
            // The same for this agent's own pod still goes to its worker at once.
            let mut mine = event("new-id", Happening::Exited).unwrap();
            mine.pod_uid = Some("u1".into());
            tx.send(Ok(mine)).await.unwrap();
            until("the poke", || r.pokes.pending() == 1).await;
            assert_eq!(drain(&r.pokes).await, ["u1"]);
            r.cancel.cancel();
        }

        /// The agent's runtime here is the test's single thread, blocked while the exit is sent
        /// from another thread: the PLEG's own thread hears it and pokes the pod all the same.
        #[tokio::test]
        async fn an_exit_is_heard_while_the_agents_runtime_is_busy() {
            let (rt, _, container) =
                crate::kubelet::runtime::inspect::test_support::one_pod("node-a").await;
            let feed = ThreadFeed::default();
            let tx = feed.0.stream();
            let r = start(&rt, feed);
            until("events and a relist", || {
                r.state.events_live() && r.cache.owner_of(&container).is_some()
            })
            .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            drain(&r.pokes).await;
            let sender = std::thread::spawn(move || {
                tx.blocking_send(event(&container, Happening::Exited))
                    .unwrap();
                tx
            });
            // Busy: this thread does not yield to its runtime until the poke is there.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while r.pokes.pending() == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the exit was not heard while the agent's runtime was busy"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let _tx = sender.join().unwrap();
            assert_eq!(drain(&r.pokes).await, ["u1"]);
            r.cancel.cancel();
        }

        #[tokio::test(start_paused = true)]
        async fn a_broken_stream_brings_back_the_fast_relist_until_a_new_one_stands() {
            let (rt, _, _) =
                crate::kubelet::runtime::inspect::test_support::one_pod("node-a").await;
            let feed = FakeFeed::default();
            let first = feed.stream();
            feed.fail();
            let second = feed.stream();
            let r = start(&rt, feed);
            until("events", || r.state.events_live()).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let verbose = r.health.report().render(true);
            assert!(
                verbose
                    .contains("[+]pleg ok: events from containerd (relist every 300s as a check)"),
                "{verbose}"
            );
            // While events flow, the relist is a rare check.
            let relists = r.rt.count("ListPodSandbox");
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert_eq!(r.rt.count("ListPodSandbox"), relists);

            // The stream breaks: relisting every second at once.
            drop(first);
            until("relist mode", || !r.state.events_live()).await;
            let broke = r.rt.count("ListPodSandbox");
            let verbose = r.health.report().render(true);
            assert!(
                verbose.contains("[+]pleg ok: relisting every 1000ms"),
                "{verbose}"
            );
            assert!(
                r.state
                    .render_metrics()
                    .contains("deckhand_pleg_mode{mode=\"relist\",source=\"none\"} 1\n")
            );
            // One failed attempt, then the second stream stands after the back-off.
            until("events again", || r.state.events_live()).await;
            assert!(r.rt.count("ListPodSandbox") > broke, "relisted meanwhile");
            let metrics = r.state.render_metrics();
            assert!(
                metrics.contains("deckhand_pleg_subscriptions_total 2\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("deckhand_pleg_stream_breaks_total 1\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("deckhand_pleg_mode{mode=\"events\",source=\"containerd\"} 1\n"),
                "{metrics}"
            );
            // A relist right after subscribing catches up, then quiet again.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let caught_up = r.rt.count("ListPodSandbox");
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert_eq!(r.rt.count("ListPodSandbox"), caught_up);
            drop(second);
            r.cancel.cancel();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_heard_exit_is_kept_until_the_runtime_shows_it_or_it_ages_out() {
        use ContainerState::*;
        let state = PlegState::default();
        let ready = Some(SandboxState::Ready);
        let running = pod(vec![container("a", Running)], ready);
        state.note_exit("a", Some(feed::ExitFacts { code: 1, at_ns: 5 }), false);
        let heard = state.heard_exits(&running);
        assert_eq!(heard.len(), 1);
        assert_eq!((heard[0].exit_code, heard[0].finished_at), (Some(1), 5));
        assert!(
            !state.exit_awaited("a"),
            "its facts are known: no need to wait"
        );
        // A view with the exit written in asks nothing, and drops nothing.
        let mut written = running.clone();
        inspect::apply_heard_exits(&mut written, &heard, 0);
        assert!(state.heard_exits(&written).is_empty());
        assert_eq!(state.heard_exits(&running).len(), 1);
        // A read that shows it: forgotten.
        state.confirmed(&pod(vec![container("a", Exited)], ready));
        assert!(state.heard_exits(&running).is_empty());
        // A SIGKILL with no OOM event for it: the runtime says why (perhaps OOMKilled).
        state.note_exit(
            "k",
            Some(feed::ExitFacts {
                code: 137,
                at_ns: 5,
            }),
            false,
        );
        assert_eq!(state.exit_of("k").unwrap().exit_code, None);
        assert!(state.exit_awaited("k"));
        state.note_exit("k", None, true);
        assert_eq!(state.exit_of("k").unwrap().exit_code, Some(137));
        // An OOM kill before its exit: waited for, then aged out.
        state.note_exit("a", None, true);
        assert!(state.exit_awaited("a"));
        assert_eq!(state.heard_exits(&running)[0].exit_code, None);
        tokio::time::advance(EXIT_NOTE_TTL + Duration::from_millis(1)).await;
        assert!(!state.exit_awaited("a"));
        assert!(state.heard_exits(&running).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_exit_of_an_object_a_worker_just_made_pokes_its_pod_before_any_view_names_it() {
        let (cache, pokes, state) = (
            RuntimeCache::default(),
            Pokes::default(),
            PlegState::default(),
        );
        let exit = RuntimeEvent {
            id: "init-1".into(),
            happening: feed::Happening::Exited,
            pod_uid: None,
            exit: Some(feed::ExitFacts { code: 0, at_ns: 7 }),
        };
        // Unknown to every view and not made by a worker: a relist must find whose it is.
        handle_event(&exit, &cache, &pokes, &state);
        assert_eq!(pokes.pending(), 0);
        // Made by pod u's worker a moment ago: its exit goes to that worker at once.
        state.note_made("u", "init-1");
        handle_event(&exit, &cache, &pokes, &state);
        assert_eq!(pokes.take().await, vec!["u".to_string()]);
        assert_eq!(state.exit_of("init-1").and_then(|h| h.exit_code), Some(0));
        // Forgotten once the worker's view has long named it.
        tokio::time::advance(MADE_TTL + Duration::from_millis(1)).await;
        assert_eq!(state.made_by("init-1"), None);
    }

    #[test]
    fn diff_reports_pods_that_vanish() {
        let old = BTreeMap::from([(
            "u".to_string(),
            pod(
                vec![container("a", ContainerState::Running)],
                Some(SandboxState::Ready),
            ),
        )]);
        let events = diff(&old, &BTreeMap::new());
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| e.pod_uid == "u"));
    }
}
