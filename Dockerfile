# syntax=docker/dockerfile:1
# The agent's image, for machines with a container engine:
#   docker build -t ghcr.io/palisade-dev/palisade:0.1.0 .
# Without one, `cargo xtask image` builds an image of the same contents as an OCI archive. Both
# take the root filesystem `cargo xtask image --rootfs` lays out: the agent, the shared libraries
# it links, and the built-in rule modules in /usr/lib/palisade/rules; nothing else (no shell, no
# package manager).

FROM docker.io/library/rust:1.95.0-bookworm AS build
# clang builds the BPF programs (and is bindgen's libclang), libbpf-dev and linux-libc-dev give
# them their headers, binutils strips the binary.
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang-19 libclang1-19 libbpf-dev linux-libc-dev binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The toolchain rust-toolchain.toml pins, with the wasm32 target of rule modules.
RUN rustup toolchain install
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo xtask image --rootfs /rootfs

FROM scratch
COPY --from=build /rootfs /
ENTRYPOINT ["/usr/bin/palisade"]
