//! The soak's report: `cargo xtask bench --soak MINUTES` runs `kernel-bench soak` in the VM on
//! each kernel, then this turns its results (one `SoakRun` per kernel) into `soak-<kernel>.json`
//! (the raw data), `soak.md` (a table per kernel, and whether memory stayed flat) and
//! `soak.png` (memory by minute).
//!
//! soak-report [--out DIR] INPUT.json...   (DIR defaults to benchmarks/results)

use std::{fmt::Write as _, path::Path};

use anyhow::Context;
use palisade_benchmarks::{
    kernel::{SoakRun, SoakSample},
    kernel_series, mib, read_json, register_font, report_args,
};
use plotters::prelude::*;

/// One figure of a sample.
type Measure = fn(&SoakSample) -> u64;

/// Memory is flat when the mean of the last 10 minutes is within this of minutes 5 to 10's.
const FLAT: f64 = 0.05;

/// The mean of `measure` over the samples of minutes `first..=last`.
fn mean(samples: &[SoakSample], first: u64, last: u64, measure: Measure) -> f64 {
    let chosen: Vec<f64> = samples
        .iter()
        .filter(|sample| (first..=last).contains(&sample.minute))
        .map(|sample| measure(sample) as f64)
        .collect();
    chosen.iter().sum::<f64>() / chosen.len().max(1) as f64
}

/// Whether `measure` stayed flat: "yes (+1.2%)", or why not.
fn flatness(samples: &[SoakSample], measure: Measure) -> String {
    let minutes = samples.last().map_or(0, |sample| sample.minute);
    if minutes < 20 {
        return format!("not judged: {minutes} minutes (it takes 20)");
    }
    let early = mean(samples, 5, 10, measure);
    let late = mean(samples, minutes - 9, minutes, measure);
    let change = late / early - 1.0;
    let verdict = if change.abs() <= FLAT { "yes" } else { "no" };
    format!(
        "{verdict} ({:.1} MiB in minutes 5-10, {:.1} MiB in the last 10: {:+.1}%)",
        mib(early as u64),
        mib(late as u64),
        change * 100.0
    )
}

fn table(label: &str, run: &SoakRun) -> String {
    let samples = &run.samples;
    let mut md = format!(
        "\n## Linux {label}\n\nThe agent is limited to {}% of a CPU (its cgroup's `cpu.max`).\n\n| minute | agent RSS | BPF maps | produced | written | dropped by the module | dropped in agent | dropped in kernel | throttled | queued | policy writes | config swaps | accounted |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        run.agent_cpu_percent
    );
    for sample in samples {
        let unaccounted = sample.unaccounted();
        let _ = writeln!(
            md,
            "| {} | {:.1} MiB | {:.1} MiB | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sample.minute,
            mib(sample.rss_bytes),
            mib(sample.map_bytes),
            sample.produced,
            sample.written,
            sample.module_dropped,
            sample.agent_dropped,
            sample.kernel_dropped,
            sample.throttled,
            sample.queued,
            sample.policy_writes,
            sample.config_swaps,
            if unaccounted == 0 {
                "yes".to_owned()
            } else {
                format!("no ({unaccounted})")
            }
        );
    }
    let every = samples.iter().all(|sample| sample.unaccounted() == 0);
    let _ = write!(
        md,
        "\nAgent RSS flat: {}. BPF map memory flat: {}. Every event accounted for at every \
         sample: {}.\n",
        flatness(samples, |sample| sample.rss_bytes),
        flatness(samples, |sample| sample.map_bytes),
        if every { "yes" } else { "no" }
    );
    md
}

fn plot(path: &Path, runs: &[(String, SoakRun)]) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let samples = || runs.iter().flat_map(|(_, run)| &run.samples);
    let minutes = samples().map(|sample| sample.minute).max().unwrap_or(1);
    let top = samples()
        .map(|sample| mib(sample.rss_bytes.max(sample.map_bytes)))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("Soak: agent memory by minute (MiB)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..minutes + 1, 0.0..top * 1.2)?;
    chart
        .configure_mesh()
        .x_desc("minute (guest time)")
        .y_desc("MiB")
        .draw()?;
    let measures: [(&str, Measure); 2] = [
        ("agent RSS", |sample| sample.rss_bytes),
        ("BPF maps", |sample| sample.map_bytes),
    ];
    for (index, ((label, run), (what, measure))) in runs
        .iter()
        .flat_map(|run| measures.iter().map(move |measure| (run, measure)))
        .enumerate()
    {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(
                run.samples
                    .iter()
                    .map(|sample| (sample.minute, mib(measure(sample)))),
                color.stroke_width(2),
            ))?
            .label(format!("{what}, Linux {label}"))
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
    root.present()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let (out, args) = report_args("soak-report")?;
    let mut runs = Vec::new();
    for input in &args {
        let run: SoakRun = read_json(input)?;
        runs.push((kernel_series(&run.environment.kernel), run));
    }
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    let mut md = String::from(
        "# Soak\n\nMethod: [README](../README.md), section Soak. Generated by `cargo xtask bench --soak MINUTES`. Counts are totals since the start; each sample is taken once the minute's events are drained. Accounted: produced = written + dropped (by the module, in the agent, in the kernel) + throttled + queued.\n",
    );
    for (label, run) in &runs {
        std::fs::write(
            out.join(format!("soak-{label}.json")),
            serde_json::to_string_pretty(run)? + "\n",
        )?;
        md += &table(label, run);
    }
    std::fs::write(out.join("soak.md"), md)?;
    register_font()?;
    plot(&out.join("soak.png"), &runs)?;
    Ok(())
}
