//! The kernel benchmark's report: `cargo xtask bench` runs `kernel-bench` in the VM on each
//! kernel, then this turns its results (one `KernelRun` per kernel) into
//! `kernel-<kernel>.json` (the raw data), `kernel.md` (every table) and PNG plots.
//!
//! kernel-report [--out DIR] INPUT.json...   (DIR defaults to benchmarks/results)

use std::{cmp::Reverse, collections::BTreeMap, fmt::Write as _, ops::Range, path::Path};

use anyhow::Context;
use palisade_benchmarks::{
    kernel::{Footprint, HookCost, KernelRun, STATES, Spread, ThroughputSample, WORKLOAD_STATES},
    kernel_series, mib, read_json, register_font, report_args,
};
use plotters::{
    coord::{Shift, ranged1d::SegmentedCoord, types::RangedCoordusize},
    prelude::*,
};

/// A published number of a seed (../shared/seeds) and our figure for the same question.
struct Comparison {
    project: &'static str,
    measure: &'static str,
    published: &'static str,
    ours: &'static str,
    figure: fn(&Kernel) -> String,
}

const SEEDS: &[Comparison] = &[
    // vArmor BPF enforcer benchmark, byte-unixbench on kernel 5.10, 10 runs
    // (seeds 002_667aa536dc500f84.txt and 000_fd23e20a145a4bd1.txt).
    Comparison {
        project: "vArmor (BPF enforcer, byte-unixbench)",
        measure: "AlwaysAllow, worst test",
        published: "<= 1.34% loss",
        ours: "AlwaysAllow (S2): worst microbenchmark",
        figure: |kernel| worst(kernel, "S2"),
    },
    Comparison {
        project: "vArmor (BPF enforcer, byte-unixbench)",
        measure: "8 rules per type: execl",
        published: "-2.55%",
        ours: "8 custom rules + built-ins (S4-8): exec",
        figure: |kernel| percent(kernel.overhead("S4-8", "exec")),
    },
    Comparison {
        project: "vArmor (BPF enforcer, byte-unixbench)",
        measure: "8 rules per type: process creation",
        published: "-2.32%",
        ours: "8 custom rules + built-ins (S4-8): fork",
        figure: |kernel| percent(kernel.overhead("S4-8", "fork")),
    },
    // Eunomia performance (seed 003_d2a39f82283c5fad.txt): "2-3% of the CPU in most uses";
    // wrk against OpenResty loses "about 4%".
    Comparison {
        project: "Eunomia",
        measure: "agent CPU",
        published: "2-3%",
        ours: "agent CPU, idle / at 1000 events/s",
        figure: agent_cpu,
    },
    Comparison {
        project: "Eunomia",
        measure: "workload throughput loss (wrk, OpenResty)",
        published: "about -4%",
        ours: "workloads in EnhanceProtect (S4-64): worst",
        figure: worst_workload,
    },
    // Kmesh resource consumption (seed 004_167e9a5150f14bd7.txt): inspektor-gadget's eBPF
    // memory with 1, 100 and 1000 services.
    Comparison {
        project: "Kmesh",
        measure: "eBPF memory, 1 to 1000 services",
        published: "23 MB, constant",
        ours: "BPF map memory (policies/cgroups), smallest to largest setup",
        figure: map_memory,
    },
];

/// A kernel's results, labelled by its series ("6.1").
struct Kernel {
    label: String,
    run: KernelRun,
}

impl Kernel {
    /// States of STATES this run measured, in order.
    fn states(&self) -> Vec<&'static str> {
        STATES
            .iter()
            .map(|(state, _)| *state)
            .filter(|state| self.run.micro.iter().any(|sample| sample.state == *state))
            .collect()
    }

    /// Microbenchmark names in the order they were run.
    fn benches(&self) -> Vec<String> {
        first_seen(self.run.micro.iter().map(|sample| &sample.bench))
    }

    /// Workload names in the order they were run.
    fn workloads(&self) -> Vec<String> {
        first_seen(self.run.workloads.iter().map(|sample| &sample.workload))
    }

    /// Per round, ns per operation of `bench` in `state`.
    fn micro(&self, state: &str, bench: &str) -> BTreeMap<usize, f64> {
        self.run
            .micro
            .iter()
            .filter(|sample| sample.state == state && sample.bench == bench)
            .map(|sample| (sample.round, sample.ns_per_op))
            .collect()
    }

    /// Per round, the value of `workload` in `state`.
    fn workload(&self, state: &str, workload: &str) -> BTreeMap<usize, f64> {
        self.run
            .workloads
            .iter()
            .filter(|sample| sample.state == state && sample.workload == workload)
            .map(|sample| (sample.round, sample.value))
            .collect()
    }

    /// The median over rounds of ns per operation of `bench` in `state`.
    fn median_ns(&self, state: &str, bench: &str) -> Option<f64> {
        median(self.micro(state, bench).into_values())
    }

    /// Overhead of `bench` in `state` against S0: more time per operation is positive.
    fn overhead(&self, state: &str, bench: &str) -> Option<Spread> {
        ratios(&self.micro(state, bench), &self.micro("S0", bench))
    }

    /// Change of `workload` in `state` against S0: less throughput is negative.
    fn workload_change(&self, state: &str, workload: &str) -> Option<Spread> {
        ratios(
            &self.workload(state, workload),
            &self.workload("S0", workload),
        )
    }

    /// Each program's runs and time per run over the whole pass of the microbenchmarks of each
    /// state.
    fn pass_costs(&self) -> Vec<HookCost> {
        let hooks = &self.run.hooks;
        let mut costs = Vec::new();
        for state in first_seen(hooks.iter().map(|cost| &cost.state)) {
            for program in first_seen(hooks.iter().map(|cost| &cost.program)) {
                let of = || {
                    hooks
                        .iter()
                        .filter(|cost| cost.state == state && cost.program == program)
                };
                let runs: u64 = of().map(|cost| cost.runs).sum();
                if runs == 0 {
                    continue;
                }
                let time: f64 = of().map(|cost| cost.ns_per_run * cost.runs as f64).sum();
                costs.push(HookCost {
                    state: state.clone(),
                    bench: String::new(),
                    program,
                    runs,
                    ns_per_run: time / runs as f64,
                });
            }
        }
        costs
    }

    fn clock_note(&self) -> &'static str {
        if self.run.environment.clock == "icount" {
            "QEMU -icount: guest ns = instructions"
        } else {
            "QEMU TCG"
        }
    }
}

