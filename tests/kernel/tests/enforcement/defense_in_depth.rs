//! DefenseInDepth on a real kernel: the allowlist a behaviour model becomes lets the modeled
//! workload run as it did, and denies and reports anything it did not do.

use std::{
    collections::BTreeSet,
    net::TcpListener,
    os::{
        linux::net::SocketAddrExt,
        unix::{
            fs::PermissionsExt,
            net::{SocketAddr, UnixListener},
        },
    },
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use palisade_agent::{
    behavior::Allowlist,
    bpf::AuditRate,
    policy::{Environment, Policy, compile},
    rules::{RuleHost, compile_policy},
};
use palisade_kernel_tests::{
    Answer, EPERM, Kernel, assert_allowed, assert_denied_once, binary, file, policy_with_spec,
    probe,
};

use super::{
    cleanup_agent, fresh_dir,
    modeling::{model, run_as_runtime, run_in, written_model},
    rule_modules::install_module,
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
    // An open for ioctls only asks for reading and writing: of a file the workload only read.
    assert_denied_once(
        &mut kernel,
        &target,
        "defense-in-depth",
        &["open-ioctl", first],
        libc::EPERM,
    );
    // A program allowed by hand runs (an exec allowance covers reading it: the exec's open of
    // the program is decided as a read).
    let mut with_program = allowlist(false);
    with_program
        .spec
        .defense_in_depth
        .as_mut()
        .expect("an allowlist")
        .allow
        .exec
        .push(unrun.to_owned());
    kernel.apply(&target, compiled(&with_program));
    kernel.events();
    assert_eq!(
        probe(Some(&target), &["exec", unrun, "echo", "ok"]),
        Answer::Ok
    );
    assert_eq!(kernel.events(), [], "an allowed program");

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

    // A rule module widens the allowlist: name resolution's files and DNS to a resolver.
    std::fs::create_dir_all("/etc").unwrap();
    std::fs::write("/etc/hosts", "127.0.0.1 localhost\n").unwrap();
    let resolver = TcpListener::bind("127.0.0.1:53").unwrap();
    let name_resolution: [&[&str]; 2] = [&["read", "/etc/hosts"], &["connect", "127.0.0.1", "53"]];
    for operation in name_resolution {
        assert_eq!(
            probe(Some(&target), operation),
            EPERM,
            "{operation:?} before the module"
        );
    }
    let modules = fresh_dir("/tmp/allowlisted-modules");
    let mut widened = allowlist(false);
    widened.spec.rule_modules = vec![
        serde_json::from_value(serde_json::json!({
            "name": "runtime-needs",
            "module": "runtime-needs.wasm",
            "sha256": install_module("runtime-needs", modules),
            "config": {"resolvers": ["127.0.0.1"]},
        }))
        .unwrap(),
    ];
    let compiled_widened = compile_policy(
        &RuleHost::new(None).unwrap(),
        &"allowlisted.yaml",
        Path::new(modules),
        &widened,
        &Environment::default(),
    )
    .unwrap_or_else(|err| panic!("{err}"));
    kernel.apply(&target, Arc::new(compiled_widened));
    kernel.events();
    for operation in name_resolution {
        assert_eq!(probe(Some(&target), operation), Answer::Ok, "{operation:?}");
    }
    assert_eq!(kernel.events(), [], "what the module allows");
    assert_denied_once(
        &mut kernel,
        &target,
        "defense-in-depth",
        &["read", unread],
        libc::EPERM,
    );

    // The trial denies nothing and reports each operation it does not allow once, however often
    // it happens: an exec seen at bprm_check and again at the program's mapping is one.
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
    // The new program is read (opened for the exec) and run: two operations, each once.
    let expected = BTreeSet::from([
        ("file_open", unread, "read"),
        ("socket_connect", "", ""),
        ("file_open", unrun, "read"),
        ("bprm_check_security", unrun, "exec"),
    ]);
    assert_eq!(once, expected, "{reported:?}");
    drop((listener, unused, resolver));
}

#[test]
fn a_written_allowlist_denies_what_it_does_not_list_in_every_category() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "written-allowlist");
    let _ = std::fs::remove_dir_all("/tmp/written");
    let read_only = file("/tmp/written/read-only/file");
    let unlinked = file("/tmp/written/read-only/unlinked");
    let writable = file("/tmp/written/writable/file");
    let mount_point = "/tmp/written/mnt";
    std::fs::create_dir_all(mount_point).unwrap();
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let abstract_socket = |name: &[u8]| {
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap()
    };
    let _allowed_socket = abstract_socket(b"written-allowed");
    let _other_socket = abstract_socket(b"written-other");
    // Reading and running every file: the probe and what it loads.
    let spec = concat!(
        "  mode: DefenseInDepth\n",
        "  defenseInDepth:\n",
        "    allow:\n",
        "      files:\n",
        "        - {paths: [/], permissions: [read, exec]}\n",
        "        - {paths: [/tmp/written/writable/], permissions: [read, write]}\n",
        "      capabilities: [chown, sys_admin]\n",
        "      network: [{addresses: [127.0.0.1], protocols: [tcp]}]\n",
        "      mount: [tmpfs]\n",
        "      sockets: [{family: inet, types: [stream]}, {family: unix}]\n",
        "      unixSockets: [\"@written-allowed\"]\n",
    );
    kernel.apply(&target, policy_with_spec("written", spec));

    let allowed: [&[&str]; 8] = [
        &["read", read_only],
        &["write", writable],
        &["truncate", writable],
        &["chown", writable, "1", "1"],
        &["connect", "127.0.0.1", &port],
        &["socket", "1", "2", "0"],
        &["unix-connect", "@written-allowed"],
        &["mount", "tmpfs", "none", mount_point],
    ];
    for operation in allowed {
        assert_allowed(&mut kernel, &target, operation);
    }
    probe(None, &["umount", mount_point]);
    let denied: [&[&str]; 12] = [
        // Files: a permission not listed, by open and by every other hook that changes a file.
        &["write", read_only],
        &["open-ioctl", read_only],
        &["truncate", read_only],
        &["unlink", unlinked],
        &["mkdir", "/tmp/written/read-only/directory"],
        &["chmod", read_only, "600"],
        // A capability, a peer, socket families and types, a UNIX socket and a mount not listed.
        &["setuid", "1"],
        &["connect", "127.0.0.2", &port],
        &["socket", "2", "2", "0"],
        &["socket", "10", "1", "0"],
        &["unix-connect", "@written-other"],
        &["mount", "ramfs", "none", mount_point],
    ];
    for operation in denied {
        assert_denied_once(
            &mut kernel,
            &target,
            "defense-in-depth",
            operation,
            libc::EPERM,
        );
        assert_eq!(probe(None, operation), Answer::Ok, "{operation:?} outside");
        if operation[0] == "mount" {
            probe(None, &["umount", mount_point]);
        }
    }
    drop(listener);
}

