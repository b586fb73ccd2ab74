//! A behaviour model: what a workload did while it was modeled, each distinct thing once with
//! how many times it was done, built from the kernel's records and written as a YAML file.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv6Addr,
    path::Path,
};

use palisade_common::{
    HOOK_BPRM_CHECK, MODEL_CAPABILITY, MODEL_FILE, MODEL_MOUNT, MODEL_OPERATION, MODEL_OVERFLOW,
    MODEL_PEER, MODEL_SOCKET, ModelKey,
};
use palisade_crds::PolicySpec;
pub use palisade_rule_sdk::model::{
    Capability, Collapsed, Counted, Executable, FileUse, Mount, Operation, Peer, Socket,
    Transformation, family_name, socket_type_name,
};

use crate::{
    bpf::hook_name,
    policy::{CAPABILITIES, permission_names},
};

/// Files of one directory, with the same permissions, past which they are one directory entry
/// (`DIR/`, all its files) in the model.
pub const COLLAPSE_AFTER: usize = 32;

/// A model as the agent writes it: the modeling policy's spec typed.
pub type BehaviorModel = palisade_rule_sdk::model::BehaviorModel<PolicySpec>;

/// Socket types are the low bits of the type argument; the others are flags.
const SOCK_TYPE_MASK: u32 = 0xf;

/// The NUL-terminated string at the start of `bytes`.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A model's records as they accumulate, before they are a `BehaviorModel`.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// By path: permissions, hooks, count.
    files: BTreeMap<String, (u32, BTreeSet<String>, u64)>,
    executables: BTreeMap<Executable, u64>,
    capabilities: BTreeMap<u32, u64>,
    sockets: BTreeMap<Socket, u64>,
    peers: BTreeMap<Peer, u64>,
    mounts: BTreeMap<Mount, u64>,
    operations: BTreeMap<Operation, u64>,
    /// The kernel's overflow count: a total, not an increment.
    lost: u64,
}

impl Recorded {
    /// Adds a record the kernel counted `count` times since it was last taken.
    pub fn add(&mut self, key: &ModelKey, count: u64) {
        let hook = hook_name(key.hook).to_owned();
        match key.kind {
            MODEL_FILE => {
                let mut path = c_string(&key.data);
                if key.cut != 0 {
                    path.push_str("**");
                }
                if key.hook == HOOK_BPRM_CHECK {
                    *self.executables.entry(Executable { path }).or_default() += count;
                    return;
                }
                let file = self.files.entry(path).or_default();
                file.0 |= key.arg;
                file.1.insert(hook);
                file.2 += count;
            }
            MODEL_CAPABILITY => *self.capabilities.entry(key.arg).or_default() += count,
            MODEL_SOCKET => {
                let socket = Socket {
                    family: key.family,
                    kind: key.arg & SOCK_TYPE_MASK,
                    protocol: key.protocol,
                };
                *self.sockets.entry(socket).or_default() += count;
            }
            MODEL_PEER => {
                let address = Ipv6Addr::from(key.addr);
                let peer = Peer {
                    hook,
                    address: address
                        .to_ipv4_mapped()
                        .map_or_else(|| address.to_string(), |v4| v4.to_string()),
                    port: key.port,
                    protocol: key.protocol,
                };
                *self.peers.entry(peer).or_default() += count;
            }
            MODEL_MOUNT => {
                let mount = Mount {
                    hook,
                    fs_type: c_string(&key.data),
                };
                *self.mounts.entry(mount).or_default() += count;
            }
            MODEL_OPERATION => {
                let operation = Operation { hook, arg: key.arg };
                *self.operations.entry(operation).or_default() += count;
            }
            MODEL_OVERFLOW => self.lost = count,
            _ => {}
        }
    }

    /// The model, its files collapsed (see `collapse`); `model` brings the rest.
    pub fn into_model(self, model: BehaviorModel) -> BehaviorModel {
        fn counted<T: Ord>(map: BTreeMap<T, u64>) -> Vec<Counted<T>> {
            map.into_iter()
                .map(|(what, count)| Counted { what, count })
                .collect()
        }
        let files = self
            .files
            .into_iter()
            .map(|(path, (perms, hooks, count))| FileUse {
                path,
                permissions: permission_names(perms)
                    .iter()
                    .map(|name| (*name).to_owned())
                    .collect(),
                hooks: hooks.into_iter().collect(),
                count,
                collapsed: None,
            })
            .collect();
        BehaviorModel {
            lost: self.lost,
            files: collapse(files, COLLAPSE_AFTER),
            executables: counted(self.executables),
            capabilities: self
                .capabilities
                .into_iter()
                .map(|(cap, count)| Counted {
                    what: Capability {
                        name: CAPABILITIES
                            .get(cap as usize)
                            .map_or_else(|| cap.to_string(), |name| (*name).to_owned()),
                    },
                    count,
                })
                .collect(),
            sockets: counted(self.sockets),
            peers: counted(self.peers),
            mounts: counted(self.mounts),
            operations: counted(self.operations),
            ..model
        }
    }
}

