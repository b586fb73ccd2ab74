//! Debian kernel packages: resolved by series at run time (package versions move), downloaded
//! with apt and cached outside the clone.

use std::{path::PathBuf, process::Command};

use anyhow::Context;

use crate::{
    cache_dir,
    debian::{download, lock},
    run,
};

/// The image package of the newest `linux-image-amd64` of `series` (e.g. "6.12") apt knows.
fn resolve(series: &str) -> anyhow::Result<String> {
    let madison = run(Command::new("apt-cache").args(["madison", "linux-image-amd64"]))?;
    let version = madison
        .lines()
        .filter_map(|line| line.split('|').nth(1).map(str::trim))
        .find(|version| {
            version
                .strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .with_context(|| {
            format!(
                "apt knows no linux-image-amd64 of the {series} series (6.12 comes from \
                 bookworm-backports: run scripts/install.sh, which adds it and runs apt-get update)"
            )
        })?;
    let depends =
        run(Command::new("apt-cache").args(["depends", &format!("linux-image-amd64={version}")]))?;
    depends
        .lines()
        .find_map(|line| line.trim().strip_prefix("Depends: "))
        .map(str::to_owned)
        .with_context(|| format!("linux-image-amd64={version} names no image package"))
}

/// Kernel modules the VM loads, in this order (a module after those it needs): a RAM disk (block
/// devices) and a block-device file system, so that the rules on disk devices meet real ones;
/// overlayfs, on which container runtimes mount a container's root; XFS on a loop device, whose
/// handle ioctls open files; binfmt_misc, whose formats name interpreters; the NIC through which
/// the Kubernetes test reaches the API server on the host; the bridge and veth pairs of the node
/// suite's pod network (CNI's bridge plugin).
const MODULES: [&str; 13] = [
    "drivers/block/brd",
    "fs/minix/minix",
    "fs/overlayfs/overlay",
    "drivers/block/loop",
    "crypto/crc32c_generic",
    "lib/libcrc32c",
    "fs/xfs/xfs",
    "fs/binfmt_misc",
    "drivers/net/ethernet/intel/e1000/e1000",
    "net/llc/llc",
    "net/802/stp",
    "net/bridge/bridge",
    "drivers/net/veth",
];

/// A Debian kernel, extracted from its package.
pub struct Kernel {
    pub vmlinuz: PathBuf,
    /// `uname -r` of the kernel.
    pub release: String,
    /// The `MODULES`, uncompressed.
    pub modules: Vec<PathBuf>,
}

/// The kernel of `series`, downloading and extracting it on first use.
pub fn fetch(series: &str) -> anyhow::Result<Kernel> {
    let package = resolve(series)?;
    let release = package
        .strip_prefix("linux-image-")
        .with_context(|| format!("{package} is not a linux-image package"))?
        .to_owned();
    let dir = cache_dir().join("kernels");
    let _lock = lock(&dir)?;
    let kernel = Kernel {
        vmlinuz: dir.join(format!("{package}.vmlinuz")),
        modules: MODULES
            .iter()
            .map(|module| {
                let name = module.rsplit('/').next().expect("a name");
                dir.join(format!("{package}.modules/{name}.ko"))
            })
            .collect(),
        release,
    };
    if kernel.vmlinuz.exists() && kernel.modules.iter().all(|module| module.exists()) {
        return Ok(kernel);
    }
    let deb = download(&dir, &package)?;
    let extract = dir.join(format!("{package}.extract"));
    let _ = std::fs::remove_dir_all(&extract);
    std::fs::create_dir_all(&extract)?;
    let module_patterns: Vec<String> = MODULES
        .iter()
        .map(|module| format!("'./lib/modules/*/kernel/{module}.ko*'"))
        .collect();
    let script = format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*' {}",
        deb.display(),
        extract.display(),
        module_patterns.join(" ")
    );
    run(Command::new("sh").args(["-c", &script]))?;
    std::fs::rename(
        extract.join(format!("boot/vmlinuz-{}", kernel.release)),
        &kernel.vmlinuz,
    )
    .with_context(|| format!("{} holds no vmlinuz-{}", deb.display(), kernel.release))?;
    let modules_dir = dir.join(format!("{package}.modules"));
    std::fs::create_dir_all(&modules_dir)?;
    for (module, target) in MODULES.iter().zip(&kernel.modules) {
        let packed = extract.join(format!("lib/modules/{}/kernel/{module}.ko", kernel.release));
        let compressed = packed.with_extension("ko.xz");
        if compressed.exists() {
            run(Command::new("xz").arg("-d").arg(&compressed))?;
        }
        std::fs::rename(&packed, target)
            .with_context(|| format!("{} holds no {module}.ko", deb.display()))?;
    }
    std::fs::remove_dir_all(&extract)?;
    Ok(kernel)
}
