//! The three housekeeping loops: each lists the runtime, asks its pure decision, and carries
//! it out. A failed pass is logged and the loop goes on at its next period.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::WorkerActivity;
use super::containers::{
    ContainerGcPlan, ContainerGcPolicy, GcContainer, GcSandbox, PodActivity, plan_container_gc,
};
use super::files;
use super::images::{FsUsage, ImageGcPolicy, ImageTracker, ListedImage, RemovalReason};
use super::rotation::{FAST_CHECK, TIMESTAMP_FORMAT, plan_rotation, recheck_after};
use crate::base::clock::{self, Instant};
use crate::base::cri_labels;
use crate::base::cri_labels::managed_selector;
use crate::base::safe_names::component_problem;
use crate::base::supervisor::Supervisor;
use crate::clients::cri::proto::{
    Container, ContainerFilter, ContainerState, ContainerStateValue, PodSandbox, PodSandboxState,
};
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::config::GcSettings;

/// Upstream's periods (`ContainerGCPeriod`, `ImageGCPeriod`).
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// Why a pass could not run.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Runtime(#[from] CriError),
    #[error(transparent)]
    File(#[from] files::FileError),
    #[error("a blocking file task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// What the loops share: the runtime, whose objects are ours, where logs are, what the
/// workers do.
#[derive(Clone)]
pub struct GcContext<R> {
    pub rt: R,
    pub node_name: String,
    pub pod_logs_dir: PathBuf,
    pub activity: WorkerActivity,
    /// True once every pod source delivered its pods: before, a pod without a worker may be
    /// one not read yet (an adopted pod), not a pod that is gone.
    pub sources_ready: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The loops' periods (upstream's; tests shorten them through the daemon's knobs).
#[derive(Clone, Copy, Debug)]
pub struct GcPeriods {
    pub container_gc: Duration,
    pub image_gc: Duration,
    pub log_monitor: Duration,
}

/// Runs `pass` every `period` (the first after one period, so a starting agent adopts its
/// pods first) until `cancel`.
async fn every<F, Fut>(period: Duration, cancel: CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval_at(clock::instant() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = pass() => {}
        }
    }
}

/// Starts the three loops as supervised tasks (`container-gc`, `image-gc`, `log-rotation`).
/// `images` is the image record the eviction manager's reclaim shares.
pub fn spawn<R: RuntimeService + ImageService>(
    ctx: GcContext<R>,
    settings: &GcSettings,
    keep_images: &[String],
    images: SharedImageGc,
    periods: GcPeriods,
    tasks: &Supervisor,
    cancel: CancellationToken,
) {
    spawn_container_gc(ctx.clone(), periods.container_gc, tasks, cancel.clone());
    let policy = ImageGcPolicy {
        high_threshold_percent: settings.image_gc_high_threshold_percent,
        low_threshold_percent: settings.image_gc_low_threshold_percent,
        min_age: settings.image_minimum_gc_age,
        max_age: settings.image_maximum_gc_age,
    };
    let keep: Arc<Vec<String>> = Arc::new(keep_images.to_vec());
    let image_gc = ImageGcTask {
        ctx: ctx.clone(),
        policy,
        keep,
        images,
        period: periods.image_gc,
    };
    let image_cancel = cancel.clone();
    tasks.spawn("image-gc", move || {
        image_gc.clone().run(image_cancel.clone())
    });
    let rotation = RotationPolicy {
        max_size: settings.container_log_max_size_bytes,
        max_files: settings.container_log_max_files,
        workers: settings.container_log_max_workers.max(1) as usize,
        interval: periods.log_monitor,
    };
    tasks.spawn("log-rotation", move || {
        log_monitor(ctx.clone(), rotation, cancel.clone())
    });
}

fn spawn_container_gc<R: RuntimeService + ImageService>(
    ctx: GcContext<R>,
    period: Duration,
    tasks: &Supervisor,
    cancel: CancellationToken,
) {
    tasks.spawn("container-gc", move || {
        let ctx = ctx.clone();
        every(period, cancel.clone(), move || {
            let ctx = ctx.clone();
            async move { container_gc_round(&ctx).await }
        })
    });
}

/// One container GC pass, logged.
async fn container_gc_round<R: RuntimeService + ImageService>(ctx: &GcContext<R>) {
    let began = clock::instant();
    match container_gc_pass(ctx, ContainerGcPolicy::default()).await {
        Ok(done) => {
            let elapsed_ms = began.elapsed().as_secs_f64() * 1000.0;
            let (containers, sandboxes) = (done.containers.len(), done.sandboxes.len());
            if containers + sandboxes > 0 {
                tracing::info!(containers, sandboxes, elapsed_ms, "container GC pass done");
            } else {
                tracing::debug!(elapsed_ms, "container GC pass done; nothing to remove");
            }
        }
        Err(err) => tracing::warn!(error = %err, "container GC failed"),
    }
}

/// The image GC loop's state: what a (re)started loop needs.
#[derive(Clone)]
struct ImageGcTask<R> {
    ctx: GcContext<R>,
    policy: ImageGcPolicy,
    keep: Arc<Vec<String>>,
    images: SharedImageGc,
    period: Duration,
}

impl<R: RuntimeService + ImageService> ImageGcTask<R> {
    /// Records what is there at once; the first pass comes one period later.
    async fn run(self, cancel: CancellationToken) {
        let ImageGcTask {
            ctx,
            policy,
            keep,
            images,
            period,
        } = self;
        {
            let mut state = images.lock().await;
            match record_images(&ctx.rt, &mut state, &keep).await {
                Ok(n) => {
                    tracing::debug!(images = n, "image GC: recorded the images present at start")
                }
                Err(err) => {
                    tracing::warn!(error = %err, "image GC: cannot list the images at start")
                }
            }
        }
        every(period, cancel, move || {
            let (ctx, state, keep) = (ctx.clone(), images.clone(), keep.clone());
            async move {
                let mut state = state.lock().await;
                if let Err(err) = image_gc_pass(&ctx.rt, &mut state, policy, &keep).await {
                    tracing::warn!(error = %err, "image GC failed");
                }
            }
        })
        .await
    }
}

/// The log monitor: a full pass over the running containers every `policy.interval`, and in
/// between, every [`FAST_CHECK`], a look at the logs that grow fast enough to reach the size
/// before the next pass (a `stat` each, no runtime call unless one is rotated).
async fn log_monitor<R: RuntimeService>(
    ctx: GcContext<R>,
    policy: RotationPolicy,
    cancel: CancellationToken,
) {
    let paths = LogPaths::default();
    let fast = FAST_CHECK.min(policy.interval);
    let mut tick = tokio::time::interval_at(clock::instant() + fast, fast);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_full = clock::instant() + policy.interval;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pass = async {
            if clock::instant() >= next_full {
                next_full = clock::instant() + policy.interval;
                rotate_logs_pass(&ctx, policy, &paths).await.map(|_| ())
            } else {
                rotate_growing_logs(&ctx, policy, &paths, clock::instant()).await;
                Ok(())
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            result = pass => if let Err(err) = result {
                tracing::warn!(error = %err, "container log rotation failed");
            }
        }
    }
}

// ---- container GC

fn label<'a>(labels: &'a HashMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map(String::as_str).unwrap_or_default()
}

