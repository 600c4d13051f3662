//! How much freed memory the C allocator (glibc's malloc) keeps.
//!
//! By default glibc raises its mmap threshold each time a large block is freed, so after a
//! pull (megabyte write buffers) the next large buffers come from the heap, and once freed
//! they stay resident between long-lived small allocations. crius fixes the threshold, so
//! large buffers are always mapped and unmapped, and hands freed heap pages back after the
//! work that made them (a pull). An operator's own `glibc.malloc` tunables
//! (`GLIBC_TUNABLES`) win: nothing is changed then.

/// Blocks of at least this size are mapped on their own and returned to the OS when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Fixes the mmap threshold; call once at start-up, before the runtime starts threads.
pub fn limit_retention() {
    if operator_tuned() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Hands the free pages of every heap back to the OS.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases pages of free chunks; live memory is untouched.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn operator_tuned() -> bool {
    std::env::var("GLIBC_TUNABLES").is_ok_and(|tunables| tunables.contains("glibc.malloc."))
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// glibc keeps a chunk's size word just before the memory it hands out; this bit of
    /// it marks a chunk mapped on its own (returned to the OS when freed).
    const IS_MMAPPED: usize = 0x2;

    fn mapped_on_its_own(block: &[u8]) -> bool {
        // SAFETY: reads the allocator's size word right before a live malloc'd block.
        let size_word = unsafe { *(block.as_ptr() as *const usize).sub(1) };
        size_word & IS_MMAPPED != 0
    }

    #[test]
    fn large_blocks_stay_mapped_after_a_larger_one_was_freed() {
        limit_retention();
        // Without the fixed threshold, freeing this raises glibc's threshold to 8 MiB.
        drop(std::hint::black_box(vec![1u8; 8 * 1024 * 1024]));
        let block = std::hint::black_box(vec![1u8; 1024 * 1024]);
        assert!(mapped_on_its_own(&block));
        drop(block);
        release_free_memory();
    }
}
