//! Behaviour models in the cluster. Each node's agent stores the model of a BehaviorModeling
//! policy's pods on its node as a PalisadeBehaviorModel (a PalisadeClusterBehaviorModel for a
//! cluster policy) named `POLICY.NODE`, in the policy's namespace, labelled with the node and
//! the policy's UID and owned by the policy (the garbage collector deletes it with the policy).
//! A writer task applies it (server-side apply, field manager `palisade-agent/NODE`), retrying
//! until the API server takes it or refuses it for good; a reflector of this node's models tells
//! a restarted agent that a complete model exists, so that it does not model again (deleting the
//! object has the pods modeled again).

use std::{collections::HashMap, time::Duration};

use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use palisade_crds::{
    API_VERSION, MODEL_NODE_LABEL, MODEL_POLICY_LABEL, ModelState, NodeModel,
    PalisadeBehaviorModel, PalisadeClusterBehaviorModel,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{
    field_manager,
    reconcile::{PolicyKey, PolicyObject},
};
use crate::{
    behavior::{BehaviorModel, ModelStore, collapse},
    rules::hex_digest,
};

/// The size a model object stays under: the API server refuses requests over 1.5 MiB.
const MODEL_OBJECT_LIMIT: usize = 1 << 20;

/// The name of the model of `policy`'s pods on `node`: `POLICY.NODE`, or its first 236
/// characters and a digest of the whole when that is longer than a name may be (253).
pub fn model_name(policy: &str, node: &str) -> String {
    let name = format!("{policy}.{node}");
    if name.len() <= 253 {
        return name;
    }
    let digest = hex_digest(name.as_bytes());
    let short = name[..236].trim_end_matches(['.', '-']);
    format!("{short}.{}", &digest[..16])
}

/// The value of the node label: the node's name, or a digest of it when it is longer than a
/// label value may be (63).
pub fn node_label(node: &str) -> String {
    if node.len() <= 63 {
        node.to_owned()
    } else {
        hex_digest(node.as_bytes())[..32].to_owned()
    }
}

/// A policy models are stored for.
#[derive(Debug, Clone)]
struct PolicyRef {
    key: PolicyKey,
    uid: String,
}

/// What a stored model says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Summary {
    policy_uid: String,
    complete: bool,
    duration_seconds: u64,
}

impl Summary {
    fn of(object: &impl ResourceExt, model: &Value) -> Option<Self> {
        Some(Self {
            policy_uid: object.labels().get(MODEL_POLICY_LABEL)?.clone(),
            complete: model.get("complete")?.as_bool()?,
            duration_seconds: model.get("durationSeconds")?.as_u64()?,
        })
    }
}

/// One model to apply.
#[derive(Debug)]
pub struct ModelWrite {
    owner: PolicyRef,
    name: String,
    model: BehaviorModel,
}

/// This node's models in the cluster.
pub struct ClusterModels {
    node: String,
    /// The policies by label (`namespace/name`, what models name them by), as last reconciled.
    owners: HashMap<String, PolicyRef>,
    /// The models this agent stored that the reflector does not have yet, by policy label.
    stored: HashMap<String, Summary>,
    namespaced: Store<PalisadeBehaviorModel>,
    cluster: Store<PalisadeClusterBehaviorModel>,
    writes: mpsc::UnboundedSender<ModelWrite>,
}

impl ClusterModels {
    pub fn new(
        node: String,
        namespaced: Store<PalisadeBehaviorModel>,
        cluster: Store<PalisadeClusterBehaviorModel>,
        writes: mpsc::UnboundedSender<ModelWrite>,
    ) -> Self {
        Self {
            node,
            owners: HashMap::new(),
            stored: HashMap::new(),
            namespaced,
            cluster,
            writes,
        }
    }

    /// Learns the policies there are now (a model is stored for its policy's current UID), and
    /// forgets the models stored that the reflector has.
    pub fn track(&mut self, policies: &[PolicyObject]) {
        self.owners = policies
            .iter()
            .map(|policy| {
                let owner = PolicyRef {
                    key: policy.key.clone(),
                    uid: policy.uid.clone(),
                };
                (policy.key.label(), owner)
            })
            .collect();
        let stored = std::mem::take(&mut self.stored);
        self.stored = stored
            .into_iter()
            .filter(|(label, stored)| {
                self.owners.get(label).is_some_and(|owner| {
                    owner.uid == stored.policy_uid && self.object(owner).is_none()
                })
            })
            .collect();
    }

