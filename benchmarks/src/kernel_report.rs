//! The kernel benchmark's report: `cargo xtask bench` runs `kernel-bench` in the VM on each
//! kernel, then this turns its results (one `KernelRun` per kernel) into
//! `kernel-<kernel>.json` (the raw data), `kernel.md` (every table) and PNG plots.
//!
//! kernel-report [--out DIR] INPUT.json...   (DIR defaults to benchmarks/results)

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Context;
use palisade_benchmarks::{
    kernel::{KernelRun, STATES, Spread, WORKLOAD_STATES},
    register_font, workspace,
};
use plotters::prelude::*;

/// A published number of a seed (../shared/seeds) and our figure for the same question.
struct Comparison {
    project: &'static str,
    measure: &'static str,
    published: &'static str,
    ours: &'static str,
    figure: fn(&Kernel) -> String,
}

const SEEDS: &[Comparison] = &[
    Comparison {
        project: "vArmor (BPF enforcer, byte-unixbench)",
        measure: "AlwaysAllow",
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
    Comparison {
        project: "Eunomia",
        measure: "agent CPU",
        published: "< 2%",
        ours: "agent CPU, idle / at 1000 events/s",
        figure: agent_cpu,
    },
    Comparison {
        project: "Eunomia",
        measure: "workload throughput loss",
        published: "2-4%",
        ours: "workloads in EnhanceProtect (S4-64): worst",
        figure: worst_workload,
    },
    Comparison {
        project: "Kmesh",
        measure: "eBPF memory, 1 to 1000 services",
        published: "23 MB, constant",
        ours: "BPF map memory, 1 to 1000 cgroups",
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
        let mut benches: Vec<String> = Vec::new();
        for sample in &self.run.micro {
            if !benches.contains(&sample.bench) {
                benches.push(sample.bench.clone());
            }
        }
        benches
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

    fn workload(&self, state: &str, workload: &str) -> BTreeMap<usize, f64> {
        self.run
            .workloads
            .iter()
            .filter(|sample| sample.state == state && sample.workload == workload)
            .map(|sample| (sample.round, sample.value))
            .collect()
    }

    /// Overhead of `bench` in `state` against S0 (per-round ratios minus one).
    fn overhead(&self, state: &str, bench: &str) -> Option<Spread> {
        ratios(&self.micro(state, bench), &self.micro("S0", bench))
    }

    fn clock_note(&self) -> &'static str {
        if self.run.environment.clock == "icount" {
            "QEMU -icount: guest ns = instructions"
        } else {
            "QEMU TCG"
        }
    }
}

/// The median and spread of `values[round] / base[round] - 1` over the rounds both have.
fn ratios(values: &BTreeMap<usize, f64>, base: &BTreeMap<usize, f64>) -> Option<Spread> {
    Spread::of(values.iter().filter_map(|(round, value)| {
        let base = base.get(round).filter(|base| **base > 0.0)?;
        Some(value / base - 1.0)
    }))
}

fn percent(spread: Option<Spread>) -> String {
    spread.map_or("-".to_owned(), |spread| {
        format!(
            "{:+.1}% ({:+.1}..{:+.1})",
            spread.median * 100.0,
            spread.min * 100.0,
            spread.max * 100.0
        )
    })
}

fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    Spread::of(values).map(|spread| spread.median)
}

/// The sample at quantile `q` of sorted `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    values[((values.len() - 1) as f64 * q).round() as usize]
}

const MIB: f64 = 1024.0 * 1024.0;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, inputs) = match args.iter().position(|arg| arg == "--out") {
        Some(at) => {
            let out = args.get(at + 1).context("--out needs a directory")?;
            let inputs: Vec<&String> = args
                .iter()
                .enumerate()
                .filter(|(index, _)| *index != at && *index != at + 1)
                .map(|(_, arg)| arg)
                .collect();
            (Path::new(out).to_owned(), inputs)
        }
        None => (
            workspace().join("benchmarks/results"),
            args.iter().collect(),
        ),
    };
    anyhow::ensure!(
        !inputs.is_empty(),
        "usage: kernel-report [--out DIR] INPUT.json..."
    );
    let mut kernels = Vec::new();
    for input in inputs {
        let text = std::fs::read_to_string(input).with_context(|| input.clone())?;
        let run: KernelRun = serde_json::from_str(&text).with_context(|| input.clone())?;
        let label = run
            .environment
            .kernel
            .split(['.', '-'])
            .take(2)
            .collect::<Vec<_>>()
            .join(".");
        kernels.push(Kernel { label, run });
    }
    kernels.sort_by_key(|kernel| {
        kernel
            .label
            .split('.')
            .map(|part| part.parse::<u32>().unwrap_or(0))
            .collect::<Vec<_>>()
    });
    std::fs::create_dir_all(&out)?;
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
    md += &workload_tables(kernels);
    for kernel in kernels {
        md += &hook_table(kernel);
    }
    md += &footprint_table(kernels);
    md += &latency_table(kernels);
    md += &throughput_table(kernels);
    md
}

