//! A CSI driver's Node service over its Unix socket, with upstream's time-out for each call
//! (`csiTimeout`, 2 minutes).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::CsiError;
use super::proto;
use super::proto::node_client::NodeClient as Raw;
pub(crate) use super::proto::node_service_capability::rpc::Type as Rpc;

/// Upstream's time-out of one CSI call.
const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting to the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What `NodeGetInfo` said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeInfo {
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
}

/// One publish or stage call's arguments.
#[derive(Clone, Debug, Default)]
pub(crate) struct VolumeCall {
    pub volume_id: String,
    pub staging_path: String,
    pub target_path: String,
    pub read_only: bool,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
    /// The Kubernetes access mode (`ReadWriteOnce`, …).
    pub access_mode: String,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub secrets: HashMap<String, String>,
}

/// Upstream's mapping of a Kubernetes access mode to CSI's (`asCSIAccessModeV1`).
pub(crate) fn csi_access_mode(mode: &str) -> proto::volume_capability::access_mode::Mode {
    use proto::volume_capability::access_mode::Mode;
    match mode {
        "ReadWriteOnce" => Mode::SingleNodeWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        _ => Mode::Unknown,
    }
}

impl VolumeCall {
    fn capability(&self) -> proto::VolumeCapability {
        use proto::volume_capability::{AccessMode, AccessType, MountVolume};
        proto::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: self.fs_type.clone(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: String::new(),
            })),
            access_mode: Some(AccessMode {
                mode: csi_access_mode(&self.access_mode) as i32,
            }),
        }
    }
}

/// A connection to one driver.
pub(crate) struct NodeClient {
    raw: Raw<tonic::transport::Channel>,
}

fn failed(call: &'static str) -> impl Fn(tonic::Status) -> CsiError {
    move |status| CsiError::Call {
        call,
        reason: format!(
            "rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        ),
    }
}

impl NodeClient {
    /// Connects to `endpoint` (a socket path, or `unix://path`).
    pub(crate) async fn connect(endpoint: &str) -> Result<Self, CsiError> {
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|e| CsiError::Call {
                call: "connect",
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CSI_TIMEOUT)
            .connect()
            .await
            .map_err(|e| CsiError::Call {
                call: "connect",
                reason: format!("{path}: {e}"),
            })?;
        Ok(NodeClient {
            raw: Raw::new(channel),
        })
    }

    pub(crate) async fn node_get_info(&mut self) -> Result<NodeInfo, CsiError> {
        let info = self
            .raw
            .node_get_info(proto::NodeGetInfoRequest {})
            .await
            .map_err(failed("NodeGetInfo"))?
            .into_inner();
        Ok(NodeInfo {
            node_id: info.node_id,
            max_volumes: info.max_volumes_per_node,
            topology: info
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
        })
    }

    /// Whether the driver advertises the Node service capability `rpc`.
    pub(crate) async fn supports(&mut self, rpc: Rpc) -> Result<bool, CsiError> {
        use proto::node_service_capability::Type;
        let caps = self
            .raw
            .node_get_capabilities(proto::NodeGetCapabilitiesRequest {})
            .await
            .map_err(failed("NodeGetCapabilities"))?
            .into_inner();
        Ok(caps
            .capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == rpc as i32)))
    }

    /// Whether the driver advertises `STAGE_UNSTAGE_VOLUME`.
    pub(crate) async fn supports_stage(&mut self) -> Result<bool, CsiError> {
        self.supports(Rpc::StageUnstageVolume).await
    }

    /// Whether the driver advertises `GET_VOLUME_STATS`.
    pub(crate) async fn supports_stats(&mut self) -> Result<bool, CsiError> {
        self.supports(Rpc::GetVolumeStats).await
    }

    /// `NodeExpandVolume` of the volume published at `call.target_path` (the pod's mount,
    /// upstream's `DeviceMountPath` for a volume in use) to `required_bytes`; the driver's
    /// status code is kept, as upstream decides on it what to tell the claim.
    pub(crate) async fn expand(
        &mut self,
        call: &VolumeCall,
        required_bytes: i64,
    ) -> Result<i64, CsiError> {
        let request = proto::NodeExpandVolumeRequest {
            volume_id: call.volume_id.clone(),
            volume_path: call.target_path.clone(),
            capacity_range: Some(proto::CapacityRange {
                required_bytes,
                limit_bytes: 0,
            }),
            staging_target_path: call.staging_path.clone(),
            volume_capability: Some(call.capability()),
            secrets: call.secrets.clone(),
        };
        let answer = self
            .raw
            .node_expand_volume(request)
            .await
            .map_err(|status| CsiError::Expand {
                code: status.code(),
                reason: format!(
                    "rpc error: code = {:?} desc = {}",
                    status.code(),
                    status.message()
                ),
            })?
            .into_inner();
        Ok(answer.capacity_bytes)
    }

    /// `NodeGetVolumeStats` of the volume published at `volume_path`.
    pub(crate) async fn volume_stats(
        &mut self,
        volume_id: &str,
        volume_path: &str,
        staging: &str,
    ) -> Result<Vec<proto::VolumeUsage>, CsiError> {
        let request = proto::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: volume_path.to_string(),
            staging_target_path: staging.to_string(),
        };
        let answer = self
            .raw
            .node_get_volume_stats(request)
            .await
            .map_err(failed("NodeGetVolumeStats"))?
            .into_inner();
        Ok(answer.usage)
    }

    pub(crate) async fn stage(&mut self, call: &VolumeCall) -> Result<(), CsiError> {
        let request = proto::NodeStageVolumeRequest {
            volume_id: call.volume_id.clone(),
            publish_context: call.publish_context.clone(),
            staging_target_path: call.staging_path.clone(),
            volume_capability: Some(call.capability()),
            secrets: call.secrets.clone(),
            volume_context: call.volume_context.clone(),
        };
        self.raw
            .node_stage_volume(request)
            .await
            .map_err(failed("attacher.MountDevice"))?;
        Ok(())
    }

    pub(crate) async fn publish(&mut self, call: &VolumeCall) -> Result<(), CsiError> {
        let request = proto::NodePublishVolumeRequest {
            volume_id: call.volume_id.clone(),
            publish_context: call.publish_context.clone(),
            staging_target_path: call.staging_path.clone(),
            target_path: call.target_path.clone(),
            volume_capability: Some(call.capability()),
            readonly: call.read_only,
            secrets: call.secrets.clone(),
            volume_context: call.volume_context.clone(),
        };
        self.raw
            .node_publish_volume(request)
            .await
            .map_err(failed("mounter.SetUpAt"))?;
        Ok(())
    }

    pub(crate) async fn unpublish(
        &mut self,
        volume_id: &str,
        target: &str,
    ) -> Result<(), CsiError> {
        let request = proto::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target.to_string(),
        };
        self.raw
            .node_unpublish_volume(request)
            .await
            .map_err(failed("mounter.TearDownAt"))?;
        Ok(())
    }

    pub(crate) async fn unstage(&mut self, volume_id: &str, staging: &str) -> Result<(), CsiError> {
        let request = proto::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: staging.to_string(),
        };
        self.raw
            .node_unstage_volume(request)
            .await
            .map_err(failed("attacher.UnmountDevice"))?;
        Ok(())
    }
}
