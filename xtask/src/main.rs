//! `cargo xtask vm-test` and `cargo xtask vm-demo`: prove enforcement on real Debian kernels
//! booted under QEMU with BPF LSM enabled (this machine's own kernel refuses LSM programs).
//! `cargo xtask kube-test`: the Kubernetes side against a real API server.

mod build;
mod kernels;
mod kube;
mod results;
mod vm;

use clap::{Parser, Subcommand};

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
        /// Only run tests whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Start etcd and kube-apiserver (scripts/kube-tools.sh builds them), check the Helm chart
    /// (lint, kubeconform, server-side dry run), install it, and run the Kubernetes tests
    /// (tests/kubernetes) against that API server.
    KubeTest,
    /// Boot a kernel and run `palisade run` with the example policy: a denied read, an allowed
    /// read and the JSON audit event.
    VmDemo {
        #[arg(long, default_value = "6.1")]
        kernel: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::VmTest { kernels, filter } => vm::test(&kernels, filter.as_deref()),
        Command::KubeTest => kube::test(),
        Command::VmDemo { kernel } => vm::demo(&kernel),
    }
}
