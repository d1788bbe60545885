use super::mounter::fake::{FakeMounter, MountCall, Op};
use super::mounter::{KernelMounter, require_root};
use super::*;
use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, DownwardAPIVolumeSource,
    EmptyDirVolumeSource, HostPathVolumeSource, ObjectFieldSelector, PodSpec,
    ProjectedVolumeSource, ResourceFieldSelector, SecurityContext, ServiceAccountTokenProjection,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

fn pod(uid: &str, volumes: Vec<Volume>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web-n1".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            annotations: Some(BTreeMap::from([("a".to_string(), "x\ny".to_string())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str, medium: Option<&str>, size: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_string),
            size_limit: size.map(|s| Quantity(s.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &Path, kind: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_string_lossy().into_owned(),
            type_: kind.map(str::to_string),
        }),
        ..Default::default()
    }
}

fn field_item(path: &str, field: &str) -> DownwardAPIVolumeFile {
    DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            api_version: None,
            field_path: field.into(),
        }),
        ..Default::default()
    }
}

fn downward(name: &str, items: Vec<DownwardAPIVolumeFile>) -> Volume {
    Volume {
        name: name.into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(items),
            default_mode: None,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A manager on `mounter`, with 1 GiB of node memory.
fn manager_on(root: &Path, mounter: Arc<dyn Mounter>) -> VolumeManager {
    VolumeManager::new(
        root.to_path_buf(),
        1 << 30,
        NodeAllocatable {
            cpu_millis: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 10 << 30,
        },
        mounter,
    )
}

/// A manager on a recording fake mounter, and the fake.
fn manager_with_fake(root: &Path) -> (VolumeManager, Arc<FakeMounter>) {
    let fake = Arc::new(FakeMounter::default());
    (manager_on(root, fake.clone()), fake)
}

fn manager(root: &Path) -> VolumeManager {
    manager_with_fake(root).0
}

fn tmpfs(target: &Path, size_bytes: u64) -> MountCall {
    MountCall::Tmpfs {
        target: target.to_path_buf(),
        size_bytes: Some(size_bytes),
    }
}

fn unmount(target: &Path, detach: bool) -> MountCall {
    MountCall::Unmount {
        target: target.to_path_buf(),
        detach,
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

#[test]
fn layout_follows_upstream() {
    let m = manager(Path::new("/var/lib/deckhand"));
    assert_eq!(
        m.volume_dir("u1", EMPTY_DIR_PLUGIN, "cache"),
        Path::new("/var/lib/deckhand/pods/u1/volumes/kubernetes.io~empty-dir/cache")
    );
    assert_eq!(
        m.volume_dir("u1", DOWNWARD_API_PLUGIN, "info"),
        Path::new("/var/lib/deckhand/pods/u1/volumes/kubernetes.io~downward-api/info")
    );
    assert_eq!(
        m.volume_dir("u1", PROJECTED_PLUGIN, "p"),
        Path::new("/var/lib/deckhand/pods/u1/volumes/kubernetes.io~projected/p")
    );
}

#[test]
fn setup_creates_volumes_idempotently() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let host_dir = tmp.path().join("host/data");
    let m = manager(&root);
    let p = pod(
        "u1",
        vec![
            empty_dir("cache", None, None),
            host_path("data", &host_dir, Some("DirectoryOrCreate")),
            downward(
                "info",
                vec![
                    field_item("labels", "metadata.labels"),
                    field_item("annotations", "metadata.annotations"),
                    field_item("meta/name", "metadata.name"),
                ],
            ),
        ],
    );
    let vols = m.setup(&p).unwrap();
    let cache = root.join("pods/u1/volumes/kubernetes.io~empty-dir/cache");
    assert_eq!(vols.paths["cache"], cache);
    assert_eq!(
        std::fs::metadata(&cache).unwrap().permissions().mode() & 0o7777,
        0o777
    );
    assert_eq!(vols.paths["data"], host_dir);
    assert!(host_dir.is_dir());
    assert!(
        !root
            .join("pods/u1/volumes/kubernetes.io~host-path")
            .exists()
    );
    let info = root.join("pods/u1/volumes/kubernetes.io~downward-api/info");
    assert_eq!(
        std::fs::read_to_string(info.join("labels")).unwrap(),
        "app=\"web\""
    );
    assert_eq!(
        std::fs::read_to_string(info.join("annotations")).unwrap(),
        "a=\"x\\ny\""
    );
    assert_eq!(
        std::fs::read_to_string(info.join("meta/name")).unwrap(),
        "web-n1"
    );
    assert!(vols.read_only.contains("info") && !vols.read_only.contains("cache"));

    std::fs::write(cache.join("kept"), b"1").unwrap();
    let data_link = std::fs::read_link(info.join("..data")).unwrap();
    m.setup(&p).unwrap();
    assert!(
        cache.join("kept").exists(),
        "a second setup keeps the content"
    );
    assert_eq!(std::fs::read_link(info.join("..data")).unwrap(), data_link);

    // refresh rewrites when the pod's labels change.
    let mut changed = p.clone();
    changed
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "front".into());
    m.refresh(&changed).unwrap();
    assert_eq!(
        std::fs::read_to_string(info.join("labels")).unwrap(),
        "app=\"web\"\ntier=\"front\""
    );
    assert_ne!(std::fs::read_link(info.join("..data")).unwrap(), data_link);

    m.teardown("u1").unwrap();
    assert!(!root.join("pods/u1/volumes").exists());
    assert!(host_dir.is_dir(), "a hostPath is never deleted");
    // A second teardown is a no-op.
    m.teardown("u1").unwrap();
}

#[test]
fn setup_errors_use_upstream_wording() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let missing = tmp.path().join("nope.txt");
    let err = m
        .setup(&pod("u2", vec![host_path("cfg", &missing, Some("File"))]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "MountVolume.SetUp failed for volume \"cfg\" : hostPath type check failed: {} is not a file",
            missing.display()
        )
    );

    let projected = |source: VolumeProjection| Volume {
        name: "p".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![source]),
            default_mode: None,
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = projected(VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            path: "token".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = m.setup(&pod("u2", vec![token])).unwrap_err().to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"p\" : projected source serviceAccountToken is not supported without an apiserver"
    );
    let cm = |optional| {
        projected(VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: "settings".into(),
                optional,
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    assert!(
        m.setup(&pod("u2", vec![cm(None)]))
            .unwrap_err()
            .to_string()
            .contains(
                "projected source configMap \"settings\" is not supported without an apiserver"
            )
    );
    assert!(m.setup(&pod("u2", vec![cm(Some(true))])).is_ok());

    let bad_field = downward("d", vec![field_item("x", "spec.nodeName")]);
    assert_eq!(
        m.setup(&pod("u2", vec![bad_field]))
            .unwrap_err()
            .to_string(),
        "MountVolume.SetUp failed for volume \"d\" : unsupported fieldPath: spec.nodeName"
    );

    let nfs = Volume {
        name: "n".into(),
        nfs: Some(Default::default()),
        ..Default::default()
    };
    assert_eq!(
        m.setup(&pod("u2", vec![nfs])).unwrap_err().to_string(),
        "MountVolume.SetUp failed for volume \"n\" : volume type nfs is not supported on this node"
    );
    let bad_name = empty_dir("../escape", None, None);
    assert!(m.setup(&pod("u2", vec![bad_name])).is_err());
    m.teardown("u2").unwrap();
}

#[test]
fn projected_downward_sources_with_modes_and_resources() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let mut p = pod(
        "u3",
        vec![Volume {
            name: "p".into(),
            projected: Some(ProjectedVolumeSource {
                default_user: None,
                default_mode: Some(0o440),
                sources: Some(vec![VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![
                            field_item("name", "metadata.name"),
                            DownwardAPIVolumeFile {
                                path: "mem".into(),
                                resource_field_ref: Some(ResourceFieldSelector {
                                    container_name: Some("app".into()),
                                    resource: "limits.memory".into(),
                                    divisor: Some(Quantity("1Mi".into())),
                                }),
                                mode: Some(0o600),
                                ..Default::default()
                            },
                        ]),
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        }],
    );
    p.spec.as_mut().unwrap().containers[0].resources =
        Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("64Mi".into()),
            )])),
            ..Default::default()
        });
    let vols = m.setup(&p).unwrap();
    let dir = &vols.paths["p"];
    assert!(dir.ends_with("kubernetes.io~projected/p"));
    assert_eq!(std::fs::read_to_string(dir.join("mem")).unwrap(), "64");
    let mode = |f: &str| std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("name"), 0o440);
    assert_eq!(mode("mem"), 0o600);
    m.teardown("u3").unwrap();
}

