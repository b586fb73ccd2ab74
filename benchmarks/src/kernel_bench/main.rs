//! `kernel-bench`: the kernel benchmarks, inside the VM that `cargo xtask bench` boots (root, BPF
//! LSM on, the guest clock counting executed instructions). It measures the overhead states in
//! interleaved rounds, the programs' run time, the agent's footprint, policy apply latency and
//! event throughput, and writes one JSON file (`palisade_benchmarks::kernel::KernelRun`).
//!
//! kernel-bench run [--smoke] --clock CLOCK OUT.json
//! kernel-bench soak MINUTES --clock CLOCK OUT.json  (the soak; writes a `SoakRun`)
//! kernel-bench micro BENCH OPS allowed|denied   (in the cgroup it starts in: ns per operation)
//! kernel-bench generate PATH RATE SECONDS       (opens PATH; prints attempts, refusals, seconds)
//! kernel-bench probe PATH                       (reads PATH forever; prints each change of answer)

mod micro;
mod scaling;
mod soak;
mod states;
mod system;
mod workloads;

use anyhow::{Context, bail};
use palisade_benchmarks::kernel::{Environment, KernelRun, SoakRun};

/// How much of everything a run measures.
pub struct Settings {
    smoke: bool,
    rounds: usize,
    apply_trials: usize,
    throughput_seconds: f64,
}

impl Settings {
    fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                smoke,
                rounds: 1,
                apply_trials: 3,
                throughput_seconds: 0.2,
            }
        } else {
            Self {
                smoke,
                rounds: 5,
                apply_trials: 100,
                throughput_seconds: 5.0,
            }
        }
    }

    /// `full` operations, or a few in a smoke run.
    fn ops(&self, full: u64) -> u64 {
        if self.smoke { (full / 50).max(2) } else { full }
    }

    /// (policy files, cgroups) the footprint is measured at.
    fn footprint_grid(&self) -> &'static [(usize, usize)] {
        if self.smoke {
            // One setup of several policies and cgroups: each setup costs an agent start,
            // about a minute and a half of the test suite.
            &[(2, 6)]
        } else {
            &[
                (1, 1),
                (1, 100),
                (1, 1000),
                (10, 100),
                (10, 1000),
                (100, 100),
                (100, 1000),
            ]
        }
    }

    /// Offered violations per second (0: as fast as they come).
    fn rates(&self) -> &'static [u64] {
        if self.smoke {
            &[1000, 0]
        } else {
            &[500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 0]
        }
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The machine the benchmarks run on.
fn environment(clock: &str, rounds: usize, smoke: bool) -> Environment {
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|line| {
            line.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_default();
    Environment {
        kernel: read("/proc/sys/kernel/osrelease"),
        lsm: read("/sys/kernel/security/lsm"),
        cpu,
        clock: clock.to_owned(),
        rounds,
        smoke,
    }
}

fn run(smoke: bool, clock: &str, out: &str) -> anyhow::Result<()> {
    let settings = Settings::new(smoke);
    let mut run = KernelRun {
        environment: environment(clock, settings.rounds, smoke),
        micro: Vec::new(),
        workloads: Vec::new(),
        hooks: Vec::new(),
        footprint: Vec::new(),
        apply_latency: Vec::new(),
        throughput: Vec::new(),
    };
    system::fix_address_space_layout()?;
    micro::prepare()?;
    let cgroups = system::Cgroups::create()?;
    states::rounds(&settings, &cgroups, &mut run)?;
    eprintln!("kernel-bench: program run time");
    states::hook_costs(&settings, &cgroups, &mut run)?;
    eprintln!("kernel-bench: apply latency");
    scaling::apply_latency(&settings, &cgroups, &mut run)?;
    eprintln!("kernel-bench: event throughput");
    scaling::throughput(&settings, &cgroups, &mut run)?;
    scaling::footprints(&settings, &cgroups, &mut run)?;
    std::fs::write(out, serde_json::to_string(&run)?)?;
    Ok(())
}

fn soak(minutes: u64, clock: &str, out: &str) -> anyhow::Result<()> {
    micro::prepare()?;
    let cgroups = system::Cgroups::create()?;
    let run = SoakRun {
        environment: environment(clock, 0, false),
        agent_cpu_percent: soak::AGENT_CPU_PERCENT,
        samples: soak::soak(minutes, &cgroups)?,
    };
    std::fs::write(out, serde_json::to_string(&run)?)?;
    Ok(())
}

/// The value of `--clock` in `args`.
fn clock<'a>(args: &[&'a str]) -> anyhow::Result<&'a str> {
    args.iter()
        .position(|arg| *arg == "--clock")
        .and_then(|at| args.get(at + 1))
        .copied()
        .context("--clock icount|tcg is required")
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args[..] {
        ["run", ref rest @ ..] => {
            let smoke = rest.contains(&"--smoke");
            let out = rest
                .last()
                .filter(|out| out.ends_with(".json"))
                .context("OUT.json is required")?;
            run(smoke, clock(rest)?, out)
        }
        ["soak", minutes, "--clock", clock, out] => soak(minutes.parse()?, clock, out),
        ["micro", bench, ops, denied] => {
            println!("{}", micro::run(bench, ops.parse()?, denied == "denied")?);
            Ok(())
        }
        ["generate", path, rate, seconds] => {
            let (attempts, refused, seconds) =
                micro::generate(path, rate.parse()?, seconds.parse()?)?;
            println!("{attempts} {refused} {seconds}");
            Ok(())
        }
        ["probe", path] => micro::probe(path),
        _ => bail!(
            "usage: kernel-bench run [--smoke] --clock CLOCK OUT.json | soak MINUTES --clock CLOCK \
             OUT.json | micro | generate | probe"
        ),
    }
}
