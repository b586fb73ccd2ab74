//! `palisade run --policy FILE -- CMD ARGS...`: one command in a fresh cgroup under a policy.

use std::{os::unix::process::ExitStatusExt, path::PathBuf, process::ExitStatus, sync::Arc};

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{error, info, warn};

use super::session::{Session, json_sink};
use crate::{
    events::{Deciding, JsonLines},
    metrics::RuleModuleMetrics,
    rules::RuleHost,
    targets::{Cgroup, Hierarchy, PodRegistry, join_in_child},
};

pub struct RunArgs {
    pub policy: PathBuf,
    pub events: Option<PathBuf>,
    pub command: Vec<String>,
}

/// What `palisade run` exits with when it fails itself (it cannot read or apply the policy,
/// enforce, or start the command): as env(1), timeout(1) and chroot(1) do, so that a script tells
/// it from the command's own status. Usage errors exit 2, as for every command.
pub const FAILED: u8 = 125;
/// The command was found but cannot be executed (no permission, not a program).
const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
const NOT_FOUND: u8 = 127;

/// Whether `spawn` failed because the command cannot be executed, rather than for want of a
/// process or a descriptor (palisade's failure).
fn cannot_execute(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::EACCES
                | libc::EPERM
                | libc::ENOEXEC
                | libc::ENOTDIR
                | libc::ELOOP
                | libc::EISDIR
                | libc::ETXTBSY
                | libc::E2BIG
                | libc::ENAMETOOLONG
        )
    )
}

/// The exit code a shell would report for `status`.
fn exit_code(status: ExitStatus) -> u8 {
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    code as u8
}

/// The command's exit status, or 126/127 when it could not be started (the reason logged);
/// an error (exit 125) when palisade itself fails.
pub async fn run(args: RunArgs) -> anyhow::Result<u8> {
    let host = RuleHost::new(None)?;
    let (policy, compiled) = super::policy::load_and_compile(&host, &args.policy)?;
    anyhow::ensure!(
        compiled.modeling().is_none(),
        "{}: spec.mode: BehaviorModeling models a workload over its duration: run it with \
         palisade agent --policy-dir",
        args.policy.display()
    );
    if policy.spec.target.is_some() {
        info!("spec.target is ignored: `palisade run` protects the cgroup it creates");
    }
    let mut signals = Signals::install()?;
    // Enforcement ends with the command: nothing is pinned.
    let enforcer = crate::bpf::Enforcer::load().context("cannot enforce")?;
    let cgroups = Hierarchy::find()?;
    let deciding = Deciding::new(host, RuleModuleMetrics::default(), cgroups.mount.clone());
    let sink = json_sink(
        args.events.as_deref(),
        None,
        &enforcer.protected_files(),
        JsonLines::new("stderr", Box::new(std::io::stderr())),
    )?;
    let mut session = Session::start(
        enforcer,
        deciding,
        vec![Box::new(sink)],
        PodRegistry::default(),
    )?;
    session.protect_own_files(&[args.policy.as_path()])?;
    let cgroup = cgroups.create(
        &cgroups.mount,
        &format!("palisade-run-{}", std::process::id()),
    )?;
    let result = supervise(
        &mut session,
        &cgroup,
        Arc::new(compiled),
        &args,
        &mut signals,
    )
    .await;
    session.stop_events();
    session.report_losses();
    // Processes the command left behind would keep the cgroup alive.
    let _ = std::fs::write(cgroup.path.join("cgroup.kill"), "1");
    if let Err(err) = session.enforcer.remove(cgroup.id) {
        warn!("removing the policy of {}: {err}", cgroup.path.display());
    }
    if let Err(err) = cgroup.remove() {
        warn!("{err}");
    }
    result
}

async fn supervise(
    session: &mut Session,
    cgroup: &Cgroup,
    policy: Arc<crate::policy::CompiledPolicy>,
    args: &RunArgs,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    session.enforcer.apply(cgroup, policy).with_context(|| {
        format!(
            "applying {} to {}",
            args.policy.display(),
            cgroup.path.display()
        )
    })?;
    let (program, program_args) = args.command.split_first().context("no command given")?;
    let procs = cgroup.procs_file();
    let mut command = tokio::process::Command::new(program);
    command.args(program_args);
    // A failure here is palisade's, not the command's: exit as palisade fails, rather than
    // return an error that spawn would report like the command's own.
    // SAFETY: join_in_child, write and _exit are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if join_in_child(&procs).is_err() {
                const MESSAGE: &[u8] = b"palisade: error: cannot place the command in its cgroup\n";
                libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
                libc::_exit(i32::from(FAILED));
            }
            Ok(())
        })
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                _ if cannot_execute(&err) => CANNOT_EXECUTE,
                _ => return Err(err).with_context(|| format!("starting {program}")),
            };
            error!("cannot run {program}: {err}");
            return Ok(code);
        }
    };
    let pid = child.id().context("the command has no pid")?;
    loop {
        let signal = tokio::select! {
            status = child.wait() => return Ok(exit_code(status?)),
            signal = signals.next() => signal,
            ready = session.events_ready() => { ready?; session.pump(); continue }
        };
        if let Some(signal) = signal {
            // SAFETY: signalling our own child, which has not been reaped yet.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }
}

/// Signals that would otherwise kill `palisade run` before its cleanup, installed before the
/// cgroup exists.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal to forward to the command. Ctrl-C is not forwarded: the command shares
    /// our terminal and gets it directly.
    async fn next(&mut self) -> Option<i32> {
        tokio::select! {
            _ = self.interrupt.recv() => None,
            _ = self.terminate.recv() => Some(libc::SIGTERM),
            _ = self.hangup.recv() => Some(libc::SIGHUP),
            _ = self.quit.recv() => Some(libc::SIGQUIT),
        }
    }
}
