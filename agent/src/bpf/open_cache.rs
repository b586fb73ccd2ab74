//! The epoch of the open verdict cache (ebpf/programs/open_cache.h): a cached open holds only
//! within the epoch it was decided in. Whatever changes what decides a target's open without its
//! path advances it once the change is made: the enforcer (targets, the policies they point at)
//! and the protected files (a file newly kept from targets) both hold this handle.

use std::sync::{
    Arc, Mutex, PoisonError,
    atomic::{Ordering, fence},
};

use aya::maps::{Array, MapData, MapError};
use tracing::warn;

/// An epoch in the cache's generation, which the programs on `__d_move` advance by one at each
/// move's start and end: far more than the moves counted between a read and the write after it
/// (the write replaces them), and even, so that an odd generation (the cache off) stays odd.
const EPOCH: u64 = 1 << 32;

#[derive(Clone)]
pub struct OpenCache(Arc<Mutex<Array<MapData, u64>>>);

impl OpenCache {
    /// Starts a new epoch in `generation` (the map, an earlier agent's if pinned): the cached
    /// opens of that agent's decisions are not this one's.
    pub(super) fn new(generation: Array<MapData, u64>) -> Result<Self, MapError> {
        let cache = Self(Arc::new(Mutex::new(generation)));
        cache.forget()?;
        Ok(cache)
    }

    /// Starts a new epoch, or warns that the opens `stale` names may go on being answered as
    /// before the change until their slots end. (A failure to write a one-entry array is not to
    /// be expected.)
    pub fn forget_or_warn(&self, stale: &str) {
        if let Err(err) = self.forget() {
            // OPEN_SLOT_LIFETIME jiffies at the lowest HZ, 100.
            warn!("{stale} for up to 100 s: {err}");
        }
    }

    /// Starts a new epoch: no open is answered from the cache by a decision made before. An
    /// error means the cache may still answer as before the change.
    fn forget(&self) -> Result<(), MapError> {
        let mut generation = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let next = generation.get(&0, 0)?.wrapping_add(EPOCH);
        // The change, written by the kernel on this thread, visible to every CPU before the
        // epoch is (a store may pass an earlier one on arm64): the programs read the
        // generation first.
        fence(Ordering::SeqCst);
        generation.set(0, next, 0)
    }
}
