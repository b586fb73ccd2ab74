//! Rule modules and model transforms built with `palisade rules build` and run by the agent's
//! host: what they compile, decide and transform, and how a misbehaving one is contained while
//! the host goes on serving.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use palisade_agent::{
    behavior::{BehaviorModel, TransformError, Transformation, load_model, transform},
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

/// The module `palisade rules build` makes of the Rego rules `rules` (package `palisade`),
/// written in a scratch directory `name`, and its digest.
fn rego_module(name: &str, rules: &str) -> (PathBuf, String) {
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.rego")),
        format!("package palisade\n\n{rules}"),
    )
    .unwrap();
    let out = dir.join(format!("{name}.wasm"));
    let digest = palisade_agent::rules::build(&dir, &out).unwrap();
    (out, digest)
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
    let env = Environment {
        kube_apiserver: vec!["10.96.0.1".to_owned()],
        ..Environment::default()
    };
    compile_policy(host, &file.display(), &scratch(), &policy, &env)
}

/// Compiles the built-in rules `lists` (list name, rules) natively, and the same rules through
/// the family module in `crate_dir`; checks that both give the same kernel entries.
fn assert_family_matches_built_in_rules(crate_dir: &str, family: &str, lists: &[(&str, &[&str])]) {
    let host = RuleHost::new(None).unwrap();
    let mut spec = "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n".to_owned();
    for (list, rules) in lists {
        spec.push_str(&format!("    {list}: [{}]\n", rules.join(", ")));
    }
    let native = compile(&host, &spec).unwrap_or_else(|err| panic!("{err}"));
    let rules: Vec<&str> = lists
        .iter()
        .flat_map(|(_, rules)| rules.iter().copied())
        .collect();
    let from_module = compile(
        &host,
        &format!(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n{}",
            module_spec(
                crate_dir,
                family,
                &format!("{{rules: [{}]}}", rules.join(", "))
            )
        ),
    )
    .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(from_module.entries(), native.entries());
    assert_eq!(rule_names(&native), rules);
    assert_eq!(
        rule_names(&from_module),
        rules
            .iter()
            .map(|rule| format!("{family}/{rule}"))
            .collect::<Vec<_>>()
    );
}

/// The names of `policy`'s rules, in rule id order.
fn rule_names(policy: &CompiledPolicy) -> Vec<String> {
    policy
        .rules()
        .iter()
        .map(|rule| rule.name.clone())
        .collect()
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
    assert_family_matches_built_in_rules(
        "rules/capabilities",
        "capabilities",
        &[(
            "hardeningRules",
            &[
                "disable-cap-sys-admin",
                "disable-cap-net-raw",
                "disable-cap-privileged",
                "disable-cap-all-except-net-bind-service",
            ],
        )],
    );
}

#[test]
fn the_file_protection_family_compiles_to_the_same_entries_as_the_built_in_rules() {
    assert_family_matches_built_in_rules(
        "rules/file-protection",
        "file-protection",
        &[
            (
                "hardeningRules",
                &[
                    "disallow-write-core-pattern",
                    "disallow-write-release-agent",
                    "disallow-access-kallsyms",
                ],
            ),
            (
                "attackProtectionRules",
                &[
                    "mitigate-sa-leak",
                    "mitigate-disk-device-number-leak",
                    "mitigate-overlayfs-leak",
                    "mitigate-host-ip-leak",
                    "disable-write-etc",
                    "disable-access-passwd",
                    "disable-access-shadow",
                    "disable-access-ssh-dir",
                ],
            ),
            (
                "vulMitigationRules",
                &[
                    "cgroups-lxcfs-escape-mitigation",
                    "runc-override-mitigation",
                ],
            ),
        ],
    );
}

