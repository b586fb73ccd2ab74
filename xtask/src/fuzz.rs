//! `cargo xtask fuzz`: a fuzzing campaign. Each target of fuzz/ runs under libFuzzer for a
//! bounded time, from its committed corpus, which is then minimised with what the run found and
//! written back; the run is appended to benchmarks/results/fuzz.json, and fuzz.md is written
//! from all runs so far. A crash, timeout or out-of-memory error stops its target's run: its
//! input is kept in fuzz/regressions/NAME/, which `cargo test` replays.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use serde::{Deserialize, Serialize};

use crate::{cache_dir, run, workspace};

/// libFuzzer's limits: memory of the process, time of one input.
const RSS_LIMIT_MB: u32 = 2048;
const INPUT_TIMEOUT_S: u32 = 10;
/// Beyond its time, what a run may take to start and write its statistics before it is killed.
const GRACE: Duration = Duration::from_secs(120);
/// What minimising a corpus may take.
const MERGE_LIMIT: Duration = Duration::from_secs(30 * 60);
/// A day: the longest run `--minutes` asks for.
const MAX_MINUTES: u64 = 24 * 60;

/// Every run of every campaign: benchmarks/results/fuzz.json.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    runs: Vec<Run>,
    crashes: Vec<Crash>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Run {
    /// When it started (UTC) and at which commit.
    date: String,
    commit: String,
    target: String,
    seconds: u64,
    executions: u64,
    /// libFuzzer's coverage at the end: edges ("cov") and features ("ft").
    edges: u64,
    features: u64,
    /// Inputs in the committed corpus once minimised.
    corpus: usize,
    peak_rss_mb: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Crash {
    date: String,
    target: String,
    /// Its input, under fuzz/regressions.
    reproducer: String,
    /// What libFuzzer reported: the panic or the sanitizer's error.
    what: String,
}

fn fuzz_dir() -> PathBuf {
    workspace().join("fuzz")
}

fn results_dir() -> PathBuf {
    workspace().join("benchmarks/results")
}

/// Every target: a binary of fuzz/fuzz_targets.
fn targets() -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))?
        .map(|entry| {
            let path = entry?.path();
            Ok(path
                .file_stem()
                .context("a file name")?
                .to_string_lossy()
                .into_owned())
        })
        .collect::<anyhow::Result<_>>()?;
    names.sort();
    Ok(names)
}

/// Where `cargo fuzz build` puts its binaries, outside the clone.
fn fuzz_target_dir() -> PathBuf {
    cache_dir().join("fuzz-target")
}

/// A target's libFuzzer binary, as `cargo fuzz build` made it for this host.
fn binary(target: &str) -> anyhow::Result<PathBuf> {
    let rustc = run(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let host = rustc
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .context("rustc -vV names no host")?;
    Ok(fuzz_target_dir().join(host).join("release").join(target))
}

fn now() -> anyhow::Result<String> {
    Ok(
        run(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))?
            .trim()
            .to_owned(),
    )
}

/// The commit fuzzed, "-dirty" when files other than what campaigns write had changes.
fn commit() -> anyhow::Result<String> {
    let head = run(Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(workspace()))?;
    let dirty = !run(Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no", "--", "."])
        .args([
            ":!fuzz/corpus",
            ":!fuzz/regressions",
            ":!benchmarks/results",
        ])
        .current_dir(workspace()))?
    .trim()
    .is_empty();
    Ok(format!(
        "{}{}",
        head.trim(),
        if dirty { "-dirty" } else { "" }
    ))
}

