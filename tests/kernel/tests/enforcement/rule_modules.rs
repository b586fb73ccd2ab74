//! Rule modules in a running agent: a Wasm module compiles a policy into rules the kernel
//! enforces and decides the policy's events (severity, tags, annotations, kill); a misbehaving
//! module is contained and the agent keeps serving.

use std::{
    os::unix::process::ExitStatusExt,
    time::{Duration, Instant},
};

use palisade_agent::rules::DECIDE_BUDGET;
use palisade_kernel_tests::{EPERM, Kernel, binary, exited_within, file, probe, spawn_probe};

use super::{
    Agent, cleanup_agent, fresh_dir,
    observability::{
        Scrape, dashboard_and_alerts_read_only_exported_metrics, http_get, wait_until_ready,
    },
    wait_until, write_policy,
};

/// Copies the module `name` (built into the VM image) into `dir`; returns its SHA-256 digest.
pub(super) fn install_module(name: &str, dir: &str) -> String {
    use sha2::Digest;
    let source = binary("PALISADE_RULES").join(format!("{name}.wasm"));
    let bytes = std::fs::read(&source).unwrap_or_else(|err| panic!("{}: {err}", source.display()));
    std::fs::write(format!("{dir}/{name}.wasm"), &bytes).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A policy on `cgroup` that reports violations and uses the module `name` with `config`.
fn module_policy(file: &str, policy: &str, cgroup: &str, name: &str, digest: &str, config: &str) {
    std::fs::write(
        file,
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {policy}\nspec:\n  target:\n    cgroupPath: {cgroup}\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    auditViolations: true\n  ruleModules:\n    - name: {name}\n      module: {name}.wasm\n      sha256: {digest}\n      config: {config}\n"
        ),
    )
    .unwrap();
}

/// The lines the agent `name` wrote: audit events, then rule module failures.
fn lines(name: &str) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    std::fs::read_to_string(format!("/tmp/{name}-events.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .partition(|line| line.get("type").is_none())
}

fn events(name: &str) -> Vec<serde_json::Value> {
    lines(name).0
}

/// Whether a module decided `event` (every verdict of the modules in these tests rates it).
fn decided(event: &serde_json::Value) -> bool {
    !event["severity"].is_null()
}

/// The first event the agent `name` wrote that a module decided. Under emulation a decide may
/// overrun its budget: the guest charges the thread with the time its host runs something else.
/// The events of that batch are kept undecided, and a timeout reported beside them must say so.
fn first_decided(name: &str) -> serde_json::Value {
    let (events, failures) = lines(name);
    let undecided = events.iter().take_while(|event| !decided(event)).count();
    if undecided > 0 {
        let failure = failures.first().unwrap_or_else(|| {
            panic!("{undecided} events not decided, and no failure reported: {events:?}")
        });
        assert_eq!(failure["failure"], "timeout", "{failure}");
        assert!(
            failure["events"].as_u64() >= Some(undecided as u64),
            "{failure}"
        );
    }
    events
        .get(undecided)
        .unwrap_or_else(|| panic!("no event decided: {events:?} {failures:?}"))
        .clone()
}

/// Waits for `done` (see `wait_until`).
fn wait_for(what: &str, done: impl FnMut() -> bool) {
    wait_until(done, || format!("never {what}"));
}

#[test]
fn a_rust_module_compiles_rules_the_kernel_enforces_and_decides_their_events() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "module");
    let secret = file("/tmp/module/secret");
    let dir = fresh_dir("/tmp/module-policies");
    let digest = install_module("protect-files", dir);
    module_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        "protect-files",
        &digest,
        &format!("{{paths: [{secret}], kill: [probe]}}"),
    );
    let bpffs = "/sys/fs/bpf/palisade-test-module";
    let agent = Agent::start(dir, bpffs, "module");
    wait_until_ready(&agent);
    // The module's rule, enforced by the kernel; outside the target nothing changes.
    assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    assert_eq!(
        probe(None, &["read", secret]),
        palisade_kernel_tests::Answer::Ok
    );
    // Its verdict on a process that keeps trying: killed.
    let stop = "/tmp/module/stop";
    let _ = std::fs::remove_file(stop);
    let mut reader = spawn_probe(Some(&target), &["read-until", secret, stop]);
    let status = exited_within(&mut reader, Duration::from_secs(30), || {
        format!("the module's kill verdict never landed: {}", agent.log())
    });
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    wait_for("a killed event", || {
        events("module").iter().any(|event| event["killed"] == true)
    });
    let scrape = Scrape::now();
    assert!(
        scrape.value(
            "palisade_rule_module_verdicts_total",
            &[("module", "protect-files"), ("verdict", "kill")]
        ) >= 1.0
    );
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
    let first = first_decided("module");
    assert_eq!(first["rule"], "protect-files/protected-files");
    assert_eq!(first["action"], "deny");
    assert_eq!(first["severity"], "high");
    assert_eq!(first["tags"], serde_json::json!(["protected-file"]));
    assert_eq!(
        first["annotations"]["attempt"],
        format!("probe (uid 0) on {secret}")
    );
}

