//! The overhead states (S0-S8, the floor and d_path), measured in interleaved rounds: every
//! round visits every state, so that a drift of the machine touches them all alike.

use std::{collections::HashMap, time::Duration};

use palisade_benchmarks::kernel::{HookCost, KernelRun, MicroSample, STATES, WORKLOAD_STATES};
use palisade_crds::rules::RULES;

use super::{
    Settings, micro,
    system::{
        Agent, Cgroups, Floor, TARGET, bench_command, cleanup, clear_policies, output,
        program_runs, settle,
    },
    workloads,
};

/// Built-in rules the S4 states leave out because they deny what the benchmarks themselves do
/// (run busybox, open TCP connections, and nginx looks its user up in /etc/passwd), under any of
/// their names, or because a policy file cannot use them (the ingress-nginx admission webhook is
/// found in Kubernetes mode only); every other built-in rule is on.
const LEFT_OUT: &[&str] = &[
    "disable-busybox",
    "disable-shell",
    "disable-network",
    "disable-inet",
    "disable-ipv4",
    "disable-tcp",
    "disable-access-passwd",
    "ingress-nightmare-mitigation",
];

/// The file S6's background process opens, under an audit rule.
const AUDITED: &str = "/tmp/bench/audited";
/// S6's rate of audit events.
const AUDIT_RATE: &str = "1000";

/// A policy file for `cgroup_path`: `spec` is what follows `target` (indented by two spaces).
pub fn policy_file(name: &str, cgroup_path: &str, spec: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: {name}\nspec:\n  target:\n    cgroupPath: {cgroup_path}\n{spec}"
    )
}

/// One `customRules.files` item (YAML, indented by six spaces), on one line so that S4-10000's
/// policy stays within a policy file's size limit.
pub fn file_rule(name: &str, path: &str, permissions: &str, action: &str) -> String {
    format!(
        "      - {{name: {name}, paths: [{path}], permissions: [{permissions}], action: {action}}}\n"
    )
}

/// EnhanceProtect with every built-in rule but LEFT_OUT, `custom` file rules on paths nothing
/// opens, and `extra` file rules (`file_rule` items).
pub fn enhance_protect(custom: usize, extra: &str) -> String {
    let mut spec =
        String::from("  mode: EnhanceProtect\n  enhanceProtect:\n    auditViolations: true\n");
    for category in palisade_crds::rules::Category::ALL {
        let names: Vec<&str> = RULES
            .iter()
            .filter(|(name, of)| *of == category && !LEFT_OUT.contains(name))
            .map(|(name, _)| *name)
            .collect();
        spec += &format!("    {}: [{}]\n", category.field(), names.join(", "));
    }
    spec += "    customRules:\n      files:\n";
    for index in 0..custom {
        spec += &file_rule(
            &format!("rule-{index}"),
            &format!("/srv/bench/rule-{index}/"),
            "read, write",
            "deny",
        );
    }
    spec + extra
}

/// S4-N's rules on top of a DefenseInDepth allowlist of N directories nothing opens and the rest
/// of the file system, every capability, destination and socket the benchmarks use: what an
/// allowlist adds to as many deny rules where it allows.
pub fn defense_in_depth(custom: usize) -> String {
    let paths: Vec<String> = (0..custom)
        .map(|index| format!("/srv/bench/allowed-{index}/"))
        .chain(["/".to_owned()])
        .collect();
    let rules = enhance_protect(custom, "").replace("  mode: EnhanceProtect\n", "");
    format!(
        "  mode: DefenseInDepth\n  defenseInDepth:\n    allow:\n      files:\n        - paths: [{}]\n          permissions: [read, write, append, exec]\n      capabilities: [all]\n      network: [{{}}]\n      sockets: [{{family: unix}}, {{family: inet}}, {{family: inet6}}, {{family: netlink}}]\n{rules}",
        paths.join(", ")
    )
}