/// Each item once, in the order of first appearance.
fn first_seen<'a, T: PartialEq + Clone + 'a>(items: impl Iterator<Item = &'a T>) -> Vec<T> {
    let mut seen: Vec<T> = Vec::new();
    for item in items {
        if !seen.contains(item) {
            seen.push(item.clone());
        }
    }
    seen
}

/// The median and spread of `values[round] / base[round] - 1` over the rounds both have.
fn ratios(values: &BTreeMap<usize, f64>, base: &BTreeMap<usize, f64>) -> Option<Spread> {
    Spread::of(values.iter().filter_map(|(round, value)| {
        let base = base.get(round).filter(|base| **base > 0.0)?;
        Some(value / base - 1.0)
    }))
}

/// "+1.7%", with the spread over rounds when there is one: "+1.7% (+1.1..+2.0)".
fn percent(spread: Option<Spread>) -> String {
    let Some(spread) = spread else {
        return "-".into();
    };
    let median = signed(spread.median);
    if spread.min == spread.max {
        median
    } else {
        format!(
            "{median} ({:+.1}..{:+.1})",
            spread.min * 100.0,
            spread.max * 100.0
        )
    }
}

fn signed(ratio: f64) -> String {
    format!("{:+.1}%", ratio * 100.0)
}

fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    Spread::of(values).map(|spread| spread.median)
}

/// The sample at quantile `q` of sorted, non-empty `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// `count` per second of `row`, if it lasted at all.
fn per_second(count: u64, row: &ThroughputSample) -> Option<f64> {
    (row.seconds > 0.0).then(|| count as f64 / row.seconds)
}

fn main() -> anyhow::Result<()> {
    let (out, args) = report_args("kernel-report")?;
    let mut kernels = Vec::new();
    for input in &args {
        let run: KernelRun = read_json(input)?;
        kernels.push(Kernel {
            label: kernel_series(&run.environment.kernel),
            run,
        });
    }
    kernels.sort_by_key(|kernel| {
        kernel
            .label
            .split('.')
            .map(|part| part.parse::<u32>().unwrap_or(0))
            .collect::<Vec<_>>()
    });
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    for kernel in &kernels {
        std::fs::write(
            out.join(format!("kernel-{}.json", kernel.label)),
            serde_json::to_string_pretty(&kernel.run)? + "\n",
        )?;
    }
    std::fs::write(out.join("kernel.md"), summary(&kernels))?;
    register_font()?;
    plot_overhead(&out.join("kernel-overhead.png"), &kernels)?;
    plot_scaling(&out.join("kernel-scaling.png"), &kernels)?;
    plot_hooks(&out.join("kernel-hooks.png"), &kernels)?;
    plot_footprint(&out.join("footprint.png"), &kernels)?;
    plot_throughput(&out.join("event-throughput.png"), &kernels)?;
    plot_latency(&out.join("file-apply-latency.png"), &kernels)?;
    Ok(())
}

fn summary(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "# Kernel benchmarks\n\nMethod and reading: [README](../README.md). Generated by `cargo xtask bench`.\n\n## Environment\n\n| kernel | lsm | cpu | clock | rounds | smoke |\n|---|---|---|---|---:|---|\n",
    );
    for kernel in kernels {
        let env = &kernel.run.environment;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            env.kernel, env.lsm, env.cpu, env.clock, env.rounds, env.smoke
        );
    }
    md += "\nWith clock `icount` a guest nanosecond is one executed instruction: \"ns\" below are instruction counts.\n";
    md += &seeds_table(kernels);
    for kernel in kernels {
        md += &micro_tables(kernel);
    }
    md += &workload_table(kernels);
    for kernel in kernels {
        md += &hook_table(kernel);
    }
    md += &footprint_table(kernels);
    md += &latency_table(kernels);
    md += &throughput_table(kernels);
    md
}

/// A Markdown table head: `columns` after the left-aligned `first` ones, right-aligned.
fn table_head(first: &[&str], columns: &[&str]) -> String {
    let mut head = String::from("|");
    for name in first.iter().chain(columns) {
        let _ = write!(head, " {name} |");
    }
    head += "\n|";
    head += &"---|".repeat(first.len());
    head += &"---:|".repeat(columns.len());
    head + "\n"
}

