//! The fuzz targets (`palisade_agent::fuzzing`) on their committed corpora and on the crash
//! reproducers (`fuzz/regressions/NAME/`: every crash fuzzing found, kept once fixed): what
//! libFuzzer runs, without its instrumentation, so that CI checks them in seconds.

use std::path::{Path, PathBuf};

use palisade_agent::fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files in `dir`, sorted; none if it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|entry| entry.unwrap().path()).collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => panic!("{}: {err}", dir.display()),
    };
    files.sort();
    files
}

#[test]
fn every_target_has_a_libfuzzer_binary_and_a_corpus() {
    for (name, _) in TARGETS {
        let binary = fuzz_dir().join(format!("fuzz_targets/{name}.rs"));
        let source = std::fs::read_to_string(&binary)
            .unwrap_or_else(|err| panic!("{}: {err}", binary.display()));
        assert!(
            source.contains(&format!("palisade_agent::fuzzing::{name}(")),
            "{} does not run {name}",
            binary.display()
        );
        let corpus = inputs(&fuzz_dir().join("corpus").join(name));
        assert!(corpus.len() >= 10, "{name}: {} corpus inputs", corpus.len());
    }
    let binaries = inputs(&fuzz_dir().join("fuzz_targets"));
    assert_eq!(binaries.len(), TARGETS.len(), "{binaries:?}");
}

#[test]
fn the_targets_pass_on_their_corpora_and_crash_reproducers() {
    for (name, target) in TARGETS {
        let mut replayed = 0;
        for kind in ["corpus", "regressions"] {
            for input in inputs(&fuzz_dir().join(kind).join(name)) {
                let data = std::fs::read(&input).unwrap();
                // Name the input that fails: the panic itself may not.
                if std::panic::catch_unwind(|| target(&data)).is_err() {
                    panic!("{name} failed on {}", input.display());
                }
                replayed += 1;
            }
        }
        eprintln!("{name}: {replayed} inputs");
    }
}