fn seeds_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Next to the seeds\n\nTheir figures come from real hardware, ours from an emulated VM counting instructions: only ratios compare. The seeds publish score changes (negative: slower); our microbenchmark figures are changes of the time per operation (positive: slower), our workload figures changes of throughput (negative: slower).\n\n| project | measure | published |",
    );
    for kernel in kernels {
        let _ = write!(md, " Palisade, Linux {} |", kernel.label);
    }
    md += "\n|---|---|---|";
    md += &"---|".repeat(kernels.len());
    md += "\n";
    for seed in SEEDS {
        let _ = write!(
            md,
            "| {} | {} (ours: {}) | {} |",
            seed.project, seed.measure, seed.ours, seed.published
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
        .map(|row| row.agent_cpu_seconds / row.seconds);
    let shown = |cpu: Option<f64>| cpu.map_or("-".into(), |cpu| format!("{:.1}%", cpu * 100.0));
    format!("{} / {}", shown(idle), shown(busy))
}

fn worst_workload(kernel: &Kernel) -> String {
    workload_names(kernel)
        .iter()
        .filter_map(|workload| {
            ratios(
                &kernel.workload("S4-64", workload),
                &kernel.workload("S0", workload),
            )
        })
        .map(|spread| spread.median)
        .min_by(f64::total_cmp)
        .map_or("-".into(), |worst| format!("{:+.1}%", worst * 100.0))
}

fn map_memory(kernel: &Kernel) -> String {
    match (kernel.run.footprint.first(), kernel.run.footprint.last()) {
        (Some(first), Some(last)) => format!(
            "{:.1} MiB -> {:.1} MiB",
            first.map_bytes as f64 / MIB,
            last.map_bytes as f64 / MIB
        ),
        _ => "-".into(),
    }
}

/// The largest median overhead of any microbenchmark in `state`.
fn worst(kernel: &Kernel, state: &str) -> String {
    kernel
        .benches()
        .iter()
        .filter_map(|bench| Some((bench, kernel.overhead(state, bench)?.median)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("-".into(), |(bench, overhead)| {
            format!("{:+.1}% ({bench})", overhead * 100.0)
        })
}

fn micro_tables(kernel: &Kernel) -> String {
    let states = kernel.states();
    let mut md = format!(
        "\n## Microbenchmarks, Linux {}\n\nOverhead against S0 of the same round: median (min..max over rounds).\n\n| benchmark | S0 ns/op |",
        kernel.label
    );
    for state in &states[1..] {
        let _ = write!(md, " {state} |");
    }
    md += "\n|---|---:|";
    md += &"---:|".repeat(states.len() - 1);
    md += "\n";
    for bench in kernel.benches() {
        let base = median(kernel.micro("S0", &bench).into_values());
        let _ = write!(
            md,
            "| {bench} | {} |",
            base.map_or("-".into(), |ns| format!("{ns:.0}"))
        );
        for state in &states[1..] {
            let _ = write!(md, " {} |", percent(kernel.overhead(state, &bench)));
        }
        md += "\n";
    }
    md += "\nThe allow path as a multiple of the floor: (state - S0) / (floor - S0), medians of ns per operation.\n\n| benchmark |";
    let allow: Vec<&str> = states
        .iter()
        .copied()
        .filter(|state| *state != "S0" && *state != "floor" && *state != "S5" && *state != "S6")
        .collect();
    for state in &allow {
        let _ = write!(md, " {state} |");
    }
    md += "\n|---|";
    md += &"---:|".repeat(allow.len());
    md += "\n";
    for bench in kernel.benches() {
        let at = |state: &str| median(kernel.micro(state, &bench).into_values());
        let _ = write!(md, "| {bench} |");
        for state in &allow {
            let cell = match (at(state), at("S0"), at("floor")) {
                (Some(value), Some(base), Some(floor)) if floor - base > 0.0 => {
                    format!("{:.1}x", (value - base) / (floor - base))
                }
                _ => "n/a".into(),
            };
            let _ = write!(md, " {cell} |");
        }
        md += "\n";
    }
    md
}

fn workload_names(kernel: &Kernel) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for sample in &kernel.run.workloads {
        if !names.contains(&sample.workload) {
            names.push(sample.workload.clone());
        }
    }
    names
}

fn workload_tables(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Workloads\n\nMedian value, and the change against S0 of the same round (higher values are better).\n\n| kernel | workload |",
    );
    for state in WORKLOAD_STATES {
        let _ = write!(md, " {state} |");
    }
    md += "\n|---|---|";
    md += &"---:|".repeat(WORKLOAD_STATES.len());
    md += "\n";
    for kernel in kernels {
        for workload in workload_names(kernel) {
            let unit = kernel
                .run
                .workloads
                .iter()
                .find(|sample| sample.workload == workload)
                .map_or("", |sample| sample.unit.as_str());
            let _ = write!(md, "| {} | {workload} ({unit}) |", kernel.label);
            for state in WORKLOAD_STATES {
                let value = median(kernel.workload(state, &workload).into_values());
                let change = if *state == "S0" {
                    String::new()
                } else {
                    format!(
                        ", {}",
                        percent(ratios(
                            &kernel.workload(state, &workload),
                            &kernel.workload("S0", &workload)
                        ))
                    )
                };
                let _ = write!(
                    md,
                    " {}{change} |",
                    value.map_or("-".into(), |value| format!("{value:.0}"))
                );
            }
            md += "\n";
        }
    }
    md
}

fn hook_table(kernel: &Kernel) -> String {
    let mut states: Vec<&str> = Vec::new();
    let mut programs: Vec<&str> = Vec::new();
    for cost in &kernel.run.hooks {
        if !states.contains(&cost.state.as_str()) {
            states.push(&cost.state);
        }
        if !programs.contains(&cost.program.as_str()) {
            programs.push(&cost.program);
        }
    }
    if states.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## Program run time (BPF statistics), Linux {}\n\nns (instructions) per run, and runs, over one pass of the microbenchmarks; `floor` is the empty program. Program names are cut to 15 characters by the kernel.\n\n| program |",
        kernel.label
    );
    for state in &states {
        let _ = write!(md, " {state} |");
    }
    md += "\n|---|";
    md += &"---:|".repeat(states.len());
    md += "\n";
    for program in programs {
        let _ = write!(md, "| {program} |");
        for state in &states {
            let cell = kernel
                .run
                .hooks
                .iter()
                .find(|cost| cost.state == *state && cost.program == program)
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
    let mut md = String::from(
        "\n## Footprint\n\n| kernel | policies | cgroups | agent RSS | BPF map memory | idle CPU | apply |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for kernel in kernels {
        for row in &kernel.run.footprint {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} MiB | {:.1} MiB | {:.2}% | {:.2} s |",
                kernel.label,
                row.policies,
                row.cgroups,
                row.rss_bytes as f64 / MIB,
                row.map_bytes as f64 / MIB,
                row.idle_cpu * 100.0,
                row.apply_seconds
            );
        }
    }
    md
}

