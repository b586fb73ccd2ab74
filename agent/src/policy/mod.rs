//! Policies: the file format, and the pure compilation of a policy into BPF map entries.

mod catalog;
mod compile;
mod effect;
mod encode;
mod lookup;
mod lower;
mod model;
mod pattern;
mod permission;
mod replay;

pub use catalog::{
    CAPABILITIES, Endpoints, Environment, INGRESS_ADMISSION_NAMESPACES, INGRESS_ADMISSION_SERVICE,
    INGRESS_NIGHTMARE_MITIGATION, ServiceDestinations,
};
pub use compile::{CompiledPolicy, Decider, RuleInfo, compile};
pub use effect::AddressBlock;
pub use encode::{MapEntries, NamedPath, NetworkEntry, TrieEntry, merge_content};
pub use lower::{ModuleRules, ip_protocol, lists_built_in, module_field};
pub use model::{KIND, MAX_FILE_BYTES, Metadata, Policy, parse_document, read_file};
pub use palisade_crds::{
    Action, AllowRules, AttackProtection, CapabilityRule, CustomRules, EnhanceProtect, ExecRule,
    FileAllow, FileRule, Mode, MountRule, NetworkAllow, NetworkRule, OnFailure, Permission,
    PolicySpec, PortRange, Protocol, RuleModule, SocketAllow, SocketRule, Target, VArmorRules,
};
pub use pattern::Pattern;
pub use permission::{PERMISSION_NAMES, permission_bit, permission_names};
pub use replay::decide_event;

/// A policy that cannot be used, and why: where it came from, the field (a path such as `spec.enhanceProtect.customRules.files[0].paths[1]`) and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {field}: {reason}")]
pub struct PolicyError {
    /// Where the policy came from: a file, a custom resource.
    pub origin: String,
    pub field: String,
    pub reason: String,
}

impl PolicyError {
    pub fn new(
        source: impl std::fmt::Display,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            origin: source.to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}
