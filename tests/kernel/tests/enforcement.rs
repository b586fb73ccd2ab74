//! Enforcement on a real kernel: every test runs an operation inside a target cgroup and checks
//! the kernel's answer, and the same operation outside the target.

use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

#[path = "enforcement/builtin_rules.rs"]
mod builtin_rules;
#[path = "enforcement/defense_in_depth.rs"]
mod defense_in_depth;
#[path = "enforcement/kubernetes.rs"]
mod kubernetes;
#[path = "enforcement/modeling.rs"]
mod modeling;
#[path = "enforcement/modes.rs"]
mod modes;
#[path = "enforcement/observability.rs"]
mod observability;
#[path = "enforcement/open_routes.rs"]
mod open_routes;
#[path = "enforcement/path_names.rs"]
mod path_names;
#[path = "enforcement/persistence.rs"]
mod persistence;
#[path = "enforcement/rule_modules.rs"]
mod rule_modules;

use palisade_kernel_tests::{
    Answer, EPERM, Kernel, assert_allowed, assert_denied_once, binary, deny_read, file, policy,
    policy_with_spec, probe, spawn_probe,
};

/// How long an agent may take to start serving: one that loads and attaches every program is
/// slow under software emulation on a busy host (over a minute at times on 6.12).
const AGENT_START: Duration = Duration::from_secs(180);

/// Polls `done` every 100 ms until it holds, for as long as an agent may take to start; fails
/// with `failure()` if it never does.
fn wait_until(mut done: impl FnMut() -> bool, failure: impl FnOnce() -> String) {
    let started = Instant::now();
    while !done() {
        if started.elapsed() >= AGENT_START {
            panic!("{}", failure());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn read_denied_in_target_and_allowed_outside() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "read");
    let secret = file("/tmp/read/secret");
    let other = file("/tmp/read/other");
    kernel.apply(&target, policy("read", &format!(
        "    files:\n      - name: secret\n        paths: [{secret}]\n        permissions: [read]\n        action: deny\n"
    )));
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    assert_eq!(probe(Some(&target), &["read", other]), Answer::Ok);
    assert_eq!(
        probe(Some(&target), &["write", secret]),
        Answer::Ok,
        "only reading is denied"
    );
    assert_eq!(probe(None, &["read", secret]), Answer::Ok);
}

#[test]
fn write_and_append_denied_in_target_and_allowed_outside() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "write");
    let config = file("/tmp/write/etc/app.conf");
    let log = file("/tmp/write/log/app.log");
    kernel.apply(
        &target,
        policy(
            "write",
            "    files:
      - paths: [/tmp/write/etc/]
        permissions: [write]
        action: deny
      - paths: [/tmp/write/log/app.log]
        permissions: [append]
        action: deny
",
        ),
    );
    assert_eq!(probe(Some(&target), &["write", config]), EPERM);
    assert_eq!(
        probe(Some(&target), &["append", config]),
        EPERM,
        "write covers append"
    );
    assert_eq!(probe(Some(&target), &["read", config]), Answer::Ok);
    assert_eq!(probe(Some(&target), &["append", log]), EPERM);
    assert_eq!(
        probe(Some(&target), &["write", log]),
        Answer::Ok,
        "append alone does not deny write"
    );
    assert_eq!(probe(None, &["write", config]), Answer::Ok);
    assert_eq!(probe(None, &["append", log]), Answer::Ok);
}

#[test]
fn exec_denied_in_target_by_the_file_executed_and_allowed_outside() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "exec");
    // A copy of busybox: the executed program prints "ok" itself when the exec is allowed.
    std::fs::create_dir_all("/tmp/exec/bin").unwrap();
    std::fs::copy("/bin/busybox", "/tmp/exec/bin/busybox").unwrap();
    let _ = std::fs::remove_file("/tmp/exec/link");
    std::os::unix::fs::symlink("/tmp/exec/bin/busybox", "/tmp/exec/link").unwrap();
    kernel.apply(
        &target,
        policy(
            "exec",
            "    exec:\n      - paths: [/tmp/exec/bin/busybox]\n        action: deny\n",
        ),
    );
    assert_eq!(
        probe(
            Some(&target),
            &["exec", "/tmp/exec/bin/busybox", "echo", "ok"]
        ),
        EPERM
    );
    // The rule names the file, so a symlink to it is denied too.
    assert_eq!(
        probe(Some(&target), &["exec", "/tmp/exec/link", "echo", "ok"]),
        EPERM
    );
    // An exec rule also refuses reading: no copy can be made to run under another name.
    assert_eq!(
        probe(Some(&target), &["read", "/tmp/exec/bin/busybox"]),
        EPERM
    );
    assert_eq!(
        probe(None, &["exec", "/tmp/exec/bin/busybox", "echo", "ok"]),
        Answer::Ok
    );
}

