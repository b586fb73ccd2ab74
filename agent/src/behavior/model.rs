//! A behaviour model: what a workload did while it was modeled, each distinct thing once with
//! how many times it was done, built from the kernel's records and written as a YAML file.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::Ipv6Addr,
    path::Path,
};

use palisade_common::{
    HOOK_BPRM_CHECK, MODEL_CAPABILITY, MODEL_FILE, MODEL_MOUNT, MODEL_OPERATION, MODEL_OVERFLOW,
    MODEL_PEER, MODEL_SOCKET, ModelKey,
};
use palisade_crds::PolicySpec;
use serde::{Deserialize, Serialize};

use crate::{
    bpf::hook_name,
    policy::{CAPABILITIES, permission_names},
};

/// Files of one directory, with the same permissions, past which they are one directory entry
/// (`DIR/`, all its files) in the model.
pub const COLLAPSE_AFTER: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BehaviorModel {
    /// The policy that modeled the workload.
    pub policy: String,
    /// Where the policy came from (its file).
    pub source: String,
    /// The policy's spec, for `palisade model to-policy`: its target and rule modules.
    pub spec: PolicySpec,
    /// What it modeled: the target cgroup.
    pub target: String,
    /// RFC 3339.
    pub started: String,
    pub ended: String,
    /// The policy's `behaviorModeling.duration`.
    pub duration_seconds: u64,
    /// Whether the model covers the policy's whole duration (not cut short by the policy
    /// changing mode, being removed or the agent stopping).
    pub complete: bool,
    /// Operations the kernel could not record (its record map was full): the model misses them.
    pub lost: u64,
    pub files: Vec<FileUse>,
    pub executables: Vec<Counted<Executable>>,
    pub capabilities: Vec<Counted<Capability>>,
    pub sockets: Vec<Counted<Socket>>,
    pub peers: Vec<Counted<Peer>>,
    pub mounts: Vec<Counted<Mount>>,
    /// Other operations: user namespaces created, bpf() commands, processes traced, BPF filters
    /// attached to sockets.
    pub operations: Vec<Counted<Operation>>,
}

/// A thing done, and how many times.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Counted<T> {
    #[serde(flatten)]
    pub what: T,
    pub count: u64,
}

/// A program run: the file really executed, not the name it was started by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Executable {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Capability {
    /// As policies name it (`net_bind_service`); its number if this build does not know it.
    pub name: String,
}

/// A file (or, collapsed, a directory's files) and what was asked of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileUse {
    /// An absolute path; a directory's files when it ends with `/`; "" for a file no path
    /// names (cut off from its mount). A path too long to record ends with `**`.
    pub path: String,
    /// read, write, append, exec, connect (an AF_UNIX socket bound at this name).
    pub permissions: Vec<String>,
    /// The hooks that saw it: file_open, mmap_file (mapped executable: shared libraries),
    /// path_unlink...
    pub hooks: Vec<String>,
    pub count: u64,
    /// Why this entry stands for many files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapsed: Option<Collapsed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Collapsed {
    /// The distinct files it stands for.
    pub files: usize,
    pub rule: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Socket {
    pub family: u32,
    /// The type without its flags (SOCK_STREAM 1, SOCK_DGRAM 2, SOCK_RAW 3...).
    #[serde(rename = "type")]
    pub kind: u32,
    /// After defaulting: what protocol 0 meant.
    pub protocol: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    /// socket_connect, or socket_sendmsg (a datagram with its own destination).
    pub hook: String,
    /// IPv4 addresses in IPv4 form.
    pub address: String,
    pub port: u32,
    pub protocol: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// sb_mount (mount(2)), sb_kern_mount (a new superblock), move_mount, fs_context_parse_param
    /// (fsconfig), sb_umount.
    pub hook: String,
    pub fs_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub hook: String,
    /// bpf: the command; ptrace_access_check: the mode; socket_setsockopt: level << 16 |
    /// option; userns_create: 0.
    pub arg: u32,
}

/// Names of address families (`socket(2)`'s first argument) models and policies write by name.
const FAMILIES: &[(u32, &str)] = &[
    (1, "unix"),
    (2, "inet"),
    (10, "inet6"),
    (16, "netlink"),
    (17, "packet"),
    (38, "alg"),
    (40, "vsock"),
];

/// Names of socket types.
const SOCKET_TYPES: &[(u32, &str)] = &[
    (1, "stream"),
    (2, "dgram"),
    (3, "raw"),
    (4, "rdm"),
    (5, "seqpacket"),
    (6, "dccp"),
    (10, "packet"),
];

fn named(names: &[(u32, &str)], number: u32) -> String {
    names
        .iter()
        .find(|(known, _)| *known == number)
        .map_or_else(|| number.to_string(), |(_, name)| (*name).to_owned())
}

/// An address family by name ("inet"), or by number where it has none here.
pub fn family_name(family: u32) -> String {
    named(FAMILIES, family)
}

/// A socket type by name ("stream"), or by number.
pub fn socket_type_name(kind: u32) -> String {
    named(SOCKET_TYPES, kind)
}

/// The name of IP protocol `number` where it has a common one.
fn protocol_name(number: u32) -> String {
    match number {
        1 => "icmp".to_owned(),
        6 => "tcp".to_owned(),
        17 => "udp".to_owned(),
        58 => "icmpv6".to_owned(),
        number => format!("protocol {number}"),
    }
}

impl fmt::Display for Executable {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.path)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Display for Socket {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{} {}",
            family_name(self.family),
            socket_type_name(self.kind)
        )?;
        if self.protocol != 0 {
            write!(f, " ({})", protocol_name(self.protocol))?;
        }
        Ok(())
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let protocol = protocol_name(self.protocol);
        if self.address.contains(':') {
            write!(
                f,
                "[{}]:{} {protocol} ({})",
                self.address, self.port, self.hook
            )
        } else {
            write!(
                f,
                "{}:{} {protocol} ({})",
                self.address, self.port, self.hook
            )
        }
    }
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} ({})", self.fs_type, self.hook)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} {}", self.hook, self.arg)
    }
}

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

impl BehaviorModel {
    /// Writes the model to `path` whole (a reader never sees half of it).
    pub fn save(&self, path: &Path) -> Result<(), ModelFileError> {
        let io = |source| ModelFileError::Io {
            path: path.display().to_string(),
            source,
        };
        let text = serde_yaml::to_string(self).map_err(|source| ModelFileError::Format {
            path: path.display().to_string(),
            source,
        })?;
        let partial = path.with_extension("yaml.partial");
        std::fs::write(&partial, text).map_err(io)?;
        std::fs::rename(&partial, path).map_err(io)
    }

    /// Reads a model file, or a model object (`kubectl get palisadebehaviormodel NAME -o yaml`):
    /// its spec is the model.
    pub fn load(path: &Path) -> Result<Self, ModelFileError> {
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
        model.save(&path).unwrap();
        assert_eq!(BehaviorModel::load(&path).unwrap(), model);
        // As the agent stores it in Kubernetes.
        let object = serde_json::json!({
            "apiVersion": "palisade.dev/v1alpha1",
            "kind": "PalisadeBehaviorModel",
            "metadata": {"name": "web.node-1", "namespace": "shop"},
            "spec": model,
        });
        std::fs::write(&path, serde_yaml::to_string(&object).unwrap()).unwrap();
        assert_eq!(BehaviorModel::load(&path).unwrap(), model);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
