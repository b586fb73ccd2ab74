//! Booting a Debian kernel under QEMU (software emulation, BPF LSM on) with a test initramfs,
//! streaming its console and reading what ran.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, ensure};

use crate::{build, debian, kernels, kube, node, results};

const SENTINEL: &str = "PALISADE-VM-EXIT";
/// Prefixes a measurement the tests left in /tmp/palisade-results (`RESULT NAME JSON`).
pub const RESULT: &str = "PALISADE-RESULT";
/// How long the kernel test suite may take on one kernel (17 minutes on 6.1, 28 on 6.12, the two
/// side by side).
const TEST_TIMEOUT: Duration = Duration::from_secs(45 * 60);

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

/// What a boot printed, and the status its init body reported: an error when the VM ran longer
/// than its timeout or stopped without reporting (the console then shows how far it got).
pub struct Boot {
    pub console: String,
    pub status: anyhow::Result<i32>,
}

/// Boots `vmlinuz` with `initrd` and QEMU's `options` (network, clock), echoing the console
/// prefixed by `label`.
pub fn boot(
    label: &str,
    vmlinuz: &Path,
    initrd: &Path,
    options: &[&str],
    timeout: Duration,
) -> anyhow::Result<Boot> {
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
                // Host seconds since boot: what shows which test takes the time.
                println!("[{label} {:>4}s] {shown}", started.elapsed().as_secs());
                if let Some(code) = line.trim().strip_prefix(SENTINEL) {
                    status = code.trim().parse().ok();
                }
                console.push_str(line);
                console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() > timeout => {
                let _ = child.kill();
                child.wait()?;
                let status = Err(anyhow!(
                    "[{label}] the VM did not finish within {timeout:?}"
                ));
                return Ok(Boot { console, status });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    child.wait()?;
    let status = status.with_context(|| {
        format!("[{label}] the VM stopped without reporting ({SENTINEL} missing)")
    });
    Ok(Boot { console, status })
}

pub fn work_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = crate::workspace().join("target/vm").join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The tests of a test binary that match `filter` (names containing any of its words).
fn listed(tests: &Path, filter: Option<&str>) -> anyhow::Result<Vec<String>> {
    let filters = filter.into_iter().flat_map(str::split_whitespace);
    let list = Command::new(tests)
        .args(["--list"])
        .args(filters)
        .output()?;
    ensure!(list.status.success(), "listing {} failed", tests.display());
    Ok(results::listed(&String::from_utf8(list.stdout)?))
}

/// Kernel tests that hold what they time to the wall clock: they run in a boot of their own on
/// each kernel while no other VM runs, so that the host's other VM cannot slow them.
const ALONE: &[&str] = &[
    "kubernetes::kubernetes_policies_reach_the_selected_pods_only",
    "rule_modules::a_module_burning_its_budget_holds_up_neither_endpoints_nor_policies",
];

/// A test binary run in a boot of its own on each kernel.
struct Suite<'a> {
    /// Appended to the boot's label.
    name: &'static str,
    /// Booted while no other VM runs (see `ALONE`).
    alone: bool,
    expected: Vec<String>,
    executables: Vec<(&'a str, &'a Path)>,
    /// Its files besides each kernel's modules and its API server's credentials.
    files: Vec<(PathBuf, String)>,
    body: String,
}

/// What one boot ran: its label, its tests' results, the test binary's status.
type Run = (String, results::Summary, i32);

