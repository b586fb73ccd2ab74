//! The policy file format (`palisade.dev/v1alpha1`, kind `PalisadePolicy`) and its parsing. The
//! spec is the custom resources' (crate palisade-crds): one model for files and Kubernetes.

use std::{io::ErrorKind, path::Path};

use palisade_crds::{API_VERSION, PolicySpec};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

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
        let policy: Policy = parse_document(file, text)?;
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
}

/// Parses one YAML document as a `T`. Errors name the file, the field and the reason.
pub fn parse_document<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, PolicyError> {
    let document = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(document).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        // serde_yaml starts its message with the path of the enclosing field (for an unknown
        // key, the map that holds it; `.[0]` for an item of a top-level list): use that as the
        // field, and say it once.
        let (field, reason) = match message.split_once(": ") {
            Some((field, reason)) if path.starts_with(field.trim_start_matches('.')) => {
                (field.trim_start_matches('.'), reason)
            }
            _ => (path.as_str(), message.as_str()),
        };
        let field = match field {
            "" | "." => "(document)",
            field => field,
        };
        PolicyError::new(file.display(), field, reason)
    })
}

/// The largest policy file: a ConfigMap's limit, so that any policy file can be shipped in one.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The text of the policy file `file`: refused unread over `MAX_FILE_BYTES`, and when not UTF-8.
pub fn read_file(file: &Path) -> Result<String, PolicyError> {
    let error = |reason: String| PolicyError::new(file.display(), "(file)", reason);
    let bytes = crate::bounded::read(file, MAX_FILE_BYTES).map_err(|err| match err.kind() {
        ErrorKind::FileTooLarge => error(format!(
            "larger than {MAX_FILE_BYTES} bytes, a policy file's limit"
        )),
        _ => error(format!("cannot read: {err}")),
    })?;
    String::from_utf8(bytes).map_err(|err| {
        let offset = err.utf8_error().valid_up_to();
        let line = err.as_bytes()[..offset]
            .iter()
            .filter(|byte| **byte == b'\n')
            .count()
            + 1;
        error(format!(
            "not UTF-8: line {line} holds bytes that are no character, at byte offset {offset}"
        ))
    })
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
