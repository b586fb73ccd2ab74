//! `cargo xtask bench`: the kernel benchmarks (benchmarks/src/kernel_bench) inside the VM on each
//! kernel, the guest clock counting executed instructions, then their report
//! (benchmarks/src/kernel_report.rs).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, ensure};

use crate::{build, kernels, results, vm};

/// The workloads' programs, from Debian's packages (`scripts/install.sh --bench` installs them).
const WORKLOADS: &[(&str, &str)] = &[
    ("redis-server", "/usr/bin/redis-server"),
    ("redis-benchmark", "/usr/bin/redis-benchmark"),
    ("nginx", "/usr/sbin/nginx"),
    ("wrk", "/usr/bin/wrk"),
    ("sysbench", "/usr/bin/sysbench"),
];

/// `-icount shift=0`: the guest clock advances one nanosecond per executed instruction, so
/// guest timings are deterministic instruction counts; `sleep=off`: an idle guest's clock
/// jumps to its next timer.
const ICOUNT: &[&str] = &["-icount", "shift=0,sleep=off"];

pub fn bench(kernels: &[String], smoke: bool, release: bool) -> anyhow::Result<()> {
    let mode = if smoke { "--smoke" } else { "" };
    let timeout = Duration::from_secs(if smoke { 30 * 60 } else { 6 * 60 * 60 });
    let inputs = run_in_vm(
        kernels,
        release,
        "kernel-bench",
        &format!("run {mode}"),
        timeout,
    )?;
    let out = if smoke {
        vm::work_dir("bench-smoke")?
    } else {
        crate::workspace().join("benchmarks/results")
    };
    report("kernel-report", &inputs, &out, release)
}

/// The soak (`kernel-bench soak`) for `minutes` of guest time on each kernel, the agent built
/// optimised; its report goes to benchmarks/results.
pub fn soak(kernels: &[String], minutes: u64) -> anyhow::Result<()> {
    // The guest clock runs slower than the host's under emulation: a generous limit.
    let timeout = Duration::from_secs(minutes * 5 * 60 + 30 * 60);
    let inputs = run_in_vm(kernels, true, "soak", &format!("soak {minutes}"), timeout)?;
    report(
        "soak-report",
        &inputs,
        &crate::workspace().join("benchmarks/results"),
        true,
    )
}

/// Boots each kernel with the agent, `kernel-bench` and the workloads, runs `kernel-bench
/// COMMAND --clock icount OUT.json` and returns the JSON files it reported (as `name`).
fn run_in_vm(
    kernels: &[String],
    release: bool,
    name: &str,
    command: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<PathBuf>> {
    if WORKLOADS.iter().any(|(_, path)| !Path::new(path).exists()) {
        let install = crate::workspace().join("scripts/install.sh");
        let status = Command::new(&install).arg("--bench").status()?;
        ensure!(status.success(), "{} --bench failed", install.display());
    }
    let (palisade, kernel_bench) = build::bench_binaries(release)?;
    let dir = vm::work_dir("bench")?;
    let mut binaries = vec![
        ("palisade", palisade.as_path()),
        ("kernel-bench", kernel_bench.as_path()),
    ];
    binaries.extend(
        WORKLOADS
            .iter()
            .map(|(name, path)| (*name, Path::new(path))),
    );
    let mut files = build::rule_modules(&palisade, &dir)?;
    // nginx looks its user up even when it stays root.
    for (name, text) in [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("group", "root:x:0:\nnogroup:x:65534:\n"),
    ] {
        std::fs::write(dir.join(name), text)?;
        files.push((dir.join(name), format!("/etc/{name}")));
    }
    let body = format!(
        "PALISADE_BIN=/palisade/bin/palisade PALISADE_RULES=/palisade/rules RUST_BACKTRACE=1 \
         kernel-bench {command} --clock icount /tmp/{name}.json && \
         echo \"{} {name} $(cat /tmp/{name}.json)\"",
        vm::RESULT
    );
    let initrd = build::initramfs(&dir, &binaries, &files, &vm::init_script(&body))?;
    let measured = vm::work_dir("results")?;
    let kernels: Vec<(&String, kernels::Kernel)> = kernels
        .iter()
        .map(|series| Ok((series, kernels::fetch(series)?)))
        .collect::<anyhow::Result<_>>()?;
    // The kernels boot side by side, one on each core: the guest clock counts instructions,
    // so neither run's measurements depend on the other.
    std::thread::scope(|scope| {
        let runs: Vec<_> = kernels
            .iter()
            .map(|(series, kernel)| {
                let (initrd, measured) = (&initrd, &measured);
                scope.spawn(move || -> anyhow::Result<PathBuf> {
                    let label = format!("linux-{series}");
                    let vm::Boot { console, status } = vm::boot(
                        &label,
                        &kernel.vmlinuz,
                        initrd,
                        &[&["-nic", "none"], ICOUNT].concat(),
                        timeout,
                    )?;
                    let status = status?;
                    ensure!(
                        status == 0,
                        "[{label}] kernel-bench {command} failed (status {status})"
                    );
                    let input = measured.join(format!("{label}-{name}.json"));
                    let _ = std::fs::remove_file(&input);
                    results::save_measurements(&console, vm::RESULT, measured, &label)?;
                    ensure!(
                        input.exists(),
                        "[{label}] kernel-bench {command} reported no results"
                    );
                    Ok(input)
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a kernel's run panicked"))
            .collect()
    })
}

/// Runs the report `bin` on `inputs`, writing into `out`.
fn report(bin: &str, inputs: &[PathBuf], out: &Path, release: bool) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["run", "--package", "palisade-benchmarks", "--bin", bin]);
    if release {
        command.arg("--release");
    }
    let status = command
        .arg("--")
        .arg("--out")
        .arg(out)
        .args(inputs)
        .status()
        .context("running cargo")?;
    ensure!(status.success(), "{bin} failed");
    println!("{bin}: {}", out.display());
    Ok(())
}
