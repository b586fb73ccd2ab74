//! DefenseInDepth on a real kernel: the allowlist a behaviour model becomes lets the modeled
//! workload run as it did, and denies and reports anything it did not do.

use std::{
    collections::BTreeSet, net::TcpListener, os::unix::fs::PermissionsExt, path::Path, sync::Arc,
};

use palisade_agent::{
    behavior::Allowlist,
    policy::{Environment, Policy, compile},
};
use palisade_kernel_tests::{Answer, Kernel, assert_denied_once, binary, file, probe};

use super::{
    cleanup_agent,
    modeling::{model, run_in, written_model},
};

#[test]
fn an_allowlist_from_a_model_runs_the_workload_and_denies_each_deviation_once() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "allowlisted");
    let first = file("/tmp/allowlisted/first");
    let second = file("/tmp/allowlisted/second");
    let unread = file("/tmp/allowlisted/unread");
    let unrun = "/tmp/allowlisted/busybox";
    std::fs::copy("/bin/busybox", unrun).unwrap();
    std::fs::set_permissions(unrun, std::fs::Permissions::from_mode(0o755)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let unused = TcpListener::bind("127.0.0.1:0").unwrap();
    let unused_port = unused.local_addr().unwrap().port().to_string();
    let probe_path = binary("PALISADE_PROBE");
    let probe_path = probe_path.display();
    let workload = format!(
        "{probe_path} read {first} && {probe_path} read {second} && \
         {probe_path} connect 127.0.0.1 {port}"
    );

    let (agent, model_path) = model(&target, "allowlisted", "10s");
    run_in(&target, &workload);
    let model = written_model(&agent, &model_path);
    drop(agent);
    cleanup_agent("/sys/fs/bpf/palisade-test-allowlisted");

    // `palisade model to-policy`'s policy, enforced, then as the trial it was written as.
    let allowlist = |trial: bool| {
        let mut policy = Allowlist::of(&model).policy;
        policy
            .spec
            .defense_in_depth
            .as_mut()
            .expect("an allowlist")
            .allow_violations = trial;
        policy
    };
    let compiled = |policy: &Policy| {
        let source = Path::new("allowlisted.yaml");
        let compiled = compile(&source.display(), policy, &Environment::default(), &[])
            .unwrap_or_else(|err| panic!("{err}"));
        Arc::new(compiled)
    };
    let deviations: [&[&str]; 3] = [
        &["read", unread],
        &["connect", "127.0.0.1", &unused_port],
        &["exec", unrun, "echo", "ok"],
    ];

    kernel.apply(&target, compiled(&allowlist(false)));
    kernel.events();
    run_in(&target, &workload);
    run_in(&target, &workload);
    assert_eq!(kernel.events(), [], "the workload as it was modeled");
    for deviation in deviations {
        assert_denied_once(
            &mut kernel,
            &target,
            "defense-in-depth",
            deviation,
            libc::EPERM,
        );
        assert_eq!(probe(None, deviation), Answer::Ok, "{deviation:?} outside");
    }

    // Deny rules apply on top: a file the workload read, denied by a custom rule.
    let mut with_rule = allowlist(false);
    with_rule.spec.enhance_protect = Some(
        serde_json::from_value(serde_json::json!({
            "privileged": true,
            "auditViolations": true,
            "customRules": {"files": [
                {"name": "no-second", "paths": [second], "permissions": ["read"], "action": "deny"}
            ]},
        }))
        .unwrap(),
    );
    kernel.apply(&target, compiled(&with_rule));
    assert_denied_once(
        &mut kernel,
        &target,
        "no-second",
        &["read", second],
        libc::EPERM,
    );

    // The trial denies nothing and reports each operation it does not allow once, however often
    // it happens: an exec seen at bprm_check and again at the program's mapping is one (6.12
    // also reads the program first: another operation, reported once too).
    kernel.apply(&target, compiled(&allowlist(true)));
    kernel.events();
    run_in(&target, &workload);
    for deviation in deviations {
        for _ in 0..3 {
            assert_eq!(probe(Some(&target), deviation), Answer::Ok, "{deviation:?}");
        }
    }
    let events = kernel.events();
    let reported: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|event| {
            assert_eq!(
                (event.naming.action, event.naming.rule.as_deref()),
                ("audit", Some("defense-in-depth")),
                "{event:#?}"
            );
            let permission = event.permissions.first().copied().unwrap_or_default();
            (event.naming.hook, event.path.as_str(), permission)
        })
        .collect();
    let once: BTreeSet<_> = reported.iter().copied().collect();
    assert_eq!(once.len(), reported.len(), "{reported:?}");
    let expected = BTreeSet::from([
        ("file_open", unread, "read"),
        ("socket_connect", "", ""),
        ("bprm_check_security", unrun, "exec"),
    ]);
    let program_read = BTreeSet::from([("file_open", unrun, "read")]);
    assert!(
        once == expected || once == &expected | &program_read,
        "{reported:?}"
    );
    drop((listener, unused));
}
