//! Model transforms: modules that rewrite a behaviour model before `palisade model to-policy`
//! makes it a policy (the `model-transform` world).

use crate::model::Model;

/// A model transform: drops what is noise in a model, widens files to their directory, or
/// anything else a reviewer would do by hand before a model becomes a policy. It may change
/// what the workload did (files, executables, capabilities, sockets, peers, mounts, other
/// operations), not which policy, target and time the model is of: the agent refuses a model
/// whose other fields changed.
///
/// ```ignore
/// use palisade_rule_sdk::{Transform, model::Model};
///
/// struct NoProc;
///
/// impl Transform for NoProc {
///     type Config = serde_json::Value;
///     fn transform(_: Self::Config, mut model: Model) -> Result<Model, String> {
///         model.files.retain(|file| !file.path.starts_with("/proc/"));
///         Ok(model)
///     }
/// }
///
/// palisade_rule_sdk::model_transform!(NoProc);
/// ```
pub trait Transform {
    /// The module's configuration (`palisade model transform --config JSON`).
    type Config: serde::de::DeserializeOwned;

    /// The model to use instead of `model`, or why the module refuses it.
    fn transform(config: Self::Config, model: Model) -> Result<Model, String>;
}

/// Runs `T::transform` on a model as JSON, as the agent calls it.
pub fn transform_json<T: Transform>(config: &str, model: &str) -> Result<String, String> {
    let config = serde_json::from_str(config).map_err(|err| format!("config: {err}"))?;
    let model = serde_json::from_str(model).map_err(|err| format!("model: {err}"))?;
    let transformed = T::transform(config, model)?;
    serde_json::to_string(&transformed).map_err(|err| format!("model: {err}"))
}

/// Exports a [`Transform`] as the module's `transform`.
#[macro_export]
macro_rules! model_transform {
    ($transform:ty) => {
        #[doc(hidden)]
        pub struct PalisadeTransformExport;

        impl $crate::transform_bindings::Guest for PalisadeTransformExport {
            fn transform(
                config: ::std::string::String,
                model: ::std::string::String,
            ) -> ::std::result::Result<::std::string::String, ::std::string::String> {
                $crate::transform_json::<$transform>(&config, &model)
            }
        }

        $crate::transform_bindings::export_model_transform!(
            PalisadeTransformExport with_types_in $crate::transform_bindings
        );
    };
}
