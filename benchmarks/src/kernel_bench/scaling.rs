//! The agent's side: its footprint as policies and cgroups grow, how fast a policy file change
//! reaches the kernel, and how many audit events it carries before it drops some.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, ensure};
use palisade_benchmarks::kernel::{ApplySample, Footprint, KernelRun, ThroughputSample};

use super::{
    Settings, micro,
    states::{enhance_protect, file_rule, policy_file},
    system::{
        Agent, Cgroups, POLICY_DIR, bench_command, clear_policies, in_cgroup, now_ns, output,
        wait_for, write_atomically,
    },
};

/// Processes killed (and their cgroups removed) when dropped.
struct Sleepers {
    children: Vec<Child>,
    cgroups: Vec<palisade_agent::targets::Cgroup>,
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for cgroup in self.cgroups.iter().rev() {
            let _ = cgroup.remove();
        }
    }
}

/// `policies` policy files (every built-in rule and 8 custom rules each), each on its own
/// cgroup, with `cgroups` cgroups below them in all, a process in each.
fn footprint(cgroups: &Cgroups, policies: usize, total: usize) -> anyhow::Result<Footprint> {
    let agent = Agent::start(&[])?;
    let mut sleepers = Sleepers {
        children: Vec::new(),
        cgroups: Vec::new(),
    };
    let mut files = Vec::new();
    for policy in 0..policies {
        let name = format!("fp-{policy}");
        let parent = cgroups.hierarchy.create(&cgroups.base, &name)?;
        for child in 0..total / policies {
            let cgroup = cgroups
                .hierarchy
                .create(&parent.path, &format!("c-{child}"))?;
            let mut sleep = Command::new("/bin/busybox");
            sleep.args(["sleep", "1000000"]);
            in_cgroup(&mut sleep, &cgroup);
            sleepers.children.push(sleep.spawn()?);
            sleepers.cgroups.push(cgroup);
        }
        sleepers.cgroups.insert(0, parent);
        files.push((
            format!("{name}.yaml"),
            policy_file(&name, &format!("bench/{name}"), &enhance_protect(8, "")),
        ));
    }
    let started = now_ns();
    agent.apply(&files)?;
    let apply_seconds = (now_ns() - started) as f64 / 1e9;
    let before = agent.usage()?;
    let idle_started = now_ns();
    std::thread::sleep(Duration::from_secs(2));
    let after = agent.usage()?;
    let rss_bytes = after.rss_bytes;
    let idle_cpu =
        (after.cpu_seconds() - before.cpu_seconds()) / ((now_ns() - idle_started) as f64 / 1e9);
    let map_bytes = agent.scrape()?.sum("palisade_bpf_map_memory_bytes") as u64;
    ensure!(map_bytes > 0, "the agent reports no BPF map memory");
    drop(sleepers);
    clear_policies()?;
    agent.stop()?;
    Ok(Footprint {
        policies,
        cgroups: total,
        rss_bytes,
        map_bytes,
        idle_cpu,
        apply_seconds,
    })
}

pub fn footprints(
    settings: &Settings,
    cgroups: &Cgroups,
    run: &mut KernelRun,
) -> anyhow::Result<()> {
    for &(policies, total) in settings.footprint_grid() {
        eprintln!("kernel-bench: footprint, {policies} policies over {total} cgroups");
        run.footprint.push(footprint(cgroups, policies, total)?);
    }
    Ok(())
}

/// The file the apply-latency prober reads.
const LATENCY_FILE: &str = "/tmp/bench/latency/file";

/// Reads the prober's `TIME ANSWER` lines until `answer`; returns its time.
fn until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    answer: &str,
) -> anyhow::Result<u64> {
    for line in lines {
        let line = line?;
        let (time, said) = line.split_once(' ').context("a prober line")?;
        ensure!(said != "error", "the prober could not read {LATENCY_FILE}");
        if said == answer {
            return Ok(time.parse()?);
        }
    }
    anyhow::bail!("the prober stopped")
}

