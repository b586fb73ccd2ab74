//! Enforcement that outlives the agent: pinned in bpffs, taken over by a restarted agent (which
//! takes over the programs, not the open verdict cache turned off by `--no-open-cache`), handed
//! over by a new build without a moment unprotected, and removed only by `--cleanup`; and
//! enforcement that starts before a target does: a cgroup created after its policy is armed by
//! the kernel before anything runs in it.

use std::{path::Path, time::Duration};

use palisade_agent::{
    bpf::{Enforcer, MapSizes, PinnedState, object_version},
    targets::Hierarchy,
};
use palisade_kernel_tests::{
    Answer, EPERM, Kernel, ProbeReport, Prober, deny_read, exited_within, file, policy, probe,
    spawn_probe,
};

use super::{
    Agent, cleanup_agent, eventually, fresh_dir,
    observability::{Scrape, wait_until_ready},
    wait_until, write_policy,
};

/// A restarted agent adopted the programs pinned under `bpffs`: one link per program, none
/// attached twice.
fn assert_programs_adopted(bpffs: &str) {
    let links = Path::new(bpffs).join(object_version()).join("links");
    let pinned = std::fs::read_dir(&links).unwrap().count();
    assert_eq!(
        pinned,
        palisade_agent::bpf::PROGRAM_COUNT,
        "the programs adopted, not loaded again"
    );
}

fn assert_never_allowed(report: &ProbeReport) {
    assert!(
        report.ok == 0 && report.eperm > 0,
        "the file was readable at some point: {report:?}"
    );
}

#[test]
fn a_killed_agent_keeps_enforcing_and_a_restarted_one_takes_over() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "persist");
    let first = file("/tmp/persist/first");
    let second = file("/tmp/persist/second");
    let dir = fresh_dir("/tmp/persist-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-persist";
    let policy_file = format!("{dir}/app.yaml");
    let cgroup = target.path.to_str().unwrap();
    write_policy(&policy_file, "app", cgroup, first);
    let agent = Agent::start(dir, bpffs, "persist-1");
    eventually(&target, first, &EPERM);
    let prober = Prober::start(&target, first, "/tmp/persist/stop");
    agent.stop(libc::SIGKILL);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        probe(Some(&target), &["read", first]),
        EPERM,
        "no agent, still enforced"
    );
    let agent = Agent::start(dir, bpffs, "persist-2");
    agent.wait_for_log("agent ready");
    assert_never_allowed(&prober.finish());
    assert_programs_adopted(bpffs);
    // And it is in charge: a change to the policy takes effect.
    write_policy(&policy_file, "app", cgroup, second);
    eventually(&target, second, &EPERM);
    assert_eq!(probe(Some(&target), &["read", first]), Answer::Ok);
    // Stopping the agent leaves enforcement in place; --cleanup ends it.
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert_eq!(probe(Some(&target), &["read", second]), EPERM);
    cleanup_agent(bpffs);
    // The kernel releases unpinned links asynchronously (6.12 defers it to a workqueue).
    eventually(&target, second, &Answer::Ok);
}

#[test]
fn an_agent_without_the_open_cache_decides_every_open_and_a_restart_turns_it_on_again() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "uncached");
    let secret = file("/tmp/uncached/secret");
    let public = file("/tmp/uncached/public");
    let dir = fresh_dir("/tmp/uncached-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-uncached";
    write_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        secret,
    );
    let cached = || Scrape::now().value("palisade_opens_cached_total", &[]);
    let agent = Agent::start_with(dir, bpffs, "uncached-1", &["--no-open-cache"]);
    wait_until_ready(&agent);
    eventually(&target, secret, &EPERM);
    let before = cached();
    assert_eq!(
        probe(Some(&target), &["read-times", "50", public]),
        Answer::Ok
    );
    assert_eq!(
        cached() - before,
        0.0,
        "opens answered by a cache turned off"
    );
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    // The next agent adopts the pinned programs, and the cache is on: the first of 50 reads
    // tags the file's slot, the second fills it, the 48 after are answered from it (unless
    // the agent started a new epoch meanwhile: then again).
    let agent = Agent::start(dir, bpffs, "uncached-2");
    wait_until_ready(&agent);
    assert_programs_adopted(bpffs);
    wait_until(
        || {
            let before = cached();
            assert_eq!(
                probe(Some(&target), &["read-times", "50", public]),
                Answer::Ok
            );
            cached() - before >= 48.0
        },
        || format!("the cache never answered 48 of 50 reads: {}", agent.log()),
    );
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    drop(agent);
    cleanup_agent(bpffs);
}

