//! Debian packages downloaded with apt (no dpkg install: nothing changes on the host) and cached
//! outside the clone: the VM's kernels, and tools the tests run.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

use crate::{cache_dir, run};

/// Holds the cache directory `dir` for this process until the file returned is dropped: two
/// xtasks at once (a benchmark beside a test run) that download or extract the same package would
/// each remove the other's half-extracted files.
pub fn lock(dir: &Path) -> anyhow::Result<File> {
    std::fs::create_dir_all(dir)?;
    let lock = File::create(dir.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}", dir.display()))?;
    Ok(lock)
}

/// The .deb of `package` in `dir`, downloaded on first use (under `lock(dir)`).
pub fn download(dir: &Path, package: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    if let Some(deb) = find_deb(dir, package)? {
        return Ok(deb);
    }
    eprintln!("xtask: downloading {package}");
    run(Command::new("apt-get")
        .args(["download", package])
        .current_dir(dir))?;
    find_deb(dir, package)?.with_context(|| format!("apt-get download {package} left no .deb"))
}

/// The files of `package`, unpacked on first use: the directory that stands for `/`.
pub fn unpacked(package: &str) -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join("debs");
    let _lock = lock(&dir)?;
    let deb = download(&dir, package)?;
    let root = deb.with_extension("root");
    if root.exists() {
        return Ok(root);
    }
    let partial = deb.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    std::fs::rename(&partial, &root)?;
    Ok(root)
}

fn find_deb(dir: &Path, package: &str) -> anyhow::Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    Ok(std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.extension().is_some_and(|ext| ext == "deb")
                && path
                    .file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with(&prefix))
        }))
}
