//! The kernel test harness: one loaded `Enforcer` per test process, test cgroups, and a probe
//! process run inside them. These tests need BPF LSM and root: they run inside the VM harness
//! (`cargo xtask vm-test`) and fail, never skip, when the kernel cannot enforce.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use palisade_agent::{
    bpf::Enforcer,
    events::{AuditEvent, Decoder},
    policy::{
        CompiledPolicy, Endpoints, Environment, INGRESS_ADMISSION_SERVICE, Policy,
        ServiceDestinations, compile,
    },
    targets::{Cgroup, Hierarchy, PodRegistry, join_in_child},
};

struct Loaded {
    enforcer: Enforcer,
    events: RingBuf<MapData>,
    decoder: Decoder,
}

fn loaded() -> MutexGuard<'static, Loaded> {
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let mut enforcer =
                Enforcer::load().unwrap_or_else(|err| panic!("BPF LSM must work here: {err}"));
            let events = enforcer.take_events().expect("the ring buffer");
            let decoder = Decoder::new(enforcer.registry(), PodRegistry::default());
            Mutex::new(Loaded {
                enforcer,
                events,
                decoder,
            })
        })
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

/// More events than the ring buffer can hold at once (2 MiB of ~440-byte records: ~4,800).
const RING_CAPACITY: usize = 8192;

/// A binary the VM image provides, named by an environment variable the init script sets.
pub fn binary(variable: &str) -> PathBuf {
    PathBuf::from(
        std::env::var_os(variable)
            .unwrap_or_else(|| panic!("{variable} must be set (run in the VM harness)")),
    )
}

/// Runs `test` on a runtime of its own.
pub fn block_on(test: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

/// `name`, made this kernel's: the API server outlives a boot, so each kernel's run names its
/// namespaces and nodes its own way.
pub fn this_kernels(name: &str) -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    format!("{name}-{}", release.trim().replace(['.', '+', '_'], "-"))
}

/// The API server address the tests' policies are compiled for.
pub const KUBE_APISERVER: &str = "10.96.0.1";

/// Where the tests' policies are compiled to find the ingress-nginx admission webhook: a
/// Service's cluster IP, and one endpoint (on loopback, where a test can listen) on this port.
pub const INGRESS_ADMISSION_IP: &str = "10.96.0.20";
pub const INGRESS_ADMISSION_ENDPOINT: &str = "127.0.0.2";
pub const INGRESS_ADMISSION_PORT: u16 = 18443;

/// Compiles a policy whose `spec` is `spec` (YAML, indented by two spaces).
pub fn policy_with_spec(name: &str, spec: &str) -> Arc<CompiledPolicy> {
    let text = format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\nspec:\n{spec}"
    );
    let file = Path::new("test.yaml");
    let parsed = Policy::parse(file, &text).unwrap_or_else(|err| panic!("{err}"));
    let env = Environment {
        kube_apiserver: vec![KUBE_APISERVER.to_owned()],
        node: "palisade-vm".to_owned(),
        ingress_admission: Some(ServiceDestinations {
            services: vec![format!("ingress-nginx/{INGRESS_ADMISSION_SERVICE}")],
            cluster_ips: vec![INGRESS_ADMISSION_IP.to_owned()],
            endpoints: vec![Endpoints {
                addresses: vec![INGRESS_ADMISSION_ENDPOINT.to_owned()],
                ports: vec![INGRESS_ADMISSION_PORT],
            }],
        }),
    };
    Arc::new(compile(&file.display(), &parsed, &env, &[]).unwrap_or_else(|err| panic!("{err}")))
}

/// Compiles a policy with only `customRules` (YAML, indented by four spaces), whose denials
/// are reported.
pub fn policy(name: &str, rules: &str) -> Arc<CompiledPolicy> {
    let rules: String = rules.lines().map(|line| format!("  {line}\n")).collect();
    policy_with_spec(
        name,
        &format!(
            "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    auditViolations: true\n    customRules:\n{rules}"
        ),
    )
}

