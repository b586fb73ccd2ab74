//! Who is protected: cgroup v2 directories, identified by the id the kernel reports for them,
//! where they are for Kubernetes pods, and what this agent enforces on them.

mod cgroup;
mod enforced;
#[cfg(any(test, feature = "fake-kernel"))]
mod fake;
mod placement;
mod pods;

pub use cgroup::{Cgroup, CgroupError, Hierarchy, Mount, find_mount, join_in_child};
pub use enforced::{EnforcedSet, Entry};
#[cfg(any(test, feature = "fake-kernel"))]
pub use fake::FakeKernel;
pub use placement::{Enforce, Placement, StageError};
pub use pods::{CgroupDriver, PodIdentity, PodRegistry, container_id};