/// `namespace/name` of the pod a container or sandbox belongs to, from its labels (the `pod`
/// field of a log line).
fn pod_of(labels: &HashMap<String, String>) -> String {
    format!(
        "{}/{}",
        label(labels, cri_labels::POD_NAMESPACE_LABEL),
        label(labels, cri_labels::POD_NAME_LABEL)
    )
}

fn gc_container(c: &Container) -> GcContainer {
    let name = match label(&c.labels, cri_labels::CONTAINER_NAME_LABEL) {
        "" => c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        name => name.to_string(),
    };
    GcContainer {
        id: c.id.clone(),
        sandbox_id: c.pod_sandbox_id.clone(),
        pod_uid: label(&c.labels, cri_labels::POD_UID_LABEL).to_string(),
        name,
        dead: c.state == ContainerState::ContainerExited as i32,
        created_at: c.created_at,
    }
}

fn gc_sandbox(s: &PodSandbox) -> GcSandbox {
    GcSandbox {
        id: s.id.clone(),
        pod_uid: label(&s.labels, cri_labels::POD_UID_LABEL).to_string(),
        ready: s.state == PodSandboxState::SandboxReady as i32,
        created_at: s.created_at,
    }
}

/// One container GC pass over this node's objects: the plan, then the removals (each
/// container with its log files), then a sweep of log files whose container is gone.
/// Returns what it removed.
pub async fn container_gc_pass<R: RuntimeService>(
    ctx: &GcContext<R>,
    policy: ContainerGcPolicy,
) -> Result<ContainerGcPlan, GcError> {
    let listed = clock::now();
    let selector = managed_selector(&ctx.node_name);
    let sandboxes = ctx
        .rt
        .list_pod_sandbox(Some(crate::clients::cri::proto::PodSandboxFilter {
            label_selector: selector.clone(),
            ..Default::default()
        }))
        .await?;
    let containers = ctx
        .rt
        .list_containers(Some(ContainerFilter {
            label_selector: selector,
            ..Default::default()
        }))
        .await?;
    // Read after the listing: a pod whose worker appears later created nothing listed.
    let sources_ready = (ctx.sources_ready)();
    let activity = |uid: &str| match ctx.activity.activity(uid) {
        PodActivity::Gone if !sources_ready => PodActivity::Terminating,
        other => other,
    };
    let plan = plan_container_gc(
        &containers.iter().map(gc_container).collect::<Vec<_>>(),
        &sandboxes.iter().map(gc_sandbox).collect::<Vec<_>>(),
        policy,
        activity,
    );
    let mut done = ContainerGcPlan::default();
    for id in &plan.containers {
        let c = containers.iter().find(|c| &c.id == id);
        let (pod, container) = c
            .map(|c| (pod_of(&c.labels), gc_container(c).name))
            .unwrap_or_default();
        // The log path is only in the status; a container that is gone meanwhile is done.
        let log_path = match ctx.rt.container_status(id.clone()).await {
            Ok(resp) => resp.status.map(|s| s.log_path).unwrap_or_default(),
            Err(err) if err.is_not_found() => continue,
            Err(err) => {
                tracing::warn!(container_id = %id, %pod, %container, error = %err, "container GC: cannot read the container's status");
                continue;
            }
        };
        match ctx.rt.remove_container(id.clone()).await {
            Err(err) if !err.is_not_found() => {
                tracing::warn!(container_id = %id, %pod, %container, error = %err, "container GC: cannot remove a dead container");
                continue;
            }
            _ => {}
        }
        if !log_path.is_empty() {
            let path = PathBuf::from(&log_path);
            match tokio::task::spawn_blocking(move || files::remove_container_logs(&path)).await? {
                Ok(n) => crate::base::metrics::KUBELET
                    .garbage_collected
                    .add(&["log_file"], n as f64),
                Err(err) => {
                    tracing::warn!(container_id = %id, %pod, %container, error = %err, "container GC: cannot remove the container's logs")
                }
            }
        }
        tracing::info!(container_id = %id, %pod, %container, "container GC removed a dead container");
        crate::base::metrics::KUBELET
            .garbage_collected
            .inc(&["container"]);
        done.containers.push(id.clone());
    }
    for id in &plan.sandboxes {
        match ctx.rt.remove_pod_sandbox(id.clone()).await {
            Err(err) if !err.is_not_found() => {
                tracing::warn!(sandbox_id = %id, error = %err, "container GC: cannot remove a dead sandbox");
            }
            _ => {
                tracing::info!(sandbox_id = %id, "container GC removed a dead sandbox");
                crate::base::metrics::KUBELET
                    .garbage_collected
                    .inc(&["sandbox"]);
                done.sandboxes.push(id.clone());
            }
        }
    }
    sweep_logs(ctx, &sandboxes, &containers, listed, &activity).await?;
    Ok(done)
}