/// The policy on the target in `state`; None where there is none.
fn state_policy(state: &str) -> Option<String> {
    let spec = match state {
        "S2" => "  mode: AlwaysAllow\n".to_owned(),
        "S3" => "  mode: RuntimeDefault\n".to_owned(),
        "S5" => enhance_protect(1, &file_rule("denied", micro::DENIED, "read", "deny")),
        "S6" => enhance_protect(1, &file_rule("audited", AUDITED, "read", "audit")),
        "S7" => defense_in_depth(8),
        "S8" => enhance_protect(10_000, ""),
        "S9" => enhance_protect(8, ""),
        state => enhance_protect(state.strip_prefix("S4-")?.parse().ok()?, ""),
    };
    Some(policy_file("bench", TARGET, &spec))
}

/// The agent's options in `state`.
fn agent_options(state: &str) -> &'static [&'static str] {
    match state {
        "S8" => &["--no-open-cache"],
        _ => &[],
    }
}

/// Runs every microbenchmark once in the target (S9: outside it), each with `1 / share` of its
/// operations.
fn micro_run(
    settings: &Settings,
    cgroups: &Cgroups,
    state: &str,
    round: usize,
    share: u64,
) -> anyhow::Result<Vec<MicroSample>> {
    micro::BENCHES
        .iter()
        .map(|bench| micro_sample(settings, cgroups, state, round, share, bench))
        .collect()
}

/// Runs microbenchmark `bench` once in the target (S9: outside it), with `1 / share` of its
/// operations.
fn micro_sample(
    settings: &Settings,
    cgroups: &Cgroups,
    state: &str,
    round: usize,
    share: u64,
    bench: &micro::Bench,
) -> anyhow::Result<MicroSample> {
    let ops = bench.run_of(settings.ops(bench.ops) / share);
    let denied = if state == "S5" { "denied" } else { "allowed" };
    let cgroup = if state == "S9" {
        &cgroups.client
    } else {
        &cgroups.target
    };
    let text = output(&mut bench_command(
        cgroup,
        &["micro", bench.name, &ops.to_string(), denied],
    )?)?;
    Ok(MicroSample {
        state: state.to_owned(),
        round,
        bench: bench.name.to_owned(),
        ops,
        ns_per_op: text.trim().parse()?,
    })
}

/// What runs in a state besides the benchmarks: S6's stream of audit events.
struct Background(Option<std::process::Child>);

