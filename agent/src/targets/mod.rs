//! Who is protected: cgroup v2 directories, identified by the id the kernel reports for them.

mod cgroup;

pub use cgroup::{Cgroup, CgroupError, Hierarchy, Mount, find_mount, join_in_child};