/// Sorted milliseconds of enforce and lift.
fn latencies(kernel: &Kernel) -> (Vec<f64>, Vec<f64>) {
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
    (
        sorted(|sample| sample.enforce_ns),
        sorted(|sample| sample.lift_ns),
    )
}

fn latency_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Policy apply latency (file change)\n\nFrom writing the policy file to the first read the target was refused (enforce) or allowed again (lift), including the agent's 200 ms settle time.\n\n| kernel | change | trials | p50 | p90 | p99 | max |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for kernel in kernels {
        let (enforce, lift) = latencies(kernel);
        for (change, values) in [("enforce", &enforce), ("lift", &lift)] {
            if values.is_empty() {
                continue;
            }
            let _ = writeln!(
                md,
                "| {} | {change} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
                kernel.label,
                values.len(),
                quantile(values, 0.5),
                quantile(values, 0.9),
                quantile(values, 0.99),
                values[values.len() - 1]
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

fn throughput_table(kernels: &[Kernel]) -> String {
    let mut md = String::from(
        "\n## Event throughput\n\nDenials through the ring buffer, the decoder, a Wasm rule module's decide and the file sink (no rate limit). Accounted: produced = submitted + dropped + throttled.\n\n| kernel | offered/s | produced/s | written/s | dropped | throttled | kept | agent CPU | agent RSS | accounted |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for kernel in kernels {
        for row in &kernel.run.throughput {
            let accounted = row.submitted + row.dropped + row.throttled;
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {:.0}% | {:.1} MiB | {} |",
                kernel.label,
                rate_label(row.offered_per_second),
                row.produced as f64 / row.seconds,
                row.written as f64 / row.seconds,
                row.dropped,
                row.throttled,
                row.kept,
                row.agent_cpu_seconds / row.seconds * 100.0,
                row.agent_rss_bytes as f64 / MIB,
                if accounted == row.produced {
                    "yes".to_owned()
                } else {
                    format!("no ({} vs {})", accounted, row.produced)
                }
            );
        }
    }
    md
}

/// The drawing area split into one panel per kernel, with a caption each.
fn panels<'a>(
    path: &'a Path,
    kernels: &[Kernel],
    height: u32,
) -> anyhow::Result<Vec<DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>>> {
    let root =
        BitMapBackend::new(path, (1200, height * kernels.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root.split_evenly((kernels.len().max(1), 1)))
}

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

/// Median overhead per state, a line per microbenchmark.
fn plot_overhead(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    for (panel, kernel) in panels(path, kernels, 520)?.iter().zip(kernels) {
        let states: Vec<&str> = kernel
            .states()
            .into_iter()
            .filter(|state| *state != "S0")
            .collect();
        let benches = kernel.benches();
        let values: Vec<f64> = benches
            .iter()
            .flat_map(|bench| {
                states
                    .iter()
                    .filter_map(|state| kernel.overhead(state, bench))
            })
            .map(|spread| spread.median * 100.0)
            .collect();
        let (low, high) = values.iter().fold((0.0f64, 1.0f64), |(low, high), value| {
            (low.min(*value), high.max(*value))
        });
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Linux {}: overhead against S0, median of rounds ({})",
                    kernel.label,
                    kernel.clock_note()
                ),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (0..states.len()).into_segmented(),
                (low - 2.0)..(high * 1.1 + 2.0),
            )?;
        chart
            .configure_mesh()
            .x_labels(states.len())
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(index) => states
                    .get(*index)
                    .map(|state| (*state).to_owned())
                    .unwrap_or_default(),
                _ => String::new(),
            })
            .y_desc("% over S0")
            .draw()?;
        for (index, bench) in benches.iter().enumerate() {
            let color = PALETTE[index % PALETTE.len()];
            let points: Vec<(SegmentValue<usize>, f64)> = states
                .iter()
                .enumerate()
                .filter_map(|(at, state)| {
                    Some((
                        SegmentValue::CenterOf(at),
                        kernel.overhead(state, bench)?.median * 100.0,
                    ))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(bench.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|point| Circle::new(point, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// Overhead of the LSM-sensitive benchmarks as custom rules grow (S4-N).
fn plot_scaling(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    const BENCHES: [&str; 3] = ["open_close", "stat", "exec"];
    let root = BitMapBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let series: Vec<(String, Vec<(f64, f64)>)> = kernels
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
        .collect();
    let high = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, y)| *y))
        .fold(1.0f64, f64::max);
    let low = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::min);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Overhead against S0 as custom rules grow (built-in rules + N)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0.5f64..20_000f64).log_scale(),
            (low - 2.0)..(high * 1.2 + 2.0),
        )?;
    chart
        .configure_mesh()
        .x_desc("custom rules (log)")
        .y_desc("% over S0")
        .draw()?;
    for (index, (label, points)) in series.into_iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Instructions per run of each program in the floor, S1 and S4-64 states.
