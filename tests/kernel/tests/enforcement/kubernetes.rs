//! End to end with Kubernetes: the agent in the VM watches the real API server on the host (as
//! the chart's service account), the test plays the kubelet (Pod objects bound to this node, pod
//! cgroups with processes in them), and a PalisadePolicy makes the kernel deny inside the
//! selected pod only; edits and deletion take effect; the status says so. Also measures how long
//! a policy change takes to reach the kernel (written to the console for the benchmarks).

use std::{
    io::ErrorKind,
    net::{Shutdown, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use palisade_agent::targets::{Cgroup, Hierarchy};
use palisade_crds::{PalisadePolicy, READY};
use palisade_kernel_tests::{
    Answer, EPERM, binary, block_on, file, probe, probe_command, this_kernels,
};
use palisade_kube_tests::{
    Node, admin, apply_policy, eventually, eventually_within, namespace, pod, report_containers,
};

use super::{Agent, cleanup_agent, fresh_dir};

/// Makes `pod`'s cgroup, as the kubelet does when it starts it.
fn start_pod(node: &Node, pod: &Pod) -> Cgroup {
    let path = node.start(pod);
    Hierarchy::find()
        .unwrap()
        .open(&path.to_string_lossy())
        .unwrap()
}

/// What each test starts from: an admin client, this kernel's namespace `ns` (labelled
/// `tenant: <its name>`) and node `node` (a node of its own: an agent watches its node's pods).
async fn scene(ns: &str, node: &str) -> (Client, String, Node) {
    let (ns, node) = (this_kernels(ns), Node::this_machine(&this_kernels(node)));
    let client = admin().await;
    namespace(&client, &ns, &[("tenant", &ns)]).await;
    std::fs::create_dir_all(node.best_effort()).unwrap();
    (client, ns, node)
}

/// Pod `name` labelled `app: <app>`, bound to `node` and started there.
async fn running_pod(client: &Client, ns: &str, node: &Node, name: &str, app: &str) -> Cgroup {
    start_pod(
        node,
        &pod(client, ns, name, &node.name, &[("app", app)]).await,
    )
}

/// The kubeconfig of the chart's service account.
fn agent_kubeconfig() -> PathBuf {
    binary("PALISADE_AGENT_KUBECONFIG")
}

/// `palisade agent --kubernetes` for `node` (as `kubeconfig` says), writing statuses at most
/// every `status_interval`, once ready; `name` names its log and events.
fn kube_agent(
    name: &str,
    node: &Node,
    bpffs: &str,
    kubeconfig: &Path,
    status_interval: &str,
) -> Agent {
    let agent = Agent::spawn(
        name,
        &[
            "--kubernetes",
            "--node-name",
            &node.name,
            "--bpffs",
            bpffs,
            "--cgroup-driver",
            "systemd",
            "--status-interval",
            status_interval,
            "--rule-modules",
            fresh_dir(&format!("/tmp/{name}-modules")),
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    agent.wait_for_log("agent ready");
    agent
}

fn policy(namespace: &str, denied: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: web\n  namespace: {namespace}\nspec:\n  target:\n    selector: {{matchLabels: {{app: web}}}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    auditViolations: true\n    customRules:\n      files:\n        - name: secret\n          paths: [{denied}]\n          permissions: [read]\n          action: deny\n"
    )
}

/// Applies `document` through `client` (connected already, as a controller's or kubectl's
/// long-lived client is) and returns how long until a process reading `path` in `pod` every
/// millisecond first got EPERM.
async fn apply_and_time(client: &Client, document: &str, pod: &Cgroup, path: &str) -> Duration {
    let mut reader = probe_command(Some(pod), &["read-until-denied", path]);
    // SAFETY: setpriority is async-signal-safe. The reader is the pod's: default priority.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut reader, || {
            set_nice(0, 0);
            Ok(())
        })
    };
    let reader = reader.spawn().expect("starting the reader");
    let pid = reader.id() as i32;
    // Let it start reading (and be allowed) before the change.
    std::thread::sleep(Duration::from_millis(300));
    let applied = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    apply_policy(client, document).await;
    let finished = tokio::task::spawn_blocking(move || reader.wait_with_output());
    let Ok(out) = tokio::time::timeout(Duration::from_secs(60), finished).await else {
        // SAFETY: killing the reader this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("{path} was not denied in the pod within 60 s");
    };
    let out = out.unwrap().unwrap();
    let denied: u128 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a time");
    Duration::from_nanos((denied - applied.as_nanos()) as u64)
}

/// Sets the nice value of thread `tid` (0: the calling thread).
fn set_nice(tid: libc::id_t, nice: i32) {
    // SAFETY: no memory is passed. As root, any value may be set.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
}

/// While it lives, every thread of this process (and those they start) runs at the lowest
/// priority.
struct LowestPriority;

impl LowestPriority {
    fn new() -> Self {
        renice_this_process(19);
        Self
    }
}

impl Drop for LowestPriority {
    fn drop(&mut self) {
        renice_this_process(0);
    }
}

fn renice_this_process(nice: i32) {
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(tid) = task.file_name().to_string_lossy().parse() {
            set_nice(tid, nice);
        }
    }
}