#[test]
fn container_mounts_map_volume_mounts() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    let host = tmp.path().join("logs");
    let p = pod(
        "u4",
        vec![
            empty_dir("cache", None, None),
            host_path("logs", &host, Some("DirectoryOrCreate")),
            downward("info", vec![field_item("labels", "metadata.labels")]),
        ],
    );
    let vols = m.setup(&p).unwrap();
    let env = HashMap::from([("POD".to_string(), "web-n1".to_string())]);
    let mut c = Container {
        name: "app".into(),
        volume_mounts: Some(vec![
            mount("cache", "/cache"),
            VolumeMount {
                read_only: Some(true),
                mount_propagation: Some("HostToContainer".into()),
                ..mount("logs", "/logs")
            },
            VolumeMount {
                sub_path_expr: Some("pods/$(POD)".into()),
                ..mount("logs", "/mine")
            },
            VolumeMount {
                sub_path: Some("labels".into()),
                ..mount("info", "/etc/labels")
            },
            mount("cache", "relative"),
        ]),
        ..Default::default()
    };
    let mounts = m
        .container_mounts(&p, &c, &vols, &env, &HashMap::new())
        .unwrap();
    let info = vols.paths["info"].canonicalize().unwrap();
    let subpaths = tmp
        .path()
        .canonicalize()
        .unwrap()
        .join("root/pods/u4/volume-subpaths");
    let want = [
        (
            "/cache",
            vols.paths["cache"].clone(),
            false,
            MountPropagation::PropagationPrivate,
        ),
        (
            "/logs",
            host.clone(),
            true,
            MountPropagation::PropagationHostToContainer,
        ),
        (
            "/mine",
            subpaths.join("logs/app/2"),
            false,
            MountPropagation::PropagationPrivate,
        ),
        (
            "/etc/labels",
            subpaths.join("info/app/3"),
            true,
            MountPropagation::PropagationPrivate,
        ),
        (
            "/relative",
            vols.paths["cache"].clone(),
            false,
            MountPropagation::PropagationPrivate,
        ),
    ];
    assert_eq!(mounts.len(), want.len());
    for (got, (path, host_path, ro, prop)) in mounts.iter().zip(want) {
        assert_eq!(got.container_path, path);
        assert_eq!(Path::new(&got.host_path), host_path, "{path}");
        assert_eq!(got.readonly, ro, "{path}");
        assert_eq!(got.propagation, prop as i32, "{path}");
        assert!(!got.selinux_relabel);
    }
    assert!(
        host.join("pods/web-n1").is_dir(),
        "subPathExpr directory created"
    );
    // The subPaths are bind mounts of what they name: the subPathExpr directory, and for a
    // downwardAPI file the file of the current version.
    let version = std::fs::canonicalize(info.join("labels")).unwrap();
    assert!(version.to_string_lossy().contains("..20"), "{version:?}");
    let bound = vec![
        MountCall::Bind {
            source: host.canonicalize().unwrap().join("pods/web-n1"),
            target: subpaths.join("logs/app/2"),
        },
        MountCall::Bind {
            source: version,
            target: subpaths.join("info/app/3"),
        },
    ];
    assert_eq!(fake.calls(), bound);
    // Asked again, the mounts that show what is wanted are kept.
    m.container_mounts(&p, &c, &vols, &env, &HashMap::new())
        .unwrap();
    assert_eq!(fake.calls(), bound, "no second bind");

    let one = |vm: VolumeMount| {
        let c = Container {
            name: "app".into(),
            volume_mounts: Some(vec![vm]),
            ..Default::default()
        };
        m.container_mounts(&p, &c, &vols, &env, &HashMap::new())
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        one(mount("ghost", "/x")).unwrap_err(),
        "container \"app\": volumeMount \"ghost\": cannot find volume \"ghost\" to mount into container \"app\""
    );
    assert_eq!(
        one(VolumeMount {
            sub_path: Some("/etc".into()),
            ..mount("cache", "/x")
        })
        .unwrap_err(),
        "container \"app\": volumeMount \"cache\": error SubPath `/etc` must not be an absolute path"
    );
    assert_eq!(
        one(VolumeMount {
            sub_path: Some("a/../..".into()),
            ..mount("cache", "/x")
        })
        .unwrap_err(),
        "container \"app\": volumeMount \"cache\": unable to provision SubPath `a/../..`: must not contain '..'"
    );
    assert!(
        one(VolumeMount {
            sub_path_expr: Some("$(MISSING)".into()),
            ..mount("cache", "/x")
        })
        .unwrap_err()
        .ends_with("missing value for MISSING")
    );
    let bidi = VolumeMount {
        mount_propagation: Some("Bidirectional".into()),
        ..mount("logs", "/b")
    };
    assert!(
        one(bidi.clone())
            .unwrap_err()
            .contains("only to privileged containers")
    );
    c.volume_mounts = Some(vec![bidi]);
    c.security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let mounts = m
        .container_mounts(&p, &c, &vols, &env, &HashMap::new())
        .unwrap();
    assert_eq!(
        mounts[0].propagation,
        MountPropagation::PropagationBidirectional as i32
    );
    fake.take_calls();
    m.teardown("u4").unwrap();
    assert_eq!(
        fake.calls(),
        [
            unmount(&subpaths.join("logs/app/2"), false),
            unmount(&subpaths.join("info/app/3"), false),
        ],
        "the teardown unmounts the subPaths, and only them"
    );
    assert!(!subpaths.exists());
}