/// Also checks the Grafana dashboard against an agent that uses every metric family: cost
/// measured, modules deciding, failing and giving verdicts.
#[test]
fn a_misbehaving_module_is_contained_and_the_agent_keeps_serving() {
    let mut kernel = Kernel::new();
    let looping = kernel.cgroup(None, "looping");
    let broken = kernel.cgroup(None, "broken");
    let healthy = kernel.cgroup(None, "healthy");
    let secret = file("/tmp/misbehaving/secret");
    let dir = fresh_dir("/tmp/misbehaving-policies");
    let digest = install_module("misbehaving", dir);
    let healthy_digest = install_module("protect-files", dir);
    module_policy(
        &format!("{dir}/healthy.yaml"),
        "healthy",
        healthy.path.to_str().unwrap(),
        "protect-files",
        &healthy_digest,
        &format!("{{paths: [{secret}]}}"),
    );
    // Deciding never returns; compiling exhausts memory.
    module_policy(
        &format!("{dir}/looping.yaml"),
        "looping",
        looping.path.to_str().unwrap(),
        "misbehaving",
        &digest,
        &format!("{{deny: {secret}, decide: loop}}"),
    );
    module_policy(
        &format!("{dir}/broken.yaml"),
        "broken",
        broken.path.to_str().unwrap(),
        "misbehaving",
        &digest,
        "{compile: memory}",
    );
    let bpffs = "/sys/fs/bpf/palisade-test-misbehaving";
    let agent = Agent::start_with(dir, bpffs, "misbehaving", &["--bpf-stats"]);
    wait_until_ready(&agent);
    agent.wait_for_log(
        "broken.yaml: spec.ruleModules[0] (misbehaving): compiling its config: stopped (memory)",
    );
    for _ in 0..3 {
        assert_eq!(probe(Some(&looping), &["read", secret]), EPERM);
    }
    assert_eq!(probe(Some(&healthy), &["read", secret]), EPERM);
    // Each batch is stopped at its budget; the events go on (onFailure: keep).
    wait_for("the events written", || events("misbehaving").len() == 4);
    assert_eq!(http_get("/healthz").unwrap().0, 200);
    let scrape = Scrape::now();
    assert!(
        scrape.value(
            "palisade_rule_module_failures_total",
            &[("module", "misbehaving"), ("kind", "timeout")]
        ) >= 1.0
    );
    assert_eq!(scrape.value("palisade_policy_errors", &[]), 1.0);
    dashboard_and_alerts_read_only_exported_metrics(&scrape.text);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(log.contains("rule module failed to decide"), "{log}");
    cleanup_agent(bpffs);
    // The failure is reported beside the events, once for the minute.
    let (_, failures) = lines("misbehaving");
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["type"], "rule_module_failure");
    assert_eq!(failures[0]["module"], "misbehaving");
    assert_eq!(failures[0]["failure"], "timeout");
    assert_eq!(failures[0]["on_failure"], "keep");
}

