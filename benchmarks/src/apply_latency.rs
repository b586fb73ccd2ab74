//! Apply-to-enforce latency in Kubernetes: from the moment a PalisadePolicy update is sent to the
//! API server to the first read a process in the selected pod gets EPERM for (and the same for
//! the policy's creation, which the updates follow), and the agent's
//! share of it (from the watch event to the map entries committed), measured by the VM suite's
//! end-to-end test (tests/kernel/tests/enforcement/kubernetes.rs: the agent in the VM,
//! the API server on the host, a reader looping in the pod's cgroup) on each kernel.
//!
//! `cargo xtask vm-test --filter kubernetes` saves the samples in target/vm/results;
//! `cargo run --release -p palisade-benchmarks --bin apply-latency` then writes
//! benchmarks/results/apply-latency.{json,md,png}.

use std::path::Path;

use anyhow::Context;

use palisade_benchmarks::{register_font, workspace};
use plotters::prelude::*;

struct Kernel {
    name: String,
    /// Milliseconds, sorted: the updates.
    samples: Vec<f64>,
    /// Milliseconds from the policy's creation to its enforcement.
    created_ms: f64,
    /// The agent's share on average: from the watch event to the map entries committed.
    in_agent_mean_ms: f64,
}

impl Kernel {
    fn quantile(&self, q: f64) -> f64 {
        self.samples[((self.samples.len() - 1) as f64 * q).round() as usize]
    }
}

fn main() -> anyhow::Result<()> {
    let measured = workspace().join("target/vm/results");
    let mut kernels = Vec::new();
    for entry in std::fs::read_dir(&measured)? {
        let path = entry?.path();
        if !path.to_string_lossy().ends_with("-apply-latency.json") {
            continue;
        }
        let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let mut samples: Vec<f64> = result["apply_to_enforce_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        anyhow::ensure!(!samples.is_empty(), "{}: no samples", path.display());
        samples.sort_by(f64::total_cmp);
        kernels.push(Kernel {
            name: result["kernel"].as_str().unwrap_or("?").to_owned(),
            samples,
            created_ms: result["create_to_enforce_ms"]
                .as_f64()
                .with_context(|| format!("{}: no create_to_enforce_ms", path.display()))?,
            in_agent_mean_ms: result["in_agent_mean_ms"]
                .as_f64()
                .with_context(|| format!("{}: no in_agent_mean_ms", path.display()))?,
        });
    }
    anyhow::ensure!(
        !kernels.is_empty(),
        "no samples in {}: run `cargo xtask vm-test --filter kubernetes` first",
        measured.display()
    );
    kernels.sort_by(|a, b| a.name.cmp(&b.name));
    let out = workspace().join("benchmarks/results");
    std::fs::create_dir_all(&out)?;
    let json: Vec<serde_json::Value> = kernels
        .iter()
        .map(|kernel| {
            serde_json::json!({
                "kernel": kernel.name,
                "samples_ms": kernel.samples,
                "median_ms": kernel.quantile(0.5),
                "p90_ms": kernel.quantile(0.9),
                "p99_ms": kernel.quantile(0.99),
                "created_ms": kernel.created_ms,
                "in_agent_mean_ms": kernel.in_agent_mean_ms,
            })
        })
        .collect();
    std::fs::write(
        out.join("apply-latency.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let mut table = String::from(
        "| kernel | updates | min | median | p90 | p99 | max | creation | in the agent (mean) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for kernel in &kernels {
        table += &format!(
            "| {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.1} ms |\n",
            kernel.name,
            kernel.samples.len(),
            kernel.samples[0],
            kernel.quantile(0.5),
            kernel.quantile(0.9),
            kernel.quantile(0.99),
            kernel.samples[kernel.samples.len() - 1],
            kernel.created_ms,
            kernel.in_agent_mean_ms,
        );
    }
    std::fs::write(out.join("apply-latency.md"), table)?;
    plot(&out.join("apply-latency.png"), &kernels)
}

/// Every sample, one row per kernel, with the median marked.
fn plot(path: &Path, kernels: &[Kernel]) -> anyhow::Result<()> {
    register_font()?;
    let root =
        BitMapBackend::new(path, (1000, 120 + 90 * kernels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = kernels
        .iter()
        .flat_map(|kernel| kernel.samples.iter().copied())
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "PalisadePolicy update to the first EPERM in the pod (ms, QEMU TCG)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(180)
        .build_cartesian_2d(0.0..max * 1.1, (0..kernels.len()).into_segmented())?;
    chart
        .configure_mesh()
        .y_labels(kernels.len())
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(index) => kernels
                .get(*index)
                .map(|kernel| format!("Linux {}", kernel.name))
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("milliseconds")
        .draw()?;
    for (index, kernel) in kernels.iter().enumerate() {
        chart.draw_series(kernel.samples.iter().map(|&sample| {
            Circle::new(
                (sample, SegmentValue::CenterOf(index)),
                5,
                BLUE.mix(0.6).filled(),
            )
        }))?;
        let median = kernel.quantile(0.5);
        chart.draw_series(std::iter::once(Cross::new(
            (median, SegmentValue::CenterOf(index)),
            9,
            RED.stroke_width(3),
        )))?;
    }
    root.present()?;
    Ok(())
}
