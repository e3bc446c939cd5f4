//! Builds the agent library (crates/uswap-agent) so that the `uswap` binary
//! carries it: `uswap run` preloads it into the program it serves, with no
//! install step. A cargo build of its own, in a target directory of its
//! own (the outer build holds the workspace's).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let crates = here.parent().expect("crates/").to_path_buf();
    for watched in [
        "uswap-agent/src",
        "uswap-agent/Cargo.toml",
        "uswap-protocol/src",
        "uswap-protocol/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", crates.join(watched).display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = out.join("agent-target");
    let mut build = Command::new(cargo);
    build
        .args(["build", "--release", "-p", "uswap-agent", "--manifest-path"])
        .arg(crates.join("uswap-agent/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    // What the outer build set for itself must not steer this one.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_CFG_")
            || matches!(
                key.as_str(),
                "CARGO_TARGET_DIR" | "CARGO_BUILD_TARGET" | "RUSTFLAGS" | "CARGO_ENCODED_RUSTFLAGS"
            )
        {
            build.env_remove(key);
        }
    }
    let status = build.status().expect("running cargo to build the agent");
    assert!(status.success(), "building the agent library failed");
    let lib = target_dir.join("release/libuswap_agent.so");
    println!("cargo:rustc-env=USWAP_AGENT_SO={}", lib.display());
}
