//! Carries out [`PodActions`] against the runtime. One sync: observe the pod, decide (pure,
//! [`actions::compute_pod_actions`]), act, observe again, and decide when to look next (pure,
//! [`revisit::next_look`]).
//!
//! The acting is split by job: `start` (volumes, sandbox, image, container, postStart),
//! `image_pull` (the image step and the pull), `teardown` (graceful stops, removal of
//! everything of a pod). Each step that fails is turned into the reason users know from
//! upstream (`ErrImagePull`, `CreateContainerConfigError`, …) and recorded for the status; one
//! failing container never stops the others from being tried.

mod dra;
mod expand;
mod image_pull;
mod image_volumes;
mod mount;
mod resize;
mod start;
mod teardown;
mod userns;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};

use crate::base::clock;
use crate::clients::cri::proto::PodSandboxConfig;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::api_objects::{ApiObjects, PodObjects};
use crate::kubelet::events::{EventType, Recorder, reason};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};
use crate::kubelet::prober::{ProbeView, Unhealthy};
use crate::kubelet::volume::VolumeManager;

use super::actions::{self, DecisionContext, PodActions};
use super::backoff::{BackoffPolicy, BackoffTable};
use super::inspect::{self, DetailCache, HeardExit, Made};
use super::pod_files;
use super::revisit::{self, ERROR_RETRY, SyncFacts};
use super::translate::{self, HostDns, SandboxContext};
use crate::base::observed::ObservedPod;

use teardown::StopUntil;
pub(crate) use teardown::TeardownError;

/// Facts about the node that translation needs; fixed for the agent's lifetime.
#[derive(Clone, Debug)]
pub(crate) struct NodeContext {
    pub node_name: String,
    pub host_ip: Option<String>,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub host_dns: HostDns,
    pub cluster_domain: Option<String>,
    pub cluster_dns: Vec<String>,
    pub cgroup_driver: crate::config::CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// Where the cgroup hierarchies are mounted (for removing pod cgroups).
    pub cgroup_fs: PathBuf,
    pub node_memory_bytes: u64,
    /// Detected once at start: what a container that sets no limit may use.
    pub allocatable: crate::base::podspec::resources::NodeAllocatable,
    /// `runtimeRequestTimeout`, also the bound of a postStart hook.
    pub runtime_request_timeout: Duration,
    /// `--image-pull-progress-deadline` (`None`: pulls wait as long as they take).
    pub image_pull_progress_deadline: Option<Duration>,
    /// `seccompDefault`: pods and containers without a seccomp profile get `RuntimeDefault`.
    pub seccomp_default: bool,
    /// What volumes are mounted and unmounted through (the kernel's; a fake in unit tests).
    pub mounter: Arc<dyn crate::kubelet::volume::mounter::Mounter>,
    /// The labels the node registers with (a persistent volume's node affinity is checked
    /// against them).
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// The pods' user namespaces (`hostUsers: false`); `None` where none are set up (unit
    /// tests), which gives no user-namespace options to the runtime and refuses such pods.
    pub userns: Option<Arc<crate::kubelet::userns::UsernsManager>>,
    /// The device plugin manager: a container's devices at its creation (`None`: no devices).
    pub devices: Option<crate::kubelet::devices::DeviceManager>,
    /// The DRA manager: a pod's claims prepared before its sandbox (`None`: no DRA).
    pub dra: Option<crate::kubelet::dra::DraManager>,
}

impl NodeContext {
    /// `<root>/pods/<uid>`: the pod's own files (hosts file, termination logs).
    pub(crate) fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }

    /// `<podLogsDir>/<namespace>_<name>_<uid>`, upstream's pod log directory.
    pub(crate) fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
    }

    /// Where `Localhost` seccomp profiles are read from.
    pub(crate) fn seccomp_profile_root(&self) -> PathBuf {
        self.root_dir.join("seccomp")
    }
}