/// A module that burns its whole budget on every batch holds up only the events it decides:
/// `/metrics` and `/healthz` answer as fast as with the module idle (p99 within a quarter of the
/// budget of the quiet agent's, measured in the same run: one waiting behind a batch would wait
/// up to the whole budget), a new policy is enforced at once, and every event is still written
/// once its batch times out.
#[test]
fn a_module_burning_its_budget_holds_up_neither_endpoints_nor_policies() {
    let mut kernel = Kernel::new();
    let burning = kernel.cgroup(None, "burning");
    let late = kernel.cgroup(None, "late");
    let secret = file("/tmp/burning/secret");
    let dir = fresh_dir("/tmp/burning-policies");
    let digest = install_module("misbehaving", dir);
    module_policy(
        &format!("{dir}/burning.yaml"),
        "burning",
        burning.path.to_str().unwrap(),
        "misbehaving",
        &digest,
        &format!("{{deny: {secret}, decide: loop}}"),
    );
    let bpffs = "/sys/fs/bpf/palisade-test-burning";
    let agent = Agent::start_with(dir, bpffs, "burning", &["--audit-rate", "0"]);
    wait_until_ready(&agent);
    let quiet = endpoint_latencies();
    // Denials all along, so that the worker always has a batch to burn a budget on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, burning) = (stop.clone(), burning.clone());
        std::thread::spawn(move || {
            let mut denied = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(probe(Some(&burning), &["read", secret]), EPERM);
                denied += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            denied
        })
    };
    let budget_spent = || {
        Scrape::now()
            .get(
                "palisade_rule_module_failures_total",
                &[("module", "misbehaving"), ("kind", "timeout")],
            )
            .unwrap_or(0.0)
    };
    wait_for("a budget burnt", || budget_spent() >= 1.0);
    let burning_latencies = endpoint_latencies();
    // A new policy, enforced while the module burns: the agent reconciles once the file is
    // written and closed.
    let other = file("/tmp/burning/other");
    let written = Instant::now();
    write_policy(
        &format!("{dir}/late.yaml"),
        "late",
        late.path.to_str().unwrap(),
        other,
    );
    while probe(Some(&late), &["read", other]) != EPERM {
        assert!(
            written.elapsed() < Duration::from_secs(30),
            "never enforced"
        );
    }
    let enforced_after = written.elapsed();
    let burnt = budget_spent();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let denied = load.join().unwrap();
    assert!(burnt >= 10.0, "{burnt} budgets burnt");
    assert!(
        burning_latencies.p99 < quiet.p99 + DECIDE_BUDGET / 4,
        "burning: {}; quiet: {}",
        burning_latencies.summary(),
        quiet.summary()
    );
    assert!(
        enforced_after < Duration::from_secs(1),
        "enforced after {enforced_after:?}"
    );
    // onFailure keeps the events: every one is written.
    wait_for("every event written", || {
        events("burning")
            .iter()
            .filter(|event| event["path"] == secret)
            .count()
            == denied
    });
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

#[test]
fn a_changed_module_config_is_swapped_in_with_events_flowing_and_none_lost() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "reload");
    let secret = file("/tmp/reload/secret");
    let dir = fresh_dir("/tmp/reload-policies");
    let digest = install_module("protect-files", dir);
    let policy_file = format!("{dir}/app.yaml");
    let cgroup = target.path.to_str().unwrap();
    let write = |config: &str| {
        module_policy(
            &policy_file,
            "app",
            cgroup,
            "protect-files",
            &digest,
            config,
        )
    };
    write(&format!("{{paths: [{secret}]}}"));
    let bpffs = "/sys/fs/bpf/palisade-test-reload";
    let agent = Agent::start_with(dir, bpffs, "reload", &["--audit-rate", "0"]);
    wait_until_ready(&agent);
    let prober = palisade_kernel_tests::Prober::start(&target, secret, "/tmp/reload/stop");
    wait_for("events kept", || !events("reload").is_empty());
    // The new config silences the prober: its events are dropped from the swap on.
    write(&format!("{{paths: [{secret}], quiet: [probe]}}"));
    let dropped = || {
        Scrape::now().get(
            "palisade_rule_module_verdicts_total",
            &[("module", "protect-files"), ("verdict", "drop")],
        )
    };
    wait_for("events dropped by the new config", || {
        dropped().is_some_and(|count| count >= 100.0)
    });
    let report = prober.finish();
    assert_eq!((report.ok, report.other), (0, 0), "{report:?}");
    let rule = [("policy", "app"), ("rule", "protect-files/protected-files")];
    let decisions = Scrape::now().value("palisade_rule_decisions_total", &rule);
    assert_eq!(decisions, report.eperm as f64, "every denial counted");
    // Every decision ends up written, dropped by the module's verdict, or counted as lost in
    // the kernel (ring buffer full) or in the agent (queue full), once the agent has read the
    // ring buffer to the end.
    let kept = || {
        // Audit events, not the failures reported beside them; counted without parsing.
        std::fs::read_to_string("/tmp/reload-events.jsonl")
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with("{\"time\""))
            .count() as f64
    };
    let mut accounted = 0.0;
    let started = Instant::now();
    while accounted != decisions {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{accounted} of {decisions} events accounted for"
        );
        std::thread::sleep(Duration::from_millis(500));
        let scrape = Scrape::now();
        let dropped = scrape
            .get(
                "palisade_rule_module_verdicts_total",
                &[("module", "protect-files"), ("verdict", "drop")],
            )
            .unwrap_or(0.0);
        accounted = kept()
            + dropped
            + scrape.value("palisade_events_dropped_total", &[])
            + scrape.value("palisade_events_overflowed_total", &[]);
    }
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

