//! Rule modules: what deciding one audit event costs natively, in a Rust module (a component)
//! and in a Rego module (OPA Wasm), in batches of 1 and 64 events, with an instance kept from
//! call to call as the agent keeps it (and, for comparison, a fresh one); and what loading a
//! policy with a module costs (compiling the module, from the compiled-module cache, already
//! loaded).
//! Every figure is measured in this one run, so ratios hold on a noisy machine.
//!
//! `cargo run --release -p palisade-benchmarks --bin rule-modules` writes
//! benchmarks/results/rule-modules.{json,md,png}.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use palisade_agent::rules::{Context, Event, LoadedModule, RuleHost};
use palisade_benchmarks::{register_font, workspace};
use palisade_rule_sdk::JsonEvent;
use plotters::prelude::*;

const REPETITIONS: usize = 300;
const BATCHES: [usize; 2] = [1, 64];

/// Median and 90th percentile of `samples`.
fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 9 / 10])
}

fn event(index: usize) -> serde_json::Value {
    serde_json::json!({
        "time": "2026-11-22T06:00:00Z", "node": "bench", "hook": "socket_connect",
        "action": "deny", "policy": "app", "rule": "module/rule", "pid": 1000 + index,
        "uid": index % 2, "comm": "curl", "path": "/srv/secrets/token", "permissions": ["read"],
        "socket": {"family": 2, "protocol": 6, "address": "169.254.169.254", "port": 80},
    })
}

/// Time per event of `decide` on `events` (one batch), over REPETITIONS batches.
fn per_event<E>(events: &[E], mut decide: impl FnMut(&[E])) -> (Duration, Duration) {
    // Warm up.
    for _ in 0..10 {
        decide(events);
    }
    let samples = (0..REPETITIONS)
        .map(|_| {
            let started = Instant::now();
            decide(events);
            started.elapsed() / events.len() as u32
        })
        .collect();
    summary(samples)
}

/// Decides with an instance kept from call to call, as the agent's event worker does.
fn wasm_decide(module: &LoadedModule, config: &str) -> impl FnMut(&[Event]) {
    let mut instance = module.instantiate().expect("instantiates");
    move |events: &[Event]| {
        let verdicts = instance.decide(config, events).expect("decides");
        assert_eq!(verdicts.len(), events.len());
    }
}

struct Row {
    what: String,
    median: Duration,
    p90: Duration,
}