#[test]
fn teardown_never_follows_symlinks_out() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let outside = tmp.path().join("precious");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("file"), b"keep").unwrap();
    let vols = m
        .setup(&pod("u5", vec![empty_dir("cache", None, None)]))
        .unwrap();
    std::os::unix::fs::symlink(&outside, vols.paths["cache"].join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("file"), vols.paths["cache"].join("flink")).unwrap();
    m.teardown("u5").unwrap();
    assert!(!m.pod_volumes_dir("u5").exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("file")).unwrap(),
        "keep"
    );
    assert!(m.teardown("../etc").is_err());
}

#[test]
fn memory_empty_dir_is_a_sized_tmpfs() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    let p = pod(
        "u6",
        vec![
            empty_dir("mem", Some("Memory"), Some("4Mi")),
            empty_dir("disk", None, None),
        ],
    );
    let vols = m.setup(&p).unwrap();
    let dir = vols.paths["mem"].canonicalize().unwrap();
    assert_eq!(
        fake.calls(),
        [tmpfs(&dir, 4 << 20)],
        "a tmpfs of the sizeLimit, and only one"
    );
    assert_eq!(fake.table_reads(), 1);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o7777,
        0o1777,
        "the tmpfs root is given the volume's mode and keeps its sticky bit"
    );
    std::fs::write(dir.join("f"), b"x").unwrap();
    // Idempotent: no second mount, content kept.
    m.setup(&p).unwrap();
    assert_eq!(fake.calls().len(), 1);
    assert!(dir.join("f").exists());
    m.teardown("u6").unwrap();
    assert_eq!(fake.calls(), [tmpfs(&dir, 4 << 20), unmount(&dir, false)]);
    assert!(fake.mounted().is_empty());
    assert!(!m.pod_volumes_dir("u6").exists());

    // Without a sizeLimit or pod limit, the size is the node's memory.
    let p = pod("u6b", vec![empty_dir("mem", Some("Memory"), None)]);
    let dir = m.setup(&p).unwrap().paths["mem"].canonicalize().unwrap();
    assert_eq!(fake.calls().last(), Some(&tmpfs(&dir, 1 << 30)));
    m.teardown("u6b").unwrap();
}

