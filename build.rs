//! Build script: compiles the CRI v1 proto into Rust (client and server) without a system protoc.
//!
//! `protox` parses `proto/runtime/v1/api.proto` into a descriptor set in pure Rust, and
//! `tonic-prost-build` turns that into `$OUT_DIR/runtime.v1.rs`, which `src/cri` includes with
//! `tonic::include_proto!("runtime.v1")`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");

    let fds = protox::compile(["runtime/v1/api.proto"], ["proto"])?;

    tonic_prost_build::configure()
        // The server half lets tests stand up a fake CRI runtime.
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    Ok(())
}