/// Removes the log files of containers the runtime no longer has, in the log directories
/// of pods that still run here.
async fn sweep_logs<R>(
    ctx: &GcContext<R>,
    sandboxes: &[PodSandbox],
    containers: &[Container],
    listed: SystemTime,
    activity: &impl Fn(&str) -> PodActivity,
) -> Result<(), GcError> {
    let mut dirs: HashMap<String, PathBuf> = HashMap::new();
    for s in sandboxes {
        let uid = label(&s.labels, cri_labels::POD_UID_LABEL);
        let dir = format!(
            "{}_{}_{}",
            label(&s.labels, cri_labels::POD_NAMESPACE_LABEL),
            label(&s.labels, cri_labels::POD_NAME_LABEL),
            uid
        );
        let kept = matches!(activity(uid), PodActivity::Active | PodActivity::Finished);
        if kept && component_problem(&dir).is_none() {
            dirs.insert(uid.to_string(), ctx.pod_logs_dir.join(dir));
        }
    }
    let mut live: HashMap<String, HashSet<(String, u32)>> = HashMap::new();
    for c in containers {
        let g = gc_container(c);
        let attempt = c.metadata.as_ref().map(|m| m.attempt).unwrap_or_default();
        live.entry(g.pod_uid).or_default().insert((g.name, attempt));
    }
    let removed = tokio::task::spawn_blocking(move || {
        let mut removed = Vec::new();
        for (uid, dir) in dirs {
            let live = live.remove(&uid).unwrap_or_default();
            match files::sweep_stale_logs(&dir, &live, listed) {
                Ok(paths) => removed.extend(paths),
                Err(err) => tracing::warn!(pod_uid = %uid, error = %err, "container GC: cannot sweep the pod's log directory"),
            }
        }
        removed
    })
    .await?;
    for path in &removed {
        tracing::debug!(path = %path.display(), "container GC removed the log of a removed container");
    }
    crate::base::metrics::KUBELET
        .garbage_collected
        .add(&["log_file"], removed.len() as f64);
    Ok(())
}