/// The one test of a memory volume against the kernel: the tmpfs is really there, of the
/// size asked for, and gone after the teardown.
#[test]
fn a_memory_empty_dir_is_a_real_tmpfs() {
    require_root("it mounts a real tmpfs");
    let tmp = tempfile::tempdir().unwrap();
    let m = manager_on(&tmp.path().join("root"), Arc::new(KernelMounter));
    let p = pod("u6", vec![empty_dir("mem", Some("Memory"), Some("4Mi"))]);
    let vols = m.setup(&p).unwrap();
    let dir = vols.paths["mem"].canonicalize().unwrap();
    let count = |dir: &Path| {
        mountinfo::read()
            .unwrap()
            .iter()
            .filter(|e| e.mount_point == dir)
            .count()
    };
    let table = mountinfo::read().unwrap();
    let entry = mountinfo::mount_at(&table, &dir).expect("a tmpfs is mounted");
    assert_eq!(entry.fs_type, "tmpfs");
    assert!(
        entry.super_options.contains("size=4096k"),
        "{}",
        entry.super_options
    );
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o7777,
        0o1777,
        "the tmpfs's sticky bit is kept, as upstream"
    );
    std::fs::write(dir.join("f"), b"x").unwrap();
    m.setup(&p).unwrap();
    assert_eq!(count(&dir), 1);
    assert!(dir.join("f").exists());
    m.teardown("u6").unwrap();
    assert_eq!(count(&dir), 0);
    assert!(!m.pod_volumes_dir("u6").exists());
}

#[test]
fn teardown_unmounts_what_is_mounted_detaching_when_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    // A disk emptyDir and a hostPath: nothing is mounted, nothing is unmounted.
    let host = tmp.path().join("host");
    let p = pod(
        "t1",
        vec![
            empty_dir("disk", None, None),
            host_path("data", &host, Some("DirectoryOrCreate")),
        ],
    );
    m.setup(&p).unwrap();
    fake.preset(&host.canonicalize().unwrap(), "ext4");
    m.teardown("t1").unwrap();
    assert_eq!(
        fake.calls(),
        [],
        "nothing was mounted, nothing is unmounted"
    );
    assert_eq!(
        fake.mounted(),
        [host.canonicalize().unwrap()],
        "a hostPath's mount is not ours"
    );

    // A busy tmpfs is detached.
    let p = pod("t2", vec![empty_dir("mem", Some("Memory"), Some("1Mi"))]);
    let dir = m.setup(&p).unwrap().paths["mem"].canonicalize().unwrap();
    fake.take_calls();
    fake.fail(Op::Unmount, Some(&dir), nix::errno::Errno::EBUSY);
    m.teardown("t2").unwrap();
    assert_eq!(fake.calls(), [unmount(&dir, false), unmount(&dir, true)]);
    assert!(!m.pod_volumes_dir("t2").exists());

    // A mount that cannot be taken away keeps every file where it is.
    let dir = m.setup(&p).unwrap().paths["mem"].canonicalize().unwrap();
    std::fs::write(dir.join("f"), b"x").unwrap();
    fake.take_calls();
    fake.fail(Op::Unmount, Some(&dir), nix::errno::Errno::EBUSY);
    fake.fail(Op::Unmount, Some(&dir), nix::errno::Errno::EPERM);
    let err = m.teardown("t2").unwrap_err().to_string();
    assert!(err.starts_with("tearing down volumes of pod t2: "), "{err}");
    assert_eq!(fake.calls(), [unmount(&dir, false), unmount(&dir, true)]);
    assert!(dir.join("f").exists(), "nothing is deleted under a mount");
    m.teardown("t2").unwrap();
    assert!(!m.pod_volumes_dir("t2").exists());
}

#[test]
fn memory_volume_mount_problems_fail_the_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    let p = pod("t3", vec![empty_dir("mem", Some("Memory"), Some("1Mi"))]);
    fake.fail(Op::Tmpfs, None, nix::errno::Errno::EPERM);
    let err = m.setup(&p).unwrap_err().to_string();
    let dir = m.volume_dir("t3", EMPTY_DIR_PLUGIN, "mem");
    assert_eq!(
        err,
        format!(
            "MountVolume.SetUp failed for volume \"mem\" : mount failed: EPERM: Operation not permitted: mounting tmpfs on {}",
            dir.display()
        )
    );
    assert!(fake.mounted().is_empty());

    // Something else mounted there is not mounted over.
    let canonical = dir.canonicalize().unwrap();
    fake.preset(&canonical, "ext4");
    fake.take_calls();
    let err = m.setup(&p).unwrap_err().to_string();
    assert!(
        err.ends_with("is already a mount point of type ext4"),
        "{err}"
    );
    assert_eq!(fake.calls(), []);

    // A mount table that cannot be read fails the memory volumes only.
    let p = pod(
        "t4",
        vec![
            empty_dir("disk", None, None),
            empty_dir("mem", Some("Memory"), None),
        ],
    );
    fake.fail(Op::Table, None, nix::errno::Errno::EACCES);
    let attempts = m.setup_each(&p, &PodObjects::standalone(), &|_| true);
    assert!(attempts[0].result.is_ok());
    let err = attempts[1].result.as_ref().unwrap_err().to_string();
    assert!(err.contains("cannot read the mount table"), "{err}");
}

