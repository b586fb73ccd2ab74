//! The kernel side, seen from user space: loading and attaching the LSM programs, and the maps
//! through which policies are enforced. `Enforcer` is the single owner of the loaded object.

mod enforcer;
mod hooks;
mod pinned;
mod preflight;
mod protected;

pub use enforcer::{
    AuditRate, DecisionCost, Enforcer, InstalledPolicy, MeasureError, PolicyRegistry, ProgramRuns,
    RetireError, RuleCounts, RuleLabels, SELF_PROTECTION, StageError, Stats,
};
pub use hooks::{HOOKS, Hook, action_name, hook_name};
pub use pinned::{DEFAULT_ROOT, PinnedState, object_version, remove as remove_pinned};
pub use preflight::{KERNEL_BTF, LoadError, LsmList, Preflight};
pub use protected::{ProtectError, ProtectedFiles, Protection, inode_key};

/// The BPF object built from ebpf/programs by build.rs.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/palisade.bpf.o"));

/// The maps in the object: what the agent pins.
pub(crate) const MAPS: &[&str] = &[
    "config",
    "targets",
    "pending",
    "protected_inodes",
    "policies",
    "path_prefixes",
    "path_suffixes",
    "globs",
    "mount_types",
    "sockets",
    "network",
    "events",
    "stats",
    "rule_counts",
    "audit_buckets",
    "hook_cost",
    "sync_inner",
    "sync_barrier",
    "scratch_space",
];

/// How many programs the agent attaches.
pub const PROGRAM_COUNT: usize = PROGRAMS.len();

/// The LSM programs in the object, by function name, with the hook each attaches to.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("file_open", "file_open"),
    ("file_receive", "file_receive"),
    ("bprm_check_security", "bprm_check_security"),
    ("mmap_file", "mmap_file"),
    ("task_kill", "task_kill"),
    ("ptrace_access_check", "ptrace_access_check"),
    ("path_truncate", "path_truncate"),
    ("path_unlink", "path_unlink"),
    ("path_rmdir", "path_rmdir"),
    ("path_mknod", "path_mknod"),
    ("path_mkdir", "path_mkdir"),
    ("path_symlink", "path_symlink"),
    ("path_link", "path_link"),
    ("path_rename", "path_rename"),
    ("path_chmod", "path_chmod"),
    ("sb_mount", "sb_mount"),
    ("sb_kern_mount", "sb_kern_mount"),
    ("move_mount", "move_mount"),
    ("fs_context_parse_param", "fs_context_parse_param"),
    ("sb_umount", "sb_umount"),
    ("capable", "capable"),
    ("userns_create", "userns_create"),
    ("bpf", "bpf"),
    ("socket_create", "socket_create"),
    ("socket_connect", "socket_connect"),
    ("socket_sendmsg", "socket_sendmsg"),
    ("socket_setsockopt", "socket_setsockopt"),
    ("unix_stream_connect", "unix_stream_connect"),
    ("kernfs_init_security", "kernfs_init_security"),
];