fn seeds_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Next to the seeds\n\nOur numbers come from an emulated VM (instructions counted), theirs from real hardware: only ratios compare. The seeds publish score changes (negative: slower); our microbenchmark figures are changes of the time per operation (positive: slower), our workload figures changes of throughput (negative: slower).\n\n",
    );
    let columns: Vec<String> = kernels
        .iter()
        .map(|kernel| format!("Palisade, Linux {}", kernel.label))
        .collect();
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    md += &table_head(&["project", "measure", "published", "ours"], &columns);
    for seed in SEEDS {
        let _ = write!(
            md,
            "| {} | {} | {} | {} |",
            seed.project, seed.measure, seed.published, seed.ours
        );
        for kernel in kernels {
            let _ = write!(md, " {} |", (seed.figure)(kernel));
        }
        md += "\n";
    }
    md
}

fn agent_cpu(kernel: &Kernel) -> String {
    let idle = median(kernel.run.footprint.iter().map(|row| row.idle_cpu));
    let busy = kernel
        .run
        .throughput
        .iter()
        .find(|row| row.offered_per_second == 1000)
        .filter(|row| row.seconds > 0.0)
        .map(|row| row.agent_cpu_seconds / row.seconds);
    let shown = |cpu: Option<f64>| cpu.map_or("-".into(), |cpu| format!("{:.1}%", cpu * 100.0));
    format!("{} / {}", shown(idle), shown(busy))
}

