//! CSI volume stats, as upstream's `csiMetricsProvider` and volume stat calculator: every
//! `volumeStatsAggPeriod` the CSI volumes published on the node whose driver advertises the
//! `GET_VOLUME_STATS` node capability are asked `NodeGetVolumeStats` once each, and the
//! answers are kept: `/stats/summary` (`pods[].volume[]`) and the `kubelet_volume_stats_*`
//! metrics of `/metrics` read what is kept, so a scrape never calls a driver. A driver without
//! the capability, unregistered, or answering an error gives no figures for its volumes (as
//! upstream, which leaves such a volume out of the summary).
//!
//! A volume is named as upstream names it: the pod's volume name, with the claim (`pvcRef`)
//! for a `persistentVolumeClaim`; both are in the volume's `vol_data.json`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::client::NodeClient;
use super::proto::VolumeUsage;
use super::proto::volume_usage::Unit;
use super::{CSI_PLUGIN_DIR, driver};
use crate::base::metrics::family::escape;

/// Deckhand's keys in a persistent volume's `vol_data.json`: the pod's volume name, the
/// claim, and the pod's namespace.
pub(crate) const POD_VOLUME_KEY: &str = "podVolumeName";
pub(crate) const CLAIM_KEY: &str = "claimName";
pub(crate) const NAMESPACE_KEY: &str = "podNamespace";

/// What a driver said of a volume (upstream's `volume.Metrics`; unset when not told).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub capacity_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// Upstream's reading of a `NodeGetVolumeStats` answer (pure): the `BYTES` entry gives
/// capacity (total), available and used; the `INODES` entry the inodes, free and used.
pub(crate) fn figures(usage: &[VolumeUsage]) -> Figures {
    let mut out = Figures::default();
    let n = |v: i64| Some(u64::try_from(v).unwrap_or(0));
    for u in usage {
        match Unit::try_from(u.unit) {
            Ok(Unit::Bytes) => {
                out.capacity_bytes = n(u.total);
                out.available_bytes = n(u.available);
                out.used_bytes = n(u.used);
            }
            Ok(Unit::Inodes) => {
                out.inodes = n(u.total);
                out.inodes_free = n(u.available);
                out.inodes_used = n(u.used);
            }
            _ => {}
        }
    }
    out
}

/// One pod volume's kept figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Measured {
    pub pod_uid: String,
    /// The pod's volume name.
    pub volume: String,
    pub namespace: String,
    /// The claim, for a `persistentVolumeClaim` volume.
    pub claim: Option<String>,
    pub figures: Figures,
    /// When it was measured (ns since the epoch).
    pub at_ns: i64,
}

/// The kept figures, by volume directory.
static KEPT: Mutex<BTreeMap<PathBuf, Measured>> = Mutex::new(BTreeMap::new());

/// The kept figures of one pod's CSI volumes, by volume name.
pub(crate) fn of_pod(uid: &str) -> Vec<Measured> {
    let kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<Measured> = kept
        .values()
        .filter(|m| m.pod_uid == uid)
        .cloned()
        .collect();
    out.sort_by(|a, b| a.volume.cmp(&b.volume));
    out
}

fn read_vol_data(dir: &Path) -> Option<HashMap<String, String>> {
    serde_json::from_slice(&std::fs::read(dir.join("vol_data.json")).ok()?).ok()
}

/// A published volume to measure: its directory and what its `vol_data.json` says.
struct Published {
    dir: PathBuf,
    pod_uid: String,
    data: HashMap<String, String>,
}

fn published(root: &Path) -> Vec<Published> {
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for pod in dirs(&root.join("pods")) {
        let pod_uid = pod
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for dir in dirs(&pod.join("volumes").join(CSI_PLUGIN_DIR)) {
            if let Some(data) = read_vol_data(&dir) {
                out.push(Published {
                    dir,
                    pod_uid: pod_uid.clone(),
                    data,
                });
            }
        }
    }
    out
}

/// Asks the volume's driver for its figures: `None` when the driver is not registered or
/// does not advertise `GET_VOLUME_STATS`, or the call failed (logged).
async fn measure(root: &Path, p: &Published) -> Option<Figures> {
    let get = |k: &str| p.data.get(k).cloned().unwrap_or_default();
    let (driver_name, handle) = (get("driverName"), get("volumeHandle"));
    let registered = driver(&driver_name)?;
    let staging = if get("volumeLifecycleMode") == "Persistent" {
        let global = super::mount::global_mount_path(root, &driver_name, &handle);
        let staged = global
            .parent()
            .is_some_and(|p| p.join("vol_data.json").exists());
        if staged {
            global.display().to_string()
        } else {
            String::new()
        }
    } else {
        String::new()
    };
    let target = p.dir.join("mount").display().to_string();
    let answer = async {
        let mut client = NodeClient::connect(&registered.endpoint).await?;
        if !client.supports_stats().await? {
            return Ok(None);
        }
        client
            .volume_stats(&handle, &target, &staging)
            .await
            .map(Some)
    }
    .await;
    match answer {
        Ok(usage) => usage.map(|u| figures(&u)),
        Err(e) => {
            tracing::debug!(driver = %driver_name, volume = %target, error = %e, "CSI volume stats not had");
            None
        }
    }
}