#[test]
fn a_trial_reports_new_operations_at_the_audit_rate_and_a_throttled_one_when_it_happens_again() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "trial-rate");
    let _ = std::fs::remove_dir_all("/tmp/trial-rate");
    let paths: Vec<String> = (0..10).map(|i| format!("/tmp/trial-rate/{i}")).collect();
    for path in &paths {
        file(path);
    }
    const RATE: u32 = 1;
    const BURST: u32 = 2;
    kernel
        .enforcer()
        .set_audit_rate(Some(AuditRate {
            per_second: RATE,
            burst: BURST,
        }))
        .unwrap();
    let spec = concat!(
        "  mode: DefenseInDepth\n",
        "  defenseInDepth:\n",
        "    allowViolations: true\n",
        "    allow:\n",
        "      files: [{paths: [/], permissions: [read, exec]}]\n",
    );
    kernel.apply(&target, policy_with_spec("trial-rate", spec));
    kernel.events();
    // Appending opens each file for writing (no truncation): one new operation per file.
    let append = |paths: &[&String]| {
        let names: Vec<&str> = paths.iter().map(|path| path.as_str()).collect();
        format!("for f in {}; do echo x >> $f; done", names.join(" "))
    };
    let reported = |kernel: &mut Kernel| -> Vec<(String, u32)> {
        let events = kernel.events();
        for event in &events {
            assert_eq!(
                (
                    event.naming.hook,
                    event.naming.action,
                    event.naming.rule.as_deref(),
                    event.errno
                ),
                ("file_open", "audit", Some("defense-in-depth"), 0),
                "{event:#?}"
            );
        }
        events
            .into_iter()
            .map(|event| (event.path, event.suppressed))
            .collect()
    };
    let stats = |kernel: &mut Kernel| kernel.enforcer().stats().unwrap();

    // A flood of new operations: reported at the audit rate, each of the others counted.
    let before = stats(&mut kernel);
    let started = Instant::now();
    run_in(&target, &append(&paths.iter().collect::<Vec<_>>()));
    let elapsed = started.elapsed().as_secs_f64();
    let first = reported(&mut kernel);
    let after = stats(&mut kernel);
    let throttled = after.events_throttled - before.events_throttled;
    let emitted = first.len() as f64;
    // A new bucket lets BURST events through at once, then RATE a second.
    let most = f64::from(BURST) + (f64::from(RATE) * elapsed).floor();
    assert!(
        emitted >= f64::from(BURST) && emitted <= most,
        "{first:?} in {elapsed:.2} s"
    );
    assert_eq!(
        first.len() as u64 + throttled,
        paths.len() as u64,
        "{first:?}"
    );
    assert!(throttled > 0, "{first:?} in {elapsed:.2} s");
    // Held back since the last event sent.
    let held: u64 = throttled - first.iter().map(|(_, held)| u64::from(*held)).sum::<u64>();
    assert_eq!(after.events_repeated, before.events_repeated);
    let first_paths: BTreeSet<&str> = first.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(first_paths.len(), first.len(), "{first:?}");
    let reported_path = paths
        .iter()
        .find(|path| first_paths.contains(path.as_str()))
        .unwrap();
    let throttled_path = paths
        .iter()
        .find(|path| !first_paths.contains(path.as_str()))
        .unwrap();

    // With credit again: a throttled operation is reported when it happens again (saying how
    // many were held back), once; a reported one never again.
    std::thread::sleep(Duration::from_millis(u64::from(1000 / RATE) + 200));
    let before = stats(&mut kernel);
    run_in(
        &target,
        &append(&[throttled_path, throttled_path, reported_path]),
    );
    assert_eq!(
        reported(&mut kernel),
        [(throttled_path.clone(), held as u32)]
    );
    let after = stats(&mut kernel);
    assert_eq!(after.events_repeated - before.events_repeated, 2);
    assert_eq!(after.events_throttled, before.events_throttled);
}

