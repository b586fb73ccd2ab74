//! The event pipeline in user space: what the agent's event worker spends on each audit event,
//! by stage, on batches of denials as the kernel submits them under a flood. Naming (the
//! decoder), deciding (one Rust rule module, its instance kept as the agent keeps it) and
//! writing (JSON lines to a rotated file); with the example module that rates, tags and
//! annotates every event, and with one that keeps them unchanged (the pipeline's own cost). The
//! kernel's share (the ring buffer, the write system call) is in kernel.md's event-throughput
//! table, measured in the VM.
//! Every figure is measured in this one run, so ratios hold on a noisy machine.
//!
//! `cargo run --release -p palisade-benchmarks --bin event-pipeline` writes
//! benchmarks/results/event-pipeline.{json,md}.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use palisade_agent::{
    bpf::{InstalledPolicy, PolicyRegistry},
    events::{Deciding, Decoded, Decoder, JsonLines, RotatingFile, Rotation, Sink},
    metrics::RuleModuleMetrics,
    rules::RuleHost,
    targets::{Cgroup, PodRegistry},
};
use palisade_benchmarks::workspace;
use palisade_common::Event;

/// Events per batch: the worker's batch under a flood.
const BATCH: usize = 1024;
const BATCHES: usize = 60;
const POLICY_ID: u32 = 7;

/// A module deciding the denials of a file its configuration protects.
struct Setup {
    what: &'static str,
    /// Its crate, in the workspace.
    module: &'static str,
    name: &'static str,
    /// Its `config` in a policy (YAML).
    config: &'static str,
    /// The rule of it that denies `path`.
    rule: &'static str,
    path: &'static str,
}

const SETUPS: [Setup; 2] = [
    Setup {
        what: "protect-files (rates, tags, annotates)",
        module: "rules/examples/protect-files",
        name: "protect-files",
        config: "{paths: [/srv/secrets/token]}",
        rule: "protect-files/protected-files",
        path: "/srv/secrets/token",
    },
    Setup {
        what: "file-protection (keeps events unchanged)",
        module: "rules/file-protection",
        name: "file-protection",
        config: "{rules: [disable-access-shadow]}",
        rule: "file-protection/disable-access-shadow",
        path: "/etc/shadow",
    },
];

/// A denied open of `path`, as the kernel reports it.
fn kernel_event(index: usize, rule_id: u32, path: &str) -> Event {
    let mut event = Event {
        hook: palisade_common::HOOK_FILE_OPEN,
        action: palisade_common::ACTION_DENY,
        policy_id: POLICY_ID,
        rule_id,
        error: -libc::EPERM,
        perms: palisade_common::PERM_READ,
        pid: 1000 + index as u32,
        tid: 1000 + index as u32,
        uid: 1000,
        cgroup_id: 4242,
        target_cgroup_id: 4242,
        time_ns: 1_000_000_000 + index as u64,
        ino: 77,
        dev: 8 << 20 | 1,
        ..Event::default()
    };
    event.comm[..3].copy_from_slice(b"cat");
    event.path[..path.len()].copy_from_slice(path.as_bytes());
    event
}

