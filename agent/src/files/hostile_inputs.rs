//! Hostile and careless policy files (issue 28): each refused with its file, field and reason,
//! the version enforced before it staying enforced. The README's test section lists them.

use super::tests::Setup;
use crate::policy::MAX_FILE_BYTES;

/// A test directory whose app.yaml, policy "v1" on the cgroup "app", is enforced.
fn enforcing_v1(test: &str) -> Setup {
    let mut setup = Setup::new(test);
    setup.write("app.yaml", "v1", "app");
    assert!(setup.reconcile().is_empty());
    setup
}

/// Writes `bytes` over app.yaml once v1 is enforced: the one error reported, after checking
/// that v1 stays enforced.
fn refused(test: &str, bytes: &[u8]) -> String {
    let mut setup = enforcing_v1(test);
    std::fs::write(setup.base.join("policies/app.yaml"), bytes).unwrap();
    refused_in(&mut setup)
}

/// The one error of the next reconcile of `setup`, after checking that v1 stays enforced.
fn refused_in(setup: &mut Setup) -> String {
    let errors = setup.reconcile();
    assert_eq!(setup.enforced("app"), Some("v1"), "{errors:?}");
    let [error] = errors.as_slice() else {
        panic!("one error expected: {errors:?}")
    };
    let error = error
        .strip_suffix("; the previous version stays enforced")
        .unwrap_or_else(|| panic!("{error}"));
    error.to_owned()
}

/// Policy "v2" on the cgroup "app" with the custom file rules `rules` (YAML flow sequences).
fn with_file_rules(rules: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: v2\nspec:\n  target:\n    cgroupPath: app\n  mode: EnhanceProtect\n  enhanceProtect:\n    customRules:\n      files: {rules}\n"
    )
}

/// A file rule denying reads of `paths` (written as YAML).
fn denying(paths: &str) -> String {
    with_file_rules(&format!(
        "[{{paths: [{paths}], permissions: [read], action: deny}}]"
    ))
}

#[test]
fn a_policy_over_the_size_limit() {
    // A file of exactly the limit is enforced...
    let mut text = denying("/etc/shadow").replace("name: v2", "name: v1");
    text.push_str(&"#".repeat(MAX_FILE_BYTES as usize - 1 - text.len()));
    text.push('\n');
    assert_eq!(text.len() as u64, MAX_FILE_BYTES);
    let mut setup = Setup::new("size");
    let file = setup.base.join("policies/app.yaml");
    std::fs::write(&file, &text).unwrap();
    assert!(setup.reconcile().is_empty());
    // ...and one byte more is not.
    text.push('\n');
    std::fs::write(&file, &text).unwrap();
    assert_eq!(
        refused_in(&mut setup),
        "/policies/app.yaml: (file): larger than 1048576 bytes, a policy file's limit"
    );
}

#[test]
fn a_policy_file_of_100_mb() {
    let mut setup = enforcing_v1("huge");
    // Sparse: refused by its size, before a byte of it is read.
    let file = std::fs::File::create(setup.base.join("policies/app.yaml")).unwrap();
    file.set_len(100 << 20).unwrap();
    assert_eq!(
        refused_in(&mut setup),
        "/policies/app.yaml: (file): larger than 1048576 bytes, a policy file's limit"
    );
}

#[test]
fn a_fifo_named_like_a_policy_file() {
    let mut setup = enforcing_v1("fifo");
    // Opening it to read would wait for a writer for ever.
    let fifo = setup.base.join("policies/app.yaml");
    std::fs::remove_file(&fifo).unwrap();
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    assert_eq!(
        refused_in(&mut setup),
        "/policies/app.yaml: (file): cannot read: not a regular file"
    );
}

/// Policy "v2" on the cgroup "app" running the rule module m.wasm (not there: the policy is
/// refused before) with the configuration `config` (YAML).
fn with_module_config(config: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: v2\nspec:\n  target:\n    cgroupPath: app\n  mode: RuntimeDefault\n  ruleModules:\n    - name: m\n      module: m.wasm\n      sha256: {}\n      config: {config}\n",
        "0".repeat(64)
    )
}

