//! Who is protected: cgroup v2 directories, identified by the id the kernel reports for them.

mod cgroup;

pub use cgroup::{Cgroup, CgroupError, cgroup2_root, join_in_child, mount_point};
