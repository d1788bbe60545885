//! The driver's part of an online expansion ([`super::expand`] decides when): upstream's
//! `csiPlugin.NodeExpand` for a volume in use. `NodeExpandVolume` goes to the volume as the
//! pod has it published (`…/kubernetes.io~csi/<pv>/mount`), with the staging path when the
//! driver stages, the PV's access mode, file system type and mount options, and the secret of
//! the source's `nodeExpandSecretRef`. A driver without `EXPAND_VOLUME` is not called.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;

use super::client::{NodeClient, Rpc, VolumeCall};
use super::mount::{global_mount_path, read_secret, read_vol_data};
use super::{CsiError, driver};

/// A CSI persistent volume a running pod uses.
pub(crate) struct InUse<'a> {
    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv name>`.
    pub dir: PathBuf,
    pub source: &'a CSIPersistentVolumeSource,
    pub access_modes: &'a [String],
    pub mount_options: &'a [String],
}

/// Whether the volume is published at `dir` (its `vol_data.json` is there): a volume that
/// is not (yet) is expanded by nothing here.
pub(crate) fn published(dir: &Path) -> bool {
    read_vol_data(dir).is_some()
}

/// `NodeExpandVolume` to `bytes` for the volume in use.
pub(crate) async fn expand_in_use(root: &Path, v: &InUse<'_>, bytes: i64) -> Result<(), CsiError> {
    let name = &v.source.driver;
    let registered = driver(name).ok_or_else(|| CsiError::NotRegistered(name.clone()))?;
    let mut client = NodeClient::connect(&registered.endpoint).await?;
    if !client.supports(Rpc::ExpandVolume).await? {
        return Err(CsiError::ExpandNotSupported(name.clone()));
    }
    let staging_path = if client.supports_stage().await? {
        global_mount_path(root, name, &v.source.volume_handle)
            .display()
            .to_string()
    } else {
        String::new()
    };
    let secrets = match &v.source.node_expand_secret_ref {
        Some(r) => {
            read_secret(
                "NodeExpandSecretRef",
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            )
            .await?
        }
        None => HashMap::new(),
    };
    let call = VolumeCall {
        volume_id: v.source.volume_handle.clone(),
        staging_path,
        target_path: v.dir.join("mount").display().to_string(),
        fs_type: v.source.fs_type.clone().unwrap_or_default(),
        mount_flags: v.mount_options.to_vec(),
        access_mode: v
            .access_modes
            .first()
            .cloned()
            .unwrap_or_else(|| "ReadWriteOnce".into()),
        secrets,
        ..Default::default()
    };
    client.expand(&call, bytes).await.map(|_| ())
}
