//! Who is protected: cgroup v2 directories, identified by the id the kernel reports for them,
//! and where they are for Kubernetes pods.

mod cgroup;
mod placement;
mod pods;

pub use cgroup::{Cgroup, CgroupError, Hierarchy, Mount, find_mount, join_in_child};
pub use placement::{Enforce, FakeKernel, Placement};
pub use pods::{CgroupDriver, PodIdentity, PodRegistry, container_id};
