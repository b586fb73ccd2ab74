//! The contract with the BPF object beyond the types of `palisade.h` (which bindgen generates):
//! the object's maps with the Rust types of their keys and values, its programs, and how keys are
//! encoded. The tests below hold these lists to the object, so that a map or program added on one
//! side only fails them.

use std::os::unix::fs::MetadataExt;

use aya::{
    Ebpf,
    maps::{
        Array, ArrayOfMaps, HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf,
        lpm_trie::{Key, LpmTrie},
    },
};
use palisade_common::{
    CGROUP_NAME_LEN, Config, Gate, GlobKey, GlobRule, HookCost, InodeKey, InodeRuleKey,
    InodeVerdict, KEY_PATH_LEN, ModelKey, MountTypeKey, NETWORK_FIXED_BITS, NetworkKeyData,
    PathVerdict, PendingKey, Policy, RuleCount, RuleKey, SocketKey, TRIE_FIXED_BITS, Target,
    TriePath, Verdict,
};
use serde::Serialize;

use super::LoadError;
use crate::policy::NetworkEntry;

/// Declares the maps: those the agent opens, each a field of `Maps` named like the map (or, for
/// a global data section, with the section's name after `in`), and those only the programs use;
/// `MAPS` names them all (the agent pins every one).
macro_rules! maps {
    (
        opened { $($name:ident $(in $section:literal)?: $type:ty,)* }
        kernel_only { $($kernel_only:ident,)* }
    ) => {
        /// The maps the agent reads and writes, taken out of the loaded object.
        pub(crate) struct Maps {
            $(pub $name: $type,)*
        }

        impl Maps {
            pub fn take(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
                Ok(Self {
                    $($name: ebpf
                        .take_map(map_name!($name $($section)?))
                        .and_then(|map| <$type>::try_from(map).ok())
                        .ok_or(LoadError::Map(map_name!($name $($section)?)))?,)*
                })
            }
        }

        pub(crate) const MAPS: &[&str] = &[
            $(map_name!($name $($section)?),)*
            $(stringify!($kernel_only),)*
        ];

        /// The key and value sizes of the maps the agent opens, by their Rust types.
        #[cfg(test)]
        const OPENED: &[(&str, (usize, usize))] = &[
            $((map_name!($name $($section)?), <$type as tests::Entries>::SIZES),)*
        ];
    };
}

/// The object's name of a map: its own, or its global data section's.
macro_rules! map_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident $section:literal) => {
        $section
    };
}

maps! {
    opened {
        config: Array<MapData, Config>,
        gate in ".data.gate": Array<MapData, Gate>,
        targets: HashMap<MapData, u64, Target>,
        pending: HashMap<MapData, PendingKey, Target>,
        protected_inodes: HashMap<MapData, InodeKey, u32>,
        policies: HashMap<MapData, u32, Policy>,
        path_prefixes: LpmTrie<MapData, TriePath, PathVerdict>,
        path_suffixes: LpmTrie<MapData, TriePath, PathVerdict>,
        globs: HashMap<MapData, GlobKey, GlobRule>,
        inode_rules: HashMap<MapData, InodeRuleKey, InodeVerdict>,
        mount_types: HashMap<MapData, MountTypeKey, Verdict>,
        sockets: HashMap<MapData, SocketKey, Verdict>,
        network: LpmTrie<MapData, NetworkKeyData, Verdict>,
        events: RingBuf<MapData>,
        stats: PerCpuArray<MapData, u64>,
        rule_counts: PerCpuHashMap<MapData, RuleKey, RuleCount>,
        hook_cost: PerCpuArray<MapData, HookCost>,
        model_records: HashMap<MapData, ModelKey, u64>,
        sync_barrier: ArrayOfMaps<MapData, Array<MapData, u32>>,
        sync_inner: Array<MapData, u32>,
    }
    kernel_only {
        audit_buckets,
        fast_path,
        reported,
        runtime_setup,
        scratch_space,
    }
}