fn plot_hooks(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    const SHOWN: [&str; 3] = ["floor", "S1", "S4-64"];
    for (panel, kernel) in panels(path, kernels, 520)?.iter().zip(kernels) {
        let mut programs: Vec<&str> = kernel
            .run
            .hooks
            .iter()
            .filter(|cost| cost.state == "S4-64")
            .map(|cost| cost.program.as_str())
            .collect();
        programs.dedup();
        let cost = |state: &str, program: &str| {
            kernel
                .run
                .hooks
                .iter()
                .find(|cost| cost.state == state && cost.program == program)
                .map(|cost| cost.ns_per_run)
        };
        let high = programs
            .iter()
            .flat_map(|program| SHOWN.iter().filter_map(|state| cost(state, program)))
            .fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Linux {}: ns per program run ({})",
                    kernel.label,
                    kernel.clock_note()
                ),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(
                0.0..high * 1.1,
                (0..programs.len() * SHOWN.len()).into_segmented(),
            )?;
        chart
            .configure_mesh()
            .y_labels(programs.len() * SHOWN.len())
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(index) if index % SHOWN.len() == 1 => programs
                    .get(index / SHOWN.len())
                    .map(|program| (*program).to_owned())
                    .unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc("ns (instructions) per run")
            .draw()?;
        for (offset, state) in SHOWN.iter().enumerate() {
            let color = PALETTE[offset];
            chart
                .draw_series(programs.iter().enumerate().filter_map(|(index, program)| {
                    let value = cost(state, program)?;
                    let row = index * SHOWN.len() + offset;
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
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// Agent RSS and BPF map memory against cgroups, a line per policy count.
fn plot_footprint(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    for (panel, kernel) in panels(path, kernels, 480)?.iter().zip(kernels) {
        let rows = &kernel.run.footprint;
        let high = rows
            .iter()
            .map(|row| row.rss_bytes.max(row.map_bytes) as f64 / MIB)
            .fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("Linux {}: agent memory by cgroups protected", kernel.label),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0.8f64..1500f64).log_scale(), 0.0..high * 1.2)?;
        chart
            .configure_mesh()
            .x_desc("cgroups (log)")
            .y_desc("MiB")
            .draw()?;
        let mut policies: Vec<usize> = rows.iter().map(|row| row.policies).collect();
        policies.dedup();
        for (index, count) in policies.iter().enumerate() {
            for (kind, pick, dashed) in [
                (
                    "RSS",
                    (|row: &palisade_benchmarks::kernel::Footprint| row.rss_bytes) as fn(&_) -> u64,
                    false,
                ),
                (
                    "BPF maps",
                    |row: &palisade_benchmarks::kernel::Footprint| row.map_bytes,
                    true,
                ),
            ] {
                let color = PALETTE[(index * 2 + usize::from(dashed)) % PALETTE.len()];
                let points: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|row| row.policies == *count)
                    .map(|row| (row.cgroups as f64, pick(row) as f64 / MIB))
                    .collect();
                chart.draw_series(
                    points
                        .iter()
                        .map(|point| Circle::new(*point, 4, color.filled())),
                )?;
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                    .label(format!("{kind}, {count} policies"))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// Events written and dropped per second against the offered rate.
fn plot_throughput(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    for (panel, kernel) in panels(path, kernels, 480)?.iter().zip(kernels) {
        let rows = &kernel.run.throughput;
        let labels: Vec<String> = rows
            .iter()
            .map(|row| rate_label(row.offered_per_second))
            .collect();
        let per_second = |count: u64, seconds: f64| count as f64 / seconds;
        let high = rows
            .iter()
            .map(|row| per_second(row.produced, row.seconds))
            .fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Linux {}: audit events per second by offered violations ({})",
                    kernel.label,
                    kernel.clock_note()
                ),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0..rows.len()).into_segmented(), 0.0..high * 1.1)?;
        chart
            .configure_mesh()
            .x_labels(rows.len())
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(index) => labels.get(*index).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc("offered violations per second")
            .y_desc("per second")
            .draw()?;
        for (index, (name, pick)) in [
            (
                "produced",
                (|row: &palisade_benchmarks::kernel::ThroughputSample| row.produced)
                    as fn(&_) -> u64,
            ),
            (
                "written",
                |row: &palisade_benchmarks::kernel::ThroughputSample| row.written,
            ),
            (
                "dropped",
                |row: &palisade_benchmarks::kernel::ThroughputSample| row.dropped,
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let color = PALETTE[index];
            let points: Vec<(SegmentValue<usize>, f64)> = rows
                .iter()
                .enumerate()
                .map(|(at, row)| {
                    (
                        SegmentValue::CenterOf(at),
                        per_second(pick(row), row.seconds),
                    )
                })
                .collect();
            chart.draw_series(
                points
                    .iter()
                    .map(|point| Circle::new(point.clone(), 4, color.filled())),
            )?;
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// The distribution of apply latencies: share of trials done by each time.
fn plot_latency(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    for (panel, kernel) in panels(path, kernels, 420)?.iter().zip(kernels) {
        let (enforce, lift) = latencies(kernel);
        let high = enforce.iter().chain(&lift).copied().fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Linux {}: policy file change to the kernel's answer ({})",
                    kernel.label,
                    kernel.clock_note()
                ),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..high * 1.05, 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("milliseconds")
            .y_desc("share of trials")
            .draw()?;
        for (index, (name, values)) in [("enforce", &enforce), ("lift", &lift)]
            .into_iter()
            .enumerate()
        {
            let color = PALETTE[index];
            let points: Vec<(f64, f64)> = values
                .iter()
                .enumerate()
                .map(|(at, value)| (*value, (at + 1) as f64 / values.len() as f64))
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}
