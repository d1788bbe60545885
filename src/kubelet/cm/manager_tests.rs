//! The manager on directory fixtures laid out like the cgroup mounts of each version: the
//! files and contents it leaves are the ones upstream's kubelet (through runc's library)
//! writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::kubelet::cm::fixture::Fixture;
use crate::kubelet::cm::fs::HostCgroupFs;

fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Q>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Q(v.to_string())))
            .collect()
    })
}

fn pod(uid: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                resources: Some(ResourceRequirements {
                    requests: list(requests),
                    limits: list(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

const GUARANTEED: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];

fn settings(root: &str) -> ManagerSettings {
    ManagerSettings {
        cgroup_root: root.into(),
        cfs: CfsSettings::default(),
        pod_pids_limit: 1024,
        memory_reserve_percent: None,
        allocatable_memory: 1 << 30,
    }
}

fn kubepods_config() -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(2048),
        memory: Some(8 << 30),
        pids_limit: Some(32768),
        ..Default::default()
    }
}

fn read(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path)).ok()
}

/// Asserts each `(path, contents)`; `None` means the file must not have been written.
fn expect(root: &Path, rows: &[(&str, Option<&str>)]) {
    for (path, want) in rows {
        assert_eq!(read(root, path).as_deref(), *want, "{path}");
    }
}

fn v1_fixture(with_hugetlb: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut hierarchies = vec![
        "cpu", "cpuacct", "cpuset", "memory", "pids", "systemd", "devices", "freezer",
    ];
    if with_hugetlb {
        hierarchies.push("hugetlb");
    }
    for h in hierarchies {
        std::fs::create_dir_all(dir.path().join(h)).unwrap();
        std::fs::write(dir.path().join(h).join("cgroup.procs"), "").unwrap();
    }

    std::fs::write(dir.path().join("cpuset/cpuset.cpus"), "0-1\n").unwrap();
    std::fs::write(dir.path().join("cpuset/cpuset.mems"), "0\n").unwrap();
    dir
}

fn manager(dir: &Path, root: &str, page_sizes: Vec<u64>) -> CgroupManager {
    CgroupManager::new(
        Arc::new(Fixture(HostCgroupFs::new(dir))),
        page_sizes,
        settings(root),
    )
    .unwrap()
}