/// Runs `targets` (all when empty) for `minutes` each, `jobs` at a time. Fails when a run
/// failed or found anything, after recording every run.
pub fn campaign(minutes: u64, only: &[String], jobs: usize) -> anyhow::Result<()> {
    // libFuzzer reads -max_total_time as an int, and 0 as no limit at all.
    ensure!(
        (1..=MAX_MINUTES).contains(&minutes),
        "--minutes must be from 1 to {MAX_MINUTES}"
    );
    let all = targets()?;
    let mut chosen: Vec<String> = if only.is_empty() {
        all
    } else {
        for name in only {
            ensure!(
                all.contains(name),
                "no fuzz target {name}: the targets are {all:?}"
            );
        }
        only.to_vec()
    };
    // Each target's runs share directories: never two at once.
    chosen.sort();
    chosen.dedup();
    println!("building the fuzz targets (nightly, with sanitizers)");
    run(Command::new("cargo")
        .args(["+nightly", "fuzz", "build"])
        .current_dir(workspace())
        .env("CARGO_TARGET_DIR", fuzz_target_dir()))
    .context("cargo-fuzz (cargo install cargo-fuzz) and nightly Rust are needed")?;
    let ledger_file = results_dir().join("fuzz.json");
    let mut ledger: Ledger = match std::fs::read_to_string(&ledger_file) {
        Ok(text) => serde_json::from_str(&text).context("benchmarks/results/fuzz.json")?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ledger::default(),
        Err(err) => return Err(err.into()),
    };
    let (date, commit) = (now()?, commit()?);
    let seconds = minutes * 60;
    let mut failures = Vec::new();
    let mut found = 0;
    for batch in chosen.chunks(jobs.max(1)) {
        let outcomes: Vec<(&String, anyhow::Result<Outcome>)> = std::thread::scope(|scope| {
            let running: Vec<_> = batch
                .iter()
                .map(|target| {
                    (
                        target,
                        scope.spawn(|| fuzz_one(target, seconds, &date, &commit)),
                    )
                })
                .collect();
            running
                .into_iter()
                .map(|(target, thread)| (target, thread.join().expect("a fuzzing thread")))
                .collect()
        });
        for (target, outcome) in outcomes {
            let Outcome { run, findings } = match outcome {
                Ok(outcome) => outcome,
                Err(err) => {
                    failures.push(format!("{target}: {err:#}"));
                    continue;
                }
            };
            match run {
                Ok(run) => {
                    println!(
                        "{target}: {} executions in {} s, {} edges, {} features, corpus {}",
                        run.executions, run.seconds, run.edges, run.features, run.corpus
                    );
                    ledger.runs.push(run);
                }
                Err(reason) => failures.push(format!("{target}: {reason}")),
            }
            for crash in &findings {
                println!("{target}: FOUND {} ({})", crash.what, crash.reproducer);
            }
            found += findings.len();
            ledger.crashes.extend(findings);
        }
        // Written after each batch: an interrupted campaign keeps what it ran.
        std::fs::write(&ledger_file, serde_json::to_string_pretty(&ledger)? + "\n")?;
        std::fs::write(results_dir().join("fuzz.md"), report(&ledger))?;
    }
    println!("wrote benchmarks/results/fuzz.json and fuzz.md");
    ensure!(
        failures.is_empty(),
        "runs that failed: {}",
        failures.join("; ")
    );
    ensure!(
        found == 0,
        "{found} finding(s), their inputs in fuzz/regressions: fix them, `cargo test` replays them"
    );
    Ok(())
}

/// What one target's run left: the run (or why it did not run to its end) and what it found.
struct Outcome {
    run: Result<Run, String>,
    findings: Vec<Crash>,
}

/// Runs `command` with its standard error into `log`, killed after `limit`: whether it exited
/// by itself, and successfully.
fn bounded(command: &mut Command, limit: Duration, log: &Path) -> anyhow::Result<Option<bool>> {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status.success()));
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A libFuzzer run of `target`'s binary with the campaign's limits.
fn libfuzzer(target: &str) -> anyhow::Result<Command> {
    let mut command = Command::new(binary(target)?);
    command
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        // As cargo-fuzz runs them: Rust's statics trip ASan's check of C++'s one-definition rule.
        .env("ASAN_OPTIONS", "detect_odr_violation=0");
    if let Some(max_len) = max_len(target) {
        command.arg(format!("-max_len={max_len}"));
    }
    Ok(command)
}

/// Longer inputs than libFuzzer's default 4 KiB, for the targets that need them.
fn max_len(target: &str) -> Option<usize> {
    // A module's answer can be as large as its memory: try long ones too.
    (target == "opa_result").then_some(1 << 20)
}