fn worst_workload(kernel: &Kernel) -> String {
    kernel
        .workloads()
        .into_iter()
        .filter_map(|workload| {
            let change = kernel.workload_change("S4-64", &workload)?.median;
            Some((workload, change))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("-".into(), |(workload, change)| {
            format!("{} ({workload})", signed(change))
        })
}

fn map_memory(kernel: &Kernel) -> String {
    let rows = &kernel.run.footprint;
    let setup = |row: &Footprint| {
        format!(
            "{:.1} MiB ({}/{})",
            mib(row.map_bytes),
            row.policies,
            row.cgroups
        )
    };
    let key = |row: &&Footprint| (row.policies, row.cgroups);
    match (rows.iter().min_by_key(key), rows.iter().max_by_key(key)) {
        (Some(smallest), Some(largest)) => format!("{} -> {}", setup(smallest), setup(largest)),
        _ => "-".into(),
    }
}

/// The largest median overhead of any microbenchmark in `state`.
fn worst(kernel: &Kernel, state: &str) -> String {
    kernel
        .benches()
        .into_iter()
        .filter_map(|bench| {
            let overhead = kernel.overhead(state, &bench)?.median;
            Some((bench, overhead))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("-".into(), |(bench, overhead)| {
            format!("{} ({bench})", signed(overhead))
        })
}

fn micro_tables(kernel: &Kernel) -> String {
    let states: Vec<&str> = kernel
        .states()
        .into_iter()
        .filter(|state| *state != "S0")
        .collect();
    let mut md = format!(
        "\n## Microbenchmarks, Linux {}\n\nOverhead against S0 of the same round: median (min..max over rounds) of the per-round ratios.\n\n",
        kernel.label
    );
    md += &table_head(&["benchmark"], &[&["S0 ns/op"], &states[..]].concat());
    for bench in kernel.benches() {
        let base = kernel
            .median_ns("S0", &bench)
            .map_or("-".into(), |ns| format!("{ns:.0}"));
        let _ = write!(md, "| {bench} | {base} |");
        for state in &states {
            let _ = write!(md, " {} |", percent(kernel.overhead(state, &bench)));
        }
        md += "\n";
    }
    let allow: Vec<&str> = states
        .iter()
        .copied()
        .filter(|state| !matches!(*state, "floor" | "S5" | "S6"))
        .collect();
    if allow.is_empty() {
        return md;
    }
    md += "\nThe allow path as a multiple of the floor: (state - S0) / (floor - S0), medians of ns per operation.\n\n";
    md += &table_head(&["benchmark"], &allow);
    for bench in kernel.benches() {
        let _ = write!(md, "| {bench} |");
        for state in &allow {
            let cell = match (
                kernel.median_ns(state, &bench),
                kernel.median_ns("S0", &bench),
                kernel.median_ns("floor", &bench),
            ) {
                (Some(value), Some(base), Some(floor)) if floor - base > 0.0 => {
                    format!("{:.1}x", (value - base) / (floor - base))
                }
                _ => "n/a".into(),
            };
            let _ = write!(md, " {cell} |");
        }
        md += "\n";
    }
    md + &goal_table(kernel) + &allowlist_table(kernel) + &open_cache_table(kernel)
}

/// What S1 (no target), S2 (an AlwaysAllow target) and S9 (a process outside an enforced
/// target) may cost: at most 1.25x the floor's overhead, or 0.3 points over it where the floor
/// is under 1% (issue 25's goal).
fn allowed_overhead(floor: f64) -> f64 {
    if floor < 0.01 {
        floor + 0.003
    } else {
        floor * 1.25
    }
}

/// S1, S2 and S9 against their goal, by benchmark: the medians the tables above show (S9's
/// where a run has it).
fn goal_table(kernel: &Kernel) -> String {
    let states = kernel.states();
    if !["floor", "S1", "S2"]
        .iter()
        .all(|state| states.contains(state))
    {
        return String::new();
    }
    let mut md = String::from(
        "\nNo target (S1), an AlwaysAllow target (S2) and a process outside an enforced target (S9) against their goal: an overhead at most 1.25x the floor's, or at most 0.3 points over it where the floor's is under 1% (medians).\n\n",
    );
    md += &table_head(&["benchmark"], &["floor", "allowed", "S1", "S2", "S9"]);
    for bench in kernel.benches() {
        let median = |state: &str| kernel.overhead(state, &bench).map(|spread| spread.median);
        let Some(floor) = median("floor") else {
            continue;
        };
        let allowed = allowed_overhead(floor);
        // Two decimals: a verdict must not hang on a rounded figure.
        let points = |ratio: f64| format!("{:+.2}%", ratio * 100.0);
        let _ = write!(md, "| {bench} | {} | {} |", points(floor), points(allowed));
        for state in ["S1", "S2", "S9"] {
            let cell = median(state).map_or("-".into(), |overhead| {
                let verdict = if overhead <= allowed { "met" } else { "missed" };
                format!("{} {verdict}", points(overhead))
            });
            let _ = write!(md, " {cell} |");
        }
        md += "\n";
    }
    md
}

/// DefenseInDepth (S7: S4-8's rules on top of an allowlist) against the deny rules alone (S4-8),
/// by benchmark: an allowlisted target is to pay no more (medians, within 0.1 points).
fn allowlist_table(kernel: &Kernel) -> String {
    let states = kernel.states();
    if !["S4-8", "S7"].iter().all(|state| states.contains(state)) {
        return String::new();
    }
    let mut md = String::from(
        "\nAn allowlist (DefenseInDepth, S7: S4-8's rules on top of it) against the deny rules alone (S4-8): its overhead at most theirs, within 0.1 points (medians).\n\n",
    );
    md += &table_head(&["benchmark"], &["S4-8", "S7"]);
    for bench in kernel.benches() {
        let median = |state: &str| kernel.overhead(state, &bench).map(|spread| spread.median);
        let (Some(rules), Some(allowlist)) = (median("S4-8"), median("S7")) else {
            continue;
        };
        let points = |ratio: f64| format!("{:+.2}%", ratio * 100.0);
        let verdict = if allowlist <= rules + 0.001 {
            "met"
        } else {
            "missed"
        };
        let _ = writeln!(
            md,
            "| {bench} | {} | {} {verdict} |",
            points(rules),
            points(allowlist)
        );
    }
    md
}

/// The open verdict cache on (S4-10000) and off (S8, the same rules): what an open+close costs
/// over S0 when it opens the same file again (the cache's hits) and a file not opened before in
/// the run (its misses, which issue 29 asks to cost no more than with no cache).
fn open_cache_table(kernel: &Kernel) -> String {
    let states = kernel.states();
    if !["S4-10000", "S8"]
        .iter()
        .all(|state| states.contains(state))
    {
        return String::new();
    }
    let mut md = String::from(
        "\nThe open verdict cache on (S4-10000) and off (S8: the same rules, the agent started with `--no-open-cache`): ns per operation over S0 (medians), and on / off.\n\n",
    );
    md += &table_head(&["benchmark"], &["S4-10000", "S8", "on / off"]);
    let over_s0 = |state: &str, bench: &str| {
        Some(kernel.median_ns(state, bench)? - kernel.median_ns("S0", bench)?)
    };
    for bench in ["open_close", "open_many"] {
        let (Some(on), Some(off)) = (over_s0("S4-10000", bench), over_s0("S8", bench)) else {
            continue;
        };
        let ratio = if off > 0.0 {
            format!("{:.2}", on / off)
        } else {
            "n/a".into()
        };
        let _ = writeln!(md, "| {bench} | {on:+.0} | {off:+.0} | {ratio} |");
    }
    md
}

fn workload_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Workloads\n\nMedian value, and the change against S0 of the same round: median (min..max over rounds) of the per-round ratios. Higher values are better.\n\n",
    );
    md += &table_head(&["kernel", "workload"], WORKLOAD_STATES);
    for kernel in kernels {
        for workload in kernel.workloads() {
            let unit = kernel
                .run
                .workloads
                .iter()
                .find(|sample| sample.workload == workload)
                .map_or("", |sample| sample.unit.as_str());
            let _ = write!(md, "| {} | {workload} ({unit}) |", kernel.label);
            for state in WORKLOAD_STATES {
                let value = median(kernel.workload(state, &workload).into_values())
                    .map_or("-".into(), |value| format!("{value:.0}"));
                let change = if *state == "S0" {
                    String::new()
                } else {
                    format!(", {}", percent(kernel.workload_change(state, &workload)))
                };
                let _ = write!(md, " {value}{change} |");
            }
            md += "\n";
        }
    }
    md
}

fn hook_table(kernel: &Kernel) -> String {
    let hooks = kernel.pass_costs();
    let states = first_seen(hooks.iter().map(|cost| &cost.state));
    let programs = first_seen(hooks.iter().map(|cost| &cost.program));
    if states.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## Program run time (BPF statistics), Linux {}\n\nns (instructions) per run, and runs, over one pass of the microbenchmarks; `floor` is the empty program on the same hooks, the cost of any program at all. Program names are cut to 15 characters by the kernel.\n\n",
        kernel.label
    );
    let columns: Vec<&str> = states.iter().map(String::as_str).collect();
    md += &table_head(&["program"], &columns);
    for program in programs {
        let _ = write!(md, "| {program} |");
        for state in &states {
            let cell = hooks
                .iter()
                .find(|cost| cost.state == *state && cost.program == program)
                .map_or("-".into(), |cost| {
                    format!("{:.0} ({})", cost.ns_per_run, cost.runs)
                });
            let _ = write!(md, " {cell} |");
        }
        md += "\n";
    }
    md + &open_table(kernel, &states)
}

/// `file_open`'s time per run in each microbenchmark that opens files, by state: in a target,
/// `open_close` and `open_denied` open one file again and again (the open verdict cache answers
/// from the second), `open_many` a new one each time (it never does).
fn open_table(kernel: &Kernel, states: &[String]) -> String {
    const PROGRAM: &str = "file_open";
    let hooks = &kernel.run.hooks;
    let benches = first_seen(
        hooks
            .iter()
            .filter(|cost| cost.program == PROGRAM && !cost.bench.is_empty())
            .map(|cost| &cost.bench),
    );
    if benches.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n`{PROGRAM}` by microbenchmark, Linux {}: ns (instructions) per run, and runs. In a target, `open_close` and `open_denied` open one file again and again (the open verdict cache answers from the second open on: the hit path), `open_many` a new file each time (the miss path).\n\n",
        kernel.label
    );
    let columns: Vec<&str> = states.iter().map(String::as_str).collect();
    md += &table_head(&["benchmark"], &columns);
    for bench in benches {
        let _ = write!(md, "| {bench} |");
        for state in states {
            let cell = hooks
                .iter()
                .find(|cost| cost.state == *state && cost.bench == bench && cost.program == PROGRAM)
                .map_or("-".into(), |cost| {
                    format!("{:.0} ({})", cost.ns_per_run, cost.runs)
                });
            let _ = write!(md, " {cell} |");
        }
        md += "\n";
    }
    md
}

