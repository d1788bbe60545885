//! For tests that put a joined node under pressure: a small tmpfs that stands in for the
//! node's disk, a trace of a Node condition over time, and a pod's phase, reason and message.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// A tmpfs mounted over a directory for as long as the value lives; detached when dropped,
/// even when the test failed half-way (the mounts the agent made inside it go with it).
pub struct SmallFs {
    at: PathBuf,
    /// Bind mounts of directories in it elsewhere, undone first.
    binds: Vec<PathBuf>,
}

impl SmallFs {
    /// Mounts a tmpfs at `at` with `options` (`size=64m,nr_inodes=2000`); fails the test
    /// with mount's complaint (the tests run as root).
    pub fn mount(at: &Path, options: &str) -> SmallFs {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "deckhand-test"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs ({options}) at {} failed (tests that fill a disk need root): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs {
            at: at.to_path_buf(),
            binds: Vec::new(),
        }
    }

    /// Bind-mounts `from` (a directory in this filesystem) at `at`, so that another of the
    /// agent's directories (its pod logs) is on the same small disk; undone when dropped.
    pub fn bind(&mut self, from: &Path, at: &Path) {
        let out = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "bind-mounting {} at {} failed: {}",
            from.display(),
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.binds.push(at.to_path_buf());
    }

    /// Free inodes and the inode count of the filesystem.
    pub fn inodes(&self) -> (u64, u64) {
        let st = nix::sys::statvfs::statvfs(&self.at).expect("statvfs of the test's tmpfs");
        (st.files_free() as u64, st.files() as u64)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        for at in self.binds.iter().rev() {
            let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
        }
        super::unmount_under(&self.at);
        let _ = nix::mount::umount2(&self.at, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The statuses a Node condition went through, as seen by polling the Node every 100 ms in
/// the background (a condition that is True for a few seconds is not missed).
pub struct ConditionTrace {
    kind: String,
    changes: Arc<Mutex<Vec<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConditionTrace {
    /// Starts following condition `kind` of Node `node`.
    pub fn follow(client: kube::Client, node: &str, kind: &str) -> ConditionTrace {
        let changes: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let (seen, node, wanted) = (changes.clone(), node.to_string(), kind.to_string());
        let task = tokio::spawn(async move {
            loop {
                if let Some(n) = super::cluster::get_node(&client, &node).await {
                    let now = super::cluster::condition(&n, &wanted).unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    if seen.last().map(|(_, s)| s) != Some(&now) {
                        seen.push((Instant::now(), now));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ConditionTrace {
            kind: kind.to_string(),
            changes,
            task,
        }
    }

    /// Every status seen, in order, with when it was first seen.
    pub fn changes(&self) -> Vec<(Instant, String)> {
        self.changes.lock().unwrap().clone()
    }

    /// When the condition was first seen True.
    pub fn first_true(&self) -> Option<Instant> {
        self.changes()
            .into_iter()
            .find(|(_, s)| s == "True")
            .map(|(at, _)| at)
    }

    /// Waits (up to `timeout` in all) until the condition has been True and is False again;
    /// answers when it turned True and when it turned False.
    pub async fn wait_came_and_went(&self, timeout: Duration) -> (Instant, Instant) {
        let what = format!("{} True, then False again", self.kind);
        super::wait_until(&what, timeout, || async {
            let changes = self.changes();
            let rose = changes.iter().position(|(_, s)| s == "True")?;
            let fell = changes[rose..].iter().find(|(_, s)| s == "False")?;
            Some((changes[rose].0, fell.0))
        })
        .await
    }
}

impl Drop for ConditionTrace {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pod's phase, reason and message as the API server has them (empty when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub phase: String,
    pub reason: String,
    pub message: String,
}

/// The pod's [`Outcome`], or `None` when it cannot be read.
pub async fn outcome(pods: &Api<Pod>, name: &str) -> Option<Outcome> {
    let status = pods.get(name).await.ok()?.status.unwrap_or_default();
    Some(Outcome {
        phase: status.phase.unwrap_or_default(),
        reason: status.reason.unwrap_or_default(),
        message: status.message.unwrap_or_default(),
    })
}

/// Waits until the pod is Running.
pub async fn wait_running(pods: &Api<Pod>, name: &str, timeout: Duration) {
    super::wait_until(&format!("{name} running"), timeout, || async {
        (outcome(pods, name).await?.phase == "Running").then_some(())
    })
    .await;
}

/// Waits until the pod is Failed with reason Evicted; answers its outcome.
pub async fn wait_evicted(pods: &Api<Pod>, name: &str, timeout: Duration) -> Outcome {
    super::wait_until(&format!("{name} evicted"), timeout, || async {
        let o = outcome(pods, name).await?;
        (o.phase == "Failed" && o.reason == "Evicted").then_some(o)
    })
    .await
}

/// The agent's own settings for a pressure test: `eviction_hard`, a round every `monitoring`
/// (the test knob `DECKHAND_EVICTION_MONITORING_PERIOD`), the Node's status every second, and a
/// `transition` period short enough for the condition to clear within the test.
pub fn quick_rounds(
    agent: &mut super::Agent,
    eviction_hard: &str,
    transition: &str,
    monitoring: &str,
) {
    agent.extra_args.extend([
        format!("--eviction-hard={eviction_hard}"),
        format!("--eviction-pressure-transition-period={transition}"),
        "--node-status-update-frequency=1s".to_string(),
    ]);
    agent.env.push((
        "DECKHAND_EVICTION_MONITORING_PERIOD".into(),
        monitoring.to_string(),
    ));
}

/// The first line of the agent's `/metrics` (read-only port) that starts with `prefix`.
pub async fn metrics_line(agent: &super::Agent, prefix: &str) -> Option<String> {
    let url = format!("http://127.0.0.1:{}/metrics", agent.read_only_port);
    let (_, page) = super::http_get(&url).await?;
    page.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}
