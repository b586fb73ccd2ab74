#!/usr/bin/env bash
# Installs what Palisade needs to build and test on a Debian 12 (bookworm) machine with Rust
# installed by rustup, as root: the Debian packages, the pinned Rust toolchain, and OPA.
# `--bench` also installs the benchmarks' workloads (`cargo xtask bench` passes it).
# Idempotent and quick when everything is already there; says what it installs and why.
set -euo pipefail

bench=
case "${1:-}" in
  --bench) bench=1 ;;
  "") ;;
  *) echo "usage: scripts/install.sh [--bench]" >&2; exit 2 ;;
esac

say() { echo "install.sh: $*" >&2; }
# (grep without -q reads all its input: under pipefail, -q's early exit fails the writer.)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep "ok installed" >/dev/null; }

missing=()
# need WHY PACKAGE...: installs the packages that are missing, for the reason WHY.
need() {
  local why=$1 package
  shift
  for package in "$@"; do
    installed "$package" || { missing+=("$package"); say "$package: $why"; }
  done
}
need "builds the BPF programs (C, CO-RE) and gives bindgen its libclang" clang-19 libclang1-19
need "the BPF programs' headers (bpf_helpers.h, linux/bpf.h)" libbpf-dev linux-libc-dev
need "compiles and links build scripts and binaries" gcc libc6-dev
need "strips the binaries put in the test VM's image" binutils
need "runs the kernel tests in a VM (and XFS, a file system they open files on by handle)" \
  qemu-system-x86 busybox-static cpio xfsprogs
need "the Kubernetes tests' certificates and API calls; downloads" openssl curl ca-certificates
if [ -n "$bench" ]; then
  need "the benchmarks' workloads (run inside the VM only; not started here)" \
    redis-server redis-tools nginx wrk sysbench
fi

# Go builds OPA (below) and the Kubernetes test tools (scripts/kube-tools.sh). A Go from go.dev
# is usually in /usr/local/go. Debian's newest Go (1.23, bookworm-backports) is older than their
# go.mod files ask for, but from Go 1.21 on `go` fetches the toolchain a module asks for from
# the Go module proxy (GOTOOLCHAIN=auto).
export PATH=/usr/local/go/bin:$PATH
# The minor version of the `go` on PATH (empty without one).
go_minor() { go env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p' || true; }
backported=()
minor=$(go_minor)
if [ "${minor:-0}" -lt 21 ]; then
  say "golang-go (bookworm-backports): builds OPA and the Kubernetes test tools (Go 1.21 or newer)"
  backported+=(golang-go)
fi

# The second kernel of the test matrix (6.12), and the Go above, come from bookworm-backports.
backports=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -e "$backports" ]; then
  say "adding bookworm-backports to apt's sources: the 6.12 test kernel is there"
  cat > "$backports" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi

if [ ${#missing[@]} -gt 0 ] || [ ${#backported[@]} -gt 0 ] \
  || ! apt-cache madison linux-image-amd64 | grep bpo >/dev/null; then
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
if [ ${#backported[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -t bookworm-backports "${backported[@]}"
fi

# The toolchain pinned by rust-toolchain.toml.
command -v rustup >/dev/null || { say "rustup is needed to install the pinned Rust toolchain"; exit 1; }
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
if ! rustup toolchain list | grep "^$toolchain" >/dev/null; then
  say "Rust $toolchain: the toolchain rust-toolchain.toml pins"
  rustup toolchain install "$toolchain" --profile minimal
fi
rustup component add --toolchain "$toolchain" rustfmt clippy >/dev/null 2>&1
# Rule modules are WebAssembly components built for this target, or Rego compiled by OPA.
rustup target add --toolchain "$toolchain" wasm32-unknown-unknown >/dev/null 2>&1
opa_version=v1.22.2
if ! opa version 2>/dev/null | grep "^Version: ${opa_version#v}$" >/dev/null; then
  say "OPA $opa_version (into /usr/local/bin): compiles Rego rule modules to Wasm"
  GOTOOLCHAIN=auto GOBIN=/usr/local/bin go install "github.com/open-policy-agent/opa@$opa_version"
fi