/// The custom rules of a policy that denies reading `paths` (a YAML list's contents).
pub fn deny_read(paths: &str) -> String {
    format!(
        "    files:\n      - paths: [{paths}]\n        permissions: [read]\n        action: deny\n"
    )
}

/// What the kernel answered a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Errno(i32),
}

pub const EPERM: Answer = Answer::Errno(libc::EPERM);

/// The kernel's answer a finished probe printed.
pub fn answer(out: &std::process::Output) -> Answer {
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "ok" => Answer::Ok,
        other => match other.strip_prefix("errno ").and_then(|n| n.parse().ok()) {
            Some(errno) => Answer::Errno(errno),
            None => panic!(
                "unexpected probe output: {other:?} ({}; stderr: {})",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        },
    }
}

/// The probe (tests/kernel/src/bin/probe.rs), placed in `cgroup` before it executes.
pub fn probe_command(cgroup: Option<&Cgroup>, args: &[&str]) -> Command {
    let mut command = Command::new(binary("PALISADE_PROBE"));
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cgroup) = cgroup {
        let procs = cgroup.procs_file();
        // SAFETY: join_in_child only makes async-signal-safe calls.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                join_in_child(&procs)
            })
        };
    }
    command
}

/// Runs the probe to completion: `cgroup` None runs it outside every target.
pub fn probe(cgroup: Option<&Cgroup>, args: &[&str]) -> Answer {
    let out = probe_command(cgroup, args)
        .output()
        .expect("running the probe");
    answer(&out)
}

pub fn spawn_probe(cgroup: Option<&Cgroup>, args: &[&str]) -> Child {
    probe_command(cgroup, args)
        .spawn()
        .expect("starting the probe")
}

/// Waits up to `limit` for `child` to exit: how it did. Past the limit, kills it and fails with
/// `never`'s message.
pub fn exited_within(
    child: &mut Child,
    limit: Duration,
    never: impl FnOnce() -> String,
) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{}", never());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads `path` in a loop inside a target until told to stop, counting each answer.
pub struct Prober {
    child: Child,
    stop: String,
}

/// How often each answer came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReport {
    pub ok: u64,
    pub eperm: u64,
    pub other: u64,
}

impl Prober {
    /// `stop` is a file whose existence ends the loop.
    pub fn start(target: &Cgroup, path: &str, stop: &str) -> Self {
        let _ = std::fs::remove_file(stop);
        Self {
            child: spawn_probe(Some(target), &["read-until", path, stop]),
            stop: stop.to_owned(),
        }
    }

    pub fn finish(self) -> ProbeReport {
        std::fs::write(&self.stop, "").expect("creating the stop file");
        let out = self
            .child
            .wait_with_output()
            .expect("waiting for the prober");
        let text = String::from_utf8_lossy(&out.stdout);
        let count = |name: &str| -> u64 {
            text.split_whitespace()
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} count in the prober's report {text:?}"))
        };
        ProbeReport {
            ok: count("ok"),
            eperm: count("eperm"),
            other: count("other"),
        }
    }
}

/// One test's view of the kernel: exclusive use of the loaded programs, and the cgroups and
/// policies it made, all removed when it ends.
pub struct Kernel {
    loaded: MutexGuard<'static, Loaded>,
    cgroups: Vec<Cgroup>,
}

impl Kernel {
    pub fn new() -> Self {
        let mut loaded = loaded();
        // Leftovers of an earlier test.
        for _ in 0..RING_CAPACITY {
            if loaded.events.next().is_none() {
                break;
            }
        }
        Self {
            loaded,
            cgroups: Vec::new(),
        }
    }

    /// A fresh cgroup `name` below `parent` (or below the tests' own directory).
    pub fn cgroup(&mut self, parent: Option<&Cgroup>, name: &str) -> Cgroup {
        let cgroups = Hierarchy::find().expect("cgroup2 is mounted");
        let base = match parent {
            Some(parent) => parent.path.clone(),
            None => {
                let base = cgroups.mount.join("palisade-tests");
                std::fs::create_dir_all(&base).expect("creating the tests' cgroup");
                base
            }
        };
        let cgroup = cgroups
            .create(&base, name)
            .unwrap_or_else(|err| panic!("{err}"));
        self.cgroups.push(cgroup.clone());
        cgroup
    }

