//! Helpers for the Kubernetes tests, which run against the real API server that `cargo xtask
//! kube-test` starts (with the Helm chart installed): clients as admin and as the agent (the
//! chart's service account, so its RBAC is what is tested), pods created the way a kubelet would
//! see them, a node's cgroup tree in a directory, and agents running on it with a recording kernel.
//! Without that API server the tests fail; they never skip.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use palisade_agent::{
    k8s::{Cluster, Reconciler},
    metrics::Metrics,
    policy::{CompiledPolicy, Environment},
    rules::RuleHost,
    targets::{FakeKernel, Hierarchy, PodRegistry},
};
use serde_json::json;
use tokio::{sync::mpsc, task::JoinHandle};

const MANAGER: &str = "palisade-tests";

async fn client_from(variable: &str) -> Client {
    let path = std::env::var(variable).unwrap_or_else(|_| {
        panic!("{variable} is not set: these tests run against the API server that `cargo xtask kube-test` starts")
    });
    let kubeconfig = Kubeconfig::read_from(&path).expect("a readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

/// A client with every right (system:masters).
pub async fn admin() -> Client {
    client_from("KUBECONFIG").await
}

/// A client with the agent's rights: the chart's service account and RBAC.
pub async fn agent_client() -> Client {
    client_from("PALISADE_AGENT_KUBECONFIG").await
}

/// Creates (or updates) namespace `name` with `labels`; returns once its `default` service
/// account exists (pods need it, and the controller manager makes it soon after).
pub async fn namespace(client: &Client, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels},
            })),
        )
        .await
        .expect("applying a namespace");
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), name);
    eventually("the namespace's default service account", async || {
        accounts
            .get_opt("default")
            .await
            .expect("reading a service account")
    })
    .await;
}

/// Creates pod `name` bound to `node` with `labels`, as the scheduler leaves it for the
/// kubelet; the API server gives it its UID and QoS class.
pub async fn pod(
    client: &Client,
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> Pod {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "registry.example/app:1"}],
                },
            }))
            .expect("a pod"),
        )
        .await
        .expect("creating a pod")
}

/// Reports the containers of pod `name` running, with container runtime ids, as the kubelet
/// does: (container name, id such as `containerd://ID`).
pub async fn report_containers(
    client: &Client,
    namespace: &str,
    name: &str,
    containers: &[(&str, &str)],
) {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|(container, id)| {
            json!({
                "name": container, "containerID": id, "image": "registry.example/app:1",
                "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}},
            })
        })
        .collect();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "containerStatuses": statuses}})),
        )
        .await
        .expect("reporting a pod's containers");
}

pub async fn relabel_pod(client: &Client, namespace: &str, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("relabelling a pod");
}

/// Deletes pod `name` at once (no kubelet confirms it).
pub async fn delete_pod(client: &Client, namespace: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .expect("deleting a pod");
}

/// Applies a policy document (YAML, either kind) as the tests' field manager.
pub async fn apply_policy(client: &Client, document: &str) {
    let document: serde_json::Value = serde_yaml::from_str(document).expect("a YAML policy");
    let name = document["metadata"]["name"].as_str().expect("a name");
    let params = PatchParams::apply(MANAGER).force();
    let result = match document["metadata"]["namespace"].as_str() {
        Some(namespace) => {
            Api::<palisade_crds::PalisadePolicy>::namespaced(client.clone(), namespace)
                .patch(name, &params, &Patch::Apply(&document))
                .await
                .map(drop)
        }
        None => Api::<palisade_crds::PalisadeClusterPolicy>::all(client.clone())
            .patch(name, &params, &Patch::Apply(&document))
            .await
            .map(drop),
    };
    result.expect("applying a policy");
}

/// Waits up to 30 s for `check` to hold, asking it again every 100 ms.
pub async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(Duration::from_secs(30), what, check).await
}