/// Policy file changes on a target where a process reads a file in a loop: from writing the
/// version that denies the file to the first read refused, and from writing the version that
/// allows it again to the first read allowed.
pub fn apply_latency(
    settings: &Settings,
    cgroups: &Cgroups,
    run: &mut KernelRun,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(Path::new(LATENCY_FILE).parent().expect("a directory"))?;
    std::fs::write(LATENCY_FILE, "content\n")?;
    let deny = |paths: &str| {
        policy_file(
            "latency",
            super::system::TARGET,
            &enhance_protect(1, &file_rule("latency", paths, "read", "deny")),
        )
    };
    let (denying, allowing) = (deny(LATENCY_FILE), deny("/tmp/bench/latency/other"));
    let agent = Agent::start(&[])?;
    let file = Path::new(POLICY_DIR).join("latency.yaml");
    agent.apply(&[("latency.yaml".to_owned(), allowing.clone())])?;
    let mut prober = bench_command(&cgroups.target, &["probe", LATENCY_FILE])?
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(prober.stdout.take().expect("piped")).lines();
    until(&mut lines, "ok")?;
    for trial in 0..settings.apply_trials {
        let written = now_ns();
        write_atomically(&file, &denying)?;
        let enforce_ns = until(&mut lines, "eperm")? - written;
        let written = now_ns();
        write_atomically(&file, &allowing)?;
        let lift_ns = until(&mut lines, "ok")? - written;
        run.apply_latency.push(ApplySample {
            trial,
            enforce_ns,
            lift_ns,
        });
    }
    prober.kill()?;
    prober.wait()?;
    clear_policies()?;
    agent.stop()
}

/// The counters one throughput step reads before and after.
struct Counters {
    submitted: f64,
    dropped: f64,
    throttled: f64,
    kept: f64,
    module_dropped: f64,
    agent_dropped: f64,
    queued: f64,
    written: u64,
}

fn counters(agent: &Agent) -> anyhow::Result<Counters> {
    let scrape = agent.scrape()?;
    let written = std::fs::read_to_string(super::system::EVENTS)
        .unwrap_or_default()
        .lines()
        .count() as u64;
    Ok(Counters {
        submitted: scrape.sum("palisade_events_total"),
        dropped: scrape.sum("palisade_events_dropped_total"),
        throttled: scrape.sum("palisade_events_throttled_total"),
        kept: scrape.sum_with(
            "palisade_rule_module_verdicts_total",
            &[("verdict", "keep")],
        ),
        module_dropped: scrape.sum_with(
            "palisade_rule_module_verdicts_total",
            &[("verdict", "drop")],
        ),
        agent_dropped: scrape.sum("palisade_events_overflowed_total")
            + scrape.sum("palisade_events_undecodable_total"),
        queued: scrape.sum("palisade_events_queued"),
        written,
    })
}

