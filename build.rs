//! Compiles the project's own protos (proto/) with protox, a pure-Rust protobuf compiler, so a
//! fresh machine needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/runtime/v1/api.proto",
        "proto/containerd/services/events/v1/events.proto",
        "proto/containerd/events/task.proto",
        "proto/containerd/events/container.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // Server stubs too, for the tests' fake CRI runtime and containerd event stream; behind a
    // feature, so the node binary holds no gRPC server.
    tonic_prost_build::configure()
        .build_server(true)
        .server_mod_attribute(".", r#"#[cfg(feature = "fake-runtime")]"#)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