/// The directory part of `path`, with its trailing slash ("/srv/a" -> "/srv/").
fn directory(path: &str) -> Option<&str> {
    path.rfind('/').map(|at| &path[..=at])
}

/// Replaces the files of a directory that has more than `after` of them with the same
/// permissions by one entry for the directory's files (`DIR/`), which says so.
pub fn collapse(files: Vec<FileUse>, after: usize) -> Vec<FileUse> {
    let mut groups: BTreeMap<(String, Vec<String>), Vec<FileUse>> = BTreeMap::new();
    let mut kept = Vec::new();
    for file in files {
        match directory(&file.path) {
            Some(dir) if dir != file.path && !file.path.ends_with("**") => groups
                .entry((dir.to_owned(), file.permissions.clone()))
                .or_default()
                .push(file),
            _ => kept.push(file),
        }
    }
    for ((dir, permissions), group) in groups {
        if group.len() <= after {
            kept.extend(group);
            continue;
        }
        let hooks: BTreeSet<String> = group.iter().flat_map(|file| file.hooks.clone()).collect();
        kept.push(FileUse {
            path: dir.clone(),
            permissions,
            hooks: hooks.into_iter().collect(),
            count: group.iter().map(|file| file.count).sum(),
            collapsed: Some(Collapsed {
                files: group.len(),
                rule: format!(
                    "more than {after} files of {dir} with the same permissions: its \
                     files, any of them"
                ),
            }),
        });
    }
    kept.sort_by(|a, b| a.path.cmp(&b.path).then(a.permissions.cmp(&b.permissions)));
    kept
}

#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a behaviour model: {source}")]
    Format {
        path: String,
        source: serde_yaml::Error,
    },
}

/// Writes the model to `path` whole (a reader never sees half of it).
pub fn save_model(model: &BehaviorModel, path: &Path) -> Result<(), ModelFileError> {
    let io = |source| ModelFileError::Io {
        path: path.display().to_string(),
        source,
    };
    let text = serde_yaml::to_string(model).map_err(|source| ModelFileError::Format {
        path: path.display().to_string(),
        source,
    })?;
    let partial = path.with_extension("yaml.partial");
    std::fs::write(&partial, text).map_err(io)?;
    std::fs::rename(&partial, path).map_err(io)
}

/// Reads a model file, or a model object (`kubectl get palisadebehaviormodel NAME -o yaml`):
/// its spec is the model.
pub fn load_model(path: &Path) -> Result<BehaviorModel, ModelFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelFileError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let format = |source| ModelFileError::Format {
        path: path.display().to_string(),
        source,
    };
    let mut document: serde_yaml::Value = serde_yaml::from_str(&text).map_err(format)?;
    if document.get("kind").is_some() {
        document = document
            .get_mut("spec")
            .map(std::mem::take)
            .unwrap_or_default();
    }
    serde_yaml::from_value(document).map_err(format)
}