/// The stages measured, and their sum.
const STAGES: [&str; 4] = [
    "decode: name the policy, rule and target",
    "decide: the module's verdicts, applied",
    "write: JSON lines to the rotated file, the batch freed",
    "total",
];

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let out = workspace().join("benchmarks/results");
    let scratch = std::env::temp_dir().join(format!("palisade-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let measured = SETUPS
        .iter()
        .map(|setup| Ok((setup.what, measure(setup, &scratch)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    write_results(&out, &measured)?;
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}

/// The median time per event of each of STAGES with `setup`'s module deciding.
fn measure(setup: &Setup, scratch: &Path) -> anyhow::Result<[Duration; 4]> {
    let module = scratch.join(format!("{}.wasm", setup.name));
    let digest = palisade_agent::rules::build(&workspace().join(setup.module), &module)?;
    let policy = scratch.join(format!("{}.yaml", setup.name));
    std::fs::write(
        &policy,
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: pipeline\n\
             spec:\n  target:\n    cgroupPath: /bench\n  mode: EnhanceProtect\n  enhanceProtect:\n    \
             auditViolations: true\n  ruleModules:\n    - name: {}\n      module: {}.wasm\n      \
             sha256: {digest}\n      config: {}\n",
            setup.name, setup.name, setup.config
        ),
    )?;
    let host = RuleHost::new(None)?;
    let (_, compiled) = palisade_agent::cmd::policy::load_and_compile(&host, &policy)?;
    let rule_id = (1..=compiled.rules().len() as u32)
        .find(|&id| compiled.rule_name(id) == Some(setup.rule))
        .ok_or_else(|| anyhow::anyhow!("{} is not in the policy", setup.rule))?;
    let registry = PolicyRegistry::default();
    registry.insert(
        POLICY_ID,
        Arc::new(InstalledPolicy::new(
            Arc::new(compiled),
            Cgroup {
                path: "/sys/fs/cgroup/bench".into(),
                id: 4242,
                level: 1,
            },
        )),
    );
    let decoder = Decoder::new(registry, PodRegistry::default());
    let mut deciding = Deciding::new(host, RuleModuleMetrics::default(), "/sys/fs/cgroup".into());
    let rotation = Rotation {
        max_bytes: 64 << 20,
        keep: 1,
    };
    let file = RotatingFile::open(
        &scratch.join(format!("{}.jsonl", setup.name)),
        rotation,
        None,
    )?;
    let mut sink = JsonLines::new("file", Box::new(file));
    let batch: Vec<Event> = (0..BATCH)
        .map(|i| kernel_event(i, rule_id, setup.path))
        .collect();

    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    // As the event worker keeps it.
    let mut decoded: Vec<Decoded> = Vec::with_capacity(BATCH);
    for round in 0..BATCHES + 5 {
        let started = Instant::now();
        decoder.decode(&batch, &mut decoded);
        let named = Instant::now();
        let failures = deciding.apply(&mut decoded);
        let kept = decoded.iter().filter(|decoded| decoded.keep).count();
        anyhow::ensure!(
            kept == BATCH && failures.is_empty(),
            "{}: the module kept {kept} of {BATCH} events, failures: {failures:?}",
            setup.name
        );
        let verdicts = Instant::now();
        for decoded in &decoded {
            sink.send(&decoded.event);
        }
        sink.flush();
        decoded.clear();
        let written = Instant::now();
        anyhow::ensure!(sink.lost() == 0, "the sink lost events");
        // The first rounds warm up caches and the module's memory.
        if round >= 5 {
            for (stage, time) in
                samples
                    .iter_mut()
                    .zip([named - started, verdicts - named, written - verdicts])
            {
                stage.push(time / BATCH as u32);
            }
        }
    }
    let [decode, decide, write] = samples;
    let total = decode
        .iter()
        .zip(&decide)
        .zip(&write)
        .map(|((a, b), c)| *a + *b + *c)
        .collect();
    Ok([median(decode), median(decide), median(write), median(total)])
}

fn write_results(out: &Path, measured: &[(&str, [Duration; 4])]) -> anyhow::Result<()> {
    let json: Vec<serde_json::Value> = measured
        .iter()
        .flat_map(|(module, times)| {
            STAGES.iter().zip(times).map(move |(stage, time)| {
                serde_json::json!({
                    "module": module,
                    "stage": stage,
                    "median_ns": time.as_nanos() as u64,
                })
            })
        })
        .collect();
    std::fs::write(
        out.join("event-pipeline.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let mut table = format!(
        "# Event pipeline, per event\n\nThe event worker's stages on batches of {BATCH} denials \
         (median of {BATCHES} batches, on this machine, natively), ns per event, by the rule module \
         deciding: `cargo run --release -p palisade-benchmarks --bin event-pipeline`.\n\n| stage |"
    );
    for (module, _) in measured {
        table.push_str(&format!(" {module} |"));
    }
    table.push_str("\n|---|");
    table.push_str(&"---:|".repeat(measured.len()));
    table.push('\n');
    for (index, stage) in STAGES.iter().enumerate() {
        table.push_str(&format!("| {stage} |"));
        for (_, times) in measured {
            table.push_str(&format!(" {} |", times[index].as_nanos()));
        }
        table.push('\n');
    }
    std::fs::write(out.join("event-pipeline.md"), &table)?;
    print!("{table}");
    Ok(())
}