/// What a worker keeps between syncs of one pod.
#[derive(Default)]
pub(crate) struct PodSyncState {
    pub backoff: BackoffTable,
    /// The message of each image's last failed pull, by back-off key, for the back-off's
    /// status message (as upstream: `Back-off pulling image "x": ErrImagePull: …`).
    pub pull_errors: HashMap<String, String>,
    pub waiting: HashMap<String, WaitingReason>,
    pub status: Option<PodStatus>,
    /// Termination messages already read, by container ID.
    pub messages: HashMap<String, String>,
    /// Time spent making sure images are present (mostly pulling), which the pod start-up SLI
    /// leaves out.
    pub image_time: Duration,
    /// The runtime is known to hold nothing of the pod (a new worker whose pod no relist or
    /// worker ever saw): the next sync starts from an empty view instead of reading one. Taken
    /// by that sync.
    pub known_empty: bool,
    /// The pod as the last sync left it (with the exits heard since written in): what the
    /// next observation starts from, so that it reads only the pod's own sandbox and
    /// containers, or nothing when an exit event already says what changed.
    pub view: Option<ObservedPod>,
    /// The next sync reads the pod even when nothing was heard of it: the view is not a
    /// complete read of this worker's (it came from the relist that adopted the pod, or a step
    /// failed or could not be read after). Taken by that sync.
    pub reread: bool,
    /// The failed set-ups of the pod's volumes and when each is tried again.
    pub mounts: crate::kubelet::volume::backoff::MountBackoff,
    /// The start could not go on because the volumes are not ready: look again after this
    /// long (the first volume's back-off), or when poked. Taken at the end of the sync.
    pub start_blocked: Option<Duration>,
    /// The failed republishes of the pod's CSI volumes (`requiresRepublish`) and when each is
    /// tried again; apart from `mounts`, as a volume that fails to be published again stays
    /// mounted and keeps nothing from starting.
    pub republish: crate::kubelet::volume::backoff::MountBackoff,
    /// A republish or an expansion failed: look again after this long (its back-off). Taken
    /// at the end of the sync.
    pub republish_retry: Option<Duration>,
    /// The failed online expansions of the pod's CSI volumes (`expand.rs`) and when each is
    /// tried again.
    pub expansion: crate::kubelet::volume::backoff::MountBackoff,
    /// What an expansion settled for good, by `<volume>@<size>`: a read-only mount told it is
    /// not expanded, a driver that cannot expand a volume in use.
    pub expansion_settled: std::collections::HashSet<String>,
    /// The next sync starts from the view without reading the pod: a probe asked to kill an
    /// instance the view shows running, and the kill should not wait for a read. Taken by
    /// that sync.
    pub act_on_view: bool,
    /// What each running instance (by container ID) was last given: its spec's resources at
    /// its start, or an in-place resize's since (upstream's actuated resources).
    pub actuated: HashMap<String, k8s_openapi::api::core::v1::ResourceRequirements>,
    /// The pod-level resources (`spec.resources`, `None` without them) the pod's cgroup was
    /// last given: the pod's at the first sync, an in-place resize's since (upstream's actuated
    /// pod-level resources). `None` until the first sync records them.
    pub actuated_pod: Option<Option<k8s_openapi::api::core::v1::ResourceRequirements>>,
    /// Why the allocated resize could not be carried out at the last try (a memory limit
    /// below what its container uses, a runtime refusal); the status shows it on
    /// `PodResizeInProgress` until a try goes through.
    pub resize_error: Option<String>,
}

/// What the executor needs to know of the PLEG's event stream to decide when to look at a pod
/// again. `pleg::PlegState` implements it; a trait, so the runtime never depends on the PLEG
/// (which reads the runtime).
pub(crate) trait RuntimeEvents: Send + Sync {
    /// Events from the runtime flow now (an exit will wake the worker).
    fn events_live(&self) -> bool;
    /// The exits the stream told of for objects `observed` still shows running or ready.
    fn heard_exits(&self, observed: &ObservedPod) -> Vec<HeardExit>;
    /// `read` came from the runtime just now: exits it shows need no remembering.
    fn confirmed(&self, read: &ObservedPod);
    /// Changes whenever the stream tells of an exit (a worker stopping a container waits on it).
    fn exits_heard(&self) -> tokio::sync::watch::Receiver<u64>;
    /// The exit of object `id` the stream told of lately, if any.
    fn exit_of(&self, id: &str) -> Option<HeardExit>;
    /// The worker of pod `pod_uid` just made object `id`: its events belong to that pod even
    /// before the worker's view (which names the pod's objects to the PLEG) is published at
    /// the end of the sync. An init container that exits at once would otherwise go unowned.
    fn made(&self, pod_uid: &str, id: &str);
    /// True when something changed in the runtime for the pod since the last call (an event
    /// or a relist poked its worker). Clears the mark: the caller reads the pod next.
    fn take_stale(&self, pod_uid: &str) -> bool;
    /// True when the stream told of an OOM kill of object `id` lately.
    fn oom_heard(&self, id: &str) -> bool;
}

/// At most this many steps in one sync (each acting on the view the previous one left): a
/// start-up whose next step is due at once goes on without waiting for another sync.
const MAX_STEPS: usize = 8;

