//! Palisade's policy model: the spec shared by local policy files and the custom resources
//! `PalisadePolicy` (namespaced) and `PalisadeClusterPolicy` of group `palisade.dev`, their
//! status, the names of the built-in rules, and the behaviour models agents write
//! (`PalisadeBehaviorModel`, `PalisadeClusterBehaviorModel`). `crdgen` prints the
//! CustomResourceDefinitions.

mod model;
pub mod rules;
mod spec;
mod status;

use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use model::{
    MODEL_NODE_LABEL, MODEL_POLICY_LABEL, PalisadeBehaviorModel, PalisadeBehaviorModelSpec,
    PalisadeClusterBehaviorModel, PalisadeClusterBehaviorModelSpec,
};
pub use spec::{
    Action, AllowRules, AttackProtection, BehaviorModeling, CapabilityRule, CustomRules,
    DefenseInDepth, EnhanceProtect, ExecRule, FileAllow, FileRule, Mode, MountRule, NetworkAllow,
    NetworkRule, OnFailure, Permission, PolicySpec, PortRange, Protocol, RuleModule, SocketAllow,
    SocketRule, Target, VArmorRules, WorkloadKind,
};
pub use status::{ENFORCED, ModelState, NodeModel, NodeStatus, PolicyStatus, READY};

pub const GROUP: &str = "palisade.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "palisade.dev/v1alpha1";

/// Protects pods of its namespace.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "PalisadePolicy",
    namespaced,
    status = "PolicyStatus",
    shortname = "ppol",
    category = "palisade",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("has(self.spec.target)").message("spec.target is required: the pods to protect"),
    validation = Rule::new("!has(self.spec.target) || !has(self.spec.target.cgroupPath)").message("spec.target.cgroupPath is for local policy files: select pods with kind and names, or selector"),
    validation = Rule::new("!has(self.spec.target) || !has(self.spec.target.namespaceSelector)").message("spec.target.namespaceSelector is for PalisadeClusterPolicy: a PalisadePolicy protects pods of its own namespace"),
)]
#[serde(transparent)]
pub struct PalisadePolicySpec(pub PolicySpec);

/// Protects pods of every namespace, or of the namespaces `target.namespaceSelector` selects.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "palisade.dev",
    version = "v1alpha1",
    kind = "PalisadeClusterPolicy",
    status = "PolicyStatus",
    shortname = "pcpol",
    category = "palisade",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("has(self.spec.target)").message("spec.target is required: the pods to protect"),
    validation = Rule::new("!has(self.spec.target) || !has(self.spec.target.cgroupPath)").message("spec.target.cgroupPath is for local policy files: select pods with kind and names, or selector"),
)]
#[serde(transparent)]
pub struct PalisadeClusterPolicySpec(pub PolicySpec);

/// Where the generated CustomResourceDefinitions are committed: in the Helm chart, which
/// installs them.
pub const CRDS_FILE: &str = "charts/palisade/crds/palisade.dev.yaml";

/// The CustomResourceDefinitions of every kind, as one YAML stream.
pub fn crds_yaml() -> String {
    [
        PalisadePolicy::crd(),
        PalisadeClusterPolicy::crd(),
        PalisadeBehaviorModel::crd(),
        PalisadeClusterBehaviorModel::crd(),
    ]
    .iter()
    .map(|crd| {
        format!(
            "---\n{}",
            serde_yaml::to_string(crd).expect("a CRD serializes")
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_crds_are_current() {
        let committed = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(CRDS_FILE),
        )
        .unwrap_or_default();
        assert!(
            committed == crds_yaml(),
            "{CRDS_FILE} is stale: run `cargo run -p palisade-crds --bin crdgen > {CRDS_FILE}`"
        );
    }

    #[test]
    fn an_actions_name_is_how_a_policy_spells_it() {
        for action in [Action::Audit, Action::Deny] {
            assert_eq!(serde_json::to_value(action).unwrap(), action.name());
        }
    }
}
