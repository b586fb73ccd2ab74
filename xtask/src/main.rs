//! `cargo xtask vm-test` and `cargo xtask vm-demo`: prove enforcement on real Debian kernels
//! booted under QEMU with BPF LSM enabled (this machine's own kernel refuses LSM programs).
//! `cargo xtask kube-test`: the Kubernetes side against a real API server.
//! `cargo xtask image`: the agent's container image, without a container engine.
//! `cargo xtask fuzz`: a fuzzing campaign over fuzz/'s targets.

mod bench;
mod build;
mod chart;
mod debian;
mod fuzz;
mod image;
mod kernels;
mod kube;
mod node;
mod results;
mod vm;

use std::{path::PathBuf, process::Stdio};

use anyhow::{Context, ensure};
use clap::{Parser, Subcommand};

/// The workspace being built. Read at run time (`cargo run` sets CARGO_MANIFEST_DIR): a target
/// directory shared by two clones may run an xtask binary compiled in the other one.
pub fn workspace() -> PathBuf {
    let xtask = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    xtask.join("..")
}

/// Where downloads and builds are cached outside the clone (kernels, Debian packages, the
/// Kubernetes tools).
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("palisade")
}

/// Runs `command` to its end: its standard output, or an error with everything it printed.
pub fn run(command: &mut std::process::Command) -> anyhow::Result<String> {
    let output = command
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build, boot each kernel and run the privileged kernel test suite inside; fails when any
    /// test fails or did not run.
    VmTest {
        /// Kernel series to boot (Debian packages): 6.1 (bookworm), 6.12 (bookworm-backports).
        #[arg(long = "kernel", default_values = ["6.1", "6.12"])]
        kernels: Vec<String>,
        /// Only run tests whose name contains this (or any of its words).
        #[arg(long)]
        filter: Option<String>,
        /// Policy updates the Kubernetes test times (benchmarks/results/apply-latency: 100).
        #[arg(long, default_value_t = 10)]
        apply_updates: usize,
        /// Run the agent optimised, as users run it (for committed results).
        #[arg(long)]
        release: bool,
    },
    /// Start etcd and kube-apiserver (scripts/kube-tools.sh builds them), check the Helm chart
    /// (lint, kubeconform, server-side dry run), install it, and run the Kubernetes tests
    /// (tests/kubernetes) against that API server.
    KubeTest,
    /// Run the kernel benchmarks (overhead states S0-S6, workloads, program run time, footprint,
    /// apply latency, event throughput) in the VM on each kernel, the guest clock counting
    /// instructions, and write their report into benchmarks/results.
    Bench {
        #[arg(long = "kernel", default_values = ["6.1", "6.12"])]
        kernels: Vec<String>,
        /// A short run that only checks every benchmark works; its report goes to target/vm.
        #[arg(long)]
        smoke: bool,
        /// Build the agent optimised, as users run it (for committed results).
        #[arg(long)]
        release: bool,
        /// Instead, the soak for MINUTES (guest time) per kernel: a flood above and below the
        /// sustainable rate, a policy file rewritten every 5 s, the module's config swapped
        /// every 30 s; memory and event accounting each minute (benchmarks/results/soak.*).
        #[arg(long, value_name = "MINUTES", conflicts_with_all = ["smoke", "release"])]
        soak: Option<u64>,
    },
    /// Boot a kernel and run `palisade run` with the example policy: a denied read, an allowed
    /// read and the JSON audit event.
    VmDemo {
        #[arg(long, default_value = "6.1")]
        kernel: String,
    },
    /// Build the agent's image (release binary, built-in rule modules) as an OCI image layout
    /// and archive in target/image, reproducibly.
    Image {
        /// Only lay out the image's root filesystem in DIR (the Dockerfile's build stage).
        #[arg(long, value_name = "DIR")]
        rootfs: Option<PathBuf>,
    },
    /// Build the image twice (one digest), unpack it with umoci and run `palisade --version`
    /// from it in a chroot.
    ImageTest,
    /// Fuzz each target of fuzz/ under libFuzzer (nightly, cargo-fuzz) for MINUTES, grow and
    /// minimise its committed corpus, and add the run to benchmarks/results/fuzz.{json,md}. A
    /// crash's input goes to fuzz/regressions, where `cargo test` replays it.
    Fuzz {
        #[arg(long)]
        minutes: u64,
        /// Only this target (repeatable); all by default.
        #[arg(long = "target")]
        targets: Vec<String>,
        /// Targets fuzzed at once, one process each.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::VmTest {
            kernels,
            filter,
            apply_updates,
            release,
        } => vm::test(&kernels, filter.as_deref(), apply_updates, release),
        Command::KubeTest => kube::test(),
        Command::Bench {
            kernels,
            soak: Some(minutes),
            ..
        } => bench::soak(&kernels, minutes),
        Command::Bench {
            kernels,
            smoke,
            release,
            soak: None,
        } => bench::bench(&kernels, smoke, release),
        Command::VmDemo { kernel } => vm::demo(&kernel),
        Command::Image { rootfs: Some(dir) } => image::rootfs(&dir),
        Command::Image { rootfs: None } => {
            let built = image::build()?;
            println!(
                "{} {}\n  layout: {}\n  archive: {}",
                image::reference(),
                built.digest,
                built.layout.display(),
                built.archive.display()
            );
            Ok(())
        }
        Command::ImageTest => image::test(),
        Command::Fuzz {
            minutes,
            targets,
            jobs,
        } => fuzz::campaign(minutes, &targets, jobs),
    }
}