fn now_ns() -> i64 {
    clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The result of one sync.
pub(crate) struct SyncOutcome {
    pub observed: ObservedPod,
    /// The runtime could not be read: `observed` means nothing, keep the last status.
    pub runtime_unreachable: bool,
    /// Sync again after this long even without events (a back-off ends, an error to retry).
    pub retry_after: Option<Duration>,
}

/// Where a sync's step loop stands: the view, the decision to carry out (or carried out
/// last), and what the last step left for deciding when to look again. One value, so that the
/// loop ([`Executor::step_until_settled`]) and the end of the sync
/// ([`Executor::finish_sync`]) hand it on whole.
struct Step {
    /// Steps begun so far.
    number: usize,
    observed: ObservedPod,
    /// An exit was heard without its code: the view lags the runtime.
    behind: bool,
    decision: PodActions,
    /// Carrying out the last decision failed somewhere.
    failed: bool,
    /// The decision made again on the view after the last step, when it changed anything.
    followup: Option<PodActions>,
}

impl Step {
    /// Before the first step: the view read at the start and the first decision on it.
    fn first(observed: ObservedPod, behind: bool, decision: PodActions) -> Self {
        Step {
            number: 0,
            observed,
            behind,
            decision,
            failed: false,
            followup: None,
        }
    }
}

/// True when the container waits on an error that is retried soon (not a back-off): starting
/// it again within the same sync would only fail again.
fn blocked_by_error(state: &PodSyncState, name: &str) -> bool {
    state
        .waiting
        .get(name)
        .is_some_and(|w| w.reason.retried_soon())
}

/// Upstream never gives a container less than this to stop.
pub(crate) const MIN_GRACE_SECONDS: i64 = 2;

/// Carries out decisions for pods on one runtime.
#[derive(Clone)]
pub(crate) struct Executor<R> {
    rt: R,
    node: Arc<NodeContext>,
    details: DetailCache,
    policy: BackoffPolicy,
    volumes: VolumeManager,
    /// What happens to pods and containers, for `kubectl describe` (never waits).
    events: Recorder,
    /// With an API server: the configMaps, secrets and tokens the pods refer to.
    objects: Option<ApiObjects>,
    /// The pods' cgroups (cgroupfs driver with cgroupsPerQOS); without it the runtime makes
    /// them with its defaults.
    cgroups: Option<Arc<crate::kubelet::cm::CgroupManager>>,
    /// How container limits are translated (CFS settings, cgroup version, huge page sizes).
    resources: crate::kubelet::cm::ContainerSettings,
    /// The PLEG's mode and the exits it heard of: with events flowing, a worker waits for the
    /// exit it needs instead of polling for it.
    pleg: Option<Arc<dyn RuntimeEvents>>,
}

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The grace period for stopping a pod's containers.
pub(crate) fn grace_period(pod: Option<&Pod>, override_seconds: Option<i64>) -> i64 {
    let from_spec = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    override_seconds.unwrap_or(from_spec).max(MIN_GRACE_SECONDS)
}

/// The spec hash in the form recorded on containers.
pub(crate) fn spec_hash(container: &Container) -> String {
    crate::base::podspec::spec_hash::format_hash(crate::base::podspec::spec_hash::container_hash(
        container,
    ))
}

/// A persistent volume's required node affinity against this node's labels and name.
fn pv_affinity(node: &NodeContext) -> crate::kubelet::volume::persistent_setup::AffinityCheck {
    let labels = node.node_labels.clone();
    let name = node.node_name.clone();
    crate::kubelet::volume::persistent_setup::AffinityCheck::new(move |selector| {
        crate::kubelet::admission::node_selector_matches(selector, &labels, &name)
    })
}

impl<R: RuntimeService + ImageService> Executor<R> {
    pub(crate) fn new(
        rt: R,
        node: Arc<NodeContext>,
        details: DetailCache,
        policy: BackoffPolicy,
        events: Recorder,
    ) -> Self {
        let volumes = VolumeManager::new(
            node.root_dir.clone(),
            node.node_memory_bytes,
            node.allocatable,
            node.mounter.clone(),
        )
        .with_pv_affinity(pv_affinity(&node));
        Executor {
            rt,
            node,
            details,
            policy,
            volumes,
            events,
            objects: None,
            cgroups: None,
            resources: crate::kubelet::cm::ContainerSettings::default(),
            pleg: None,
        }
    }

    /// Makes and removes the pods' cgroups through `cgroups`.
    pub(crate) fn with_cgroups(mut self, cgroups: Arc<crate::kubelet::cm::CgroupManager>) -> Self {
        self.cgroups = Some(cgroups);
        self
    }

    /// Translates container limits with `settings` (`cpuCFSQuota`, its period, the cgroup
    /// version, the machine's huge page sizes).
    pub(crate) fn with_container_settings(
        mut self,
        settings: crate::kubelet::cm::ContainerSettings,
    ) -> Self {
        self.resources = settings;
        self
    }

    /// Makes sure the pod's cgroup exists before anything of it starts (upstream: before the
    /// sandbox, volumes included); a pod that will not run again stops counting for the QoS
    /// tiers. `Err`'s text is the message for the pod's event.
    async fn ensure_pod_cgroup(&self, pod: &Pod, terminal: bool) -> Result<(), PodCgroupError> {
        let Some(cgroups) = self.cgroups.clone() else {
            return Ok(());
        };
        let uid = pod_uid(pod).to_string();
        if terminal {
            tokio::task::spawn_blocking(move || cgroups.pod_stopped(&uid)).await?;
            return Ok(());
        }
        let owned = pod.clone();
        let started = clock::instant();
        let ensured = tokio::task::spawn_blocking(move || cgroups.ensure_pod(&owned)).await??;
        if ensured == crate::kubelet::cm::Ensured::Created {
            tracing::debug!(
                pod_uid = %uid,
                elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
                "pod cgroup created"
            );
        }
        Ok(())
    }

    /// Lets the next-look decision know whether the PLEG's event stream flows.
    pub(crate) fn with_pleg(mut self, pleg: Arc<dyn RuntimeEvents>) -> Self {
        self.pleg = Some(pleg);
        self
    }

    /// Reads configMaps, secrets and tokens through `objects` (with `--kubeconfig`); without
    /// it, volumes and variables that need them are refused, as a standalone kubelet does.
    pub(crate) fn with_api_objects(mut self, objects: ApiObjects) -> Self {
        self.objects = Some(objects);
        self
    }

    /// What the pod's volumes and environment read from the API server, fetched now (from the
    /// watch cache; tokens when due).
    async fn pod_objects(&self, pod: &Pod) -> PodObjects {
        match &self.objects {
            Some(objects) => objects.for_pod(pod).await,
            None => PodObjects::standalone(),
        }
    }

    /// The pod is gone: its objects need no watching and its tokens no keeping.
    fn forget_objects(&self, uid: &str) {
        if let Some(objects) = &self.objects {
            objects.forget_pod(uid);
        }
    }

    /// Reads the pod's current state from the runtime.
    pub(crate) async fn observe(&self, uid: &str) -> Result<ObservedPod, CriError> {
        inspect::observe_pod(&self.rt, &self.details, &self.node.node_name, uid).await
    }

    fn sandbox_config(
        &self,
        pod: &Pod,
        attempt: u32,
        userns: Option<crate::clients::cri::proto::UserNamespace>,
    ) -> Result<PodSandboxConfig, translate::TranslateError> {
        let qos = crate::base::podspec::qos_class(pod);
        let ctx = SandboxContext {
            pod_logs_dir: self.node.pod_logs_dir.clone(),
            host_dns: self.node.host_dns.clone(),
            cluster_dns: self.node.cluster_dns.clone(),
            cluster_domain: self.node.cluster_domain.clone().unwrap_or_default(),
            cgroup_parent: crate::kubelet::cm::pod_cgroup_parent(
                self.node.cgroup_driver,
                &self.node.cgroup_root,
                self.node.cgroups_per_qos,
                qos,
                pod_uid(pod),
            ),
            seccomp_profile_root: self.node.seccomp_profile_root(),
            seccomp_default: self.node.seccomp_default,
            userns,
        };
        translate::pod_sandbox_config(pod, &ctx, attempt)
    }

    /// Reads the pod for a sync. With events flowing, only this worker changes the pod and
    /// every other change arrives as an event or a relist's poke, so the last view stands
    /// without a read when nothing was heard of the pod since (a periodic resync, a new spec, a
    /// probe's verdict: upstream's resync reads its pod cache too), and an exit heard for
    /// what the view shows running is written in without a read. Else a pod seen before costs
    /// its own sandbox's status and the list of its containers, and only a pod nobody has seen
    /// is read by its labels.
    async fn read_for_sync(
        &self,
        uid: &str,
        state: &mut PodSyncState,
    ) -> Result<ObservedPod, CriError> {
        if std::mem::take(&mut state.known_empty) {
            return Ok(ObservedPod::default());
        }
        if std::mem::take(&mut state.act_on_view)
            && let Some(view) = state.view.take()
        {
            tracing::debug!("a probe asks for a kill; acting on the last view without a read");
            return Ok(view);
        }
        let reread = std::mem::take(&mut state.reread);
        let Some(view) = state.view.take() else {
            let read = self.observe(uid).await?;
            self.confirm(&read);
            return Ok(read);
        };
        if let Some(pleg) = self.pleg.as_ref().filter(|p| p.events_live()) {
            let heard = pleg.heard_exits(&view);
            if !heard.is_empty() && heard.iter().all(|h| h.exit_code.is_some()) {
                tracing::debug!(
                    exits = heard.len(),
                    "acting on the exit events without a read"
                );
                return Ok(view);
            }
            // Taken before the read: a change heard during it marks the pod again.
            let stale = pleg.take_stale(uid);
            if heard.is_empty() && !stale && !reread {
                tracing::trace!("nothing heard of the pod since the last read; the view stands");
                return Ok(view);
            }
        }
        let read =
            inspect::observe_known_pod(&self.rt, &self.details, &self.node.node_name, uid, &view)
                .await?;
        self.confirm(&read);
        Ok(read)
    }

    fn confirm(&self, read: &ObservedPod) {
        if let Some(pleg) = &self.pleg {
            pleg.confirmed(read);
        }
    }

    /// Writes the exits heard from the stream into `view`; true when one came without its
    /// code (the view must be read again soon).
    fn apply_heard(&self, view: &mut ObservedPod) -> bool {
        let Some(pleg) = &self.pleg else {
            return false;
        };
        inspect::name_heard_ooms(view, |id| pleg.oom_heard(id));
        let heard = pleg.heard_exits(view);
        !heard.is_empty() && inspect::apply_heard_exits(view, &heard, now_ns())
    }

    /// The view after a step: only what the step made is read when it made things and
    /// stopped or removed nothing; otherwise the pod is read again.
    async fn read_after_step(
        &self,
        uid: &str,
        before: &ObservedPod,
        decision: &PodActions,
        made: &Made,
    ) -> Result<ObservedPod, CriError> {
        let only_made = decision.kill_pod.is_none()
            && decision.kill_containers.is_empty()
            && decision.remove_containers.is_empty()
            && decision.remove_sandboxes.is_empty();
        if only_made {
            return inspect::refresh_after_start(&self.rt, &self.details, before, made).await;
        }
        // Containers stopped within the sync whose exits the stream told, code and all: the
        // exits are written into the view as for a crash ([`Executor::apply_heard`]), and
        // nothing else of the pod changed but what the step made.
        let stops_heard = decision.kill_pod.is_none()
            && made.sandbox.is_none()
            && decision.remove_containers.is_empty()
            && decision.remove_sandboxes.is_empty()
            && self.pleg.as_ref().is_some_and(|p| {
                p.events_live()
                    && decision
                        .kill_containers
                        .iter()
                        .all(|k| p.exit_of(&k.id).is_some_and(|h| h.exit_code.is_some()))
            });
        if stops_heard {
            tracing::debug!(
                stopped = decision.kill_containers.len(),
                "the stopped containers' exits were heard; the pod is not read again"
            );
            return inspect::refresh_after_start(&self.rt, &self.details, before, made).await;
        }
        let read = if made.sandbox.is_none() && decision.kill_pod.is_none() {
            inspect::observe_known_pod(&self.rt, &self.details, &self.node.node_name, uid, before)
                .await?
        } else {
            self.observe(uid).await?
        };
        self.confirm(&read);
        Ok(read)
    }

    /// Brings the pod closer to its spec: reads it, then decides and acts, step after step
    /// while the view after one step already calls for the next (the next init container, a
    /// container that exited meanwhile), at most [`MAX_STEPS`] times.
    pub(crate) async fn sync_pod(
        &self,
        pod: &Pod,
        state: &mut PodSyncState,
        unhealthy: &HashMap<String, Unhealthy>,
        probes: &HashMap<String, ProbeView>,
    ) -> SyncOutcome {
        let uid = pod_uid(pod).to_string();
        let (observed, behind) = match self.read_at_start(&uid, state).await {
            Ok(read) => read,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the pod's state from the runtime");
                return SyncOutcome {
                    observed: ObservedPod::default(),
                    runtime_unreachable: true,
                    retry_after: Some(ERROR_RETRY),
                };
            }
        };
        let backoff_before = state.backoff.clone();
        let hash = |c: &Container| spec_hash(c);
        let decide = |observed: &ObservedPod, state: &PodSyncState| {
            actions::compute_pod_actions(
                pod,
                observed,
                &DecisionContext {
                    now: clock::now(),
                    backoff: &state.backoff,
                    policy: self.policy,
                    spec_hash: &hash,
                    unhealthy,
                    probes,
                    actuated: &state.actuated,
                    pod_level: resize::pod_level(pod, state),
                },
            )
        };
        resize::note_actuated(pod, &observed, state);
        let first = decide(&observed, state);
        let settled = match self
            .step_until_settled(pod, state, Step::first(observed, behind, first), &decide)
            .await
        {
            Ok(settled) => settled,
            Err(stopped) => return stopped,
        };
        self.finish_sync(pod, state, settled, &backoff_before).await
    }

    /// Reads the pod at the start of a sync ([`Executor::read_for_sync`]) and writes in the
    /// exits heard since. The flag is true when an exit came without its code (the view lags
    /// the runtime and must be read again soon).
    async fn read_at_start(
        &self,
        uid: &str,
        state: &mut PodSyncState,
    ) -> Result<(ObservedPod, bool), CriError> {
        let read_started = clock::instant();
        let mut observed = self.read_for_sync(uid, state).await?;
        let behind = self.apply_heard(&mut observed);
        tracing::trace!(
            elapsed_ms = read_started.elapsed().as_secs_f64() * 1000.0,
            "pod read"
        );
        Ok((observed, behind))
    }

    /// Carries out `at.decision`, reads the pod again and decides again, for as long as each
    /// step went through and the next makes progress (at most [`MAX_STEPS`]). `Err` is the
    /// outcome of a sync that could not make the pod's cgroup (nothing was done).
    async fn step_until_settled(
        &self,
        pod: &Pod,
        state: &mut PodSyncState,
        mut at: Step,
        decide: &(dyn Fn(&ObservedPod, &PodSyncState) -> PodActions + Sync),
    ) -> Result<Step, SyncOutcome> {
        let uid = pod_uid(pod);
        loop {
            at.number += 1;
            let step = at.number;
            let changed = revisit::changes_anything(&at.decision);
            if changed {
                tracing::debug!(step, decision = ?at.decision, "pod actions");
            }
            self.note_backoff_waits(pod, &at.decision, state);
            if step == 1
                && let Err(err) = self.ensure_pod_cgroup(pod, at.decision.terminal).await
            {
                return Err(self.cgroup_failed(pod, &err.to_string(), state, at.observed));
            }
            let acted = clock::instant();
            let mut made = Made::default();
            let executed = self
                .execute(pod, &at.observed, &at.decision, state, &mut made)
                .await;
            if let Err(err) = &executed {
                tracing::warn!(error = %err, "sync failed; will retry");
                state.reread = true;
            }
            at.failed = executed.is_err();
            if !changed {
                return Ok(at);
            }
            match self
                .read_after_step(uid, &at.observed, &at.decision, &made)
                .await
            {
                Ok(read) => {
                    at.observed = read;
                    at.behind = self.apply_heard(&mut at.observed);
                }
                // The view still shows the pod before the step.
                Err(_) => state.reread = true,
            }
            tracing::debug!(
                step,
                elapsed_ms = acted.elapsed().as_secs_f64() * 1000.0,
                "step carried out"
            );
            // What the runtime shows now may already call for the next step: the pure
            // decision is made again on the fresh view.
            resize::note_actuated(pod, &at.observed, state);
            let followup = executed.is_ok().then(|| decide(&at.observed, state));
            let blocked = |name: &str| blocked_by_error(state, name);
            let through = revisit::went_through(&at.decision, made.sandbox.is_some(), &blocked);
            match followup {
                Some(next)
                    if through && step < MAX_STEPS && revisit::makes_progress(&next, &blocked) =>
                {
                    at.decision = next;
                }
                followup => {
                    at.followup = followup;
                    return Ok(at);
                }
            }
        }
    }

    /// Back-off waits are shown as CrashLoopBackOff until the container starts again, and
    /// told in an event each time a step finds one.
    fn note_backoff_waits(&self, pod: &Pod, decision: &PodActions, state: &mut PodSyncState) {
        for w in &decision.waiting {
            self.events.container(
                pod,
                &w.name,
                EventType::Warning,
                reason::BACK_OFF,
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    w.name,
                    actions::pod_label(pod)
                ),
            );
            state.waiting.insert(
                w.name.clone(),
                WaitingReason::new(WaitReason::CrashLoopBackOff, w.message.clone()),
            );
        }
    }

    /// The outcome of a sync that could not make the pod's cgroup: told in an event, nothing
    /// done, tried again soon on the view just read.
    fn cgroup_failed(
        &self,
        pod: &Pod,
        message: &str,
        state: &mut PodSyncState,
        observed: ObservedPod,
    ) -> SyncOutcome {
        tracing::warn!(error = %message, "cannot create the pod's cgroup; will retry");
        self.events.pod(
            pod,
            EventType::Warning,
            reason::FAILED_TO_CREATE_POD_CONTAINER,
            format!("unable to ensure pod container exists: {message}"),
        );
        state.view = Some(observed.clone());
        SyncOutcome {
            observed,
            runtime_unreachable: false,
            retry_after: Some(ERROR_RETRY),
        }
    }

    /// Ends a sync once its steps have settled: decides when to look again, keeps the
    /// back-off state on disk when it changed, reads the termination messages and keeps the
    /// view for the next sync.
    async fn finish_sync(
        &self,
        pod: &Pod,
        state: &mut PodSyncState,
        settled: Step,
        backoff_before: &BackoffTable,
    ) -> SyncOutcome {
        let uid = pod_uid(pod);
        let Step {
            mut observed,
            behind,
            decision,
            failed,
            followup,
            ..
        } = settled;
        let start_blocked = state.start_blocked.take();
        let republish_after = state.republish_retry.take();
        let blocked = |name: &str| blocked_by_error(state, name);
        let init_running = revisit::init_running(pod, &observed);
        let retry = revisit::next_look(&SyncFacts {
            decision: &decision,
            failed,
            error_waiting: state.waiting.values().any(|w| w.reason.retried_soon()),
            followup: followup.as_ref(),
            blocked: &blocked,
            init_running,
            events_live: self.pleg.as_ref().is_some_and(|p| p.events_live()),
            exit_pending: behind,
            start_blocked,
            republish_after,
        });
        // The next look is for what the runtime may show with no event come (an init
        // container's exit whose event got lost, an exit the view lags): it reads the pod.
        if init_running || behind {
            state.reread = true;
        }
        if state.backoff != *backoff_before {
            self.save_backoff(uid, &state.backoff).await;
        }
        let log_dir = self
            .node
            .pod_log_dir(pod_namespace(pod), pod_name(pod), uid);
        super::termination_message::fill_messages(
            &mut observed,
            pod,
            &self.node.pod_dir(uid),
            &log_dir,
            &mut state.messages,
        );
        state.view = Some(observed.clone());
        SyncOutcome {
            observed,
            runtime_unreachable: false,
            retry_after: retry,
        }
    }

    /// Puts the exited containers' termination messages into `observed` (each read once and
    /// kept in `cache`), as a sync does: a pod stopped outside a sync (finished, or killed)
    /// keeps them in its final status.
    pub(crate) fn fill_termination_messages(
        &self,
        pod: &Pod,
        observed: &mut ObservedPod,
        cache: &mut HashMap<String, String>,
    ) {
        let uid = pod_uid(pod);
        let log_dir = self
            .node
            .pod_log_dir(pod_namespace(pod), pod_name(pod), uid);
        super::termination_message::fill_messages(
            observed,
            pod,
            &self.node.pod_dir(uid),
            &log_dir,
            cache,
        );
    }

    /// Writes the pod's back-off table to its directory, so that an agent restarted keeps
    /// the crash loops' delays (a failure is logged: the table is still kept in memory).
    async fn save_backoff(&self, uid: &str, backoff: &BackoffTable) {
        let dir = self.node.pod_dir(uid);
        let table = backoff.clone();
        let saved =
            tokio::task::spawn_blocking(move || pod_files::save_backoff(&dir, &table)).await;
        if let Ok(Err(err)) = saved {
            tracing::warn!(error = %err, "cannot save the back-off state");
        }
    }

    /// The sync state of a pod this agent may have run before it restarted: the back-off
    /// entries are read back from the pod's directory.
    pub(crate) fn load_state(&self, uid: &str) -> PodSyncState {
        let (backoff, repairs) =
            pod_files::load_backoff(&self.node.pod_dir(uid), &self.policy, clock::now());
        for repair in repairs {
            tracing::warn!(pod_uid = %uid, ?repair, "repaired the saved back-off state");
        }
        PodSyncState {
            backoff,
            ..Default::default()
        }
    }

    /// Carries out one decision, in upstream's order: stop what must stop, remove garbage,
    /// then start (volumes, sandbox, containers).
    async fn execute(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        decision: &PodActions,
        state: &mut PodSyncState,
        made: &mut Made,
    ) -> Result<(), CriError> {
        if let Some(why) = &decision.kill_pod {
            tracing::info!(reason = %why, "stopping the pod");
            if decision.create_sandbox.is_some() {
                self.events.pod(
                    pod,
                    EventType::Normal,
                    reason::SANDBOX_CHANGED,
                    "Pod sandbox changed, it will be killed and re-created.",
                );
            }
            self.stop_pod(Some(pod), observed, grace_period(Some(pod), None))
                .await?;
        }
        for id in &decision.remove_containers {
            self.remove_container(id).await;
        }
        for id in &decision.remove_sandboxes {
            if let Err(err) = self.rt.remove_pod_sandbox(id.clone()).await
                && !err.is_not_found()
            {
                tracing::warn!(sandbox = %id, error = %err, "cannot remove an old sandbox");
            }
        }
        for kill in &decision.kill_containers {
            tracing::info!(container = %kill.name, reason = %kill.reason, "stopping container");
            if let Some(inst) = observed.containers.iter().find(|c| c.id == kill.id) {
                let ip = observed.reachable_ip(None, self.node.host_ip.as_deref());
                self.stop_container_gracefully(
                    Some(pod),
                    inst,
                    grace_period(Some(pod), kill.grace_override),
                    ip.as_deref(),
                    Some(&kill.reason),
                    StopUntil::Exited,
                )
                .await?;
            }
        }
        self.resize_in_place(pod, observed, decision, state).await?;
        self.start(pod, observed, decision, state, made).await
    }
}

