//! The soak: the agent for many minutes under a flood of denials, alternately above and below
//! its sustainable rate, while a policy file is rewritten every few seconds and the rule
//! module's config is swapped; its memory and every term of the event accounting are sampled
//! at the end of each minute (the flood pauses while the minute's events drain).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::ensure;
use palisade_benchmarks::kernel::SoakSample;

use super::{
    micro,
    scaling::{drain, install_protect_files, protect_files_policy},
    states::{enhance_protect, policy_file},
    system::{
        Agent, Cgroups, POLICY_DIR, bench_command, clear_policies, now_ns, output, write_atomically,
    },
};

/// Offered denials per second, in turn, for `CHUNK_SECONDS` each: above and below what the
/// agent writes within `AGENT_CPU_PERCENT`.
const RATES: [u64; 2] = [20_000, 1_000];
/// The agent's CPU limit: on a whole vCPU it writes ~45,000 events a second, faster than the
/// generator can be refused on the same vCPU; within 10% of it, ~10,000 (at ~9,400 guest
/// instructions an event), so that the flood's first rate is above what it sustains.
pub const AGENT_CPU_PERCENT: u64 = 10;
const CHUNK_SECONDS: f64 = 10.0;
/// How often the churning policy file is rewritten, and the module's config swapped.
const POLICY_EVERY: Duration = Duration::from_secs(5);
const SWAP_EVERY: Duration = Duration::from_secs(30);
/// Rotation of the event file: the soak writes gigabytes.
const EVENTS_MAX_BYTES: &str = "16777216";

/// What the churn thread has done.
#[derive(Default)]
struct Churned {
    policy_writes: AtomicU64,
    config_swaps: AtomicU64,
}

/// The module's config, in turn: one keeps the generator's events, one drops them all.
fn module_config(swaps: u64) -> String {
    let quiet = if swaps % 2 == 1 { "kernel-bench" } else { "" };
    format!("{{paths: [{}], quiet: [{quiet}]}}", micro::DENIED)
}

/// Rewrites `churn.yaml` (a policy on a cgroup of its own, with 1 to 8 custom rules) every
/// POLICY_EVERY and swaps the config of the module of `digest` every SWAP_EVERY, until `stop`.
fn churn(churned: &Churned, digest: &str, stop: &AtomicBool) -> anyhow::Result<()> {
    let started = now_ns();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLICY_EVERY);
        let writes = churned.policy_writes.fetch_add(1, Ordering::Relaxed) + 1;
        let spec = enhance_protect(1 + (writes % 8) as usize, "");
        write_atomically(
            &std::path::Path::new(POLICY_DIR).join("churn.yaml"),
            &policy_file("churn", "bench/churn", &spec),
        )?;
        let due = (now_ns() - started) / SWAP_EVERY.as_nanos() as u64;
        if churned.config_swaps.load(Ordering::Relaxed) < due {
            let swaps = churned.config_swaps.fetch_add(1, Ordering::Relaxed) + 1;
            write_atomically(
                &std::path::Path::new(POLICY_DIR).join("soak.yaml"),
                &protect_files_policy("soak", digest, &module_config(swaps)),
            )?;
        }
    }
    Ok(())
}

pub fn soak(minutes: u64, cgroups: &Cgroups) -> anyhow::Result<Vec<SoakSample>> {
    let churn_cgroup = cgroups.hierarchy.create(&cgroups.base, "churn")?;
    let agent = Agent::start(&["--events-max-bytes", EVENTS_MAX_BYTES, "--events-keep", "1"])?;
    agent.limit_cpu(AGENT_CPU_PERCENT)?;
    let digest = install_protect_files()?;
    agent.apply(&[(
        "soak.yaml".to_owned(),
        protect_files_policy("soak", &digest, &module_config(0)),
    )])?;
    let churned = Arc::new(Churned::default());
    let stop = Arc::new(AtomicBool::new(false));
    let churning = {
        let (churned, stop) = (churned.clone(), stop.clone());
        std::thread::spawn(move || churn(&churned, &digest, &stop))
    };
    let mut samples = Vec::new();
    let mut produced = 0;
    let mut chunk = 0;
    for minute in 1..=minutes {
        let end = now_ns() + 60_000_000_000;
        while now_ns() < end {
            let rate = RATES[chunk % RATES.len()];
            chunk += 1;
            let seconds = CHUNK_SECONDS.min((end - now_ns()) as f64 / 1e9);
            let text = output(&mut bench_command(
                &cgroups.target,
                &[
                    "generate",
                    micro::DENIED,
                    &rate.to_string(),
                    &seconds.to_string(),
                ],
            )?)?;
            let refused: u64 = text
                .split_whitespace()
                .nth(1)
                .and_then(|refused| refused.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("unexpected generator output {text:?}"))?;
            produced += refused;
        }
        drain(&agent)?;
        let scrape = agent.scrape()?;
        let count = |name: &str| scrape.sum(name) as u64;
        let sample = SoakSample {
            minute,
            rss_bytes: agent.usage()?.rss_bytes,
            map_bytes: count("palisade_bpf_map_memory_bytes"),
            produced,
            written: count("palisade_events_written_total"),
            module_dropped: scrape.sum_with(
                "palisade_rule_module_verdicts_total",
                &[("verdict", "drop")],
            ) as u64,
            agent_dropped: count("palisade_events_overflowed_total")
                + count("palisade_events_undecodable_total"),
            kernel_dropped: count("palisade_events_dropped_total"),
            throttled: count("palisade_events_throttled_total"),
            queued: count("palisade_events_queued"),
            policy_writes: churned.policy_writes.load(Ordering::Relaxed),
            config_swaps: churned.config_swaps.load(Ordering::Relaxed),
        };
        eprintln!(
            "kernel-bench: soak minute {minute}: {} MiB RSS, {} written of {produced}, unaccounted {}",
            sample.rss_bytes >> 20,
            sample.written,
            sample.unaccounted()
        );
        samples.push(sample);
    }
    stop.store(true, Ordering::Relaxed);
    churning
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))??;
    ensure!(
        agent.scrape()?.sum("palisade_policy_errors") == 0.0,
        "the agent refused a soak policy: {}",
        agent.log()
    );
    clear_policies()?;
    agent.stop()?;
    churn_cgroup.remove()?;
    Ok(samples)
}
