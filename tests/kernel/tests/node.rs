//! A real Kubernetes node in the VM: containerd and runc (Debian's packages), the CNI bridge
//! plugin, and a kubelet built from the Kubernetes release the test API server runs, registered
//! to that API server on the host. Images come from OCI archives imported into containerd (no
//! registry is reachable): the pause image and a busybox image that `cargo xtask vm-test` builds,
//! and the agent's image (`cargo xtask image`), which the chart, installed there with helm, runs.
//!
//! The node runs for the whole binary (the tests share it); each kernel's boot registers a node
//! of its own name.

use std::{
    path::Path,
    process::{Child, Command},
    sync::{Mutex, OnceLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
};
use palisade_agent::behavior::{Allowlist, BehaviorModel};
use palisade_crds::{PalisadeBehaviorModel, PalisadePolicy, READY};
use palisade_kernel_tests::{binary, block_on, this_kernels};
use palisade_kube_tests::{admin, apply_policy, namespace};
use serde_json::json;

/// An image `cargo xtask vm-test` builds and the VM imports, by the variable that names it.
fn image(variable: &str) -> String {
    std::env::var(variable)
        .unwrap_or_else(|_| panic!("{variable} must be set (run in the VM harness)"))
}

/// Starts `program` with its output in /tmp/NAME.log.
fn daemon(name: &str, program: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(format!("/tmp/{name}.log")).unwrap();
    Command::new(program)
        .args(args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|err| panic!("starting {program}: {err}"))
}

fn log(name: &str) -> String {
    std::fs::read_to_string(format!("/tmp/{name}.log")).unwrap_or_default()
}

fn write(path: &str, text: &str) {
    std::fs::create_dir_all(Path::new(path).parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The node's daemons, started once for the binary.
struct TheNode {
    name: String,
    daemons: Mutex<Vec<(&'static str, Child)>>,
}

impl TheNode {
    /// Panics with its log when a daemon has exited.
    fn check_running(&self) {
        for (name, daemon) in self.daemons.lock().unwrap().iter_mut() {
            if let Ok(Some(status)) = daemon.try_wait() {
                panic!("{name} exited ({status}):\n{}", tail(&log(name)));
            }
        }
    }
}

/// containerd with the CRI plugin on runc and the CNI bridge (pods get 10.88.0.0/16 on cni0),
/// the images imported, then the kubelet (cgroupfs driver, as the agent's tests expect of a
/// node without systemd), registered as `this_kernels("node")` with a client certificate in
/// `system:nodes`.
fn the_node() -> &'static TheNode {
    static NODE: OnceLock<TheNode> = OnceLock::new();
    NODE.get_or_init(|| {
        // Their state lives on tmpfs: overlayfs needs an upper directory that is not rootfs.
        for dir in ["/var/lib/containerd", "/var/lib/kubelet", "/run/containerd"] {
            std::fs::create_dir_all(dir).unwrap();
            let status = Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs", dir])
                .status()
                .unwrap();
            assert!(status.success(), "mounting tmpfs on {dir}");
        }
        let bin = binary("PALISADE_NODE_BIN");
        let bin = bin.to_str().unwrap();
        write(
            "/etc/containerd/config.toml",
            &format!(
                r#"version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # The VM's root is the initramfs, which pivot_root(2) cannot leave.
        NoPivotRoot = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "/etc/cni/net.d"
"#,
                pause = image("PALISADE_PAUSE_IMAGE"),
            ),
        );
        write(
            "/etc/cni/net.d/10-bridge.conflist",
            &json!({
                "cniVersion": "1.0.0",
                "name": "pods",
                "plugins": [
                    {
                        "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": "10.88.0.0/16"}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    },
                    {"type": "loopback"},
                ],
            })
            .to_string(),
        );
        let mut containerd = daemon(
            "containerd",
            &format!("{bin}/containerd"),
            &["--config", "/etc/containerd/config.toml"],
        );
        let socket = Path::new("/run/containerd/containerd.sock");
        for _ in 0..480 {
            if socket.exists() {
                break;
            }
            if let Some(status) = containerd.try_wait().unwrap() {
                panic!(
                    "containerd exited ({status}):\n{}",
                    tail(&log("containerd"))
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        assert!(
            socket.exists(),
            "containerd has no socket after 120 s:\n{}",
            tail(&log("containerd"))
        );
        let images = binary("PALISADE_NODE_IMAGES");
        for entry in std::fs::read_dir(&images).unwrap() {
            let archive = entry.unwrap().path();
            let out = Command::new(format!("{bin}/ctr"))
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(&archive)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "importing {}: {}{}",
                archive.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        let name = this_kernels("node");
        // The kubelet reads the users (user namespaces' mappings) and the machine's id;
        // containerd gives each pod a copy of the node's hosts file.
        write("/etc/hosts", "127.0.0.1 localhost\n");
        write("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n");
        write("/etc/group", "root:x:0:\n");
        write("/etc/machine-id", "0123456789abcdef0123456789abcdef\n");
        write(
            "/etc/kubernetes/kubelet.yaml",
            &json!({
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "cgroupDriver": "cgroupfs",
                "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
                "failSwapOn": false,
                // The API server cannot reach the kubelet's port (the VM's network is QEMU's user
                // network): nothing calls it, and it only listens on loopback.
                "address": "127.0.0.1",
                "authentication": {"anonymous": {"enabled": false}, "webhook": {"enabled": false}},
                "authorization": {"mode": "AlwaysAllow"},
                "resolvConf": "",
                // A RAM-backed node: the defaults would evict pods at once.
                "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                                 "imagefs.available": "1%"},
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "registerNode": true,
            })
            .to_string(),
        );
        let kubeconfig = binary("PALISADE_NODE_KUBECONFIG");
        let kubelet = daemon(
            "kubelet",
            &format!("{bin}/kubelet"),
            &[
                "--config=/etc/kubernetes/kubelet.yaml",
                &format!("--kubeconfig={}", kubeconfig.display()),
                &format!("--hostname-override={name}"),
                "--node-ip=10.0.2.15",
                "--v=2",
            ],
        );
        TheNode {
            name,
            daemons: Mutex::new(vec![("containerd", containerd), ("kubelet", kubelet)]),
        }
    })
}

/// The end of a log, its lines cut in pieces the VM's console shows whole.
fn tail(text: &str) -> String {
    let lines: Vec<String> = text
        .lines()
        .flat_map(|line| {
            let chars: Vec<char> = line.chars().collect();
            chars
                .chunks(250)
                .map(|piece| piece.iter().collect::<String>())
                .collect::<Vec<_>>()
        })
        .collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// The nodes group's rights (the `system:node` role), which the Node authorizer gives where it
/// runs; the test API server authorizes with RBAC only.
async fn grant_node_rights(client: &Client) {
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .patch(
            "palisade-test-nodes",
            &PatchParams::apply("palisade-node-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "palisade-test-nodes"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                              "name": "system:nodes"}],
            })),
        )
        .await
        .expect("binding system:node to the nodes");
}

/// Deletes the nodes earlier boots registered (one per kernel, each gone with its VM), so that
/// nothing is scheduled or counted on them.
async fn forget_other_nodes(client: &Client) {
    let nodes = Api::<Node>::all(client.clone());
    let this = this_kernels("node");
    for node in nodes
        .list(&Default::default())
        .await
        .expect("listing nodes")
    {
        let name = node.metadata.name.unwrap_or_default();
        if name.starts_with("node-") && name != this {
            nodes
                .delete(&name, &DeleteParams::default())
                .await
                .expect("deleting an earlier boot's node");
        }
    }
}

/// Deletes pod `name` at once (its containers stop with the grace of none) and waits until it
/// is gone; a pod an earlier run left is removed the same way.
async fn remove_pod(pods: &Api<Pod>, name: &str) {
    delete_pod(pods, name, &DeleteParams::default().grace_period(0)).await;
}

/// Deletes pod `name` as `params` say and waits until it is gone.
async fn delete_pod(pods: &Api<Pod>, name: &str, params: &DeleteParams) {
    let _ = pods.delete(name, params).await;
    for _ in 0..600 {
        if pods.get_opt(name).await.expect("reading a pod").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod {name} still exists 60 s after its deletion");
}

async fn ready(client: &Client, name: &str) -> bool {
    let Ok(node) = Api::<Node>::all(client.clone()).get(name).await else {
        return false;
    };
    node.status
        .and_then(|status| status.conditions)
        .unwrap_or_default()
        .iter()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// Asks `check` every 250 ms until it holds; panics with the daemons' logs after `limit`, or at
/// once when one of them has exited.
async fn eventually_on_node<T>(
    node: &TheNode,
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        node.check_running();
        if started.elapsed() > limit {
            panic!(
                "timed out waiting for {what}\n--- containerd\n{}\n--- kubelet\n{}",
                tail(&log("containerd")),
                tail(&log("kubelet"))
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The node, registered and Ready, and an admin client.
async fn ready_node() -> (Client, &'static TheNode) {
    let client = admin().await;
    grant_node_rights(&client).await;
    forget_other_nodes(&client).await;
    let node = the_node();
    eventually_on_node(
        node,
        "the node to be Ready",
        Duration::from_secs(300),
        async || ready(&client, &node.name).await.then_some(()),
    )
    .await;
    (client, node)
}

/// Runs pod `name` of `namespace`, labelled `app`, on the node to its end: busybox's shell runs
/// `script`. Returns its phase and what it printed; the pod is removed.
async fn run_pod(
    client: &Client,
    node: &TheNode,
    namespace: &str,
    (name, app): (&str, &str),
    script: &str,
) -> (String, String) {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    remove_pod(&pods, name).await;
    pods.create(
        &Default::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {
                "nodeName": node.name,
                "automountServiceAccountToken": false,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main",
                    "image": image("PALISADE_BUSYBOX_IMAGE"),
                    "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "sh", "-c", script],
                }],
            },
        }))
        .unwrap(),
    )
    .await
    .expect("creating a pod");
    let phase = eventually_on_node(
        node,
        &format!("pod {name} to finish"),
        Duration::from_secs(300),
        async || {
            let phase = pods.get(name).await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
    .await;
    // The API server cannot reach the kubelet for logs: the kubelet's files have them.
    let logs = pod_logs(namespace, name, "main");
    remove_pod(&pods, name).await;
    (phase, logs)
}

#[test]
fn the_kubelet_registers_the_node_and_runs_a_pod_from_a_local_image() {
    block_on(async {
        let (client, node) = ready_node().await;
        let ns = node.name.clone();
        namespace(&client, &ns, &[]).await;
        let (phase, logs) = run_pod(
            &client,
            node,
            &ns,
            ("hello", "hello"),
            "/bin/busybox ip -4 addr show eth0 | /bin/busybox grep -q 'inet 10.88.' && echo hello from the pod network",
        )
        .await;
        assert_eq!(phase, "Succeeded", "the pod failed: {logs}");
        assert!(logs.contains("hello from the pod network"), "{logs}");
    });
}

/// Runs `helm` with `args` as admin.
fn helm(args: &[&str]) -> String {
    let out = Command::new(binary("PALISADE_NODE_BIN").join("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", "/tmp/helm/cache")
        .env("HELM_CONFIG_HOME", "/tmp/helm/config")
        .env("HELM_DATA_HOME", "/tmp/helm/data")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helm {args:?}: {text}");
    text
}

/// A pod's shell command that writes /srv/secret and reads it back.
const READ_A_SECRET: &str =
    "/bin/busybox mkdir /srv && echo s3cret > /srv/secret && /bin/busybox cat /srv/secret";

/// The programs of the agent's kinds loaded on this machine: on LSM hooks, or on kernel
/// functions (the agent's on `__d_move`).
fn agent_programs() -> usize {
    use aya_obj::generated::bpf_prog_type::{BPF_PROG_TYPE_LSM, BPF_PROG_TYPE_TRACING};
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|program| {
            matches!(
                program.program_type(),
                BPF_PROG_TYPE_LSM | BPF_PROG_TYPE_TRACING
            )
        })
        .count()
}

/// The chart installed as a user would (the image `cargo xtask image` built, imported into
/// containerd): the agent pod becomes Ready on the node, a PalisadePolicy denies in the pods it
/// selects and nowhere else, and uninstalling the chart leaves the node as it was.
#[test]
fn the_chart_protects_the_selected_pods_and_uninstalls_cleanly() {
    block_on(async {
        let (client, node) = ready_node().await;
        // One release per kernel's boot (the chart's cluster-wide objects are named after it);
        // those of earlier boots go, or their agents would come to this node too.
        let release = this_kernels("palisade");
        let releases = helm(&["list", "--all-namespaces", "--short"]);
        for earlier in releases
            .lines()
            .filter(|name| name.starts_with("palisade-"))
        {
            helm(&["uninstall", earlier, "--namespace", earlier]);
        }
        assert_eq!(agent_programs(), 0, "BPF programs before the install");

        helm(&[
            "install",
            &release,
            &std::env::var("PALISADE_CHART").expect("PALISADE_CHART (run in the VM harness)"),
            "--namespace",
            &release,
            "--create-namespace",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "agent.cgroupDriver=cgroupfs",
            // No kube-proxy here: the agent reaches the API server where the VM does.
            "--set-json",
            r#"extraEnv=[{"name":"KUBERNETES_SERVICE_HOST","value":"10.0.2.100"},{"name":"KUBERNETES_SERVICE_PORT","value":"6443"}]"#,
        ]);
        let agents = Api::<Pod>::namespaced(client.clone(), &release);
        let agent = ready_agent(node, &agents, None).await;
        let agent_logs = |agent: &str| tail(&pod_logs(&release, agent, "agent"));
        assert!(
            agent_programs() > 0,
            "no BPF program loaded:\n{}",
            agent_logs(&agent)
        );

        let ns = this_kernels("guarded");
        namespace(&client, &ns, &[]).await;
        apply_policy(
            &client,
            &format!(
                "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: guarded\n  namespace: {ns}\nspec:\n  target:\n    selector: {{matchLabels: {{app: guarded}}}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    privileged: true\n    customRules:\n      files:\n        - name: secret\n          paths: [/srv/secret]\n          permissions: [read]\n          action: deny\n"
            ),
        )
        .await;
        // The agent has compiled it: what follows is about enforcement, not about the watch.
        let policies = Api::<PalisadePolicy>::namespaced(client.clone(), &ns);
        eventually_on_node(
            node,
            "the policy to be Ready",
            Duration::from_secs(120),
            async || {
                let status = policies.get_status("guarded").await.ok()?.status?;
                status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == READY && condition.status == "True")
                    .then_some(())
            },
        )
        .await;
        let guarded = ("guarded", "guarded");
        let denied = async |agent: &str| {
            let (phase, logs) = run_pod(&client, node, &ns, guarded, READ_A_SECRET).await;
            assert!(
                phase == "Failed" && logs.contains("/srv/secret': Operation not permitted"),
                "the selected pod read the secret ({phase}): {logs}\n--- agent\n{}",
                agent_logs(agent)
            );
        };
        denied(&agent).await;
        let (phase, logs) = run_pod(&client, node, &ns, ("other", "other"), READ_A_SECRET).await;
        assert!(
            phase == "Succeeded" && logs.contains("s3cret"),
            "another pod ({phase}): {logs}"
        );

        modeled_pods_run_under_their_allowlist(&client, node, &ns, &|| agent_logs(&agent)).await;

        // An agent stopped while its DaemonSet stays leaves enforcement in place for the next.
        delete_pod(&agents, &agent, &DeleteParams::default()).await;
        assert!(agent_programs() > 0, "the stopped agent's programs went");
        let agent = ready_agent(node, &agents, Some(&agent)).await;
        denied(&agent).await;

        helm(&["uninstall", &release, "--namespace", &release]);
        // The kubelet removes a pod's logs with the pod: keep the last seen.
        let mut last_logs = String::new();
        eventually_on_node(
            node,
            "the agent's pod to go, and its programs with it",
            Duration::from_secs(300),
            async || {
                let logs = agent_logs(&agent);
                if !logs.is_empty() {
                    last_logs = logs;
                }
                let left = agents.list(&Default::default()).await.ok()?.items.len();
                (left == 0 && agent_programs() == 0).then_some(())
            },
        )
        .await;
        assert!(
            !Path::new("/sys/fs/bpf/palisade").exists(),
            "pinned state left:\n{last_logs}"
        );
        let cache: Vec<_> = std::fs::read_dir("/var/cache/palisade").unwrap().collect();
        assert!(cache.is_empty(), "the agent's cache left: {cache:?}");
        // The policy is still there, but nothing enforces it.
        let (phase, logs) = run_pod(&client, node, &ns, guarded, READ_A_SECRET).await;
        assert!(
            phase == "Succeeded" && logs.contains("s3cret"),
            "after the uninstall ({phase}): {logs}"
        );
    });
}

/// What the modeled pods do, and one thing more.
const MODELED_WORKLOAD: &str = "/bin/busybox cat /etc/hostname && echo done";
/// The kubelet mounts /etc/hosts into every pod; the modeled one did not read it.
const DEVIATION: &str = "/bin/busybox cat /etc/hostname && /bin/busybox cat /etc/hosts";

/// A pod modeled, the model made a DefenseInDepth policy as `palisade model to-policy` makes
/// it: the pod starts again under containerd and runc (whose setup of each container is not
/// under the allowlist) and runs as it was modeled, and what it did not do is denied.
async fn modeled_pods_run_under_their_allowlist(
    client: &Client,
    node: &TheNode,
    ns: &str,
    agent_log: &dyn Fn() -> String,
) {
    let policies = Api::<PalisadePolicy>::namespaced(client.clone(), ns);
    let apply = async |spec: serde_json::Value| {
        let document = json!({
            "apiVersion": "palisade.dev/v1alpha1",
            "kind": "PalisadePolicy",
            "metadata": {"name": "modeled", "namespace": ns},
            "spec": spec,
        });
        apply_policy(client, &document.to_string()).await;
        eventually_on_node(
            node,
            "the policy's generation to be Ready",
            Duration::from_secs(120),
            async || {
                let policy = policies.get("modeled").await.ok()?;
                let status = policy.status?;
                let ready = status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == READY && condition.status == "True");
                (ready && status.observed_generation == policy.metadata.generation).then_some(())
            },
        )
        .await;
    };
    apply(json!({
        "target": {"selector": {"matchLabels": {"app": "modeled"}}},
        "mode": "BehaviorModeling",
        // Counted from the policy's start, not the pod's: a pod took 26 s to run its first
        // command on a busy machine.
        "behaviorModeling": {"duration": "45s"},
    }))
    .await;
    let modeled = ("modeled", "modeled");
    // A pod that leaves before the duration ends leaves an incomplete model: this one stays.
    let staying = format!("{MODELED_WORKLOAD} && /bin/busybox sleep 60");
    let (phase, logs) = run_pod(client, node, ns, modeled, &staying).await;
    assert_eq!(phase, "Succeeded", "the modeled pod: {logs}");
    let models = Api::<PalisadeBehaviorModel>::namespaced(client.clone(), ns);
    let name = format!("modeled.{}", node.name);
    let model: BehaviorModel = eventually_on_node(
        node,
        "the complete model",
        Duration::from_secs(120),
        async || {
            let object = models.get(&name).await.ok()?;
            let model: BehaviorModel = serde_json::from_value(object.spec.0).ok()?;
            model.complete.then_some(model)
        },
    )
    .await;
    let mut allowlist = Allowlist::of(&model).policy.spec;
    allowlist
        .defense_in_depth
        .as_mut()
        .expect("an allowlist")
        .allow_violations = false;
    apply(serde_json::to_value(&allowlist).unwrap()).await;
    let (phase, logs) = run_pod(client, node, ns, modeled, MODELED_WORKLOAD).await;
    assert!(
        phase == "Succeeded" && logs.contains("done"),
        "the modeled pod under its allowlist ({phase}): {logs}\n--- allowlist\n{}\n--- agent\n{}",
        Allowlist::of(&model).to_yaml(),
        agent_log()
    );
    let (phase, logs) = run_pod(client, node, ns, modeled, DEVIATION).await;
    assert!(
        phase == "Failed" && logs.contains("/etc/hosts': Operation not permitted"),
        "a deviation ({phase}): {logs}"
    );
}

/// The name of the release's Ready agent pod (other than `former`).
async fn ready_agent(node: &TheNode, agents: &Api<Pod>, former: Option<&str>) -> String {
    eventually_on_node(
        node,
        "the agent's pod to be Ready",
        Duration::from_secs(300),
        async || {
            let pods = agents.list(&Default::default()).await.ok()?;
            pods.items.into_iter().find_map(|pod| {
                let name = pod.metadata.name?;
                let conditions = pod.status?.conditions?;
                let ready = conditions
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True");
                (ready && Some(name.as_str()) != former).then_some(name)
            })
        },
    )
    .await
}

/// What `container` of pod `name` printed, from the kubelet's log files.
fn pod_logs(namespace: &str, name: &str, container: &str) -> String {
    let prefix = format!("{namespace}_{name}_");
    std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|entry| {
            std::fs::read_to_string(entry.path().join(container).join("0.log")).ok()
        })
        .collect()
}
