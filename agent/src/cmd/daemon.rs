//! `palisade agent`: enforce every policy file of a directory (`--policy-dir`), or the policy
//! custom resources on the pods of this node (`--kubernetes`), and follow their changes.

use std::{
    net::SocketAddr,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use notify::Watcher;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{info, warn};

use super::session::{Session, json_sink};
use crate::{
    behavior::{ModelDir, Models},
    bpf::{AuditRate, Enforcer, MapSizes, PinnedState},
    events::{Deciding, FalcoSink, FalcoWorker, JsonLines, Rotation, Sink},
    files::{Change, PolicyDir},
    http::{Endpoints, client::TlsFiles},
    k8s::{Cluster, DaemonSetName, Owner, Reconciler},
    metrics::{KernelSnapshot, Metrics},
    policy::Environment,
    rules::RuleHost,
    targets::{CgroupDriver, Enforce, Hierarchy, PodRegistry},
};

const RESYNC_INTERVAL: Duration = Duration::from_secs(2);
/// How often the inodes the rules name are looked for again: a named file created or replaced,
/// or a hard link made outside the targets to a file in a named directory, holds its rules at
/// most this long after. A target without processes is looked at again at every resync, so that
/// its first processes' views count within RESYNC_INTERVAL.
const NAMES_INTERVAL: Duration = Duration::from_secs(30);
/// Replaced policies are retired in the background, one step per timer: RETIRE_DELAY after a
/// release (once for a burst of changes), one wait for the programs that may be using them, on a
/// blocking thread; then their entries are deleted DELETES_PER_TURN policies at a time (about
/// half a millisecond each under emulation), DELETE_PAUSE apart. Neither a policy change nor the
/// workloads wait behind them: the loop runs at a high priority.
const RETIRE_DELAY: Duration = Duration::from_millis(100);
const DELETES_PER_TURN: usize = 4;
const DELETE_PAUSE: Duration = Duration::from_millis(4);
/// The control loop's nice value. Its work (reconciling policies, serving `/metrics` and
/// `/healthz`, copying the ring buffer into the event queue) is short and must not wait behind
/// the event worker or the targets when CPUs are busy: it wins the CPU when it has work and
/// costs nothing when it has none.
const CONTROL_NICE: i32 = -10;
/// How long a policy file being written may stay open before the agent reads it all the same.
const PARTIAL_WRITE_SETTLE: Duration = Duration::from_millis(200);
/// How long a stopping agent keeps trying to deliver queued events to Falcosidekick.
const FALCO_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The directory of policy files (*.yaml, *.yml) to enforce.
    #[arg(long, value_name = "DIR", required_unless_present_any = ["cleanup", "kubernetes"])]
    pub policy_dir: Option<PathBuf>,
    /// Enforce the PalisadePolicy and PalisadeClusterPolicy resources on this node's pods
    /// (credentials from KUBECONFIG, or the pod's service account).
    #[arg(long, conflicts_with = "policy_dir", requires = "node_name")]
    pub kubernetes: bool,
    /// The DaemonSet that runs this agent, NAMESPACE/NAME: when it is deleted with its pods
    /// (the chart uninstalled), the stopping agent removes its pinned state and compiled rule
    /// modules, ending enforcement on this node. While it stays, enforcement stays pinned for
    /// the agent's next pod.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "kubernetes")]
    pub daemonset: Option<DaemonSetName>,
    /// This node's name (set from the downward API in the DaemonSet).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The kubelet's cgroup driver (found from the cgroups there are when not given).
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<CgroupDriver>,
    /// Where the rule modules that policies name (spec.ruleModules[].module) are, in Kubernetes.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/palisade/rules")]
    pub rule_modules: PathBuf,
    /// The least time between two status writes of one policy by this agent.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub status_interval: Duration,
    /// Append audit events (JSON lines) to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Rotate the event file when it would grow past BYTES.
    #[arg(long, value_name = "BYTES", requires = "events")]
    pub events_max_bytes: Option<u64>,
    /// Rotated event files to keep (FILE.1 is the newest).
    #[arg(
        long,
        value_name = "COUNT",
        default_value_t = 5,
        requires = "events_max_bytes"
    )]
    pub events_keep: u32,
    /// Audit events each rule may emit per second for each target (0: no limit). Decisions are
    /// never limited; suppressed events are counted and the next event says how many.
    #[arg(long, value_name = "EVENTS", default_value_t = 20)]
    pub audit_rate: u32,
    /// Audit events a rule may emit at once for a target after a quiet period.
    #[arg(long, value_name = "EVENTS", default_value_t = 50)]
    pub audit_burst: u32,
    /// Measure what enforcement costs in the kernel: the time of each decision about a target,
    /// and the run time of each program (the kernel's BPF statistics). Costs a clock read or
    /// two per hook call.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Decide every open of a target by its path, never from the open verdict cache (which
    /// answers an open decided before without resolving its path again): measures what the
    /// cache saves. A restart without it turns the cache on again.
    #[arg(long)]
    pub no_open_cache: bool,
    /// Also post every audit event, in Falco's output format, to Falcosidekick at URL
    /// (http://HOST:2801/, or https:// to its tlsserver).
    #[arg(long, value_name = "URL")]
    pub falcosidekick_url: Option<String>,
    /// PEM file of the CA certificates that verify an https:// Falcosidekick, trusted besides
    /// the system's (the agent's image has none).
    #[arg(long, value_name = "FILE", requires = "falcosidekick_url")]
    pub falcosidekick_ca: Option<PathBuf>,
    /// PEM certificate chain (the agent's first) presented to an https:// Falcosidekick that
    /// asks for one (its tlsserver.mutualtls).
    #[arg(long, value_name = "FILE", requires_all = ["falcosidekick_url", "falcosidekick_key"])]
    pub falcosidekick_cert: Option<PathBuf>,
    /// PEM private key of --falcosidekick-cert (PKCS#8, PKCS#1 or SEC1, not encrypted).
    #[arg(long, value_name = "FILE", requires = "falcosidekick_cert")]
    pub falcosidekick_key: Option<PathBuf>,
    /// Events queued for Falcosidekick while it is slow or down; more are counted and dropped.
    #[arg(long, value_name = "EVENTS", default_value_t = 10_000)]
    pub falcosidekick_queue: usize,
    /// Where in bpffs the programs' links and maps are pinned.
    #[arg(long, value_name = "DIR", default_value = crate::bpf::DEFAULT_ROOT)]
    pub bpffs: PathBuf,
    /// Cgroups that policies may target (or be staged for) at once. Sizes the kernel's maps:
    /// a change replaces the pinned state when the agent restarts.
    #[arg(long, value_name = "CGROUPS", default_value_t = MapSizes::default().targets,
        value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub max_targets: u32,
    /// Path entries (one per path of a prefix or exact rule, on each targeted cgroup) that
    /// policies may hold at once; other rules get a quarter as many, the inodes that exact and
    /// directory rules name as many. Sizes the kernel's maps like --max-targets.
    #[arg(long, value_name = "ENTRIES", default_value_t = MapSizes::default().path_entries,
        value_parser = clap::value_parser!(u32).range(1..=1 << 22))]
    pub max_path_entries: u32,
    /// Where the models of BehaviorModeling policy files are written (POLICY.yaml); in
    /// Kubernetes they are PalisadeBehaviorModel objects.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/palisade/models")]
    pub models_dir: PathBuf,
    /// Distinct things modeled targets may do between two reads of the agent (every 2 s); more
    /// are counted as lost in their model. Sizes the kernel's maps like --max-targets.
    #[arg(long, value_name = "RECORDS", default_value_t = MapSizes::default().model_records,
        value_parser = clap::value_parser!(u32).range(1..=1 << 22))]
    pub max_model_records: u32,
    /// Where compiled rule modules are kept between runs (only root may write there).
    #[arg(long, value_name = "DIR", default_value = "/var/cache/palisade/rules")]
    pub rules_cache: PathBuf,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:9464")]
    pub metrics_address: SocketAddr,
    /// Remove everything the agent pinned (ending its enforcement) and exit.
    #[arg(long, conflicts_with_all = ["policy_dir", "kubernetes"])]
    pub cleanup: bool,
}

