//! The component's allocator: free lists of power-of-two size classes (16
//! bytes to 1 KiB) in front of a general allocator (talc in the component).
//!
//! Nearly every allocation the component makes is small and short-lived: the
//! strings the host lowers into a call (each one a `cabi_realloc`), the
//! statements and rows of a batch, the answer lowered out. A general
//! allocator (talc, dlmalloc) searches bins, splits and coalesces on every
//! call; here a small block is a pop from its class's list and a free is a
//! push, with no header (Rust's `dealloc` passes the layout, so the class is
//! known). Larger blocks, and the slabs the classes are cut from, come from
//! the backing allocator.
//!
//! No crate offers this for wasm32 (wee_alloc is archived; lol_alloc's free
//! list is a linear search), hence this file.
//!
//! Memory: a freed small block stays in its class, so the small blocks held
//! are at most the peak of what each class had live at once (the instance's
//! memory limit bounds the whole, as it bounds the backing allocator).
//! Single-threaded: the component has no threads (no `atomics` target
//! feature), so the lists need no locking.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;

/// Size classes 16, 32, ..., 1024 bytes.
const CLASSES: usize = 7;
const SMALLEST: usize = 16;
const LARGEST: usize = SMALLEST << (CLASSES - 1);
/// What the classes take from the backing allocator at a time.
const SLAB_BYTES: usize = 16 << 10;

pub struct SizeClasses<B> {
    state: UnsafeCell<State>,
    backing: B,
}

struct State {
    /// Each class's free blocks, linked through their first word.
    free: [*mut u8; CLASSES],
    /// The rest of the current slab, not handed out yet.
    slab: *mut u8,
    slab_left: usize,
}

// SAFETY: only one thread ever runs in the component (see the module docs);
// the tests use one allocator per thread.
unsafe impl<B: Sync> Sync for SizeClasses<B> {}

impl<B> SizeClasses<B> {
    pub const fn new(backing: B) -> SizeClasses<B> {
        SizeClasses {
            state: UnsafeCell::new(State { free: [ptr::null_mut(); CLASSES], slab: ptr::null_mut(), slab_left: 0 }),
            backing,
        }
    }
}

/// The class of a layout, `None` for a block the backing allocator serves.
/// A class's blocks are aligned to their size (slabs are aligned to the
/// largest class and cut in whole blocks of one size at a time, each at an
/// offset that is a multiple of its size), so any alignment up to the size
/// is met.
#[inline]
fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size().max(layout.align()).max(SMALLEST);
    if size > LARGEST {
        return None;
    }
    Some((usize::BITS - (size - 1).leading_zeros()) as usize - SMALLEST.trailing_zeros() as usize)
}

#[inline]
fn class_bytes(class: usize) -> usize {
    SMALLEST << class
}

unsafe impl<B: GlobalAlloc> GlobalAlloc for SizeClasses<B> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(layout) else { return self.backing.alloc(layout) };
        let state = &mut *self.state.get();
        let head = state.free[class];
        if !head.is_null() {
            state.free[class] = *(head as *mut *mut u8);
            return head;
        }
        let size = class_bytes(class);
        // Blocks are cut largest-first-aligned: a slab's cursor only ever
        // moves by whole blocks, and a smaller block after a larger one
        // keeps the cursor aligned to the smaller size. A class that needs
        // more alignment than the cursor has skips ahead to it.
        let misaligned = (state.slab as usize) & (size - 1);
        let skip = if misaligned == 0 { 0 } else { size - misaligned };
        if state.slab.is_null() || state.slab_left < skip + size {
            let slab = self.backing.alloc(Layout::from_size_align_unchecked(SLAB_BYTES, LARGEST));
            if slab.is_null() {
                return slab;
            }
            state.slab = slab;
            state.slab_left = SLAB_BYTES;
        } else {
            state.slab = state.slab.add(skip);
            state.slab_left -= skip;
        }
        let block = state.slab;
        state.slab = block.add(size);
        state.slab_left -= size;
        block
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = class_of(layout) else { return self.backing.dealloc(block, layout) };
        let state = &mut *self.state.get();
        *(block as *mut *mut u8) = state.free[class];
        state.free[class] = block;
    }

    #[inline]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class_of(layout), class_of(new_layout)) {
            (Some(old), Some(new)) if old == new => block,
            (None, None) => self.backing.realloc(block, layout, new_size),
            _ => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_are_the_next_power_of_two_from_16_to_1024() {
        assert_eq!(class_of(layout(1, 1)), Some(0));
        assert_eq!(class_of(layout(16, 1)), Some(0));
        assert_eq!(class_of(layout(17, 1)), Some(1));
        assert_eq!(class_of(layout(3, 64)), Some(2), "alignment counts as size");
        assert_eq!(class_of(layout(1024, 8)), Some(6));
        assert_eq!(class_of(layout(1025, 1)), None);
        assert_eq!(class_of(layout(8, 2048)), None);
    }

    #[test]
    fn blocks_are_aligned_disjoint_and_reused_after_free() {
        let a = SizeClasses::new(System);
        let sizes = [1usize, 7, 16, 24, 33, 64, 100, 200, 512, 1000, 1024, 1500, 5000];
        let mut live: Vec<(*mut u8, Layout)> = Vec::new();
        for round in 0..50 {
            for (i, &size) in sizes.iter().enumerate() {
                let align = [1usize, 8, 16][(i + round) % 3];
                let l = layout(size, align);
                let p = unsafe { a.alloc(l) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                unsafe { ptr::write_bytes(p, (i + round) as u8, size) };
                live.push((p, l));
            }
            // Free every other block: later rounds take them again.
            let mut keep = Vec::new();
            for (n, (p, l)) in live.drain(..).enumerate() {
                if n % 2 == 0 {
                    unsafe { a.dealloc(p, l) };
                } else {
                    keep.push((p, l));
                }
            }
            live = keep;
        }
        // No two live blocks overlap, and each still holds what was written to it.
        let mut spans: Vec<(usize, usize)> = live.iter().map(|(p, l)| (*p as usize, *p as usize + l.size())).collect();
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "blocks overlap: {pair:?}");
        }
        for (p, l) in live {
            let first = unsafe { *p };
            assert!(unsafe { std::slice::from_raw_parts(p, l.size()) }.iter().all(|&b| b == first));
            unsafe { a.dealloc(p, l) };
        }
    }

    #[test]
    fn a_freed_block_is_the_next_one_of_its_class() {
        let a = SizeClasses::new(System);
        let l = layout(40, 8);
        let p = unsafe { a.alloc(l) };
        unsafe { a.dealloc(p, l) };
        assert_eq!(unsafe { a.alloc(layout(64, 8)) }, p, "40 and 64 bytes are one class");
    }

    #[test]
    fn realloc_keeps_the_contents_across_classes_and_to_the_backing_allocator() {
        let a = SizeClasses::new(System);
        let mut l = layout(10, 1);
        let mut p = unsafe { a.alloc(l) };
        unsafe { ptr::copy_nonoverlapping(b"0123456789".as_ptr(), p, 10) };
        for new_size in [12, 16, 17, 300, 1024, 4096, 20_000, 900, 10] {
            p = unsafe { a.realloc(p, l, new_size) };
            l = layout(new_size, 1);
            assert_eq!(unsafe { std::slice::from_raw_parts(p, 10) }, b"0123456789");
        }
        unsafe { a.dealloc(p, l) };
    }
}
