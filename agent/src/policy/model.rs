//! The policy file format (`palisade.dev/v1alpha1`, kind `PalisadePolicy`) and its parsing.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PolicyError;

pub const API_VERSION: &str = "palisade.dev/v1alpha1";
pub const KIND: &str = "PalisadePolicy";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// Who is protected. Required by the agent; `palisade run` protects its own fresh cgroup.
    #[serde(default)]
    pub target: Option<Target>,
    #[serde(default)]
    pub rules: Rules,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// A cgroup v2 directory, absolute or relative to the cgroup2 mount. Covers its descendants.
    pub cgroup_path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rules {
    #[serde(default)]
    pub files: Vec<FileRule>,
    #[serde(default)]
    pub exec: Vec<ExecRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRule {
    #[serde(default)]
    pub name: Option<String>,
    pub paths: Vec<String>,
    pub permissions: Vec<Permission>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRule {
    #[serde(default)]
    pub name: Option<String>,
    pub paths: Vec<String>,
    pub action: Action,
}

/// `write` covers every open for writing, `append` only opens with O_APPEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Permission {
    Read,
    Write,
    Append,
    Exec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Allow and report.
    Audit,
    /// Refuse with EPERM and report.
    Deny,
}

impl Policy {
    /// Parses one policy document. Errors name the file, the field and the reason.
    pub fn parse(file: &Path, text: &str) -> Result<Self, PolicyError> {
        let document = serde_yaml::Deserializer::from_str(text);
        let policy: Policy = serde_path_to_error::deserialize(document).map_err(|err| {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            // serde_yaml starts its message with the path of the enclosing field (for an unknown
            // key, the map that holds it): use that as the field, and say it once.
            match message.split_once(": ") {
                Some((field, reason)) if path.starts_with(field) => {
                    PolicyError::new(file, field, reason)
                }
                _ => PolicyError::new(
                    file,
                    if path == "." { "(document)" } else { &path },
                    message,
                ),
            }
        })?;
        if policy.api_version != API_VERSION {
            return Err(PolicyError::new(
                file,
                "apiVersion",
                format!("expected \"{API_VERSION}\", got \"{}\"", policy.api_version),
            ));
        }
        if policy.kind != KIND {
            return Err(PolicyError::new(
                file,
                "kind",
                format!("expected \"{KIND}\", got \"{}\"", policy.kind),
            ));
        }
        if policy.metadata.name.is_empty() {
            return Err(PolicyError::new(file, "metadata.name", "must not be empty"));
        }
        Ok(policy)
    }

    pub fn load(file: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(file)
            .map_err(|err| PolicyError::new(file, "(file)", format!("cannot read: {err}")))?;
        Self::parse(file, &text)
    }
}