impl AgentArgs {
    fn map_sizes(&self) -> MapSizes {
        MapSizes {
            targets: self.max_targets,
            path_entries: self.max_path_entries,
            model_records: self.max_model_records,
        }
    }

    /// How the event file is rotated, if it is.
    fn events_rotation(&self) -> Option<Rotation> {
        self.events_max_bytes.map(|max_bytes| Rotation {
            max_bytes,
            keep: self.events_keep,
        })
    }
}

/// Where policies come from.
#[expect(clippy::large_enum_variant, reason = "one per agent")]
enum Source {
    Dir {
        policies: PolicyDir,
        /// Set by the directory's watcher when a change is complete (`Change::Complete`).
        completed: Arc<AtomicBool>,
    },
    Kubernetes(Cluster),
}

impl Source {
    fn reconcile(&mut self, enforcer: &mut impl Enforce) {
        match self {
            Source::Dir { policies, .. } => policies.reconcile_and_report(enforcer),
            Source::Kubernetes(cluster) => cluster.reconcile(enforcer),
        }
    }

    /// Waits until a change (the first one received) can be reconciled, then drops the notices
    /// of those that came meanwhile: the reconcile sees them all.
    async fn settle(&self, changed: &mut mpsc::Receiver<()>) {
        // A complete change is reconciled at once. A partial one (a file being written) waits
        // for a complete one, at most PARTIAL_WRITE_SETTLE: a writer may keep a file open for
        // good. Watch events are whole objects: reconciled at once.
        if let Source::Dir { completed, .. } = self {
            until_complete(completed, changed, PARTIAL_WRITE_SETTLE).await
        }
        while changed.try_recv().is_ok() {}
    }

