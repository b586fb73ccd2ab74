//! The target filter (in the fast path's value, ebpf/programs/common.h), seen from the agent: a
//! byte per cgroup id, set before the cgroup becomes a target, so that the programs tell a task
//! under no target so without a hash lookup. The kernel sets the byte of a staged cgroup it
//! arms; the agent sets the others', and clears those of cgroups no longer targets (`rebuild`)
//! only while no program can set one. One agent at a time writes it (the pinned state is one
//! agent's).

use std::{
    os::fd::AsFd,
    sync::atomic::{AtomicU8, Ordering},
};

use aya::maps::{MapData, MapError};
use palisade_common::{FAST_PATH_TARGET_FILTER, TARGET_FILTER_CGROUPS};

use super::mapping::Mapping;

const START: usize = FAST_PATH_TARGET_FILTER as usize;
const CGROUPS: usize = TARGET_FILTER_CGROUPS as usize;

/// The filter, mapped into the agent.
pub(super) struct TargetFilter(Mapping);

impl TargetFilter {
    /// The filter of the fast path's map `fast_path`, as it is: an earlier agent's pinned one
    /// has the bytes of its targets.
    pub fn new(fast_path: &MapData) -> Result<Self, MapError> {
        Ok(Self(Mapping::new(
            fast_path.fd().as_fd(),
            START + CGROUPS,
            true,
        )?))
    }

    /// Lets cgroup `id` be a target: before its entry is added.
    pub fn mark(&self, id: u64) {
        self.byte(position(id)).store(1, Ordering::SeqCst);
    }

    /// Leaves set only the bytes of the cgroups `targets`. Only while no program can set a
    /// byte: nothing is staged, and no program that found a stage can still be running.
    pub fn rebuild(&self, targets: impl IntoIterator<Item = u64>) {
        let mut bytes = vec![0; CGROUPS];
        for id in targets {
            bytes[position(id)] = 1;
        }
        // Only the bytes that change: every CPU's copy of the others stays valid.
        for (position, set) in bytes.into_iter().enumerate() {
            if self.byte(position).load(Ordering::SeqCst) != set {
                self.byte(position).store(set, Ordering::SeqCst);
            }
        }
    }

    fn byte(&self, position: usize) -> &AtomicU8 {
        self.0.atomic_byte(START + position)
    }
}

/// The byte of cgroup `id`, as the programs' `filter_byte` finds it: the id modulo the
/// filter's size.
fn position(id: u64) -> usize {
    (id % CGROUPS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_id_wraps_around_the_filter() {
        assert_eq!(position(0), 0);
        assert_eq!(position(65), 65);
        assert_eq!(position(CGROUPS as u64 + 63), 63);
        assert_eq!(position(u64::MAX), CGROUPS - 1);
    }
}
