//! DefenseInDepth on a real kernel: the allowlist a behaviour model becomes lets the modeled
//! workload run as it did, and denies and reports anything it did not do.

use std::{net::TcpListener, os::unix::fs::PermissionsExt, path::Path, sync::Arc};

use palisade_agent::{
    behavior::Allowlist,
    policy::{Environment, compile},
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

    // `palisade model to-policy`'s policy, enforced rather than a trial.
    let mut policy = Allowlist::of(&model).policy;
    policy
        .spec
        .defense_in_depth
        .as_mut()
        .expect("an allowlist")
        .allow_violations = false;
    let source = Path::new("allowlisted.yaml");
    let compiled = compile(&source.display(), &policy, &Environment::default(), &[])
        .unwrap_or_else(|err| panic!("{err}"));
    kernel.apply(&target, Arc::new(compiled));
    kernel.events();

    run_in(&target, &workload);
    run_in(&target, &workload);
    assert_eq!(kernel.events(), [], "the workload as it was modeled");
    let deviations: [&[&str]; 3] = [
        &["read", unread],
        &["connect", "127.0.0.1", &unused_port],
        &["exec", unrun, "echo", "ok"],
    ];
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
    drop((listener, unused));
}