    fn all_enforced(&self) -> bool {
        match self {
            Source::Dir { policies, .. } => policies.all_enforced(),
            Source::Kubernetes(cluster) => cluster.all_enforced(),
        }
    }

    /// The agent stops: the models being recorded are stored as they are.
    async fn stop_modeling(self, enforcer: &mut impl Enforce) {
        match self {
            Source::Dir { mut policies, .. } => policies.stop_modeling(enforcer),
            Source::Kubernetes(cluster) => cluster.stop_modeling(enforcer).await,
        }
    }
}

/// Waits until `completed` is set (taking it back), looking again at every notice on
/// `changed`, for at most `limit`.
async fn until_complete(completed: &AtomicBool, changed: &mut mpsc::Receiver<()>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !completed.swap(false, Ordering::Relaxed) {
        tokio::select! {
            Some(()) = changed.recv() => {}
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
}

/// Reconciles; the first time every policy is enforced, removes what earlier agents left (it
/// stays until then, so that no target is less protected than before the restart).
fn reconcile(source: &mut Source, enforcer: &mut Enforcer, retired: &mut bool) {
    source.reconcile(enforcer);
    if !*retired && source.all_enforced() {
        match enforcer.retire_previous() {
            Ok(()) => *retired = true,
            Err(err) => warn!("{err}"),
        }
    }
}

/// The Falcosidekick sink of `url`, with the TLS files the arguments name, and its worker.
fn falcosidekick(
    url: &str,
    args: &AgentArgs,
    metrics: &Metrics,
) -> anyhow::Result<(FalcoSink, FalcoWorker)> {
    let tls = TlsFiles {
        ca: args.falcosidekick_ca.clone(),
        identity: args
            .falcosidekick_cert
            .clone()
            .zip(args.falcosidekick_key.clone()),
    };
    anyhow::ensure!(
        url.starts_with("https://") || (tls.ca.is_none() && tls.identity.is_none()),
        "--falcosidekick-ca and --falcosidekick-cert are for an https:// --falcosidekick-url, \
         not {url}"
    );
    Ok(FalcoSink::start(
        url,
        &tls,
        args.falcosidekick_queue,
        metrics.http_sink.clone(),
    )?)
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.policy_dir {
        anyhow::ensure!(
            dir.is_dir(),
            "the policy directory {} does not exist",
            dir.display()
        );
    }
    let metrics = Arc::new(Metrics::new());
    // Before the programs load: a bad URL or TLS file stops the agent at once.
    let falco = match &args.falcosidekick_url {
        Some(url) => Some(falcosidekick(url, &args, &metrics)?),
        None => None,
    };
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut enforcer = Enforcer::load_pinned(PinnedState::new(&args.bpffs), &args.map_sizes())
        .context("cannot enforce")?;
    enforcer
        .set_audit_rate(Some(AuditRate {
            per_second: args.audit_rate,
            burst: args.audit_burst,
        }))
        .context("setting the audit rate")?;
    if args.bpf_stats {
        enforcer.measure_cost()?;
    }
    if args.no_open_cache {
        enforcer.turn_open_cache_off();
        info!("the open verdict cache is off: every open of a target is decided by its path");
    }
    if enforcer.replaced_pinned_state() {
        metrics.pinned_state_replaced.inc();
    }
    let rule_host = RuleHost::new(Some(args.rules_cache.clone()))?;
    let cgroups = Hierarchy::find()?;
    let deciding = Deciding::new(
        rule_host.clone(),
        metrics.rule_modules.clone(),
        cgroups.mount.clone(),
    );
    // Which pod a cgroup is: the Kubernetes reconciler knows, audit events say.
    let pods = PodRegistry::default();
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(json_sink(
        args.events.as_deref(),
        args.events_rotation(),
        &enforcer.protected_files(),
        JsonLines::new("stdout", Box::new(std::io::stdout())),
    )?)];
    let falco_worker = falco.map(|(sink, worker)| {
        sinks.push(Box::new(sink));
        worker
    });
    let mut session = Session::start(enforcer, deciding, sinks, pods.clone())?;
    // After the event worker started: it keeps the default priority.
    prioritise_this_thread();
    // Compiled modules are loaded as native code: only root may write there, and no target.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&args.rules_cache)
        .with_context(|| format!("creating {}", args.rules_cache.display()))?;
    let mut own_files = vec![args.rules_cache.as_path()];
    if let Some(policy_dir) = &args.policy_dir {
        // Models say what a target did: no target may change them.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&args.models_dir)
            .with_context(|| format!("creating {}", args.models_dir.display()))?;
        own_files.extend([policy_dir.as_path(), args.models_dir.as_path()]);
    }
    if args.kubernetes && args.rule_modules.exists() {
        own_files.push(&args.rule_modules);
    }
    session.protect_own_files(&own_files)?;

    let ready = Arc::new(AtomicBool::new(false));
    let (snapshots, mut snapshot_requests) = mpsc::channel(8);
    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("serving metrics on {}", args.metrics_address))?;
    let server = tokio::spawn(crate::http::serve(
        listener,
        Arc::new(Endpoints {
            metrics: metrics.clone(),
            ready: ready.clone(),
            snapshots,
        }),
    ));
    // Watch before the first read, so that no change can slip in between.
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    let mut dir_watcher = None;
    let mut owner = None;
    let mut source = match &args.policy_dir {
        Some(dir) => {
            let completed = Arc::new(AtomicBool::new(false));
            let watcher_completed = completed.clone();
            let mut watcher = notify::recommended_watcher(move |event| {
                let Some(change) = PolicyDir::change(&event) else {
                    return;
                };
                if change == Change::Complete {
                    watcher_completed.store(true, Ordering::Relaxed);
                }
                let _ = changed_tx.try_send(());
            })?;
            watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
            dir_watcher = Some(watcher);
            info!(dir = %dir.display(), "policies from files");
            Source::Dir {
                policies: PolicyDir::new(
                    dir.clone(),
                    cgroups,
                    rule_host,
                    metrics,
                    Models::new(ModelDir(args.models_dir.clone())),
                ),
                completed,
            }
        }
        None => {
            let node = args
                .node_name
                .clone()
                .context("--kubernetes needs --node-name (or NODE_NAME)")?;
            let client = kube::Client::try_default()
                .await
                .context("connecting to the Kubernetes API server")?;
            owner = args
                .daemonset
                .as_ref()
                .map(|daemonset| Owner::watch(client.clone(), daemonset));
            let environment = Environment {
                node: node.clone(),
                ..Environment::from_process()
            };
            let reconciler = Reconciler::new(
                cgroups,
                args.cgroup_driver,
                rule_host,
                args.rule_modules.clone(),
                environment,
                pods,
            );
            Source::Kubernetes(
                Cluster::connect(
                    client,
                    &node,
                    reconciler,
                    args.status_interval,
                    metrics,
                    changed_tx,
                )
                .await?,
            )
        }
    };
    let mut retired = false;
    reconcile(&mut source, &mut session.enforcer, &mut retired);
    ready.store(true, Ordering::Relaxed);
    info!(metrics = %args.metrics_address, "agent ready: watching for policy changes");

    // Targets come and go without the policies changing: look again now and then.
    let mut resync = tokio::time::interval(RESYNC_INTERVAL);
    let mut losses = tokio::time::interval(Duration::from_secs(10));
    let mut names = tokio::time::interval(NAMES_INTERVAL);
    // A look that takes long delays the next rather than bunching them up.
    names.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_retire_step = None;
    let mut barrier_wait = None;
    loop {
        tokio::select! {
            Some(()) = changed.recv() => {
                source.settle(&mut changed).await;
                reconcile(&mut source, &mut session.enforcer, &mut retired);
            }
            _ = resync.tick() => {
                reconcile(&mut source, &mut session.enforcer, &mut retired);
                session.enforcer.find_named_inodes_again(true);
            }
            ready = session.events_ready() => { ready?; session.pump(); }
            _ = names.tick() => session.enforcer.find_named_inodes_again(false),
            _ = losses.tick() => {
                session.report_losses();
                session.check_worker()?;
            }
            Some(reply) = snapshot_requests.recv() => {
                let _ = reply.send(snapshot(&session));
            }
            () = tokio::time::sleep_until(next_retire_step.unwrap_or_else(tokio::time::Instant::now)),
                if next_retire_step.is_some() => {
                next_retire_step = None;
                if session.enforcer.has_deletable() {
                    session.enforcer.delete_retired(DELETES_PER_TURN);
                } else if let Some(barrier) = session.enforcer.start_retiring() {
                    barrier_wait = Some(tokio::task::spawn_blocking(move || barrier.wait()));
                }
            }
            waited = async { barrier_wait.as_mut().expect("guarded").await },
                if barrier_wait.is_some() => {
                barrier_wait = None;
                let waited = waited.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
                session.enforcer.finish_retiring(waited);
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
        if next_retire_step.is_none() {
            let now = tokio::time::Instant::now();
            if session.enforcer.has_deletable() {
                next_retire_step = Some(now + DELETE_PAUSE);
            } else if session.enforcer.can_start_retiring() {
                next_retire_step = Some(now + RETIRE_DELAY);
            }
        }
    }
    source.stop_modeling(&mut session.enforcer).await;
    session.enforcer.retire_released();
    server.abort();
    drop(dir_watcher);
    session.stop_events();
    session.report_losses();
    drop(session);
    // Before the wait for Falcosidekick: the kubelet's grace period is counting.
    let uninstalling = owner.is_some_and(|owner| owner.uninstalling());
    if uninstalling {
        info!("the agent's DaemonSet was deleted with its pods: uninstalling");
        cleanup(&args.bpffs)?;
        if args.rules_cache.exists() {
            std::fs::remove_dir_all(&args.rules_cache)
                .with_context(|| format!("removing {}", args.rules_cache.display()))?;
        }
    }
    if let Some(worker) = falco_worker
        && !worker.finish(FALCO_GRACE).await
    {
        warn!(
            "events for Falcosidekick still undelivered after {} s: dropped",
            FALCO_GRACE.as_secs()
        );
    }
    if !uninstalling {
        info!(
            "agent stopped; enforcement stays pinned in the kernel (`palisade agent --cleanup` ends it)"
        );
    }
    Ok(())
}

/// Runs the calling thread (and the threads it starts from now on) at `CONTROL_NICE`.
fn prioritise_this_thread() {
    // SAFETY: no memory is passed; on Linux the nice value is the calling thread's.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, CONTROL_NICE) } != 0 {
        warn!(
            "raising the control loop's priority: {}; a busy event worker may slow it down",
            std::io::Error::last_os_error()
        );
    }
}

/// The counters `/metrics` reports: the kernel's, and what the agent did with its events.
fn snapshot(session: &Session) -> KernelSnapshot {
    fn or_default<T: Default>(read: Result<T, impl std::fmt::Display>) -> T {
        read.unwrap_or_else(|err| {
            warn!("reading the kernel's counters: {err}");
            T::default()
        })
    }
    let enforcer = &session.enforcer;
    KernelSnapshot {
        stats: or_default(enforcer.stats()),
        opens_cached: or_default(enforcer.opens_cached()),
        targets: enforcer.target_count() as u64,
        rules: or_default(enforcer.rule_counts()),
        decision_costs: or_default(enforcer.decision_costs()),
        program_runs: enforcer.program_runs(),
        agent_events: session.event_counts(),
        sink_losses: session.sink_losses(),
    }
}

/// `palisade agent --cleanup`: unpins every build's state, which detaches the programs.
pub fn cleanup(bpffs: &Path) -> anyhow::Result<()> {
    crate::bpf::remove_pinned(bpffs)
        .with_context(|| format!("removing the pinned state under {}", bpffs.display()))?;
    info!(state = %bpffs.display(), "pinned state removed: enforcement ended");
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    const LIMIT: Duration = Duration::from_millis(200);

    #[tokio::test(start_paused = true)]
    async fn a_complete_change_is_reconciled_at_once() {
        let (_notices, mut changed) = mpsc::channel(1);
        let completed = AtomicBool::new(true);
        let started = Instant::now();
        until_complete(&completed, &mut changed, LIMIT).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(!completed.load(Ordering::Relaxed), "taken back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_change_waits_for_its_completion_or_the_limit() {
        let (notices, mut changed) = mpsc::channel(1);
        let completed = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        until_complete(&completed, &mut changed, LIMIT).await;
        assert_eq!(started.elapsed(), LIMIT, "a file left open");

        let writer = completed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            notices.send(()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            writer.store(true, Ordering::Relaxed);
            notices.send(()).await.unwrap();
        });
        let started = Instant::now();
        until_complete(&completed, &mut changed, LIMIT).await;
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(50),
            "closed after 50 ms"
        );
    }
}