#[test]
fn a_new_build_takes_over_with_no_unprotected_window() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "upgrade");
    let secret = file("/tmp/upgrade/secret");
    let bpffs = "/sys/fs/bpf/palisade-test-upgrade";
    let older = PinnedState {
        root: bpffs.into(),
        version: "v-older-build".to_owned(),
    };
    let older_dir = older.dir();
    let _ = std::fs::remove_dir_all(bpffs);
    // An older build's agent enforced the policy and exited, leaving its state pinned.
    {
        let mut old = Enforcer::load_pinned(older, &MapSizes::default()).unwrap();
        old.apply(&target, policy("old", &deny_read(secret)))
            .unwrap();
    }
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    let prober = Prober::start(&target, secret, "/tmp/upgrade/stop");
    let dir = fresh_dir("/tmp/upgrade-policies");
    write_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        secret,
    );
    let agent = Agent::start(dir, bpffs, "upgrade");
    // The new build removes the old state once it enforces every policy itself.
    wait_until(
        || !older_dir.exists(),
        || "the old build's state stays".to_owned(),
    );
    assert!(Path::new(bpffs).join(object_version()).exists());
    std::thread::sleep(Duration::from_secs(1));
    assert_never_allowed(&prober.finish());
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(
        log.contains("removed the pinned state of another build"),
        "{log}"
    );
    cleanup_agent(bpffs);
    eventually(&target, secret, &Answer::Ok);
}

#[test]
fn a_cgroup_created_after_its_policy_is_armed_before_its_first_exec() {
    let mut kernel = Kernel::new();
    let parent = kernel.cgroup(None, "arming");
    let tool = "/tmp/arming/bin/tool";
    std::fs::create_dir_all("/tmp/arming/bin").unwrap();
    std::fs::copy(palisade_kernel_tests::binary("PALISADE_PROBE"), tool).unwrap();
    let dir = fresh_dir("/tmp/arming-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-arming";
    std::fs::write(
        format!("{dir}/pod.yaml"),
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: pod\nspec:\n  target:\n    cgroupPath: {}/new-pod\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n      exec:\n        - paths: [{tool}]\n          action: deny\n",
            parent.path.display()
        ),
    )
    .unwrap();
    let agent = Agent::start(dir, bpffs, "arming");
    agent.wait_for_log("armed until created");
    // The agent looks at cgroups every few seconds; the kernel arms the new one at creation, so
    // the very first program run in it is already decided by the policy.
    let pod = kernel.cgroup(Some(&parent), "new-pod");
    let procs = pod.procs_file();
    let mut first = std::process::Command::new(tool);
    first.args(["read", "/proc/version"]);
    // SAFETY: join_in_child only makes async-signal-safe calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut first, move || {
            palisade_agent::targets::join_in_child(&procs)
        })
    };
    let error = first.output().expect_err("the first exec is denied");
    assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{error}");
    assert_eq!(probe(Some(&pod), &["read", "/proc/version"]), Answer::Ok);
    // Nor can the workload touch the agent's policies or its pinned maps.
    let policy_file = format!("{dir}/pod.yaml");
    assert_eq!(probe(Some(&pod), &["write", &policy_file]), EPERM);
    let targets_map = Path::new(bpffs).join(object_version()).join("maps/targets");
    assert_eq!(
        probe(Some(&pod), &["bpf-obj-get", targets_map.to_str().unwrap()]),
        EPERM
    );
    assert_eq!(
        probe(None, &["bpf-obj-get", targets_map.to_str().unwrap()]),
        Answer::Ok
    );
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

/// A policy file edited to name a cgroup not created yet: its old target stays protected until
/// the new one is armed. A process in the old target makes the new cgroup the moment it is
/// released: were the old target released first, that cgroup would be made unarmed, and run
/// its first process unconfined.
#[test]
fn an_edit_to_a_cgroup_not_created_yet_keeps_the_old_target_until_the_new_one_is_armed() {
    let mut kernel = Kernel::new();
    let old = kernel.cgroup(None, "moving");
    let parent = kernel.cgroup(None, "moving-to");
    let secret = file("/tmp/moving/secret");
    let dir = fresh_dir("/tmp/moving-policies");
    let policy_file = format!("{dir}/app.yaml");
    write_policy(&policy_file, "app", old.path.to_str().unwrap(), secret);
    let bpffs = "/sys/fs/bpf/palisade-test-moving";
    let agent = Agent::start(dir, bpffs, "moving");
    eventually(&old, secret, &EPERM);

    let new = parent.path.join("new");
    let mut released = spawn_probe(
        Some(&old),
        &["read-until-allowed", secret, new.to_str().unwrap()],
    );
    write_policy(&policy_file, "app", new.to_str().unwrap(), secret);
    let status = exited_within(&mut released, Duration::from_secs(120), || {
        format!("the old target was never released: {}", agent.log())
    });
    assert!(status.success(), "making the new cgroup failed");
    let new = Hierarchy::find()
        .unwrap()
        .open(new.to_str().unwrap())
        .unwrap();
    assert_eq!(
        probe(Some(&new), &["read", secret]),
        EPERM,
        "the new cgroup, made as the old target was released: {}",
        agent.log()
    );
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
    new.remove().unwrap();
}

