//! The generation of the open verdict cache (ebpf/programs/open_cache.h): a cached open holds
//! only within the generation it was decided in. Whatever changes what decides a target's open
//! without its path adds an epoch to it once the change is made: the enforcer (targets, the
//! policies they point at) and the protected files (a file newly kept from targets) both hold
//! this handle. The programs on `__d_move` add one at each dentry move's start and end.

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::{
    maps::{Array, IterableMap, MapData, MapError},
    sys::SyscallError,
};

/// An epoch: even, so that an odd generation (the cache off) stays odd.
const EPOCH: u64 = 1 << 32;

#[derive(Clone)]
pub struct OpenCache(Arc<Generation>);

impl OpenCache {
    /// Starts a new epoch in `generation` (the map, an earlier agent's if pinned): the cached
    /// opens of that agent's decisions are not this one's.
    pub(super) fn new(generation: Array<MapData, u64>) -> Result<Self, MapError> {
        let cache = Self(Arc::new(Generation::map(generation.map())?));
        cache.forget();
        Ok(cache)
    }

    /// Starts a new epoch: no open is answered from the cache by a decision made before. A full
    /// barrier: the change, written by the kernel on this thread, is visible to every CPU before
    /// the epoch is (the programs read the generation first).
    pub fn forget(&self) {
        self.0.value().fetch_add(EPOCH, Ordering::SeqCst);
    }
}

/// Keeps the cache from answering or remembering any open: an odd generation, a dentry move
/// under way for the programs, stays odd while nothing counts moves.
pub(super) fn turn_off(generation: &MapData) -> Result<(), MapError> {
    Generation::map(generation)?
        .value()
        .fetch_or(1, Ordering::SeqCst);
    Ok(())
}

/// The generation's map (`BPF_F_MMAPABLE`) mapped into the agent: its value changes by atomic
/// adds, as the programs' do, so that none is lost to a write and no program reads one torn.
struct Generation(NonNull<AtomicU64>);

// The value is an atomic, which the mapping keeps valid until dropped.
unsafe impl Send for Generation {}
unsafe impl Sync for Generation {}

impl Generation {
    fn map(map: &MapData) -> Result<Self, MapError> {
        // SAFETY: a new shared mapping of the map's one page, unmapped on drop; the kernel
        // places element 0 at its start, aligned for a u64.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(SyscallError {
                call: "mmap",
                io_error: std::io::Error::last_os_error(),
            }
            .into());
        }
        Ok(Self(NonNull::new(mapped.cast()).expect("mmap succeeded")))
    }

    fn value(&self) -> &AtomicU64 {
        // SAFETY: mapped until `self` is dropped.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, no longer referenced.
        unsafe { libc::munmap(self.0.as_ptr().cast(), page_size()) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}