/// One target for `seconds`: from a copy of its corpus, minimised back into it afterwards.
fn fuzz_one(target: &str, seconds: u64, date: &str, commit: &str) -> anyhow::Result<Outcome> {
    let corpus = fuzz_dir().join("corpus").join(target);
    let work = cache_dir().join("fuzz").join(target);
    let (scratch, minimised, artifacts) = (
        work.join("corpus"),
        work.join("minimised"),
        work.join("artifacts"),
    );
    let _ = std::fs::remove_dir_all(&work);
    for dir in [&scratch, &minimised, &artifacts] {
        std::fs::create_dir_all(dir)?;
    }
    copy_files(&corpus, &scratch)?;
    let log_file = work.join("fuzz.log");
    let started = Instant::now();
    let exited = bounded(
        libfuzzer(target)?
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-print_final_stats=1")
            .arg(&scratch),
        Duration::from_secs(seconds) + GRACE,
        &log_file,
    )?;
    let elapsed = started.elapsed().as_secs();
    let log = String::from_utf8_lossy(&std::fs::read(&log_file)?).into_owned();
    // Kept first, whatever happens next.
    let findings = keep_findings(target, &artifacts, &log, date)?;
    let stats = Stats::parse(&log);
    if exited.is_none() || stats.executions == 0 {
        let why = if exited.is_none() {
            "killed past its time"
        } else {
            "no statistics"
        };
        return Ok(Outcome {
            run: Err(format!("{why}: see {}", log_file.display())),
            findings,
        });
    }
    let merge_log = work.join("merge.log");
    let merged = bounded(
        libfuzzer(target)?
            .arg("-merge=1")
            .arg(&minimised)
            .arg(&scratch),
        MERGE_LIMIT,
        &merge_log,
    )?;
    ensure!(
        merged == Some(true),
        "{target}: minimising its corpus failed: see {}",
        merge_log.display()
    );
    for input in std::fs::read_dir(&corpus)? {
        std::fs::remove_file(input?.path())?;
    }
    let kept = copy_files(&minimised, &corpus)?;
    let run = Run {
        date: date.to_owned(),
        commit: commit.to_owned(),
        target: target.to_owned(),
        seconds: stats.seconds.unwrap_or(elapsed),
        executions: stats.executions,
        edges: stats.edges,
        features: stats.features,
        corpus: kept,
        peak_rss_mb: stats.peak_rss_mb,
    };
    Ok(Outcome {
        run: Ok(run),
        findings,
    })
}

/// Copies the files of `from` into `to`; how many.
fn copy_files(from: &Path, to: &Path) -> anyhow::Result<usize> {
    let mut copied = 0;
    for input in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
        let input = input?.path();
        std::fs::copy(&input, to.join(input.file_name().context("a file name")?))?;
        copied += 1;
    }
    Ok(copied)
}

/// The inputs of the crashes, timeouts, out-of-memory errors and leaks libFuzzer wrote (not its
/// slow units), copied to fuzz/regressions.
fn keep_findings(
    target: &str,
    artifacts: &Path,
    log: &str,
    date: &str,
) -> anyhow::Result<Vec<Crash>> {
    let what = log
        .lines()
        .skip_while(|line| !line.contains("panicked at") && !line.contains("ERROR: "))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let regressions = fuzz_dir().join("regressions").join(target);
    let mut findings = Vec::new();
    for input in std::fs::read_dir(artifacts)? {
        let input = input?.path();
        let name = input
            .file_name()
            .context("a file name")?
            .to_string_lossy()
            .into_owned();
        let Some(kind) = ["crash", "timeout", "oom", "leak"]
            .into_iter()
            .find(|kind| name.starts_with(&format!("{kind}-")))
        else {
            continue;
        };
        std::fs::create_dir_all(&regressions)?;
        std::fs::copy(&input, regressions.join(&name))?;
        findings.push(Crash {
            date: date.to_owned(),
            target: target.to_owned(),
            reproducer: format!("fuzz/regressions/{target}/{name}"),
            what: format!("{kind}: {what}"),
        });
    }
    Ok(findings)
}

/// What libFuzzer printed at the end of a run.
#[derive(Debug, Default, PartialEq)]
struct Stats {
    executions: u64,
    /// From "Done N runs in S second(s)", which a run that crashed does not print.
    seconds: Option<u64>,
    edges: u64,
    features: u64,
    peak_rss_mb: u64,
}