#[test]
fn a_cgroup_armed_with_a_staged_policy_follows_its_next_version() {
    let mut kernel = Kernel::new();
    let parent = kernel.cgroup(None, "restage");
    let first = file("/tmp/restage/first");
    let second = file("/tmp/restage/second");
    let stage = |kernel: &mut Kernel, denied: &str| {
        kernel
            .enforcer()
            .stage(&parent, "pod", policy("pod", &deny_read(denied)))
            .expect("staging the pod's policy");
    };
    stage(&mut kernel, first);
    // The kubelet creates the pod's cgroup (the kernel arms it with the staged version) while
    // the agent stages the pod's next version, before it applies that to the cgroup.
    let pod = kernel.cgroup(Some(&parent), "pod");
    assert_eq!(probe(Some(&pod), &["read", first]), EPERM);
    stage(&mut kernel, second);
    assert_eq!(
        probe(Some(&pod), &["read", second]),
        EPERM,
        "the armed cgroup is under the new version"
    );
    assert_eq!(probe(Some(&pod), &["read", first]), Answer::Ok);
    assert_eq!(probe(Some(&parent), &["read", second]), Answer::Ok);
    kernel.enforcer().unstage(parent.id, "pod").unwrap();
}

#[test]
fn pods_created_while_their_policy_is_restaged_never_run_unconfined() {
    let mut kernel = Kernel::new();
    let parent = kernel.cgroup(None, "churn");
    let shared = file("/tmp/churn/shared");
    let versions = [
        policy(
            "pod",
            &deny_read(&format!("{shared}, {}", file("/tmp/churn/a"))),
        ),
        policy(
            "pod",
            &deny_read(&format!("{shared}, {}", file("/tmp/churn/b"))),
        ),
    ];
    for round in 0..20 {
        let name = format!("pod-{round}");
        kernel
            .enforcer()
            .stage(&parent, &name, versions[0].clone())
            .unwrap();
        // The kubelet creates the pod's cgroup and starts its first process while the agent
        // stages one new version after another.
        let creating = {
            let (base, name) = (parent.path.clone(), name.clone());
            std::thread::spawn(move || {
                let pod = Hierarchy::find().unwrap().create(&base, &name).unwrap();
                let first = probe(Some(&pod), &["read", shared]);
                (pod, first)
            })
        };
        let mut restaged = 0;
        while !creating.is_finished() {
            restaged += 1;
            kernel
                .enforcer()
                .stage(&parent, &name, versions[restaged % 2].clone())
                .unwrap();
            // The version before deleted at once: a pod armed with it and missed by the
            // repoint would be unconfined.
            kernel.enforcer().retire_released();
        }
        let (pod, first) = creating.join().unwrap();
        assert_eq!(first, EPERM, "round {round}: the pod's first process");
        assert_eq!(
            probe(Some(&pod), &["read", shared]),
            EPERM,
            "round {round}: after {restaged} versions staged"
        );
        kernel.enforcer().unstage(parent.id, &name).unwrap();
        pod.remove().unwrap();
    }
}

#[test]
fn pinned_state_that_does_not_match_is_replaced_without_a_moment_unprotected() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "corrupt");
    let secret = file("/tmp/corrupt/secret");
    let dir = fresh_dir("/tmp/corrupt-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-corrupt";
    write_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        secret,
    );
    let agent = Agent::start(dir, bpffs, "corrupt-1");
    eventually(&target, secret, &EPERM);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    // Another map pinned in the place of `targets`.
    let maps = Path::new(bpffs).join(object_version()).join("maps");
    std::fs::rename(maps.join("stats"), maps.join("targets")).unwrap();
    let prober = Prober::start(&target, secret, "/tmp/corrupt/stop");
    let agent = Agent::start(dir, bpffs, "corrupt-2");
    agent.wait_for_log("agent ready");
    let (_, metrics) = super::observability::http_get("/metrics").unwrap();
    assert!(
        metrics.contains("palisade_pinned_state_replaced_total 1"),
        "{metrics}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_never_allowed(&prober.finish());
    // The state set aside went once this start enforced every policy; the new one enforces.
    let versions: Vec<_> = std::fs::read_dir(bpffs)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(versions, [object_version().as_str()]);
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(
        log.contains("the pinned state does not match this build"),
        "{log}"
    );
    // A restart on the state it left adopts it as it is.
    let agent = Agent::start(dir, bpffs, "corrupt-3");
    agent.wait_for_log("agent ready");
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(!log.contains("does not match"), "{log}");
    cleanup_agent(bpffs);
}