/// Why the pod's cgroup could not be made or released: the blocking task failed, or the
/// cgroup manager refused. Only its text travels on, into the pod's event and log line.
#[derive(Debug, thiserror::Error)]
enum PodCgroupError {
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Cgroup(#[from] crate::kubelet::cm::CgroupError),
}

#[cfg(test)]
mod cgroup_tests {
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::clients::cri::fake::FakeCri;
    use crate::kubelet::cm::fixture::Fixture;
    use crate::kubelet::cm::{
        CfsSettings, CgroupManager, HostCgroupFs, ManagerSettings, ResourceConfig,
    };

    pub(super) const IMAGE: &str = "example.test/app:1";

    pub(super) fn pod(uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some(IMAGE.into()),
                    image_pull_policy: Some("IfNotPresent".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(super) fn executor(
        dir: &Path,
        rt: FakeCri,
    ) -> (
        Executor<FakeCri>,
        tokio::sync::mpsc::Receiver<k8s_openapi::api::core::v1::Event>,
    ) {
        let node = Arc::new(NodeContext {
            node_name: "node-a".into(),
            host_ip: None,
            root_dir: dir.join("root"),
            pod_logs_dir: dir.join("logs"),
            host_dns: HostDns::default(),
            cluster_domain: None,
            cluster_dns: vec![],
            cgroup_driver: crate::config::CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            cgroup_fs: dir.join("cgroup"),
            node_memory_bytes: 1 << 30,
            allocatable: Default::default(),
            runtime_request_timeout: Duration::from_secs(5),
            image_pull_progress_deadline: None,
            seccomp_default: false,
            mounter: Arc::new(crate::kubelet::volume::mounter::fake::FakeMounter::default()),
            node_labels: Default::default(),
            userns: None,
            devices: None,
            dra: None,
        });
        let (recorder, events) = crate::kubelet::events::Recorder::to_api("node-a");
        (
            Executor::new(
                rt,
                node,
                DetailCache::default(),
                BackoffPolicy::default(),
                recorder,
            ),
            events,
        )
    }

    pub(super) fn manager(cgroups: &Path) -> Arc<CgroupManager> {
        for h in ["cpu", "memory", "pids"] {
            std::fs::create_dir_all(cgroups.join(h)).unwrap();
            // What marks a mounted hierarchy.
            std::fs::write(cgroups.join(h).join("cgroup.procs"), "").unwrap();
        }
        let m = CgroupManager::new(
            Arc::new(Fixture(HostCgroupFs::new(cgroups))),
            vec![],
            ManagerSettings {
                cgroup_root: "/".into(),
                cfs: CfsSettings::default(),
                pod_pids_limit: -1,
                memory_reserve_percent: None,
                allocatable_memory: 1 << 30,
            },
        )
        .unwrap();
        m.start(&ResourceConfig::default()).unwrap();
        Arc::new(m)
    }

    #[tokio::test]
    async fn the_pod_cgroup_is_made_before_the_sandbox_and_removed_with_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = dir.path().join("cgroup");
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, _events) = executor(dir.path(), rt.clone());
        let executor = executor.with_cgroups(manager(&cgroups));
        let p = pod("uid-1");
        let mut state = PodSyncState::default();
        executor
            .sync_pod(&p, &mut state, &HashMap::new(), &HashMap::new())
            .await;
        assert_eq!(rt.count("RunPodSandbox"), 1);
        let pod_dir = cgroups.join("cpu/kubepods/besteffort/poduid-1");
        assert_eq!(
            std::fs::read_to_string(pod_dir.join("cpu.shares")).unwrap(),
            "2"
        );
        executor
            .terminate_pod("uid-1", Some(&p), Some(1))
            .await
            .unwrap();
        assert!(!pod_dir.exists());
        assert!(cgroups.join("cpu/kubepods/besteffort").exists());
    }

