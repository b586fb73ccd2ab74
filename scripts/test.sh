#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests on this machine, the agent's image, the
# Kubernetes suite against a real API server, then the privileged kernel suite and a Kubernetes
# node (containerd and a kubelet) inside QEMU on Debian's 6.1 and 6.12 kernels, and a smoke run of
# the kernel benchmarks. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install.sh
# The Kubernetes tools build from the Go module proxy while cargo builds (on a cold cache their
# downloads overlap the Rust builds); the Kubernetes suite waits for them.
kube_tools_log=$(mktemp)
./scripts/kube-tools.sh > "$kube_tools_log" 2>&1 &
kube_tools=$!
trap 'kill "$kube_tools" 2>/dev/null || true' EXIT
# Build outputs and kernel packages are cached outside the clone; a cold cache only costs time.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/palisade/target}"
# A warning fails any build.
export RUSTFLAGS="-D warnings"

cargo fmt --all --check
# Clippy's lints: every target of every crate of the workspace compiled by clippy-driver (rustc
# with clippy's lints; RUSTC_WORKSPACE_WRAPPER: for the workspace's crates only). The dependencies
# are compiled by rustc, once for this and the builds below: `cargo clippy` would check each of
# them a second time. What is tested is compiled again by rustc (clippy-driver leaves out MIR
# optimisations and debug checks).
RUSTC_WORKSPACE_WRAPPER=clippy-driver cargo build --workspace --all-targets --locked
cargo test --locked
# The agent's image: built twice (one digest), unpacked by umoci, run in a chroot.
cargo xtask image-test
wait "$kube_tools" || { cat "$kube_tools_log"; echo "scripts/kube-tools.sh failed" >&2; exit 1; }
cargo xtask kube-test
cargo xtask vm-test --kernel 6.1 --kernel 6.12
# Every benchmark briefly, so that the harness never rots (full runs: benchmarks/README.md).
cargo xtask bench --smoke --kernel 6.1
