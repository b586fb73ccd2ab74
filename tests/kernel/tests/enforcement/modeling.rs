//! BehaviorModeling on a real kernel: a target runs a scripted workload while the kernel records
//! what it does, and the agent writes the model when the duration ends.

use std::{net::TcpListener, path::Path, process::Command};

use palisade_agent::{
    behavior::{Allowlist, BehaviorModel, load_model},
    policy::{Permission, PortRange, Protocol},
    targets::Cgroup,
};
use palisade_kernel_tests::{Kernel, binary, file, probe_command};

use super::{Agent, cleanup_agent, fresh_dir, observability::Scrape, wait_until};

/// Starts an agent modeling `target` for `duration` (policy `name`); returns it once the kernel
/// records.
pub(super) fn model(target: &Cgroup, name: &str, duration: &str) -> (Agent, String) {
    let dir = fresh_dir(&format!("/tmp/{name}-policies")).to_owned();
    let models = fresh_dir(&format!("/tmp/{name}-models")).to_owned();
    std::fs::write(
        format!("{dir}/{name}.yaml"),
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\nspec:\n  target:\n    cgroupPath: {}\n  mode: BehaviorModeling\n  behaviorModeling:\n    duration: {duration}\n",
            target.path.display()
        ),
    )
    .unwrap();
    let bpffs = format!("/sys/fs/bpf/palisade-test-{name}");
    let agent = Agent::start_with(&dir, &bpffs, name, &["--models-dir", &models]);
    agent.wait_for_log("modeling the target's behaviour");
    // Logged as the model opens, before the policy that records into it is enforced.
    agent.wait_for_log("agent ready");
    (agent, format!("{models}/{name}.yaml"))
}

/// Waits for the model at `path` (written after the duration and one more pass).
pub(super) fn written_model(agent: &Agent, path: &str) -> BehaviorModel {
    wait_until(
        || Path::new(path).exists(),
        || format!("no model at {path}: {}", agent.log()),
    );
    load_model(Path::new(path)).unwrap()
}

/// Runs `sh -c script` inside `target`; fails unless it succeeds.
pub(super) fn run_in(target: &Cgroup, script: &str) {
    let procs = target.procs_file();
    let mut command = Command::new("/bin/busybox");
    command.args(["sh", "-c", script]);
    // SAFETY: join_in_child only makes async-signal-safe calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            palisade_agent::targets::join_in_child(&procs)
        })
    };
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `probe runtime` printed: a container runtime joining `container`, re-executing a sealed
/// copy of itself first if `copy` says so (`memfd-copy`, `bind-copy`), opening a file as `setup`
/// says, then executing the probe with `entrypoint` as arguments.
pub(super) fn run_as_runtime(
    container: &Path,
    copy: &str,
    setup: [&str; 2],
    entrypoint: &[&str],
) -> String {
    let procs = container.join("cgroup.procs");
    let probe_path = binary("PALISADE_PROBE");
    let mut args = vec![
        "runtime",
        procs.to_str().unwrap(),
        copy,
        setup[0],
        setup[1],
        probe_path.to_str().unwrap(),
    ];
    args.extend(entrypoint);
    let out = probe_command(None, &args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What starting a program reads besides the workload's own files: the kernel opens the program
/// run for reading and maps it executable; the probe (dynamically linked) has the loader read its
/// cache and map the shared libraries executable, and its runtime read its own memory map
/// (`/proc/PID/maps`: glibc's pthread_getattr_np, finding the main thread's stack).
fn read_to_start(model: &BehaviorModel, path: &str) -> bool {
    let program = model.executables.iter().any(|run| run.what.path == path);
    let own_memory_map = path
        .strip_prefix("/proc/")
        .and_then(|rest| rest.strip_suffix("/maps"))
        .is_some_and(|pid| pid.bytes().all(|byte| byte.is_ascii_digit()));
    program
        || own_memory_map
        || path == "/etc/ld.so.cache"
        || path.starts_with("/lib")
        || path.starts_with("/usr/lib")
}

#[test]
fn a_modeled_workload_is_exactly_the_files_programs_and_peer_it_used() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "modeled");
    let first = file("/tmp/modeled/first");
    let second = file("/tmp/modeled/second");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (agent, model_path) = model(&target, "modeled", "10s");

    let probe = binary("PALISADE_PROBE");
    let probe = probe.display();
    run_in(
        &target,
        &format!(
            "{probe} read {first} && {probe} read {second} && {probe} connect 127.0.0.1 {port}"
        ),
    );
    let model = written_model(&agent, &model_path);
    assert!(model.complete, "{model:#?}");
    assert_eq!(model.lost, 0);
    assert_eq!(model.target, target.path.display().to_string());

    let programs: Vec<&str> = model
        .executables
        .iter()
        .map(|run| run.what.path.as_str())
        .collect();
    assert_eq!(
        programs,
        ["/bin/busybox", "/palisade/bin/probe"],
        "{model:#?}"
    );
    let probe_runs = model
        .executables
        .iter()
        .find(|run| run.what.path.ends_with("probe"));
    assert_eq!(probe_runs.unwrap().count, 3);

    // The workload's own files; the rest is starting its programs.
    let (loader, own): (Vec<_>, Vec<_>) = model
        .files
        .iter()
        .partition(|used| read_to_start(&model, &used.path));
    let own: Vec<(&str, &[String])> = own
        .iter()
        .map(|used| (used.path.as_str(), used.permissions.as_slice()))
        .collect();
    assert_eq!(
        own,
        [
            (first, &["read".to_owned()][..]),
            (second, &["read".to_owned()][..])
        ],
        "{model:#?}"
    );
    assert!(
        loader.iter().any(|used| used.path.contains("libc.so")
            && used.permissions == ["read", "exec"]
            && used.hooks == ["file_open", "mmap_file"]),
        "the probe's libc, opened and mapped executable: {loader:#?}"
    );
    let memory_maps = loader.iter().filter(|used| used.path.ends_with("/maps"));
    assert_eq!(
        memory_maps.count(),
        3,
        "one per run of the probe: {loader:#?}"
    );

    assert_eq!(model.peers.len(), 1, "{model:#?}");
    let peer = &model.peers[0];
    assert_eq!(
        (
            peer.what.hook.as_str(),
            peer.what.address.as_str(),
            peer.what.port,
            peer.what.protocol
        ),
        (
            "socket_connect",
            "127.0.0.1",
            u32::from(port),
            libc::IPPROTO_TCP as u32
        )
    );
    assert_eq!(model.sockets.len(), 1, "the probe's TCP socket: {model:#?}");
    assert!(
        model.mounts.is_empty() && model.operations.is_empty(),
        "{model:#?}"
    );
    drop(listener);

    // The policy it becomes allows that: the programs, the two files, the peer.
    let policy = Allowlist::of(&model).policy;
    assert_eq!(policy.spec.target, model.spec.target);
    let allow = policy.spec.defense_in_depth.unwrap().allow;
    assert_eq!(allow.exec, programs);
    assert!(
        allow
            .files
            .iter()
            .any(|rule| rule.permissions == [Permission::Read]
                && rule.paths.iter().any(|path| path == first)
                && rule.paths.iter().any(|path| path == second)),
        "{allow:#?}"
    );
    assert_eq!(allow.network.len(), 1, "{allow:#?}");
    assert_eq!(
        (
            &allow.network[0].addresses[..],
            &allow.network[0].ports[..],
            &allow.network[0].protocols[..]
        ),
        (
            &["127.0.0.1".to_owned()][..],
            &[PortRange::Port(port)][..],
            &[Protocol::Tcp][..]
        )
    );

    // Nothing is recorded once the model is written: the target runs on, left alone.
    run_in(&target, &format!("{probe} read {first}"));
    assert!(agent.log().contains("behaviour model written"));
    drop(agent);
    cleanup_agent("/sys/fs/bpf/palisade-test-modeled");
}