/// The record of `perms` asked of the file at `path` in `hook`, as the kernel makes it.
#[cfg(any(test, feature = "fake-kernel"))]
pub fn file_record(model_id: u32, hook: u32, path: &str, perms: u32) -> ModelKey {
    let mut key = ModelKey {
        model_id,
        kind: MODEL_FILE,
        hook,
        arg: perms,
        ..ModelKey::default()
    };
    key.data[..path.len()].copy_from_slice(path.as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use palisade_common::{
        HOOK_CAPABLE, HOOK_FILE_OPEN, HOOK_MMAP_FILE, HOOK_SB_MOUNT, HOOK_SOCKET_CONNECT,
        HOOK_SOCKET_CREATE, PERM_EXEC, PERM_READ, PERM_WRITE,
    };

    use super::*;

    fn file(hook: u32, path: &str, perms: u32) -> ModelKey {
        file_record(1, hook, path, perms)
    }

    #[test]
    fn records_become_a_model_each_thing_once_with_its_count() {
        let mut recorded = Recorded::default();
        recorded.add(&file(HOOK_FILE_OPEN, "/etc/hosts", PERM_READ), 2);
        recorded.add(
            &file(HOOK_FILE_OPEN, "/etc/hosts", PERM_READ | PERM_WRITE),
            1,
        );
        recorded.add(&file(HOOK_MMAP_FILE, "/lib/libc.so.6", PERM_EXEC), 3);
        recorded.add(&file(HOOK_BPRM_CHECK, "/bin/busybox", PERM_EXEC), 2);
        recorded.add(
            &ModelKey {
                kind: MODEL_CAPABILITY,
                hook: HOOK_CAPABLE,
                arg: 10,
                ..ModelKey::default()
            },
            1,
        );
        recorded.add(
            &ModelKey {
                kind: MODEL_SOCKET,
                hook: HOOK_SOCKET_CREATE,
                family: 2,
                protocol: 6,
                arg: 1 | 0o2000000, // SOCK_STREAM | SOCK_CLOEXEC
                ..ModelKey::default()
            },
            1,
        );
        let mut peer = ModelKey {
            kind: MODEL_PEER,
            hook: HOOK_SOCKET_CONNECT,
            family: 2,
            protocol: 6,
            port: 8080,
            ..ModelKey::default()
        };
        peer.addr = std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
        recorded.add(&peer, 4);
        let mut mount = ModelKey {
            kind: MODEL_MOUNT,
            hook: HOOK_SB_MOUNT,
            ..ModelKey::default()
        };
        mount.data[..5].copy_from_slice(b"tmpfs");
        recorded.add(&mount, 1);
        recorded.add(
            &ModelKey {
                kind: MODEL_OVERFLOW,
                ..ModelKey::default()
            },
            7,
        );
        let model = recorded.into_model(BehaviorModel::default());
        assert_eq!(model.lost, 7);
        assert_eq!(
            model.files,
            [
                FileUse {
                    path: "/etc/hosts".into(),
                    permissions: vec!["read".into(), "write".into()],
                    hooks: vec!["file_open".into()],
                    count: 3,
                    collapsed: None,
                },
                FileUse {
                    path: "/lib/libc.so.6".into(),
                    permissions: vec!["exec".into()],
                    hooks: vec!["mmap_file".into()],
                    count: 3,
                    collapsed: None,
                },
            ]
        );
        assert_eq!(
            model.executables,
            [Counted {
                what: Executable {
                    path: "/bin/busybox".to_owned()
                },
                count: 2
            }]
        );
        assert_eq!(model.capabilities[0].what.name, "net_bind_service");
        assert_eq!(
            model.sockets,
            [Counted {
                what: Socket {
                    family: 2,
                    kind: 1,
                    protocol: 6
                },
                count: 1
            }]
        );
        assert_eq!(model.peers[0].what.address, "127.0.0.1");
        assert_eq!(model.peers[0].what.hook, "socket_connect");
        assert_eq!(model.peers[0].count, 4);
        assert_eq!(model.mounts[0].what.fs_type, "tmpfs");
    }

    #[test]
    fn a_directory_with_many_files_collapses_into_one_entry_that_says_why() {
        let mut recorded = Recorded::default();
        for index in 0..=COLLAPSE_AFTER {
            recorded.add(
                &file(HOOK_FILE_OPEN, &format!("/data/f{index}"), PERM_READ),
                1,
            );
        }
        recorded.add(&file(HOOK_FILE_OPEN, "/data/out", PERM_WRITE), 1);
        for index in 0..COLLAPSE_AFTER {
            recorded.add(
                &file(HOOK_FILE_OPEN, &format!("/etc/f{index}"), PERM_READ),
                1,
            );
        }
        let model = recorded.into_model(BehaviorModel::default());
        let collapsed: Vec<&FileUse> = model
            .files
            .iter()
            .filter(|file| file.collapsed.is_some())
            .collect();
        assert_eq!(collapsed.len(), 1, "{:#?}", model.files);
        assert_eq!(collapsed[0].path, "/data/");
        assert_eq!(collapsed[0].count, COLLAPSE_AFTER as u64 + 1);
        assert_eq!(
            collapsed[0].collapsed.as_ref().unwrap().files,
            COLLAPSE_AFTER + 1
        );
        assert!(model.files.iter().any(|file| file.path == "/data/out"));
        assert_eq!(
            model.files.len(),
            2 + COLLAPSE_AFTER,
            "/etc has {COLLAPSE_AFTER} files: not collapsed"
        );
    }

    #[test]
    fn a_cut_path_is_marked_and_a_model_file_reads_back() {
        let mut recorded = Recorded::default();
        let mut long = file(HOOK_FILE_OPEN, "/deep/", PERM_READ);
        long.cut = 1;
        recorded.add(&long, 1);
        let model = recorded.into_model(BehaviorModel {
            policy: "web".into(),
            complete: true,
            ..BehaviorModel::default()
        });
        assert_eq!(model.files[0].path, "/deep/**");
        let dir = std::env::temp_dir().join(format!("palisade-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.yaml");
        save_model(&model, &path).unwrap();
        assert_eq!(load_model(&path).unwrap(), model);
        // As the agent stores it in Kubernetes.
        let object = serde_json::json!({
            "apiVersion": "palisade.dev/v1alpha1",
            "kind": "PalisadeBehaviorModel",
            "metadata": {"name": "web.node-1", "namespace": "shop"},
            "spec": model,
        });
        std::fs::write(&path, serde_yaml::to_string(&object).unwrap()).unwrap();
        assert_eq!(load_model(&path).unwrap(), model);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
