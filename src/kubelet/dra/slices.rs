//! The node's stale ResourceSlices, deleted as upstream's kubelet deletes them. The drivers
//! publish their own slices, but a driver that has gone cannot take them back, and the
//! scheduler would go on allocating its devices to pods that would then wait on this node.
//! So, as upstream's `DRAPluginManager`: at start every slice of the node is deleted (no
//! driver has registered yet; each publishes again when it does), and [`WIPING_DELAY`] after
//! a driver became unusable without coming back, that driver's slices: it deregistered (its
//! registration socket went), or its service socket stopped answering (a killed driver
//! leaves its registration socket behind; upstream follows the gRPC connection's state, here
//! the socket is tried every [`PROBE_PERIOD`]). A deletion that
//! fails is tried again with upstream's back-off (1 s, doubling, at most 5 minutes apart)
//! until it goes through or the agent stops.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};
use tokio_util::sync::CancellationToken;

/// How long a driver may be away before its slices go (upstream's `defaultWipingDelay`).
pub(crate) const WIPING_DELAY: Duration = Duration::from_secs(30);
/// How often a registered driver's service socket is tried.
pub(crate) const PROBE_PERIOD: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(5 * 60);

/// The field selector of the node's slices, of one driver or of all (upstream's
/// `spec.nodeName` and `spec.driver` selectors).
pub(crate) fn selector(node: &str, driver: Option<&str>) -> String {
    match driver {
        Some(driver) => format!("spec.nodeName={node},spec.driver={driver}"),
        None => format!("spec.nodeName={node}"),
    }
}

/// Deletes the node's slices (of `driver`, or all), trying again until it goes through or
/// `stop`.
pub(crate) async fn wipe(
    client: kube::Client,
    node: &str,
    driver: Option<&str>,
    stop: &CancellationToken,
) {
    let api: Api<ResourceSlice> = Api::all(client);
    let params = ListParams::default().fields(&selector(node, driver));
    let which = driver.unwrap_or("every driver");
    let mut wait = FIRST_RETRY;
    loop {
        match api
            .delete_collection(&DeleteParams::default(), &params)
            .await
        {
            Ok(_) => {
                tracing::info!(node, driver = which, "deleted the node's ResourceSlices");
                return;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return,
            Err(err) => {
                tracing::warn!(node, driver = which, error = %err, retry_in_s = wait.as_secs(), "cannot delete the node's ResourceSlices; trying again");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(LONGEST_RETRY);
    }
}

/// Tries the driver's service socket every [`PROBE_PERIOD`] until `stop`, and tells
/// `changed` each time it starts or stops answering (one connect, closed at once).
pub(crate) async fn watch_connection(
    endpoint: &str,
    stop: &CancellationToken,
    changed: impl Fn(bool),
) {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    let mut answered = true;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_PERIOD) => {}
        }
        let now = tokio::net::UnixStream::connect(path).await.is_ok();
        if now != answered {
            if now {
                tracing::info!(endpoint, "the DRA driver answers again");
            } else {
                tracing::warn!(endpoint, "the DRA driver does not answer on its socket");
            }
            answered = now;
            changed(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::FakeApiServer;

    fn slice(name: &str, node: &str, driver: &str) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_that_stops_answering_and_comes_back_is_told_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("dra.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (record, path, halt) = (seen.clone(), socket.display().to_string(), stop.clone());
        let watch = tokio::spawn(async move {
            watch_connection(&path, &halt, |up| record.lock().unwrap().push(up)).await
        });
        tokio::time::sleep(PROBE_PERIOD * 2 + Duration::from_millis(10)).await;
        assert!(
            seen.lock().unwrap().is_empty(),
            "answering: nothing to tell"
        );
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        tokio::time::sleep(PROBE_PERIOD * 3).await;
        assert_eq!(*seen.lock().unwrap(), [false], "told once that it went");
        let _again = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::time::sleep(PROBE_PERIOD * 2).await;
        assert_eq!(*seen.lock().unwrap(), [false, true]);
        stop.cancel();
        watch.await.unwrap();
    }

    #[test]
    fn the_selectors_are_upstreams() {
        assert_eq!(selector("n1", None), "spec.nodeName=n1");
        assert_eq!(
            selector("n1", Some("gpu.example.com")),
            "spec.nodeName=n1,spec.driver=gpu.example.com"
        );
    }

    #[tokio::test]
    async fn only_the_nodes_slices_of_the_driver_go() {
        let fake = FakeApiServer::new();
        for (name, node, driver) in [
            ("a", "n1", "gpu.example.com"),
            ("b", "n1", "nic.example.com"),
            ("c", "n2", "gpu.example.com"),
        ] {
            fake.apply(&slice(name, node, driver));
        }
        let stop = CancellationToken::new();
        wipe(fake.client(), "n1", Some("gpu.example.com"), &stop).await;
        let left = |name: &str| fake.get::<ResourceSlice>("", name).is_some();
        assert_eq!((left("a"), left("b"), left("c")), (false, true, true));
        wipe(fake.client(), "n1", None, &stop).await;
        assert_eq!((left("b"), left("c")), (false, true));
    }
}
