//! The target filter (`target_filter`, ebpf/programs/common.h), seen from the agent: a bit per
//! cgroup id, set before the cgroup becomes a target, so that the programs tell a task under no
//! target so without a hash lookup. The kernel sets the bit of a staged cgroup it arms; the
//! agent sets the others', and clears those of cgroups no longer targets (`rebuild`) only while
//! no program can set one. One agent at a time writes it (the pinned state is one agent's).

use std::{
    os::fd::AsFd,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{Array, IterableMap, MapData, MapError};
use palisade_common::TARGET_FILTER_WORDS;

use super::mapping::Mapping;

const WORDS: usize = TARGET_FILTER_WORDS as usize;

/// The filter, mapped into the agent.
pub(super) struct TargetFilter(Mapping);

impl TargetFilter {
    /// The filter of `map`, as it is: an earlier agent's pinned one has the bits of its targets.
    pub fn new(map: Array<MapData, u64>) -> Result<Self, MapError> {
        Ok(Self(Mapping::new(
            map.map().fd().as_fd(),
            WORDS * size_of::<u64>(),
            true,
        )?))
    }

    /// Lets cgroup `id` be a target: before its entry is added.
    pub fn mark(&self, id: u64) {
        let (word, bit) = position(id);
        self.word(word).fetch_or(bit, Ordering::SeqCst);
    }

    /// Leaves set only the bits of the cgroups `targets`. Only while no program can set a bit:
    /// nothing is staged, and no program that found a stage can still be running.
    pub fn rebuild(&self, targets: impl IntoIterator<Item = u64>) {
        let mut words = vec![0; WORDS];
        for id in targets {
            let (word, bit) = position(id);
            words[word] |= bit;
        }
        // Only the words that change: every CPU's copy of the others stays valid.
        for (word, bits) in words.into_iter().enumerate() {
            if self.word(word).load(Ordering::SeqCst) != bits {
                self.word(word).store(bits, Ordering::SeqCst);
            }
        }
    }

    fn word(&self, word: usize) -> &AtomicU64 {
        self.0.atomic(word * size_of::<u64>())
    }
}

/// The word and bit of cgroup `id`, as the programs' `filter_word` and `may_be_target` find
/// them: the id modulo the filter's bits.
fn position(id: u64) -> (usize, u64) {
    ((id / 64) as usize % WORDS, 1 << (id % 64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_id_wraps_around_the_filter() {
        assert_eq!(position(0), (0, 1));
        assert_eq!(position(65), (1, 2));
        assert_eq!(position(64 * WORDS as u64 + 63), (0, 1 << 63));
        assert_eq!(position(u64::MAX), (WORDS - 1, 1 << 63));
    }
}
