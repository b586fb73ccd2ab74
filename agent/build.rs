//! Compiles the kernel programs (C, CO-RE) into one BPF object that the agent embeds.
//! `CLANG` overrides the compiler (default `clang-19`, from Debian's packages).

use std::{env, path::PathBuf, process::Command};

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../ebpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("palisade.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang-19".to_owned());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-changed={}", root.join("programs").display());
    println!("cargo:rerun-if-changed={}", root.join("include").display());
    let status = Command::new(&clang)
        .args([
            "-target",
            "bpf",
            "-g",
            "-O2",
            "-Wall",
            "-Werror",
            "-D__TARGET_ARCH_x86",
        ])
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-I")
        .arg(root.join("include"))
        .arg("-c")
        .arg(root.join("programs/palisade.bpf.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|err| panic!("running {clang}: {err} (scripts/install.sh installs it)"));
    assert!(
        status.success(),
        "{clang} failed to compile the BPF programs"
    );
}