#[test]
fn the_network_family_compiles_to_the_same_entries_as_the_built_in_rules() {
    assert_family_matches_built_in_rules(
        "rules/network",
        "network",
        &[(
            "attackProtectionRules",
            &[
                "block-access-to-metadata-service",
                "block-access-to-aws-metadata-service",
                "block-access-to-volc-metadata-service",
                "block-access-to-alibaba-metadata-service",
                "block-access-to-oci-metadata-service",
                "block-access-to-kube-apiserver",
            ],
        )],
    );
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
fn a_module_outside_the_module_directory_is_refused_unread() {
    let host = RuleHost::new(None).unwrap();
    let digest = "0".repeat(64);
    for file in ["/etc/passwd", "../policy.yaml", "modules/../../x.wasm"] {
        let spec = format!(
            "  mode: AlwaysAllow\n  ruleModules:\n    - name: m\n      module: {file}\n      sha256: {digest}\n"
        );
        let err = compile(&host, &spec).unwrap_err();
        assert_eq!(err.field, "spec.ruleModules[0] (m)");
        assert!(
            err.reason
                .contains("must be a path relative to the module directory"),
            "{file}: {err}"
        );
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
            "not a module this agent runs",
        ),
        // A core module, not a component.
        (
            "core.wasm",
            b"\0asm\x01\0\0\0",
            "not a module this agent runs",
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

/// An event for a misbehaving module to decide.
fn denied_read() -> Event<'static> {
    Event {
        hook: "file_open",
        action: "deny",
        policy: "test",
        rule: "bad/deny",
        pid: 1,
        uid: 0,
        comm: "cat",
        path: "/etc/shadow",
        json: "{}",
    }
}

#[test]
fn a_misbehaving_module_is_stopped_within_its_budget_and_the_host_goes_on() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("tests/rules/misbehaving");
    let loaded = host.load(&path, &digest).unwrap();
    let event = denied_read();
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
    let verdicts = loaded.decide("{}", &[event, event]).unwrap();
    assert_eq!(verdicts.len(), 2);
    assert!(verdicts.iter().all(|verdict| verdict.keep));
    // It asked for the events' JSON.
    assert_eq!(verdicts[1].annotations, [("json".into(), "{}".into())]);
}

/// A module that takes all the memory it may have on every call: each compile and each decide
/// is stopped and named, and the host goes on. (A policy refused so is not enforced, and the
/// agent keeps the version it enforced before: files/hostile_inputs.rs.)
#[test]
fn a_module_taking_its_whole_memory_on_every_call_is_stopped_every_time() {
    let host = RuleHost::new(None).unwrap();
    let spec = format!(
        "  mode: RuntimeDefault\n{}",
        module_spec("tests/rules/misbehaving", "hog", "{compile: memory}")
    );
    let file = scratch().join("policy.yaml");
    let expected = format!(
        "{}: spec.ruleModules[0] (hog): compiling its config: stopped (memory): it used all the \
         memory it may have (64 MiB): forcing trap when growing memory to ",
        file.display()
    );
    for _ in 0..3 {
        let err = compile(&host, &spec).unwrap_err().to_string();
        assert!(
            err.starts_with(&expected) && err.ends_with(" bytes"),
            "{err}"
        );
    }
    let (path, digest) = module("tests/rules/misbehaving");
    let loaded = host.load(&path, &digest).unwrap();
    // Each call on a fresh instance, as the agent's next batch gets after an instance failed.
    for _ in 0..3 {
        let err = loaded
            .decide(r#"{"decide": "memory"}"#, &[denied_read()])
            .unwrap_err();
        assert_eq!(err.kind(), Some(FailureKind::Memory), "{err}");
    }
    assert!(loaded.decide("{}", &[denied_read()]).unwrap()[0].keep);
}

#[test]
fn a_module_is_stopped_within_its_budget_after_the_host_was_idle() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("tests/rules/misbehaving");
    let loaded = host.load(&path, &digest).unwrap();
    let mut instance = loaded.instantiate().unwrap();
    // Long enough without a call for the epoch to stand still: the next call starts it again.
    std::thread::sleep(Duration::from_millis(1500));
    let started = Instant::now();
    let err = instance
        .decide(r#"{"decide": "loop"}"#, &[denied_read()])
        .unwrap_err();
    assert_eq!(err.kind(), Some(FailureKind::Timeout), "{err}");
    // The budget is 200 ms; an epoch that stood still until its next check would take 1 s.
    assert!(started.elapsed() < Duration::from_millis(900));
}

#[test]
fn a_kept_instance_decides_again_and_again_within_one_memory_limit() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("tests/rules/misbehaving");
    let loaded = host.load(&path, &digest).unwrap();
    let event = denied_read();
    let mut instance = loaded.instantiate().unwrap();
    for _ in 0..200 {
        let verdicts = instance.decide("{}", std::slice::from_ref(&event)).unwrap();
        assert!(verdicts[0].keep);
    }
    // 1 MiB kept per call: each call fits, the instance's memory does not (64 MiB).
    let leak = r#"{"decide": "leak"}"#;
    let calls = (1..=100)
        .find(|_| {
            instance
                .decide(leak, std::slice::from_ref(&event))
                .is_err_and(|err| err.kind() == Some(FailureKind::Memory))
        })
        .expect("the leaking instance was stopped");
    assert!((50..=64).contains(&calls), "stopped after {calls} calls");
    // A fresh instance starts with its whole memory.
    let mut fresh = loaded.instantiate().unwrap();
    assert!(fresh.decide(leak, std::slice::from_ref(&event)).is_ok());
}

#[test]
fn the_example_module_rates_silences_and_asks_to_kill() {
    let host = RuleHost::new(None).unwrap();
    let (path, digest) = module("rules/examples/protect-files");
    let loaded = host.load(&path, &digest).unwrap();
    let event = |comm: &'static str| Event {
        hook: "file_open",
        action: "deny",
        policy: "test",
        rule: "protect-files/protected-files",
        pid: 7,
        uid: 1000,
        comm,
        path: "/srv/secrets/token",
        json: "{}",
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
            "attempt".into(),
            "less (uid 1000) on /srv/secrets/token".into()
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
    assert!(
        text.contains(&format!(
            "kind     a rule module (component of palisade:rule@{})",
            palisade_agent::rules::ABI_VERSION
        )),
        "{text}"
    );
    assert!(text.contains("abi      ok: this agent runs it"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["rules", "inspect", "--output", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["module"], path.to_str().unwrap());
    assert_eq!(inspected["sha256"], digest);
    assert_eq!(inspected["runnable"], true);
    assert_eq!(inspected["refused"], serde_json::Value::Null);
    assert_eq!(inspected["size"], std::fs::metadata(&path).unwrap().len());
    assert!(
        inspected["kind"]
            .as_str()
            .is_some_and(|kind| kind.starts_with("a rule module")),
        "{inspected}"
    );
    for export in ["compile", "decide"] {
        let item = serde_json::json!({"name": export, "kind": "function"});
        assert!(
            inspected["exports"].as_array().unwrap().contains(&item),
            "{item} in {inspected}"
        );
    }
    // A component this agent refuses (it exports nothing): the reason, and the command fails.
    let empty = scratch().join("inspect-empty.wasm");
    std::fs::write(&empty, b"\0asm\x0d\0\x01\0").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["rules", "inspect", "--output", "json"])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["runnable"], false);
    assert!(inspected["refused"].is_string(), "{inspected}");
    let garbage = scratch().join("inspect-garbage.wasm");
    std::fs::write(&garbage, "no").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["rules", "inspect"])
        .arg(&garbage)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a module this agent runs"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn policy_test_runs_the_fixtures_against_the_built_module() {
    let (path, digest) = module("rules/examples/protect-files");
    let run = |dir: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["policy", "test"])
            .arg(dir)
            .arg("--module")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (passed, out) = run(&workspace().join("rules/examples/protect-files"));
    assert!(passed, "{out}");
    assert!(out.contains("5 passed, 0 failed"), "{out}");
    assert!(out.contains(&digest), "{out}");
    // A fixture the module does not meet fails, and says how.
    let wrong = scratch().join("wrong-fixtures");
    std::fs::create_dir_all(&wrong).unwrap();
    std::fs::write(
        wrong.join("kill.json"),
        r#"{"decide": {"config": {"paths": ["/s"]}, "event": {"hook": "file_open", "comm": "cat"},
            "verdict": {"keep": true, "severity": null, "tags": [], "annotations": [], "kill": true}}}"#,
    )
    .unwrap();
    let (passed, out) = run(&wrong);
    assert!(!passed, "{out}");
    assert!(
        out.contains("FAILED") && out.contains("0 passed, 1 failed"),
        "{out}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["policy", "test", "--output", "json"])
        .arg(&wrong)
        .arg("--module")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sha256"], digest);
    assert_eq!(report["module"], path.to_str().unwrap());
    assert_eq!(
        (&report["passed"], &report["failed"]),
        (&0.into(), &1.into())
    );
    let fixture = &report["fixtures"][0];
    assert_eq!(fixture["name"], wrong.join("kill.json").to_str().unwrap());
    assert_eq!(fixture["passed"], false);
    assert!(fixture["mismatch"].is_string(), "{report}");
}