#[test]
fn kubernetes_policies_reach_the_selected_pods_only() {
    block_on(end_to_end());
}

async fn end_to_end() {
    let (client, ns, node) = scene("e2e", "vm").await;
    let web = running_pod(&client, &ns, &node, "web", "web").await;
    let db = running_pod(&client, &ns, &node, "db", "db").await;
    let first = file("/tmp/kube/first");
    let second = file("/tmp/kube/second");

    let bpffs = "/sys/fs/bpf/palisade-test-kube";
    // Statuses written as often as by default: the API server handles a status write and a
    // policy update of one object one after the other, and the updates are measured.
    let agent = kube_agent("kube-agent", &node, bpffs, &agent_kubeconfig(), "10s");

    // While latencies are measured, this test's API client stands in for one on another machine
    // (kubectl, a controller): on this one-CPU VM, its work must not take the CPU from the node's
    // agent and pods. The readers, the pod's processes, keep the default priority.
    let lowest = LowestPriority::new();
    let created = apply_and_time(&client, &policy(&ns, first), &web, first).await;
    assert_eq!(
        probe(Some(&db), &["read", first]),
        Answer::Ok,
        "another pod"
    );
    assert_eq!(
        probe(None, &["read", first]),
        Answer::Ok,
        "outside every pod"
    );

    // Audit events name the pod and the container (by its cgroup's name, containerd's here).
    let container_id = "c".repeat(64);
    let scope = web
        .path
        .join(format!("cri-containerd-{container_id}.scope"));
    std::fs::create_dir(&scope).unwrap();
    report_containers(
        &client,
        &ns,
        "web",
        &[("main", &format!("containerd://{container_id}"))],
    )
    .await;
    let in_container = Hierarchy::find()
        .unwrap()
        .open(&scope.to_string_lossy())
        .unwrap();
    let named = eventually("an event naming the pod's container", async || {
        assert_eq!(probe(Some(&in_container), &["read", first]), EPERM);
        let events = std::fs::read_to_string("/tmp/kube-agent-events.jsonl").ok()?;
        events
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|event| event["kubernetes"]["container"] == "main")
    })
    .await;
    assert_eq!(named["kubernetes"]["namespace"], ns.as_str());
    assert_eq!(named["kubernetes"]["pod"], "web");
    assert_eq!(named["policy"], format!("{ns}/web"));

    // Edits take effect: the new path is denied, the old one no longer.
    let mut updates = vec![apply_and_time(&client, &policy(&ns, second), &web, second).await];
    assert_eq!(probe(Some(&web), &["read", first]), Answer::Ok);
    // More edits, alternating, for the latency's spread (PALISADE_APPLY_UPDATES in all, for
    // benchmarks/results: `cargo xtask vm-test --apply-updates 100`).
    let count: usize = std::env::var("PALISADE_APPLY_UPDATES")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(10);
    let mut denied = second;
    for round in 0..count.saturating_sub(1) {
        denied = if round % 2 == 0 { first } else { second };
        updates.push(apply_and_time(&client, &policy(&ns, denied), &web, denied).await);
    }

    drop(lowest);

    // The status says what this node did.
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), &ns);
    let status = eventually("the node's status entry", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let generation = policies.get("web").await.ok()?.metadata.generation;
        (status.observed_generation == generation && !status.nodes.is_empty()).then_some(status)
    })
    .await;
    let ready = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == READY)
        .expect("Ready");
    assert_eq!(ready.status, "True");
    assert_eq!(status.nodes[0].node, node.name);
    assert_eq!(
        (status.nodes[0].enforced_pods, status.nodes[0].failed_pods),
        (1, 0)
    );

    // A pod scheduled after the policy: armed before the kubelet makes its cgroup, so its very
    // first process is confined.
    let late = pod(&client, &ns, "web-late", &node.name, &[("app", "web")]).await;
    let armed = format!("subject=pod {ns}/web-late");
    eventually("the late pod armed", async || {
        let log = agent.log();
        let line = log.lines().find(|line| line.contains(&armed))?;
        assert!(line.contains("armed until created"), "{line}");
        Some(())
    })
    .await;
    let late = start_pod(&node, &late);
    assert_eq!(
        probe(Some(&late), &["read", denied]),
        EPERM,
        "from its first process; the agent's log:\n{}",
        agent.log()
    );

    // Deleting the policy ends it.
    policies.delete("web", &Default::default()).await.unwrap();
    eventually("the policy off", async || {
        (probe(Some(&web), &["read", denied]) == Answer::Ok).then_some(())
    })
    .await;
    // The agent's share: from the watch event to the map entries committed, on average.
    let (_, metrics) = super::observability::http_get("/metrics").unwrap();
    let metric = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let in_agent_ms = metric("palisade_policy_apply_seconds_sum ") * 1e3
        / metric("palisade_policy_apply_seconds_count ");
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);

    // For benchmarks/results: the VM's init prints it, cargo xtask vm-test saves it.
    let millis = |latency: &Duration| latency.as_secs_f64() * 1e3;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let measured = serde_json::json!({
        "kernel": release.trim(),
        "create_to_enforce_ms": millis(&created),
        "apply_to_enforce_ms": updates.iter().map(millis).collect::<Vec<_>>(),
        "in_agent_mean_ms": in_agent_ms,
    });
    std::fs::create_dir_all("/tmp/palisade-results").unwrap();
    std::fs::write(
        "/tmp/palisade-results/apply-latency.json",
        measured.to_string(),
    )
    .unwrap();
}