#[test]
fn hostile_uids_and_symlinked_pod_dirs_touch_nothing_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let m = manager(&root);
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), b"keep").unwrap();
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&victim)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let vols = || vec![empty_dir("c", None, None)];

    // UIDs that are not one plain path component are refused everywhere.
    for uid in [
        "",
        ".",
        "..",
        "a/b",
        "x/../../victim",
        "../victim",
        "a\0b",
        "u/",
    ] {
        assert!(m.setup(&pod(uid, vols())).is_err(), "{uid:?}");
        assert!(m.teardown(uid).is_err(), "{uid:?}");
    }
    assert!(m.teardown(&"u".repeat(256)).is_err());

    // pods/<uid> is a symlink to the victim: set-up refuses, teardown leaves it alone.
    std::fs::create_dir_all(root.join("pods")).unwrap();
    std::os::unix::fs::symlink(&victim, root.join("pods/evil")).unwrap();
    assert!(m.setup(&pod("evil", vols())).is_err());
    m.teardown("evil").unwrap();

    // pods/<uid>/volumes is a symlink: set-up refuses; teardown removes the link only.
    std::fs::create_dir(root.join("pods/u7")).unwrap();
    std::os::unix::fs::symlink(&victim, root.join("pods/u7/volumes")).unwrap();
    assert!(m.setup(&pod("u7", vols())).is_err());
    m.teardown("u7").unwrap();
    assert!(std::fs::symlink_metadata(root.join("pods/u7/volumes")).is_err());

    // pods/<uid>/volumes/<plugin> or the volume itself is a symlink: set-up refuses.
    std::fs::create_dir_all(root.join("pods/u8/volumes/kubernetes.io~downward-api")).unwrap();
    std::os::unix::fs::symlink(
        &victim,
        root.join("pods/u8/volumes/kubernetes.io~empty-dir"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        &victim,
        root.join("pods/u8/volumes/kubernetes.io~downward-api/info"),
    )
    .unwrap();
    let err = m.setup(&pod("u8", vols())).unwrap_err().to_string();
    assert!(err.contains("is a symlink"), "{err}");
    let err = m
        .setup(&pod(
            "u8",
            vec![downward("info", vec![field_item("name", "metadata.name")])],
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a symlink"), "{err}");
    // volume-subpaths is a symlink: teardown removes the link only.
    std::os::unix::fs::symlink(&victim, root.join("pods/u8/volume-subpaths")).unwrap();
    m.teardown("u8").unwrap();
    assert!(std::fs::symlink_metadata(root.join("pods/u8/volume-subpaths")).is_err());

    // A subPath of a pod whose UID is hostile is refused before anything is made.
    let p = pod("../victim", vols());
    let c = Container {
        name: "app".into(),
        volume_mounts: Some(vec![VolumeMount {
            sub_path: Some("x".into()),
            ..mount("c", "/x")
        }]),
        ..Default::default()
    };
    let fake = PodVolumes {
        paths: HashMap::from([("c".to_string(), tmp.path().join("fake"))]),
        ..Default::default()
    };
    std::fs::create_dir(tmp.path().join("fake")).unwrap();
    assert!(
        m.container_mounts(&p, &c, &fake, &HashMap::new(), &HashMap::new())
            .is_err()
    );

    assert_eq!(listing(), vec!["keep".to_string()]);
    assert_eq!(std::fs::read(victim.join("keep")).unwrap(), b"keep");
}

#[test]
fn fs_group_owns_empty_dir_and_downward_api_but_not_host_path() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let host = tmp.path().join("host");
    let m = manager(&root);
    let mut p = pod(
        "u9",
        vec![
            empty_dir("cache", None, None),
            host_path("data", &host, Some("DirectoryOrCreate")),
            Volume {
                name: "info".into(),
                downward_api: Some(DownwardAPIVolumeSource {
                    items: Some(vec![
                        field_item("labels", "metadata.labels"),
                        DownwardAPIVolumeFile {
                            mode: Some(0o400),
                            ..field_item("name", "metadata.name")
                        },
                    ]),
                    default_mode: None,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
    );
    p.spec.as_mut().unwrap().security_context =
        Some(k8s_openapi::api::core::v1::PodSecurityContext {
            fs_group: Some(4321),
            ..Default::default()
        });
    let vols = m.setup(&p).unwrap();
    let meta = |p: &Path| std::fs::metadata(p).unwrap();
    let cache = &vols.paths["cache"];
    assert_eq!(meta(cache).gid(), 4321);
    assert_eq!(meta(cache).mode() & 0o7777, 0o2777);
    let info = &vols.paths["info"];
    assert_eq!(meta(info).gid(), 4321);
    assert_eq!(meta(&info.join("labels")).gid(), 4321);
    assert_eq!(meta(&info.join("labels")).mode() & 0o7777, 0o644);
    assert_eq!(meta(&info.join("name")).mode() & 0o7777, 0o440);
    assert_ne!(
        meta(&host).gid(),
        4321,
        "hostPath volumes are never given away"
    );
    assert_eq!(meta(&host).mode() & 0o2000, 0);

    // The emptyDir is walked once: a file made later keeps its group on the next set-up.
    std::fs::write(cache.join("later"), b"x").unwrap();
    std::os::unix::fs::chown(cache.join("later"), None, Some(0)).unwrap();
    let data = std::fs::read_link(info.join("..data")).unwrap();
    m.setup(&p).unwrap();
    m.refresh(&p).unwrap();
    assert_eq!(meta(&cache.join("later")).gid(), 0);
    assert_eq!(meta(cache).mode() & 0o7777, 0o2777);
    // The group bits the walk added are not a change of the downwardAPI content.
    assert_eq!(std::fs::read_link(info.join("..data")).unwrap(), data);

    // A new label is a new version, owned again before it becomes visible.
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("v".into(), "2".into());
    m.refresh(&p).unwrap();
    assert_ne!(std::fs::read_link(info.join("..data")).unwrap(), data);
    assert_eq!(meta(&info.join("labels")).gid(), 4321);
    assert_eq!(meta(&info.join("name")).mode() & 0o7777, 0o440);

    // An invalid fsGroup fails the set-up with a message.
    p.spec
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .fs_group = Some(-5);
    let err = m.setup(&p).unwrap_err().to_string();
    assert!(err.contains("invalid securityContext.fsGroup -5"), "{err}");
    m.teardown("u9").unwrap();
    assert!(host.is_dir());
}

/// The objects a pod would get from an API server: configMap `app` (one key), secret `creds`,
/// `kube-root-ca.crt`, and a token for the projected volume `kube-api-access` (source 0).
fn api_objects(app_conf: &str) -> PodObjects {
    use crate::kubelet::api_objects::TokenSlot;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMap as Cm, Secret as Sec};
    use std::sync::Arc;
    let cm = |data: &[(&str, &str)]| {
        Ok(Arc::new(Cm {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }))
    };
    PodObjects {
        from_api: true,
        config_maps: BTreeMap::from([
            ("app".to_string(), cm(&[("app.conf", app_conf)])),
            ("kube-root-ca.crt".to_string(), cm(&[("ca.crt", "CA PEM")])),
            (
                "gone".to_string(),
                Err(ObjectError::NotFound {
                    kind: crate::kubelet::api_objects::Kind::ConfigMap,
                    name: "gone".into(),
                }),
            ),
        ]),
        secrets: BTreeMap::from([(
            "creds".to_string(),
            Ok(Arc::new(Sec {
                data: Some(BTreeMap::from([(
                    "password".to_string(),
                    ByteString(b"hunter2".to_vec()),
                )])),
                ..Default::default()
            })),
        )]),
        tokens: BTreeMap::from([(
            TokenSlot {
                volume: "kube-api-access".into(),
                source: 0,
            },
            Ok("eyJhbGciOi.token".to_string()),
        )]),
        service_env: None,
        ..Default::default()
    }
}

fn api_volumes(gone_optional: Option<bool>) -> Vec<Volume> {
    serde_json::from_value(serde_json::json!([
        {"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o640}},
        {"name": "creds", "secret": {"secretName": "creds",
            "items": [{"key": "password", "path": "db/pw", "mode": 0o400}]}},
        {"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}},
        {"name": "maybe", "configMap": {"name": "gone", "optional": gone_optional}}
    ]))
    .unwrap()
}

#[test]
fn api_volumes_are_written_followed_and_secrets_kept_off_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    let p = pod("api1", api_volumes(Some(true)));
    let vols = m.setup_with(&p, &api_objects("port=80")).unwrap();
    let read = |v: &str, f: &str| std::fs::read_to_string(vols.paths[v].join(f)).unwrap();
    let mode = |v: &str, f: &str| {
        std::fs::metadata(vols.paths[v].join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(read("cfg", "app.conf"), "port=80");
    assert_eq!(mode("cfg", "app.conf"), 0o640);
    assert_eq!(read("creds", "db/pw"), "hunter2");
    assert_eq!(mode("creds", "db/pw"), 0o400);
    assert_eq!(read("kube-api-access", "token"), "eyJhbGciOi.token");
    assert_eq!(read("kube-api-access", "ca.crt"), "CA PEM");
    assert_eq!(read("kube-api-access", "namespace"), "default");
    assert_eq!(mode("kube-api-access", "token"), 0o644);
    assert!(vols.read_only.contains("creds") && vols.read_only.contains("cfg"));
    assert!(
        vols.paths["maybe"].is_dir(),
        "an optional missing configMap is empty"
    );
    assert_eq!(
        vols.paths["creds"],
        m.volume_dir("api1", SECRET_PLUGIN, "creds")
    );

    // The secret and the projected volume are each on a tmpfs (the node's memory: no pod
    // limit), in the spec's order; the configMap is on the node's disk, as upstream.
    let real = |v: &str| vols.paths[v].canonicalize().unwrap();
    let mounted = [
        tmpfs(&real("creds"), 1 << 30),
        tmpfs(&real("kube-api-access"), 1 << 30),
    ];
    assert_eq!(fake.calls(), mounted);
    assert_eq!(fake.mounted(), [real("creds"), real("kube-api-access")]);

    // A change reaches the file; an object that cannot be read keeps what the volume has.
    m.refresh_with(&p, &api_objects("port=8080")).unwrap();
    assert_eq!(read("cfg", "app.conf"), "port=8080");
    let mut broken = api_objects("port=9090");
    broken.secrets.insert(
        "creds".into(),
        Err(ObjectError::NotSynced {
            kind: crate::kubelet::api_objects::Kind::Secret,
            last: None,
        }),
    );
    let err = m.refresh_with(&p, &broken).unwrap_err().to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"creds\" : failed to sync secret cache: timed out waiting for the condition"
    );
    assert_eq!(
        read("cfg", "app.conf"),
        "port=9090",
        "the others still follow"
    );
    assert_eq!(read("creds", "db/pw"), "hunter2");
    assert_eq!(fake.calls(), mounted, "a refresh mounts nothing");

    let (creds, token) = (real("creds"), real("kube-api-access"));
    m.teardown("api1").unwrap();
    assert!(!m.pod_volumes_dir("api1").exists());
    assert_eq!(
        fake.calls()[2..],
        [unmount(&creds, false), unmount(&token, false)]
    );
}

#[test]
fn missing_api_objects_fail_with_upstreams_words() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let missing: Vec<Volume> = serde_json::from_value(serde_json::json!([
        {"name": "maybe", "configMap": {"name": "gone"}}
    ]))
    .unwrap();
    let err = m
        .setup_with(&pod("api2", missing), &api_objects("x"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"maybe\" : configmap \"gone\" not found"
    );
    assert!(
        !m.volume_dir("api2", CONFIG_MAP_PLUGIN, "maybe").exists(),
        "nothing is left behind"
    );

    let bad_key: Vec<Volume> = serde_json::from_value(serde_json::json!([
        {"name": "cfg", "configMap": {"name": "app", "items": [{"key": "nope", "path": "x"}]}}
    ]))
    .unwrap();
    let err = m
        .setup_with(&pod("api2", bad_key), &api_objects("x"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap references non-existent config key: nope"
    );

    // Several failing sources of one projected volume are told together.
    let projected: Vec<Volume> = serde_json::from_value(serde_json::json!([
        {"name": "p", "projected": {"sources": [
            {"configMap": {"name": "gone"}},
            {"secret": {"name": "creds", "items": [{"key": "user", "path": "u"}]}}
        ]}}
    ]))
    .unwrap();
    let err = m
        .setup_with(&pod("api2", projected), &api_objects("x"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"p\" : [configmap \"gone\" not found, references non-existent secret key: user]"
    );

    // Standalone, as before: refused, not looked up.
    let err = m
        .setup_with(
            &pod("api2", api_volumes(Some(true))),
            &PodObjects::standalone(),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found: configMap volumes are not supported without an apiserver"
    );
}

#[test]
fn a_token_with_an_fs_group_is_readable_by_the_group_only() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let volumes: Vec<Volume> = serde_json::from_value(serde_json::json!([
        {"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
            {"serviceAccountToken": {"path": "token"}}
        ]}}
    ]))
    .unwrap();
    let mut p = pod("api3", volumes);
    p.spec.as_mut().unwrap().security_context =
        Some(k8s_openapi::api::core::v1::PodSecurityContext {
            fs_group: Some(nix::unistd::getegid().as_raw().into()),
            ..Default::default()
        });
    let vols = m.setup_with(&p, &api_objects("x")).unwrap();
    let mode = std::fs::metadata(vols.paths["kube-api-access"].join("token"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o640, "0600 and the group's read bit");
    m.teardown("api3").unwrap();
}

/// Objects read for a pod whose claim `data` is bound to the local volume `pv1` at `path`.
fn claim_objects(path: &Path, bound: bool) -> PodObjects {
    use crate::kubelet::api_objects::claims::FetchError;
    use k8s_openapi::api::core::v1::{
        LocalVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    };
    let mut claim = PersistentVolumeClaim {
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: bound.then(|| "pv1".to_string()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some(if bound { "Bound" } else { "Pending" }.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    claim.metadata.uid = Some("c-uid".into());
    let pv = PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            local: Some(LocalVolumeSource {
                path: path.to_string_lossy().into_owned(),
                fs_type: None,
            }),
            claim_ref: Some(ObjectReference {
                uid: Some("c-uid".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut objects = PodObjects {
        from_api: true,
        ..Default::default()
    };
    objects.claims.insert("data".into(), Ok(Arc::new(claim)));
    let read = if bound {
        Ok(Arc::new(pv))
    } else {
        Err(FetchError::Request("not read".into()))
    };
    objects.persistent_volumes.insert("pv1".into(), read);
    objects
}

#[test]
fn a_bound_local_claim_is_bind_mounted_kept_across_setups_and_unmounted_without_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, fake) = manager_with_fake(&tmp.path().join("root"));
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    std::fs::write(disk.join("kept"), b"data").unwrap();
    let claim = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(
            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name: "data".into(),
                read_only: None,
            },
        ),
        ..Default::default()
    };
    let mut p = pod("pv1-pod", vec![claim]);
    p.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![mount("data", "/data")]);

    // Unbound: the pod waits with upstream's populator message.
    let err = m
        .setup_with(&p, &claim_objects(&disk, false))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: \
         error processing PVC default/data: PVC is not bound"
    );
    assert_eq!(fake.calls(), [], "nothing is mounted for an unbound claim");

    // Bound: the local path is bind-mounted at upstream's place.
    let objects = claim_objects(&disk, true);
    let got = m.setup_with(&p, &objects).unwrap();
    let dir = m.volume_dir("pv1-pod", "kubernetes.io~local-volume", "pv1");
    assert_eq!(got.paths["data"], dir);
    assert!(!got.read_only.contains("data"));
    let real = dir.canonicalize().unwrap();
    assert_eq!(
        fake.take_calls(),
        [MountCall::Bind {
            source: disk.canonicalize().unwrap(),
            target: real.clone(),
        }]
    );
    // Set up again (a later sync, or after a restart): the mount there is kept.
    m.setup_with(&p, &objects).unwrap();
    assert_eq!(
        fake.take_calls(),
        [],
        "an existing mount is not mounted again"
    );

    m.teardown("pv1-pod").unwrap();
    assert_eq!(fake.calls(), [unmount(&real, false)]);
    assert!(!m.pod_volumes_dir("pv1-pod").exists());
    assert_eq!(
        std::fs::read(disk.join("kept")).unwrap(),
        b"data",
        "the volume's data stays"
    );
}

#[test]
fn a_read_write_once_pod_local_volume_is_mounted_by_one_pod_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, _fake) = manager_with_fake(&tmp.path().join("root"));
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mut objects = claim_objects(&disk, true);
    let mut pv = (**objects.persistent_volumes["pv1"].as_ref().unwrap()).clone();
    pv.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOncePod".into()]);
    objects
        .persistent_volumes
        .insert("pv1".into(), Ok(Arc::new(pv)));
    let claim_pod = |uid: &str| {
        let mut p = pod(
            uid,
            vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(
                    k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                        claim_name: "data".into(),
                        read_only: None,
                    },
                ),
                ..Default::default()
            }],
        );
        p.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![mount("data", "/d")]);
        p
    };
    m.setup_with(&claim_pod("first"), &objects).unwrap();
    m.setup_with(&claim_pod("first"), &objects)
        .expect("the pod that has it mounts it again");
    let err = m
        .setup_with(&claim_pod("second"), &objects)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "MountVolume.SetUp failed for volume \"data\" : volume uses the ReadWriteOncePod access \
         mode and is already in use by another pod"
    );
    m.teardown("first").unwrap();
    m.setup_with(&claim_pod("second"), &objects)
        .expect("free once the first pod is gone");
}

