//! Generates the Rust side of the kernel/user ABI from the one C header that defines it.

use std::{env, path::PathBuf};

/// Rust names for the header's items: `struct palisade_path_key` -> `PathKey`,
/// `PALISADE_PERM_READ` -> `PERM_READ`.
#[derive(Debug)]
struct Names;

impl bindgen::callbacks::ParseCallbacks for Names {
    fn item_name(&self, item: bindgen::callbacks::ItemInfo<'_>) -> Option<String> {
        if let Some(constant) = item.name.strip_prefix("PALISADE_") {
            return Some(constant.to_owned());
        }
        let name = item.name.strip_prefix("palisade_")?;
        Some(
            name.split('_')
                .map(|word| {
                    let mut chars = word.chars();
                    chars.next().map_or_else(String::new, |first| {
                        first.to_ascii_uppercase().to_string() + chars.as_str()
                    })
                })
                .collect(),
        )
    }
}

fn main() {
    let header =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../include/palisade.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let bindings = bindgen::Builder::default()
        .header(header.to_str().unwrap())
        .use_core()
        .allowlist_item("(palisade|PALISADE)_.*")
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_eq(true)
        .derive_hash(true)
        .layout_tests(true)
        .parse_callbacks(Box::new(Names))
        .generate()
        .expect("palisade.h must parse");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("abi.rs");
    bindings.write_to_file(out).unwrap();
}