#[test]
fn v1_tree_and_pod_files_hold_upstreams_values() {
    let dir = v1_fixture(false);
    let root = dir.path();
    let m = manager(root, "/", vec![]);
    assert_eq!(m.version(), CgroupVersion::V1);
    m.start(&kubepods_config()).unwrap();
    expect(
        root,
        &[
            ("memory/kubepods/memory.limit_in_bytes", Some("8589934592")),
            ("cpu/kubepods/cpu.shares", Some("2048")),
            ("pids/kubepods/pids.max", Some("32768")),
            ("cpu/kubepods/besteffort/cpu.shares", Some("2")),
            ("cpu/kubepods/burstable/cpu.shares", Some("2")),
            ("memory/kubepods/burstable/memory.limit_in_bytes", None),
            // New cpuset levels inherit the parent's CPUs and memory nodes.
            ("cpuset/kubepods/burstable/cpuset.cpus", Some("0-1")),
            ("cpuset/kubepods/burstable/cpuset.mems", Some("0")),
        ],
    );
    assert!(root.join("systemd/kubepods/besteffort").is_dir());
    // devices and freezer are left to runc.
    assert!(!root.join("devices/kubepods").exists());

    // (pod, uid, directory under each hierarchy, expected files)
    type Row<'a> = (Pod, &'a str, Vec<(&'a str, Option<&'a str>)>);
    let rows: Vec<Row> = vec![
        (
            pod("g-1", GUARANTEED, GUARANTEED),
            "kubepods/podg-1",
            vec![
                ("cpu.shares", Some("512")),
                ("cpu.cfs_period_us", Some("100000")),
                ("cpu.cfs_quota_us", Some("50000")),
                ("memory.limit_in_bytes", Some("67108864")),
                ("pids.max", Some("1024")),
            ],
        ),
        (
            pod("b-1", &[("cpu", "100m"), ("memory", "32Mi")], GUARANTEED),
            "kubepods/burstable/podb-1",
            vec![
                ("cpu.shares", Some("102")),
                ("cpu.cfs_period_us", Some("100000")),
                ("cpu.cfs_quota_us", Some("50000")),
                ("memory.limit_in_bytes", Some("67108864")),
                ("pids.max", Some("1024")),
            ],
        ),
        (
            pod("b-2", &[("cpu", "250m")], &[]),
            "kubepods/burstable/podb-2",
            vec![
                ("cpu.shares", Some("256")),
                ("cpu.cfs_period_us", None),
                ("cpu.cfs_quota_us", None),
                ("memory.limit_in_bytes", None),
                ("pids.max", Some("1024")),
            ],
        ),
        (
            pod("e-1", &[], &[]),
            "kubepods/besteffort/pode-1",
            vec![
                ("cpu.shares", Some("2")),
                ("cpu.cfs_quota_us", None),
                ("memory.limit_in_bytes", None),
                ("pids.max", Some("1024")),
            ],
        ),
    ];
    for (p, at, files) in &rows {
        assert_eq!(m.ensure_pod(p).unwrap(), Ensured::Created, "{at}");
        for (file, want) in files {
            let h = match *file {
                f if f.starts_with("cpu.") => "cpu",
                f if f.starts_with("memory.") => "memory",
                _ => "pids",
            };
            assert_eq!(
                read(root, &format!("{h}/{at}/{file}")).as_deref(),
                *want,
                "{h}/{at}/{file}"
            );
        }
        for h in ["cpu", "cpuacct", "cpuset", "memory", "pids", "systemd"] {
            assert!(root.join(h).join(at).is_dir(), "{h}/{at}");
        }
    }
    // The burstable tier has the shares of both burstable pods (100m + 250m).
    expect(root, &[("cpu/kubepods/burstable/cpu.shares", Some("358"))]);
    // A second ensure leaves the cgroup alone.
    assert_eq!(m.ensure_pod(&rows[0].0).unwrap(), Ensured::Existed);

    // A pod that finished no longer counts; a removed one is gone from every hierarchy.
    m.pod_stopped("b-2");
    expect(root, &[("cpu/kubepods/burstable/cpu.shares", Some("102"))]);
    std::fs::create_dir_all(root.join("devices/kubepods/burstable/podb-1/ctr")).unwrap();
    let problems = m.destroy_pod("b-1");
    assert!(problems.is_empty(), "{problems:?}");
    expect(root, &[("cpu/kubepods/burstable/cpu.shares", Some("2"))]);
    for h in ["cpu", "memory", "pids", "devices", "cpuset"] {
        assert!(
            !root.join(h).join("kubepods/burstable/podb-1").exists(),
            "{h}"
        );
        assert!(root.join(h).join("kubepods/burstable").exists() || h == "devices");
    }
    assert!(m.destroy_pod("g-1").is_empty());
    assert!(!root.join("cpu/kubepods/podg-1").exists());
    assert!(root.join("cpu/kubepods/besteffort").exists());
}