/// The LSM programs of the object, each named after the hook it attaches to.
pub const PROGRAMS: &[&str] = &[
    "file_open",
    "d_instantiate",
    "file_receive",
    "bprm_check_security",
    "mmap_file",
    "task_kill",
    "ptrace_access_check",
    "path_truncate",
    "path_unlink",
    "path_rmdir",
    "path_mknod",
    "path_mkdir",
    "path_symlink",
    "path_link",
    "path_rename",
    "path_chmod",
    "sb_mount",
    "sb_kern_mount",
    "move_mount",
    "fs_context_parse_param",
    "sb_umount",
    "capable",
    "userns_create",
    "bpf",
    "socket_create",
    "socket_connect",
    "socket_sendmsg",
    "socket_setsockopt",
    "unix_stream_connect",
    "kernfs_init_security",
    "inode_init_security_anon",
];

/// Where a program that is not on an LSM hook runs: at the entry or at the exit of a kernel
/// function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traced {
    Entry(&'static str),
    Exit(&'static str),
}

/// The programs on kernel functions, each named after what it does: those on `__d_move` count
/// the kernel's dentry moves for the open verdict cache (ebpf/programs/open_cache.h).
pub const TRACING_PROGRAMS: &[(&str, Traced)] = &[
    ("dentry_move_start", Traced::Entry("__d_move")),
    ("dentry_move_end", Traced::Exit("__d_move")),
];

/// Every program of the object: the LSM programs, then the tracing ones.
pub(crate) fn program_names() -> impl Iterator<Item = &'static str> {
    PROGRAMS
        .iter()
        .copied()
        .chain(TRACING_PROGRAMS.iter().map(|(name, _)| *name))
}

/// The `pending` key of the cgroup `name` below `parent_id`; None for a name the kernel cannot
/// arm (empty, with a slash, or too long).
pub fn pending_key(parent_id: u64, name: &str) -> Option<PendingKey> {
    let mut key = PendingKey {
        parent_id,
        name: [0; CGROUP_NAME_LEN as usize],
    };
    if name.is_empty() || name.len() >= key.name.len() || name.contains('/') {
        return None;
    }
    key.name[..name.len()].copy_from_slice(name.as_bytes());
    Some(key)
}

/// The `path_prefixes` or `path_suffixes` key of `bytes` (a path, or a reversed suffix) in a
/// policy: matched in full, like the kernel's lookups.
pub fn trie_key(policy_id: u32, bytes: &[u8]) -> Key<TriePath> {
    let mut path = TriePath {
        policy_id,
        path: [0; KEY_PATH_LEN as usize],
    };
    path.path[..bytes.len()].copy_from_slice(bytes);
    Key::new(TRIE_FIXED_BITS + 8 * bytes.len() as u32, path)
}

/// The `network` key of a rule's destination in a policy: its address block's bits, after the
/// fields always matched in full.
pub fn network_key(policy_id: u32, entry: &NetworkEntry) -> Key<NetworkKeyData> {
    let data = NetworkKeyData {
        policy_id,
        protocol: entry.protocol,
        reserved: 0,
        port: entry.port,
        addr: entry.block.addr,
    };
    Key::new(NETWORK_FIXED_BITS + entry.block.bits, data)
}

pub fn mount_type_key(policy_id: u32, fs_type: &[u8; 16]) -> MountTypeKey {
    MountTypeKey {
        policy_id,
        fs_type: *fs_type,
    }
}

pub fn socket_key(policy_id: u32, (family, protocol): (u32, u32)) -> SocketKey {
    SocketKey {
        policy_id,
        family,
        protocol,
    }
}

pub fn glob_key(policy_id: u32, index: usize) -> GlobKey {
    GlobKey {
        policy_id,
        index: index as u32,
    }
}

/// The `protected_inodes` key of the inode `metadata` describes.
pub fn inode_key(metadata: &std::fs::Metadata) -> InodeKey {
    InodeKey {
        ino: metadata.ino(),
        dev: Device::from_user(metadata.dev()).0,
        reserved: 0,
    }
}

/// A device number as the kernel encodes it (MKDEV: major << 20 | minor; user space's dev_t
/// differs), written "major:minor".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(pub u32);

impl Device {
    const MINOR_BITS: u32 = 20;

    pub fn from_user(dev: u64) -> Self {
        Self((libc::major(dev) << Self::MINOR_BITS) | libc::minor(dev))
    }