    /// The name of the model of `key`'s pods on this node.
    fn name(&self, key: &PolicyKey) -> String {
        model_name(&key.name, &self.node)
    }

    /// What the reflector has of the model of `owner`'s pods on this node.
    fn object(&self, owner: &PolicyRef) -> Option<Summary> {
        let name = self.name(&owner.key);
        match &owner.key.namespace {
            Some(namespace) => self
                .namespaced
                .get(&ObjectRef::new(&name).within(namespace))
                .and_then(|object| Summary::of(object.as_ref(), &object.spec.0)),
            None => self
                .cluster
                .get(&ObjectRef::new(&name))
                .and_then(|object| Summary::of(object.as_ref(), &object.spec.0)),
        }
    }

    /// What is stored of the model of the policy labelled `policy`, for its current UID.
    fn summary(&self, policy: &str) -> Option<Summary> {
        let owner = self.owners.get(policy)?;
        self.object(owner)
            .or_else(|| self.stored.get(policy).cloned())
            .filter(|summary| summary.policy_uid == owner.uid)
    }

    /// This node's model of `key`'s pods, for the policy's status: being recorded (`modeling`), or
    /// stored.
    pub fn report(&self, key: &PolicyKey, modeling: bool) -> Option<NodeModel> {
        let state = if modeling {
            ModelState::Recording
        } else {
            if self.summary(&key.label())?.complete {
                ModelState::Complete
            } else {
                ModelState::Incomplete
            }
        };
        Some(NodeModel {
            name: self.name(key),
            state,
        })
    }
}

impl ModelStore for ClusterModels {
    fn has_complete(&self, policy: &str, duration: Duration) -> bool {
        self.summary(policy).is_some_and(|summary| {
            summary.complete && summary.duration_seconds == duration.as_secs()
        })
    }

    fn store(&mut self, model: BehaviorModel) {
        let Some(owner) = self.owners.get(&model.policy).cloned() else {
            warn!(policy = %model.policy, "the behaviour model is lost: its policy is gone");
            return;
        };
        let model = match fit(model) {
            Ok(model) => model,
            Err(size) => {
                warn!(
                    policy = %owner.key,
                    size,
                    "the behaviour model is lost: {size} bytes even with its files collapsed, \
                     more than an object may hold ({MODEL_OBJECT_LIMIT})"
                );
                return;
            }
        };
        self.stored.insert(
            model.policy.clone(),
            Summary {
                policy_uid: owner.uid.clone(),
                complete: model.complete,
                duration_seconds: model.duration_seconds,
            },
        );
        let name = self.name(&owner.key);
        // The writer lives as long as the agent.
        let _ = self.writes.send(ModelWrite { owner, name, model });
    }
}

/// `model`, its files collapsed further while its object would be too large for the API server;
/// the size it still has if that is not enough.
fn fit(mut model: BehaviorModel) -> Result<BehaviorModel, usize> {
    let size =
        |model: &BehaviorModel| serde_json::to_vec(model).map_or(usize::MAX, |json| json.len());
    for after in [8, 2] {
        if size(&model) <= MODEL_OBJECT_LIMIT {
            return Ok(model);
        }
        model.files = collapse(model.files, after);
    }
    match size(&model) {
        size if size <= MODEL_OBJECT_LIMIT => Ok(model),
        size => Err(size),
    }
}

/// Whether the API server's refusal stays whatever the retries: the object is invalid, not
/// allowed, or has nowhere to go (its namespace is gone).
fn refused_for_good(status: &kube::core::Status) -> bool {
    (400..500).contains(&status.code) && !matches!(status.code, 409 | 429)
}

/// Applies the models it is sent, retrying every `interval` those the API server did not take
/// (but for a refusal for good); once the sender is gone (the agent stops), tries what is left
/// once more and returns.
pub struct ModelWriter {
    client: Client,
    node: String,
    interval: Duration,
}

impl ModelWriter {
    pub fn new(client: Client, node: String, interval: Duration) -> Self {
        Self {
            client,
            node,
            interval,
        }
    }

