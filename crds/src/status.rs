//! What the agents report on a policy. Every node's agent writes its own entry of `nodes` and
//! the policy-wide conditions with server-side apply, each as its own field manager: entries
//! merge by key, and an agent that sends what is already there changes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `Ready`: the policy compiled (a reason says why not). `Enforced`: no node failed to enforce
/// it on a pod it selects.
pub const READY: &str = "Ready";
pub const ENFORCED: &str = "Enforced";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The generation of the spec the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// One entry per node that runs pods the policy selects, or has a model of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["node".into()]))]
    pub nodes: Vec<NodeStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    /// The generation of the spec this node enforces.
    pub observed_generation: i64,
    /// Pods on the node the policy selects and protects (armed pods not started yet included).
    pub enforced_pods: u32,
    /// Pods on the node the policy selects and does not protect.
    pub failed_pods: u32,
    /// Why the failed pods are not protected (the first error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// In BehaviorModeling: the model of the policy's pods on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<NodeModel>,
}

/// A behaviour model a node's agent records or wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeModel {
    /// The PalisadeBehaviorModel (PalisadeClusterBehaviorModel for a cluster policy), in the
    /// policy's namespace.
    pub name: String,
    pub state: ModelState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModelState {
    /// The pods' behaviour is being recorded: the model is written when the duration ends.
    Recording,
    /// The model covers the whole duration.
    Complete,
    /// The model was cut short (the policy left the mode or changed its duration, its pods left
    /// the node, or the agent stopped); the pods are modeled again while the policy models them.
    Incomplete,
}
