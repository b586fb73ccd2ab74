//! `palisade rules build DIR`: a Rust rule crate or model transform (using palisade-rule-sdk)
//! built for `wasm32-unknown-unknown` and wrapped as a component, or the Rego files of DIR
//! compiled by `opa build -t wasm`: the two forms the agent loads.

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{Context, ensure};

/// Builds the rule module in `dir` and writes it to `out`; returns its SHA-256 digest (hex).
pub fn build(dir: &Path, out: &Path) -> anyhow::Result<String> {
    let module = if dir.join("Cargo.toml").is_file() {
        build_rust(dir)?
    } else {
        build_rego(dir)?
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, &module).with_context(|| format!("writing {}", out.display()))?;
    Ok(super::host::hex_digest(&module))
}

/// The policy.wasm `opa build` makes of DIR's *.rego files (the JSON fixtures beside them stay
/// out of the bundle's data).
fn build_rego(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "rego"))
        .collect();
    sources.sort();
    ensure!(
        !sources.is_empty(),
        "{}: neither a Rust crate (Cargo.toml) nor Rego files (*.rego)",
        dir.display()
    );
    // A directory of this build's own (a process may build several modules at once), made
    // afresh: one already there under its name is refused, not used.
    static BUILDS: AtomicU64 = AtomicU64::new(0);
    let build_number = BUILDS.fetch_add(1, Ordering::Relaxed);
    let work = std::env::temp_dir().join(format!(
        "palisade-rego-{}-{build_number}",
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .with_context(|| format!("creating {}", work.display()))?;
    let module = opa_build(dir, &sources, &work);
    std::fs::remove_dir_all(&work)?;
    module
}

/// `opa build` of `sources` (the Rego files of `dir`) in `work`: its policy.wasm.
fn opa_build(dir: &Path, sources: &[PathBuf], work: &Path) -> anyhow::Result<Vec<u8>> {
    let bundle = work.join("bundle.tar.gz");
    let mut build = Command::new("opa");
    build.args(["build", "-t", "wasm"]);
    for entrypoint in entrypoints(sources)? {
        build.args(["-e", entrypoint]);
    }
    let status = build
        .arg("-o")
        .arg(&bundle)
        .args(sources)
        .status()
        .context("running opa (scripts/install.sh installs it)")?;
    ensure!(status.success(), "opa build failed for {}", dir.display());
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&bundle)
        .arg("-C")
        .arg(work)
        .arg("/policy.wasm")
        // GNU tar notes that it drops the leading "/": nothing to report.
        .stderr(Stdio::null())
        .status()
        .context("running tar")?;
    ensure!(status.success(), "the bundle opa built has no policy.wasm");
    Ok(std::fs::read(work.join("policy.wasm"))?)
}

/// The entrypoints of the ABI (a rule module's, a model transform's) that the package
/// `palisade` of `sources` defines: `opa build` refuses entrypoints no rule defines.
fn entrypoints(sources: &[PathBuf]) -> anyhow::Result<Vec<&'static str>> {
    let mut defined = Vec::new();
    for source in sources {
        let parsed = Command::new("opa")
            .args(["parse", "--format", "json"])
            .arg(source)
            .output()
            .context("running opa (scripts/install.sh installs it)")?;
        ensure!(
            parsed.status.success(),
            "{}: {}",
            source.display(),
            String::from_utf8_lossy(&parsed.stderr).trim()
        );
        let ast: serde_json::Value = serde_json::from_slice(&parsed.stdout)?;
        let package: Vec<&str> = ast["package"]["path"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|term| term["value"].as_str())
            .collect();
        if package != ["data", "palisade"] {
            continue;
        }
        for rule in ast["rules"].as_array().into_iter().flatten() {
            let head = &rule["head"];
            if let Some(name) = head["name"].as_str().or(head["ref"][0]["value"].as_str()) {
                defined.push(name.to_owned());
            }
        }
    }
    let entrypoints: Vec<&str> = [
        super::opa::COMPILE_ENTRYPOINT,
        super::opa::DECIDE_ENTRYPOINT,
        super::opa::TRANSFORM_ENTRYPOINT,
    ]
    .into_iter()
    .filter(|entrypoint| {
        defined
            .iter()
            .any(|name| entrypoint.ends_with(&format!("/{name}")))
    })
    .collect();
    ensure!(
        !entrypoints.is_empty(),
        "the package palisade of the Rego files defines none of compile, decide (a rule module) \
         and transform (a model transform)"
    );
    Ok(entrypoints)
}

/// The component built from the rule crate in `dir`.
fn build_rust(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let core = build_core(&dir.join("Cargo.toml"))?;
    let bytes = std::fs::read(&core).with_context(|| format!("reading {}", core.display()))?;
    wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|err| anyhow::anyhow!("{err:#}"))
        .with_context(|| {
            format!(
                "{}: not a rule module (does it export a rule with palisade_rule_sdk::rule!, or a \
                 model transform with palisade_rule_sdk::model_transform!?)",
                core.display()
            )
        })
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