// ---- image GC

/// The image GC's memory between passes.
pub struct ImageGc {
    pub tracker: ImageTracker,
    /// When the GC started (the age rule waits `max_age` from then).
    pub began: Instant,
}

/// One image record for the whole agent, as upstream has one image GC manager: the periodic
/// pass and the eviction manager's reclaim must agree on when an image was first seen, or
/// the reclaim (seeing every image for the first time when pressure comes) would find them
/// all younger than the minimum age and leave the eviction of a pod as the only way out.
pub type SharedImageGc = Arc<tokio::sync::Mutex<ImageGc>>;

impl ImageGc {
    /// An empty record whose age rule counts from now.
    pub fn shared() -> SharedImageGc {
        Arc::new(tokio::sync::Mutex::new(ImageGc {
            tracker: ImageTracker::default(),
            began: clock::instant(),
        }))
    }
}

/// What one look at the runtime found: its images, those in use, and when it looked.
struct Detected {
    images: Vec<crate::clients::cri::proto::Image>,
    in_use: HashSet<String>,
    now: Instant,
}

/// Lists the images and what uses them, and records both in the tracker (upstream's
/// `detectImages`). An image counts as used when any container in the runtime (whoever made
/// it, in any state) names it, or when it is the sandbox image or one of `keep`.
async fn detect_images<R: RuntimeService + ImageService>(
    rt: &R,
    state: &mut ImageGc,
    keep: &[String],
) -> Result<Detected, GcError> {
    let now = clock::instant();
    let images = rt.list_images().await?;
    // The sandbox image: containerd 1.6 does not pin it, and no container lists it as its
    // image, yet every new pod needs it (and it may not be pullable from here).
    let mut protected: HashSet<String> = sandbox_image(rt).await.into_iter().collect();
    protected.extend(keep.iter().cloned());
    let containers = rt.list_containers(None).await?;
    let mut in_use: HashSet<String> = HashSet::new();
    let specs: HashSet<&str> = containers
        .iter()
        .filter_map(|c| c.image.as_ref().map(|i| i.image.as_str()))
        .collect();
    for c in &containers {
        in_use.insert(c.image_ref.clone());
    }
    for image in &images {
        let named = image
            .repo_tags
            .iter()
            .chain(&image.repo_digests)
            .any(|n| specs.contains(n.as_str()));
        let kept = image
            .repo_tags
            .iter()
            .chain(&image.repo_digests)
            .chain(std::iter::once(&image.id))
            .any(|n| protected.contains(n));
        if named || kept || specs.contains(image.id.as_str()) {
            in_use.insert(image.id.clone());
        }
    }
    let listed: Vec<ListedImage> = images
        .iter()
        .map(|i| ListedImage {
            id: i.id.clone(),
            size: i.size,
            pinned: i.pinned,
        })
        .collect();
    state.tracker.observe(&listed, &in_use, now);
    Ok(Detected {
        images,
        in_use,
        now,
    })
}

