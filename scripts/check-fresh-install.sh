#!/usr/bin/env bash
# The README's command 1 on a fresh Debian 12, as root: a bookworm root made by debootstrap
# from Debian's packages, Rust installed in it by rustup, a clone of this repository's HEAD;
# there, `./scripts/install.sh && cargo xtask vm-demo`, then `palisade --version`,
# `palisade doctor` and `opa version` must work. Every download and build is cold (~25 min on
# 2 cores): not part of CI. It writes its record, with the date and the commit, to
# docs/fresh-install.md, and the whole log to the file given (default /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

root=/var/tmp/palisade-fresh-root
log=${1:-/var/tmp/palisade-fresh-install.log}
record=docs/fresh-install.md
commit=$(git rev-parse HEAD)

unmount() {
  for mount in dev/pts dev proc sys; do
    umount "$root/$mount" 2>/dev/null || true
  done
}
trap unmount EXIT
unmount
rm -rf "$root"
# debootstrap from Debian's package, unpacked rather than installed: this machine stays as it is.
tools=$(mktemp -d)
(cd "$tools" && apt-get download -q debootstrap >/dev/null 2>&1 && dpkg-deb -x debootstrap_*.deb .)
DEBOOTSTRAP_DIR="$tools/usr/share/debootstrap" "$tools/usr/sbin/debootstrap" --variant=minbase \
  bookworm "$root" http://deb.debian.org/debian >"$log" 2>&1
rm -rf "$tools"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t proc proc "$root/proc"
mount --bind /sys "$root/sys"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's own certificate authorities (of a TLS-intercepting egress proxy, say): the root
# reaches what this machine reaches (the ca-certificates package installed below adds them).
mkdir -p "$root/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
git clone -q . "$root/root/palisade"

# in_root COMMAND [FILTER...]: runs COMMAND in the root, in the clone, with a clean
# environment; prints "$ COMMAND" and its output (through FILTER, if given), all of it to the log.
in_root() {
  local command=$1
  shift
  echo "\$ $command" | tee -a "$log"
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/palisade && $command" 2>&1 | tee -a "$log" | "${@:-cat}"
}

started=$(date +%s)
{
  echo "# A fresh install, checked"
  echo
  echo "\`scripts/check-fresh-install.sh\` on $(date -u +%Y-%m-%d) at commit $commit: a Debian 12"
  echo "root made by \`debootstrap --variant=minbase bookworm\`, Rust installed in it by rustup,"
  echo "then the README's command 1. The build output is left out; the commands and the checks'"
  echo "output are as they ran."
  echo
  echo '```'
  # Rust installed by rustup, as on the machine the README speaks of (rustup-init, as
  # https://rustup.rs downloads it).
  in_root "apt-get update -q >/dev/null && apt-get install -y -q curl ca-certificates >/dev/null \
&& curl -sSf -o /tmp/rustup-init \
https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init \
&& chmod +x /tmp/rustup-init && /tmp/rustup-init -y -q --profile minimal \
--default-toolchain none >/dev/null && echo rustup installed"
  in_root "./scripts/install.sh" grep "^install.sh: "
  in_root "cargo xtask vm-demo" grep -E "^\[linux-6.1\] (---|\\$|cat|\{)"
  in_root "target/debug/palisade --version"
  in_root "target/debug/palisade doctor" || true
  in_root "opa version | head -1"
  echo '```'
  echo
  echo "Took $(( ($(date +%s) - started) / 60 )) minutes."
} >"$record.new"
# Each check must have worked: the demo enforced, and the three commands answered.
grep -q "^palisade " "$record.new"
grep -q "^Version: " "$record.new"
mv "$record.new" "$record"
echo "check-fresh-install: passed; $record"
