//! Setting CSI volumes up and tearing them down, as upstream's `csiMountMgr` and
//! `csiAttacher`: a pod's volume is published to
//! `<root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`, beside upstream's
//! `vol_data.json` (what the teardown needs: driver, volume handle, lifecycle mode), after a
//! persistent volume was staged, when the driver can stage, to
//! `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount` (with its
//! own `vol_data.json`). A persistent volume is unstaged when the last pod using it on this
//! node is torn down.
//!
//! These run on the volume code's blocking threads; the calls go to the runtime
//! ([`super::block_on`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, CSIVolumeSource, Pod, Secret};
use k8s_openapi::api::storage::v1::CSIDriver;

use super::client::{NodeClient, VolumeCall};
use super::republish::Published;
use super::{CSI_PLUGIN_DIR, CsiError, attach, block_on, driver, host, tokens};
use crate::kubelet::volume::ownership::{self, FsGroup};

const VOL_DATA: &str = "vol_data.json";
const EPHEMERAL: &str = "Ephemeral";
const PERSISTENT: &str = "Persistent";

fn sha256_hex(text: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()))
}

/// Upstream's handle of an inline volume: `csi-<sha256(podUID + volume name)>`.
pub(crate) fn inline_volume_handle(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume}")))
}

/// Upstream's VolumeAttachment name: `csi-<sha256(handle + driver + node)>`.
pub(crate) fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{handle}{driver}{node}")))
}

/// Where a driver stages a volume (upstream's `makeDeviceMountPath`).
pub(crate) fn global_mount_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/csi")
        .join(driver)
        .join(sha256_hex(handle))
        .join("globalmount")
}

/// The `csi.storage.k8s.io/*` volume context of `podInfoOnMount` (pure).
pub(crate) fn pod_info(pod: &Pod, ephemeral: bool) -> HashMap<String, String> {
    let meta = &pod.metadata;
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone());
    HashMap::from([
        (
            "csi.storage.k8s.io/pod.name".into(),
            meta.name.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".into(),
            meta.namespace.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.uid".into(),
            meta.uid.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/serviceAccount.name".into(),
            sa.unwrap_or_default(),
        ),
        ("csi.storage.k8s.io/ephemeral".into(), ephemeral.to_string()),
    ])
}

/// Whether the driver supports the lifecycle mode (upstream's `supportsVolumeLifecycleMode`):
/// with no CSIDriver only persistent volumes are served.
pub(crate) fn check_mode(
    name: &str,
    object: Option<&CSIDriver>,
    mode: &'static str,
) -> Result<(), CsiError> {
    let Some(object) = object else {
        if mode == PERSISTENT {
            return Ok(());
        }
        return Err(CsiError::NoCsiDriver {
            mode,
            driver: name.to_string(),
        });
    };
    let modes = object
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec![PERSISTENT.to_string()]);
    if modes.iter().any(|m| m == mode) {
        return Ok(());
    }
    Err(CsiError::LifecycleMode {
        mode,
        driver: name.to_string(),
        modes,
    })
}

/// Whether the volume is given to the pod's fsGroup (upstream's `supportsFSGroup`; the
/// default policy is `ReadWriteOnceWithFSType`) (pure).
pub(crate) fn applies_fs_group(
    policy: Option<&str>,
    read_only: bool,
    fs_type: &str,
    access_modes: Option<&[String]>,
) -> bool {
    match policy.unwrap_or("ReadWriteOnceWithFSType") {
        _ if read_only => false,
        "None" => false,
        "File" => true,
        _ => {
            !fs_type.is_empty()
                && access_modes.is_some_and(|m| m.iter().any(|m| m == "ReadWriteOnce"))
        }
    }
}

async fn read_driver(name: String) -> Result<Option<CSIDriver>, CsiError> {
    let Some(client) = host().and_then(|h| h.client.clone()) else {
        return Ok(None);
    };
    let api: kube::Api<CSIDriver> = kube::Api::all(client);
    api.get_opt(&name).await.map_err(|e| CsiError::ReadDriver {
        driver: name,
        reason: e.to_string(),
    })
}

