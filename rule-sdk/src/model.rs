//! Behaviour models: what a workload did while a BehaviorModeling policy modeled it, each
//! distinct thing once with how many times it was done. The agent writes them (as YAML files or
//! Kubernetes objects); model transforms (see [`Transform`](crate::Transform)) rewrite them
//! before `palisade model to-policy` makes them a policy.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A model as transforms see it: the policy's spec left as JSON.
pub type Model = BehaviorModel<serde_json::Value>;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BehaviorModel<Spec = serde_json::Value> {
    /// The policy that modeled the workload.
    pub policy: String,
    /// Where the policy came from (its file).
    pub source: String,
    /// The policy's spec, for `palisade model to-policy`: its target and rule modules.
    pub spec: Spec,
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
    /// The model transforms that rewrote the model, in order (`palisade model transform`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transformed: Vec<Transformation>,
}

/// A model transform that rewrote a model: which module, with what configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transformation {
    /// The module's file name.
    pub module: String,
    /// SHA-256 of the module, in hex.
    pub sha256: String,
    pub config: serde_json::Value,
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
    /// names (cut off from its mount); "pipe:[N]", "socket:[N]"... for a file of no directory.
    /// A path too long to record ends with `**`.
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
    /// option; userns_create and inode_init_security_anon (a userfaultfd): 0.
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

fn numbered(names: &[(u32, &str)], name: &str) -> Option<u32> {
    names
        .iter()
        .find(|(_, known)| *known == name)
        .map(|(number, _)| *number)
        .or_else(|| name.parse().ok())
}

/// The address family `family_name` writes as `name`.
pub fn family_number(name: &str) -> Option<u32> {
    numbered(FAMILIES, name)
}

/// The socket type `socket_type_name` writes as `name`.
pub fn socket_type_number(name: &str) -> Option<u32> {
    numbered(SOCKET_TYPES, name)
}

/// The name of IP protocol `number` where it has a common one.
pub fn protocol_name(number: u32) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_socket_types_read_back_by_name_or_number() {
        for number in [1, 2, 10, 16, 17, 38, 40, 44] {
            assert_eq!(family_number(&family_name(number)), Some(number));
        }
        for number in 1..=10 {
            assert_eq!(socket_type_number(&socket_type_name(number)), Some(number));
        }
        assert_eq!(family_number("inet7"), None);
        assert_eq!(socket_type_number("river"), None);
    }
}