#[test]
fn process_in_child_cgroup_of_target_is_covered() {
    let mut kernel = Kernel::new();
    let pod = kernel.cgroup(None, "pod");
    let container = kernel.cgroup(Some(&pod), "container");
    let nested = kernel.cgroup(Some(&container), "nested");
    let secret = file("/tmp/child/secret");
    kernel.apply(&pod, policy("pod", &deny_read(secret)));
    assert_eq!(probe(Some(&container), &["read", secret]), EPERM);
    assert_eq!(probe(Some(&nested), &["read", secret]), EPERM);
    let events = kernel.events();
    assert_eq!(events.len(), 2);
    assert!(
        events
            .iter()
            .all(|event| event.naming.target.cgroup_id == pod.id)
    );
    assert_eq!(events[0].cgroup_id, container.id);
    // A deeper target's own policy takes precedence over its ancestor's.
    kernel.apply(&container, policy("container", "    files: []\n"));
    assert_eq!(probe(Some(&container), &["read", secret]), Answer::Ok);
    assert_eq!(probe(Some(&pod), &["read", secret]), EPERM);
}

#[test]
fn a_cgroup_whose_target_is_removed_falls_under_the_target_above_it() {
    let mut kernel = Kernel::new();
    let node = kernel.cgroup(None, "filter-node");
    let pod = kernel.cgroup(Some(&node), "pod");
    let container = kernel.cgroup(Some(&pod), "container");
    let sibling = kernel.cgroup(Some(&pod), "sibling");
    let (secret, own) = (file("/tmp/filter/secret"), file("/tmp/filter/own"));
    // Above the pod, a target that decides nothing: the deepest target found must win.
    kernel.apply(
        &node,
        policy_with_spec("filter-node", "  mode: AlwaysAllow\n"),
    );
    kernel.apply(&pod, policy("filter-pod", &deny_read(secret)));
    kernel.apply(&container, policy("filter-container", &deny_read(own)));
    // Keeps the containers' level probed once `container` is no target.
    kernel.apply(&sibling, policy("filter-sibling", &deny_read(own)));
    assert_eq!(probe(Some(&container), &["read", secret]), Answer::Ok);
    assert_eq!(probe(Some(&container), &["read", own]), EPERM);
    assert!(kernel.enforcer().remove(container.id).unwrap());
    // The target filter still has the container's bit (cleared once its policy is retired):
    // the task's deepest candidate is no target, and the pod's policy is found above it, not
    // the node's.
    for stage in ["before the retirement", "after it"] {
        assert_eq!(probe(Some(&container), &["read", secret]), EPERM, "{stage}");
        assert_eq!(
            probe(Some(&container), &["read", own]),
            Answer::Ok,
            "{stage}"
        );
        assert_eq!(probe(Some(&sibling), &["read", own]), EPERM, "{stage}");
        kernel.enforcer().retire_released();
    }
    assert_eq!(probe(None, &["read", secret]), Answer::Ok);
}

#[test]
fn a_target_at_the_deepest_level_is_enforced_on_the_cgroups_below_it() {
    let mut kernel = Kernel::new();
    let mut deepest = kernel.cgroup(None, "deepest");
    while deepest.level < palisade_common::MAX_LEVEL {
        deepest = kernel.cgroup(Some(&deepest), "d");
    }
    let secret = file("/tmp/deepest/secret");
    kernel.apply(&deepest, policy("deepest", &deny_read(secret)));
    // Below it, a cgroup deeper than any target may be (made as a runtime would, not opened as
    // a target).
    let path = deepest.path.join("below");
    std::fs::create_dir(&path).unwrap();
    let below = palisade_agent::targets::Cgroup {
        id: std::fs::metadata(&path).unwrap().ino(),
        level: deepest.level + 1,
        path,
    };
    assert_eq!(probe(Some(&deepest), &["read", secret]), EPERM);
    assert_eq!(probe(Some(&below), &["read", secret]), EPERM);
    assert_eq!(probe(None, &["read", secret]), Answer::Ok);
    std::fs::remove_dir(&below.path).unwrap();
}