    pub fn major(self) -> u32 {
        self.0 >> Self::MINOR_BITS
    }

    pub fn minor(self) -> u32 {
        self.0 & ((1 << Self::MINOR_BITS) - 1)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major(), self.minor())
    }
}

impl Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use aya::Pod;
    use aya_obj::{Object, ProgramSection};

    use super::*;
    use crate::bpf::{HOOKS, OBJECT};

    /// Key and value sizes of a map type, as the object declares them.
    pub trait Entries {
        const SIZES: (usize, usize);
    }

    impl<K: Pod, V: Pod> Entries for HashMap<MapData, K, V> {
        const SIZES: (usize, usize) = (size_of::<K>(), size_of::<V>());
    }

    impl<K: Pod, V: Pod> Entries for PerCpuHashMap<MapData, K, V> {
        const SIZES: (usize, usize) = (size_of::<K>(), size_of::<V>());
    }

    impl<K: Pod, V: Pod> Entries for LpmTrie<MapData, K, V> {
        const SIZES: (usize, usize) = (size_of::<Key<K>>(), size_of::<V>());
    }

    impl<V: Pod> Entries for Array<MapData, V> {
        const SIZES: (usize, usize) = (size_of::<u32>(), size_of::<V>());
    }

    impl<V: Pod> Entries for PerCpuArray<MapData, V> {
        const SIZES: (usize, usize) = (size_of::<u32>(), size_of::<V>());
    }

    /// Keys are indexes, values are the inner maps' descriptors.
    impl<V> Entries for ArrayOfMaps<MapData, V> {
        const SIZES: (usize, usize) = (size_of::<u32>(), size_of::<u32>());
    }

    impl Entries for RingBuf<MapData> {
        const SIZES: (usize, usize) = (0, 0);
    }

    fn object() -> Object {
        Object::parse(OBJECT).expect("the embedded object parses")
    }

    #[test]
    fn the_maps_are_the_objects_with_their_key_and_value_sizes() {
        let object = object();
        let defined: BTreeMap<&str, (usize, usize)> = object
            .maps
            .iter()
            .map(|(name, map)| {
                let sizes = (map.key_size() as usize, map.value_size() as usize);
                (name.as_str(), sizes)
            })
            .collect();
        let mut listed = MAPS.to_vec();
        listed.sort();
        listed.dedup();
        assert_eq!(listed.len(), MAPS.len(), "a map listed twice");
        assert_eq!(
            defined.keys().copied().collect::<Vec<_>>(),
            listed,
            "the object's maps (left) are not the agent's"
        );
        for (name, sizes) in OPENED {
            assert_eq!(*sizes, defined[name], "{name}: (key, value) sizes");
        }
    }

    #[test]
    fn the_programs_are_the_objects_and_cover_every_hook() {
        let object = object();
        let mut defined: Vec<&str> = object.programs.keys().map(String::as_str).collect();
        defined.sort();
        let mut listed: Vec<&str> = program_names().collect();
        listed.sort();
        assert_eq!(
            defined, listed,
            "the object's programs (left) are not the agent's"
        );
        for (name, program) in &object.programs {
            let traced = TRACING_PROGRAMS
                .iter()
                .find(|(traced, _)| traced == name)
                .map(|(_, traced)| traced);
            let expected = match traced {
                None => matches!(program.section, ProgramSection::Lsm { sleepable: false }),
                Some(Traced::Entry(_)) => {
                    matches!(program.section, ProgramSection::FEntry { sleepable: false })
                }
                Some(Traced::Exit(_)) => {
                    matches!(program.section, ProgramSection::FExit { sleepable: false })
                }
            };
            assert!(expected, "{name} is not attached as the agent attaches it");
        }
        for hook in HOOKS {
            assert!(
                PROGRAMS.contains(&hook.name),
                "no program for {}",
                hook.name
            );
        }
    }

    #[test]
    fn devices_are_encoded_as_the_kernel_does() {
        let device = Device::from_user(libc::makedev(8, 17));
        assert_eq!(device, Device(8 << 20 | 17));
        assert_eq!(device.to_string(), "8:17");
    }
}
