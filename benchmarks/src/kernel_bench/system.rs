//! What the benchmarks drive: cgroups, the agent process and its metrics, the floor programs,
//! and the kernel's statistics of the programs attached.

use std::{
    collections::HashMap,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use aya_obj::generated::bpf_prog_type;
use palisade_agent::targets::{Cgroup, Hierarchy, join_in_child};

/// The guest's monotonic clock in nanoseconds (executed instructions under `-icount`).
pub fn now_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// `kernel-bench ARGS`, started inside `cgroup` (its first instruction already runs there).
pub fn bench_command(cgroup: &Cgroup, args: &[&str]) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(args);
    in_cgroup(&mut command, cgroup);
    Ok(command)
}

pub fn in_cgroup(command: &mut Command, cgroup: &Cgroup) {
    let procs = cgroup.procs_file();
    // SAFETY: join_in_child only makes async-signal-safe calls.
    unsafe { std::os::unix::process::CommandExt::pre_exec(command, move || join_in_child(&procs)) };
}

/// Runs `command` to completion; its standard output.
pub fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The benchmark's cgroups: `target` (protected from S2 on) and `client` (never protected).
pub struct Cgroups {
    pub hierarchy: Hierarchy,
    pub base: PathBuf,
    pub target: Cgroup,
    pub client: Cgroup,
}

/// The target's path as a policy's `cgroupPath` names it.
pub const TARGET: &str = "bench/target";

impl Cgroups {
    pub fn create() -> anyhow::Result<Self> {
        let hierarchy = Hierarchy::find()?;
        let base = hierarchy.mount.join("bench");
        std::fs::create_dir_all(&base)?;
        let target = hierarchy.create(&base, "target")?;
        let client = hierarchy.create(&base, "client")?;
        Ok(Self {
            hierarchy,
            base,
            target,
            client,
        })
    }
}

/// A Prometheus scrape of the agent.
pub struct Scrape(prometheus_parse::Scrape);

impl Scrape {
    /// The sum of the samples of `name` (all label sets); the count of a histogram.
    pub fn sum(&self, name: &str) -> f64 {
        self.sum_with(name, &[])
    }

    /// The sum of the samples of `name` that have `labels`.
    pub fn sum_with(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        use prometheus_parse::Value;
        self.0
            .samples
            .iter()
            .filter(|sample| {
                sample.metric == name
                    && labels
                        .iter()
                        .all(|(key, value)| sample.labels.get(key) == Some(*value))
            })
            .map(|sample| match &sample.value {
                Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => *value,
                Value::Histogram(buckets) => buckets
                    .iter()
                    .find(|bucket| bucket.less_than.is_infinite())
                    .map_or(0.0, |bucket| bucket.count),
                Value::Summary(_) => 0.0,
            })
            .sum()
    }
}

const METRICS: &str = "127.0.0.1:9464";
const BPFFS: &str = "/sys/fs/bpf/palisade-bench";
pub const POLICY_DIR: &str = "/tmp/bench/policies";
pub const EVENTS: &str = "/tmp/bench/events.jsonl";

fn palisade() -> anyhow::Result<PathBuf> {
    std::env::var_os("PALISADE_BIN")
        .map(PathBuf::from)
        .context("PALISADE_BIN must name the palisade binary (the VM harness sets it)")
}

fn http_get(path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(METRICS)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// The guest's CPU time so far, in clock ticks: (busy, all).
fn cpu_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let all = ticks.iter().sum();
    // idle and iowait are the 4th and 5th.
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Ok((all - idle, all))
}

/// Turns address-space layout randomisation off in the guest, for the processes started from now
/// on. Where a process's stack, heap and libraries fall decides how many page tables it has, and
/// so what fork and exec cost: with randomisation on, `fork` moved by up to ±7% (once +40%)
/// between runs of one state and `exec` by ±3%; with it off, both repeat within ±0.1%.
pub fn fix_address_space_layout() -> anyhow::Result<()> {
    std::fs::write("/proc/sys/kernel/randomize_va_space", "0")
        .context("turning address-space randomisation off")
}

/// How long the kernel may hold a freed object on a timer: `kfree_rcu` frees a small batch
/// after 5 s.
const LATE_FREES: Duration = Duration::from_secs(6);

/// Brings the kernel's allocators to the same state before every state's measurements, whatever
/// ran before (an agent starting or stopping, a policy's maps written): waits out the frees the
/// kernel defers (to workqueues, RCU callbacks and `kfree_rcu` batches; free of cost under
/// `-icount sleep=off`, where an idle guest's clock jumps to its next timer), then until the
/// guest has been idle for two 100-ms slices in a row, then has SLUB flush its per-CPU slabs,
/// free its empty slabs and sort its partial ones, fullest first, in every cache. Otherwise that
/// work, and where the slabs were left, would be counted in the next state's time (without the
/// wait and the shrinking, S1's `fork` on 6.12 was up to 0.5% slower than the floor's in some
/// rounds, though no program runs on its path). What live processes hold stays where it is.
pub fn settle() -> anyhow::Result<()> {
    std::thread::sleep(LATE_FREES);
    wait_until_idle()?;
    shrink_slab_caches()
}

