#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests on this machine, the Kubernetes suite
# against a real API server, then the privileged kernel suite inside QEMU on Debian's 6.1 and
# 6.12 kernels. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install.sh
./scripts/kube-tools.sh
# Build outputs and kernel packages are cached outside the clone; a cold cache only costs time.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/palisade/target}"

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --locked
cargo xtask kube-test
cargo xtask vm-test --kernel 6.1 --kernel 6.12
