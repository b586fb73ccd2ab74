//! Policy modes on a real kernel: what AlwaysAllow, RuntimeDefault and the violation flags do.

use palisade_kernel_tests::{
    Answer, EPERM, Kernel, assert_allowed, file, policy_with_spec, probe, spawn_probe,
};

#[test]
fn always_allow_watches_and_denies_nothing() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "always-allow");
    kernel.apply(
        &target,
        policy_with_spec("always-allow", "  mode: AlwaysAllow\n"),
    );
    // Self-protection included: this test process loaded the programs, it stands for the agent.
    let (me, urgent) = (std::process::id().to_string(), libc::SIGURG.to_string());
    for allowed in [
        vec!["read", "/proc/kcore"],
        vec!["readlink", "/proc/1/root"],
        vec!["sethostname"],
        vec!["kill", &me, &urgent],
    ] {
        assert_allowed(&mut kernel, &target, &allowed);
    }
}

#[test]
fn always_allow_switches_in_place_and_wins_below_another_mode() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "always-allow-switch");
    let always_allow = policy_with_spec("switch", "  mode: AlwaysAllow\n");
    let runtime_default = policy_with_spec("switch", "  mode: RuntimeDefault\n");
    let kcore = ["read", "/proc/kcore"];
    // While the only target is in AlwaysAllow the programs decide nothing: each switch must
    // have them decide again before the target points at the policy that denies.
    for round in 0..2 {
        kernel.apply(&target, always_allow.clone());
        assert_allowed(&mut kernel, &target, &kcore);
        kernel.apply(&target, runtime_default.clone());
        assert_eq!(probe(Some(&target), &kcore), EPERM, "round {round}");
    }
    // A deeper target's policy wins, AlwaysAllow too, self-protection included (this test
    // process stands for the agent); the target above still denies.
    let child = kernel.cgroup(Some(&target), "left-alone");
    kernel.apply(&child, always_allow);
    let (me, urgent) = (std::process::id().to_string(), libc::SIGURG.to_string());
    assert_allowed(&mut kernel, &child, &kcore);
    assert_allowed(&mut kernel, &child, &["kill", &me, &urgent]);
    assert_eq!(probe(Some(&target), &kcore), EPERM);
    assert_eq!(probe(Some(&target), &["kill", &me, &urgent]), EPERM);
}

#[test]
fn runtime_default_denies_silently_and_keeps_the_target_working() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "runtime-default");
    kernel.apply(
        &target,
        policy_with_spec("runtime-default", "  mode: RuntimeDefault\n"),
    );
    std::fs::create_dir_all("/tmp/rd/point").unwrap();
    kernel.events();
    for (violation, errno) in [
        (vec!["read", "/proc/kcore"], EPERM),
        (vec!["write", "/proc/sysrq-trigger"], EPERM),
        (vec!["read", "/proc/self/mem"], EPERM),
        (vec!["read", "/sys/kernel/security/lsm"], EPERM),
        (vec!["mount", "tmpfs", "none", "/tmp/rd/point"], EPERM),
        (vec!["new-mount", "tmpfs", "/tmp/rd/point"], EPERM),
        (
            vec!["readlink", "/proc/1/root"],
            Answer::Errno(libc::EACCES),
        ),
    ] {
        assert_eq!(probe(Some(&target), &violation), errno, "{violation:?}");
    }
    // RuntimeDefault reports nothing (auditViolations is an EnhanceProtect flag).
    assert_eq!(kernel.events(), []);
    // Processes of the same target may still inspect each other.
    let stop = "/tmp/rd/stop";
    let _ = std::fs::remove_file(stop);
    let mut sibling = spawn_probe(Some(&target), &["read-until", file("/tmp/rd/data"), stop]);
    let root = format!("/proc/{}/root", sibling.id());
    assert_allowed(&mut kernel, &target, &["readlink", &root]);
    std::fs::write(stop, "").unwrap();
    sibling.wait().unwrap();
    assert_allowed(&mut kernel, &target, &["read", "/proc/version"]);
}

#[test]
fn allow_violations_reports_without_denying() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "allow-violations");
    kernel.apply(
        &target,
        policy_with_spec(
            "allow-violations",
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    allowViolations: true\n    attackProtectionRules: [disable-access-passwd]\n",
        ),
    );
    let passwd = file("/etc/passwd");
    kernel.events();
    assert_eq!(probe(Some(&target), &["read", passwd]), Answer::Ok);
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].naming.action, "audit");
    assert_eq!(events[0].errno, 0);
    assert_eq!(
        events[0].naming.rule.as_deref(),
        Some("disable-access-passwd")
    );
}

#[test]
fn a_recreated_cgroup_of_the_same_name_is_not_the_target() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "reused");
    kernel.apply(
        &target,
        policy_with_spec(
            "reused",
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    attackProtectionRules: [disable-access-passwd]\n",
        ),
    );
    let passwd = file("/etc/passwd");
    assert_eq!(probe(Some(&target), &["read", passwd]), EPERM);
    // Policies are keyed by the cgroup's 64-bit id, which the kernel never reuses: a new cgroup
    // under the old name is someone else.
    target.remove().unwrap();
    let newcomer = kernel.cgroup(None, "reused");
    assert_ne!(newcomer.id, target.id);
    assert_eq!(probe(Some(&newcomer), &["read", passwd]), Answer::Ok);
}