/// Records the images the runtime has now, without removing any: what the image loop does
/// when it starts (as upstream's image manager does at once), so that the minimum age
/// counts from the agent's start rather than from the first pass or the first pressure.
pub async fn record_images<R: RuntimeService + ImageService>(
    rt: &R,
    state: &mut ImageGc,
    keep: &[String],
) -> Result<usize, GcError> {
    let detected = detect_images(rt, state, keep).await?;
    Ok(detected.images.len())
}

/// Removes `plan` (image ID, reason) from the runtime; returns the IDs that went (or were
/// already gone). A failure is logged and the others are still tried.
async fn remove_images<R: ImageService>(
    rt: &R,
    listed: &[crate::clients::cri::proto::Image],
    plan: &[(String, RemovalReason)],
) -> Vec<String> {
    let mut removed = Vec::new();
    for (id, reason) in plan {
        let names = listed
            .iter()
            .find(|i| &i.id == id)
            .map(|i| i.repo_tags.join(","))
            .unwrap_or_default();
        match rt.remove_image(id.clone()).await {
            Err(err) if !err.is_not_found() => {
                tracing::warn!(image_id = %id, image = %names, error = %err, "image GC: cannot remove an image");
            }
            _ => {
                tracing::info!(image_id = %id, image = %names, reason = reason.as_str(), "image GC removed an unused image");
                crate::base::metrics::KUBELET
                    .image_garbage_collected
                    .inc(&[reason.as_str()]);
                removed.push(id.clone());
            }
        }
    }
    removed
}

/// One image GC pass: record what is in use, measure the image filesystem, remove what the
/// plan says. Returns the IDs removed.
/// `keep` names images never to remove besides those in use (`--pod-infra-container-image`).
pub async fn image_gc_pass<R: RuntimeService + ImageService>(
    rt: &R,
    state: &mut ImageGc,
    policy: ImageGcPolicy,
    keep: &[String],
) -> Result<Vec<String>, GcError> {
    let began = clock::instant();
    let detected = detect_images(rt, state, keep).await?;
    let usage = image_fs_usage(rt).await;
    let plan = state
        .tracker
        .plan(&detected.in_use, usage, policy, detected.now, state.began);
    if plan.bytes_to_free > 0 {
        tracing::info!(
            usage_percent = usage.map(|u| u.usage_percent()).unwrap_or_default(),
            high_threshold = policy.high_threshold_percent,
            bytes_to_free = plan.bytes_to_free,
            bytes_planned = plan.bytes_planned,
            "image filesystem above the high threshold; removing unused images"
        );
    }
    let removed = remove_images(rt, &detected.images, &plan.remove).await;
    if plan.bytes_planned < plan.bytes_to_free {
        tracing::warn!(
            bytes_to_free = plan.bytes_to_free,
            bytes_freed = plan.bytes_planned,
            "image GC could not free enough space: the remaining images are in use or too new"
        );
    }
    let elapsed_ms = began.elapsed().as_secs_f64() * 1000.0;
    if removed.is_empty() {
        tracing::debug!(
            images = detected.images.len(),
            elapsed_ms,
            "image GC pass done; nothing removed"
        );
    } else {
        tracing::info!(
            images = detected.images.len(),
            removed = removed.len(),
            elapsed_ms,
            "image GC pass done"
        );
    }
    Ok(removed)
}

