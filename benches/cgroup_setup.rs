//! Cgroup setup benchmark: what making and removing a pod's cgroup costs on this machine's
//! real cgroup filesystem (upstream's kubelet does the same work before every sandbox).
//!
//! Run as root, with no runtime needed: `cargo bench --bench cgroup_setup` (release), or
//! `cargo test --bench cgroup_setup` for a quick debug-build figure. Works under a private
//! cgroup root (`/deckhand-bench-cg-<pid>`) that it creates in every hierarchy and removes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deckhand::kubelet::cm::{
    CfsSettings, CgroupManager, HostCgroupFs, ManagerSettings, ResourceConfig,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const MOUNT: &str = "/sys/fs/cgroup";
const PODS: usize = 60;

fn pod(i: usize) -> Pod {
    let q = |pairs: &[(&str, &str)]| {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        })
    };
    // A third each of Guaranteed, Burstable and BestEffort pods.
    type List<'a> = &'a [(&'a str, &'a str)];
    let (requests, limits): (List, List) = match i % 3 {
        0 => (&[], &[("cpu", "100m"), ("memory", "32Mi")]),
        1 => (&[("cpu", "50m")], &[("memory", "64Mi")]),
        _ => (&[], &[]),
    };
    Pod {
        metadata: ObjectMeta {
            uid: Some(format!("bench-{i}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                resources: Some(ResourceRequirements {
                    requests: q(requests),
                    limits: q(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn summary(what: &str, mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    format!(
        "{what:<28} n={:<3} median {:>6.2} ms  p95 {:>6.2} ms  max {:>6.2} ms",
        samples.len(),
        ms(pick(0.5)),
        ms(pick(0.95)),
        ms(*samples.last().unwrap())
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let root = format!("deckhand-bench-cg-{}", std::process::id());
    let hierarchies: Vec<String> = ["cpu", "cpuacct", "cpuset", "memory", "pids", "systemd"]
        .iter()
        .filter(|h| Path::new(MOUNT).join(h).is_dir())
        .map(|h| h.to_string())
        .collect();
    let v2 = Path::new(MOUNT).join("cgroup.controllers").exists();
    let dirs: Vec<std::path::PathBuf> = if v2 {
        vec![Path::new(MOUNT).join(&root)]
    } else {
        hierarchies
            .iter()
            .map(|h| Path::new(MOUNT).join(h).join(&root))
            .collect()
    };
    for d in &dirs {
        std::fs::create_dir_all(d).expect("create the bench cgroup root (run as root)");
    }
    let manager = CgroupManager::new(
        Arc::new(HostCgroupFs::new(MOUNT)),
        vec![],
        ManagerSettings {
            cgroup_root: format!("/{root}"),
            cfs: CfsSettings::default(),
            pod_pids_limit: 1024,
            memory_reserve_percent: None,
            allocatable_memory: 1 << 30,
        },
    )
    .expect("a cgroup manager");
    let started = Instant::now();
    manager
        .start(&ResourceConfig {
            cpu_shares: Some(2048),
            memory: Some(8 << 30),
            ..Default::default()
        })
        .expect("kubepods and the QoS cgroups");
    let start_took = started.elapsed();

    let mut ensure = Vec::new();
    let mut again = Vec::new();
    let mut destroy = Vec::new();
    for i in 0..PODS {
        let p = pod(i);
        let t = Instant::now();
        manager.ensure_pod(&p).expect("the pod cgroup");
        ensure.push(t.elapsed());
        let t = Instant::now();
        manager.ensure_pod(&p).expect("the pod cgroup, again");
        again.push(t.elapsed());
    }
    for i in 0..PODS {
        let t = Instant::now();
        let problems = manager.destroy_pod(&format!("bench-{i}"));
        destroy.push(t.elapsed());
        assert!(problems.is_empty(), "{problems:?}");
    }
    for d in &dirs {
        remove_tree(d);
    }
    println!(
        "cgroup v{} ({} hierarchies), {PODS} pods",
        if v2 { 2 } else { 1 },
        if v2 { 1 } else { hierarchies.len() }
    );
    println!(
        "{:<28} {:.2} ms",
        "start (kubepods + QoS)",
        start_took.as_secs_f64() * 1000.0
    );
    println!("{}", summary("ensure_pod (create)", ensure));
    println!("{}", summary("ensure_pod (exists)", again));
    println!("{}", summary("destroy_pod", destroy));
}
