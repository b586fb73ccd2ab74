//! The `palisade` binary as a person uses it on this machine.

use std::process::Command;

use aya::{
    programs::{LsmAttachType, ProgramType},
    sys::is_program_supported,
};

fn palisade(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn policy_compile_prints_the_map_entries() {
    let (code, out, _) = palisade(&["policy", "compile", &example("protect-secrets.yaml")]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(
            "policy \"protect-secrets\": 10 rules, 18 prefix entries, 3 suffix entries, 3 globs, \
             0 mount types, 3 socket entries, 5 network entries\nrule 1 \"runtime-default\": deny\n"
        ),
        "{out}"
    );
    for line in [
        "path_prefixes \"/srv/secrets/\": read=deny+audit(rule 7) write=deny+audit(rule 7) append=deny+audit(rule 7) globs=0x2\n",
        "network 169.254.169.254/32 protocol 0 port 0: deny+audit(rule 4)\n",
        // The metadata service is not reachable through raw IP or packet sockets either.
        "sockets family 2 type 3: deny+audit(rule 4)\n",
        "sockets family 17 protocol any: deny+audit(rule 4)\n",
        "userns_create: deny+audit(rule 3)\n",
    ] {
        assert!(out.contains(line), "{line} in {out}");
    }
}

#[test]
fn policy_compile_prints_the_map_entries_as_json() {
    let (code, out, err) = palisade(&[
        "policy",
        "compile",
        &example("protect-secrets.yaml"),
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let entries = json(&out);
    assert_eq!(entries["policy"], "protect-secrets");
    let counted = |field: &str| entries[field].as_array().map(Vec::len);
    // As the text's first line counts them.
    for (field, count) in [
        ("rules", 10),
        ("path_prefixes", 18),
        ("path_suffixes", 3),
        ("globs", 3),
        ("mount_types", 0),
        ("sockets", 3),
        ("network", 5),
    ] {
        assert_eq!(counted(field), Some(count), "{field} in {out}");
    }
    assert_eq!(
        entries["rules"][0],
        serde_json::json!({"id": 1, "name": "runtime-default", "action": "deny"})
    );
    let deny_audit = |rule: u32| serde_json::json!({"action": ["deny", "audit"], "rule": rule});
    let secrets = entries["path_prefixes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["key"] == "/srv/secrets/")
        .unwrap_or_else(|| panic!("no /srv/secrets/ in {out}"));
    assert_eq!(secrets["glob_mask"], 2);
    let mut read = deny_audit(7);
    read["permission"] = "read".into();
    assert_eq!(secrets["permissions"][0], read);
    assert_eq!(secrets["permissions"].as_array().unwrap().len(), 3);
    let mut metadata = deny_audit(4);
    for (field, value) in [
        ("address", "169.254.169.254/32".into()),
        ("protocol", 0.into()),
        ("port", 0.into()),
    ] {
        metadata[field] = value;
    }
    assert!(
        entries["network"].as_array().unwrap().contains(&metadata),
        "{metadata} in {out}"
    );
    let mut userns = deny_audit(3);
    userns["name"] = "userns_create".into();
    assert!(
        entries["switches"].as_array().unwrap().contains(&userns),
        "{userns} in {out}"
    );
    let glob = &entries["globs"][0];
    assert!(glob["min_len"].as_u64().unwrap() > 0, "{out}");
    assert!(
        glob["permissions"]
            .as_array()
            .is_some_and(|permissions| !permissions.is_empty())
    );
    assert_eq!(entries["denied_unless_allowed"], serde_json::Value::Null);
}

#[test]
fn policy_compile_rejects_a_broken_file_with_file_field_and_reason() {
    let file =
        std::env::temp_dir().join(format!("palisade-cli-broken-{}.yaml", std::process::id()));
    std::fs::write(&file, "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata: {name: x}\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount-procfs, disable-cap-sys-admn]\n").unwrap();
    let (code, out, err) = palisade(&["policy", "compile", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert_eq!(
        err,
        format!(
            "palisade: error: {}: spec.enhanceProtect.hardeningRules[1]: unknown built-in rule \"disable-cap-sys-admn\" (did you mean \"disable-cap-sys-admin\"?)\n",
            file.display()
        )
    );
}

/// On a kernel that refuses BPF LSM programs (this project's development machines), doctor and
/// run must say so plainly and fail; where LSM programs load, they must work.
#[test]
fn doctor_and_run_report_whether_bpf_lsm_works() {
    let lsm_loads = matches!(
        is_program_supported(ProgramType::Lsm(LsmAttachType::Mac)),
        Ok(true)
    );
    let (doctor_code, report, _) = palisade(&["doctor"]);
    let (json_code, json_report, _) = palisade(&["doctor", "--output", "json"]);
    assert_eq!(json_code, doctor_code, "{json_report}");
    let doctor = json(&json_report);
    assert_eq!(doctor["ready"], lsm_loads, "{json_report}");
    assert_eq!(doctor["program_types"][0]["type"], "lsm");
    assert_eq!(doctor["program_types"][0]["loads"], lsm_loads);
    assert_eq!(doctor["root"], true, "the tests run as root");
    assert!(
        doctor["kernel"]
            .as_str()
            .is_some_and(|kernel| !kernel.is_empty())
    );
    assert!(doctor["cgroup_v2"]["mount"].is_string(), "{json_report}");
    let (run_code, _, run_err) = palisade(&[
        "run",
        "--policy",
        &example("protect-secrets.yaml"),
        "--",
        "true",
    ]);
    if lsm_loads {
        assert_eq!(doctor_code, 0, "{report}");
        assert!(report.contains("READY"), "{report}");
        assert_eq!(doctor["programs_error"], serde_json::Value::Null);
        assert_eq!(run_code, 0, "{run_err}");
    } else {
        assert_eq!(doctor_code, 1, "{report}");
        assert!(report.contains("\n  lsm                no ("), "{report}");
        assert!(
            report.contains(
                "palisade programs  FAIL: the kernel refused to load BPF LSM program `file_open`"
            ),
            "{report}"
        );
        assert!(report.contains("NOT READY"), "{report}");
        assert!(
            doctor["programs_error"]
                .as_str()
                .is_some_and(|error| error
                    .starts_with("the kernel refused to load BPF LSM program `file_open`")),
            "{json_report}"
        );
        assert!(
            doctor["program_types"][0]["error"].is_string(),
            "{json_report}"
        );
        assert_eq!(
            run_code, 125,
            "palisade's own failure, as env(1) reports it"
        );
        let error = run_err
            .lines()
            .find(|line| line.starts_with("palisade: error: "))
            .expect("an error line");
        assert!(
            error.starts_with(
                "palisade: error: cannot enforce: the kernel refused to load BPF LSM \
                 program `file_open` (BPF_PROG_LOAD: Operation not permitted (os error 1))"
            ),
            "{run_err}"
        );
        assert!(
            run_err.contains("BPF LSM programs cannot run on this kernel"),
            "{run_err}"
        );
        assert!(
            !run_err.contains("panicked") && !run_err.contains("backtrace"),
            "{run_err}"
        );
    }
}

#[test]
fn completions_cover_every_command_in_each_shell() {
    const TOP: [&str; 8] = [
        "agent",
        "run",
        "doctor",
        "top",
        "policy",
        "model",
        "rules",
        "completions",
    ];
    const BELOW: [&str; 9] = [
        "compile",
        "test",
        "replay",
        "show",
        "diff",
        "transform",
        "to-policy",
        "build",
        "inspect",
    ];
    let script = |shell| {
        let (code, script, err) = palisade(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        script
    };
    // How each shell's script offers a command (help texts name some commands too).
    let (bash, fish, zsh) = (script("bash"), script("fish"), script("zsh"));
    for command in TOP {
        let token = format!("palisade__subcmd__{command})");
        assert!(bash.contains(&token), "bash: no {token}");
    }
    for command in TOP.iter().chain(&BELOW) {
        let token = format!("-a \"{command}\" -d '");
        assert!(fish.contains(&token), "fish: no {token}");
        let token = format!("'{command}:");
        assert!(zsh.contains(&token), "zsh: no {token}");
    }
    let (code, _, err) = palisade(&["completions", "tcsh"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid value 'tcsh'"), "{err}");
}

#[test]
fn agent_refuses_falcosidekick_tls_settings_it_cannot_use_before_loading_anything() {
    let dir = scratch("falcosidekick-tls");
    let agent = |url: &str, tls: &[&str]| {
        let args = [
            &[
                "agent",
                "--policy-dir",
                dir.to_str().unwrap(),
                "--falcosidekick-url",
                url,
            ],
            tls,
        ]
        .concat();
        palisade(&args)
    };
    let (code, _, err) = agent(
        "http://127.0.0.1:2801/",
        &["--falcosidekick-ca", "/etc/hostname"],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err,
        "palisade: error: --falcosidekick-ca and --falcosidekick-cert are for an https:// \
         --falcosidekick-url, not http://127.0.0.1:2801/\n"
    );
    let (code, _, err) = agent(
        "https://127.0.0.1:2801/",
        &["--falcosidekick-ca", "/nonexistent/ca.crt"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("palisade: error: /nonexistent/ca.crt: "),
        "{err}"
    );
    // A key without its certificate: a usage error.
    let (code, _, err) = agent(
        "https://127.0.0.1:2801/",
        &["--falcosidekick-key", "tls.key"],
    );
    assert_eq!(code, 2, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_exits_125_when_its_policy_cannot_be_read() {
    let (code, out, err) = palisade(&["run", "--policy", "/nonexistent/policy.yaml", "--", "true"]);
    assert_eq!(code, 125, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.starts_with("palisade: error: /nonexistent/policy.yaml: "),
        "{err}"
    );
}

#[test]
fn policy_replay_counts_what_a_candidate_would_have_blocked_per_rule() {
    let dir = scratch("replay");
    let events = dir.join("events.jsonl");
    let event = |fields: &str| {
        format!(
            "{{\"time\":\"2026-11-22T06:00:00Z\",\"node\":\"n\",\"action\":\"audit\",\"pid\":9,\"uid\":0,\"comm\":\"app\",{fields}}}\n"
        )
    };
    let recorded = [
        event(r#""hook":"file_open","path":"/etc/shadow","permissions":["read"]"#),
        event(r#""hook":"file_open","path":"/etc/shadow","permissions":["read"]"#),
        event(r#""hook":"file_open","path":"/etc/hosts","permissions":["read"]"#),
        event(r#""hook":"capable","path":"","capability":"CAP_SYS_ADMIN","permissions":[]"#),
        event(
            r#""hook":"socket_connect","path":"","permissions":[],"socket":{"family":2,"protocol":6,"address":"169.254.169.254","port":80}"#,
        ),
        event(
            r#""hook":"socket_create","path":"","permissions":[],"socket":{"family":2,"protocol":17},"arg":2"#,
        ),
        event(r#""hook":"task_kill","path":"","permissions":[],"signal":9"#),
    ]
    .concat();
    std::fs::write(&events, recorded).unwrap();
    let candidate = dir.join("candidate.yaml");
    std::fs::write(
        &candidate,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: candidate\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    hardeningRules: [disable-cap-sys-admin]\n    attackProtectionRules: [disable-access-shadow, block-access-to-metadata-service, disable-udp]\n    auditRules: [block-access-to-metadata-service]\n",
    )
    .unwrap();
    let replay = |output: &[&str]| {
        let command = [
            "policy",
            "replay",
            "--events",
            events.to_str().unwrap(),
            "--policy",
            candidate.to_str().unwrap(),
        ];
        palisade(&[&command[..], output].concat())
    };
    let (code, out, err) = replay(&[]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with("6 events replayed, 1 not replayable, 1 matched no rule"),
        "{out}"
    );
    let row = |rule: &str| -> Vec<&str> {
        lines
            .iter()
            .find(|line| line.contains(&format!(" {rule} ")))
            .unwrap_or_else(|| panic!("no {rule} in {out}"))
            .split_whitespace()
            .take(2)
            .collect()
    };
    assert_eq!(row("disable-access-shadow"), ["2", "0"]);
    assert_eq!(row("disable-cap-sys-admin"), ["1", "0"]);
    assert_eq!(row("disable-udp"), ["1", "0"]);
    assert_eq!(row("block-access-to-metadata-service"), ["0", "1"]);
    assert!(out.contains("not replayable: 1 task_kill events"), "{out}");

    let (code, out, err) = replay(&["--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let replay = json(&out);
    assert_eq!(replay["policy"], "candidate");
    assert_eq!(replay["events"], events.to_str().unwrap());
    assert_eq!(replay["replayed"], 6);
    assert_eq!(replay["matched_no_rule"], 1);
    assert_eq!(
        replay["not_replayable"],
        serde_json::json!({"task_kill": 1})
    );
    let rules = replay["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 4, "{out}");
    assert!(
        rules.contains(&serde_json::json!({
            "rule": "disable-access-shadow",
            "would_deny": 2,
            "would_audit": 0,
            "example": "app file_open /etc/shadow",
        })),
        "{out}"
    );
    assert!(
        rules
            .iter()
            .any(|rule| rule["rule"] == "block-access-to-metadata-service"
                && rule["would_deny"] == 0
                && rule["would_audit"] == 1),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The example policies (examples/, examples/kubernetes/ and any other directory of policies
/// there), each with its fixtures at the same place under examples/fixtures/.
fn example_policies(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        if path.is_dir() && name != "fixtures" && name != "models" {
            example_policies(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "yaml") {
            found.push(path);
        }
    }
}

#[test]
fn every_example_policy_passes_its_fixtures() {
    let examples = std::path::Path::new(&example("")).canonicalize().unwrap();
    let mut policies = Vec::new();
    example_policies(&examples, &mut policies);
    for example in ["protect-secrets.yaml", "kubernetes/web.yaml"] {
        assert!(policies.contains(&examples.join(example)), "{policies:?}");
    }
    for policy in policies {
        let fixtures = examples
            .join("fixtures")
            .join(policy.strip_prefix(&examples).unwrap());
        assert!(
            fixtures.is_file(),
            "{} has no fixtures ({})",
            policy.display(),
            fixtures.display()
        );
        let (code, out, err) = palisade(&[
            "policy",
            "test",
            policy.to_str().unwrap(),
            fixtures.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{}: {out}{err}", policy.display());
        assert!(out.contains(" passed, 0 failed"), "{out}");
    }
}

#[test]
fn policy_test_says_which_fixture_fails_and_why() {
    let dir = scratch("policy-fixtures");
    let fixtures = dir.join("fixtures.yaml");
    let fixture = |name: &str, event: &str, expect: &str| {
        format!("- name: {name}\n  event: {{{event}}}\n  expect: {{{expect}}}\n")
    };
    let read = |path: &str| format!("hook: file_open, path: {path}, permissions: [read]");
    std::fs::write(
        &fixtures,
        [
            fixture(
                "the other rule",
                &read("/etc/shadow"),
                "action: deny, rule: ssh-keys",
            ),
            fixture("hosts", &read("/etc/hosts"), "action: deny, rule: secrets"),
            fixture("a signal", "hook: task_kill, signal: 9", "action: allow"),
            fixture(
                "a typo",
                "hook: file_open, paht: /etc/hosts, permissions: [read]",
                "action: allow",
            ),
            fixture("a map", "hook: bpf, arg: 0", "action: allow"),
            fixture(
                "secrets",
                &read("/srv/secrets/a"),
                "action: deny, rule: secrets",
            ),
        ]
        .concat(),
    )
    .unwrap();
    let policy = example("protect-secrets.yaml");
    let test = |output: &[&str]| {
        let command = ["policy", "test", &policy, fixtures.to_str().unwrap()];
        palisade(&[&command[..], output].concat())
    };
    let (code, out, err) = test(&[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!(
            "FAILED  the other rule: expected deny by rule ssh-keys, got deny by rule secrets\n\
             FAILED  hosts: expected deny by rule secrets, got allow\n\
             FAILED  a signal: its event cannot be decided: task_kill events do not record what \
             its decision looks up (the target process)\n\
             FAILED  a typo: its event cannot be decided: file_open needs \"path\" (a string)\n\
             FAILED  a map: its event cannot be decided: bpf command 0 is not a policy's to \
             decide: only loading a program (5) is (commands that reach loaded objects are the \
             agent's self-protection)\n\
             ok      secrets\n\
             1 passed, 5 failed (policy \"protect-secrets\", {})\n",
            fixtures.display()
        )
    );

    let (code, out, err) = test(&["--output", "json"]);
    assert_eq!(code, 1, "{err}");
    let report = json(&out);
    assert_eq!(report["policy"], "protect-secrets");
    assert_eq!(report["policy_file"], policy.as_str());
    assert_eq!(report["fixtures_file"], fixtures.to_str().unwrap());
    assert_eq!(
        (report["passed"].clone(), report["failed"].clone()),
        (1.into(), 5.into())
    );
    assert_eq!(
        report["fixtures"][1],
        serde_json::json!({
            "name": "hosts",
            "passed": false,
            "mismatch": "expected deny by rule secrets, got allow",
        })
    );
    assert_eq!(report["fixtures"][5]["mismatch"], serde_json::Value::Null);

    // A fixture file that cannot be used: an error naming the fixture and the field.
    for (text, field, reason) in [
        (
            fixture("no rule", &read("/etc/shadow"), "action: deny"),
            "[0].expect.rule",
            "required with a deny or audit action: the rule that decides",
        ),
        (
            fixture(
                "allowed",
                &read("/etc/hosts"),
                "action: allow, rule: secrets",
            ),
            "[0].expect.rule",
            "an allowed event has no rule",
        ),
        (
            fixture("", &read("/etc/hosts"), "action: permit"),
            "[0].expect.action",
            "unknown variant `permit`, expected one of `deny`, `audit`, `allow` at line 3 column 20",
        ),
        ("[]".to_owned(), "(document)", "no fixtures"),
    ] {
        std::fs::write(&fixtures, &text).unwrap();
        let (code, out, err) = test(&[]);
        assert_eq!((code, out.as_str()), (1, ""), "{text}");
        assert_eq!(
            err,
            format!(
                "palisade: error: {}: {field}: {reason}\n",
                fixtures.display()
            ),
            "{text}"
        );
    }
    let (code, _, err) = test(&["--module", "rule.wasm"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = palisade(&["policy", "test", &policy]);
    assert_eq!(code, 1);
    assert!(
        err.ends_with("a policy is tested on fixtures: policy test POLICY FIXTURES\n"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What only an on/off rule class decides, a mode's bits, a bind mount (no file system type) and
/// an unmount.
#[test]
fn policy_test_decides_switches_modes_and_mounts() {
    let dir = scratch("policy-switches");
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: switches\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    hardeningRules: [disallow-create-user-ns, disallow-load-all-bpf-prog, disallow-load-bpf-via-setsockopt, disallow-mount, disallow-umount]\n    attackProtectionRules: [disable-chmod-s-bit]\n    customRules:\n      files:\n        - {name: bin, paths: [/usr/bin/], permissions: [write], action: audit}\n",
    )
    .unwrap();
    let fixtures = dir.join("fixtures.yaml");
    std::fs::write(
        &fixtures,
        "- name: setuid\n  event: {hook: path_chmod, path: /tmp/x, permissions: [write], arg: 2541}\n  expect: {action: deny, rule: disable-chmod-s-bit}\n\
         - name: setuid under an audited directory\n  event: {hook: path_chmod, path: /usr/bin/x, permissions: [write], arg: 2541}\n  expect: {action: deny, rule: disable-chmod-s-bit}\n\
         - name: a plain mode there\n  event: {hook: path_chmod, path: /usr/bin/x, permissions: [write], arg: 420}\n  expect: {action: audit, rule: bin}\n\
         - name: user namespace\n  event: {hook: userns_create}\n  expect: {action: deny, rule: disallow-create-user-ns}\n\
         - name: program load\n  event: {hook: bpf, arg: 5}\n  expect: {action: deny, rule: disallow-load-all-bpf-prog}\n\
         - name: socket filter\n  event: {hook: socket_setsockopt, arg: 65562}\n  expect: {action: deny, rule: disallow-load-bpf-via-setsockopt}\n\
         - name: bind mount\n  event: {hook: sb_mount}\n  expect: {action: deny, rule: disallow-mount}\n\
         - name: unmount\n  event: {hook: sb_umount, fs_type: tmpfs}\n  expect: {action: deny, rule: disallow-umount}\n",
    )
    .unwrap();
    let (code, out, err) = palisade(&[
        "policy",
        "test",
        policy.to_str().unwrap(),
        fixtures.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("8 passed, 0 failed"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A scratch directory of this test process.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("palisade-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

#[test]
fn model_show_summarizes_a_model_as_text_and_json() {
    let model = example("models/web.yaml");
    let (code, out, err) = palisade(&["model", "show", &model]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "model of policy \"web\" (/etc/palisade/policies/web.yaml)",
        "recorded: 2026-11-28T04:00:00Z to 2026-11-28T04:01:30Z (90 s)",
        "files (7):",
        "/data/  (file_open): 10000 files collapsed, more than 32 files of /data/",
        "executables (2):",
        "       2  /bin/busybox",
        "       4  127.0.0.1:8080 tcp (socket_connect)",
        "       1  [::1]:53 udp (socket_sendmsg)",
        "       4  inet stream (tcp)",
        "       1  tmpfs (sb_kern_mount)",
        "other operations (1):",
    ] {
        assert!(out.contains(line), "{line}\n{out}");
    }
    let (code, out, err) = palisade(&["model", "show", &model, "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let shown = json(&out);
    assert_eq!(shown["policy"], "web");
    assert_eq!(shown["files"][0]["path"], "/data/");
    assert_eq!(shown["files"][0]["collapsed"]["files"], 10000);
    assert_eq!(shown["peers"][0]["port"], 8080);

    let (code, _, err) = palisade(&["model", "show", &example("protect-secrets.yaml")]);
    assert_eq!(code, 1);
    assert!(
        err.contains("protect-secrets.yaml: not a behaviour model"),
        "{err}"
    );
}

#[test]
fn model_diff_says_what_changed_between_two_models() {
    let dir = scratch("model-diff");
    let before = example("models/web.yaml");
    let after = dir.join("after.yaml");
    let text = std::fs::read_to_string(&before).unwrap();
    let changed = text
        .replace(
            "- path: /usr/bin/env\n  count: 1\n",
            "- path: /bin/sh\n  count: 1\n",
        )
        .replace("  count: 4\n- family: 1", "  count: 9\n- family: 1");
    assert_ne!(changed, text);
    std::fs::write(&after, changed).unwrap();
    let after = after.to_str().unwrap();
    let (code, out, err) = palisade(&["model", "diff", &before, after]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, "executables:\n  + /bin/sh\n  - /usr/bin/env\n",
        "counts aside"
    );
    let (code, out, err) = palisade(&["model", "diff", &before, after, "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let diff = json(&out);
    assert_eq!(diff["same"], false);
    assert_eq!(diff["executables"]["added"], serde_json::json!(["/bin/sh"]));
    assert_eq!(
        diff["executables"]["removed"],
        serde_json::json!(["/usr/bin/env"])
    );
    assert_eq!(diff["files"]["added"], serde_json::json!([]));
    let (code, out, _) = palisade(&["model", "diff", &before, &before]);
    assert_eq!(
        (code, out.as_str()),
        (0, "the models are the same (counts aside)\n")
    );
    let (_, out, _) = palisade(&["model", "diff", &before, &before, "--output", "json"]);
    assert_eq!(json(&out)["same"], true);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_to_policy_writes_a_reviewable_allowlist() {
    let dir = scratch("model-policy");
    let model = example("models/web.yaml");
    let (code, yaml, err) = palisade(&["model", "to-policy", &model]);
    assert_eq!(code, 0, "{err}");
    let policy = palisade_agent::policy::Policy::parse(std::path::Path::new("web.yaml"), &yaml)
        .unwrap_or_else(|err| panic!("{err}\n{yaml}"));
    assert_eq!(policy.metadata.name, "web");
    assert_eq!(
        policy.spec.mode,
        palisade_agent::policy::Mode::DefenseInDepth
    );
    let lines: Vec<&str> = yaml.lines().collect();
    let data = lines
        .iter()
        .position(|line| line.trim() == "- /data/")
        .unwrap();
    assert!(
        lines[data - 1]
            .trim_start()
            .starts_with("# 10000 distinct files"),
        "the collapsed pattern is explained:\n{yaml}"
    );
    assert!(yaml.contains("allowViolations: true"), "{yaml}");
    assert!(yaml.contains("        - /bin/busybox\n"), "{yaml}");

    let (code, out, err) = palisade(&["model", "to-policy", &model, "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let from_json: palisade_agent::policy::Policy = serde_json::from_str(&out).unwrap();
    assert_eq!(from_json, policy, "the same policy in both outputs");

    // The allowlist compiles: one rule denying (a trial: reporting) what it does not allow.
    let file = dir.join("web.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let (code, out, err) = palisade(&["policy", "compile", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rule 1 \"defense-in-depth\": deny\n"), "{out}");
    assert!(
        out.contains(
            "denied unless allowed: read,write,append,exec,connect,capabilities,network,sockets,\
             mount: audit(rule 1)\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "path_prefixes \"/bin/busybox\\x00\": read=allow(rule 0) exec=allow(rule 0)\n"
        ),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