/// The eviction manager's image reclaim (upstream's `DeleteUnusedImages`): every image not
/// in use, not pinned and seen for at least `min_age`, whatever the GC thresholds, least
/// recently used first. Returns the IDs removed.
pub async fn delete_unused_images<R: RuntimeService + ImageService>(
    rt: &R,
    state: &mut ImageGc,
    min_age: Duration,
    keep: &[String],
) -> Result<Vec<String>, GcError> {
    let detected = detect_images(rt, state, keep).await?;
    let plan: Vec<(String, RemovalReason)> = state
        .tracker
        .plan_unused(&detected.in_use, min_age, detected.now)
        .into_iter()
        .map(|id| (id, RemovalReason::Space))
        .collect();
    let unused = detected
        .images
        .iter()
        .filter(|i| !detected.in_use.contains(&i.id) && !i.pinned)
        .count();
    if plan.len() < unused {
        tracing::info!(
            unused,
            old_enough = plan.len(),
            min_age_s = min_age.as_secs_f64(),
            "image reclaim: some unused images are younger than the minimum age and stay"
        );
    }
    Ok(remove_images(rt, &detected.images, &plan).await)
}

/// The runtime's sandbox image, from the configuration containerd shows in its verbose
/// status (`config.sandboxImage`); `None` when it does not say.
async fn sandbox_image<R: RuntimeService>(rt: &R) -> Option<String> {
    let status = rt.status(true).await.ok()?;
    let config: serde_json::Value = serde_json::from_str(status.info.get("config")?).ok()?;
    config
        .get("sandboxImage")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The image filesystem's size and free space: its mountpoint from CRI `ImageFsInfo`, then
/// statvfs there. `None` (logged) when either fails.
async fn image_fs_usage<R: ImageService>(rt: &R) -> Option<FsUsage> {
    let info = match rt.image_fs_info().await {
        Ok(info) => info,
        Err(err) => {
            tracing::warn!(error = %err, "image GC: the runtime does not report its image filesystem");
            return None;
        }
    };
    let fs = info.image_filesystems.first()?;
    let mountpoint = PathBuf::from(fs.fs_id.as_ref()?.mountpoint.clone());
    let used = fs.used_bytes.as_ref().map(|u| u.value).unwrap_or_default();
    let shown = mountpoint.clone();
    match tokio::task::spawn_blocking(move || files::fs_usage(&mountpoint)).await {
        Ok(Ok(usage)) => {
            tracing::debug!(mountpoint = %shown.display(), images_bytes = used, capacity = usage.capacity, available = usage.available, "image filesystem");
            Some(usage)
        }
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "image GC: cannot measure the image filesystem");
            None
        }
        Err(_) => None,
    }
}

// ---- log rotation

/// The `containerLog*` settings the rotation needs.
#[derive(Clone, Copy, Debug)]
pub struct RotationPolicy {
    pub max_size: u64,
    pub max_files: u32,
    pub workers: usize,
    /// `containerLogMonitorInterval`: the period of the full passes.
    pub interval: Duration,
}

/// Each running container's log path as the runtime reported it the first time, and how
/// its log grows. A container's path never changes, and asking again every pass would cost one
/// `ContainerStatus` per running container every monitoring period: most of an idle node's CRI
/// calls (660 a minute at 110 pods). Upstream's log manager asks every time.
#[derive(Default)]
pub struct LogPaths(std::sync::Mutex<HashMap<String, Watched>>);

/// What the monitor knows of one running container's log.
#[derive(Clone, Debug)]
struct Watched {
    path: PathBuf,
    pod: String,
    container: String,
    /// The size at the last look (0 after a rotation), and when.
    last: Option<(u64, Instant)>,
    /// When to look again before the next full pass.
    due: Option<Instant>,
}

impl LogPaths {
    fn get(&self, id: &str) -> Option<PathBuf> {
        self.lock().get(id).map(|w| w.path.clone())
    }

    fn insert(&self, id: &str, path: PathBuf, pod: &str, container: &str) {
        self.lock().insert(
            id.to_string(),
            Watched {
                path,
                pod: pod.to_string(),
                container: container.to_string(),
                last: None,
                due: None,
            },
        );
    }

