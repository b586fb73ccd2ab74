//! The event pipeline in user space: what the agent's event worker spends on each audit event,
//! by stage, on batches of denials as the kernel submits them under a flood. Naming (the
//! decoder), deciding (one Rust rule module, its instance kept as the agent keeps it) and
//! writing (JSON lines to a rotated file). The kernel's share (the ring buffer, the write
//! system call) is in kernel.md's event-throughput table, measured in the VM.
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
const DENIED: &str = "/srv/secrets/token";

/// A denied open of DENIED, as the kernel reports it.
fn kernel_event(index: usize, rule_id: u32) -> Event {
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
    event.path[..DENIED.len()].copy_from_slice(DENIED.as_bytes());
    event
}

/// Median time per event of each stage, and of all three.
struct Stages {
    decode: Duration,
    decide: Duration,
    write: Duration,
    total: Duration,
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let out = workspace().join("benchmarks/results");
    let scratch = std::env::temp_dir().join(format!("palisade-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let module = scratch.join("protect-files.wasm");
    let digest =
        palisade_agent::rules::build(&workspace().join("rules/examples/protect-files"), &module)?;
    let policy = scratch.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: pipeline\n\
             spec:\n  target:\n    cgroupPath: /bench\n  mode: EnhanceProtect\n  enhanceProtect:\n    \
             auditViolations: true\n  ruleModules:\n    - name: protect-files\n      \
             module: protect-files.wasm\n      sha256: {digest}\n      config: {{paths: [{DENIED}]}}\n"
        ),
    )?;
    let host = RuleHost::new(None)?;
    let (_, compiled) = palisade_agent::cmd::policy::load_and_compile(&host, &policy)?;
    let rule_id = (1..=compiled.rules.len() as u32)
        .find(|&id| compiled.rule_name(id) == Some("protect-files/protected-files"))
        .ok_or_else(|| anyhow::anyhow!("the module's rule is not in the policy"))?;
    let registry = PolicyRegistry::default();
    registry.insert(
        POLICY_ID,
        Arc::new(InstalledPolicy {
            policy: Arc::new(compiled),
            target: Cgroup {
                path: "/sys/fs/cgroup/bench".into(),
                id: 4242,
                level: 1,
            },
        }),
    );
    let decoder = Decoder::new(registry, PodRegistry::default());
    let mut deciding = Deciding::new(host, RuleModuleMetrics::default(), "/sys/fs/cgroup".into());
    let rotation = Rotation {
        max_bytes: 64 << 20,
        keep: 1,
    };
    let file = RotatingFile::open(&scratch.join("events.jsonl"), rotation)?;
    let mut sink = JsonLines::new("file", Box::new(file));
    let batch: Vec<Event> = (0..BATCH).map(|i| kernel_event(i, rule_id)).collect();

    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    // As the event worker keeps it.
    let mut decoded: Vec<Decoded> = Vec::with_capacity(BATCH);
    for round in 0..BATCHES + 5 {
        let started = Instant::now();
        decoded.extend(batch.iter().map(|event| decoder.decode(event)));
        let named = Instant::now();
        let failures = deciding.apply(&mut decoded);
        let kept = decoded.iter().filter(|decoded| decoded.keep).count();
        anyhow::ensure!(
            kept == BATCH && failures.is_empty(),
            "the module kept {kept} of {BATCH} events, failures: {failures:?}"
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
    let stages = Stages {
        decode: median(decode),
        decide: median(decide),
        write: median(write),
        total: median(total),
    };
    write_results(&out, &stages)?;
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}

fn write_results(out: &Path, stages: &Stages) -> anyhow::Result<()> {
    let rows = [
        ("decode: name the policy, rule and target", stages.decode),
        (
            "decide: the Rust rule module's verdicts, applied",
            stages.decide,
        ),
        (
            "write: JSON lines to the rotated file, the batch freed",
            stages.write,
        ),
        ("total", stages.total),
    ];
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|(stage, time)| serde_json::json!({"stage": stage, "median_ns": time.as_nanos() as u64}))
        .collect();
    std::fs::write(
        out.join("event-pipeline.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let mut table = format!(
        "# Event pipeline, per event\n\nThe event worker's stages on batches of {BATCH} denials \
         (median of {BATCHES} batches, on this machine, natively): `cargo run --release -p \
         palisade-benchmarks --bin event-pipeline`.\n\n| stage | ns per event |\n|---|---:|\n"
    );
    for (stage, time) in rows {
        table.push_str(&format!("| {stage} | {} |\n", time.as_nanos()));
    }
    std::fs::write(out.join("event-pipeline.md"), &table)?;
    print!("{table}");
    Ok(())
}
