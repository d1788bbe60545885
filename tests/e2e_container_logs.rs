//! End to end, on the private containerd: `/containerLogs` on a large log. The agent runs
//! standalone with anonymous requests allowed (`--anonymous-auth=true
//! --authorization-mode=AlwaysAllow`), so no control plane is needed; e2e_node_api covers the
//! authentication in front of it and kubectl's way there.
//!
//! A sleeping pod's log gets 200 MB of CRI lines appended (as a chatty container would leave
//! it; `containerLogMaxSize` is set above that so the monitor leaves it alone). Six concurrent
//! `tailLines=1` requests must each answer the last line while the agent's peak RSS stays
//! within 60 MB of its idle RSS and its `/healthz` answers within a second throughout (a
//! whole-file read took 430 MB for one such request and stalled the runtime).
//! `sinceSeconds=9223372036854775807` (which overflowed, a panic) and `limitBytes` are
//! checked on the same log.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::node_api::{CurlError, curl_node_api};
use common::{Agent, http_get, sleeping_pod, wait_until};

const WAIT: Duration = Duration::from_secs(60);
const LOG_BYTES: usize = 200 * 1000 * 1000;
const REQUESTS: usize = 6;
const RSS_BOUND_KIB: u64 = 60 * 1024;
const LAST_LINE: &str = "the-last-line";

/// `curl -k` against the node API, waiting up to 120 s (the big log's requests run
/// together); (HTTP status, body), or curl's complaint.
fn curl(port: u16, path: &str) -> Result<(u16, String), CurlError> {
    curl_node_api(port, path, ["-k", "--max-time", "120"])
}

/// A `VmRSS`/`VmHWM` line of `/proc/<pid>/status`, in KiB.
fn vm_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// The log file of container `app` of the pod whose directory name starts with `prefix`.
fn app_log(logs_dir: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(logs_dir)
        .ok()?
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path().join("app/0.log"))
        .filter(|p| p.exists())
}

/// Appends about `bytes` of CRI entries to `path`, then `LAST_LINE`.
fn append_big_log(path: &Path, bytes: usize) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    let line = format!(
        "2026-12-01T10:00:00.123456789Z stdout F {}\n",
        "filler ".repeat(12)
    );
    let block = line.repeat((4 << 20) / line.len());
    let mut written = 0;
    while written < bytes {
        f.write_all(block.as_bytes()).unwrap();
        written += block.len();
    }
    writeln!(f, "2026-12-01T10:00:01Z stdout F {LAST_LINE}").unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
async fn tail_requests_on_a_large_log_stay_small() {
    let mut agent = Agent::new("e2e-biglog");
    agent.with_config("containerLogMaxSize: 1Gi\n");
    agent.let_anyone_in();
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("big.yaml", &sleeping_pod("big"));
    let pod = agent.pod_name("big");
    let prefix = format!("default_{pod}_");
    let logs_dir = agent.logs_dir();
    let log = wait_until("the pod's log file", WAIT, || {
        let (dir, prefix) = (logs_dir.clone(), prefix.clone());
        async move { app_log(&dir, &prefix) }
    })
    .await;
    append_big_log(&log, LOG_BYTES);
    let port = agent.port;
    let url = format!("/containerLogs/default/{pod}/app");
    let ready = format!("{url}?tailLines=1&limitBytes=5");
    wait_until("the node API serves the pod's log", WAIT, || {
        let ready = ready.clone();
        async move {
            let got = tokio::task::spawn_blocking(move || curl(port, &ready))
                .await
                .ok()?;
            (got.ok()? == (200, "the-l".to_string())).then_some(())
        }
    })
    .await;

    let pid = agent.child.as_ref().unwrap().id();
    // Settle, then the idle figures.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rss = vm_kib(pid, "VmRSS:");
    // The peak from here on: VmHWM back to the present RSS (root only; without it the
    // start-up's peak stays, and only a rise above it counts).
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    let hwm_before = vm_kib(pid, "VmHWM:");

    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let path = format!("{url}?tailLines=1");
            std::thread::spawn(move || curl(port, &path))
        })
        .collect();
    let healthz = format!("http://127.0.0.1:{}/healthz", agent.healthz_port);
    let started = Instant::now();
    let mut slowest_healthz = Duration::ZERO;
    let mut peak_rss = idle_rss;
    while !requests.iter().all(|r| r.is_finished()) {
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "the tail requests did not finish"
        );
        peak_rss = peak_rss.max(vm_kib(pid, "VmRSS:"));
        let asked = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(1), http_get(&healthz)).await;
        let took = asked.elapsed();
        slowest_healthz = slowest_healthz.max(took);
        assert!(
            matches!(answer, Ok(Some((200, _)))),
            "/healthz did not answer within 1 s during the tail requests ({took:?}): {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hwm_after = vm_kib(pid, "VmHWM:");
    for r in requests {
        let got = r.join().unwrap();
        assert_eq!(got, Ok((200, format!("{LAST_LINE}\n"))));
    }
    eprintln!(
        "idle RSS {idle_rss} KiB, sampled peak {peak_rss} KiB, VmHWM {hwm_before} -> {hwm_after} KiB, \
         slowest /healthz {slowest_healthz:?}, {REQUESTS} requests in {:?}",
        started.elapsed()
    );
    let peak = if hwm_after > hwm_before {
        hwm_after
    } else {
        peak_rss
    };
    assert!(
        peak <= idle_rss + RSS_BOUND_KIB,
        "{REQUESTS} tailLines=1 requests on a {LOG_BYTES}-byte log took the agent from \
         {idle_rss} KiB to {peak} KiB (bound: +{RSS_BOUND_KIB} KiB)"
    );

    // sinceSeconds beyond the earliest time: every entry (it overflowed and panicked).
    let got = curl(
        port,
        &format!("{url}?tailLines=1&sinceSeconds=9223372036854775807"),
    );
    assert_eq!(got, Ok((200, format!("{LAST_LINE}\n"))));
    let got = curl(
        port,
        &format!("{url}?tailLines=2&timestamps=true&limitBytes=40"),
    );
    let (code, body) = got.unwrap();
    assert_eq!(code, 200);
    assert_eq!(body, "2026-12-01T10:00:00.123456789Z filler fi");
    agent.stop();
}
