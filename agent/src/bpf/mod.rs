//! The kernel side, seen from user space: loading and attaching the programs (`loader`), and
//! the maps through which policies are enforced: the policies' entries (`store`), which target
//! has which (`table`, and which cgroups may be targets: `target_filter`), what the kernel counts
//! (`counters`) and what it records for BehaviorModeling (`records`), and the open verdict
//! cache's generation (`open_cache`), some of them mapped into the agent (`mapping`).
//! `Enforcer` owns them all and switches policies in (`swap`); `layout` is the contract with the
//! object.

mod counters;
mod enforcer;
mod hooks;
mod layout;
mod loader;
mod mapping;
mod names;
mod open_cache;
mod pinned;
mod preflight;
mod protected;
mod records;
mod registry;
mod sizes;
mod store;
mod table;
mod target_filter;

pub use counters::{DecisionCost, MeasureError, ProgramRuns, RuleCounts, RuleLabels, Stats};
pub use enforcer::{AuditRate, Enforcer, RetireError};
pub use hooks::{HOOKS, Hook, Subject, action_name, hook_name, hook_named};
pub use layout::{Device, PROGRAMS, TRACING_PROGRAMS, Traced, inode_key, pending_key};
pub(crate) use layout::{MAPS, Maps};
use open_cache::OpenCache;
pub use pinned::{DEFAULT_ROOT, PinnedState, object_version, remove as remove_pinned};
pub use preflight::{KERNEL_BTF, LoadError, LsmList, Preflight};
pub use protected::{ProtectError, ProtectedFiles, Protection};
pub use records::Records;
pub use registry::{InstalledPolicy, PolicyRegistry, SELF_PROTECTION};
pub use sizes::{EnforceError, MapSizes};
pub use store::ProgramsBarrier;

/// The BPF object built from ebpf/programs by build.rs.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/palisade.bpf.o"));

/// How many programs the agent attaches.
pub const PROGRAM_COUNT: usize = PROGRAMS.len() + TRACING_PROGRAMS.len();
