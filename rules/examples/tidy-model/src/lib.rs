//! Example model transform: files and programs matching `drop` leave the model; the files below
//! each directory of `widen` become one entry per set of permissions, which says so.
//!
//! ```sh
//! palisade rules build rules/examples/tidy-model --out tidy-model.wasm
//! palisade model to-policy web.yaml --module tidy-model.wasm \
//!     --config '{"drop": ["/proc/**"], "widen": ["/usr/lib/"]}'
//! ```

use std::collections::{BTreeMap, BTreeSet};

use palisade_rule_sdk::{
    Transform,
    model::{Collapsed, FileUse, Model},
};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Paths ("/etc/hostname") or everything below a directory ("/proc/**").
    #[serde(default)]
    drop: Vec<String>,
    /// Directories, ending with "/".
    #[serde(default)]
    widen: Vec<String>,
}

pub struct TidyModel;

impl Transform for TidyModel {
    type Config = Config;

    fn transform(config: Config, mut model: Model) -> Result<Model, String> {
        if let Some(dir) = config.widen.iter().find(|dir| !dir.ends_with('/')) {
            return Err(format!(
                "widen: {dir:?} is not a directory (it must end with /)"
            ));
        }
        let dropped = |path: &str| config.drop.iter().any(|pattern| matches(pattern, path));
        model.files.retain(|file| !dropped(&file.path));
        model
            .executables
            .retain(|program| !dropped(&program.what.path));
        for dir in &config.widen {
            model.files = widen(std::mem::take(&mut model.files), dir);
        }
        model.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(model)
    }
}

fn matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix("**") {
        Some(prefix) => path.starts_with(prefix),
        None => path == pattern,
    }
}

/// `files` with those below `dir` merged into one entry per set of permissions.
fn widen(files: Vec<FileUse>, dir: &str) -> Vec<FileUse> {
    let (below, mut kept): (Vec<FileUse>, Vec<FileUse>) = files
        .into_iter()
        .partition(|file| file.path.starts_with(dir) && file.path != dir);
    let mut merged: BTreeMap<Vec<String>, (BTreeSet<String>, u64, usize)> = BTreeMap::new();
    for file in below {
        let entry = merged.entry(file.permissions).or_default();
        entry.0.extend(file.hooks);
        entry.1 += file.count;
        entry.2 += file.collapsed.map_or(1, |collapsed| collapsed.files);
    }
    kept.extend(
        merged
            .into_iter()
            .map(|(permissions, (hooks, count, files))| FileUse {
                path: dir.to_owned(),
                permissions,
                hooks: hooks.into_iter().collect(),
                count,
                collapsed: Some(Collapsed {
                    files,
                    rule: format!("widened by tidy-model: the files below {dir}, any of them"),
                }),
            }),
    );
    kept
}

palisade_rule_sdk::model_transform!(TidyModel);

#[cfg(test)]
mod tests {
    use palisade_rule_sdk::{model::Model, transform_json};

    use super::*;

    fn file(path: &str, permissions: &[&str], count: u64) -> FileUse {
        FileUse {
            path: path.to_owned(),
            permissions: permissions.iter().map(|name| (*name).to_owned()).collect(),
            hooks: vec!["file_open".to_owned()],
            count,
            collapsed: None,
        }
    }

    #[test]
    fn drops_the_matching_paths_and_widens_the_directories() {
        let model = Model {
            files: vec![
                file("/etc/hostname", &["read"], 1),
                file("/proc/self/status", &["read"], 3),
                file("/usr/lib/libc.so.6", &["read", "exec"], 2),
                file("/usr/lib/x86_64/libm.so.6", &["read", "exec"], 1),
                file("/usr/lib/os-release", &["read"], 1),
            ],
            ..Model::default()
        };
        let config = r#"{"drop": ["/proc/**", "/etc/hostname"], "widen": ["/usr/lib/"]}"#;
        let output =
            transform_json::<TidyModel>(config, &serde_json::to_string(&model).unwrap()).unwrap();
        let tidy: Model = serde_json::from_str(&output).unwrap();
        let paths: Vec<(&str, usize, u64)> = tidy
            .files
            .iter()
            .map(|file| {
                let files = file
                    .collapsed
                    .as_ref()
                    .map_or(1, |collapsed| collapsed.files);
                (file.path.as_str(), files, file.count)
            })
            .collect();
        assert_eq!(paths, [("/usr/lib/", 1, 1), ("/usr/lib/", 2, 3)]);
        assert_eq!(tidy.files[1].permissions, ["read", "exec"]);
    }

    #[test]
    fn a_widened_path_must_be_a_directory() {
        let model = serde_json::to_string(&Model::default()).unwrap();
        let err = transform_json::<TidyModel>(r#"{"widen": ["/usr/lib"]}"#, &model).unwrap_err();
        assert!(err.contains("must end with /"), "{err}");
    }
}