#[test]
fn a_runtime_sets_a_container_up_outside_the_allowlist_which_starts_at_its_entrypoints_exec() {
    let mut kernel = Kernel::new();
    let pod = kernel.cgroup(None, "runtime-pod");
    let _ = std::fs::remove_dir_all("/tmp/runtime");
    let state = file("/tmp/runtime/state");
    let secret = file("/tmp/runtime/secret");
    let unwritten = file("/tmp/runtime/unwritten");
    let spec = format!(
        concat!(
            "  mode: DefenseInDepth\n",
            "  defenseInDepth:\n",
            "    allow:\n",
            "      files:\n",
            "        - {{paths: [/], permissions: [read, exec]}}\n",
            "        - {{paths: [{pod}/], permissions: [read, write]}}\n",
            "  enhanceProtect:\n",
            "    privileged: true\n",
            "    customRules:\n",
            "      files: [{{name: no-secret, paths: [{secret}], permissions: [read], action: deny}}]\n",
        ),
        pod = pod.path.display(),
        secret = secret,
    );
    kernel.apply(&pod, policy_with_spec("runtime", &spec));
    kernel.events();

    // Containers' cgroups, made by the runtime (in no target): its setup writes a file the
    // allowlist does not list, before and after re-executing a sealed copy of itself (runc 1.1);
    // the entrypoint it then executes may not.
    let containers = ["itself", "memfd-copy", "bind-copy"].map(|copy| {
        let container = kernel.cgroup(Some(&pod), &format!("container-{copy}"));
        assert_eq!(
            run_as_runtime(
                &container.path,
                copy,
                ["write", state],
                &["write", unwritten]
            ),
            "errno 1",
            "{copy}"
        );
        container
    });
    // A cgroup made for a policy staged for it, as a pod's: the same.
    let staging = kernel.cgroup(None, "runtime-staging");
    kernel
        .enforcer()
        .stage(&staging, "pod", policy_with_spec("runtime", &spec))
        .expect("staging the pod's policy");
    let staged = kernel.cgroup(Some(&staging), "pod");
    assert_eq!(
        run_as_runtime(
            &staged.path,
            "itself",
            ["write", state],
            &["write", unwritten]
        ),
        "errno 1",
        "staged"
    );
    kernel.enforcer().unstage(staging.id, "pod").unwrap();
    let events = kernel.events();
    let denied: Vec<(&str, Option<&str>, &str)> = events
        .iter()
        .map(|event| {
            (
                event.naming.hook,
                event.naming.rule.as_deref(),
                event.path.as_str(),
            )
        })
        .collect();
    assert_eq!(
        denied,
        [("file_open", Some("defense-in-depth"), unwritten); 4],
        "{events:#?}"
    );
    // Once the entrypoint ran, what joins the container is under the allowlist from its first
    // instruction (runc exec).
    assert_eq!(
        run_as_runtime(
            &containers[0].path,
            "itself",
            ["write", state],
            &["read", state]
        ),
        "setup errno 1"
    );
    // Deny rules apply to the setup too.
    let denied_setup = kernel.cgroup(Some(&pod), "denied-setup");
    assert_eq!(
        run_as_runtime(
            &denied_setup.path,
            "itself",
            ["read", secret],
            &["read", state]
        ),
        "setup errno 1"
    );
    // A cgroup a task of the target makes is never set up outside the allowlist.
    let nested = pod.path.join("nested");
    let made = probe(Some(&containers[0]), &["mkdir", nested.to_str().unwrap()]);
    let setup = run_as_runtime(&nested, "itself", ["write", state], &["read", state]);
    let _ = std::fs::remove_dir(&nested);
    assert_eq!((made, setup.as_str()), (Answer::Ok, "setup errno 1"));
    kernel.events();
}