fn footprint_table(kernels: &[Kernel]) -> String {
    let mut md = String::from("\n## Footprint\n\n");
    md += &table_head(
        &["kernel"],
        &[
            "policies",
            "cgroups",
            "agent RSS",
            "BPF map memory",
            "idle CPU",
            "apply",
        ],
    );
    for kernel in kernels {
        for row in &kernel.run.footprint {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} MiB | {:.1} MiB | {:.2}% | {:.2} s |",
                kernel.label,
                row.policies,
                row.cgroups,
                mib(row.rss_bytes),
                mib(row.map_bytes),
                row.idle_cpu * 100.0,
                row.apply_seconds
            );
        }
    }
    md
}

/// Sorted milliseconds of enforce and lift.
fn latencies(kernel: &Kernel) -> [(&'static str, Vec<f64>); 2] {
    let sorted = |pick: fn(&palisade_benchmarks::kernel::ApplySample) -> u64| {
        let mut values: Vec<f64> = kernel
            .run
            .apply_latency
            .iter()
            .map(|sample| pick(sample) as f64 / 1e6)
            .collect();
        values.sort_by(f64::total_cmp);
        values
    };
    [
        ("enforce", sorted(|sample| sample.enforce_ns)),
        ("lift", sorted(|sample| sample.lift_ns)),
    ]
}

fn latency_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Policy apply latency (file change)\n\nFrom writing the policy file to the first read the target was refused (enforce) or allowed again (lift), the policy file written whole and closed (the agent reconciles at once).\n\n",
    );
    md += &table_head(
        &["kernel", "change"],
        &["trials", "p50", "p90", "p99", "max"],
    );
    for kernel in kernels {
        for (change, values) in latencies(kernel) {
            let Some(max) = values.last() else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {} | {change} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {max:.0} ms |",
                kernel.label,
                values.len(),
                quantile(&values, 0.5),
                quantile(&values, 0.9),
                quantile(&values, 0.99),
            );
        }
    }
    md
}

fn rate_label(rate: u64) -> String {
    if rate == 0 {
        "max".into()
    } else {
        rate.to_string()
    }
}

/// The rows that lasted, by offered rate with "as fast as possible" (0) last.
fn throughput_rows(kernel: &Kernel) -> Vec<&ThroughputSample> {
    let mut rows: Vec<&ThroughputSample> = kernel
        .run
        .throughput
        .iter()
        .filter(|row| row.seconds > 0.0)
        .collect();
    rows.sort_by_key(|row| (row.offered_per_second == 0, row.offered_per_second));
    rows
}