#[test]
fn audit_rule_allows_and_emits_one_event() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "audit");
    let watched = file("/tmp/audit/watched");
    kernel.apply(&target, policy("audit-policy", &format!(
        "    files:\n      - name: watch\n        paths: [{watched}]\n        permissions: [read]\n        action: audit\n"
    )));
    assert_eq!(probe(Some(&target), &["read", watched]), Answer::Ok);
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    let metadata = std::fs::metadata(watched).unwrap();
    assert_eq!(event.naming.action, "audit");
    assert_eq!(event.naming.hook, "file_open");
    assert_eq!(event.naming.policy.as_deref(), Some("audit-policy"));
    assert_eq!(event.naming.rule.as_deref(), Some("watch"));
    assert_eq!(event.path, watched);
    assert_eq!(event.ino, metadata.ino());
    assert_eq!(
        event.dev.to_string(),
        format!(
            "{}:{}",
            libc::major(metadata.dev()),
            libc::minor(metadata.dev())
        )
    );
    assert_eq!(event.errno, 0);
    assert_eq!(event.comm, "probe");
    assert_eq!(event.permissions, ["read"]);
    assert_eq!(event.naming.target.cgroup_id, target.id);
    assert_eq!(
        event.naming.target.cgroup_path.as_deref(),
        Some(target.path.to_str().unwrap())
    );
    assert_eq!(&*event.naming.node, "palisade-vm");
    // Outside the target: no event.
    assert_eq!(probe(None, &["read", watched]), Answer::Ok);
    assert!(kernel.events().is_empty());
}

#[test]
fn denial_emits_an_event_with_errno() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "deny-event");
    let secret = file("/tmp/deny-event/secret");
    kernel.apply(&target, policy("deny-policy", &format!(
        "    files:\n      - name: secret\n        paths: [{secret}]\n        permissions: [read, write]\n        action: deny\n"
    )));
    let mut child = spawn_probe(Some(&target), &["write", secret]);
    let pid = child.id();
    child.wait().unwrap();
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].naming.action, "deny");
    assert_eq!(events[0].errno, libc::EPERM);
    assert_eq!(events[0].pid, pid);
    assert_eq!(events[0].tid, pid, "the probe is single-threaded");
    assert_eq!(events[0].uid, 0);
    assert_eq!(events[0].permissions, ["write"]);
}

#[test]
fn glob_and_prefix_rules_match_resolved_paths() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "glob");
    let deep = file("/tmp/glob/a/b/c/id_rsa");
    let shallow = file("/tmp/glob/id_rsa");
    let near_miss = file("/tmp/glob/a/id_rsa.pub");
    let under = file("/tmp/glob-dir/x/y");
    kernel.apply(
        &target,
        policy(
            "glob",
            "    files:
      - paths: [/tmp/glob/**/id_rsa, /tmp/glob-dir/]
        permissions: [read]
        action: deny
",
        ),
    );
    assert_eq!(probe(Some(&target), &["read", deep]), EPERM);
    assert_eq!(
        probe(Some(&target), &["read", shallow]),
        EPERM,
        "** also matches no directory"
    );
    assert_eq!(probe(Some(&target), &["read", near_miss]), Answer::Ok);
    assert_eq!(probe(Some(&target), &["read", under]), EPERM);
    // A relative path names the same file: the kernel resolves it.
    let mut relative = palisade_kernel_tests::probe_command(Some(&target), &["read", "c/id_rsa"]);
    let out = relative.current_dir("/tmp/glob/a/b").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "errno 1");
}

#[test]
fn rule_removal_takes_effect_without_reloading_programs() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "removal");
    let first = file("/tmp/removal/first");
    let second = file("/tmp/removal/second");
    // Programs by id: replacing a program would give it a new one. (Other tests' programs may
    // still be going away meanwhile: only new ids count.)
    let program_ids = || -> std::collections::BTreeSet<u32> {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|program| program.id())
            .collect()
    };
    let programs_before = program_ids();
    kernel.apply(
        &target,
        policy("removal", &deny_read(&format!("{first}, {second}"))),
    );
    assert_eq!(probe(Some(&target), &["read", first]), EPERM);
    assert_eq!(probe(Some(&target), &["read", second]), EPERM);
    kernel.apply(&target, policy("removal", &deny_read(second)));
    assert_eq!(
        probe(Some(&target), &["read", first]),
        Answer::Ok,
        "the removed rule no longer applies"
    );
    assert_eq!(probe(Some(&target), &["read", second]), EPERM);
    assert!(kernel.enforcer().remove(target.id).unwrap());
    assert_eq!(
        probe(Some(&target), &["read", second]),
        Answer::Ok,
        "the removed policy no longer applies"
    );
    let loaded: Vec<u32> = program_ids()
        .difference(&programs_before)
        .copied()
        .collect();
    assert_eq!(loaded, [] as [u32; 0], "no program was loaded");
}