#[test]
fn a_broken_policy_never_releases_a_pod_even_across_a_restart() {
    block_on(fail_closed());
}

/// `policy` made unable to compile: its rule module is not there.
fn broken(policy: &str) -> String {
    let digest = "0".repeat(64);
    format!(
        "{policy}  ruleModules:\n    - {{name: absent, module: absent.wasm, sha256: \"{digest}\"}}\n"
    )
}

/// Waits until this node has seen the current generation of policy `web` in `ns` and found it
/// rejected.
async fn rejected(policies: &Api<PalisadePolicy>) {
    eventually("web rejected", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let generation = policies.get("web").await.ok()?.metadata.generation;
        let ready = status
            .conditions
            .iter()
            .find(|condition| condition.type_ == READY)?;
        (status.observed_generation == generation && ready.reason == "Rejected").then_some(())
    })
    .await;
}

async fn fail_closed() {
    let (client, ns, node) = scene("fail-closed", "vm-fail-closed").await;
    let web = running_pod(&client, &ns, &node, "web", "web").await;
    let baseline_file = file("/tmp/fail-closed/baseline");
    let own_file = file("/tmp/fail-closed/own");
    apply_policy(
        &client,
        &format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadeClusterPolicy\nmetadata:\n  name: {ns}\nspec:\n  target:\n    selector: {{}}\n    namespaceSelector: {{matchLabels: {{tenant: {ns}}}}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n      files:\n        - name: secret\n          paths: [{baseline_file}]\n          permissions: [read]\n          action: deny\n"
        ),
    )
    .await;
    let bpffs = "/sys/fs/bpf/palisade-test-fail-closed";
    let denied = async |cgroup: &Cgroup, path: &str| {
        eventually("denied", async || {
            (probe(Some(cgroup), &["read", path]) == EPERM).then_some(())
        })
        .await
    };
    let agent = kube_agent("fail-closed-agent", &node, bpffs, &agent_kubeconfig(), "1s");
    denied(&web, baseline_file).await;

    // The namespace's own policy wins selection and is broken: the pod keeps the cluster
    // policy, and a pod started meanwhile gets it.
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), &ns);
    apply_policy(&client, &broken(&policy(&ns, own_file))).await;
    rejected(&policies).await;
    assert_eq!(probe(Some(&web), &["read", baseline_file]), EPERM, "kept");
    let late = running_pod(&client, &ns, &node, "web-late", "web").await;
    denied(&late, baseline_file).await;

    // Fixed, it takes over.
    apply_policy(&client, &policy(&ns, own_file)).await;
    denied(&web, own_file).await;
    denied(&late, own_file).await;
    assert_eq!(probe(Some(&web), &["read", baseline_file]), Answer::Ok);

    // Killed, and broken again before the next agent starts: that agent cannot enforce the
    // policy, so it keeps what the killed one left in the kernel.
    agent.stop(libc::SIGKILL);
    apply_policy(&client, &broken(&policy(&ns, own_file))).await;
    let agent = kube_agent(
        "fail-closed-agent-2",
        &node,
        bpffs,
        &agent_kubeconfig(),
        "1s",
    );
    rejected(&policies).await;
    for pod in [&web, &late] {
        assert_eq!(
            probe(Some(pod), &["read", own_file]),
            EPERM,
            "the previous agent's entries were retired or replaced: {}",
            agent.log()
        );
    }
    // A pod the killed agent did not protect gets the next policy that selects it.
    let new = running_pod(&client, &ns, &node, "web-new", "web").await;
    denied(&new, baseline_file).await;
    assert_eq!(
        probe(Some(&web), &["read", own_file]),
        EPERM,
        "still the previous agent's"
    );

    // Fixed again: enforced by the new agent.
    apply_policy(&client, &policy(&ns, baseline_file)).await;
    denied(&web, baseline_file).await;
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