    /// Records a look at `id`'s log at `now`: it was `size` bytes (and then rotated, or not);
    /// plans the next look when it grows fast.
    fn record(&self, id: &str, size: u64, rotated: bool, now: Instant, policy: RotationPolicy) {
        let mut map = self.lock();
        let Some(w) = map.get_mut(id) else { return };
        let left = if rotated { 0 } else { size };
        w.due = match w.last {
            // A first look: a second one soon measures how fast the log grows.
            None => (FAST_CHECK < policy.interval).then(|| now + FAST_CHECK),
            Some((before, at)) => {
                // Smaller than before: rotated by someone else; all of it is new.
                let grew = size.checked_sub(before).unwrap_or(size);
                let over = now.saturating_duration_since(at);
                recheck_after(grew, over, left, policy.max_size, policy.interval)
                    .map(|after| now + after)
            }
        };
        w.last = Some((left, now));
    }

    /// The containers whose logs are due for a look at `now`: (id, pod, container).
    fn due(&self, now: Instant) -> Vec<(String, String, String)> {
        self.lock()
            .iter()
            .filter(|(_, w)| w.due.is_some_and(|d| d <= now))
            .map(|(id, w)| (id.clone(), w.pod.clone(), w.container.clone()))
            .collect()
    }

    /// Forgets the containers that no longer run.
    fn keep_only(&self, running: &[Container]) {
        let running: HashSet<&str> = running.iter().map(|c| c.id.as_str()).collect();
        self.lock().retain(|id, _| running.contains(id.as_str()));
    }

    /// How many paths are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        // A panic while holding the lock cannot leave the map half-written.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One rotation pass over this node's running containers, `workers` at a time. Returns how
/// many logs were rotated.
pub async fn rotate_logs_pass<R: RuntimeService>(
    ctx: &GcContext<R>,
    policy: RotationPolicy,
    paths: &LogPaths,
) -> Result<usize, GcError> {
    let running = ctx
        .rt
        .list_containers(Some(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerRunning as i32,
            }),
            label_selector: managed_selector(&ctx.node_name),
            ..Default::default()
        }))
        .await?;
    paths.keep_only(&running);
    let rotated = futures::stream::iter(running)
        .map(|c| async move {
            let (pod, container) = (pod_of(&c.labels), gc_container(&c).name);
            check_log(&ctx.rt, &c.id, &pod, &container, policy, paths).await
        })
        .buffer_unordered(policy.workers)
        .filter(|rotated| std::future::ready(*rotated))
        .count()
        .await;
    Ok(rotated)
}

/// Between full passes: looks at the logs that [`LogPaths::record`] found growing fast enough
/// to pass the size before the next one. Returns how many were rotated.
pub async fn rotate_growing_logs<R: RuntimeService>(
    ctx: &GcContext<R>,
    policy: RotationPolicy,
    paths: &LogPaths,
    now: Instant,
) -> usize {
    futures::stream::iter(paths.due(now))
        .map(|(id, pod, container)| async move {
            check_log(&ctx.rt, &id, &pod, &container, policy, paths).await
        })
        .buffer_unordered(policy.workers)
        .filter(|rotated| std::future::ready(*rotated))
        .count()
        .await
}

/// Looks at one container's log, rotates it when it is over the size, logs and counts what
/// happened, and records its growth. Returns whether it was rotated.
async fn check_log<R: RuntimeService>(
    rt: &R,
    id: &str,
    pod: &str,
    container: &str,
    policy: RotationPolicy,
    paths: &LogPaths,
) -> bool {
    let began = clock::instant();
    match rotate_one(rt, id, pod, container, policy, paths).await {
        Ok(checked) => {
            paths.record(
                id,
                checked.size,
                checked.rotated.is_some(),
                clock::instant(),
                policy,
            );
            let Some(to) = checked.rotated else {
                return false;
            };
            let elapsed_ms = began.elapsed().as_secs_f64() * 1000.0;
            tracing::info!(container_id = %id, %pod, %container, rotated_to = %to.display(), size = checked.size, elapsed_ms, "rotated a container log");
            crate::base::metrics::KUBELET
                .log_rotations
                .inc(&["rotated"]);
            true
        }
        Err(err) => {
            tracing::warn!(container_id = %id, %pod, %container, error = %err, "cannot rotate a container log");
            crate::base::metrics::KUBELET.log_rotations.inc(&["failed"]);
            false
        }
    }
}

