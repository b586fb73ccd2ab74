//! Builds what goes into the VM and lays out its initramfs.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, ensure};

/// Binaries cargo built, by name.
pub struct Binaries {
    pub palisade: PathBuf,
    pub probe: PathBuf,
    pub kernel_tests: PathBuf,
    pub node_tests: PathBuf,
}

/// (target name, whether it is a test harness, path) of each executable cargo built.
fn cargo_executables(args: &[&str]) -> anyhow::Result<Vec<(String, bool, PathBuf)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    ensure!(out.status.success(), "cargo {} failed", args.join(" "));
    let mut found = Vec::new();
    for line in String::from_utf8(out.stdout)?.lines() {
        let message: serde_json::Value = serde_json::from_str(line)?;
        let test = message["profile"]["test"].as_bool() == Some(true);
        if let (Some(name), Some(path)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            found.push((name.to_owned(), test, PathBuf::from(path)));
        }
    }
    Ok(found)
}

pub fn binaries() -> anyhow::Result<Binaries> {
    let mut built = cargo_executables(&[
        "build",
        "--package",
        "palisade-agent",
        "--package",
        "palisade-kernel-tests",
        "--bins",
    ])?;
    built.extend(cargo_executables(&[
        "test",
        "--package",
        "palisade-kernel-tests",
        "--no-run",
    ])?);
    let find = |name: &str, test: bool| {
        built
            .iter()
            .find(|(built, is_test, _)| built == name && *is_test == test)
            .map(|(_, _, path)| path.clone())
            .with_context(|| format!("cargo built no `{name}`"))
    };
    Ok(Binaries {
        palisade: find("palisade", false)?,
        probe: find("probe", false)?,
        kernel_tests: find("enforcement", true)?,
        node_tests: find("node", true)?,
    })
}

/// The agent and the kernel benchmark (benchmarks/src/kernel_bench), in release builds or not.
pub fn bench_binaries(release: bool) -> anyhow::Result<(PathBuf, PathBuf)> {
    let mut args = vec![
        "build",
        "--package",
        "palisade-agent",
        "--package",
        "palisade-benchmarks",
        "--bin",
        "palisade",
        "--bin",
        "kernel-bench",
    ];
    if release {
        args.push("--release");
    }
    let built = cargo_executables(&args)?;
    let find = |name: &str| {
        built
            .iter()
            .find(|(built, _, _)| built == name)
            .map(|(_, _, path)| path.clone())
            .with_context(|| format!("cargo built no `{name}`"))
    };
    Ok((find("palisade")?, find("kernel-bench")?))
}

/// The agent, optimised as users run it.
pub fn agent_release() -> anyhow::Result<PathBuf> {
    cargo_executables(&[
        "build",
        "--release",
        "--package",
        "palisade-agent",
        "--bin",
        "palisade",
    ])?
    .into_iter()
    .find(|(name, _, _)| name == "palisade")
    .map(|(_, _, path)| path)
    .context("cargo built no `palisade`")
}

/// The rule modules the kernel tests and benchmarks use, built into `dir`: (file, path in the
/// initramfs).
pub fn rule_modules(palisade: &Path, dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let crates = [
        "rules/examples/protect-files",
        "rules/examples/egress",
        "rules/examples/runtime-needs",
        "tests/rules/misbehaving",
    ];
    Ok(build_rule_modules(palisade, &crates, dir)?
        .into_iter()
        .map(|module| {
            let name = module.file_name().expect("a file").to_string_lossy();
            let path = format!("/palisade/rules/{name}");
            (module, path)
        })
        .collect())
}

/// Builds each rule module crate (a directory in the workspace) with `palisade rules build` into
/// `dir`, named after its directory: `dir/NAME.wasm`.
pub fn build_rule_modules(
    palisade: &Path,
    crates: &[&str],
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let workspace = crate::workspace();
    crates
        .iter()
        .map(|crate_dir| {
            let name = Path::new(crate_dir)
                .file_name()
                .expect("a crate directory")
                .to_string_lossy();
            let out = dir.join(format!("{name}.wasm"));
            let status = Command::new(palisade)
                .args(["rules", "build"])
                .arg(workspace.join(crate_dir))
                .arg("--out")
                .arg(&out)
                .stdout(Stdio::null())
                .status()
                .context("running palisade rules build")?;
            ensure!(
                status.success(),
                "building the rule module {crate_dir} failed"
            );
            Ok(out)
        })
        .collect()
}

/// The shared libraries a dynamically linked binary needs, as `ldd` resolves them here (none for
/// a static one, for which `ldd` fails).
fn shared_libraries(binary: &Path) -> anyhow::Result<BTreeSet<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().find(|word| word.starts_with('/')))
        .map(PathBuf::from)
        .collect())
}

/// The path of `to` (absolute in the image) below `root`, its directory made.
fn place(root: &Path, to: &str) -> anyhow::Result<PathBuf> {
    let target = root.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(
        target
            .parent()
            .expect("paths inside the root have a parent"),
    )?;
    Ok(target)
}

fn copy_into(root: &Path, from: &Path, to: &str) -> anyhow::Result<()> {
    std::fs::copy(from, place(root, to)?).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

/// Puts `binary`, stripped, at `to` below `root`, and the shared libraries it links where `ldd`
/// finds them here. Without debug information, builds of the same binary strip to the same bytes.
pub fn install_executable(root: &Path, binary: &Path, to: &str) -> anyhow::Result<()> {
    let status = Command::new("strip")
        .arg("-o")
        .arg(place(root, to)?)
        .arg(binary)
        .status()?;
    ensure!(status.success(), "strip {} failed", binary.display());
    for library in shared_libraries(binary)? {
        copy_into(root, &library, &library.to_string_lossy())?;
    }
    Ok(())
}

/// Lays out an initramfs root: static busybox, `binaries` (stripped) under /palisade/bin with
/// their libraries, the examples, `files` (source, path in the image), and `init`. Returns the
/// gzipped cpio archive.
pub fn initramfs(
    dir: &Path,
    binaries: &[(&str, &Path)],
    files: &[(PathBuf, String)],
    init: &str,
) -> anyhow::Result<PathBuf> {
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    for sub in ["proc", "sys", "dev", "tmp", "run"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    copy_into(&root, Path::new("/bin/busybox"), "/bin/busybox")
        .context("busybox-static is needed (scripts/install.sh installs it)")?;
    for (name, binary) in binaries {
        install_executable(&root, binary, &format!("/palisade/bin/{name}"))?;
    }
    let examples = crate::workspace().join("examples");
    for entry in std::fs::read_dir(&examples)? {
        let path = entry?.path();
        if !path.is_file() {
            continue; // examples/kubernetes: resources, not policy files
        }
        copy_into(
            &root,
            &path,
            &format!(
                "/palisade/examples/{}",
                path.file_name().expect("a file").to_string_lossy()
            ),
        )?;
    }
    for (source, target) in files {
        copy_into(&root, source, target)?;
    }
    let init_path = root.join("init");
    std::fs::write(&init_path, init)?;
    std::fs::set_permissions(
        &init_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let archive = dir.join("initrd.gz");
    let script = format!(
        "cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'",
        root.display(),
        archive.display()
    );
    let status = Command::new("sh").args(["-c", &script]).status()?;
    ensure!(status.success(), "building the initramfs failed");
    std::fs::remove_dir_all(&root)?;
    Ok(archive)
}