#[test]
fn a_replaced_policy_stays_in_the_kernel_until_retired() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "retired");
    let denied = file("/tmp/retired/denied");
    let stored = |kernel: &mut Kernel| kernel.enforcer().stored_policy_ids().unwrap();
    kernel.apply(&target, policy("v1", &deny_read(denied)));
    let first = stored(&mut kernel);
    kernel.apply(&target, policy("v2", &deny_read(denied)));
    let second = stored(&mut kernel);
    assert!(
        first.is_subset(&second) && second.len() == first.len() + 1,
        "the replaced version stays until retired: {first:?}, then {second:?}"
    );
    // The daemon's way: the wait runs while the next version replaces this one.
    let barrier = kernel.enforcer().start_retiring().expect("v1 released");
    kernel.apply(&target, policy("v3", &deny_read(denied)));
    let third = stored(&mut kernel);
    assert!(
        kernel.enforcer().start_retiring().is_none(),
        "v2 waits: one barrier out at a time"
    );
    let waited = std::thread::spawn(move || barrier.wait()).join().unwrap();
    kernel.enforcer().finish_retiring(waited);
    assert_eq!(stored(&mut kernel), third, "deleted a few at a time, later");
    kernel.enforcer().delete_retired(1);
    assert!(!kernel.enforcer().has_deletable());
    let deleted: Vec<u32> = third.difference(&stored(&mut kernel)).copied().collect();
    assert!(
        deleted.len() == 1 && first.contains(&deleted[0]),
        "only the version released before the wait is deleted: {deleted:?} of {third:?}"
    );
    assert!(
        kernel.enforcer().has_released(),
        "v2 waits for its own wait"
    );
    kernel.enforcer().retire_released();
    let left = stored(&mut kernel);
    let replaced: HashSet<u32> = second.difference(&left).copied().collect();
    assert!(
        left.is_subset(&third) && left.len() == first.len() && replaced.len() == 2,
        "both replaced versions are deleted, nothing else: {left:?} of {third:?}"
    );
    assert_eq!(probe(Some(&target), &["read", denied]), EPERM);
    assert!(!kernel.enforcer().has_released());
}

#[test]
fn policy_replacement_is_atomic() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "atomic");
    let always = file("/tmp/atomic/always");
    let versions = [
        policy(
            "v1",
            &format!(
                "    files:\n      - paths: [{always}, /tmp/atomic/a]\n        permissions: [read]\n        action: deny\n"
            ),
        ),
        policy(
            "v2",
            &format!(
                "    files:\n      - paths: [/tmp/atomic/b/, {always}]\n        permissions: [read]\n        action: deny\n      - paths: [/tmp/**/c]\n        permissions: [read]\n        action: audit\n"
            ),
        ),
    ];
    kernel.apply(&target, versions[0].clone());
    let stop = "/tmp/atomic/stop";
    let _ = std::fs::remove_file(stop);
    let reader = spawn_probe(Some(&target), &["read-until", always, stop]);
    // The reader is running once its denials show up.
    let started = Instant::now();
    while kernel.events().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the reader never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Both versions deny `always`: a read that got through saw neither version. Keep replacing
    // while denials keep coming, so that reads and replacements interleave.
    let started = Instant::now();
    let (mut replacements, mut denials_meanwhile) = (0, 0);
    while replacements < 30 || started.elapsed() < Duration::from_secs(2) {
        kernel.apply(&target, versions[replacements % 2].clone());
        // Each version's entries deleted before the next one, while the reader reads.
        kernel.enforcer().retire_released();
        replacements += 1;
        denials_meanwhile += kernel.events().len();
    }
    std::fs::write(stop, "").unwrap();
    let output = reader.wait_with_output().unwrap();
    let counts = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let (ok, rest) = counts.split_once(' ').unwrap();
    assert_eq!(ok, "ok=0", "{counts} after {replacements} replacements");
    assert!(rest.ends_with(" other=0"), "{counts}");
    assert!(
        denials_meanwhile >= replacements,
        "only {denials_meanwhile} reads during {replacements} replacements"
    );
    kernel.events();
}

#[test]
fn ten_thousand_rule_policy_loads_and_denies() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "many");
    let denied = file("/tmp/many/f7777");
    let allowed = file("/tmp/many/unlisted");
    let mut rules = String::from("    files:\n");
    for i in 0..10_000 {
        rules.push_str(&format!(
            "      - paths: [/tmp/many/f{i}]\n        permissions: [read]\n        action: deny\n"
        ));
    }
    let compiled = policy("many", &rules);
    assert_eq!(compiled.rules().len(), 10_000);
    kernel.apply(&target, compiled);
    assert_eq!(probe(Some(&target), &["read", denied]), EPERM);
    assert_eq!(probe(Some(&target), &["read", allowed]), Answer::Ok);
    assert_eq!(probe(None, &["read", denied]), Answer::Ok);
    let events = kernel.events();
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].naming.rule.as_deref(),
        Some("customRules.files[7777]")
    );
}

