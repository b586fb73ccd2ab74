//! `palisade rules build DIR`: a Rust rule crate (using palisade-rule-sdk) built for
//! `wasm32-unknown-unknown` and wrapped as a component, the form the agent loads.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, ensure};

/// Builds the rule crate in `dir` and writes the component to `out`; returns its SHA-256
/// digest (hex).
pub fn build(dir: &Path, out: &Path) -> anyhow::Result<String> {
    let manifest = dir.join("Cargo.toml");
    ensure!(
        manifest.is_file(),
        "{}: no Cargo.toml: a rule module is a Rust crate using palisade-rule-sdk",
        dir.display()
    );
    let core = build_core(&manifest)?;
    let bytes = std::fs::read(&core).with_context(|| format!("reading {}", core.display()))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|err| anyhow::anyhow!("{err:#}"))
        .with_context(|| {
            format!(
                "{}: not a rule module (does it export a rule with palisade_rule_sdk::rule!?)",
                core.display()
            )
        })?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, &component).with_context(|| format!("writing {}", out.display()))?;
    Ok(super::host::hex_digest(&component))
}

/// `cargo build --release` for wasm32-unknown-unknown; returns the core module built.
fn build_core(manifest: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-unknown-unknown",
            "--lib",
        ])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--message-format=json-render-diagnostics")
        // Debug information would make up most of the module.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    ensure!(
        out.status.success(),
        "building {} failed (is the target installed? rustup target add wasm32-unknown-unknown)",
        manifest.display()
    );
    let mut built = None;
    for line in String::from_utf8(out.stdout)?.lines() {
        let message: serde_json::Value = serde_json::from_str(line)?;
        let is_lib = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|kind| kind == "cdylib"));
        let from_manifest =
            message["manifest_path"].as_str().map(Path::new) == Some(&manifest.canonicalize()?);
        if is_lib && from_manifest {
            built = message["filenames"]
                .as_array()
                .and_then(|files| {
                    files
                        .iter()
                        .filter_map(|file| file.as_str())
                        .find(|file| file.ends_with(".wasm"))
                })
                .map(PathBuf::from);
        }
    }
    built.with_context(|| {
        format!(
            "{} built no WebAssembly module: its [lib] needs crate-type = [\"cdylib\"]",
            manifest.display()
        )
    })
}
