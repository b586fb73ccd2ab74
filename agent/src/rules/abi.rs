//! The ABI between the agent and rule modules: the bindings of the `palisade:rule` package's
//! worlds (rule-sdk/wit), and the SDK's event, verdict and model types, one definition for both
//! sides.

mod bindings {
    wasmtime::component::bindgen!({
        world: "rule",
        path: "../rule-sdk/wit",
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
    });
}

mod transform_bindings {
    wasmtime::component::bindgen!({
        world: "model-transform",
        path: "../rule-sdk/wit",
    });
}

pub(super) use bindings::{Rule, RulePre};
/// An audit event as rule modules see it (its fields borrowed), and what happens to it.
pub use palisade_rule_sdk::{Event, Severity, Verdict};
pub(super) use transform_bindings::{ModelTransform, ModelTransformPre};

/// The types of the ABI, as the host sees them.
pub mod types {
    pub use super::bindings::palisade::rule::types::*;
}

/// The ABI modules must be built for (the version of the WIT package `palisade:rule`).
pub const ABI_VERSION: &str = "0.4.0";
