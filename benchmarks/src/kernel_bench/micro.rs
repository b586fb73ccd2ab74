//! The microbenchmarks, in the spirit of byte-unixbench and lmbench. Each runs `ops` operations
//! in the process `kernel-bench micro` starts inside the cgroup under test and reports the
//! guest time per operation (executed instructions when the VM counts them).

use std::{
    ffi::{CStr, CString},
    io,
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::Stdio,
};

use anyhow::{Context, bail, ensure};
use palisade_benchmarks::kernel::Spread;

use super::system::now_ns;

/// Where the files the benchmarks open live (tmpfs in the VM).
pub const DATA: &str = "/tmp/bench/data";
/// The tree of files `open_many` opens in turn, one per operation of a run: no file comes back
/// within a run, so that every open in a target misses the kernel's open verdict cache (and there
/// are more files than the cache has slots, ebpf/programs/open_cache.h).
const MANY: &str = "/tmp/bench/data/many";
const MANY_FILES: u64 = 20_000;
/// The file `open_denied` opens: refused in state S5 only.
pub const DENIED: &str = "/tmp/bench/denied/file";
/// The program `exec` runs: static, so that exec is the kernel's work and not the loader's.
const PROGRAM: &str = "/bin/busybox";
const COPY_SIZE: usize = 256 * 1024;

/// A microbenchmark.
pub struct Bench {
    pub name: &'static str,
    /// Operations per run.
    pub ops: u64,
    /// Operations per timed sample: a few hundred thousand instructions or fewer, so that most
    /// samples see no timer tick nor any other task run (run_phase).
    pub per_sample: u64,
}

/// `fork`, `open_close`, `connect` and `open_denied` run more operations than their time per
/// operation alone asks for: shorter runs varied between rounds by as much as the margin of the
/// goal they are checked against. `fork` stops at 4,000: at half a million instructions each,
/// its runs were three quarters of a round's guest time at 8,000.
pub const BENCHES: &[Bench] = &[
    // fork, exec of a static program, exit, wait
    Bench {
        name: "exec",
        ops: 200,
        per_sample: 1,
    },
    // fork, exit, wait
    Bench {
        name: "fork",
        ops: 4000,
        per_sample: 1,
    },
    // open and close a file
    Bench {
        name: "open_close",
        ops: 20000,
        per_sample: 25,
    },
    // stat a file
    Bench {
        name: "stat",
        ops: 5000,
        per_sample: 25,
    },
    // write and read back 512 bytes through a pipe
    Bench {
        name: "pipe",
        ops: 5000,
        per_sample: 50,
    },
    // TCP socket, connect to loopback, accept, close both (reset: no TIME_WAIT left)
    Bench {
        name: "connect",
        ops: 8000,
        per_sample: 4,
    },
    // copy a 256 KiB file in 4 KiB blocks
    Bench {
        name: "file_copy",
        ops: 80,
        per_sample: 1,
    },
    // open and close the file S5 denies
    Bench {
        name: "open_denied",
        ops: 20000,
        per_sample: 25,
    },
    // open and close the next of 20,000 files, 6 directories deep (no file twice in a run)
    Bench {
        name: "open_many",
        ops: MANY_FILES,
        per_sample: 25,
    },
];

impl Bench {
    /// A run of about `ops` operations: whole samples in every phase.
    pub fn run_of(&self, ops: u64) -> u64 {
        ops.max(1).next_multiple_of(PHASES * self.per_sample)
    }
}

/// Creates the files the benchmarks use.
pub fn prepare() -> anyhow::Result<()> {
    std::fs::create_dir_all(DATA)?;
    std::fs::write(format!("{DATA}/file"), "content\n")?;
    std::fs::write(format!("{DATA}/source"), vec![7u8; COPY_SIZE])?;
    std::fs::create_dir_all("/tmp/bench/denied")?;
    std::fs::write(DENIED, "content\n")?;
    for index in 0..MANY_FILES {
        let file = many_file(index);
        std::fs::create_dir_all(file.rsplit_once('/').expect("a directory").0)?;
        std::fs::write(file, "content\n")?;
    }
    Ok(())
}

