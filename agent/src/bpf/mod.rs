//! The kernel side, seen from user space: loading and attaching the LSM programs, and the maps
//! through which policies are enforced. `Enforcer` is the single owner of the loaded object.

mod enforcer;
mod hooks;
mod layout;
mod pinned;
mod preflight;
mod protected;

pub use enforcer::{
    AuditRate, DecisionCost, Enforcer, InstalledPolicy, MeasureError, PolicyRegistry, ProgramRuns,
    RetireError, RuleCounts, RuleLabels, SELF_PROTECTION, StageError, Stats,
};
pub use hooks::{HOOKS, Hook, Subject, action_name, hook_name, hook_named};
pub use layout::{Device, PROGRAMS, inode_key};
pub(crate) use layout::{MAPS, Maps};
pub use pinned::{DEFAULT_ROOT, PinnedState, object_version, remove as remove_pinned};
pub use preflight::{KERNEL_BTF, LoadError, LsmList, Preflight};
pub use protected::{ProtectError, ProtectedFiles, Protection};

/// The BPF object built from ebpf/programs by build.rs.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/palisade.bpf.o"));

/// How many programs the agent attaches.
pub const PROGRAM_COUNT: usize = PROGRAMS.len();
