//! Rule modules built with `palisade rules build` and run by the agent's host: what they compile,
//! how they decide, and how a misbehaving one is contained while the host goes on serving.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use palisade_agent::{
    policy::{CompiledPolicy, Environment, Policy, PolicyError},
    rules::{Context, Event, FailureKind, ModuleError, RuleHost, compile_policy},
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("palisade-rule-modules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The component built from the crate at `crate_dir` (relative to the workspace), and its
/// digest; built once per test process.
fn module(crate_dir: &str) -> (PathBuf, String) {
    static BUILT: OnceLock<Mutex<HashMap<String, (PathBuf, String)>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Mutex::default).lock().unwrap();
    built
        .entry(crate_dir.to_owned())
        .or_insert_with(|| {
            let out = scratch().join(format!("{}.wasm", crate_dir.replace('/', "-")));
            let result = Command::new(env!("CARGO_BIN_EXE_palisade"))
                .args(["rules", "build"])
                .arg(workspace().join(crate_dir))
                .arg("--out")
                .arg(&out)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&result.stdout);
            assert!(
                result.status.success(),
                "{stdout}{}",
                String::from_utf8_lossy(&result.stderr)
            );
            let digest = stdout.split_whitespace().next().unwrap().to_owned();
            (out, digest)
        })
        .clone()
}

fn context() -> Context {
    Context {
        policy: "test".to_owned(),
        node: "node".to_owned(),
        kube_apiserver: Vec::new(),
    }
}

/// Compiles a policy file written next to the modules, whose `spec` is `spec`.
fn compile(host: &RuleHost, spec: &str) -> Result<CompiledPolicy, PolicyError> {
    let file = scratch().join("policy.yaml");
    let text = format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: test\nspec:\n{spec}"
    );
    let policy = Policy::parse(&file, &text)?;
    compile_policy(host, &file, &policy, &Environment::default())
}

fn module_spec(crate_dir: &str, name: &str, config: &str) -> String {
    let (path, digest) = module(crate_dir);
    format!(
        "  ruleModules:\n    - name: {name}\n      module: {}\n      sha256: {digest}\n      config: {config}\n",
        path.file_name().unwrap().to_string_lossy()
    )
}