    #[tokio::test]
    async fn no_sandbox_without_the_pod_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = dir.path().join("cgroup");
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, mut events) = executor(dir.path(), rt.clone());
        let executor = executor.with_cgroups(manager(&cgroups));
        // A file where the pod's cgroup directory belongs: it cannot be made.
        std::fs::write(cgroups.join("memory/kubepods/besteffort/poduid-2"), "").unwrap();
        let p = pod("uid-2");
        let outcome = executor
            .sync_pod(
                &p,
                &mut PodSyncState::default(),
                &HashMap::new(),
                &HashMap::new(),
            )
            .await;
        assert_eq!(rt.count("RunPodSandbox"), 0);
        assert_eq!(outcome.retry_after, Some(ERROR_RETRY));
        let event = events.try_recv().unwrap();
        assert_eq!(event.reason.as_deref(), Some("FailedToCreatePodContainer"));
        assert!(event.message.unwrap_or_default().starts_with(
            "unable to ensure pod container exists: creating cgroup /kubepods/besteffort/poduid-2"
        ),);
    }
}

#[cfg(test)]
mod pod_api_tests;

#[cfg(test)]
mod replace_tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use super::cgroup_tests::{IMAGE, executor, pod};
    use super::*;
    use crate::clients::cri::fake::{FakeCri, Script};
    use crate::kubelet::pleg::PlegState;
    use crate::kubelet::pleg::feed::{ExitFacts, FeedSource};
    use crate::kubelet::pleg::route::Mode;

    /// The fixture pod, bound to the fixture node (the labels a pod is read back by name it).
    fn bound_pod(uid: &str) -> Arc<Pod> {
        let mut p = pod(uid);
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = Some("node-a".into());
        }
        Arc::new(p)
    }

    async fn until(what: &str, rt: &FakeCri, check: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; calls: {:?}",
                rt.calls()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A running pod whose app container fails its liveness probe, with containerd never
    /// answering the stop: the runtime, the app's ID and the sync that handles the failure.
    async fn a_liveness_stop_that_hangs(
        dir: &std::path::Path,
        pleg: &PlegState,
        uid: &str,
    ) -> (
        FakeCri,
        String,
        tokio::task::JoinHandle<crate::kubelet::runtime::executor::SyncOutcome>,
    ) {
        let rt = FakeCri::with_images(&[IMAGE]);
        let (executor, _events) = executor(dir, rt.clone());
        let executor = executor.with_pleg(Arc::new(pleg.clone()));
        let p = bound_pod(uid);
        let mut state = PodSyncState::default();
        executor
            .sync_pod(&p, &mut state, &HashMap::new(), &HashMap::new())
            .await;
        let app = rt.containers()[0].id.clone();
        // containerd answers the stop only after it has handled the exit; here, never.
        rt.script("StopContainer", Script::Hang);
        let unhealthy = HashMap::from([(
            app.clone(),
            Unhealthy {
                container_name: "app".into(),
                message: "Container app failed liveness probe, will be restarted".into(),
                grace_override: None,
            },
        )]);
        let sync = tokio::spawn(async move {
            executor
                .sync_pod(&p, &mut state, &unhealthy, &HashMap::new())
                .await
        });
        (rt, app, sync)
    }

    #[tokio::test]
    async fn a_container_failing_liveness_restarts_on_its_exit_event_before_the_stop_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let pleg = PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let (rt, app, sync) = a_liveness_stop_that_hangs(dir.path(), &pleg, "uid-l").await;
        until("the stop", &rt, || rt.count("StopContainer") == 1).await;
        assert_eq!(rt.count("CreateContainer"), 1);
        // The exit event arrives, with its code.
        pleg.note_exit(
            &app,
            Some(ExitFacts {
                code: 143,
                at_ns: now_ns(),
            }),
            false,
        );
        let outcome = tokio::time::timeout(Duration::from_secs(5), sync)
            .await
            .expect("the sync went on without the stop's answer")
            .unwrap();
        assert_eq!(rt.count("CreateContainer"), 2, "{:?}", rt.calls());
        assert_eq!(rt.count("StartContainer"), 2);
        // Nothing of the pod was read between the stop and the restart.
        let calls = rt.calls();
        let stop = calls.iter().position(|c| *c == "StopContainer").unwrap();
        let create = stop
            + calls[stop..]
                .iter()
                .position(|c| *c == "CreateContainer")
                .unwrap();
        assert!(
            calls[stop..create].iter().all(|c| ![
                "ListContainers",
                "PodSandboxStatus",
                "ListPodSandbox"
            ]
            .contains(c)),
            "{calls:?}"
        );
        // The old instance shows the exit as the event told it.
        let old = outcome
            .observed
            .containers
            .iter()
            .find(|c| c.id == app)
            .unwrap();
        assert_eq!(old.state, crate::base::observed::ContainerState::Exited);
        assert_eq!(old.exit_code, 143);
        rt.release();
    }

    #[tokio::test]
    async fn without_events_the_stop_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, _app, sync) =
            a_liveness_stop_that_hangs(dir.path(), &PlegState::default(), "uid-m").await;
        until("the stop", &rt, || rt.count("StopContainer") == 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!sync.is_finished());
        assert_eq!(rt.count("CreateContainer"), 1);
        rt.release();
        tokio::time::timeout(Duration::from_secs(5), sync)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rt.count("CreateContainer"), 2, "{:?}", rt.calls());
    }
}