/// The `index`th file of `open_many`'s tree: its first four digits name four levels of
/// directories, two more levels below them, ten files in each leaf.
fn many_file(index: u64) -> String {
    let digit = |place: u64| index / place % 10;
    format!(
        "{MANY}/{}/{}/{}/{}/e/f/file-{}",
        digit(10_000),
        digit(1000),
        digit(100),
        digit(10),
        digit(1)
    )
}

fn check(result: libc::c_int, what: &str) -> anyhow::Result<libc::c_int> {
    if result < 0 {
        bail!("{what}: {}", io::Error::last_os_error());
    }
    Ok(result)
}

/// What opening a file for reading answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opened {
    Ok,
    Refused,
    Failed,
}

/// Opens `path` for reading and closes it at once.
fn open_close(path: &CStr) -> Opened {
    // SAFETY: a valid path; the descriptor is closed at once.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
        Opened::Ok
    } else if io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
        Opened::Refused
    } else {
        Opened::Failed
    }
}

/// Makes closing `stream` reset the connection (SO_LINGER with a zero timeout).
fn reset_on_close(stream: &TcpStream) -> anyhow::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket, and an option of the size given.
    let set = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    check(set, "SO_LINGER").map(drop)
}

fn c_path(path: &str) -> CString {
    CString::new(path).expect("no NUL in benchmark paths")
}

