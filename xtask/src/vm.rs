//! Booting a Debian kernel under QEMU (software emulation, BPF LSM on) with a test initramfs,
//! streaming its console and reading what ran.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};

use crate::{build, kernels, kube, node, results};

const SENTINEL: &str = "PALISADE-VM-EXIT";
/// Prefixes a measurement the tests left in /tmp/palisade-results (`RESULT NAME JSON`).
pub const RESULT: &str = "PALISADE-RESULT";
/// How long the kernel test suite may take on one kernel.
const TEST_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// The start of every /init: mounts what a node has, then runs `body`, then reports its status.
pub fn init_script(body: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/palisade/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t securityfs securityfs /sys/kernel/security
mkdir -p /sys/fs/cgroup /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
for module in /palisade/modules/$(uname -r)/*.ko; do [ -e "$module" ] && insmod "$module"; done
hostname palisade-vm
echo "palisade-vm: kernel $(uname -r), lsm=$(cat /sys/kernel/security/lsm)"
cd /palisade
{body}
echo "{SENTINEL} $?"
poweroff -f
"#
    )
}

/// Boots `vmlinuz` with `initrd` and QEMU's `options` (network, clock), echoing the console
/// prefixed by `label`. Returns the console and the status the init body reported; fails when
/// the VM runs longer than `timeout`.
pub fn boot(
    label: &str,
    vmlinuz: &Path,
    initrd: &Path,
    options: &[&str],
    timeout: Duration,
) -> anyhow::Result<(String, i32)> {
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-m",
            "2048",
            // One vCPU: under TCG, the kernel's live patching of BPF trampolines (attach and
            // detach, while another vCPU runs the patched function) can oops with "int3"
            // on 6.12, an emulation artefact that real CPUs do not show.
            "-smp",
            "1",
            "-nographic",
            "-no-reboot",
        ])
        .args(options)
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyS0 lsm=lockdown,capability,landlock,bpf quiet loglevel=3 panic=-1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64 (scripts/install.sh installs it)")?;
    let stdout = child.stdout.take().expect("piped");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut console = String::new();
    let mut status = None;
    loop {
        match lines.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                // Measurements can be long lines: the console shows their start.
                let shown: String = line.chars().take(300).collect();
                println!("[{label}] {shown}");
                if let Some(code) = line.trim().strip_prefix(SENTINEL) {
                    status = code.trim().parse().ok();
                }
                console.push_str(line);
                console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() > timeout => {
                let _ = child.kill();
                bail!("[{label}] the VM did not finish within {timeout:?}");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    child.wait()?;
    let status = status.with_context(|| {
        format!("[{label}] the VM stopped without reporting ({SENTINEL} missing)")
    })?;
    Ok((console, status))
}

pub fn work_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = crate::workspace().join("target/vm").join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The tests of a test binary that match `filter`.
fn listed(tests: &Path, filter: Option<&str>) -> anyhow::Result<Vec<String>> {
    let list = Command::new(tests).args(["--list"]).args(filter).output()?;
    ensure!(list.status.success(), "listing {} failed", tests.display());
    Ok(results::listed(&String::from_utf8(list.stdout)?))
}

/// A test binary run in a boot of its own on each kernel.
struct Suite {
    /// Appended to the boot's label.
    name: &'static str,
    expected: Vec<String>,
    initrd: PathBuf,
}

/// The kernel suite (tests/kernel/tests/enforcement) and the node suite (tests/kernel/tests/node:
/// containerd and a kubelet in the VM), each in its own boot of each kernel.
pub fn test(kernels: &[String], filter: Option<&str>, apply_updates: usize) -> anyhow::Result<()> {
    let binaries = build::binaries()?;
    let kernel_tests = listed(&binaries.kernel_tests, filter)?;
    let node_tests = listed(&binaries.node_tests, filter)?;
    ensure!(
        !kernel_tests.is_empty() || !node_tests.is_empty(),
        "no kernel test matches the filter"
    );
    // The Kubernetes tests' API server, on loopback here; the VM reaches it at VM_ADDRESS
    // through QEMU's guestfwd relay (restrict=on: no other packet leaves the VM).
    let server = kube::ApiServer::start(&work_dir("kube")?)?;
    // The release whose RBAC the kernel suite's agents run with (they start in the VM as the
    // tests say); its DaemonSet runs on no node: the node suite installs a release of its own.
    server.install_chart(
        &crate::workspace().join("charts/palisade"),
        &["--set", "nodeSelector.palisade\\.test/agents=none"],
    )?;
    let nic = format!(
        "user,model=e1000,restrict=on,guestfwd=tcp:{}:{}-cmd:/bin/busybox nc 127.0.0.1 {}",
        kube::VM_ADDRESS,
        kube::VM_PORT,
        server.port
    );
    let kernels: Vec<(&String, kernels::Kernel)> = kernels
        .iter()
        .map(|series| Ok((series, kernels::fetch(series)?)))
        .collect::<anyhow::Result<_>>()?;
    // Numbered: /init loads them in the order of their names.
    let modules: Vec<(PathBuf, String)> = kernels
        .iter()
        .flat_map(|(_, kernel)| {
            kernel.modules.iter().enumerate().map(|(index, module)| {
                let name = module.file_name().expect("a file").to_string_lossy();
                (
                    module.clone(),
                    format!("/palisade/modules/{}/{index:02}-{name}", kernel.release),
                )
            })
        })
        .collect();
    let mut kube_files = Vec::new();
    for user in ["admin", "agent", "node"] {
        kube_files.extend(server.vm_files(user, Path::new("/palisade/kube"))?);
    }
    let network = "ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && sleep 3";
    let mut suites = Vec::new();
    if !kernel_tests.is_empty() {
        let dir = work_dir("test")?;
        let mut files = build::rule_modules(&binaries.palisade, &dir)?;
        files.extend(kube_files.iter().cloned());
        files.extend(modules.iter().cloned());
        let body = format!(
            "{network}\n\
             palisade doctor\nPALISADE_BIN=/palisade/bin/palisade PALISADE_PROBE=/palisade/bin/probe \
             PALISADE_RULES=/palisade/rules KUBECONFIG=/palisade/kube/admin.kubeconfig \
             PALISADE_AGENT_KUBECONFIG=/palisade/kube/agent.kubeconfig \
             PALISADE_APPLY_UPDATES={apply_updates} RUST_BACKTRACE=1 /palisade/bin/enforcement --test-threads=1 {}\n\
             {}",
            filter.unwrap_or_default(),
            report_results()
        );
        let initrd = build::initramfs(
            &dir,
            &[
                ("palisade", &binaries.palisade),
                ("probe", &binaries.probe),
                ("enforcement", &binaries.kernel_tests),
                ("mkfs.xfs", Path::new("/usr/sbin/mkfs.xfs")),
            ],
            &files,
            &init_script(&body),
        )?;
        suites.push(Suite {
            name: "",
            expected: kernel_tests,
            initrd,
        });
    }
    if !node_tests.is_empty() {
        let dir = work_dir("node")?;
        let node = node::binaries()?;
        let mut files = node::images(&dir)?;
        files.push(node::chart(&dir)?);
        files.extend(kube_files.iter().cloned());
        files.extend(modules.iter().cloned());
        let body = format!(
            "{network}\n\
             ip route add default via 10.0.2.2\n\
             PALISADE_NODE_BIN=/palisade/bin PALISADE_NODE_IMAGES=/palisade/images \
             PALISADE_PAUSE_IMAGE={} PALISADE_BUSYBOX_IMAGE={} PALISADE_CHART=/palisade/chart.tgz \
             KUBECONFIG=/palisade/kube/admin.kubeconfig \
             PALISADE_NODE_KUBECONFIG=/palisade/kube/node.kubeconfig \
             RUST_BACKTRACE=1 /palisade/bin/node --test-threads=1 {}\n\
             {}",
            node::PAUSE_IMAGE,
            node::BUSYBOX_IMAGE,
            filter.unwrap_or_default(),
            report_results()
        );
        let mut executables: Vec<(&str, &Path)> = vec![("node", &binaries.node_tests)];
        executables.extend(node.iter().map(|(name, path)| (*name, path.as_path())));
        let initrd = build::initramfs(&dir, &executables, &files, &init_script(&body))?;
        suites.push(Suite {
            name: "-node",
            expected: node_tests,
            initrd,
        });
    }
    let mut report = Vec::new();
    for (series, kernel) in &kernels {
        for suite in &suites {
            let label = format!("linux-{series}{}", suite.name);
            let (console, status) = match boot(
                &label,
                &kernel.vmlinuz,
                &suite.initrd,
                &["-nic", &nic],
                TEST_TIMEOUT,
            ) {
                Ok(run) => run,
                Err(err) => {
                    eprintln!("{err:#}");
                    (String::new(), -1)
                }
            };
            let summary = results::Summary::new(&suite.expected, &results::parse(&console));
            results::save_measurements(&console, RESULT, &work_dir("results")?, &label)?;
            report.push((label, summary, status));
        }
    }
    let (mut passed, mut failed) = (0, 0);
    println!("\nkernel test suite:");
    for (label, summary, status) in &report {
        println!(
            "  {label}: {} passed, {} failed (test binary exit status {status})",
            summary.passed.len(),
            summary.failures()
        );
        for name in &summary.failed {
            println!("    FAILED       {name}");
        }
        for name in &summary.not_run {
            println!("    DID NOT RUN  {name}");
        }
        passed += summary.passed.len();
        failed += summary.failures() + usize::from(*status != 0 && summary.failures() == 0);
    }
    println!("{passed} passed, {failed} failed");
    ensure!(failed == 0, "the kernel test suite failed");
    Ok(())
}

/// The end of a test boot's body: the measurements the tests left, then the test binary's
/// status as the boot's.
fn report_results() -> String {
    format!(
        "status=$?\n\
         for result in /tmp/palisade-results/*.json; do [ -e \"$result\" ] && echo \"{RESULT} $(basename $result .json) $(cat $result)\"; done\n\
         (exit $status)"
    )
}

pub fn demo(series: &str) -> anyhow::Result<()> {
    let binaries = build::binaries()?;
    let initrd = build::initramfs(
        &work_dir("demo")?,
        &[("palisade", &binaries.palisade)],
        &[],
        &init_script(include_str!("demo.sh")),
    )?;
    let (_, status) = boot(
        &format!("linux-{series}"),
        &kernels::fetch(series)?.vmlinuz,
        &initrd,
        &["-nic", "none"],
        TEST_TIMEOUT,
    )?;
    ensure!(status == 0, "the demo failed (status {status})");
    Ok(())
}