#[test]
fn the_capability_family_compiles_to_the_same_entries_as_the_built_in_rules() {
    let host = RuleHost::new(None).unwrap();
    let rules = [
        "disable-cap-sys-admin",
        "disable-cap-net-raw",
        "disable-cap-privileged",
        "disable-cap-all-except-net-bind-service",
    ];
    let native = compile(
        &host,
        &format!(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    hardeningRules: [{}]\n",
            rules.join(", ")
        ),
    )
    .unwrap();
    let from_module = compile(
        &host,
        &format!(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n{}",
            module_spec(
                "rules/capabilities",
                "capabilities",
                &format!("{{rules: [{}]}}", rules.join(", "))
            )
        ),
    )
    .unwrap();
    assert_eq!(from_module.switches, native.switches);
    let names = |policy: &CompiledPolicy| -> Vec<String> {
        policy.rules.iter().map(|rule| rule.name.clone()).collect()
    };
    assert_eq!(
        names(&from_module),
        rules
            .iter()
            .map(|rule| format!("capabilities/{rule}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(names(&native), rules);
}

#[test]
fn module_rules_are_checked_like_policy_rules() {
    let host = RuleHost::new(None).unwrap();
    let err = compile(
        &host,
        &format!(
            "  mode: RuntimeDefault\n{}",
            module_spec("tests/rules/misbehaving", "bad", "{compile: invalid}")
        ),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(
            "spec.ruleModules[0] (bad).capabilities[0].capabilities[0]: unknown capability \"cap_nonsense\""
        ),
        "{err}"
    );
    let err = compile(
        &host,
        &format!(
            "  mode: RuntimeDefault\n{}",
            module_spec(
                "rules/capabilities",
                "capabilities",
                "{rules: [disable-shell]}"
            )
        ),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(
            "spec.ruleModules[0] (capabilities): compiling its config: \"disable-shell\" is not a capability rule"
        ),
        "{err}"
    );
}

#[test]
fn a_module_whose_digest_differs_is_refused() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("rules/capabilities");
    let wrong = digest.replace(&digest[..4], "0000");
    match host.load(&path, &wrong) {
        Err(ModuleError::Digest {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (wrong, digest)),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn files_that_are_not_rule_modules_are_refused_with_the_reason() {
    let host = RuleHost::new(None).unwrap();
    let dir = scratch();
    let cases: [(&str, &[u8], &str); 3] = [
        (
            "garbage.wasm",
            b"not wasm at all",
            "not a rule module for palisade:rule@0.1.0",
        ),
        // A core module, not a component.
        (
            "core.wasm",
            b"\0asm\x01\0\0\0",
            "not a rule module for palisade:rule@0.1.0",
        ),
        // An empty component: the right format, exporting nothing.
        ("empty.wasm", b"\0asm\x0d\0\x01\0", "compile"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let digest: String = {
            use sha2::Digest;
            sha2::Sha256::digest(bytes)
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect()
        };
        let err = host.load(&path, &digest).err().expect("refused");
        assert!(
            matches!(err, ModuleError::Abi { .. }) && err.to_string().contains(expected),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_misbehaving_module_is_stopped_within_its_budget_and_the_host_goes_on() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("tests/rules/misbehaving");
    let loaded = host.load(&path, &digest).unwrap();
    let event = Event {
        hook: "file_open".to_owned(),
        action: "deny".to_owned(),
        policy: "test".to_owned(),
        rule: "bad/deny".to_owned(),
        pid: 1,
        uid: 0,
        comm: "cat".to_owned(),
        path: "/etc/shadow".to_owned(),
        json: "{}".to_owned(),
    };
    let cases = [
        ("loop", FailureKind::Timeout),
        ("memory", FailureKind::Memory),
        ("recursion", FailureKind::StackOverflow),
        ("trap", FailureKind::Trap),
    ];
    for (misbehaviour, kind) in cases {
        let started = Instant::now();
        let err = loaded
            .compile(&format!("{{\"compile\": \"{misbehaviour}\"}}"), &context())
            .unwrap_err();
        assert_eq!(err.kind(), Some(kind), "compile {misbehaviour}: {err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{misbehaviour}");
        let started = Instant::now();
        let err = loaded
            .decide(
                &format!("{{\"decide\": \"{misbehaviour}\"}}"),
                std::slice::from_ref(&event),
            )
            .unwrap_err();
        assert_eq!(err.kind(), Some(kind), "decide {misbehaviour}: {err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{misbehaviour}");
    }
    // Every call gets a fresh instance: the same module still works.
    let entries = loaded
        .compile("{\"deny\": \"/srv/secret\"}", &context())
        .unwrap();
    assert_eq!(entries.len(), 1);
    let verdicts = loaded.decide("{}", &[event.clone(), event]).unwrap();
    assert_eq!(verdicts.len(), 2);
    assert!(verdicts.iter().all(|verdict| verdict.keep));
}

#[test]
fn the_example_module_rates_silences_and_asks_to_kill() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("rules/examples/protect-files");
    let loaded = host.load(&path, &digest).unwrap();
    let event = |comm: &str| Event {
        hook: "file_open".to_owned(),
        action: "deny".to_owned(),
        policy: "test".to_owned(),
        rule: "protect-files/protected-files".to_owned(),
        pid: 7,
        uid: 1000,
        comm: comm.to_owned(),
        path: "/srv/secrets/token".to_owned(),
        json: "{}".to_owned(),
    };
    let verdicts = loaded
        .decide(
            r#"{"paths": ["/srv/secrets/**"], "kill": ["cat"], "quiet": ["backup"]}"#,
            &[event("cat"), event("backup"), event("less")],
        )
        .unwrap();
    assert_eq!(
        verdicts
            .iter()
            .map(|verdict| (verdict.keep, verdict.kill))
            .collect::<Vec<_>>(),
        [(true, true), (false, false), (true, false)]
    );
    assert_eq!(verdicts[2].tags, ["protected-file"]);
    assert_eq!(
        verdicts[2].annotations,
        [(
            "attempt".to_owned(),
            "less (uid 1000) on /srv/secrets/token".to_owned()
        )]
    );
}

#[test]
fn inspect_shows_the_digest_and_the_abi() {
    let (path, digest) = module("rules/examples/protect-files");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["rules", "inspect"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("sha256   {digest}")), "{text}");
    assert!(text.contains("export   compile (function)"), "{text}");
    assert!(text.contains("export   decide (function)"), "{text}");
    assert!(text.contains("abi      palisade:rule@0.1.0: ok"), "{text}");
    let garbage = scratch().join("inspect-garbage.wasm");
    std::fs::write(&garbage, "no").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["rules", "inspect"])
        .arg(&garbage)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a rule module"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
