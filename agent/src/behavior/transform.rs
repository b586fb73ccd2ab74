//! Model transforms: Wasm or Rego modules that rewrite a model before it becomes a policy
//! (`palisade model transform`, `model to-policy --module`), run in the rule modules' sandbox.

use std::path::Path;

use super::{BehaviorModel, Transformation};
use crate::rules::{ModuleError, RuleHost};

#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error("the model transform returned something that is not a model: {0}")]
    NotAModel(serde_json::Error),
    #[error(
        "the model transform changed the model's {0}: a transform may change what the \
         workload did, not which policy, target and time the model is of"
    )]
    Changed(&'static str),
}

/// The model the transform at `module` makes of `model` with `config`, which says so in its
/// `transformed` list.
pub fn transform(
    host: &RuleHost,
    module: &Path,
    config: &serde_json::Value,
    model: &BehaviorModel,
) -> Result<BehaviorModel, TransformError> {
    let loaded = host.open(module)?;
    let input = serde_json::to_string(model).expect("models serialize");
    let output = loaded.transform(&config.to_string(), &input)?;
    let mut transformed: BehaviorModel =
        serde_json::from_str(&output).map_err(TransformError::NotAModel)?;
    let changed = [
        ("policy", model.policy != transformed.policy),
        ("source", model.source != transformed.source),
        ("spec", model.spec != transformed.spec),
        ("target", model.target != transformed.target),
        ("started", model.started != transformed.started),
        ("ended", model.ended != transformed.ended),
        (
            "durationSeconds",
            model.duration_seconds != transformed.duration_seconds,
        ),
        ("complete", model.complete != transformed.complete),
        ("lost", model.lost != transformed.lost),
        ("transformed", model.transformed != transformed.transformed),
    ];
    if let Some((field, _)) = changed.into_iter().find(|(_, changed)| *changed) {
        return Err(TransformError::Changed(field));
    }
    transformed.transformed.push(Transformation {
        module: module.file_name().map_or_else(
            || module.display().to_string(),
            |name| name.to_string_lossy().into(),
        ),
        sha256: loaded.digest.clone(),
        config: config.clone(),
    });
    Ok(transformed)
}
