//! Build script: compiles Deckhand's protos into Rust (client and server) without a system protoc.
//!
//! `protox` parses `proto/runtime/v1/api.proto` (CRI v1) and `proto/grpc/health/v1/health.proto`
//! (the gRPC health protocol that `grpc` probes speak) into one descriptor set in pure Rust, and
//! `tonic-prost-build` turns that into `$OUT_DIR/runtime.v1.rs` and `$OUT_DIR/grpc.health.v1.rs`,
//! which `src/cri` and `src/prober` include with `tonic::include_proto!`. A small subset of
//! containerd's content service (`proto/containerd/...`) lets `src/cri/pull_progress.rs` see
//! whether an image pull is still receiving bytes, and a subset of its event service and event
//! payloads (`proto/containerd/services/events`, `proto/containerd/events`) lets the PLEG
//! (`src/pleg/feed.rs`) hear of container exits as they happen. The kubelet's plugin
//! registration protocol (`proto/pluginregistration/v1`) and the CSI Node service's subset
//! (`proto/csi/v1`) serve `src/kubelet/plugin_watcher` and `src/kubelet/volume/csi`; the
//! device plugin API (`proto/deviceplugin/v1beta1`) and pod-resources API
//! (`proto/podresources/v1`) are served and called by `src/kubelet/devices`; DRA drivers'
//! `proto/dra/v1` and their optional device health service (`proto/drahealth/v1alpha1`) are
//! called by `src/kubelet/dra`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // The agent is a position-independent executable, so the loader relocates ~50 000
    // pointers at start-up. Packed (RELR) relocations keep them in a few KiB instead of
    // ~1.2 MiB of entries that are read at every start and then stay resident (file-backed
    // RSS). glibc has read them since 2.36 (Debian 12) and GNU ld writes them since 2.38.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }

    let fds = protox::compile(
        [
            "runtime/v1/api.proto",
            "grpc/health/v1/health.proto",
            "containerd/services/content/v1/content.proto",
            "containerd/services/events/v1/events.proto",
            "containerd/events/events.proto",
            "pluginregistration/v1/api.proto",
            "csi/v1/csi.proto",
            "deviceplugin/v1beta1/api.proto",
            "podresources/v1/api.proto",
            "dra/v1/api.proto",
            "drahealth/v1alpha1/api.proto",
        ],
        ["proto"],
    )?;

    tonic_prost_build::configure()
        // The server half lets tests stand up a fake CRI runtime and a health-serving target.
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    Ok(())
}
