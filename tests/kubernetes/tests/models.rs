//! BehaviorModeling in Kubernetes, against a real API server: the pods a policy selects on a
//! node are modeled into a PalisadeBehaviorModel of that node, owned by the policy and named in
//! its status; `palisade model` reads the object as kubectl prints it; a restarted agent does not
//! model again what it modeled completely, unless the model is deleted; the model goes with its
//! policy.

use std::time::Duration;

use kube::{Api, ResourceExt};
use palisade_agent::behavior::{BehaviorModel, file_record, load_model};
use palisade_common::{HOOK_FILE_OPEN, PERM_READ};
use palisade_crds::{ModelState, NodeModel, PalisadeBehaviorModel, PalisadePolicy};
use palisade_kube_tests::{Agent, Node, admin, apply_policy, eventually, namespace, pod};

const POLICY: &str = "apiVersion: palisade.dev/v1alpha1
kind: PalisadePolicy
metadata:
  name: web
  namespace: modeling
spec:
  target:
    selector: {matchLabels: {app: web}}
  mode: BehaviorModeling
  behaviorModeling:
    duration: 3s
";

#[tokio::test(flavor = "multi_thread")]
async fn a_policys_pods_are_modeled_into_an_object_of_their_node_owned_by_the_policy() {
    let client = admin().await;
    namespace(&client, "modeling", &[]).await;
    let node = Node::new("modeling");
    let web = pod(&client, "modeling", "web-1", &node.name, &[("app", "web")]).await;
    let id = node.id(&node.start(&web));
    let agent = Agent::start(&node).await;
    apply_policy(&client, POLICY).await;
    let model_id = eventually("web-1 recording", async || agent.enforced(id)?.model_id()).await;
    let name = format!("web.{}", node.name);
    let policies = Api::<PalisadePolicy>::namespaced(client.clone(), "modeling");
    let node_model = async |state| {
        let status = policies.get_status("web").await.ok()?.status?;
        let entry = status.nodes.iter().find(|entry| entry.node == node.name)?;
        let expected = NodeModel {
            name: name.clone(),
            state,
        };
        (entry.model.as_ref() == Some(&expected)).then_some(())
    };
    eventually("the status naming the model being recorded", async || {
        node_model(ModelState::Recording).await
    })
    .await;
    // What the kernel recorded, as the agent takes it out.
    let record = file_record(model_id, HOOK_FILE_OPEN, "/etc/hostname", PERM_READ);
    agent.kernel.lock().unwrap().records.push((record, 3));

    // The duration ends: the pod runs on unrecorded, and the model is stored and closed.
    eventually("web-1 enforced without recording", async || {
        agent
            .enforced(id)
            .filter(|policy| policy.model_id().is_none())
    })
    .await;
    let models = Api::<PalisadeBehaviorModel>::namespaced(client.clone(), "modeling");
    let object = eventually("the model object", async || models.get(&name).await.ok()).await;
    let model: BehaviorModel = serde_json::from_value(object.spec.0.clone()).unwrap();
    assert!(model.complete);
    assert_eq!(model.policy, "modeling/web");
    assert_eq!(model.duration_seconds, 3);
    assert_eq!(model.files.len(), 1, "{:?}", model.files);
    assert_eq!(
        (model.files[0].path.as_str(), model.files[0].count),
        ("/etc/hostname", 3)
    );
    assert!(agent.kernel.lock().unwrap().models.is_empty(), "closed");
    let policy = policies.get("web").await.unwrap();
    assert_eq!(object.labels()["palisade.dev/node"], node.name);
    assert_eq!(
        object.labels()["palisade.dev/policy-uid"],
        policy.uid().unwrap()
    );
    let owner = &object.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        ("PalisadePolicy", "web", policy.uid().as_ref())
    );
    eventually("the status naming the complete model", async || {
        node_model(ModelState::Complete).await
    })
    .await;
    // `palisade model show|diff|to-policy` read the object as kubectl prints it.
    let printed = node.root.join("model.yaml");
    std::fs::write(&printed, serde_yaml::to_string(&object).unwrap()).unwrap();
    assert_eq!(load_model(&printed).unwrap(), model);

    // A restarted agent does not model the pods again.
    let kernel = agent.stop();
    let agent = Agent::start_with(&node, kernel).await;
    eventually("web-1 enforced", async || agent.enforced(id)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(agent.enforced(id).unwrap().model_id(), None);
    assert!(agent.kernel.lock().unwrap().models.is_empty());

    // Deleting the model has the pods modeled again.
    models.delete(&name, &Default::default()).await.unwrap();
    eventually("web-1 recording again", async || {
        agent.enforced(id)?.model_id()
    })
    .await;
    eventually("the model written again", async || {
        models.get_opt(&name).await.ok()?
    })
    .await;

    // The model goes with its policy.
    policies.delete("web", &Default::default()).await.unwrap();
    eventually("the model deleted with its policy", async || {
        models.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
}