    pub async fn run(self, mut writes: mpsc::UnboundedReceiver<ModelWrite>) {
        // The latest model of each object not written yet, by namespace and name.
        let mut pending: HashMap<(Option<String>, String), ModelWrite> = HashMap::new();
        let mut open = true;
        loop {
            tokio::select! {
                write = writes.recv(), if open => match write {
                    Some(write) => {
                        pending.insert((write.owner.key.namespace.clone(), write.name.clone()), write);
                    }
                    None => open = false,
                },
                () = tokio::time::sleep(self.interval), if !pending.is_empty() => {}
            }
            let mut failed = HashMap::new();
            for (object, write) in pending.drain() {
                match self.apply(&write).await {
                    Ok(()) => info!(
                        policy = %write.owner.key,
                        model = %write.name,
                        complete = write.model.complete,
                        files = write.model.files.len(),
                        lost = write.model.lost,
                        "behaviour model written"
                    ),
                    Err(kube::Error::Api(status)) if refused_for_good(&status) => warn!(
                        policy = %write.owner.key,
                        model = %write.name,
                        "the behaviour model is lost: the API server refuses it: {}",
                        status.message
                    ),
                    Err(err) => {
                        warn!(policy = %write.owner.key, model = %write.name, "writing the behaviour model: {err}");
                        failed.insert(object, write);
                    }
                }
            }
            pending = failed;
            if !open {
                for write in pending.values() {
                    warn!(policy = %write.owner.key, model = %write.name, "the behaviour model is lost: the agent stops");
                }
                return;
            }
        }
    }

    async fn apply(&self, write: &ModelWrite) -> Result<(), kube::Error> {
        let params = PatchParams::apply(&field_manager(&self.node)).force();
        let kind = match write.owner.key.namespace {
            Some(_) => "PalisadeBehaviorModel",
            None => "PalisadeClusterBehaviorModel",
        };
        let object = json!({
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {
                "name": write.name,
                "labels": {
                    MODEL_NODE_LABEL: node_label(&self.node),
                    MODEL_POLICY_LABEL: write.owner.uid,
                },
                "ownerReferences": [{
                    "apiVersion": API_VERSION,
                    "kind": write.owner.key.kind(),
                    "name": write.owner.key.name,
                    "uid": write.owner.uid,
                }],
            },
            "spec": write.model,
        });
        let patch = Patch::Apply(&object);
        match &write.owner.key.namespace {
            Some(namespace) => {
                Api::<PalisadeBehaviorModel>::namespaced(self.client.clone(), namespace)
                    .patch(&write.name, &params, &patch)
                    .await
                    .map(drop)
            }
            None => Api::<PalisadeClusterBehaviorModel>::all(self.client.clone())
                .patch(&write.name, &params, &patch)
                .await
                .map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::behavior::FileUse;

    #[test]
    fn long_names_and_node_labels_are_cut_and_told_apart_by_a_digest() {
        assert_eq!(model_name("web", "node-1"), "web.node-1");
        let node = format!("{}-{}", "n".repeat(200), "a");
        let (a, b) = (
            model_name(&"p".repeat(60), &node),
            model_name(&"p".repeat(61), &node),
        );
        assert!(a.len() <= 253 && b.len() <= 253, "{a}");
        assert_ne!(a, b);
        assert!(a.starts_with("pppp") && !a.contains(".-"), "{a}");
        // Label values are at most 63 characters.
        assert_eq!(node_label("node-1"), "node-1");
        assert_eq!(node_label(&node).len(), 32);
    }

    #[test]
    fn a_model_too_large_for_an_object_collapses_its_directories_further() {
        // 3,000 directories of 5 files: over 1 MiB, and none collapsed by the recording's rule.
        let file = |path: String| FileUse {
            path,
            permissions: vec!["read".to_owned()],
            hooks: vec!["file_open".to_owned()],
            count: 1,
            collapsed: None,
        };
        let files = (0..3_000)
            .flat_map(|dir| (0..5).map(move |file| (dir, file)))
            .map(|(dir, name)| file(format!("/srv/data/directory-{dir:05}/file-{name}")))
            .collect();
        let model = BehaviorModel {
            files,
            ..BehaviorModel::default()
        };
        assert_eq!(model.files.len(), 15_000);
        assert!(serde_json::to_vec(&model).unwrap().len() > MODEL_OBJECT_LIMIT);
        let fitted = fit(model).expect("fits once collapsed");
        assert!(serde_json::to_vec(&fitted).unwrap().len() <= MODEL_OBJECT_LIMIT);
        assert_eq!(fitted.files.len(), 3_000, "one entry per directory");
        let rule = &fitted.files[0].collapsed.as_ref().unwrap().rule;
        assert!(
            rule.starts_with("more than 2 files of /srv/data/directory-00000/"),
            "{rule}"
        );
    }
}
