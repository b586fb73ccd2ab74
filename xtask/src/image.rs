//! `cargo xtask image`: the agent's container image, built without a container engine into an
//! OCI image layout and an OCI archive (`ctr images import`, `docker load`), reproducibly: the
//! same inputs give the same digest. The Dockerfile lays out the same root filesystem with
//! `cargo xtask image --rootfs DIR` and copies it onto an empty base.
//!
//! `cargo xtask image-test` checks it: two builds give one digest, umoci (Debian's package)
//! verifies and unpacks the layout, and `palisade --version` runs in a chroot of what it unpacked.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, ensure};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{build, debian};

/// The image's name, as the chart's `image.repository` defaults to it.
pub const REPOSITORY: &str = "ghcr.io/palisade-dev/palisade";
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
/// filesystem in `root`: the binary, the shared libraries it links, the modules, nothing else.
pub fn rootfs(root: &Path) -> anyhow::Result<()> {
    let palisade = build::agent_release()?;
    let _ = std::fs::remove_dir_all(root);
    let rules = root.join(RULES_DIR);
    std::fs::create_dir_all(&rules)?;
    build::build_rule_modules(&palisade, &RULE_MODULES, &rules)?;
    let binary = root.join(BINARY);
    std::fs::create_dir_all(binary.parent().expect("has a parent"))?;
    // Without debug information: stripped binaries of the same source are the same bytes.
    let status = Command::new("strip")
        .arg("-o")
        .arg(&binary)
        .arg(&palisade)
        .status()?;
    ensure!(status.success(), "strip {} failed", palisade.display());
    for library in build::shared_libraries(&palisade)? {
        let target = root.join(library.strip_prefix("/")?);
        std::fs::create_dir_all(target.parent().expect("has a parent"))?;
        std::fs::copy(&library, &target)
            .with_context(|| format!("copying {}", library.display()))?;
    }
    Ok(())
}

/// Builds the image into target/image.
pub fn build() -> anyhow::Result<Image> {
    let out = out_dir();
    let root = out.join("rootfs");
    rootfs(&root)?;
    let layer_tar = tar_of(&root)?;
    let diff_id = sha256(&layer_tar);
    let mut layer = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    layer.write_all(&layer_tar)?;
    let layer = layer.finish()?;

    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY}")],
            "Labels": {
                "org.opencontainers.image.title": "palisade",
                "org.opencontainers.image.version": VERSION,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created_by": "cargo xtask image" }],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(CONFIG_TYPE, &config),
        "layers": [descriptor(LAYER_TYPE, &layer)],
    }))?;
    let mut manifest_descriptor = descriptor(MANIFEST_TYPE, &manifest);
    manifest_descriptor["platform"] = json!({ "architecture": "amd64", "os": "linux" });
    manifest_descriptor["annotations"] = json!({
        // containerd names the imported image by the first, OCI tools by the second.
        "io.containerd.image.name": format!("{REPOSITORY}:{VERSION}"),
        "org.opencontainers.image.ref.name": VERSION,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;

    let layout = out.join("oci");
    let _ = std::fs::remove_dir_all(&layout);
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
    let archive = out.join(format!("palisade-{VERSION}.oci.tar"));
    std::fs::write(&archive, tar_of(&layout)?)?;
    Ok(Image {
        layout,
        archive,
        digest: sha256(&manifest),
    })
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
    debian::output(
        Command::new(&umoci)
            .arg("unpack")
            .arg("--image")
            .arg(format!("{}:{VERSION}", second.layout.display()))
            .arg(&bundle),
    )?;
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
    let version = debian::output(
        Command::new("chroot")
            .arg(&rootfs)
            .args([&format!("/{BINARY}"), "--version"]),
    )?;
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