/// `eventually`, waiting up to `limit`.
pub async fn eventually_within<T>(
    limit: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node's cgroup v2 tree: the kubelet's QoS cgroups (systemd layout), and pod cgroups made as
/// the kubelet starts pods.
pub struct Node {
    pub name: String,
    pub root: PathBuf,
    /// A scratch directory standing in for the tree, removed at the end.
    scratch: bool,
}

impl Node {
    /// A node whose tree is a scratch directory.
    pub fn new(name: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("palisade-kube-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("kubepods.slice/kubepods-burstable.slice")).unwrap();
        Self {
            name: name.to_owned(),
            root,
            scratch: true,
        }
    }

    /// This machine, with its real cgroup2 hierarchy at /sys/fs/cgroup (in the test VM).
    pub fn this_machine(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            root: PathBuf::from("/sys/fs/cgroup"),
            scratch: false,
        }
    }

    /// The directory of the QoS class BestEffort, which the kubelet makes for the first such pod.
    pub fn best_effort(&self) -> PathBuf {
        self.root.join("kubepods.slice/kubepods-besteffort.slice")
    }

    /// Where `pod`'s cgroup is: (parent directory, name).
    pub fn pod_cgroup(&self, pod: &Pod) -> (PathBuf, String) {
        let uid = pod
            .metadata
            .uid
            .as_deref()
            .expect("a created pod")
            .replace('-', "_");
        let qos = pod
            .status
            .as_ref()
            .and_then(|status| status.qos_class.as_deref());
        assert_eq!(qos, Some("BestEffort"), "test pods have no resources");
        (
            self.best_effort(),
            format!("kubepods-besteffort-pod{uid}.slice"),
        )
    }

    /// Makes `pod`'s cgroup, as the kubelet does when it starts the pod; returns its path.
    pub fn start(&self, pod: &Pod) -> PathBuf {
        let (parent, name) = self.pod_cgroup(pod);
        std::fs::create_dir_all(parent.join(&name)).unwrap();
        parent.join(name)
    }

    pub fn id(&self, path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// `palisade agent --kubernetes` on a `Node`, its kernel a recording one: reconciles at every
/// change and every 200 ms, writes statuses at most every 100 ms.
pub struct Agent {
    pub kernel: Arc<Mutex<FakeKernel>>,
    /// Which pod and container each cgroup is, as audit events will say.
    pub pods: PodRegistry,
    /// Whether the last reconcile protected every selected pod: what lets the real agent retire
    /// the kernel state of the agent before it.
    all_enforced: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Agent {
    pub async fn start(node: &Node) -> Self {
        Self::start_with(node, Arc::default()).await
    }

    /// An agent on a kernel an earlier agent left as it was (a restart).
    pub async fn start_with(node: &Node, kernel: Arc<Mutex<FakeKernel>>) -> Self {
        let pods = PodRegistry::default();
        let reconciler = Reconciler::new(
            Hierarchy::at(node.root.clone(), Path::new("/")),
            None,
            RuleHost::new(None).expect("a rule host"),
            node.root.join("no-modules-here"),
            Environment {
                node: node.name.clone(),
                ..Environment::default()
            },
            pods.clone(),
        );
        let (changed_tx, mut changed) = mpsc::channel(1);
        let mut cluster = Cluster::connect(
            agent_client().await,
            &node.name,
            reconciler,
            Duration::from_millis(100),
            Arc::new(Metrics::new()),
            changed_tx,
        )
        .await
        .expect("the agent's reflectors start");
        cluster.reconcile(&mut *kernel.lock().unwrap());
        let all_enforced = Arc::new(AtomicBool::new(cluster.all_enforced()));
        let (shared, enforced) = (kernel.clone(), all_enforced.clone());
        let task = tokio::spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_millis(200), changed.recv()).await;
                cluster.reconcile(&mut *shared.lock().unwrap());
                enforced.store(cluster.all_enforced(), Ordering::Relaxed);
            }
        });
        Self {
            kernel,
            pods,
            all_enforced,
            task,
        }
    }

    /// Stops the agent; its kernel stays as it was.
    pub fn stop(self) -> Arc<Mutex<FakeKernel>> {
        self.task.abort();
        self.kernel.clone()
    }

    pub fn all_enforced(&self) -> bool {
        self.all_enforced.load(Ordering::Relaxed)
    }

    /// The policy enforced on cgroup `id`, if any.
    pub fn enforced(&self, id: u64) -> Option<Arc<CompiledPolicy>> {
        self.kernel.lock().unwrap().enforced.get(&id).cloned()
    }

    /// The policy armed for the cgroup `name` below the directory `parent`, if any.
    pub fn armed(&self, node: &Node, parent: &Path, name: &str) -> Option<Arc<CompiledPolicy>> {
        let key = (node.id(parent), name.to_owned());
        self.kernel.lock().unwrap().staged.get(&key).cloned()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The names of the rules of a compiled policy.
pub fn rule_names(policy: &CompiledPolicy) -> Vec<String> {
    policy
        .rules()
        .iter()
        .map(|rule| rule.name.clone())
        .collect()
}