fn main() -> anyhow::Result<()> {
    let out = workspace().join("benchmarks/results");
    let scratch = std::env::temp_dir().join(format!("palisade-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let built = |name: &str, dir: &str| -> anyhow::Result<(PathBuf, String)> {
        let path = scratch.join(format!("{name}.wasm"));
        let digest = palisade_agent::rules::build(&workspace().join(dir), &path)?;
        Ok((path, digest))
    };
    let (rust_path, rust_digest) = built("protect-files", "rules/examples/protect-files")?;
    let (rego_path, rego_digest) = built("egress", "rules/examples/egress")?;
    let host = RuleHost::new(None)?;
    let rust = host.load(&rust_path, &rust_digest)?;
    let rego = host.load(&rego_path, &rego_digest)?;
    let rust_config = r#"{"paths": ["/srv/secrets/**"], "quiet": ["backup"]}"#;
    let rego_config = r#"{"addresses": ["169.254.169.254"], "quiet": ["backup"]}"#;

    let mut rows = Vec::new();
    let mut row =
        |what: String, (median, p90): (Duration, Duration)| rows.push(Row { what, median, p90 });
    for batch in BATCHES {
        // Converted from the agent's JSON form before the time measured.
        let json_events: Vec<JsonEvent> = (0..batch).map(|i| JsonEvent::new(event(i))).collect();
        let events: Vec<Event> = json_events.iter().map(JsonEvent::event).collect();
        let native_config: palisade_rule_protect_files::Config = serde_json::from_str(rust_config)?;
        let native = per_event(&events, |events| {
            for event in events {
                std::hint::black_box(
                    <palisade_rule_protect_files::ProtectFiles as palisade_rule_sdk::Rule>::decide(
                        &native_config,
                        event,
                    ),
                );
            }
        });
        row(format!("native Rust, batch {batch}"), native);
        row(
            format!("Rust module (Wasm component), batch {batch}"),
            per_event(&events, wasm_decide(&rust, rust_config)),
        );
        row(
            format!("Rego module (OPA Wasm), batch {batch}"),
            per_event(&events, wasm_decide(&rego, rego_config)),
        );
    }
    // What a module that failed costs on its next batch: a fresh instance.
    row(
        "Rust module, a fresh instance for the call, batch 1".to_owned(),
        per_event(&[JsonEvent::new(event(0)).event()], |events| {
            let verdicts = rust.decide(rust_config, events).expect("decides");
            assert_eq!(verdicts.len(), events.len());
        }),
    );

    // Loading: compiling a module, from the on-disk cache, or already in memory.
    let context = Context {
        policy: "bench".to_owned(),
        node: "bench".to_owned(),
        kube_apiserver: Vec::new(),
    };
    let cache = scratch.join("cache");
    let reload = |what: &str, fresh_cache: bool, reuse: Option<&RuleHost>| -> anyhow::Result<Row> {
        let samples = (0..20)
            .map(|_| {
                if fresh_cache {
                    let _ = std::fs::remove_dir_all(&cache);
                }
                let started = Instant::now();
                let owned;
                let host = match reuse {
                    Some(host) => host,
                    None => {
                        owned = RuleHost::new(Some(cache.clone())).expect("a runtime");
                        &owned
                    }
                };
                let module = host.load(&rust_path, &rust_digest).expect("loads");
                module.compile(rust_config, &context).expect("compiles");
                started.elapsed()
            })
            .collect();
        let (median, p90) = summary(samples);
        Ok(Row {
            what: what.to_owned(),
            median,
            p90,
        })
    };
    rows.push(reload("reload: module compiled (no cache)", true, None)?);
    rows.push(reload(
        "reload: module from the compiled-module cache",
        false,
        None,
    )?);
    rows.push(reload(
        "reload: module already loaded (config change)",
        false,
        Some(&host),
    )?);

    write_results(&out, &rows)?;
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}

fn write_results(out: &Path, rows: &[Row]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "measure": row.what,
                "median_ns": row.median.as_nanos() as u64,
                "p90_ns": row.p90.as_nanos() as u64,
            })
        })
        .collect();
    std::fs::write(
        out.join("rule-modules.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let mut table = String::from(
        "| measure | median | p90 | events per second (median) |\n|---|---:|---:|---:|\n",
    );
    for row in rows {
        let throughput = if row.what.starts_with("reload") {
            "-".to_owned()
        } else {
            format!("{:.0}", 1.0 / row.median.as_secs_f64())
        };
        table += &format!(
            "| {} | {:.2?} | {:.2?} | {throughput} |\n",
            row.what, row.median, row.p90
        );
    }
    std::fs::write(out.join("rule-modules.md"), table)?;
    plot(&out.join("rule-modules.png"), &rows[..rows.len() - 3])?;
    Ok(())
}

/// A bar chart of decide time per event (median), log scale.
fn plot(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = rows
        .iter()
        .map(|row| row.median.as_nanos() as f64)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Deciding one audit event (median ns, log scale)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(
            (1.0..max * 3.0).log_scale(),
            (0..rows.len()).into_segmented(),
        )?;
    chart
        .configure_mesh()
        .y_labels(rows.len())
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(index) => rows
                .get(*index)
                .map(|row| row.what.clone())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("ns per event")
        .draw()?;
    chart.draw_series(
        Histogram::horizontal(&chart)
            .margin(12)
            .baseline(1.0)
            .style(BLUE.mix(0.6).filled())
            .data(
                rows.iter()
                    .enumerate()
                    .map(|(index, row)| (index, row.median.as_nanos().max(1) as f64)),
            ),
    )?;
    root.present()?;
    Ok(())
}
