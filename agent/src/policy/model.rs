//! The policy file format (`palisade.dev/v1alpha1`, kind `PalisadePolicy`) and its parsing. The
//! spec is the custom resources' (crate palisade-crds): one model for files and Kubernetes.

use std::path::Path;

use palisade_crds::{API_VERSION, PolicySpec};
use serde::{Deserialize, Serialize};

use super::PolicyError;

pub const KIND: &str = "PalisadePolicy";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: PolicySpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
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
            let (field, reason) = match message.split_once(": ") {
                Some((field, reason)) if path.starts_with(field) => (field, reason),
                _ => (path.as_str(), message.as_str()),
            };
            let field = match field {
                "" | "." => "(document)",
                field => field,
            };
            PolicyError::new(file.display(), field, reason)
        })?;
        if policy.api_version != API_VERSION {
            return Err(PolicyError::new(
                file.display(),
                "apiVersion",
                format!("expected \"{API_VERSION}\", got \"{}\"", policy.api_version),
            ));
        }
        if policy.kind != KIND {
            return Err(PolicyError::new(
                file.display(),
                "kind",
                format!("expected \"{KIND}\", got \"{}\"", policy.kind),
            ));
        }
        if policy.metadata.name.is_empty() {
            return Err(PolicyError::new(
                file.display(),
                "metadata.name",
                "must not be empty",
            ));
        }
        Ok(policy)
    }

    pub fn load(file: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(file).map_err(|err| {
            PolicyError::new(file.display(), "(file)", format!("cannot read: {err}"))
        })?;
        Self::parse(file, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_of_the_whole_document_names_the_document() {
        // Found by fuzzing (fuzz/regressions/policy_file): a tagged key at the top level.
        let text = "!spec?a   : - /ion:tr\n   \n     name";
        let err = Policy::parse(Path::new("p.yaml"), text).unwrap_err();
        assert_eq!(err.field, "(document)");
        assert!(err.reason.starts_with("unknown field ``"), "{err}");
    }
}
