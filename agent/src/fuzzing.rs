//! Fuzz targets: the parsers that policy authors, rule modules and the kernel feed, each taking
//! any bytes. A target fails by panicking: on a crash of what it calls, or when two views of the
//! same input disagree. `fuzz/` runs them under libFuzzer (`cargo +nightly fuzz run NAME`), and
//! `tests/fuzz_corpora.rs` replays their committed corpora and crash reproducers in `cargo test`.

use std::{
    path::Path,
    sync::{Arc, OnceLock},
};

use palisade_common::{ACTION_AUDIT, Event, KEY_PATH_LEN, PERM_READ};

use crate::{
    bpf::{InstalledPolicy, PolicyRegistry},
    events::Decoder,
    k8s::PolicyObject,
    policy::{self, Environment, Pattern, Policy, PolicyError},
    rules::{RuleHost, opa},
    targets::{Cgroup, PodRegistry},
};

/// A fuzz target: any bytes in, a panic when something is wrong.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary in `fuzz/fuzz_targets` and its corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("policy_file", policy_file),
    ("policy_resource", policy_resource),
    ("event_record", event_record),
    ("wasm_module", wasm_module),
    ("opa_result", opa_result),
    ("path_pattern", path_pattern),
];

/// One host for every input: starting one starts a thread.
fn rule_host() -> &'static RuleHost {
    static HOST: OnceLock<RuleHost> = OnceLock::new();
    HOST.get_or_init(|| RuleHost::new(None).expect("a rule host"))
}

/// Where modules are looked for: a directory without any.
fn no_modules() -> &'static Path {
    Path::new("/nonexistent/palisade-fuzz")
}

/// Errors must say where, what and why.
fn check_error(err: &PolicyError) {
    assert!(
        !err.origin.is_empty() && !err.field.is_empty() && !err.reason.is_empty(),
        "{err:?}"
    );
}

/// A policy file as the agent reads one: parsed, then compiled with its rule modules.
pub fn policy_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("fuzz.yaml");
    let compiled = Policy::parse(file, text).and_then(|policy| {
        crate::rules::compile_policy(
            rule_host(),
            &file.display(),
            no_modules(),
            &policy,
            &Environment::default(),
        )
    });
    if let Err(err) = compiled {
        check_error(&err);
    }
}

/// A PalisadePolicy as the API server sends one (JSON), made a policy and compiled as the
/// reconciler does. The API server's schema checks are not assumed.
pub fn policy_resource(data: &[u8]) {
    let Ok(resource) = serde_json::from_slice::<palisade_crds::PalisadePolicy>(data) else {
        return;
    };
    let object = PolicyObject::from(&resource);
    let compiled = crate::rules::compile_policy(
        rule_host(),
        &object.key,
        no_modules(),
        &object.as_policy(),
        &Environment::default(),
    );
    if let Err(err) = compiled {
        check_error(&err);
    }
}

/// A ring-buffer record, of any length: decoded, named by an installed policy, written as a JSON
/// line, which must be what serde_json writes for the event.
pub fn event_record(data: &[u8]) {
    static DECODER: OnceLock<Decoder> = OnceLock::new();
    let decoder = DECODER.get_or_init(|| {
        let registry = PolicyRegistry::default();
        let file = Path::new("fuzz.yaml");
        let text = format!(
            "apiVersion: {}\nkind: PalisadePolicy\nmetadata:\n  name: fuzz\nspec:\n  mode: \
             EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n      \
             files:\n        - paths: [/etc/]\n          permissions: [read]\n          action: \
             deny\n",
            palisade_crds::API_VERSION
        );
        let compiled = Policy::parse(file, &text)
            .and_then(|policy| {
                policy::compile(&file.display(), &policy, &Environment::default(), &[])
            })
            .expect("the fuzz policy compiles");
        let target = Cgroup {
            path: "/sys/fs/cgroup/fuzz".into(),
            id: 1,
            level: 1,
        };
        registry.insert(
            1,
            Arc::new(InstalledPolicy::new(Arc::new(compiled), target)),
        );
        Decoder::new(registry, PodRegistry::default())
    });
    let Some(event) = Decoder::read(data) else {
        assert!(data.len() < size_of::<Event>());
        return;
    };
    let mut decoded = Vec::new();
    decoder.decode(&[event], &mut decoded);
    let [decoded] = decoded.as_slice() else {
        panic!("one event decoded as {}", decoded.len());
    };
    let mut line = Vec::new();
    decoded.event.write_json(&mut line);
    let expected = serde_json::to_vec(&decoded.event).expect("an event serializes");
    assert!(
        line == expected,
        "written:  {}\nexpected: {}",
        String::from_utf8_lossy(&line),
        String::from_utf8_lossy(&expected)
    );
    serde_json::from_str::<serde_json::Value>(decoded.event.facts_json())
        .expect("the facts are JSON");
}