#[test]
fn v1_hugetlb_and_cfs_settings() {
    let dir = v1_fixture(true);
    let root = dir.path();
    let mut s = settings("/");
    s.cfs = CfsSettings {
        enforce_cpu_limits: false,
        period_us: 50_000,
    };
    s.pod_pids_limit = -1;
    let m = CgroupManager::new(
        Arc::new(Fixture(HostCgroupFs::new(root))),
        vec![2 << 20, 1 << 30],
        s,
    )
    .unwrap();
    m.start(&kubepods_config()).unwrap();
    let mut limits = GUARANTEED.to_vec();
    limits.push(("hugepages-2Mi", "4Mi"));
    m.ensure_pod(&pod("h-1", &limits, &limits)).unwrap();
    expect(
        root,
        &[
            ("cpu/kubepods/podh-1/cpu.cfs_quota_us", Some("-1")),
            ("cpu/kubepods/podh-1/cpu.cfs_period_us", Some("50000")),
            ("pids/kubepods/podh-1/pids.max", None),
            (
                "hugetlb/kubepods/podh-1/hugetlb.2MB.limit_in_bytes",
                Some("4194304"),
            ),
            (
                "hugetlb/kubepods/podh-1/hugetlb.1GB.limit_in_bytes",
                Some("0"),
            ),
            // The reserved-page file is only written where the kernel has it.
            (
                "hugetlb/kubepods/podh-1/hugetlb.2MB.rsvd.limit_in_bytes",
                None,
            ),
            // The tiers leave huge pages unbounded.
            (
                "hugetlb/kubepods/burstable/hugetlb.2MB.limit_in_bytes",
                Some("4611686018427387904"),
            ),
        ],
    );
}

#[test]
fn a_plain_directory_named_like_a_hierarchy_is_not_one() {
    // `/sys/fs/cgroup` is a tmpfs: `mkdir /sys/fs/cgroup/hugetlb` on a machine that does not
    // mount hugetlb makes a directory that is no cgroup. Nothing is written there.
    let dir = v1_fixture(false);
    let root = dir.path();
    std::fs::create_dir_all(root.join("hugetlb")).unwrap();
    let m = CgroupManager::new(
        Arc::new(Fixture(HostCgroupFs::new(root))),
        vec![2 << 20],
        settings("/"),
    )
    .unwrap();
    m.start(&kubepods_config()).unwrap();
    let mut limits = GUARANTEED.to_vec();
    limits.push(("hugepages-2Mi", "4Mi"));
    m.ensure_pod(&pod("h-2", &limits, &limits)).unwrap();
    assert!(root.join("cpu/kubepods/podh-2").is_dir());
    assert!(!root.join("hugetlb/kubepods").exists());
}

#[test]
fn a_missing_cgroup_root_stops_the_start() {
    let dir = v1_fixture(false);
    let m = manager(dir.path(), "/deckhand-missing", vec![]);
    let err = m.start(&kubepods_config()).unwrap_err().to_string();
    assert!(
        err.contains("cgroupRoot \"/deckhand-missing\" does not exist"),
        "{err}"
    );
    // Made in every hierarchy, it works, and the tree goes below it.
    for h in ["cpu", "cpuacct", "cpuset", "memory", "pids", "systemd"] {
        std::fs::create_dir_all(dir.path().join(h).join("deckhand-missing")).unwrap();
    }
    m.start(&kubepods_config()).unwrap();
    assert_eq!(
        read(
            dir.path(),
            "cpu/deckhand-missing/kubepods/besteffort/cpu.shares"
        )
        .as_deref(),
        Some("2")
    );
    assert_eq!(
        m.pod_cgroup(QosClass::Burstable, "u"),
        "/deckhand-missing/kubepods/burstable/podu"
    );
}

fn v2_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    )
    .unwrap();
    dir
}