#[test]
fn a_noisy_workload_makes_a_compact_model_and_no_events() {
    const FILES: usize = 10_000;
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "noisy");
    let dir = fresh_dir("/tmp/noisy-files");
    for index in 0..FILES {
        std::fs::write(format!("{dir}/{index}"), "x").unwrap();
    }
    let (agent, model_path) = model(&target, "noisy", "15s");
    // One process reads every file (busybox's cat, given them all at once).
    run_in(&target, &format!("cd {dir} && cat * > /dev/null"));
    let model = written_model(&agent, &model_path);

    let collapsed: Vec<_> = model
        .files
        .iter()
        .filter(|used| used.collapsed.is_some())
        .collect();
    assert_eq!(collapsed.len(), 1, "{:#?}", model.files);
    let pattern = collapsed[0];
    assert_eq!(pattern.path, format!("{dir}/"));
    assert_eq!(pattern.permissions, ["read"]);
    // Every file was opened once: recorded in the pattern, or counted as lost when the kernel's
    // record map (8,192 entries, emptied every 2 s) was full.
    let recorded = pattern.collapsed.as_ref().unwrap().files;
    assert_eq!(
        recorded as u64 + model.lost,
        FILES as u64,
        "{:#?}",
        model.files
    );
    assert_eq!(pattern.count, recorded as u64);
    assert!(model.files.len() < 20, "compact: {:#?}", model.files);

    // Modeling raises no audit event: the kernel counts in its maps, not on the ring buffer.
    assert_eq!(Scrape::now().value("palisade_events_total", &[]), 0.0);
    drop(agent);
    cleanup_agent("/sys/fs/bpf/palisade-test-noisy");
}

#[test]
fn a_runtimes_setup_of_a_new_container_is_not_modeled() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "modeled-runtime");
    let state = file("/tmp/modeled-runtime/state");
    let used = file("/tmp/modeled-runtime/used");
    let (agent, model_path) = model(&target, "modeled-runtime", "5s");
    let container = kernel.cgroup(Some(&target), "container");
    assert_eq!(
        run_as_runtime(
            &container.path,
            "memfd-copy",
            ["write", state],
            &["read", used]
        ),
        "ok"
    );
    let model = written_model(&agent, &model_path);
    assert!(model.complete, "{model:#?}");
    let programs: Vec<&str> = model
        .executables
        .iter()
        .map(|run| run.what.path.as_str())
        .collect();
    assert_eq!(programs, ["/palisade/bin/probe"], "{model:#?}");
    let own: Vec<(&str, &[String])> = model
        .files
        .iter()
        .filter(|used| !read_to_start(&model, &used.path))
        .map(|used| (used.path.as_str(), used.permissions.as_slice()))
        .collect();
    assert_eq!(own, [(used, &["read".to_owned()][..])], "{model:#?}");
    drop(agent);
    cleanup_agent("/sys/fs/bpf/palisade-test-modeled-runtime");
}