#[test]
fn a_policy_too_large_for_the_maps_is_rejected_and_resizing_them_leaves_no_moment_unprotected() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "sized");
    let paths: Vec<String> = (0..6).map(|index| format!("/tmp/sized/f{index}")).collect();
    for path in &paths {
        file(path);
    }
    let dir = fresh_dir("/tmp/sized-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-sized";
    let policy_file = format!("{dir}/app.yaml");
    let cgroup = target.path.to_str().unwrap();
    write_policy(&policy_file, "app", cgroup, &paths[0]);
    let agent = Agent::start_with(dir, bpffs, "sized-1", &["--max-path-entries", "4"]);
    eventually(&target, &paths[0], &EPERM);
    // Six paths do not fit in four entries: refused, and the enforced version stays.
    write_policy(&policy_file, "app", cgroup, &paths.join(", "));
    agent.wait_for_log(
        "the kernel's path_prefixes map is full (4 entries): the agent's --max-path-entries",
    );
    assert_eq!(probe(Some(&target), &["read", &paths[0]]), EPERM);
    assert_eq!(probe(Some(&target), &["read", &paths[5]]), Answer::Ok);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    // Larger maps: the pinned state is replaced, the first path denied throughout.
    let prober = Prober::start(&target, &paths[0], "/tmp/sized/stop");
    let agent = Agent::start_with(dir, bpffs, "sized-2", &["--max-path-entries", "16"]);
    eventually(&target, &paths[5], &EPERM);
    assert_never_allowed(&prober.finish());
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(
        log.contains("path_prefixes is (type, key size, value size, entries, flags)"),
        "{log}"
    );
    cleanup_agent(bpffs);
}

#[test]
fn replaced_policies_not_retired_yet_make_room_when_the_maps_are_full() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "room");
    let versions = [
        "/tmp/room/a",
        "/tmp/room/b",
        "/tmp/room/c",
        "/tmp/room/d",
        "/tmp/room/e",
        "/tmp/room/f",
    ]
    .map(file);
    let bpffs = "/sys/fs/bpf/palisade-test-room";
    let _ = std::fs::remove_dir_all(bpffs);
    let sizes = MapSizes {
        path_entries: 4,
        ..MapSizes::default()
    };
    let mut enforcer = Enforcer::load_pinned(PinnedState::new(Path::new(bpffs)), &sizes).unwrap();
    // One path entry each, the versions replaced keep theirs until retired: the fifth would
    // not fit beside them.
    for path in versions {
        enforcer
            .apply(&target, policy("room", &deny_read(path)))
            .unwrap_or_else(|err| panic!("applying the version denying {path}: {err}"));
    }
    assert_eq!(probe(Some(&target), &["read", versions[5]]), EPERM);
    assert_eq!(probe(Some(&target), &["read", versions[0]]), Answer::Ok);
    drop(enforcer);
    cleanup_agent(bpffs);
}

#[test]
fn an_agent_killed_before_during_or_after_a_policy_update_never_lets_through_what_both_deny() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "killed-update");
    let shared = file("/tmp/killed-update/shared");
    let versions = [
        file("/tmp/killed-update/first"),
        file("/tmp/killed-update/second"),
    ];
    let dir = fresh_dir("/tmp/killed-update-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-killed-update";
    let policy_file = format!("{dir}/app.yaml");
    let cgroup = target.path.to_str().unwrap();
    let write_version = |index: usize| {
        write_policy(
            &policy_file,
            "app",
            cgroup,
            &format!("{shared}, {}", versions[index % 2]),
        )
    };
    write_version(0);
    let agent = Agent::start(dir, bpffs, "killed-update");
    eventually(&target, versions[0], &EPERM);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    // Both versions deny `shared`: whatever moment the agent dies at, it stays denied.
    let prober = Prober::start(&target, shared, "/tmp/killed-update/stop");
    for (update, delay_ms) in [0, 1, 3, 10, 30, 100, 300].into_iter().enumerate() {
        let agent = Agent::start(dir, bpffs, "killed-update");
        agent.wait_for_log("agent ready");
        write_version(update + 1);
        std::thread::sleep(Duration::from_millis(delay_ms));
        agent.stop(libc::SIGKILL);
    }
    let agent = Agent::start(dir, bpffs, "killed-update");
    agent.wait_for_log("agent ready");
    // The last version written (the eighth: the second) is the one enforced.
    eventually(&target, versions[1], &EPERM);
    eventually(&target, versions[0], &Answer::Ok);
    assert_never_allowed(&prober.finish());
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}