#[test]
fn deeply_nested_yaml() {
    let nested = format!("{}a{}", "[".repeat(10_000), "]".repeat(10_000));
    // Where a string belongs.
    assert_eq!(
        refused("nested", denying(&nested).as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: invalid type: sequence, expected a string at line 11 column 24"
    );
    // In a module's configuration, which takes any structure.
    let error = refused("nested-config", with_module_config(&nested).as_bytes());
    let field = format!("spec.ruleModules[0].config{}", "[0]".repeat(124));
    assert_eq!(
        error,
        format!("/policies/app.yaml: {field}: recursion limit exceeded at line 13 column 139")
    );
}

#[test]
fn yaml_aliases_that_expand_exponentially() {
    // Each level names the one before ten times: a billion strings at the ninth.
    let mut config = String::from("{x0: &x0 [a]");
    for level in 1..10 {
        let before = vec![format!("*x{}", level - 1); 10].join(", ");
        config.push_str(&format!(", x{level}: &x{level} [{before}]"));
    }
    config.push('}');
    let error = refused("aliases", with_module_config(&config).as_bytes());
    assert!(
        error.starts_with("/policies/app.yaml: spec.ruleModules[0].config.x")
            && error.ends_with("]: repetition limit exceeded"),
        "{error}"
    );
}

#[test]
fn a_path_with_dot_dot() {
    assert_eq!(
        refused("dotdot", denying("/etc/../root/.ssh/id_rsa").as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"/etc/../root/.ssh/id_rsa\" contains a \".\" or \"..\" component"
    );
}

#[test]
fn a_path_with_a_nul_byte() {
    assert_eq!(
        refused("nul", denying(r#""/etc/shadow\0.txt""#).as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"/etc/shadow\0.txt\" contains a NUL byte"
    );
}

#[test]
fn a_path_longer_than_the_kernel_key() {
    let path = format!("/{}", "a".repeat(251));
    assert_eq!(
        refused("long", denying(&path).as_bytes()),
        format!(
            "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"{path}\" is too long: paths, prefixes and suffixes are limited to 251 bytes"
        )
    );
}

#[test]
fn patterns_that_would_backtrack() {
    // The pattern language has one `**` at most: a lookup is two trie walks, never a search.
    assert_eq!(
        refused("backtrack", denying("/**a**a**a**a**a**b").as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"/**a**a**a**a**a**b\" has more than one \"**\""
    );
    assert_eq!(
        refused("star", denying("/a*a*a*a*a*b").as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[0].paths[0]: \"/a*a*a*a*a*b\": only the \"**\" wildcard is supported (no \"*\", \"?\" or \"[\")"
    );
}

#[test]
fn invalid_utf8() {
    let mut text = denying("/etc/shadow").into_bytes();
    text.splice(0..0, *b"# one\n# two\n# caf\xe9\n");
    assert_eq!(
        refused("utf8", &text),
        "/policies/app.yaml: (file): not UTF-8: line 3 holds bytes that are no character, at byte offset 17"
    );
}

#[test]
fn duplicate_rule_names() {
    let rules = "[{name: x, paths: [/a], permissions: [read], action: deny}, {name: x, paths: [/b], permissions: [read], action: deny}]";
    assert_eq!(
        refused("duplicate", with_file_rules(rules).as_bytes()),
        "/policies/app.yaml: spec.enhanceProtect.customRules.files[1]: duplicate rule name \"x\""
    );
}

#[test]
fn a_hundred_thousand_rules() {
    // As many paths as fit in the size limit: more than the kernel's path map holds.
    let paths: Vec<String> = (0..100_000).map(|path| format!("/{path}")).collect();
    let text = denying(&paths.join(","));
    assert!(text.len() as u64 <= MAX_FILE_BYTES);
    assert_eq!(
        refused("many", text.as_bytes()),
        "/policies/app.yaml: (kernel): cannot install: the kernel's path_prefixes map is full (16384 entries): the agent's --max-path-entries sizes it"
    );
}

#[test]
fn a_cgroup_name_over_127_bytes() {
    let name = "c".repeat(128);
    let text = format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: v2\nspec:\n  target:\n    cgroupPath: app/{name}\n  mode: RuntimeDefault\n"
    );
    let mut setup = enforcing_v1("cgroup-name");
    std::fs::write(setup.base.join("policies/app.yaml"), text).unwrap();
    assert_eq!(
        refused_in(&mut setup),
        format!(
            "/policies/app.yaml: spec.target.cgroupPath: cgroup /cgroup/app/{name} does not exist, and only a cgroup whose name has 1 to 127 bytes can be armed before it exists"
        )
    );
}

/// Policy "v2" on the cgroup "app" running the rule module `file` (in the policy directory),
/// whose bytes are `module`.
fn with_module(setup: &Setup, file: &str, module: &[u8]) -> String {
    std::fs::write(setup.base.join("policies").join(file), module).unwrap();
    let digest = crate::rules::hex_digest(module);
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: v2\nspec:\n  target:\n    cgroupPath: app\n  mode: RuntimeDefault\n  ruleModules:\n    - {{name: m, module: {file}, sha256: {digest}}}\n"
    )
}

#[test]
fn a_module_importing_a_host_function_the_agent_does_not_declare() {
    // A core module (what OPA builds) importing env.system, and a component importing
    // `run-command`: the agent provides neither.
    let core = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x02\x0e\x01\x03env\x06system\0\0";
    let component = b"\0asm\x0d\0\x01\0\x07\x05\x01\x40\0\x01\0\x0a\x10\x01\0\x0brun-command\x01\0";
    for (file, bytes, reason) in [
        (
            "core.wasm",
            &core[..],
            "it imports env.system, which the agent does not provide",
        ),
        ("component.wasm", &component[..], "run-command"),
    ] {
        let mut setup = enforcing_v1(file);
        let text = with_module(&setup, file, bytes);
        std::fs::write(setup.base.join("policies/app.yaml"), text).unwrap();
        let error = refused_in(&mut setup);
        assert!(
            error.starts_with(&format!(
                "/policies/app.yaml: spec.ruleModules[0] (m): /policies/{file}: "
            )) && error.contains(reason),
            "{error}"
        );
    }
}

#[test]
fn a_rule_module_of_100_mb() {
    let mut setup = enforcing_v1("huge-module");
    let text = with_module(&setup, "huge.wasm", b"");
    // Sparse: refused by its size, before a byte of it is read.
    let module = std::fs::File::create(setup.base.join("policies/huge.wasm")).unwrap();
    module.set_len(100 << 20).unwrap();
    std::fs::write(setup.base.join("policies/app.yaml"), text).unwrap();
    assert_eq!(
        refused_in(&mut setup),
        "/policies/app.yaml: spec.ruleModules[0] (m): reading /policies/huge.wasm: larger than 33554432 bytes, its limit"
    );
}