/// The kernel suite (tests/kernel/tests/enforcement) and the node suite (tests/kernel/tests/node:
/// containerd and a kubelet in the VM), each in its own boot of each kernel, two boots at a time;
/// then the kernel tests in `ALONE`. The kernel tests run the agent of a debug build, or,
/// `release`, the one users run.
pub fn test(
    kernels: &[String],
    filter: Option<&str>,
    apply_updates: usize,
    release: bool,
) -> anyhow::Result<()> {
    let binaries = build::binaries()?;
    let palisade = if release {
        build::agent_release()?
    } else {
        binaries.palisade.clone()
    };
    let kernel_tests = listed(&binaries.kernel_tests, filter)?;
    let node_tests = listed(&binaries.node_tests, filter)?;
    ensure!(
        !kernel_tests.is_empty() || !node_tests.is_empty(),
        "no kernel test matches the filter"
    );
    let network = "ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && sleep 3";
    let mut suites = Vec::new();
    let (alone, shared): (Vec<String>, Vec<String>) = kernel_tests
        .into_iter()
        .partition(|name| ALONE.contains(&name.as_str()));
    let rule_modules = build::rule_modules(&palisade, &work_dir("test")?)?;
    // Checks the agent's /metrics as Prometheus 2.42 reads it.
    let promtool = debian::unpacked("prometheus")?.join("usr/bin/promtool");
    let skip_alone: String = ALONE.iter().map(|name| format!(" --skip {name}")).collect();
    let only_alone = format!("--exact {}", alone.join(" "));
    for (name, alone, expected, selection) in [
        (
            "",
            false,
            shared,
            format!("{}{skip_alone}", filter.unwrap_or_default()),
        ),
        ("-alone", true, alone, only_alone),
    ] {
        if expected.is_empty() {
            continue;
        }
        suites.push(Suite {
            name,
            alone,
            expected,
            executables: vec![
                ("palisade", &palisade),
                ("probe", &binaries.probe),
                ("enforcement", &binaries.kernel_tests),
                ("mkfs.xfs", Path::new("/usr/sbin/mkfs.xfs")),
                ("promtool", &promtool),
            ],
            files: rule_modules.clone(),
            body: format!(
                "{network}\n\
                 palisade doctor\nPALISADE_BIN=/palisade/bin/palisade PALISADE_PROBE=/palisade/bin/probe \
                 PALISADE_PROMTOOL=/palisade/bin/promtool \
                 PALISADE_RULES=/palisade/rules KUBECONFIG=/palisade/kube/admin.kubeconfig \
                 PALISADE_AGENT_KUBECONFIG=/palisade/kube/agent.kubeconfig \
                 PALISADE_APPLY_UPDATES={apply_updates} RUST_BACKTRACE=1 /palisade/bin/enforcement --test-threads=1 {selection}\n\
                 {}",
                report_results()
            ),
        });
    }
    let node_binaries = if node_tests.is_empty() {
        Vec::new()
    } else {
        node::binaries()?
    };
    if !node_tests.is_empty() {
        let dir = work_dir("node")?;
        let mut files = node::images(&dir)?;
        files.push(node::chart(&dir)?);
        let mut executables: Vec<(&str, &Path)> = vec![("node", &binaries.node_tests)];
        executables.extend(
            node_binaries
                .iter()
                .map(|(name, path)| (*name, path.as_path())),
        );
        suites.push(Suite {
            name: "-node",
            alone: false,
            expected: node_tests,
            executables,
            files,
            body: format!(
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
            ),
        });
    }
    let kernels: Vec<(&String, kernels::Kernel)> = kernels
        .iter()
        .map(|series| Ok((series, kernels::fetch(series)?)))
        .collect::<anyhow::Result<_>>()?;
    let machines: Vec<Machine> = kernels
        .iter()
        .map(|(series, kernel)| Machine::prepare(series, kernel))
        .collect::<anyhow::Result<_>>()?;
    // Two boots at a time, one on each of the host's two cores (each VM has one vCPU), the
    // longest first: the kernel suites, the later kernel's first; then those booted alone.
    let (alone, shared): (Vec<&Suite>, Vec<&Suite>) = suites.iter().partition(|suite| suite.alone);
    let queue: VecDeque<(&Machine, &Suite)> = shared
        .into_iter()
        .flat_map(|suite| machines.iter().rev().map(move |machine| (machine, suite)))
        .collect();
    let queue = Mutex::new(queue);
    let mut report: Vec<Run> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<Vec<Run>> {
                    let mut runs = Vec::new();
                    loop {
                        let next = queue.lock().expect("not poisoned").pop_front();
                        let Some((machine, suite)) = next else {
                            return Ok(runs);
                        };
                        runs.push(machine.boot(suite)?);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a boot panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    for suite in alone {
        for machine in &machines {
            report.push(machine.boot(suite)?);
        }
    }
    report.sort_by(|a, b| a.0.cmp(&b.0));
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

/// A kernel to boot, with an API server of its own (no kernel sees another's objects) and the
/// files each of its boots gets besides the suite's.
struct Machine<'a> {
    series: &'a str,
    kernel: &'a kernels::Kernel,
    dir: PathBuf,
    server: kube::ApiServer,
    files: Vec<(PathBuf, String)>,
}

impl<'a> Machine<'a> {
    fn prepare(series: &'a str, kernel: &'a kernels::Kernel) -> anyhow::Result<Self> {
        let dir = work_dir(&format!("linux-{series}"))?;
        // The Kubernetes tests' API server, on loopback here; the VM reaches it at VM_ADDRESS
        // through QEMU's guestfwd relay (restrict=on: no other packet leaves the VM).
        let server = kube::ApiServer::start(&dir.join("kube"))?;
        // The release whose RBAC the kernel suite's agents run with (they start in the VM as
        // the tests say); its DaemonSet runs on no node: the node suite installs its own.
        server.install_chart(
            &crate::workspace().join("charts/palisade"),
            &["--set", "nodeSelector.palisade\\.test/agents=none"],
        )?;
        // Numbered: /init loads them in the order of their names.
        let mut files: Vec<(PathBuf, String)> = kernel
            .modules
            .iter()
            .enumerate()
            .map(|(index, module)| {
                let name = module.file_name().expect("a file").to_string_lossy();
                (
                    module.clone(),
                    format!("/palisade/modules/{}/{index:02}-{name}", kernel.release),
                )
            })
            .collect();
        for user in ["admin", "agent", "node"] {
            files.extend(server.vm_files(user, Path::new("/palisade/kube"))?);
        }
        Ok(Self {
            series,
            kernel,
            dir,
            server,
            files,
        })
    }

    /// Boots the kernel with `suite`; what ran.
    fn boot(&self, suite: &Suite) -> anyhow::Result<Run> {
        let label = format!("linux-{}{}", self.series, suite.name);
        let initrd = build::initramfs(
            &self.dir.join(format!("boot{}", suite.name)),
            &suite.executables,
            &[&suite.files[..], &self.files[..]].concat(),
            &init_script(&suite.body),
        )?;
        let nic = format!(
            "user,model=e1000,restrict=on,guestfwd=tcp:{}:{}-cmd:/bin/busybox nc 127.0.0.1 {}",
            kube::VM_ADDRESS,
            kube::VM_PORT,
            self.server.port
        );
        let Boot { console, status } = boot(
            &label,
            &self.kernel.vmlinuz,
            &initrd,
            &["-nic", &nic],
            TEST_TIMEOUT,
        )?;
        // A suite cut short still reports the tests it ran.
        let status = status.unwrap_or_else(|err| {
            eprintln!("{err:#}");
            -1
        });
        let summary = results::Summary::new(&suite.expected, &results::parse(&console));
        results::save_measurements(&console, RESULT, &work_dir("results")?, &label)?;
        Ok((label, summary, status))
    }
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
    let status = boot(
        &format!("linux-{series}"),
        &kernels::fetch(series)?.vmlinuz,
        &initrd,
        &["-nic", "none"],
        TEST_TIMEOUT,
    )?
    .status?;
    ensure!(status == 0, "the demo failed (status {status})");
    Ok(())
}
