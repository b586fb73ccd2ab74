//! What the node suite's VM holds beside the test binary: containerd, runc and the CNI plugins
//! from Debian's packages, the kubelet and helm (scripts/kube-tools.sh), the chart, and the
//! images the node runs (the agent's among them), as OCI archives to import (no registry is
//! reachable).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use serde_json::json;

use crate::{debian, image, kube, run};

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
        ("helm", kube::tool("helm")?),
    ])
}

/// The chart, packaged: (archive, path in the VM).
pub fn chart(dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let packaged = dir.join("chart");
    let _ = std::fs::remove_dir_all(&packaged);
    run(Command::new(kube::tool("helm")?)
        .arg("package")
        .arg(crate::workspace().join("charts/palisade"))
        .arg("--destination")
        .arg(&packaged))?;
    let archive = std::fs::read_dir(&packaged)?
        .next()
        .context("helm package wrote nothing")??
        .path();
    Ok((archive, "/palisade/chart.tgz".to_owned()))
}

/// The agent's image (`cargo xtask image`), the pause image containerd starts each pod's sandbox
/// with, and a busybox image for pods: (archive, path in the VM).
pub fn images(dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let agent = image::build()?;
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
    let mut archives = vec![(agent.archive, "/palisade/images/agent.oci.tar".to_owned())];
    for (name, reference, config) in images {
        let archive = dir.join(format!("{name}.oci.tar"));
        let packed = image::pack(&root, config, reference, &dir.join(name), &archive)?;
        archives.push((packed.archive, format!("/palisade/images/{name}.oci.tar")));
    }
    Ok(archives)
}
