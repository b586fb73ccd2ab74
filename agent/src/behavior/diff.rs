//! `palisade model diff A B`: what a workload did in model B and not in A, and the reverse.
//! Counts are left aside: two runs of the same workload never do a thing equally often.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::model::{BehaviorModel, Counted, FileUse};

/// The things one side has and the other has not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Changes<T> {
    pub added: Vec<T>,
    pub removed: Vec<T>,
}

impl<T> Changes<T> {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// A path and what was asked of it (every entry of the model with that path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    pub path: String,
    pub permissions: Vec<String>,
}

/// A path both models have, asked for other permissions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PermissionChange {
    pub path: String,
    pub before: Vec<String>,
    pub after: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelDiff {
    /// Nothing added, removed or changed.
    pub same: bool,
    pub files: Changes<FileEntry>,
    pub file_permissions: Vec<PermissionChange>,
    pub executables: Changes<String>,
    pub capabilities: Changes<String>,
    pub sockets: Changes<String>,
    pub peers: Changes<String>,
    pub mounts: Changes<String>,
    pub operations: Changes<String>,
}

/// Permissions by path.
fn by_path(files: &[FileUse]) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut paths: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for file in files {
        paths
            .entry(&file.path)
            .or_default()
            .extend(file.permissions.iter().map(String::as_str));
    }
    paths
}

fn names(permissions: &BTreeSet<&str>) -> Vec<String> {
    permissions.iter().map(|name| (*name).to_owned()).collect()
}

/// The things of `after` not in `before` and the reverse, as they are written.
fn changes<T: ToString>(before: &[Counted<T>], after: &[Counted<T>]) -> Changes<String> {
    let before: BTreeSet<String> = before.iter().map(|done| done.what.to_string()).collect();
    let after: BTreeSet<String> = after.iter().map(|done| done.what.to_string()).collect();
    Changes {
        added: after.difference(&before).cloned().collect(),
        removed: before.difference(&after).cloned().collect(),
    }
}

impl ModelDiff {
    pub fn of(before: &BehaviorModel, after: &BehaviorModel) -> Self {
        let (old, new) = (by_path(&before.files), by_path(&after.files));
        let entry = |(path, permissions): (&&str, &BTreeSet<&str>)| FileEntry {
            path: (*path).to_owned(),
            permissions: names(permissions),
        };
        let files = Changes {
            added: new
                .iter()
                .filter(|(path, _)| !old.contains_key(*path))
                .map(entry)
                .collect(),
            removed: old
                .iter()
                .filter(|(path, _)| !new.contains_key(*path))
                .map(entry)
                .collect(),
        };
        let file_permissions = new
            .iter()
            .filter_map(|(path, after)| {
                let before = old.get(path)?;
                (before != after).then(|| PermissionChange {
                    path: (*path).to_owned(),
                    before: names(before),
                    after: names(after),
                })
            })
            .collect();
        let mut diff = Self {
            same: false,
            files,
            file_permissions,
            executables: changes(&before.executables, &after.executables),
            capabilities: changes(&before.capabilities, &after.capabilities),
            sockets: changes(&before.sockets, &after.sockets),
            peers: changes(&before.peers, &after.peers),
            mounts: changes(&before.mounts, &after.mounts),
            operations: changes(&before.operations, &after.operations),
        };
        diff.same = diff.files.is_empty()
            && diff.file_permissions.is_empty()
            && diff.categories().all(|(_, changes)| changes.is_empty());
        diff
    }

    /// Every kind of thing but files, by the name the text output gives it.
    pub fn categories(&self) -> impl Iterator<Item = (&'static str, &Changes<String>)> {
        [
            ("executables", &self.executables),
            ("capabilities", &self.capabilities),
            ("sockets", &self.sockets),
            ("peers", &self.peers),
            ("mounts", &self.mounts),
            ("other operations", &self.operations),
        ]
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::behavior::model::{Capability, Executable};

    fn file(path: &str, permissions: &[&str]) -> FileUse {
        FileUse {
            path: path.to_owned(),
            permissions: permissions.iter().map(|name| (*name).to_owned()).collect(),
            hooks: vec!["file_open".to_owned()],
            count: 1,
            collapsed: None,
        }
    }

    fn executable(path: &str, count: u64) -> Counted<Executable> {
        Counted {
            what: Executable {
                path: path.to_owned(),
            },
            count,
        }
    }

    #[test]
    fn a_diff_lists_what_was_added_removed_and_changed_counts_aside() {
        let before = BehaviorModel {
            files: vec![
                file("/etc/hosts", &["read"]),
                file("/etc/old", &["read"]),
                file("/tmp/out", &["write"]),
            ],
            executables: vec![executable("/bin/busybox", 2)],
            capabilities: vec![Counted {
                what: Capability {
                    name: "net_raw".to_owned(),
                },
                count: 1,
            }],
            ..BehaviorModel::default()
        };
        let after = BehaviorModel {
            files: vec![
                file("/etc/hosts", &["read"]),
                file("/etc/new", &["read"]),
                file("/tmp/out", &["read"]),
                file("/tmp/out", &["write"]),
            ],
            executables: vec![executable("/bin/busybox", 7), executable("/bin/sh", 1)],
            ..BehaviorModel::default()
        };
        let diff = ModelDiff::of(&before, &after);
        assert!(!diff.same);
        assert_eq!(
            diff.files,
            Changes {
                added: vec![FileEntry {
                    path: "/etc/new".into(),
                    permissions: vec!["read".into()]
                }],
                removed: vec![FileEntry {
                    path: "/etc/old".into(),
                    permissions: vec!["read".into()]
                }],
            }
        );
        assert_eq!(
            diff.file_permissions,
            [PermissionChange {
                path: "/tmp/out".into(),
                before: vec!["write".into()],
                after: vec!["read".into(), "write".into()],
            }]
        );
        assert_eq!(diff.executables.added, ["/bin/sh"]);
        assert!(diff.executables.removed.is_empty(), "counts aside");
        assert_eq!(diff.capabilities.removed, ["net_raw"]);
        assert!(ModelDiff::of(&after, &after).same);
    }
}