#[test]
fn compiled_modules_are_cached_by_digest_and_a_damaged_cache_is_rebuilt() {
    let (path, digest) = module("rules/capabilities");
    let cache = scratch().join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    let cached = || -> Vec<PathBuf> {
        std::fs::read_dir(&cache)
            .map(|entries| {
                entries
                    .filter_map(|entry| Some(entry.ok()?.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let config = r#"{"rules": ["disable-cap-sys-admin"]}"#;
    let first = RuleHost::new(Some(cache.clone())).unwrap();
    first
        .load(&path, &digest)
        .unwrap()
        .compile(config, &context())
        .unwrap();
    let files = cached();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&digest) && name.ends_with(".cwasm"),
        "{name}"
    );
    // Another agent finds it; a damaged file is compiled again and replaced.
    std::fs::write(&files[0], b"damaged").unwrap();
    let second = RuleHost::new(Some(cache.clone())).unwrap();
    let entries = second
        .load(&path, &digest)
        .unwrap()
        .compile(config, &context())
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert!(std::fs::metadata(&files[0]).unwrap().len() > 1000);
    // Rego policies too.
    let (rego, rego_digest) = module("rules/examples/egress");
    second.load(&rego, &rego_digest).unwrap();
    assert_eq!(cached().len(), 2);
}

#[test]
fn a_rego_module_runs_its_fixtures_and_its_builtins_are_checked_at_load() {
    let (path, digest) = module("rules/examples/egress");
    assert_fixtures_pass("rules/examples/egress", &path, 5);
    // Compiled into a policy like any module's rules.
    let host = RuleHost::new(None).unwrap();
    let compiled = compile(
        &host,
        &format!(
            "  mode: RuntimeDefault\n{}",
            module_spec(
                "rules/examples/egress",
                "egress",
                "{addresses: [10.0.0.0/8], ports: [443]}"
            )
        ),
    )
    .unwrap();
    assert_eq!(compiled.entries().network.len(), 1);
    assert_eq!(compiled.rule_name(2), Some("egress/egress"));
    assert!(host.load(&path, &digest).is_ok());
    // A policy needing a builtin the agent does not provide is refused when loaded.
    let (out, digest) = rego_module(
        "needs-sprintf",
        "compile := [] if true\n\ndecide := {\"tags\": [sprintf(\"%v\", [input.event.pid])]} if true\n",
    );
    let err = host.load(&out, &digest).err().expect("refused");
    assert!(
        err.to_string()
            .contains("the policy needs builtins the agent does not provide: sprintf"),
        "{err}"
    );
}

/// `palisade policy test DIR --module MODULE` passes, with `count` fixtures.
fn assert_fixtures_pass(dir: &str, module: &Path, count: usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["policy", "test"])
        .arg(workspace().join(dir))
        .arg("--module")
        .arg(module)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let summary = format!("{count} passed, 0 failed");
    assert!(
        text.lines().any(|line| line.starts_with(&summary)),
        "{text}"
    );
}

#[test]
fn a_module_generates_and_widens_a_defense_in_depth_allowlist() {
    const MODULE: &str = "rules/examples/runtime-needs";
    let (path, _) = module(MODULE);
    assert_fixtures_pass(MODULE, &path, 3);
    let host = RuleHost::new(None).unwrap();
    let compile = |spec: &str| compile(&host, spec).unwrap_or_else(|err| panic!("{err}"));
    let config = "{resolvers: [10.96.0.10], time_zones: true}";
    // What the module allows, written as allow rules.
    let written = concat!(
        "      files:\n",
        "        - paths: [/etc/hosts, /etc/nsswitch.conf, /etc/resolv.conf, /etc/host.conf, /etc/gai.conf, /etc/services, /etc/protocols]\n",
        "          permissions: [read]\n",
        "        - {paths: [/etc/localtime, /usr/share/zoneinfo/**], permissions: [read]}\n",
        "      network: [{addresses: [10.96.0.10], ports: [\"53\"], protocols: [udp, tcp]}]\n",
        "      sockets:\n",
        "        - {family: inet, types: [dgram, stream]}\n",
        "        - {family: inet6, types: [dgram, stream]}\n",
        "        - {family: netlink, types: [raw]}\n",
        "        - {family: unix, types: [stream]}\n",
        "      unixSockets: [/run/nscd/socket]\n",
    );
    let own = "      exec: [/usr/bin/app]\n      capabilities: [net_bind_service]\n";
    // A DefenseInDepth policy allowing `allow` itself, with or without the module.
    let allowlist = |allow: &str, with_module: bool| {
        let module = if with_module {
            module_spec(MODULE, "runtime-needs", config)
        } else {
            String::new()
        };
        let defense = if allow.is_empty() {
            " {}\n".to_owned()
        } else {
            format!("\n    allow:\n{allow}")
        };
        compile(&format!(
            "  mode: DefenseInDepth\n  defenseInDepth:{defense}{module}"
        ))
    };
    // Generated: a policy that allows nothing itself (`defenseInDepth: {}`).
    let generated = allowlist("", true);
    assert_eq!(generated.entries(), allowlist(written, false).entries());
    assert_eq!(rule_names(&generated), ["defense-in-depth"]);
    // Widened: the policy's own allow rules and the module's.
    let widened = allowlist(own, true);
    assert_eq!(
        widened.entries(),
        allowlist(&format!("{own}{written}"), false).entries()
    );
    assert_ne!(widened.entries(), allowlist(own, false).entries());
    // Allow rules widen an allowlist: in another mode they are refused.
    let err = compile_err(
        &host,
        &format!(
            "  mode: EnhanceProtect\n{}",
            module_spec(MODULE, "runtime-needs", config)
        ),
    );
    assert!(
        err.contains(
            "spec.ruleModules[0] (runtime-needs): its allow rules widen a DefenseInDepth policy's \
             allowlist: not allowed with mode EnhanceProtect"
        ),
        "{err}"
    );
}

fn compile_err(host: &RuleHost, spec: &str) -> String {
    compile(host, spec).expect_err("refused").to_string()
}

#[test]
fn a_module_s_allow_rules_are_checked_like_the_policy_s() {
    let host = RuleHost::new(None).unwrap();
    let with_rules = |name: &str, rules: &str| {
        let (path, digest) = rego_module(name, &format!("compile := {rules}\n\ndecide := {{}}\n"));
        format!(
            "  mode: DefenseInDepth\n  defenseInDepth: {{}}\n  ruleModules:\n    - name: {name}\n      module: {}\n      sha256: {digest}\n      config: {{}}\n",
            path.strip_prefix(scratch()).unwrap().display()
        )
    };
    let cases = [
        (
            "bad-family",
            r#"[{"name": "s", "action": "allow", "sockets": [{"family": "nonsense"}]}]"#,
            "spec.ruleModules[0] (bad-family).allow[\"s\"].sockets[0].family: unknown address family \"nonsense\"",
        ),
        (
            "deny-unix-sockets",
            r#"[{"name": "s", "action": "deny", "unix_sockets": ["/run/a.sock"]}]"#,
            "spec.ruleModules[0] (deny-unix-sockets): rule \"s\": unix-sockets rules can only allow",
        ),
        (
            "deny-no-sockets",
            r#"[{"name": "s", "action": "deny", "sockets": []}]"#,
            "spec.ruleModules[0] (deny-no-sockets): rule \"s\" matches nothing: its list of sockets is empty",
        ),
        (
            "every-mount",
            r#"[{"name": "m", "action": "allow", "mount": ["*"]}]"#,
            "spec.ruleModules[0] (every-mount): rule \"m\": an allow rule names the file system types it allows",
        ),
        (
            "bad-path",
            r#"[{"name": "f", "action": "allow", "unix_sockets": ["relative"]}]"#,
            "spec.ruleModules[0] (bad-path).allow[\"f\"].unixSockets[0]:",
        ),
        (
            "allows-nothing",
            r#"[{"name": "e", "action": "allow", "exec": []}]"#,
            "spec.ruleModules[0] (allows-nothing): rule \"e\" allows nothing: its list is empty",
        ),
    ];
    for (name, rules, expected) in cases {
        let err = compile_err(&host, &with_rules(name, rules));
        assert!(err.contains(expected), "{name}: {err}");
    }
    // A "**" pattern over the policy's limit is blamed on the module's rule that holds it.
    let globs: Vec<String> = (0..65).map(|i| format!("\"/proc/**/f{i}\"")).collect();
    let rules = format!(
        r#"[{{"name": "g", "action": "allow", "files": {{"paths": [{}], "permissions": ["read"]}}}}]"#,
        globs.join(", ")
    );
    let err = compile_err(&host, &with_rules("many-globs", &rules));
    assert!(
        err.contains(
            "spec.ruleModules[0] (many-globs).allow[\"g\"].files[0].paths[64]: a policy may hold \
             at most 64 \"**\" patterns"
        ),
        "{err}"
    );
    // Each rule stands alone: one's exclusion does not take back what another allows.
    let policy = compile(
        &host,
        &with_rules(
            "capabilities",
            r#"[{"name": "admin", "action": "allow", "capabilities": ["sys_admin"]},
                {"name": "others", "action": "allow", "capabilities": ["all", "-sys_admin", "-net_raw"]}]"#,
        ),
    )
    .unwrap_or_else(|err| panic!("{err}"));
    let allowed = |capability: u32| policy.entries().decide_capability(capability).action == 0;
    assert!(allowed(21), "CAP_SYS_ADMIN");
    assert!(allowed(0), "CAP_CHOWN");
    assert!(!allowed(13), "CAP_NET_RAW");
}

/// The example model, as the agent writes models.
fn web_model() -> BehaviorModel {
    load_model(&workspace().join("examples/models/web.yaml")).unwrap()
}

fn paths(model: &BehaviorModel) -> Vec<&str> {
    model.files.iter().map(|file| file.path.as_str()).collect()
}

#[test]
fn a_rust_model_transform_drops_and_widens_and_says_so_in_the_model() {
    let (path, digest) = module("rules/examples/tidy-model");
    let host = RuleHost::new(None).unwrap();
    let config = serde_json::json!({"drop": ["/tmp/**", "/usr/bin/env"], "widen": ["/lib/"]});
    let model = web_model();
    let tidy = transform(&host, &path, &config, &model).unwrap();
    assert_eq!(
        paths(&tidy),
        [
            "",
            "/data/",
            "/etc/hosts",
            "/lib/",
            "/proc/4242/maps",
            "/run/app.sock"
        ]
    );
    let widened = tidy.files.iter().find(|file| file.path == "/lib/").unwrap();
    assert_eq!(widened.permissions, ["exec"]);
    assert!(
        widened
            .collapsed
            .as_ref()
            .unwrap()
            .rule
            .contains("widened by tidy-model"),
        "{widened:?}"
    );
    let programs: Vec<&str> = tidy
        .executables
        .iter()
        .map(|program| program.what.path.as_str())
        .collect();
    assert_eq!(programs, ["/bin/busybox"]);
    // What the workload did otherwise, and what the model is of, are as they were.
    assert_eq!(tidy.peers, model.peers);
    assert_eq!((&tidy.policy, &tidy.spec), (&model.policy, &model.spec));
    assert_eq!(
        tidy.transformed,
        [Transformation {
            module: path.file_name().unwrap().to_string_lossy().into_owned(),
            sha256: digest,
            config: config.clone(),
        }]
    );
    // Its refusal is the command's error.
    let err = transform(
        &host,
        &path,
        &serde_json::json!({"widen": ["/lib"]}),
        &model,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("must end with /"), "{err}");
}

#[test]
fn a_rego_model_transform_drops_paths_and_may_not_change_what_the_model_is_of() {
    let (path, _) = module("rules/examples/drop-paths");
    let host = RuleHost::new(None).unwrap();
    let model = web_model();
    let dropped = transform(
        &host,
        &path,
        &serde_json::json!({"prefixes": ["/data/", "/usr/"]}),
        &model,
    )
    .unwrap();
    assert_eq!(
        paths(&dropped),
        [
            "/etc/hosts",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/proc/4242/maps",
            "/run/app.sock",
            "/tmp/out",
            ""
        ]
    );
    assert_eq!(dropped.executables.len(), 1);
    assert_eq!(dropped.capabilities, model.capabilities);
    let err = transform(&host, &path, &serde_json::json!({"prefixes": []}), &model)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`prefixes` lists nothing to drop"), "{err}");
    // A transform that retargets the model is refused, with the field it changed.
    let (retarget, _) = rego_module(
        "retarget",
        "transform := object.union(input.model, {\"target\": \"/elsewhere\"})\n",
    );
    let err = transform(&host, &retarget, &serde_json::json!({}), &model).unwrap_err();
    assert!(matches!(err, TransformError::Changed("target")), "{err}");
}

#[test]
fn rule_modules_and_model_transforms_are_each_refused_in_the_others_place() {
    let host = RuleHost::new(None).unwrap();
    let (rule, _) = module("rules/examples/protect-files");
    let err = transform(&host, &rule, &serde_json::json!({}), &web_model())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a rule module, not a model transform"),
        "{err}"
    );
    for transform in ["rules/examples/tidy-model", "rules/examples/drop-paths"] {
        let err = compile(
            &host,
            &format!(
                "  mode: RuntimeDefault\n{}",
                module_spec(transform, "tidy", "{}")
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("the module is a model transform"),
            "{transform}: {err}"
        );
    }
}

#[test]
fn model_transform_and_to_policy_run_a_transform_from_the_command_line() {
    let (path, digest) = module("rules/examples/drop-paths");
    let model = workspace().join("examples/models/web.yaml");
    let palisade = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let model_arg = model.to_str().unwrap();
    // `palisade model COMMAND web.yaml --module MODULE --config CONFIG`
    let with_module = |command: &str, module: &str, config: &str| {
        palisade(&[
            "model", command, model_arg, "--module", module, "--config", config,
        ])
    };
    let module_arg = path.to_str().unwrap();
    let config = r#"{"prefixes": ["/data/"]}"#;
    let (ok, out, err) = with_module("transform", module_arg, config);
    assert!(ok, "{err}");
    let written = scratch().join("web-dropped.yaml");
    std::fs::write(&written, &out).unwrap();
    let dropped = load_model(&written).unwrap();
    assert!(!paths(&dropped).contains(&"/data/"), "{out}");
    assert_eq!(dropped.transformed[0].sha256, digest);
    let (ok, diff, err) = palisade(&["model", "diff", model_arg, written.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(diff.contains("  - /data/ (read)"), "{diff}");
    let (ok, policy, err) = with_module("to-policy", module_arg, config);
    assert!(ok, "{err}");
    assert!(
        policy.contains(&format!(
            "# Rewritten by the model transform {} (sha256 {digest})",
            path.file_name().unwrap().to_string_lossy()
        )),
        "{policy}"
    );
    assert!(!policy.contains("- /data/"), "{policy}");
    // Bad input: configuration that is not JSON, a module that is not there.
    let (ok, _, err) = with_module("to-policy", module_arg, "{prefixes");
    assert!(!ok && err.contains("not JSON"), "{err}");
    let (ok, _, err) = with_module("transform", "/nonexistent.wasm", config);
    assert!(!ok && err.contains("/nonexistent.wasm"), "{err}");
}