#[test]
fn image_volumes_are_mounted_by_the_runtime_read_only_from_the_pulled_image() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(&tmp.path().join("root"));
    let image = Volume {
        name: "img".into(),
        image: Some(k8s_openapi::api::core::v1::ImageVolumeSource {
            reference: Some("busybox:1.35".into()),
            pull_policy: Some("IfNotPresent".into()),
        }),
        ..Default::default()
    };
    let p = pod("u-img", vec![image, empty_dir("cache", None, None)]);
    // Nothing to set up on the node: no directory under the pod's volumes.
    let vols = m.setup(&p).unwrap();
    assert!(vols.images.contains("img"));
    assert!(
        !m.pod_volumes_dir("u-img")
            .join("kubernetes.io~image")
            .exists()
    );
    let spec = ImageSpec {
        image: "sha256:abc".into(),
        user_specified_image: "busybox:1.35".into(),
        ..Default::default()
    };
    let images = HashMap::from([("img".to_string(), spec.clone())]);
    let c = Container {
        name: "app".into(),
        volume_mounts: Some(vec![
            mount("img", "/img"),
            VolumeMount {
                sub_path: Some("etc".into()),
                read_only: Some(false),
                ..mount("img", "/etc-of-image")
            },
            mount("cache", "/cache"),
        ]),
        ..Default::default()
    };
    let mounts = m
        .container_mounts(&p, &c, &vols, &HashMap::new(), &images)
        .unwrap();
    let seen: Vec<(&str, &str, bool, Option<&str>, &str)> = mounts
        .iter()
        .map(|m| {
            (
                m.container_path.as_str(),
                m.host_path.as_str(),
                m.readonly,
                m.image.as_ref().map(|i| i.image.as_str()),
                m.image_sub_path.as_str(),
            )
        })
        .collect();
    assert_eq!(seen[0], ("/img", "", true, Some("sha256:abc"), ""));
    // readOnly: false does not make an image writable.
    assert_eq!(
        seen[1],
        ("/etc-of-image", "", true, Some("sha256:abc"), "etc")
    );
    assert_eq!(seen[2].3, None);
    // No pulled image, or a subPathExpr: no mount.
    let err = m
        .container_mounts(&p, &c, &vols, &HashMap::new(), &HashMap::new())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("image volume \"img\" has no pulled image"),
        "{err}"
    );
    let expr = Container {
        name: "app".into(),
        volume_mounts: Some(vec![VolumeMount {
            sub_path_expr: Some("$(X)".into()),
            ..mount("img", "/img")
        }]),
        ..Default::default()
    };
    let err = m
        .container_mounts(&p, &expr, &vols, &HashMap::new(), &images)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("not allowed in image volume sources"),
        "{err}"
    );
    m.teardown("u-img").unwrap();
}