    pub fn enforcer(&mut self) -> &mut Enforcer {
        &mut self.loaded.enforcer
    }

    pub fn apply(&mut self, cgroup: &Cgroup, policy: Arc<CompiledPolicy>) {
        self.loaded
            .enforcer
            .apply(cgroup, policy)
            .expect("applying the policy");
    }

    /// Audit events submitted since the last call (at most a ring buffer's worth).
    pub fn events(&mut self) -> Vec<AuditEvent> {
        let Loaded {
            events, decoder, ..
        } = &mut *self.loaded;
        let mut read = Vec::new();
        // Bounded: a target that keeps being denied produces events as fast as we decode them.
        while read.len() < RING_CAPACITY
            && let Some(record) = events.next()
        {
            read.push(Decoder::read(&record).expect("a decodable event"));
        }
        let mut decoded = Vec::with_capacity(read.len());
        decoder.decode(&read, &mut decoded);
        decoded.into_iter().map(|decoded| decoded.event).collect()
    }
}

impl Default for Kernel {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        for cgroup in self.cgroups.iter().rev() {
            let _ = self.loaded.enforcer.remove(cgroup.id);
            let _ = std::fs::write(cgroup.path.join("cgroup.kill"), "1");
            let _ = cgroup.remove();
        }
        self.loaded.enforcer.retire_released();
        // A test may have limited the audit rate: the next one starts without a limit.
        let _ = self.loaded.enforcer.set_audit_rate(None);
    }
}

/// A fresh target protected by one built-in rule from `list` (privileged, so that the
/// RuntimeDefault set stays out of the way; denials reported).
pub fn protect_with_rule(kernel: &mut Kernel, list: &str, rule: &str) -> Cgroup {
    let target = kernel.cgroup(None, rule);
    kernel.apply(
        &target,
        policy_with_spec(
            rule,
            &format!(
                "  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    auditViolations: true\n    {list}: [{rule}]\n"
            ),
        ),
    );
    target
}

/// Runs the probe with `args` in `target`: it must fail with `errno`, reported by exactly one
/// audit event that names `rule`. Returns the event.
pub fn assert_denied_once(
    kernel: &mut Kernel,
    target: &Cgroup,
    rule: &str,
    args: &[&str],
    errno: i32,
) -> AuditEvent {
    kernel.events();
    assert_eq!(
        probe(Some(target), args),
        Answer::Errno(errno),
        "{rule}: {args:?} in the target"
    );
    let events = kernel.events();
    assert_eq!(events.len(), 1, "{rule}: {args:?}: {events:#?}");
    let event = events.into_iter().next().expect("one event");
    assert_eq!(event.naming.rule.as_deref(), Some(rule), "{event:#?}");
    assert_eq!(event.naming.action, "deny", "{event:#?}");
    event
}

/// Runs the probe with `args` in `target`: it must succeed, unreported.
pub fn assert_allowed(kernel: &mut Kernel, target: &Cgroup, args: &[&str]) {
    kernel.events();
    assert_eq!(
        probe(Some(target), args),
        Answer::Ok,
        "{args:?} in the target"
    );
    assert_eq!(kernel.events(), [], "{args:?}");
}

/// Runs a shell command outside every target (setup and cleanup).
pub fn sh(command: &str) {
    // What it prints goes in the failure, not to the console the suite's results are read from.
    let out = Command::new("sh").args(["-c", command]).output().unwrap();
    assert!(
        out.status.success(),
        "{command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates `path` with some content (and its directories).
pub fn file(path: &str) -> &str {
    let path_ref = Path::new(path);
    std::fs::create_dir_all(path_ref.parent().expect("absolute")).expect("creating directories");
    std::fs::write(path_ref, "content\n").expect("creating the file");
    path
}