fn wait_until_idle() -> anyhow::Result<()> {
    let mut idle_slices = 0;
    let mut before = cpu_ticks()?;
    wait_for("the guest idle", Duration::from_secs(120), || {
        std::thread::sleep(Duration::from_millis(100));
        let now = cpu_ticks()?;
        let (busy, all) = (now.0 - before.0, now.1 - before.1);
        before = now;
        // At most 2% busy: this process's own reads.
        idle_slices = if busy * 50 <= all { idle_slices + 1 } else { 0 };
        Ok(idle_slices >= 2)
    })
}

fn shrink_slab_caches() -> anyhow::Result<()> {
    let caches = "/sys/kernel/slab";
    for cache in std::fs::read_dir(caches).with_context(|| format!("reading {caches}"))? {
        let cache = cache?;
        // A cache merged into another is listed again as a link to it.
        if cache.file_type()?.is_symlink() {
            continue;
        }
        let shrink = cache.path().join("shrink");
        std::fs::write(&shrink, "1").with_context(|| format!("writing {}", shrink.display()))?;
    }
    Ok(())
}

/// Polls `done` every 20 ms for up to `limit`.
pub fn wait_for(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while !done()? {
        ensure!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `palisade agent` on the policy directory, events to a file, no rate limit on audit events;
/// in a cgroup of its own, whose CPU time the kernel counts to the microsecond (a process's, in
/// /proc, is counted in ticks of 10 ms: 10 million instructions under `-icount`).
pub struct Agent {
    child: Child,
    /// The command-line options it was started with besides the harness's own.
    options: Vec<String>,
    log: PathBuf,
    cgroup: Cgroup,
}

/// Mounts a tmpfs on the policy directory, once: the agent watches that directory (inotify), and
/// the kernel's file notification does more for every file accessed on a file system where
/// anything is watched, which the benchmarks' file operations next to it would count as the
/// hooks' cost (~115 instructions per read or write on 6.1 before this mount). A ConfigMap
/// volume is a file system of its own too.
fn mount_policy_dir() -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(POLICY_DIR)?;
    let parent = Path::new(POLICY_DIR).parent().context("a parent")?;
    if std::fs::metadata(POLICY_DIR)?.dev() != std::fs::metadata(parent)?.dev() {
        return Ok(());
    }
    let target = std::ffi::CString::new(POLICY_DIR)?;
    // SAFETY: valid NUL-terminated strings; no data.
    let mounted = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    ensure!(
        mounted == 0,
        "mounting a tmpfs on {POLICY_DIR}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

impl Agent {
    pub fn start(extra: &[&str]) -> anyhow::Result<Self> {
        mount_policy_dir()?;
        let log = PathBuf::from("/tmp/bench/agent.log");
        let hierarchy = Hierarchy::find()?;
        let path = hierarchy.mount.join("palisade-agent");
        std::fs::create_dir_all(&path)?;
        let cgroup = hierarchy.open(&path.to_string_lossy())?;
        let mut command = Command::new(palisade()?);
        in_cgroup(&mut command, &cgroup);
        let child = command
            .args(["agent", "--policy-dir", POLICY_DIR, "--bpffs", BPFFS])
            .args(["--events", EVENTS, "--audit-rate", "0"])
            .args(extra)
            // As in a cluster: block-access-to-kube-apiserver needs the API server's address.
            .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting the agent")?;
        let mut agent = Self {
            child,
            options: extra.iter().map(|option| (*option).to_owned()).collect(),
            log,
            cgroup,
        };
        wait_for("the agent ready", Duration::from_secs(600), || {
            if let Some(status) = agent.child.try_wait()? {
                bail!("the agent exited ({status}): {}", agent.log());
            }
            Ok(http_get("/readyz").map(|(status, _)| status).unwrap_or(0) == 200)
        })?;
        Ok(agent)
    }

    pub fn options(&self) -> &[String] {
        &self.options
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Caps the agent at `percent` of one CPU (its cgroup's `cpu.max`), as a resource limit in a
    /// cluster does.
    pub fn limit_cpu(&self, percent: u64) -> anyhow::Result<()> {
        let root = Hierarchy::find()?.mount;
        std::fs::write(root.join("cgroup.subtree_control"), "+cpu")?;
        let period = 100_000;
        std::fs::write(
            self.cgroup.path.join("cpu.max"),
            format!("{} {period}", percent * period / 100),
        )?;
        Ok(())
    }

    pub fn usage(&self) -> anyhow::Result<Usage> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let rss_kb: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")?;
        // The split between user and kernel time is sampled at the tick; their sum is exact.
        let stat = std::fs::read_to_string(self.cgroup.path.join("cpu.stat"))?;
        let seconds = |key: &str| -> anyhow::Result<f64> {
            let micros: u64 = stat
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
                .with_context(|| format!("no {key} in cpu.stat"))?;
            Ok(micros as f64 / 1e6)
        };
        Ok(Usage {
            rss_bytes: rss_kb * 1024,
            user_seconds: seconds("user_usec")?,
            system_seconds: seconds("system_usec")?,
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn scrape(&self) -> anyhow::Result<Scrape> {
        let (status, text) = http_get("/metrics")?;
        ensure!(status == 200, "/metrics answered {status}");
        Ok(Scrape(prometheus_parse::Scrape::parse(
            text.lines().map(|line| Ok(line.to_owned())),
        )?))
    }

    /// Writes the policy files `files` (name, YAML), each in place atomically, and waits until
    /// the agent has applied as many changes and enforces them all.
    pub fn apply(&self, files: &[(String, String)]) -> anyhow::Result<()> {
        let applied = self.scrape()?.sum("palisade_policy_apply_seconds");
        for (name, text) in files {
            write_atomically(&Path::new(POLICY_DIR).join(name), text)?;
        }
        let wanted = applied + files.len() as f64;
        wait_for("the policy applied", Duration::from_secs(1200), || {
            let scrape = self.scrape()?;
            ensure!(
                scrape.sum("palisade_policy_errors") == 0.0,
                "the agent refused a benchmark policy: {}",
                self.log()
            );
            Ok(scrape.sum("palisade_policy_apply_seconds") >= wanted)
        })
    }

    /// Stops the agent and removes what it pinned: no program stays attached.
    pub fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait()?;
        ensure!(
            status.success(),
            "the agent failed ({status}): {}",
            self.log()
        );
        cleanup()
    }
}

/// `palisade agent --cleanup`: unpins whatever an agent left, then waits until the kernel has
/// detached its programs. It detaches a released link from a workqueue, one hook at a time, each
/// after RCU-tasks grace periods: on 6.12 several seconds for the agent's hooks, while the guest
/// looks idle, and a state measured meanwhile (S0) ran with some of them still attached. A program
/// leaves the kernel's list only once detached.
pub fn cleanup() -> anyhow::Result<()> {
    output(Command::new(palisade()?).args(["agent", "--cleanup", "--bpffs", BPFFS]))?;
    wait_for("the programs detached", Duration::from_secs(120), || {
        Ok(!programs_loaded())
    })
}

/// Whether programs of the agent's kinds are loaded: on LSM hooks, or on kernel functions (the
/// agent's on `__d_move`).
fn programs_loaded() -> bool {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .any(|info| {
            matches!(
                info.program_type(),
                bpf_prog_type::BPF_PROG_TYPE_LSM | bpf_prog_type::BPF_PROG_TYPE_TRACING
            )
        })
}

pub fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}

/// Removes every file of the policy directory (the agent lifts their policies).
pub fn clear_policies() -> anyhow::Result<()> {
    for entry in std::fs::read_dir(POLICY_DIR)? {
        std::fs::remove_file(entry?.path())?;
    }
    Ok(())
}

/// The agent's resident memory and the CPU time it has used so far.
pub struct Usage {
    pub rss_bytes: u64,
    pub user_seconds: f64,
    /// In the kernel, on the agent's behalf (system calls, faults).
    pub system_seconds: f64,
}

impl Usage {
    pub fn cpu_seconds(&self) -> f64 {
        self.user_seconds + self.system_seconds
    }
}

/// The floor programs (ebpf/floor.bpf.c), attached while this lives.
pub struct Floor {
    _programs: aya::Ebpf,
}

static FLOOR: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor.bpf.o"));

/// The floor program that resolves the opened file's path, for the "d_path" state.
const FILE_OPEN_PATH: &str = "file_open_path";

impl Floor {
    /// An empty program on each of the agent's hooks; with `resolving_paths`, the one on
    /// `file_open` resolves the opened file's path.
    pub fn attach(resolving_paths: bool) -> anyhow::Result<Self> {
        let btf = aya::Btf::from_sys_fs()?;
        let mut ebpf = aya::Ebpf::load(FLOOR)?;
        for hook in palisade_agent::bpf::PROGRAMS {
            let name = match *hook {
                "file_open" if resolving_paths => FILE_OPEN_PATH,
                hook => hook,
            };
            let program: &mut aya::programs::Lsm = ebpf
                .program_mut(name)
                .context("a floor program")?
                .try_into()?;
            program.load(hook, &btf)?;
            program.attach()?;
        }
        Ok(Self { _programs: ebpf })
    }
}

/// Run counts and run time of every loaded program, by id (while statistics are on).
pub fn program_runs() -> HashMap<u32, (String, u64, Duration)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|info| {
            (
                info.id(),
                (
                    info.name_as_str().unwrap_or("?").to_owned(),
                    info.run_count(),
                    info.run_time(),
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_floor_has_a_program_on_each_of_the_agents_hooks() {
        let floor = aya_obj::Object::parse(super::FLOOR).expect("the floor object parses");
        let mut names: Vec<&str> = floor
            .programs
            .keys()
            .map(String::as_str)
            .filter(|name| *name != super::FILE_OPEN_PATH)
            .collect();
        names.sort_unstable();
        let mut agent = palisade_agent::bpf::PROGRAMS.to_vec();
        agent.sort_unstable();
        assert_eq!(
            names, agent,
            "the floor's programs (left) are not the agent's"
        );
    }
}