#[test]
fn v2_tree_and_pod_files_hold_upstreams_values() {
    let dir = v2_fixture();
    let root = dir.path();
    let m = manager(root, "/", vec![2 << 20]);
    assert_eq!(m.version(), CgroupVersion::V2);
    m.start(&kubepods_config()).unwrap();
    let enable = "+cpu +cpuset +memory +pids +hugetlb";
    expect(
        root,
        &[
            ("cgroup.subtree_control", Some(enable)),
            ("kubepods/cgroup.subtree_control", Some(enable)),
            ("kubepods/memory.max", Some("8589934592")),
            ("kubepods/cpu.weight", Some("79")),
            ("kubepods/pids.max", Some("32768")),
            ("kubepods/memory.min", Some("0")),
            ("kubepods/memory.low", Some("0")),
            ("kubepods/besteffort/cpu.weight", Some("1")),
            ("kubepods/burstable/cpu.weight", Some("1")),
            ("kubepods/burstable/memory.low", Some("0")),
            (
                "kubepods/burstable/hugetlb.2MB.max",
                Some("4611686018427387904"),
            ),
        ],
    );
    type Row<'a> = (Pod, &'a str, Vec<(&'a str, Option<&'a str>)>);
    let rows: Vec<Row> = vec![
        (
            pod("g-1", GUARANTEED, GUARANTEED),
            "kubepods/podg-1",
            vec![
                ("cpu.weight", Some("20")),
                ("cpu.max", Some("50000 100000")),
                ("memory.max", Some("67108864")),
                ("pids.max", Some("1024")),
                ("hugetlb.2MB.max", Some("0")),
                ("memory.min", None),
                ("memory.high", None),
            ],
        ),
        (
            pod("b-1", &[("cpu", "100m"), ("memory", "32Mi")], GUARANTEED),
            "kubepods/burstable/podb-1",
            vec![
                ("cpu.weight", Some("4")),
                ("cpu.max", Some("50000 100000")),
                ("memory.max", Some("67108864")),
            ],
        ),
        (
            pod("b-2", &[("cpu", "250m")], &[]),
            "kubepods/burstable/podb-2",
            vec![
                ("cpu.weight", Some("10")),
                ("cpu.max", None),
                ("memory.max", None),
            ],
        ),
        (
            pod("e-1", &[], &[]),
            "kubepods/besteffort/pode-1",
            vec![
                ("cpu.weight", Some("1")),
                ("cpu.max", None),
                ("memory.max", None),
            ],
        ),
    ];
    for (p, at, files) in &rows {
        m.ensure_pod(p).unwrap();
        for (file, want) in files {
            assert_eq!(
                read(root, &format!("{at}/{file}")).as_deref(),
                *want,
                "{at}/{file}"
            );
        }
    }
    // The burstable tier: 100m + 250m → 358 shares → weight 14.
    expect(
        root,
        &[
            ("kubepods/burstable/cpu.weight", Some("14")),
            ("kubepods/burstable/cgroup.subtree_control", Some(enable)),
        ],
    );
    assert!(m.destroy_pod("b-2").is_empty());
    assert!(!root.join("kubepods/burstable/podb-2").exists());
    expect(root, &[("kubepods/burstable/cpu.weight", Some("4"))]);
}

#[test]
fn v2_without_cfs_quota_writes_max() {
    let dir = v2_fixture();
    let mut s = settings("/");
    s.cfs.enforce_cpu_limits = false;
    let m =
        CgroupManager::new(Arc::new(Fixture(HostCgroupFs::new(dir.path()))), vec![], s).unwrap();
    m.start(&kubepods_config()).unwrap();
    m.ensure_pod(&pod("g-2", GUARANTEED, GUARANTEED)).unwrap();
    assert_eq!(
        read(dir.path(), "kubepods/podg-2/cpu.max").as_deref(),
        Some("max 100000")
    );
}

