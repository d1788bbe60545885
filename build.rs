//! Build script: compiles Deckhand's protos into Rust (client and server) without a system protoc.
//!
//! `protox` parses `proto/runtime/v1/api.proto` (CRI v1) and `proto/grpc/health/v1/health.proto`
//! (the gRPC health protocol that `grpc` probes speak) into one descriptor set in pure Rust, and
//! `tonic-prost-build` turns that into `$OUT_DIR/runtime.v1.rs` and `$OUT_DIR/grpc.health.v1.rs`,
//! which `src/cri` and `src/prober` include with `tonic::include_proto!`. A small subset of
//! containerd's content service (`proto/containerd/...`) lets `src/cri/pull_progress.rs` see
//! whether an image pull is still receiving bytes, and a subset of its event service and event
//! payloads (`proto/containerd/services/events`, `proto/containerd/events`) lets the PLEG
//! (`src/pleg/feed.rs`) hear of container exits as they happen.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");

    let fds = protox::compile(
        [
            "runtime/v1/api.proto",
            "grpc/health/v1/health.proto",
            "containerd/services/content/v1/content.proto",
            "containerd/services/events/v1/events.proto",
            "containerd/events/events.proto",
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