/// A TCP relay in the guest between the agent and the API server. Cut, it is the API server
/// gone for the agent (its connections closed, new ones refused) while the test still reaches
/// the API server directly; restored, the API server is back on the same address.
struct Relay {
    upstream: String,
    port: u16,
    accepting: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    /// A relay to the API server `kubeconfig` names, and a kubeconfig that goes through it.
    fn start(kubeconfig: &Path, relayed: &str) -> Self {
        let config = std::fs::read_to_string(kubeconfig).unwrap();
        let server = config
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: https://"))
            .expect("a server in the kubeconfig")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // The API server's certificate names 127.0.0.1 too.
        let through = config.replace(&server, &format!("127.0.0.1:{port}"));
        std::fs::write(relayed, through).unwrap();
        let mut relay = Self {
            upstream: server,
            port,
            accepting: None,
            connections: Arc::default(),
            accepted: Arc::default(),
        };
        relay.accept(listener);
        relay
    }

    fn accept(&mut self, listener: TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (stopping, upstream) = (stop.clone(), self.upstream.clone());
        let (connections, accepted) = (self.connections.clone(), self.accepted.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(err) if err.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(err) => panic!("relay: {err}"),
                };
                client.set_nonblocking(false).unwrap();
                let server = TcpStream::connect(&upstream).unwrap();
                accepted.fetch_add(1, Ordering::Relaxed);
                let mut open = connections.lock().unwrap();
                for stream in [&client, &server] {
                    open.push(stream.try_clone().unwrap());
                }
                let (client_in, server_in) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client_in, server));
                std::thread::spawn(move || pipe(server_in, client));
            }
        });
        self.accepting = Some((stop, thread));
    }

    /// Refuses new connections and closes the open ones.
    fn cut(&mut self) {
        let (stop, thread) = self.accepting.take().expect("relaying");
        stop.store(true, Ordering::Relaxed);
        thread.join().unwrap();
        for stream in self.connections.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn restore(&mut self) {
        self.accept(TcpListener::bind(("127.0.0.1", self.port)).unwrap());
    }

    /// Connections relayed so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// Copies what `from` reads to `to` until either end closes.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

#[test]
fn an_api_server_outage_keeps_enforcement_and_the_agent_catches_up() {
    block_on(outage());
}

/// The API server gone for 30 s, and the policy edited meanwhile: the pod stays protected
/// throughout, the agent keeps running, and once the API server is back it enforces the edit
/// and reports it in the status.
async fn outage() {
    let (client, ns, node) = scene("outage", "vm-outage").await;
    let web = running_pod(&client, &ns, &node, "web", "web").await;
    let (first, second) = (file("/tmp/outage/first"), file("/tmp/outage/second"));
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), &ns);
    // The node's status entry for the policy's current generation, once it has one. (The
    // policy-wide generation and conditions are any node's: an agent of another test may write
    // them while this node's entry still tells of the generation before.)
    let reported = async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let generation = policies.get("web").await.ok()?.metadata.generation;
        let ready = status
            .conditions
            .iter()
            .find(|condition| condition.type_ == READY)?;
        (status.observed_generation == generation
            && ready.status == "True"
            && status.nodes.iter().any(|entry| {
                entry.node == node.name
                    && Some(entry.observed_generation) == generation
                    && (entry.enforced_pods, entry.failed_pods) == (1, 0)
            }))
        .then_some(())
    };
    apply_policy(&client, &policy(&ns, first)).await;

    let kubeconfig = "/tmp/outage-kubeconfig";
    let mut relay = Relay::start(&agent_kubeconfig(), kubeconfig);
    let bpffs = "/sys/fs/bpf/palisade-test-outage";
    let agent = kube_agent("outage-agent", &node, bpffs, Path::new(kubeconfig), "1s");
    eventually("the policy enforced", async || {
        (probe(Some(&web), &["read", first]) == EPERM).then_some(())
    })
    .await;
    eventually("the status reported", &reported).await;
    assert!(relay.accepted() > 0, "the agent does not use the relay");

    relay.cut();
    apply_policy(&client, &policy(&ns, second)).await;
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(30) {
        assert_eq!(
            probe(Some(&web), &["read", first]),
            EPERM,
            "protection kept"
        );
        assert_eq!(probe(None, &["read", first]), Answer::Ok, "outside the pod");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        reported().await.is_none(),
        "the agent reported an edit it cannot have seen"
    );

    // Back: the watches resume (after their backoff, up to 30 s) and the edit takes effect.
    relay.restore();
    eventually_within(Duration::from_secs(120), "the edit enforced", async || {
        let now = (
            probe(Some(&web), &["read", second]),
            probe(Some(&web), &["read", first]),
        );
        (now == (EPERM, Answer::Ok)).then_some(())
    })
    .await;
    eventually_within(Duration::from_secs(60), "the status caught up", &reported).await;
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}
