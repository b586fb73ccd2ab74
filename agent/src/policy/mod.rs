//! Policies: the file format, and the pure compilation of a policy into BPF map entries.

mod compile;
mod model;
mod pattern;

use std::path::Path;

pub use compile::{CompiledPolicy, RuleInfo, TrieEntry, compile};
pub use model::{Action, ExecRule, FileRule, Permission, Policy, Rules, Spec, Target};
pub use pattern::Pattern;

/// A policy that cannot be used, and why: the file, the field (a path such as
/// `spec.rules.files[0].paths[1]`) and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {reason}")]
pub struct PolicyError {
    pub file: String,
    pub field: String,
    pub reason: String,
}

impl PolicyError {
    pub fn new(file: &Path, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            file: file.display().to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}
