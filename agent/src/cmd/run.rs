//! `palisade run --policy FILE -- CMD ARGS...`: one command in a fresh cgroup under a policy.

use std::{
    fs,
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::{Arc, atomic::Ordering},
};

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::{
    bpf::Enforcer,
    events::{Decoder, EventReader},
    targets::{Cgroup, cgroup2_root, join_in_child},
};

pub struct RunArgs {
    pub policy: PathBuf,
    pub events: Option<PathBuf>,
    pub command: Vec<String>,
}

/// The cgroup and its policy, removed however `run` ends.
struct Sandbox<'a> {
    enforcer: &'a mut Enforcer,
    cgroup: Cgroup,
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        // Processes the command left behind would keep the cgroup alive.
        let _ = fs::write(self.cgroup.path.join("cgroup.kill"), "1");
        if let Err(err) = self.enforcer.remove(self.cgroup.id) {
            warn!(
                "removing the policy of {}: {err}",
                self.cgroup.path.display()
            );
        }
        if let Err(err) = self.cgroup.remove() {
            warn!("{err}");
        }
    }
}

/// The exit code a shell would report for `status`.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

pub async fn run(args: RunArgs) -> anyhow::Result<i32> {
    let (policy, compiled) = super::policy::load_and_compile(&args.policy)?;
    if policy.spec.target.is_some() {
        info!("spec.target is ignored: `palisade run` protects the cgroup it creates");
    }
    let mut enforcer = Enforcer::load().context("cannot enforce the policy")?;
    let ring = enforcer
        .take_events()
        .context("the event ring buffer is missing")?;
    let mut reader = EventReader::new(ring, Decoder::new(enforcer.registry()))?;
    let sink_stats = reader.stats();

    let root = cgroup2_root()?;
    let cgroup = Cgroup::create(&root, &format!("palisade-run-{}", std::process::id()))?;
    let sandbox = Sandbox {
        enforcer: &mut enforcer,
        cgroup,
    };
    sandbox
        .enforcer
        .apply(&sandbox.cgroup, Arc::new(compiled))
        .with_context(|| {
            format!(
                "applying {} to {}",
                args.policy.display(),
                sandbox.cgroup.path.display()
            )
        })?;

    let (program, program_args) = args.command.split_first().context("no command given")?;
    let procs = sandbox.cgroup.procs_file();
    let mut command = tokio::process::Command::new(program);
    command.args(program_args);
    // SAFETY: join_in_child only makes async-signal-safe calls.
    unsafe { command.pre_exec(move || join_in_child(&procs)) };
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {program}"))?;

    let mut sink = super::event_sink(args.events.as_deref(), Box::new(std::io::stderr()))?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            // The command shares our terminal: it sees Ctrl-C itself; we only must not die first.
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {
                if let Some(pid) = child.id() {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
            }
            ready = reader.ready() => { ready?; reader.drain(&mut sink); }
        }
    };
    reader.drain(&mut sink);
    let kernel_stats = sandbox.enforcer.stats()?;
    drop(sandbox);
    report_losses(
        kernel_stats.events_dropped,
        sink_stats.write_errors.load(Ordering::Relaxed),
        args.events.as_deref(),
    );
    Ok(exit_code(status))
}

fn report_losses(dropped: u64, write_errors: u64, events: Option<&Path>) {
    if dropped > 0 {
        warn!("{dropped} audit events were dropped in the kernel: the ring buffer was full");
    }
    if write_errors > 0 {
        let sink = events.map_or("stderr".into(), |path| path.display().to_string());
        warn!("{write_errors} audit events could not be written to {sink}");
    }
}
