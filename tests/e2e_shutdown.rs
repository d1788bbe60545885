//! Graceful node shutdown against a real `dbus-daemon` on a private bus, with a minimal
//! stand-in for systemd-logind living in this test (logind itself needs systemd as PID 1,
//! which these machines do not have): the agent takes a delay lock, and on
//! `PrepareForShutdown(true)` stops the regular pods first and the critical pod last, each
//! within its grace, marks them Failed with upstream's reason and message, unmounts their
//! volumes, refuses new pods, and releases the lock (the stand-in sees its end of the lock
//! reach EOF). A cancelled shutdown takes a new lock and admits pods again.
//!
//! A second test joins the agent to the real test control plane (`DECKHAND_TEST_CLUSTER`):
//! on `PrepareForShutdown(true)` the Node turns not Ready with upstream's reason and message,
//! the pods bound to it end Failed in the API with the `DisruptionTarget` condition, their
//! volumes are unmounted before the lock is released, and on `PrepareForShutdown(false)` the
//! Node is Ready again.

mod common;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Agent, BUSYBOX, wait_until};
use futures::StreamExt;

const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";

/// A private system-type bus: `dbus-daemon` with its own configuration and socket.
struct Bus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Bus {
    /// Starts the bus and waits until it accepts connections.
    async fn start() -> Bus {
        let dir = tempfile::Builder::new()
            .prefix("deckhand-dbus-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("bus.sock");
        let config = dir.path().join("bus.conf");
        std::fs::write(&config, bus_config(&socket)).unwrap();
        let child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .arg("--nopidfile")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start dbus-daemon ({e}); install Debian's dbus-daemon package (scripts/install-deps)")
            });
        let bus = Bus {
            child,
            address: format!("unix:path={}", socket.display()),
            _dir: dir,
        };
        wait_until("the private bus", Duration::from_secs(10), || {
            // The socket file appears at bind, a moment before dbus-daemon listens on it.
            let ready = std::os::unix::net::UnixStream::connect(&socket).is_ok();
            async move { ready.then_some(()) }
        })
        .await;
        bus
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Anyone may own names and send anything: the bus is private to this test.
fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

/// What the stand-in has seen: one entry per lock handed out, with when it was released.
#[derive(Default)]
struct Locks {
    taken: Vec<Instant>,
    released: Vec<Option<Instant>>,
}

/// A minimal `org.freedesktop.login1` on the bus: `InhibitDelayMaxUSec`, `Inhibit` (an fd of
/// a socket pair whose other end it watches for EOF) and the `PrepareForShutdown` signal.
struct Logind {
    conn: zbus::Connection,
    locks: Arc<Mutex<Locks>>,
}

impl Logind {
    async fn start(address: &str, inhibit_delay_max: Duration) -> Logind {
        let conn = zbus::connection::Builder::address(address)
            .build()
            .await
            .expect("the stand-in connects to the private bus");
        conn.request_name("org.freedesktop.login1")
            .await
            .expect("the stand-in owns org.freedesktop.login1");
        let locks = Arc::new(Mutex::new(Locks::default()));
        let mut calls = zbus::MessageStream::from(&conn);
        let served = conn.clone();
        let seen = locks.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = calls.next().await {
                let header = msg.header();
                if header.message_type() != zbus::message::Type::MethodCall {
                    continue;
                }
                let member = header.member().map(|m| m.to_string()).unwrap_or_default();
                let interface = header
                    .interface()
                    .map(|i| i.to_string())
                    .unwrap_or_default();
                match (interface.as_str(), member.as_str()) {
                    ("org.freedesktop.DBus.Properties", "Get") => {
                        let (_, property): (String, String) = msg.body().deserialize().unwrap();
                        assert_eq!(property, "InhibitDelayMaxUSec");
                        let value = zbus::Variant::from(inhibit_delay_max.as_micros() as u64);
                        served.reply(&header, &value).await.unwrap();
                    }
                    (LOGIND_MANAGER, "Inhibit") => {
                        let (what, _who, _why, mode): (String, String, String, String) =
                            msg.body().deserialize().unwrap();
                        assert_eq!((what.as_str(), mode.as_str()), ("shutdown", "delay"));
                        let (ours, theirs) = UnixStream::pair().unwrap();
                        let index = {
                            let mut l = seen.lock().unwrap();
                            l.taken.push(Instant::now());
                            l.released.push(None);
                            l.released.len() - 1
                        };
                        let fd = zbus::OwnedFd::from(std::os::fd::OwnedFd::from(theirs));
                        served.reply(&header, &fd).await.unwrap();
                        drop(fd);
                        let seen = seen.clone();
                        // EOF once every copy of the other end is closed: the agent let go.
                        tokio::task::spawn_blocking(move || {
                            let mut ours = ours;
                            let mut buf = [0u8; 16];
                            while !matches!(ours.read(&mut buf), Ok(0) | Err(_)) {}
                            seen.lock().unwrap().released[index] = Some(Instant::now());
                        });
                    }
                    _ => {
                        let _ = served
                            .reply_dbus_error(&header, zbus::fdo::Error::UnknownMethod(member))
                            .await;
                    }
                }
            }
        });
        Logind { conn, locks }
    }

    async fn prepare_for_shutdown(&self, active: bool) {
        self.conn
            .emit_signal(
                None::<&str>,
                LOGIND_PATH,
                LOGIND_MANAGER,
                "PrepareForShutdown",
                &active,
            )
            .await
            .unwrap();
    }

    fn locks(&self) -> (usize, Vec<Option<Instant>>) {
        let l = self.locks.lock().unwrap();
        (l.taken.len(), l.released.clone())
    }
}