/// A module file: inspected (compiled and checked against both ABIs; a Rego policy's check
/// runs its `builtins` and `entrypoints` exports, within its budget).
pub fn wasm_module(data: &[u8]) {
    let digest = crate::rules::hex_digest(data);
    let _ = rule_host().inspect_bytes(Path::new("fuzz.wasm"), data, digest);
}

/// What a Rego policy's memory holds when the host reads its answer: byte 0 places the address
/// `opa_json_dump` returns (before, in or past the rest, the memory), which each entrypoint's
/// reading of the result must survive.
pub fn opa_result(data: &[u8]) {
    let Some((&place, memory)) = data.split_first() else {
        return;
    };
    let addr = i32::from(place) - 8;
    let Ok(text) = opa::string(memory, addr) else {
        return;
    };
    let Ok(result) = opa::result_value(&text) else {
        return;
    };
    let _ = opa::rules(result.clone());
    let _ = opa::verdict(result.clone());
    let _ = opa::transformed(result, "{}");
}

/// Lines of patterns, then a path: what the encoded tries decide for the path (the kernel's
/// lookups in Rust) must be what the patterns mean.
pub fn path_pattern(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines: Vec<&str> = text.split('\n').collect();
    let Some(path) = lines.pop() else {
        return;
    };
    if path.contains('\0') || path.len() >= KEY_PATH_LEN as usize {
        return;
    }
    let patterns: Vec<(&str, Pattern)> = lines
        .into_iter()
        .take(16)
        .filter_map(|line| Some((line, Pattern::parse(line).ok()?)))
        .collect();
    let rules: Vec<serde_json::Value> = patterns
        .iter()
        .map(|(line, _)| {
            serde_json::json!({"paths": [line], "permissions": ["read"], "action": "audit"})
        })
        .collect();
    let policy: Policy = serde_json::from_value(serde_json::json!({
        "apiVersion": palisade_crds::API_VERSION,
        "kind": policy::KIND,
        "metadata": {"name": "fuzz"},
        "spec": {
            "mode": "EnhanceProtect",
            "enhanceProtect": {"privileged": true, "customRules": {"files": rules}},
        },
    }))
    .expect("a policy of file rules");
    let file = Path::new("fuzz.yaml");
    let compiled = policy::compile(&file.display(), &policy, &Environment::default(), &[])
        .unwrap_or_else(|err| panic!("patterns that parse must compile: {err}"));
    let matching: Vec<u32> = (1..)
        .zip(&patterns)
        .filter(|(_, (_, pattern))| pattern.matches(path))
        .map(|(rule_id, _)| rule_id)
        .collect();
    let verdict = compiled.entries().decide_path(path, PERM_READ);
    if matching.is_empty() {
        assert_eq!(
            verdict.action, 0,
            "{path:?} matched rule {}",
            verdict.rule_id
        );
    } else {
        assert_eq!(
            verdict.action, ACTION_AUDIT,
            "{path:?} should match {matching:?}"
        );
        assert!(
            matching.contains(&verdict.rule_id),
            "{path:?}: rule {}, expected one of {matching:?}",
            verdict.rule_id
        );
    }
}
