//! The allocator `rule!` installs in a module. A verdict allocates and frees a few small strings
//! and lists for every event; through dlmalloc (the standard library's allocator on
//! wasm32-unknown-unknown) that took half of a module's instructions per event. Here a freed
//! small block goes on a free list of its size class and the next allocation of that class takes
//! it back: a pop and a push. Larger blocks, and the first block of each class, come from
//! dlmalloc. Free small blocks are kept for the life of the instance (a Wasm memory never shrinks
//! anyway), so a module holds at most as many as it ever used at once.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::UnsafeCell,
    ptr,
};

/// The smallest block: room for the free list's link.
const SMALLEST: usize = 8;
/// Classes of 8, 16, ... 2048 bytes.
const CLASSES: usize = 9;
/// Every small block's alignment: the most a Wasm value needs (v128).
const ALIGN: usize = 16;

pub struct SizeClasses {
    /// The first free block of each class; a free block holds the address of the next.
    free: UnsafeCell<[*mut u8; CLASSES]>,
}

// SAFETY: a module has one thread: `rule!` installs the allocator only on wasm32 without the
// atomics feature, and the SDK's tests use an instance each, never shared.
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    pub const fn new() -> Self {
        Self {
            free: UnsafeCell::new([ptr::null_mut(); CLASSES]),
        }
    }
}

impl Default for SizeClasses {
    fn default() -> Self {
        Self::new()
    }
}

/// The class of the blocks that hold `layout`, if it is small.
fn class(layout: Layout) -> Option<usize> {
    if layout.align() > ALIGN {
        return None;
    }
    let size = layout.size().max(SMALLEST).next_power_of_two();
    let class = (size.trailing_zeros() - SMALLEST.trailing_zeros()) as usize;
    (class < CLASSES).then_some(class)
}

fn block(class: usize) -> Layout {
    Layout::from_size_align(SMALLEST << class, ALIGN).expect("a power of two up to 2048")
}

unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class(layout) else {
            // SAFETY: the caller's layout, as given.
            return unsafe { System.alloc(layout) };
        };
        // SAFETY: one thread (see `Sync`), and no other reference to the lists lives across
        // calls; a block on a list is free and holds the next one's address.
        unsafe {
            let free = &mut (*self.free.get())[class];
            if free.is_null() {
                return System.alloc(block(class));
            }
            let taken = *free;
            *free = taken.cast::<*mut u8>().read();
            taken
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = class(layout) else {
            // SAFETY: a large block comes from `System` with this layout.
            return unsafe { System.dealloc(block, layout) };
        };
        // SAFETY: as in `alloc`; a small block has room and alignment for the link.
        unsafe {
            let free = &mut (*self.free.get())[class];
            block.cast::<*mut u8>().write(*free);
            *free = block;
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout =
            Layout::from_size_align(new_size, layout.align()).expect("as the caller's");
        match (class(layout), class(new_layout)) {
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: a large block comes from `System` with this layout.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: the caller's block and layouts; the copy fits both blocks.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_reused_by_class_and_keep_their_bytes_when_they_grow() {
        let allocator = SizeClasses::new();
        let layout = |size, align| Layout::from_size_align(size, align).unwrap();
        unsafe {
            for (size, align) in [(1, 1), (8, 8), (9, 4), (100, 16), (2048, 2), (2049, 8)] {
                let block = allocator.alloc(layout(size, align));
                assert_eq!(block as usize % align, 0, "{size} bytes aligned to {align}");
                block.write_bytes(0xab, size);
                allocator.dealloc(block, layout(size, align));
            }
            // The last block freed in a class is the next one of that class handed out.
            let first = allocator.alloc(layout(20, 8));
            let second = allocator.alloc(layout(30, 8));
            allocator.dealloc(first, layout(20, 8));
            assert_eq!(allocator.alloc(layout(17, 1)), first);
            assert_ne!(allocator.alloc(layout(32, 8)), second);
            // Growing within a class stays; across classes, and out of them, the bytes move.
            let mut block = allocator.alloc(layout(3, 1));
            block.copy_from_nonoverlapping(b"abc".as_ptr(), 3);
            assert_eq!(allocator.realloc(block, layout(3, 1), 8), block);
            for (old, new) in [(8, 100), (100, 5000), (5000, 10_000), (10_000, 40)] {
                block = allocator.realloc(block, layout(old, 1), new);
                assert_eq!(std::slice::from_raw_parts(block, 3), b"abc");
            }
            allocator.dealloc(block, layout(40, 1));
            // Alignment beyond what small blocks have is left to the system allocator.
            let aligned = allocator.alloc(layout(64, 64));
            assert_eq!(aligned as usize % 64, 0);
            allocator.dealloc(aligned, layout(64, 64));
        }
    }
}