fn wait_child(pid: libc::pid_t) -> anyhow::Result<()> {
    let mut status = 0;
    // SAFETY: waits for our own child.
    check(unsafe { libc::waitpid(pid, &mut status, 0) }, "waitpid")?;
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed ({status:#x})"
    );
    Ok(())
}

/// Allocator phases a run is spread over. Where a fork's objects land in the kernel's slab caches
/// depends on how many objects other processes hold there, and with it whether freeing them takes
/// the slow path: on 6.1, six or eight idle processes anywhere move `fork` by +0.4% with no
/// program attached, as much as a goal's margin; on 6.12, 6 to 15 idle processes move it by up to
/// 8%. Phase N runs its share of the operations while N idle processes exist, so every state is
/// measured over the same phases, and the processes a state adds itself (the agent's, the floor
/// loader's) shift fewer of them out of the range the mean covers.
pub const PHASES: u64 = 16;

/// Runs `bench` `ops` times (`Bench::run_of`), spread evenly over the allocator phases; returns
/// the guest nanoseconds per operation, the mean over phases. `denied` says whether
/// `open_denied` must be refused.
pub fn run(bench: &str, ops: u64, denied: bool) -> anyhow::Result<f64> {
    let Some(bench) = BENCHES.iter().find(|known| known.name == bench) else {
        bail!("no benchmark {bench}");
    };
    ensure!(
        bench.run_of(ops) == ops,
        "{ops} operations do not split into {PHASES} phases of samples of {}",
        bench.per_sample
    );
    let ops_per_phase = ops / PHASES;
    let mut total = 0.0;
    for phase in 0..PHASES {
        let _idle = IdleProcesses::start(phase)?;
        total += run_phase(bench, phase * ops_per_phase, ops_per_phase, denied)?;
    }
    Ok(total / PHASES as f64)
}

/// `busybox sleep` processes, each asleep before `start` returns, killed when dropped. Exec'd
/// rather than forked and left idle, so that they share no page with the benchmark process.
struct IdleProcesses(Vec<std::process::Child>);

impl IdleProcesses {
    fn start(count: u64) -> anyhow::Result<Self> {
        let mut idle = Self(Vec::new());
        for _ in 0..count {
            let child = std::process::Command::new(PROGRAM)
                .args(["sleep", "1000000"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting an idle process")?;
            idle.0.push(child);
        }
        for child in &mut idle.0 {
            // Asleep: nothing it does afterwards falls into the measured operations.
            let stat = format!("/proc/{}/stat", child.id());
            while !std::fs::read_to_string(&stat)?.contains(") S ") {
                ensure!(child.try_wait()?.is_none(), "an idle process exited");
                std::thread::yield_now();
            }
        }
        Ok(idle)
    }
}

impl Drop for IdleProcesses {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where `file_copy` writes its copies.
fn copy_path() -> String {
    format!("{DATA}/copy-{}", std::process::id())
}

/// One operation of a microbenchmark, given its index in the run.
type Operation = Box<dyn FnMut(u64) -> anyhow::Result<()>>;

/// Runs operations `first..first + ops` of `bench` in samples of `bench.per_sample` operations;
/// returns the guest nanoseconds per operation of the median sample. A timer tick costs the
/// sample it falls in thousands of instructions, and any task that runs meanwhile (the agent,
/// a kernel worker) its whole run; neither is the cost of the operations under test, and which
/// states happened to meet more of them moved `pipe`, which no hook sees, by 0.6% between
/// states. The median of samples that short leaves them out.
fn run_phase(bench: &Bench, first: u64, ops: u64, denied: bool) -> anyhow::Result<f64> {
    let file = c_path(&format!("{DATA}/file"));
    let mut operation: Operation = match bench.name {
        "exec" => {
            let program = c_path(PROGRAM);
            let argv0 = c_path("true");
            Box::new(move |_| {
                let argv: [*const libc::c_char; 2] = [argv0.as_ptr(), std::ptr::null()];
                let envp: [*const libc::c_char; 1] = [std::ptr::null()];
                // SAFETY: the child only calls execve and _exit.
                let pid = check(unsafe { libc::fork() }, "fork")?;
                if pid == 0 {
                    unsafe {
                        libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
                        libc::_exit(127);
                    }
                }
                wait_child(pid)
            })
        }
        "fork" => Box::new(|_| {
            // SAFETY: the child only calls _exit.
            let pid = check(unsafe { libc::fork() }, "fork")?;
            if pid == 0 {
                unsafe { libc::_exit(0) };
            }
            wait_child(pid)
        }),
        "open_close" | "open_many" => {
            let files: Vec<CString> = if bench.name == "open_close" {
                vec![file]
            } else {
                (0..MANY_FILES)
                    .map(|index| c_path(&many_file(index)))
                    .collect()
            };
            Box::new(move |op| {
                let file = &files[op as usize % files.len()];
                // SAFETY: a valid path; the descriptor is closed at once.
                let fd = check(unsafe { libc::open(file.as_ptr(), libc::O_RDONLY) }, "open")?;
                unsafe { libc::close(fd) };
                Ok(())
            })
        }
        "stat" => {
            // SAFETY: all-zero is a valid `struct stat`.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            Box::new(move |_| {
                // SAFETY: a valid path and buffer.
                check(unsafe { libc::stat(file.as_ptr(), &mut stat) }, "stat").map(drop)
            })
        }
        "pipe" => {
            let mut fds = [0; 2];
            // SAFETY: a valid array of two descriptors.
            check(unsafe { libc::pipe(fds.as_mut_ptr()) }, "pipe")?;
            let mut buffer = [0u8; 512];
            Box::new(move |_| {
                // SAFETY: valid descriptors and buffer.
                let written = unsafe { libc::write(fds[1], buffer.as_ptr().cast(), 512) };
                let read = unsafe { libc::read(fds[0], buffer.as_mut_ptr().cast(), 512) };
                ensure!(
                    written == 512 && read == 512,
                    "pipe: {}",
                    io::Error::last_os_error()
                );
                Ok(())
            })
        }
        "connect" => {
            // One thread: on loopback the handshake is done when connect returns. The reset
            // leaves no socket in TIME_WAIT, whose ports later connects would search past.
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let address = listener.local_addr()?;
            Box::new(move |_| {
                let client = TcpStream::connect(address).context("connect")?;
                reset_on_close(&client)?;
                let (server, _) = listener.accept().context("accept")?;
                drop(client);
                drop(server);
                Ok(())
            })
        }
        "file_copy" => {
            let source = c_path(&format!("{DATA}/source"));
            let copy = c_path(&copy_path());
            let mut buffer = [0u8; 4096];
            Box::new(move |_| {
                // SAFETY: valid paths and buffer; both descriptors are closed below.
                let from = check(
                    unsafe { libc::open(source.as_ptr(), libc::O_RDONLY) },
                    "open",
                )?;
                let to = check(
                    unsafe {
                        libc::open(
                            copy.as_ptr(),
                            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                            0o600,
                        )
                    },
                    "create",
                )?;
                loop {
                    let read = unsafe { libc::read(from, buffer.as_mut_ptr().cast(), 4096) };
                    if read <= 0 {
                        break;
                    }
                    let written = unsafe { libc::write(to, buffer.as_ptr().cast(), read as usize) };
                    ensure!(written == read, "write: {}", io::Error::last_os_error());
                }
                unsafe {
                    libc::close(from);
                    libc::close(to);
                }
                Ok(())
            })
        }
        "open_denied" => {
            let path = c_path(DENIED);
            Box::new(move |_| {
                let refused = open_close(&path) == Opened::Refused;
                ensure!(
                    refused == denied,
                    "open_denied: {}",
                    if denied { "not refused" } else { "refused" }
                );
                Ok(())
            })
        }
        other => bail!("no benchmark {other}"),
    };
    let per_sample = bench.per_sample;
    let mut samples = Vec::new();
    for sample in (first..first + ops).step_by(per_sample as usize) {
        let started = now_ns();
        for op in sample..sample + per_sample {
            operation(op)?;
        }
        samples.push((now_ns() - started) as f64 / per_sample as f64);
    }
    if bench.name == "file_copy" {
        let _ = std::fs::remove_file(copy_path());
    }
    Ok(Spread::of(samples).context("no sample")?.median)
}

/// Keeps `path` being opened `rate` times per second for `seconds` (guest time), or as fast as
/// it can with `rate` 0. Returns (attempts, refused, seconds taken).
pub fn generate(path: &str, rate: u64, seconds: f64) -> anyhow::Result<(u64, u64, f64)> {
    let path = c_path(path);
    let started = now_ns();
    let end = started + (seconds * 1e9) as u64;
    let (mut attempts, mut refused) = (0u64, 0u64);
    loop {
        let now = now_ns();
        if now >= end {
            break;
        }
        // Rate 0: no pacing.
        if let Some(offset) = (attempts * 1_000_000_000).checked_div(rate) {
            let due = started + offset;
            if due > now {
                sleep_until(due);
                continue;
            }
        }
        if open_close(&path) == Opened::Refused {
            refused += 1;
        }
        attempts += 1;
    }
    Ok((attempts, refused, (now_ns() - started) as f64 / 1e9))
}

fn sleep_until(ns: u64) {
    let deadline = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; an interrupted sleep only ends early.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &deadline,
            std::ptr::null_mut(),
        )
    };
}

/// Reads `path` in a loop; prints `TIME ok|eperm` whenever the answer changes, forever.
pub fn probe(path: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let path = c_path(path);
    let mut last = None;
    let mut out = io::stdout().lock();
    loop {
        let answer = match open_close(&path) {
            Opened::Ok => "ok",
            Opened::Refused => "eperm",
            Opened::Failed => "error",
        };
        if last != Some(answer) {
            writeln!(out, "{} {answer}", now_ns())?;
            out.flush()?;
            last = Some(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_holds_whole_samples_in_every_phase() {
        for bench in BENCHES {
            for ops in [0, 1, bench.ops / 4, bench.ops] {
                let run = bench.run_of(ops);
                assert!(run >= ops.max(1), "{}: {run} < {ops}", bench.name);
                assert_eq!(run % (PHASES * bench.per_sample), 0, "{}", bench.name);
            }
        }
        assert_eq!(BENCHES[2].run_of(20000), 20000);
    }
}