fn pod(name: &str, grace: i64, class: Option<&str>, script: &str) -> String {
    let class = class
        .map(|c| format!("  priorityClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{class}  terminationGracePeriodSeconds: {grace}
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "{script}"]
    readinessProbe:
      exec: {{command: ["test", "-e", "/tmp/ready"]}}
      periodSeconds: 1
"#
    )
}

/// `manifest` (from [`pod`]) with a memory-backed emptyDir: a tmpfs mount under the pod's
/// directory that must be gone before the shutdown goes on.
fn with_memory_volume(manifest: String) -> String {
    let more = [
        "    volumeMounts:",
        "    - name: cache",
        "      mountPath: /cache",
        "  volumes:",
        "  - name: cache",
        "    emptyDir:",
        "      medium: Memory",
    ];
    manifest + &more.join("\n") + "\n"
}

// Each script marks itself ready (the pod's readiness probe) only once its SIGTERM handling
// is in place: a SIGTERM that reaches the container before its process has even been
// exec'd (runc's init, a Go program, is still PID 1 for a moment after StartContainer
// returns) ends it at once, so a test that stops a pod that only just started must wait for
// its readiness.

/// Stops at once on SIGTERM.
const POLITE: &str = "trap 'exit 0' TERM; touch /tmp/ready; sleep 600 & wait";
/// Ignores SIGTERM (ignored, and kept so across the exec): only the kill at the end of its
/// grace stops it.
const STUBBORN: &str = "trap '' TERM; touch /tmp/ready; exec sleep 600";

