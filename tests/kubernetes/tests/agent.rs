//! The agent's Kubernetes mode against a real API server, as the chart's service account: its
//! reflectors follow policies, pods and namespaces; selected pods get their policy (armed before
//! the kubelet makes their cgroup); a restarted agent resyncs; statuses and events say what
//! each node did; the ingress-nginx admission webhook's addresses follow its Services.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice, events::v1::Event};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use palisade_agent::policy::CompiledPolicy;
use palisade_common::ACTION_DENY;
use palisade_crds::{ENFORCED, PalisadePolicy, PolicyStatus, READY};
use palisade_kube_tests::{
    Agent, Node, admin, apply_policy, delete_pod, eventually, namespace, pod, relabel_pod,
    report_containers, rule_names,
};
use serde_json::json;

fn web_policy(namespace: &str, extra: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: web\n  namespace: {namespace}\nspec:\n  target:\n    selector: {{matchLabels: {{app: web}}}}\n{extra}"
    )
}

async fn delete_policy(namespace: &str, name: &str) {
    Api::<PalisadePolicy>::namespaced(admin().await, namespace)
        .delete(name, &Default::default())
        .await
        .expect("deleting a policy");
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_are_protected_as_policies_and_pods_come_and_go() {
    let client = admin().await;
    namespace(&client, "lifecycle", &[]).await;
    let node = Node::new("lifecycle");
    let first = pod(&client, "lifecycle", "web-1", &node.name, &[("app", "web")]).await;
    let first_id = node.id(&node.start(&first));
    let agent = Agent::start(&node).await;
    assert!(agent.enforced(first_id).is_none(), "no policy yet");

    apply_policy(
        &client,
        &web_policy("lifecycle", "  mode: RuntimeDefault\n"),
    )
    .await;
    let policy = eventually("web-1 protected", async || agent.enforced(first_id)).await;
    assert_eq!(policy.name(), "lifecycle/web");

    // A pod the kubelet has not started: armed under its QoS cgroup, which the kubelet makes too.
    std::fs::create_dir_all(node.best_effort()).unwrap();
    let second = pod(&client, "lifecycle", "web-2", &node.name, &[("app", "web")]).await;
    let (parent, name) = node.pod_cgroup(&second);
    eventually("web-2 armed", async || agent.armed(&node, &parent, &name)).await;
    let second_id = node.id(&node.start(&second));
    eventually("web-2 protected once started", async || {
        agent
            .enforced(second_id)
            .filter(|_| agent.armed(&node, &parent, &name).is_none())
    })
    .await;

    // A new version of the policy replaces the old one on every pod.
    apply_policy(
        &client,
        &web_policy(
            "lifecycle",
            "  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n",
        ),
    )
    .await;
    for id in [first_id, second_id] {
        eventually("the new version", async || {
            agent
                .enforced(id)
                .filter(|policy| rule_names(policy).contains(&"disallow-mount".to_owned()))
        })
        .await;
    }

    // A pod no longer selected, a deleted pod, a deleted policy: released.
    relabel_pod(&client, "lifecycle", "web-1", &[("app", "other")]).await;
    eventually("web-1 released", async || {
        agent.enforced(first_id).is_none().then_some(())
    })
    .await;
    delete_pod(&client, "lifecycle", "web-2").await;
    eventually("web-2 released", async || {
        agent.enforced(second_id).is_none().then_some(())
    })
    .await;
    relabel_pod(&client, "lifecycle", "web-1", &[("app", "web")]).await;
    eventually("web-1 protected again", async || agent.enforced(first_id)).await;
    delete_policy("lifecycle", "web").await;
    eventually("nothing enforced", async || {
        let kernel = agent.kernel.lock().unwrap();
        (kernel.enforced.is_empty() && kernel.staged.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_agent_resyncs_without_dropping_enforcement() {
    let client = admin().await;
    namespace(&client, "restart", &[]).await;
    let node = Node::new("restart");
    let kept = pod(
        &client,
        "restart",
        "web-kept",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let kept_id = node.id(&node.start(&kept));
    let gone = pod(
        &client,
        "restart",
        "web-gone",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let gone_id = node.id(&node.start(&gone));
    apply_policy(&client, &web_policy("restart", "  mode: RuntimeDefault\n")).await;
    let agent = Agent::start(&node).await;
    eventually("both protected", async || {
        agent.enforced(kept_id).and(agent.enforced(gone_id))
    })
    .await;
    let kernel = agent.stop();

    // While no agent runs: the policy changes, a pod goes, a pod comes.
    apply_policy(
        &client,
        &web_policy(
            "restart",
            "  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-umount]\n",
        ),
    )
    .await;
    delete_pod(&client, "restart", "web-gone").await;
    let new = pod(&client, "restart", "web-new", &node.name, &[("app", "web")]).await;
    let new_id = node.id(&node.start(&new));
    // That the kernel goes on enforcing without an agent is shown on a real kernel, in the VM
    // suite (persistence: a_killed_agent_keeps_enforcing_and_a_restarted_one_takes_over).

    // The new agent's first reconcile, before it returns, brings the kernel up to date by
    // replacing entries, never removing them first.
    let agent = Agent::start_with(&node, kernel).await;
    let kept_policy = agent.enforced(kept_id).expect("still protected");
    assert!(
        rule_names(&kept_policy).contains(&"disallow-umount".to_owned()),
        "the new version"
    );
    assert!(agent.enforced(new_id).is_some(), "the new pod protected");
    // The deleted pod's cgroup is gone with it; a new agent knows nothing of its entry (the real
    // agent retires the previous agent's kernel state once everything is enforced).
}

/// A namespaced policy `web` that selects `app: web` pods and cannot compile: its rule module is
/// not there.
fn rejected_web_policy(namespace: &str) -> String {
    let digest = "0".repeat(64);
    web_policy(
        namespace,
        &format!(
            "  mode: RuntimeDefault\n  ruleModules:\n    - {{name: absent, module: absent.wasm, sha256: \"{digest}\"}}\n"
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_policy_never_releases_a_pod_from_the_policy_protecting_it() {
    let client = admin().await;
    namespace(&client, "fail-closed", &[("tenant", "fail-closed")]).await;
    let node = Node::new("fail-closed");
    let first = pod(
        &client,
        "fail-closed",
        "web-1",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let first_id = node.id(&node.start(&first));
    let agent = Agent::start(&node).await;
    apply_policy(
        &client,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadeClusterPolicy\nmetadata:\n  name: fail-closed-baseline\nspec:\n  target:\n    selector: {}\n    namespaceSelector: {matchLabels: {tenant: fail-closed}}\n  mode: RuntimeDefault\n",
    )
    .await;
    let baseline = async |id| {
        agent
            .enforced(id)
            .filter(|policy| policy.name() == "fail-closed-baseline")
    };
    eventually("the cluster policy", async || baseline(first_id).await).await;

    // The namespace's own policy wins selection, and is rejected: the pod keeps the cluster
    // policy and the node does not count as enforced. A pod that comes meanwhile gets the
    // cluster policy too, and both follow its new versions.
    apply_policy(&client, &rejected_web_policy("fail-closed")).await;
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), "fail-closed");
    eventually("web rejected", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        (condition(&status, READY)?.reason == "Rejected").then_some(())
    })
    .await;
    eventually("not everything enforced", async || {
        (!agent.all_enforced()).then_some(())
    })
    .await;
    assert!(baseline(first_id).await.is_some(), "web-1 kept its policy");
    let second = pod(
        &client,
        "fail-closed",
        "web-2",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let second_id = node.id(&node.start(&second));
    eventually("web-2 reported", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let entry = status.nodes.iter().find(|entry| entry.node == node.name)?;
        (entry.failed_pods == 2).then_some(())
    })
    .await;
    eventually("web-2 gets the cluster policy", async || {
        baseline(second_id).await
    })
    .await;
    assert!(baseline(first_id).await.is_some(), "web-1 kept its policy");
    apply_policy(
        &client,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadeClusterPolicy\nmetadata:\n  name: fail-closed-baseline\nspec:\n  target:\n    selector: {}\n    namespaceSelector: {matchLabels: {tenant: fail-closed}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n",
    )
    .await;
    for id in [first_id, second_id] {
        eventually("the cluster policy's new version", async || {
            let policy = baseline(id).await?;
            rule_names(&policy)
                .contains(&"disallow-mount".to_owned())
                .then_some(())
        })
        .await;
    }

    // Fixed, it replaces the cluster policy; a rejected new version leaves it in place.
    apply_policy(&client, &web_policy("fail-closed", "  mode: AlwaysAllow\n")).await;
    let web = async |id| {
        agent
            .enforced(id)
            .filter(|policy| policy.name() == "fail-closed/web")
    };
    for id in [first_id, second_id] {
        eventually("the namespace's policy", async || web(id).await).await;
    }
    eventually("every pod protected", async || {
        agent.all_enforced().then_some(())
    })
    .await;
    apply_policy(&client, &rejected_web_policy("fail-closed")).await;
    eventually("the new version rejected", async || {
        (!agent.all_enforced()).then_some(())
    })
    .await;
    for id in [first_id, second_id] {
        assert!(web(id).await.is_some(), "kept the version before");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_whose_cgroup_cannot_be_found_keeps_its_policy() {
    let client = admin().await;
    namespace(&client, "no-cgroup", &[]).await;
    let node = Node::new("no-cgroup");
    let web = pod(&client, "no-cgroup", "web", &node.name, &[("app", "web")]).await;
    let id = node.id(&node.start(&web));
    let agent = Agent::start(&node).await;
    apply_policy(
        &client,
        &web_policy("no-cgroup", "  mode: RuntimeDefault\n"),
    )
    .await;
    eventually("protected", async || agent.enforced(id)).await;

    // The kubelet's cgroups cannot be found (for a while, say): a new version cannot be placed,
    // and the pod keeps the version it has.
    std::fs::remove_dir_all(node.root.join("kubepods.slice")).unwrap();
    apply_policy(
        &client,
        &web_policy(
            "no-cgroup",
            "  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n",
        ),
    )
    .await;
    eventually("the pod reported", async || {
        (!agent.all_enforced()).then_some(())
    })
    .await;
    let kept = agent.enforced(id).expect("still protected");
    assert!(!rule_names(&kept).contains(&"disallow-mount".to_owned()));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_restarted_on_a_rejected_version_keeps_what_the_previous_one_enforced() {
    let client = admin().await;
    namespace(
        &client,
        "restart-rejected",
        &[("tenant", "restart-rejected")],
    )
    .await;
    let node = Node::new("restart-rejected");
    let web = pod(
        &client,
        "restart-rejected",
        "web",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let id = node.id(&node.start(&web));
    apply_policy(
        &client,
        &web_policy("restart-rejected", "  mode: RuntimeDefault\n"),
    )
    .await;
    // Selects the pod too, and yields to the namespace's own policy.
    apply_policy(
        &client,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadeClusterPolicy\nmetadata:\n  name: restart-rejected-baseline\nspec:\n  target:\n    selector: {}\n    namespaceSelector: {matchLabels: {tenant: restart-rejected}}\n  mode: AlwaysAllow\n",
    )
    .await;
    let agent = Agent::start(&node).await;
    eventually("protected", async || {
        agent
            .enforced(id)
            .filter(|policy| policy.name() == "restart-rejected/web")
    })
    .await;
    let kernel = agent.stop();

    apply_policy(&client, &rejected_web_policy("restart-rejected")).await;
    let agent = Agent::start_with(&node, kernel).await;
    // The new agent cannot enforce the policy: the previous agent's entry must stay, so the
    // agent must not count everything as enforced (it would then retire that entry).
    assert!(
        !agent.all_enforced(),
        "a rejected version counted as enforced"
    );
    // Nor replace that entry with the next policy that selects the pod (weaker, here).
    let kept = agent.enforced(id).expect("the previous agent's entry");
    assert_eq!(kept.name(), "restart-rejected/web");
    // A pod the previous agent did not protect gets that next policy.
    let new = pod(
        &client,
        "restart-rejected",
        "web-2",
        &node.name,
        &[("app", "web")],
    )
    .await;
    let new_id = node.id(&node.start(&new));
    eventually("the new pod protected", async || {
        agent
            .enforced(new_id)
            .filter(|policy| policy.name() == "restart-rejected-baseline")
    })
    .await;
    let kept = agent.enforced(id).expect("the previous agent's entry");
    assert_eq!(kept.name(), "restart-rejected/web");
}

fn condition<'a>(
    status: &'a PolicyStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status
        .conditions
        .iter()
        .find(|condition| condition.type_ == type_)
}

#[tokio::test(flavor = "multi_thread")]
async fn statuses_and_events_say_what_each_node_did() {
    let client = admin().await;
    namespace(&client, "status", &[]).await;
    let ready_node = Node::new("status-a");
    let other_node = Node::new("status-b");
    let here = pod(
        &client,
        "status",
        "web-a",
        &ready_node.name,
        &[("app", "web")],
    )
    .await;
    ready_node.start(&here);
    // On the other node the kubelet has not made the BestEffort cgroup: the pod cannot be armed.
    let there = pod(
        &client,
        "status",
        "web-b",
        &other_node.name,
        &[("app", "web")],
    )
    .await;
    let _agents = [
        Agent::start(&ready_node).await,
        Agent::start(&other_node).await,
    ];
    apply_policy(&client, &web_policy("status", "  mode: RuntimeDefault\n")).await;
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), "status");
    let status = eventually("both nodes report", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        (status.nodes.len() == 2).then_some(status)
    })
    .await;
    let ready = condition(&status, READY).expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Accepted")
    );
    assert_eq!(status.observed_generation, Some(1));
    let entry = |status: &PolicyStatus, node: &str| {
        status
            .nodes
            .iter()
            .find(|entry| entry.node == node)
            .cloned()
            .expect("an entry")
    };
    assert_eq!(
        (
            entry(&status, "status-a").enforced_pods,
            entry(&status, "status-a").failed_pods
        ),
        (1, 0)
    );
    let failed = entry(&status, "status-b");
    assert_eq!((failed.enforced_pods, failed.failed_pods), (0, 1));
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|message| message.contains("pod status/web-b")),
        "{failed:?}"
    );
    let enforced = eventually("Enforced turns False", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        condition(&status, ENFORCED)
            .filter(|condition| condition.status == "False")
            .cloned()
    })
    .await;
    assert_eq!(enforced.reason, "PodsNotProtected");
    assert_eq!(
        enforced.message,
        "selected pods are not protected on: status-b"
    );

    // The kubelet catches up: every pod protected.
    other_node.start(&there);
    eventually("Enforced turns True", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let done = condition(&status, ENFORCED)?.status == "True"
            && entry(&status, "status-b").enforced_pods == 1;
        done.then_some(())
    })
    .await;

    // A policy that cannot compile: Ready False with the reason, and an event from each node
    // where it selects pods. (It also selects the pods `web` protects, and yields to it: older, or
    // created in the same second and first by name.)
    let digest = "0".repeat(64);
    apply_policy(
        &client,
        &format!("apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: web-rejected\n  namespace: status\nspec:\n  target:\n    selector: {{matchLabels: {{app: web}}}}\n  mode: RuntimeDefault\n  ruleModules:\n    - {{name: absent, module: absent.wasm, sha256: \"{digest}\"}}\n"),
    )
    .await;
    let rejected = eventually("Ready False", async || {
        let status = policies.get_status("web-rejected").await.ok()?.status?;
        condition(&status, READY)
            .filter(|condition| condition.status == "False")
            .cloned()
    })
    .await;
    assert_eq!(rejected.reason, "Rejected");
    assert!(
        rejected.message.contains("absent.wasm"),
        "{}",
        rejected.message
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "status");
    let reporters = eventually("an event from each node", async || {
        let events = events.list(&ListParams::default()).await.ok()?;
        let mut reporters: Vec<String> = events
            .items
            .iter()
            .filter(|event| event.reason.as_deref() == Some("PolicyRejected"))
            .filter(|event| {
                event
                    .regarding
                    .as_ref()
                    .and_then(|regarding| regarding.name.as_deref())
                    == Some("web-rejected")
            })
            .filter_map(|event| event.reporting_instance.clone())
            .collect();
        reporters.sort();
        (reporters.len() == 2).then_some(reporters)
    })
    .await;
    assert_eq!(reporters, ["status-a", "status-b"]);
    let shadowed = eventually("web-rejected's node entries", async || {
        let status = policies.get_status("web-rejected").await.ok()?.status?;
        (status.nodes.len() == 2).then_some(status)
    })
    .await;
    assert!(
        entry(&shadowed, "status-a")
            .message
            .as_deref()
            .is_some_and(|message| message.contains("is protected by PalisadePolicy status/web")),
        "{shadowed:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_policies_follow_namespace_labels_and_yield_to_namespaced_ones() {
    let client = admin().await;
    namespace(&client, "tenant", &[("env", "prod")]).await;
    let node = Node::new("cluster");
    let app = pod(&client, "tenant", "app", &node.name, &[("app", "web")]).await;
    let id = node.id(&node.start(&app));
    let agent = Agent::start(&node).await;
    apply_policy(
        &client,
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadeClusterPolicy\nmetadata:\n  name: prod-baseline\nspec:\n  target:\n    selector: {}\n    namespaceSelector: {matchLabels: {env: prod}}\n  mode: RuntimeDefault\n",
    )
    .await;
    let policy = eventually("the cluster policy", async || agent.enforced(id)).await;
    assert_eq!(policy.name(), "prod-baseline");
    // The namespace's own policy takes precedence.
    apply_policy(&client, &web_policy("tenant", "  mode: AlwaysAllow\n")).await;
    eventually("the namespace's policy", async || {
        agent
            .enforced(id)
            .filter(|policy| policy.name() == "tenant/web")
    })
    .await;
    delete_policy("tenant", "web").await;
    eventually("the cluster policy again", async || {
        agent
            .enforced(id)
            .filter(|policy| policy.name() == "prod-baseline")
    })
    .await;
    // The namespace leaves prod: released.
    namespace(&client, "tenant", &[("env", "dev")]).await;
    eventually("released", async || {
        agent.enforced(id).is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_events_can_name_the_pod_and_container_of_a_cgroup() {
    let client = admin().await;
    namespace(&client, "names", &[]).await;
    let node = Node::new("names");
    let web = pod(&client, "names", "web", &node.name, &[("app", "web")]).await;
    let pod_cgroup = node.start(&web);
    // Containers as containerd (systemd driver) and CRI-O name their cgroups.
    let (nginx, sidecar) = ("a".repeat(64), "b".repeat(64));
    for name in [
        format!("cri-containerd-{nginx}.scope"),
        format!("crio-{sidecar}.scope"),
    ] {
        std::fs::create_dir(pod_cgroup.join(name)).unwrap();
    }
    report_containers(
        &client,
        "names",
        "web",
        &[
            ("nginx", &format!("containerd://{nginx}")),
            ("sidecar", &format!("cri-o://{sidecar}")),
        ],
    )
    .await;
    let agent = Agent::start(&node).await;
    apply_policy(&client, &web_policy("names", "  mode: RuntimeDefault\n")).await;
    let container = |name: String| {
        let id = node.id(&pod_cgroup.join(name));
        let pods = agent.pods.clone();
        async move || pods.get(id).and_then(|identity| identity.container)
    };
    let mut nginx_name = container(format!("cri-containerd-{nginx}.scope"));
    assert_eq!(eventually("nginx named", &mut nginx_name).await, "nginx");
    let mut sidecar_name = container(format!("crio-{sidecar}.scope"));
    assert_eq!(
        eventually("sidecar named", &mut sidecar_name).await,
        "sidecar"
    );
    let identity = agent
        .pods
        .get(node.id(&pod_cgroup))
        .expect("the pod's own cgroup");
    assert_eq!(
        (
            identity.namespace.as_str(),
            identity.pod.as_str(),
            identity.container
        ),
        ("names", "web", None)
    );
}

const ADMISSION: &str = "ingress-nginx-controller-admission";

/// The ingress-nginx admission Service in `namespace`, selectorless, with one EndpointSlice of
/// `endpoint` on 8443 (made here: the test cluster runs no EndpointSlice controller); returns the
/// cluster IP the API server gave the Service.
async fn admission_service(namespace: &str, endpoint: &str) -> String {
    let client = admin().await;
    let params = PatchParams::apply("palisade-tests").force();
    let service = Api::<Service>::namespaced(client.clone(), namespace)
        .patch(
            ADMISSION,
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": ADMISSION},
                "spec": {"ports": [{"name": "https-webhook", "port": 443, "targetPort": 8443}]},
            })),
        )
        .await
        .expect("applying a Service");
    Api::<EndpointSlice>::namespaced(client, namespace)
        .patch(
            ADMISSION,
            &params,
            &Patch::Apply(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": ADMISSION,
                    "labels": {"kubernetes.io/service-name": ADMISSION},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [endpoint]}],
                "ports": [{"name": "https-webhook", "port": 8443, "protocol": "TCP"}],
            })),
        )
        .await
        .expect("applying an EndpointSlice");
    service
        .spec
        .and_then(|spec| spec.cluster_ip)
        .expect("a cluster IP")
}

async fn delete_admission_service(namespace: &str) {
    let client = admin().await;
    let gone = |result: kube::Result<_>| match result {
        Ok(()) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => panic!("deleting: {err}"),
    };
    let params = DeleteParams::default();
    gone(
        Api::<Service>::namespaced(client.clone(), namespace)
            .delete(ADMISSION, &params)
            .await
            .map(drop),
    );
    gone(
        Api::<EndpointSlice>::namespaced(client, namespace)
            .delete(ADMISSION, &params)
            .await
            .map(drop),
    );
}

/// Whether `policy` denies a TCP connection to `address`:`port`.
fn denies(policy: &CompiledPolicy, address: &str, port: u16) -> bool {
    let verdict = policy
        .entries()
        .decide_destination(address.parse().unwrap(), 6, port);
    verdict.action & ACTION_DENY != 0
}

#[tokio::test(flavor = "multi_thread")]
async fn ingress_nightmare_mitigation_follows_the_admission_webhook() {
    let client = admin().await;
    let tenant = "ingress-tenant";
    namespace(&client, tenant, &[]).await;
    namespace(&client, "ingress-nginx", &[]).await;
    for namespace in ["ingress-nginx", "kube-system", tenant] {
        delete_admission_service(namespace).await;
    }
    let node = Node::new("ingress");
    let web = pod(&client, tenant, "web", &node.name, &[("app", "web")]).await;
    let web_id = node.id(&node.start(&web));
    let other = pod(&client, tenant, "other", &node.name, &[("app", "other")]).await;
    let other_id = node.id(&node.start(&other));
    let agent = Agent::start(&node).await;
    apply_policy(
        &client,
        &format!(
            "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: other\n  namespace: {tenant}\nspec:\n  target:\n    selector: {{matchLabels: {{app: other}}}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n"
        ),
    )
    .await;
    let other_policy = eventually("other protected", async || agent.enforced(other_id)).await;

    // Neither Service: rejected, saying so.
    apply_policy(
        &client,
        &web_policy(
            tenant,
            "  mode: EnhanceProtect\n  enhanceProtect:\n    vulMitigationRules: [ingress-nightmare-mitigation]\n",
        ),
    )
    .await;
    let policies: Api<PalisadePolicy> = Api::namespaced(client.clone(), tenant);
    let rejected = async || {
        let status = policies.get_status("web").await.ok()?.status?;
        let ready = condition(&status, READY)?;
        (ready.reason == "Rejected").then(|| ready.message.clone())
    };
    // (Until the agent has listed the Services, the addresses are not known.)
    let absent =
        format!("neither Service ingress-nginx/{ADMISSION} nor kube-system/{ADMISSION} exists");
    eventually("web rejected: no Service", async || {
        rejected().await.filter(|message| message.contains(&absent))
    })
    .await;
    assert!(agent.enforced(web_id).is_none());

    // Installed: its cluster IP on every port, its endpoint on the webhook's port only.
    let cluster_ip = admission_service("ingress-nginx", "10.244.1.5").await;
    let policy = eventually("web protected", async || {
        agent
            .enforced(web_id)
            .filter(|policy| denies(policy, "10.244.1.5", 8443))
    })
    .await;
    assert!(denies(&policy, &cluster_ip, 443) && denies(&policy, &cluster_ip, 80));
    assert!(denies(&policy, "10.244.1.5", 8443));
    assert!(!denies(&policy, "10.244.1.5", 80) && !denies(&policy, "10.244.1.5", 443));
    eventually("web accepted", async || {
        let status = policies.get_status("web").await.ok()?.status?;
        (condition(&status, READY)?.reason == "Accepted").then_some(())
    })
    .await;
    let generation = policies.get("web").await.unwrap().metadata.generation;

    // The webhook's pod moves: the same generation of the policy follows it.
    admission_service("ingress-nginx", "10.244.2.7").await;
    let policy = eventually("the new endpoint blocked", async || {
        agent
            .enforced(web_id)
            .filter(|policy| denies(policy, "10.244.2.7", 8443))
    })
    .await;
    assert!(!denies(&policy, "10.244.1.5", 8443), "the old one released");
    assert!(denies(&policy, &cluster_ip, 443));
    assert_eq!(
        policies.get("web").await.unwrap().metadata.generation,
        generation
    );

    // A copy in kube-system counts; a same-named Service in a tenant's namespace does not.
    let tenants_ip = admission_service(tenant, "10.244.9.9").await;
    let system_ip = admission_service("kube-system", "10.244.3.3").await;
    let policy = eventually("kube-system's blocked", async || {
        agent
            .enforced(web_id)
            .filter(|policy| denies(policy, &system_ip, 443) && denies(policy, "10.244.3.3", 8443))
    })
    .await;
    assert!(denies(&policy, "10.244.2.7", 8443));
    assert!(!denies(&policy, &tenants_ip, 443) && !denies(&policy, "10.244.9.9", 8443));
    // A policy without the rule was not compiled or installed again.
    assert!(Arc::ptr_eq(
        &agent.enforced(other_id).unwrap(),
        &other_policy
    ));

    // One gone: the other is still blocked. Both gone: rejected again, and the pod keeps what
    // it had.
    delete_admission_service("ingress-nginx").await;
    let policy = eventually("ingress-nginx's released", async || {
        agent
            .enforced(web_id)
            .filter(|policy| !denies(policy, "10.244.2.7", 8443))
    })
    .await;
    assert!(denies(&policy, &system_ip, 443) && denies(&policy, "10.244.3.3", 8443));
    delete_admission_service("kube-system").await;
    eventually("web rejected again", rejected).await;
    let kept = agent.enforced(web_id).unwrap();
    assert!(denies(&kept, &system_ip, 443) && denies(&kept, "10.244.3.3", 8443));
    delete_admission_service(tenant).await;
    delete_policy(tenant, "web").await;
    delete_policy(tenant, "other").await;
}
