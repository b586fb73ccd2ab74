//! `cargo xtask image`: the agent's container image, built without a container engine into an
//! OCI image layout and an OCI archive (`ctr images import`, `docker load`). The packaging is
//! deterministic: the same binaries and modules give the same digest (cargo builds them the same
//! from the same sources at the same paths: panic messages name source files). The Dockerfile
//! lays out the same root filesystem with `cargo xtask image --rootfs DIR` onto an empty base.
//!
//! `cargo xtask image-test` checks it: two builds give one digest, umoci (Debian's package)
//! verifies and unpacks the layout, and `palisade --version` runs in a chroot of what it unpacked.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{build, debian, run};

/// The image's name, as the chart's `image.repository` defaults to it.
const REPOSITORY: &str = "ghcr.io/palisade-dev/palisade";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The built-in rule modules, in /usr/lib/palisade/rules (the agent's `--rule-modules`).
const RULE_MODULES: [&str; 3] = [
    "rules/capabilities",
    "rules/file-protection",
    "rules/network",
];
const RULES_DIR: &str = "usr/lib/palisade/rules";
const BINARY: &str = "usr/bin/palisade";

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// A built image.
pub struct Image {
    /// The OCI image layout (a directory).
    pub layout: PathBuf,
    /// The same layout as one tar file.
    pub archive: PathBuf,
    /// The manifest's digest, `sha256:...`.
    pub digest: String,
}

fn out_dir() -> PathBuf {
    crate::workspace().join("target/image")
}

/// Builds the agent (release) and the built-in rule modules and lays out the image's root
/// filesystem in `root` (a new or empty directory): the binary, the shared libraries it links,
/// the modules, nothing else.
pub fn rootfs(root: &Path) -> anyhow::Result<()> {
    ensure!(
        !root.exists() || std::fs::read_dir(root)?.next().is_none(),
        "{} is not empty: the root filesystem goes into a new or empty directory",
        root.display()
    );
    let palisade = build::agent_release()?;
    let rules = root.join(RULES_DIR);
    std::fs::create_dir_all(&rules)?;
    build::build_rule_modules(&palisade, &RULE_MODULES, &rules)?;
    build::install_executable(root, &palisade, BINARY)?;
    Ok(())
}

/// Builds the image into target/image.
pub fn build() -> anyhow::Result<Image> {
    let out = out_dir();
    let root = out.join("rootfs");
    let _ = std::fs::remove_dir_all(&root);
    rootfs(&root)?;
    let config = json!({
        "Entrypoint": [format!("/{BINARY}")],
        "Labels": {
            "org.opencontainers.image.title": "palisade",
            "org.opencontainers.image.version": VERSION,
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    });
    pack(
        &root,
        config,
        &reference(),
        &out.join("oci"),
        &out.join(format!("palisade-{VERSION}.oci.tar")),
    )
}

/// Packs the tree under `root` as a one-layer image for this machine's architecture, named
/// `reference` (NAME:TAG), with `config` as its runtime configuration (Entrypoint, Cmd...):
/// an OCI layout in the directory `layout` and the same as one tar file, `archive`.
pub fn pack(
    root: &Path,
    config: Value,
    reference: &str,
    layout: &Path,
    archive: &Path,
) -> anyhow::Result<Image> {
    let tag = reference
        .rsplit_once(':')
        .map(|(_, tag)| tag)
        .with_context(|| format!("{reference} has no tag"))?;
    let layer_tar = tar_of(root)?;
    let diff_id = sha256(&layer_tar);
    let mut layer = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    layer.write_all(&layer_tar)?;
    let layer = layer.finish()?;

    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no OCI name for the architecture {other}"),
    };
    let config = serde_json::to_vec(&json!({
        "architecture": architecture,
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created_by": "cargo xtask" }],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(CONFIG_TYPE, &config),
        "layers": [descriptor(LAYER_TYPE, &layer)],
    }))?;
    let mut manifest_descriptor = descriptor(MANIFEST_TYPE, &manifest);
    manifest_descriptor["platform"] = json!({ "architecture": architecture, "os": "linux" });
    manifest_descriptor["annotations"] = json!({
        // containerd names the imported image by the first, OCI tools by the second.
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;

    let _ = std::fs::remove_dir_all(layout);
    std::fs::create_dir_all(layout.join("blobs/sha256"))?;
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    std::fs::write(layout.join("index.json"), &index)?;
    for blob in [&config, &manifest, &layer] {
        let digest = sha256(blob);
        let name = digest.strip_prefix("sha256:").expect("a sha256 digest");
        std::fs::write(layout.join("blobs/sha256").join(name), blob)?;
    }
    // `docker load` without containerd's image store reads manifest.json (as `docker save`
    // writes it beside the OCI layout's files); every other tool reads the layout.
    let blob = |bytes: &[u8]| format!("blobs/sha256/{}", &sha256(bytes)["sha256:".len()..]);
    let docker_manifest = serde_json::to_vec(&json!([{
        "Config": blob(&config),
        "RepoTags": [reference],
        "Layers": [blob(&layer)],
    }]))?;
    std::fs::write(layout.join("manifest.json"), docker_manifest)?;
    std::fs::write(archive, tar_of(layout)?)?;
    Ok(Image {
        layout: layout.to_path_buf(),
        archive: archive.to_path_buf(),
        digest: sha256(&manifest),
    })
}

/// The image's name and tag.
pub fn reference() -> String {
    format!("{REPOSITORY}:{VERSION}")
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": sha256(blob), "size": blob.len() })
}

/// A tar of the tree under `root`, the same bytes for the same files: entries in name order,
/// owned by root, time 0, modes 0755 (directories and executables) or 0644.
fn tar_of(root: &Path) -> anyhow::Result<Vec<u8>> {
    let mut paths = BTreeSet::new();
    walk(root, root, &mut paths)?;
    let mut tar = tar::Builder::new(Vec::new());
    for relative in paths {
        let path = root.join(&relative);
        let metadata = std::fs::symlink_metadata(&path)?;
        ensure!(
            metadata.is_dir() || metadata.is_file(),
            "{} is neither a file nor a directory",
            path.display()
        );
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        if metadata.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            tar.append_data(&mut header, &relative, std::io::empty())?;
        } else {
            let executable =
                std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o111 != 0;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if executable { 0o755 } else { 0o644 });
            header.set_size(metadata.len());
            tar.append_data(&mut header, &relative, std::fs::File::open(&path)?)?;
        }
    }
    Ok(tar.into_inner()?)
}

/// Every file and directory below `dir`, relative to `root`.
fn walk(root: &Path, dir: &Path, paths: &mut BTreeSet<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        paths.insert(path.strip_prefix(root)?.to_path_buf());
        if path.is_dir() && !path.is_symlink() {
            walk(root, &path, paths)?;
        }
    }
    Ok(())
}