fn write_policy(path: &str, name: &str, cgroup: &str, denied: &str) {
    std::fs::write(path, format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\nspec:\n  target:\n    cgroupPath: {cgroup}\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    auditViolations: true\n    customRules:\n      files:\n        - paths: [{denied}]\n          permissions: [read]\n          action: deny\n"
    )).unwrap();
}

/// Empties (or creates) the directory `path`.
fn fresh_dir(path: &str) -> &str {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).unwrap();
    path
}

/// A `palisade agent` process, its log going to a file.
struct Agent {
    child: Child,
    log: String,
}

/// A test that fails leaves no agent behind to disturb the next one.
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts the agent on the policy directory `dir`, pinning under `bpffs`; `name` names its
    /// log (/tmp/NAME.log) and events (/tmp/NAME-events.jsonl).
    fn start(dir: &str, bpffs: &str, name: &str) -> Self {
        Self::start_with(dir, bpffs, name, &[])
    }

    /// `start` with more command-line arguments.
    fn start_with(dir: &str, bpffs: &str, name: &str, args: &[&str]) -> Self {
        let mut all = vec!["--policy-dir", dir, "--bpffs", bpffs];
        all.extend(args);
        Self::spawn(name, &all, &[])
    }

    /// `palisade agent ARGS` with `envs` added to its environment, its log in /tmp/NAME.log,
    /// its events in /tmp/NAME-events.jsonl unless ARGS say where.
    fn spawn(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let log = format!("/tmp/{name}.log");
        let events = format!("/tmp/{name}-events.jsonl");
        let default_events = ["--events", events.as_str()];
        let child = Command::new(binary("PALISADE_BIN"))
            .arg("agent")
            .args(args)
            .args(if args.contains(&"--events") {
                &[][..]
            } else {
                &default_events[..]
            })
            .envs(envs.iter().copied())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for_log(&self, needle: &str) {
        wait_until(
            || self.log().contains(needle),
            || format!("the agent never logged {needle:?}: {}", self.log()),
        );
    }

    /// Sends `signal` and waits, a minute at most (an agent that does not stop fails its test,
    /// not the whole suite); returns whether it exited successfully, and its log.
    fn stop(mut self, signal: i32) -> (bool, String) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the agent did not stop on signal {signal}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `palisade agent --cleanup`: afterwards nothing is pinned under `bpffs`.
fn cleanup_agent(bpffs: &str) {
    let out = Command::new(binary("PALISADE_BIN"))
        .args(["agent", "--cleanup", "--bpffs", bpffs])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!Path::new(bpffs).exists());
}

/// Polls until `probe read path` in `cgroup` answers `expected` (the agent applies changes
/// asynchronously, and a starting agent loads every program first).
fn eventually(cgroup: &palisade_agent::targets::Cgroup, path: &str, expected: &Answer) {
    wait_until(
        || probe(Some(cgroup), &["read", path]) == *expected,
        || format!("{path} never became {expected:?}"),
    );
}

#[test]
fn agent_applies_replaces_and_removes_policy_files() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "agent");
    let first = file("/tmp/agent-files/first");
    let second = file("/tmp/agent-files/second");
    let dir = fresh_dir("/tmp/agent-policies");
    let policy_file = format!("{dir}/app.yaml");
    let cgroup = target.path.to_str().unwrap();
    write_policy(&policy_file, "app", cgroup, first);
    let bpffs = "/sys/fs/bpf/palisade-test-files";
    let agent = Agent::start(dir, bpffs, "agent");
    eventually(&target, first, &EPERM);
    // A broken version is rejected; the enforced one stays.
    std::fs::write(&policy_file, "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata: {name: app}\nspec:\n  rulez: []\n").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(probe(Some(&target), &["read", first]), EPERM);
    // A valid replacement takes over as a whole.
    write_policy(&policy_file, "app", cgroup, second);
    eventually(&target, second, &EPERM);
    assert_eq!(probe(Some(&target), &["read", first]), Answer::Ok);
    // Removing the file removes the policy.
    std::fs::remove_file(&policy_file).unwrap();
    eventually(&target, second, &Answer::Ok);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
    assert!(
        log.contains("app.yaml: spec: unknown field `rulez`"),
        "{log}"
    );
    assert!(log.contains("the previous version stays enforced"), "{log}");
    let events = std::fs::read_to_string("/tmp/agent-events.jsonl").unwrap();
    let first_event: serde_json::Value =
        serde_json::from_str(events.lines().next().unwrap()).unwrap();
    assert_eq!(first_event["policy"], "app");
    assert_eq!(first_event["action"], "deny");
    assert_eq!(first_event["path"], first);
}

