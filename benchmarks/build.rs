//! Compiles the floor programs (ebpf/floor.bpf.c) that `kernel-bench` attaches in the "floor"
//! and "d_path" states, against the agent's kernel structures (ebpf/include/kernel_types.h).
//! `CLANG` overrides the compiler (default `clang-19`), as for the agent.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let source = manifest.join("ebpf/floor.bpf.c");
    let kernel_types = manifest.join("../ebpf/include");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("floor.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", kernel_types.display());
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
        .args([
            "-D__TARGET_ARCH_x86",
            "-I/usr/include/x86_64-linux-gnu",
            "-I",
        ])
        .arg(&kernel_types)
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|err| panic!("running {clang}: {err} (scripts/install.sh installs it)"));
    assert!(
        status.success(),
        "{clang} failed to compile {}",
        source.display()
    );
}
