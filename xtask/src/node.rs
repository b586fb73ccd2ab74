//! What the node suite's VM holds beside the test binary: containerd, runc and the CNI plugins
//! from Debian's packages, the kubelet built with the API server (scripts/kube-tools.sh), and
//! the images the node runs, as OCI archives to import (no registry is reachable).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{debian, image, kube};

/// The images the node suite imports, by name (the test reads them from PALISADE_PAUSE_IMAGE and
/// PALISADE_BUSYBOX_IMAGE).
pub const PAUSE_IMAGE: &str = "palisade.test/pause:1";
pub const BUSYBOX_IMAGE: &str = "palisade.test/busybox:1";

/// (name in the VM, file) of the node's executables.
pub fn binaries() -> anyhow::Result<Vec<(&'static str, PathBuf)>> {
    let containerd = debian::unpacked("containerd")?.join("usr/bin");
    let runc = debian::unpacked("runc")?.join("usr/sbin/runc");
    let cni = debian::unpacked("containernetworking-plugins")?.join("usr/lib/cni");
    Ok(vec![
        ("containerd", containerd.join("containerd")),
        (
            "containerd-shim-runc-v2",
            containerd.join("containerd-shim-runc-v2"),
        ),
        ("ctr", containerd.join("ctr")),
        ("runc", runc),
        ("bridge", cni.join("bridge")),
        ("host-local", cni.join("host-local")),
        ("loopback", cni.join("loopback")),
        ("kubelet", kube::tool("kubelet")?),
    ])
}

/// The pause image containerd starts each pod's sandbox with, and a busybox image for pods:
/// (archive, path in the VM).
pub fn images(dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let root = dir.join("busybox-root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("bin"))?;
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))?;
    let images = [
        (
            "pause",
            PAUSE_IMAGE,
            // A sandbox's first process: waits, and ends on SIGTERM.
            json!({"Entrypoint": ["/bin/busybox", "sh", "-c",
                "trap 'exit 0' TERM INT; while :; do /bin/busybox sleep 3600 & wait; done"]}),
        ),
        (
            "busybox",
            BUSYBOX_IMAGE,
            json!({"Cmd": ["/bin/busybox", "sh"]}),
        ),
    ];
    images
        .into_iter()
        .map(|(name, reference, config)| {
            let archive = dir.join(format!("{name}.oci.tar"));
            let packed = image::pack(&root, config, reference, &dir.join(name), &archive)?;
            Ok((packed.archive, format!("/palisade/images/{name}.oci.tar")))
        })
        .collect()
}