/// Waits until `read` gives the same reading twice in a row, 300 ms apart: nothing moves any
/// more.
fn settled<T: PartialEq>(
    what: &str,
    mut read: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<()> {
    let mut last = None;
    wait_for(what, Duration::from_secs(600), || {
        std::thread::sleep(Duration::from_millis(300));
        let now = read()?;
        let settled = last.as_ref() == Some(&now);
        last = Some(now);
        Ok(settled)
    })
}

/// Waits until the agent has stopped writing events (the events file, which it creates when it
/// starts, keeps its size), without asking the agent anything: its CPU time meanwhile is its
/// own work's.
fn written_out() -> anyhow::Result<()> {
    settled("the events written", || {
        Ok(std::fs::metadata(super::system::EVENTS)?.len())
    })
}

/// Waits until the agent has read and written what the kernel submitted: nothing moves any more.
pub fn drain(agent: &Agent) -> anyhow::Result<()> {
    settled("the events drained", || {
        let scrape = agent.scrape()?;
        Ok((
            scrape.sum("palisade_events_total") + scrape.sum("palisade_events_dropped_total"),
            scrape.sum("palisade_events_written_total"),
        ))
    })
}

/// Puts the rule module `rules/examples/protect-files` in the policy directory; its digest.
pub fn install_protect_files() -> anyhow::Result<String> {
    let module = Path::new(
        &std::env::var("PALISADE_RULES")
            .context("PALISADE_RULES must name the rule modules' directory")?,
    )
    .join("protect-files.wasm");
    let bytes = std::fs::read(&module).with_context(|| module.display().to_string())?;
    std::fs::create_dir_all(POLICY_DIR)?;
    std::fs::write(Path::new(POLICY_DIR).join("protect-files.wasm"), &bytes)?;
    Ok(<sha2::Sha256 as sha2::Digest>::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// A policy file `name` on the target whose rule module is the installed protect-files (of
/// `digest`) with `config` (YAML).
pub fn protect_files_policy(name: &str, digest: &str, config: &str) -> String {
    let spec = format!(
        "  mode: EnhanceProtect\n  enhanceProtect:\n    auditViolations: true\n  ruleModules:\n    - name: protect-files\n      module: protect-files.wasm\n      sha256: {digest}\n      config: {config}\n"
    );
    policy_file(name, super::system::TARGET, &spec)
}

/// Denials at rising rates through the ring buffer, the decoder, a Wasm rule module's decide
/// and the file sink, until the pipeline saturates and drops.
pub fn throughput(
    settings: &Settings,
    cgroups: &Cgroups,
    run: &mut KernelRun,
) -> anyhow::Result<()> {
    let digest = install_protect_files()?;
    let policy = protect_files_policy(
        "throughput",
        &digest,
        &format!("{{paths: [{}]}}", micro::DENIED),
    );
    let agent = Agent::start(&[])?;
    agent.apply(&[("throughput.yaml".to_owned(), policy)])?;
    // Not measured: the agent's first pass through the 2-MiB ring buffer faults its pages in
    // (~2 million instructions once per start; as the first flood, 500/s cost ~860 instructions
    // more an event). A second as fast as the generator goes passes through it several times.
    output(&mut bench_command(
        &cgroups.target,
        &["generate", micro::DENIED, "0", "1"],
    )?)?;
    written_out()?;
    for &rate in settings.rates() {
        // The agent's CPU time is read after the first scrape and before the last: answering
        // them is not the pipeline's work.
        let before = counters(&agent)?;
        let cpu_before = agent.usage()?;
        let text = output(&mut bench_command(
            &cgroups.target,
            &[
                "generate",
                micro::DENIED,
                &rate.to_string(),
                &settings.throughput_seconds.to_string(),
            ],
        )?)?;
        let numbers: Vec<f64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [attempts, refused, seconds] = numbers[..] else {
            anyhow::bail!("unexpected generator output {text:?}");
        };
        ensure!(
            attempts == refused,
            "the generator was allowed {} times",
            attempts - refused
        );
        written_out()?;
        let cpu_after = agent.usage()?;
        let after = counters(&agent)?;
        run.throughput.push(ThroughputSample {
            offered_per_second: rate,
            seconds,
            produced: refused as u64,
            submitted: (after.submitted - before.submitted) as u64,
            dropped: (after.dropped - before.dropped) as u64,
            throttled: (after.throttled - before.throttled) as u64,
            kept: (after.kept - before.kept) as u64,
            module_dropped: (after.module_dropped - before.module_dropped) as u64,
            agent_dropped: (after.agent_dropped - before.agent_dropped) as u64,
            queued: after.queued as u64,
            written: after.written - before.written,
            agent_cpu_seconds: cpu_after.cpu_seconds() - cpu_before.cpu_seconds(),
            agent_system_seconds: cpu_after.system_seconds - cpu_before.system_seconds,
            agent_rss_bytes: cpu_after.rss_bytes,
        });
    }
    clear_policies()?;
    agent.stop()
}