fn throughput_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Event throughput\n\nDenials through the ring buffer, the decoder, a Wasm rule module's decide and the file sink (no rate limit). Accounted: produced = written + dropped by the rule module, the agent or the kernel + throttled + still queued. The agent's CPU time per written event (its cgroup's, to the microsecond), from the flood's start until the events file stops growing, includes its background work (timers) but not the benchmark's scrapes of its metrics; in parentheses, the part spent in the kernel on its behalf (reading the ring buffer, writing the events file, waking its threads; apportioned by the kernel's ticks). Drops, throttled and kept are counts over the whole flood. The rates are measured in this order after a 1-s flood as fast as the generator goes that is not measured: the agent's first pass through the 2-MiB ring buffer faults its pages in, a cost paid once per start.\n\n",
    );
    md += &table_head(
        &["kernel"],
        &[
            "offered/s",
            "flood s",
            "produced/s",
            "written/s",
            "dropped in kernel",
            "dropped in agent",
            "throttled",
            "kept",
            "agent CPU",
            "agent ns per written event (in the kernel)",
            "agent RSS",
            "accounted",
        ],
    );
    for kernel in kernels {
        for row in throughput_rows(kernel) {
            let per_event = if row.written == 0 {
                "-".to_owned()
            } else {
                let per_event = |seconds: f64| seconds * 1e9 / row.written as f64;
                format!(
                    "{:.0} ({:.0})",
                    per_event(row.agent_cpu_seconds),
                    per_event(row.agent_system_seconds)
                )
            };
            let rate =
                |count| per_second(count, row).map_or("-".into(), |rate| format!("{rate:.0}"));
            let diff = i128::from(row.produced)
                - i128::from(row.written)
                - i128::from(row.module_dropped)
                - i128::from(row.agent_dropped)
                - i128::from(row.dropped)
                - i128::from(row.throttled)
                - i128::from(row.queued);
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {:.0}% | {per_event} | {:.1} MiB | {} |",
                kernel.label,
                rate_label(row.offered_per_second),
                row.seconds,
                rate(row.produced),
                rate(row.written),
                row.dropped,
                row.agent_dropped,
                row.throttled,
                row.kept,
                row.agent_cpu_seconds / row.seconds * 100.0,
                mib(row.agent_rss_bytes),
                if diff == 0 {
                    "yes".to_owned()
                } else {
                    format!("no (diff {diff})")
                }
            );
        }
    }
    md += "\nSustainable rate (the fastest offered rate whose every event was written or dropped by the module's verdict):";
    for kernel in kernels {
        let sustained = throughput_rows(kernel)
            .into_iter()
            .filter(|row| {
                row.offered_per_second > 0
                    && row.written > 0
                    && row.written + row.module_dropped == row.produced
            })
            .map(|row| row.offered_per_second)
            .max();
        let _ = write!(
            md,
            " {}: {};",
            kernel.label,
            sustained.map_or("none".to_owned(), |rate| format!("{rate}/s"))
        );
    }
    md.pop();
    md += ".\n";
    md
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// A labelled line's points.
type Series<X> = (String, Vec<(X, f64)>);

/// A quantity of a row, by name.
type Measure<Row> = (&'static str, fn(&Row) -> u64);

const CAPTION: (&str, u32) = ("sans-serif", 22);
const TEXT: (&str, u32) = ("sans-serif", 16);

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// Draws one panel per kernel, stacked, into the PNG at `path`.
fn per_kernel(
    path: &Path,
    kernels: &[Kernel],
    height: u32,
    draw: impl Fn(&Area, &Kernel) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let root =
        BitMapBackend::new(path, (1200, height * kernels.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, kernel) in root
        .split_evenly((kernels.len().max(1), 1))
        .iter()
        .zip(kernels)
    {
        draw(panel, kernel)?;
    }
    root.present()?;
    Ok(())
}

/// A panel with its caption and nothing measured to draw.
fn no_data(area: &Area, caption: &str) -> anyhow::Result<()> {
    let inner = area.margin(15, 15, 15, 15).titled(caption, CAPTION)?;
    let (width, height) = inner.dim_in_pixel();
    inner.draw(&Text::new(
        "no data",
        (width as i32 / 2 - 30, height as i32 / 2),
        TEXT,
    ))?;
    Ok(())
}

/// A chart in `area` with the report's caption style and margins.
fn chart_on<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    y_label_area: u32,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, CAPTION)
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(y_label_area);
    builder
}

/// An axis value without trailing zeros: "10000", "2.5".
fn tick(value: &f64) -> String {
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" { "0" } else { text }.to_owned()
}

