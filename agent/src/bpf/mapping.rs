//! A map of `BPF_F_MMAPABLE` mapped into the agent: its values read and changed with atomic
//! operations, as the programs do, so that none is lost to a write and no program reads one
//! torn.

use std::{
    os::fd::{AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU8, AtomicU64, Ordering},
};

use aya::{maps::MapError, sys::SyscallError};

/// A shared mapping of a map's values, unmapped on drop.
pub(super) struct Mapping {
    start: NonNull<u8>,
    /// The bytes asked for.
    len: usize,
    /// The bytes mapped: whole pages.
    mapped: usize,
    writable: bool,
}

// What is mapped is read and written through atomics only.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of the values of `map`, to be read, or read and written.
    pub fn new(map: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Self, MapError> {
        let mapped = len.next_multiple_of(page_size());
        let protection = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new shared mapping of the map's first `mapped` bytes, unmapped on drop.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                protection,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(SyscallError {
                call: "mmap",
                io_error: std::io::Error::last_os_error(),
            }
            .into());
        }
        Ok(Self {
            start: NonNull::new(start.cast()).expect("mmap succeeded"),
            len,
            mapped,
            writable,
        })
    }

    /// The u64 at byte `offset`, to be read.
    pub fn load(&self, offset: usize) -> u64 {
        self.u64_at(offset).load(Ordering::Relaxed)
    }

    /// The u64 at byte `offset` of a writable mapping, to be changed.
    pub fn atomic(&self, offset: usize) -> &AtomicU64 {
        assert!(self.writable, "a writable mapping");
        self.u64_at(offset)
    }

    /// The byte at `offset` of a writable mapping, to be changed.
    pub fn atomic_byte(&self, offset: usize) -> &AtomicU8 {
        assert!(self.writable, "a writable mapping");
        assert!(offset < self.len, "a byte of the mapping");
        // SAFETY: within the mapping, which lives as long as the reference; the kernel and the
        // agent access it atomically only.
        unsafe { self.start.byte_add(offset).cast::<AtomicU8>().as_ref() }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "a u64 of the mapping"
        );
        // SAFETY: within the mapping, which lives as long as the reference, and aligned (the
        // mapping starts on a page); the kernel and the agent access it atomically only.
        unsafe { self.start.byte_add(offset).cast::<AtomicU64>().as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, no longer referenced.
        unsafe { libc::munmap(self.start.as_ptr().cast(), self.mapped) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}