impl Background {
    fn start(cgroups: &Cgroups, state: &str) -> anyhow::Result<Self> {
        if state != "S6" {
            return Ok(Self(None));
        }
        let child = bench_command(
            &cgroups.target,
            &["generate", AUDITED, AUDIT_RATE, "1000000"],
        )?
        .stdout(std::process::Stdio::null())
        .spawn()?;
        Ok(Self(Some(child)))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Brings the kernel into `state` (the agent running from S1 on, restarted where the state's
/// options differ from its own), runs `measure` there once the guest is idle.
fn visit(
    cgroups: &Cgroups,
    state: &str,
    agent: &mut Option<Agent>,
    mut measure: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match state {
        "S0" => {
            settle()?;
            measure()
        }
        "floor" | "d_path" => {
            let _floor = Floor::attach(state == "d_path")?;
            settle()?;
            measure()
        }
        _ => {
            let options = agent_options(state);
            if agent
                .as_ref()
                .is_some_and(|running| running.options() != options)
            {
                // Started with no policy: it would apply the last state's first.
                clear_policies()?;
                agent.take().expect("running").stop()?;
            }
            if agent.is_none() {
                *agent = Some(Agent::start(options)?);
            }
            let agent = agent.as_ref().expect("started");
            if let Some(policy) = state_policy(state) {
                agent.apply(&[("bench.yaml".to_owned(), policy)])?;
            }
            settle()?;
            let _background = Background::start(cgroups, state)?;
            measure()
        }
    }
}

/// The interleaved rounds: microbenchmarks in every state, workloads in WORKLOAD_STATES.
pub fn rounds(settings: &Settings, cgroups: &Cgroups, run: &mut KernelRun) -> anyhow::Result<()> {
    std::fs::create_dir_all(AUDITED.rsplit_once('/').expect("a directory").0)?;
    std::fs::write(AUDITED, "content\n")?;
    cleanup()?;
    // The first run of a benchmark pays one-time costs (the first TCP connection): not kept.
    micro_run(settings, cgroups, "warm-up", 0, 1)?;
    for round in 0..settings.rounds {
        let mut agent = None;
        for (state, _) in STATES {
            // The console stamps each line with the host's time: where a run's hours go.
            eprintln!(
                "kernel-bench: round {}/{} {state}",
                round + 1,
                settings.rounds
            );
            visit(cgroups, state, &mut agent, || {
                run.micro
                    .extend(micro_run(settings, cgroups, state, round, 1)?);
                if WORKLOAD_STATES.contains(state) {
                    run.workloads
                        .extend(workloads::run(settings, cgroups, state, round)?);
                }
                Ok(())
            })?;
        }
        clear_policies()?;
        agent.take().expect("started in S1").stop()?;
    }
    Ok(())
}

/// One more round with the kernel's run-time statistics on (they cost a clock read per program
/// run, so the rounds above run without): each program's runs and time per run in each
/// microbenchmark of each state, run with a quarter of their operations (a time per program
/// run needs no long runs; the microbenchmarks' 8 allocator phases still all run).
pub fn hook_costs(
    settings: &Settings,
    cgroups: &Cgroups,
    run: &mut KernelRun,
) -> anyhow::Result<()> {
    let _statistics = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    let mut agent = None;
    for (state, _) in STATES.iter().filter(|(state, _)| *state != "S0") {
        visit(cgroups, state, &mut agent, || {
            for bench in micro::BENCHES {
                let before = program_runs();
                micro_sample(settings, cgroups, state, 0, 4, bench)?;
                let mut by_program: HashMap<String, (u64, Duration)> = HashMap::new();
                for (id, (name, runs, time)) in program_runs() {
                    let Some((_, runs_before, time_before)) = before.get(&id) else {
                        continue;
                    };
                    let total = by_program.entry(name).or_default();
                    total.0 += runs - runs_before;
                    total.1 += time - *time_before;
                }
                let mut costs: Vec<HookCost> = by_program
                    .into_iter()
                    .filter(|(_, (runs, _))| *runs > 0)
                    .map(|(program, (runs, time))| HookCost {
                        state: (*state).to_owned(),
                        bench: bench.name.to_owned(),
                        program,
                        runs,
                        ns_per_run: time.as_nanos() as f64 / runs as f64,
                    })
                    .collect();
                costs.sort_by(|a, b| a.program.cmp(&b.program));
                run.hooks.extend(costs);
            }
            Ok(())
        })?;
    }
    clear_policies()?;
    if let Some(agent) = agent {
        agent.stop()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_policy_compiles_and_fits_a_policy_file() {
        let with_policy: Vec<&str> = STATES
            .iter()
            .map(|(state, _)| *state)
            .filter(|state| {
                let Some(text) = state_policy(state) else {
                    return false;
                };
                use palisade_agent::policy::{Environment, Policy, compile};
                let file = std::path::Path::new("bench.yaml");
                assert!(
                    text.len() as u64 <= palisade_agent::policy::MAX_FILE_BYTES,
                    "{state}: {} bytes, over a policy file's limit",
                    text.len()
                );
                let environment = Environment {
                    kube_apiserver: vec!["10.96.0.1".to_owned()],
                    node: "bench".to_owned(),
                    ingress_admission: None,
                };
                Policy::parse(file, &text)
                    .and_then(|policy| compile(&file.display(), &policy, &environment, &[]))
                    .unwrap_or_else(|err| panic!("{state}: {err}"));
                true
            })
            .collect();
        assert_eq!(
            with_policy,
            [
                "S2", "S3", "S4-1", "S4-8", "S4-64", "S4-1024", "S4-10000", "S5", "S6", "S7", "S9",
                "S8"
            ]
        );
    }
}