#[test]
fn palisade_run_denies_reports_and_cleans_up() {
    let _kernel = Kernel::new();
    let secret = file("/tmp/run/secret");
    std::fs::write("/tmp/run/policy.yaml", format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: run-policy\nspec:\n  mode: EnhanceProtect\n  enhanceProtect:\n    auditViolations: true\n    customRules:\n      files:\n        - name: secret\n          paths: [{secret}]\n          permissions: [read]\n          action: deny\n"
    )).unwrap();
    let _ = std::fs::remove_file("/tmp/run/events.jsonl");
    let run = |args: &[&str]| {
        Command::new(binary("PALISADE_BIN"))
            .args([
                "run",
                "--policy",
                "/tmp/run/policy.yaml",
                "--events",
                "/tmp/run/events.jsonl",
                "--",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let probe_bin = binary("PALISADE_PROBE");
    let probe_path = probe_bin.to_str().unwrap();
    let denied = run(&[probe_path, "read", secret]);
    assert_eq!(
        String::from_utf8_lossy(&denied.stdout).trim(),
        "errno 1",
        "stdio passes through"
    );
    assert_eq!(
        denied.status.code(),
        Some(1),
        "palisade run exits with the command's status"
    );
    let events = std::fs::read_to_string("/tmp/run/events.jsonl").unwrap();
    let lines: Vec<serde_json::Value> = events
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{events}");
    assert_eq!(lines[0]["rule"], "secret");
    assert_eq!(lines[0]["errno"], 1);
    let allowed = run(&["sh", "-c", "cat /etc/hostname >/dev/null; exit 7"]);
    assert_eq!(allowed.status.code(), Some(7));
    // As env(1): 127 for a command not found, 126 for one that cannot be executed.
    let missing = run(&["/tmp/run/no-such-command"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let not_a_program = run(&["/tmp/run/policy.yaml"]);
    assert_eq!(not_a_program.status.code(), Some(126), "{not_a_program:?}");
    assert!(
        String::from_utf8_lossy(&not_a_program.stderr).contains("cannot run /tmp/run/policy.yaml"),
        "{not_a_program:?}"
    );
    // The command cannot kill `palisade run` to shed its policy.
    let escape = run(&["sh", "-c", "kill -KILL $PPID; echo survived"]);
    assert_eq!(escape.status.code(), Some(0), "{escape:?}");
    assert_eq!(String::from_utf8_lossy(&escape.stdout).trim(), "survived");
    // The secret is readable outside, and no run cgroup is left behind.
    assert_eq!(probe(None, &["read", secret]), Answer::Ok);
    let leftovers: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("palisade-run-")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn doctor_reports_ready() {
    let out = Command::new(binary("PALISADE_BIN"))
        .arg("doctor")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("bpf is active"), "{report}");
    assert!(report.contains("READY"), "{report}");
    let out = Command::new(binary("PALISADE_BIN"))
        .args(["doctor", "--output", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ready"], true, "{report}");
    assert_eq!(
        report["programs_error"],
        serde_json::Value::Null,
        "{report}"
    );
    assert_eq!(report["lsm_list"]["bpf"], true, "{report}");
    assert_eq!(report["program_types"][0]["type"], "lsm");
    assert_eq!(report["program_types"][0]["loads"], true, "{report}");
}

#[test]
fn exec_rules_cover_descriptors_the_dynamic_loader_and_executable_mappings() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "loader");
    let data = file("/tmp/loader/data");
    let tool = "/tmp/loader/tool"; // a dynamically linked program: a copy of the probe
    std::fs::copy(binary("PALISADE_PROBE"), tool).unwrap();
    let loader = "/lib64/ld-linux-x86-64.so.2";
    kernel.apply(
        &target,
        policy(
            "loader",
            // Only the exec permission (an exec rule also refuses reading), to show that every
            // way of running the file is covered by itself.
            &format!(
                "    files:\n      - name: tool\n        paths: [{tool}]\n        permissions: [exec]\n        action: deny\n"
            ),
        ),
    );
    let through_loader = |cgroup| {
        let out =
            palisade_kernel_tests::probe_command(cgroup, &["exec", loader, tool, "read", data])
                .output()
                .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(probe(Some(&target), &["exec", tool, "read", data]), EPERM);
    // By descriptor there is no name at all: the file is what matches.
    assert_eq!(
        probe(Some(&target), &["exec-fd", tool, "read", data]),
        EPERM
    );
    // ld.so itself may run, but mapping the program executable is exec'ing it.
    assert_eq!(
        through_loader(Some(&target)),
        "",
        "the loader must fail to map the program"
    );
    assert_eq!(probe(Some(&target), &["map-exec", tool]), EPERM);
    assert_eq!(
        probe(Some(&target), &["read", tool]),
        Answer::Ok,
        "reading is not executing"
    );
    let hooks: std::collections::BTreeSet<&str> = kernel
        .events()
        .iter()
        .map(|event| event.naming.hook)
        .collect();
    assert_eq!(
        hooks.into_iter().collect::<Vec<_>>(),
        ["bprm_check_security", "mmap_file"]
    );
    // Outside the target every way works.
    assert_eq!(probe(None, &["exec", tool, "read", data]), Answer::Ok);
    assert_eq!(probe(None, &["exec-fd", tool, "read", data]), Answer::Ok);
    assert_eq!(through_loader(None), "ok");
    assert_eq!(probe(None, &["map-exec", tool]), Answer::Ok);
}

#[test]
fn targets_cannot_signal_or_trace_the_enforcing_process() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "self-protection");
    kernel.apply(&target, policy("self-protection", "    files: []\n"));
    // This test process loaded the programs: it stands for the agent.
    let me = std::process::id();
    let (pid, urgent) = (me.to_string(), libc::SIGURG.to_string()); // SIGURG is ignored by default
    let environ = format!("/proc/{me}/environ");
    assert_eq!(probe(Some(&target), &["kill", &pid, &urgent]), EPERM);
    assert_eq!(
        probe(Some(&target), &["kill", &pid, "0"]),
        Answer::Ok,
        "asking whether it exists"
    );
    // Reading its environment needs ptrace access, which /proc refuses with EACCES.
    assert_eq!(
        probe(Some(&target), &["read", &environ]),
        Answer::Errno(libc::EACCES)
    );
    let events = kernel.events();
    let seen: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.naming.hook,
                e.naming.rule.as_deref(),
                e.object_pid,
                e.signal,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "task_kill",
                Some("palisade-self-protection"),
                Some(me),
                Some(libc::SIGURG as u32)
            ),
            (
                "ptrace_access_check",
                Some("palisade-self-protection"),
                Some(me),
                None
            ),
        ]
    );
    // Outside the target nothing changes, and inside it other processes can still be signalled.
    assert_eq!(probe(None, &["kill", &pid, &urgent]), Answer::Ok);
    assert_eq!(probe(None, &["read", &environ]), Answer::Ok);
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let term = libc::SIGTERM.to_string();
    assert_eq!(
        probe(Some(&target), &["kill", &sleeper.id().to_string(), &term]),
        Answer::Ok
    );
    assert!(!sleeper.wait().unwrap().success());
}