fn phase(pod: &serde_json::Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

#[tokio::test]
async fn prepare_for_shutdown_stops_regular_pods_then_critical_ones_then_releases_the_lock() {
    let bus = Bus::start().await;
    // A logind that allows 30 s of delay: the configured 14 s fit.
    let logind = Logind::start(&bus.address, Duration::from_secs(30)).await;

    let mut agent = Agent::new("e2e-shutdown");
    let config = agent.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         shutdownGracePeriod: 14s\nshutdownGracePeriodCriticalPods: 6s\n",
    )
    .unwrap();
    agent
        .extra_args
        .push(format!("--config={}", config.display()));
    agent
        .env
        .push(("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.address.clone()));
    // Regular pods get 8 s: `web` stops at once, `stubborn` is killed after its own 3 s.
    agent.write_manifest(
        "web.yaml",
        &with_memory_volume(pod("web", 30, None, POLITE)),
    );
    agent.write_manifest("stubborn.yaml", &pod("stubborn", 3, None, STUBBORN));
    // The critical pod, last, with the 6 s of the critical part.
    agent.write_manifest(
        "crit.yaml",
        &pod("crit", 30, Some("system-node-critical"), POLITE),
    );
    agent.start();
    agent.wait_healthy(Duration::from_secs(30)).await;

    wait_until("the delay lock", Duration::from_secs(15), || {
        let (taken, _) = logind.locks();
        async move { (taken == 1).then_some(()) }
    })
    .await;
    for name in ["web", "stubborn", "crit"] {
        wait_until(
            &format!("{name} running and ready"),
            Duration::from_secs(30),
            || async {
                let p = agent.pod(name).await?;
                (phase(&p) == "Running" && p["status"]["containerStatuses"][0]["ready"] == true)
                    .then_some(())
            },
        )
        .await;
    }

    let web_uid = agent.pod("web").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let web_volumes = agent.root_dir().join("pods").join(web_uid).join("volumes");
    assert!(
        !mounts_under(&web_volumes).is_empty(),
        "web's emptyDir is mounted"
    );

    let signal = Instant::now();
    logind.prepare_for_shutdown(true).await;
    // Watch /pods: when each pod turns Failed, until the lock is released.
    let mut failed_at: std::collections::HashMap<&str, Duration> = Default::default();
    let released = loop {
        if let Some(list) = agent.pods().await {
            for name in ["web", "stubborn", "crit"] {
                let full = agent.pod_name(name);
                let failed = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["metadata"]["name"] == full.as_str() && phase(p) == "Failed");
                if failed {
                    failed_at.entry(name).or_insert_with(|| signal.elapsed());
                }
            }
        }
        if let Some(Some(at)) = logind.locks().1.first().cloned() {
            // Stopped pods are kept (static pods are not removed), their volumes are not.
            assert_eq!(mounts_under(&web_volumes), Vec::<String>::new());
            break at.duration_since(signal);
        }
        assert!(
            signal.elapsed() < Duration::from_secs(25),
            "the lock was not released; pods failed at {failed_at:?}; log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Every pod ended Failed with upstream's reason and message, the condition, and no
    // running container.
    for name in ["web", "stubborn", "crit"] {
        let p = agent.pod(name).await.expect("the pod is still shown");
        assert_eq!(phase(&p), "Failed", "{name}: {p}");
        assert_eq!(p["status"]["reason"], "Terminated", "{name}");
        assert_eq!(
            p["status"]["message"],
            "Pod was terminated in response to imminent node shutdown."
        );
        let conditions = p["status"]["conditions"].as_array().unwrap();
        assert!(
            conditions.iter().any(|c| c["type"] == "DisruptionTarget"
                && c["status"] == "True"
                && c["reason"] == "TerminationByKubelet"),
            "{name}: {conditions:?}"
        );
        assert!(
            p["status"]["containerStatuses"][0]["state"]["terminated"].is_object(),
            "{name}: {p}"
        );
        failed_at.entry(name).or_insert(released);
    }
    let (web, stubborn, crit) = (failed_at["web"], failed_at["stubborn"], failed_at["crit"]);
    eprintln!(
        "signal -> web stopped {web:?}, stubborn {stubborn:?}, crit {crit:?}, lock released {released:?}"
    );
    // Regular pods first, each within its grace (the stubborn one needs all of its 3 s);
    // the critical pod only after both.
    assert!(
        stubborn >= Duration::from_secs(3) && stubborn < Duration::from_secs(8),
        "the stubborn pod uses its 3 s grace: {failed_at:?}"
    );
    assert!(web < Duration::from_secs(8), "{failed_at:?}");
    assert!(
        crit >= stubborn && crit >= web,
        "critical last: {failed_at:?}"
    );
    assert!(crit < Duration::from_secs(14));
    assert!(released <= Duration::from_secs(14) + Duration::from_secs(1));

    // While the node shuts down, a new pod is refused.
    agent.write_manifest("late.yaml", &pod("late", 1, None, POLITE));
    let late = wait_until("the late pod refused", Duration::from_secs(15), || async {
        let p = agent.pod("late").await?;
        (phase(&p) == "Failed").then_some(p)
    })
    .await;
    assert_eq!(late["status"]["reason"], "NodeShutdown");
    let page = common::http_get(&format!(
        "http://127.0.0.1:{}/metrics",
        agent.read_only_port
    ))
    .await
    .unwrap()
    .1;
    let end = page
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_graceful_shutdown_end_time_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(end > 0.0, "the end time is recorded");

    // Cancelled: a new lock is taken, and a new pod runs again.
    logind.prepare_for_shutdown(false).await;
    wait_until("a new delay lock", Duration::from_secs(15), || {
        let (taken, _) = logind.locks();
        async move { (taken == 2).then_some(()) }
    })
    .await;
    agent.write_manifest("after.yaml", &pod("after", 1, None, POLITE));
    wait_until(
        "a pod after the cancellation",
        Duration::from_secs(30),
        || async {
            let p = agent.pod("after").await?;
            (phase(&p) == "Running").then_some(())
        },
    )
    .await;
    agent.stop();
}

/// The mount points at or below `dir`, as this process's mount table shows them.
fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = dir.display().to_string();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// The Node's Ready condition: (status, reason, message).
async fn ready_of(client: &kube::Client, node: &str) -> Option<(String, String, String)> {
    let n = common::cluster::get_node(client, node).await?;
    let c = n
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
    ))
}

#[tokio::test]
async fn joined_node_goes_not_ready_at_shutdown_and_its_pods_end_failed_in_the_api() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};

    let started = Instant::now();
    let bus = Bus::start().await;
    let logind = Logind::start(&bus.address, Duration::from_secs(30)).await;

    let client = common::cluster::admin().await;
    let node = "dev-shutdown-api";
    let (mut agent, _node_cleanup) = common::cluster::joined_agent(node);
    // The joined agent's configuration file, with a short shutdown added: 4 s for regular
    // pods, 2 s for critical ones.
    let config = agent.dir.path().join("config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("shutdownGracePeriod: 6s\nshutdownGracePeriodCriticalPods: 2s\n");
    std::fs::write(&config, text).unwrap();
    agent
        .extra_args
        .push("--node-status-update-frequency=1s".to_string());
    agent
        .env
        .push(("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.address.clone()));
    agent.start();
    common::cluster::wait_node_ready(&client, node, &agent).await;
    wait_until("the delay lock", Duration::from_secs(15), || {
        let (taken, _) = logind.locks();
        async move { (taken == 1).then_some(()) }
    })
    .await;
    let ns = "e2e-shutdown-api";
    let _ns = common::cluster::create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // `web` has a memory-backed emptyDir: a tmpfs mount under its pod directory, which is
    // unmounted once the pod is stopped for the shutdown.
    let mut web = common::cluster::sleeping_spec(30);
    web["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "cache", "mountPath": "/cache"}]);
    web["volumes"] = serde_json::json!([{"name": "cache", "emptyDir": {"medium": "Memory"}}]);
    for (name, spec) in [("web", web), ("worker", common::cluster::sleeping_spec(30))] {
        pods.create(
            &PostParams::default(),
            &common::cluster::bound_pod_with(name, node, spec),
        )
        .await
        .unwrap();
    }
    // Running and Ready: the sync that started the containers is over.
    for name in ["web", "worker"] {
        wait_until(
            &format!("{name} ready"),
            Duration::from_secs(30),
            || async {
                let p = pods.get(name).await.ok()?;
                let s = p.status?;
                let ready = s
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (s.phase.as_deref() == Some("Running") && ready).then_some(())
            },
        )
        .await;
    }
    let web_uid = pods.get("web").await.unwrap().metadata.uid.unwrap();
    let web_volumes = agent.root_dir().join("pods").join(&web_uid).join("volumes");
    assert!(
        !mounts_under(&web_volumes).is_empty(),
        "web's emptyDir is a mount under {}",
        web_volumes.display()
    );

    let signal = Instant::now();
    logind.prepare_for_shutdown(true).await;
    // Upstream's Ready condition while the shutdown manager reports an error.
    let not_ready = wait_until("the Node not Ready", Duration::from_secs(15), || async {
        let ready = ready_of(&client, node).await?;
        (ready.0 == "False").then_some(ready)
    })
    .await;
    let not_ready_after = signal.elapsed();
    assert_eq!(
        not_ready,
        (
            "False".to_string(),
            "KubeletNotReady".to_string(),
            "node is shutting down".to_string()
        )
    );
    // Each pod ends Failed in the API with upstream's reason, message and condition, its
    // container terminated.
    for name in ["web", "worker"] {
        let pod = wait_until(
            &format!("{name} Failed in the API"),
            Duration::from_secs(20),
            || async {
                let p = pods.get(name).await.ok()?;
                let s = p.status.clone()?;
                let terminated = s
                    .container_statuses
                    .as_ref()?
                    .first()?
                    .state
                    .as_ref()?
                    .terminated
                    .is_some();
                (s.phase.as_deref() == Some("Failed") && terminated).then_some(p)
            },
        )
        .await;
        let status = pod.status.unwrap();
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let conditions = status.conditions.unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("TerminationByKubelet")),
            "{name}: {conditions:?}"
        );
    }
    let pods_failed_after = signal.elapsed();
    wait_until("the lock released", Duration::from_secs(15), || {
        let (_, released) = logind.locks();
        async move { released.first().cloned().flatten() }
    })
    .await;
    // The shutdown went on only once the stopped pods' volumes were unmounted.
    assert_eq!(mounts_under(&web_volumes), Vec::<String>::new());
    // The Node's event about it.
    wait_until(
        "the NodeShutdown event",
        Duration::from_secs(15),
        || async {
            common::cluster::event_reasons(&client, "default", node)
                .await
                .into_iter()
                .any(|(reason, m)| {
                    reason == "NodeShutdown" && m == "Shutdown manager detected shutdown event"
                })
                .then_some(())
        },
    )
    .await;

    // Cancelled: Ready again, with a new lock.
    let cancel = Instant::now();
    logind.prepare_for_shutdown(false).await;
    wait_until("the Node Ready again", Duration::from_secs(15), || async {
        (ready_of(&client, node).await?.0 == "True").then_some(())
    })
    .await;
    let ready_after = cancel.elapsed();
    wait_until("a new delay lock", Duration::from_secs(15), || {
        let (taken, _) = logind.locks();
        async move { (taken == 2).then_some(()) }
    })
    .await;
    eprintln!(
        "joined shutdown: signal -> Node not Ready {not_ready_after:?}, pods Failed in the API {pods_failed_after:?}; cancel -> Ready {ready_after:?}; took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    agent.stop();
}
