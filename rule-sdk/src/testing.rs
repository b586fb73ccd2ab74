//! Checks a rule natively against fixtures, in the rule crate's `cargo test`: no Wasm runtime.
//! `palisade policy test DIR` checks the built module against the same fixtures.
//!
//! A fixture is a JSON file, one of:
//! - `{"compile": {"config": {...}, "entries": [...]}}`, or with `"error": "TEXT"` instead of
//!   `entries` when compiling must fail with a message containing TEXT;
//! - `{"decide": {"config": {...}, "event": {...}, "verdict": {...}}}`, where the event is a line
//!   of the agent's JSON output and the verdict is `{"keep": true, "severity": "High", "tags": [],
//!   "annotations": [["key", "value"]], "kill": false}` (`severity` may be null).

use std::{fmt::Debug, path::Path};

use serde::{Deserialize, de::DeserializeOwned};

use crate::{Context, Entry, JsonEvent, Rule, Verdict};

/// A fixture, over the entry and verdict types of whoever runs it (this SDK natively, or the
/// agent's host for a built module).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
#[serde(bound(deserialize = "E: DeserializeOwned, V: DeserializeOwned"))]
pub enum Fixture<E, V> {
    Compile {
        config: serde_json::Value,
        #[serde(default)]
        entries: Option<Vec<E>>,
        #[serde(default)]
        error: Option<String>,
    },
    Decide {
        config: serde_json::Value,
        event: serde_json::Value,
        verdict: V,
    },
}

/// The context fixtures compile in.
pub fn context() -> Context {
    Context {
        policy: "fixture".to_owned(),
        node: "fixture-node".to_owned(),
        kube_apiserver: vec!["10.96.0.1".to_owned()],
    }
}

/// A fixture and the file it came from.
pub type NamedFixture<E, V> = (String, Fixture<E, V>);

/// Reads every `*.json` fixture in `dir`, sorted by name; an error if there is none.
pub fn read_fixtures<E: DeserializeOwned, V: DeserializeOwned>(
    dir: &Path,
) -> Result<Vec<NamedFixture<E, V>>, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|err| format!("{}: {err}", dir.display()))?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    if files.is_empty() {
        return Err(format!("no fixtures in {}", dir.display()));
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(&path).map_err(|err| format!("{name}: {err}"))?;
            let fixture = serde_json::from_str(&text).map_err(|err| format!("{name}: {err}"))?;
            Ok((name, fixture))
        })
        .collect()
}

/// Checks `fixture` with the rule's `compile` (config JSON -> rules, or why not) and `decide`
/// (config JSON and one event -> verdicts, or why none): None if it holds, what differs if not.
pub fn mismatch<E: PartialEq + Debug, V: PartialEq + Debug>(
    fixture: &Fixture<E, V>,
    compile: impl FnOnce(&str) -> Result<Vec<E>, String>,
    decide: impl FnOnce(&str, &serde_json::Value) -> Result<Vec<V>, String>,
) -> Option<String> {
    match fixture {
        Fixture::Compile {
            config,
            entries,
            error,
        } => compile_mismatch(entries, error, &compile(&config.to_string())),
        Fixture::Decide {
            config,
            event,
            verdict,
        } => match decide(&config.to_string(), event) {
            Ok(got) => decide_mismatch(verdict, &got),
            Err(error) => Some(error),
        },
    }
}

/// Checks what `compile` returned against a compile fixture: None if it is as expected.
fn compile_mismatch<E: PartialEq + Debug>(
    expected_entries: &Option<Vec<E>>,
    expected_error: &Option<String>,
    got: &Result<Vec<E>, String>,
) -> Option<String> {
    match (expected_entries, expected_error, got) {
        (Some(expected), None, Ok(entries)) if entries == expected => None,
        (None, Some(expected), Err(error)) if error.contains(expected.as_str()) => None,
        (None, None, _) | (Some(_), Some(_), _) => {
            Some("a compile fixture needs `entries` or `error`".to_owned())
        }
        _ => Some(format!(
            "expected {}, got {got:?}",
            match (expected_entries, expected_error) {
                (Some(entries), _) => format!("{entries:?}"),
                (_, error) => format!("an error containing {error:?}"),
            }
        )),
    }
}

/// Checks the verdicts `decide` returned for a decide fixture's one event: None if as expected.
fn decide_mismatch<V: PartialEq + Debug>(expected: &V, got: &[V]) -> Option<String> {
    match got {
        [verdict] if verdict == expected => None,
        _ => Some(format!("expected [{expected:?}], got {got:?}")),
    }
}

/// Runs `R` natively on every fixture in `dir`; panics with every mismatch.
pub fn check_fixtures<R: Rule>(dir: impl AsRef<Path>) {
    let fixtures: Vec<NamedFixture<Entry, Verdict>> =
        read_fixtures(dir.as_ref()).unwrap_or_else(|err| panic!("{err}"));
    let failures: Vec<String> = fixtures
        .iter()
        .filter_map(|(name, fixture)| {
            let mismatch = mismatch(
                fixture,
                |config| crate::compile_json::<R>(config, &context()),
                |config, event| {
                    let event = JsonEvent::new(event.clone());
                    let event = crate::wire::as_passed(event.event(), R::READS_JSON);
                    Ok(crate::decide_json::<R>(config, &[event]))
                },
            )?;
            Some(format!("{name}: {mismatch}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A `#[test]` named `fixtures` that checks `$rule` natively against the JSON fixtures in the
/// crate's `fixtures` directory.
#[macro_export]
macro_rules! fixture_test {
    ($rule:ty) => {
        #[cfg(test)]
        #[test]
        fn fixtures() {
            // Read when the test runs: a test binary reused from a build cache that another
            // checkout filled would name that checkout's directory at compile time.
            let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets it");
            $crate::testing::check_fixtures::<$rule>(std::path::Path::new(&dir).join("fixtures"));
        }
    };
}