#[test]
fn targets_cannot_change_the_enforcing_process_files_or_bpffs() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "own-files");
    kernel.apply(&target, policy("own-files", "    files: []\n"));
    let policy_file = file("/tmp/own-files/policies/app.yaml");
    let events = file("/tmp/own-files/events.jsonl");
    kernel
        .enforcer()
        .protect(Path::new("/tmp/own-files/policies"))
        .unwrap();
    kernel.enforcer().protect(Path::new(events)).unwrap();
    let pins = "/sys/fs/bpf/palisade-test-own";
    std::fs::create_dir_all(pins).unwrap();
    let rule = "palisade-self-protection";
    for violation in [
        vec!["write", policy_file],
        vec!["unlink", policy_file],
        vec!["rename", policy_file, "/tmp/own-files/moved.yaml"],
        vec!["symlink", "/etc/passwd", "/tmp/own-files/policies/new.yaml"],
        vec!["append", events],
        vec!["truncate", events],
        vec!["chmod", events, "600"],
        vec!["mkdir", "/sys/fs/bpf/palisade-test-evil"],
        vec!["rename", pins, "/sys/fs/bpf/palisade-test-moved"],
    ] {
        let event = assert_denied_once(&mut kernel, &target, rule, &violation, libc::EPERM);
        // The policy has no path rules: the path is resolved only to report the decision.
        if ["write", "append", "truncate", "unlink"].contains(&violation[0]) {
            assert_eq!(event.path, violation[1], "{violation:?}");
        }
    }
    assert_allowed(&mut kernel, &target, &["read", policy_file]);
    assert_allowed(
        &mut kernel,
        &target,
        &["write", file("/tmp/own-files/other")],
    );
    std::fs::remove_dir(pins).unwrap();
}

