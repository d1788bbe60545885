//! End to end: `/metrics` on the read-only port carries upstream's kubelet metric names with
//! values that follow what the agent did on the private containerd, and `promtool check
//! metrics` (Prometheus' own linter) finds nothing wrong with any metrics page.

mod common;

use std::time::Duration;

use common::{Agent, http_get, sleeping_pod, wait_until};

const WAIT: Duration = Duration::from_secs(60);

/// The value of the first sample line starting with `series` (name and labels).
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_use_upstreams_names_follow_the_pods_and_pass_promtool() {
    let mut agent = Agent::new("e2e-metrics");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("one.yaml", &sleeping_pod("one"));
    agent.write_manifest("two.yaml", &sleeping_pod("two"));
    let base = format!("http://127.0.0.1:{}", agent.read_only_port);

    let page = wait_until("two running pods in /metrics", WAIT, || {
        let url = format!("{base}/metrics");
        async move {
            let (code, page) = http_get(&url).await?;
            (code == 200
                && sample(&page, "kubelet_running_pods") == Some(2.0)
                && sample(&page, "kubelet_pod_start_duration_seconds_count") == Some(2.0)
                // Two relists at least, so there is an interval between them.
                && sample(&page, "kubelet_pleg_relist_interval_seconds_count")
                    .is_some_and(|n| n >= 1.0))
            .then_some(page)
        }
    })
    .await;

    let node = format!("kubelet_node_name{{node=\"{}\"}}", agent.node);
    assert_eq!(sample(&page, &node), Some(1.0), "{page}");
    assert_eq!(
        sample(
            &page,
            "kubelet_running_containers{container_state=\"running\"}"
        ),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "kubelet_started_containers_total{container_type=\"container\"}"
        ),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "kubelet_pod_start_sli_duration_seconds_count"),
        Some(2.0),
        "{page}"
    );
    for op in [
        "run_podsandbox",
        "create_container",
        "start_container",
        "list_containers",
    ] {
        let series = format!("kubelet_runtime_operations_total{{operation_type=\"{op}\"}}");
        assert!(
            sample(&page, &series).is_some_and(|v| v >= 1.0),
            "{series} in {page}"
        );
    }
    for name in [
        "kubelet_pleg_relist_duration_seconds_count",
        "kubelet_pleg_relist_interval_seconds_count",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(
            sample(&page, name).is_some_and(|v| v > 0.0),
            "{name} in {page}"
        );
    }
    assert!(
        page.contains("kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 2\n"),
        "{page}"
    );
    // The request that fetched the page before this one was counted.
    assert!(
        page.contains("kubelet_http_requests_total{method=\"GET\",path=\"metrics\",server_type=\"readonly\",long_running=\"false\"}"),
        "{page}"
    );

    for path in ["/metrics", "/metrics/probes", "/metrics/events"] {
        let (code, page) = http_get(&format!("{base}{path}")).await.expect(path);
        assert_eq!(code, 200, "{path}");
        assert_eq!(
            common::promtool_lint(&page),
            "",
            "promtool on {path}:\n{page}"
        );
    }
}