/// Measures every published CSI volume once and keeps the answers; volumes that are gone are
/// forgotten.
pub(crate) async fn refresh(root: &Path) {
    let root_owned = root.to_path_buf();
    let found = tokio::task::spawn_blocking(move || published(&root_owned))
        .await
        .unwrap_or_default();
    let mut fresh = BTreeMap::new();
    for p in &found {
        let Some(figures) = measure(root, p).await else {
            continue;
        };
        let get = |k: &str| p.data.get(k).cloned().unwrap_or_default();
        let claim = Some(get(CLAIM_KEY)).filter(|c| !c.is_empty());
        // An inline volume's `specVolID` is the pod's volume name; a claim's is the PV's.
        let volume = Some(get(POD_VOLUME_KEY))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| get("specVolID"));
        let at_ns = crate::base::clock::timestamp().as_nanosecond() as i64;
        fresh.insert(
            p.dir.clone(),
            Measured {
                pod_uid: p.pod_uid.clone(),
                volume,
                namespace: get(NAMESPACE_KEY),
                claim,
                figures,
                at_ns,
            },
        );
    }
    *KEPT.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
}

/// Measures again every `period` until `cancel` (a zero period turns the measuring off, as
/// it turns off the walks of the other volumes).
pub(crate) async fn run(root: PathBuf, period: Duration, cancel: CancellationToken) {
    if period.is_zero() {
        return;
    }
    loop {
        refresh(&root).await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// One gauge of upstream's volume stats collector: name, help, and which figure.
type Gauge = (&'static str, &'static str, fn(&Figures) -> Option<u64>);

const GAUGES: [Gauge; 6] = [
    (
        "kubelet_volume_stats_available_bytes",
        "Number of available bytes in the volume",
        |f| f.available_bytes,
    ),
    (
        "kubelet_volume_stats_capacity_bytes",
        "Capacity in bytes of the volume",
        |f| f.capacity_bytes,
    ),
    (
        "kubelet_volume_stats_inodes",
        "Maximum number of inodes in the volume",
        |f| f.inodes,
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "Number of free inodes in the volume",
        |f| f.inodes_free,
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "Number of used inodes in the volume",
        |f| f.inodes_used,
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "Number of used bytes in the volume",
        |f| f.used_bytes,
    ),
];

/// Upstream's `kubelet_volume_stats_*` gauges of the claims among `kept` (pure): one series
/// per namespace and claim (the first pod's figures when several pods use one claim, as
/// upstream's collector keeps the first), a figure the driver did not give left out.
pub(crate) fn render_metrics(kept: &[Measured]) -> String {
    let mut claims: BTreeMap<(&str, &str), &Figures> = BTreeMap::new();
    for m in kept {
        if let Some(claim) = &m.claim {
            claims
                .entry((m.namespace.as_str(), claim.as_str()))
                .or_insert(&m.figures);
        }
    }
    let mut out = String::new();
    for (name, help, pick) in GAUGES {
        let series: Vec<String> = claims
            .iter()
            .filter_map(|((ns, claim), f)| {
                let v = pick(f)?;
                Some(format!(
                    "{name}{{namespace=\"{}\",persistentvolumeclaim=\"{}\"}} {v}\n",
                    escape(ns),
                    escape(claim)
                ))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "# HELP {name} [ALPHA] {help}\n# TYPE {name} gauge\n"
        ));
        out.extend(series);
    }
    out
}

/// The metrics of what is kept now.
pub(crate) fn metrics() -> String {
    let kept: Vec<Measured> = KEPT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    render_metrics(&kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_answer_is_read_as_upstream_reads_it() {
        let usage = |unit: Unit, total, available, used| VolumeUsage {
            available,
            total,
            used,
            unit: unit as i32,
        };
        assert_eq!(figures(&[]), Figures::default());
        assert_eq!(
            figures(&[
                usage(Unit::Bytes, 100, 60, 40),
                usage(Unit::Inodes, 10, 7, 3)
            ]),
            Figures {
                capacity_bytes: Some(100),
                available_bytes: Some(60),
                used_bytes: Some(40),
                inodes: Some(10),
                inodes_free: Some(7),
                inodes_used: Some(3),
            }
        );
        // The mock driver gives only the total bytes: the rest is 0, the inodes untold.
        let only_total = figures(&[usage(Unit::Bytes, 5, 0, 0)]);
        assert_eq!(only_total.capacity_bytes, Some(5));
        assert_eq!(only_total.inodes, None);
    }

    #[test]
    fn claims_are_rendered_once_each_as_upstreams_collector() {
        let m = |uid: &str, claim: Option<&str>, cap: u64| Measured {
            pod_uid: uid.into(),
            volume: "data".into(),
            namespace: "ns".into(),
            claim: claim.map(Into::into),
            figures: Figures {
                capacity_bytes: Some(cap),
                used_bytes: Some(1),
                ..Default::default()
            },
            at_ns: 0,
        };
        let text = render_metrics(&[
            m("u1", Some("c"), 10),
            m("u2", Some("c"), 20),
            m("u3", None, 30),
        ]);
        assert_eq!(
            text,
            "# HELP kubelet_volume_stats_capacity_bytes [ALPHA] Capacity in bytes of the volume\n\
             # TYPE kubelet_volume_stats_capacity_bytes gauge\n\
             kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"c\"} 10\n\
             # HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume\n\
             # TYPE kubelet_volume_stats_used_bytes gauge\n\
             kubelet_volume_stats_used_bytes{namespace=\"ns\",persistentvolumeclaim=\"c\"} 1\n"
        );
        assert_eq!(render_metrics(&[m("u3", None, 30)]), "");
    }
}