#[test]
fn targets_cannot_read_or_change_the_audit_trail_across_rotations() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "trail");
    let secret = file("/tmp/trail/secret");
    let dir = fresh_dir("/tmp/trail-policies");
    let bpffs = "/sys/fs/bpf/palisade-test-trail";
    write_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        secret,
    );
    let events = "/tmp/trail-events.jsonl";
    let files = [
        events.to_owned(),
        format!("{events}.1"),
        format!("{events}.2"),
    ];
    for file in &files {
        let _ = std::fs::remove_file(file);
    }
    let rotation = ["--events-max-bytes", "2000", "--events-keep", "2"];
    let agent = Agent::start_with(dir, bpffs, "trail", &rotation);
    eventually(&target, secret, &EPERM);
    // Denials, each an event, until the oldest kept file was rotated out: three rotations.
    let inode = |path: &str| std::fs::metadata(path).map(|file| file.ino()).ok();
    let mut first_oldest = None;
    let started = Instant::now();
    loop {
        assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
        let oldest = inode(&files[2]);
        first_oldest = first_oldest.or(oldest);
        if oldest.is_some() && oldest != first_oldest {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the event file was not rotated three times"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each attempt is an event too: the files rotate on while they are tried, and a rotation
    // renames the live file and `.1` away for an instant before their successors take the names.
    let settled = |cgroup: Option<&palisade_agent::targets::Cgroup>, args: &[&str]| {
        let missing = Answer::Errno(libc::ENOENT);
        (0..50)
            .map(|_| probe(cgroup, args))
            .find(|answer| *answer != missing)
            .unwrap_or(missing)
    };
    for file in &files {
        for operation in ["read", "write", "append", "truncate", "unlink"] {
            assert_eq!(
                settled(Some(&target), &[operation, file]),
                EPERM,
                "{operation} {file}"
            );
        }
        assert_eq!(
            settled(None, &["read", file]),
            Answer::Ok,
            "outside the target"
        );
    }
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    // The protection of a file ends with it: the kernel keeps from being read exactly the event
    // files there are, none rotated out (an inode number a new file may be given).
    let pinned = Path::new(bpffs)
        .join(palisade_agent::bpf::object_version())
        .join("maps/protected_inodes");
    let map = aya::maps::MapData::from_pin(pinned).unwrap();
    let map: aya::maps::HashMap<_, palisade_common::InodeKey, u32> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(map)).unwrap();
    let sorted = |mut inodes: Vec<(u32, u64)>| {
        inodes.sort();
        inodes
    };
    let hidden = map
        .iter()
        .map(Result::unwrap)
        .filter(|(_, protection)| protection & palisade_common::PROTECT_READ != 0)
        .map(|(key, _)| (key.dev, key.ino))
        .collect();
    let expected = files
        .iter()
        .map(|file| palisade_agent::bpf::inode_key(&std::fs::metadata(file).unwrap()))
        .map(|key| (key.dev, key.ino))
        .collect();
    assert_eq!(sorted(hidden), sorted(expected));
    // A restarted agent keeps them so, once it removed what it did not take over.
    let agent = Agent::start_with(dir, bpffs, "trail", &rotation);
    agent.wait_for_log("agent ready");
    for file in &files {
        assert_eq!(probe(Some(&target), &["read", file]), EPERM, "{file}");
    }
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

#[test]
fn paths_longer_than_a_trie_key_still_match() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "long");
    // Longer than the 252 bytes a trie key holds: prefixes are matched on the first 252 bytes,
    // suffixes on the last 252, and a glob's length check on the whole path.
    let deep = format!(
        "{}/{}/{}",
        "a".repeat(100),
        "b".repeat(100),
        "c".repeat(100)
    );
    let secret = format!("/tmp/long/{deep}/secret");
    let near_miss = format!("/tmp/long/{deep}/secret2");
    let logged = format!("/tmp/long-logs/{deep}/app.log");
    for path in [&secret, &near_miss, &logged] {
        file(path);
    }
    assert!(secret.len() > 300);
    kernel.apply(
        &target,
        policy(
            "long",
            "    files:
      - paths: [/tmp/long/**/secret]
        permissions: [read]
        action: deny
      - paths: [/tmp/long-logs/]
        permissions: [write]
        action: deny
",
        ),
    );
    assert_eq!(probe(Some(&target), &["read", &secret]), EPERM);
    assert_eq!(probe(Some(&target), &["read", &near_miss]), Answer::Ok);
    assert_eq!(probe(Some(&target), &["write", &logged]), EPERM);
    assert_eq!(probe(Some(&target), &["read", &logged]), Answer::Ok);
    let events = kernel.events();
    assert_eq!(events.len(), 2);
    // The event carries the first 255 bytes of the path.
    assert!(
        secret.starts_with(&events[0].path) && events[0].path.len() == 255,
        "{}",
        events[0].path
    );
}