/// What one look at a log found: its size, and where it was rotated to if it was.
struct Checked {
    size: u64,
    rotated: Option<PathBuf>,
}

/// What the blocking part of a rotation found.
enum Prepared {
    /// The log file is missing: the runtime should open it again.
    Missing,
    /// Not rotated; its size.
    Small(u64),
    /// Renamed to this, at this size; the runtime must reopen the original name.
    Renamed(PathBuf, u64),
}

/// Rotates one container's log when it is over the size: cleanup, compression and rename
/// on a blocking thread, then `ReopenContainerLog`; a failed reopen renames the file back so
/// the next round tries again (upstream's order). Returns the rotated file's path.
async fn rotate_one<R: RuntimeService>(
    rt: &R,
    id: &str,
    pod: &str,
    container: &str,
    policy: RotationPolicy,
    paths: &LogPaths,
) -> Result<Checked, GcError> {
    let log_path = match paths.get(id) {
        Some(path) => path,
        None => {
            let status = rt.container_status(id.to_string()).await?;
            let path = status
                .status
                .map(|s| PathBuf::from(s.log_path))
                .unwrap_or_default();
            paths.insert(id, path.clone(), pod, container);
            path
        }
    };
    if log_path.as_os_str().is_empty() {
        return Ok(Checked {
            size: 0,
            rotated: None,
        });
    }
    let path = log_path.clone();
    let timestamp = clock::timestamp().strftime(TIMESTAMP_FORMAT).to_string();
    let prepared =
        tokio::task::spawn_blocking(move || prepare_rotation(&path, policy, &timestamp)).await??;
    match prepared {
        Prepared::Small(size) => Ok(Checked {
            size,
            rotated: None,
        }),
        Prepared::Missing => {
            rt.reopen_container_log(id.to_string()).await?;
            Ok(Checked {
                size: 0,
                rotated: None,
            })
        }
        Prepared::Renamed(rotated, size) => {
            if let Err(err) = rt.reopen_container_log(id.to_string()).await {
                let (from, to) = (rotated.clone(), log_path.clone());
                let back = tokio::task::spawn_blocking(move || std::fs::rename(&from, &to)).await?;
                if let Err(rename_err) = back {
                    tracing::error!(container_id = %id, rotated = %rotated.display(), error = %rename_err, "cannot rename a rotated log back; the container's log continues in a new file");
                }
                return Err(err.into());
            }
            Ok(Checked {
                size,
                rotated: Some(rotated),
            })
        }
    }
}

fn prepare_rotation(
    log_path: &Path,
    policy: RotationPolicy,
    timestamp: &str,
) -> Result<Prepared, files::FileError> {
    let size = match std::fs::metadata(log_path) {
        Ok(m) => m.len(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Prepared::Missing),
        Err(source) => {
            return Err(files::FileError {
                what: "reading the size of",
                path: log_path.to_path_buf(),
                source,
            });
        }
    };
    let (Some(dir), Some(name)) = (
        log_path.parent(),
        log_path.file_name().and_then(|n| n.to_str()),
    ) else {
        return Ok(Prepared::Small(size));
    };
    let siblings = files::dir_names(dir)?;
    let Some(plan) = plan_rotation(
        name,
        size,
        policy.max_size,
        policy.max_files,
        &siblings,
        timestamp,
    ) else {
        return Ok(Prepared::Small(size));
    };
    for old in &plan.remove {
        files::remove_file(&dir.join(old))?;
    }
    for old in &plan.compress {
        files::compress(dir, old)?;
    }
    let Some(to) = plan.rotate_to else {
        return Ok(Prepared::Small(size));
    };
    let rotated = dir.join(to);
    std::fs::rename(log_path, &rotated).map_err(|source| files::FileError {
        what: "renaming",
        path: log_path.to_path_buf(),
        source,
    })?;
    Ok(Prepared::Renamed(rotated, size))
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