/// Refuses every write of one file name, as the kernel refuses a limit below the usage.
#[derive(Debug)]
struct Refusing(Fixture, &'static str);

impl CgroupFs for Refusing {
    fn is_dir(&self, dir: &Path) -> bool {
        self.0.is_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.0.create_dir_all(dir)
    }
    fn write(&self, dir: &Path, file: &str, value: &str) -> io::Result<()> {
        if file == self.1 {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        self.0.write(dir, file, value)
    }
    fn read(&self, dir: &Path, file: &str) -> io::Result<String> {
        self.0.read(dir, file)
    }
    fn exists(&self, dir: &Path, file: &str) -> bool {
        self.0.exists(dir, file)
    }
    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        self.0.remove_dir(dir)
    }
    fn subdirs(&self, dir: &Path) -> Vec<String> {
        self.0.subdirs(dir)
    }
}

#[test]
fn a_refused_setting_is_logged_and_the_cgroups_are_still_made() {
    let dir = v1_fixture(false);
    let root = dir.path();
    let m = CgroupManager::new(
        Arc::new(Refusing(Fixture(HostCgroupFs::new(root)), "pids.max")),
        vec![],
        settings("/"),
    )
    .unwrap();
    m.start(&kubepods_config()).unwrap();
    assert_eq!(
        m.ensure_pod(&pod("g-1", GUARANTEED, GUARANTEED)).unwrap(),
        Ensured::Created
    );
    // As runc's library: the writes before the refused one are in, the rest of that cgroup's
    // are not; the cgroups exist and the start and the pod go on.
    expect(
        root,
        &[
            ("memory/kubepods/memory.limit_in_bytes", Some("8589934592")),
            ("cpu/kubepods/cpu.shares", Some("2048")),
            ("pids/kubepods/pids.max", None),
            ("cpu/kubepods/podg-1/cpu.shares", Some("512")),
            (
                "memory/kubepods/podg-1/memory.limit_in_bytes",
                Some("67108864"),
            ),
        ],
    );
    assert!(root.join("pids/kubepods/podg-1").is_dir());
    // Direct writes still report the refusal.
    let err = m
        .apply("/kubepods", &kubepods_config())
        .unwrap_err()
        .to_string();
    assert!(err.contains("pids/kubepods/pids.max"), "{err}");
}

#[test]
fn a_pods_process_count_is_read_from_its_tier() {
    let dir = v1_fixture(false);
    let root = dir.path();
    let m = manager(root, "/", vec![]);
    m.start(&kubepods_config()).unwrap();
    for (path, n) in [
        ("pids/kubepods/burstable/podb1", "7\n"),
        ("pids/kubepods/podg1", "3\n"),
    ] {
        std::fs::create_dir_all(root.join(path)).unwrap();
        std::fs::write(root.join(path).join("pids.current"), n).unwrap();
    }
    assert_eq!(m.pod_process_count("b1"), Some(7));
    assert_eq!(m.pod_process_count("g1"), Some(3));
    assert_eq!(m.pod_process_count("gone"), None);
    assert_eq!(m.pod_process_count("../b1"), None);
}

#[test]
fn the_orphan_sweep_removes_only_cgroups_no_pod_owns() {
    use crate::kubelet::cm::orphans::{SweepInputs, sweep_once};
    let dir = v1_fixture(false);
    let root = dir.path();
    let m = manager(root, "/", vec![]);
    m.start(&kubepods_config()).unwrap();
    // A live pod, an orphan (only in the devices hierarchy, as runc leaves them), an orphan
    // whose volumes are still on disk, a pod this agent never ran (another agent's on the same
    // cgroup root), and the QoS tiers themselves (never pods).
    for path in [
        "memory/kubepods/burstable/podlive",
        "cpu/kubepods/burstable/podlive",
        "devices/kubepods/besteffort/podgone",
        "memory/kubepods/podvols",
        "memory/kubepods/burstable/podother",
    ] {
        std::fs::create_dir_all(root.join(path)).unwrap();
    }
    let found: Vec<String> = m.pod_cgroup_uids().into_iter().collect();
    assert_eq!(found, ["gone", "live", "other", "vols"]);
    let inputs = SweepInputs {
        ready: Arc::new(|| true),
        ours: Arc::new(|uid| uid != "other"),
        known: Arc::new(|uid| uid == "live"),
        volumes_left: Arc::new(|uid| uid == "vols"),
    };
    assert_eq!(sweep_once(&m, &inputs), ["gone"]);
    assert!(!root.join("devices/kubepods/besteffort/podgone").exists());
    assert!(root.join("memory/kubepods/burstable/podlive").exists());
    assert!(root.join("memory/kubepods/podvols").exists());
    assert!(
        root.join("memory/kubepods/burstable/podother").exists(),
        "another agent's pod is left alone"
    );
    assert!(root.join("memory/kubepods/besteffort").exists());
}