pub(super) async fn read_secret(
    what: &'static str,
    namespace: String,
    name: String,
) -> Result<HashMap<String, String>, CsiError> {
    let fail = |reason: String| CsiError::Secret {
        what,
        namespace: namespace.clone(),
        name: name.clone(),
        reason,
    };
    let client = host()
        .and_then(|h| h.client.clone())
        .ok_or_else(|| fail("no API server".into()))?;
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &namespace);
    let secret = api.get(&name).await.map_err(|e| fail(e.to_string()))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

fn files_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> CsiError {
    CsiError::Files {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn write_vol_data(dir: &Path, data: &BTreeMap<&str, String>) -> Result<(), CsiError> {
    let path = dir.join(VOL_DATA);
    let text = serde_json::to_vec(data).unwrap_or_default();
    std::fs::write(&path, text).map_err(|e| files_error("saving volume data", &path, e))
}

pub(super) fn read_vol_data(dir: &Path) -> Option<BTreeMap<String, String>> {
    serde_json::from_slice(&std::fs::read(dir.join(VOL_DATA)).ok()?).ok()
}

/// A pod volume to publish: the volume directory made by the volume manager, and who uses it.
pub(crate) struct PodTarget<'a> {
    pub pod: &'a Pod,
    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<name>`.
    pub dir: &'a Path,
    pub fs_group: Option<FsGroup>,
    /// Published before, published again (`requiresRepublish`, see [`super::republish`]): a
    /// persistent volume is not staged again, as upstream's remount finds it staged.
    pub remount: bool,
}

/// The driver's `tokenRequests` tokens for the pod, put where the driver reads them
/// ([`super::tokens`]); nothing to ask without a CSIDriver or with no requests.
fn add_tokens(
    pod: &Pod,
    object: Option<&CSIDriver>,
    context: &mut HashMap<String, String>,
    secrets: &mut HashMap<String, String>,
) -> Result<(), CsiError> {
    let Some(object) = object.filter(|o| o.spec.token_requests.iter().flatten().next().is_some())
    else {
        return Ok(());
    };
    let issued = block_on(tokens::fetch(pod.clone(), object.clone()))??;
    tokens::hand_over(object, &issued, context, secrets);
    Ok(())
}

fn vol_data(
    name: &str,
    handle: &str,
    driver_name: &str,
    mode: &str,
) -> BTreeMap<&'static str, String> {
    let node = host().map(|h| h.node_name.clone()).unwrap_or_default();
    BTreeMap::from([
        ("specVolID", name.to_string()),
        ("volumeHandle", handle.to_string()),
        ("driverName", driver_name.to_string()),
        ("attachmentID", attachment_name(handle, driver_name, &node)),
        ("nodeName", node),
        ("volumeLifecycleMode", mode.to_string()),
    ])
}

/// Publishes a CSI inline ephemeral volume (`volumes[].csi`); returns the mount path.
pub(crate) fn set_up_inline(
    t: &PodTarget,
    name: &str,
    source: &CSIVolumeSource,
) -> Result<PathBuf, CsiError> {
    let driver_name = source.driver.clone();
    let object = block_on(read_driver(driver_name.clone()))??;
    check_mode(&driver_name, object.as_ref(), EPHEMERAL)?;
    let registered =
        driver(&driver_name).ok_or_else(|| CsiError::NotRegistered(driver_name.clone()))?;
    let uid = t.pod.metadata.uid.clone().unwrap_or_default();
    let handle = inline_volume_handle(&uid, name);
    let mut data = vol_data(name, &handle, &driver_name, EPHEMERAL);
    let namespace = t.pod.metadata.namespace.clone().unwrap_or_default();
    data.insert(super::stats::NAMESPACE_KEY, namespace);
    write_vol_data(t.dir, &data)?;
    let mut context: HashMap<String, String> = source
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if object.as_ref().and_then(|o| o.spec.pod_info_on_mount) == Some(true) {
        context.extend(pod_info(t.pod, true));
    }
    let namespace = t.pod.metadata.namespace.clone().unwrap_or_default();
    let mut secrets = match source.node_publish_secret_ref.as_ref() {
        Some(r) => block_on(read_secret(
            "NodePublishSecretRef",
            namespace,
            r.name.clone(),
        ))??,
        None => HashMap::new(),
    };
    add_tokens(t.pod, object.as_ref(), &mut context, &mut secrets)?;
    let target = t.dir.join("mount");
    let call = VolumeCall {
        volume_id: handle,
        target_path: target.display().to_string(),
        read_only: source.read_only.unwrap_or(false),
        fs_type: source.fs_type.clone().unwrap_or_default(),
        access_mode: "ReadWriteOnce".into(),
        volume_context: context,
        secrets,
        ..Default::default()
    };
    let endpoint = registered.endpoint;
    block_on(async move {
        let mut client = NodeClient::connect(&endpoint).await?;
        client.publish(&call).await
    })??;
    let policy = object.as_ref().and_then(|o| o.spec.fs_group_policy.clone());
    let fs_type = source.fs_type.clone().unwrap_or_default();
    if let Some(group) = t.fs_group
        && applies_fs_group(
            policy.as_deref(),
            source.read_only.unwrap_or(false),
            &fs_type,
            None,
        )
    {
        ownership::apply(&target, group, false)
            .map_err(|e| files_error("applyFSGroup failed for", &target, e))?;
    }
    Ok(target)
}

/// A persistent volume whose source is `csi`, as the PVC → PV resolution hands it over.
pub(crate) struct PersistentCsi<'a> {
    /// The PV's name (the pod volume directory's name, as upstream).
    pub pv_name: &'a str,
    pub source: &'a CSIPersistentVolumeSource,
    pub access_modes: &'a [String],
    pub mount_options: &'a [String],
    /// The claim's or the pod volume's `readOnly`, on top of the source's.
    pub read_only: bool,
    /// The pod's volume and the claim it names (what `/stats/summary` and the volume
    /// metrics call the volume).
    pub pod_volume: &'a str,
    pub claim: &'a str,
    /// Published before: published again without staging ([`PodTarget::remount`]).
    pub remount: bool,
}

/// Stages (when the driver can) and publishes a CSI persistent volume for a pod; returns the
/// mount path. A volume whose CSIDriver has `attachRequired: true` (the default without one)
/// is reported in use and must be attached by the controller first ([`super::attach`]); the
/// attachment's metadata is the publish context of both calls, as upstream.
pub(crate) fn set_up_persistent(
    root: &Path,
    t: &PodTarget,
    pv: &PersistentCsi,
) -> Result<PathBuf, CsiError> {
    let source = pv.source;
    let driver_name = source.driver.clone();
    let object = block_on(read_driver(driver_name.clone()))??;
    check_mode(&driver_name, object.as_ref(), PERSISTENT)?;
    let handle = source.volume_handle.clone();
    let publish_context = if object
        .as_ref()
        .is_none_or(|o| o.spec.attach_required != Some(false))
    {
        let unique = attach::unique_name(&driver_name, &handle);
        attach::want(t.pod.metadata.uid.as_deref().unwrap_or(""), &unique);
        let node = host().map(|h| h.node_name.clone()).unwrap_or_default();
        let name = attachment_name(&handle, &driver_name, &node);
        block_on(attach::attached(unique, name))??
    } else {
        HashMap::new()
    };
    let registered =
        driver(&driver_name).ok_or_else(|| CsiError::NotRegisteredStage(driver_name.clone()))?;
    let attributes: HashMap<String, String> = source
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let secret =
        |what: &'static str, r: &Option<k8s_openapi::api::core::v1::SecretReference>| match r {
            Some(r) => block_on(read_secret(
                what,
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            ))?,
            None => Ok(HashMap::new()),
        };
    let read_only = pv.read_only || source.read_only.unwrap_or(false);
    let mut call = VolumeCall {
        volume_id: handle.clone(),
        fs_type: source.fs_type.clone().unwrap_or_default(),
        mount_flags: pv.mount_options.to_vec(),
        access_mode: pv
            .access_modes
            .first()
            .cloned()
            .unwrap_or_else(|| "ReadWriteOnce".into()),
        volume_context: attributes.clone(),
        publish_context,
        secrets: secret("NodeStageSecretRef", &source.node_stage_secret_ref)?,
        ..Default::default()
    };
    let endpoint = registered.endpoint.clone();
    let mut client = block_on(async move { NodeClient::connect(&endpoint).await })??;
    let (stages, returned) = block_on(async move { (client.supports_stage().await, client) })?;
    client = returned;
    if stages? {
        let global = global_mount_path(root, &driver_name, &handle);
        call.staging_path = global.display().to_string();
        if !t.remount {
            client = stage(root, client, &global, &call, &driver_name)?;
        }
    }
    let mut data = vol_data(pv.pv_name, &handle, &driver_name, PERSISTENT);
    // Deckhand's own keys (upstream's volume manager knows these from the pod): what the
    // volume stats name the volume by.
    data.insert(super::stats::POD_VOLUME_KEY, pv.pod_volume.to_string());
    data.insert(super::stats::CLAIM_KEY, pv.claim.to_string());
    let namespace = t.pod.metadata.namespace.clone().unwrap_or_default();
    data.insert(super::stats::NAMESPACE_KEY, namespace);
    write_vol_data(t.dir, &data)?;
    if object.as_ref().and_then(|o| o.spec.pod_info_on_mount) == Some(true) {
        call.volume_context.extend(pod_info(t.pod, false));
    }
    call.secrets = secret("NodePublishSecretRef", &source.node_publish_secret_ref)?;
    add_tokens(
        t.pod,
        object.as_ref(),
        &mut call.volume_context,
        &mut call.secrets,
    )?;
    call.read_only = read_only;
    let target = t.dir.join("mount");
    call.target_path = target.display().to_string();
    block_on(async move { client.publish(&call).await })??;
    let policy = object.as_ref().and_then(|o| o.spec.fs_group_policy.clone());
    let fs_type = source.fs_type.clone().unwrap_or_default();
    if let Some(group) = t.fs_group
        && applies_fs_group(
            policy.as_deref(),
            read_only,
            &fs_type,
            Some(pv.access_modes),
        )
    {
        ownership::apply(&target, group, false)
            .map_err(|e| files_error("applyFSGroup failed for", &target, e))?;
    }
    Ok(target)
}

/// Stages a persistent volume at `global` (upstream's `MountDevice`), beside the
/// `vol_data.json` its unstage reads; hands the client back.
fn stage(
    root: &Path,
    mut client: NodeClient,
    global: &Path,
    call: &VolumeCall,
    driver_name: &str,
) -> Result<NodeClient, CsiError> {
    std::fs::create_dir_all(global)
        .map_err(|e| files_error("attacher.MountDevice failed to create dir", global, e))?;
    let parent = global.parent().unwrap_or(root);
    let data = BTreeMap::from([
        ("volumeHandle", call.volume_id.clone()),
        ("driverName", driver_name.to_string()),
    ]);
    write_vol_data(parent, &data)?;
    let stage_call = call.clone();
    block_on(async move { client.stage(&stage_call).await.map(|()| client) })?
}

impl crate::kubelet::volume::VolumeManager {
    /// The one call for a pod volume whose claim is bound to a CSI persistent volume: makes
    /// `pods/<uid>/volumes/kubernetes.io~csi/<pv name>` and stages and publishes the volume
    /// there ([`set_up_persistent`]). Its teardown is the pod's ([`tear_down_pod`]).
    pub(crate) fn set_up_csi_persistent(
        &self,
        pod: &Pod,
        pv: &PersistentCsi,
    ) -> Result<crate::kubelet::volume::SetUpVolume, crate::kubelet::volume::VolumeProblem> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        crate::kubelet::volume::check_component("pod UID", uid)?;
        crate::kubelet::volume::check_component("volume name", pv.pv_name)?;
        let fs_group = FsGroup::from_pod(pod)?;
        let dir = self.make_volume_dir(uid, CSI_PLUGIN_DIR, pv.pv_name, 0o750)?;
        let target = PodTarget {
            pod,
            dir: &dir,
            fs_group,
            remount: pv.remount,
        };
        let path = set_up_persistent(&self.root_dir, &target, pv)?;
        let read_only = pv.read_only || pv.source.read_only == Some(true);
        Ok(crate::kubelet::volume::SetUpVolume {
            path,
            read_only,
            image: false,
        })
    }
}

/// The pod's CSI volumes that are published (their `vol_data.json` is there), each with
/// whether its driver's CSIDriver asks for a republish. A CSIDriver that cannot be read asks
/// for none, as upstream's `RequiresRemount` answers then.
pub(crate) fn published(pod_dir: &Path) -> Vec<Published> {
    let plugin_dir = pod_dir.join("volumes").join(CSI_PLUGIN_DIR);
    let Ok(entries) = std::fs::read_dir(&plugin_dir) else {
        return Vec::new();
    };
    let mut republish: HashMap<String, bool> = HashMap::new();
    let mut out = Vec::new();
    for data in entries.flatten().filter_map(|e| read_vol_data(&e.path())) {
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        // A persistent volume's directory is the PV's; the pod's volume name is kept beside.
        let volume = data
            .get(super::stats::POD_VOLUME_KEY)
            .cloned()
            .unwrap_or_else(|| get("specVolID"));
        let driver_name = get("driverName");
        let requires = *republish
            .entry(driver_name.clone())
            .or_insert_with(|| requires_republish(&driver_name));
        out.push(Published {
            volume,
            requires_republish: requires,
        });
    }
    out
}

/// The driver's CSIDriver says `requiresRepublish: true`.
fn requires_republish(driver_name: &str) -> bool {
    match block_on(read_driver(driver_name.to_string())).and_then(|read| read) {
        Ok(object) => object.is_some_and(|o| o.spec.requires_republish == Some(true)),
        Err(err) => {
            tracing::debug!(driver = %driver_name, error = %err, "cannot read the CSIDriver; no republish");
            false
        }
    }
}

/// Unpublishes every CSI volume of a pod (and unstages the persistent ones no other pod on
/// the node uses), then removes their directories. A driver that is not registered fails
/// the teardown, which is tried again: nothing is removed while it may still be mounted.
pub(crate) fn tear_down_pod(root: &Path, pod_dir: &Path) -> Result<(), CsiError> {
    let plugin_dir = pod_dir.join("volumes").join(CSI_PLUGIN_DIR);
    let Ok(entries) = std::fs::read_dir(&plugin_dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(data) = read_vol_data(&dir) else {
            continue;
        };
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let (driver_name, handle) = (get("driverName"), get("volumeHandle"));
        let registered =
            driver(&driver_name).ok_or_else(|| CsiError::NotRegistered(driver_name.clone()))?;
        let target = dir.join("mount").display().to_string();
        let endpoint = registered.endpoint.clone();
        let unpublish = (handle.clone(), target);
        block_on(async move {
            let mut client = NodeClient::connect(&endpoint).await?;
            client.unpublish(&unpublish.0, &unpublish.1).await
        })??;
        let _ = std::fs::remove_dir(dir.join("mount"));
        let _ = std::fs::remove_file(dir.join(VOL_DATA));
        let _ = std::fs::remove_dir(&dir);
        if get("volumeLifecycleMode") == PERSISTENT
            && !used_elsewhere(root, pod_dir, &driver_name, &handle)
        {
            unstage(root, &registered.endpoint, &driver_name, &handle)?;
        }
    }
    Ok(())
}

/// Whether another pod on the node still has the volume published.
fn used_elsewhere(root: &Path, pod_dir: &Path, driver_name: &str, handle: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return false;
    };
    pods.flatten()
        .filter(|p| p.path() != pod_dir)
        .filter_map(|p| std::fs::read_dir(p.path().join("volumes").join(CSI_PLUGIN_DIR)).ok())
        .flat_map(|d| d.flatten())
        .filter_map(|v| read_vol_data(&v.path()))
        .any(|d| {
            d.get("driverName").map(String::as_str) == Some(driver_name)
                && d.get("volumeHandle").map(String::as_str) == Some(handle)
        })
}

fn unstage(root: &Path, endpoint: &str, driver_name: &str, handle: &str) -> Result<(), CsiError> {
    let global = global_mount_path(root, driver_name, handle);
    let Some(parent) = global.parent().map(Path::to_path_buf) else {
        return Ok(());
    };
    if read_vol_data(&parent).is_none() {
        return Ok(());
    }
    let (endpoint, handle, staging) = (
        endpoint.to_string(),
        handle.to_string(),
        global.display().to_string(),
    );
    block_on(async move {
        let mut client = NodeClient::connect(&endpoint).await?;
        if client.supports_stage().await? {
            client.unstage(&handle, &staging).await?;
        }
        Ok::<(), CsiError>(())
    })??;
    let _ = std::fs::remove_dir(&global);
    let _ = std::fs::remove_file(parent.join(VOL_DATA));
    let _ = std::fs::remove_dir(&parent);
    Ok(())
}
