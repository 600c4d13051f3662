//! How much freed memory the C allocator (glibc's malloc) keeps.
//!
//! By default glibc raises its mmap threshold each time a large block is freed, so after a
//! pull (megabyte write buffers) the next large buffers come from the heap, and once freed
//! they stay resident between long-lived small allocations. crius fixes the threshold, so
//! large buffers are mapped on their own (unless a free heap chunk fits) and unmapped when
//! freed. glibc also gives each thread that allocates an arena of its own (up to eight per
//! core), each keeping free chunks of its own; crius's tasks move between its worker
//! threads, so the arenas are capped at two, which the threads share. Freed heap pages go
//! back to the OS after the work that made them: a pull, or a burst of lifecycle calls once
//! it has quietened down ([`release_when_quiet`]). An operator's own `glibc.malloc`
//! tunables (`GLIBC_TUNABLES`) win: the threshold and the cap are not changed then.

use std::time::Duration;

use tokio::sync::Notify;

/// Blocks of at least this size are mapped on their own and returned to the OS when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// At most this many malloc arenas (glibc's default is eight per core).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: i32 = 2;

/// After work that freed memory, the free pages go back once no such work came for this
/// long...
pub const QUIET: Duration = Duration::from_secs(1);
/// ...or this long after the first of it, on a node where it never stops (exec probes).
pub const MAX_RELEASE_DELAY: Duration = Duration::from_secs(10);

/// Fixes the mmap threshold and caps the arenas; call once at start-up, before the runtime
/// starts threads.
pub fn limit_retention() {
    if operator_tuned() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}

static RELEASE_REQUESTED: Notify = Notify::const_new();

/// Asks [`release_when_quiet`] to hand free pages back once things have quietened down.
pub fn release_soon() {
    RELEASE_REQUESTED.notify_one();
}

/// Runs forever: after each [`release_soon`], waits until none came for `quiet` (at most
/// `max_delay` after the first) and hands the free pages of every heap back.
pub async fn release_when_quiet(quiet: Duration, max_delay: Duration) {
    run_when_quiet(&RELEASE_REQUESTED, quiet, max_delay, || async {
        // malloc_trim walks every arena: not on a worker thread.
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
    })
    .await
}

/// Runs `action` once per burst of `requests`: when none came for `quiet`, or `max_delay`
/// after the burst's first.
async fn run_when_quiet<F, Fut>(requests: &Notify, quiet: Duration, max_delay: Duration, action: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        requests.notified().await;
        let deadline = tokio::time::Instant::now() + max_delay;
        loop {
            let wait_until = (tokio::time::Instant::now() + quiet).min(deadline);
            match tokio::time::timeout_at(wait_until, requests.notified()).await {
                Ok(()) if tokio::time::Instant::now() < deadline => continue,
                _ => break,
            }
        }
        action().await;
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

    /// When (ms from the start) `run_when_quiet`, 300 ms quiet and 1 s at most, ran while
    /// requests came at the given milliseconds; watched until `until_ms`. The quiet time is
    /// far above the gaps between requests, so a late wake-up on a busy machine does not
    /// end a burst early.
    async fn runs_for(requests: &[u64], until_ms: u64) -> Vec<u64> {
        use std::sync::{Arc, Mutex};
        let notify = Arc::new(Notify::new());
        let runs = Arc::new(Mutex::new(Vec::new()));
        let start = tokio::time::Instant::now();
        let task = tokio::spawn({
            let (notify, runs) = (notify.clone(), runs.clone());
            async move {
                let quiet = Duration::from_millis(300);
                run_when_quiet(&notify, quiet, Duration::from_secs(1), || {
                    let ms = start.elapsed().as_millis() as u64;
                    runs.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
                    async {}
                })
                .await
            }
        });
        for &ms in requests {
            tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
            notify.notify_one();
        }
        tokio::time::sleep_until(start + Duration::from_millis(until_ms)).await;
        task.abort();
        runs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    #[tokio::test]
    async fn a_burst_is_released_once_after_it_quietens() {
        let runs = runs_for(&[0, 20, 40, 60], 900).await;
        assert_eq!(runs.len(), 1, "released at {runs:?}");
        assert!(
            runs[0] >= 360,
            "released at {runs:?}, before the burst quietened"
        );
    }

    #[tokio::test]
    async fn nothing_is_released_without_a_request() {
        assert_eq!(runs_for(&[], 300).await, Vec::<u64>::new());
    }

    #[tokio::test]
    async fn work_that_never_stops_is_released_every_max_delay() {
        let requests: Vec<u64> = (0..50).map(|i| i * 50).collect();
        let runs = runs_for(&requests, 2_800).await;
        assert!(runs.len() >= 2, "released at {runs:?}");
        assert!(
            (1_000..1_500).contains(&runs[0]),
            "released at {runs:?}, not at the burst's limit"
        );
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