impl Stats {
    fn parse(log: &str) -> Self {
        let mut stats = Self::default();
        let number = |text: &str| text.trim().parse::<u64>().unwrap_or(0);
        for line in log.lines() {
            if let Some((key, value)) = line.strip_prefix("stat::").and_then(|s| s.split_once(':'))
            {
                match key {
                    "number_of_executed_units" => stats.executions = number(value),
                    "peak_rss_mb" => stats.peak_rss_mb = number(value),
                    _ => {}
                }
            } else if let Some(rest) = line.strip_prefix("Done ") {
                stats.seconds = rest.split_whitespace().nth(3).map(number);
            }
            let mut words = line.split_whitespace();
            while let Some(word) = words.next() {
                match word {
                    "cov:" => stats.edges = words.next().map_or(stats.edges, number),
                    "ft:" => stats.features = words.next().map_or(stats.features, number),
                    _ => {}
                }
            }
        }
        stats
    }
}

/// benchmarks/results/fuzz.md: executions per target over all runs, the last run's coverage,
/// the crashes found.
fn report(ledger: &Ledger) -> String {
    let mut by_target: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &ledger.runs {
        by_target.entry(&run.target).or_default().push(run);
    }
    let mut out = format!(
        "# Fuzzing\n\nGenerated by `cargo xtask fuzz` from [fuzz.json](fuzz.json): every run of \
         every campaign. Targets and method: [fuzz/README.md](../../fuzz/README.md). Each run is \
         one libFuzzer process with AddressSanitizer, `-rss_limit_mb={RSS_LIMIT_MB}` and \
         `-timeout={INPUT_TIMEOUT_S}` per input, from the committed corpus, which is minimised \
         afterwards with what the run found. The goal: at least 10 million executions per \
         target over all runs. A commit marked -dirty had uncommitted changes (until 2026-11-29 \
         these included the corpora and results of the campaign's earlier runs).\n\n\
         | Target | Executions, all runs | Runs | Fuzzing time | Last run | Its rate | Edges | \
         Features | Corpus | Peak RSS |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (target, runs) in &by_target {
        let executions: u64 = runs.iter().map(|run| run.executions).sum();
        let seconds: u64 = runs.iter().map(|run| run.seconds).sum();
        let last = runs.last().expect("a run");
        out.push_str(&format!(
            "| {target} | {} | {} | {} min | {} ({}) | {}/s | {} | {} | {} | {} MiB |\n",
            millions(executions),
            runs.len(),
            seconds / 60,
            last.date,
            last.commit,
            last.executions / last.seconds.max(1),
            last.edges,
            last.features,
            last.corpus,
            last.peak_rss_mb
        ));
    }
    out.push_str("\n## Crashes found\n\n");
    if ledger.crashes.is_empty() {
        out.push_str("None.\n");
    } else {
        out.push_str(
            "Each reproducer is replayed by `cargo test` (agent/tests/fuzz_corpora.rs), without \
             instrumentation: a crash fails it until fixed; a timeout, out-of-memory error or \
             sanitizer report is checked by fuzzing it again.\n\n\
             | Found | Target | What | Reproducer |\n\
             |---|---|---|---|\n",
        );
        for crash in &ledger.crashes {
            out.push_str(&format!(
                "| {} | {} | {} | [{}](../../{}) |\n",
                crash.date,
                crash.target,
                crash.what.replace('|', "\\|"),
                crash.reproducer.rsplit('/').next().unwrap_or_default(),
                crash.reproducer
            ));
        }
    }
    out
}

/// 12345678 as "12.3 M".
fn millions(count: u64) -> String {
    format!("{:.1} M", count as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzers_final_statistics() {
        let log = "INFO: Seed: 1\n\
                   #2\tINITED cov: 10 ft: 12 corp: 3/30b exec/s: 0 rss: 40Mb\n\
                   #600515\tREDUCE cov: 6401 ft: 11776 corp: 1871/529Kb lim: 935 exec/s: 6065 rss: 530Mb\n\
                   Done 1000131 runs in 151 second(s)\n\
                   stat::number_of_executed_units: 1000131\n\
                   stat::average_exec_per_sec:     6623\n\
                   stat::peak_rss_mb:              531\n";
        assert_eq!(
            Stats::parse(log),
            Stats {
                executions: 1000131,
                seconds: Some(151),
                edges: 6401,
                features: 11776,
                peak_rss_mb: 531,
            }
        );
    }
}
