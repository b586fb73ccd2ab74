#!/usr/bin/env bash
# Installs what Palisade needs to build and test on a Debian 12 (bookworm) machine, as root.
# Idempotent and quick when everything is already there.
set -euo pipefail

# clang builds the BPF programs (C, CO-RE) and give bindgen its libclang; libbpf-dev and
# linux-libc-dev provide bpf_helpers.h and linux/bpf.h; binutils strips binaries for the VM image;
# qemu, busybox and cpio are the VM kernel test harness; xfsprogs makes the XFS file system a VM
# test opens files on by handle.
packages=(
  clang-19 libclang1-19
  libbpf-dev linux-libc-dev
  binutils
  qemu-system-x86 busybox-static cpio xfsprogs
  # The benchmarks' workloads (run inside the VM only; their services are not started here).
  redis-server redis-tools nginx wrk sysbench
)

backports=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -e "$backports" ]; then
  # The second kernel of the test matrix (6.12) comes from bookworm-backports.
  cat > "$backports" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ] || ! apt-cache madison linux-image-amd64 | grep -q bpo; then
  apt-get update -q
fi
if [ ${#missing[@]} -gt 0 ]; then
  # policy-rc.d keeps the packages' services (redis, nginx) from starting on this machine.
  created_policy_rc=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    created_policy_rc=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  [ -z "$created_policy_rc" ] || rm -f /usr/sbin/policy-rc.d
fi

# The toolchain pinned by rust-toolchain.toml.
command -v rustup >/dev/null || { echo "install.sh: rustup is needed to install the pinned Rust toolchain" >&2; exit 1; }
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
rustup toolchain list | grep -q "^$toolchain" || rustup toolchain install "$toolchain" --profile minimal
rustup component add --toolchain "$toolchain" rustfmt clippy >/dev/null 2>&1
# Rule modules are WebAssembly components built for this target, or Rego compiled by OPA
# (from the Go module proxy: Go is part of this machine's toolchain).
rustup target add --toolchain "$toolchain" wasm32-unknown-unknown >/dev/null 2>&1
opa_version=v1.22.2
if ! opa version 2>/dev/null | grep -q "^Version: ${opa_version#v}$"; then
  GOBIN=/usr/local/bin go install "github.com/open-policy-agent/opa@$opa_version"
fi
