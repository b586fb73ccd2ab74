//! The open verdict cache (ebpf/programs/open_cache.h), in the fast path's value
//! (ebpf/programs/common.h), seen from the agent: its generation and the count of opens its
//! slots answered.
//!
//! A cached open holds only within the generation it was decided in. Whatever changes what
//! decides a target's open without its path adds an epoch to it once the change is made: the
//! enforcer (targets, the policies they point at) and the protected files (a file newly kept
//! from targets) both hold this handle. The programs on `__d_move` add one at each dentry
//! move's start and end. Its top bit turns the cache off: on a kernel whose dentry moves cannot
//! be counted, and for `palisade agent --no-open-cache`.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::{
    maps::{MapData, MapError},
    sys::SyscallError,
};
use palisade_common::{
    FAST_PATH_OPEN_GENERATION, FAST_PATH_OPEN_SLOTS, OPEN_CACHE_OFF_BIT, OPEN_SLOT_HITS,
    OPEN_SLOT_SIZE, OPEN_SLOTS,
};

use super::mapping::Mapping;

/// An epoch: even, so that an odd generation (a dentry move under way) stays odd.
const EPOCH: u64 = 1 << 32;
/// The generation's bit that turns the cache off.
const OFF: u64 = 1 << OPEN_CACHE_OFF_BIT;

#[derive(Clone)]
pub struct OpenCache(Arc<Inner>);

struct Inner {
    generation: Generation,
    slots: Slots,
}

impl OpenCache {
    /// Starts a new epoch in the fast path's map `fast_path` (an earlier agent's if pinned): the
    /// cached opens of that agent's decisions are not this one's.
    pub(super) fn new(fast_path: &MapData) -> Result<Self, MapError> {
        let cache = Self(Arc::new(Inner {
            generation: Generation::map(fast_path)?,
            slots: Slots::new(fast_path)?,
        }));
        cache.forget();
        Ok(cache)
    }

    /// Starts a new epoch: no open is answered from the cache by a decision made before. A full
    /// barrier: the change, written by the kernel on this thread, is visible to every CPU before
    /// the epoch is (the programs read the generation first).
    pub fn forget(&self) {
        self.0.generation.forget();
    }

    /// The opens of targets the cache answered (without resolving their path), since its map
    /// was made.
    pub fn answered(&self) -> Result<u64, MapError> {
        self.0.slots.hits()
    }

    /// Keeps the cache from answering or remembering any open from now on, until an agent
    /// loads the programs again.
    pub fn turn_off(&self) {
        self.0.generation.set_off(true);
    }
}

/// Starts a new epoch in the fast path's map pinned at `path`, if one is: loading the object sets
/// the adopted gate back to its initial value, which enforces, and while the earlier agent's gate
/// enforced nothing lsm/d_instantiate kept no slot.
pub(super) fn forget_pinned(path: &Path) -> Result<(), MapError> {
    if !path.exists() {
        return Ok(());
    }
    let fast_path = MapData::from_pin(path)?;
    Generation::map(&fast_path)?.forget();
    Ok(())
}

/// Turns the cache of the fast path's map off (every open is decided by its path), or on: off
/// wherever nothing counts the kernel's dentry moves.
pub(super) fn set_off(fast_path: &MapData, off: bool) -> Result<(), MapError> {
    Generation::map(fast_path)?.set_off(off);
    Ok(())
}

/// The generation, mapped into the agent: it changes by atomic adds, as the programs' do.
struct Generation(Mapping);

const GENERATION: usize = FAST_PATH_OPEN_GENERATION as usize;

impl Generation {
    fn map(fast_path: &MapData) -> Result<Self, MapError> {
        Ok(Self(Mapping::new(
            fast_path.fd().as_fd(),
            GENERATION + size_of::<u64>(),
            true,
        )?))
    }

    fn value(&self) -> &AtomicU64 {
        self.0.atomic(GENERATION)
    }

    /// Adds an epoch (OpenCache::forget).
    fn forget(&self) {
        self.value().fetch_add(EPOCH, Ordering::SeqCst);
    }

    /// Sets or clears OFF, leaving the count the programs add to as it is.
    fn set_off(&self, off: bool) {
        if off {
            self.value().fetch_or(OFF, Ordering::SeqCst);
        } else {
            self.value().fetch_and(!OFF, Ordering::SeqCst);
        }
    }
}

/// The slots: each counts the opens it answered at OPEN_SLOT_HITS, and only grows. Mapped only
/// while they are summed: a lasting mapping of them all would be resident in the agent's memory.
struct Slots(OwnedFd);

const SLOTS: usize = FAST_PATH_OPEN_SLOTS as usize;
const SLOT_SIZE: usize = OPEN_SLOT_SIZE as usize;

impl Slots {
    /// The slots of the fast path's map `fast_path`, through a copy of its descriptor (a map's
    /// id gives one only to CAP_SYS_ADMIN).
    fn new(fast_path: &MapData) -> Result<Self, MapError> {
        let map = fast_path
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|io_error| SyscallError {
                call: "fcntl",
                io_error,
            })?;
        Ok(Self(map))
    }

    fn hits(&self) -> Result<u64, MapError> {
        let count = OPEN_SLOTS as usize;
        let mapping = Mapping::new(self.0.as_fd(), SLOTS + count * SLOT_SIZE, false)?;
        // The slots' size and offset are multiples of 8; the programs change a count by atomic
        // adds only.
        Ok((0..count)
            .map(|slot| mapping.load(SLOTS + slot * SLOT_SIZE + OPEN_SLOT_HITS as usize))
            .sum())
    }
}