/// The segment label of `labels[index]`.
fn segment(labels: &[String], value: &SegmentValue<usize>) -> String {
    match value {
        SegmentValue::CenterOf(index) => labels.get(*index).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// `count` categories on a segmented axis (plotters' integer ranges include their end).
fn categories(count: usize) -> SegmentedCoord<RangedCoordusize> {
    (0..count.saturating_sub(1)).into_segmented()
}

/// The range `values` span, padded and never empty; with `zero`, one that holds 0 (and starts
/// there for positive values).
fn span(values: impl IntoIterator<Item = f64>, zero: bool) -> Range<f64> {
    let mut values: Vec<f64> = values
        .into_iter()
        .filter(|value| value.is_finite())
        .collect();
    if zero {
        values.push(0.0);
    }
    let Some(Spread { min, max, .. }) = Spread::of(values) else {
        return 0.0..1.0;
    };
    let pad = if max > min {
        (max - min) * 0.1
    } else {
        (max.abs() * 0.1).max(0.5)
    };
    let bottom = if zero && min == 0.0 { 0.0 } else { min - pad };
    bottom..max + pad
}

/// `range` raised for a legend of `rows` entries to fit above the data (in a ~500 px panel).
fn legend_room(range: Range<f64>, rows: usize) -> Range<f64> {
    let share = (0.05 + 0.05 * rows as f64).min(0.6);
    range.start..range.start + (range.end - range.start) / (1.0 - share)
}

/// A labelled line with a dot on each point.
fn line<X, Y>(
    chart: &mut ChartContext<'_, BitMapBackend<'_>, Cartesian2d<X, Y>>,
    points: Vec<(X::ValueType, Y::ValueType)>,
    color: RGBColor,
    label: impl Into<String>,
) -> anyhow::Result<()>
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    chart.draw_series(
        points
            .iter()
            .map(|point| Circle::new(point.clone(), 4, color.filled())),
    )?;
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

fn legend<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(TEXT)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Median overhead per state, a line per microbenchmark.
fn plot_overhead(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    per_kernel(path, kernels, 520, |panel, kernel| {
        let caption = format!(
            "Linux {}: time per operation against S0, median of rounds ({})",
            kernel.label,
            kernel.clock_note()
        );
        let states: Vec<String> = kernel
            .states()
            .into_iter()
            .filter(|state| *state != "S0")
            .map(str::to_owned)
            .collect();
        let series: Vec<Series<SegmentValue<usize>>> = kernel
            .benches()
            .into_iter()
            .map(|bench| {
                let points = states
                    .iter()
                    .enumerate()
                    .filter_map(|(at, state)| {
                        let overhead = kernel.overhead(state, &bench)?.median * 100.0;
                        Some((SegmentValue::CenterOf(at), overhead))
                    })
                    .collect();
                (bench, points)
            })
            .collect();
        if series.iter().all(|(_, points)| points.is_empty()) {
            return no_data(panel, &caption);
        }
        let values = series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|(_, y)| *y));
        let mut chart = chart_on(panel, &caption, 70).build_cartesian_2d(
            categories(states.len()),
            legend_room(span(values, true), series.len()),
        )?;
        chart
            .configure_mesh()
            .x_labels(states.len())
            .x_label_formatter(&|x| segment(&states, x))
            .y_label_formatter(&|y| format!("{}%", tick(y)))
            .x_desc("state")
            .y_desc("overhead against S0")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        for (index, (bench, points)) in series.into_iter().enumerate() {
            line(&mut chart, points, color(index), bench)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// Overhead of the LSM-sensitive benchmarks as custom rules grow (S4-N).
fn plot_scaling(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    const BENCHES: [&str; 3] = ["open_close", "stat", "exec"];
    let root = BitMapBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "Overhead against S0 as custom rules grow (built-in rules + N; {})",
        kernels.first().map_or("", Kernel::clock_note)
    );
    let series: Vec<Series<f64>> = kernels
        .iter()
        .flat_map(|kernel| {
            BENCHES.iter().map(move |bench| {
                let points = kernel
                    .states()
                    .iter()
                    .filter_map(|state| {
                        let rules: f64 = state.strip_prefix("S4-")?.parse().ok()?;
                        Some((rules, kernel.overhead(state, bench)?.median * 100.0))
                    })
                    .collect();
                (format!("Linux {} {bench}", kernel.label), points)
            })
        })
        .filter(|(_, points): &Series<f64>| !points.is_empty())
        .collect();
    if series.is_empty() {
        no_data(&root, &caption)?;
    } else {
        let values = series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|(_, y)| *y));
        let mut chart = chart_on(&root, &caption, 70).build_cartesian_2d(
            (0.5f64..20_000f64).log_scale(),
            legend_room(span(values, true), series.len()),
        )?;
        chart
            .configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&|y| format!("{}%", tick(y)))
            .x_desc("custom rules (log scale)")
            .y_desc("overhead against S0")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        for (index, (label, points)) in series.into_iter().enumerate() {
            line(&mut chart, points, color(index), label)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

/// ns per run of the most run programs in S4-64, next to S1 and the empty program (floor).
fn plot_hooks(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    const SHOWN: [&str; 3] = ["floor", "S1", "S4-64"];
    /// Rows per program: a bar per state and a gap.
    const STRIDE: usize = SHOWN.len() + 1;
    const TOP: usize = 12;
    per_kernel(path, kernels, 560, |panel, kernel| {
        let caption = format!(
            "Linux {}: ns per program run, most run programs in S4-64 ({})",
            kernel.label,
            kernel.clock_note()
        );
        let hooks = &kernel.pass_costs();
        let mut top: Vec<_> = hooks.iter().filter(|cost| cost.state == "S4-64").collect();
        top.sort_by_key(|cost| Reverse(cost.runs));
        top.truncate(TOP);
        if top.is_empty() {
            return no_data(panel, &caption);
        }
        // The most run program at the top.
        let labels: Vec<String> = top
            .iter()
            .rev()
            .flat_map(|cost| {
                let mut rows = vec![String::new(); STRIDE];
                rows[STRIDE / 2] = format!("{} ({} runs)", cost.program, cost.runs);
                rows
            })
            .collect();
        let cost = |state: &str, program: &str| {
            hooks
                .iter()
                .find(|cost| cost.state == state && cost.program == program)
                .map(|cost| cost.ns_per_run)
        };
        let values = top
            .iter()
            .flat_map(|top| SHOWN.iter().filter_map(|state| cost(state, &top.program)));
        let mut chart = chart_on(panel, &caption, 260)
            .build_cartesian_2d(span(values, true), (0..labels.len()).into_segmented())?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(labels.len())
            .y_label_formatter(&|y| segment(&labels, y))
            .x_label_formatter(&tick)
            .x_desc("ns per run")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        for (offset, state) in SHOWN.iter().enumerate() {
            let color = color(offset);
            chart
                .draw_series(top.iter().rev().enumerate().filter_map(|(index, top)| {
                    let value = cost(state, &top.program)?;
                    // The first state on top.
                    let row = index * STRIDE + SHOWN.len() - offset;
                    Some(Rectangle::new(
                        [
                            (0.0, SegmentValue::Exact(row)),
                            (value, SegmentValue::Exact(row + 1)),
                        ],
                        color.filled(),
                    ))
                }))?
                .label(*state)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                });
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// Agent RSS and BPF map memory against cgroups, a line per policy count.
fn plot_footprint(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    per_kernel(path, kernels, 480, |panel, kernel| {
        let caption = format!("Linux {}: agent memory by cgroups protected", kernel.label);
        let rows = &kernel.run.footprint;
        let Some(most) = rows.iter().map(|row| row.cgroups).max() else {
            return no_data(panel, &caption);
        };
        let fewest = rows.iter().map(|row| row.cgroups).min().unwrap_or(1).max(1);
        let most = most.max(fewest);
        let policies = first_seen(rows.iter().map(|row| &row.policies));
        let values = rows
            .iter()
            .flat_map(|row| [mib(row.rss_bytes), mib(row.map_bytes)]);
        let mut chart = chart_on(panel, &caption, 70).build_cartesian_2d(
            (fewest as f64 * 0.7..most as f64 * 1.5).log_scale(),
            legend_room(span(values, true), 2 * policies.len()),
        )?;
        chart
            .configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .x_desc("cgroups with a process each (log scale)")
            .y_desc("MiB")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        let kinds: [Measure<Footprint>; 2] = [
            ("agent RSS", |row| row.rss_bytes),
            ("BPF maps", |row| row.map_bytes),
        ];
        for (kind_index, (kind, pick)) in kinds.into_iter().enumerate() {
            for (index, count) in policies.iter().enumerate() {
                let mut points: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|row| row.policies == *count && row.cgroups > 0)
                    .map(|row| (row.cgroups as f64, mib(pick(row))))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let plural = if *count == 1 { "policy" } else { "policies" };
                let label = format!("{kind}, {count} {plural}");
                line(
                    &mut chart,
                    points,
                    color(kind_index * policies.len() + index),
                    label,
                )?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// Events produced, written and dropped per second against the offered rate.
fn plot_throughput(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    per_kernel(path, kernels, 480, |panel, kernel| {
        let caption = format!(
            "Linux {}: audit events per second by offered violations ({})",
            kernel.label,
            kernel.clock_note()
        );
        let rows = throughput_rows(kernel);
        if rows.is_empty() {
            return no_data(panel, &caption);
        }
        let labels: Vec<String> = rows
            .iter()
            .map(|row| rate_label(row.offered_per_second))
            .collect();
        let kinds: [Measure<ThroughputSample>; 3] = [
            ("produced", |row| row.produced),
            ("written", |row| row.written),
            ("dropped", |row| row.dropped),
        ];
        let values = rows.iter().flat_map(|row| {
            kinds
                .iter()
                .filter_map(|(_, pick)| per_second(pick(row), row))
        });
        let mut chart = chart_on(panel, &caption, 90).build_cartesian_2d(
            categories(rows.len()),
            legend_room(span(values, true), kinds.len()),
        )?;
        chart
            .configure_mesh()
            .x_labels(rows.len())
            .x_label_formatter(&|x| segment(&labels, x))
            .y_label_formatter(&tick)
            .x_desc("offered violations per second (max: as fast as the generator can)")
            .y_desc("events per second")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        for (index, (name, pick)) in kinds.into_iter().enumerate() {
            let points = rows
                .iter()
                .enumerate()
                .filter_map(|(at, row)| {
                    Some((SegmentValue::CenterOf(at), per_second(pick(row), row)?))
                })
                .collect();
            line(&mut chart, points, color(index), name)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// The distribution of apply latencies: share of trials done by each time.
fn plot_latency(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    per_kernel(path, kernels, 420, |panel, kernel| {
        let caption = format!(
            "Linux {}: policy file change to the kernel's answer ({})",
            kernel.label,
            kernel.clock_note()
        );
        let series = latencies(kernel);
        if series.iter().all(|(_, values)| values.is_empty()) {
            return no_data(panel, &caption);
        }
        let values = series.iter().flat_map(|(_, values)| values.iter().copied());
        let mut chart =
            chart_on(panel, &caption, 70).build_cartesian_2d(span(values, false), 0.0..1.05)?;
        chart
            .configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .x_desc("milliseconds")
            .y_desc("share of trials done")
            .label_style(TEXT)
            .axis_desc_style(TEXT)
            .draw()?;
        for (index, (name, values)) in series.iter().enumerate() {
            let points = values
                .iter()
                .enumerate()
                .map(|(at, value)| (*value, (at + 1) as f64 / values.len() as f64))
                .collect();
            line(&mut chart, points, color(index), *name)?;
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

#[cfg(test)]
mod tests {
    use super::allowed_overhead;

    #[test]
    fn the_goal_is_a_quarter_over_the_floor_or_three_tenths_of_a_point_under_one_percent() {
        for (floor, allowed) in [(0.03, 0.0375), (0.007, 0.010), (-0.005, -0.002)] {
            assert!((allowed_overhead(floor) - allowed).abs() < 1e-12, "{floor}");
        }
    }
}