/// `cargo xtask image-test`.
pub fn test() -> anyhow::Result<()> {
    // The chart's DaemonSet runs the image tagged with the chart's appVersion.
    let chart: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        crate::workspace().join("charts/palisade/Chart.yaml"),
    )?)?;
    ensure!(
        chart["appVersion"].as_str() == Some(VERSION),
        "the chart's appVersion {:?} is not the image's tag {VERSION}",
        chart["appVersion"]
    );
    let first = build()?;
    let second = build()?;
    ensure!(
        first.digest == second.digest,
        "two builds of the same sources gave two images: {} and {}",
        first.digest,
        second.digest
    );
    // umoci checks every blob's digest and size against its descriptor and each layer's
    // uncompressed digest against the config's diff_ids while it unpacks.
    let umoci = debian::unpacked("umoci")?.join("usr/bin/umoci");
    let bundle = out_dir().join("bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    run(Command::new(&umoci)
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{VERSION}", second.layout.display()))
        .arg(&bundle))?;
    let runtime: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
    ensure!(
        runtime["process"]["args"] == json!([format!("/{BINARY}")]),
        "the image runs {} instead of /{BINARY}",
        runtime["process"]["args"]
    );
    let rootfs = bundle.join("rootfs");
    let mut unpacked = BTreeSet::new();
    walk(&rootfs, &rootfs, &mut unpacked)?;
    let mut built = BTreeSet::new();
    let built_root = out_dir().join("rootfs");
    walk(&built_root, &built_root, &mut built)?;
    ensure!(
        unpacked == built,
        "the unpacked image holds {unpacked:?}, not {built:?}"
    );
    for module in RULE_MODULES {
        let name = Path::new(module).file_name().expect("a crate directory");
        let file = Path::new(RULES_DIR).join(name).with_extension("wasm");
        ensure!(
            unpacked.contains(&file),
            "the image has no {}",
            file.display()
        );
    }
    let version = run(Command::new("chroot")
        .arg(&rootfs)
        .args([&format!("/{BINARY}"), "--version"]))?;
    ensure!(
        version.trim() == format!("palisade {VERSION}"),
        "`palisade --version` in the image printed {version:?}"
    );
    println!(
        "image-test: {} ({}) unpacks, holds {} files and directories and runs: {}",
        second.digest,
        second.archive.display(),
        unpacked.len(),
        version.trim()
    );
    Ok(())
}
