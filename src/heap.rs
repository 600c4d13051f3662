//! How much freed memory the C allocator (glibc's malloc) keeps.
//!
//! By default glibc raises its mmap threshold each time a large block is freed, so after a
//! pull (megabyte write buffers) the next large buffers come from the heap, and once freed
//! they stay resident between long-lived small allocations. crius fixes the threshold, so
//! large buffers are mapped on their own (unless a free heap chunk fits) and unmapped when
//! freed, and hands freed heap pages back after the work that made them (a pull). An
//! operator's own `glibc.malloc` tunables (`GLIBC_TUNABLES`) win: nothing is changed then.

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

    /// Whether malloc maps a block of `size` on its own.
    fn mapped_on_its_own(size: usize) -> bool {
        // SAFETY: a plain malloc/free pair; the word before the block is glibc's chunk
        // header, part of the same mapping.
        unsafe {
            let block = libc::malloc(size);
            assert!(!block.is_null(), "malloc({size})");
            let size_word = *(block as *const usize).sub(1);
            libc::free(block);
            size_word & IS_MMAPPED != 0
        }
    }

    #[test]
    fn large_blocks_stay_mapped_after_a_larger_one_was_freed() {
        if operator_tuned() {
            return;
        }
        limit_retention();
        // Without the fixed threshold, freeing this raises glibc's threshold to 24 MiB, and
        // the next 20 MiB block comes from the heap (no test leaves a free chunk that big).
        // SAFETY: a plain malloc/free pair.
        unsafe { libc::free(std::hint::black_box(libc::malloc(24 << 20))) };
        assert!(mapped_on_its_own(20 << 20));
        release_free_memory();
    }
}