#[test]
fn a_rego_module_compiles_rules_the_kernel_enforces_and_decides_their_events() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "rego");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let dir = fresh_dir("/tmp/rego-policies");
    let digest = install_module("egress", dir);
    module_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        "egress",
        &digest,
        &format!("{{addresses: [127.0.0.1], ports: [{port}]}}"),
    );
    let bpffs = "/sys/fs/bpf/palisade-test-rego";
    let agent = Agent::start(dir, bpffs, "rego");
    wait_until_ready(&agent);
    assert_eq!(
        probe(Some(&target), &["connect", "127.0.0.1", &port]),
        EPERM,
        "{}",
        agent.log()
    );
    assert_eq!(
        probe(None, &["connect", "127.0.0.1", &port]),
        palisade_kernel_tests::Answer::Ok
    );
    // A batch left undecided (see `first_decided`) is followed by another attempt.
    wait_for("a decided event", || {
        let events = events("rego");
        if events.last().is_some_and(|event| !decided(event)) {
            assert_eq!(
                probe(Some(&target), &["connect", "127.0.0.1", &port]),
                EPERM
            );
        }
        events.iter().any(decided)
    });
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
    let event = first_decided("rego");
    assert_eq!(event["rule"], "egress/egress");
    assert_eq!(event["hook"], "socket_connect");
    assert_eq!(event["severity"], "critical");
    assert_eq!(event["tags"], serde_json::json!(["egress"]));
    assert_eq!(event["annotations"]["destination"], "127.0.0.1");
}

/// How fast `/metrics` and `/healthz` answer, 100 requests each.
struct Latencies {
    p99: Duration,
    median: Duration,
    /// The ten slowest: latency, path, and when, from the first request.
    slowest: Vec<(Duration, &'static str, Duration)>,
}

impl Latencies {
    fn summary(&self) -> String {
        format!(
            "p99 {:?}, median {:?}, the slowest (latency, path, when) {:?}",
            self.p99, self.median, self.slowest
        )
    }
}

fn endpoint_latencies() -> Latencies {
    // The scraper runs at the agent's control priority: on the VM's one CPU it would otherwise
    // wait behind the worker a module keeps burning, which a scraper elsewhere does not.
    let scraper_nice = |nice| {
        // SAFETY: no memory is passed; on Linux this sets the calling thread's nice value.
        assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) }, 0);
    };
    scraper_nice(-10);
    let measuring = Instant::now();
    let mut latencies = Vec::new();
    for path in ["/metrics", "/healthz"].repeat(100) {
        let started = Instant::now();
        assert_eq!(http_get(path).unwrap().0, 200);
        latencies.push((started.elapsed(), path, started - measuring));
        std::thread::sleep(Duration::from_millis(20));
    }
    scraper_nice(0);
    latencies.sort();
    Latencies {
        p99: latencies[latencies.len() * 99 / 100 - 1].0,
        median: latencies[latencies.len() / 2].0,
        slowest: latencies[latencies.len() - 10..].to_vec(),
    }
}
