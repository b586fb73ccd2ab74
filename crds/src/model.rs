//! Behaviour models in the cluster: what one node's agent recorded of the pods a policy in
//! BehaviorModeling selects there. The spec is the model as `palisade model` reads it (the
//! agent's model format, which the agent defines and checks), so its schema is open.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::any_object;

/// The label naming the node whose agent wrote a model.
pub const MODEL_NODE_LABEL: &str = "palisade.dev/node";
/// The label holding the UID of the policy a model is of.
pub const MODEL_POLICY_LABEL: &str = "palisade.dev/policy-uid";

/// The behaviour of the pods of a PalisadePolicy (in its namespace) on one node, named
/// `POLICY.NODE`; deleted with the policy.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "PalisadeBehaviorModel",
    namespaced,
    shortname = "pbm",
    category = "palisade",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"Complete","type":"boolean","jsonPath":".spec.complete"}"#,
    printcolumn = r#"{"name":"Ended","type":"date","jsonPath":".spec.ended"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct PalisadeBehaviorModelSpec(#[schemars(schema_with = "any_object")] pub serde_json::Value);

/// The behaviour of the pods of a PalisadeClusterPolicy on one node, named `POLICY.NODE`;
/// deleted with the policy.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "PalisadeClusterBehaviorModel",
    shortname = "pcbm",
    category = "palisade",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"Complete","type":"boolean","jsonPath":".spec.complete"}"#,
    printcolumn = r#"{"name":"Ended","type":"date","jsonPath":".spec.ended"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct PalisadeClusterBehaviorModelSpec(
    #[schemars(schema_with = "any_object")] pub serde_json::Value,
);
